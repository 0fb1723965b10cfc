"""Several writer processes on one log: what the commit lock costs, and what sharing
a partition between processes gives.

Command (from the repository root):

    .venv/bin/python bench/writers.py                       # this code only
    .venv/bin/python bench/writers.py --compare 38e2839     # and a commit before the lock

Writes bench/results/writers.json and prints a table. Every measurement runs in a child
process (so --compare can import the older code through PYTHONPATH); single-record
appends with append_sync, 100-byte values, one stream, one partition.

  lock_cycle_us            one commit's lock work alone: PartitionLock acquire (flock +
                           counter read), bump (counter write), release (flock), median
                           of 5 runs of 50,000 cycles.
  commit_us_never          µs per append_sync, fsync="never": the commit path's CPU cost
                           (lock included); before_commit_us_never the same for REV.
  commit_us_always         the same with fsync="always" (one fdatasync per commit).
  lock_share_never         lock_cycle_us / commit_us_never: the lock's part of a commit.
  procs_P_rps_always       P processes (1, 2, 4) appending to the same partition at once,
                           fsync="always", for --seconds each: acknowledged records per
                           second, all processes together; procs_P_rps_never the same
                           with fsync="never". Each process's commits are single records
                           (no group commit inside a process), so this shows the cost of
                           taking turns and of catching up with the others' frames.

The machine is shared and noisy: read the ratios, measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (Row, export, fresh_dir, median, phase, print_table,  # noqa: E402
                     progress, short_rev, write_results)

VALUE = b"v" * 100


def child_lock_cycle(path: str) -> dict:
    from streamlog.fileio import OsFileIO
    from streamlog.locks import PartitionLock
    os.makedirs(path, exist_ok=True)
    lock = PartitionLock(OsFileIO(), path, writable=True)
    runs = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(50_000):
            lock.acquire()
            lock.bump()
            lock.release()
        runs.append((time.perf_counter() - started) / 50_000 * 1e6)
    lock.close()
    return {"lock_cycle_us": median(runs)}


def child_commits(path: str, fsync: str, count: int) -> dict:
    import streamlog
    with streamlog.open_log(path, fsync=fsync) as log:
        log.create_stream("s")
        for _ in range(200):  # warm up
            log.append_sync("s", VALUE)
        started = time.perf_counter()
        for _ in range(count):
            log.append_sync("s", VALUE)
        seconds = time.perf_counter() - started
    return {"us": seconds / count * 1e6}


def child_shared(path: str, fsync: str, start_at: float, seconds: float) -> dict:
    import streamlog
    with streamlog.open_log(path, fsync=fsync) as log:
        log.create_stream("s")
        time.sleep(max(0.0, start_at - time.time()))
        done, deadline = 0, start_at + seconds
        while time.time() < deadline:
            log.append_sync("s", VALUE)
            done += 1
    return {"records": done}


def run_child(code: str | None, *args) -> dict:
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = code
    out = subprocess.run([sys.executable, __file__, "--_child", *map(str, args)], env=env,
                         check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def shared(work: Path, processes: int, fsync: str, seconds: float) -> float:
    path = fresh_dir(work / f"shared-{processes}-{fsync}")
    run_child(None, "commits", path, fsync, 1)  # create the log and stream first
    start_at = time.time() + 3.0  # every child open and waiting by then
    children = [subprocess.Popen([sys.executable, __file__, "--_child", "shared", str(path),
                                  fsync, str(start_at), str(seconds)],
                                 stdout=subprocess.PIPE, text=True)
                for _ in range(processes)]
    total = 0
    for child in children:
        out, _ = child.communicate(timeout=600)
        assert child.returncode == 0
        total += json.loads(out.strip().splitlines()[-1])["records"]
    import streamlog
    with streamlog.open_log(path, readonly=True) as log:
        held = log.end_offset("s", 0)
    assert held == total + 201, (held, total)  # every acknowledged record, densely
    return total / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", metavar="REV", help="also measure commit REV's code")
    parser.add_argument("--seconds", type=float, default=5.0,
                        help="how long the processes share a partition (default 5)")
    parser.add_argument("--workdir", type=Path, default=Path(__file__).resolve().parent / "work")
    parser.add_argument("--_child", nargs="+", dest="child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "lock":
            result = child_lock_cycle(rest[0])
        elif kind == "commits":
            result = child_commits(rest[0], rest[1], int(rest[2]))
        else:
            result = child_shared(rest[0], rest[1], float(rest[2]), float(rest[3]))
        print(json.dumps(result))
        return
    work = args.workdir.resolve() / "writers"
    figures: dict = {}
    with tempfile.TemporaryDirectory() as old_code:
        versions = [("", None)]
        if args.compare:
            versions.append(("before_", export(args.compare, Path(old_code))))
            figures["before_commit"] = short_rev(args.compare)
        with phase("lock cycle"):
            figures.update(run_child(None, "lock", fresh_dir(work / "lock")))
        for fsync, count in (("never", 20_000), ("always", 2_000)):
            for round_number in range(3):  # interleaved, so both see the same noise
                for prefix, code in versions:
                    key = f"{prefix}commit_us_{fsync}"
                    path = fresh_dir(work / f"{prefix}commits-{fsync}")
                    got = run_child(code, "commits", path, fsync, count)["us"]
                    figures.setdefault(key + "_runs", []).append(got)
                    progress(f"{key} run {round_number + 1}: {got:.1f} us")
            for prefix, _ in versions:
                key = f"{prefix}commit_us_{fsync}"
                figures[key] = median(figures.pop(key + "_runs"))
        figures["lock_share_never"] = figures["lock_cycle_us"] / figures["commit_us_never"]
    for fsync in ("always", "never"):
        for processes in (1, 2, 4):
            with phase(f"{processes} processes, fsync={fsync}"):
                figures[f"procs_{processes}_rps_{fsync}"] = shared(work, processes, fsync,
                                                                   args.seconds)
    rows = [Row("lock cycle", "lock_cycle_us", "us"),
            Row("commit, fsync=never", "commit_us_never", "us",
                {"vs before": "before_commit_us_never"}),
            Row("commit, fsync=always", "commit_us_always", "us",
                {"vs before": "before_commit_us_always"}),
            Row("lock share of a commit (never)", "lock_share_never", "")]
    for fsync in ("always", "never"):
        rows += [Row(f"{p} processes, fsync={fsync}", f"procs_{p}_rps_{fsync}", "rec/s",
                     {"vs 1 proc": f"procs_1_rps_{fsync}"}) for p in (1, 2, 4)]
    print_table(figures, rows, ["vs before", "vs 1 proc"])
    print(f"wrote {write_results('writers', figures)}")


if __name__ == "__main__":
    main()
