"""`streamlog verify`: judge every byte of every partition (check.py), as an open would.

Strategy: `check_all` walks each partition with check_partition (sealed segments by their
whole-file checksum), showing progress; the findings go to stderr, a summary to stdout.
A log in an object store is checked the same way through its read-only view's file
layer and index (store.log_files): every frame of every segment object the newest
manifest generation names, against the index objects' claim that all of it is
committed; findings name the object's URL.
"""

from __future__ import annotations

import json
import sys

from ..check import check_partition, partition_dirs, record_verification
from ..fileio import OsFileIO
from .common import (EXIT_DATA, EXIT_OK, UsageError, advance_to, is_store_url, plural,
                     progress_bar, segment_bytes, subparser)
from .store import LogFiles, log_files

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
LOG may be a log in an object store, s3://BUCKET/PREFIX (endpoint and credentials from
the AWS_* variables): every frame of every segment object its newest manifest
generation names is checked, with the same verdicts (all of it is committed, so damage
anywhere, the last frame included, is exit 1), and a finding names the object's URL
and the position in it; damaged index objects are a warning. --record does not apply
there (the store is read-only here).

examples:
  streamlog verify data/log
  streamlog verify data/log --strict && echo clean
  streamlog verify data/log --record && streamlog info data/log
  streamlog verify data/log --json | jq '.findings'
  streamlog verify s3://my-bucket/logs/orders
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
    if args.record and is_store_url(args.log):
        raise UsageError(f"--record keeps the result beside the segment files, and "
                         f"{args.log} is a log in an object store, which is read-only here")
    with log_files(args.log, "verify") as files:
        results = check_all(files, "verify")
    fileio = OsFileIO()
    for result in results:
        if args.record:
            record_verification(fileio, result)
        print_problems(result, in_store=files.view is not None)
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


def print_problems(result, *, in_store: bool = False) -> None:
    name = f"{result.stream}/{result.partition}"
    if result.index_problem and in_store:
        sys.stderr.write(f"streamlog: warning: the index objects of {name} are damaged "
                         f"(readers rebuild its index from the segment objects): "
                         f"{result.index_problem}\n")
    elif result.index_problem:
        sys.stderr.write(f"streamlog: warning: index of {name} will be rebuilt by the next "
                         f"open: {result.index_problem}\n")
    for note in result.notes:
        sys.stderr.write(f"streamlog: warning: {name}: {note}\n")
    for finding in ([result.finding] if result.finding else []) + result.payload_findings:
        sys.stderr.write(f"streamlog: {finding.message()}\n")


def check_all(files: LogFiles | str, label: str):
    """check_partition for every partition of the log at `files` (a local directory's
    path, or store.LogFiles), with a progress bar. Findings name a segment by
    LogFiles.name_of (a segment object's URL, for a log in a store)."""
    if isinstance(files, str):
        files = LogFiles(files)
    plan = list(partition_dirs(files.path, fileio=files.fileio))
    total = sum(segment_bytes(d, files.fileio) for _, _, d in plan)
    results, done = [], 0
    with progress_bar(label, total, in_bytes=True) as bar:
        for stream, number, directory in plan:
            result = check_partition(stream, number, directory, fileio=files.fileio,
                                     index_storage=files.index_storage,
                                     progress=lambda n, base=done: advance_to(bar, base + n))
            done += result.bytes_walked + result.bytes_sealed
            advance_to(bar, done)
            for finding in ([result.finding] if result.finding else []) + (
                    result.payload_findings):
                finding.path = files.name_of(finding.path)
            results.append(result)
    return results
