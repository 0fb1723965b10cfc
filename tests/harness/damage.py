"""Damage a log on purpose and check what streamlog makes of it (DESIGN 4, the contract).

Strategy: build one small log, deterministic by seed (`build_log`), read its expected
answers while it is whole (`Expected`), then damage fresh copies of it one fault at a
time and judge every answer the damaged copy gives. A judgement is a category, never an
assertion, so that a sweep runs to the end and reports how many faults fell where:

    segment flips   one bit of one byte of a segment file (`check_segment_flip`): verify
                    must name the damaged frame (segment S, position P); a read-only
                    reader must deliver exactly the records before it, then raise
                    CorruptSegment(S, P); a writable open refuses naming S and P or opens
                    and changes nothing that it reads.
    index flips     one bit of an LMDB index file (`check_index_flip`, run in a worker
                    process because a damaged LMDB can crash its process): every answer
                    (records in both modes, offsets, times, transaction states) must be
                    the undamaged one, through a read-only open, a writable open and a
                    second writable open; an index that cannot be read is rebuilt.
    damaged tails   a writer killed with SIGKILL (`tail-writer`, below), then its last
                    segment damaged past the acknowledged end (`check_tail_damage`): a
                    writable open succeeds, every acknowledged record is there, nothing
                    invalid is delivered, and verify passes after it.

Categories that break the contract whatever else happens: WRONG (an answer differs
from the undamaged log's), SILENT_SHORT (fewer records and no error), RAW (an exception
that is not a streamlog.errors.StreamLogError), and for index flips DEATH (the worker
process died) and HANG.

It is one module of ~1,400 lines, over the house's ~500, on purpose: the three sweeps
share the built log, its expected answers, the categories and the judges, and the tests
and bench/integrity_sweep.py import them from one place.

Run as a program, this module is the two helper processes:

    python -m harness.damage tail-writer LOG SEED
    python -m harness.damage index-worker BUILT_PICKLE

with tests/ and the directory holding streamlog on PYTHONPATH (`_helper_command` and
`_helper_env` start them so: the worker unpickles `harness.damage` classes).

Why ~1,400 lines: one harness for every kind of fault (segment and index flips, kills),
with the expected answers each is judged against; it is test tooling, not the product.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import os
import pickle
import random
import select
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback
from typing import NamedTuple

import streamlog
from streamlog import cli, layout
from streamlog.errors import CorruptFrame, CorruptSegment, StreamLogError
from streamlog.frame import (CODEC_ZSTD, HEADER_BYTES, INCOMPLETE, Frame, decode_frame,
                             encode_frame)
from streamlog.records import RecordKind
from streamlog.txn import TxnState, encode_commit

from streamlog.testing.faultfs import flip_bit

# -- the log under test ------------------------------------------------------------------

STREAMS = (("z", "zstd"), ("n", "none"))  # (stream, compression it is written with)
PARTITIONS = 2
SEGMENT_BYTES_MAX = 4096  # the smallest LogConfig allows: many segments from little data
# Data timestamps start at 2099-01-01T00:00:00Z: commit and abort markers carry their
# append time (now), so they stay below the data's high-water mark, out of order, and the
# time index is shaped by the seed alone.
EPOCH_US = 4_070_908_800_000_000
PAGE_BYTES = 4096  # LMDB page size on this platform (meta pages are pages 0 and 1)

# Outcome categories.
OK = "ok"
DETECTED = "detected"  # the right error at the right place, after the exact prefix
WRONG_POSITION = "wrong_position"  # an error naming another segment or position
TORN_ONLY = "torn_only"  # verify: reported as a torn tail (exit 0), not corruption
MISSED = "missed"  # no error, and every record delivered equals the undamaged one
WRONG = "wrong"  # a record or an answer differs from the undamaged log's
SILENT_SHORT = "silent_short"  # fewer records than the undamaged log, no error
EARLY_ERROR = "early_error"  # the right error and place, but records before it missing
OTHER_ERROR = "streamlog_error"  # a StreamLogError other than the expected one
REFUSED_UNACKED = "refused_unacked_durable"  # see check_tail_damage
RAW = "raw"  # an exception that is not a StreamLogError
REFUSED = "refused"  # writable open refused with CorruptSegment(S, P)
DEATH = "death"
HANG = "hang"


class Rec(NamedTuple):
    """A record as the contract compares it."""

    offset: int
    timestamp_us: int
    key: bytes | None
    value: bytes
    kind: int
    headers: tuple = ()


def rec(record) -> Rec:
    return Rec(record.offset, record.timestamp_us, record.key, bytes(record.value),
               int(record.kind), tuple(record.headers))


@dataclasses.dataclass
class Expected:
    """The answers of one partition of the undamaged log."""

    records: list[Rec]  # read_committed=False, data_only=False, from offset 0
    committed: list[Rec]  # read_committed=True, data_only=True (the defaults)
    end_offset: int
    last_stable_offset: int
    times: dict[int, int]  # timestamp_us -> offset_for_timestamp
    txns: dict[int, int | None]  # txn_id -> TxnState value (None: unknown)
    from_offsets: list[int]  # offsets a reader is started at (records[o:] expected)


@dataclasses.dataclass(frozen=True)
class FrameInfo:
    stream: str
    partition: int
    segment: str  # path relative to the log directory
    position: int
    size: int
    base_offset: int
    count: int
    codec: int
    control: bool
    txn_id: int

    @property
    def key(self) -> str:
        return f"{self.stream}/{self.partition}"


@dataclasses.dataclass
class BuiltLog:
    path: str
    seed: int
    expected: dict[str, Expected]  # "stream/partition" -> answers
    frames: list[FrameInfo]
    index_files: dict[str, str]  # "stream/partition" -> data.mdb path, relative

    def partitions(self) -> list[tuple[str, int]]:
        return [(s, p) for s, _ in STREAMS for p in range(PARTITIONS)]


class HarnessError(AssertionError):
    """The harness itself is wrong (the undamaged log does not read back as written)."""


def build_log(path: str, seed: int, *, batches: int = 40, min_segments: int = 3) -> BuiltLog:
    """Write the log under test at `path` (which must not exist) and return it with its
    expected answers and frame map. `batches` is the number of append operations per
    partition (data batches, transactional batches and markers); plain batches follow
    until every partition has `min_segments` segments."""
    rng = random.Random(seed)
    written: dict[str, list[Rec]] = {}
    txn_final: dict[str, dict[int, int]] = {}
    clock = [0]
    for stream, compression in STREAMS:
        with streamlog.open_log(path, fsync="always", compression=compression,
                                segment_bytes_max=SEGMENT_BYTES_MAX) as log:
            log.create_stream(stream, PARTITIONS)
            for partition in range(PARTITIONS):
                key = f"{stream}/{partition}"
                written[key], txn_final[key] = _write_partition(
                    log, stream, partition, rng, batches, clock, min_segments)
    frames = list(_frame_map(path))
    expected = {}
    with streamlog.open_log(path, readonly=True) as log:
        for stream, _ in STREAMS:
            for partition in range(PARTITIONS):
                key = f"{stream}/{partition}"
                expected[key] = _read_expected(log, stream, partition, written[key],
                                               txn_final[key], frames, rng)
    _check_build(frames, expected)
    index_files = {f"{s}/{p}": os.path.join("streams", s, str(p), "index", "data.mdb")
                   for s, _ in STREAMS for p in range(PARTITIONS)}
    return BuiltLog(os.path.abspath(path), seed, expected, frames, index_files)


def _value(rng: random.Random, n: int) -> bytes:
    """Text that zstd compresses, with a random part so that it does not vanish."""
    if rng.random() < 0.03:
        return b""
    page = rng.choice((b"/", b"/cart", b"/products/", b"/search?q=", b"/checkout/pay"))
    text = b'{"event":"view","page":"%s%d","n":%d,"r":"' % (page, rng.randrange(100), n)
    return text + rng.randbytes(rng.randint(0, 24)).hex().encode() + b'"}'


def _write_partition(log, stream: str, partition: int, rng: random.Random, batches: int,
                     clock: list[int], min_segments: int):
    """Append `batches` operations to one partition; returns (records as written,
    {txn_id: final TxnState value})."""
    out: list[Rec] = []
    open_txns: list[int] = []
    final: dict[int, int] = {}

    def batch(txn_id: int) -> None:
        n = rng.choice((1, 1, 2, 3, 5, 8, 13, 21, 34, 50, rng.randint(1, 50)))
        values = [_value(rng, clock[0] + i) for i in range(n)]
        keys = [None if rng.random() < 0.3 else b"user-%d" % rng.randrange(40)
                for _ in range(n)]
        timestamps = []
        for _ in range(n):
            clock[0] += 1
            jitter = rng.choice((0, 0, rng.randint(-20_000, 20_000)))
            timestamps.append(EPOCH_US + clock[0] * 1_000 + jitter)
        headers = None
        if rng.random() < 0.3:
            headers = [() if rng.random() < 0.4 else
                       (("trace", rng.randbytes(8)), ("src", b"damage"))[:rng.randint(1, 2)]
                       for _ in range(n)]
        result = log.append_batch_sync(stream, values, keys=keys, timestamps_us=timestamps,
                                       partition=partition, headers=headers, txn_id=txn_id)
        first, last = result.ranges[partition]
        assert last - first + 1 == n
        for i in range(n):
            out.append(Rec(first + i, timestamps[i], keys[i], values[i], 0,
                           tuple(headers[i]) if headers else ()))

    def marker(txn_id: int, commit: bool) -> None:
        if commit:
            tag = f"sink-{stream}-{partition}"
            value = rng.randbytes(rng.randint(0, 12))
            offset = log.commit_txn(stream, partition, txn_id, tag=tag, marker=value)
            final[txn_id] = int(TxnState.COMMITTED)
            out.append(Rec(offset, -1, None, encode_commit(tag, value), int(RecordKind.COMMIT)))
        else:
            offset = log.abort_txn(stream, partition, txn_id)
            final[txn_id] = int(TxnState.ABORTED)
            out.append(Rec(offset, -1, None, b"", int(RecordKind.ABORT)))

    for _ in range(batches):
        roll = rng.random()
        if roll < 0.55 or (roll < 0.75 and len(open_txns) >= 2):
            batch(0)
        elif roll < 0.75:
            txn_id = log.new_txn_id()
            open_txns.append(txn_id)
            batch(txn_id)
        elif open_txns and roll < 0.85:
            batch(rng.choice(open_txns))
        elif open_txns:
            txn_id = open_txns.pop(rng.randrange(len(open_txns)))
            marker(txn_id, rng.random() < 0.65)
        else:
            batch(0)
    for txn_id in open_txns:
        marker(txn_id, rng.random() < 0.65)
    directory = os.path.join(log.path, "streams", stream, str(partition))
    for _ in range(1000):
        if len(_segment_paths(directory)) >= min_segments:
            break
        batch(0)
    return out, final


def _segment_paths(directory: str) -> list[str]:
    """The segment files of a partition directory, in offset order."""
    names = os.listdir(directory) if os.path.isdir(directory) else []
    bases = sorted(b for b in map(layout.parse_segment_name, names) if b is not None)
    return [os.path.join(directory, layout.segment_name(b)) for b in bases]


def walk_file(path: str) -> tuple[list[Frame], int, str]:
    """(valid frames, position where they stop, why) of one segment file, decoded with
    streamlog.frame alone (no index, no recovery): the frames from the start of the
    file up to its end or its first spot that is not a whole valid frame."""
    with open(path, "rb") as file:
        data = file.read()
    frames, position = [], 0
    while position < len(data):
        try:
            frame = decode_frame(data, position)
        except CorruptFrame as error:
            return frames, position, error.reason
        if frame is INCOMPLETE:
            return frames, position, "incomplete"
        frames.append(dataclasses.replace(frame, payload=bytes(frame.payload)))
        position = frame.end_position
    return frames, position, ""


def _frame_map(path: str):
    for stream, _ in STREAMS:
        for partition in range(PARTITIONS):
            for segment in _segment_paths(os.path.join(path, "streams", stream,
                                                       str(partition))):
                found, _, problem = walk_file(segment)
                if problem:
                    raise HarnessError(f"the undamaged log has a bad spot in {segment}: "
                                       f"{problem}")
                for event in found:
                    yield FrameInfo(stream, partition, os.path.relpath(segment, path),
                                    event.position, event.size, event.base_offset,
                                    event.record_count, event.codec, event.has_control,
                                    event.txn_id)


def _read_expected(log, stream: str, partition: int, written: list[Rec],
                   txn_final: dict[int, int], frames: list[FrameInfo],
                   rng: random.Random) -> Expected:
    records = [rec(r) for r in log.reader(stream, partition, from_offset=0,
                                          read_committed=False, data_only=False)]
    # Markers carry the append time: take it from the log, check everything else.
    check = [r._replace(timestamp_us=-1) if r.kind else r for r in records]
    if check != written:
        first = next((i for i, (a, b) in enumerate(zip(check, written)) if a != b),
                     min(len(check), len(written)))
        raise HarnessError(f"{stream}/{partition} does not read back as written "
                           f"(first difference at index {first})")
    committed = [rec(r) for r in log.reader(stream, partition)]
    data_txn = _txn_of_offsets(frames, stream, partition)
    visible = [r for r in records if r.kind == 0 and (
        data_txn.get(r.offset, 0) == 0 or
        txn_final.get(data_txn[r.offset]) == int(TxnState.COMMITTED))]
    if committed != visible:
        raise HarnessError(f"{stream}/{partition}: read_committed does not match the "
                           f"transactions written")
    timestamps = [r.timestamp_us for r in records]
    data = [r.timestamp_us for r in records if r.kind == 0]
    probes = {min(timestamps) - 1, min(timestamps), max(timestamps), max(timestamps) + 1}
    probes |= {rng.choice(data) for _ in range(6)}
    probes |= {rng.randint(min(data), max(data)) for _ in range(4)}
    times = {t: log.offset_for_timestamp(stream, partition, t) for t in sorted(probes)}
    for t, offset in times.items():
        hwm, want = None, len(records)
        for r in records:  # the high-water-mark rule, recomputed the slow way
            hwm = r.timestamp_us if hwm is None else max(hwm, r.timestamp_us)
            if hwm >= t:
                want = r.offset
                break
        if offset != want:
            raise HarnessError(f"{stream}/{partition}: offset_for_timestamp({t}) is "
                               f"{offset}, the rule says {want}")
    txns = {t: _state(log.txn_state(stream, partition, t)) for t in txn_final}
    if txns != txn_final:
        raise HarnessError(f"{stream}/{partition}: transaction states {txns} != {txn_final}")
    end = log.end_offset(stream, partition)
    lso = log.last_stable_offset(stream, partition)
    if end != len(records) or lso != end:
        raise HarnessError(f"{stream}/{partition}: end {end}, lso {lso}, "
                           f"{len(records)} records")
    bases = [f.base_offset for f in frames if (f.stream, f.partition) == (stream, partition)]
    from_offsets = sorted({rng.choice(bases), rng.randrange(len(records)),
                           len(records) // 2, len(records) - 1})
    return Expected(records, committed, end, lso, times, txns, from_offsets)


def _txn_of_offsets(frames, stream, partition) -> dict[int, int]:
    out = {}
    for f in frames:
        if (f.stream, f.partition) == (stream, partition):
            for offset in range(f.base_offset, f.base_offset + f.count):
                out[offset] = f.txn_id
    return out


def _state(state) -> int | None:
    return None if state is None else int(state)


def _check_build(frames: list[FrameInfo], expected: dict[str, Expected]) -> None:
    """The log must be what the sweep needs: >= 3 segments per partition, really
    compressed frames in the zstd stream and none in the other, control frames."""
    for stream, compression in STREAMS:
        for partition in range(PARTITIONS):
            mine = [f for f in frames if (f.stream, f.partition) == (stream, partition)]
            segments = {f.segment for f in mine}
            if len(segments) < 3:
                raise HarnessError(f"{stream}/{partition} has {len(segments)} segments; "
                                   f"the sweep needs >= 3 (write more batches)")
            zstd = sum(f.codec == CODEC_ZSTD for f in mine)
            data_frames = len([f for f in mine if not f.control])
            if compression == "zstd" and zstd < max(1, data_frames // 4):
                raise HarnessError(f"{stream}/{partition}: only {zstd} of {len(mine)} "
                                   f"frames are zstd-compressed")
            if compression == "none" and zstd:
                raise HarnessError(f"{stream}/{partition} has zstd frames")
    if not any(f.control for f in frames):
        raise HarnessError("the log has no control (commit/abort) frames")


def describe(built: BuiltLog) -> dict:
    """Counts that say what the log under test is made of."""
    out = {"frames": len(built.frames),
           "segments": len({f.segment for f in built.frames}),
           "records": sum(len(e.records) for e in built.expected.values()),
           "control_frames": sum(f.control for f in built.frames),
           "zstd_frames": sum(f.codec == CODEC_ZSTD for f in built.frames),
           "txn_frames": sum(f.txn_id != 0 for f in built.frames)}
    return out


def save_built(built: BuiltLog, path: str) -> None:
    with open(path, "wb") as file:
        pickle.dump(built, file)


def load_built(path: str) -> BuiltLog:
    with open(path, "rb") as file:
        return pickle.load(file)


@contextlib.contextmanager
def quiet_streamlog_logging():
    """Keep recovery's warnings and errors off stderr during a sweep (the verdicts say
    what happened); the handler it yields keeps their messages (`handler.messages`)."""
    logger = logging.getLogger("streamlog")
    saved = logger.handlers[:], logger.propagate, logger.level
    handler = _CountingHandler()
    logger.handlers[:] = [handler]
    logger.propagate = False
    try:
        yield handler
    finally:
        logger.handlers[:], logger.propagate, logger.level = saved


class _CountingHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record) -> None:
        self.messages.append(record.getMessage())


# -- shared judging ----------------------------------------------------------------------

def fresh_copy(built: BuiltLog, work: str) -> str:
    copy = os.path.join(work, "copy")
    if os.path.exists(copy):
        shutil.rmtree(copy)
    shutil.copytree(built.path, copy)
    return copy


def relative(path: str, root: str) -> str:
    return os.path.relpath(os.path.realpath(path), os.path.realpath(root))


def _error_text(error: BaseException) -> str:
    return f"{type(error).__module__}.{type(error).__name__}: {error}"[:300]


def read_all(reader_factory, *, arrow: bool = False):
    """(delivered, error): what a reader delivers before it stops, and why it stopped.
    With arrow=True, delivered holds (offset, timestamp, key, value) per row."""
    delivered = []
    try:
        reader = reader_factory()
        if arrow:
            for batch in reader.arrow():
                offsets = batch.column("offset").to_pylist()
                times = batch.column("timestamp").cast("int64").to_pylist()
                keys = batch.column("key").to_pylist()
                values = batch.column("value").to_pylist()
                delivered += list(zip(offsets, times, keys, values))
        else:
            for record in reader.records():
                delivered.append(rec(record))
    except Exception as error:  # noqa: BLE001 (judged by the caller)
        return delivered, error
    return delivered, None


def judge_read(delivered, error, expected: list, *, cut: int | None, where=None,
               root: str = "") -> tuple[str, str]:
    """Category of one read of a partition, and a sentence saying what happened.

    `cut` is the number of records that must be delivered before the damage (None: the
    partition is undamaged and must be read in full); `where` is (segment, position)
    that the CorruptSegment must name (relative path)."""
    for i, got in enumerate(delivered):
        if i >= len(expected):
            return WRONG, f"{len(delivered)} records delivered, {len(expected)} exist"
        if got != expected[i]:
            return WRONG, f"record {i} differs: got {_short(got)}, expected {_short(expected[i])}"
    n = len(delivered)
    if error is not None and not isinstance(error, StreamLogError):
        return RAW, f"after {n} records: {_error_text(error)}"
    if cut is None:
        if error is not None:
            return OTHER_ERROR, f"after {n} records: {_error_text(error)}"
        if n < len(expected):
            return SILENT_SHORT, f"{n} of {len(expected)} records, no error"
        return OK, ""
    if error is None:
        if n < len(expected):
            return SILENT_SHORT, f"{n} of {len(expected)} records (damage before record " \
                                 f"{cut}), no error"
        return MISSED, f"all {n} records delivered, no error"
    if not isinstance(error, CorruptSegment):
        return OTHER_ERROR, f"after {n} records (expected {cut}): {_error_text(error)}"
    named = (relative(error.path, root), error.position)
    if named == tuple(where) and n < cut:
        return EARLY_ERROR, (f"CorruptSegment at the damage after {n} records; "
                             f"{cut} come before it")
    if named != tuple(where) or n != cut:
        return WRONG_POSITION, (f"after {n} records (expected {cut}): CorruptSegment at "
                                f"{named[0]}:{named[1]} ({error.reason}), damage at "
                                f"{where[0]}:{where[1]}")
    return DETECTED, ""


def _short(item) -> str:
    text = repr(tuple(item))
    return text if len(text) < 120 else text[:117] + "..."


def run_verify(path: str) -> tuple[int, dict | None, str]:
    """`streamlog verify PATH --json` in this process: (exit code, summary, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["verify", path, "--json"])
    summary = None
    for line in out.getvalue().splitlines():
        with contextlib.suppress(ValueError):
            summary = json.loads(line)
    return code, summary, err.getvalue()


# -- segment flips -----------------------------------------------------------------------

class SegmentTarget(NamedTuple):
    frame: FrameInfo
    position: int  # byte position in the segment file
    bit: int

    @property
    def in_header(self) -> bool:
        return self.position - self.frame.position < HEADER_BYTES


def segment_targets(built: BuiltLog, rng: random.Random, *, partitions=None,
                    payload_per_frame: int = 4, header_bytes=None) -> list[SegmentTarget]:
    """Every header byte (one random bit each) of every frame of `partitions` (default
    all), plus `payload_per_frame` random payload bytes per frame. `header_bytes`, when
    given, keeps only these header byte numbers (0..71)."""
    targets = []
    keep = None if partitions is None else {f"{s}/{p}" for s, p in partitions}
    for frame in built.frames:
        if keep is not None and frame.key not in keep:
            continue
        for byte in range(HEADER_BYTES):
            if header_bytes is None or byte in header_bytes:
                targets.append(SegmentTarget(frame, frame.position + byte, rng.randrange(8)))
        payload = frame.size - HEADER_BYTES
        for byte in rng.sample(range(payload), min(payload_per_frame, payload)):
            targets.append(SegmentTarget(frame, frame.position + HEADER_BYTES + byte,
                                         rng.randrange(8)))
    return targets


@dataclasses.dataclass
class SegmentResult:
    target: SegmentTarget
    verify: str
    reader: str  # records() of the damaged partition, read-only open
    arrow: str  # arrow() of the damaged partition, read-only open
    others: str  # the undamaged partitions, read-only open
    writable: str  # REFUSED, or the worst category of its reads
    details: dict

    @property
    def violations(self) -> list[str]:
        """Contract counts this flip adds to: wrong, silent_short, raw."""
        found = [self.verify, self.reader, self.arrow, self.others, self.writable]
        return sorted({c for c in found if c in (WRONG, SILENT_SHORT, RAW)})

    def as_dict(self) -> dict:
        f = self.target.frame
        return {"segment": f.segment, "frame_position": f.position,
                "byte": self.target.position, "bit": self.target.bit,
                "in_header": self.target.in_header, "base_offset": f.base_offset,
                "verify": self.verify, "reader": self.reader, "arrow": self.arrow,
                "others": self.others, "writable": self.writable, "details": self.details}


def check_segment_flip(built: BuiltLog, work: str, target: SegmentTarget) -> SegmentResult:
    """Flip one bit and judge verify (on its own fresh copy: verify may record what it
    found in the log directory), then readers and a writable open on another one."""
    frame = target.frame
    where = (frame.segment, frame.position)
    details: dict[str, str] = {}
    copy = fresh_copy(built, work)
    flip_bit(os.path.join(copy, frame.segment), target.position, target.bit)
    verify = _judge_verify(copy, where, details)
    copy = fresh_copy(built, work)
    flip_bit(os.path.join(copy, frame.segment), target.position, target.bit)
    expected = built.expected[frame.key]
    cut = frame.base_offset  # offsets are dense from 0: index == offset
    reader = arrow = others = RAW
    try:
        with streamlog.open_log(copy, readonly=True) as log:
            delivered, error = read_all(lambda: log.reader(
                frame.stream, frame.partition, from_offset=0, read_committed=False,
                data_only=False))
            reader, details["reader"] = judge_read(delivered, error, expected.records,
                                                   cut=cut, where=where, root=copy)
            delivered, error = read_all(lambda: log.reader(
                frame.stream, frame.partition, from_offset=0, read_committed=False,
                data_only=False), arrow=True)
            rows = [(r.offset, r.timestamp_us, r.key, r.value) for r in expected.records]
            arrow, details["arrow"] = judge_read(delivered, error, rows, cut=cut,
                                                 where=where, root=copy)
            others, details["others"] = _read_others(log, built, frame.key)
    except Exception as error:  # noqa: BLE001 (the open itself failed)
        category = OTHER_ERROR if isinstance(error, StreamLogError) else RAW
        reader = arrow = others = category
        details["readonly_open"] = _error_text(error)
    writable = _judge_writable(built, copy, frame, where, details)
    return SegmentResult(target, verify, reader, arrow, others, writable,
                         {k: v for k, v in details.items() if v})


def _judge_verify(copy: str, where, details: dict) -> str:
    try:
        code, summary, stderr = run_verify(copy)
    except Exception as error:  # noqa: BLE001
        details["verify"] = f"{_error_text(error)} at {_where_raised(error)}"
        return RAW
    findings = (summary or {}).get("findings", [])
    named = [(relative(f["path"], copy), f["position"], f["kind"]) for f in findings]
    at = [kind for path, position, kind in named if (path, position) == tuple(where)]
    if code == 1 and at:
        return DETECTED
    if code == 0 and at:
        details["verify"] = f"exit 0, finding at the damage is {at[0]!r}"
        return TORN_ONLY
    if named:
        details["verify"] = (f"exit {code}, findings at "
                             f"{[f'{p}:{q} {k}' for p, q, k in named][:3]}, damage at "
                             f"{where[0]}:{where[1]}")
        return WRONG_POSITION
    details["verify"] = f"exit {code}, no finding: {stderr.strip()[:200]}"
    return MISSED


_TABLES: dict[tuple[str, str], object] = {}


def _expected_table(built: BuiltLog, key: str):
    """The undamaged partition as one Arrow table (read once per process)."""
    import pyarrow as pa
    found = _TABLES.get((built.path, key))
    if found is None:
        stream, partition = key.split("/")
        with streamlog.open_log(built.path, readonly=True) as log:
            batches = list(log.reader(stream, int(partition), from_offset=0,
                                      read_committed=False, data_only=False).arrow())
        found = _TABLES[(built.path, key)] = pa.Table.from_batches(batches)
        rows = found.num_rows
        if rows != len(built.expected[key].records):
            raise HarnessError(f"{key}: arrow gives {rows} rows")
    return found


def _read_others(log, built: BuiltLog, damaged: str) -> tuple[str, str]:
    """Read every undamaged partition in full (Arrow, compared as whole tables; the
    record-by-record judgement only when they differ)."""
    import pyarrow as pa
    worst, text = OK, ""
    for stream, partition in built.partitions():
        key = f"{stream}/{partition}"
        if key == damaged:
            continue
        try:
            batches = list(log.reader(stream, partition, from_offset=0,
                                      read_committed=False, data_only=False).arrow())
            expected = _expected_table(built, key)
            if batches and pa.Table.from_batches(batches).equals(expected):
                continue
        except Exception:  # noqa: BLE001 (judged below, record by record)
            pass
        delivered, error = read_all(lambda: log.reader(stream, partition, from_offset=0,
                                                       read_committed=False, data_only=False))
        category, why = judge_read(delivered, error, built.expected[key].records, cut=None)
        if category == OK:
            category, why = WRONG, "records() equal, arrow() differs"
        if _rank(category) > _rank(worst):
            worst, text = category, f"{key}: {why}"
    return worst, text


def _judge_writable(built: BuiltLog, copy: str, frame: FrameInfo, where,
                    details: dict) -> str:
    try:
        log = streamlog.open_log(copy, fsync="always")
    except CorruptSegment as error:
        named = (relative(error.path, copy), error.position)
        if named == tuple(where):
            return REFUSED
        details["writable"] = f"refused naming {named[0]}:{named[1]}: {error.reason}"
        return WRONG_POSITION
    except Exception as error:  # noqa: BLE001
        details["writable"] = f"open: {_error_text(error)}"
        return OTHER_ERROR if isinstance(error, StreamLogError) else RAW
    try:
        expected = built.expected[frame.key]
        delivered, error = read_all(lambda: log.reader(
            frame.stream, frame.partition, from_offset=0, read_committed=False,
            data_only=False))
        category, why = judge_read(delivered, error, expected.records, cut=frame.base_offset,
                                   where=where, root=copy)
        for stream, partition in built.partitions():  # read in full by the read-only
            key = f"{stream}/{partition}"                # open; here only their ends
            end = log.end_offset(stream, partition)
            if key != frame.key and end != built.expected[key].end_offset and (
                    _rank(category) < _rank(WRONG)):
                category, why = WRONG, f"{key} end_offset {end}"
        if category == DETECTED:
            category = OK  # opened, and its reader stops at the damage
        details["writable"] = f"opened; {why}" if why else ""
        return category
    finally:
        with contextlib.suppress(Exception):
            log.close()


_RANKS = {OK: 0, DETECTED: 0, REFUSED: 0, MISSED: 1, TORN_ONLY: 1, WRONG_POSITION: 2,
          EARLY_ERROR: 2, OTHER_ERROR: 3, SILENT_SHORT: 4, RAW: 5, HANG: 5, DEATH: 6, WRONG: 7}


def _rank(category: str) -> int:
    return _RANKS[category]


def summarize_segment(results: list[SegmentResult]) -> dict:
    """Flat counts (seg_*) over a sweep of segment flips."""
    out = {"seg_flips": len(results),
           "seg_header_flips": sum(r.target.in_header for r in results)}
    for name in ("verify", "reader", "arrow", "others", "writable"):
        for category in sorted({getattr(r, name) for r in results}):
            out[f"seg_{name}_{category}"] = sum(getattr(r, name) == category
                                                for r in results)
    out["seg_verify_detected"] = sum(r.verify == DETECTED for r in results)
    out["seg_reader_detected"] = sum(r.reader == DETECTED and r.arrow == DETECTED
                                     for r in results)
    for category in (WRONG, SILENT_SHORT, RAW):
        out[f"seg_{category}"] = sum(category in r.violations for r in results)
    return out


def segment_examples(results: list[SegmentResult], limit: int = 1) -> dict[str, list]:
    """First `limit` examples of each (check, category) that is not a pass."""
    passes = {"verify": {DETECTED}, "reader": {DETECTED}, "arrow": {DETECTED},
              "others": {OK}, "writable": {OK, REFUSED}}
    out: dict[str, list] = {}
    for r in results:
        for name, fine in passes.items():
            category = getattr(r, name)
            if category in fine:
                continue
            bucket = out.setdefault(f"{name}:{category}", [])
            if len(bucket) < limit:
                bucket.append(r.as_dict())
    return out


# -- index flips -------------------------------------------------------------------------

class IndexTarget(NamedTuple):
    partition: str  # "stream/partition"
    position: int
    bit: int
    region: str  # where in the file: see index_targets
    unsealed: bool  # the index seal removed first, as a killed writer leaves it


def index_targets(built: BuiltLog, rng: random.Random, count: int,
                  unsealed_share: float = 0.5) -> list[IndexTarget]:
    """`count` single-bit flips over the index files of every partition, in turn.

    A clean close seals the index (`index.seal`: a whole-file checksum that an open
    checks before LMDB reads the file), so a flip in a sealed index only tests that
    check. `unsealed_share` of the flips remove the seal first, as a killed writer
    leaves the index, so that LMDB and the per-entry checks meet the damaged bytes.

    A uniform sample would be almost all no-ops: LMDB pages are mostly empty and most
    data pages of a small index are free (copy-on-write leaves old pages behind). So
    the positions are drawn from the bytes LMDB would read (`lmdb_layout`), by region:

        meta-current  25%  the used bytes of the meta page with the higher txnid
        meta-other    10%  the used bytes of the other meta page
        meta-any       5%  anywhere in pages 0 and 1
        live          50%  the used bytes (header, pointers, nodes) of the pages
                           reachable from the current meta: the tree of every database
        data-any      10%  anywhere after the meta pages (free pages included)
    """
    keys = sorted(built.index_files)
    layouts = {key: lmdb_layout(os.path.join(built.path, built.index_files[key]))
               for key in keys}
    out = []
    for i in range(count):
        key = keys[i % len(keys)]
        current, other, live, size = layouts[key]
        roll = rng.random()
        if roll < 0.25:
            position, region = current * PAGE_BYTES + rng.randrange(_META_USED), "meta-current"
        elif roll < 0.35:
            position, region = other * PAGE_BYTES + rng.randrange(_META_USED), "meta-other"
        elif roll < 0.40 or size <= 2 * PAGE_BYTES:
            position, region = rng.randrange(2 * PAGE_BYTES), "meta-any"
        elif roll < 0.90 and live:
            position, region = rng.choice(live), "live"
        else:
            position, region = rng.randrange(2 * PAGE_BYTES, size), "data-any"
        out.append(IndexTarget(key, position, rng.randrange(8), region,
                               rng.random() < unsealed_share))
    return out


# LMDB's on-disk layout (lmdb.h / mdb.c, 64-bit): a page header is pgno u64, pad u16,
# flags u16, lower u16, upper u16; a meta page holds after it magic u32, version u32,
# address u64, mapsize u64, two MDB_db (free, main) of 48 bytes, last_pgno u64, txnid u64.
_PAGE_HEADER = struct.Struct("<QHHHH")
_DB = struct.Struct("<IHHQQQQQ")  # pad, flags, depth, branch, leaf, overflow, entries, root
_META_USED = 16 + 24 + 2 * 48 + 16
_P_BRANCH, _P_LEAF, _P_OVERFLOW, _P_META = 0x01, 0x02, 0x04, 0x08
_F_BIGDATA, _F_SUBDATA = 0x01, 0x02
_P_INVALID = (1 << 64) - 1


def lmdb_layout(path: str):
    """(current meta page, other meta page, [byte positions LMDB reads in the live
    tree pages], file size) of an LMDB data file."""
    with open(path, "rb") as file:
        data = file.read()
    metas = []
    for page in (0, 1):
        base = page * PAGE_BYTES + 16
        txnid = struct.unpack_from("<Q", data, base + 24 + 2 * 48 + 8)[0]
        dbs = [_DB.unpack_from(data, base + 24 + 48 * i) for i in range(2)]
        metas.append((txnid, page, dbs))
    metas.sort(reverse=True)
    _, current, dbs = metas[0]
    live: list[int] = []
    seen: set[int] = set()
    roots = [db[7] for db in dbs]
    while roots:
        page = roots.pop()
        if page == _P_INVALID or page in seen or page < 2 or (page + 1) * PAGE_BYTES > len(data):
            continue
        seen.add(page)
        at = page * PAGE_BYTES
        _, _, flags, lower, upper = _PAGE_HEADER.unpack_from(data, at)
        if flags & _P_OVERFLOW:
            count = struct.unpack_from("<I", data, at + 12)[0]
            live += range(at, at + min(count, 64) * PAGE_BYTES)
            continue
        if not flags & (_P_BRANCH | _P_LEAF) or not 16 <= lower <= upper <= PAGE_BYTES:
            continue
        live += range(at, at + lower)
        live += range(at + upper, at + PAGE_BYTES)
        for i in range((lower - 16) // 2):
            node = at + struct.unpack_from("<H", data, at + 16 + 2 * i)[0]
            if node + 8 > at + PAGE_BYTES:
                continue
            lo, hi, node_flags, key_size = struct.unpack_from("<HHHH", data, node)
            if flags & _P_BRANCH:
                roots.append(lo | hi << 16 | node_flags << 32)
                continue
            value = node + 8 + key_size
            if node_flags & _F_SUBDATA and value + _DB.size <= len(data):
                roots.append(_DB.unpack_from(data, value)[7])
            elif node_flags & _F_BIGDATA and value + 8 <= len(data):
                roots.append(struct.unpack_from("<Q", data, value)[0])
    return current, metas[1][1], live, len(data)


def collect_answers(log, built: BuiltLog, damaged: str | None = None) -> list[str]:
    """Every answer of every partition compared with the undamaged log's; returns one
    line per difference (empty: all equal). Exceptions propagate. With `damaged`, the
    other partitions (whose files are untouched) are checked by their offsets only."""
    problems = []
    for stream, partition in built.partitions():
        key = f"{stream}/{partition}"
        want = built.expected[key]
        if damaged is not None and key != damaged:
            for label, got, expected in (
                    ("end_offset", log.end_offset(stream, partition), want.end_offset),
                    ("last_stable_offset", log.last_stable_offset(stream, partition),
                     want.last_stable_offset)):
                if got != expected:
                    problems.append(f"{key} {label}: {got!r}, expected {expected!r}")
            continue

        def check(label, got, expected):
            if got != expected:
                problems.append(f"{key} {label}: {_diff(got, expected)}")

        def records(**options):
            return [rec(r) for r in log.reader(stream, partition, **options)]

        check("records", records(from_offset=0, read_committed=False, data_only=False),
              want.records)
        check("committed", records(), want.committed)
        for offset in want.from_offsets:
            check(f"records from {offset}", records(from_offset=offset,
                                                    read_committed=False, data_only=False),
                  want.records[offset:])
        check("end_offset", log.end_offset(stream, partition), want.end_offset)
        check("last_stable_offset", log.last_stable_offset(stream, partition),
              want.last_stable_offset)
        for t, offset in want.times.items():
            check(f"offset_for_timestamp({t})", log.offset_for_timestamp(stream, partition, t),
                  offset)
        for t in list(want.times)[1::3]:
            check(f"records from timestamp {t}",
                  records(from_timestamp_us=t, read_committed=False, data_only=False),
                  want.records[want.times[t]:])
        for txn_id, state in want.txns.items():
            check(f"txn_state({txn_id:#x})",
                  _state(log.txn_state(stream, partition, txn_id)), state)
    return problems


def _diff(got, expected) -> str:
    if isinstance(got, list) and isinstance(expected, list):
        for i, (a, b) in enumerate(zip(got, expected)):
            if a != b:
                return f"item {i} is {_short(a)}, expected {_short(b)}"
        return f"{len(got)} items, expected {len(expected)}"
    return f"{got!r}, expected {expected!r}"


def check_index_flip(built: BuiltLog, work: str, target: IndexTarget) -> dict:
    """Flip one bit of one index file in a fresh copy, then: a read-only open and every
    answer, a writable open and every answer, close, a second writable open and every
    answer. Returns {"category", "phases": {phase: category}, "detail", "rebuilt"}."""
    copy = fresh_copy(built, work)
    index_file = os.path.join(copy, built.index_files[target.partition])
    if target.unsealed:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.dirname(index_file) + ".seal")
    flip_bit(index_file, target.position, target.bit)
    phases, detail = {}, ""
    with quiet_streamlog_logging() as handler:
        for phase, options in (("readonly", {"readonly": True}), ("writable", {}),
                               ("reopen", {})):
            try:
                with streamlog.open_log(copy, fsync="always", **options) as log:
                    problems = collect_answers(log, built, target.partition)
                phases[phase] = WRONG if problems else OK
                if problems and not detail:
                    detail = f"{phase}: {problems[0]}"
            except Exception as error:  # noqa: BLE001
                phases[phase] = OTHER_ERROR if isinstance(error, StreamLogError) else RAW
                if not detail:
                    detail = f"{phase}: {_error_text(error)}"
                    if phases[phase] == RAW:
                        detail += " at " + _where_raised(error)
    category = max(phases.values(), key=_rank)
    rebuilt = any("rebuild" in m for m in handler.messages)
    return {"category": category, "phases": phases, "detail": detail, "rebuilt": rebuilt}


def _where_raised(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    mine = [f for f in frames if "streamlog" in f.filename] or frames
    last = mine[-1] if mine else None
    return f"{os.path.basename(last.filename)}:{last.lineno}" if last else "?"


class IndexSweep:
    """Runs index flips in a worker process (`index-worker`), many per worker, and
    starts a new worker when one dies (the flip it was on counts as DEATH, with its
    signal) or hangs (HANG, after `timeout_s`)."""

    def __init__(self, built: BuiltLog, work: str, *, timeout_s: float = 60.0) -> None:
        self.built = built
        self.work = work
        self.timeout_s = timeout_s
        os.makedirs(work, exist_ok=True)
        self.pickle_path = os.path.join(work, "built.pickle")
        save_built(built, self.pickle_path)
        self.process = None
        self.stderr_path = os.path.join(work, "worker-stderr.txt")
        self.deaths = 0
        self._hung = False
        self._stderr_mark = 0

    def _start(self) -> None:
        env = _helper_env()
        env["PYTHONFAULTHANDLER"] = "1"
        with open(self.stderr_path, "ab") as stderr:
            self.process = subprocess.Popen(
                _helper_command("index-worker", self.pickle_path), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=stderr, env=env)

    def run(self, target: IndexTarget) -> dict:
        if self.process is None or self.process.poll() is not None:
            self._start()
        self._stderr_mark = os.path.getsize(self.stderr_path)
        job = json.dumps({"partition": target.partition, "position": target.position,
                          "bit": target.bit, "region": target.region,
                          "unsealed": target.unsealed,
                          "work": os.path.join(self.work, "w")}) + "\n"
        try:
            self.process.stdin.write(job.encode())
            self.process.stdin.flush()
        except BrokenPipeError:
            pass
        line = self._read_line()
        if line is None:
            return self._dead()
        result = json.loads(line)
        return result

    def _read_line(self) -> bytes | None:
        deadline = time.monotonic() + self.timeout_s
        stdout = self.process.stdout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.process.kill()
                self.process.wait()
                self._hung = True
                return None
            ready, _, _ = select.select([stdout], [], [], left)
            if ready:
                line = stdout.readline()
                return line if line else None

    def _dead(self) -> dict:
        hung, self._hung = self._hung, False
        code = self.process.wait()
        self.process = None
        self.deaths += 1
        if hung:
            return {"category": HANG, "phases": {}, "detail": f"no answer in "
                    f"{self.timeout_s:.0f} s: worker killed", "rebuilt": False}
        what = (f"signal {signal.Signals(-code).name}" if code < 0 else f"exit {code}")
        return {"category": DEATH, "phases": {}, "detail": f"worker died: {what} in "
                f"{_crash_site(self.stderr_path, self._stderr_mark)}", "rebuilt": False,
                "signal": what}

    def close(self) -> None:
        if self.process is not None:
            with contextlib.suppress(Exception):
                self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None


def _crash_site(path: str, mark: int) -> str:
    """The innermost frames faulthandler printed for the crashing thread (written to
    the worker's stderr after `mark`), innermost first."""
    with contextlib.suppress(OSError), open(path, errors="replace") as file:
        file.seek(mark)
        text = file.read()
        at = text.find("Current thread")
        frames = []
        for line in text[at:].splitlines()[1:] if at >= 0 else []:
            line = line.strip()
            if not line.startswith("File "):
                break
            name, _, rest = line[6:].partition('", line ')
            frames.append(f"{os.path.basename(name)}:{rest}")
        return " < ".join(frames[:4]) or _tail(path)
    return "?"


def _tail(path: str, lines: int = 3) -> str:
    with contextlib.suppress(OSError), open(path, errors="replace") as file:
        text = [line.strip() for line in file.read().splitlines() if line.strip()]
        return " | ".join(text[-lines:])[:300]
    return ""


def index_worker_main(pickle_path: str) -> None:
    """The worker: one JSON job per stdin line, one JSON result per stdout line."""
    built = load_built(pickle_path)
    out = sys.stdout
    for line in sys.stdin:
        job = json.loads(line)
        target = IndexTarget(job["partition"], job["position"], job["bit"], job["region"],
                             job["unsealed"])
        os.makedirs(job["work"], exist_ok=True)
        try:
            result = check_index_flip(built, job["work"], target)
        except Exception as error:  # noqa: BLE001 (a harness failure: report it)
            result = {"category": RAW, "phases": {}, "rebuilt": False,
                      "detail": f"harness: {_error_text(error)} at {_where_raised(error)}"}
        out.write(json.dumps(result) + "\n")
        out.flush()


def failure_kind(detail: str) -> str:
    """The kind of an index failure, for grouping: its phase and what failed (the answer
    asked for, or the exception type and where it was raised), without the numbers."""
    import re
    phase, _, rest = detail.partition(": ")
    if rest[:1].isalpha() and "/" in rest.split(" ")[0]:  # "z/0 answer ...: got, expected"
        rest = rest.split(" ", 1)[1].split(":")[0]
        rest = re.sub(r"0x[0-9a-f]+|[0-9]+", "N", rest)
    else:
        rest = re.sub(r":.*( at )", r"\1", rest)
    return f"{phase}: {rest}"[:90]


def summarize_index(targets: list[IndexTarget], results: list[dict]) -> dict:
    out = {"index_flips": len(results)}
    for category in (OK, WRONG, RAW, OTHER_ERROR, DEATH, HANG):
        out[f"index_{category}"] = sum(r["category"] == category for r in results)
    out["index_rebuilt_with_warning"] = sum(bool(r.get("rebuilt")) for r in results)
    for region in ("meta-current", "meta-other", "meta-any", "live", "data-any"):
        mine = [r for t, r in zip(targets, results) if t.region == region]
        name = region.replace("-", "_")
        out[f"index_{name}_flips"] = len(mine)
        out[f"index_{name}_failures"] = sum(r["category"] != OK for r in mine)
    for sealed in ("sealed", "unsealed"):
        mine = [r for t, r in zip(targets, results) if t.unsealed == (sealed == "unsealed")]
        out[f"index_{sealed}_flips"] = len(mine)
        out[f"index_{sealed}_failures"] = sum(r["category"] != OK for r in mine)
    for phase in ("readonly", "writable", "reopen"):
        for category in (WRONG, RAW, OTHER_ERROR):
            out[f"index_{phase}_{category}"] = sum(r["phases"].get(phase) == category
                                                   for r in results)
    return out


def index_examples(targets, results, limit: int = 1) -> dict[str, list]:
    out: dict[str, list] = {}
    for target, result in zip(targets, results):
        if result["category"] == OK:
            continue
        bucket = out.setdefault(f"{result['category']}:{failure_kind(result['detail'])}", [])
        if len(bucket) < limit:
            bucket.append({"index": target.partition, "position": target.position,
                           "bit": target.bit, "region": target.region,
                           "unsealed": target.unsealed, **result})
    return out


# -- damaged tails after a kill ----------------------------------------------------------

TAIL_STREAM = "t"
TAIL_SEGMENT_BYTES_MAX = 8192
TAIL_ORIGIN = struct.Struct(">II")  # seq, row
TAIL_MODES = ("truncate", "zeros", "garbage", "stale")


def tail_call(seed: int, seq: int):
    """(values, keys, timestamps_us) of append `seq`: a pure function of (seed, seq)."""
    rng = random.Random((seed << 32) ^ seq)
    count = rng.choice((1, 1, 1, 2, 4, 9, rng.randint(1, 40)))
    values = [TAIL_ORIGIN.pack(seq, row) + _value(rng, seq) for row in range(count)]
    keys = [None if rng.random() < 0.3 else b"k%d" % rng.randrange(50) for _ in range(count)]
    timestamps = [EPOCH_US + seq * 1000 + rng.randint(-3000, 3000) for _ in range(count)]
    return values, keys, timestamps


def tail_writer_main(path: str, seed: int) -> None:
    """Append with fsync="always" until killed; print READY, then `A seq first count`
    per acknowledged append (`B seq` before submitting it)."""
    import asyncio
    import itertools

    compression = "zstd" if seed % 2 else "none"
    log = streamlog.open_log(path, fsync="always", compression=compression,
                             segment_bytes_max=TAIL_SEGMENT_BYTES_MAX)
    log.create_stream(TAIL_STREAM, 1)
    print(f"READY {log.end_offset(TAIL_STREAM, 0)}", flush=True)
    numbers = itertools.count()

    async def task() -> None:
        while True:
            seq = next(numbers)
            values, keys, timestamps = tail_call(seed, seq)
            print(f"B {seq}", flush=True)
            result = await log.append_batch(TAIL_STREAM, values, keys=keys,
                                            timestamps_us=timestamps, partition=0)
            print(f"A {seq} {result.ranges[0][0]} {len(values)}", flush=True)

    async def run() -> None:
        await asyncio.gather(*(task() for _ in range(3)))

    asyncio.run(run())


@dataclasses.dataclass
class TailResult:
    mode: str  # the damage applied (truncate, torn, zeros, garbage, stale, stale+torn)
    acked_records: int
    category: str  # OK, or the first contract breach
    detail: str
    readonly: str  # what a read-only open before it made of the damaged log
    verify_before: str  # verify before the writable open: OK (exit 0) or what it said

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def run_tail_writer(path: str, seed: int, run_s: float, stderr_path: str):
    """Start the writer, SIGKILL it `run_s` seconds after READY; returns
    (started seqs, {seq: (first, count)} acknowledged)."""
    process = subprocess.Popen(_helper_command("tail-writer", path, str(seed)),
                               stdout=subprocess.PIPE, stderr=open(stderr_path, "wb"),
                               text=True, bufsize=1, env=_helper_env())
    lines: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        for line in process.stdout:
            lines.append(line)
            if line.startswith("READY"):
                ready.set()

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    if not ready.wait(60):
        process.kill()
        process.wait()
        raise HarnessError(f"the tail writer never got ready: {_tail(stderr_path)}")
    time.sleep(run_s)
    process.send_signal(signal.SIGKILL)
    code = process.wait(60)
    thread.join(60)
    if code != -signal.SIGKILL:
        raise HarnessError(f"the tail writer exited by itself ({code}): {_tail(stderr_path)}")
    started, acked = set(), {}
    for line in lines:
        if not line.endswith("\n"):
            continue
        kind, *fields = line.split()
        if kind == "B":
            started.add(int(fields[0]))
        elif kind == "A":
            seq, first, count = map(int, fields)
            acked[seq] = (first, count)
    return started, acked


def damage_tail(path: str, acked_end: int, mode: str,
                rng: random.Random) -> tuple[str, tuple[str, int] | None]:
    """Damage the last segment of the tail stream past the acknowledged end; returns
    the damage actually applied and, for a cut frame, (segment path, position).
    "truncate" cuts the last frame when it was not acknowledged, and otherwise becomes
    "torn": a prefix of the frame that would have come next (right magic, right base
    offset) is appended instead."""
    segments = _segment_paths(os.path.join(path, "streams", TAIL_STREAM, "0"))
    last = segments[-1]
    frames = []
    for segment in segments:
        frames += [(segment, e) for e in walk_file(segment)[0]]
    mine = [e for s, e in frames if s == last]
    if mode == "truncate":
        if mine and mine[-1].base_offset >= acked_end:
            victim = mine[-1]
            cut = rng.randrange(victim.position + 1, victim.end_position)
            os.truncate(last, cut)
            return "truncate", (last, victim.position)
        mode = "torn"
    raw = [_frame_bytes(s, e) for s, e in frames]
    with open(last, "ab") as file:
        if mode == "torn":  # the next frame, as a writer would have begun it, cut short
            if not frames:
                file.write(b"SLOG"[:rng.randint(1, 3)])
                return mode, None
            model = rng.choice(frames)[1]
            following = encode_frame(
                base_offset=frames[-1][1].next_offset, record_count=model.record_count,
                min_timestamp_us=model.min_timestamp_us,
                max_timestamp_us=model.max_timestamp_us, txn_id=model.txn_id,
                flags=model.flags, raw_bytes=model.raw_bytes, payload=bytes(model.payload))
            file.write(following[:rng.randrange(1, len(following))])
        elif mode == "zeros":
            file.write(bytes(rng.randint(1, 9000)))
        elif mode == "garbage":
            file.write(rng.randbytes(rng.randint(1, 9000)))
        elif mode == "stale":
            if not raw:
                file.write(bytes(100))
                return "zeros", None
            torn = rng.random() < 0.5
            if torn:
                partial = rng.choice(raw)
                file.write(partial[:rng.randrange(1, len(partial))])
            file.write(rng.choice(raw))
            mode = "stale+torn" if torn else "stale"
        else:
            raise ValueError(mode)
    return mode, None


def _frame_bytes(path: str, frame: Frame) -> bytes:
    with open(path, "rb") as file:
        file.seek(frame.position)
        return file.read(frame.size)


def check_tail_damage(work: str, seed: int, mode: str, rng: random.Random,
                      run_s: float) -> TailResult:
    """One kill: fresh log, writer killed after `run_s`, tail damaged by `mode`, then
    the contract checked."""
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, f"tail-{seed}")
    if os.path.exists(path):
        shutil.rmtree(path)
    try:
        started, acked = run_tail_writer(path, seed, run_s,
                                         os.path.join(work, "tail-stderr"))
    except HarnessError as error:  # the writer could not run: nothing to damage
        return TailResult(mode, 0, "writer_failed", str(error)[:300], "", "")
    acked_end = max((first + count for first, count in acked.values()), default=0)
    acked_records = sum(count for _, count in acked.values())
    applied, cut = damage_tail(path, acked_end, mode, rng)
    with quiet_streamlog_logging():
        verify_before = _tail_verify(path)  # before any writer: a torn tail is exit 0
        readonly = _tail_read(path, seed, started, acked, readonly=True)[0]
        category, detail, error = _tail_read(path, seed, started, acked, readonly=False)
        if (category == "open_failed" and cut is not None and isinstance(
                error, CorruptSegment) and (os.path.realpath(error.path), error.position)
                == (os.path.realpath(cut[0]), cut[1])):
            # The cut frame was never acknowledged to the writer, but it had been
            # written and fsynced and the index said so before the kill: DESIGN 4 calls
            # that corruption, the brief's contract a tear. Counted on its own.
            category = REFUSED_UNACKED
        if category == OK:
            after = _tail_verify(path)
            if after != OK:
                category, detail = "verify_failed", f"after the writable open: {after}"
    return TailResult(applied, acked_records, category, detail, readonly, verify_before)


def _tail_verify(path: str) -> str:
    """OK when `verify` exits 0, else what it said (or raised)."""
    try:
        code, summary, stderr = run_verify(path)
    except Exception as error:  # noqa: BLE001
        return f"verify raised {_error_text(error)} at {_where_raised(error)}"
    if code == 0:
        return OK
    findings = [(f.get("kind"), f.get("reason")) for f in (summary or {}).get("findings", [])]
    return f"exit {code}: {findings[:2] or stderr.strip()[:200]}"[:300]


def _tail_read(path: str, seed: int, started, acked, *, readonly: bool):
    """(category, detail, error) of one open of the damaged tail log: OK, "open_failed",
    "lost_acked", WRONG (something delivered that was never appended), RAW."""
    calls = {}
    try:
        with streamlog.open_log(path, readonly=readonly, fsync="always") as log:
            records = [rec(r) for r in log.reader(TAIL_STREAM, 0, from_offset=0,
                                                   read_committed=False, data_only=False)]
    except StreamLogError as error:
        return "open_failed", _error_text(error), error
    except Exception as error:  # noqa: BLE001
        return RAW, f"{_error_text(error)} at {_where_raised(error)}", error
    where = {}
    for i, r in enumerate(records):
        if r.offset != i:
            return WRONG, f"offset {r.offset} at index {i}: not dense", None
        try:
            seq, row = TAIL_ORIGIN.unpack_from(r.value)
        except struct.error:
            return WRONG, f"offset {r.offset} holds {r.value[:16]!r}: never appended", None
        if seq not in started:
            return WRONG, f"offset {r.offset} holds append {seq}, never started", None
        if seq not in calls:
            calls[seq] = tail_call(seed, seq)
        values, keys, timestamps = calls[seq]
        if row >= len(values) or (r.value, r.key, r.timestamp_us) != (
                values[row], keys[row], timestamps[row]) or r.kind:
            return WRONG, f"offset {r.offset} differs from append {seq} row {row}", None
        if (seq, row) in where:
            return WRONG, f"append {seq} row {row} delivered twice", None
        where[(seq, row)] = r.offset
    for seq, (first, count) in sorted(acked.items()):
        if [where.get((seq, row)) for row in range(count)] != list(range(first, first + count)):
            return "lost_acked", (f"acknowledged append {seq} at {first}..{first + count - 1}"
                                  f" is missing or moved ({len(records)} records read)"), None
    return OK, "", None


def summarize_tail(results: list[TailResult]) -> dict:
    out = {"tail_kills": len(results),
           "tail_acked_records": sum(r.acked_records for r in results)}
    for category in (OK, "open_failed", "lost_acked", WRONG, RAW, "verify_failed",
                     "writer_failed", REFUSED_UNACKED):
        out[f"tail_{category}"] = sum(r.category == category for r in results)
    out["tail_readonly_not_ok"] = sum(r.readonly != OK for r in results)
    out["tail_verify_before_not_ok"] = sum(r.verify_before != OK for r in results)
    for mode in ("truncate", "torn", "zeros", "garbage", "stale", "stale+torn"):
        mine = [r for r in results if r.mode == mode]
        key = mode.replace("+", "_")
        out[f"tail_mode_{key}"] = len(mine)
        out[f"tail_mode_{key}_failures"] = sum(r.category != OK for r in mine)
    return out


# -- entry point for the helper processes -------------------------------------------------

def _helper_command(*argv: str) -> list[str]:
    """The command line of a helper process: this module, by its module path."""
    return [sys.executable, "-m", "harness.damage", *argv]


def _helper_env() -> dict[str, str]:
    """The environment of a helper process: this one's, with tests/ (which holds the
    `harness` package) and the directory of the streamlog this process runs first on
    PYTHONPATH, so the child imports the same code, whatever its working directory."""
    tests_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    streamlog_root = os.path.dirname(os.path.dirname(os.path.abspath(streamlog.__file__)))
    assert os.path.isfile(os.path.join(tests_dir, "harness", "__init__.py")), tests_dir
    assert os.path.isdir(os.path.join(streamlog_root, "streamlog")), streamlog_root
    env = dict(os.environ)
    inherited = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([tests_dir, streamlog_root,
                                                       *inherited]))
    return env


def main(argv: list[str]) -> None:
    if argv[:1] == ["tail-writer"] and len(argv) == 3:
        tail_writer_main(argv[1], int(argv[2]))
    elif argv[:1] == ["index-worker"] and len(argv) == 2:
        index_worker_main(argv[1])
    else:
        sys.stderr.write(__doc__.split("Run as a program")[1])
        sys.exit(2)


if __name__ == "__main__":
    main(sys.argv[1:])
