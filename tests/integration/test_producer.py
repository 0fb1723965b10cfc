"""The Producer (streamlog/producer.py): single records sent from plain threads
and from asyncio, written in group-committed batches.

What is checked, on real files: every handle resolves to a distinct offset and the log
holds exactly what was sent (value, key, timestamp, headers), in each thread's order per
partition; flush and close make it durable (the log is reopened); a full buffer blocks
a sender, then lets it through, or raises BufferFull when the log is stalled (fsync held
by a gate); a bad record fails only its own handle, a failed partition every handle of
its records; linger; and a child process SIGKILLed while sending, whose resolved
offsets must all be in the reopened log.

The machine is shared and noisy: no timing assert is tighter than seconds.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import streamlog
from streamlog import (BufferFull, InvalidAppend, InvalidArgument, LogClosed, PartitionFailed,
                       Producer, ProducerTimeout, ReadOnlyLog, UnknownStream)
from streamlog.fileio import OsFileIO

S = "events"
EPOCH_US = 1_700_000_000_000_000


class GatedFileIO(OsFileIO):
    """Real files whose fsync waits while `gate` is clear (a stalled disk), and raises
    once `fail` is set (a dying one)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.fail = False

    def fsync(self, handle: int) -> None:
        if not self.gate.wait(60):
            raise OSError("test gate never opened")
        if self.fail:
            raise OSError(5, "injected fsync failure")
        super().fsync(handle)


def records_of(log, partition: int = 0) -> list:
    return list(log.reader(S, partition))


def value_of(thread: int, seq: int) -> bytes:
    return b"t%d:s%d:" % (thread, seq) + bytes([seq % 251]) * (seq % 40)


@pytest.fixture
def gated(log_dir, open_logs):
    """A log whose fsync a test can hold or break; the gate is opened at teardown."""
    fileio = GatedFileIO()
    log = open_logs(log_dir, fsync="always", fileio=fileio)
    log.create_stream(S, partitions=1)
    yield log, fileio
    fileio.gate.set()


# -- many threads --------------------------------------------------------------------


def test_many_threads_get_distinct_offsets_in_their_order_and_the_log_holds_exactly_that(
        log_dir, open_logs):
    threads, per_thread, partitions = 8, 1500, 3
    log = open_logs(log_dir, fsync="always")
    log.create_stream(S, partitions=partitions)
    sent: dict[int, list] = {}
    with log.producer(S, linger_ms=20, batch_records=256) as producer:
        def run(thread: int) -> None:
            handles = []
            for seq in range(per_thread):
                key = None if seq % 5 == 0 else b"key-%d" % (seq % 11)
                headers = {"thread": b"%d" % thread} if seq % 97 == 0 else None
                handle = producer.send(value_of(thread, seq), key=key, headers=headers,
                                       timestamp_us=EPOCH_US + thread * 10**6 + seq)
                handles.append((seq, key, headers, handle))
            sent[thread] = handles

        workers = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(120)
        assert len(sent) == threads
        positions = {}
        for thread, handles in sent.items():
            for seq, key, headers, handle in handles:
                positions[(thread, seq)] = handle.result(timeout=60)
    assert len(set(positions.values())) == threads * per_thread  # all distinct

    stored = {(p, r.offset): r for p in range(partitions) for r in records_of(log, p)}
    assert len(stored) == threads * per_thread  # exactly what was sent, nothing else
    for thread, handles in sent.items():
        last_offset = {}
        for seq, key, headers, handle in handles:
            partition, offset = positions[(thread, seq)]
            record = stored[(partition, offset)]
            assert record.value == value_of(thread, seq)
            assert record.key == key
            assert record.timestamp_us == EPOCH_US + thread * 10**6 + seq
            assert record.headers == (tuple(headers.items()) if headers else ())
            if key is not None:
                assert partition == streamlog.partition_for_key(key, partitions)
            assert offset > last_offset.get(partition, -1), "a thread's order was lost"
            last_offset[partition] = offset
    # keyless records go "sticky" but not all to one partition over 1,200 of them
    keyless = {positions[(t, s)].partition for t in range(threads)
               for s in range(0, per_thread, 5)}
    assert len(keyless) > 1
    assert producer.stats["batches"] < threads * per_thread / 10  # batched, not one by one


def test_records_share_writes_and_fsyncs(log_dir, open_logs):
    log = open_logs(log_dir, fsync="always")
    log.create_stream(S)
    with log.producer(S, linger_ms=20) as producer:
        handles = [producer.send(b"v%d" % i, key=b"k") for i in range(20_000)]
    assert [h.result().offset for h in handles] == list(range(20_000))
    stats = log.stats()[f"{S}/0"]
    assert stats["records"] == 20_000
    assert stats["fsyncs"] <= 20_000 // 100, stats  # group commit, not one fsync a record


# -- durability ------------------------------------------------------------------------


def test_flush_makes_every_record_durable(log_dir):
    log = streamlog.open_log(log_dir, fsync="always")
    log.create_stream(S)
    producer = log.producer(S, linger_ms=60_000)  # only flush writes them
    handles = [producer.send(b"value-%d" % i, timestamp_us=EPOCH_US + i) for i in range(3000)]
    assert not handles[0].done()
    producer.flush(timeout=60)
    assert all(h.done() for h in handles)
    offsets = [h.result(0).offset for h in handles]
    with pytest.raises(TypeError, match="not a RecordPosition"):
        partition, offset = handles[0]  # a handle, not where the record landed
    producer.close()
    log.close()
    with streamlog.open_log(log_dir, readonly=True) as reopened:
        got = [(r.offset, r.value, r.timestamp_us) for r in records_of(reopened)]
    assert got == [(offsets[i], b"value-%d" % i, EPOCH_US + i) for i in range(3000)]


def test_close_flushes_and_a_send_after_close_raises(log_dir, open_logs):
    log = open_logs(log_dir, fsync="always")
    log.create_stream(S)
    producer = Producer(log, S, linger_ms=60_000)
    handles = [producer.send(b"x%d" % i) for i in range(10)]
    producer.close(timeout=60)
    assert [h.result(0).offset for h in handles] == list(range(10))
    with pytest.raises(LogClosed, match="closed"):
        producer.send(b"late")
    producer.close()  # idempotent
    assert [r.value for r in records_of(log)] == [b"x%d" % i for i in range(10)]


def test_records_of_a_log_closed_under_the_producer_fail_with_log_closed(log_dir):
    log = streamlog.open_log(log_dir, fsync="always")
    log.create_stream(S)
    producer = log.producer(S, linger_ms=60_000)
    handle = producer.send(b"never written")
    log.close()
    with pytest.raises(LogClosed):
        handle.result(timeout=30)  # failed, not dropped
    with pytest.raises(LogClosed):
        producer.send(b"after")
    producer.close(timeout=30)


# -- back-pressure ---------------------------------------------------------------------


def test_a_full_buffer_blocks_the_sender_until_the_log_catches_up(gated):
    log, fileio = gated
    record_bytes = 100 + 24
    producer = log.producer(S, linger_ms=1, buffer_bytes=10 * record_bytes,
                            block_ms_max=60_000)
    fileio.gate.clear()  # the disk stalls
    handles: list = []
    sender = threading.Thread(target=lambda: handles.extend(
        producer.send(b"%0100d" % i) for i in range(50)))
    sender.start()
    sender.join(0.5)
    assert sender.is_alive(), "the sender should be blocked on the full buffer"
    assert producer.buffered_bytes <= 10 * record_bytes
    fileio.gate.set()
    sender.join(60)
    assert not sender.is_alive()
    producer.close(timeout=60)
    assert [h.result(0).offset for h in handles] == list(range(50))
    assert [r.value for r in records_of(log)] == [b"%0100d" % i for i in range(50)]


def test_a_stalled_log_makes_send_raise_buffer_full_after_block_ms_max(gated):
    log, fileio = gated
    producer = log.producer(S, linger_ms=1, buffer_bytes=4096, block_ms_max=300)
    fileio.gate.clear()
    handles = []
    started = time.monotonic()
    with pytest.raises(BufferFull, match="buffer_bytes=4,096") as raised:
        for i in range(1000):
            handles.append(producer.send(b"%0100d" % i))
    assert time.monotonic() - started >= 0.25  # it waited block_ms_max first
    assert isinstance(raised.value, TimeoutError)
    assert 0 < len(handles) < 1000
    assert not any(h.done() for h in handles)
    with pytest.raises(ProducerTimeout, match="not acknowledged within 0.2 s"):
        producer.flush(timeout=0.2)
    fileio.gate.set()  # what was accepted before the errors is still written
    producer.close(timeout=60)
    assert [h.result(0).offset for h in handles] == list(range(len(handles)))


# -- errors ----------------------------------------------------------------------------


def test_an_invalid_record_fails_only_its_own_future(log_dir, open_logs):
    log = open_logs(log_dir, fsync="always", record_bytes_max=1024)
    log.create_stream(S, partitions=2)
    with log.producer(S, linger_ms=60_000) as producer:
        good = [producer.send(b"good-0", partition=0)]
        bad = [producer.send("text, not bytes", partition=0),
               producer.send(b"v", key="text key", partition=0),
               producer.send(b"v", timestamp_us=1 << 63, partition=0),
               producer.send(b"v", timestamp_us=1.5, partition=0),
               producer.send(b"v", partition=2),
               producer.send(b"v", partition=True),
               producer.send(b"x" * 2000, partition=0),
               producer.send(b"v", headers={"h": "text"}, partition=0)]
        good.append(producer.send(bytearray(b"good-1"), partition=0))
        for handle in bad:
            assert handle.done()  # failed at once, before any write
            assert isinstance(handle.exception(0), InvalidAppend)
        with pytest.raises(InvalidAppend, match="must be bytes"):
            bad[0].result(0)
        assert "partitions 0..1" in str(bad[4].exception(0))
        assert "limit is 1024" in str(bad[6].exception(0))
        producer.flush(timeout=60)
    assert [h.result(0) for h in good] == [(0, 0), (0, 1)]
    assert [r.value for r in records_of(log, 0)] == [b"good-0", b"good-1"]
    assert records_of(log, 1) == []
    assert producer.stats["failed"] == len(bad)


def test_a_failed_partition_fails_every_future_of_its_records(gated):
    log, fileio = gated
    producer = log.producer(S, linger_ms=1)
    first = producer.send(b"before")
    assert first.result(timeout=60).offset == 0
    fileio.fail = True
    handles = [producer.send(b"doomed-%d" % i) for i in range(200)]
    producer.flush(timeout=60)  # returns: a failure resolves the handles too
    for handle in handles:
        assert isinstance(handle.exception(0), PartitionFailed)
    later = producer.send(b"later")
    with pytest.raises(PartitionFailed):
        later.result(timeout=60)
    assert producer.stats["failed"] == 201
    producer.close(timeout=60)


def test_a_bad_partitioner_fails_its_record_and_a_good_one_is_used(log_dir, open_logs):
    log = open_logs(log_dir, fsync="never")
    log.create_stream(S, partitions=3)
    with log.producer(S, partitioner=lambda key, count: len(key or b"") % count) as producer:
        assert producer.send(b"v", key=b"ab").result(timeout=60).partition == 2
        assert producer.send(b"v").result(timeout=60).partition == 0
    with log.producer(S, partitioner=lambda key, count: 7) as producer:
        assert "partitioner returned 7" in str(producer.send(b"v").exception(timeout=60))


def test_bad_options_and_targets_are_refused(log_dir, open_logs):
    log = open_logs(log_dir, fsync="never")
    log.create_stream(S)
    for options in ({"linger_ms": -1}, {"batch_records": 0}, {"batch_records": 1 << 20},
                    {"batch_bytes": 1 << 40}, {"buffer_bytes": True},
                    {"partitioner": "key"}, {"block_ms_max": "1"},
                    {"linger_ms": float("inf")}):
        with pytest.raises(InvalidArgument):
            log.producer(S, **options)
    with pytest.raises(UnknownStream):
        log.producer("missing")
    log.close()
    with streamlog.open_log(log_dir, readonly=True) as view:
        with pytest.raises(ReadOnlyLog):
            Producer(view, S)


# -- callbacks, linger -----------------------------------------------------------------


def test_done_callbacks_run_once_with_the_handle(log_dir, open_logs):
    log = open_logs(log_dir, fsync="always")
    log.create_stream(S)
    seen, done = [], threading.Event()
    with log.producer(S, linger_ms=1) as producer:
        handles = [producer.send(b"c%d" % i) for i in range(100)]
        for handle in handles:
            handle.add_done_callback(lambda h: (seen.append(h.result(0).offset),
                                                len(seen) == 100 and done.set()))
        assert done.wait(60)
        late = []
        handles[0].add_done_callback(late.append)  # already done: called at once
    assert sorted(seen) == list(range(100))
    assert late == [handles[0]]


def test_a_lone_record_is_written_after_linger_ms_and_not_long_before(log_dir, open_logs):
    log = open_logs(log_dir, fsync="always")
    log.create_stream(S)
    with log.producer(S, linger_ms=20) as producer:
        started = time.monotonic()
        assert producer.send(b"alone").result(timeout=10).offset == 0
        assert time.monotonic() - started < 10
    with log.producer(S, linger_ms=3_000) as producer:
        handle = producer.send(b"waits")
        time.sleep(0.3)
        assert not handle.done()  # still lingering
        assert log.end_offset(S) == 1
        assert handle.result(timeout=30).offset == 1  # written when its linger ran out
        assert log.end_offset(S) == 2


# -- asyncio ---------------------------------------------------------------------------


def test_send_async_from_one_coroutine_without_a_task_per_record(log_dir, open_logs):
    log = open_logs(log_dir, fsync="always")
    log.create_stream(S, partitions=2)
    count = 5000

    async def main():
        tasks_before = len(asyncio.all_tasks())
        async with log.producer(S, linger_ms=2) as producer:
            handles = [await producer.send_async(b"a%d" % i, key=b"k%d" % (i % 3),
                                                 timestamp_us=EPOCH_US + i)
                       for i in range(count)]
            assert len(asyncio.all_tasks()) == tasks_before  # no task per record
            first, last = await handles[0], await handles[-1]
            await producer.flush_async(timeout=60)
        return first, last, [h.result(0) for h in handles]

    first, last, positions = asyncio.run(main())
    assert (first, last) == (positions[0], positions[-1])
    assert len(set(positions)) == count
    for i, (partition, offset) in enumerate(positions):
        assert partition == streamlog.partition_for_key(b"k%d" % (i % 3), 2)
    values = {(p, r.offset): r.value for p in range(2) for r in records_of(log, p)}
    assert values == {positions[i]: b"a%d" % i for i in range(count)}


def test_send_async_awaits_a_full_buffer_without_blocking_the_loop(gated):
    log, fileio = gated
    producer = log.producer(S, linger_ms=1, buffer_bytes=2048, block_ms_max=60_000)
    fileio.gate.clear()

    async def main():
        ticks = 0
        stop = asyncio.Event()

        async def ticker():  # runs only if send_async leaves the loop free
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        ticking = asyncio.create_task(ticker())
        loop = asyncio.get_running_loop()
        loop.call_later(0.5, fileio.gate.set)
        handles = [await producer.send_async(b"%0100d" % i) for i in range(200)]
        stop.set()
        await ticking
        positions = [await handle for handle in handles]
        return ticks, positions

    ticks, positions = asyncio.run(main())
    assert ticks >= 5  # the loop kept running while the sender waited for space
    assert [p.offset for p in positions] == list(range(200))
    producer.close(timeout=60)


def test_send_async_raises_buffer_full_when_the_log_stays_stalled(gated):
    log, fileio = gated
    producer = log.producer(S, linger_ms=1, buffer_bytes=2048, block_ms_max=200)
    fileio.gate.clear()

    async def main():
        for i in range(1000):
            await producer.send_async(b"%0100d" % i)

    with pytest.raises(BufferFull, match="waiting for the log"):
        asyncio.run(main())
    fileio.gate.set()
    producer.close(timeout=60)


# -- crash safety ----------------------------------------------------------------------

CHILD = textwrap.dedent("""
    import os, queue, sys, threading
    import streamlog

    log = streamlog.open_log(sys.argv[1], fsync="always")
    log.create_stream("events", partitions=2)
    producer = log.producer("events", linger_ms=2)
    resolved = queue.Queue(maxsize=64)

    def report():  # one line per resolved record: "A seq partition offset"
        while True:
            lines = []
            for seq, handle in resolved.get():
                partition, offset = handle.result()
                lines.append(f"A {seq} {partition} {offset}\\n")
            os.write(1, "".join(lines).encode())

    threading.Thread(target=report, daemon=True).start()
    seq = 0
    while True:  # until SIGKILL
        chunk = []
        for _ in range(200):
            chunk.append((seq, producer.send(b"seq-%d-" % seq + b"x" * (seq % 50),
                                             key=b"k%d" % (seq % 7),
                                             timestamp_us=1_700_000_000_000_000 + seq)))
            seq += 1
        resolved.put(chunk)
""")


def test_every_resolved_record_survives_a_sigkill(log_dir):
    """fsync="always": a handle resolves only once its batch is fsynced, so every offset
    the child printed is in the reopened log with its value, key and timestamp."""
    process = subprocess.Popen([sys.executable, "-c", CHILD, log_dir], text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while len(lines) < 5000 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    process.kill()  # SIGKILL, mid-stream
    process.wait(30)
    reader.join(30)
    acked = [tuple(map(int, line.split()[1:])) for line in lines if line.endswith("\n")]
    assert len(acked) >= 5000, process.stderr.read()[-2000:]
    with streamlog.open_log(log_dir, fsync="always") as log:  # recovery runs here
        stored = {(p, r.offset): r for p in range(2) for r in records_of(log, p)}
    assert len({(p, o) for _, p, o in acked}) == len(acked)  # distinct offsets
    for seq, partition, offset in acked:
        record = stored[(partition, offset)]
        assert record.value == b"seq-%d-" % seq + b"x" * (seq % 50)
        assert record.key == b"k%d" % (seq % 7)
        assert record.timestamp_us == 1_700_000_000_000_000 + seq
