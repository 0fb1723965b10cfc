"""`streamlog verify`: judge every byte of every partition (check.py), as an open would.

Strategy: `check_all` walks each partition with check_partition (sealed segments by their
whole-file checksum), showing progress; the findings go to stderr, a summary to stdout.
"""

from __future__ import annotations

import json
import sys

from ..check import check_partition, partition_dirs, record_verification
from ..fileio import OsFileIO
from .common import (EXIT_DATA, EXIT_OK, advance_to, existing_log, local_path, plural,
                     progress_bar, segment_bytes, subparser)

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
stdout at the end; on a terminal, stderr shows the progress (bytes checked).
LOG is a local directory: verify reads the segment files directly, so on a daemon's
log run it on the daemon's machine (the daemon's scrubber checks sealed segments too).

examples:
  streamlog verify data/log
  streamlog verify data/log --strict && echo clean
  streamlog verify data/log --record && streamlog info data/log
  streamlog verify data/log --json | jq '.findings'
"""


def add(subparsers) -> None:
    parser = subparser(subparsers, "verify", "check every byte of every partition",
                       _VERIFY_EPILOG, url=False)
    parser.add_argument("--strict", action="store_true",
                        help="a torn or stale tail is an error too (exit 1)")
    parser.add_argument("--json", action="store_true", help="a JSON summary instead of text")
    parser.add_argument("--record", action="store_true",
                        help="keep the result (scrub.json) for `streamlog info`")
    parser.set_defaults(run=run)


def run(args) -> int:
    path = existing_log(local_path(args.log, "verify"))
    results = check_all(path, "verify")
    fileio = OsFileIO()
    for result in results:
        if args.record:
            record_verification(fileio, result)
        print_problems(result)
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
            f"verified {plural(len(results), 'partition')}, "
            f"{plural(totals['segments'], 'segment')}, "
            f"{plural(totals['records'], 'record')} "
            f"({plural(totals['frames'], 'frame')} decoded), "
            f"{plural(totals['bytes_walked'] + totals['bytes_sealed'], 'byte')} "
            f"({totals['bytes_sealed']} by whole-segment checksums): {damaged} corrupt, "
            f"{torn} torn: {verdict}\n")
    return EXIT_DATA if damaged or (torn and args.strict) else EXIT_OK


def print_problems(result) -> None:
    name = f"{result.stream}/{result.partition}"
    if result.index_problem:
        sys.stderr.write(f"streamlog: warning: index of {name} will be rebuilt by the next "
                         f"open: {result.index_problem}\n")
    for note in result.notes:
        sys.stderr.write(f"streamlog: warning: {name}: {note}\n")
    for finding in ([result.finding] if result.finding else []) + result.payload_findings:
        sys.stderr.write(f"streamlog: {finding.message()}\n")


def check_all(path: str, label: str):
    """check_partition for every partition of the log at `path`, with a progress bar."""
    plan = list(partition_dirs(path))
    results, done = [], 0
    with progress_bar(label, sum(segment_bytes(d) for _, _, d in plan), in_bytes=True) as bar:
        for stream, number, directory in plan:
            result = check_partition(stream, number, directory,
                                     progress=lambda n, base=done: advance_to(bar, base + n))
            done += result.bytes_walked + result.bytes_sealed
            advance_to(bar, done)
            results.append(result)
    return results
