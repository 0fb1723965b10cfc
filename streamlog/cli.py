"""The `streamlog` command line: append, read, info, dump, verify, repair (DESIGN 10).

Strategy: one `argparse` subcommand per verb; each is registered by an `_add_NAME`
function listed in `COMMANDS` and run by a `_run_NAME(args) -> exit code` function, so a
new verb (`serve`) is one more pair. `main()` is the only place that turns exceptions
into exit codes and one-line messages:

    0    success
    1    corruption found, or a data error (damaged files, a failed write)
    2    usage errors and malformed input
    3    cannot reach or authenticate to a daemon (with the daemon client)
    130  interrupted (Ctrl-C);  141  the reader of stdout went away (`| head`)

`append` and `read` go through the public API (`open_log`); `read` opens the log
read-only, which never modifies a file. `info`, `dump`, `verify` and `repair` live in
check_cli.py: they judge the files with the same walker and decision table as an open
(check.py, integrity.py), so no two commands disagree about the same bytes.
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
from .errors import (CorruptionError, InvalidArgument, OffsetOutOfRange, ReadOnlyLog,
                     StreamLogError, UnknownStream)
from .log import open_log, partition_for_key

EXIT_OK, EXIT_DATA, EXIT_USAGE, EXIT_DAEMON = 0, 1, 2, 3
EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 130, 141
DAEMON_SCHEME = "streamlog://"
# append: lines parsed and handed to the log at once (a frame holds up to 64 Ki records).
APPEND_CHUNK_LINES = 4096
APPEND_CHUNK_BYTES = 8 * 1024 * 1024
APPEND_THREADS_MAX = 8
# read --follow: how often the directory is re-opened to see other processes' appends.
FOLLOW_INTERVAL_S = 0.2
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


def _add_info(subparsers) -> None:
    from .check_cli import add_info
    add_info(subparsers)


def _add_dump(subparsers) -> None:
    from .check_cli import add_dump
    add_dump(subparsers)


def _add_verify(subparsers) -> None:
    from .check_cli import add_verify
    add_verify(subparsers)


def _add_repair(subparsers) -> None:
    from .check_cli import add_repair
    add_repair(subparsers)


def _add_serve(subparsers) -> None:
    from .wire.serve_cli import add_serve_parser, run_serve
    add_serve_parser(subparsers).set_defaults(run=run_serve)


# A new subcommand is one more `_add_NAME(subparsers)` here.
COMMANDS = (_add_append, _add_read, _add_info, _add_dump, _add_verify, _add_repair,
            _add_serve)


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
                _put_bytes(item, "key", record.key)
                _put_bytes(item, "value", record.value)
                lines.append(_json_line(item))
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
    # `python -m streamlog.cli`: run the imported module's main, so check_cli and this
    # command share one set of classes (this file would otherwise be loaded twice).
    from streamlog.cli import main as _main
    sys.exit(_main())
