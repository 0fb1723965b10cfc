"""spark.readStream / writeStream with format("streamlog"): starting positions, admission
control, restarts from a checkpoint, and the sink's replay rules through real Spark."""

from __future__ import annotations

import os
import random

import pytest
from pyspark.sql import functions as F
from spark_helpers import EPOCH_US, write_log

import streamlog

pytestmark = pytest.mark.slow


def make_input(path, counts=(300, 200), seed=7) -> None:
    rng = random.Random(seed)
    write_log(path, "in", {number: [(b"k%d" % rng.randrange(20), b"p%d-%04d" % (number, i),
                                     EPOCH_US + i * 1000 + rng.randrange(-2500, 2500))
                                    for i in range(count)]
                           for number, count in enumerate(counts)})


def stream(spark, path, **options):
    reader = (spark.readStream.format("streamlog").option("path", str(path))
              .option("stream", "in"))
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def to_memory(frame, name: str):
    query = (frame.writeStream.format("memory").queryName(name)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    assert query.exception() is None
    return query


def memory_rows(spark, name: str) -> list[tuple]:
    return sorted((r.partition, r.offset, bytes(r.value))
                  for r in spark.table(name).select("partition", "offset", "value").collect())


def log_rows(path, bounds) -> list[tuple]:
    with streamlog.open_log(path, readonly=True) as log:
        return sorted((number, r.offset, r.value) for number in (0, 1)
                      for r in log.reader("in", number, **bounds[number]))


def test_stream_from_a_timestamp_and_from_offsets(spark, tmp_path):
    path = tmp_path / "in"
    make_input(path)
    start_ms = EPOCH_US // 1000 + 120
    to_memory(stream(spark, path, startingTimestamp=str(start_ms)), "from_timestamp")
    bound = {"from_timestamp_us": start_ms * 1000}
    assert memory_rows(spark, "from_timestamp") == log_rows(path, {0: bound, 1: bound})
    to_memory(stream(spark, path, startingOffsets='{"in": {"0": 250, "1": -2}}'),
              "from_offsets")
    expected = log_rows(path, {0: {"from_offset": 250}, 1: {}})
    assert memory_rows(spark, "from_offsets") == expected
    assert len(expected) == 50 + 200


def test_max_offsets_per_trigger_sets_micro_batch_sizes(spark, tmp_path):
    path = tmp_path / "in"
    make_input(path, counts=(250, 150))
    query = to_memory(stream(spark, path, startingOffsets="earliest",
                             maxOffsetsPerTrigger="150"), "limited")
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [150, 150, 100]
    first_end = query.recentProgress[0]["sources"][0]["endOffset"]
    assert first_end == '{"in": {"0": 94, "1": 56}}'  # shared in proportion to the backlog
    assert len(memory_rows(spark, "limited")) == 400
    assert len(set(memory_rows(spark, "limited"))) == 400


def copy_query(spark, source, target, checkpoint, **sink_options):
    frame = stream(spark, source, startingOffsets="earliest", maxOffsetsPerTrigger="100")
    result = frame.select("key", F.concat(F.lit(b"out-"), "value").alias("value"),
                          "timestamp")
    writer = (result.writeStream.format("streamlog").option("path", str(target))
              .option("stream", "out").option("partitions", "2")
              .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True))
    for name, value in sink_options.items():
        writer = writer.option(name, value)
    query = writer.start()
    query.awaitTermination()
    assert query.exception() is None
    return query


def output_values(path, *, read_committed=True) -> list[bytes]:
    with streamlog.open_log(path, readonly=True) as log:
        return [r.value for number in range(2)
                for r in log.reader("out", number, read_committed=read_committed)]


def query_id(checkpoint) -> str:
    import json
    with open(os.path.join(checkpoint, "metadata")) as handle:
        return json.load(handle)["id"]


def append_input(path, first: int, count: int) -> None:
    with streamlog.open_log(path) as log:
        log.append_batch_sync("in", [b"p0-%04d" % i for i in range(first, first + count)],
                              keys=[b"late"] * count, partition=0)


def test_restart_resumes_and_a_replayed_batch_is_skipped(spark, tmp_path):
    source, target, checkpoint = tmp_path / "in", tmp_path / "out", tmp_path / "ckpt"
    make_input(source, counts=(120, 80))
    copy_query(spark, source, target, checkpoint)
    assert sorted(output_values(target)) == sorted(b"out-" + v for v in all_inputs(source))
    tag = query_id(checkpoint)
    append_input(source, 120, 30)
    # Forget that batch 1 finished: Spark replays it, and the sink must skip it.
    forget_commit(checkpoint, 1)
    copy_query(spark, source, target, checkpoint)
    expected = sorted(b"out-" + v for v in all_inputs(source))
    assert len(expected) == 230
    assert sorted(output_values(target)) == expected
    # Skipped means nothing was appended at all, not even invisible data.
    assert sorted(output_values(target, read_committed=False)) == expected
    late = streamlog.partition_for_key(b"late", 2)  # batch 2's rows all went there
    with streamlog.open_log(target, readonly=True) as log:
        batches = [log.last_commit("out", n, tag).split()[0] for n in range(2)]
    assert batches[late] == b"2" and batches[1 - late] == b"1"
    assert not os.listdir(target / "staging" / tag)


def forget_commit(checkpoint, batch_id: int) -> None:
    """Make the checkpoint say that micro-batch `batch_id` never finished."""
    for name in (f"{batch_id}", f".{batch_id}.crc"):
        target = checkpoint / "commits" / name
        if target.exists():
            target.unlink()


def all_inputs(path) -> list[bytes]:
    with streamlog.open_log(path, readonly=True) as log:
        return [r.value for n in range(2) for r in log.reader("in", n)]


def test_truncate_mode_forgets_what_an_unfinished_batch_wrote(spark, tmp_path):
    source, target, checkpoint = tmp_path / "in", tmp_path / "out", tmp_path / "ckpt"
    make_input(source, counts=(120, 80))
    copy_query(spark, source, target, checkpoint, mode="truncate")
    expected = sorted(b"out-" + v for v in all_inputs(source))
    assert sorted(output_values(target)) == expected
    # An attempt of the next batch that died before its commit marker left this behind:
    with streamlog.open_log(target) as log:
        for number in range(2):
            log.append_batch_sync("out", [b"junk"] * 3, partition=number)
    append_input(source, 120, 30)
    copy_query(spark, source, target, checkpoint, mode="truncate")
    expected = sorted(b"out-" + v for v in all_inputs(source))
    assert sorted(output_values(target, read_committed=False)) == expected


def test_checkpoint_with_other_streams_is_refused(spark, tmp_path):
    source, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    make_input(source, counts=(5, 5))
    with streamlog.open_log(source) as log:
        log.create_stream("other")
        log.append_batch_sync("other", [b"x"])
    query = (stream(spark, source, startingOffsets="earliest").writeStream.format("noop")
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination()
    other = (spark.readStream.format("streamlog").option("path", str(source))
             .option("stream", "other").load())
    query = (other.writeStream.format("noop").option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    with pytest.raises(Exception) as excinfo:
        query.awaitTermination()
    assert "use a new checkpointLocation" in str(excinfo.value)


def test_ending_options_are_refused_for_streams(spark, tmp_path):
    make_input(tmp_path / "in", counts=(5, 5))
    frame = stream(spark, tmp_path / "in", endingOffsets="latest")
    with pytest.raises(Exception) as excinfo:
        to_memory(frame, "never")
    assert "is for batch queries only" in str(excinfo.value)
