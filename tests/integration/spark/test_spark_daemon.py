"""format("streamlog") with a daemon URL as its path: a batch read through the daemon,
and an exactly-once streaming write whose executors append through it.

The daemon is `streamlog serve` in a child process on a free loopback port. Its token
is STREAMLOG_TOKEN, set here at import (collection runs before the session fixture
starts Spark, and Spark's JVM and Python workers inherit the driver's environment), so
the driver's planning and every task reach the daemon with it.
"""

from __future__ import annotations

import collections
import json
import os

import pytest
from spark_helpers import EPOCH_US, spark_error_text, write_log

import streamlog
from spark_sink import _remote
from streamlog import RecordKind
from streamlog.testing.serve import ServeProcess

pytestmark = pytest.mark.slow

TOKEN = os.environ.setdefault("STREAMLOG_TOKEN", "spark-daemon-test-token")


class Daemon(ServeProcess):
    """`streamlog serve LOG --port 0 --fsync never` in a child process, until stop()."""

    def __init__(self, path) -> None:
        super().__init__(path, "--fsync", "never", token=TOKEN)

    def connect(self):
        return streamlog.open_log(self.url)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    running = Daemon(tmp_path_factory.mktemp("daemon") / "log")
    yield running
    running.stop()


def remote_values(daemon, stream: str) -> list[bytes]:
    """Values a read_committed reader sees in every partition of `stream`."""
    with daemon.connect() as log:
        return [r.value for n in range(log.partition_count(stream))
                for r in log.reader(stream, n)]


def open_data_txns(daemon, stream: str) -> list[int]:
    """Transactions with data in `stream` that have neither a commit nor an abort."""
    with daemon.connect() as log:
        pending = set()
        for n in range(log.partition_count(stream)):
            for r in log.reader(stream, n, data_only=False, read_committed=False):
                if r.kind == RecordKind.DATA and r.txn_id:
                    pending.add((n, r.txn_id))
                elif r.kind in (RecordKind.COMMIT, RecordKind.ABORT):
                    pending.discard((n, r.txn_id))
    return sorted(pending)


def test_batch_read_through_the_daemon_returns_what_was_appended(spark, daemon):
    expected = []
    with daemon.connect() as log:
        log.create_stream("src", partitions=2)
        for number in (0, 1):
            values = [b"v%d-%03d" % (number, i) for i in range(150)]
            keys = [None if i % 7 == 0 else b"k%d" % (i % 5) for i in range(150)]
            stamps = [EPOCH_US + i * 1000 for i in range(150)]
            result = log.append_batch_sync("src", values, keys=keys, timestamps_us=stamps,
                                           partition=number)
            first, _ = result.ranges[number]
            expected += [(number, first + i, stamps[i], keys[i], values[i]) for i in range(150)]
            # an aborted transaction's rows must not be read, a committed one's must
            aborted, committed = log.new_txn_id(), log.new_txn_id()
            log.append_batch_sync("src", [b"gone"], partition=number, txn_id=aborted)
            log.abort_txn("src", number, aborted)
            result = log.append_batch_sync("src", [b"kept%d" % number], partition=number,
                                           txn_id=committed, timestamps_us=[EPOCH_US])
            log.commit_txn("src", number, committed, tag="t", marker=b"m")
            expected.append((number, result.ranges[number][0], EPOCH_US, None,
                             b"kept%d" % number))
    rows = (spark.read.format("streamlog").option("path", daemon.url).option("stream", "src")
            .option("minPartitions", 4).load().collect())
    got = sorted((r.partition, r.offset, int(r.timestamp.timestamp() * 1_000_000),
                  None if r.key is None else bytes(r.key), bytes(r.value)) for r in rows)
    assert {r.stream for r in rows} == {"src"}
    assert got == sorted(expected)
    assert len(got) == 302
    # ending offsets resolve against the daemon too
    head = (spark.read.format("streamlog").option("path", daemon.url).option("stream", "src")
            .option("endingOffsets", json.dumps({"src": {"0": 10, "1": 5}})).load().collect())
    assert sorted((r.partition, r.offset) for r in head) == sorted(
        [(0, o) for o in range(10)] + [(1, o) for o in range(5)])


def make_input(path, counts) -> list[bytes]:
    rows = {n: [(b"k%d" % (i % 11), b"in%d-%04d" % (n, i), EPOCH_US + i * 1000)
                for i in range(count)] for n, count in enumerate(counts)}
    write_log(path, "in", rows)
    return [value for records in rows.values() for _, value, _ in records]


def copy_to_daemon(spark, source, url: str, checkpoint) -> None:
    frame = (spark.readStream.format("streamlog").option("path", str(source))
             .option("stream", "in").option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", 100).load()
             .selectExpr("key", "value", "timestamp"))
    query = (frame.writeStream.format("streamlog").option("path", url)
             .option("stream", "out").option("partitions", 2)
             .option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    assert query.exception() is None


def test_streaming_write_to_the_daemon_is_exactly_once(spark, daemon, tmp_path):
    source, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    inputs = make_input(source, counts=(180, 120))  # 3 micro-batches of 100 offsets
    copy_to_daemon(spark, source, daemon.url, checkpoint)
    assert sorted(remote_values(daemon, "out")) == sorted(inputs)

    # the same query again: nothing new, nothing written twice
    copy_to_daemon(spark, source, daemon.url, checkpoint)
    assert sorted(remote_values(daemon, "out")) == sorted(inputs)

    # more input, and the checkpoint forgets that batch 2 finished: Spark replays it
    with streamlog.open_log(source, fsync="never") as log:
        more = [b"late-%03d" % i for i in range(40)]
        log.append_batch_sync("in", more, partition=1)
    for name in ("2", ".2.crc"):
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    copy_to_daemon(spark, source, daemon.url, checkpoint)
    values = remote_values(daemon, "out")
    assert sorted(values) == sorted(inputs + more)
    assert [v for v, n in collections.Counter(values).items() if n > 1] == []
    assert open_data_txns(daemon, "out") == []
    tag = json.loads((checkpoint / "metadata").read_text())["id"]
    with daemon.connect() as log:
        markers = [_remote.parse_marker(log.last_commit("out", n, tag)) for n in range(2)]
    assert max(batch for batch, *_ in markers) == 3  # batches 0-2, the replay of 2, then 3


def test_a_commit_cut_short_is_completed_by_its_replay(daemon):
    class Options:
        path = daemon.url
        stream = "cut"
        partitions = 1
    with daemon.connect() as log:
        log.create_stream("cut", partitions=1)
        first = [log.new_txn_id(), log.new_txn_id()]
        for i, txn in enumerate(first):
            log.append_batch_sync("cut", [b"a%d" % i], partition=0, txn_id=txn)
        first.sort()
        # the first attempt committed one of its two transactions, then died
        log.commit_txn("cut", 0, first[0], tag="q",
                       marker=_remote.encode_marker(4, log.end_offset("cut", 0), first))
        replay = log.new_txn_id()
        log.append_batch_sync("cut", [b"again"], partition=0, txn_id=replay)
    outcomes = _remote.commit_streaming(Options, [{0: [replay, 1]}], 4, "q")
    assert outcomes == {0: "completed"}
    assert sorted(remote_values(daemon, "cut")) == [b"a0", b"a1"]
    assert open_data_txns(daemon, "cut") == []
    # a later replay of the same batch skips it, and one of the next batch commits
    with daemon.connect() as log:
        late, nxt = log.new_txn_id(), log.new_txn_id()
        log.append_batch_sync("cut", [b"again"], partition=0, txn_id=late)
        log.append_batch_sync("cut", [b"b"], partition=0, txn_id=nxt)
    assert _remote.commit_streaming(Options, [{0: [late, 1]}], 4, "q") == {0: "skipped"}
    assert _remote.commit_streaming(Options, [{0: [nxt, 1]}], 5, "q") == {0: "committed"}
    assert sorted(remote_values(daemon, "cut")) == [b"a0", b"a1", b"b"]
    assert open_data_txns(daemon, "cut") == []


def test_truncate_mode_is_refused_with_a_daemon_url(spark, daemon, tmp_path):
    source = tmp_path / "in"
    make_input(source, counts=(5,))
    frame = (spark.readStream.format("streamlog").option("path", str(source))
             .option("stream", "in").load().selectExpr("value"))
    with pytest.raises(Exception) as excinfo:
        query = (frame.writeStream.format("streamlog").option("path", daemon.url)
                 .option("stream", "t").option("mode", "truncate")
                 .option("checkpointLocation", str(tmp_path / "ckpt"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
    assert "mode transactional" in spark_error_text(excinfo)


def test_batch_write_through_the_daemon(spark, daemon):
    rows = [(b"k%d" % (i % 3), b"w-%03d" % i) for i in range(200)]
    frame = spark.createDataFrame(rows, "key binary, value binary").repartition(3)
    (frame.write.format("streamlog").mode("append").option("path", daemon.url)
     .option("stream", "batch").option("partitions", 2).save())
    assert sorted(remote_values(daemon, "batch")) == sorted(v for _, v in rows)
    assert open_data_txns(daemon, "batch") == []
    with daemon.connect() as log:  # each key's rows in the partition its hash names
        for number in range(2):
            keys = {r.key for r in log.reader("batch", number)}
            assert all(streamlog.partition_for_key(k, 2) == number for k in keys)


def test_daemon_urls_in_options():
    from spark_sink._options import parse_sink_options
    from spark_source._options import parse_source_options
    url = "streamlog://127.0.0.1:7541"
    assert parse_source_options({"path": url, "stream": "s"}, streaming=True).path == url
    assert parse_sink_options({"path": url, "stream": "s"}).mode == "transactional"
    with pytest.raises(streamlog.InvalidArgument, match="has a path or query"):
        parse_source_options({"path": url + "/logs", "stream": "s"}, streaming=False)
    with pytest.raises(streamlog.InvalidArgument, match="only mode transactional"):
        parse_sink_options({"path": url, "stream": "s", "mode": "truncate"})
    # a directory keeps truncate mode
    assert parse_sink_options({"path": "/l", "stream": "s", "mode": "truncate"}).mode == \
        "truncate"
