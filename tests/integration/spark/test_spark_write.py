"""df.write / writeStream to format("streamlog"): column mapping, routing, refusals."""

from __future__ import annotations

import datetime as dt

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, StringType, StructField,
                               StructType, TimestampType)
from spark_helpers import EPOCH_US

import streamlog

pytestmark = pytest.mark.slow

UTC = dt.timezone.utc
SCHEMA = StructType([StructField("key", StringType()), StructField("value", BinaryType()),
                     StructField("timestamp", TimestampType()),
                     StructField("partition", IntegerType()),
                     StructField("extra", StringType())])


def at(micros: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(micros / 1e6, UTC)


def save(frame, path, stream="out", **options):
    writer = (frame.write.format("streamlog").mode("append").option("path", str(path))
              .option("stream", stream))
    for name, value in options.items():
        writer = writer.option(name, value)
    writer.save()


def records(path, stream="out", **reader_options) -> dict[int, list]:
    with streamlog.open_log(path, readonly=True) as log:
        return {n: list(log.reader(stream, n, **reader_options))
                for n in range(log.partition_count(stream))}


def test_batch_write_maps_columns_and_routes_rows(spark, tmp_path):
    rows = [("a", b"v1", at(EPOCH_US + 5), 2, "x"),      # partition given
            ("b", b"v2", at(EPOCH_US + 1), None, "x"),   # routed by key
            (None, b"v3", None, None, "x"),              # routed by value, staged time
            ("c", b"", at(EPOCH_US - 7), 0, "x")]
    frame = spark.createDataFrame(rows, SCHEMA).coalesce(1)
    save(frame, tmp_path / "log", partitions="3")
    found = records(tmp_path / "log")
    placed = {r.value: (n, r) for n, part in found.items() for r in part}
    assert sorted(placed) == [b"", b"v1", b"v2", b"v3"]
    assert placed[b"v1"][0] == 2 and placed[b""][0] == 0
    assert placed[b"v2"][0] == streamlog.partition_for_key(b"b", 3)
    assert placed[b"v3"][0] == streamlog.partition_for_key(b"v3", 3)
    assert placed[b"v1"][1].key == b"a" and placed[b"v3"][1].key is None
    assert placed[b"v1"][1].timestamp_us == EPOCH_US + 5
    assert placed[b""][1].timestamp_us == EPOCH_US - 7
    assert placed[b"v3"][1].timestamp_us > EPOCH_US  # no timestamp: the time of writing
    assert all(r.kind == streamlog.RecordKind.DATA for part in found.values() for r in part)


def test_batch_write_then_read_round_trip_with_headers(spark, tmp_path):
    source = tmp_path / "in"
    with streamlog.open_log(source) as log:
        log.create_stream("in", partitions=2)
        for number in range(2):
            # tombstones (None values) and None header values go through as nulls
            log.append_batch_sync("in", [None if i % 5 == 0 else b"%d-%d" % (number, i)
                                         for i in range(200)],
                                  keys=[b"k%d" % i for i in range(200)], partition=number,
                                  timestamps_us=[EPOCH_US + i for i in range(200)],
                                  headers=[{"n": b"%d" % i, "t": None if i % 7 == 0 else b""}
                                           for i in range(200)])
    frame = (spark.read.format("streamlog").option("path", str(source)).option("stream", "in")
             .option("includeHeaders", "true").load())
    save(frame, tmp_path / "copy", partitions="2")  # keeps each row's partition
    copied = records(tmp_path / "copy")
    original = records(source, "in")
    for number in range(2):
        assert [(r.key, r.value, r.timestamp_us, r.headers) for r in copied[number]] == [
            (r.key, r.value, r.timestamp_us, r.headers) for r in original[number]]
        assert [r.value for r in copied[number]].count(None) == 40
        assert [r.headers[1][1] for r in copied[number]].count(None) == 29
    # Data rows are committed under a transaction: one commit record per partition.
    with streamlog.open_log(tmp_path / "copy", readonly=True) as log:
        assert [log.end_offset("out", n) for n in range(2)] == [201, 201]


def test_string_values_are_utf8(spark, tmp_path):
    frame = spark.createDataFrame([("ключ", "значение")], "key string, value string")
    save(frame, tmp_path / "log")
    (record,) = records(tmp_path / "log")[0]
    assert (record.key, record.value) == ("ключ".encode(), "значение".encode())


def test_overwrite_and_complete_mode_are_refused(spark, tmp_path):
    frame = spark.createDataFrame([("v",)], "value string")
    with pytest.raises(Exception) as excinfo:
        (frame.write.format("streamlog").mode("overwrite").option("path", str(tmp_path / "l"))
         .option("stream", "out").save())
    assert "a log is append-only" in str(excinfo.value)
    counts = (spark.readStream.format("rate").option("rowsPerSecond", 1).load()
              .groupBy().count().select(F.col("count").cast("string").alias("value")))
    query = (counts.writeStream.format("streamlog").outputMode("complete")
             .option("path", str(tmp_path / "l")).option("stream", "out")
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    with pytest.raises(Exception) as excinfo:
        query.awaitTermination(60)
    assert "complete output mode" in str(excinfo.value)


@pytest.mark.parametrize("ddl, rows, message", [
    ("key string", [("k",)], "needs a 'value' column"),
    ("value string, timestamp long", [("v", 1)], "timestamp_micros(col)"),
    ("value int", [(1,)], "column 'value' is int"),
    ("value string, partition int", [("v", 5)], "holds partition 5"),
    ("value string, headers array<string>", [("v", ["h"])], "for headers"),
])
def test_bad_columns_give_clear_errors(spark, tmp_path, ddl, rows, message):
    frame = spark.createDataFrame(rows, ddl)
    with pytest.raises(Exception) as excinfo:
        save(frame, tmp_path / "log", partitions="2")
    assert message in str(excinfo.value)


def test_partition_count_must_match_an_existing_stream(spark, tmp_path):
    with streamlog.open_log(tmp_path / "log") as log:
        log.create_stream("out", partitions=2)
    frame = spark.createDataFrame([("v",)], "value string")
    with pytest.raises(Exception) as excinfo:
        save(frame, tmp_path / "log", partitions="3")
    assert "has 2 partitions, not 3" in str(excinfo.value)


def test_a_commit_shares_the_log_this_process_has_open(spark, tmp_path):
    """The driver holds the log open for writing itself: the commit uses that Log
    (one per directory and process) and leaves it open."""
    path = tmp_path / "log"
    frame = spark.createDataFrame([("v",)], "value string")
    save(frame, path)  # creates the log and the stream
    with streamlog.open_log(path) as log:
        log.append_sync("out", b"mine", partition=0)
        save(frame, path, lockTimeoutMs="300")
        assert not log.closed
        log.append_sync("out", b"mine again", partition=0)
    assert sorted(r.value for p in records(path).values() for r in p) == [
        b"mine", b"mine again", b"v", b"v"]
    assert not list((path / "staging").iterdir())


def test_headers_column_from_spark_types(spark, tmp_path):
    schema = StructType([StructField("value", BinaryType()), StructField(
        "headers", ArrayType(StructType([StructField("key", StringType()),
                                         StructField("value", StringType())])))])
    frame = spark.createDataFrame([(b"v", [("a", "1"), ("b", None)]), (b"w", None)], schema)
    save(frame.coalesce(1), tmp_path / "log")
    found = records(tmp_path / "log")[0]
    assert [(r.value, r.headers) for r in found] == [
        (b"v", (("a", b"1"), ("b", None))), (b"w", ())]  # a null header value stays None
