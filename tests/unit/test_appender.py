"""Appender (appender.py): the group-commit writer thread, over a fake partition that
hands it a real segment file, with real threads."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import os
import threading
import time

import pytest

from streamlog.appender import Appender, Pending, Waiter
from streamlog.encoder import Piece
from streamlog.config import LogConfig
from streamlog.errors import LogClosed, PartitionFailed
from streamlog.frame import CODEC_MASK, CODEC_NONE, CODEC_ZSTD, INCOMPLETE, decode_frame
from streamlog.index import RecoveryPoint
from streamlog.payload import columns_to_records, decode_columns
from streamlog.records import RecordKind
from streamlog.segment import Segment
from streamlog.segments import Segments
from streamlog.state import PartitionState
from streamlog.testing.clock import ManualClock
from streamlog.testing import MemoryFileIO
from streamlog.testing.faultfs import FaultFileIO
from streamlog.txn import TxnState, encode_commit

WAIT_S = 10.0


class CountingClock(ManualClock):
    """A manual clock that counts how often the writer thread looks at it."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def monotonic_s(self) -> float:
        self.reads += 1
        return super().monotonic_s()


@dataclasses.dataclass
class Commit:
    """What the fake partition was told of one commit: the index's put, the state the
    writer published, and the batches handed to the live tail."""

    entries: list
    recovery: RecoveryPoint | None
    events: list
    next_offset: int = 0
    hwm_us: int | None = None
    end_position: int = 0
    published: list = dataclasses.field(default_factory=list)  # (base, Columns, hwm)

    @property
    def record_count(self) -> int:
        return sum(entry.record_count for entry in self.entries)


class FakeIndex:
    def __init__(self, partition: "FakePartition") -> None:
        self.partition = partition

    def put(self, entries, recovery, events) -> None:
        assert self.partition.locked
        self.partition.committed.append(Commit(list(entries), recovery, list(events)))

    def set_recovery_point(self, point) -> None:
        self.partition.events.append("sync_active")
        if self.partition.sync_error is not None:
            raise self.partition.sync_error

    def sync(self) -> None:
        self.partition.events.append("writer_close")


class FakeRing:
    def __init__(self, partition: "FakePartition") -> None:
        self.partition = partition

    def publish(self, batches, end_offset: int) -> None:
        assert self.partition.locked
        commit = self.partition.committed[-1]
        assert commit.next_offset == end_offset
        commit.published = list(batches)


class FakeExclusive:
    def __init__(self, partition: "FakePartition") -> None:
        self.partition = partition

    def __enter__(self) -> None:
        partition = self.partition
        partition.entered.set()
        if partition.gate is not None:
            assert partition.gate.wait(WAIT_S)
        assert not partition.locked
        partition.locked = True

    def __exit__(self, *exc) -> None:
        self.partition.locked = False


class FakePartition:
    """What the appender sees of a partition: the commit lock, its state (the end to
    append after, the segment to write to), and an index and a live tail that record
    what they are told.

    `gate`: entering the lock sets `entered`, then waits for the gate, so a test can
    hold the writer thread inside a commit while more appends queue up."""

    ack_gate = None  # acks go out at once (durability "local")

    def __init__(self, *, gate: threading.Event | None = None) -> None:
        self.name = "fake/0"
        self.config = LogConfig()
        self.clock = CountingClock()
        self.fileio = FaultFileIO(inner=MemoryFileIO())  # counts, faults; no disk
        self.directory = "/memory/fake"
        self.fileio.makedirs(self.directory)
        self.segment = Segment(self.fileio, self.directory, 0, writable=True, create=True)
        self.state = PartitionState(0, 0, None, None, Segments([self.segment]))
        self.committed: list[Commit] = []
        self.events: list = []  # ("record", next_offset), "sync_active", "writer_close", ...
        self.record_threads: set = set()
        self.sync_error: BaseException | None = None
        self.gate = gate
        self.entered = threading.Event()
        self.locked = False
        self.exclusive = FakeExclusive(self)
        self.index = FakeIndex(self)
        self.ring = FakeRing(self)

    @property
    def end_offset(self) -> int:
        return self.state.end_offset

    def publish(self, **changes) -> None:
        self.state = self.state._replace(**changes)

    def publish_end(self, end_offset: int, hwm_us, position: int) -> None:
        assert self.locked
        self.record_threads.add(threading.current_thread())
        commit = self.committed[-1]
        commit.next_offset, commit.hwm_us, commit.end_position = end_offset, hwm_us, position
        self.publish(end_offset=end_offset, hwm_us=hwm_us, active_position=position)
        self.events.append(("record", end_offset))


@pytest.fixture
def make():
    """`make(gate=None, **config)` -> (appender, partition); closed at teardown."""
    made: list[tuple[Appender, FakePartition]] = []

    def make_one(*, gate: threading.Event | None = None, **options):
        partition = FakePartition(gate=gate)
        appender = Appender(partition, LogConfig(**options).validate())
        made.append((appender, partition))
        return appender, partition

    yield make_one
    for appender, partition in made:
        if partition.gate is not None:
            partition.gate.set()
        appender.close()
        partition.segment.close()


def piece(values, *, timestamps=None, keys=None, kinds=None, headers=None, txn_id=0,
          nbytes=None) -> Piece:
    values = list(values)
    timestamps = list(timestamps) if timestamps is not None else [1000] * len(values)
    keys = list(keys) if keys is not None else [None] * len(values)
    size = nbytes if nbytes is not None else sum(map(len, values)) + 24 * len(values)
    return Piece(timestamps, keys, values, kinds, headers, size, txn_id)


def pending(*pieces: Piece, loop=None) -> Pending:
    return Pending(list(pieces), Waiter(loop), sum(p.nbytes for p in pieces))


def append(appender: Appender, *pieces: Piece) -> int:
    item = pending(*pieces)
    appender.submit(item)
    return item.waiter.wait()


def frames_written(segment: Segment) -> list:
    """Every frame in the segment file, decoded back to back from its first byte."""
    data = segment.read(0, segment.size_bytes)
    frames, position = [], 0
    while position < len(data):
        frame = decode_frame(data, position)
        assert frame is not INCOMPLETE
        frames.append(frame)
        position = frame.end_position
    return frames


def records_written(segment: Segment) -> list:
    return [record for frame in frames_written(segment)
            for record in columns_to_records(decode_columns(frame), 0, data_only=False)]


def wait_until(predicate, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


class Submitter(threading.Thread):
    """Submits one append from its own thread and waits for it."""

    def __init__(self, appender: Appender, item: Pending) -> None:
        super().__init__(daemon=True)
        self.appender, self.item = appender, item
        self.queued = threading.Event()
        self.result = self.error = None

    def run(self) -> None:
        try:
            self.appender.submit(self.item)
            self.queued.set()
            self.result = self.item.waiter.wait()
        except BaseException as error:  # noqa: BLE001 - checked by the test
            self.error = error


def hold_writer(appender: Appender, partition: FakePartition, first: Pending) -> None:
    """Queue `first` and return once the writer thread is inside its commit, stuck at
    the gate: whatever is submitted next waits in the queue."""
    appender.submit(first)
    assert partition.entered.wait(WAIT_S)


# -- group commit ----------------------------------------------------------------------------


def test_concurrent_submitters_share_one_write_one_fsync_and_one_frame(make):
    gate = threading.Event()
    appender, partition = make(gate=gate, compression="none")
    hold_writer(appender, partition, pending(piece([b"first"])))
    submitters = [Submitter(appender, pending(piece([b"v%02d" % n]))) for n in range(40)]
    for submitter in submitters:
        submitter.start()
    for submitter in submitters:
        assert submitter.queued.wait(WAIT_S)
    gate.set()
    for submitter in submitters:
        submitter.join(WAIT_S)
        assert submitter.error is None
    # The first append went alone; the 40 queued behind it went as one group.
    assert appender.stats == {"writes": 2, "fsyncs": 2, "frames": 2, "records": 41}
    assert partition.fileio.counts["pwrite"] == 2
    assert partition.fileio.counts["fsync"] == 2
    assert sorted(s.result for s in submitters) == list(range(1, 41))
    written = {r.offset: r.value for r in records_written(partition.segment)}
    assert written[0] == b"first"
    assert all(written[s.result] == s.item.pieces[0].values[0] for s in submitters)
    assert [c.record_count for c in partition.committed] == [1, 40]
    assert [c.next_offset for c in partition.committed] == [1, 41]
    assert [t.name for t in partition.record_threads] == ["streamlog-writer-fake/0"]


def test_record_gets_dense_commits_whose_entries_describe_the_frames_written(make):
    appender, partition = make(batch_records_max=2, compression="none")
    # One append of three pieces: frames [50, 10], [30] and [100, 5] (two records each
    # at most); the high-water mark is the running max across them.
    first = append(appender, piece([b"a", b"b"], timestamps=[50, 10]),
                   piece([b"c"], timestamps=[30]), piece([b"d", b"e"], timestamps=[100, 5]))
    assert first == 0
    frames = frames_written(partition.segment)
    (commit,) = partition.committed
    assert commit.next_offset == 5 and commit.record_count == 5 and commit.hwm_us == 100
    assert commit.end_position == partition.segment.size_bytes
    assert commit.recovery == RecoveryPoint(0, partition.segment.size_bytes, 5, 100)
    assert commit.events == []
    assert [(e.base_offset, e.record_count) for e in commit.entries] == [(0, 2), (2, 1), (3, 2)]
    assert [(f.base_offset, f.record_count) for f in frames] == [(0, 2), (2, 1), (3, 2)]
    for entry, frame in zip(commit.entries, frames):
        assert entry.segment_base == 0
        assert (entry.position, entry.frame_bytes) == (frame.position, frame.size)
        assert (entry.min_timestamp_us, entry.max_timestamp_us) == (
            frame.min_timestamp_us, frame.max_timestamp_us)
    assert [e.hwm_after_us for e in commit.entries] == [50, 50, 100]
    assert [hwm_before for _, _, hwm_before in commit.published] == [None, 50, 50]
    for (base, published, _), frame in zip(commit.published, frames):
        assert (base, len(published)) == (frame.base_offset, frame.record_count)
        assert bytes(published.values) == bytes(decode_columns(frame).values)

    # The next commit continues from the partition's end and running max.
    assert append(appender, piece([b"f"], timestamps=[7])) == 5
    second = partition.committed[-1]
    assert (second.next_offset, second.record_count, second.hwm_us) == (6, 1, 100)
    assert second.entries[0].base_offset == 5 and second.entries[0].hwm_after_us == 100
    assert second.entries[0].position == commit.end_position
    assert second.published[0][2] == 100
    assert second.recovery == RecoveryPoint(0, partition.segment.size_bytes, 6, 100)
    assert [(r.offset, r.value, r.timestamp_us) for r in records_written(partition.segment)] == [
        (0, b"a", 50), (1, b"b", 10), (2, b"c", 30), (3, b"d", 100), (4, b"e", 5), (5, b"f", 7)]


@pytest.mark.parametrize("policy", ["never", "interval"])
def test_without_fsync_always_no_recovery_point_and_no_fsync_per_commit(make, policy):
    appender, partition = make(fsync=policy, fsync_interval_ms=50)
    assert append(appender, piece([b"a"])) == 0
    assert append(appender, piece([b"b"])) == 1
    assert [c.recovery for c in partition.committed] == [None, None]
    assert partition.fileio.counts["fsync"] == 0
    assert appender.stats["fsyncs"] == 0
    assert "sync_active" not in partition.events  # the manual clock has not moved
    partition.clock.advance(1.0)
    if policy == "interval":
        wait_until(lambda: "sync_active" in partition.events)
        assert appender.stats["fsyncs"] == 1
    time.sleep(0.15)  # several intervals: nothing more is dirty
    assert partition.events.count("sync_active") == (1 if policy == "interval" else 0)


# -- frames ----------------------------------------------------------------------------------


@pytest.mark.parametrize("options, pieces, frame_counts, frame_txns", [
    # batch_records_max: [3, 1] fill a frame of 4, then [1, 2].
    (dict(batch_records_max=4),
     [piece([b"a"] * 3), piece([b"b"]), piece([b"c"]), piece([b"d"] * 2)], [4, 3], [0, 0]),
    # frame_bytes_max // 2 = 512 bytes a frame, by the pieces' declared sizes.
    (dict(frame_bytes_max=1024, record_bytes_max=256),
     [piece([b"a"], nbytes=300), piece([b"b"], nbytes=200), piece([b"c"], nbytes=100)],
     [2, 1], [0, 0]),
    # A frame holds one transaction id.
    (dict(), [piece([b"a"]), piece([b"b"], txn_id=7), piece([b"c"], txn_id=7),
              piece([b"d"], txn_id=9), piece([b"e"])], [1, 2, 1, 1], [0, 7, 9, 0]),
    # A piece is never split, even one over the record bound (the log cuts appends).
    (dict(batch_records_max=2), [piece([b"a"] * 5), piece([b"b"])], [5, 1], [0, 0]),
], ids=["batch_records_max", "frame_bytes_max", "txn_id", "whole-piece"])
def test_pieces_merge_into_as_few_frames_as_the_bounds_allow(make, options, pieces,
                                                             frame_counts, frame_txns):
    appender, partition = make(compression="none", **options)
    assert append(appender, *pieces) == 0
    frames = frames_written(partition.segment)
    assert [f.record_count for f in frames] == frame_counts
    assert [f.txn_id for f in frames] == frame_txns
    assert appender.stats["writes"] == 1 and appender.stats["frames"] == len(frame_counts)
    records = records_written(partition.segment)
    assert [r.offset for r in records] == list(range(sum(frame_counts)))
    assert [r.value for r in records] == [v for p in pieces for v in p.values]
    assert [r.txn_id for r in records] == [p.txn_id for p in pieces for _ in p.values]


def test_merged_pieces_keep_each_records_kind_and_headers(make):
    appender, partition = make(compression="none")
    tag_marker = encode_commit("query", b"batch-3")
    append(appender,
           piece([b"plain", b"plain2"], keys=[b"k", None]),
           piece([b"note"], kinds=[int(RecordKind.CHECKPOINT)], headers=[(("h", b"1"),)]),
           piece([b"t0", b"t1"], txn_id=5),
           piece([tag_marker], kinds=[int(RecordKind.COMMIT)], txn_id=5))
    frames = frames_written(partition.segment)
    assert [(f.base_offset, f.record_count, f.txn_id) for f in frames] == [(0, 3, 0), (3, 3, 5)]
    records = records_written(partition.segment)
    assert [(r.kind, r.key, r.value, r.headers) for r in records] == [
        (RecordKind.DATA, b"k", b"plain", ()), (RecordKind.DATA, None, b"plain2", ()),
        (RecordKind.CHECKPOINT, None, b"note", (("h", b"1"),)),
        (RecordKind.DATA, None, b"t0", ()), (RecordKind.DATA, None, b"t1", ()),
        (RecordKind.COMMIT, None, tag_marker, ())]
    (commit,) = partition.committed
    assert commit.events == [(5, TxnState.OPEN, 3, None, None),
                             (5, TxnState.COMMITTED, 5, "query", b"batch-3")]


COMPRESSIBLE = [b"the same words again and again " * 40 for _ in range(3)]
RANDOM = [os.urandom(1200) for _ in range(3)]
SMALL = [b"x" * 100 for _ in range(3)]


@pytest.mark.parametrize("mode, values, codec", [
    ("none", COMPRESSIBLE, CODEC_NONE),
    ("zstd", COMPRESSIBLE, CODEC_ZSTD),
    ("auto", COMPRESSIBLE, CODEC_ZSTD),
    ("auto", RANDOM, CODEC_NONE),
    ("zstd", SMALL, CODEC_NONE),  # under 512 raw bytes: never worth it
], ids=["none", "zstd", "auto", "auto-incompressible", "zstd-small"])
def test_compression_modes_store_frames_that_decode_to_the_same_values(make, mode, values,
                                                                      codec):
    appender, partition = make(compression=mode)
    append(appender, piece(values))
    (frame,) = frames_written(partition.segment)
    assert frame.codec == codec
    if codec == CODEC_ZSTD:
        assert len(frame.payload) < frame.raw_bytes
    else:
        assert len(frame.payload) == frame.raw_bytes
    assert [r.value for r in records_written(partition.segment)] == values
    # The live tail is handed the raw payload, whatever is stored.
    ((base, published, _),) = partition.committed[0].published
    assert base == 0
    assert len(published.raw) == frame.raw_bytes
    assert bytes(published.values) == b"".join(values)


@pytest.mark.parametrize("mode", ["auto", "zstd"])
def test_auto_backs_off_after_a_frame_that_did_not_compress(make, mode):
    appender, partition = make(compression=mode, fsync="never")
    append(appender, piece(RANDOM))
    for _ in range(40):
        append(appender, piece(COMPRESSIBLE))
    codecs = [f.codec for f in frames_written(partition.segment)]
    assert codecs[0] == CODEC_NONE
    if mode == "auto":  # a while stored raw, then zstd is tried (and pays) again
        assert codecs[1] == CODEC_NONE and codecs[-1] == CODEC_ZSTD
    else:
        assert codecs[1:] == [CODEC_ZSTD] * 40
    assert len(records_written(partition.segment)) == 3 * 41


# -- back-pressure ---------------------------------------------------------------------------


def test_submit_blocks_while_inflight_appends_max_are_queued(make):
    gate = threading.Event()
    appender, partition = make(gate=gate, inflight_appends_max=2)
    first = pending(piece([b"a"]))
    hold_writer(appender, partition, first)
    queued = [pending(piece([b"b"])), pending(piece([b"c"]))]
    for item in queued:
        appender.submit(item)  # two fit the window: neither blocks
    blocked = Submitter(appender, pending(piece([b"d"])))
    blocked.start()
    assert not blocked.queued.wait(0.2)
    gate.set()
    assert blocked.queued.wait(WAIT_S)
    blocked.join(WAIT_S)
    assert [first.waiter.wait()] + [p.waiter.wait() for p in queued] + [blocked.result] == [
        0, 1, 2, 3]
    assert [r.value for r in records_written(partition.segment)] == [b"a", b"b", b"c", b"d"]


def test_submit_blocks_while_inflight_bytes_max_are_queued(make):
    gate = threading.Event()
    appender, partition = make(gate=gate, inflight_bytes_max=1000)
    hold_writer(appender, partition, pending(piece([b"a"], nbytes=600)))
    appender.submit(pending(piece([b"b"], nbytes=600)))  # the queue was empty
    blocked = Submitter(appender, pending(piece([b"c"], nbytes=600)))
    blocked.start()
    assert not blocked.queued.wait(0.2)  # 600 + 600 > 1000
    gate.set()
    blocked.join(WAIT_S)
    assert blocked.result == 2
    # The writer takes at most inflight_bytes_max a group: three appends, three writes.
    assert appender.stats["writes"] == 3


def test_an_append_over_the_byte_window_goes_through_alone(make):
    gate = threading.Event()
    appender, partition = make(gate=gate, inflight_bytes_max=1000)
    hold_writer(appender, partition, pending(piece([b"a"])))
    big = pending(piece([b"big"], nbytes=5000))
    appender.submit(big)  # nothing queued: it does not block, however large
    small = Submitter(appender, pending(piece([b"small"], nbytes=1)))
    small.start()
    assert not small.queued.wait(0.2)  # the window is over full until it is taken
    gate.set()
    small.join(WAIT_S)
    assert (big.waiter.wait(), small.result) == (1, 2)


async def test_submit_async_awaits_without_blocking_the_event_loop(make):
    gate = threading.Event()
    appender, partition = make(gate=gate, inflight_appends_max=1)
    loop = asyncio.get_running_loop()
    first = pending(piece([b"a"]), loop=loop)
    await appender.submit_async(first)
    assert await asyncio.to_thread(partition.entered.wait, WAIT_S)
    second = pending(piece([b"b"]), loop=loop)
    await appender.submit_async(second)  # the queue was empty
    third = pending(piece([b"c"]), loop=loop)
    task = asyncio.ensure_future(appender.submit_async(third))
    await asyncio.sleep(0.2)  # the loop runs on while the submit waits for room
    assert not task.done()
    gate.set()
    await asyncio.wait_for(task, WAIT_S)
    results = await asyncio.wait_for(
        asyncio.gather(first.waiter.future, second.waiter.future, third.waiter.future), WAIT_S)
    assert results == [0, 1, 2]


async def test_async_waiters_are_resolved_on_their_loop(make):
    appender, partition = make(fsync="never")
    loop = asyncio.get_running_loop()

    async def one(n: int) -> int:
        item = pending(piece([b"%d" % n]), loop=loop)
        await appender.submit_async(item)
        return await item.waiter.future

    results = await asyncio.wait_for(asyncio.gather(*(one(n) for n in range(30))), WAIT_S)
    assert sorted(results) == list(range(30))
    written = {r.offset: r.value for r in records_written(partition.segment)}
    assert all(written[offset] == b"%d" % n for n, offset in enumerate(results))


# -- sticky failure --------------------------------------------------------------------------


def test_a_failed_write_fails_every_waiter_and_every_later_append(make):
    gate = threading.Event()
    appender, partition = make(gate=gate)
    partition.fileio.inject_eio("pwrite")
    first = pending(piece([b"a"]))
    hold_writer(appender, partition, first)
    queued = [pending(piece([b"b"])), pending(piece([b"c"]))]
    for item in queued:
        appender.submit(item)
    gate.set()
    for item in [first] + queued:
        with pytest.raises(PartitionFailed):
            item.waiter.wait()
    assert isinstance(appender.failed, OSError) and appender.failed.errno == errno.EIO
    with pytest.raises(PartitionFailed, match="reopen"):
        appender.submit(pending(piece([b"d"])))
    # Nothing was written after the failure, nothing was fsynced, nothing recorded.
    assert partition.fileio.counts["pwrite"] == 1
    assert partition.fileio.counts["fsync"] == 0
    assert partition.committed == []
    appender.close()
    assert "writer_close" not in partition.events


async def test_a_failed_partition_refuses_async_appends(make):
    appender, partition = make()
    partition.fileio.inject_eio("pwrite")
    loop = asyncio.get_running_loop()
    first = pending(piece([b"a"]), loop=loop)
    await appender.submit_async(first)
    with pytest.raises(PartitionFailed):
        await asyncio.wait_for(first.waiter.future, WAIT_S)
    with pytest.raises(PartitionFailed):
        await appender.submit_async(pending(piece([b"b"]), loop=loop))


def test_a_failed_fsync_is_never_retried(make):
    appender, partition = make(fsync="always")
    partition.fileio.inject_eio("fsync")
    with pytest.raises(PartitionFailed):
        append(appender, piece([b"a"]))
    assert partition.fileio.counts["fsync"] == 1
    assert partition.committed == []  # written, but never acknowledged nor indexed
    for value in (b"b", b"c"):
        with pytest.raises(PartitionFailed):
            append(appender, piece([value]))
    appender.close()
    assert partition.fileio.counts["fsync"] == 1
    assert partition.fileio.counts["pwrite"] == 1
    assert "writer_close" not in partition.events


def test_a_failed_interval_fsync_fails_the_partition_once(make):
    appender, partition = make(fsync="interval", fsync_interval_ms=20)
    partition.sync_error = OSError(errno.EIO, "injected")
    assert append(appender, piece([b"a"])) == 0
    partition.clock.advance(1.0)
    wait_until(lambda: appender.failed is not None)
    assert appender.failed is partition.sync_error
    with pytest.raises(PartitionFailed):
        appender.submit(pending(piece([b"b"])))
    partition.clock.advance(1.0)
    time.sleep(0.1)
    appender.close()
    assert partition.events.count("sync_active") == 1
    assert "writer_close" not in partition.events


def test_a_failed_interval_fsync_leaves_the_writer_thread_idle(make):
    appender, partition = make(fsync="interval", fsync_interval_ms=20)
    partition.sync_error = OSError(errno.EIO, "injected")
    append(appender, piece([b"a"]))
    partition.clock.advance(1.0)
    wait_until(lambda: appender.failed is not None)
    before = partition.clock.reads
    time.sleep(0.3)
    # An idle writer looks at the clock when it wakes; one that waits on its
    # condition does so a handful of times in 0.3 s, not tens of thousands.
    assert partition.clock.reads - before < 100


# -- jobs ------------------------------------------------------------------------------------


def test_a_job_runs_on_the_writer_thread_between_appends(make):
    gate = threading.Event()
    appender, partition = make(gate=gate)
    seen = {}

    def job():
        seen["thread"] = threading.current_thread()
        seen["end"] = partition.end_offset
        partition.events.append("job")
        return "done"

    first = pending(piece([b"a"]))
    hold_writer(appender, partition, first)
    the_job = Pending([], Waiter(), 0, job)
    after = pending(piece([b"b"]))
    appender.submit(the_job)
    appender.submit(after)
    gate.set()
    assert the_job.waiter.wait() == "done"
    assert (first.waiter.wait(), after.waiter.wait()) == (0, 1)
    assert seen["end"] == 1
    assert partition.record_threads == {seen["thread"]}
    assert seen["thread"] is not threading.current_thread()
    assert partition.events == [("record", 1), "job", ("record", 2)]


def test_a_job_error_goes_to_its_caller_and_the_partition_carries_on(make):
    appender, partition = make()
    error = ValueError("not mine")

    def job():
        raise error

    item = Pending([], Waiter(), 0, job)
    appender.submit(item)
    with pytest.raises(ValueError) as raised:
        item.waiter.wait()
    assert raised.value is error
    assert appender.failed is None
    assert append(appender, piece([b"a"])) == 0


def test_an_io_error_in_a_job_is_sticky(make):
    appender, partition = make()

    def job():
        raise OSError(errno.EIO, "disk gone")

    item = Pending([], Waiter(), 0, job)
    appender.submit(item)
    with pytest.raises(PartitionFailed, match="disk gone"):
        item.waiter.wait()
    with pytest.raises(PartitionFailed):
        append(appender, piece([b"a"]))


def test_a_job_can_append_through_write_from_job(make):
    appender, partition = make()
    append(appender, piece([b"a", b"b"]))
    item = Pending([], Waiter(), 0,
                   lambda: appender.write_from_job([piece([b"c"]), piece([b"d"])]))
    appender.submit(item)
    assert item.waiter.wait() == 2
    assert append(appender, piece([b"e"])) == 4
    assert [r.value for r in records_written(partition.segment)] == [b"a", b"b", b"c", b"d",
                                                                     b"e"]
    assert [c.next_offset for c in partition.committed] == [2, 4, 5]


# -- close -----------------------------------------------------------------------------------


def test_close_drains_the_queue_then_closes_the_writer(make):
    gate = threading.Event()
    appender, partition = make(gate=gate)
    first = pending(piece([b"a"]))
    hold_writer(appender, partition, first)
    queued = [pending(piece([b"b"])), pending(piece([b"c"]))]
    for item in queued:
        appender.submit(item)
    closer = threading.Thread(target=appender.close, daemon=True)
    closer.start()
    time.sleep(0.1)
    assert closer.is_alive()  # it waits for the queue to drain
    with pytest.raises(LogClosed):
        appender.submit(pending(piece([b"late"])))
    gate.set()
    closer.join(WAIT_S)
    assert not closer.is_alive()
    assert "streamlog-writer-fake/0" not in [t.name for t in threading.enumerate()]
    assert [item.waiter.wait() for item in [first] + queued] == [0, 1, 2]
    assert partition.events == [("record", 1), ("record", 3), "sync_active", "writer_close"]
    assert [r.value for r in records_written(partition.segment)] == [b"a", b"b", b"c"]
    appender.close()  # again: nothing more happens
    assert partition.events.count("writer_close") == 1
