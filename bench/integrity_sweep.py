"""Integrity sweep, long run: the contract of DESIGN 4 under thousands of single faults.

Command (from the repository root; `./dev bench integrity_sweep` runs the same):

    .venv/bin/python bench/integrity_sweep.py                       # the full sweep
    .venv/bin/python bench/integrity_sweep.py --seed 7 --index-flips 2000 --kills 60
    .venv/bin/python bench/integrity_sweep.py --max-segment-flips 1500 --index-flips 300
                                                                    # a quicker sample

Builds the log under test (tests/harness/damage.py: 2 streams, zstd and none, 2
partitions each, >= 3 segments per partition, committed and aborted transactions,
fsync="always", closed cleanly), then, each fault on a fresh copy:

  segment flips   one random bit of every header byte of every frame of every
                  partition, plus --payload-per-frame random payload bytes per frame
                  (--max-segment-flips N: a random sample of N of those instead)
  index flips     --index-flips single bits over the LMDB files (meta pages and the
                  live tree; half of them with the index seal removed first, as a
                  killed writer leaves it; see damage.index_targets), checked in a
                  worker process that is restarted when a flip kills it
  damaged tails   --kills writers killed with SIGKILL, their tail damaged past the
                  acknowledged end (truncate, zeros, garbage, stale frame), in turn

Writes bench/results/integrity_sweep.json (flat: named counts, plus "command" and
"cpu_count"), the first example of every failure kind to WORKDIR/examples.json, prints
progress on stderr and a table on stdout. Exit status 1 when a contract count is
violated (a wrong answer, a silent short read, a raw exception, a worker death or hang,
a damaged frame not named at its position, a kill that cost an acknowledged record).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import traceback
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
# The repository root, then tests/: it holds the harness package (harness.damage), which
# is test tooling and not part of the installed streamlog.
sys.path[0:0] = [str(_ROOT), str(_ROOT / "tests")]

from _common import (  # noqa: E402  (bench/ is on sys.path when run as a script)
    DEFAULT_WORKDIR, fresh_dir, progress, remove, write_results)

from harness import damage  # noqa: E402


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=20260101)
    parser.add_argument("--batches", type=int, default=40,
                        help="append operations per partition (default 40: ~170 frames)")
    parser.add_argument("--payload-per-frame", type=int, default=4)
    parser.add_argument("--max-segment-flips", type=int, default=None,
                        help="a random sample of this many segment flips (default: all)")
    parser.add_argument("--index-flips", type=int, default=1000)
    parser.add_argument("--kills", type=int, default=40)
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR / "integrity")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    return parser.parse_args(argv)


class Every:
    """Progress on stderr every `seconds`, with a rate and an estimate of what is left."""

    def __init__(self, label: str, total: int, seconds: float = 10.0) -> None:
        self.label, self.total, self.seconds = label, total, seconds
        self.started = self.shown = time.monotonic()

    def tick(self, done: int, note: str = "") -> None:
        now = time.monotonic()
        if now - self.shown < self.seconds and done != self.total:
            return
        self.shown = now
        rate = done / max(now - self.started, 1e-9)
        left = (self.total - done) / rate if rate else 0
        progress(f"{self.label}: {done:,}/{self.total:,} ({rate:.1f}/s, ~{left:.0f} s left)"
                 f"{' ' + note if note else ''}")


def sweep_segments(built, work: str, args, rng: random.Random):
    targets = damage.segment_targets(built, rng, payload_per_frame=args.payload_per_frame)
    if args.max_segment_flips is not None and args.max_segment_flips < len(targets):
        targets = sorted(rng.sample(targets, args.max_segment_flips),
                         key=lambda t: (t.frame.segment, t.position))
    results, every = [], Every("segment flips", len(targets))
    failing, harness_errors = 0, []
    with damage.quiet_streamlog_logging():
        for number, target in enumerate(targets, 1):
            try:
                result = damage.check_segment_flip(built, work, target)
            except Exception:  # noqa: BLE001 (the harness itself: say so, go on)
                traceback.print_exc()
                harness_errors.append(target)
                continue
            results.append(result)
            failing += bool(result.violations) or result.verify != damage.DETECTED or (
                result.reader != damage.DETECTED)
            every.tick(number, f"{failing} not as the contract says")
    return results, len(harness_errors)


def sweep_index(built, work: str, args, rng: random.Random):
    targets = damage.index_targets(built, rng, args.index_flips)
    sweep = damage.IndexSweep(built, os.path.join(work, "index"))
    results, every = [], Every("index flips", len(targets))
    try:
        for number, target in enumerate(targets, 1):
            results.append(sweep.run(target))
            bad = sum(r["category"] != damage.OK for r in results)
            every.tick(number, f"{bad} not ok, {sweep.deaths} worker restarts")
    finally:
        sweep.close()
    return targets, results


def sweep_tails(work: str, args, rng: random.Random):
    results, every = [], Every("kills", args.kills, seconds=5.0)
    for number in range(args.kills):
        mode = damage.TAIL_MODES[number % len(damage.TAIL_MODES)]
        results.append(damage.check_tail_damage(work, args.seed * 1000 + number, mode, rng,
                                                rng.uniform(0.05, 1.0)))
        every.tick(number + 1, f"{sum(r.category != damage.OK for r in results)} failed")
    return results


# (figure, contract: "0" must be zero, "all:<figure>" must equal that figure, "" none)
ROWS = [
    ("seg_flips", ""), ("seg_header_flips", ""),
    ("seg_verify_detected", "all:seg_flips"), ("seg_verify_torn_only", "0"),
    ("seg_verify_wrong_position", "0"), ("seg_verify_missed", "0"),
    ("seg_reader_detected", "all:seg_flips"), ("seg_reader_early_error", "0"),
    ("seg_reader_wrong_position", "0"), ("seg_reader_streamlog_error", "0"),
    ("seg_arrow_early_error", "0"), ("seg_arrow_wrong_position", "0"),
    ("seg_others_ok", "all:seg_flips"), ("seg_writable_refused", ""),
    ("seg_writable_ok", ""), ("seg_writable_wrong_position", ""),
    ("seg_writable_streamlog_error", "0"),
    ("seg_wrong", "0"), ("seg_silent_short", "0"), ("seg_raw", "0"),
    ("seg_harness_errors", "0"),
    ("index_flips", ""), ("index_ok", ""), ("index_wrong", "0"), ("index_raw", "0"),
    ("index_streamlog_error", "ideally 0"), ("index_death", "0"), ("index_hang", "0"),
    ("index_rebuilt_with_warning", ""),
    ("index_sealed_flips", ""), ("index_sealed_failures", ""),
    ("index_unsealed_flips", ""), ("index_unsealed_failures", ""),
    ("index_meta_current_flips", ""), ("index_meta_current_failures", ""),
    ("index_meta_other_flips", ""), ("index_meta_other_failures", ""),
    ("index_meta_any_flips", ""), ("index_meta_any_failures", ""),
    ("index_live_flips", ""), ("index_live_failures", ""),
    ("index_data_any_flips", ""), ("index_data_any_failures", ""),
    ("index_readonly_wrong", ""), ("index_readonly_raw", ""),
    ("index_writable_wrong", ""), ("index_writable_raw", ""),
    ("index_reopen_wrong", ""), ("index_reopen_raw", ""),
    ("tail_kills", ""), ("tail_acked_records", ""), ("tail_ok", ""),
    ("tail_refused_unacked_durable", ""),
    ("tail_open_failed", "0"), ("tail_lost_acked", "0"), ("tail_wrong", "0"),
    ("tail_raw", "0"), ("tail_verify_failed", "0"), ("tail_writer_failed", "0"),
    ("tail_readonly_not_ok", "ideally 0"), ("tail_verify_before_not_ok", "ideally 0"),
]


def verdicts(figures: dict) -> dict[str, str]:
    """figure -> PASS / FAIL / MISS ("ideally" targets) for the rows with a contract."""
    out = {}
    for name, rule in ROWS:
        value = figures.get(name, 0)
        if rule == "0":
            out[name] = "PASS" if value == 0 else "FAIL"
        elif rule.startswith("all:"):
            out[name] = "PASS" if value == figures.get(rule[4:], 0) else "FAIL"
        elif rule == "ideally 0":
            out[name] = "PASS" if value == 0 else "MISS"
    return out


def print_table(figures: dict) -> None:
    """The rows with a contract (and the counts beside them), then every other count the
    sweep produced (a category that appeared for the first time shows up here)."""
    judged = verdicts(figures)
    print(f"{'figure':36}{'count':>9}  {'contract':14}verdict")
    print("-" * 68)
    listed = {name for name, _ in ROWS}
    extra = [(name, "") for name in figures if name not in listed and isinstance(
        figures[name], int) and name != "seed"]
    for name, rule in ROWS + extra:
        if name not in figures and not rule:
            continue
        value = figures.get(name, 0)
        rule_text = {"0": "= 0", "ideally 0": "ideally 0", "": ""}.get(
            rule, "= " + rule[4:] if rule.startswith("all:") else rule)
        print(f"{name:36}{value:>9,}  {rule_text:14}{judged.get(name, '')}")


def main(argv=None) -> None:
    args = parse_args(argv)
    rng = random.Random(args.seed)
    work = fresh_dir(args.workdir)
    started = time.monotonic()
    figures: dict = {"seed": args.seed}
    examples: dict = {}
    try:
        progress(f"building the log under test (seed {args.seed})")
        built = damage.build_log(str(work / "log"), args.seed, batches=args.batches)
        figures.update({f"log_{k}": v for k, v in damage.describe(built).items()})
        progress(f"log: {damage.describe(built)}")

        phase_started = time.monotonic()
        segment_results, harness_errors = sweep_segments(built, str(work / "seg"), args, rng)
        figures.update(damage.summarize_segment(segment_results))
        figures["seg_harness_errors"] = harness_errors
        figures["seg_seconds"] = time.monotonic() - phase_started
        examples["segment"] = damage.segment_examples(segment_results)

        phase_started = time.monotonic()
        index_targets, index_results = sweep_index(built, str(work), args, rng)
        figures.update(damage.summarize_index(index_targets, index_results))
        figures["index_seconds"] = time.monotonic() - phase_started
        examples["index"] = damage.index_examples(index_targets, index_results)

        phase_started = time.monotonic()
        tail_results = sweep_tails(str(work / "tails"), args, rng) if args.kills else []
        figures.update(damage.summarize_tail(tail_results))
        figures["tail_seconds"] = time.monotonic() - phase_started
        examples["tail"] = {f"{r.mode}:{r.category}": [r.as_dict()] for r in tail_results
                            if r.category != damage.OK or r.verify_before != damage.OK}
    finally:
        figures["total_seconds"] = time.monotonic() - started
        examples_path = args.workdir / "examples.json"
        if args.workdir.exists():
            examples_path.write_text(json.dumps(examples, indent=1, default=str) + "\n")
        if not args.keep:
            for name in ("log", "seg", "index", "tails"):
                remove(work / name)
    path = write_results("integrity_sweep", figures)
    print_table(figures)
    print()
    for section, found in examples.items():
        for kind, items in sorted(found.items()):
            print(f"{section} {kind}: {json.dumps(items[0], default=str)[:400]}")
    print(f"\nwrote {path} and {examples_path}")
    failed = [name for name, verdict in verdicts(figures).items() if verdict == "FAIL"]
    if failed:
        print(f"CONTRACT VIOLATED (seed {args.seed}): {', '.join(failed)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
