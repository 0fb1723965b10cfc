"""Kafka's option names and habits, without a SparkSession: selection of streams and
partitions, isolation, trigger thresholds, unknown names, a catalog table's options, and
the stream reader's decisions (driven directly, as Spark's driver process calls it)."""

from __future__ import annotations

import time

import pytest
from pyspark.sql.datasource import InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

import streamlog
from spark_source._catalog import remember_options, table_options
from spark_source._options import near_miss, parse_source_options
from spark_source._plan import selected_keys
from spark_source._schema import spark_schema
from spark_source._stream import StreamReader

BASE = {"path": "/data/log"}


def parse(streaming=False, **options):
    return parse_source_options({**BASE, **options}, streaming=streaming)


def test_subscribe_is_stream_and_pattern_and_assign_choose_otherwise():
    assert parse(subscribe="a, b").streams == parse(stream="a,b").streams == ("a", "b")
    pattern = parse(subscribePattern="click.*")
    assert (pattern.streams, pattern.pattern, pattern.assigned) == ((), "click.*", None)
    assigned = parse(assign='{"b": [2, 0], "a": [1]}')
    assert assigned.assigned == (("a", 1), ("b", 0), ("b", 2))
    assert assigned.streams == ("a", "b")


@pytest.mark.parametrize("options, message", [
    ({"stream": "a", "assign": '{"a": [0]}'}, "options 'stream' and 'assign' each choose"),
    ({"subscribe": "a", "subscribePattern": "a"}, "'subscribe' and 'subscribePattern'"),
    ({}, "option 'stream' is required"),
    ({"subscribe": " "}, "option 'subscribe' is required"),
    ({"subscribePattern": "(unclosed"}, "option 'subscribePattern' is not a regular"),
    ({"assign": '{"a": []}'}, "option 'assign' must be a JSON object of streams"),
    ({"assign": '{"a": [-1]}'}, "-1 in stream 'a' is not a partition number"),
    ({"assign": '{"a": [0, 0]}'}, "names a partition twice"),
    ({"stream": "a", "minOffsetsPerTrigger": "10", "maxOffsetsPerTrigger": "5"},
     "'minOffsetsPerTrigger' (10) is more than 'maxOffsetsPerTrigger' (5)"),
    ({"stream": "a", "maxTriggerDelay": "soon"}, "option 'maxTriggerDelay' must be a duration"),
    ({"stream": "a", "isolationLevel": "read_committed",
      "kafka.isolation.level": "read_uncommitted"}, "disagree"),
    ({"stream": "a", "kafka.group.id": "g"}, "'kafka.group.id' is a setting of Kafka's"),
    ({"stream": "a", "groupIdPrefix": "g"}, "'groupidprefix' is a setting of Kafka's"),
])
def test_bad_selection_and_kafka_options(options, message):
    with pytest.raises(streamlog.InvalidArgument) as excinfo:
        parse(streaming=True, **options)
    assert message in str(excinfo.value)
    assert "\n" not in str(excinfo.value)


def test_trigger_thresholds_and_isolation():
    options = parse(streaming=True, stream="a", minOffsetsPerTrigger="100",
                    maxTriggerDelay="10s")
    assert (options.min_offsets_per_trigger, options.max_trigger_delay_ms) == (100, 10_000)
    assert parse(stream="a").max_trigger_delay_ms == 15 * 60 * 1000
    assert parse(stream="a", maxTriggerDelay="250").max_trigger_delay_ms == 250
    assert parse(stream="a", maxTriggerDelay="2 min").max_trigger_delay_ms == 120_000
    assert parse(stream="a").read_committed
    assert not parse(stream="a", isolationLevel="READ_UNCOMMITTED").read_committed
    assert not parse(stream="a", **{"kafka.isolation.level": "read_uncommitted"}).read_committed


def test_unknown_names_suggest_only_near_misses():
    with pytest.raises(streamlog.InvalidArgument, match="did you mean 'startingOffsets'"):
        parse(stream="a", startingOffset="earliest")
    with pytest.raises(streamlog.InvalidArgument) as excinfo:
        parse(stream="a", colour="blue")
    assert "unknown option 'colour'" in str(excinfo.value)
    assert "did you mean" not in str(excinfo.value)
    assert "maxOffsetsPerTrigger" in str(excinfo.value)  # the known names are listed
    # Kafka's minOffsetsPerTrigger is an option now, not a typo of maxOffsetsPerTrigger
    assert parse(streaming=True, stream="a", minOffsetsPerTrigger="5")
    assert near_miss("maxoffsetpertrigger", ["maxoffsetspertrigger", "stream"]) == \
        "maxoffsetspertrigger"
    assert near_miss("sream", ["stream", "assign"]) == "stream"
    assert near_miss("mode", ["path", "stream"]) is None
    assert near_miss("pathh", ["path", "paths"]) is None  # two candidates: no guess


def test_load_checks_what_does_not_depend_on_the_query():
    # at load() Spark cannot say whether a read, a readStream or a write follows
    assert parse_source_options({}, streaming=None, required=False) is None
    assert parse_source_options({"startingOffsets": "latest", "endingOffsets": "latest"},
                                streaming=None, required=False) is None
    assert parse_source_options({"path": "/l", "stream": "s", "mode": "truncate",
                                 "checkpointLocation": "/c", "partitions": "2"},
                                streaming=None) is not None
    with pytest.raises(streamlog.InvalidArgument, match="must be true or false"):
        parse_source_options({"failOnDataLoss": "maybe"}, streaming=None, required=False)


def test_catalog_table_options_travel_in_the_schema():
    created = {"location": "file:/data/log", "path": "file:/data/log", "stream": "s",
               "option.stream": "s", "owner": "me", "provider": "streamlog"}
    parse_source_options(created, streaming=None)  # what CREATE TABLE hands the source
    schema = remember_options(spark_schema(False), created)
    assert schema.fieldNames() == spark_schema(False).fieldNames()
    assert spark_schema(False).fields[0].metadata == {}  # the shared fields stay clean
    options = table_options({}, schema)
    assert options == {"path": "file:/data/log", "stream": "s"}
    assert parse_source_options(options, streaming=False).path == "/data/log"
    assert table_options({"subscribe": "t"}, schema) == {"path": "file:/data/log",
                                                        "subscribe": "t"}
    assert remember_options(spark_schema(False), {"path": "/l"}) == spark_schema(False)


def test_selected_keys_against_a_log(tmp_path):
    with streamlog.open_log(tmp_path / "log") as log:
        log.create_stream("clicks", partitions=2)
        log.create_stream("clicks_eu", partitions=1)
        log.create_stream("orders", partitions=3)
        assert selected_keys(log, parse(subscribePattern="clicks.*")) == [
            ("clicks", 0), ("clicks", 1), ("clicks_eu", 0)]
        assert selected_keys(log, parse(subscribePattern="click")) == []  # whole names
        assert selected_keys(log, parse(assign='{"orders": [2, 0]}')) == [
            ("orders", 0), ("orders", 2)]
        with pytest.raises(streamlog.InvalidArgument, match="do not exist: orders/3"):
            selected_keys(log, parse(assign='{"orders": [3]}'))


def stream_reader(path, **options) -> StreamReader:
    parsed = parse_source_options({"path": str(path), **options}, streaming=True)
    return StreamReader(parsed, spark_schema(False))


def test_min_offsets_per_trigger_holds_batches_back_until_the_delay(tmp_path):
    path = tmp_path / "log"
    with streamlog.open_log(path) as log:
        log.create_stream("s", partitions=2)
        log.append_batch_sync("s", [b"a", b"b"], partition=0)
        reader = stream_reader(path, stream="s", startingOffsets="earliest",
                               minOffsetsPerTrigger="4", maxTriggerDelay="300ms")
        start = reader.initialOffset()
        assert start == {"s": {"0": 0, "1": 0}}
        assert reader.latestOffset(start, ReadAllAvailable()) == start  # 2 < 4: wait
        log.append_batch_sync("s", [b"c", b"d"], partition=1)
        end = reader.latestOffset(start, ReadAllAvailable())
        assert end == {"s": {"0": 2, "1": 2}}  # 4 available: a batch at once
        log.append_batch_sync("s", [b"e"], partition=0)
        assert reader.latestOffset(end, ReadAllAvailable()) == end
        time.sleep(0.35)  # the delay since the last batch passed: take what there is
        assert reader.latestOffset(end, ReadAllAvailable()) == {"s": {"0": 3, "1": 2}}
        assert reader.reportLatestOffset() == {"s": {"0": 3, "1": 2}}
        reader.stop()


def test_a_pattern_picks_up_new_streams_and_isolation_moves_the_end(tmp_path):
    path = tmp_path / "log"
    with streamlog.open_log(path) as log:
        log.create_stream("in_a")
        log.append_batch_sync("in_a", [b"a"])
        reader = stream_reader(path, subscribePattern="in_.*", startingOffsets="earliest")
        start = reader.initialOffset()
        first = reader.latestOffset(start, ReadMaxRows(10))
        assert first == {"in_a": {"0": 1}}
        log.create_stream("in_b")
        log.append_batch_sync("in_b", [b"x", b"y"])
        second = reader.latestOffset(first, ReadMaxRows(10))
        assert second == {"in_a": {"0": 1}, "in_b": {"0": 2}}
        (split,) = reader.partitions(first, second)
        assert (split.stream, split.start, split.end) == ("in_b", 0, 2)
        assert [b.num_rows for b in reader.read(split)] == [2]
        assert list(reader.read(InputPartition(None))) == []  # Spark's placeholder
        reader.stop()
        txn = log.new_txn_id()
        log.append_batch_sync("in_a", [b"open"], txn_id=txn)
        committed = stream_reader(path, stream="in_a", startingOffsets="earliest")
        dirty = stream_reader(path, stream="in_a", startingOffsets="earliest",
                              isolationLevel="read_uncommitted")
        for reader, end, values in [(committed, 1, [b"a"]), (dirty, 2, [b"a", b"open"])]:
            offset = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
            assert offset == {"in_a": {"0": end}}
            rows = [v for s in reader.partitions(reader.initialOffset(), offset)
                    for b in reader.read(s) for v in b.column("value").to_pylist()]
            assert rows == values
            reader.stop()
