"""The public API on real files: argument errors, concurrency, live tail, fsync policies,
retention, truncation, the writer lock and read-only opens."""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import threading
import time

import pytest

from streamlog.view import View

import streamlog
from streamlog import (InvalidAppend, InvalidArgument, LogClosed, OffsetOutOfRange,
                       ReadOnlyLog, RecordKind, StreamLogError, UnknownStream)
from streamlog.txn import TxnState

STREAM = "s"
SEGMENT_SMALL = dict(segment_bytes_max=4096, compression="none")


def offsets(reader) -> list[int]:
    return [record.offset for record in reader]


def contents(log, stream: str = STREAM) -> dict[int, list[tuple]]:
    return {p: [(r.offset, r.timestamp_us, r.key, r.value, r.headers)
                for r in log.reader(stream, p)]
            for p in range(log.partition_count(stream))}


def run(result):
    """Await a coroutine (the async entry points), or return a plain result."""
    if asyncio.iscoroutine(result):
        return asyncio.run(result)
    return result


def wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


# -- bad input to every public entry point -------------------------------------------------


@pytest.fixture
def seeded(log_dir, open_logs):
    """A log with stream `s` of two partitions and a few records in each."""
    log = open_logs(log_dir, fsync="never", record_bytes_max=1024)
    log.create_stream(STREAM, partitions=2)
    log.append_batch_sync(STREAM, [b"a", b"b", b"c"], keys=[b"k1", None, b""],
                          timestamps_us=[10, 30, 20], partition=0,
                          headers=[{"h": b"1"}, None, ()])
    log.append_sync(STREAM, b"d", partition=1, timestamp_us=5)
    return log


def _bad(name, call, error, match):
    return pytest.param(call, error, match, id=name)


BAD_CALLS = [
    # values
    _bad("append-value-str", lambda log: log.append(STREAM, "text", partition=0),
         InvalidAppend, "encode"),
    _bad("append_sync-value-str", lambda log: log.append_sync(STREAM, "text", partition=0),
         InvalidAppend, "encode"),
    _bad("append-value-int", lambda log: log.append(STREAM, 7, partition=0),
         InvalidAppend, "must be bytes, not int"),
    _bad("append-value-list", lambda log: log.append_sync(STREAM, [b"v"], partition=0),
         InvalidAppend, "must be bytes, not list"),  # (None is a tombstone, not an error)
    _bad("batch-values-bytes", lambda log: log.append_batch_sync(STREAM, b"abc"),
         InvalidAppend, "list"),
    _bad("batch-values-str", lambda log: log.append_batch(STREAM, "abc"),
         InvalidAppend, "list"),
    _bad("batch-values-generator",
         lambda log: log.append_batch_sync(STREAM, (v for v in [b"a"])), InvalidAppend, "list"),
    _bad("batch-values-none", lambda log: log.append_batch_sync(STREAM, None),
         InvalidAppend, "list"),
    _bad("batch-empty", lambda log: log.append_batch_sync(STREAM, []), InvalidAppend, "empty"),
    _bad("batch-empty-async", lambda log: log.append_batch(STREAM, []), InvalidAppend, "empty"),
    _bad("batch-second-value-str",
         lambda log: log.append_batch_sync(STREAM, [b"ok", "not ok"], partition=0),
         InvalidAppend, "record 1.*encode"),
    # keys
    _bad("append-key-str", lambda log: log.append_sync(STREAM, b"v", key="k"),
         InvalidAppend, "key.*encode"),
    _bad("append-key-int", lambda log: log.append(STREAM, b"v", key=3),
         InvalidAppend, "key.*int"),
    _bad("batch-keys-length", lambda log: log.append_batch_sync(STREAM, [b"a", b"b"],
                                                                keys=[b"k"]),
         InvalidAppend, "keys has 1 items for 2 values"),
    _bad("batch-keys-bytes", lambda log: log.append_batch_sync(STREAM, [b"a", b"b"],
                                                               keys=b"ab"),
         InvalidAppend, "keys must be a list"),
    _bad("batch-keys-str", lambda log: log.append_batch(STREAM, [b"a"], keys=["k"]),
         InvalidAppend, "encode"),
    # timestamps
    _bad("append-ts-str", lambda log: log.append_sync(STREAM, b"v", timestamp_us="10"),
         InvalidAppend, "timestamp.*int.*str"),
    _bad("append-ts-float", lambda log: log.append(STREAM, b"v", timestamp_us=1.5),
         InvalidAppend, "timestamp.*float"),
    _bad("append-ts-bool", lambda log: log.append_sync(STREAM, b"v", timestamp_us=True),
         InvalidAppend, "timestamp.*bool"),
    _bad("append-ts-too-big", lambda log: log.append_sync(STREAM, b"v", timestamp_us=1 << 63),
         InvalidAppend, "int64"),
    _bad("append-ts-too-small",
         lambda log: log.append_sync(STREAM, b"v", timestamp_us=-(1 << 63)),
         InvalidAppend, "int64"),
    _bad("batch-ts-length", lambda log: log.append_batch_sync(STREAM, [b"a", b"b"],
                                                              timestamps_us=[1]),
         InvalidAppend, "timestamps_us has 1 items"),
    _bad("batch-ts-second-str", lambda log: log.append_batch_sync(
        STREAM, [b"a", b"b"], timestamps_us=[1, "2"]), InvalidAppend, "record 1"),
    _bad("batch-ts-int", lambda log: log.append_batch_sync(STREAM, [b"a"], timestamps_us=5),
         InvalidAppend, "timestamps_us must be a list"),
    # headers
    _bad("append-header-value-str",
         lambda log: log.append_sync(STREAM, b"v", headers={"h": "text"}),
         InvalidAppend, "headers"),
    _bad("append-header-name-bytes",
         lambda log: log.append(STREAM, b"v", headers={b"h": b"x"}), InvalidAppend, "headers"),
    _bad("append-headers-str", lambda log: log.append_sync(STREAM, b"v", headers="h=x"),
         InvalidAppend, "headers"),
    _bad("append-headers-triples",
         lambda log: log.append_sync(STREAM, b"v", headers=[("a", b"b", b"c")]),
         InvalidAppend, "headers"),
    _bad("append-headers-int", lambda log: log.append_sync(STREAM, b"v", headers=5),
         InvalidAppend, "headers"),
    # Headers the payload cannot encode: refused up front, not on the writer thread
    # (where the failure would mark the partition FAILED).
    _bad("append-header-name-too-long",
         lambda log: log.append_sync(STREAM, b"v", partition=0, headers={"x" * 70000: b"v"}),
         InvalidAppend, "header"),
    _bad("append-header-name-not-utf8",
         lambda log: log.append(STREAM, b"v", partition=0, headers={"\ud800": b"v"}),
         InvalidAppend, "header"),
    _bad("append-too-many-headers", lambda log: log.append_sync(
        STREAM, b"v", partition=0, headers=[(f"h{i}", b"") for i in range(70000)]),
         InvalidAppend, "header"),
    _bad("batch-headers-length",
         lambda log: log.append_batch_sync(STREAM, [b"a", b"b"], headers=[{"h": b"1"}]),
         InvalidAppend, "headers has 1 items"),
    # kinds and transactions
    _bad("append-kind-unknown", lambda log: log.append_sync(STREAM, b"v", kind=99),
         InvalidAppend, "kind"),
    _bad("batch-kinds-unknown", lambda log: log.append_batch_sync(STREAM, [b"a"], kinds=[9]),
         InvalidAppend, "kind"),
    _bad("append-txn-negative", lambda log: log.append_sync(STREAM, b"v", txn_id=-1),
         InvalidAppend, "txn_id"),
    _bad("append-txn-str", lambda log: log.append(STREAM, b"v", txn_id="1"),
         InvalidAppend, "txn_id"),
    # sizes
    _bad("append-oversize", lambda log: log.append_sync(STREAM, b"x" * 1025),
         InvalidAppend, "record_bytes_max"),
    _bad("append-oversize-with-key",
         lambda log: log.append(STREAM, b"x" * 1000, key=b"k" * 25),
         InvalidAppend, "record_bytes_max"),
    _bad("batch-last-oversize",
         lambda log: log.append_batch_sync(STREAM, [b"fine", b"x" * 2000], partition=0),
         InvalidAppend, "record 1 is 2000 bytes"),
    # partitions
    _bad("append-partition-out-of-range",
         lambda log: log.append_sync(STREAM, b"v", partition=2), InvalidArgument, r"0\.\.1"),
    _bad("append-partition-negative",
         lambda log: log.append(STREAM, b"v", partition=-1), InvalidArgument, "partitions"),
    _bad("append-partition-str", lambda log: log.append_sync(STREAM, b"v", partition="0"),
         InvalidArgument, "partitions"),
    _bad("append-partition-bool", lambda log: log.append_sync(STREAM, b"v", partition=True),
         InvalidArgument, "partitions"),
    _bad("batch-partition-out-of-range",
         lambda log: log.append_batch(STREAM, [b"a"], partition=5), InvalidArgument,
         "partitions"),
    # streams
    _bad("append-unknown-stream", lambda log: log.append_sync("nope", b"v"),
         UnknownStream, "nope"),
    _bad("append-async-unknown-stream", lambda log: log.append("nope", b"v"),
         UnknownStream, "nope"),
    _bad("batch-unknown-stream", lambda log: log.append_batch_sync("nope", [b"v"]),
         UnknownStream, "nope"),
    _bad("append-stream-int", lambda log: log.append_sync(5, b"v"), UnknownStream, "5"),
    _bad("append-stream-list", lambda log: log.append_sync([STREAM], b"v"), UnknownStream,
         "stream"),
    _bad("append-stream-bytes", lambda log: log.append_sync(STREAM.encode(), b"v"),
         UnknownStream, "stream"),
    # readers
    _bad("reader-from-offset-and-timestamp",
         lambda log: log.reader(STREAM, 0, from_offset=0, from_timestamp_us=0),
         InvalidArgument, "not both"),
    _bad("reader-to-offset-and-timestamp",
         lambda log: log.reader(STREAM, 0, to_offset=1, to_timestamp_us=0),
         InvalidArgument, "not both"),
    _bad("reader-past-end", lambda log: log.reader(STREAM, 0, from_offset=4),
         OffsetOutOfRange, "past its end"),
    _bad("reader-negative-offset", lambda log: log.reader(STREAM, 0, from_offset=-1),
         OffsetOutOfRange, "offset -1"),
    _bad("reader-offset-str", lambda log: log.reader(STREAM, 0, from_offset="0"),
         InvalidArgument, "from_offset"),
    _bad("reader-to-offset-float", lambda log: log.reader(STREAM, 0, to_offset=1.0),
         InvalidArgument, "to_offset"),
    _bad("reader-timestamp-float", lambda log: log.reader(STREAM, 0, from_timestamp_us=1.5),
         InvalidArgument, "from_timestamp_us"),
    _bad("reader-to-timestamp-str", lambda log: log.reader(STREAM, 0, to_timestamp_us="9"),
         InvalidArgument, "to_timestamp_us"),
    _bad("reader-partition", lambda log: log.reader(STREAM, 2), InvalidArgument, "partitions"),
    _bad("reader-unknown-stream", lambda log: log.reader("nope", 0), UnknownStream, "nope"),
    # offsets and maintenance
    _bad("offset-for-timestamp-stream", lambda log: log.offset_for_timestamp("nope", 0, 1),
         UnknownStream, "nope"),
    _bad("offset-for-timestamp-partition", lambda log: log.offset_for_timestamp(STREAM, 3, 1),
         InvalidArgument, "partitions"),
    _bad("offset-for-timestamp-str", lambda log: log.offset_for_timestamp(STREAM, 0, "soon"),
         InvalidArgument, "timestamp_us"),
    _bad("offset-for-timestamp-digits", lambda log: log.offset_for_timestamp(STREAM, 0, "5"),
         InvalidArgument, "timestamp_us"),
    _bad("offset-for-timestamp-float", lambda log: log.offset_for_timestamp(STREAM, 0, 1.5),
         InvalidArgument, "timestamp_us"),
    _bad("end-offset-partition", lambda log: log.end_offset(STREAM, 9), InvalidArgument,
         "partitions"),
    _bad("start-offset-stream", lambda log: log.start_offset("nope"), UnknownStream, "nope"),
    _bad("partition-count-stream", lambda log: log.partition_count("nope"), UnknownStream,
         "nope"),
    _bad("truncate-offset-str", lambda log: log.truncate_after(STREAM, 0, "1"),
         InvalidArgument, "offset"),
    _bad("truncate-before-start", lambda log: log.truncate_after(STREAM, 0, -5),
         OffsetOutOfRange, "start"),
    _bad("truncate-partition", lambda log: log.truncate_after(STREAM, 4, 0), InvalidArgument,
         "partitions"),
    _bad("create-stream-name-empty", lambda log: log.create_stream(""), InvalidArgument,
         "stream name"),
    _bad("create-stream-name-slash", lambda log: log.create_stream("a/b"), InvalidArgument,
         "stream name"),
    _bad("create-stream-name-dots", lambda log: log.create_stream(".."), InvalidArgument,
         "stream name"),
    _bad("create-stream-name-int", lambda log: log.create_stream(5), InvalidArgument,
         "stream name"),
    _bad("create-stream-zero-partitions", lambda log: log.create_stream("t", 0),
         InvalidArgument, "partitions"),
    _bad("create-stream-partitions-str", lambda log: log.create_stream("t", "2"),
         InvalidArgument, "partitions"),
    _bad("create-stream-partitions-bool", lambda log: log.create_stream("t", True),
         InvalidArgument, "partitions"),
    _bad("create-stream-too-many", lambda log: log.create_stream("t", 5000), InvalidArgument,
         "partitions"),
    _bad("create-stream-other-count", lambda log: log.create_stream(STREAM, 3),
         InvalidArgument, "has 2 partitions"),
]


@pytest.mark.parametrize("call, error, match", BAD_CALLS)
def test_bad_input_is_refused_clearly_and_loses_nothing(seeded, call, error, match):
    before = contents(seeded)
    ends = [seeded.end_offset(STREAM, p) for p in range(2)]
    with pytest.raises(error, match=match) as caught:
        run(call(seeded))
    assert isinstance(caught.value, StreamLogError)
    assert contents(seeded) == before
    assert [seeded.end_offset(STREAM, p) for p in range(2)] == ends
    assert seeded.streams() == [STREAM]
    # The log still works: the rejected call left nothing half done.
    assert seeded.append_sync(STREAM, b"after", partition=0).offset == ends[0]
    assert seeded.append_batch_sync(STREAM, [b"x", b"y"], partition=1).ranges == {
        1: (ends[1], ends[1] + 1)}


def test_invalid_append_is_a_value_error(seeded):
    with pytest.raises(ValueError):
        seeded.append_sync(STREAM, "text")


@pytest.mark.parametrize("timestamp, where", [(1 << 63, "end"), (1 << 64, "end"),
                                              (-(1 << 63) - 1, "start")])
def test_query_timestamps_outside_int64_are_refused_or_clamped(seeded, timestamp, where):
    expected = seeded.end_offset(STREAM, 0) if where == "end" else 0
    queries = [lambda: seeded.offset_for_timestamp(STREAM, 0, timestamp),
               lambda: next(iter(offsets(seeded.reader(STREAM, 0, from_timestamp_us=timestamp))),
                            seeded.end_offset(STREAM, 0))]
    for query in queries:
        try:
            got = query()
        except InvalidArgument:
            continue
        assert got == expected


def test_reader_bounds_at_the_edges(seeded):
    end = seeded.end_offset(STREAM, 0)
    assert offsets(seeded.reader(STREAM, 0, from_offset=end)) == []
    assert offsets(seeded.reader(STREAM, 0, from_offset=1, to_offset=end + 100)) == [1, 2]
    assert offsets(seeded.reader(STREAM, 0, from_offset=2, to_offset=1)) == []
    assert offsets(seeded.reader(STREAM, 0, from_offset=1, to_offset=1)) == []
    # timestamps 10, 30, 20: high-water marks 10, 30, 30
    assert offsets(seeded.reader(STREAM, 0, from_timestamp_us=25)) == [1, 2]
    assert offsets(seeded.reader(STREAM, 0, from_timestamp_us=31)) == []
    assert offsets(seeded.reader(STREAM, 0, to_timestamp_us=30)) == [0]
    assert offsets(seeded.reader(STREAM, 0, to_timestamp_us=-(1 << 63) + 1)) == []
    assert seeded.offset_for_timestamp(STREAM, 0, 31) == end
    assert seeded.offset_for_timestamp(STREAM, 0, -(1 << 63)) == 0


def test_extreme_timestamps_round_trip(log_dir, open_logs):
    log = open_logs(log_dir, fsync="never")
    log.create_stream(STREAM)
    extremes = [-(1 << 63) + 1, 0, (1 << 63) - 1, -5]
    log.append_batch_sync(STREAM, [b"a", b"b", b"c", b"d"], timestamps_us=extremes)
    assert [r.timestamp_us for r in log.reader(STREAM, 0)] == extremes
    assert offsets(log.reader(STREAM, 0, from_timestamp_us=(1 << 63) - 1)) == [2, 3]
    assert offsets(log.reader(STREAM, 0, from_timestamp_us=-(1 << 63) + 1)) == [0, 1, 2, 3]
    assert offsets(log.reader(STREAM, 0, to_timestamp_us=1)) == [0, 1]


async def test_async_batches_across_partitions(log_dir, open_logs):
    log = open_logs(log_dir, fsync="always")
    log.create_stream(STREAM, partitions=3)
    keys = [b"key-%d" % (i % 7) for i in range(50)]
    results = await asyncio.gather(*(
        log.append_batch(STREAM, [b"%d-%d" % (n, i) for i in range(50)], keys=keys,
                         timestamps_us=list(range(50)))
        for n in range(4)))
    for result in results:
        assert result.records == 50
        for p, (first, last) in result.ranges.items():
            got = list(log.reader(STREAM, p, from_offset=first, to_offset=last + 1))
            assert all(streamlog.partition_for_key(r.key, 3) == p for r in got)
            batch = int(got[0].value.split(b"-")[0])
            assert [r.value for r in got] == [b"%d-%d" % (batch, i) for i in range(50)
                                              if streamlog.partition_for_key(keys[i], 3) == p]
    assert sum(log.end_offset(STREAM, p) for p in range(3)) == 200


def test_text_values_mention_encode(seeded):
    with pytest.raises(InvalidAppend) as caught:
        seeded.append_batch_sync(STREAM, [b"a", "b"])
    assert "encode" in str(caught.value)
    assert "record 1" in str(caught.value)


def test_values_of_bytes_like_types_are_accepted(seeded):
    result = seeded.append_batch_sync(STREAM, [bytearray(b"ba"), memoryview(b"mv")],
                                      keys=[memoryview(b"k"), bytearray(b"")], partition=1,
                                      timestamps_us=[1, 2])
    first, _ = result.ranges[1]
    got = list(seeded.reader(STREAM, 1, from_offset=first))
    assert [(r.key, r.value) for r in got] == [(b"k", b"ba"), (b"", b"mv")]
    assert all(type(r.value) is bytes for r in got)


def test_closed_log_refuses_everything_with_log_closed(log_dir):
    log = streamlog.open_log(log_dir, fsync="never")
    log.create_stream(STREAM)
    log.append_sync(STREAM, b"kept")
    log.close()
    log.close()  # idempotent
    with pytest.raises(LogClosed):
        log.append_sync(STREAM, b"v")
    with pytest.raises(LogClosed):
        asyncio.run(log.append(STREAM, b"v"))
    with pytest.raises(LogClosed):
        log.append_batch_sync(STREAM, [b"v"])
    with pytest.raises(LogClosed):
        asyncio.run(log.append_batch(STREAM, [b"v"]))
    with pytest.raises(LogClosed):
        log.reader(STREAM, 0)
    with pytest.raises(LogClosed):
        log.create_stream("other")
    with pytest.raises(LogClosed):
        log.truncate_after(STREAM, 0, 0)
    with pytest.raises(LogClosed):
        log.end_offset(STREAM, 0)
    with streamlog.open_log(log_dir, readonly=True) as again:
        assert [r.value for r in again.reader(STREAM, 0)] == [b"kept"]


async def test_closed_log_refuses_async_appends(log_dir):
    log = streamlog.open_log(log_dir, fsync="never")
    log.create_stream(STREAM)
    await log.aclose()
    with pytest.raises(LogClosed):
        await log.append(STREAM, b"v")


def test_read_only_log_refuses_writes_with_read_only_log(log_dir):
    with streamlog.open_log(log_dir, fsync="never") as log:
        log.create_stream(STREAM, 2)
        log.append_sync(STREAM, b"kept", partition=1)
    with streamlog.open_log(log_dir, readonly=True) as log:
        with pytest.raises(ReadOnlyLog):
            log.append_sync(STREAM, b"v")
        with pytest.raises(ReadOnlyLog):
            asyncio.run(log.append(STREAM, b"v", partition=0))
        with pytest.raises(ReadOnlyLog):
            log.append_batch_sync(STREAM, [b"v"])
        with pytest.raises(ReadOnlyLog):
            asyncio.run(log.append_batch(STREAM, [b"v"]))
        with pytest.raises(ReadOnlyLog):
            log.create_stream("other")
        with pytest.raises(ReadOnlyLog):
            log.truncate_after(STREAM, 1, -1)
        assert log.create_stream(STREAM, 2) == 2  # exists already: nothing to write
        assert [r.value for r in log.reader(STREAM, 1)] == [b"kept"]
        assert log.end_offset(STREAM, 1) == 1


def test_read_only_open_of_a_missing_log_is_refused(log_dir):
    with pytest.raises(StreamLogError):
        streamlog.open_log(log_dir, readonly=True)
    assert not os.path.exists(log_dir)
    with pytest.raises(StreamLogError):
        streamlog.open_log(log_dir, create=False)
    assert not os.path.exists(log_dir)


def test_a_directory_that_is_not_a_log_is_refused(tmp_path):
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(StreamLogError, match="not a streamlog log"):
        streamlog.open_log(str(tmp_path))
    assert os.listdir(tmp_path) == ["precious.txt"]


# -- concurrency ---------------------------------------------------------------------------


async def test_group_commit_shares_fsyncs_between_concurrent_appends(log_dir, open_logs):
    log = open_logs(log_dir, fsync="always")
    log.create_stream(STREAM)
    count = 1000
    positions = await asyncio.gather(*(
        log.append(STREAM, b"value-%d" % i, key=b"%d" % i, timestamp_us=i)
        for i in range(count)))
    assert sorted(p.offset for p in positions) == list(range(count))
    stats = log.stats()[f"{STREAM}/0"]
    assert stats["records"] == count
    assert 1 <= stats["fsyncs"] <= count // 10, stats
    assert stats["writes"] <= count // 10, stats
    by_offset = {r.offset: r for r in log.reader(STREAM, 0)}
    for i, position in enumerate(positions):
        record = by_offset[position.offset]
        assert (record.key, record.value, record.timestamp_us) == (
            b"%d" % i, b"value-%d" % i, i)


def test_sync_appends_from_many_threads(log_dir, open_logs):
    log = open_logs(log_dir, fsync="always")
    log.create_stream(STREAM, partitions=2)
    threads_count, per_thread = 8, 60
    results: dict[int, list] = {}
    errors = []
    barrier = threading.Barrier(threads_count)

    def work(number: int) -> None:
        try:
            barrier.wait()
            mine = []
            for i in range(per_thread):
                if i % 3 == 0:
                    result = log.append_batch_sync(
                        STREAM, [b"t%d-%d-a" % (number, i), b"t%d-%d-b" % (number, i)],
                        partition=number % 2)
                    mine.append((result.ranges[number % 2][0], 2))
                else:
                    position = log.append_sync(STREAM, b"t%d-%d" % (number, i),
                                               partition=number % 2)
                    mine.append((position.offset, 1))
            results[number] = mine
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    expected_total = threads_count * per_thread + threads_count * (per_thread // 3)
    assert sum(log.end_offset(STREAM, p) for p in range(2)) == expected_total
    for p in range(2):
        records = list(log.reader(STREAM, p))
        assert [r.offset for r in records] == list(range(len(records)))
    for number, mine in results.items():
        by_offset = {r.offset: r.value for r in log.reader(STREAM, number % 2)}
        firsts = [first for first, _ in mine]
        assert firsts == sorted(firsts)  # one thread's appends land in its order
        for i, (first, count) in enumerate(mine):
            if count == 2:
                assert by_offset[first] == b"t%d-%d-a" % (number, i)
                assert by_offset[first + 1] == b"t%d-%d-b" % (number, i)
            else:
                assert by_offset[first] == b"t%d-%d" % (number, i)


def test_readers_during_appends_see_a_dense_prefix(log_dir, open_logs):
    """Readers (from disk, the ring, or both) racing the writer and segment rolls."""
    log = open_logs(log_dir, fsync="never", tail_ring_batches_max=2, read_chunk_bytes=1024,
                    **SEGMENT_SMALL)
    log.create_stream(STREAM)
    total = 600
    done = threading.Event()
    errors: list[BaseException] = []
    checks = []

    def write() -> None:
        for i in range(0, total, 3):
            log.append_batch_sync(STREAM, [b"%06d" % j + b"." * (j % 300) for j in
                                           range(i, i + 3)], timestamps_us=[i, i + 1, i + 2])
        done.set()

    def read() -> None:
        try:
            while not done.is_set():
                got = list(log.reader(STREAM, 0))
                assert [r.offset for r in got] == list(range(len(got)))
                assert all(r.value[:6] == b"%06d" % r.offset for r in got)
                middle = len(got) // 2  # timestamps equal offsets here
                tail = offsets(log.reader(STREAM, 0, from_timestamp_us=middle))
                if got:
                    assert tail[:1] == [middle]
                else:  # the writer may have started since
                    assert tail[:1] in ([], [0])
                checks.append(len(got))
                time.sleep(0.001)  # leave the writer some of the GIL
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    readers = [threading.Thread(target=read) for _ in range(3)]
    writer = threading.Thread(target=write)
    for thread in readers + [writer]:
        thread.start()
    for thread in [writer] + readers:
        thread.join(60)
    assert not errors, errors[0]
    assert checks and len(log._partition(STREAM, 0).segments) > 5
    assert offsets(log.reader(STREAM, 0)) == list(range(total))


# -- live tail -----------------------------------------------------------------------------


class SyncFollower(threading.Thread):
    """Follows a partition in a thread, noting when each record arrived."""

    def __init__(self, log, *, from_offset: int, to_offset: int, delay_s: float = 0.0):
        super().__init__(daemon=True)
        self.reader = log.reader(STREAM, 0, from_offset=from_offset, to_offset=to_offset,
                                 follow=True)
        self.delay_s = delay_s
        self.received: list = []
        self.arrival: dict[int, float] = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for record in self.reader:
                self.arrival[record.offset] = time.monotonic()
                self.received.append(record)
                if self.delay_s:
                    time.sleep(self.delay_s)
        except BaseException as error:  # noqa: BLE001 - checked by the test
            self.error = error


async def test_async_and_sync_followers_receive_new_records_without_polling(log_dir,
                                                                            open_logs):
    log = open_logs(log_dir, fsync="always")
    log.create_stream(STREAM)
    log.append_batch_sync(STREAM, [b"old-0", b"old-1"], timestamps_us=[1, 2])
    total = 2 + 5
    thread_follower = SyncFollower(log, from_offset=0, to_offset=total)
    thread_follower.start()
    received: list = []
    arrival: dict[int, float] = {}

    async def follow() -> None:
        async for record in log.reader(STREAM, 0, from_offset=0, follow=True):
            received.append(record)
            arrival[record.offset] = time.monotonic()
            if len(received) == total:
                return

    task = asyncio.create_task(follow())
    await asyncio.to_thread(wait_until, lambda: len(thread_follower.received) == 2)
    while len(received) < 2:
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.1)  # both are now waiting at the end
    assert not task.done()
    for i in range(5):
        appended = time.monotonic()
        position = await log.append(STREAM, b"new-%d" % i, timestamp_us=10 + i)
        await asyncio.to_thread(wait_until,
                                lambda: position.offset in thread_follower.arrival)
        while position.offset not in arrival:
            await asyncio.sleep(0.001)
        # The sync follower's wait has a 1 s safety timeout; a wake-up must beat it.
        assert thread_follower.arrival[position.offset] - appended < 0.5
        assert arrival[position.offset] - appended < 0.5
    await asyncio.wait_for(task, 5)
    await asyncio.to_thread(thread_follower.join, 5)
    assert thread_follower.error is None
    expected = [b"old-0", b"old-1"] + [b"new-%d" % i for i in range(5)]
    assert [r.value for r in received] == expected
    assert [r.value for r in thread_follower.received] == expected
    assert [r.offset for r in received] == list(range(total))


async def test_many_followers(log_dir, open_logs):
    log = open_logs(log_dir, fsync="never")
    log.create_stream(STREAM)
    total = 300

    async def follow() -> list[int]:
        got = []
        async for record in log.reader(STREAM, 0, follow=True, to_offset=total):
            got.append(record.offset)
        return got

    tasks = [asyncio.create_task(follow()) for _ in range(40)]
    threads = [SyncFollower(log, from_offset=0, to_offset=total) for _ in range(6)]
    for thread in threads:
        thread.start()
    await asyncio.sleep(0.05)
    for i in range(0, total, 10):
        await log.append_batch(STREAM, [b"%d" % j for j in range(i, i + 10)])
        await asyncio.sleep(0)
    results = await asyncio.wait_for(asyncio.gather(*tasks), 20)
    assert all(got == list(range(total)) for got in results)
    for thread in threads:
        await asyncio.to_thread(thread.join, 10)
        assert thread.error is None
        assert [r.offset for r in thread.received] == list(range(total))
        assert [r.value for r in thread.received] == [b"%d" % j for j in range(total)]


def test_slow_follower_falls_back_to_disk_and_receives_everything(log_dir, open_logs,
                                                                  monkeypatch):
    log = open_logs(log_dir, fsync="never", tail_ring_batches_max=2, **SEGMENT_SMALL)
    log.create_stream(STREAM)
    partition = log._partition(STREAM, 0)
    disk_reads = []
    original = View.disk_frames

    def counting(view, offset):
        if view.name == partition.name:
            disk_reads.append(offset)
        return original(view, offset)

    monkeypatch.setattr(View, "disk_frames", counting)
    batches, per_batch = 60, 5
    total = batches * per_batch
    follower = SyncFollower(log, from_offset=0, to_offset=total, delay_s=0.002)
    follower.start()
    for b in range(batches):
        log.append_batch_sync(STREAM, [b"%d-%d" % (b, i) + b"." * 100 for i in range(per_batch)],
                              timestamps_us=[b] * per_batch)
    follower.join(30)
    assert not follower.is_alive()
    assert follower.error is None
    assert [r.offset for r in follower.received] == list(range(total))
    assert [r.value for r in follower.received] == [
        b"%d-%d" % (b, i) + b"." * 100 for b in range(batches) for i in range(per_batch)]
    assert any(offset > 0 for offset in disk_reads), "the follower never fell behind the ring"
    assert len(partition.segments) > 1


async def test_closing_the_log_ends_followers(log_dir):
    log = streamlog.open_log(log_dir, fsync="never")
    log.create_stream(STREAM)
    log.append_sync(STREAM, b"one")
    thread_follower = SyncFollower(log, from_offset=0, to_offset=1000)
    thread_follower.start()

    async def follow():
        async for _ in log.reader(STREAM, 0, follow=True):
            pass

    task = asyncio.create_task(follow())
    await asyncio.sleep(0.1)
    await log.aclose()
    with pytest.raises(LogClosed):
        await asyncio.wait_for(task, 5)
    await asyncio.to_thread(thread_follower.join, 5)
    assert not thread_follower.is_alive()
    assert isinstance(thread_follower.error, LogClosed)
    assert [r.value for r in thread_follower.received] == [b"one"]


def test_follower_stops_at_to_timestamp(log_dir, open_logs):
    log = open_logs(log_dir, fsync="never")
    log.create_stream(STREAM)
    log.append_sync(STREAM, b"a", timestamp_us=10)
    follower = threading.Thread(target=lambda: got.extend(
        offsets(log.reader(STREAM, 0, follow=True, to_timestamp_us=100))), daemon=True)
    got: list[int] = []
    follower.start()
    for timestamp in (50, 20, 100, 5):  # offset 3 reaches 100: stop before it
        log.append_sync(STREAM, b"x", timestamp_us=timestamp)
    follower.join(10)
    assert not follower.is_alive()
    assert got == [0, 1, 2]


def test_follower_from_a_future_timestamp_skips_records_below_it(log_dir, open_logs):
    log = open_logs(log_dir, fsync="never")
    log.create_stream(STREAM)
    log.append_sync(STREAM, b"a", timestamp_us=10)
    got: list[int] = []
    reader = log.reader(STREAM, 0, from_timestamp_us=100, follow=True, to_offset=4)
    follower = threading.Thread(target=lambda: got.extend(offsets(reader)), daemon=True)
    follower.start()
    for timestamp in (20, 100, 30):  # offsets 1, 2, 3; high-water marks 20, 100, 100
        log.append_sync(STREAM, b"x", timestamp_us=timestamp)
    follower.join(10)
    assert not follower.is_alive()
    # What a reader made now, after the fact, returns:
    assert offsets(log.reader(STREAM, 0, from_timestamp_us=100)) == [2, 3]
    assert got == [2, 3]


def test_an_async_follower_whose_event_loop_is_gone_does_not_break_appends(log_dir,
                                                                          open_logs):
    log = open_logs(log_dir, fsync="never")
    log.create_stream(STREAM)
    log.append_sync(STREAM, b"one")

    async def follow_for_a_while() -> None:
        async def follow() -> None:
            async for _ in log.reader(STREAM, 0, follow=True):
                pass

        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(follow(), 0.2)

    asyncio.run(follow_for_a_while())  # the follower gave up; its event loop is closed
    assert log.append_sync(STREAM, b"two").offset == 1
    assert log.append_sync(STREAM, b"three").offset == 2
    assert [r.value for r in log.reader(STREAM, 0)] == [b"one", b"two", b"three"]


# -- fsync policies ------------------------------------------------------------------------


def test_fsync_interval(log_dir):
    log = streamlog.open_log(log_dir, fsync="interval", fsync_interval_ms=20)
    log.create_stream(STREAM)
    for i in range(50):
        log.append_sync(STREAM, b"%d" % i, timestamp_us=i)
    writes = log.stats()[f"{STREAM}/0"]["writes"]
    assert writes >= 1
    wait_until(lambda: log.stats()[f"{STREAM}/0"]["fsyncs"] >= 1, timeout=5)
    assert log.stats()[f"{STREAM}/0"]["fsyncs"] <= writes
    assert offsets(log.reader(STREAM, 0)) == list(range(50))
    log.close()
    with streamlog.open_log(log_dir, fsync="interval") as log:
        assert [r.value for r in log.reader(STREAM, 0)] == [b"%d" % i for i in range(50)]
        log.append_sync(STREAM, b"more")
        assert log.end_offset(STREAM, 0) == 51


async def test_fsync_never(log_dir):
    log = streamlog.open_log(log_dir, fsync="never")
    log.create_stream(STREAM)
    await asyncio.gather(*(log.append(STREAM, b"%d" % i) for i in range(100)))
    await asyncio.sleep(0.1)
    stats = log.stats()[f"{STREAM}/0"]
    assert stats["records"] == 100
    assert stats["fsyncs"] == 0
    await log.aclose()
    async with streamlog.open_log(log_dir, fsync="never") as log:
        assert sorted(r.value for r in log.reader(STREAM, 0)) == sorted(
            b"%d" % i for i in range(100))


def test_fsync_always_fsyncs_before_acknowledging(log_dir, open_logs):
    log = open_logs(log_dir, fsync="always")
    log.create_stream(STREAM)
    for i in range(5):
        log.append_sync(STREAM, b"%d" % i)
        stats = log.stats()[f"{STREAM}/0"]
        assert stats["fsyncs"] == stats["writes"] == i + 1


# -- retention -----------------------------------------------------------------------------


def segment_files(log_dir: str, partition: int = 0) -> list[str]:
    directory = os.path.join(log_dir, "streams", STREAM, str(partition))
    return sorted(n for n in os.listdir(directory) if n.endswith(".log"))


def fill(log, count: int, *, size: int = 1000, timestamp_us=lambda i: i) -> None:
    for i in range(count):
        log.append_sync(STREAM, b"%04d" % i + b"x" * (size - 4), timestamp_us=timestamp_us(i),
                        partition=0)


def test_retention_by_size_keeps_what_a_reader_holds(log_dir, open_logs):
    log = open_logs(log_dir, fsync="never", retention_bytes=3 * 4096, **SEGMENT_SMALL)
    log.create_stream(STREAM)
    fill(log, 40)
    bases = [int(name[:20]) for name in segment_files(log_dir)]
    assert len(bases) >= 10
    held_offset = bases[4] + 1  # inside the fifth segment
    held = log.reader(STREAM, 0, from_offset=held_offset)

    deleted = log.apply_retention()
    assert len(deleted) == 4
    assert log.start_offset(STREAM, 0) == bases[4]
    assert [int(n[:20]) for n in segment_files(log_dir)] == bases[4:]
    assert not any(os.path.exists(path) for path in deleted)
    assert [r.value[:4] for r in held] == [b"%04d" % i for i in range(held_offset, 40)]

    # The reader finished and let go: now the size bound applies.
    log.apply_retention()
    remaining = segment_files(log_dir)
    sizes = [os.path.getsize(os.path.join(log_dir, "streams", STREAM, "0", n))
             for n in remaining]
    assert sum(sizes) <= 3 * 4096
    start = log.start_offset(STREAM, 0)
    assert start == int(remaining[0][:20])
    assert [r.offset for r in log.reader(STREAM, 0)] == list(range(start, 40))
    assert [r.value[:4] for r in log.reader(STREAM, 0)] == [
        b"%04d" % i for i in range(start, 40)]
    with pytest.raises(OffsetOutOfRange, match="no longer"):
        log.reader(STREAM, 0, from_offset=start - 1)
    assert log.info()["streams"][STREAM]["partitions"][0]["start_offset"] == start
    log.close()
    with streamlog.open_log(log_dir, fsync="never", **SEGMENT_SMALL) as again:
        assert again.start_offset(STREAM, 0) == start
        assert offsets(again.reader(STREAM, 0)) == list(range(start, 40))
        again.append_sync(STREAM, b"next")
        assert again.end_offset(STREAM, 0) == 41


def test_retention_never_deletes_the_active_segment(log_dir, open_logs):
    log = open_logs(log_dir, fsync="never", retention_bytes=1, **SEGMENT_SMALL)
    log.create_stream(STREAM)
    fill(log, 10)
    log.apply_retention()
    assert len(segment_files(log_dir)) == 1
    end = log.end_offset(STREAM, 0)
    start = log.start_offset(STREAM, 0)
    assert start < end
    assert offsets(log.reader(STREAM, 0)) == list(range(start, end))


def test_retention_while_a_reader_is_reading_from_disk(log_dir, open_logs):
    # The reader is between frames of a segment when retention removes the segments
    # before it; it must carry on from where it was, not from a shifted position.
    log = open_logs(log_dir, fsync="never", retention_bytes=1, tail_ring_batches_max=2,
                    **SEGMENT_SMALL)
    log.create_stream(STREAM)
    fill(log, 40)
    records = iter(log.reader(STREAM, 0, from_offset=0))
    got = [next(records).offset for _ in range(7)]
    assert log.apply_retention()  # deletes the segments before offset 7
    got += [record.offset for record in records]
    assert got == list(range(40))


def test_an_abandoned_reader_does_not_block_retention(log_dir, open_logs):
    log = open_logs(log_dir, fsync="never", retention_bytes=1, **SEGMENT_SMALL)
    log.create_stream(STREAM)
    fill(log, 20)
    for record in log.reader(STREAM, 0, from_offset=0):
        if record.offset == 1:
            break
    log.reader(STREAM, 0, from_offset=0)  # never iterated
    gc.collect()
    assert log.apply_retention()
    assert log.start_offset(STREAM, 0) > 1


def test_a_closed_reader_lets_retention_go_on(log_dir, open_logs):
    log = open_logs(log_dir, fsync="never", retention_bytes=1, **SEGMENT_SMALL)
    log.create_stream(STREAM)
    fill(log, 20)
    with log.reader(STREAM, 0, from_offset=0) as reader:
        assert next(iter(reader)).offset == 0
        assert log.apply_retention() == []
    assert log.apply_retention()
    assert log.start_offset(STREAM, 0) > 1


def test_retention_by_age(log_dir, open_logs):
    day_us = 86_400 * 1_000_000
    now_us = 1_700_000_000_000_000
    log = open_logs(log_dir, fsync="never", retention_age_s=86_400.0, **SEGMENT_SMALL)
    log.create_stream(STREAM)
    # Records 0..19 are three days old, 20..39 are an hour old.
    fill(log, 40, timestamp_us=lambda i: now_us - (3 * day_us if i < 20 else 3600 * 10**6))
    boundary = next(b for b in (int(n[:20]) for n in segment_files(log_dir)) if b >= 20)
    deleted = log.apply_retention(now_us=now_us)
    start = log.start_offset(STREAM, 0)
    # Whole segments whose newest record is old go; the one that mixes old and new stays.
    assert start <= 20
    assert start == max(b for b in (int(n[:20]) for n in segment_files(log_dir)) if b <= 20)
    assert len(deleted) >= 1
    assert offsets(log.reader(STREAM, 0)) == list(range(start, 40))
    assert boundary in [int(n[:20]) for n in segment_files(log_dir)]
    # Nothing is old enough at an earlier "now".
    assert log.apply_retention(now_us=now_us - 2 * day_us) == []


def test_retention_disabled_by_default(log_dir, open_logs):
    log = open_logs(log_dir, fsync="never", **SEGMENT_SMALL)
    log.create_stream(STREAM)
    fill(log, 20)
    assert log.apply_retention(now_us=1 << 62) == []
    assert log.start_offset(STREAM, 0) == 0


def test_timestamp_bounds_keep_the_high_water_mark_of_deleted_records(log_dir, open_logs):
    options = dict(fsync="never", retention_bytes=1, **SEGMENT_SMALL)
    log = open_logs(log_dir, **options)
    log.create_stream(STREAM)
    log.append_sync(STREAM, b"x" * 3500, timestamp_us=100)  # segment 0
    log.append_sync(STREAM, b"y" * 3000, timestamp_us=50)   # segment 1
    log.append_sync(STREAM, b"z", timestamp_us=60)
    log.append_sync(STREAM, b"w" * 3500, timestamp_us=200)  # segment 3
    assert [int(n[:20]) for n in segment_files(log_dir)] == [0, 1, 3]
    # Offsets 1 and 2 have a high-water mark of 100 (record 0), so T=80 starts at 1.
    held = log.reader(STREAM, 0, from_offset=1)
    log.apply_retention()
    assert log.start_offset(STREAM, 0) == 1
    results = []
    for current in (log, None):
        if current is None:
            held.close()
            log.close()
            current = open_logs(log_dir, **options)
        results.append((current.offset_for_timestamp(STREAM, 0, 80),
                        offsets(current.reader(STREAM, 0, from_timestamp_us=80)),
                        offsets(current.reader(STREAM, 0, to_timestamp_us=80))))
    assert results == [(1, [1, 2, 3], [])] * 2


# -- truncate_after ------------------------------------------------------------------------


def two_batches(log) -> None:
    log.append_batch_sync(STREAM, [b"a%d" % i for i in range(10)],
                          keys=[b"k%d" % i if i % 2 else None for i in range(10)],
                          timestamps_us=list(range(10)),
                          headers=[{"n": b"%d" % i} if i % 3 == 0 else None
                                   for i in range(10)])
    log.append_batch_sync(STREAM, [b"b%d" % i for i in range(10)],
                          timestamps_us=[100 + i for i in range(10)])


@pytest.mark.parametrize("keep_through, new_end", [(14, 15), (9, 10), (3, 4), (19, 20),
                                                   (25, 20), (-1, 0)])
def test_truncate_after(log_dir, open_logs, keep_through, new_end):
    log = open_logs(log_dir, fsync="always")
    log.create_stream(STREAM)
    two_batches(log)
    before = contents(log)[0]
    assert log.truncate_after(STREAM, 0, keep_through) == new_end
    assert log.end_offset(STREAM, 0) == new_end
    assert contents(log)[0] == before[:new_end]
    assert log.append_sync(STREAM, b"after", timestamp_us=50).offset == new_end
    expected = before[:new_end] + [(new_end, 50, None, b"after", ())]
    assert contents(log)[0] == expected
    log.close()
    reopened = open_logs(log_dir, fsync="always")
    assert reopened.end_offset(STREAM, 0) == new_end + 1
    assert contents(reopened)[0] == expected
    assert reopened.append_sync(STREAM, b"again").offset == new_end + 1


def test_truncate_forgets_the_timestamps_it_cut(log_dir, open_logs):
    log = open_logs(log_dir, fsync="never")
    log.create_stream(STREAM)
    two_batches(log)  # offsets 10..19 have timestamps 100..109
    log.truncate_after(STREAM, 0, 12)  # keeps 100, 101, 102
    log.append_sync(STREAM, b"late", timestamp_us=50)  # offset 13, high-water mark 102
    for current in (log, None):
        if current is None:
            log.close()
            current = open_logs(log_dir, fsync="never")
        assert current.offset_for_timestamp(STREAM, 0, 105) == 14
        assert offsets(current.reader(STREAM, 0, from_timestamp_us=105)) == []
        assert current.offset_for_timestamp(STREAM, 0, 102) == 12
        assert offsets(current.reader(STREAM, 0, from_timestamp_us=101)) == [11, 12, 13]
        assert offsets(current.reader(STREAM, 0, to_timestamp_us=102)) == list(range(12))


def test_truncate_keeps_control_records_and_headers_of_the_cut_batch(log_dir, open_logs):
    log = open_logs(log_dir, fsync="never")
    log.create_stream(STREAM)
    log.append_batch_sync(STREAM, [b"d0", b"c1", b"d2", b"c3"], timestamps_us=[1, 2, 3, 4],
                          kinds=[0, RecordKind.COMMIT, 0, RecordKind.G_OPEN],
                          headers=[None, {"h": b"1"}, None, None], txn_id=7)
    log.truncate_after(STREAM, 0, 2)
    everything = list(log.reader(STREAM, 0, data_only=False, read_committed=False))
    assert [(r.offset, r.value, r.kind, r.headers, r.txn_id) for r in everything] == [
        (0, b"d0", RecordKind.DATA, (), 7), (1, b"c1", RecordKind.COMMIT, (("h", b"1"),), 7),
        (2, b"d2", RecordKind.DATA, (), 7)]
    assert offsets(log.reader(STREAM, 0, read_committed=False)) == [0, 2]


def test_truncating_a_commit_marker_reopens_the_transaction(log_dir, open_logs):
    log = open_logs(log_dir, fsync="never")
    log.create_stream(STREAM)
    txn_id = log.new_txn_id()
    log.append_batch_sync(STREAM, [b"a", b"b"], txn_id=txn_id)
    commit_offset = log.commit_txn(STREAM, 0, txn_id)
    assert [r.value for r in log.reader(STREAM, 0)] == [b"a", b"b"]
    log.truncate_after(STREAM, 0, commit_offset - 1)
    # The segments no longer hold the commit: what they say is the truth.
    assert log.txn_state(STREAM, 0, txn_id) is not TxnState.COMMITTED
    assert [r.value for r in log.reader(STREAM, 0)] == []


def test_a_follower_past_the_cut_is_told_about_the_truncation(log_dir, open_logs):
    log = open_logs(log_dir, fsync="never")
    log.create_stream(STREAM)
    log.append_batch_sync(STREAM, [b"%d" % i for i in range(20)])
    received: list[tuple[int, bytes]] = []
    errors: list[BaseException] = []

    def follow() -> None:
        try:
            for record in log.reader(STREAM, 0, follow=True, to_offset=25):
                received.append((record.offset, record.value))
        except StreamLogError as error:
            errors.append(error)

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    wait_until(lambda: len(received) == 20)
    log.truncate_after(STREAM, 0, 9)
    log.append_batch_sync(STREAM, [b"new%d" % i for i in range(15)])
    follower.join(10)
    assert not follower.is_alive()
    # Offsets 10..19 it delivered are gone and 10..19 now hold other records: the
    # follower cannot stay consistent by carrying on at offset 20, so it must be told.
    assert errors and isinstance(errors[0], OffsetOutOfRange)


def test_last_commit_forgets_a_commit_that_truncate_cut(log_dir, open_logs):
    """An exactly-once sink asks last_commit(tag) what it committed: after a truncate
    cut the latest commit, the answer is the one before it, even once new records
    occupy the cut offsets."""
    log = open_logs(log_dir)
    log.create_stream(STREAM)
    for batch in (1, 2):
        txn = log.new_txn_id()
        log.append_sync(STREAM, b"x", txn_id=txn)
        at = log.commit_txn(STREAM, 0, txn, tag="q", marker=b"%d" % batch)
    assert log.last_commit(STREAM, 0, "q") == b"2"
    log.truncate_after(STREAM, 0, at - 1)
    assert log.last_commit(STREAM, 0, "q") == b"1"
    log.append_sync(STREAM, b"y")
    log.append_sync(STREAM, b"z")
    assert log.last_commit(STREAM, 0, "q") == b"1"
    assert log.last_commit(STREAM, 0, "nobody") is None


def test_truncate_inside_a_transactions_first_frame_aborts_it(log_dir, open_logs):
    log = open_logs(log_dir)
    log.create_stream(STREAM)
    log.append_batch_sync(STREAM, [b"a", b"b"], partition=0, txn_id=9)
    log.commit_txn(STREAM, 0, 9)
    log.truncate_after(STREAM, 0, 0)  # keeps "a", cuts "b" and the commit
    assert log.txn_state(STREAM, 0, 9) is TxnState.ABORTED
    assert log.last_stable_offset(STREAM, 0) == log.end_offset(STREAM, 0)
    assert [r.value for r in log.reader(STREAM, 0)] == []


def test_a_read_committed_reader_stops_at_the_last_stable_offset(log_dir, open_logs):
    log = open_logs(log_dir)
    log.create_stream(STREAM)
    log.append_sync(STREAM, b"open", txn_id=5)
    log.append_sync(STREAM, b"plain")
    assert log.last_stable_offset(STREAM, 0) == 0
    assert [r.value for r in log.reader(STREAM, 0, from_offset=1)] == []
    assert [r.value for r in log.reader(STREAM, 0, from_offset=1,
                                        read_committed=False)] == [b"plain"]
    log.commit_txn(STREAM, 0, 5)
    assert [r.value for r in log.reader(STREAM, 0)] == [b"open", b"plain"]


def test_truncate_into_an_older_segment(log_dir, open_logs):
    log = open_logs(log_dir, fsync="never", **SEGMENT_SMALL)
    log.create_stream(STREAM)
    fill(log, 30)
    assert len(segment_files(log_dir)) > 3
    log.truncate_after(STREAM, 0, 4)
    assert log.end_offset(STREAM, 0) == 5
    assert [int(n[:20]) for n in segment_files(log_dir)][-1] <= 4
    fill(log, 3, timestamp_us=lambda i: 1000 + i)
    log.close()
    reopened = open_logs(log_dir, fsync="never", **SEGMENT_SMALL)
    got = list(reopened.reader(STREAM, 0))
    assert [r.offset for r in got] == list(range(8))
    assert [r.timestamp_us for r in got] == [0, 1, 2, 3, 4, 1000, 1001, 1002]


# -- one writer, and read-only opens ---------------------------------------------------------


def test_a_second_writer_process_appends_beside_the_first(log_dir, open_logs):
    """DESIGN 9: several processes may append to one log; each catches up with the
    other's frames before it writes, so offsets stay dense and nothing is lost."""
    log = open_logs(log_dir, fsync="never")
    log.create_stream(STREAM)
    log.append_sync(STREAM, b"mine")
    script = ("import sys, streamlog\n"
              "with streamlog.open_log(sys.argv[1]) as log:\n"
              "    print(log.append_sync('s', b'theirs').offset)\n")
    other = subprocess.run([sys.executable, "-c", script, log_dir], capture_output=True,
                           text=True, timeout=60)
    assert other.returncode == 0, other.stderr
    assert other.stdout.strip() == "1"
    assert "rebuilding" not in other.stderr  # the live writer's index was used as it is
    assert log.append_sync(STREAM, b"mine again").offset == 2
    assert [r.value for r in log.reader(STREAM, 0)] == [b"mine", b"theirs", b"mine again"]
    with pytest.raises(streamlog.LogLocked, match="already open for writing in this process"):
        streamlog.open_log(log_dir)
    reader_script = ("import sys, streamlog\n"
                     "with streamlog.open_log(sys.argv[1], readonly=True) as log:\n"
                     "    print([r.value for r in log.reader('s', 0)])\n")
    readonly = subprocess.run([sys.executable, "-c", reader_script, log_dir],
                              capture_output=True, text=True, timeout=60)
    assert readonly.returncode == 0, readonly.stderr
    assert readonly.stdout.strip() == "[b'mine', b'theirs', b'mine again']"
    log.close()
    repair = subprocess.run([sys.executable, "-m", "streamlog", "repair", log_dir],
                            capture_output=True, text=True, timeout=60)
    assert repair.returncode == 0, repair.stdout + repair.stderr


def test_a_second_writable_open_in_the_same_process_is_refused(log_dir, open_logs):
    # One Log per log directory and process (LMDB allows one environment per file per
    # process): the second open is told to share the first.
    log = open_logs(log_dir, fsync="never")
    log.create_stream(STREAM)
    with pytest.raises(StreamLogError, match="open for writing"):
        streamlog.open_log(log_dir, fsync="never")
    assert log.append_sync(STREAM, b"still mine").offset == 0
    with streamlog.open_log(log_dir, readonly=True) as reader_log:
        assert [r.value for r in reader_log.reader(STREAM, 0)] == [b"still mine"]
    log.close()
    with streamlog.open_log(log_dir, fsync="never") as second:
        assert second.end_offset(STREAM, 0) == 1


def snapshot(directory: str) -> dict[str, tuple]:
    """Every file and folder under `directory`: bytes and mtime (files), mtime (folders)."""
    out = {}
    for root, folders, files in os.walk(directory):
        out[root] = ("dir", os.stat(root).st_mtime_ns, sorted(folders), sorted(files))
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as handle:
                out[path] = ("file", os.stat(path).st_mtime_ns, handle.read())
    return out


def read_everything(log) -> None:
    for stream in log.streams():
        for p in range(log.partition_count(stream)):
            list(log.reader(stream, p))
            for batch in log.reader(stream, p).arrow():
                assert batch.num_rows
            log.offset_for_timestamp(stream, p, 5)
            list(log.reader(stream, p, from_timestamp_us=5, to_timestamp_us=50))
    log.info()


def make_log_with_data(log_dir: str) -> None:
    with streamlog.open_log(log_dir, fsync="interval", **SEGMENT_SMALL) as log:
        log.create_stream(STREAM, 2)
        log.create_stream("other")
        fill(log, 12)
        log.append_batch_sync("other", [b"o1", b"o2"], timestamps_us=[3, 1])
        log.append_sync(STREAM, b"p1", partition=1, headers={"h": b"v"})


@pytest.mark.parametrize("damage", ["none", "torn-tail", "no-index", "writer-open"])
def test_read_only_open_never_changes_a_file(log_dir, damage):
    make_log_with_data(log_dir)
    partition_dir = os.path.join(log_dir, "streams", STREAM, "0")
    writer = None
    if damage == "torn-tail":
        last = os.path.join(partition_dir, segment_files(log_dir)[-1])
        with open(last, "ab") as handle:
            handle.write(b"SLOG\x01" + b"\x00" * 30)  # a frame cut short
    elif damage == "no-index":
        for name in os.listdir(os.path.join(partition_dir, "index")):
            os.unlink(os.path.join(partition_dir, "index", name))
        os.rmdir(os.path.join(partition_dir, "index"))
    elif damage == "writer-open":
        writer = streamlog.open_log(log_dir, fsync="always", **SEGMENT_SMALL)
    time.sleep(0.02)  # so that a write would show in mtimes of any resolution
    before = snapshot(log_dir)
    try:
        with streamlog.open_log(log_dir, readonly=True) as log:
            assert log.streams() == ["other", STREAM]
            assert log.end_offset(STREAM, 0) == 12
            assert [r.value[:4] for r in log.reader(STREAM, 0)] == [
                b"%04d" % i for i in range(12)]
            read_everything(log)
            with pytest.raises(ReadOnlyLog):
                log.append_sync(STREAM, b"no")
            with pytest.raises(ReadOnlyLog):
                log.create_stream("new")
            with pytest.raises(ReadOnlyLog):
                log.truncate_after(STREAM, 0, 3)
            with pytest.raises(ReadOnlyLog):
                log.apply_retention()
    finally:
        after = snapshot(log_dir)
        if writer is not None:
            writer.close()
    assert after == before
