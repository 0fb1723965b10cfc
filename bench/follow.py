"""Follow latency: how long after an append a follower in another process has the record.

Command (from the repository root):

    .venv/bin/python bench/follow.py                    # 1,000 appends, ~5 ms pauses
    .venv/bin/python bench/follow.py --records 300      # a shorter run

Writes bench/results/follow.json and prints a table with ratios and targets.

One log, one partition, fsync="always" (--fsync to change it). A writer process appends
single 100-byte records with append_sync, pausing a random 0.5x..1.5x of --interval-ms
after each (so the appends do not keep step with a poll), each stamped with the wall
clock just before the call (timestamp_us). Three followers, each a
`reader(follow=True)` started at offset 0 before the first append, note for every
record the wall clock when it is delivered minus its stamp (one machine, one clock):

  same_process_*     a follower thread in the writer's own process: the writer thread
                     wakes it when it publishes (DESIGN 3). The baseline: what an append
                     costs before anyone can see it.
  view_*             a read-only view (open_log(readonly=True)) in its own process that
                     never calls refresh(): its follower looks at the commit lock's
                     change counter every view_poll_s and refreshes the partition when a
                     writer has been there.
  other_writer_*     a writable Log in its own process (another writer that appends
                     nothing): its follower asks the partition's writer thread to take
                     in the others' frames every follow_poll_s.

  *_p50_ms, *_p99_ms, *_max_ms   latency percentiles over the records after the first
                     WARMUP (milliseconds); view_vs_same_process_p50 / _p99 the ratios.
  view_idle_cpu_pct  CPU the view's process uses while its follower waits at the end
                     with nothing appended, over IDLE_S, in percent of one core: the
                     cost of looking every view_poll_s.

Targets: the view's follower within 15 ms at p50 and 50 ms at p99, and an idle one
under 2% of a core. The machine is shared and noisy: read the ratios, measured in the
same run.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (DEFAULT_WORKDIR, Row, Target, attempt, fresh_dir, phase,  # noqa: E402
                     progress, publish, ratio, remove)

VALUE = b"v" * 100
STREAM = "s"
WARMUP = 20  # records left out of the percentiles (first refreshes, first mappings)
IDLE_S = 2.0
FOLLOWERS = ("same_process", "view", "other_writer")


def now_us() -> int:
    return time.time_ns() // 1000


# ---------------------------------------------------------------- children

def follow_into(log, records: int, latencies: list[int]) -> None:
    """Follow partition 0 from offset 0 until `records` records have come."""
    for record in log.reader(STREAM, 0, from_offset=0, to_offset=records, follow=True):
        latencies.append(now_us() - record.timestamp_us)


def child_writer(path: str, records: int, interval_ms: float, fsync: str) -> dict:
    """Append `records` records; a thread of this process follows them (the baseline)."""
    import streamlog
    latencies: list[int] = []
    with streamlog.open_log(path, fsync=fsync) as log:
        follower = threading.Thread(target=follow_into, args=(log, records, latencies))
        follower.start()
        rng = random.Random(7)
        for _ in range(records):
            log.append_sync(STREAM, VALUE, timestamp_us=now_us())
            time.sleep(interval_ms / 1000 * rng.uniform(0.5, 1.5))
        follower.join()
    return {"latencies_us": latencies}


def child_follower(path: str, records: int, readonly: bool, view_poll_s: float) -> dict:
    """A follower in its own process, on a view or on a writable Log. Says "ready" on
    stdout once it waits at the end (after IDLE_S of measured idling, for a view)."""
    import streamlog
    latencies: list[int] = []
    with streamlog.open_log(path, readonly=readonly, view_poll_s=view_poll_s) as log:
        follower = threading.Thread(target=follow_into, args=(log, records, latencies))
        follower.start()
        time.sleep(0.2)  # at the end, waiting
        idle_cpu = None
        if readonly:
            started_cpu, started = time.process_time(), time.perf_counter()
            time.sleep(IDLE_S)
            idle_cpu = (time.process_time() - started_cpu) / (time.perf_counter() - started)
        print("ready", flush=True)
        follower.join()
    return {"latencies_us": latencies, "idle_cpu": idle_cpu}


# ---------------------------------------------------------------- the run

def spawn(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, "--_child", *map(str, args)],
                            stdout=subprocess.PIPE, text=True)


def result_of(child: subprocess.Popen, what: str) -> dict:
    out, _ = child.communicate(timeout=600)
    if child.returncode != 0:
        raise RuntimeError(f"the {what} process failed ({child.returncode})")
    return json.loads(out.strip().splitlines()[-1])


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def measure(args, figures: dict) -> None:
    import streamlog
    path = fresh_dir(args.workdir) / "log"
    with streamlog.open_log(path, fsync=args.fsync) as log:
        log.create_stream(STREAM)
        figures["follow_poll_s"] = log.config.follow_poll_s
    view_poll_s = (streamlog.LogConfig().view_poll_s if args.view_poll_ms is None
                   else args.view_poll_ms / 1000)
    figures.update(records=args.records, interval_ms=args.interval_ms, fsync=args.fsync,
                   view_poll_s=view_poll_s)
    followers = {"view": spawn("follower", path, args.records, 1, view_poll_s),
                 "other_writer": spawn("follower", path, args.records, 0, view_poll_s)}
    for name, child in followers.items():
        line = child.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"the {name} follower did not start ({line!r})")
    with phase(f"{args.records} appends, pauses of about {args.interval_ms:g} ms"):
        writer = spawn("writer", path, args.records, args.interval_ms, args.fsync)
        results = {"same_process": result_of(writer, "writer")}
        for name, child in followers.items():
            results[name] = result_of(child, f"{name} follower")
    for name in FOLLOWERS:
        got = results[name]["latencies_us"]
        if len(got) != args.records:
            raise RuntimeError(f"the {name} follower got {len(got)} of {args.records}")
        kept = [us / 1000 for us in got[WARMUP:]]
        for label, fraction in (("p50", 0.5), ("p99", 0.99), ("max", 1.0)):
            figures[f"{name}_{label}_ms"] = percentile(kept, fraction)
        progress(f"{name}: p50 {figures[f'{name}_p50_ms']:.2f} ms, "
                 f"p99 {figures[f'{name}_p99_ms']:.2f} ms")
    figures["view_idle_cpu_pct"] = 100 * results["view"]["idle_cpu"]
    for label in ("p50", "p99"):
        figures[f"view_vs_same_process_{label}"] = ratio(
            figures[f"view_{label}_ms"], figures[f"same_process_{label}_ms"])
    if not args.keep:
        remove(args.workdir)


VS = {"vs same process": None}


def _rows() -> list[Row]:
    rows = []
    for name, title in (("same_process", "follower in the writer's process"),
                        ("view", "read-only view, other process"),
                        ("other_writer", "writable log, other process")):
        for label in ("p50", "p99", "max"):
            base = None if name == "same_process" else {
                "vs same process": f"same_process_{label}_ms"}
            rows.append(Row(f"{title}, {label}", f"{name}_{label}_ms", "ms", base))
    rows.append(Row("idle view follower, CPU", "view_idle_cpu_pct", "%"))
    return rows


ROWS = _rows()
TARGETS = [
    Target("read-only view follower p50 <= 15 ms",
           lambda f: None if "view_p50_ms" not in f else f["view_p50_ms"] <= 15),
    Target("read-only view follower p99 <= 50 ms",
           lambda f: None if "view_p99_ms" not in f else f["view_p99_ms"] <= 50),
    Target("an idle view follower uses <= 2% of a core",
           lambda f: None if "view_idle_cpu_pct" not in f else f["view_idle_cpu_pct"] <= 2),
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--interval-ms", type=float, default=5.0,
                        help="mean pause after each append (default 5)")
    parser.add_argument("--fsync", default="always",
                        choices=("always", "interval", "never"))
    parser.add_argument("--view-poll-ms", type=float, default=None,
                        help="the view's view_poll_s in ms (default: LogConfig's)")
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR / "follow")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--_child", nargs="+", dest="child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.records <= WARMUP:
        parser.error(f"--records must be more than {WARMUP}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        kind, path, records, *rest = args.child
        if kind == "writer":
            result = child_writer(path, int(records), float(rest[0]), rest[1])
        else:
            result = child_follower(path, int(records), rest[0] == "1", float(rest[1]))
        print(json.dumps(result))
        return
    figures: dict = {}
    failures: list[str] = []
    attempt("follow latency", lambda: measure(args, figures), failures)
    publish("follow", figures, failures, ROWS, list(VS), TARGETS)


if __name__ == "__main__":
    main()
