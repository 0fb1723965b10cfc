"""`streamlog append`: JSON lines from stdin into a stream (DESIGN 10).

Strategy: lines are parsed and routed to partitions in chunks (a key picks a partition
by a stable hash, a record without one goes round robin), and each chunk is handed to
the log as one batch per partition, a few in flight at once. A malformed line stops the
command with its line number; the lines before it are appended and reported.
"""

from __future__ import annotations

import base64
import binascii
import concurrent.futures
import dataclasses
import json
import os
import stat
import sys
import time

from .. import open_log, partition_for_key
from ..config import LogConfig
from .common import (EXIT_OK, ObjectPairs, UsageError, is_url, json_line, parse_headers,
                     parse_timestamp, partitions_arg, positive_int, progress_bar,
                     stream_arg, subparser, writable_log)

# append: lines parsed and handed to the log at once (a frame holds up to 64 Ki records).
APPEND_CHUNK_LINES = 4096
APPEND_CHUNK_BYTES = 8 * 1024 * 1024
APPEND_THREADS_MAX = 8

_APPEND_EPILOG = """\
Each input line is one JSON object:
  value | value_b64    the value, as UTF-8 text or base64 bytes (one of them is required;
                       "value": null is a tombstone, a record whose value is None)
  key | key_b64        optional key (null or absent: no key)
  headers | headers_b64
                       optional headers, one JSON object {"name": "value"}: with
                       `headers` the values are UTF-8 text, with `headers_b64` every
                       value is base64 (the rule `read` follows: headers_b64 as soon as
                       one value is not valid UTF-8); a null value is None; a name given
                       twice is kept twice
  timestamp            optional: integer microseconds since the epoch, or ISO-8601
                       (UTC when no zone is given); absent: the time of the append
  partition            optional partition number; otherwise a key picks one by a stable
                       hash and a record without a key goes round robin
  stream, offset       ignored, so the output of `streamlog read` can be appended
Blank lines are skipped. The log and the stream are created when missing (1 partition
unless --partitions says otherwise). At the end one JSON line tells what was appended:
  {"stream": "S", "records": N, "partitions": {"P": [first_offset, last_offset]}}
A malformed line stops the command with exit 2 and its line (and column) number on
stderr; the lines before it are appended and reported, nothing after it.
Several processes may append to one local log at once, a daemon's among them (while
`streamlog repair` has the log to itself, append waits for it to finish). LOG may be a
daemon URL: the records go to the daemon's log (--fsync is the daemon's own there).
LOG may not be a log in an object store (s3://BUCKET/PREFIX): it is read-only here;
append to the local log (or the daemon) that is tiered to it.
On a terminal, stderr shows the progress (bytes of input read).

examples:
  echo '{"key": "user-1", "value": "hello"}' | streamlog append data/log --stream events
  echo '{"value": "v", "headers": {"trace": "abc"}}' | streamlog append data/log --stream events
  streamlog append data/log --stream events --partitions 4 --fsync interval < events.jsonl
  streamlog read old/log --stream events | streamlog append new/log --stream events
  STREAMLOG_TOKEN=secret streamlog append streamlog://127.0.0.1:7541 --stream events < events.jsonl
"""


def add(subparsers) -> None:
    parser = subparser(subparsers, "append", "append JSON lines from stdin to a stream",
                       _APPEND_EPILOG, store=False)
    parser.add_argument("--stream", required=True, type=stream_arg,
                        help="stream name (letters, digits, '.', '_', '-')")
    parser.add_argument("--partitions", type=partitions_arg, metavar="N",
                        help="partitions of a new stream (default 1); must match an existing one")
    parser.add_argument("--fsync", choices=("always", "interval", "never"),
                        help="durability policy of a local log (default always: "
                             "acknowledged = on disk)")
    parser.add_argument("--fsync-interval-ms", type=positive_int, metavar="MS",
                        help="group-commit interval for --fsync interval (default 50)")
    parser.set_defaults(run=run, show_warnings=True)


# -- append ----------------------------------------------------------------------------

_APPEND_FIELDS = frozenset({"value", "value_b64", "key", "key_b64", "headers", "headers_b64",
                            "timestamp", "partition", "stream", "offset"})


def run(args) -> int:
    path = writable_log(args.log)
    if is_url(path):
        if args.fsync is not None or args.fsync_interval_ms is not None:
            raise UsageError("--fsync and --fsync-interval-ms set a local log's policy; a "
                             "daemon keeps its own")
        options = {}
    else:
        options = {"fsync": args.fsync or "always"}
        if args.fsync_interval_ms is not None:
            options["fsync_interval_ms"] = args.fsync_interval_ms
    with open_log(path, **options) as log:
        count = _ensure_stream(log, args.stream, args.partitions)
        batcher = _Batcher(log, args.stream, count)
        try:
            with progress_bar(f"append {args.stream}", _input_size(sys.stdin.buffer),
                              in_bytes=True) as bar:
                error = batcher.run(sys.stdin.buffer, bar)
        finally:
            sys.stdout.buffer.write(json_line(batcher.summary()))
            sys.stdout.buffer.flush()
    if error is not None:
        raise UsageError(error)
    return EXIT_OK


def _input_size(stream) -> int | None:
    """Bytes left to read when stdin is a regular file (for the bar's total), else None."""
    try:
        found = os.fstat(stream.fileno())
        if stat.S_ISREG(found.st_mode):
            return max(found.st_size - stream.tell(), 0)
    except (OSError, ValueError, AttributeError):
        pass
    return None


def _ensure_stream(log, stream: str, partitions: int | None) -> int:
    if stream in log.streams():
        existing = log.partition_count(stream)
        if partitions is not None and partitions != existing:
            raise UsageError(f"stream {stream!r} has {existing} "
                             f"partition{'s' if existing != 1 else ''}; --partitions "
                             f"{partitions} disagrees (leave it out to use the stream's)")
        return existing
    return log.create_stream(stream, partitions or 1)


@dataclasses.dataclass(slots=True)
class _Chunk:
    """Parsed lines waiting to be appended: per partition, parallel columns (headers:
    None for a partition none of whose records has any)."""

    columns: dict = dataclasses.field(default_factory=dict)  # p -> [values, keys, times, headers]
    lines: int = 0
    nbytes: int = 0
    input_bytes: int = 0  # of the lines read, blank and malformed ones included

    def add(self, partition: int, value: bytes, key: bytes | None, timestamp_us: int,
            record_headers) -> None:
        columns = self.columns.get(partition)
        if columns is None:
            columns = self.columns[partition] = [[], [], [], None]
        values, keys, timestamps, headers = columns
        if record_headers is not None and headers is None:
            headers = columns[3] = [None] * len(values)
        values.append(value)
        keys.append(key)
        timestamps.append(timestamp_us)
        if headers is not None:
            headers.append(record_headers)
        self.lines += 1
        self.nbytes += _record_bytes(value, key)


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

    def run(self, lines, bar) -> str | None:
        """Append every line; returns the message for a malformed line, or None.
        `bar` (progress_bar) advances by the bytes of input of each chunk."""
        workers = min(self.partition_count, APPEND_THREADS_MAX)
        error, pending = None, []
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            for chunk, error in self._chunks(lines):
                self._collect(pending)
                pending = [pool.submit(self._append, p, *columns)
                           for p, columns in sorted(chunk.columns.items())]
                bar.update(chunk.input_bytes)
                if error is not None:
                    break
            self._collect(pending)
        return error

    def _append(self, partition: int, values, keys, timestamps, headers):
        return self.log.append_batch_sync(self.stream, values, keys=keys,
                                          timestamps_us=timestamps, partition=partition,
                                          headers=headers)

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
            chunk.input_bytes += len(line)
            if not line.strip():
                continue
            try:
                value, key, timestamp_us, partition, headers = parse_append_record(
                    line, self.partition_count, self.record_bytes_max)
            except ValueError as error:
                yield chunk, f"line {number}: {error}"
                return
            chunk.add(self._route(partition, key), value, key, timestamp_us, headers)
            if chunk.lines >= APPEND_CHUNK_LINES or chunk.nbytes >= APPEND_CHUNK_BYTES:
                yield chunk, None
                chunk = _Chunk()
        if chunk.lines or chunk.input_bytes:
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
    """(value, key, timestamp_us, partition or None) of one input line (its headers:
    parse_append_record). Raises ValueError with a sentence (without the line number)
    for a malformed line."""
    return parse_append_record(line, partition_count, record_bytes_max)[:4]


def parse_append_record(line: bytes, partition_count: int, record_bytes_max: int):
    """(value, key, timestamp_us, partition or None, headers or None) of one input line
    (a plain tuple: a million lines are parsed one by one). Raises ValueError with a
    sentence (without the line number) for a malformed line; a JSON error names its
    column in the line (1 is the first character)."""
    line = line.rstrip(b"\r\n")
    try:
        if b'"headers' in line:  # keep a header name that is given twice
            item = json.loads(line, object_pairs_hook=ObjectPairs)
        else:
            item = json.loads(line)
    except UnicodeDecodeError as error:
        raise ValueError(f"not valid UTF-8 (byte {error.start + 1})") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"not valid JSON: {error.msg} at column {error.pos + 1}") from None
    if not isinstance(item, dict):
        raise ValueError(f"expected a JSON object, got {type(item).__name__}")
    unknown = item.keys() - _APPEND_FIELDS
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(sorted(map(repr, unknown)))}")
    value = _bytes_field(item, "value")
    if value is None and not ("value" in item or "value_b64" in item):
        raise ValueError("no value (give value or value_b64; null for a tombstone)")
    key = _bytes_field(item, "key")
    size = _record_bytes(value, key)
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
    return value, key, timestamp_us, partition, parse_headers(item)


def _record_bytes(value: bytes | None, key: bytes | None) -> int:
    """A record's key and value bytes, as the log counts them (None: 0)."""
    return (len(value) if value is not None else 0) + (len(key) if key is not None else 0)


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


