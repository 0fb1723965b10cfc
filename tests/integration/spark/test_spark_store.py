"""format("streamlog") over a log in an object store (s3://BUCKET/PREFIX): batch and
streaming reads whose Python workers read the store themselves (spark_source/_store.py),
against Ceph's RADOS Gateway on loopback (the s3_server fixture).

The log is written and tiered in this process; only its sealed segments go up, so
every read from the store is compared with the local log read up to each partition's
remote committed offset. The Spark session is the shared one (conftest.py), which may
have started before these tests: its Python workers get the AWS_* variables through the
session's environment for Python functions, which a source registered with
spark_source.register() takes (`workers_env`).

Grouping: like every test under integration/spark/, these run in xdist group "spark"
(tests/conftest.py), one JVM at a time. They are not also marked xdist_group("s3"):
pytest-xdist 3.8 joins an item's groups into one name ("s3_spark"), a group of its
own that could run beside the Spark group's JVM; the s3_server fixture is shared
between workers in any case.
"""

from __future__ import annotations

import contextlib
import socket

import pytest
from pyspark.sql import functions as F
from spark_helpers import EPOCH_US, spark_error_text

import spark_source
import streamlog
from spark_source import _store
from spark_source._batch import BatchReader
from spark_source._options import parse_source_options
from spark_source._plan import OffsetRange, cut_at, split_ranges
from spark_source._schema import spark_schema

pytestmark = pytest.mark.slow

SEGMENT_BYTES = 4096
ROW = ["stream", "partition", "offset", "timestamp", "timestampType", "key", "value"]


# -- the log, in the store and here ---------------------------------------------------

def tiered_log(path, s3_server, partitions: int = 2):
    """(writer, url): a log at `path` tiered to a fresh prefix, rounds by hand only."""
    url = s3_server.url(s3_server.new_prefix())
    log = streamlog.open_log(path, remote=url, storage_options=s3_server.storage_options,
                             segment_bytes_max=SEGMENT_BYTES, fsync="never")
    log.tiering.close()
    log.create_stream("s", partitions)
    return log, url


def fill(log, count: int, start: int = 0, partitions: int = 2) -> None:
    """Records whose timestamps go back now and then (the high-water mark differs
    from the timestamp), some without a key."""
    for i in range(start, start + count):
        back = 4000 if i % 9 == 4 else 0
        log.append_sync("s", b"%05d" % i + b"." * 100, partition=i % partitions,
                        key=None if i % 5 == 0 else b"k%d" % (i % 7),
                        timestamp_us=EPOCH_US + 1000 * i - back)


def upload(log) -> list[int]:
    """One tiering round; each partition's remote committed end after it."""
    log.tiering.run_once()
    parts = log.info()["streams"]["s"]["partitions"]
    return [part["remote_committed_offset"] for part in parts]


def segment_objects(url, s3_server) -> dict[str, int]:
    """{"s/n": number of segment objects} of the newest generation."""
    with streamlog.open_log(url, storage_options=s3_server.storage_options) as view:
        manifest = view.remote_view.fs.manifest
        return {name: len(part.segments) for name, part in manifest.partitions.items()}


def local_rows(log, bounds: dict[int, dict], **options) -> list[tuple]:
    """The local log's own reader: (partition, offset, timestamp_us, key, value)."""
    return [(n, r.offset, r.timestamp_us, r.key, r.value)
            for n, reader_bounds in sorted(bounds.items())
            for r in log.reader("s", n, **reader_bounds, **options)]


def spark_tuples(frame) -> list[tuple]:
    """The same five columns of a DataFrame's rows, in the order Spark returns them."""
    rows = frame.select("partition", "offset", F.unix_micros("timestamp").alias("us"),
                        "key", "value").collect()
    return [(r.partition, r.offset, r.us, None if r.key is None else bytes(r.key),
             bytes(r.value)) for r in rows]


def whole_rows(frame) -> list[tuple]:
    return [tuple(row) for row in frame.select(*ROW).collect()]


def read(spark, path, **options):
    reader = spark.read.format("streamlog").option("stream", "s")
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load(str(path))


def below(frame, ends: list[int]):
    """Rows of `frame` below each partition's end (what the store has of a local log)."""
    condition = F.lit(False)
    for number, end in enumerate(ends):
        condition = condition | ((F.col("partition") == number) & (F.col("offset") < end))
    return frame.where(condition)


@contextlib.contextmanager
def workers_env(spark, env: dict[str, str]):
    """Spark's Python workers (the driver's planners and the executors' readers) see
    `env` while inside: the session's environment for Python functions, which
    format("streamlog") takes when registered again. Restored (and registered again)
    after."""
    environment = spark.sparkContext.environment
    saved = {name: environment.get(name) for name in env}
    environment.update(env)
    spark_source.register(spark)
    try:
        yield spark
    finally:
        for name, value in saved.items():
            if value is None:
                environment.pop(name, None)
            else:
                environment[name] = value
        spark_source.register(spark)


@pytest.fixture
def store_spark(spark, s3_server):
    """The session, its Python workers pointed at the store by the AWS_* variables."""
    with workers_env(spark, s3_server.env):
        yield spark


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then let go)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# -- batch reads ------------------------------------------------------------------------

def test_a_batch_read_from_the_store_equals_the_local_read(store_spark, s3_server, tmp_path):
    spark = store_spark
    log, url = tiered_log(tmp_path / "log", s3_server)
    try:
        fill(log, 600)
        ends = upload(log)
        assert all(0 < end < log.end_offset("s", n) for n, end in enumerate(ends))
        objects = segment_objects(url, s3_server)
        assert min(objects.values()) >= 3
        from_store = read(spark, url)
        # One split per segment object (the ranges cover every object whole).
        assert from_store.rdd.getNumPartitions() == sum(objects.values())
        expected = local_rows(log, {n: {"to_offset": end} for n, end in enumerate(ends)})
        assert spark_tuples(from_store) == expected  # the same order within a partition
        # Every column, row for row, as Spark reads the local log (schema included).
        local = below(read(spark, tmp_path / "log"), ends)
        assert from_store.schema == local.schema
        assert whole_rows(from_store) == whole_rows(local)

        # More goes up; the executors' Python workers (kept views) see the new
        # generation, and the same plan reads it.
        fill(log, 300, start=600)
        later = upload(log)
        assert all(b > a for a, b in zip(ends, later))
        again = (spark.read.format("streamlog").option("path", url)  # the path option
                 .option("stream", "s").load())
        assert spark_tuples(again) == local_rows(
            log, {n: {"to_offset": end} for n, end in enumerate(later)})
    finally:
        log.close()


def test_time_bounded_reads_equal_the_local_ones(store_spark, s3_server, tmp_path):
    spark = store_spark
    log, url = tiered_log(tmp_path / "log", s3_server)
    try:
        fill(log, 600)
        ends = upload(log)
        start_ms, end_ms = EPOCH_US // 1000 + 101, EPOCH_US // 1000 + 420
        options = {"startingTimestamp": str(start_ms), "endingTimestamp": str(end_ms)}
        from_store = spark_tuples(read(spark, url, **options))
        bounds = {}
        for n, end in enumerate(ends):
            first = log.offset_for_timestamp("s", n, start_ms * 1000)
            last = min(log.offset_for_timestamp("s", n, end_ms * 1000), end)
            assert 0 < first < last <= end
            bounds[n] = {"from_offset": first, "to_offset": last}
        assert from_store == local_rows(log, bounds)
        local = below(read(spark, tmp_path / "log", **options), ends)
        assert whole_rows(read(spark, url, **options)) == whole_rows(local)
    finally:
        log.close()


def test_read_committed_and_uncommitted_equal_the_local_reads(store_spark, s3_server,
                                                              tmp_path):
    """Transactions committed and aborted, and one still open whose records went up in
    a sealed segment: read_committed stops at it in the store as here."""
    spark = store_spark
    log, url = tiered_log(tmp_path / "log", s3_server, partitions=1)
    try:
        fill(log, 40, partitions=1)
        for k, end_txn in enumerate((log.commit_txn, log.abort_txn, None)):
            txn = log.new_txn_id()
            log.append_batch_sync("s", [b"t%d-%02d" % (k, i) + b"." * 100 for i in range(20)],
                                  partition=0, txn_id=txn)
            fill(log, 20, start=100 + 20 * k, partitions=1)  # beside the transaction
            if end_txn is not None:
                end_txn("s", 0, txn)
        open_from = log.last_stable_offset("s", 0)
        fill(log, 100, start=300, partitions=1)  # seals the open one's segment
        (end,) = upload(log)
        assert 0 < open_from < end
        committed = spark_tuples(read(spark, url))
        assert committed == local_rows(log, {0: {"to_offset": open_from}})
        assert committed == spark_tuples(read(spark, tmp_path / "log"))
        assert any(value.startswith(b"t") for *_, value in committed)  # a commit's
        uncommitted = spark_tuples(read(spark, url, isolationLevel="read_uncommitted"))
        assert uncommitted == local_rows(log, {0: {"to_offset": end}}, read_committed=False)
        assert len(uncommitted) > len(committed)
    finally:
        log.close()


def test_storage_options_reach_the_driver_and_every_executor(spark, s3_server, tmp_path):
    """The workers' AWS_* variables point nowhere; the storage.* options name the store,
    so the read can only work if they travel with the plan."""
    log, url = tiered_log(tmp_path / "log", s3_server)
    try:
        fill(log, 300)
        ends = upload(log)
        nowhere = {**s3_server.env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{closed_port()}",
                   "AWS_SECRET_ACCESS_KEY": "wrong"}
        options = {f"storage.{name}": value for name, value in s3_server.storage_options.items()}
        with workers_env(spark, nowhere):
            frame = read(spark, url, **options)
            assert frame.rdd.getNumPartitions() == sum(segment_objects(url, s3_server).values())
            assert spark_tuples(frame) == local_rows(
                log, {n: {"to_offset": end} for n, end in enumerate(ends)})
    finally:
        log.close()


@pytest.fixture
def executor_here():
    """Splits read in this process, as an executor's Python worker reads them; the
    views it keeps are closed after."""
    yield
    while _store._views:
        _, view = _store._views.popitem()
        view.close()


def read_here(reader: BatchReader, splits) -> list[tuple]:
    """(partition, offset, value) of what `reader.read` yields for each split."""
    out = []
    for split in splits:
        for batch in reader.read(split):
            columns = batch.to_pydict()
            out += zip(columns["partition"], columns["offset"], columns["value"])
    return out


def test_a_plan_reads_the_same_rows_from_a_newer_generation(s3_server, tmp_path,
                                                            executor_here):
    """Planned from one generation, read after the next went up: exactly the planned
    rows, since each split carries exact offsets. No Spark: the reader's own calls."""
    log, url = tiered_log(tmp_path / "log", s3_server)
    try:
        fill(log, 300)
        ends = upload(log)
        options = {"path": url, "stream": "s", **{
            f"storage.{name}": value for name, value in s3_server.storage_options.items()}}
        reader = BatchReader(parse_source_options(options, streaming=False),
                             spark_schema(False))
        splits = reader.partitions()
        generation = splits[0].generation
        assert generation > 0 and {split.generation for split in splits} == {generation}
        assert [(split.partition, split.start) for split in splits] == sorted(
            (split.partition, split.start) for split in splits)
        fill(log, 300, start=300)
        later = upload(log)
        assert all(b > a for a, b in zip(ends, later))
        expected = [(n, offset, value) for n, offset, _, _, value in local_rows(
            log, {n: {"to_offset": end} for n, end in enumerate(ends)})]
        assert read_here(reader, splits) == expected
        (view,) = _store._views.values()
        assert _store.generation_of(view) > generation  # read from the newer one
        # An executor that finds only older generations than planned says so.
        ahead = OffsetRange(url, "s", 0, 0, 1, False, True, True,
                            splits[0].storage_options, generation + 1000)
        with pytest.raises(streamlog.StreamLogError, match="older than generation"):
            read_here(reader, [ahead])
    finally:
        log.close()


# -- streaming --------------------------------------------------------------------------

def stream_to_log(spark, url, target, checkpoint, **options):
    """An availableNow query from the store into the stream "out" of the local log at
    `target` (the same partition numbers), exactly once across runs."""
    reader = (spark.readStream.format("streamlog").option("path", url).option("stream", "s")
              .option("startingOffsets", "earliest"))
    for option, value in options.items():
        reader = reader.option(option, value)
    query = (reader.load().select("partition", "key", "value", "timestamp")
             .writeStream.format("streamlog").option("path", str(target))
             .option("stream", "out").option("partitions", "2")
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
             .start())
    query.awaitTermination()
    assert query.exception() is None
    return query


def written(target, starts=(0, 0)) -> list[tuple]:
    """(partition, timestamp_us, key, value) of stream "out" from offsets `starts`,
    sorted: a micro-batch's splits of one partition commit in any order."""
    with streamlog.open_log(target, readonly=True) as log:
        return sorted(((n, r.timestamp_us, r.key, r.value) for n in (0, 1)
                       for r in log.reader("out", n, from_offset=starts[n])), key=by_value)


def ends_of(target) -> list[int]:
    with streamlog.open_log(target, readonly=True) as log:
        return [log.end_offset("out", n) for n in (0, 1)]


def without_offsets(rows) -> list[tuple]:
    return sorted(((n, us, key, value) for n, _, us, key, value in rows), key=by_value)


def by_value(row: tuple):
    """Partition, then value (each record's value is its own; keys may be None)."""
    return row[0], row[-1]


def memory_tuples(spark, name: str) -> list[tuple]:
    return sorted(spark_tuples(spark.table(name)))


def test_a_stream_reads_exactly_what_each_upload_adds(store_spark, s3_server, tmp_path):
    spark = store_spark
    log, url = tiered_log(tmp_path / "log", s3_server)
    target, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    try:
        fill(log, 400)
        ends = upload(log)
        query = stream_to_log(spark, url, target, checkpoint, maxOffsetsPerTrigger="150")
        assert len([p for p in query.recentProgress if p["numInputRows"]]) >= 2
        assert written(target) == without_offsets(
            local_rows(log, {n: {"to_offset": end} for n, end in enumerate(ends)}))
        first_run = ends_of(target)
        fill(log, 300, start=400)
        later = upload(log)
        assert all(b > a for a, b in zip(ends, later))
        stream_to_log(spark, url, target, checkpoint)  # the same checkpoint: resumes
        assert written(target, first_run) == without_offsets(local_rows(
            log, {n: {"from_offset": a, "to_offset": b}
                  for n, (a, b) in enumerate(zip(ends, later))}))
        assert len(written(target)) == sum(later)  # nothing twice, nothing left out
    finally:
        log.close()


def test_a_running_query_takes_in_each_new_generation(store_spark, s3_server, tmp_path):
    """One query, one driver view: each trigger refreshes it to the newest generation."""
    spark = store_spark
    log, url = tiered_log(tmp_path / "log", s3_server)
    query = None
    try:
        fill(log, 300)
        ends = upload(log)
        query = (spark.readStream.format("streamlog").option("path", url)
                 .option("stream", "s").option("startingOffsets", "earliest").load()
                 .writeStream.format("memory").queryName("store_running")
                 .option("checkpointLocation", str(tmp_path / "checkpoint"))
                 .trigger(processingTime="500 milliseconds").start())
        query.processAllAvailable()
        assert memory_tuples(spark, "store_running") == sorted(
            local_rows(log, {n: {"to_offset": end} for n, end in enumerate(ends)}))
        fill(log, 300, start=300)
        later = upload(log)
        query.processAllAvailable()
        rows = memory_tuples(spark, "store_running")
        assert rows == sorted(local_rows(log, {n: {"to_offset": end}
                                               for n, end in enumerate(later)}))
        assert len(set(rows)) == len(rows)
        assert query.exception() is None
    finally:
        if query is not None:
            query.stop()
        log.close()


# -- errors -----------------------------------------------------------------------------

def test_a_prefix_with_no_log_is_named(store_spark, s3_server):
    url = s3_server.url(s3_server.new_prefix())
    with pytest.raises(Exception) as excinfo:
        read(store_spark, url).collect()
    text = spark_error_text(excinfo)
    assert f"no log at {url}" in text and "option 'path'" in text


def test_an_unreachable_store_is_named(store_spark, s3_server, tmp_path):
    url = s3_server.url(s3_server.new_prefix())
    with pytest.raises(Exception) as excinfo:
        read(store_spark, url, **{"storage.endpoint": f"http://127.0.0.1:{closed_port()}"}
             ).collect()
    text = spark_error_text(excinfo)
    assert f"cannot reach the object store of {url} (option 'path')" in text
    assert "storage.endpoint" in text and "AWS_ENDPOINT_URL" in text


def test_a_store_that_refuses_is_named(store_spark, s3_server):
    url = s3_server.url(s3_server.new_prefix())
    with pytest.raises(Exception) as excinfo:
        read(store_spark, url, **{"storage.secret_access_key": "wrong"}).collect()
    text = spark_error_text(excinfo)
    assert f"the object store of {url} (option 'path') refused" in text
    assert "403" in text


def test_a_store_path_is_read_only_for_spark(store_spark, s3_server):
    url = s3_server.url(s3_server.new_prefix())
    frame = store_spark.createDataFrame([(b"v",)], "value binary")
    with pytest.raises(Exception) as excinfo:
        frame.write.format("streamlog").mode("append").option("stream", "s").save(url)
    assert "reads but does not write" in spark_error_text(excinfo)


@pytest.mark.parametrize("options, message", [
    ({"path": "s3://"}, "is not a log in an object store"),
    ({"path": "s3://bucket/p?region=x"}, "is not a log in an object store"),
    ({"path": "s3a://bucket/p"}, "Hadoop's file systems"),
    ({"path": "s3://bucket/p", "fs.s3a.endpoint": "http://x"}, "Hadoop's S3 file system"),
    ({"path": "/data/log", "storage.endpoint": "http://x"}, "options storage.* configure"),
    ({"path": "s3://bucket/p", "storage.": "x"}, "unknown option 'storage.'"),
])
def test_bad_store_options_are_refused_at_load(options, message):
    with pytest.raises(streamlog.InvalidArgument) as excinfo:
        parse_source_options({"stream": "s", **options}, streaming=False)
    assert message in str(excinfo.value)


# -- the rules, without Spark -----------------------------------------------------------

def test_store_options_are_kept_and_never_shown():
    options = parse_source_options({"path": "s3://bucket/p", "stream": "s",
                                    "STORAGE.Secret_Access_Key": "hush",
                                    "storage.endpoint": "http://h:1"}, streaming=False)
    assert options.storage_options == (("endpoint", "http://h:1"),
                                       ("secret_access_key", "hush"))
    split = OffsetRange("s3://bucket/p", "s", 0, 0, 5, False, True, True,
                        options.storage_options, 7)
    assert "hush" not in repr(options) and "hush" not in repr(split)
    local = parse_source_options({"path": "/data/log", "stream": "s"}, streaming=False)
    assert local.storage_options == ()


def test_ranges_are_cut_where_segment_objects_begin():
    a, b = ("s", 0), ("s", 1)
    ranges = [(a, 0, 100), (b, 40, 90), (("t", 0), 5, 5)]
    bases = {a: (0, 30, 60, 90), b: (0, 25, 50, 75, 100)}
    assert cut_at(ranges, bases) == [(a, 0, 30), (a, 30, 60), (a, 60, 90), (a, 90, 100),
                                     (b, 40, 50), (b, 50, 75), (b, 75, 90),
                                     (("t", 0), 5, 5)]
    assert cut_at(ranges, {}) == ranges  # a local log: no cut
    pieces = split_ranges(cut_at(ranges, bases), min_partitions=None, max_records=20,
                          cores=2)
    assert all(end - start <= 20 for _, start, end in pieces)
    assert [(k, s, e) for k, s, e in pieces if k == b] == [(b, 40, 50), (b, 50, 62),
                                                           (b, 62, 75), (b, 75, 90)]
