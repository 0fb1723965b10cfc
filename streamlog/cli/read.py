"""`streamlog read`: records of a stream as JSON lines, by offset or time (DESIGN 10).

Strategy: the log is opened read-only; per partition a cursor resolves its bounds (a
timestamp by the high-water-mark rule) and the records in range are written in large
chunks. Every record before a damaged frame is written and flushed before the error
(segment and position) is reported. `--follow` on a local log refreshes the read-only
view every FOLLOW_INTERVAL_S to take in what the writer (another process) appended; on
a daemon URL it opens one following reader per partition and writes what the daemon
pushes as it is acknowledged (no polling). A missing log or stream is waited for when
following (checked every WAIT_INTERVAL_S), an error otherwise. A log in an object store
(s3://BUCKET/PREFIX) is read through its read-only view, as a local log is; `--follow`
there refreshes the view (a look at the next manifest generation) every
`remote_poll_ms`, and waits for a log not in the store yet as often.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time

from ..errors import CorruptionError, UnknownStream
from .common import (EXIT_OK, UsageError, existing_log, foreign_directory, has_marker,
                     is_store_url, is_url, json_line, nonnegative_int, positive_int,
                     progress_bar, put_bytes, put_headers, refuse_non_directory,
                     stream_arg, subparser, timestamp_arg)
from .store import open_readonly

# read --follow (local log): how often the view is refreshed to see another process's
# appends; a missing log or stream is looked for this often too.
FOLLOW_INTERVAL_S = 0.2
WAIT_INTERVAL_S = 0.25
# read --follow of a log in a store that is not there yet: looked for this often (a
# listing of the store's manifests each time).
STORE_WAIT_INTERVAL_S = 1.0
# read: lines written to stdout at once; a remote follower lets other partitions' records
# (and the flush) through every this many records.
WRITE_CHUNK_LINES = 1024


_READ_EPILOG = """\
Writes one JSON line per record:
  {"stream", "partition", "offset", "timestamp", "key", "value"[, "headers"]}
timestamp is integer microseconds; key is null when absent, value null for a tombstone
(a None value, not ""); key and value are strings when they are valid UTF-8, else
key_b64 / value_b64 (base64) take their place. A record with headers has
"headers": {"name": "value", ...} (names in order, a repeated name kept, a None value
null); when one of its values is not valid UTF-8, "headers_b64" takes its place with
every value in base64. (This is what `streamlog append` takes.)
Without --partition every partition is read, each in offset order, one after another.

T is integer microseconds since the epoch or ISO-8601 (UTC when no zone is given).
--from-* is inclusive and --to-* exclusive. Timestamp bounds follow the high-water mark
(the running maximum timestamp): --from-timestamp T starts at the first record whose
high-water mark is >= T, and --to-timestamp T stops before it, so a late record with an
old timestamp is kept in order, not skipped. --from-offset past the end prints nothing
(with --follow: the records from that offset on, once they are appended); before the
start (removed by retention) it is an error.

--follow keeps reading as records are appended, until --to-* or --max-messages is
reached or the command is interrupted; a log or stream that does not exist yet is
waited for. --from-end starts at the end, so only records appended from now on are
written (without --follow: none); a stream created after the command started is read
from its start. On a local log, the records that another process appends are seen by
refreshing the read-only view every 200 ms; a frame is shown once it is whole in the
segment file. On a daemon URL, the daemon pushes each record as it is acknowledged.
--max-messages N stops after N records (exit 0).

LOG may be a log in an object store, s3://BUCKET/PREFIX, read from any machine with no
local files (endpoint and credentials from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_REGION): the records its newest manifest generation holds
(the sealed segments the writer has uploaded), with the same bounds and output as a
local log. --follow looks for a newer generation every second.

examples:
  streamlog read data/log --stream events --partition 0 --from-offset 100 --to-offset 200
  streamlog read data/log --stream events --from-timestamp 2024-05-01T00:00:00
  streamlog read data/log --stream events --follow | jq .value
  streamlog read data/log --stream events --from-end --follow --max-messages 10
  STREAMLOG_TOKEN=secret streamlog read streamlog://127.0.0.1:7541 --stream events --follow
  streamlog read s3://my-bucket/logs/orders --stream events --from-timestamp 2024-05-01
"""


def add(subparsers) -> None:
    parser = subparser(subparsers, "read", "write records of a stream as JSON lines",
                       _READ_EPILOG)
    parser.add_argument("--stream", required=True, type=stream_arg, help="stream name")
    parser.add_argument("--partition", type=nonnegative_int, metavar="P",
                        help="read only this partition (default: all)")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--from-offset", type=nonnegative_int, metavar="O",
                       help="first offset to read (inclusive)")
    start.add_argument("--from-timestamp", type=timestamp_arg, metavar="T",
                       help="start at the first record whose high-water mark is >= T")
    start.add_argument("--from-end", action="store_true",
                       help="start at the end: only records appended from now on")
    stop = parser.add_mutually_exclusive_group()
    stop.add_argument("--to-offset", type=nonnegative_int, metavar="O",
                      help="stop before this offset (exclusive)")
    stop.add_argument("--to-timestamp", type=timestamp_arg, metavar="T",
                      help="stop before the first record whose high-water mark is >= T")
    parser.add_argument("--max-messages", type=positive_int, metavar="N",
                        help="stop after N records")
    parser.add_argument("--follow", action="store_true",
                        help="keep reading records as they are appended")
    parser.set_defaults(run=run)


# -- read ------------------------------------------------------------------------------

@dataclasses.dataclass(slots=True)
class _Cursor:
    """Where the read of one partition stands. `next_offset` None: the start is not
    known yet (no record has reached --from-timestamp); `stop_offset` None: the end
    bound is not reached yet (or there is none). Records below `skip_below` are not
    written (a --from-offset that was past the end)."""

    partition: int
    next_offset: int | None = None
    stop_offset: int | None = None
    finished: bool = False
    skip_below: int = 0


@dataclasses.dataclass(slots=True)
class _Read:
    """One run of the command: its arguments and what is left to write."""

    args: object
    new_stream: bool = False  # created after the command started (--from-end: its start)
    left: int | None = None  # --max-messages still to write

    @property
    def stream(self) -> str:
        return self.args.stream

    def take(self, count: int) -> int:
        """How many of `count` records may still be written; counts them as written."""
        if self.left is None:
            return count
        count = min(count, self.left)
        self.left -= count
        return count

    @property
    def satisfied(self) -> bool:
        return self.left == 0


def run(args) -> int:
    log = _open_when_there(args)
    try:
        read = _Read(args, left=args.max_messages)
        cursors = [_Cursor(p) for p in _partitions_when_there(log, read)]
        if args.follow and is_url(args.log):
            _follow_remote(log, read, cursors)
            return EXIT_OK
        out = sys.stdout.buffer
        interval_s = _follow_interval_s(args.log, log)
        first = True
        while True:
            _read_pass(log, read, cursors, out, show_progress=first)
            out.flush()
            first = False
            if not args.follow or read.satisfied or all(c.finished for c in cursors):
                return EXIT_OK
            time.sleep(interval_s)
            log.refresh()  # take in what the writer added (no reopen)
    finally:
        log.close()


def _follow_interval_s(path: str, log) -> float:
    """How often --follow refreshes: a log in a store by its manifest poll interval
    (each refresh is a request), a local one every FOLLOW_INTERVAL_S."""
    if is_store_url(path):
        return max(FOLLOW_INTERVAL_S, log.config.remote_poll_ms / 1000)
    return FOLLOW_INTERVAL_S


def _open_when_there(args):
    """The read-only Log of LOG; with --follow, a log that does not exist yet (in its
    directory, or in the store) is waited for."""
    if not is_store_url(args.log):
        return open_readonly(_log_when_there(args))
    said = False
    while True:
        try:
            return open_readonly(args.log)
        except UsageError:  # no log in the store there (yet)
            if not args.follow:
                raise
        said = said or _waiting(f"the log {args.log}")
        time.sleep(STORE_WAIT_INTERVAL_S)


def _log_when_there(args) -> str:
    """LOG, checked; with --follow, a log that does not exist yet is waited for."""
    path = args.log
    if is_url(path) or not args.follow:
        return existing_log(path)
    said = False
    while True:
        refuse_non_directory(path)
        if has_marker(path):
            return path
        if foreign_directory(path):
            return existing_log(path)  # says it is not a log
        said = said or _waiting(f"the log {path}")
        time.sleep(WAIT_INTERVAL_S)


def _waiting(what: str) -> bool:
    """Say once, on stderr, what --follow waits for (as Kafka's console consumer warns
    of a topic that is not there yet); True."""
    print(f"streamlog: waiting for {what} to be created (--follow)", file=sys.stderr,
          flush=True)
    return True


def _partitions_when_there(log, read: _Read) -> list[int]:
    """The partitions to read; with --follow, a stream that does not exist yet is
    waited for."""
    args = read.args
    said = False
    while True:
        try:
            count = log.partition_count(args.stream)
            break
        except UnknownStream:
            if not args.follow:
                raise
        read.new_stream = True
        said = said or _waiting(f"the stream {args.stream!r}")
        time.sleep(WAIT_INTERVAL_S)
        log.refresh()
    if args.partition is None:
        return list(range(count))
    if args.partition >= count:
        raise UsageError(f"stream {args.stream!r} has partitions 0..{count - 1} "
                         f"(got --partition {args.partition})")
    return [args.partition]


def _read_pass(log, read: _Read, cursors: list[_Cursor], out, *,
               show_progress: bool) -> None:
    """Write every record that is in the log now and within the bounds."""
    limits = {}
    for cursor in cursors:
        if not cursor.finished:
            end = log.end_offset(read.stream, cursor.partition)
            _resolve_bounds(log, read, cursor, end)
            limits[cursor.partition] = end if cursor.stop_offset is None else min(
                end, cursor.stop_offset)
    total = sum(max(limits[c.partition] - c.next_offset, 0) for c in cursors
                if c.partition in limits and c.next_offset is not None)
    if read.left is not None:
        total = min(total, read.left)
    with progress_bar(f"read {read.stream}", total, writes_stdout=True,
                      enabled=show_progress) as bar:
        for cursor in cursors:
            limit = limits.get(cursor.partition)
            if limit is not None and cursor.next_offset is not None and not read.satisfied:
                _read_partition(log, read, cursor, limit, out, bar)
            if cursor.stop_offset is not None and cursor.next_offset is not None and (
                    cursor.next_offset >= cursor.stop_offset):
                cursor.finished = True


def _start_offset(log, read: _Read, partition: int, end: int) -> tuple[int | None, int]:
    """(first offset to read or None when --from-timestamp is not reached yet, offsets
    below which nothing is written)."""
    args, stream = read.args, read.stream
    if args.from_timestamp is not None:
        start = log.offset_for_timestamp(stream, partition, args.from_timestamp)
        return (start if start < end else None), 0
    if args.from_end and not read.new_stream:
        return end, 0
    first = log.start_offset(stream, partition)
    if args.from_offset is None:
        return first, 0
    if args.from_offset < first:
        raise UsageError(f"--from-offset {args.from_offset} is before the start of "
                         f"{stream}/{partition} ({first}): retention removed the offsets "
                         f"before it")
    return min(args.from_offset, end), args.from_offset


def _resolve_bounds(log, read: _Read, cursor: _Cursor, end: int) -> None:
    args, stream, partition = read.args, read.stream, cursor.partition
    if cursor.next_offset is None:
        cursor.next_offset, cursor.skip_below = _start_offset(log, read, partition, end)
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


def record_line(stream: str, record) -> bytes:
    item = {"stream": stream, "partition": record.partition, "offset": record.offset,
            "timestamp": record.timestamp_us}
    put_bytes(item, "key", record.key)
    put_bytes(item, "value", record.value)
    put_headers(item, record.headers)
    return json_line(item)


def _read_partition(log, read: _Read, cursor: _Cursor, limit: int, out, bar) -> None:
    """Write records [cursor.next_offset, limit) of one partition (those at or past
    skip_below), as many as --max-messages leaves."""
    start = cursor.next_offset
    if start >= limit:
        return
    lines = []
    try:
        with log.reader(read.stream, cursor.partition, from_offset=start,
                        to_offset=limit) as reader:
            for record in reader.records():
                if record.offset < cursor.skip_below:
                    continue
                lines.append(record_line(read.stream, record))
                if len(lines) >= WRITE_CHUNK_LINES or len(lines) == read.left:
                    _write(out, lines, read, bar)
                    if read.satisfied:
                        cursor.next_offset = record.offset + 1
                        return
    except CorruptionError:
        _write(out, lines, read, bar)
        out.flush()  # every record before the damage, then main() prints the error
        raise
    _write(out, lines, read, bar)
    cursor.next_offset = limit


def _write(out, lines: list[bytes], read: _Read, bar) -> None:
    """Write the pending lines (as many as --max-messages leaves)."""
    count = read.take(len(lines))
    out.write(b"".join(lines[:count]))
    bar.update(count)
    lines.clear()


# -- read --follow on a daemon ---------------------------------------------------------

class _Enough(Exception):
    """--max-messages reached."""


def _follow_remote(log, read: _Read, cursors: list[_Cursor]) -> None:
    """One following reader per partition (the daemon pushes each acknowledged record);
    their records are written as they come, flushed whenever none is waiting."""
    readers = []
    try:
        for cursor in cursors:
            end = log.end_offset(read.stream, cursor.partition)
            _resolve_bounds(log, read, cursor, end)
            options = _remote_bounds(read.args, cursor)
            if options is not None:
                readers.append((cursor, log.reader(read.stream, cursor.partition,
                                                   follow=True, **options)))
        if readers:
            asyncio.run(_pump_all(read, readers, sys.stdout.buffer))
    finally:
        for _, reader in readers:
            reader.close()
        sys.stdout.buffer.flush()


def _remote_bounds(args, cursor: _Cursor) -> dict | None:
    """The reader options of a cursor resolved by _resolve_bounds; None when there is
    nothing to read (the stop is at or before the start)."""
    options = {}
    if cursor.next_offset is not None:
        options["from_offset"] = cursor.next_offset
    else:  # not reached yet: the daemon's reader waits for the high-water mark
        options["from_timestamp_us"] = args.from_timestamp
    if args.to_offset is not None:
        if cursor.next_offset is not None and args.to_offset <= cursor.next_offset:
            return None
        options["to_offset"] = args.to_offset
    elif args.to_timestamp is not None:
        options["to_timestamp_us"] = args.to_timestamp
    return options


async def _pump_all(read: _Read, readers, out) -> None:
    loop = asyncio.get_running_loop()
    flush_pending = False

    def flush() -> None:
        nonlocal flush_pending
        flush_pending = False
        out.flush()

    async def pump(cursor: _Cursor, reader) -> None:
        nonlocal flush_pending
        written = 0
        async for record in reader.arecords():
            if record.offset < cursor.skip_below:
                continue
            if not read.take(1):
                raise _Enough
            out.write(record_line(read.stream, record))
            if not flush_pending:  # runs once every pump waits for the daemon
                flush_pending = True
                loop.call_soon(flush)
            if read.satisfied:
                raise _Enough
            written += 1
            if written % WRITE_CHUNK_LINES == 0:
                await asyncio.sleep(0)  # let the other partitions (and the flush) in

    tasks = [asyncio.create_task(pump(cursor, reader)) for cursor, reader in readers]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    out.flush()
    for task in done:
        error = task.exception()
        if error is not None and not isinstance(error, _Enough):
            raise error
