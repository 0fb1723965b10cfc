"""spark.read.format("streamlog"): registration, schema, ranges, splits, errors."""

from __future__ import annotations

import random

import pytest
from pyspark.sql import functions as F
from spark_helpers import AUTO_REGISTRATION, EPOCH_US, write_log

import spark_source
import streamlog

pytestmark = pytest.mark.slow

COLUMNS = ["stream", "partition", "offset", "micros", "key", "value"]


def sample_rows(seed: int, counts=(500, 300)) -> dict[int, list[tuple]]:
    """Per partition: keys (some None), values of varied length (some empty), and
    timestamps that go backwards now and then."""
    rng = random.Random(seed)
    rows = {}
    for number, count in enumerate(counts):
        rows[number] = [(None if rng.random() < 0.2 else b"k%d" % rng.randrange(50),
                         rng.randbytes(rng.randrange(0, 40)),
                         EPOCH_US + i * 1000 + rng.randrange(-3000, 3000))
                        for i in range(count)]
    return rows


def spark_rows(frame) -> list[tuple]:
    out = frame.select("stream", "partition", "offset",
                       F.unix_micros("timestamp").alias("micros"), "key", "value").collect()
    return sorted((r.stream, r.partition, r.offset, r.micros,
                   None if r.key is None else bytes(r.key), bytes(r.value)) for r in out)


def log_rows(path, stream: str, bounds: dict | None = None) -> list[tuple]:
    """What the log's own reader gives for {partition: reader bounds}."""
    out = []
    with streamlog.open_log(path, readonly=True) as log:
        for number in range(log.partition_count(stream)):
            per = (bounds or {}).get(number, {})
            with log.reader(stream, number, **per) as reader:
                out += [(stream, number, r.offset, r.timestamp_us, r.key, r.value)
                        for r in reader]
    return sorted(out)


def load(spark, path, stream="events", **options):
    reader = spark.read.format("streamlog").option("path", str(path)).option("stream", stream)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def test_format_streamlog_works_with_no_register_call(spark):
    # The session fixture read a log before anything could call register().
    assert AUTO_REGISTRATION.get("error") is None, AUTO_REGISTRATION
    assert AUTO_REGISTRATION["rows"] == [("probe", 0, b"x")]


def test_explicit_register_works_too(spark, tmp_path):
    write_log(tmp_path / "log", "events", {0: [(b"k", b"v", EPOCH_US)]})
    spark_source.register(spark)
    rows = load(spark, tmp_path / "log").collect()
    assert [(r.key, r.value) for r in rows] == [(b"k", b"v")]


def test_schema_and_arrow_types(spark, tmp_path):
    write_log(tmp_path / "log", "events", {0: [(None, b"v", EPOCH_US)]})
    with streamlog.open_log(tmp_path / "log") as log:  # a tombstone: value None, not b""
        log.append_batch_sync("events", [None, b""], headers=[{"h": None}, None])
    frame = load(spark, tmp_path / "log")
    assert frame.schema.simpleString() == ("struct<stream:string,partition:int,offset:bigint,"
                                           "timestamp:timestamp,timestampType:int,key:binary,"
                                           "value:binary>")
    assert [f.nullable for f in frame.schema.fields] == [False, False, False, False, False,
                                                         True, True]
    rows = frame.orderBy("offset").collect()
    assert [None if r.value is None else bytes(r.value) for r in rows] == [b"v", None, b""]
    with_headers = load(spark, tmp_path / "log", includeHeaders="true").orderBy("offset")
    assert with_headers.schema.fieldNames()[-1] == "headers"
    headers = [r.headers for r in with_headers.collect()]
    assert headers[0] is None and headers[2] is None
    assert [(h.key, h.value) for h in headers[1]] == [("h", None)]


def test_batch_read_returns_every_data_record_exactly(spark, tmp_path):
    path = tmp_path / "log"
    write_log(path, "events", sample_rows(1))
    got = spark_rows(load(spark, path))
    assert len(got) == 800
    assert got == log_rows(path, "events")


def test_offsets_json_bounds(spark, tmp_path):
    path = tmp_path / "log"
    write_log(path, "events", sample_rows(2))
    frame = load(spark, path, startingOffsets='{"events": {"0": 10, "1": -2}}',
                 endingOffsets='{"events": {"0": 25, "1": -1}}')
    got = spark_rows(frame)
    assert got == log_rows(path, "events", {0: {"from_offset": 10, "to_offset": 25}})
    assert [r[2] for r in got if r[1] == 0] == list(range(10, 25))
    assert len([r for r in got if r[1] == 1]) == 300


def test_timestamp_bounds_follow_the_high_water_mark(spark, tmp_path):
    path = tmp_path / "log"
    write_log(path, "events", sample_rows(3))
    start_ms, end_ms = EPOCH_US // 1000 + 100, EPOCH_US // 1000 + 250
    got = spark_rows(load(spark, path, startingTimestamp=str(start_ms),
                          endingTimestamp=str(end_ms)))
    bounds = {"from_timestamp_us": start_ms * 1000, "to_timestamp_us": end_ms * 1000}
    expected = log_rows(path, "events", {0: bounds, 1: bounds})
    assert got == expected
    # Out-of-order timestamps: some rows inside the range are older than its start.
    assert any(r[3] < start_ms * 1000 for r in got)
    by_partition = load(spark, path, startingOffsetsByTimestamp=(
        '{"events": {"0": %d, "1": %d}}' % (start_ms, end_ms)))
    expected = log_rows(path, "events", {0: {"from_timestamp_us": start_ms * 1000},
                                         1: {"from_timestamp_us": end_ms * 1000}})
    assert spark_rows(by_partition) == expected


def test_control_records_and_uncommitted_data_never_appear(spark, tmp_path):
    path = tmp_path / "log"
    with streamlog.open_log(path) as log:
        log.create_stream("events")
        log.append_batch_sync("events", [b"plain-1"])
        committed = log.new_txn_id()
        log.append_batch_sync("events", [b"txn-a", b"txn-b"], txn_id=committed)
        aborted = log.new_txn_id()
        log.append_batch_sync("events", [b"aborted"], txn_id=aborted)
        log.abort_txn("events", 0, aborted)
        log.commit_txn("events", 0, committed, tag="t", marker=b"1")
        log.append_batch_sync("events", [b"plain-2"])
        assert log.end_offset("events", 0) == 7
    values = [bytes(r.value) for r in load(spark, path).orderBy("offset").collect()]
    assert values == [b"plain-1", b"txn-a", b"txn-b", b"plain-2"]


def test_open_transaction_is_not_read_past(spark, tmp_path):
    """A reader must stop at an open transaction (the last stable offset): rows after it
    are not shown until it ends, so a plan must not claim them."""
    path = tmp_path / "log"
    with streamlog.open_log(path) as log:
        log.create_stream("events")
        log.append_batch_sync("events", [b"before"])
        log.append_batch_sync("events", [b"pending"], txn_id=log.new_txn_id())
        log.append_batch_sync("events", [b"after"])
        # Still open while Spark reads: the writer process is this one.
        values = [bytes(r.value) for r in load(spark, path).collect()]
        assert values == [b"before"]


def test_several_streams_in_one_read(spark, tmp_path):
    path = tmp_path / "log"
    write_log(path, "a", {0: [(None, b"a0", EPOCH_US)], 1: [(None, b"a1", EPOCH_US)]})
    with streamlog.open_log(path) as log:
        log.create_stream("b")
        log.append_batch_sync("b", [b"b0", b"b1"])
    frame = load(spark, path, stream="a,b", endingOffsets='{"a": {"0": -1, "1": -1}, '
                                                         '"b": {"0": 1}}')
    rows = sorted((r.stream, r.partition, r.offset, bytes(r.value)) for r in frame.collect())
    assert rows == [("a", 0, 0, b"a0"), ("a", 1, 0, b"a1"), ("b", 0, 0, b"b0")]


def test_headers(spark, tmp_path):
    path = tmp_path / "log"
    with streamlog.open_log(path) as log:
        log.create_stream("events")
        log.append_batch_sync("events", [b"a", b"b"], headers=[{"h": b"1", "g": b""}, None])
    rows = load(spark, path, includeHeaders="true").orderBy("offset").collect()
    assert [(h.key, bytes(h.value)) for h in rows[0].headers] == [("h", b"1"), ("g", b"")]
    assert rows[1].headers is None


@pytest.mark.parametrize("options, splits", [
    ({"maxRecordsPerPartition": "300"}, 4),
    ({"minPartitions": "5"}, 5),
    ({}, 1),  # 1,000 offsets: too few to be worth a second task
])
def test_large_partition_is_split_into_offset_ranges(spark, tmp_path, options, splits):
    path = tmp_path / "log"
    write_log(path, "events", sample_rows(4, counts=(1000,)))
    frame = load(spark, path, **options)
    assert frame.rdd.getNumPartitions() == splits
    offsets = sorted(r.offset for r in frame.select("offset").collect())
    assert offsets == list(range(1000))


def test_retention_gap_fails_or_is_skipped(spark, tmp_path):
    path = tmp_path / "log"
    with streamlog.open_log(path, fsync="never", segment_bytes_max=4096,
                            retention_bytes=20000) as log:
        log.create_stream("events")
        rng = random.Random(6)
        for _ in range(100):
            log.append_batch_sync("events", [rng.randbytes(100) for _ in range(5)])
        log.apply_retention()
        first = log.start_offset("events", 0)
    assert first > 0
    explicit = '{"events": {"0": 0}}'
    with pytest.raises(Exception) as excinfo:
        load(spark, path, startingOffsets=explicit).count()
    assert "removed by retention" in str(excinfo.value)
    assert "failOnDataLoss=false" in str(excinfo.value)
    frame = load(spark, path, startingOffsets=explicit, failOnDataLoss="false")
    assert sorted(r.offset for r in frame.collect()) == list(range(first, 500))


# Each option's own checks are in test_spark_options.py; these show that the errors
# found while planning reach the user through Spark intact.
@pytest.mark.parametrize("options, message", [
    ({"path": None}, "option 'path' is required"),
    ({"stream": "nope"}, "no stream named 'nope'"),
    ({"startingOffsets": '{"events": {"0": 0}}'}, "missing: events/1"),
    ({"endingOffsets": '{"events": {"0": 9999, "1": -1}}'}, "past its end"),
    ({"startingTimestamp": str(EPOCH_US // 1000 + 10 ** 9)}, "no record of events/0"),
    ({"startingOffset": "earliest"}, "did you mean 'startingOffsets'?"),
])
def test_bad_options_give_clear_errors(spark, tmp_path, options, message):
    path = tmp_path / "log"
    write_log(path, "events", sample_rows(5, counts=(3, 3)))
    given = {"path": str(path), "stream": "events", **options}
    reader = spark.read.format("streamlog")
    for name, value in given.items():
        if value is not None:
            reader = reader.option(name, value)
    with pytest.raises(Exception) as excinfo:
        reader.load().collect()
    assert message in str(excinfo.value)


def test_user_schema_must_be_the_source_schema(spark, tmp_path):
    write_log(tmp_path / "log", "events", {0: [(None, b"v", EPOCH_US)]})
    reader = (spark.read.format("streamlog").schema("value string, key binary")
              .option("path", str(tmp_path / "log")).option("stream", "events"))
    with pytest.raises(Exception) as excinfo:
        reader.load().collect()
    assert "has a fixed schema" in str(excinfo.value)
