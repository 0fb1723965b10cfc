"""The `streamlog` command line: append, read, info, dump, verify (DESIGN 10).

Strategy: one `argparse` subcommand per verb; each is registered by an `_add_NAME`
function listed in `COMMANDS` and run by a `_run_NAME(args) -> exit code` function, so a
new verb (`serve`) is one more pair. `main()` is the only place that turns exceptions
into exit codes and one-line messages:

    0    success
    1    corruption found, or a data error (damaged files, a failed write)
    2    usage errors and malformed input
    3    cannot reach or authenticate to a daemon (with the daemon client)
    130  interrupted (Ctrl-C);  141  the reader of stdout went away (`| head`)

`append` and `read` go through the public API (`open_log`); `read` and `info` open the
log read-only, which never modifies a file. `dump` and `verify` do not trust the index:
they walk every segment frame by frame with the pure decoders of frame.py, scan.py and
payload.py, so they work on a log whose writer was killed and on a damaged one.
A bad spot followed by a valid frame anywhere later in its partition is corruption; a
bad spot with nothing valid after it is a torn tail, which a writer truncates on its
next open (DESIGN 4).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import concurrent.futures
import dataclasses
import datetime
import json
import logging
import os
import re
import sys
import time

from .config import LogConfig
from . import layout
from .errors import (CorruptFrame, CorruptionError, InvalidArgument, OffsetOutOfRange,
                     ReadOnlyLog, StreamLogError, UnknownStream)
from .frame import HEADER_BYTES, INCOMPLETE, MAGIC_BYTES, Frame, decode_frame, decode_header
from .log import open_log, partition_for_key
from .payload import columns_to_records, decode_columns
from .records import RecordKind
from .scan import StopReason, scan_buffer

EXIT_OK, EXIT_DATA, EXIT_USAGE, EXIT_DAEMON = 0, 1, 2, 3
EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 130, 141
DAEMON_SCHEME = "streamlog://"
# append: lines parsed and handed to the log at once (a frame holds up to 64 Ki records).
APPEND_CHUNK_LINES = 4096
APPEND_CHUNK_BYTES = 8 * 1024 * 1024
APPEND_THREADS_MAX = 8
# read --follow: how often the directory is re-opened to see other processes' appends.
FOLLOW_INTERVAL_S = 0.2
# dump / verify read segments in chunks of this size.
SCAN_CHUNK_BYTES = 8 * 1024 * 1024
# Progress on a terminal: shown only for work that lasts, refreshed a few times a second.
PROGRESS_DELAY_S = 1.0
PROGRESS_EVERY_S = 0.25
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
_INTEGER = re.compile(r"^[+-]?\d+$")


class CliError(Exception):
    """An error the command reports in one line and turns into its exit code."""

    code = EXIT_DATA


class UsageError(CliError):
    code = EXIT_USAGE


class DataError(CliError):
    code = EXIT_DATA


# -- timestamps and bytes as text ------------------------------------------------------

def parse_timestamp(text: str) -> int:
    """Integer microseconds since the epoch, or ISO-8601 (UTC when no zone is given).

    A string of digits (optionally signed) is microseconds, never a basic-format date.
    Raises ValueError with a sentence for anything else.
    """
    text = text.strip()
    if _INTEGER.match(text):
        value = int(text)
    else:
        try:
            moment = datetime.datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(f"timestamp {text!r} is neither integer microseconds "
                             f"nor ISO-8601") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=datetime.timezone.utc)
        value = (moment - _EPOCH) // datetime.timedelta(microseconds=1)
    if not _INT64_MIN < value <= _INT64_MAX:
        raise ValueError(f"timestamp {text!r} is out of the int64 microseconds range")
    return value


def format_timestamp(timestamp_us: int | None) -> str | None:
    """ISO-8601 in UTC with microseconds and a Z, or None when out of datetime's range."""
    if timestamp_us is None:
        return None
    try:
        moment = _EPOCH + datetime.timedelta(microseconds=timestamp_us)
    except OverflowError:
        return None
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def _put_bytes(out: dict, name: str, data: bytes | None) -> None:
    """out[name] = text when `data` is valid UTF-8, else out[name_b64] = base64."""
    if data is None:
        out[name] = None
        return
    try:
        out[name] = data.decode("utf-8")
    except UnicodeDecodeError:
        out[name + "_b64"] = base64.b64encode(data).decode("ascii")


def _json_line(item: dict) -> bytes:
    return json.dumps(item, ensure_ascii=False).encode("utf-8") + b"\n"


# -- the parser ------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    """Usage errors are one line on stderr and exit 2, like every other error."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"streamlog: error: {message} (see '{self.prog} --help')\n")


def _positive_int(text: str) -> int:
    value = _nonnegative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _nonnegative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value


def _timestamp_arg(text: str) -> int:
    try:
        return parse_timestamp(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _subparser(subparsers, name: str, summary: str, epilog: str) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(name, help=summary, description=summary, epilog=epilog,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", metavar="LOG",
                        help="the log directory, or a daemon URL streamlog://HOST:PORT "
                             "(token from STREAMLOG_TOKEN)")
    return parser


_APPEND_EPILOG = """\
Each input line is one JSON object:
  value | value_b64    the value, as UTF-8 text or base64 bytes (one of them is required)
  key | key_b64        optional key (null or absent: no key)
  timestamp            optional: integer microseconds since the epoch, or ISO-8601
                       (UTC when no zone is given); absent: the time of the append
  partition            optional partition number; otherwise a key picks one by a stable
                       hash and a record without a key goes round robin
  stream, offset       ignored, so the output of `streamlog read` can be appended
Blank lines are skipped. The log and the stream are created when missing (1 partition
unless --partitions says otherwise). At the end one JSON line tells what was appended:
  {"stream": "S", "records": N, "partitions": {"P": [first_offset, last_offset]}}
A malformed line stops the command with exit 2 and its line number on stderr; the lines
before it are appended and reported, nothing after it.

examples:
  echo '{"key": "user-1", "value": "hello"}' | streamlog append data/log --stream events
  streamlog append data/log --stream events --partitions 4 --fsync interval < events.jsonl
  streamlog read old/log --stream events | streamlog append new/log --stream events
"""


def _add_append(subparsers) -> None:
    parser = _subparser(subparsers, "append", "append JSON lines from stdin to a stream",
                        _APPEND_EPILOG)
    parser.add_argument("--stream", required=True, help="stream name")
    parser.add_argument("--partitions", type=_positive_int, metavar="N",
                        help="partitions of a new stream (default 1); must match an existing one")
    parser.add_argument("--fsync", choices=("always", "interval", "never"), default="always",
                        help="durability policy (default always: acknowledged = on disk)")
    parser.add_argument("--fsync-interval-ms", type=_positive_int, metavar="MS",
                        help="group-commit interval for --fsync interval (default 50)")
    parser.set_defaults(run=_run_append, show_warnings=True)


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


def _add_read(subparsers) -> None:
    parser = _subparser(subparsers, "read", "write records of a stream as JSON lines",
                        _READ_EPILOG)
    parser.add_argument("--stream", required=True, help="stream name")
    parser.add_argument("--partition", type=_nonnegative_int, metavar="P",
                        help="read only this partition (default: all)")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--from-offset", type=_nonnegative_int, metavar="O",
                       help="first offset to read (inclusive)")
    start.add_argument("--from-timestamp", type=_timestamp_arg, metavar="T",
                       help="start at the first record whose high-water mark is >= T")
    stop = parser.add_mutually_exclusive_group()
    stop.add_argument("--to-offset", type=_nonnegative_int, metavar="O",
                      help="stop before this offset (exclusive)")
    stop.add_argument("--to-timestamp", type=_timestamp_arg, metavar="T",
                      help="stop before the first record whose high-water mark is >= T")
    parser.add_argument("--follow", action="store_true",
                        help="keep reading records as they are appended")
    parser.set_defaults(run=_run_read)


_INFO_EPILOG = """\
Shows, per stream and partition: start and end offsets (the end is the next offset to be
written), the time range (the first batch's smallest timestamp and the high-water mark,
as ISO-8601 and microseconds), segments, bytes, and the state of the tail (clean, torn:
a writer's last frame is incomplete, or corrupt: run `streamlog verify`).
The log is opened read-only and no file is modified.

examples:
  streamlog info data/log
  streamlog info data/log --json | jq '.streams.events.partitions[0].end_offset'
"""


def _add_info(subparsers) -> None:
    parser = _subparser(subparsers, "info", "show the streams and partitions of a log",
                        _INFO_EPILOG)
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    parser.set_defaults(run=_run_info)


_DUMP_EPILOG = """\
Reads every segment file directly, without the index, and prints each batch frame:
segment file, position, base and last offset, record count, min and max timestamp,
codec, flags, transaction id, payload bytes and whether its checksums hold. A bad spot
is printed with its position and reason, and the dump goes on at the next valid frame.
Works on a log whose writer was killed; never modifies a file.

examples:
  streamlog dump data/log
  streamlog dump data/log --stream events --partition 0 --records
  streamlog dump data/log --json | jq 'select(.checksum_ok == false)'
"""


def _add_dump(subparsers) -> None:
    parser = _subparser(subparsers, "dump", "print the frames of the segment files",
                        _DUMP_EPILOG)
    parser.add_argument("--stream", help="only this stream")
    parser.add_argument("--partition", type=_nonnegative_int, metavar="P",
                        help="only this partition")
    parser.add_argument("--records", action="store_true", help="print every record too")
    parser.add_argument("--json", action="store_true", help="one JSON object per frame")
    parser.set_defaults(run=_run_dump)


_VERIFY_EPILOG = """\
Reads every frame of every segment of every partition, without the index, and checks
checksums, offset continuity (within and across segments) and that every payload
decodes. Never modifies a file; works on a log whose writer was killed.
  corruption (a bad frame with valid data after it): reported with the segment path and
      position on stderr, exit 1
  torn tail (the last frame is incomplete or bad, nothing valid after it): a warning,
      exit 0 (1 with --strict); the next writer truncates it
A summary line goes to stdout at the end.

examples:
  streamlog verify data/log
  streamlog verify data/log --strict && echo clean
"""


def _add_verify(subparsers) -> None:
    parser = _subparser(subparsers, "verify", "check every frame of every segment",
                        _VERIFY_EPILOG)
    parser.add_argument("--strict", action="store_true",
                        help="a torn tail is an error too (exit 1)")
    parser.add_argument("--json", action="store_true", help="a JSON summary instead of text")
    parser.set_defaults(run=_run_verify)


def _add_serve(subparsers) -> None:
    from .wire.serve_cli import add_serve_parser, run_serve
    add_serve_parser(subparsers).set_defaults(run=run_serve)


# A new subcommand is one more `_add_NAME(subparsers)` here.
COMMANDS = (_add_append, _add_read, _add_info, _add_dump, _add_verify, _add_serve)


_MAIN_EPILOG = """\
exit codes:
  0    success
  1    corruption found, or a data error
  2    usage errors and malformed input
  3    cannot reach or authenticate to a daemon
  130  interrupted;  141  stdout was closed by its reader (e.g. `| head`)

Run 'streamlog COMMAND --help' for a command's options and examples.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="streamlog", description="A durable stream log.",
                     epilog=_MAIN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in COMMANDS:
        add(subparsers)
    return parser


# -- shared by the commands ------------------------------------------------------------

def _is_url(log: str) -> bool:
    return log.startswith((DAEMON_SCHEME, "streamlog+tls://"))


def _local_path(log: str, command: str = "this command") -> str:
    if _is_url(log):
        raise UsageError(f"{command} reads segment files directly: run it on the daemon's "
                         f"machine with the log directory")
    return log


def _existing_log(log: str) -> str:
    if _is_url(log):
        return log
    path = _local_path(log)
    if not os.path.isdir(path):
        raise UsageError(f"no log at {path}")
    if not _has_marker(path):
        raise UsageError(f"{path} is not a streamlog log (no streamlog.json)")
    return path


def _has_marker(path: str) -> bool:
    return os.path.exists(os.path.join(path, "streamlog.json"))


def _open_readonly(path: str):
    return open_log(path, readonly=True, create=False)


class Progress:
    """A one-line progress display on stderr, only when stderr is a terminal and only
    once the work has lasted PROGRESS_DELAY_S; erased by `finish`."""

    def __init__(self, label: str, total: int, unit: str) -> None:
        self.label, self.total, self.unit = label, total, unit
        self.enabled = sys.stderr.isatty()
        self.started = time.monotonic()
        self.shown_at = 0.0
        self.visible = False

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.started < PROGRESS_DELAY_S or now - self.shown_at < PROGRESS_EVERY_S:
            return
        share = f" ({100 * done // self.total}%)" if self.total > 0 else ""
        sys.stderr.write(f"\r{self.label}: {done:,} of {self.total:,} {self.unit}{share}\x1b[K")
        sys.stderr.flush()
        self.shown_at, self.visible = now, True

    def finish(self) -> None:
        if self.visible:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self.visible = False


# -- append ----------------------------------------------------------------------------

_APPEND_FIELDS = frozenset({"value", "value_b64", "key", "key_b64", "timestamp",
                            "partition", "stream", "offset"})


def _run_append(args) -> int:
    path = args.log
    if not _is_url(path) and os.path.isdir(path) and not _has_marker(path) and any(
            name != "LOCK" for name in os.listdir(path)):
        raise UsageError(f"{path} is not empty and not a streamlog log; "
                         f"refusing to write into it")
    options = {}
    if args.fsync_interval_ms is not None:
        options["fsync_interval_ms"] = args.fsync_interval_ms
    with open_log(path, fsync=args.fsync, **options) as log:
        count = _ensure_stream(log, args.stream, args.partitions)
        batcher = _Batcher(log, args.stream, count)
        try:
            error = batcher.run(sys.stdin.buffer)
        finally:
            sys.stdout.buffer.write(_json_line(batcher.summary()))
            sys.stdout.buffer.flush()
    if error is not None:
        raise UsageError(error)
    return EXIT_OK


def _ensure_stream(log, stream: str, partitions: int | None) -> int:
    if stream in log.streams():
        existing = log.partition_count(stream)
        if partitions is not None and partitions != existing:
            raise UsageError(f"stream {stream!r} has {existing} partitions; "
                             f"--partitions {partitions} disagrees")
        return existing
    return log.create_stream(stream, partitions or 1)


@dataclasses.dataclass(slots=True)
class _Chunk:
    """Parsed lines waiting to be appended: per partition, parallel columns."""

    columns: dict = dataclasses.field(default_factory=dict)  # p -> (values, keys, times)
    lines: int = 0
    nbytes: int = 0

    def add(self, partition: int, value: bytes, key: bytes | None, timestamp_us: int) -> None:
        values, keys, timestamps = self.columns.setdefault(partition, ([], [], []))
        values.append(value)
        keys.append(key)
        timestamps.append(timestamp_us)
        self.lines += 1
        self.nbytes += len(value) + (len(key) if key is not None else 0)


class _Batcher:
    """Parses stdin in chunks and appends each chunk with one batch per partition, the
    partitions in parallel, while the next chunk is being parsed. A chunk is submitted
    only after the previous one is acknowledged, so input order is offset order."""

    def __init__(self, log, stream: str, partition_count: int) -> None:
        self.log, self.stream, self.partition_count = log, stream, partition_count
        # A daemon enforces its own limit (and says so per record); locally, ours.
        config = getattr(log, "config", None)
        self.record_bytes_max = (config.record_bytes_max if config is not None
                                 else LogConfig().record_bytes_max)
        self.ranges: dict[int, tuple[int, int]] = {}
        self.records = 0
        self._next_robin = 0

    def run(self, lines) -> str | None:
        """Append every line; returns the message for a malformed line, or None."""
        workers = min(self.partition_count, APPEND_THREADS_MAX)
        error, pending = None, []
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            for chunk, error in self._chunks(lines):
                self._collect(pending)
                pending = [pool.submit(self._append, p, *columns)
                           for p, columns in sorted(chunk.columns.items())]
                if error is not None:
                    break
            self._collect(pending)
        return error

    def _append(self, partition: int, values, keys, timestamps):
        return self.log.append_batch_sync(self.stream, values, keys=keys,
                                          timestamps_us=timestamps, partition=partition)

    def _collect(self, futures) -> None:
        """Wait for every future; account the ones that succeeded, then raise the first
        failure (so the summary reports what is durable)."""
        failure = None
        for future in futures:
            try:
                result = future.result()
            except BaseException as error:  # noqa: BLE001 - re-raised below
                failure = failure or error
                continue
            for partition, (first, last) in result.ranges.items():
                known = self.ranges.get(partition)
                self.ranges[partition] = (first, last) if known is None else (
                    min(known[0], first), max(known[1], last))
            self.records += result.records
        if failure is not None:
            raise failure

    def _chunks(self, lines):
        """Yield (chunk, None) per full chunk, and (chunk, message) for a bad line."""
        chunk = _Chunk()
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                value, key, timestamp_us, partition = parse_append_line(
                    line, self.partition_count, self.record_bytes_max)
            except ValueError as error:
                yield chunk, f"line {number}: {error}"
                return
            chunk.add(self._route(partition, key), value, key, timestamp_us)
            if chunk.lines >= APPEND_CHUNK_LINES or chunk.nbytes >= APPEND_CHUNK_BYTES:
                yield chunk, None
                chunk = _Chunk()
        if chunk.lines:
            yield chunk, None

    def _route(self, partition: int | None, key: bytes | None) -> int:
        if partition is not None:
            return partition
        if key is not None:
            return partition_for_key(key, self.partition_count)
        self._next_robin += 1
        return (self._next_robin - 1) % self.partition_count

    def summary(self) -> dict:
        return {"stream": self.stream, "records": self.records,
                "partitions": {str(p): list(self.ranges[p]) for p in sorted(self.ranges)}}


def parse_append_line(line: bytes, partition_count: int, record_bytes_max: int):
    """(value, key, timestamp_us, partition or None) of one input line.

    Raises ValueError with a sentence (without the line number) for a malformed line.
    """
    try:
        item = json.loads(line)
    except UnicodeDecodeError:
        raise ValueError("not valid UTF-8") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"not valid JSON: {error.msg} at column {error.colno}") from None
    if not isinstance(item, dict):
        raise ValueError(f"expected a JSON object, got {type(item).__name__}")
    unknown = item.keys() - _APPEND_FIELDS
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(sorted(map(repr, unknown)))}")
    value = _bytes_field(item, "value")
    if value is None:
        raise ValueError("no value (give value or value_b64)")
    key = _bytes_field(item, "key")
    size = len(value) + (len(key) if key is not None else 0)
    if size > record_bytes_max:
        raise ValueError(f"record is {size} bytes; the limit is {record_bytes_max}")
    timestamp = item.get("timestamp")
    if timestamp is None:
        timestamp_us = time.time_ns() // 1000
    elif isinstance(timestamp, str):
        timestamp_us = parse_timestamp(timestamp)
    elif isinstance(timestamp, int) and not isinstance(timestamp, bool):
        timestamp_us = parse_timestamp(str(timestamp))
    else:
        raise ValueError("timestamp must be integer microseconds or an ISO-8601 string")
    partition = item.get("partition")
    if partition is not None and (isinstance(partition, bool) or not isinstance(
            partition, int) or not 0 <= partition < partition_count):
        raise ValueError(f"partition {partition!r} is not in 0..{partition_count - 1}")
    return value, key, timestamp_us, partition


def _bytes_field(item: dict, name: str) -> bytes | None:
    text, encoded = item.get(name), item.get(name + "_b64")
    if text is not None and encoded is not None:
        raise ValueError(f"give {name} or {name}_b64, not both")
    if encoded is not None:
        if not isinstance(encoded, str):
            raise ValueError(f"{name}_b64 must be a base64 string")
        try:
            return base64.b64decode(encoded, validate=True)
        except binascii.Error:
            raise ValueError(f"{name}_b64 is not valid base64") from None
    if text is None:
        return None
    if not isinstance(text, str):
        raise ValueError(f"{name} must be a string (use {name}_b64 for bytes)")
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{name} is not valid Unicode (a lone surrogate?)") from None


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


def _run_read(args) -> int:
    path = _existing_log(args.log)
    log = _open_readonly(path)
    try:
        partitions = _partitions_to_read(log, args)
        cursors = [_Cursor(p) for p in partitions]
        out = sys.stdout.buffer
        while True:
            _read_pass(log, args, cursors, out)
            out.flush()
            _check_corruption(log, args.stream, partitions)
            if not args.follow or all(c.finished for c in cursors):
                return EXIT_OK
            log.close()
            time.sleep(FOLLOW_INTERVAL_S)
            log = _open_readonly(path)
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
            stop = log.offset_for_timestamp(stream, partition, args.to_timestamp)
            cursor.stop_offset = stop if stop < end else None


def _read_partition(log, stream: str, cursor: _Cursor, limit: int, out, progress,
                    done: int) -> int:
    """Write records [cursor.next_offset, limit) of one partition; returns `done` plus
    the offsets covered, for the progress display."""
    start = cursor.next_offset
    if start >= limit:
        return done
    lines = []
    with log.reader(stream, cursor.partition, from_offset=start, to_offset=limit) as reader:
        for record in reader.records():
            item = {"stream": stream, "partition": record.partition, "offset": record.offset,
                    "timestamp": record.timestamp_us}
            _put_bytes(item, "key", record.key)
            _put_bytes(item, "value", record.value)
            lines.append(_json_line(item))
            if len(lines) >= 1024:
                out.write(b"".join(lines))
                lines.clear()
                progress.update(done + record.offset - start)
    out.write(b"".join(lines))
    cursor.next_offset = limit
    return done + limit - start


def _check_corruption(log, stream: str, partitions: list[int]) -> None:
    """A read-only open stops before corruption instead of raising: say so, exit 1."""
    described = log.info()["streams"][stream]["partitions"]
    for partition in partitions:
        corruption = described[partition].get("recovery", {}).get("corruption")
        if corruption:
            raise DataError(f"{corruption}; records after it are not shown "
                            f"(run 'streamlog verify')")


# -- info ------------------------------------------------------------------------------

def _run_info(args) -> int:
    path = _existing_log(args.log)
    with _open_readonly(path) as log:
        described = log.info()
    rows = []
    for stream, found in described["streams"].items():
        for part in found["partitions"]:
            rows.append(_info_row(stream, part))
    if args.json:
        streams: dict = {}
        for row in rows:
            streams.setdefault(row.pop("stream"), {"partitions": []})["partitions"].append(row)
        sys.stdout.write(json.dumps({"path": path, "streams": streams}) + "\n")
    else:
        sys.stdout.write(_info_table(path, rows))
    return EXIT_OK


def _info_row(stream: str, part: dict) -> dict:
    recovery = part["recovery"]
    return {"stream": stream, "partition": part["partition"],
            "start_offset": part["start_offset"], "end_offset": part["end_offset"],
            "min_timestamp_us": part["min_timestamp_us"],
            "max_timestamp_us": part["max_timestamp_us"],
            "min_time": format_timestamp(part["min_timestamp_us"]),
            "max_time": format_timestamp(part["max_timestamp_us"]),
            "segments": part["segments"], "bytes": part["bytes"],
            "tail": recovery["tail"], "corruption": recovery["corruption"]}


_INFO_COLUMNS = (("STREAM", "stream"), ("PART", "partition"), ("START", "start_offset"),
                 ("END", "end_offset"), ("SEGMENTS", "segments"), ("BYTES", "bytes"),
                 ("TAIL", "tail"), ("MIN TIME", "min_time"), ("MIN US", "min_timestamp_us"),
                 ("MAX TIME", "max_time"), ("MAX US", "max_timestamp_us"))


def _info_table(path: str, rows: list[dict]) -> str:
    streams = len({row["stream"] for row in rows})
    head = f"log {path}: {streams} stream{'s' if streams != 1 else ''}\n"
    if not rows:
        return head
    cells = [[title for title, _ in _INFO_COLUMNS]]
    cells += [["-" if row[name] is None else str(row[name]) for _, name in _INFO_COLUMNS]
              for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(_INFO_COLUMNS))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip()
             for line in cells]
    notes = [f"{row['stream']}/{row['partition']}: {row['corruption']}"
             for row in rows if row["corruption"]]
    return head + "\n".join(lines + notes) + "\n"


# -- dump and verify: walking segments without the index -------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class BadSpot:
    """Bytes at `position` of a segment that are not a whole valid frame. `header`
    holds the decoded header fields when only the payload is wrong."""

    position: int
    reason: str
    header: dict | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class SegmentFile:
    stream: str
    partition: int
    base_offset: int
    path: str
    size_bytes: int


def walk_segment(handle: int, size: int, chunk_bytes: int = SCAN_CHUNK_BYTES):
    """Yield every Frame (position within the file) and BadSpot of one segment, in
    file order. After a bad spot the walk resumes at the next valid whole frame."""
    position = 0
    while position < size:
        data = os.pread(handle, min(chunk_bytes, size - position), position)
        if not data:
            return  # the file shrank under us
        result = scan_buffer(data, 0)
        for frame in result.frames:
            yield dataclasses.replace(frame, position=position + frame.position)
        position += result.end
        if result.stop is StopReason.END or (result.stop is StopReason.INCOMPLETE
                                             and result.frames):
            continue
        if result.stop is StopReason.INCOMPLETE:  # a frame larger than a chunk, or cut
            found = _decode_at(handle, size, position)
            if isinstance(found, Frame):
                yield found
                position = found.end_position
                continue
            reason = found
        else:
            reason = result.reason
        yield BadSpot(position, reason, _header_at(handle, position))
        resumed = _resync(handle, size, position, chunk_bytes)
        if resumed is None:
            return
        position = resumed


def _decode_at(handle: int, size: int, position: int) -> Frame | str:
    """The whole frame at `position` read on its own, or why there is none."""
    head = os.pread(handle, HEADER_BYTES, position)
    try:
        fields = decode_header(head, 0)
    except CorruptFrame as error:
        return error.reason
    if fields is INCOMPLETE:
        return f"frame cut short: the file ends {size - position} bytes into its header"
    total = HEADER_BYTES + fields[9]  # fields[9]: payload_bytes (frame.py's table)
    if position + total > size:
        return f"frame cut short: {size - position} of its {total} bytes are in the file"
    try:
        frame = decode_frame(os.pread(handle, total, position), 0)
    except CorruptFrame as error:
        return error.reason
    if frame is INCOMPLETE:
        return "frame cut short"
    return dataclasses.replace(frame, position=position)


def _header_at(handle: int, position: int) -> dict | None:
    try:
        fields = decode_header(os.pread(handle, HEADER_BYTES, position), 0)
    except CorruptFrame:
        return None
    if fields is INCOMPLETE:
        return None
    return {"base_offset": fields[4], "last_offset": fields[4] + fields[8] - 1,
            "count": fields[8], "min_timestamp_us": fields[5], "max_timestamp_us": fields[6],
            "txn_id": fields[7], "flags": fields[2], "payload_bytes": fields[9]}


def _resync(handle: int, size: int, position: int, chunk_bytes: int) -> int | None:
    """Position of the first valid whole frame strictly after `position`, or None."""
    search = position + 1
    overlap = len(MAGIC_BYTES) - 1
    while search < size:
        data = os.pread(handle, min(chunk_bytes, size - search), search)
        if not data:
            return None
        found = data.find(MAGIC_BYTES)
        while found >= 0:
            if isinstance(_decode_at(handle, size, search + found), Frame):
                return search + found
            found = data.find(MAGIC_BYTES, found + 1)
        if search + len(data) >= size:
            return None
        search += max(len(data) - overlap, 1)
    return None


def payload_problem(frame: Frame) -> str | None:
    """Why the payload of a checksummed frame does not decode, or None when it does."""
    try:
        columns = decode_columns(frame)
    except CorruptFrame as error:
        return error.reason
    timestamps = columns.timestamps_us
    if int(timestamps.min()) != frame.min_timestamp_us or (
            int(timestamps.max()) != frame.max_timestamp_us):
        return "timestamps disagree with the header's min and max"
    if columns.kinds is not None and int(columns.kinds.max()) > max(RecordKind):
        return "unknown record kind"
    if columns.header_lengths is not None:
        try:
            for _ in columns_to_records(columns, 0, data_only=False):
                pass
        except CorruptFrame as error:
            return error.reason
    return None


def log_segments(path: str, stream: str | None = None, partition: int | None = None):
    """Yield (stream, partition, [SegmentFile]) for the partitions of a log directory,
    in order, from the files alone. Raises UsageError for an unknown stream."""
    root = layout.streams_dir(path)
    names = sorted(n for n in (os.listdir(root) if os.path.isdir(root) else ())
                   if os.path.exists(os.path.join(root, n, "stream.json")))
    if stream is not None:
        if stream not in names:
            raise UsageError(f"no stream named {stream!r} in {path}")
        names = [stream]
    for name in names:
        meta = os.path.join(layout.stream_dir(path, name), "stream.json")
        try:
            with open(meta, "rb") as handle:
                count = int(json.loads(handle.read())["partitions"])
        except (ValueError, KeyError, TypeError):
            raise DataError(f"{meta} is damaged") from None
        for number in range(count):
            if partition is None or partition == number:
                yield name, number, _segment_files(path, name, number)


def _segment_files(path: str, stream: str, partition: int) -> list[SegmentFile]:
    directory = layout.partition_dir(path, stream, partition)
    if not os.path.isdir(directory):
        return []
    found = []
    for name in sorted(os.listdir(directory)):
        base = layout.parse_segment_name(name)
        if base is not None:
            file_path = os.path.join(directory, name)
            found.append(SegmentFile(stream, partition, base, file_path,
                                     os.path.getsize(file_path)))
    return sorted(found, key=lambda s: s.base_offset)


def _walk_file(segment: SegmentFile):
    handle = os.open(segment.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        yield from walk_segment(handle, segment.size_bytes)
    finally:
        os.close(handle)


# -- dump ------------------------------------------------------------------------------

_CODECS = {0: "none", 1: "zstd"}


def _run_dump(args) -> int:
    path = _existing_log(_local_path(args.log, "dump"))
    out = sys.stdout.buffer
    for stream, partition, segments in log_segments(path, args.stream, args.partition):
        for segment in segments:
            if not args.json:
                out.write(f"segment {segment.path} stream {stream} partition {partition} "
                          f"base_offset {segment.base_offset} bytes {segment.size_bytes}\n"
                          .encode())
            for event in _walk_file(segment):
                item = _dump_item(segment, event, args.records)
                out.write(_json_line(item) if args.json else _dump_text(item))
    out.flush()
    return EXIT_OK


def _dump_item(segment: SegmentFile, event, with_records: bool) -> dict:
    item = {"segment": segment.path, "stream": segment.stream,
            "partition": segment.partition, "position": event.position}
    if isinstance(event, BadSpot):
        item.update(event.header or {})
        item.update({"checksum_ok": False, "error": event.reason})
        return item
    item.update({"base_offset": event.base_offset, "last_offset": event.next_offset - 1,
                 "count": event.record_count, "min_timestamp_us": event.min_timestamp_us,
                 "max_timestamp_us": event.max_timestamp_us,
                 "codec": _CODECS.get(event.codec, str(event.codec)), "flags": event.flags,
                 "control": event.has_control, "txn_id": event.txn_id,
                 "payload_bytes": len(event.payload), "raw_bytes": event.raw_bytes,
                 "checksum_ok": True})
    problem = payload_problem(event)
    if problem is not None:
        item["error"] = problem
    elif with_records:
        item["records"] = [_dump_record(record) for record in columns_to_records(
            decode_columns(event), segment.partition, data_only=False)]
    return item


def _dump_record(record) -> dict:
    item = {"offset": record.offset, "timestamp": record.timestamp_us,
            "kind": record.kind.name.lower()}
    _put_bytes(item, "key", record.key)
    _put_bytes(item, "value", record.value)
    if record.headers:
        item["headers"] = {name: base64.b64encode(value).decode("ascii")
                           for name, value in record.headers}
    if record.txn_id:
        item["txn_id"] = record.txn_id
    return item


def _dump_text(item: dict) -> bytes:
    skip = ("segment", "stream", "partition", "records")
    parts = [_text_pair(name, value) for name, value in item.items() if name not in skip]
    lines = ["  " + " ".join(parts)]
    for record in item.get("records", ()):
        lines.append("  | " + " ".join(_text_pair(n, v) for n, v in record.items()))
    return ("\n".join(lines) + "\n").encode("utf-8")


_QUOTED = frozenset({"key", "value", "key_b64", "value_b64", "headers", "error"})


def _text_pair(name: str, value) -> str:
    """`name: value`, with user data and messages as JSON so spaces cannot mislead."""
    if name in _QUOTED:
        return f"{name}: {json.dumps(value, ensure_ascii=False)}"
    if isinstance(value, bool):
        return f"{name}: {'true' if value else 'false'}"
    return f"{name}: {'null' if value is None else value}"


# -- verify ----------------------------------------------------------------------------

@dataclasses.dataclass(slots=True)
class Finding:
    kind: str  # "corrupt" or "torn"
    path: str
    position: int
    reason: str

    def message(self) -> str:
        if self.kind == "torn":
            return (f"warning: torn tail in segment {self.path} at position {self.position}: "
                    f"{self.reason} (a writer truncates it on its next open)")
        return f"error: corruption in segment {self.path} at position {self.position}: " \
               f"{self.reason}"


@dataclasses.dataclass(slots=True)
class VerifyCounts:
    partitions: int = 0
    segments: int = 0
    frames: int = 0
    records: int = 0
    bytes: int = 0


def _run_verify(args) -> int:
    path = _existing_log(_local_path(args.log, "verify"))
    plan = list(log_segments(path))
    counts = VerifyCounts()
    progress = Progress("verify", sum(s.size_bytes for _, _, ss in plan for s in ss), "bytes")
    findings: list[Finding] = []
    try:
        for _, _, segments in plan:
            counts.partitions += 1
            findings += verify_partition(segments, counts, progress)
    finally:
        progress.finish()
    for finding in findings:
        sys.stderr.write(f"streamlog: {finding.message()}\n")
    corrupt = sum(f.kind == "corrupt" for f in findings)
    torn = sum(f.kind == "torn" for f in findings)
    verdict = "corrupt" if corrupt else "torn tail" if torn else "ok"
    if args.json:
        summary = dataclasses.asdict(counts) | {
            "streams": len({stream for stream, _, _ in plan}), "corrupt": corrupt,
            "torn": torn, "result": verdict,
            "findings": [dataclasses.asdict(f) for f in findings]}
        sys.stdout.write(json.dumps(summary) + "\n")
    else:
        sys.stdout.write(f"verified {counts.partitions} partitions, {counts.segments} segments, "
                         f"{counts.frames} frames, {counts.records} records, {counts.bytes} "
                         f"bytes: {corrupt} corrupt, {torn} torn: {verdict}\n")
    return EXIT_DATA if corrupt or (torn and args.strict) else EXIT_OK


def verify_partition(segments: list[SegmentFile], counts: VerifyCounts,
                     progress: Progress) -> list[Finding]:
    """Check one partition's segments in order. A bad spot becomes corruption when a
    valid frame follows it anywhere later in the partition, else it is the torn tail."""
    findings: list[Finding] = []
    pending: list[Finding] = []  # bad spots with no valid frame after them yet
    expected = None  # the base offset the next frame must have
    for segment in segments:
        counts.segments += 1
        if expected is not None and not pending and segment.base_offset != expected:
            findings.append(Finding("corrupt", segment.path, 0,
                                    f"segment starts at offset {segment.base_offset}, "
                                    f"expected {expected}"))
        expected = segment.base_offset if not pending else None
        for event in _walk_file(segment):
            if isinstance(event, BadSpot):
                pending.append(Finding("torn", segment.path, event.position, event.reason))
                continue
            if pending:  # valid data after a bad spot: corruption, and a gap is expected
                findings += [dataclasses.replace(f, kind="corrupt") for f in pending]
                pending, expected = [], None
            problem = _frame_problem(event, expected)
            if problem is not None:
                findings.append(Finding("corrupt", segment.path, event.position, problem))
            expected = event.next_offset
            counts.frames += 1
            counts.records += event.record_count
            counts.bytes += event.size
            progress.update(counts.bytes)
    return findings + pending


def _frame_problem(frame: Frame, expected: int | None) -> str | None:
    if expected is not None and frame.base_offset != expected:
        return f"frame has base offset {frame.base_offset}, expected {expected}"
    return payload_problem(frame)


# -- main ------------------------------------------------------------------------------

def _configure_logging(show_warnings: bool) -> None:
    """Recovery warnings (a torn tail truncated) as one line each when writing; read-only
    commands report what they find themselves."""
    logger = logging.getLogger("streamlog")
    logger.propagate = False
    logger.handlers[:] = []
    if not show_warnings:
        logger.addHandler(logging.NullHandler())
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("streamlog: warning: %(message)s"))
    handler.addFilter(lambda record: record.levelno == logging.WARNING)
    logger.addHandler(handler)


def _exit_code(error: BaseException) -> int:
    from .wire.protocol import DaemonError, ProtocolError
    if isinstance(error, CliError):
        return error.code
    if isinstance(error, (DaemonError, ProtocolError)):
        return EXIT_DAEMON
    if isinstance(error, CorruptionError):
        return EXIT_DATA
    if isinstance(error, (InvalidArgument, UnknownStream, OffsetOutOfRange, ReadOnlyLog)):
        return EXIT_USAGE
    if isinstance(error, (StreamLogError, OSError)):
        return EXIT_DATA
    return EXIT_USAGE  # ValueError from what the user gave


def _quiet_stdout() -> None:
    """After a broken pipe, point stdout at /dev/null so the interpreter's final flush
    does not complain."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code (the console script exits with it)."""
    args = build_parser().parse_args(argv)
    _configure_logging(getattr(args, "show_warnings", False))
    try:
        return args.run(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    except (StreamLogError, CliError, OSError, ValueError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        sys.stderr.write(f"streamlog: error: {message}\n")
        return _exit_code(error)


if __name__ == "__main__":
    sys.exit(main())
