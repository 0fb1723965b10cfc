"""Benchmark report: every bench/results/*.json in one Markdown table and one chart.

Command (from the repository root; `./dev bench report` runs the same):

    .venv/bin/python bench/report.py                  # bench/results/ -> REPORT.md, throughput.png
    .venv/bin/python bench/report.py --results DIR    # another folder of results files

Strategy. Nothing is measured here: the report reads the JSON files the benchmarks wrote
and puts each headline figure of ours beside the baseline or peer it was measured against.
Which figure goes with which is not guessed from the names: PAIRS below says it, one entry
a row, and a figure that is missing from its JSON (or a JSON that is not there) is shown
as "not measured", never filled in.

  ratio    how many times better ours is: ours / baseline for rates and counts, baseline /
           ours for times (Pair.higher_is_better False). Above 1, streamlog is ahead.
  target   the benchmark's own Target (its TARGETS list, found by its exact text), so PASS
           and MISS here are what the benchmark printed; the few benchmarks with no TARGETS
           get targets written here (LOCAL_TARGETS), each saying whose rule it restates.
           A row whose own figure is not measured has every target "n/a".
  machine, command, date   from the JSON ("machine" and "date" are written by
           _common.write_results; older files have neither: "not recorded" and the file's
           modification time, labelled as such).

The chart (matplotlib, Agg) is one horizontal bar per Pair with chart=True: the ratio on a
log scale around a 1.0x line, coloured by the target's verdict, with the ratio a target asks
for (Pair.target_ratio) marked. Those are throughput against baselines and peers measured in
the same run; figures quoted from a paper stay in the table.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.util
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/, for the TARGETS lookups

from _common import RESULTS_DIR, Target, command_line, fmt_number  # noqa: E402

REPORT_NAME = "REPORT.md"
README = Path(__file__).resolve().parent.parent / "README.md"
README_BENCHES = ("core", "daemon", "spark", "kafka", "cec")  # the performance figures
README_BEGIN, README_END = "<!-- bench-table:begin -->", "<!-- bench-table:end -->"
CHART_NAME = "throughput.png"
NOT_MEASURED = "not measured"


@dataclass(frozen=True)
class Paper:
    """A baseline that was not measured here: a published figure, quoted."""

    value: float  # the one the ratio is taken against
    text: str


@dataclass(frozen=True)
class Pair:
    """One row of the report: a figure of ours beside what it was measured against.

    `baseline` is a figure's name in the same JSON, a Paper, or None (a figure on its own).
    `targets` holds texts of the benchmark's TARGETS, or Target objects written here.
    `target_ratio` is only for the chart: the ratio the row's target asks for.
    Text fields may name figures of the JSON in braces ("{before_commit}").
    """

    bench: str
    figure: str
    ours: str
    unit: str
    baseline_name: str = ""
    baseline: str | Paper | None = None
    higher_is_better: bool = True
    targets: tuple[str | Target, ...] = ()
    target_ratio: float | None = None
    chart: bool = False


def _sweep(prefix: str, ideal: bool):
    """A check over integrity_sweep.py's own rules (its verdicts()) for one phase: the
    contract counts ("= 0", "= all"), or the "ideally 0" ones when ideal."""
    phase_total = {"seg_": "seg_flips", "index_": "index_flips", "tail_": "tail_kills"}[prefix]

    def check(figures: dict) -> bool | None:
        import integrity_sweep
        if phase_total not in figures:
            return None  # that phase did not run: n/a (verdicts() would count it as 0)
        judged = {name: verdict for name, verdict in integrity_sweep.verdicts(figures).items()
                  if name.startswith(prefix)}
        if ideal:
            return all(verdict != "MISS" for verdict in judged.values())
        return all(verdict != "FAIL" for verdict in judged.values())
    return check


LOCAL_TARGETS = {
    "reopen_1gib": Target("reopen after SIGKILL < 1 s for a 1 GiB log (core.py's target, on "
                          "this 1 GiB log)", lambda f: f["after_kill_s_1gib"] < 1.0),
    **{f"{prefix}{kind}": Target(
        f"{name}: every {rule} count holds (integrity_sweep.py's rules)",
        _sweep(prefix, kind == "ideal"))
       for prefix, name in (("seg_", "segment flips"), ("index_", "index flips"),
                            ("tail_", "damaged tails"))
       for kind, rule in (("contract", "'= 0' / '= all'"), ("ideal", "'ideally 0'"))},
}

PLAIN = "plain file, fsync per MiB"
DISK = "the disk: 1 MiB writes + fsync, no records"
PARQUET_READ = "spark.read.parquet, same rows"
PARQUET_WRITE = "df.write.parquet (no fsync)"
BEFORE = "commit {before_commit}, same run"

PAIRS = [
    # core: durable append and replay against three stores, in the same run.
    Pair("core", "durable append, batches of 1,000", "append_batched_rps", "rec/s", PLAIN,
         "baseline_append_rps", targets=("batched append >= 50% of the plain file baseline",),
         target_ratio=0.5, chart=True),
    Pair("core", "durable append, batches of 1,000", "append_batched_rps", "rec/s",
         "SQLite WAL, synchronous=FULL", "sqlite_append_rps",
         targets=("batched append ahead of SQLite",), target_ratio=1.0, chart=True),
    Pair("core", "durable append, batches of 1,000", "append_batched_rps", "rec/s",
         "LMDB, sync=True", "lmdb_append_rps", targets=("batched append ahead of LMDB",),
         target_ratio=1.0, chart=True),
    Pair("core", "durable append, batches of 1,000", "append_batched_mb_s", "MB/s", DISK,
         "disk_fsync_mb_s", chart=True),
    Pair("core", "durable append, Arrow columns", "append_columns_mb_s", "MB/s", DISK,
         "disk_fsync_mb_s", targets=("columnar append >= 0.7x disk write + fsync MB/s",),
         target_ratio=0.7, chart=True),
    Pair("core", "durable append, Arrow columns", "append_columns_rps", "rec/s", PLAIN,
         "baseline_append_rps", targets=("columnar append >= 1.0x the plain file baseline",),
         target_ratio=1.0, chart=True),
    Pair("core", "durable append, Arrow columns", "append_columns_rps", "rec/s",
         "LMDB, sync=True", "lmdb_append_rps", targets=("columnar append >= 2x LMDB",),
         target_ratio=2.0, chart=True),
    Pair("core", "durable append, 1,000 concurrent single records", "append_concurrent_rps",
         "rec/s", PLAIN, "baseline_append_rps", chart=True),
    Pair("core", "durable append, 1,000 concurrent single records", "append_concurrent_rps",
         "rec/s", "producer single sends, same run", "append_producer_rps",
         targets=("awaited single appends, 1,000 tasks >= 0.5x producer single sends",),
         target_ratio=0.5, chart=True),
    Pair("core", "durable append, 10 concurrent single records", "append_concurrent10_rps",
         "rec/s", "producer single sends, same run", "append_producer_rps"),
    Pair("core", "durable append, single records through a producer", "append_producer_rps",
         "rec/s", "append_batch of 1,000, same run", "append_batched_rps",
         targets=("producer single sends >= 0.2x batched append",), target_ratio=0.2,
         chart=True),
    Pair("core", "replay, Record objects", "replay_records_rps", "rec/s",
         "plain file, a tuple a record", "baseline_replay_rps",
         targets=("records replay >= 0.8x the plain file baseline",), target_ratio=0.8,
         chart=True),
    Pair("core", "replay, Record objects", "replay_records_rps", "rec/s", "LMDB cursor",
         "lmdb_replay_rps", chart=True),
    Pair("core", "replay, Arrow", "replay_arrow_rps", "rec/s", "plain file, a tuple a record",
         "baseline_replay_rps", targets=("Arrow replay >= 3,000,000 rec/s",), chart=True),
    Pair("core", "replay, Arrow", "replay_arrow_rps", "rec/s", "LMDB cursor",
         "lmdb_replay_rps", chart=True),
    Pair("core", "timestamp seek, median", "timestamp_seek_ms", "ms",
         "the same seek on a log of N/10", "timestamp_seek_ms_small", higher_is_better=False,
         targets=("timestamp seek < 5 ms",
                  "timestamp seek flat: at N within 2x (or +1 ms) of at N/10")),
    Pair("core", "reopen after SIGKILL", "reopen_after_kill_s", "s",
         targets=("reopen after SIGKILL < 1 s for a 1 GiB log",)),
    Pair("core", "size of the log reopened after SIGKILL", "reopen_log_bytes", "bytes"),
    # daemon: `streamlog serve` against the local log and two servers, in the same run.
    Pair("daemon", "daemon append, fsync before ack", "daemon_append_rps", "rec/s",
         "Redis XADD, appendfsync always", "redis_append_rps",
         targets=("daemon append >= 10x redis (appendfsync always)",), target_ratio=10,
         chart=True),
    Pair("daemon", "daemon append, fsync before ack", "daemon_append_rps", "rec/s",
         "NATS JetStream (no fsync before ack)", "nats_append_rps",
         targets=("daemon append >= 10x nats",), target_ratio=10, chart=True),
    Pair("daemon", "daemon append, fsync before ack", "daemon_append_rps", "rec/s",
         "local log, in process", "local_append_rps",
         targets=("daemon append >= 0.8x local",), target_ratio=0.8, chart=True),
    Pair("daemon", "daemon replay, Arrow", "daemon_replay_rps", "rec/s", "Redis XRANGE",
         "redis_replay_rps", targets=("daemon replay >= 10x redis",), target_ratio=10,
         chart=True),
    Pair("daemon", "daemon replay, Arrow", "daemon_replay_rps", "rec/s",
         "NATS ordered consumer", "nats_replay_rps", targets=("daemon replay >= 10x nats",),
         target_ratio=10, chart=True),
    Pair("daemon", "daemon replay, Arrow", "daemon_replay_rps", "rec/s",
         "local log, in process", "local_replay_rps",
         targets=("daemon replay (arrow) within 2x of local",), target_ratio=0.5, chart=True),
    Pair("daemon", "daemon replay, Record objects", "daemon_replay_records_rps", "rec/s",
         "Redis XRANGE (Python objects too)", "redis_replay_rps", chart=True),
    # spark: format("streamlog") against Spark's own Parquet, in the same run.
    Pair("spark", "spark.read.format(\"streamlog\")", "streamlog_read_rps", "rows/s",
         PARQUET_READ, "parquet_read_rps", targets=("read >= 1.0x Parquet's rows/s",),
         target_ratio=1.0, chart=True),
    Pair("spark", "df.write.format(\"streamlog\"), fsync always", "streamlog_write_rps",
         "rows/s", PARQUET_WRITE, "parquet_write_rps",
         targets=("write >= 1.0x Parquet's rows/s",), target_ratio=1.0, chart=True),
    Pair("spark", "readStream streamlog -> noop", "streamlog_stream_rps", "rows/s",
         PARQUET_READ, "parquet_read_rps"),
    Pair("spark", "readStream streamlog -> streamlog sink, exactly once",
         "streamlog_stream_sink_rps", "rows/s", PARQUET_WRITE, "parquet_write_rps"),
    Pair("spark", "live tail -> foreachBatch, p99", "latency_foreachbatch_p99_ms", "ms"),
    Pair("spark", "live tail -> streamlog sink, p99", "latency_sink_p99_ms", "ms"),
    # spark: the bounds of a Python data source and sink, measured in the same run.
    Pair("spark", "spark.read.format(\"streamlog\")", "streamlog_read_rps", "rows/s",
         "no-op Python data source, same run", "noop_source_read_rps",
         targets=("streamlog read >= 0.9x the no-op Python source",), target_ratio=0.9,
         chart=True),
    Pair("spark", "df.write.format(\"streamlog\"), fsync always", "streamlog_write_rps",
         "rows/s", "no-op Python data sink, same run", "noop_sink_write_rps",
         targets=("streamlog write >= 0.9x the no-op Python sink",), target_ratio=0.9,
         chart=True),
    Pair("spark", "df.write.format(\"streamlog\"), fsync always", "streamlog_write_rps",
         "rows/s", "durable no-op Python sink (a file and an fsync a task), same run",
         "durable_sink_write_rps"),
    Pair("spark", "no-op Python data source", "noop_source_read_rps", "rows/s", PARQUET_READ,
         "parquet_read_rps"),
    Pair("spark", "no-op Python data sink", "noop_sink_write_rps", "rows/s", PARQUET_WRITE,
         "parquet_write_rps"),
    # kafka: an unmodified Kafka client against `serve --kafka-port`, beside our client.
    Pair("kafka", "confluent-kafka produce, acks=all, linger 5 ms", "kafka_produce_rps",
         "rec/s", "streamlog client: producer, same run", "ours_produce_rps",
         targets=("kafka produce >= 0.5x our client's",), target_ratio=0.5, chart=True),
    Pair("kafka", "confluent-kafka consume", "kafka_consume_rps", "rec/s",
         "streamlog client: records replay, same run", "ours_consume_rps",
         targets=("kafka consume >= 0.8x our client's",), target_ratio=0.8, chart=True),
    Pair("kafka", "confluent-kafka consume, fetch.queue.backoff.ms=10",
         "kafka_consume_prompt_rps", "rec/s", "our client's replay, same run",
         "ours_consume_rps"),
    Pair("kafka", "confluent-kafka produce, transactional, a commit per 1,000",
         "kafka_txn_produce_rps", "rec/s", "confluent-kafka produce, idempotent, same run",
         "kafka_idempotent_produce_rps",
         targets=("transactional produce (commit per 1,000) >= 0.5x idempotent produce",),
         target_ratio=0.5, chart=True),
    # cec: the CEC paper's evaluation; peers in the same run, the paper's figures quoted.
    Pair("cec", "operator with CEC (G_OPEN), 1-record windows", "throughput_fast_gopen_rps",
         "rec/s", "no checkpointing, same run", "throughput_fast_none_rps",
         targets=("G_OPEN overhead < 10% of failure-free throughput (worse workload)",),
         target_ratio=0.9, chart=True),
    Pair("cec", "operator with CEC (G_OPEN), 1,000-record windows",
         "throughput_slow_gopen_rps", "rec/s", "no checkpointing, same run",
         "throughput_slow_none_rps", targets=("G_OPEN overhead < 10% on slow windows",),
         target_ratio=0.9, chart=True),
    Pair("cec", "operator with CEC (G_OPEN), 1-record windows", "throughput_fast_gopen_rps",
         "rec/s", "CRB, periodic checkpoints", "throughput_fast_crb_rps", chart=True),
    Pair("cec", "operator with CEC (G_OPEN), 1,000-record windows",
         "throughput_slow_gopen_rps", "rec/s", "CRB, periodic checkpoints",
         "throughput_slow_crb_rps", chart=True),
    Pair("cec", "EC load, 500,000-record extent", "ec_load_s_500k", "s",
         baseline=Paper(14.0, "CEC paper: 14 - 27 s (ratio against 14)"),
         higher_is_better=False,
         targets=("EC load of a 500,000-record extent < 0.5 s (paper: 14-27 s)",)),
    Pair("cec", "EC load, Q = 2x open windows", "q2x_ec_load_s", "s",
         baseline=Paper(3.5, "CEC paper: 3.5 - 5 s (ratio against 3.5)"),
         higher_is_better=False),
    Pair("cec", "recovery (EC load), full log", "recovery_s_full_log", "s",
         "the same at half the log", "recovery_s_half_log", higher_is_better=False,
         targets=("recovery does not grow with the log: full log within 1.5x (+0.1 s) "
                  "of half",)),
    Pair("cec", "output records read to recover a 1,000,000-record extent",
         "extent1m_scanned", "records", "the extent", "extent1m_live", higher_is_better=False,
         targets=("(d) recovery reads at most 2x the extent + 2,000 records, at every "
                  "extent",)),
    Pair("cec", "random-crash recoveries equal to a failure-free run", "crash_trials_exact",
         "trials", "trials run", "crash_trials",
         targets=("every random-crash recovery gives the failure-free output",)),
    # checkpoint_overhead: a slow serialiser, handed over vs on the operator's thread.
    Pair("checkpoint_overhead", "operator throughput, checkpoints handed over",
         "throughput_handover_rps", "rec/s", "no checkpoints, same run",
         "throughput_baseline_rps", targets=("hand-over throughput >= 0.6x the baseline",),
         target_ratio=0.6, chart=True),
    Pair("checkpoint_overhead", "operator throughput, checkpoints handed over",
         "throughput_handover_rps", "rec/s", "serialised on the operator's thread",
         "throughput_sync_rps", targets=("hand-over throughput >= 2x the sync path's",),
         target_ratio=2.0, chart=True),
    Pair("checkpoint_overhead", "operator time per checkpoint, handed over",
         "handover_operator_ms_per_checkpoint", "ms", "serialised on the operator's thread",
         "sync_operator_ms_per_checkpoint", higher_is_better=False,
         targets=("hand-over: the operator spends < 10 ms per checkpoint (serialiser: "
                  "50 ms)",)),
    # writers: the cross-process commit lock against the code before it.
    Pair("writers", "commit, fsync=never", "commit_us_never", "us", BEFORE,
         "before_commit_us_never", higher_is_better=False),
    Pair("writers", "commit, fsync=always", "commit_us_always", "us", BEFORE,
         "before_commit_us_always", higher_is_better=False),
    Pair("writers", "2 processes on one partition, fsync=always", "procs_2_rps_always",
         "rec/s", "1 process", "procs_1_rps_always"),
    Pair("writers", "4 processes on one partition, fsync=always", "procs_4_rps_always",
         "rec/s", "1 process", "procs_1_rps_always"),
    # reopen: open times at 1 and 10 GiB against an older commit, in the same run.
    Pair("reopen", "open after SIGKILL, 1 GiB log", "after_kill_s_1gib", "s", BEFORE,
         "before_after_kill_s_1gib", higher_is_better=False,
         targets=(LOCAL_TARGETS["reopen_1gib"],)),
    Pair("reopen", "open after SIGKILL, 10 GiB log", "after_kill_s_10gib", "s", BEFORE,
         "before_after_kill_s_10gib", higher_is_better=False),
    Pair("reopen", "clean open, 10 GiB log", "clean_s_10gib", "s", BEFORE,
         "before_clean_s_10gib", higher_is_better=False),
    # integrity_sweep: single faults; the "baseline" is how many were made.
    Pair("integrity_sweep", "segment bit flips named at their position by verify",
         "seg_verify_detected", "flips", "flips made", "seg_flips",
         targets=(LOCAL_TARGETS["seg_contract"],)),
    Pair("integrity_sweep", "index bit flips answered correctly", "index_ok", "flips",
         "flips made", "index_flips",
         targets=(LOCAL_TARGETS["index_contract"], LOCAL_TARGETS["index_ideal"])),
    Pair("integrity_sweep", "acknowledged records lost, kills with a damaged tail",
         "tail_lost_acked", "records", "acknowledged records", "tail_acked_records",
         higher_is_better=False,
         targets=(LOCAL_TARGETS["tail_contract"], LOCAL_TARGETS["tail_ideal"])),
    # footprint: the command line's start-up and the daemon's memory, idle and after a
    # flood of hostile connections.
    Pair("footprint", "streamlog read of a 10-record log, start to exit", "read_startup_ms",
         "ms", "python -c pass, same run", "python_startup_ms", higher_is_better=False,
         targets=("read start-up < 150 ms",)),
    Pair("footprint", "daemon RSS, idle, no --kafka-port", "idle_rss_mib", "MiB",
         targets=("daemon idle RSS <= 80 MiB (no --kafka-port)",)),
    Pair("footprint", "daemon RSS, idle, with --kafka-port", "idle_rss_mib_kafka", "MiB",
         "no --kafka-port, same run", "idle_rss_mib", higher_is_better=False),
    Pair("footprint", "daemon RSS at the peak of a hostile flood", "flood_peak_rss_mib",
         "MiB", "idle, before the flood", "flood_idle_rss_mib", higher_is_better=False),
    Pair("footprint", "daemon RSS 60 s after a hostile flood", "after_flood_60s_rss_mib",
         "MiB", "idle, before the flood", "flood_idle_rss_mib", higher_is_better=False,
         targets=("RSS 60 s after a hostile flood within 1.2x of idle",)),
    # console: the web console's page loads on a log of 100 partitions, and what twenty
    # browsers loading pages (and a flood of page loads) cost the producers of the same
    # daemon, in the same run.
    Pair("console", "console page load p95, slowest page kind ({page_p95_worst_kind})",
         "page_p95_worst_ms", "ms",
         targets=("every page kind's p95 < 300 ms on a log of 100 partitions",)),
    Pair("console", "producers' appends, 20 browsers loading console pages "
         "(~{think_s} s between pages)", "append_browsing_rps", "rec/s",
         "no console traffic, same run (three phases)", "append_baseline_rps",
         targets=("producers' append rate with 20 browsers >= 0.9x without console "
                  "traffic",), target_ratio=0.9, chart=True),
    Pair("console", "producers' appends, a flood of console page loads (20 clients, no "
         "pause)", "append_flood_rps", "rec/s", "no console traffic, same run (three phases)",
         "append_baseline_rps",
         targets=("producers' append rate under a flood of console requests (20 clients, "
                  "no pause) >= 0.8x without console traffic",), target_ratio=0.8),
    Pair("console", "console pages served, 20 browsers", "browsing_pages_per_s", "pages/s"),
    Pair("console", "console pages served, a flood (20 clients, no pause)",
         "flood_pages_per_s", "pages/s"),
]


# ---------------------------------------------------------------- reading

@dataclass(frozen=True)
class Results:
    """One bench/results/NAME.json and where it came from."""

    figures: dict
    machine: str
    command: str
    date: str


def load_results(results_dir: Path) -> dict[str, Results]:
    """bench name -> its results, for every *.json in results_dir."""
    found = {}
    for path in sorted(results_dir.glob("*.json")):
        figures = json.loads(path.read_text())
        if not isinstance(figures, dict):
            raise ValueError(f"{path}: a results file is one JSON object, not this")
        if "machine" in figures:
            machine = f"{figures['machine']}"
        else:
            machine = f"{figures.get('cpu_count', '?')} CPUs; machine not recorded"
        if "date" in figures:
            date = str(figures["date"])
        else:
            modified = datetime.datetime.fromtimestamp(path.stat().st_mtime,
                                                       tz=datetime.timezone.utc)
            date = modified.strftime("%Y-%m-%d %H:%M UTC") + " (file mtime)"
        found[path.stem] = Results(figures, machine, str(figures.get("command", "?")), date)
    return found


def number(figures: dict, key: str) -> float | None:
    """figures[key] when it is a finite number, else None (not measured)."""
    value = figures.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


def bench_module(bench: str):
    """bench/BENCH.py as a module, loaded from its file as `bench_BENCH` (a bench may
    share its name with an installed package: bench/kafka.py and kafka-python)."""
    name = f"bench_{bench}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, Path(__file__).resolve().parent / f"{bench}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while it runs
        spec.loader.exec_module(module)
    return sys.modules[name]


def script_target(bench: str, text: str) -> Target:
    """The Target of bench/BENCH.py whose text is `text`."""
    module = bench_module(bench)
    for target in module.TARGETS:
        if target.text == text:
            return target
    raise LookupError(f"no target {text!r} in bench/{bench}.py TARGETS")


# ---------------------------------------------------------------- evaluating

@dataclass(frozen=True)
class Line:
    """A Pair evaluated against its results: the numbers and verdicts of one row."""

    pair: Pair
    results: Results | None
    ours: float | None
    baseline: float | None
    ratio: float | None
    verdicts: tuple[tuple[str, str], ...]  # (PASS | MISS | n/a, target text)


def evaluate(pair: Pair, results: Results | None) -> Line:
    figures = results.figures if results else {}
    ours = number(figures, pair.ours)
    if isinstance(pair.baseline, Paper):
        baseline = pair.baseline.value
    else:
        baseline = number(figures, pair.baseline) if pair.baseline else None
    verdicts = []
    for target in pair.targets:
        if isinstance(target, str):
            target = script_target(pair.bench, target)
        verdicts.append((verdict(target, figures) if ours is not None else "n/a",
                         target.text))
    assert len(verdicts) == len(pair.targets)
    return Line(pair, results, ours, baseline, better_ratio(pair, ours, baseline),
                tuple(verdicts))


def better_ratio(pair: Pair, ours: float | None, baseline: float | None) -> float | None:
    """How many times better ours is than the baseline; None when that is undefined."""
    if ours is None or baseline is None:
        return None
    numerator, denominator = (ours, baseline) if pair.higher_is_better else (baseline, ours)
    return numerator / denominator if denominator else None


def verdict(target: Target, figures: dict) -> str:
    """As _common.print_targets: a figure the check needs that is missing gives n/a."""
    try:
        ok = target.check(figures)
    except (KeyError, TypeError):
        ok = None
    if ok is None:
        return "n/a"
    return "PASS" if ok else "MISS"


def chart_verdict(line: Line) -> str:
    """One verdict for a bar: MISS if any target missed, PASS if one passed, else none."""
    states = {state for state, _ in line.verdicts}
    if "MISS" in states:
        return "MISS"
    return "PASS" if "PASS" in states else "none"


# ---------------------------------------------------------------- Markdown

COLUMNS = ("figure", "ours", "baseline", "ratio", "target", "machine", "command", "date")


def fill(text: str, figures: dict) -> str:
    """text with {name} replaced by the figure `name` (unchanged if one is missing)."""
    try:
        return text.format_map(figures)
    except (KeyError, ValueError, IndexError):
        return text


def format_ratio(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:.0f}x"
    if value >= 10:
        return f"{value:.1f}x"
    return f"{value:.2f}x" if value >= 0.1 else f"{value:.3f}x"


def baseline_label(line: Line) -> str:
    return fill(line.pair.baseline_name, line.results.figures if line.results else {})


def cells(line: Line) -> list[str]:
    pair, results = line.pair, line.results
    figures = results.figures if results else {}
    ours = NOT_MEASURED if line.ours is None else f"{fmt_number(line.ours)} {pair.unit}"
    if isinstance(pair.baseline, Paper):
        baseline = pair.baseline.text
    elif pair.baseline is None:
        baseline = "-"
    else:
        value = (NOT_MEASURED if line.baseline is None
                 else f"{fmt_number(line.baseline)} {pair.unit}")
        baseline = f"{baseline_label(line)}: {value}"
    targets = "<br>".join(f"{state}: {text}" for state, text in line.verdicts) or "-"
    if results is None:
        where = f"no bench/results/{pair.bench}.json"
        run = [where, where, where]
    else:
        run = [results.machine, f"`{results.command}`", results.date]
    return [f"{pair.bench}: {fill(pair.figure, figures)}", ours, baseline,
            format_ratio(line.ratio), targets, *run]


def markdown_table(lines: list[Line]) -> str:
    rows = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for line in lines:
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells(line)) + " |")
    return "\n".join(rows) + "\n"


def markdown_report(lines: list[Line], unpaired: list[str], command: str) -> str:
    parts = [
        "# Benchmark report\n",
        f"Rendered by `{command}` (`./dev bench report`) from `bench/results/*.json`; "
        "nothing here is measured by the report itself. Each row puts a figure of ours "
        "beside the baseline or peer it was measured against in the same run (or a "
        "paper's published figure, quoted). **ratio** = how many times better ours is: "
        "ours / baseline for rates and counts, baseline / ours for times; above 1.00x "
        "streamlog is ahead. **target** is the benchmark's own target (PASS, MISS, or "
        "n/a when the figures it needs are missing). A figure missing from its results "
        "file is shown as *not measured*. The machines are shared and noisy: read the "
        "ratios, not the absolute figures.\n",
        f"![throughput against peers]({CHART_NAME})\n",
        markdown_table(lines),
    ]
    if unpaired:
        parts.append("Results files with no rows in `bench/report.py` PAIRS: "
                     + ", ".join(f"`{name}.json`" for name in unpaired) + ".\n")
    return "\n".join(parts)


# ---------------------------------------------------------------- chart

COLOURS = {"PASS": "#2e7d32", "MISS": "#c62828", "none": "#78909c"}


def short_number(value: float) -> str:
    for bound, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= bound:
            return f"{value / bound:.3g}{suffix}"
    return f"{value:.3g}"


def draw_chart(lines: list[Line], path: Path) -> None:
    """A horizontal bar a line: its ratio on a log axis, from the 1.0x line."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    shown = [line for line in lines if line.pair.chart]
    assert shown, "PAIRS has no row for the chart"
    ratios = [line.ratio for line in shown if line.ratio is not None]
    ratios += [line.pair.target_ratio for line in shown if line.pair.target_ratio]
    low, high = min(ratios + [1.0]) / 2, max(ratios + [1.0]) * 12
    figure, axes = pyplot.subplots(figsize=(12, 1.6 + 0.36 * len(shown)))
    for row, line in enumerate(shown):
        if line.ratio is None:
            axes.text(1.05, row, NOT_MEASURED, va="center", fontsize=8, style="italic")
            continue
        colour = COLOURS[chart_verdict(line)]
        axes.barh(row, line.ratio - 1.0, left=1.0, height=0.65, color=colour)
        # A bar of 0.98x is too thin to see: a tick at its end shows where it stops.
        axes.plot(line.ratio, row, marker="|", markersize=14, color=colour)
        axes.text(max(line.ratio, 1.0, line.pair.target_ratio or 0) * 1.12, row,
                  f"{format_ratio(line.ratio)}  ({short_number(line.ours)} vs "
                  f"{short_number(line.baseline)} {line.pair.unit})", va="center", fontsize=8)
        if line.pair.target_ratio:
            axes.plot(line.pair.target_ratio, row, marker="D", color="black", markersize=5)
    labels = [f"{line.pair.bench}: {line.pair.figure}\nvs {baseline_label(line)}"
              for line in shown]
    axes.set_yticks(range(len(shown)), labels, fontsize=7)
    for row in range(1, len(shown)):
        if shown[row].pair.bench != shown[row - 1].pair.bench:
            axes.axhline(row - 0.5, color="grey", linewidth=0.5, linestyle=":")
    axes.invert_yaxis()
    axes.set_xscale("log")
    axes.set_xlim(low, high)
    axes.axvline(1.0, color="black", linewidth=1)
    axes.set_xlabel("times better than the baseline or peer (log scale; 1.0x = level)")
    axes.set_title("streamlog throughput against baselines and peers measured in the same run")
    axes.grid(axis="x", which="major", alpha=0.3)
    axes.legend(handles=[Patch(color=COLOURS["PASS"], label="target met"),
                         Patch(color=COLOURS["MISS"], label="target missed"),
                         Patch(color=COLOURS["none"], label="no target"),
                         Line2D([], [], marker="D", color="black", linestyle="",
                                label="ratio the target asks for")],
                loc="lower right", fontsize=8)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    pyplot.close(figure)


# ---------------------------------------------------------------- main

def unpaired(results: dict[str, Results]) -> list[str]:
    """The results files no Pair reads (a new benchmark wants rows in PAIRS)."""
    paired = {pair.bench for pair in PAIRS}
    return [name for name in results if name not in paired]


def readme_table(lines: list[Line], results: dict[str, Results]) -> str:
    """The table for the README: the headline benchmarks' rows (README_BENCHES) with
    figure, ours, baseline, ratio, target; the machine, command and date of each run
    under it. REPORT.md has every row."""
    lines = [line for line in lines if line.pair.bench in README_BENCHES]
    results = {name: r for name, r in results.items() if name in README_BENCHES}
    rows = ["| " + " | ".join(COLUMNS[:5]) + " |", "|" + "---|" * 5]
    for line in lines:
        rows.append("| " + " | ".join(cell.replace("|", "\\|")
                                      for cell in cells(line)[:5]) + " |")
    runs = [f"`{name}`: `{r.command}`, {r.date}" for name, r in results.items()
            if any(pair.bench == name for pair in PAIRS)]
    machines = sorted({r.machine for r in results.values()})
    return ("\n".join(rows) + "\n\nMeasured on " + "; ".join(machines) + ". Runs: "
            + "; ".join(runs) + ".\n")


def update_readme(readme: Path, table: str) -> bool:
    """Put `table` between README_BEGIN and README_END in `readme`; False (and nothing
    written) when the file lacks them."""
    text = readme.read_text(encoding="utf-8") if readme.exists() else ""
    start, end = text.find(README_BEGIN), text.find(README_END)
    if start < 0 or end < start:
        return False
    start += len(README_BEGIN)
    readme.write_text(text[:start] + "\n" + table + text[end:], encoding="utf-8")
    return True


def render(results_dir: Path, command: str = "bench/report.py",
           readme: Path | None = None) -> tuple[Path, Path]:
    """Write REPORT.md and throughput.png into results_dir (and the table into `readme`
    between its markers); return their paths."""
    results = load_results(results_dir)
    lines = [evaluate(pair, results.get(pair.bench)) for pair in PAIRS]
    report_path, chart_path = results_dir / REPORT_NAME, results_dir / CHART_NAME
    report_path.write_text(markdown_report(lines, unpaired(results), command))
    draw_chart(lines, chart_path)
    if readme is not None:
        update_readme(readme, readme_table(lines, results))
    return report_path, chart_path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS_DIR,
                        help="the folder of NAME.json files, and where the report goes "
                             "(default bench/results/)")
    parser.add_argument("--readme", type=Path, default=README,
                        help="the file whose table between the markers "
                             f"{README_BEGIN} and {README_END} is rewritten "
                             "(default README.md; a file without them is left alone)")
    args = parser.parse_args(argv)
    command = command_line()
    report_path, chart_path = render(args.results, command, args.readme)
    print(f"wrote {report_path}")
    print(f"wrote {chart_path}")
    print(f"command: {command}")


if __name__ == "__main__":
    main()
