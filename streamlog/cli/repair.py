"""`streamlog repair`: cut damaged partitions at their first bad frame, moving the cut
bytes under LOG/quarantine/ (check.repair_partition), under the writer lock.
"""

from __future__ import annotations

import json
import sys

from ..check import repair_partition
from .verify import check_all, print_problems
from .common import (EXIT_DATA, EXIT_OK, existing_log, local_path, subparser)

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


def add(subparsers) -> None:
    parser = subparser(subparsers, "repair",
                          "cut damaged partitions at their first bad frame",
                          _REPAIR_EPILOG)
    parser.add_argument("--dry-run", action="store_true",
                        help="print what would be cut; change nothing")
    parser.set_defaults(run=run)


def run(args) -> int:
    from ..log import take_writer_lock
    path = existing_log(local_path(args.log, "repair"))
    lock = None if args.dry_run else take_writer_lock(path)
    try:
        results = check_all(path, "repair: checking")
        needed = [r for r in results if r.finding is not None or r.index_problem]
        for result in needed:
            for line in repair_partition(path, result, dry_run=args.dry_run):
                sys.stdout.write(json.dumps(line) + "\n")
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
        from ..log import open_log  # rebuild the indexes now, and prove the log opens
        open_log(path, create=False).close()
    return EXIT_DATA if unsound else EXIT_OK
