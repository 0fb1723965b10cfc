"""A process of test_multi_writer_kill.py: a writer or a follower of one shared local log.

Usage:
    python multi_writer_child.py write LOG NAME SEED OUT [--follow OUT2]
    python multi_writer_child.py follow LOG OUT
    python multi_writer_child.py tail LOG OUT

`write` opens LOG for writing beside the other writer processes and appends until it is
killed: singles and small batches of unique values (b"NAME:seq:row"), to a partition
chosen by the round (so every process writes every partition). After each append is
acknowledged it writes one line per record to OUT: "A partition offset value". With
--follow, a thread of the same process follows partition 0 through the writable log
(so it sees the other processes' appends by polling) and writes "F offset value" lines
to OUT2.

`follow` is a read-only view in its own process, as `streamlog read --follow` is: it
refreshes and reads every partition from where its OUT file says it got to (it may have
been killed before), and writes "F partition offset value" lines.

`tail` is a read-only view in its own process that never calls refresh(): its readers
follow (`reader(follow=True)`, a thread each: one per partition, and a second one on
partition 0) and take the writers' appends in by themselves. Each resumes from where
OUT says it got to and writes "T follower partition offset value" lines.

Lines are written with one os.write each, so a kill leaves at most one cut line (the
reader ignores a last line without its newline).
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time

import streamlog

STREAM = "shared"
PARTITIONS = 3
SEGMENT_BYTES_MAX = 64 * 1024


def _line(handle: int, text: str) -> None:
    os.write(handle, (text + "\n").encode())


def write(path: str, name: str, seed: int, out: str, follow_out: str | None) -> None:
    rng = random.Random(seed)
    handle = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    log = streamlog.open_log(path, segment_bytes_max=SEGMENT_BYTES_MAX)
    log.create_stream(STREAM, PARTITIONS)
    if follow_out is not None:
        threading.Thread(target=follow_in_process, args=(log, follow_out),
                         daemon=True).start()
    _line(handle, "READY")
    seq = 0
    while True:
        partition = rng.randrange(PARTITIONS)
        count = 1 if rng.random() < 0.6 else rng.randint(2, 6)
        values = [f"{name}:{seq}:{row}".encode() + b"." * rng.randint(0, 300)
                  for row in range(count)]
        if count == 1:
            first = log.append_sync(STREAM, values[0], partition=partition).offset
        else:
            first = log.append_batch_sync(STREAM, values, partition=partition).ranges[partition][0]
        for row, value in enumerate(values):
            _line(handle, f"A {partition} {first + row} {value.decode()}")
        seq += 1
        if rng.random() < 0.1:
            time.sleep(rng.random() * 0.01)


def follow_in_process(log, out: str) -> None:
    handle = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for record in log.reader(STREAM, 0, from_offset=0, follow=True):
        _line(handle, f"F {record.offset} {record.value.decode()}")


def resume(path: str, out: str,
           offset_field: int) -> tuple[dict[str, int], int, streamlog.Log]:
    """Where a read-only view goes on (it may have been killed before): (next offsets,
    OUT's handle, the log). The next offsets follow OUT's complete lines, keyed by each
    line's field 1 (a partition or a follower), with the offset in field `offset_field`;
    OUT is opened for appending; the log at `path` is opened read-only as soon as a
    writer has created it."""
    next_offsets: dict[str, int] = {}
    if os.path.exists(out):
        with open(out, "rb") as existing:
            for raw in existing.read().split(b"\n")[:-1]:
                fields = raw.decode().split(" ", offset_field + 1)
                next_offsets[fields[1]] = int(fields[offset_field]) + 1
    handle = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    while True:
        try:
            return next_offsets, handle, streamlog.open_log(path, readonly=True)
        except streamlog.StreamLogError:
            time.sleep(0.05)  # no writer has created the log yet


def follow(path: str, out: str) -> None:
    """A read-only view that refreshes: resumes after the last complete line of OUT."""
    resumed, handle, log = resume(path, out, offset_field=2)
    next_offsets = [resumed.get(str(partition), 0) for partition in range(PARTITIONS)]
    _line(sys.stdout.fileno(), "READY")
    while True:
        log.refresh()
        moved = False
        if STREAM in log.streams():
            for partition in range(PARTITIONS):
                for record in log.reader(STREAM, partition,
                                         from_offset=next_offsets[partition]):
                    _line(handle, f"F {partition} {record.offset} {record.value.decode()}")
                    next_offsets[partition] = record.offset + 1
                    moved = True
        if not moved:
            time.sleep(0.02)


TAIL_FOLLOWERS = {"p0": 0, "p1": 1, "p2": 2, "p0bis": 0}  # follower -> its partition


def tail(path: str, out: str) -> None:
    """A read-only view whose following readers take the appends in by themselves."""
    resumed, handle, log = resume(path, out, offset_field=3)
    next_offsets = {name: resumed.get(name, 0) for name in TAIL_FOLLOWERS}
    threads = [threading.Thread(target=tail_one, daemon=True,
                                args=(log, handle, name, partition, next_offsets[name]))
               for name, partition in TAIL_FOLLOWERS.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()  # they follow until the process is killed


def tail_one(log, handle: int, name: str, partition: int, start: int) -> None:
    while True:
        try:
            reader = log.reader(STREAM, partition, from_offset=start, follow=True)
            break
        except streamlog.UnknownStream:
            time.sleep(0.02)  # no writer has created the stream yet
    for record in reader.records():
        _line(handle, f"T {name} {partition} {record.offset} {record.value.decode()}")


def main(argv: list[str]) -> None:
    if argv[0] == "write":
        follow_out = argv[argv.index("--follow") + 1] if "--follow" in argv else None
        write(argv[1], argv[2], int(argv[3]), argv[4], follow_out)
    elif argv[0] == "tail":
        tail(argv[1], argv[2])
    else:
        follow(argv[1], argv[2])


if __name__ == "__main__":
    main(sys.argv[1:])
