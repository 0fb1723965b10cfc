"""The commands that judge a log's files: `info`, `dump`, `verify`, `repair`.

Strategy: each is a thin shell over check.py, which judges a partition with the same
walker and decision table as an open (integrity.py), so these commands and an open
never disagree about the same bytes. `info` opens the log read-only (its TAIL column is
what that open saw after the last recovery point) and shows the last full verification
(`verify` or the scrubber), never "clean" for bytes nobody checked. `dump` prints every
frame and bad spot. `verify` judges every byte and records its result. `repair` cuts
damaged partitions at their first bad frame, moving the cut bytes under
`LOG/quarantine/`, and says exactly what it cut.
"""

from __future__ import annotations

import base64
import json
import os
import sys

from . import cli as c
from . import layout
from .check import (BadSpot, check_partition, last_verification, record_verification,
                    repair_partition, segment_events, payload_problem)
from .fileio import OsFileIO
from .payload import columns_to_records, decode_columns

_INFO_EPILOG = """\
Shows, per stream and partition: start and end offsets (the end is the next offset to be
written), the time range (the first batch's smallest timestamp and the high-water mark,
as ISO-8601 and microseconds), segments, bytes, and two verdicts:
  TAIL      what opening the log saw after its last recovery point: clean, torn (a
            writer's last frame is incomplete; the next writer cuts it), stale, damaged
            (an acknowledged frame is damaged) or corrupt (valid data after damage)
  VERIFIED  when every byte was last checked (`streamlog verify --record`, or the
            scrubber of a daemon) and the result; "never" when nothing has checked the
            bytes before the tail
The log is opened read-only and no file is modified.

examples:
  streamlog info data/log
  streamlog info data/log --json | jq '.streams.events.partitions[0].end_offset'
"""

_DUMP_EPILOG = """\
Reads every segment file directly, without the index, and prints each batch frame:
segment file, position, base and last offset, record count, min and max timestamp,
codec, flags, transaction id, payload bytes and whether its checksums hold. A bad spot
is printed with its position and reason, and the dump goes on at the next valid frame.
After each partition, one line gives its verdict (as `verify` judges it).
Works on a log whose writer was killed; never modifies a file.

examples:
  streamlog dump data/log
  streamlog dump data/log --stream events --partition 0 --records
  streamlog dump data/log --json | jq 'select(.checksum_ok == false)'
"""

_VERIFY_EPILOG = """\
Checks every byte of every partition: each frame's checksums, that each frame continues
the one before (within and across segments), that every payload decodes; a sealed
segment (one that rolled) is checked at disk speed against its whole-file checksum.
The verdict per partition is the one an open would reach for the same bytes:
  damaged / corrupt   an acknowledged frame is damaged, or valid data follows damage:
                      the segment path, position and offset on stderr, exit 1
  torn / stale        the tail after the last acknowledged frame is incomplete or an
                      old copy: a warning, exit 0 (1 with --strict); a writer cuts it
An index that disagrees with the segments is reported (the next open rebuilds it).
Never modifies a file, unless --record asks it to keep its result for `streamlog info`
(scrub.json in each partition, as the daemon's scrubber does). A summary line goes to
stdout at the end.

examples:
  streamlog verify data/log
  streamlog verify data/log --strict && echo clean
  streamlog verify data/log --record && streamlog info data/log
  streamlog verify data/log --json | jq '.findings'
"""

_REPAIR_EPILOG = """\
Cuts each damaged partition at its first bad frame (damaged, corrupt, torn or stale,
as `verify` judges it). The cut bytes are moved under LOG/quarantine/STREAM/P/TIME/,
never deleted, and the partition's index is dropped (the next open rebuilds it). Prints
one JSON line per cut: stream, partition, segment, position, verdict, reason,
bytes_cut, offsets_removed ([first, last] of the whole records cut, or null) and the
quarantine folder. Takes the log's writer lock (no writer may have it open).
Exit 0 when the log is sound afterwards, 1 when it is not; with --dry-run it prints
what it would cut and changes nothing (exit 0 when nothing needs cutting, else 1).

examples:
  streamlog repair data/log --dry-run
  streamlog repair data/log && streamlog verify data/log
"""


def add_info(subparsers) -> None:
    parser = c._subparser(subparsers, "info", "show the streams and partitions of a log",
                          _INFO_EPILOG)
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    parser.set_defaults(run=run_info)


def add_dump(subparsers) -> None:
    parser = c._subparser(subparsers, "dump", "print the frames of the segment files",
                          _DUMP_EPILOG)
    parser.add_argument("--stream", help="only this stream")
    parser.add_argument("--partition", type=c._nonnegative_int, metavar="P",
                        help="only this partition")
    parser.add_argument("--records", action="store_true", help="print every record too")
    parser.add_argument("--json", action="store_true", help="one JSON object per frame")
    parser.set_defaults(run=run_dump)


def add_verify(subparsers) -> None:
    parser = c._subparser(subparsers, "verify", "check every byte of every partition",
                          _VERIFY_EPILOG)
    parser.add_argument("--strict", action="store_true",
                        help="a torn or stale tail is an error too (exit 1)")
    parser.add_argument("--json", action="store_true", help="a JSON summary instead of text")
    parser.add_argument("--record", action="store_true",
                        help="keep the result (scrub.json) for `streamlog info`")
    parser.set_defaults(run=run_verify)


def add_repair(subparsers) -> None:
    parser = c._subparser(subparsers, "repair",
                          "cut damaged partitions at their first bad frame",
                          _REPAIR_EPILOG)
    parser.add_argument("--dry-run", action="store_true",
                        help="print what would be cut; change nothing")
    parser.set_defaults(run=run_repair)


# -- partitions of a log directory --------------------------------------------------------

def partition_dirs(path: str, stream: str | None = None, partition: int | None = None):
    """(stream, number, directory) of every partition, from the files alone."""
    root = layout.streams_dir(path)
    names = sorted(n for n in (os.listdir(root) if os.path.isdir(root) else ())
                   if os.path.exists(os.path.join(root, n, "stream.json")))
    if stream is not None:
        if stream not in names:
            raise c.UsageError(f"no stream named {stream!r} in {path}")
        names = [stream]
    for name in names:
        meta = os.path.join(layout.stream_dir(path, name), "stream.json")
        try:
            with open(meta, "rb") as handle:
                count = int(json.loads(handle.read())["partitions"])
        except (ValueError, KeyError, TypeError):
            raise c.DataError(f"{meta} is damaged") from None
        for number in range(count):
            if partition is None or partition == number:
                yield name, number, layout.partition_dir(path, name, number)


def _size_of(directory: str) -> int:
    if not os.path.isdir(directory):
        return 0
    return sum(os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory)
               if layout.parse_segment_name(n) is not None)


def _check_all(path: str, label: str):
    plan = list(partition_dirs(path))
    progress = c.Progress(label, sum(_size_of(d) for _, _, d in plan), "bytes")
    results, done = [], 0
    try:
        for stream, number, directory in plan:
            result = check_partition(stream, number, directory,
                                     progress=lambda n, base=done: progress.update(base + n))
            done += result.bytes_walked + result.bytes_sealed
            results.append(result)
    finally:
        progress.finish()
    return results


# -- verify -------------------------------------------------------------------------------

def run_verify(args) -> int:
    path = c._existing_log(c._local_path(args.log, "verify"))
    results = _check_all(path, "verify")
    fileio = OsFileIO()
    for result in results:
        if args.record:
            record_verification(fileio, result)
        _print_problems(result)
    damaged = sum(r.damaged for r in results)
    torn = sum(r.verdict.is_tail_garbage for r in results)
    verdict = "corrupt" if damaged else "torn tail" if torn else "ok"
    totals = {name: sum(getattr(r, name) for r in results)
              for name in ("segments", "frames", "records", "bytes_walked", "bytes_sealed")}
    if args.json:
        findings = [f for r in results for f in r.as_dict()["findings"]]
        summary = {"partitions": len(results), **totals,
                   "bytes": totals["bytes_walked"] + totals["bytes_sealed"],
                   "streams": len({r.stream for r in results}), "corrupt": damaged,
                   "torn": torn, "result": verdict, "findings": findings,
                   "details": [r.as_dict() for r in results]}
        sys.stdout.write(json.dumps(summary) + "\n")
    else:
        sys.stdout.write(
            f"verified {len(results)} partitions, {totals['segments']} segments, "
            f"{totals['records']} records ({totals['frames']} frames decoded), "
            f"{totals['bytes_walked'] + totals['bytes_sealed']} bytes "
            f"({totals['bytes_sealed']} by whole-segment checksums): {damaged} corrupt, "
            f"{torn} torn: {verdict}\n")
    return c.EXIT_DATA if damaged or (torn and args.strict) else c.EXIT_OK


def _print_problems(result) -> None:
    name = f"{result.stream}/{result.partition}"
    if result.index_problem:
        sys.stderr.write(f"streamlog: warning: index of {name} will be rebuilt by the next "
                         f"open: {result.index_problem}\n")
    for note in result.notes:
        sys.stderr.write(f"streamlog: warning: {name}: {note}\n")
    for finding in ([result.finding] if result.finding else []) + result.payload_findings:
        sys.stderr.write(f"streamlog: {finding.message()}\n")


# -- repair -------------------------------------------------------------------------------

def run_repair(args) -> int:
    from .log import take_writer_lock
    path = c._existing_log(c._local_path(args.log, "repair"))
    lock = None if args.dry_run else take_writer_lock(path)
    try:
        results = _check_all(path, "repair: checking")
        needed = [r for r in results if r.finding is not None or r.index_problem]
        for result in needed:
            for line in repair_partition(path, result, dry_run=args.dry_run):
                sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()
        if args.dry_run:
            return c.EXIT_DATA if needed else c.EXIT_OK
        after = _check_all(path, "repair: re-checking")
    finally:
        if lock is not None:
            lock.close()
    unsound = [r for r in after if r.damaged or r.verdict.is_tail_garbage]
    for result in unsound:
        _print_problems(result)
    if not unsound and needed:
        from .log import open_log  # rebuild the indexes now, and prove the log opens
        open_log(path, create=False).close()
    return c.EXIT_DATA if unsound else c.EXIT_OK


# -- info ---------------------------------------------------------------------------------

def run_info(args) -> int:
    path = c._existing_log(args.log)
    with c._open_readonly(path) as log:
        described = log.info()
    rows = []
    for stream, found in described["streams"].items():
        for part in found["partitions"]:
            directory = None if c._is_url(path) else layout.partition_dir(
                path, stream, part["partition"])
            rows.append(_info_row(stream, part, directory))
    if args.json:
        streams: dict = {}
        for row in rows:
            streams.setdefault(row.pop("stream"), {"partitions": []})["partitions"].append(row)
        sys.stdout.write(json.dumps({"path": path, "streams": streams}) + "\n")
    else:
        sys.stdout.write(_info_table(path, rows))
    return c.EXIT_OK


def _info_row(stream: str, part: dict, directory: str | None) -> dict:
    recovery = part["recovery"]
    verified = part.get("verified")
    if verified is None and directory is not None:
        verified = last_verification(directory)
    return {"stream": stream, "partition": part["partition"],
            "start_offset": part["start_offset"], "end_offset": part["end_offset"],
            "min_timestamp_us": part["min_timestamp_us"],
            "max_timestamp_us": part["max_timestamp_us"],
            "min_time": c.format_timestamp(part["min_timestamp_us"]),
            "max_time": c.format_timestamp(part["max_timestamp_us"]),
            "segments": part["segments"], "bytes": part["bytes"],
            "tail": recovery["tail"], "corruption": recovery["corruption"],
            "index_problem": recovery.get("index_problem"), "verified": verified}


def _verified_cell(verified: dict | None) -> str:
    if not verified:
        return "never"
    when = c.format_timestamp(verified.get("verified_at_us"))
    return f"{verified.get('result', '?')} at {when}"


_INFO_COLUMNS = (("STREAM", "stream"), ("PART", "partition"), ("START", "start_offset"),
                 ("END", "end_offset"), ("SEGMENTS", "segments"), ("BYTES", "bytes"),
                 ("TAIL", "tail"), ("VERIFIED", "verified_cell"), ("MIN TIME", "min_time"),
                 ("MIN US", "min_timestamp_us"), ("MAX TIME", "max_time"),
                 ("MAX US", "max_timestamp_us"))


def _info_table(path: str, rows: list[dict]) -> str:
    streams = len({row["stream"] for row in rows})
    head = f"log {path}: {streams} stream{'s' if streams != 1 else ''}\n"
    if not rows:
        return head
    for row in rows:
        row["verified_cell"] = _verified_cell(row["verified"])
    cells = [[title for title, _ in _INFO_COLUMNS]]
    cells += [["-" if row[name] is None else str(row[name]) for _, name in _INFO_COLUMNS]
              for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(_INFO_COLUMNS))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip()
             for line in cells]
    notes = [f"{row['stream']}/{row['partition']}: {row['corruption']}"
             for row in rows if row["corruption"]]
    notes += [f"{row['stream']}/{row['partition']}: index rebuilt in memory: "
              f"{row['index_problem']}" for row in rows if row["index_problem"]]
    for row in rows:
        found = (row["verified"] or {}).get("findings") or []
        notes += [f"{row['stream']}/{row['partition']}: verification found: "
                  f"{f.get('segment')} at position {f.get('position')}: {f.get('reason')}"
                  for f in found]
    return head + "\n".join(lines + notes) + "\n"


# -- dump ---------------------------------------------------------------------------------

_CODECS = {0: "none", 1: "zstd"}


def run_dump(args) -> int:
    from .check import open_segments
    path = c._existing_log(c._local_path(args.log, "dump"))
    out = sys.stdout.buffer
    for stream, number, directory in partition_dirs(path, args.stream, args.partition):
        segments = open_segments(directory)
        try:
            for segment in segments:
                if not args.json:
                    out.write(f"segment {segment.path} stream {stream} partition {number} "
                              f"base_offset {segment.base_offset} bytes "
                              f"{segment.size_bytes}\n".encode())
                for event in segment_events(segment):
                    item = _dump_item(segment.path, stream, number, event, args.records)
                    out.write(c._json_line(item) if args.json else _dump_text(item))
        finally:
            for segment in segments:
                segment.close()
        result = check_partition(stream, number, directory, check_payloads=False)
        verdict = {"stream": stream, "partition": number, "verdict": result.verdict.value,
                   "index": result.index.value}
        if result.finding is not None:
            verdict.update(segment=result.finding.path, position=result.finding.position,
                           reason=result.finding.reason)
        out.write(c._json_line({"kind": "verdict", **verdict}) if args.json else
                  ("verdict " + " ".join(_text_pair(k, v) for k, v in verdict.items())
                   + "\n").encode())
    out.flush()
    return c.EXIT_OK


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
    c._put_bytes(item, "key", record.key)
    c._put_bytes(item, "value", record.value)
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


_QUOTED = frozenset({"key", "value", "key_b64", "value_b64", "headers", "error", "reason",
                     "segment"})


def _text_pair(name: str, value) -> str:
    """`name: value`, with user data and messages as JSON so spaces cannot mislead."""
    if name in _QUOTED:
        return f"{name}: {json.dumps(value, ensure_ascii=False)}"
    if isinstance(value, bool):
        return f"{name}: {'true' if value else 'false'}"
    return f"{name}: {'null' if value is None else value}"
