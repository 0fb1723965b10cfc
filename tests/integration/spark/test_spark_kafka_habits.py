"""format("streamlog") as a user of Spark's Kafka source expects it: reads with nothing
to read, options checked at load(), subscribe / subscribePattern / assign,
isolationLevel, the timestampType column, minOffsetsPerTrigger, a catalog table, and
the offsets behind latest in a query's progress."""

from __future__ import annotations

import json
import time

import pytest
from spark_helpers import EPOCH_US, write_log

import streamlog

pytestmark = pytest.mark.slow

FUTURE_MS = 4_102_444_800_000  # 2100-01-01


def read(spark, path, **options):
    reader = spark.read.format("streamlog").option("path", str(path))
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def read_stream(spark, path, **options):
    reader = spark.readStream.format("streamlog").option("path", str(path))
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def drain(frame, name: str) -> list:
    query = (frame.writeStream.format("memory").queryName(name)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    assert query.exception() is None
    return query


def test_reads_with_nothing_to_read_return_no_rows(spark, tmp_path):
    empty, full = tmp_path / "empty", tmp_path / "full"
    with streamlog.open_log(empty) as log:
        log.create_stream("s", partitions=2)
    write_log(full, "s", {0: [(None, b"a", EPOCH_US)], 1: [(None, b"b", EPOCH_US)]})
    future = {"startingTimestamp": str(FUTURE_MS),
              "startingOffsetsByTimestampStrategy": "latest"}
    assert read(spark, empty, stream="s").count() == 0
    assert read(spark, empty, stream="s").collect() == []
    assert read(spark, full, stream="s", **future).count() == 0
    assert read(spark, full, stream="s",
                startingOffsets='{"s": {"0": 1, "1": 1}}').collect() == []
    assert read(spark, full, stream="s").count() == 2  # the same log, with a range
    for name, path, options in [("empty_earliest", empty, {"startingOffsets": "earliest"}),
                                ("full_latest", full, {"startingOffsets": "latest"}),
                                ("full_future", full, future)]:
        query = drain(read_stream(spark, path, stream="s", **options), name)
        assert spark.table(name).count() == 0, name
        assert query.lastProgress is None or query.lastProgress["numInputRows"] == 0


@pytest.mark.parametrize("options, message", [
    ({"maxOffsetPerTrigger": "5"}, "did you mean 'maxOffsetsPerTrigger'?"),
    ({"stream": "s", "subscribe": "s"}, "options 'stream' and 'subscribe' each choose"),
    ({"kafka.bootstrap.servers": "h:9092"}, "is a setting of Kafka's source or client"),
    ({"assign": "[0, 1]"}, "option 'assign' must be a JSON object"),
    ({"isolationLevel": "dirty"}, "must be read_committed or read_uncommitted"),
    ({"startingOffsets": "{bad"}, "option 'startingOffsets' must be earliest, latest or JSON"),
])
def test_bad_options_fail_at_load(spark, tmp_path, options, message):
    given = {"stream": "s", **options} if "subscribe" not in options and \
        "assign" not in options else options
    for kind in (read, read_stream):
        with pytest.raises(Exception) as excinfo:
            kind(spark, tmp_path / "nolog", **given)  # load() only: no action
        assert message in str(excinfo.value), kind
    with pytest.raises(Exception) as excinfo:
        read(spark, tmp_path / "nolog")
    assert "option 'stream' is required" in str(excinfo.value)


def test_subscribe_pattern_assign_isolation_and_timestamp_type(spark, tmp_path):
    path = tmp_path / "log"
    with streamlog.open_log(path, fsync="never") as log:
        for stream in ("clicks", "clicks_eu", "orders"):
            log.create_stream(stream, partitions=3)
            for number in range(3):
                log.append_batch_sync(stream, [b"%s-%d" % (stream.encode(), number)],
                                      partition=number, timestamps_us=[EPOCH_US])
        open_txn = log.new_txn_id()
        log.append_batch_sync("orders", [b"pending"], partition=0, txn_id=open_txn)

        def values(**options) -> list:
            return sorted(bytes(r.value) for r in read(spark, path, **options).collect())

        assert values(subscribe="clicks, orders") == values(stream="clicks,orders")
        assert values(subscribePattern="clicks.*") == sorted(
            b"clicks%s-%d" % (suffix, n) for suffix in (b"", b"_eu") for n in range(3))
        assert values(assign='{"orders": [0, 2], "clicks": [1]}') == [
            b"clicks-1", b"orders-0", b"orders-2"]
        assert b"pending" not in values(stream="orders")
        assert b"pending" in values(stream="orders", isolationLevel="read_uncommitted")
        assert b"pending" in values(stream="orders",
                                    **{"kafka.isolation.level": "read_uncommitted"})
        frame = read(spark, path, stream="orders")
        assert frame.schema["timestampType"].dataType.simpleString() == "int"
        assert {r.timestampType for r in frame.collect()} == {0}
        # a query written for Kafka's columns runs unchanged
        kafka_style = frame.selectExpr("CAST(value AS STRING) AS v", "timestamp",
                                       "timestampType", "offset", "partition")
        assert kafka_style.where("timestampType = 0").count() == 3
        with pytest.raises(Exception) as excinfo:
            read(spark, path, assign='{"orders": [7]}').collect()
        assert "option 'assign' names partitions that do not exist: orders/7" in str(
            excinfo.value)
        log.abort_txn("orders", 0, open_txn)


def test_create_table_then_select(spark, tmp_path):
    path = tmp_path / "log"
    write_log(path, "s", {0: [(b"k", b"v0", EPOCH_US)], 1: [(None, b"v1", EPOCH_US)]})
    spark.sql(f"CREATE TABLE sl_table USING streamlog OPTIONS (path '{path}', stream 's')")
    try:
        rows = spark.sql("SELECT partition, value, timestampType FROM sl_table").collect()
        assert sorted((r.partition, bytes(r.value), r.timestampType) for r in rows) == [
            (0, b"v0", 0), (1, b"v1", 0)]
        # the query's own options go over the table's
        only_first = spark.sql("SELECT value FROM sl_table WITH ('assign' = '{\"s\": [1]}')")
        assert [bytes(r.value) for r in only_first.collect()] == [b"v1"]
    finally:
        spark.sql("DROP TABLE IF EXISTS sl_table")
    with streamlog.open_log(path, readonly=True) as log:  # dropping the table kept the log
        assert log.end_offset("s", 0) == 1


def test_min_offsets_per_trigger_waits_for_rows_or_the_delay(spark, tmp_path):
    path = tmp_path / "log"
    write_log(path, "s", {0: [(None, b"a%d" % i, EPOCH_US) for i in range(3)]})
    frame = read_stream(spark, path, stream="s", startingOffsets="earliest",
                        minOffsetsPerTrigger="5", maxTriggerDelay="3s")
    started = time.monotonic()
    query = (frame.writeStream.format("memory").queryName("min_offsets")
             .trigger(processingTime="200 milliseconds").start())
    try:
        time.sleep(1.5)
        assert spark.table("min_offsets").count() == 0  # 3 < 5, and 3 s have not passed
        while spark.table("min_offsets").count() < 3 and time.monotonic() - started < 30:
            time.sleep(0.2)
        assert time.monotonic() - started >= 3.0
        assert spark.table("min_offsets").count() == 3
        with streamlog.open_log(path, fsync="never") as log:
            log.append_batch_sync("s", [b"b%d" % i for i in range(6)])
        while spark.table("min_offsets").count() < 9 and time.monotonic() - started < 30:
            time.sleep(0.2)
        assert spark.table("min_offsets").count() == 9
        progress = [p for p in query.recentProgress if p["numInputRows"] > 0][-1]
        (source,) = progress["sources"]
        # offsets behind latest per partition: latestOffset - endOffset (here none)
        assert json.loads(source["latestOffset"]) == {"s": {"0": 9}}
        assert json.loads(source["endOffset"]) == {"s": {"0": 9}}
    finally:
        query.stop()
