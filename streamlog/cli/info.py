"""`streamlog info`: streams and partitions, their tail verdict and last verification.

Strategy: a read-only open (its recovery report is the TAIL verdict, the same table as
every other tool) and each partition's scrub.json (VERIFIED), as a table or JSON. A log
tiered to an object store (through its daemon) or read from the store (an s3:// LOG)
also has its manifest generation and, per partition, what the store holds and what it
lacks yet (Log.info's "remote" fields), as columns of their own.
"""

from __future__ import annotations

import json
import sys

from .common import EXIT_OK, existing_log, format_timestamp, subparser
from .store import open_readonly

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
Below the table: the durable holds (Log.hold; an operator's runtime holds the input it
would need to recover), each keeping its offset and what follows from retention.
The log is opened read-only and no file is modified. LOG may be a daemon URL: the
daemon describes its log. LOG may be a log in an object store, s3://BUCKET/PREFIX
(endpoint and credentials from the AWS_* variables): what the store's newest manifest
generation holds, read from this machine.
For a log tiered to a store (a daemon's, or one read from the store) the table also has:
  REMOTE END  the offset the store holds the partition up to (exclusive)
  LAG         records the store lacks yet (0 for a log read from the store)
  LAG BYTES   bytes of the local segments the store lacks yet
  GEN         the manifest generation these come from
and --json the same fields: remote_committed_offset, remote_lag_records,
remote_lag_bytes, and a "remote" object (url, generation, epoch, writer, error).

examples:
  streamlog info data/log
  streamlog info data/log --json | jq '.streams.events.partitions[0].end_offset'
  STREAMLOG_TOKEN=secret streamlog info streamlog://127.0.0.1:7541
  streamlog info s3://my-bucket/logs/orders
"""


def add(subparsers) -> None:
    parser = subparser(subparsers, "info", "show the streams and partitions of a log",
                       _INFO_EPILOG)
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    parser.set_defaults(run=run)


def run(args) -> int:
    path = existing_log(args.log)
    with open_readonly(path) as log:
        described = log.info()
    rows = []
    for stream, found in described["streams"].items():
        for part in found["partitions"]:
            rows.append(_info_row(stream, part))
    if args.json:
        streams: dict = {}
        for row in rows:
            streams.setdefault(row.pop("stream"), {"partitions": []})["partitions"].append(row)
        remote = {"remote": described["remote"]} if "remote" in described else {}
        sys.stdout.write(json.dumps({"path": path, "streams": streams, **remote}) + "\n")
    else:
        sys.stdout.write(_info_table(path, rows, described.get("remote")))
    return EXIT_OK


def _info_row(stream: str, part: dict) -> dict:
    recovery = part["recovery"]
    verified = part.get("verified")  # Log.info reads scrub.json (a daemon's, remotely)
    return {"stream": stream, "partition": part["partition"],
            "start_offset": part["start_offset"], "end_offset": part["end_offset"],
            "min_timestamp_us": part["min_timestamp_us"],
            "max_timestamp_us": part["max_timestamp_us"],
            "min_time": format_timestamp(part["min_timestamp_us"]),
            "max_time": format_timestamp(part["max_timestamp_us"]),
            "segments": part["segments"], "bytes": part["bytes"],
            "tail": recovery["tail"], "corruption": recovery["corruption"],
            "index_problem": recovery.get("index_problem"), "verified": verified,
            "holds": part.get("holds") or {},
            **{name: part[name] for name in _REMOTE_FIELDS if name in part}}


# Per partition, for a log tiered to a store (Log.info).
_REMOTE_FIELDS = ("remote_committed_offset", "remote_lag_records", "remote_lag_bytes")


def _verified_cell(verified: dict | None) -> str:
    if not verified:
        return "never"
    when = format_timestamp(verified.get("verified_at_us"))
    return f"{verified.get('result', '?')} at {when}"


_INFO_COLUMNS = (("STREAM", "stream"), ("PART", "partition"), ("START", "start_offset"),
                 ("END", "end_offset"), ("SEGMENTS", "segments"), ("BYTES", "bytes"),
                 ("TAIL", "tail"), ("VERIFIED", "verified_cell"), ("MIN TIME", "min_time"),
                 ("MIN US", "min_timestamp_us"), ("MAX TIME", "max_time"),
                 ("MAX US", "max_timestamp_us"))
# After END, for a log tiered to a store.
_REMOTE_COLUMNS = (("REMOTE END", "remote_committed_offset"), ("LAG", "remote_lag_records"),
                   ("LAG BYTES", "remote_lag_bytes"), ("GEN", "generation"))


def _info_table(path: str, rows: list[dict], remote: dict | None = None) -> str:
    streams = len({row["stream"] for row in rows})
    head = f"log {path}: {streams} stream{'s' if streams != 1 else ''}\n"
    if remote is not None:  # a log tiered to a store, or read from it
        head += (f"store {remote.get('url')}: manifest generation "
                 f"{remote.get('generation')}, epoch {remote.get('epoch')}, writer "
                 f"{remote.get('writer')}"
                 + (f", error: {remote['error']}" if remote.get("error") else "") + "\n")
    if not rows:
        return head
    columns = _INFO_COLUMNS
    if remote is not None:
        columns = columns[:4] + _REMOTE_COLUMNS + columns[4:]
    for row in rows:
        row["verified_cell"] = _verified_cell(row["verified"])
        if remote is not None:
            row["generation"] = remote.get("generation")
            for name in _REMOTE_FIELDS:
                row.setdefault(name, None)
    cells = [[title for title, _ in columns]]
    cells += [["-" if row[name] is None else str(row[name]) for _, name in columns]
              for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip()
             for line in cells]
    notes = [f"{row['stream']}/{row['partition']}: {row['corruption']}"
             for row in rows if row["corruption"]]
    notes += [f"{row['stream']}/{row['partition']}: index rebuilt in memory: "
              f"{row['index_problem']}" for row in rows if row["index_problem"]]
    for row in rows:
        for name, hold in sorted(row["holds"].items()):
            damaged = f" (damaged: {hold['damaged']})" if "damaged" in hold else ""
            notes.append(f"{row['stream']}/{row['partition']}: hold {name} at offset "
                         f"{hold['offset']}: retention keeps it and what follows{damaged}")
    for row in rows:
        found = (row["verified"] or {}).get("findings") or []
        notes += [f"{row['stream']}/{row['partition']}: verification found: "
                  f"{f.get('segment')} at position {f.get('position')}: {f.get('reason')}"
                  for f in found]
    return head + "\n".join(lines + notes) + "\n"
