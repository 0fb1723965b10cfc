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
streamlog, bound and Parquet runs take turns; `*_median` beside each best):
  streamlog_read_rps        spark.read.format("streamlog") of the log -> format("noop")
  parquet_read_rps          spark.read.parquet of the same rows -> format("noop")
  streamlog_write_rps       the Parquet rows' key, value, timestamp -> df.write
                            .format("streamlog") into a new 2-partition stream, fsync=always
                            (executors stage Arrow files, the driver commits them)
  parquet_write_rps         the same DataFrame -> df.write.parquet (no fsync)
  noop_source_read_rps      the bound on any Python data source's read: a source whose
                            reader yields, for each of 2 partitions, N/2 rows of the
                            streamlog schema as pyarrow RecordBatches of BOUND_BATCH_ROWS
                            rows built once per Python worker (random keys and values of
                            the same sizes) -> format("noop")
  noop_sink_write_rps       the bound on any Python data sink's write: the DataFrame of
                            streamlog_write_rps -> a DataSourceArrowWriter whose write()
                            counts the Arrow batches and drops them (no commit work)
  durable_sink_write_rps    the same DataFrame -> the least a durable Python sink does:
                            each task writes the Arrow batches it gets to one file
                            (Arrow IPC, as they came) and fsyncs it and its directory;
                            no routing of rows, no commit
The Parquet source and sink run in the JVM; a Python source's rows cross from a Python
worker to the JVM as Arrow IPC, and a Python sink's the other way, so the no-op pair
measures what Spark's exchange with its Python workers leaves to us. Ratios:
read_vs_parquet, streamlog_read_vs_noop_source, noop_source_vs_parquet, and the same
three for the write (write_vs_parquet, streamlog_write_vs_noop_sink,
noop_sink_vs_parquet), and streamlog_write_vs_durable_sink, durable_sink_vs_noop_sink.
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
    DEFAULT_WORKDIR, Row, Target, add_ratios, attempt, fresh_dir, median, phase, progress,
    publish, rate, remove, timed)
from pyspark.sql.datasource import (  # noqa: E402
    DataSource, DataSourceArrowWriter, DataSourceReader, InputPartition, WriterCommitMessage)

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
BOUND_BATCH_ROWS = 65536  # the no-op source's batches: the log's batch_records_max


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
    import pyarrow as pa
    return _fixed_width(pa.binary(), blob[lo * width:hi * width], width, hi - lo)


def _fixed_width(kind, blob: bytes, width: int, rows: int):
    """An Arrow binary or string array of `rows` items of `width` bytes of `blob`."""
    import numpy as np
    import pyarrow as pa
    offsets = np.arange(0, (rows + 1) * width, width, dtype=np.int32)
    return pa.Array.from_buffers(kind, rows, [None, pa.py_buffer(offsets), pa.py_buffer(blob)])


# ---------------------------------------------------------------- the bounds

class NoopSource(DataSource):
    """format("streamlog_bench_noop"): read, the streamlog source's schema and row
    count (option rows, over PARTITIONS partitions) with none of its work; written, a
    sink that drops what it gets, or with the option path, writes it to files there
    durably (DurableWriter). Defined in the script, so Spark's cloudpickle carries it
    to the workers by value."""

    @classmethod
    def name(cls) -> str:
        return "streamlog_bench_noop"

    def schema(self):
        from spark_source._schema import spark_schema  # on the driver's planner only
        return spark_schema(include_headers=False)

    def reader(self, schema):
        return NoopReader(int(self.options["rows"]), schema)

    def writer(self, schema, overwrite: bool):
        if "path" in self.options:
            return DurableWriter(self.options["path"])
        return NoopWriter()


class NoopReader(DataSourceReader):
    def __init__(self, rows: int, schema) -> None:
        from pyspark.sql.pandas.types import to_arrow_schema
        self.rows = rows
        self.target = to_arrow_schema(schema, timezone="UTC")

    def partitions(self):
        share = self.rows // PARTITIONS
        return [InputPartition(self.rows - share * (PARTITIONS - 1) if number == 0 else share)
                for number in range(PARTITIONS)]

    def read(self, partition):
        rows = partition.value
        batch = _bound_batch(self.target)
        for start in range(0, rows, batch.num_rows):
            yield batch if start + batch.num_rows <= rows else batch.slice(0, rows - start)


def _bound_batch(target):
    """One batch of `target`, BOUND_BATCH_ROWS rows: a stream name, offsets, rising
    timestamps, random keys and values of KEY_BYTES and VALUE_BYTES. Built once per
    Python worker: Spark rebuilds this script's classes (carried by value) for every
    task, so the batch is kept on a module object of the worker's, which a reused
    worker keeps from task to task."""
    import types
    cache = sys.modules.setdefault("_streamlog_bench_bound", types.ModuleType("_bound"))
    if getattr(cache, "batch", None) is None or not cache.batch.schema.equals(target):
        cache.batch = _random_batch(target, BOUND_BATCH_ROWS)
    return cache.batch


def _random_batch(target, rows: int):
    import numpy as np
    import pyarrow as pa
    offsets = np.arange(rows, dtype=np.int64)
    rng = np.random.default_rng(1)
    arrays = [_fixed_width(pa.string(), STREAM.encode() * rows, len(STREAM), rows),
              pa.array(np.zeros(rows, dtype=np.int32)), pa.array(offsets),
              pa.array(1_700_000_000_000_000 + offsets * TS_STEP_US).cast(target[3].type),
              pa.array(np.zeros(rows, dtype=np.int32)),
              _fixed_width(pa.binary(), rng.bytes(rows * KEY_BYTES), KEY_BYTES, rows),
              _fixed_width(pa.binary(), rng.bytes(rows * VALUE_BYTES), VALUE_BYTES, rows)]
    return pa.RecordBatch.from_arrays(arrays, schema=target)


class NoopWriter(DataSourceArrowWriter):
    """Counts the Arrow batches Spark hands it and drops them; commits nothing."""

    def write(self, iterator):
        rows = 0
        for batch in iterator:
            rows += batch.num_rows
        return WriterCommitMessage()

    def commit(self, messages) -> None:
        assert all(message is not None for message in messages)


class DurableWriter(NoopWriter):
    """Writes the Arrow batches of a task, as they come, to one file in `directory`, and
    fsyncs the file and the directory; commits nothing."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def write(self, iterator):
        import uuid

        import pyarrow as pa
        os.makedirs(self.directory, exist_ok=True)
        with open(os.path.join(self.directory, uuid.uuid4().hex), "wb") as file:
            writer = None
            for batch in iterator:
                if writer is None:
                    writer = pa.ipc.new_file(file, batch.schema)
                writer.write_batch(batch)
            if writer is not None:
                writer.close()
            file.flush()
            os.fsync(file.fileno())
        handle = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(handle)
        finally:
            os.close(handle)
        return WriterCommitMessage()


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
    spark.dataSource.register(NoopSource)
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
    bound = spark.read.format(NoopSource.name()).option("rows", str(count))
    assert source.load().count() == count
    assert bound.load().count() == count
    assert bound.load().schema == source.load().schema
    assert spark.read.parquet(str(parquet_path)).count() == count
    results = interleaved(repeat, {
        "streamlog": lambda _: source.load().write.format("noop").mode("overwrite").save(),
        "noop source": lambda _: bound.load().write.format("noop").mode("overwrite").save(),
        "parquet": lambda _: (spark.read.parquet(str(parquet_path)).write.format("noop")
                              .mode("overwrite").save())})
    record(figures, "streamlog_read_rps", count, results["streamlog"])
    record(figures, "noop_source_read_rps", count, results["noop source"])
    record(figures, "parquet_read_rps", count, results["parquet"])


def measure_writes(spark, figures, workdir: Path, parquet_path: Path, count: int, repeat):
    rows = spark.read.parquet(str(parquet_path)).select("key", "value", "timestamp")

    def to_streamlog(run: int) -> None:
        (rows.write.format("streamlog").mode("append")
         .option("path", str(workdir / f"write-{run}.log"))
         .option("stream", "out").option("partitions", str(PARTITIONS)).save())

    def to_parquet(run: int) -> None:
        rows.write.mode("overwrite").parquet(str(workdir / f"write-{run}.parquet"))

    def to_noop_sink(_run: int) -> None:
        rows.write.format(NoopSource.name()).mode("append").save()

    def to_durable_sink(run: int) -> None:
        (rows.write.format(NoopSource.name()).mode("append")
         .option("path", str(workdir / f"durable-{run}")).save())

    results = interleaved(repeat, {"streamlog": to_streamlog, "noop sink": to_noop_sink,
                                   "durable sink": to_durable_sink, "parquet": to_parquet})
    record(figures, "streamlog_write_rps", count, results["streamlog"])
    record(figures, "noop_sink_write_rps", count, results["noop sink"])
    record(figures, "durable_sink_write_rps", count, results["durable sink"])
    record(figures, "parquet_write_rps", count, results["parquet"])
    for written in workdir.glob("durable-*"):
        remove(written)
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

    def pause(seconds: float) -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            if before_each is not None:
                before_each(0.005)
            else:
                time.sleep(0.005)

    def arrive(rows: int, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while arrived() < rows and time.monotonic() < deadline:
            pause(0.005)
        return arrived() >= rows

    time.sleep(3)  # the query's first (empty) trigger
    # A query slower to start than that takes `latest` after the warm-up record, which
    # it then never sees: another one every 5 s until one arrives, then a second for
    # any others to arrive before the count starts.
    deadline = time.monotonic() + 120
    while True:
        append(b"warm-up", 0)
        if arrive(1, 5):
            break
        if time.monotonic() > deadline:
            raise RuntimeError("no warm-up record arrived in 120 s")
    pause(1)
    reset()
    for i in range(count):
        append(b"%d" % i, i % PARTITIONS)
        pause(0.1)
    if not arrive(count, 60):
        raise RuntimeError(f"only {arrived()} of {count} rows arrived")


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
    Row("streamlog read", "streamlog_read_rps", "rows/s",
        {"vs parquet": "parquet_read_rps", "vs no-op": "noop_source_read_rps",
         "vs estimate": "estimate_read_rps"}),
    Row("no-op Python source read", "noop_source_read_rps", "rows/s",
        {"vs parquet": "parquet_read_rps"}),
    Row("parquet read", "parquet_read_rps", "rows/s"),
    Row("streamlog write (fsync always)", "streamlog_write_rps", "rows/s",
        {"vs parquet": "parquet_write_rps", "vs no-op": "noop_sink_write_rps",
         "vs estimate": "estimate_commit_rps"}),
    Row("no-op Python sink write", "noop_sink_write_rps", "rows/s",
        {"vs parquet": "parquet_write_rps"}),
    Row("durable no-op sink write", "durable_sink_write_rps", "rows/s",
        {"vs parquet": "parquet_write_rps", "vs no-op": "noop_sink_write_rps"}),
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
    Target("streamlog read >= 0.9x the no-op Python source",
           lambda f: f["streamlog_read_rps"] >= 0.9 * f["noop_source_read_rps"]),
    Target("streamlog write >= 0.9x the no-op Python sink",
           lambda f: f["streamlog_write_rps"] >= 0.9 * f["noop_sink_write_rps"]),
]
RATIOS = {
    "read_vs_parquet": ("streamlog_read_rps", "parquet_read_rps"),
    "streamlog_read_vs_noop_source": ("streamlog_read_rps", "noop_source_read_rps"),
    "noop_source_vs_parquet": ("noop_source_read_rps", "parquet_read_rps"),
    "write_vs_parquet": ("streamlog_write_rps", "parquet_write_rps"),
    "streamlog_write_vs_noop_sink": ("streamlog_write_rps", "noop_sink_write_rps"),
    "noop_sink_vs_parquet": ("noop_sink_write_rps", "parquet_write_rps"),
    "streamlog_write_vs_durable_sink": ("streamlog_write_rps", "durable_sink_write_rps"),
    "durable_sink_vs_noop_sink": ("durable_sink_write_rps", "noop_sink_write_rps"),
}


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
    add_ratios(figures, RATIOS)
    return figures, failures


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    figures, failures = run(args)
    publish("spark", figures, failures, ROWS, ["vs parquet", "vs no-op", "vs estimate"],
            TARGETS)


if __name__ == "__main__":
    main()
