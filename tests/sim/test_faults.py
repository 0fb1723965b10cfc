"""Simulated power loss, torn writes, flipped bits and I/O errors (DESIGN 3 and 4).

Every test drives a real log directory through `FaultFileIO`
(streamlog/testing/faultfs.py), which knows what an fsync made durable and, on
`crash`, rewrites the files as a power loss would have left them. The log object that
was running is then abandoned and the directory opened again, as after a reboot.

What is checked, whatever the fault:
  * under fsync="always", every acknowledged record (its append returned) is there, at
    the offset it was given, byte for byte (value, key, timestamp, headers);
  * nothing is delivered that was never appended: a record beyond the acknowledged
    ones is a prefix of an append that was in flight, nothing else;
  * offsets are dense from 0, the time index agrees with the records, and appends
    carry on after recovery;
  * under "interval" and "never", what survives is a prefix of what was appended;
  * a damaged durable frame is corruption (named by segment and position), never a
    torn tail, and no reader ever delivers a damaged record;
  * a failed write or fsync is sticky: the partition refuses appends until reopened;
  * multi-step operations (truncate_after, segment roll, retention) crashed at any step
    leave the old state or the new one, nothing else.

Runs are seeded: the seed is in each test id and in every failure message.
"""

from __future__ import annotations

import asyncio
import dataclasses
import glob
import itertools
import os
import random
import shutil
import struct
import threading

import pytest

import streamlog
from streamlog.scan import StopReason, scan_buffer
from streamlog.testing.faultfs import CrashMode, FaultFileIO, flip_bit

STREAM = "events"
MODES = list(CrashMode)
# What a maintenance call (truncate_after, apply_retention) raises when the disk fails
# under it: the partition has failed (or, before that, the bare OSError).
IO_FAILURE = (OSError, streamlog.PartitionFailed)
# Each value starts with (append id, row) so any record read back names its origin.
_ORIGIN = struct.Struct(">QI")
_EPOCH_US = 1_700_000_000_000_000


# -- the workload: deterministic appends that remember their fate ---------------------


@dataclasses.dataclass
class Call:
    """One append call: what it sent, and where it landed once acknowledged."""

    ident: int
    values: list[bytes]
    keys: list[bytes | None]
    timestamps_us: list[int]
    headers: list[tuple] | None
    single: bool
    first: int | None = None  # first offset, set when the append was acknowledged

    def expected(self, row: int) -> tuple:
        headers = self.headers[row] if self.headers else ()
        return self.values[row], self.keys[row], self.timestamps_us[row], headers


class Workload:
    """Appends whose content comes from one Random; remembers every call."""

    def __init__(self, rng: random.Random, *, batches_only: bool = False) -> None:
        self.rng = rng
        self.batches_only = batches_only  # every call appends 3..12 small records
        self.calls: dict[int, Call] = {}
        self.clock_us = _EPOCH_US

    def next_call(self) -> Call:
        rng = self.rng
        ident = len(self.calls) + 1
        single = not self.batches_only and rng.random() < 0.4
        if single:
            count = 1
        else:
            count = rng.randint(3, 12) if self.batches_only else rng.randint(1, 24)
        values, keys, timestamps = [], [], []
        for row in range(count):
            large = not self.batches_only and rng.random() < 0.1
            size = rng.randint(300, 5000) if large else rng.randint(0, 300)
            body = rng.randbytes(size) if rng.random() < 0.7 else bytes([row % 251]) * size
            values.append(_ORIGIN.pack(ident, row) + body)
            keys.append(None if rng.random() < 0.3 else rng.randbytes(rng.randint(0, 16)))
            self.clock_us += rng.randint(0, 2000)
            # Out-of-order event time now and then (DESIGN 5).
            timestamps.append(self.clock_us - (rng.randint(0, 50_000)
                                               if rng.random() < 0.2 else 0))
        headers = None
        if rng.random() < 0.15:
            headers = [(("h", rng.randbytes(4)),) for _ in range(count)]
        call = Call(ident, values, keys, timestamps, headers, single)
        self.calls[ident] = call
        return call


async def append_call(log: streamlog.Log, call: Call) -> None:
    if call.single:
        position = await log.append(STREAM, call.values[0], key=call.keys[0],
                                    timestamp_us=call.timestamps_us[0],
                                    headers=call.headers[0] if call.headers else None)
        call.first = position.offset
    else:
        result = await log.append_batch(STREAM, call.values, keys=call.keys,
                                        timestamps_us=call.timestamps_us,
                                        headers=call.headers)
        first, last = result.ranges[0]
        assert last - first + 1 == len(call.values)
        call.first = first


async def run_appends(log: streamlog.Log, workload: Workload, calls_max: int,
                      concurrency_max: int = 4) -> BaseException | None:
    """Append in groups of concurrent calls until `calls_max` calls or the first
    failure; returns that failure (a crash makes every call in flight fail)."""
    made = 0
    while made < calls_max:
        group = [workload.next_call()
                 for _ in range(min(workload.rng.randint(1, concurrency_max),
                                    calls_max - made))]
        made += len(group)
        results = await asyncio.gather(*(append_call(log, c) for c in group),
                                       return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            return failures[0]
    return None


def append_all_sync(log: streamlog.Log, workload: Workload, calls: int) -> None:
    """Sequential appends (no concurrency): byte-for-byte reproducible from the seed."""
    for _ in range(calls):
        call = workload.next_call()
        if call.single:
            call.first = log.append_sync(STREAM, call.values[0], key=call.keys[0],
                                         timestamp_us=call.timestamps_us[0],
                                         headers=call.headers[0] if call.headers
                                         else None).offset
        else:
            result = log.append_batch_sync(STREAM, call.values, keys=call.keys,
                                           timestamps_us=call.timestamps_us,
                                           headers=call.headers)
            call.first = result.ranges[0][0]


# -- checking a recovered log ----------------------------------------------------------


def check_log(log: streamlog.Log, workload: Workload, context: str, *,
              every_ack_kept: bool = True) -> None:
    """Read the whole partition back and check it against the workload; with
    `every_ack_kept` (fsync="always"), no acknowledged record may be missing."""
    end = log.end_offset(STREAM, 0)
    records = list(log.reader(STREAM, 0))
    offsets = [r.offset for r in records]
    assert offsets == list(range(end)), f"{context}: offsets are not dense 0..{end}"
    where: dict[tuple[int, int], int] = {}
    for record in records:
        assert len(record.value) >= _ORIGIN.size, \
            f"{context}: offset {record.offset} holds a record that was never appended"
        ident, row = _ORIGIN.unpack_from(record.value)
        call = workload.calls.get(ident)
        assert call is not None and row < len(call.values), \
            f"{context}: offset {record.offset} holds a record that was never appended"
        got = (record.value, record.key, record.timestamp_us, record.headers)
        assert got == call.expected(row), \
            f"{context}: offset {record.offset} differs from what append {ident} sent"
        assert (ident, row) not in where, f"{context}: record {ident}/{row} delivered twice"
        where[(ident, row)] = record.offset
    for call in workload.calls.values():
        _check_call(call, where, end, context, every_ack_kept)
    _check_time_index(log, records, workload.rng, context)


def _check_call(call: Call, where: dict, end: int, context: str,
                every_ack_kept: bool) -> None:
    rows = [where.get((call.ident, row)) for row in range(len(call.values))]
    if call.first is not None:
        expected = [call.first + row if call.first + row < end else None
                    for row in range(len(rows))]
        assert rows == expected, \
            f"{context}: acknowledged append {call.ident} at {call.first} is not intact"
        if every_ack_kept:
            assert call.first + len(rows) <= end, \
                f"{context}: acknowledged append {call.ident} at {call.first} was lost"
        return
    # Never acknowledged: a prefix of it may have been written before the fault,
    # at consecutive offsets.
    present = [r for r in rows if r is not None]
    if present:
        assert rows[:len(present)] == present, \
            f"{context}: unacknowledged append {call.ident} left a hole"
        assert present == list(range(present[0], present[0] + len(present))), \
            f"{context}: unacknowledged append {call.ident} is not contiguous"


def forget_lost(workload: Workload, end: int) -> None:
    """Acknowledged appends that reach past `end` were lost (fsync "interval" or
    "never"): from now on they count as never acknowledged, so a prefix of them may
    remain and new appends take their offsets."""
    for call in workload.calls.values():
        if call.first is not None and call.first + len(call.values) > end:
            call.first = None


def _check_time_index(log: streamlog.Log, records, rng: random.Random,
                      context: str) -> None:
    """offset_for_timestamp and readers from random offsets agree with the records."""
    hwm, running = [], None
    for record in records:
        running = record.timestamp_us if running is None else max(running,
                                                                   record.timestamp_us)
        hwm.append(running)
    probes = [_EPOCH_US - 1, (hwm[-1] + 1) if hwm else _EPOCH_US]
    probes += [rng.choice(hwm) + rng.randint(-1, 1) for _ in range(4)] if hwm else []
    for timestamp_us in probes:
        expected = next((i for i, h in enumerate(hwm) if h >= timestamp_us), len(hwm))
        found = log.offset_for_timestamp(STREAM, 0, timestamp_us)
        assert found == expected, \
            f"{context}: offset_for_timestamp({timestamp_us}) = {found}, not {expected}"
    if records:
        start = rng.randrange(len(records))
        tail = [r.value for r in log.reader(STREAM, 0, from_offset=start)]
        assert tail == [r.value for r in records[start:]], \
            f"{context}: a reader from offset {start} differs"


def recovery(log: streamlog.Log) -> dict:
    return log.info()["streams"][STREAM]["partitions"][0]["recovery"]


# -- file helpers ----------------------------------------------------------------------


def partition_dir(path) -> str:
    return os.path.join(str(path), "streams", STREAM, "0")


def segment_paths(path) -> list[str]:
    return sorted(glob.glob(os.path.join(partition_dir(path), "*.log")))


def frames_of(segment_path: str):
    with open(segment_path, "rb") as file:
        data = file.read()
    result = scan_buffer(data)
    assert result.stop is StopReason.END, f"{segment_path} does not end cleanly"
    return result.frames


def snapshot(path) -> dict[str, bytes]:
    """Every file under the log directory except the index and the lock: the state a
    crash test compares."""
    out = {}
    for root, _, names in os.walk(str(path)):
        if os.path.basename(root) == "index":
            continue
        for name in names:
            if name not in ("LOCK", "writer.lock"):
                with open(os.path.join(root, name), "rb") as file:
                    out[os.path.relpath(os.path.join(root, name), str(path))] = file.read()
    return out


def open_log(path, fileio=None, **options) -> streamlog.Log:
    return streamlog.open_log(str(path), fileio=fileio, **options)


def new_log(path, fileio=None, **options) -> streamlog.Log:
    log = open_log(path, fileio, **options)
    log.create_stream(STREAM)
    return log


def build_log(path, seed: int, calls: int, *, batches_only: bool = False,
              **options) -> Workload:
    """A closed fsync="always" log of `calls` sequential appends, reproducible."""
    workload = Workload(random.Random(seed), batches_only=batches_only)
    with new_log(path, **options) as log:
        append_all_sync(log, workload, calls)
    return workload


# -- 0. the fault model itself: if it does not bite, nothing below proves anything ----


def _contents(path) -> bytes:
    with open(path, "rb") as file:
        return file.read()


def test_fault_model_drop_unsynced_returns_to_the_last_fsync(tmp_path):
    fs = FaultFileIO(1)
    path, directory = str(tmp_path / "file"), str(tmp_path)
    handle = fs.open(path, writable=True, create=True)
    fs.pwrite(handle, b"hello", 0)
    fs.fsync(handle)
    fs.fsync_dir(directory)
    fs.truncate(handle, 2)
    fs.pwrite(handle, b"XYZW", 2)
    fresh = fs.open(str(tmp_path / "new"), writable=True, create=True)
    fs.pwrite(fresh, b"never named durably", 0)
    fs.fsync(fresh)
    assert _contents(path) == b"heXYZW"
    assert fs.unsynced_bytes() == 4
    fs.crash(random.Random(1), CrashMode.DROP_UNSYNCED)
    assert _contents(path) == b"hello"
    assert sorted(os.listdir(directory)) == ["file"]  # the new entry was not fsynced
    for call in (lambda: fs.pwrite(handle, b"x", 0), lambda: fs.fsync(handle),
                 lambda: fs.pread(handle, 1, 0), lambda: fs.listdir(directory)):
        with pytest.raises(OSError):
            call()
    fs.close(handle)
    fs.close(fresh)
    assert _contents(path) == b"hello", "a call after the crash reached the disk"


def test_fault_model_undoes_unsynced_renames_and_unlinks(tmp_path):
    fs = FaultFileIO(2)
    directory = str(tmp_path)
    for name, data in (("a", b"old a"), ("b", b"old b"), ("c", b"old c")):
        handle = fs.open(os.path.join(directory, name), writable=True, create=True)
        fs.pwrite(handle, data, 0)
        fs.fsync(handle)
        fs.close(handle)
    fs.fsync_dir(directory)
    fs.rename(os.path.join(directory, "a"), os.path.join(directory, "b"))
    fs.unlink(os.path.join(directory, "c"))
    assert sorted(os.listdir(directory)) == ["b"]
    fs.crash(random.Random(2), CrashMode.DROP_UNSYNCED)
    assert {n: _contents(tmp_path / n) for n in os.listdir(directory)} == {
        "a": b"old a", "b": b"old b", "c": b"old c"}


@pytest.mark.parametrize("mode", [CrashMode.TORN, CrashMode.GARBAGE])
def test_fault_model_torn_keeps_a_prefix_garbage_keeps_the_length(tmp_path, mode):
    durable, unsynced = b"D" * 100, bytes(range(1, 201)) * 5
    kept_lengths = set()
    for seed in range(30):
        fs = FaultFileIO(seed)
        path = str(tmp_path / f"{mode.value}-{seed}")
        handle = fs.open(path, writable=True, create=True)
        fs.pwrite(handle, durable, 0)
        fs.fsync(handle)
        fs.fsync_dir(str(tmp_path))
        for start in range(0, len(unsynced), 250):  # four appends, not synced
            fs.pwrite(handle, unsynced[start:start + 250], 100 + start)
        fs.crash(random.Random(seed), mode)
        fs.close(handle)
        data = _contents(path)
        whole = durable + unsynced
        kept = next(i for i in range(len(whole) + 1)
                    if i == len(data) or i == len(whole) or data[i] != whole[i])
        assert kept >= len(durable), f"seed={seed}: durable bytes lost"
        if mode is CrashMode.TORN:
            assert data == whole[:kept], f"seed={seed}: not a prefix"
        else:
            assert len(data) == len(whole), f"seed={seed}"
            junk = data[kept:]
            assert junk == bytes(len(junk)) or len(set(junk)) > 1, f"seed={seed}"
        kept_lengths.add(kept)
    assert len(kept_lengths) > 10, "the crashes never tore a write"


def test_fault_model_injected_errors_and_scheduled_crash(tmp_path):
    fs = FaultFileIO(3)
    path = str(tmp_path / "file")
    handle = fs.open(path, writable=True, create=True)
    fs.fsync_dir(str(tmp_path))
    fs.inject_eio("fsync", 2)
    fs.inject_eio("pwrite", 2, partial=True)
    fs.pwrite(handle, b"a" * 10, 0)
    fs.fsync(handle)
    with pytest.raises(OSError, match="injected"):
        fs.pwrite(handle, b"b" * 1000, 10)
    assert 10 <= len(_contents(path)) < 1010  # a short write, then the error
    with pytest.raises(OSError, match="injected"):
        fs.fsync(handle)
    fs.crash_at_step(fs.steps + 2, CrashMode.DROP_UNSYNCED)
    fs.truncate(handle, 10)
    with pytest.raises(OSError, match="power loss during step"):
        fs.fsync(handle)  # the power fails before the disk acknowledges it
    assert fs.crashed
    fs.close(handle)
    assert _contents(path) == b"a" * 10
    assert [entry[1] for entry in fs.trace] == ["create", "fsync_dir", "pwrite", "fsync",
                                                "pwrite", "fsync", "truncate", "fsync"]


def test_fault_model_flip_bit_is_durable(tmp_path):
    fs = FaultFileIO(4)
    path = str(tmp_path / "file")
    handle = fs.open(path, writable=True, create=True)
    fs.pwrite(handle, b"\x00" * 8, 0)
    fs.fsync(handle)
    fs.fsync_dir(str(tmp_path))
    fs.flip_bit(path, 3, 7)
    fs.crash(random.Random(4), CrashMode.DROP_UNSYNCED)
    fs.close(handle)
    assert _contents(path) == b"\x00\x00\x00\x80\x00\x00\x00\x00"


# -- 1. power loss in the middle of a run, fsync="always" ----------------------------


@pytest.mark.parametrize("seed", range(48))
async def test_power_loss_keeps_every_acknowledged_record(tmp_path, seed):
    """Swarm-style: per seed, a crash mode, a segment size, whether the log was closed
    and reopened midway, what happens to the index, and whether recovery itself is
    crashed once; then every acknowledged record must be there."""
    rng = random.Random(seed)
    mode = rng.choice(MODES)
    options = dict(segment_bytes_max=rng.choice([4096, 16384, 65536]))
    reopen_midway = rng.random() < 0.4
    index_fate = rng.choice(["kept", "kept", "deleted"] + (["rolled_back"] * 2
                                                           if reopen_midway else []))
    crash_recovery = rng.random() < 0.3
    context = (f"seed={seed} mode={mode.value} {options} reopen_midway={reopen_midway} "
               f"index={index_fate} crash_recovery={crash_recovery}")
    path = tmp_path / "log"
    workload = Workload(rng)
    with new_log(path, **options) as log:
        if reopen_midway:
            assert await run_appends(log, workload, rng.randint(10, 60)) is None, context
    if reopen_midway:
        shutil.copytree(os.path.join(partition_dir(path), "index"), tmp_path / "old-index")
    fs = FaultFileIO(seed)
    log = open_log(path, fs, **options)
    follower = Follower(log)
    calls_max = rng.randint(30, 150)
    fs.crash_at_step(fs.steps + rng.randint(1, 2 * calls_max), mode, random.Random(~seed))
    failure = await run_appends(log, workload, calls_max)
    if failure is not None:
        assert fs.crashed, f"{context}: an append failed without a crash: {failure!r}"
        assert isinstance(failure, streamlog.PartitionFailed), f"{context}: {failure!r}"
    fs.abandon(log)
    followed = follower.stop()

    _damage_index(path, tmp_path / "old-index", index_fate)
    if crash_recovery:
        _open_and_crash(path, FaultFileIO(seed + 10_000), rng, mode, options)
    with open_log(path, FaultFileIO(seed + 20_000), **options) as log:
        report = recovery(log)
        check_log(log, workload, f"{context} after the crash")
        # Persist, then forward (DESIGN 3): what a live follower saw was durable.
        recovered = list(log.reader(STREAM, 0, to_offset=len(followed)))
        assert [_fields(r) for r in recovered] == [_fields(r) for r in followed], \
            f"{context}: a follower saw records the crash then lost"
        if mode is CrashMode.DROP_UNSYNCED and not crash_recovery:
            assert report["tail"] == "clean", f"{context}: {report}"
        if index_fate == "deleted" and not crash_recovery and log.end_offset(STREAM, 0):
            assert report["rebuilt_index"], f"{context}: {report}"
        end = log.end_offset(STREAM, 0)
        assert await run_appends(log, workload, 15) is None, context
        assert min(c.first for c in workload.calls.values()
                   if c.first is not None and c.first >= end) == end, context
    with open_log(path, **options) as log:
        check_log(log, workload, f"{context} after appending past the recovery")


class Follower:
    """A live reader (follow=True) on its own thread, as a tailing consumer would be."""

    def __init__(self, log: streamlog.Log) -> None:
        self.records: list = []
        self._reader = log.reader(STREAM, 0, follow=True)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for record in self._reader:
                self.records.append(record)
        except (streamlog.LogClosed, OSError):
            pass  # the log died under it

    def stop(self) -> list:
        """After the log was closed: the records seen, in order from offset 0."""
        self._thread.join(timeout=30)
        assert not self._thread.is_alive(), "the follower did not stop with the log"
        assert [r.offset for r in self.records] == list(range(len(self.records)))
        return self.records


def _fields(record) -> tuple:
    return record.offset, record.value, record.key, record.timestamp_us, record.headers


def _damage_index(path, old_index, fate: str) -> None:
    index = os.path.join(partition_dir(path), "index")
    if fate == "deleted":
        shutil.rmtree(index)
    elif fate == "rolled_back":  # LMDB (opened without sync) lost its latest commits
        shutil.rmtree(index)
        shutil.copytree(old_index, index)


def _open_and_crash(path, fs: FaultFileIO, rng: random.Random, mode: CrashMode,
                    options: dict) -> None:
    """Open the log (running recovery) and lose power at a random step of it."""
    fs.crash_at_step(rng.randint(1, 8), mode, random.Random(rng.random()))
    try:
        log = open_log(path, fs, **options)
    except OSError:
        assert fs.crashed
        return
    fs.abandon(log)


# -- 2. power loss with fsync="interval" / "never": a prefix survives -----------------


@pytest.mark.parametrize("seed", range(24))
async def test_power_loss_without_fsync_keeps_a_prefix(tmp_path, seed):
    rng = random.Random(seed)
    policy = rng.choice(["interval", "never"])
    mode = rng.choice(MODES)
    options = dict(segment_bytes_max=rng.choice([4096, 65536]), fsync=policy,
                   fsync_interval_ms=rng.choice([1, 5, 20]))
    context = f"seed={seed} mode={mode.value} {options}"
    path = tmp_path / "log"
    workload = Workload(rng)
    fs = FaultFileIO(seed)
    log = new_log(path, fs, **options)
    calls_max = rng.randint(30, 150)
    fs.crash_at_step(fs.steps + rng.randint(1, 2 * calls_max), mode, random.Random(~seed))
    failure = await run_appends(log, workload, calls_max)
    assert failure is None or fs.crashed, f"{context}: {failure!r}"
    fs.abandon(log)
    with open_log(path, FaultFileIO(seed + 1), **options) as log:
        check_log(log, workload, f"{context} after the crash", every_ack_kept=False)
        forget_lost(workload, log.end_offset(STREAM, 0))
        assert await run_appends(log, workload, 10) is None, context
    with open_log(path, **options) as log:
        check_log(log, workload, f"{context} after appending past the recovery",
                  every_ack_kept=False)


async def test_index_ahead_of_lost_segment_data_is_forgotten(tmp_path):
    """fsync="never": LMDB indexes batches whose bytes a power loss then drops. The
    reopened log ends at the durable data, and new appends are not shadowed by the
    stale index entries."""
    path = tmp_path / "log"
    workload = Workload(random.Random(7))
    with new_log(path, fsync="never") as log:  # closing makes these 5 calls durable
        append_all_sync(log, workload, 5)
        durable_end = log.end_offset(STREAM, 0)
    fs = FaultFileIO(7)
    log = open_log(path, fs, fsync="never")
    append_all_sync(log, workload, 20)
    assert fs.unsynced_bytes() > 0
    fs.crash(random.Random(7), CrashMode.DROP_UNSYNCED)
    fs.abandon(log)
    with open_log(path) as log:
        assert log.end_offset(STREAM, 0) == durable_end
        check_log(log, workload, "after losing the unsynced tail", every_ack_kept=False)
        late = workload.calls[max(workload.calls)].timestamps_us[-1]
        assert log.offset_for_timestamp(STREAM, 0, late) == durable_end
        forget_lost(workload, durable_end)
        append_all_sync(log, workload, 10)
        check_log(log, workload, "after appending over the lost tail")


# -- 3. bit flips in durable frames: corruption, never truncation ---------------------


def _flip_somewhere(rng: random.Random, path: str, frame) -> int:
    """Flip one bit in `frame` (header or payload); returns the position."""
    position = frame.position + (rng.randrange(72) if rng.random() < 0.5
                                 else rng.randrange(frame.size))
    flip_bit(path, position, rng.randrange(8))
    return position


def _read_until_error(log):
    records, error = [], None
    try:
        for record in log.reader(STREAM, 0):
            records.append(record)
    except streamlog.CorruptionError as caught:
        error = caught
    return records, error


def _assert_prefix_only(records, workload: Workload, stop: int, context: str) -> None:
    """Delivered records are exactly offsets 0..stop-1, byte for byte."""
    assert [r.offset for r in records] == list(range(stop)), context
    for record in records:
        ident, row = _ORIGIN.unpack_from(record.value)
        got = (record.value, record.key, record.timestamp_us, record.headers)
        assert got == workload.calls[ident].expected(row), context


@pytest.mark.parametrize("seed", range(8))
def test_bit_flip_in_the_middle_of_the_log(tmp_path, seed):
    """A flipped bit in an old durable frame. Recovery scans only from the recovery
    point (DESIGN 4: its time is bounded by the unflushed tail), so the open succeeds;
    a reader delivers every record before the damage and then raises CorruptSegment
    naming the segment and position; records after it stay readable by offset. With
    the index gone, the rebuild scans everything and a writable open refuses."""
    rng = random.Random(seed)
    path = tmp_path / "log"
    workload = build_log(path, seed, 120, segment_bytes_max=8192)
    segments = segment_paths(path)
    assert len(segments) >= 3
    segment = rng.choice(segments[:-1])
    frames = frames_of(segment)
    frame = rng.choice(frames)
    position = _flip_somewhere(rng, segment, frame)
    context = f"seed={seed} flip at {segment}:{position} (frame at {frame.position})"

    with open_log(path) as log:  # writable, index intact
        records, error = _read_until_error(log)
        assert isinstance(error, streamlog.CorruptSegment), f"{context}: {error!r}"
        assert (error.path, error.position) == (segment, frame.position), context
        _assert_prefix_only(records, workload, frame.base_offset, context)
        after = list(log.reader(STREAM, 0, from_offset=frame.next_offset))
        assert len(after) == log.end_offset(STREAM, 0) - frame.next_offset, context
    with open_log(path, readonly=True) as log:
        records, error = _read_until_error(log)
        assert isinstance(error, streamlog.CorruptSegment), f"{context}: {error!r}"
        _assert_prefix_only(records, workload, frame.base_offset, context)

    shutil.rmtree(os.path.join(partition_dir(path), "index"))
    before = snapshot(path)
    with pytest.raises(streamlog.CorruptSegment) as raised:
        open_log(path)
    assert (raised.value.path, raised.value.position) == (segment, frame.position), context
    assert snapshot(path) == before, f"{context}: a refused open changed the files"
    with open_log(path, readonly=True) as log:
        assert recovery(log)["tail"] == "corrupt", context
        records, error = _read_until_error(log)
        _assert_prefix_only(records, workload, frame.base_offset, context)
    assert snapshot(path) == before, f"{context}: a read-only open changed the files"


@pytest.mark.parametrize("seed", range(8))
def test_bit_flip_in_the_last_durable_frame_is_corruption_not_a_tear(tmp_path, seed):
    """DESIGN 4: a frame the index records as durable is never torn, even at the tail."""
    rng = random.Random(seed)
    path = tmp_path / "log"
    workload = build_log(path, seed, 40, segment_bytes_max=rng.choice([8192, 1 << 20]))
    segment = segment_paths(path)[-1]
    frame = frames_of(segment)[-1]
    position = _flip_somewhere(rng, segment, frame)
    context = f"seed={seed} flip at {segment}:{position} (frame at {frame.position})"
    before = snapshot(path)
    with pytest.raises(streamlog.CorruptSegment) as raised:
        open_log(path)
    assert (raised.value.path, raised.value.position) == (segment, frame.position), context
    assert snapshot(path) == before, f"{context}: the acknowledged frame was cut"
    with open_log(path, readonly=True) as log:
        assert recovery(log)["tail"] == "damaged", context
        records, error = _read_until_error(log)
        _assert_prefix_only(records, workload, frame.base_offset, context)
    assert snapshot(path) == before, context


# -- 4. torn tails: a writer truncates them, a reader stops before them ----------------


def _tear_the_tail(path, tail: str) -> tuple[str, int, bytes]:
    """Append what an unacknowledged write may leave: returns (file, size before, extra)."""
    segment = segment_paths(path)[-1]
    last = frames_of(segment)[-1]
    with open(segment, "rb") as file:
        whole = file.read()
    rng = random.Random(tail)
    if tail == "junk_segment":  # a new segment whose first frame never made it
        with open_log(path, readonly=True) as log:
            end = log.end_offset(STREAM, 0)
        victim, size, extra = os.path.join(partition_dir(path), f"{end:020d}.log"), 0, \
            rng.randbytes(100)
    else:
        victim, size = segment, len(whole)
        extra = {"half_frame": whole[last.position:last.position + last.size // 2],
                 "zeros": bytes(300), "junk": rng.randbytes(300)}[tail]
    with open(victim, "ab") as file:
        file.write(extra)
    return victim, size, extra


TAILS = ["half_frame", "zeros", "junk", "junk_segment"]


@pytest.mark.parametrize("tail", TAILS)
def test_torn_tail_is_truncated_by_a_writer(tmp_path, tail):
    path = tmp_path / "log"
    workload = build_log(path, 3, 30, segment_bytes_max=1 << 20)
    victim, size, extra = _tear_the_tail(path, tail)
    with open_log(path) as log:
        report = recovery(log)
        assert report["tail"] == "torn", report
        assert report["truncated_bytes"] == len(extra), report
        assert os.path.getsize(victim) == size
        check_log(log, workload, f"{tail}: writable")
        append_all_sync(log, workload, 5)
        check_log(log, workload, f"{tail}: after appending")
    with open_log(path) as log:
        assert recovery(log)["tail"] == "clean"
        check_log(log, workload, f"{tail}: reopened")


@pytest.mark.parametrize("tail", TAILS)
def test_read_only_open_stops_at_a_torn_tail(tmp_path, tail):
    """DESIGN 4: read-only opens never modify the files; they stop at a torn tail and
    report it. Every acknowledged record is readable up to it."""
    path = tmp_path / "log"
    workload = build_log(path, 3, 30, segment_bytes_max=1 << 20)
    _tear_the_tail(path, tail)
    before = snapshot(path)
    with open_log(path, readonly=True) as log:
        assert recovery(log)["tail"] == "torn"
        check_log(log, workload, f"{tail}: read-only")
    assert snapshot(path) == before, "a read-only open changed the files"


# -- 5. the index is a cache: deleted or damaged, it is rebuilt ------------------------


@pytest.mark.parametrize("damage", ["directory_removed", "data_removed", "lock_removed",
                                    "random_overwrite", "pages_zeroed", "truncated",
                                    "rolled_back"])
def test_damaged_index_is_rebuilt(tmp_path, damage):
    path = tmp_path / "log"
    rng = random.Random(damage)
    workload = Workload(rng)
    index = os.path.join(partition_dir(path), "index")
    with new_log(path, segment_bytes_max=8192) as log:
        append_all_sync(log, workload, 40)
    shutil.copytree(index, tmp_path / "old-index")
    with open_log(path, segment_bytes_max=8192) as log:
        append_all_sync(log, workload, 40)
    data = os.path.join(index, "data.mdb")
    size = os.path.getsize(data)
    if damage == "directory_removed":
        shutil.rmtree(index)
    elif damage == "data_removed":
        os.unlink(data)
    elif damage == "lock_removed":
        os.unlink(os.path.join(index, "lock.mdb"))
    elif damage == "random_overwrite":
        with open(data, "r+b") as file:
            file.write(rng.randbytes(size))
    elif damage == "pages_zeroed":  # meta pages intact, the trees gone
        with open(data, "r+b") as file:
            file.seek(8192)
            file.write(bytes(size - 8192))
    elif damage == "truncated":
        os.truncate(data, 100)
    else:
        shutil.rmtree(index)
        shutil.copytree(tmp_path / "old-index", index)
    with open_log(path, segment_bytes_max=8192) as log:
        report = recovery(log)
        if damage != "lock_removed":  # lock.mdb holds no data: nothing to rebuild
            assert report["rebuilt_index"] or report["frames_indexed"] > 0, report
        check_log(log, workload, damage)
        append_all_sync(log, workload, 5)
    with open_log(path) as log:
        check_log(log, workload, f"{damage}: reopened")


def test_recovery_point_past_the_files_is_damage_until_repaired(tmp_path):
    """A recovery point is written only after the bytes before it are fsynced, and
    truncate_after keeps it in step (its intent file and an index sync), so files that
    end before it lost acknowledged bytes (here: an index restored from before a
    truncate, which is indistinguishable): a writable open refuses rather than cut,
    and `streamlog repair` (which moves nothing here: every byte is valid) drops the
    index so the next open rebuilds it from what the files hold."""
    from streamlog.cli import main as cli_main
    path = tmp_path / "log"
    workload = Workload(random.Random(11))
    index = os.path.join(partition_dir(path), "index")
    with new_log(path) as log:
        append_all_sync(log, workload, 40)
    shutil.copytree(index, tmp_path / "old-index")
    with open_log(path) as log:
        cut = log.end_offset(STREAM, 0) // 2
        log.truncate_after(STREAM, 0, cut)
        _forget_after(workload, cut)
    shutil.rmtree(index)
    shutil.copytree(tmp_path / "old-index", index)
    # With the seal of the newer index beside it, the restored copy is seen for what
    # it is (not the file that was sealed) and rebuilt.
    shutil.copytree(path, tmp_path / "sealed-copy")
    with open_log(tmp_path / "sealed-copy") as log:
        assert recovery(log)["rebuilt_index"]
        check_log(log, workload, "restored index with a newer seal")
    # Without a seal nothing tells a stale index from lost bytes: refuse, repair.
    os.unlink(index + ".seal")
    segment = segment_paths(path)[-1]
    with pytest.raises(streamlog.CorruptSegment) as raised:
        open_log(path)
    assert raised.value.path == segment
    assert cli_main(["verify", str(path)]) == 1
    assert cli_main(["repair", str(path)]) == 0
    with open_log(path) as log:
        check_log(log, workload, "after repair")


def test_index_rolled_back_into_a_rewritten_frame_is_rebuilt(tmp_path):
    """truncate_after rewrites the cut batch as an uncompressed prefix frame, which can
    be longer than the zstd frame it replaces. An index rolled back to when that frame
    was the last one has a recovery point inside the new frame: still only a stale
    cache, not corruption."""
    path = tmp_path / "log"
    index = os.path.join(partition_dir(path), "index")
    with new_log(path) as log:
        log.append_batch_sync(STREAM, [b"a" * 50, b"b" * 50], timestamps_us=[1, 2])
        first, _ = log.append_batch_sync(STREAM, [bytes([65 + i]) * 200 for i in range(10)],
                                         timestamps_us=list(range(3, 13))).ranges[0]
    frame = frames_of(segment_paths(path)[-1])[-1]
    assert frame.codec == 1, "the batch should be compressed"
    shutil.copytree(index, tmp_path / "old-index")
    with open_log(path) as log:
        log.truncate_after(STREAM, 0, first + 4)
        expected = [r.value for r in log.reader(STREAM, 0)]
    assert frames_of(segment_paths(path)[-1])[-1].size > frame.size
    shutil.rmtree(index)
    shutil.copytree(tmp_path / "old-index", index)
    with open_log(path) as log:
        assert [r.value for r in log.reader(STREAM, 0)] == expected
        assert log.append_sync(STREAM, b"next").offset == first + 5


def _forget_after(workload: Workload, offset: int) -> None:
    """truncate_after(offset) removed the records after `offset`: no longer expected."""
    for call in workload.calls.values():
        if call.first is None or call.first + len(call.values) - 1 <= offset:
            continue
        if call.first > offset:
            call.first = None
            continue
        keep = offset - call.first + 1  # the cut went through this append
        call.values, call.keys = call.values[:keep], call.keys[:keep]
        call.timestamps_us = call.timestamps_us[:keep]
        call.headers = call.headers[:keep] if call.headers else None


# -- 6. sticky failure: an I/O error fails the partition until it is reopened ---------


@pytest.mark.parametrize("operation,partial,policy", [
    ("fsync", False, "always"), ("pwrite", False, "always"), ("pwrite", True, "always"),
    ("create", False, "always"), ("fsync_dir", False, "always"),
    ("fsync", False, "interval"), ("pwrite", True, "never")])
def test_io_error_fails_the_partition_until_reopened(tmp_path, operation, partial, policy):
    """STYLE 6: after a failed write or fsync every append is refused with
    PartitionFailed, fsync is never tried again, and a reopen recovers."""
    path = tmp_path / "log"
    workload = Workload(random.Random(operation))
    fs = FaultFileIO(5)
    log = new_log(path, fs, segment_bytes_max=4096, fsync=policy, fsync_interval_ms=1)
    append_all_sync(log, workload, 10)
    if operation in ("create", "fsync_dir"):  # the next segment roll fails
        while len(segment_paths(path)) < 2:
            append_all_sync(log, workload, 1)
    fs.inject_eio(operation, 1, partial=partial)
    with pytest.raises(streamlog.PartitionFailed):
        while True:  # until the operation happens (a roll needs enough bytes)
            append_all_sync(log, workload, 1)
    failed_at = fs.counts["fsync"]
    for _ in range(3):
        with pytest.raises(streamlog.PartitionFailed):
            append_all_sync(log, workload, 1)
    assert list(log.reader(STREAM, 0))[-1].offset == log.end_offset(STREAM, 0) - 1
    log.close()
    assert fs.counts["fsync"] == failed_at, "fsync was retried after the failure"
    with open_log(path, segment_bytes_max=4096) as log:
        check_log(log, workload, f"{operation} failed")
        if partial:
            assert recovery(log)["tail"] in ("torn", "clean")
        append_all_sync(log, workload, 5)
        check_log(log, workload, f"{operation} failed, then appended")


def steps_of(base, action, **options) -> list[tuple]:
    """The mutating steps (step, operation, path) `action(log)` takes, run on a copy
    of the closed log at `base`."""
    copy = str(base) + "-dry"
    shutil.copytree(base, copy)
    fs = FaultFileIO(0)
    with open_log(copy, fs, **options) as log:
        start = fs.steps
        action(log)
        steps = [entry for entry in fs.trace if entry[0] > start]
    shutil.rmtree(copy)
    return steps


def crash_during(base, copy, action, number: int, mode: CrashMode, **options) -> None:
    """Copy the closed log at `base` to `copy`, open it on a FaultFileIO, and lose power
    at mutating step `number` of `action(log)`, which must fail; abandon the log."""
    shutil.copytree(base, copy)
    fs = FaultFileIO(number)
    log = open_log(copy, fs, **options)
    fs.crash_at_step(fs.steps + number, mode, random.Random(number))
    with pytest.raises(IO_FAILURE):
        action(log)
    fs.abandon(log)


def _truncate_steps(path, cut: int) -> list[tuple]:
    return steps_of(path, lambda log: log.truncate_after(STREAM, 0, cut))


def test_io_error_during_truncate_after_fails_the_partition(tmp_path):
    """The same stickiness when the failing operation belongs to truncate_after."""
    path = tmp_path / "base"
    build_log(path, 21, 25, batches_only=True, segment_bytes_max=8192)
    cut = _cut_inside_a_frame(path, random.Random(21))
    steps = _truncate_steps(path, cut)
    problems = []
    for number, (_, operation, where) in enumerate(steps, start=1):
        copy = tmp_path / f"step-{number}"
        shutil.copytree(path, copy)
        fs = FaultFileIO(number)
        log = open_log(copy, fs, segment_bytes_max=8192)
        ordinal = sum(1 for _, op, _ in steps[:number] if op == operation)
        fs.inject_eio(operation, ordinal)
        with pytest.raises(IO_FAILURE):
            log.truncate_after(STREAM, 0, cut)
        try:
            log.append_sync(STREAM, b"after a failed truncate")
            problems.append(f"step {number} ({operation} {os.path.basename(where)}): "
                            f"an append succeeded")
        except streamlog.PartitionFailed:
            pass
        except Exception as error:  # noqa: BLE001 - anything else is a problem too
            problems.append(f"step {number} ({operation}): append raised {error!r}")
        log.close()
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("operation,ordinal", [("fsync_dir", 1), ("truncate", 2)])
def test_append_acknowledged_after_a_failed_truncate_is_not_lost(tmp_path, operation,
                                                                  ordinal):
    """The intent file is durable, the segment is not cut yet, and the I/O error is
    reported to the caller of truncate_after. An append acknowledged after that must
    survive the next open (or be refused with PartitionFailed)."""
    path = tmp_path / "log"
    build_log(path, 22, 30, batches_only=True, segment_bytes_max=8192)
    cut = _cut_inside_a_frame(path, random.Random(22))
    steps = [op for _, op, _ in _truncate_steps(path, cut)]
    assert steps.index("rename") < [i for i, op in enumerate(steps)
                                    if op == operation][ordinal - 1]
    fs = FaultFileIO(22)
    with open_log(path, fs) as log:
        fs.inject_eio(operation, ordinal)
        with pytest.raises(IO_FAILURE):
            log.truncate_after(STREAM, 0, cut)
        try:
            position = log.append_sync(STREAM, b"acknowledged")
        except streamlog.PartitionFailed:
            return  # refused: nothing was promised
    with open_log(path) as log:
        found = list(log.reader(STREAM, 0, from_offset=min(position.offset,
                                                           log.end_offset(STREAM, 0))))
        assert [r.value for r in found[:1]] == [b"acknowledged"], \
            f"the append acknowledged at offset {position.offset} is gone"


# -- 7. multi-step operations crashed at every step: old state or new, nothing else ---


def _cut_inside_a_frame(path, rng: random.Random) -> int:
    """An offset in the middle of a multi-record frame of the last segment."""
    frames = [f for f in frames_of(segment_paths(path)[-1]) if f.record_count >= 3]
    frame = rng.choice(frames)
    return frame.base_offset + rng.randrange(1, frame.record_count - 1)


def _cut_cases(path, rng: random.Random) -> dict[str, int]:
    segments = segment_paths(path)
    last_frames = frames_of(segments[-1])
    assert len(segments) >= 3
    early = [f for f in frames_of(segments[-3]) if f.record_count >= 2]
    return {
        "inside_a_frame": _cut_inside_a_frame(path, rng),
        "at_a_frame_boundary": rng.choice(last_frames[1:]).base_offset - 1,
        "in_an_earlier_segment": early[len(early) // 2].base_offset,
    }


@pytest.mark.parametrize("case", ["inside_a_frame", "at_a_frame_boundary",
                                  "in_an_earlier_segment"])
def test_crash_at_each_step_of_truncate_after(tmp_path, case):
    rng = random.Random(case)
    path = tmp_path / "base"
    build_log(path, 31, 25, batches_only=True, segment_bytes_max=8192)
    cut = _cut_cases(path, rng)[case]
    with open_log(path, readonly=True) as log:
        old = [r.value for r in log.reader(STREAM, 0)]
    new = old[:cut + 1]
    assert len(new) < len(old)
    steps = _truncate_steps(path, cut)
    assert any(op == "rename" for _, op, _ in steps), steps  # the intent file
    for number, mode in itertools.product(range(1, len(steps) + 1), MODES):
        context = (f"case={case} cut={cut} crash at step {number}/{len(steps)} "
                   f"{steps[number - 1][1:]} mode={mode.value}")
        copy = tmp_path / f"{number}-{mode.value}"
        crash_during(path, copy, lambda log: log.truncate_after(STREAM, 0, cut), number,
                     mode, segment_bytes_max=8192)
        _check_old_or_new(copy, old, new, context)
        shutil.rmtree(copy)


def test_read_only_open_during_an_unfinished_truncate_sees_old_or_new(tmp_path):
    """A read-only open must not finish the truncate (it changes no file), but what it
    shows must still be the old state or the truncated one."""
    path = tmp_path / "base"
    build_log(path, 31, 25, batches_only=True, segment_bytes_max=8192)
    problems = []
    for case, cut in _cut_cases(path, random.Random(5)).items():
        with open_log(path, readonly=True) as log:
            old = [r.value for r in log.reader(STREAM, 0)]
        new, steps = old[:cut + 1], _truncate_steps(path, cut)
        after_intent = [op for _, op, _ in steps].index("rename") + 1
        for number, mode in itertools.product(range(after_intent, len(steps) + 1), MODES):
            copy = tmp_path / f"{case}-{number}-{mode.value}"
            crash_during(path, copy, lambda log: log.truncate_after(STREAM, 0, cut),
                         number, mode, segment_bytes_max=8192)
            with open_log(copy, readonly=True) as log:
                values = [r.value for r in log.reader(STREAM, 0)]
                if values not in (old, new):
                    problems.append(f"{case} cut={cut} step {number} {steps[number - 1][1]} "
                                    f"{mode.value}: {len(values)} records, end_offset "
                                    f"{log.end_offset(STREAM, 0)}; old {len(old)}, "
                                    f"new {len(new)}")
            shutil.rmtree(copy)
    assert not problems, "\n".join(problems)


def _check_old_or_new(path, old: list[bytes], new: list[bytes], context: str) -> None:
    with open_log(path, segment_bytes_max=8192) as log:
        values = [r.value for r in log.reader(STREAM, 0)]
        assert values in (old, new), (f"{context}: {len(values)} records, neither the "
                                      f"old {len(old)} nor the new {len(new)}")
        end = log.end_offset(STREAM, 0)
        assert end == len(values), context
        position = log.append_sync(STREAM, b"after the crash")
        assert position.offset == end, context
    with open_log(path, readonly=True) as log:
        again = [r.value for r in log.reader(STREAM, 0)]
        assert again == values + [b"after the crash"], context


@pytest.mark.parametrize("phase", ["log", "stream"])
def test_crash_at_each_step_of_creating_a_log_and_a_stream(tmp_path, phase):
    """Creating the log directory or a stream, crashed at any step: opening it again
    (create=True) and creating the stream again must work, then appends go on."""
    def create(path, fs):
        log = open_log(path, fs)
        if phase == "stream":
            log.create_stream(STREAM)
        return log

    base, dry = tmp_path / "base", tmp_path / "dry"
    if phase == "stream":
        open_log(base).close()
        shutil.copytree(base, dry)
    fs = FaultFileIO(0)
    create(dry, fs).close()
    steps = list(fs.trace)
    problems = []
    for number, mode, variant in itertools.product(range(1, len(steps) + 1), MODES,
                                                   range(3)):
        copy = tmp_path / f"{number}-{mode.value}-{variant}"
        if phase == "stream":
            shutil.copytree(base, copy)
        fs = FaultFileIO(number)
        fs.crash_at_step(number, mode, random.Random(number * 10 + variant))
        try:
            fs.abandon(create(copy, fs))
        except OSError:
            assert fs.crashed
        try:
            with open_log(copy) as log:
                log.create_stream(STREAM)
                log.append_sync(STREAM, b"after the crash")
                assert [r.value for r in log.reader(STREAM, 0)] == [b"after the crash"]
        except Exception as error:  # noqa: BLE001 - collected and reported below
            problems.append(f"step {number} {steps[number - 1][1:]} {mode.value}: "
                            f"{error!r}")
    assert not problems, "\n".join(problems)


def test_crash_at_each_step_of_a_segment_roll(tmp_path):
    path = tmp_path / "base"
    build_log(path, 41, 20, segment_bytes_max=8192)
    with open_log(path, readonly=True) as log:
        old = [r.value for r in log.reader(STREAM, 0)]
    size = os.path.getsize(segment_paths(path)[-1])
    # Incompressible and too big for what is left: the append rolls a new segment.
    big = random.Random(41).randbytes(max(8192 - size + 1, 1))
    steps = steps_of(path, lambda log: log.append_sync(STREAM, big), segment_bytes_max=8192)
    # fsync the full segment; write its seal (temp file, fsync, rename, fsync the
    # directory); create the next segment; unseal the index before its first write of
    # this open (remove index.seal, fsync the directory: the index's seal and wipe go
    # through the partition's FileIO); write and fsync the append.
    assert [op for _, op, _ in steps] == ["fsync", "create", "truncate", "pwrite", "fsync",
                                          "rename", "fsync_dir", "create", "fsync_dir",
                                          "unlink", "fsync_dir", "pwrite", "fsync"], steps
    assert os.path.basename(steps[9][2]) == "index.seal"
    for number, mode in itertools.product(range(1, len(steps) + 1), MODES):
        context = f"roll: crash at step {number} {steps[number - 1][1:]} {mode.value}"
        copy = tmp_path / f"{number}-{mode.value}"
        crash_during(path, copy, lambda log: log.append_sync(STREAM, big), number, mode,
                     segment_bytes_max=8192)
        _check_old_or_new(copy, old, old + [big], context)


def test_crash_at_each_step_of_retention(tmp_path):
    path = tmp_path / "base"
    build_log(path, 51, 60, segment_bytes_max=8192)
    with open_log(path, readonly=True) as log:
        old = [r.value for r in log.reader(STREAM, 0)]
    total = sum(os.path.getsize(p) for p in segment_paths(path))
    options = dict(segment_bytes_max=8192, retention_bytes=total - 1)
    deleted = []
    steps = steps_of(path, lambda log: deleted.extend(log.apply_retention()), **options)
    assert len(deleted) == 1, deleted
    first_kept = int(os.path.basename(segment_paths(path)[1])[:20])
    for number, mode in itertools.product(range(1, len(steps) + 1), MODES):
        context = f"retention: crash at step {number} {steps[number - 1][1:]} {mode.value}"
        copy = tmp_path / f"{number}-{mode.value}"
        crash_during(path, copy, lambda log: log.apply_retention(), number, mode, **options)
        with open_log(copy, **options) as log:
            start_offset = log.start_offset(STREAM, 0)
            assert start_offset in (0, first_kept), context
            values = [r.value for r in log.reader(STREAM, 0)]
            assert values == old[start_offset:], context
        assert not glob.glob(os.path.join(partition_dir(copy), "*.deleted")), context
