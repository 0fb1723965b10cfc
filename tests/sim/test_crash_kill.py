"""The real thing: a writer process killed with SIGKILL, over and over (DESIGN 3, 4).

Each round starts `crash_writer.py` on the same log directory (fsync="always", small
segments, so the log grows and rolls across rounds), lets it append for a random time,
kills it, and reopens the log in this process:

  * every append the writer reported as acknowledged is there, at its offsets, byte
    for byte (the parent regenerates the content from (seed, round, seq));
  * everything from earlier rounds is unchanged;
  * beyond the acknowledged records there is only what the writer was appending when
    it died: a prefix of an append it had announced, nothing else;
  * offsets are dense, a read-only open first sees the same records and changes no
    file, and the writable open leaves a log the next round appends to.

A kill keeps what reached the page cache, so this tests the process-crash half of
DESIGN 3; power loss is simulated in test_faults.py.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os
import random
import subprocess
import sys
import threading
import time

import pytest
import xxhash

import streamlog

_HERE = os.path.dirname(os.path.abspath(__file__))
_WRITER_PATH = os.path.join(_HERE, "crash_writer.py")
_spec = importlib.util.spec_from_file_location("crash_writer", _WRITER_PATH)
writer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(writer)

SEED = 20240611
ROUNDS = 20
DELAY_S_MIN, DELAY_S_MAX = 0.1, 1.4
STARTUP_S_MAX = 60.0


@dataclasses.dataclass
class Round:
    """What one writer process said before it died."""

    number: int
    ready_end: int | None = None
    started: set = dataclasses.field(default_factory=set)
    acked: dict = dataclasses.field(default_factory=dict)  # seq -> (first, count)

    def parse(self, line: str) -> None:
        kind, *fields = line.split()
        if kind == "READY":
            self.ready_end = int(fields[0])
        elif kind == "B":
            self.started.add(int(fields[0]))
        elif kind == "A":
            seq, first, count = map(int, fields)
            assert seq in self.started, line
            self.acked[seq] = (first, count)
        else:
            raise AssertionError(f"unexpected line from the writer: {line!r}")


def run_and_kill(path: str, number: int, delay_s: float, stderr_path: str) -> Round:
    """Run the writer for `delay_s` seconds, SIGKILL it, return what it reported."""
    result = Round(number)
    with open(stderr_path, "wb") as stderr:
        process = subprocess.Popen([sys.executable, _WRITER_PATH, path, str(number),
                                    str(SEED)], stdout=subprocess.PIPE, stderr=stderr,
                                   text=True, bufsize=1)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
        reader.start()
        time.sleep(delay_s)
        process.kill()
        code = process.wait(timeout=STARTUP_S_MAX)
        reader.join(timeout=STARTUP_S_MAX)
    if code != -9:
        with open(stderr_path, encoding="utf-8", errors="replace") as file:
            pytest.fail(f"round {number}: the writer exited by itself ({code}):\n"
                        f"{file.read()[-3000:]}")
    for line in lines:
        if line.endswith("\n"):  # a line cut by the kill is no report
            result.parse(line)
    return result


@dataclasses.dataclass
class Verified:
    """The log as checked after the previous round: origin and digest per offset."""

    origins: list = dataclasses.field(default_factory=list)
    digests: list = dataclasses.field(default_factory=list)


def check_round(log: streamlog.Log, records, state: Round, verified: Verified,
                context: str) -> Verified:
    """Check the reopened log against what the writer of this round reported."""
    end = log.end_offset(writer.STREAM, 0)
    assert [r.offset for r in records] == list(range(end)), f"{context}: offsets not dense"
    old = len(verified.origins)
    assert end >= old, f"{context}: the log lost records of earlier rounds ({end} < {old})"
    digests = [xxhash.xxh3_64_intdigest(r.value + (r.key or b"-")) ^ r.timestamp_us
               for r in records]
    assert digests[:old] == verified.digests, f"{context}: earlier rounds' records changed"
    if state.ready_end is not None:
        assert state.ready_end == old, f"{context}: the writer opened at {state.ready_end}"
    where: dict[tuple[int, int], int] = {}
    origins = list(verified.origins)
    calls: dict[int, tuple] = {}
    for record in records[old:]:
        round_number, seq, row = writer.ORIGIN.unpack_from(record.value)
        assert round_number == state.number and seq in state.started, \
            f"{context}: offset {record.offset} holds a record that was never appended"
        if seq not in calls:
            calls[seq] = writer.make_call(SEED, state.number, seq)
        _, values, keys, timestamps = calls[seq]
        expected = (values[row], keys[row], timestamps[row])
        assert (record.value, record.key, record.timestamp_us) == expected, \
            f"{context}: offset {record.offset} differs from append {seq} row {row}"
        assert (seq, row) not in where, f"{context}: {seq}/{row} delivered twice"
        where[(seq, row)] = record.offset
        origins.append((round_number, seq, row))
    for seq, (first, count) in state.acked.items():
        rows = [where.get((seq, row)) for row in range(count)]
        assert rows == list(range(first, first + count)), \
            f"{context}: acknowledged append {seq} at {first} is missing or moved"
    for seq in state.started - set(state.acked):
        rows = [where.get((seq, row)) for row in range(len(calls.get(seq, (0, []))[1]))]
        present = [r for r in rows if r is not None]
        assert rows[:len(present)] == present, f"{context}: in-flight {seq} has a hole"
        if present:
            assert present == list(range(present[0], present[0] + len(present))), context
    return Verified(origins, digests)


def file_sizes(path: str) -> dict[str, int]:
    return {name: os.path.getsize(name)
            for name in glob.glob(os.path.join(path, "streams", "*", "*", "*.log"))}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigkill_never_loses_an_acknowledged_record(tmp_path):
    rng = random.Random(SEED)
    path = str(tmp_path / "log")
    verified = Verified()
    torn_rounds = acked_total = 0
    for number in range(ROUNDS):
        delay_s = rng.uniform(DELAY_S_MIN, DELAY_S_MAX)
        context = f"seed={SEED} round={number} killed after {delay_s:.2f}s"
        state = run_and_kill(path, number, delay_s, str(tmp_path / f"stderr-{number}"))
        acked_total += sum(count for _, count in state.acked.values())
        if not os.path.exists(os.path.join(path, "streams", writer.STREAM, "stream.json")):
            assert not state.acked, context
            continue  # killed before the stream existed
        sizes = file_sizes(path)
        with streamlog.open_log(path, readonly=True) as log:
            values_read_only = [r.value for r in log.reader(writer.STREAM, 0)]
        assert file_sizes(path) == sizes, f"{context}: a read-only open changed files"
        with streamlog.open_log(path, segment_bytes_max=writer.SEGMENT_BYTES_MAX) as log:
            recovery = log.info()["streams"][writer.STREAM]["partitions"][0]["recovery"]
            torn_rounds += recovery["tail"] == "torn"
            assert recovery["tail"] in ("clean", "torn"), f"{context}: {recovery}"
            records = list(log.reader(writer.STREAM, 0))
            assert [r.value for r in records] == values_read_only, \
                f"{context}: the read-only open saw other records"
            verified = check_round(log, records, state, verified, context)
    assert acked_total > 1000, f"the writers acknowledged only {acked_total} records"
    print(f"{ROUNDS} rounds, {acked_total} acknowledged records, {len(verified.origins)} "
          f"in the log, {torn_rounds} torn tails, {len(file_sizes(path))} segments")
    assert len(file_sizes(path)) >= 2, "the log never rolled a segment"

