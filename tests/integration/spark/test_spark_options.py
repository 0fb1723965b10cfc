"""The connector's rules without a SparkSession: options, offsets JSON, rate limit,
splits, and the mapping of DataFrame columns. Fast; no JVM is started here."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import types as T
from spark_helpers import EPOCH_US

import streamlog
from spark_sink._columns import ColumnMap
from spark_sink._options import parse_sink_options
from spark_source._options import EARLIEST, LATEST, OFFSET, TIMESTAMP, parse_source_options
from spark_source._plan import SPLIT_OFFSETS_MIN, rate_limit, split_ranges, stable_end
from spark_source._schema import spark_schema, stream_column, target_arrow_schema, to_spark_batch
from spark_source._stream import from_json, to_json

BASE = {"path": "/data/log", "stream": "events"}


def parse(streaming=False, **options):
    return parse_source_options({**BASE, **options}, streaming=streaming)


def test_defaults_follow_kafka():
    batch, stream = parse(), parse(streaming=True)
    assert batch.starting.every.kind == EARLIEST and batch.ending.every.kind == LATEST
    assert stream.starting.every.kind == LATEST and stream.ending is None
    assert batch.fail_on_data_loss and not batch.include_headers
    assert batch.max_offsets_per_trigger is None


def test_timestamps_are_milliseconds_and_take_precedence():
    options = parse(startingTimestamp="1700000000123", startingOffsets="earliest",
                    endingTimestamp="1700000000999")
    assert options.starting.every.kind == TIMESTAMP
    assert options.starting.every.value == 1_700_000_000_123_000
    assert options.ending.every.value == 1_700_000_000_999_000
    by_partition = parse(startingOffsetsByTimestamp='{"events": {"0": 5, "1": 7}}',
                         startingOffsets="earliest")
    assert by_partition.starting.position("events", 1).value == 7000


def test_offsets_json_special_values():
    options = parse(startingOffsets='{"events": {"0": 12, "1": -2, "2": -1}}',
                    endingOffsets='{"events": {"0": 20, "1": -1, "2": -1}}')
    assert options.starting.position("events", 0).kind == OFFSET
    assert options.starting.position("events", 0).value == 12
    assert options.starting.position("events", 1).kind == EARLIEST
    assert options.starting.position("events", 2).kind == LATEST
    assert options.ending.position("events", 1).kind == LATEST


def test_option_names_are_case_insensitive_and_streams_may_be_several():
    options = parse_source_options({"PATH": "/l", "Stream": "a, b", "INCLUDEHEADERS": "TRUE"},
                                   streaming=True)
    assert options.streams == ("a", "b") and options.include_headers


@pytest.mark.parametrize("options, streaming, message", [
    ({"path": ""}, False, "option 'path' is required"),
    ({"stream": " , "}, False, "option 'stream' is required"),
    ({"stream": "a,a"}, False, "names a stream twice"),
    ({"startingOffsets": "latest"}, False, "cannot be latest for a batch query"),
    ({"endingOffsets": "earliest"}, False, "cannot be earliest"),
    ({"endingOffsets": '{"events": {"0": -2}}'}, False, "offset -2 of events/0"),
    ({"startingOffsets": '{"other": {"0": 1}}'}, False, "names stream 'other'"),
    ({"startingOffsets": '{"events": {"x": 1}}'}, False, "is not a partition number"),
    ({"startingOffsets": '{"events": {"0": 1.5}}'}, False, "must be an integer"),
    ({"startingOffsets": '["events"]'}, False, "must be a JSON object"),
    ({"startingTimestamp": "99999999999999999999"}, False, "out of range"),
    ({"startingOffsetsByTimestampStrategy": "nearest"}, False, "must be error or latest"),
    ({"endingTimestamp": "1"}, True, "is for batch queries only"),
    ({"maxOffsetsPerTrigger": "-5"}, True, "must be a positive integer"),
    ({"maxOffsetsPerTrigger": "lots"}, True, "must be an integer"),
    ({"includeHeaders": "yes"}, False, "must be true or false"),
    ({"maxOffsetPerTrigger": "5"}, True, "did you mean 'maxOffsetsPerTrigger'?"),
    ({"path": "streamlog://host:7541/logs"}, False, "has a path or query"),
])
def test_bad_source_options(options, streaming, message):
    with pytest.raises(streamlog.InvalidArgument) as excinfo:
        parse(streaming=streaming, **options)
    assert message in str(excinfo.value)


@pytest.mark.parametrize("options, message", [
    ({"stream": "a,b"}, "must name one stream"),
    ({"mode": "overwrite"}, "must be transactional or truncate"),
    ({"fsync": "sometimes"}, "must be always, interval or never"),
    ({"partitions": "0"}, "must be a positive integer"),
    ({"lockTimeoutMs": "soon"}, "must be an integer"),
    ({"partiton": "2"}, "did you mean 'partitions'?"),
])
def test_bad_sink_options(options, message):
    with pytest.raises(streamlog.InvalidArgument) as excinfo:
        parse_sink_options({**BASE, **options})
    assert message in str(excinfo.value)


def test_sink_options_defaults():
    options = parse_sink_options({**BASE, "checkpointLocation": "/c"})
    assert (options.mode, options.fsync, options.partitions) == ("transactional", "always", None)
    assert not hasattr(options, "lock_timeout_s")  # accepted, checked, without effect


# -- offsets, rate limit, splits ------------------------------------------------------

def test_offset_json_is_stable_text():
    positions = {("b", 10): 3, ("a", 2): 1, ("b", 9): 4, ("a", 0): 0}
    text = json.dumps(to_json(positions))
    assert text == '{"a": {"0": 0, "2": 1}, "b": {"9": 4, "10": 3}}'
    assert from_json(json.loads(text)) == positions
    assert json.dumps(to_json(from_json(json.loads(text)))) == text


def test_rate_limit_shares_in_proportion_to_backlog():
    assert rate_limit([0, 0], [250, 150], 150) == [94, 56]
    assert rate_limit([94, 56], [250, 150], 150) == [188, 112]
    assert rate_limit([0, 0, 0], [1, 1, 1], 2) == [1, 1, 0]
    assert rate_limit([5, 5], [10, 10], None) == [10, 10]
    assert rate_limit([5, 5], [10, 10], 100) == [10, 10]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 1000)), min_size=1,
                max_size=8), st.integers(1, 3000))
def test_rate_limit_reads_exactly_the_budget_within_each_backlog(pairs, budget):
    starts = [a for a, _ in pairs]
    ends = [a + b for a, b in pairs]
    limited = rate_limit(starts, ends, budget)
    assert all(s <= l <= e for s, l, e in zip(starts, limited, ends))
    assert sum(l - s for s, l in zip(starts, limited)) == min(budget, sum(ends) - sum(starts))


def test_split_ranges():
    key = ("s", 0)
    big = [(key, 0, 4 * SPLIT_OFFSETS_MIN)]
    assert len(split_ranges(big, min_partitions=None, max_records=None, cores=2)) == 2
    assert split_ranges([(key, 0, 1000)], min_partitions=None, max_records=None,
                        cores=2) == [(key, 0, 1000)]
    assert split_ranges([(key, 5, 5)], min_partitions=None, max_records=None, cores=2) == []
    pieces = split_ranges([(key, 0, 1000), (("s", 1), 0, 10)], min_partitions=None,
                          max_records=300, cores=1)
    assert pieces == [(key, 0, 250), (key, 250, 500), (key, 500, 750), (key, 750, 1000),
                      (("s", 1), 0, 10)]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 300_000), min_size=1, max_size=5),
       st.one_of(st.none(), st.integers(1, 20)), st.one_of(st.none(), st.integers(1, 10**6)))
def test_splits_cover_every_offset_once(sizes, min_partitions, max_records):
    ranges = [(("s", n), 7, 7 + size) for n, size in enumerate(sizes)]
    pieces = split_ranges(ranges, min_partitions=min_partitions, max_records=max_records,
                          cores=2)
    for n, size in enumerate(sizes):
        mine = [(a, b) for key, a, b in pieces if key == ("s", n)]
        assert all(a < b for a, b in mine)
        assert [a for a, _ in mine] == [7] + [b for _, b in mine[:-1]] if mine else size == 0
        assert sum(b - a for a, b in mine) == size
        if max_records is not None:
            assert all(b - a <= max_records for a, b in mine)
    if min_partitions is not None and sum(sizes) >= 20 * len(sizes):
        assert len(pieces) >= min(min_partitions, sum(sizes))


# -- Arrow batches ------------------------------------------------------------------

def test_batches_match_the_schema_spark_demands(tmp_path):
    path = tmp_path / "log"
    with streamlog.open_log(path) as log:
        log.create_stream("events")
        log.append_batch_sync("events", [b"a", b"b"], keys=[None, b"k"],
                              timestamps_us=[EPOCH_US, EPOCH_US + 1],
                              headers=[{"h": b"1"}, None])
        for headers in (False, True):
            target = target_arrow_schema(spark_schema(headers), headers)
            with log.reader("events", 0) as reader:
                (batch,) = list(reader.arrow(include_headers=headers))
            out = to_spark_batch(batch, "events", target)
            assert out.schema.equals(target)
            assert out.column("stream").to_pylist() == ["events", "events"]
            assert out.column("key").to_pylist() == [None, b"k"]
    assert stream_column("", 3).to_pylist() == ["", "", ""]
    assert stream_column("é", 0).to_pylist() == []


def test_stable_end_stops_at_an_open_transaction(tmp_path):
    with streamlog.open_log(tmp_path / "log") as log:
        log.create_stream("events")
        log.append_batch_sync("events", [b"a", b"b"])
        txn = log.new_txn_id()
        log.append_batch_sync("events", [b"c"], txn_id=txn)
        log.append_batch_sync("events", [b"d"])
        with streamlog.open_log(tmp_path / "log", readonly=True) as reader:
            assert stable_end(reader, "events", 0) == 2
        log.commit_txn("events", 0, txn)
        with streamlog.open_log(tmp_path / "log", readonly=True) as reader:
            assert stable_end(reader, "events", 0) == 5


# -- DataFrame columns -> staged rows -------------------------------------------------

def schema(*fields) -> T.StructType:
    return T.StructType([T.StructField(name, kind) for name, kind in fields])


def test_column_map_stages_and_routes():
    mapping = ColumnMap.from_schema(schema(
        ("VALUE", T.StringType()), ("Key", T.BinaryType()), ("timestamp", T.TimestampType()),
        ("partition", T.LongType()), ("other", T.IntegerType())), 4)
    batch = pa.record_batch({
        "VALUE": pa.array(["x", "y", "z"]),
        "Key": pa.array([b"k", None, b"k"]),
        "timestamp": pa.array([EPOCH_US, None, EPOCH_US + 9], pa.timestamp("us", tz="UTC")),
        "partition": pa.array([3, None, None], pa.int64()),
        "other": pa.array([1, 2, 3], pa.int32())})
    staged = mapping.stage(batch)
    assert staged.column("value").to_pylist() == [b"x", b"y", b"z"]
    assert staged.column("partition").to_pylist() == [
        3, streamlog.partition_for_key(b"y", 4), streamlog.partition_for_key(b"k", 4)]
    stamps = staged.column("timestamp").to_pylist()
    assert stamps[0] == EPOCH_US and stamps[2] == EPOCH_US + 9 and stamps[1] > EPOCH_US


def test_write_schema_errors():
    with pytest.raises(streamlog.InvalidArgument, match="two columns named 'value'"):
        ColumnMap.from_schema(schema(("value", T.StringType()), ("VALUE", T.BinaryType())), 1)
    with pytest.raises(streamlog.InvalidArgument, match="takes an integer type for partition"):
        ColumnMap.from_schema(schema(("value", T.StringType()), ("partition", T.StringType())),
                              1)
