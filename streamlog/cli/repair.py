"""`streamlog repair`: cut damaged partitions at their first bad frame, moving the cut
bytes under LOG/quarantine/ (check.repair_partition), under the writer lock.

Strategy: judge every partition as `verify` does (check_all); a partition's first bad
frame is the earliest of the walk's finding and the frames whose payload does not
decode; cut there (repair_partition), then judge again: exit 0 only when every
partition is sound. stdout has one JSON line per cut and nothing else; an index that is
dropped without a cut (it disagreed with sound segments) is a note on stderr.
"""

from __future__ import annotations

import dataclasses
import json
import sys

from ..check import repair_partition
from ..errors import LogLocked
from ..integrity import Verdict
from .common import (EXIT_DATA, EXIT_OK, UsageError, existing_log, local_path, subparser)
from .verify import check_all, print_problems

_REPAIR_EPILOG = """\
Cuts each damaged partition at its first bad frame (damaged, corrupt, torn or stale,
as `verify` judges it, or a frame whose payload does not decode). The cut bytes are
moved under LOG/quarantine/STREAM/P/TIME/, never deleted, and the partition's index is
dropped (the next open rebuilds it). Prints one JSON line per cut on stdout:
  {"stream", "partition", "segment", "position", "verdict", "reason", "bytes_cut",
   "offsets_removed", "index", "dry_run", "quarantine"}
offsets_removed is [first, last] of the whole records cut, or null when only garbage
was cut; quarantine is the folder that holds the cut bytes (absent with --dry-run).
An index that disagrees with sound segments is dropped too, with a note on stderr.
Takes the log's writer lock: no other process may have the log open for writing (stop
the writers, or `streamlog serve`, first). LOG is a local directory, not a daemon URL
and not a log in an object store (s3://...: `streamlog verify` checks one; it is
read-only here).
Exit 0 when the log is sound afterwards, 1 when it is not; with --dry-run it prints
what it would cut and changes nothing (exit 0 when nothing needs cutting, else 1).

examples:
  streamlog repair data/log --dry-run
  streamlog repair data/log && streamlog verify data/log
"""


def add(subparsers) -> None:
    parser = subparser(subparsers, "repair", "cut damaged partitions at their first bad frame",
                       _REPAIR_EPILOG, url=False, store=False)
    parser.add_argument("--dry-run", action="store_true",
                        help="print what would be cut; change nothing")
    parser.set_defaults(run=run)


def run(args) -> int:
    from ..directory import take_writer_lock
    from ..connect import open_log
    path = existing_log(local_path(args.log, "repair"))
    try:
        lock = None if args.dry_run else take_writer_lock(path)
    except LogLocked:
        raise UsageError(f"{path} is open for writing by another process: stop it (a "
                         f"writer, or `streamlog serve`) and run repair again") from None
    try:
        results = check_all(path, "repair: checking")
        needed = [first_bad_frame(r) for r in results
                  if r.finding is not None or r.payload_findings or r.index_problem]
        for result in needed:
            _report(repair_partition(path, result, dry_run=args.dry_run))
        sys.stdout.flush()
        if args.dry_run:
            return EXIT_DATA if needed else EXIT_OK
        after = check_all(path, "repair: re-checking")
    finally:
        if lock is not None:
            lock.close()
    unsound = [r for r in after if r.damaged or r.verdict.is_tail_garbage]
    for result in unsound:
        print_problems(result)
    if not unsound and needed:
        open_log(path, create=False).close()  # rebuild the indexes now; prove it opens
    return EXIT_DATA if unsound else EXIT_OK


def first_bad_frame(result):
    """`result` with its finding moved to the partition's first bad frame: the walk
    stops at a frame that is not whole or does not continue the partition, but a frame
    before it may hold a payload that does not decode (verify reports it apart)."""
    bad = ([result.finding] if result.finding is not None else []) + result.payload_findings
    if not bad:
        return result
    # Segment files are named by their zero-padded base offset: path order is log order.
    first = min(bad, key=lambda finding: (finding.path, finding.position))
    if first is result.finding:
        return result
    return dataclasses.replace(result, finding=first, verdict=Verdict.CORRUPT)


def _report(lines: list[dict]) -> None:
    """The cut line (if any) on stdout, with the index's fate; an index dropped without
    a cut as a note on stderr."""
    cuts = [line for line in lines if "segment" in line]
    for line in lines:
        if "segment" in line:
            continue
        if cuts:
            cuts[0]["index"] = ("would be dropped" if line["dry_run"] else "dropped") + (
                "; the next open rebuilds it from the segments")
            continue
        verb = "would drop" if line["dry_run"] else "dropped"
        sys.stderr.write(f"streamlog: note: {line['stream']}/{line['partition']}: index "
                         f"{verb} ({line['reason']}); the next open rebuilds it from the "
                         f"segments\n")
    for cut in cuts:
        sys.stdout.write(json.dumps(cut) + "\n")
