"""`streamlog read`: records of a stream as JSON lines, by offset or time (DESIGN 10).

Strategy: the log is opened read-only; per partition a cursor resolves its bounds (a
timestamp by the high-water-mark rule) and the records in range are written in large
chunks. Every record before a damaged frame is written and flushed before the error
(segment and position) is reported. `--follow` refreshes the read-only view every
FOLLOW_INTERVAL_S to take in what the writer (another process) appended.
"""

from __future__ import annotations

import dataclasses
import sys
import time

from ..errors import CorruptionError
from .common import (EXIT_OK, Progress, UsageError, existing_log, json_line,
                     nonnegative_int, open_readonly, put_bytes,
                     subparser, timestamp_arg)
# read --follow: how often the view is refreshed to see another process's appends.
FOLLOW_INTERVAL_S = 0.2


_READ_EPILOG = """\
Writes one JSON line per record:
  {"stream", "partition", "offset", "timestamp", "key", "value"}
timestamp is integer microseconds; key is null when absent; key and value are strings
when they are valid UTF-8, else key_b64 / value_b64 (base64) take their place.
Without --partition every partition is read, each in offset order, one after another.

T is integer microseconds since the epoch or ISO-8601 (UTC when no zone is given).
--from-* is inclusive and --to-* exclusive. Timestamp bounds follow the high-water mark
(the running maximum timestamp): --from-timestamp T starts at the first record whose
high-water mark is >= T, and --to-timestamp T stops before it, so a late record with an
old timestamp is kept in order, not skipped.

--follow keeps reading as records are appended, until --to-* is reached or the command
is interrupted. The log is opened read-only, so records that another process appends
are seen by re-opening the directory every 200 ms and continuing from the next offset;
a frame that the writer is still writing is shown once it is whole (that is, once it is
in the segment file, which can be just before the writer's fsync acknowledges it).

examples:
  streamlog read data/log --stream events --partition 0 --from-offset 100 --to-offset 200
  streamlog read data/log --stream events --from-timestamp 2024-05-01T00:00:00
  streamlog read data/log --stream events --follow | jq .value
"""


def add(subparsers) -> None:
    parser = subparser(subparsers, "read", "write records of a stream as JSON lines",
                        _READ_EPILOG)
    parser.add_argument("--stream", required=True, help="stream name")
    parser.add_argument("--partition", type=nonnegative_int, metavar="P",
                        help="read only this partition (default: all)")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--from-offset", type=nonnegative_int, metavar="O",
                       help="first offset to read (inclusive)")
    start.add_argument("--from-timestamp", type=timestamp_arg, metavar="T",
                       help="start at the first record whose high-water mark is >= T")
    stop = parser.add_mutually_exclusive_group()
    stop.add_argument("--to-offset", type=nonnegative_int, metavar="O",
                      help="stop before this offset (exclusive)")
    stop.add_argument("--to-timestamp", type=timestamp_arg, metavar="T",
                      help="stop before the first record whose high-water mark is >= T")
    parser.add_argument("--follow", action="store_true",
                        help="keep reading records as they are appended")
    parser.set_defaults(run=run)




# -- read ------------------------------------------------------------------------------

@dataclasses.dataclass(slots=True)
class _Cursor:
    """Where the read of one partition stands. `next_offset` None: the start is not
    known yet (no record has reached --from-timestamp); `stop_offset` None: the end
    bound is not reached yet (or there is none)."""

    partition: int
    next_offset: int | None = None
    stop_offset: int | None = None
    finished: bool = False


def run(args) -> int:
    path = existing_log(args.log)
    log = open_readonly(path)
    try:
        partitions = _partitions_to_read(log, args)
        cursors = [_Cursor(p) for p in partitions]
        out = sys.stdout.buffer
        while True:
            _read_pass(log, args, cursors, out)
            out.flush()
            if not args.follow or all(c.finished for c in cursors):
                return EXIT_OK
            time.sleep(FOLLOW_INTERVAL_S)
            log.refresh()  # take in what the writer added (no reopen)
    finally:
        log.close()


def _partitions_to_read(log, args) -> list[int]:
    count = log.partition_count(args.stream)
    if args.partition is None:
        return list(range(count))
    if args.partition >= count:
        raise UsageError(f"stream {args.stream!r} has partitions 0..{count - 1} "
                         f"(got --partition {args.partition})")
    return [args.partition]


def _read_pass(log, args, cursors: list[_Cursor], out) -> None:
    """Write every record that is in the log now and within the bounds."""
    limits = {}
    for cursor in cursors:
        if not cursor.finished:
            end = log.end_offset(args.stream, cursor.partition)
            _resolve_bounds(log, args, cursor, end)
            limits[cursor.partition] = end if cursor.stop_offset is None else min(
                end, cursor.stop_offset)
    total = sum(max(limits[c.partition] - c.next_offset, 0) for c in cursors
                if c.partition in limits and c.next_offset is not None)
    progress = Progress(f"read {args.stream}", total, "records")
    done = 0
    try:
        for cursor in cursors:
            limit = limits.get(cursor.partition)
            if limit is not None and cursor.next_offset is not None:
                done = _read_partition(log, args.stream, cursor, limit, out, progress, done)
            if cursor.stop_offset is not None and cursor.next_offset is not None and (
                    cursor.next_offset >= cursor.stop_offset):
                cursor.finished = True
    finally:
        progress.finish()


def _resolve_bounds(log, args, cursor: _Cursor, end: int) -> None:
    stream, partition = args.stream, cursor.partition
    if cursor.next_offset is None:
        if args.from_timestamp is not None:
            start = log.offset_for_timestamp(stream, partition, args.from_timestamp)
            cursor.next_offset = start if start < end else None
        elif args.from_offset is not None:
            if args.from_offset > end and args.partition is not None and not args.follow:
                raise UsageError(f"--from-offset {args.from_offset} is past the end of "
                                 f"{stream}/{partition} ({end})")
            cursor.next_offset = args.from_offset
        else:
            cursor.next_offset = log.start_offset(stream, partition)
    if cursor.stop_offset is None:
        if args.to_offset is not None:
            cursor.stop_offset = args.to_offset
        elif args.to_timestamp is not None:
            try:
                stop = log.offset_for_timestamp(stream, partition, args.to_timestamp)
            except CorruptionError:
                # The batch that reaches T is damaged: the stop is in it, so this pass
                # reads up to it and the reader raises there, after every record before.
                return
            cursor.stop_offset = stop if stop < end else None


def _read_partition(log, stream: str, cursor: _Cursor, limit: int, out, progress,
                    done: int) -> int:
    """Write records [cursor.next_offset, limit) of one partition; returns `done` plus
    the offsets covered, for the progress display."""
    start = cursor.next_offset
    if start >= limit:
        return done
    lines = []
    try:
        with log.reader(stream, cursor.partition, from_offset=start,
                        to_offset=limit) as reader:
            for record in reader.records():
                item = {"stream": stream, "partition": record.partition,
                        "offset": record.offset, "timestamp": record.timestamp_us}
                put_bytes(item, "key", record.key)
                put_bytes(item, "value", record.value)
                lines.append(json_line(item))
                if len(lines) >= 1024:
                    out.write(b"".join(lines))
                    lines.clear()
                    progress.update(done + record.offset - start)
    except CorruptionError:
        _flush_before_error(out, lines)
        raise
    out.write(b"".join(lines))
    cursor.next_offset = limit
    return done + limit - start


def _flush_before_error(out, lines: list[bytes]) -> None:
    """The reader raised at a damaged frame (DESIGN 4: it delivers every record before
    it, then raises naming segment and position): write and flush those records before
    main() prints the one-line error, so stdout has all of them and stderr comes last."""
    out.write(b"".join(lines))
    lines.clear()
    out.flush()


