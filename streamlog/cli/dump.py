"""`streamlog dump`: every frame and bad spot of the segment files, and each partition's
verdict (check.py), without the index.

A log in an object store is dumped through its read-only view's file layer, held at
one manifest generation (store.log_files); a segment is named by its object's URL.
"""

from __future__ import annotations

import json
import sys

from ..check import (BadSpot, check_partition, open_segments, partition_dirs, payload_problem,
                     segment_events)
from ..payload import columns_to_records, decode_columns
from .common import (EXIT_OK, UsageError, advance_to, json_line, nonnegative_int,
                     progress_bar, put_bytes, put_headers, segment_bytes, stream_arg,
                     subparser)
from .store import log_files

_DUMP_EPILOG = """\
Reads every segment file directly, without the index, and prints each batch frame:
segment file, position, base and last offset, record count, min and max timestamp,
codec, flags, transaction id, payload bytes and whether its checksums hold. A bad spot
is printed with its position and reason, and the dump goes on at the next valid frame.
With --records, each record's key, value and headers follow the rules of `read`
(text, or key_b64 / value_b64 / headers_b64 when not valid UTF-8).
After each partition, one line gives its verdict (as `verify` judges it).
Works on a log whose writer was killed; never modifies a file. LOG is a local
directory: dump reads the segment files directly, so on a daemon's log run it on the
daemon's machine. When stdout is not a terminal, stderr shows the progress there.
LOG may be a log in an object store, s3://BUCKET/PREFIX (endpoint and credentials from
the AWS_* variables): the segment objects its newest manifest generation names, each
named by its URL.

examples:
  streamlog dump data/log
  streamlog dump data/log --stream events --partition 0 --records
  streamlog dump data/log --json | jq 'select(.checksum_ok == false)'
  streamlog dump s3://my-bucket/logs/orders --stream events --partition 0
"""


def add(subparsers) -> None:
    parser = subparser(subparsers, "dump", "print the frames of the segment files",
                       _DUMP_EPILOG, url=False)
    parser.add_argument("--stream", type=stream_arg, help="only this stream")
    parser.add_argument("--partition", type=nonnegative_int, metavar="P",
                        help="only this partition")
    parser.add_argument("--records", action="store_true", help="print every record too")
    parser.add_argument("--json", action="store_true", help="one JSON object per frame")
    parser.set_defaults(run=run)


_CODECS = {0: "none", 1: "zstd"}


def run(args) -> int:
    with log_files(args.log, "dump") as files:
        return _dump(args, files)


def _dump(args, files) -> int:
    out = sys.stdout.buffer
    plan = list(partition_dirs(files.path, args.stream, args.partition, fileio=files.fileio))
    if args.partition is not None and not plan:
        raise UsageError(f"no partition {args.partition} in "
                         f"{'stream ' + repr(args.stream) if args.stream else 'any stream'}")
    total = sum(segment_bytes(directory, files.fileio) for _, _, directory in plan)
    with progress_bar("dump", total, in_bytes=True, writes_stdout=True) as bar:
        for stream, number, directory in plan:
            segments = open_segments(directory, files.fileio)
            try:
                _dump_partition(out, args, files, (stream, number, directory), segments, bar)
            finally:
                for segment in segments:
                    segment.close()
    out.flush()
    return EXIT_OK


def _dump_partition(out, args, files, where: tuple, segments, bar) -> None:
    stream, number, directory = where
    for segment in segments:
        name = files.name_of(segment.path)
        if not args.json:
            out.write(f"segment {name} stream {stream} partition {number} "
                      f"base_offset {segment.base_offset} bytes "
                      f"{segment.size_bytes}\n".encode())
        done = bar.n
        for event in segment_events(segment):
            item = _dump_item(name, stream, number, event, args.records)
            out.write(json_line(item) if args.json else _dump_text(item))
            advance_to(bar, done + event.position)
        advance_to(bar, done + segment.size_bytes)
    result = check_partition(stream, number, directory, fileio=files.fileio,
                             index_storage=files.index_storage, check_payloads=False)
    verdict = {"stream": stream, "partition": number, "verdict": result.verdict.value,
               "index": result.index.value}
    if result.finding is not None:
        verdict.update(segment=files.name_of(result.finding.path),
                       position=result.finding.position, reason=result.finding.reason)
    out.write(json_line({"kind": "verdict", **verdict}) if args.json else
              ("verdict " + " ".join(_text_pair(k, v) for k, v in verdict.items())
               + "\n").encode())


def _dump_item(path: str, stream: str, number: int, event, with_records: bool) -> dict:
    item = {"segment": path, "stream": stream, "partition": number,
            "position": event.position}
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
            decode_columns(event), number, data_only=False)]
    return item


def _dump_record(record) -> dict:
    item = {"offset": record.offset, "timestamp": record.timestamp_us,
            "kind": record.kind.name.lower()}
    put_bytes(item, "key", record.key)
    put_bytes(item, "value", record.value)
    put_headers(item, record.headers)
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


_QUOTED = frozenset({"key", "value", "key_b64", "value_b64", "headers", "headers_b64",
                     "error", "reason", "segment"})


def _text_pair(name: str, value) -> str:
    """`name: value`, with user data and messages as JSON so spaces cannot mislead."""
    if name in _QUOTED:
        return f"{name}: {json.dumps(value, ensure_ascii=False)}"
    if isinstance(value, bool):
        return f"{name}: {'true' if value else 'false'}"
    return f"{name}: {'null' if value is None else value}"
