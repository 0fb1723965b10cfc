"""Checkpoint overhead: what periodic checkpoints with a slow serialiser cost an operator's
throughput, when the operator serialises its state itself (the synchronous path) and
when it hands a snapshot over to the checkpointer's worker thread (checkpoint.py).

Command (from the repository root):

    .venv/bin/python bench/checkpoint_overhead.py            # the defaults: ~2 minutes
    .venv/bin/python bench/checkpoint_overhead.py --quick    # a smoke run, < 20 s
    .venv/bin/python bench/checkpoint_overhead.py --records 5000000 --repeats 5

Writes bench/results/checkpoint_overhead.json (flat: named numbers, plus "command" and
"cpu_count"), prints progress on stderr and the table on stdout.

The operator counts input records per key. Its state is a dict of --keys keys (100,000,
all present from the start, so every checkpoint has the same size: ~0.8 MB of
MessagePack);
it emits one output record per chunk (--chunk-records, 1024), so the output append is a
small fixed cost. Input keys are uniformly random; the input and output logs use
fsync="never", the checkpoint store is LMDB with an fsync per checkpoint (as always).

Configurations, run --repeats times each, interleaved; figures are medians:

    baseline   no checkpointing
    sync       periodic checkpoints every --interval-ms (20); checkpoint() sets
               ckpt.state = slow(state): the operator's thread serialises
    handover   the same interval; checkpoint() calls ckpt.hand_over(dict(counts), slow):
               the operator pays for a shallow copy, slow() runs on the worker thread

slow(state) is the default codec (MessagePack) followed by a sleep that makes it take
--serialize-ms (50) in all: a serialiser that is slow but releases the GIL for most of
its time (compression, I/O). The MessagePack part holds the GIL, so even handed over it
still takes the operator's CPU: encode_ms says how much.

Figures: throughput_{baseline,sync,handover}_rps (input records per second, wall clock)
and ratio_{sync,handover} (against the baseline of the same run); per checkpointed
configuration: *_checkpoints (written), *_dropped (periodic ones due while one was in
flight), *_operator_ms_per_checkpoint (the operator thread's time inside checkpoint
calls: snapshot + hand-off, plus the serialiser on the sync path), *_write_ms (the
store put), handover_serialize_ms (on the worker). encode_ms: one MessagePack encode of
the state; snapshot_copy_ms: one dict(counts).

Back-of-envelope estimates, printed beside the measurements (estimate_ratio_*): with
interval I and an in-flight time T per checkpoint, a periodic checkpoint starts every
ceil(T / I) * I (the ones due in between are dropped). Sync: T = serialise + write, and
the operator stands still for the serialise part of each cycle. Handover: the operator
loses the copy and the GIL-held encode part of each cycle.
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root

from _common import (  # noqa: E402  (bench/ is on sys.path when run as a script)
    DEFAULT_WORKDIR, Row, Target, attempt, command_line, fresh_dir, median, phase,
    print_table, print_targets, progress, rate, remove, write_results)

import numpy as np  # noqa: E402

import streamlog  # noqa: E402
from streamlog.operators.checkpoint import CheckpointPolicy, CheckpointStore  # noqa: E402
from streamlog.operators.codec import DEFAULT_CODEC  # noqa: E402
from streamlog.operators.runtime import OperatorRuntime  # noqa: E402

CONFIGS = ("baseline", "sync", "handover")
GEN_BATCH = 65536


class KeyCounter:
    """Counts records per key; its checkpoint is the whole dict."""

    def __init__(self, keys: int, serialize, hand_over: bool) -> None:
        self.keys, self.serialize, self.hand_over = keys, serialize, hand_over
        self.reset_to_initial_state()

    def reset_to_initial_state(self) -> None:
        self.counts = {b"%d" % k: 0 for k in range(self.keys)}

    def checkpoint(self, ckpt) -> None:
        if self.hand_over:
            ckpt.hand_over(dict(self.counts), self.serialize)
        else:
            ckpt.state = self.serialize(self.counts)

    def reset(self, ckpt) -> None:
        self.counts = ckpt.value()

    def process_chunk(self, chunk, out) -> None:
        counts = self.counts
        for key in chunk.keys:
            counts[key] += 1
        out.emit(b"%d" % len(chunk), None, chunk.timestamps_us[-1])


def slow_serializer(total_s: float):
    """The default codec, then a sleep up to `total_s` in all (releases the GIL)."""
    def serialize(state) -> bytes:
        deadline = time.perf_counter() + total_s
        data = DEFAULT_CODEC.encode(state)
        time.sleep(max(0.0, deadline - time.perf_counter()))
        return data
    return serialize


def make_input(path: Path, records: int, keys: int, seed: int) -> streamlog.Log:
    remove(path)
    log = streamlog.open_log(path, fsync="never")
    log.create_stream("in")
    rng = np.random.default_rng(seed)
    for lo in range(0, records, GEN_BATCH):
        n = min(GEN_BATCH, records - lo)
        ids = rng.integers(0, keys, n).tolist()
        log.append_batch_sync("in", [b"x"] * n, keys=[b"%d" % k for k in ids],
                              timestamps_us=list(range(lo, lo + n)))
    return log


def run_once(args, input_log, config: str, index: int) -> dict:
    """One run of `config` over the whole input; returns its figures."""
    path = fresh_dir(args.workdir / f"run-{config}-{index}")
    output = streamlog.open_log(path / "out", fsync="never")
    store = None if config == "baseline" else CheckpointStore(path / "ckpt", keep=3)
    policy = None if store is None else CheckpointPolicy.periodic(args.interval_ms / 1000)
    operator = KeyCounter(args.keys, slow_serializer(args.serialize_ms / 1000),
                          hand_over=config == "handover")
    runtime = OperatorRuntime(operator, input_log=input_log, input_stream="in",
                              output_log=output, output_stream="out", store=store,
                              checkpointing=policy, chunk_records=args.chunk_records,
                              progress=None, hold_input=False)
    runtime.recover(replay=False)
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    count = runtime.run()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    runtime.close()  # the last write, outside the timed part
    assert count == args.records, (count, args.records)
    figures = {"rps": rate(count, wall), "cpu_s": cpu}
    if store is not None:
        stats = runtime.checkpointer.stats
        figures.update(checkpoints=stats.written, dropped=stats.dropped,
                       operator_ms_per_checkpoint=1000 * stats.snapshot_seconds / max(
                           1, stats.started),
                       write_ms=1000 * stats.write_seconds / max(1, stats.written),
                       serialize_ms=1000 * stats.serialize_seconds / max(1, stats.serialized))
        store.close()
    output.close()
    remove(path)
    return figures


def measure_costs(args, figures: dict) -> None:
    """One encode and one dict copy of a full state, for the estimates."""
    counts = KeyCounter(args.keys, None, False).counts
    encodes, copies = [], []
    for _ in range(5):
        started = time.perf_counter()
        DEFAULT_CODEC.encode(counts)
        encodes.append(time.perf_counter() - started)
        started = time.perf_counter()
        dict(counts)
        copies.append(time.perf_counter() - started)
    figures["encode_ms"] = 1000 * median(encodes)
    figures["snapshot_copy_ms"] = 1000 * median(copies)
    figures["state_bytes"] = len(DEFAULT_CODEC.encode(counts))


def measure(args, input_log, figures: dict) -> None:
    runs: dict[str, list[dict]] = {config: [] for config in CONFIGS}
    for repeat in range(args.repeats):  # interleaved, so drift hits all configurations
        for config in CONFIGS:
            result = run_once(args, input_log, config, repeat)
            runs[config].append(result)
            progress(f"  repeat {repeat + 1}/{args.repeats} {config:8}: "
                     f"{result['rps']:,.0f} rec/s" + (
                         f", {result['checkpoints']} checkpoints, {result['dropped']} dropped"
                         if "checkpoints" in result else ""))
    for config, results in runs.items():
        figures[f"throughput_{config}_rps"] = median([r["rps"] for r in results])
        figures[f"cpu_s_{config}"] = median([r["cpu_s"] for r in results])
        if config == "baseline":
            continue
        for name in ("checkpoints", "dropped", "operator_ms_per_checkpoint", "write_ms"):
            figures[f"{config}_{name}"] = median([r[name] for r in results])
        if config == "handover":
            figures["handover_serialize_ms"] = median([r["serialize_ms"] for r in results])
        figures[f"ratio_{config}"] = (figures[f"throughput_{config}_rps"] /
                                      figures["throughput_baseline_rps"])
        spread = [r["rps"] for r in results]
        if len(spread) > 1:
            figures[f"throughput_{config}_rps_stdev"] = statistics.stdev(spread)


def estimate(args, figures: dict) -> None:
    """The back-of-envelope ratios of the module docstring."""
    interval, serialize = args.interval_ms, args.serialize_ms
    write = figures.get("sync_write_ms", 0.0)
    cycle = math.ceil((serialize + write) / interval) * interval
    figures["estimate_ratio_sync"] = max(0.0, cycle - serialize) / cycle
    write = figures.get("handover_write_ms", 0.0)
    cycle = math.ceil((serialize + write) / interval) * interval
    lost = figures["snapshot_copy_ms"] + figures["encode_ms"]
    figures["estimate_ratio_handover"] = max(0.0, cycle - lost) / cycle


ROWS = [
    Row("throughput, no checkpoints", "throughput_baseline_rps", "rec/s",
        {"vs baseline": "throughput_baseline_rps"}),
    Row("throughput, sync path", "throughput_sync_rps", "rec/s",
        {"vs baseline": "throughput_baseline_rps"}),
    Row("throughput, hand-over path", "throughput_handover_rps", "rec/s",
        {"vs baseline": "throughput_baseline_rps", "vs sync": "throughput_sync_rps"}),
    Row("  estimate, sync / baseline", "estimate_ratio_sync", "x"),
    Row("  estimate, hand-over / baseline", "estimate_ratio_handover", "x"),
    Row("checkpoints written, sync", "sync_checkpoints", "-"),
    Row("checkpoints dropped, sync", "sync_dropped", "-"),
    Row("checkpoints written, hand-over", "handover_checkpoints", "-"),
    Row("checkpoints dropped, hand-over", "handover_dropped", "-"),
    Row("operator ms / checkpoint, sync", "sync_operator_ms_per_checkpoint", "ms"),
    Row("operator ms / checkpoint, hand-over", "handover_operator_ms_per_checkpoint", "ms"),
    Row("serialise ms (worker), hand-over", "handover_serialize_ms", "ms"),
    Row("store write ms, sync", "sync_write_ms", "ms"),
    Row("store write ms, hand-over", "handover_write_ms", "ms"),
    Row("one msgpack encode of the state", "encode_ms", "ms"),
    Row("one dict copy of the state", "snapshot_copy_ms", "ms"),
    Row("state size", "state_bytes", "bytes"),
    Row("CPU seconds, no checkpoints", "cpu_s_baseline", "s"),
    Row("CPU seconds, sync", "cpu_s_sync", "s"),
    Row("CPU seconds, hand-over", "cpu_s_handover", "s"),
]

TARGETS = [
    Target("hand-over: the operator spends < 10 ms per checkpoint (serialiser: 50 ms)",
           lambda f: f["handover_operator_ms_per_checkpoint"] < 10),
    Target("hand-over throughput >= 2x the sync path's",
           lambda f: f["throughput_handover_rps"] >= 2 * f["throughput_sync_rps"]),
    Target("hand-over throughput >= 0.6x the baseline",
           lambda f: f["ratio_handover"] >= 0.6),
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a small smoke run (< 20 s)")
    parser.add_argument("--records", type=int, help="input records per run "
                        "(default 3,000,000; --quick 1,000,000)")
    parser.add_argument("--keys", type=int, default=100_000, help="keys in the state")
    parser.add_argument("--repeats", type=int, help="runs per configuration (default 3; "
                        "--quick 1)")
    parser.add_argument("--interval-ms", type=float, default=20.0)
    parser.add_argument("--serialize-ms", type=float, default=50.0)
    parser.add_argument("--chunk-records", type=int, default=1024)
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR / "checkpoint_overhead")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.records = args.records or (1_000_000 if args.quick else 3_000_000)
    args.repeats = args.repeats or (1 if args.quick else 3)
    if args.records < 1 or args.repeats < 1 or args.keys < 1 or args.interval_ms <= 0:
        parser.error("--records, --repeats, --keys and --interval-ms must be positive")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    failures: list[str] = []
    fresh_dir(args.workdir)
    figures: dict = {"records": args.records, "keys": args.keys, "repeats": args.repeats,
                     "interval_ms": args.interval_ms, "serialize_ms": args.serialize_ms,
                     "chunk_records": args.chunk_records}
    try:
        with phase(f"input: {args.records:,} records over {args.keys:,} keys"):
            input_log = make_input(args.workdir / "in", args.records, args.keys, args.seed)
        attempt("costs", lambda: measure_costs(args, figures), failures)
        with phase(f"throughput: {', '.join(CONFIGS)} x {args.repeats}"):
            attempt("throughput", lambda: measure(args, input_log, figures), failures)
        input_log.close()
        attempt("estimates", lambda: estimate(args, figures), failures)
    finally:
        remove(args.workdir)
    path = write_results("checkpoint_overhead", figures)
    print(f"periodic checkpoints every {args.interval_ms:g} ms, a {args.serialize_ms:g} ms "
          f"serialiser, {args.keys:,} keys, {args.records:,} records x {args.repeats}")
    print_table(figures, ROWS, ["vs baseline", "vs sync"])
    print_targets(figures, TARGETS)
    print(f"\nwrote {path}")
    print(f"command: {command_line()}")
    if failures:
        print(f"FAILED: {', '.join(failures)} (tracebacks above, on stderr)")
        sys.exit(1)


if __name__ == "__main__":
    main()
