"""Spark benchmark: format("streamlog") against Spark's own Parquet, on local[2].

Command (from the repository root; `./dev bench spark` runs the same):

    .venv/bin/python bench/spark.py                   # 1,000,000 records
    .venv/bin/python bench/spark.py --records 200000 --repeat 5 --workdir DIR [--keep]

Writes bench/results/spark.json (flat: named numbers, plus "command" and "cpu_count"),
prints progress on stderr and a table with ratios and targets on stdout.

Data: N records in one stream of 2 partitions (N/2 each), a 16-byte random key, a
100-byte random value, and a timestamp rising by 10 us a record with +-15 us of jitter.
The same rows, with the columns the streamlog source returns (stream, partition,
offset, timestamp, key, value), are written once with pyarrow as 2 Parquet files
(snappy), one per partition, for the Parquet baselines.

Figures (rows per second; best of --repeat runs after one warm-up, each timed from the
action's call to its return, so each includes Spark's planning and task start-up; the
streamlog and Parquet runs take turns; `*_median` beside each best):
  streamlog_read_rps        spark.read.format("streamlog") of the log -> format("noop")
  parquet_read_rps          spark.read.parquet of the same rows -> format("noop")
  streamlog_write_rps       the Parquet rows' key, value, timestamp -> df.write
                            .format("streamlog") into a new 2-partition stream, fsync=always
                            (executors stage Arrow files, the driver commits them)
  parquet_write_rps         the same DataFrame -> df.write.parquet (no fsync)
  streamlog_stream_rps      readStream.format("streamlog") from earliest,
                            maxOffsetsPerTrigger N/4, Trigger.AvailableNow -> "noop"
  streamlog_stream_sink_rps the same stream's key, value, timestamp -> writeStream
                            .format("streamlog"), exactly-once (transactional mode)
The streaming figures are one run each (a fresh checkpoint), from start() to the end
of awaitTermination(). The machine may be shared: compare ratios measured in one run.

End-to-end latency of a live tail (milliseconds; --latency-records appends, one every
100 ms to alternating partitions of a 2-partition stream, after a warm-up that waits
for the query's first rows; trigger(processingTime="0 seconds"), startingOffsets latest;
each record carries its append time):
  latency_foreachbatch_p50_ms / _p99_ms   append -> the row reaches foreachBatch
                                          (measured in that function, on the driver)
  latency_sink_p50_ms / _p99_ms           append -> the row is visible to a
                                          read_committed reader of the streamlog sink's
                                          output log (polled every 5 ms)
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root

from _common import (  # noqa: E402  (bench/ is on sys.path when run as a script)
    DEFAULT_WORKDIR, Row, Target, attempt, fresh_dir, median, phase, progress, publish,
    rate, ratio, remove, timed)

ROOT = Path(__file__).resolve().parent.parent
STREAM = "events"
PARTITIONS = 2
KEY_BYTES = 16
VALUE_BYTES = 100
APPEND_ROWS = 50_000
TS_STEP_US = 10
TS_JITTER_US = 15
# Back-of-envelope, from measurements of the Python Data Source API on this class of
# machine (2 cores): Arrow batches cost about 0.7 us a row in the framework, per core;
# the driver's commit appends about 1 M rows/s (the log's own batched append) after
# about 0.35 us a row of Arrow -> Python conversion.
ESTIMATE_READ_RPS = PARTITIONS / 0.7e-6
ESTIMATE_COMMIT_RPS = 1 / (1.0e-6 + 0.35e-6)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR / "spark")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--latency-records", type=int, default=100,
                        help="records appended for the live-tail latency (0: skip it)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the work directory (about 1.3 GB for 1,000,000 records)")
    return parser.parse_args(argv)


# ---------------------------------------------------------------- data

def build_inputs(workdir: Path, count: int, seed: int) -> tuple[Path, Path]:
    """The streamlog log and the Parquet directory holding the same rows."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    import streamlog
    rng = random.Random(seed)
    key_blob = rng.randbytes(count * KEY_BYTES)
    value_blob = rng.randbytes(count * VALUE_BYTES)
    base = 1_700_000_000_000_000
    jitter = np.array([rng.randint(-TS_JITTER_US, TS_JITTER_US) for _ in range(count)])
    timestamps = (base + np.arange(count, dtype=np.int64) * TS_STEP_US + jitter).tolist()
    log_path, parquet_path = workdir / "input.log", fresh_dir(workdir / "input.parquet")
    remove(log_path)
    share = count // PARTITIONS
    with streamlog.open_log(log_path, fsync="never") as log:
        log.create_stream(STREAM, partitions=PARTITIONS)
        for number in range(PARTITIONS):
            lo, hi = number * share, count if number == PARTITIONS - 1 else (number + 1) * share
            for start in range(lo, hi, APPEND_ROWS):
                stop = min(start + APPEND_ROWS, hi)
                log.append_batch_sync(
                    STREAM, [value_blob[i * VALUE_BYTES:(i + 1) * VALUE_BYTES]
                             for i in range(start, stop)],
                    keys=[key_blob[i * KEY_BYTES:(i + 1) * KEY_BYTES] for i in range(start, stop)],
                    timestamps_us=timestamps[start:stop], partition=number)
            table = pa.table({
                "stream": pa.array([STREAM] * (hi - lo), pa.string()),
                "partition": pa.array(np.full(hi - lo, number, dtype=np.int32)),
                "offset": pa.array(np.arange(hi - lo, dtype=np.int64)),
                "timestamp": pa.array(timestamps[lo:hi], pa.timestamp("us", tz="UTC")),
                "key": _binary(key_blob, KEY_BYTES, lo, hi),
                "value": _binary(value_blob, VALUE_BYTES, lo, hi)})
            pq.write_table(table, parquet_path / f"part-{number}.parquet", compression="snappy")
    return log_path, parquet_path


def _binary(blob: bytes, width: int, lo: int, hi: int):
    import numpy as np
    import pyarrow as pa
    offsets = np.arange(0, (hi - lo + 1) * width, width, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), hi - lo, [None, pa.py_buffer(offsets),
                                                        pa.py_buffer(blob[lo * width:hi * width])])


# ---------------------------------------------------------------- Spark

def start_spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = f"{ROOT}{os.pathsep}{path}" if path else str(ROOT)
    from pyspark.sql import SparkSession

    import spark_source
    spark = (SparkSession.builder.master("local[2]").appName("streamlog-bench")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.memory", "2g")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark_source.register(spark)
    return spark


def interleaved(repeat: int, actions: dict) -> dict:
    """{name: (best, median) seconds} of `repeat` runs of each action(run), after one
    warm-up run each. The contenders take turns (order flipped every round), so a burst
    of load from elsewhere on the machine hits both, not one."""
    for action in actions.values():
        action(-1)
    seconds: dict = {name: [] for name in actions}
    for run in range(repeat):
        names = list(actions) if run % 2 == 0 else list(reversed(actions))
        for name in names:
            seconds[name].append(timed(actions[name], run)[1])
    return {name: (min(values), median(values)) for name, values in seconds.items()}


def record(figures: dict, name: str, count: int, seconds: tuple[float, float]) -> None:
    figures[name] = rate(count, seconds[0])
    figures[f"{name}_median"] = rate(count, seconds[1])


def measure_reads(spark, figures, log_path: Path, parquet_path: Path, count: int, repeat):
    source = (spark.read.format("streamlog").option("path", str(log_path))
              .option("stream", STREAM))
    assert source.load().count() == count
    assert spark.read.parquet(str(parquet_path)).count() == count
    results = interleaved(repeat, {
        "streamlog": lambda _: source.load().write.format("noop").mode("overwrite").save(),
        "parquet": lambda _: (spark.read.parquet(str(parquet_path)).write.format("noop")
                              .mode("overwrite").save())})
    record(figures, "streamlog_read_rps", count, results["streamlog"])
    record(figures, "parquet_read_rps", count, results["parquet"])


def measure_writes(spark, figures, workdir: Path, parquet_path: Path, count: int, repeat):
    rows = spark.read.parquet(str(parquet_path)).select("key", "value", "timestamp")

    def to_streamlog(run: int) -> None:
        (rows.write.format("streamlog").mode("append")
         .option("path", str(workdir / f"write-{run}.log"))
         .option("stream", "out").option("partitions", str(PARTITIONS)).save())

    def to_parquet(run: int) -> None:
        rows.write.mode("overwrite").parquet(str(workdir / f"write-{run}.parquet"))

    results = interleaved(repeat, {"streamlog": to_streamlog, "parquet": to_parquet})
    record(figures, "streamlog_write_rps", count, results["streamlog"])
    record(figures, "parquet_write_rps", count, results["parquet"])
    assert count_records(workdir / "write-0.log", "out") == count


def measure_streams(spark, figures, workdir: Path, log_path: Path, count: int) -> None:
    def stream():
        return (spark.readStream.format("streamlog").option("path", str(log_path))
                .option("stream", STREAM).option("startingOffsets", "earliest")
                .option("maxOffsetsPerTrigger", str(max(count // 4, 1))).load())

    def run(writer) -> float:
        def go():
            query = writer.trigger(availableNow=True).start()
            query.awaitTermination()
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
            return query
        query, seconds = timed(go)
        progress(f"  {len(query.recentProgress)} micro-batches in {seconds:.2f} s")
        return seconds

    checkpoint = fresh_dir(workdir / "ckpt-noop")
    seconds = run(stream().writeStream.format("noop").option("checkpointLocation",
                                                             str(checkpoint)))
    figures["streamlog_stream_rps"] = rate(count, seconds)
    checkpoint, target = fresh_dir(workdir / "ckpt-sink"), workdir / "stream-out.log"
    remove(target)
    writer = (stream().select("key", "value", "timestamp").writeStream.format("streamlog")
              .option("path", str(target)).option("stream", "out")
              .option("partitions", str(PARTITIONS))
              .option("checkpointLocation", str(checkpoint)))
    figures["streamlog_stream_sink_rps"] = rate(count, run(writer))
    assert count_records(target, "out") == count


def measure_latency(spark, figures, workdir: Path, count: int) -> None:
    """The live-tail latencies (module docstring), into foreachBatch and into the sink."""
    import streamlog
    source, target = workdir / "tail.log", workdir / "tail-out.log"
    remove(source)
    remove(target)
    with streamlog.open_log(source, fsync="always") as log:
        log.create_stream("tail", partitions=PARTITIONS)
        seen: list[float] = []

        def arrived(frame, _batch_id) -> None:
            now = time.time()
            seen.extend(now - _sent_at(r.value) for r in frame.select("value").collect())

        def tail():
            return (spark.readStream.format("streamlog").option("path", str(source))
                    .option("stream", "tail").option("startingOffsets", "latest").load())

        query = (tail().writeStream.foreachBatch(arrived)
                 .option("checkpointLocation", str(fresh_dir(workdir / "ckpt-tail")))
                 .trigger(processingTime="0 seconds").start())
        try:
            _timed_appends(log, count, seen.clear, lambda: len(seen))
            _percentiles(figures, "latency_foreachbatch", seen)
        finally:
            query.stop()
        watcher = _OutputWatcher(target)
        query = (tail().select("key", "value").writeStream.format("streamlog")
                 .option("path", str(target)).option("stream", "out")
                 .option("partitions", str(PARTITIONS))
                 .option("checkpointLocation", str(fresh_dir(workdir / "ckpt-tail-sink")))
                 .trigger(processingTime="0 seconds").start())
        try:
            _timed_appends(log, count, watcher.seen.clear, lambda: len(watcher.seen),
                           before_each=watcher.poll_until)
            _percentiles(figures, "latency_sink", watcher.seen)
        finally:
            query.stop()
            watcher.close()


def _sent_at(value: bytes) -> float:
    return int(value.split(b":")[1]) / 1e6


def _timed_appends(log, count: int, reset, arrived, before_each=None) -> None:
    """Warm the query up (until its first rows arrive), then append `count` records
    100 ms apart, each carrying its append time, and wait for all of them."""
    def append(label: bytes, partition: int) -> None:
        log.append_sync("tail", label + b":%d" % (time.time_ns() // 1000),
                        partition=partition)

    def wait_for(rows: int, deadline: float) -> None:
        while arrived() < rows:
            if before_each is not None:
                before_each(0.005)
            else:
                time.sleep(0.005)
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {arrived()} of {rows} rows arrived")

    time.sleep(3)  # the query's first (empty) trigger
    append(b"warm-up", 0)
    wait_for(1, time.monotonic() + 120)
    reset()
    for i in range(count):
        append(b"%d" % i, i % PARTITIONS)
        next_at = time.monotonic() + 0.1
        while time.monotonic() < next_at:
            if before_each is not None:
                before_each(0.005)
            else:
                time.sleep(0.005)
    wait_for(count, time.monotonic() + 60)


class _OutputWatcher:
    """Reads the sink's output log as a read_committed reader in another process would
    (a read-only view, refreshed), noting when each record becomes visible."""

    def __init__(self, path: Path) -> None:
        self.path, self.view, self.seen = path, None, []
        self.next = [0] * PARTITIONS

    def poll_until(self, seconds: float) -> None:
        import streamlog
        if self.view is None:
            if not (self.path / "streamlog.json").exists():
                time.sleep(seconds)
                return
            self.view = streamlog.open_log(self.path, readonly=True)
        self.view.refresh()
        now = time.time()
        for number in range(self.view.partition_count("out") if "out" in
                            self.view.streams() else 0):
            with self.view.reader("out", number, from_offset=self.next[number]) as reader:
                self.seen.extend(now - _sent_at(r.value) for r in reader)
            self.next[number] = self.view.last_stable_offset("out", number)
        time.sleep(seconds)

    def close(self) -> None:
        if self.view is not None:
            self.view.close()


def _percentiles(figures: dict, name: str, seconds: list[float]) -> None:
    ordered = sorted(seconds)
    figures[f"{name}_p50_ms"] = ordered[len(ordered) // 2] * 1000
    figures[f"{name}_p99_ms"] = ordered[min(len(ordered) - 1, len(ordered) * 99 // 100)] * 1000
    progress(f"  {name}: p50 {figures[f'{name}_p50_ms']:.0f} ms, "
             f"p99 {figures[f'{name}_p99_ms']:.0f} ms over {len(ordered)} records")


def count_records(path: Path, stream: str) -> int:
    import streamlog
    with streamlog.open_log(path, readonly=True) as log:
        total = 0
        for number in range(log.partition_count(stream)):
            with log.reader(stream, number) as reader:
                total += sum(batch.num_rows for batch in reader.arrow())
        return total


# ---------------------------------------------------------------- report

ROWS = [
    Row("streamlog read", "streamlog_read_rps", "rows/s", {"vs parquet": "parquet_read_rps",
                                                          "vs estimate": "estimate_read_rps"}),
    Row("parquet read", "parquet_read_rps", "rows/s"),
    Row("streamlog write (fsync always)", "streamlog_write_rps", "rows/s",
        {"vs parquet": "parquet_write_rps", "vs estimate": "estimate_commit_rps"}),
    Row("parquet write", "parquet_write_rps", "rows/s"),
    Row("streamlog stream -> noop", "streamlog_stream_rps", "rows/s",
        {"vs parquet": "parquet_read_rps"}),
    Row("streamlog stream -> streamlog", "streamlog_stream_sink_rps", "rows/s",
        {"vs parquet": "parquet_write_rps"}),
    Row("live tail -> foreachBatch, p50", "latency_foreachbatch_p50_ms", "ms"),
    Row("live tail -> foreachBatch, p99", "latency_foreachbatch_p99_ms", "ms"),
    Row("live tail -> streamlog sink, p50", "latency_sink_p50_ms", "ms"),
    Row("live tail -> streamlog sink, p99", "latency_sink_p99_ms", "ms"),
    Row("estimate: read, Arrow, 2 cores", "estimate_read_rps", "rows/s"),
    Row("estimate: driver commit", "estimate_commit_rps", "rows/s"),
]
TARGETS = [
    Target("read >= 1.0x Parquet's rows/s",
           lambda f: f["streamlog_read_rps"] >= f["parquet_read_rps"]),
    Target("write >= 1.0x Parquet's rows/s",
           lambda f: f["streamlog_write_rps"] >= f["parquet_write_rps"]),
]


def run(args) -> tuple[dict, list[str]]:
    figures: dict = {"records": args.records, "partitions": PARTITIONS,
                     "key_bytes": KEY_BYTES, "value_bytes": VALUE_BYTES,
                     "estimate_read_rps": ESTIMATE_READ_RPS,
                     "estimate_commit_rps": ESTIMATE_COMMIT_RPS}
    failures: list[str] = []
    workdir = fresh_dir(args.workdir)
    with phase(f"build {args.records:,} records (log and Parquet)"):
        log_path, parquet_path = build_inputs(workdir, args.records, args.seed)
    with phase("start Spark (local[2])"):
        spark = start_spark()
    try:
        with phase("batch reads"):
            attempt("reads", lambda: measure_reads(spark, figures, log_path, parquet_path,
                                                   args.records, args.repeat), failures)
        with phase("batch writes"):
            attempt("writes", lambda: measure_writes(spark, figures, workdir, parquet_path,
                                                     args.records, args.repeat), failures)
        with phase("streaming"):
            attempt("streams", lambda: measure_streams(spark, figures, workdir, log_path,
                                                       args.records), failures)
        if args.latency_records > 0:
            with phase("live-tail latency (trigger 0 s)"):
                attempt("latency", lambda: measure_latency(spark, figures, workdir,
                                                           args.latency_records), failures)
    finally:
        spark.stop()
        if not args.keep:
            remove(workdir)
    figures["read_vs_parquet"] = ratio(figures.get("streamlog_read_rps"),
                                       figures.get("parquet_read_rps"))
    figures["write_vs_parquet"] = ratio(figures.get("streamlog_write_rps"),
                                        figures.get("parquet_write_rps"))
    return figures, failures


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    figures, failures = run(args)
    publish("spark", figures, failures, ROWS, ["vs parquet", "vs estimate"], TARGETS)


if __name__ == "__main__":
    main()
