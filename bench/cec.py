"""CEC benchmark: the evaluation of the CEC paper (Section IV) on this machine, printed
beside the paper's numbers.

Command (from the repository root):

    .venv/bin/python bench/cec.py            # the defaults: a few minutes
    .venv/bin/python bench/cec.py --quick    # a smoke run (smaller figures, no 500k extent)
    .venv/bin/python bench/cec.py --workdir DIR --repeats 3 --trials 4

Writes bench/results/cec.json (flat: named numbers, plus "command" and "cpu_count"),
prints progress on stderr and the tables on stdout.

The operator is streamlog.operators.cec.AggregateOperator: count windows per key computing count,
sum, min, max and average of an int64 price, reading one input partition and writing
one output partition (fsync="always", one append per chunk of input). Input records are
the paper's 100-byte tuples: an 8-byte item id as the key, a 92-byte value starting with
the price; timestamps rise by 10 us per record; keys are uniformly random.

(a) Failure-free throughput (Fig. 5). Two item ids; "fast" windows of 1 record (every
    input opens and closes a window: G_OPEN then R) and "slow" windows of 1,000. Three
    configurations: no checkpointing ("none"), CEC with G_OPEN only ("gopen", the paper's
    Gopen/Disk: the footprints are persisted in the output log), and CRB (periodic
    checkpoints of every open window into an LMDB store every --crb-interval-s). Each
    configuration runs --repeats times, interleaved; figures are medians. Fast-windows
    runs read --records-a tuples, slow-windows runs 3x as many (they run ~3x faster).
    throughput_{fast,slow}_{none,gopen,crb}_rps: input records per second (wall clock).
    gopen_overhead_pct_{fast,slow}: 100 * (1 - gopen / none); gopen_overhead_pct is the
    worse of the two (likewise crb_overhead_pct). *_cpu_pct: the same from CPU seconds
    (process time), which the other jobs on a shared machine disturb less.
    output_per_result_{fast,slow}: output records (R + G) per R with G_OPEN on (the
    paper's "Real" bar: twice the data tuples for fast windows).

(b) Recovery time vs Q and U (Figs. 6, 7). 100,000 item ids, windows of 10 records,
    CI = 5 ms, CP = 100 ms. Each run is "crashed" at an input offset (--crash-at, 2.5
    million tuples, for the Q runs: long enough for the G_OPEN-only extent to approach
    the paper's 500,000 maximum; --u-crash-at, 1.5 million, for the U runs: there the
    replay u, not the extent, decides, and it passes every U target well before), and
    a new operator recovers from the output:
      *_extent: output records read backwards to rebuild the eventual checkpoint
      *_gchecks: G_CHECKs written during the run
      *_ec_load_s: reconstruct + load (+ forgetting the last input's output), seconds;
        *_ec_load_cpu_s the CPU seconds of the same (less disturbed by other jobs)
      *_replay_records / *_replay_mb: input to replay after the EC is loaded (100-byte
        tuples), and *_replay_s the time to replay it up to the crash point.
    openwins: open windows at the crash point. Q runs: q{1,2,4,8}x (Q = k * openwins,
    U off); U runs: u{125k,250k,500k,1m} (Q off); gopen_only: no G_CHECK at all. A Q
    beyond the largest extent the G_OPEN-only run reached (8x here, as in the paper) can
    never be exceeded, so that run is the G_OPEN-only run and is reported as such.
    Recovery times of the G_OPEN-only and Q = 2x runs are medians of 3 recoveries.
    ec_load_s_500k: the G_OPEN-only run continued until its extent reached 500,000
    records (ec_load_500k_extent says how many exactly), then crashed and recovered.
    recovery_s_half_log / recovery_s_full_log: the Q = 2x run crashed first at half the
    crash offset and then at the full one (so the output log doubled): reconstruct +
    load seconds each time, beside output_records_half_log / _full_log. Recovery reads
    the extent only, so it should not grow with the log.

(c) Extent vs CP (Figs. 8, 9). Q = openwins (always over target), CI = 10 ms, CP in
    {25, 50, 100, 250} ms, crashed at --cp-crash-at (1 million tuples):
    cp{N}_extent, cp{N}_gchecks, cp{N}_ec_load_s and
    cp{N}_throughput_rps (the paper measured response time; the operator's throughput
    shows the same cost of the time spent on G_CHECKs).

(d) Recovery against the extent (1k to 1M records). One slow window stays open while
    every other key opens and closes a window of 2 records (G_OPEN, then R: one output
    record per input record), with G_OPEN only, so the extent is the output written
    since the slow window opened: the input is 2E fast records, the slow key's record,
    then E fast records, and the extent is E records while the log holds 3E. A new
    operator recovers (reconstruct + load, no replay):
      extent{E}_scanned: output records read backwards (the extent, plus the records of
        the last input offset and the rest of the oldest batch read);
      extent{E}_ratio: scanned / extent; extent{E}_ec_load_s: reconstruct + load seconds;
      extent{E}_bytes_read / extent{E}_log_bytes: stored bytes read vs the whole log.
    With the same runs, the checkpoint overhead with a slow serialiser is
    bench/checkpoint_overhead.py (its own results file).

(e) A Q that cannot be met: 100,000 records over 2,000 keys, windows of 10, Q = 100
    (below the ~2,000 open windows) and no CP budget, against G_OPEN only on the same
    input. q_unmet_gchecks: G_CHECKs written; q_unmet_slowdown: its run time over the
    G_OPEN-only run's. (Before Q was raised to N it wrote a G_CHECK per window per pass.)

Crash trials. crash_trials random-crash recoveries, half CEC and half CRB: a child
process runs the job (streamlog.operators.cec.job_main) on 20,000 skewed records and is killed
with SIGKILL at a random moment (uniform over the time an uninterrupted run took), up
to 4 times (at least once), then left to finish; crash_trials_exact counts the trials
whose results (R records) equal those of a failure-free run exactly.

The machine is shared and noisy: the throughput ratios come from interleaved repeats;
absolute figures vary from run to run.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root

from _common import (  # noqa: E402  (bench/ is on sys.path when run as a script)
    DEFAULT_WORKDIR, Target, attempt, fmt_number, fresh_dir, median, phase, print_targets,
    progress, rate, remove, write_results)

import numpy as np  # noqa: E402

import streamlog  # noqa: E402
from streamlog.operators.cec import AggregateOperator, CECPolicy, WindowSpec  # noqa: E402
from streamlog.operators.checkpoint import CheckpointPolicy, CheckpointStore  # noqa: E402
from streamlog.operators.runtime import OperatorRuntime  # noqa: E402

KEY_BYTES, VALUE_BYTES = 8, 92  # the paper's 100-byte tuple
TUPLE_BYTES = KEY_BYTES + VALUE_BYTES
GEN_BATCH = 65536
EXTENT_500K = 500_000


# -------------------------------------------------------------------- input and runs

def make_input(path: Path, records: int, keys: int, seed: int) -> streamlog.Log:
    """`records` tuples with uniformly random item ids in [0, keys)."""
    remove(path)
    log = streamlog.open_log(path, fsync="never")
    log.create_stream("in")
    rng = np.random.default_rng(seed)
    pad = bytes(VALUE_BYTES - 8)
    for lo in range(0, records, GEN_BATCH):
        n = min(GEN_BATCH, records - lo)
        ids = rng.integers(0, keys, n).tolist()
        prices = rng.integers(1, 1000, n).tolist()
        log.append_batch_sync("in", [struct.pack("<q", p) + pad for p in prices],
                              keys=[b"%08d" % k for k in ids],
                              timestamps_us=list(range(lo * 10, (lo + n) * 10, 10)))
    return log


class Job:
    """One operator over the input, writing to a fresh output (and store, for CRB)."""

    def __init__(self, workdir: Path, name: str, input_log, window: int, *, mode: str,
                 cec: CECPolicy | None = None, crb_interval_s: float = 1.0,
                 chunk_records: int = 8192) -> None:
        self.path = fresh_dir(workdir / f"out-{name}")
        self.output = streamlog.open_log(self.path / "log", fsync="always")
        self.store = None
        policy = None
        if mode == "crb":
            self.store = CheckpointStore(self.path / "ckpt")
            policy = CheckpointPolicy.periodic(crb_interval_s)
        self.operator = AggregateOperator(WindowSpec.count(window),
                                          cec=cec if mode == "gopen" or mode == "cec" else None)
        self.runtime = OperatorRuntime(self.operator, input_log=input_log, input_stream="in",
                                       output_log=self.output, output_stream="out",
                                       store=self.store, checkpointing=policy,
                                       chunk_records=chunk_records)
        self.runtime.recover()
        self.input_log, self.window, self.cec, self.chunk_records = (
            input_log, window, cec, chunk_records)
        self.gchecks_before = 0  # written by operators that "crashed" earlier

    def run_to(self, offset: int) -> tuple[float, float]:
        """Process up to input `offset`; returns (wall, cpu) seconds."""
        wall, cpu = time.perf_counter(), time.process_time()
        self.runtime.run(to_offset=offset)
        return time.perf_counter() - wall, time.process_time() - cpu

    def crash_and_recover(self, repeats: int = 1) -> dict:
        """Abandon the operator (its output is what a crash under fsync=always leaves),
        recover a new one from the output, and time the phases (the median of `repeats`
        recoveries, each by a new operator; each forgets the output of the last input
        offset again, a few records), then replay up to the crash point."""
        self.runtime.close()
        crash_at = self.runtime.input_next
        figures = {"extent_live": self.operator.extent_records(),
                   "open": len(self.operator.open),
                   "gchecks": self.gchecks_before + self.operator.stats.g_check,
                   "output_records": self.output.end_offset("out")}
        self.gchecks_before = figures["gchecks"]
        timings = []
        for _ in range(repeats):
            self.operator = AggregateOperator(WindowSpec.count(self.window), cec=self.cec)
            self.runtime = OperatorRuntime(self.operator, input_log=self.input_log,
                                           input_stream="in", output_log=self.output,
                                           output_stream="out",
                                           chunk_records=self.chunk_records)
            gc.collect()
            cpu = time.process_time()
            report = self.runtime.recover(replay=False)
            cpu = time.process_time() - cpu
            seconds = report.phase_seconds
            timings.append((sum(seconds.get(p, 0.0) for p in (
                "locate", "truncate", "reconstruct", "load")), cpu,
                seconds.get("reconstruct", 0.0), seconds.get("load", 0.0)))
        timings.sort()
        (figures["ec_load_s"], figures["ec_load_cpu_s"], figures["reconstruct_s"],
         figures["load_s"]) = timings[len(timings) // 2]
        figures["extent"] = report.output_records_scanned
        self.last_report = report
        figures["windows"] = report.windows_loaded
        figures["replay_records"] = crash_at - report.replay_from_offset
        figures["replay_mb"] = figures["replay_records"] * TUPLE_BYTES / 1e6
        wall, _ = self.run_to(crash_at)
        figures["replay_s"] = wall
        self.gchecks_before -= self.operator.stats.g_check  # the replay wrote these again
        return figures

    def close(self) -> None:
        self.runtime.close()
        self.output.close()
        if self.store is not None:
            self.store.close()
        remove(self.path)


# -------------------------------------------------------------------- (a) throughput

def measure_throughput(args, figures: dict) -> None:
    workdir = args.workdir
    records = {"fast": args.records_a, "slow": 3 * args.records_a}  # similar run times
    input_log = make_input(workdir / "in-a", records["slow"], 2, args.seed)
    try:
        for workload, size in (("fast", 1), ("slow", 1000)):
            walls: dict[str, list[float]] = {"none": [], "gopen": [], "crb": []}
            cpus: dict[str, list[float]] = {"none": [], "gopen": [], "crb": []}
            for repeat in range(args.repeats):
                for mode in walls:
                    job = Job(workdir, f"{workload}-{mode}", input_log, size, mode=mode,
                              cec=CECPolicy(), crb_interval_s=args.crb_interval_s,
                              chunk_records=1024)
                    wall, cpu = job.run_to(records[workload])
                    walls[mode].append(wall)
                    cpus[mode].append(cpu)
                    if mode == "gopen":
                        stats = job.operator.stats
                        figures[f"output_per_result_{workload}"] = (
                            (stats.results + stats.g_open) / max(1, stats.results))
                    job.close()
                    progress(f"  {workload} {mode} repeat {repeat}: "
                             f"{rate(records[workload], wall):,.0f} rec/s")
            for mode in walls:
                figures[f"throughput_{workload}_{mode}_rps"] = rate(records[workload],
                                                                    median(walls[mode]))
            none = figures[f"throughput_{workload}_none_rps"]
            for mode in ("gopen", "crb"):
                figures[f"{mode}_overhead_pct_{workload}"] = 100 * (
                    1 - figures[f"throughput_{workload}_{mode}_rps"] / none)
                figures[f"{mode}_overhead_cpu_pct_{workload}"] = 100 * (
                    median(cpus[mode]) / median(cpus["none"]) - 1)
        for mode in ("gopen", "crb"):
            figures[f"{mode}_overhead_pct"] = max(figures[f"{mode}_overhead_pct_fast"],
                                                  figures[f"{mode}_overhead_pct_slow"])
    finally:
        input_log.close()
        remove(workdir / "in-a")


# -------------------------------------------------------------------- (b), (c) recovery

def measure_recovery(args, figures: dict) -> None:
    workdir = args.workdir
    total = args.crash_at * 6 // 5  # room for the G_OPEN-only run to reach a 500k extent
    with phase(f"(b) input: {total:,} tuples over {args.keys:,} item ids"):
        input_log = make_input(workdir / "in-b", total, args.keys, args.seed + 1)
    try:
        attempt("gopen-only run", lambda: _gopen_only(args, input_log, figures), args.failures)
        openwins = figures.get("openwins") or int(args.keys * 0.9)
        for k in (1, 2, 4, 8):
            if k * openwins > figures.get("gopen_only_max_extent", 0) > 0:
                # The target is beyond the largest extent this workload reaches: no
                # G_CHECK is ever due, so the run is the G_OPEN-only run, measured above.
                for key in ("extent", "gchecks", "ec_load_s", "ec_load_cpu_s",
                            "replay_records", "replay_mb", "replay_s"):
                    figures[f"q{k}x_{key}"] = figures[f"gopen_only_{key}"]
                continue
            policy = CECPolicy(q_target=k * openwins, ci_ms=5, cp_ms=100)
            attempt(f"Q={k}x", lambda: _crash_run(args, input_log, f"q{k}x", policy, figures,
                                                  twice=(k == 2)), args.failures)
        for name, target in (("125k", 125_000), ("250k", 250_000), ("500k", 500_000),
                             ("1m", 1_000_000)):
            policy = CECPolicy(u_target=target, ci_ms=5, cp_ms=100)
            attempt(f"U={name}", lambda: _crash_run(args, input_log, f"u{name}", policy,
                                                    figures, crash_at=args.u_crash_at),
                    args.failures)
        for cp_ms in (25, 50, 100, 250):
            policy = CECPolicy(q_target=openwins, ci_ms=10, cp_ms=cp_ms)
            attempt(f"CP={cp_ms}", lambda: _crash_run(args, input_log, f"cp{cp_ms}", policy,
                                                      figures, throughput=True,
                                                      crash_at=args.cp_crash_at), args.failures)
    finally:
        input_log.close()
        remove(workdir / "in-b")


def _gopen_only(args, input_log, figures: dict) -> None:
    with phase("(b) G_OPEN only: crash at the crash offset, then again at a 500k extent"):
        job = Job(args.workdir, "gopen-only", input_log, 10, mode="cec", cec=CECPolicy())
        try:
            job.run_to(args.crash_at)
            figures["openwins"] = len(job.operator.open)
            at_crash = job.crash_and_recover(repeats=3)
            end = input_log.end_offset("in")
            step = max(1, args.crash_at // 20)
            while job.operator.extent_records() < EXTENT_500K and job.runtime.input_next < end:
                job.run_to(min(end, job.runtime.input_next + step))
            result = job.crash_and_recover(repeats=3)
        finally:
            job.close()
    for key in ("extent", "gchecks", "ec_load_s", "ec_load_cpu_s", "replay_records",
                "replay_mb", "replay_s"):
        figures[f"gopen_only_{key}"] = at_crash[key]
    progress(f"  at the crash offset: extent {at_crash['extent']:,} records, EC load "
             f"{at_crash['ec_load_s']:.3f} s; later: extent {result['extent']:,} records, "
             f"EC load {result['ec_load_s']:.3f} s")
    figures["gopen_only_max_extent"] = result["extent"]
    if result["extent"] >= EXTENT_500K:
        figures["ec_load_s_500k"] = result["ec_load_s"]
        figures["ec_load_cpu_s_500k"] = result["ec_load_cpu_s"]
        figures["ec_load_reconstruct_s_500k"] = result["reconstruct_s"]
        figures["ec_load_load_s_500k"] = result["load_s"]
        figures["ec_load_500k_extent"] = result["extent"]
        figures["ec_load_500k_windows"] = result["windows"]
        figures["ec_load_records_per_s"] = rate(result["extent"], result["ec_load_s"])


def _crash_run(args, input_log, name: str, policy: CECPolicy, figures: dict, *,
               twice: bool = False, throughput: bool = False,
               crash_at: int | None = None) -> None:
    crash_at = crash_at or args.crash_at
    with phase(f"(b/c) {name}: run to {crash_at:,}, crash, recover"):
        job = Job(args.workdir, name, input_log, 10, mode="cec", cec=policy)
        try:
            if twice:
                job.run_to(crash_at // 2)
                half = job.crash_and_recover(repeats=3)
                figures["recovery_s_half_log"] = half["ec_load_s"]
                figures["output_records_half_log"] = half["output_records"]
                figures["extent_half_log"] = half["extent"]
            wall, _ = job.run_to(crash_at)
            result = job.crash_and_recover(repeats=3 if twice else 1)
        finally:
            job.close()
    for key in ("extent", "gchecks", "ec_load_s", "ec_load_cpu_s", "replay_records",
                "replay_mb", "replay_s"):
        figures[f"{name}_{key}"] = result[key]
    if twice:
        figures["recovery_s_full_log"] = result["ec_load_s"]
        figures["output_records_full_log"] = result["output_records"]
        figures["extent_full_log"] = result["extent"]
    if throughput:
        figures[f"{name}_throughput_rps"] = rate(crash_at, wall)
    progress(f"  extent {result['extent']:,}, G_CHECKs {result['gchecks']:,}, "
             f"EC load {result['ec_load_s']:.3f} s, replay {result['replay_records']:,} "
             f"records ({result['replay_s']:.2f} s)")


# -------------------------------------------------------------------- crash trials

def measure_crash_trials(args, figures: dict) -> None:
    workdir = args.workdir
    path = workdir / "in-crash"
    remove(path)
    rng = random.Random(args.seed)
    with streamlog.open_log(path, fsync="never") as log:
        log.create_stream("in")
        count = 20_000
        log.append_batch_sync(
            "in", [struct.pack("<q", rng.randint(1, 999)) + bytes(84) for _ in range(count)],
            keys=[b"%08d" % (int(rng.paretovariate(1.0)) % 500) for _ in range(count)],
            timestamps_us=[1_000_000 + (i // 4) * 10 for i in range(count)])
    expected = _failure_free(path, workdir)
    trials = exact = 0
    for mode in ("cec", "crb"):
        spec = _crash_spec(path, workdir / f"crash-{mode}-ref", mode)
        run_s = _run_child(spec, None)[1]
        for trial in range(args.trials // 2):
            spec = _crash_spec(path, workdir / f"crash-{mode}-{trial}", mode)
            kills = _crash_until_done(spec, rng, run_s)
            with streamlog.open_log(spec["output_path"], readonly=True) as log:
                same = [(r.key, r.value) for r in log.reader("out", 0)] == expected
            trials += 1
            exact += same
            progress(f"  {mode} trial {trial}: {kills} kills, "
                     f"{'identical' if same else 'DIFFERENT'} results")
            remove(Path(spec["output_path"]))
            remove(Path(spec["store_path"]))
    figures["crash_trials"] = trials
    figures["crash_trials_exact"] = exact
    remove(path)


def _crash_until_done(spec: dict, rng: random.Random, run_s: float) -> int:
    """Kill the job at random moments (at least once) until a run completes; returns the
    number of kills. A trial whose first run ends before its kill starts over."""
    for restart in range(4):
        kills = 0
        for _ in range(4):
            done, _ = _run_child(spec, rng.uniform(0.02, run_s / (1 + restart)))
            if done:
                break
            kills += 1
        else:
            _run_child(spec, None)
        if kills:
            return kills
        remove(Path(spec["output_path"]))
        remove(Path(spec["store_path"]))
    raise RuntimeError("the job always finished before its kill")


def _failure_free(path: Path, workdir: Path) -> list[tuple]:
    out = workdir / "crash-expected"
    remove(out)
    with streamlog.open_log(path, readonly=True) as input_log, \
            streamlog.open_log(out, fsync="never") as output_log:
        runtime = OperatorRuntime(AggregateOperator(WindowSpec.count(10)), input_log=input_log,
                                  input_stream="in", output_log=output_log, output_stream="out")
        runtime.recover()
        runtime.run()
        found = [(r.key, r.value) for r in output_log.reader("out", 0)]
    remove(out)
    return found


def _crash_spec(input_path: Path, out: Path, mode: str) -> dict:
    return {"input_path": str(input_path), "input_stream": "in",
            "output_path": str(out), "output_stream": "out", "store_path": str(out) + ".ckpt",
            "mode": mode, "window": {"kind": "count", "size": 10},
            "cec": {"q_target": 300, "ci_ms": 5, "cp_ms": 20},
            "checkpoint_interval_s": 0.05, "chunk_records": 64, "fsync": "always"}


def _run_child(spec: dict, kill_after_s: float | None) -> tuple[bool, float]:
    """Run the job in a child; SIGKILL it `kill_after_s` after READY. Returns (completed,
    seconds from READY to exit)."""
    code = "from streamlog.operators.cec import job_main; job_main()"
    child = subprocess.Popen([sys.executable, "-c", code, json.dumps(spec)],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = child.stdout.readline()
        assert line.startswith("READY"), line
        started = time.monotonic()
        try:
            child.wait(timeout=600 if kill_after_s is None else kill_after_s)
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGKILL)
            child.wait()
            return False, time.monotonic() - started
        if child.returncode != 0:
            raise RuntimeError(f"the job exited with {child.returncode}")
        return True, time.monotonic() - started
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()


# -------------------------------------------------------------------- report

PAPER = [
    # (label, our figure, paper's figure as text)
    ("G_OPEN overhead, fast windows %", "gopen_overhead_pct_fast", "< 10"),
    ("G_OPEN overhead, slow windows %", "gopen_overhead_pct_slow", "< 10"),
    ("G_OPEN overhead (CPU), fast %", "gopen_overhead_cpu_pct_fast", "-"),
    ("G_OPEN overhead (CPU), slow %", "gopen_overhead_cpu_pct_slow", "-"),
    ("CRB overhead, fast windows %", "crb_overhead_pct_fast", "-"),
    ("CRB overhead, slow windows %", "crb_overhead_pct_slow", "-"),
    ("output records per R, fast", "output_per_result_fast", "2 (Real bar)"),
    ("output records per R, slow", "output_per_result_slow", "-"),
    ("throughput fast none rec/s", "throughput_fast_none_rps", "source-bound"),
    ("throughput fast gopen rec/s", "throughput_fast_gopen_rps", "-"),
    ("throughput fast crb rec/s", "throughput_fast_crb_rps", "-"),
    ("throughput slow none rec/s", "throughput_slow_none_rps", "source-bound"),
    ("throughput slow gopen rec/s", "throughput_slow_gopen_rps", "-"),
    ("throughput slow crb rec/s", "throughput_slow_crb_rps", "-"),
    ("open windows at the crash", "openwins", "~90,000"),
    ("EC load, 500k extent s", "ec_load_s_500k", "14 - 27"),
    ("  of which: reconstruct s", "ec_load_reconstruct_s_500k", "-"),
    ("  of which: load s", "ec_load_load_s_500k", "-"),
    ("  CPU seconds", "ec_load_cpu_s_500k", "100% busy"),
    ("  its extent, records", "ec_load_500k_extent", "500,000"),
    ("G_OPEN only: largest extent reached", "gopen_only_max_extent", "max 500,000"),
    ("recovery, half log s", "recovery_s_half_log", "-"),
    ("recovery, full log s", "recovery_s_full_log", "-"),
    ("  output records, half / full", "output_records_half_log", "-"),
    ("", "output_records_full_log", "-"),
]
PAPER_Q = {"q1x": ("120,000 (Q unattainable)", "3.5 - 5", "25 - 50"),
           "q2x": ("~180,000 (target met)", "3.5 - 5", "25 - 50"),
           "q4x": ("target met", "14 - 27", "> 200"),
           "q8x": ("500,000 (max)", "14 - 27", "> 200")}
PAPER_U = {"u125k": ("120,000", "2.5", "20"), "u250k": ("-", "-", "-"),
           "u500k": ("-", "-", "-"), "u1m": ("230,000", "6.7", "90")}
PAPER_CP = {"cp25": ("smallest", "~2 (est.)"), "cp50": ("-", "-"), "cp100": ("-", "-"),
            "cp250": ("largest", "~5 (est.)")}

TARGETS = [
    Target("G_OPEN overhead < 10% of failure-free throughput (worse workload)",
           lambda f: f["gopen_overhead_pct"] < 10),
    Target("G_OPEN overhead < 10% on slow windows",
           lambda f: f["gopen_overhead_pct_slow"] < 10),
    Target("EC load of a 500,000-record extent < 0.5 s (paper: 14-27 s)",
           lambda f: f["ec_load_s_500k"] < 0.5),
    Target("(d) recovery reads at most 2x the extent + 2,000 records, at every extent",
           lambda f: all(f[k] <= 2 * f[k.replace("_scanned", "_live")] + 2000
                         for k in f if k.startswith("extent") and k.endswith("_scanned"))),
    Target("recovery does not grow with the log: full log within 1.5x (+0.1 s) of half",
           lambda f: f["recovery_s_full_log"] <= 1.5 * f["recovery_s_half_log"] + 0.1),
    Target("every random-crash recovery gives the failure-free output",
           lambda f: f["crash_trials"] > 0 and f["crash_trials_exact"] == f["crash_trials"]),
]


def report(figures: dict) -> None:
    print("(a) failure-free throughput and overheads; (b) recovery; this machine vs paper")
    print(f"{'figure':36}{'this machine':>16}  paper")
    print("-" * 72)
    for label, key, paper in PAPER:
        if key in figures:
            print(f"{label:36}{fmt_number(figures[key]):>16}  {paper}")
    print()
    print("(b) Q and U sweeps: 100,000 item ids, windows of 10, CI 5 ms, CP 100 ms")
    header = ("run", "extent", "G_CHECKs", "EC load s", "replay MB", "replay s")
    print(f"{header[0]:12}" + "".join(f"{h:>12}" for h in header[1:]) +
          "   paper: extent | EC load s | replay MB")
    for name, paper in [("gopen_only", ("500,000", "14 - 27", "> 200"))] + list(
            PAPER_Q.items()) + list(PAPER_U.items()):
        cells = [figures.get(f"{name}_{k}") for k in (
            "extent", "gchecks", "ec_load_s", "replay_mb", "replay_s")]
        if all(c is None for c in cells):
            continue
        print(f"{name:12}" + "".join(f"{fmt_number(c):>12}" for c in cells) +
              f"   {paper[0]} | {paper[1]} | {paper[2]}")
    print()
    print("(c) extent vs CP: Q = openwins, CI 10 ms")
    print(f"{'run':12}{'extent':>12}{'G_CHECKs':>12}{'EC load s':>12}{'rec/s':>12}"
          "   paper: extent | EC load s")
    for name, paper in PAPER_CP.items():
        cells = [figures.get(f"{name}_{k}") for k in ("extent", "gchecks", "ec_load_s",
                                                       "throughput_rps")]
        if all(c is None for c in cells):
            continue
        print(f"{name:12}" + "".join(f"{fmt_number(c):>12}" for c in cells) +
              f"   {paper[0]} | {paper[1]}")
    print()
    print("(d) recovery against the extent: one slow window, G_OPEN only")
    print(f"{'extent':>10}{'log records':>14}{'read':>12}{'read/extent':>13}"
          f"{'EC load s':>11}{'bytes read':>14}{'log bytes':>14}")
    for extent in (1_000, 10_000, 100_000, 1_000_000, 50_000):
        name = f"extent{_short(extent)}"
        if f"{name}_scanned" not in figures:
            continue
        print(f"{fmt_number(figures[name + '_live']):>10}"
              f"{fmt_number(figures[name + '_output_records']):>14}"
              f"{fmt_number(figures[name + '_scanned']):>12}"
              f"{figures[name + '_ratio']:>13.2f}{figures[name + '_ec_load_s']:>11.3f}"
              f"{fmt_number(figures[name + '_bytes_read']):>14}"
              f"{fmt_number(figures[name + '_log_bytes']):>14}")
    print()
    if "q_unmet_gchecks" in figures:
        print(f"(e) Q = 100 with ~2,000 windows open: {figures['q_unmet_gchecks']:,} "
              f"G_CHECKs, {figures['q_unmet_slowdown']:.2f}x the G_OPEN-only run time\n")
    print(f"crash trials: {figures.get('crash_trials')} run, "
          f"{figures.get('crash_trials_exact')} gave exactly the failure-free results")
    print_targets(figures, TARGETS)


# -------------------------------------------------------------------- (d) extent sweep

def measure_extent_sweep(args, figures: dict) -> None:
    for extent in args.extents:
        attempt(f"extent {extent:,}", lambda: _extent_run(args, extent, figures),
                args.failures)


def _extent_input(path: Path, extent: int) -> streamlog.Log:
    """2E fast records, one slow-key record, E fast records (module docstring, (d))."""
    remove(path)
    log = streamlog.open_log(path, fsync="never")
    log.create_stream("in")
    pad = bytes(VALUE_BYTES - 8)
    value = struct.pack("<q", 7) + pad
    total = 3 * extent + 1
    slow_at = 2 * extent
    for lo in range(0, total, GEN_BATCH):
        rows = range(lo, min(total, lo + GEN_BATCH))
        keys = [b"slow-key" if i == slow_at else b"%08d" % ((i - (i > slow_at)) // 2)
                for i in rows]
        log.append_batch_sync("in", [value] * len(rows), keys=keys,
                              timestamps_us=[i * 10 for i in rows])
    return log


def _extent_run(args, extent: int, figures: dict) -> None:
    workdir = args.workdir
    with phase(f"(d) extent {extent:,}: input {3 * extent + 1:,} tuples"):
        input_log = _extent_input(workdir / "in-d", extent)
    try:
        job = Job(workdir, f"extent{extent}", input_log, 2, mode="cec", cec=CECPolicy(),
                  chunk_records=8192)
        wall, _ = job.run_to(3 * extent + 1)
        live = job.operator.extent_records()
        progress(f"  ran {3 * extent + 1:,} tuples in {wall:.1f} s; extent {live:,}")
        result = job.crash_and_recover(repeats=3 if extent <= 100_000 else 1)
        name = f"extent{_short(extent)}"
        figures[f"{name}_live"] = live
        figures[f"{name}_scanned"] = result["extent"]
        figures[f"{name}_ratio"] = result["extent"] / max(1, live)
        figures[f"{name}_ec_load_s"] = result["ec_load_s"]
        figures[f"{name}_bytes_read"] = job.last_report.output_bytes_read
        figures[f"{name}_log_bytes"] = job.output.info()["streams"]["out"]["partitions"][0][
            "bytes"]
        figures[f"{name}_output_records"] = result["output_records"]
        job.close()
    finally:
        input_log.close()
        remove(workdir / "in-d")


def measure_unmet_q(args, figures: dict) -> None:
    workdir = args.workdir
    input_log = streamlog.open_log(workdir / "in-e", fsync="never")
    try:
        input_log.create_stream("in")
        n = 100_000
        input_log.append_batch_sync("in", [struct.pack("<q", i) for i in range(n)],
                                    keys=[b"k%d" % (i % 2000) for i in range(n)],
                                    timestamps_us=list(range(n)))
        seconds = {}
        for name, policy in (("gopen", CECPolicy()),
                             ("unmet", CECPolicy(q_target=100, cp_ms=None))):
            job = Job(workdir, f"q-{name}", input_log, 10, mode="cec", cec=policy,
                      chunk_records=1024)
            seconds[name], _ = job.run_to(n)
            if name == "unmet":
                figures["q_unmet_gchecks"] = job.operator.stats.g_check
            job.close()
        figures["q_unmet_slowdown"] = seconds["unmet"] / seconds["gopen"]
    finally:
        input_log.close()
        remove(workdir / "in-e")


def _short(n: int) -> str:
    return f"{n // 1_000_000}m" if n >= 1_000_000 and n % 1_000_000 == 0 else f"{n // 1000}k"


# -------------------------------------------------------------------- main

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    parser.add_argument("--records-a", type=int, help="input tuples per fast-windows "
                        "throughput run; slow-windows runs take 3x (default 200,000)")
    parser.add_argument("--crash-at", type=int, help="input offset of the crash in (b) "
                        "(default 2,500,000)")
    parser.add_argument("--u-crash-at", type=int, help="input offset of the crash in the "
                        "U runs of (b) (default 60%% of --crash-at)")
    parser.add_argument("--cp-crash-at", type=int, help="input offset of the crash in (c) "
                        "(default 40%% of --crash-at)")
    parser.add_argument("--keys", type=int, help="item ids in (b) and (c) (default 100,000)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trials", type=int, default=20, help="random-crash trials")
    parser.add_argument("--crb-interval-s", type=float, default=1.0)
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR / "cec")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip", default="", help="comma-separated: a, b, d, e, crash")
    parser.add_argument("--extents", default=None, help="comma-separated extents for (d) "
                        "(default 1000,10000,100000,1000000; --quick 1000,10000,50000)")
    args = parser.parse_args(argv)
    quick = args.quick
    args.records_a = args.records_a or (30_000 if quick else 200_000)
    args.crash_at = args.crash_at or (150_000 if quick else 2_500_000)
    args.u_crash_at = args.u_crash_at or args.crash_at * 3 // 5
    args.cp_crash_at = args.cp_crash_at or args.crash_at * 2 // 5
    args.keys = args.keys or (10_000 if quick else 100_000)
    if quick:
        args.repeats, args.trials = min(args.repeats, 1), min(args.trials, 2)
    args.extents = [int(x) for x in (args.extents or (
        "1000,10000,50000" if quick else "1000,10000,100000,1000000")).split(",")]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.failures = []
    skip = set(filter(None, args.skip.split(",")))
    fresh_dir(args.workdir)
    figures: dict = {"records_a": args.records_a, "crash_at": args.crash_at,
                     "u_crash_at": args.u_crash_at, "cp_crash_at": args.cp_crash_at,
                     "keys": args.keys}
    try:
        if "a" not in skip:
            with phase("(a) failure-free throughput: none / G_OPEN only / CRB"):
                attempt("throughput", lambda: measure_throughput(args, figures), args.failures)
        if "b" not in skip:
            measure_recovery(args, figures)
        if "d" not in skip:
            measure_extent_sweep(args, figures)
        if "e" not in skip:
            with phase("(e) a Q below the open windows"):
                attempt("unmet Q", lambda: measure_unmet_q(args, figures), args.failures)
        if "crash" not in skip:
            with phase(f"crash trials ({args.trials})"):
                attempt("crash trials", lambda: measure_crash_trials(args, figures),
                        args.failures)
    finally:
        remove(args.workdir)
    path = write_results("cec", figures)
    report(figures)
    print(f"\nwrote {path}")
    if args.failures:
        print(f"FAILED: {', '.join(args.failures)} (tracebacks above, on stderr)")
        sys.exit(1)


if __name__ == "__main__":
    main()
