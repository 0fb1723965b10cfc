"""Reader (reader.py): ranges, the live tail and the disk, transactions, Arrow, holds
against retention and truncation, over a real log."""

from __future__ import annotations

import threading
import time

import pytest

from streamlog import OffsetOutOfRange, RecordKind
from streamlog.reader import Reader
from streamlog.testing import MemoryFileIO
from streamlog.testing.memindex import MemoryIndexStorage
from streamlog.txn import encode_commit
from streamlog.view import View

STREAM = "s"
WAIT_S = 10.0
SEGMENT_SMALL = dict(segment_bytes_max=4096, compression="none")


@pytest.fixture
def make_log(open_logs):
    """`make_log(**options)`: a log with stream `s` of one partition, fsync never, on
    an in-memory file system with an in-memory index (no disk: the reader's logic is
    what is tested here; tests/integration read real files). Made again with the same
    options, it is the same log, opened again."""
    fileio, index_storage = MemoryFileIO(), MemoryIndexStorage()

    def make(**options):
        log = open_logs("/memory/log", fsync="never", fileio=fileio,
                        index_storage=index_storage, **options)
        if STREAM not in log.streams():
            log.create_stream(STREAM)
        return log
    return make


def fill_batches(log, batches: int, per_batch: int) -> list[bytes]:
    """Append `batches` appends of `per_batch` records (one frame each); record n has
    value b"rNN" and timestamp 10 * n."""
    out = []
    for b in range(batches):
        values = [b"r%02d" % (b * per_batch + i) for i in range(per_batch)]
        log.append_batch_sync(STREAM, values,
                              timestamps_us=[10 * (b * per_batch + i) for i in range(per_batch)])
        out += values
    return out


def reopen(log, make_log, **options):
    """Close and open again: the live tail starts empty, so reads go to the segments."""
    log.close()
    log = make_log(**options)
    assert log._partition(STREAM, 0).ring.find(0) is None
    return log


def pairs(records) -> list[tuple[int, bytes]]:
    return [(r.offset, r.value) for r in records]


def arrow_rows(reader, **options) -> list[tuple]:
    rows = []
    for batch in reader.arrow(**options):
        table = batch.to_pydict()
        timestamps = batch.column("timestamp").cast("int64").to_pylist()
        rows += [(table["partition"][i], table["offset"][i], timestamps[i], table["key"][i],
                  table["value"][i])
                 + ((tuple((h["key"], h["value"]) for h in table["headers"][i] or ()),)
                    if "headers" in table else ())
                 for i in range(batch.num_rows)]
    return rows


def record_rows(reader, *, headers: bool = False) -> list[tuple]:
    return [(r.partition, r.offset, r.timestamp_us, r.key, r.value)
            + ((r.headers,) if headers else ()) for r in reader]


def watch_disk(monkeypatch, partition, *, forbid: bool = False) -> list[int]:
    """Record the base offset of each frame read from the partition's segments (or
    forbid reading them)."""
    reads: list[int] = []
    original = View.disk_frames

    def disk_frames(view, offset):
        if view.name != partition.name:
            yield from original(view, offset)
            return
        assert not forbid, f"read offset {offset} from the segments"
        for frame in original(view, offset):
            reads.append(frame.base_offset)
            yield frame

    monkeypatch.setattr(View, "disk_frames", disk_frames)
    return reads


class Follower(threading.Thread):
    """Iterates a reader in its own thread; `has(n)` waits until n records came."""

    def __init__(self, reader: Reader) -> None:
        super().__init__(daemon=True)
        self.reader = reader
        self.received: list = []
        self.error: BaseException | None = None
        self._arrived = threading.Condition()

    def run(self) -> None:
        try:
            for record in self.reader:
                with self._arrived:
                    self.received.append(record)
                    self._arrived.notify_all()
        except BaseException as error:  # noqa: BLE001 - checked by the test
            self.error = error

    def has(self, count: int, timeout: float = WAIT_S) -> bool:
        with self._arrived:
            return self._arrived.wait_for(lambda: len(self.received) >= count, timeout)


# -- ranges ----------------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["tail", "disk"])
@pytest.mark.parametrize("start, stop", [(0, None), (3, None), (7, 13), (7, 8), (7, 7),
                                         (12, 10), (19, None), (20, None), (4, 100)])
def test_reads_any_range_of_offsets_across_batch_boundaries(make_log, monkeypatch, source,
                                                            start, stop):
    log = make_log()
    values = fill_batches(log, 4, 5)
    if source == "disk":
        log = reopen(log, make_log)
    reads = watch_disk(monkeypatch, log._partition(STREAM, 0), forbid=source == "tail")
    end = min(20 if stop is None else stop, 20)
    expected = [(n, values[n]) for n in range(start, end)]
    assert pairs(log.reader(STREAM, 0, from_offset=start, to_offset=stop)) == expected
    rows = arrow_rows(log.reader(STREAM, 0, from_offset=start, to_offset=stop))
    assert [(offset, value) for _, offset, _, _, value in rows] == expected
    if source == "disk" and expected:
        assert reads[0] == start - start % 5  # the frame holding the start


def test_a_start_outside_the_log_is_refused(make_log):
    log = make_log()
    fill_batches(log, 2, 3)
    with pytest.raises(OffsetOutOfRange, match="past its end"):
        log.reader(STREAM, 0, from_offset=7)
    partition = log._partition(STREAM, 0)
    with pytest.raises(OffsetOutOfRange, match="no longer"):
        Reader(partition, start_offset=-1)
    assert partition.min_hold() is None  # a refused reader holds nothing
    with Reader(partition, start_offset=6) as at_end:
        assert list(at_end) == []


def test_a_reader_over_a_prefix_does_not_read_the_frames_past_it(make_log, monkeypatch):
    log = make_log()
    fill_batches(log, 4, 5)
    log = reopen(log, make_log)
    judged = watch_disk(monkeypatch, log._partition(STREAM, 0))
    assert [r.offset for r in log.reader(STREAM, 0, from_offset=2, to_offset=7)] == [
        2, 3, 4, 5, 6]
    assert judged == [0, 5]


# -- following -------------------------------------------------------------------------------


def test_a_follower_wakes_on_an_append_without_waiting_for_its_poll(make_log):
    log = make_log(follow_poll_s=30.0)  # a wake-up that relied on the poll would time out
    fill_batches(log, 1, 2)
    follower = Follower(log.reader(STREAM, 0, from_offset=2, to_offset=4, follow=True))
    follower.start()
    time.sleep(0.1)
    assert follower.is_alive() and follower.received == []
    started = time.monotonic()
    log.append_sync(STREAM, b"new-2")
    assert follower.has(1, timeout=5)
    log.append_sync(STREAM, b"new-3")
    follower.join(5)
    assert not follower.is_alive() and follower.error is None
    assert time.monotonic() - started < 5
    assert pairs(follower.received) == [(2, b"new-2"), (3, b"new-3")]


def test_slices_yield_the_wait_sentinel_at_the_live_end(make_log):
    log = make_log(follow_poll_s=30.0)
    fill_batches(log, 1, 3)
    reader = log.reader(STREAM, 0, from_offset=1, follow=True)
    slices = reader.slices()
    columns, lo, hi = next(slices)
    assert (columns.base_offset, lo, hi) == (0, 1, 3)
    waiting = next(slices)
    assert not isinstance(waiting, tuple)
    assert reader.wait_offset() == 3
    log.append_batch_sync(STREAM, [b"x", b"y"])
    started = time.monotonic()
    reader.wait()  # the end has passed 3: no waiting for the 30 s poll
    assert time.monotonic() - started < 5
    columns, lo, hi = next(slices)
    assert (columns.base_offset, lo, hi) == (3, 0, 2)
    assert not isinstance(next(slices), tuple)
    reader.close()
    assert list(slices) == []


def test_a_follower_behind_the_tail_ring_reads_every_record_once_from_disk(make_log,
                                                                         monkeypatch):
    log = make_log(tail_ring_batches_max=1, **SEGMENT_SMALL)
    fill_batches(log, 2, 3)
    partition = log._partition(STREAM, 0)
    reads = watch_disk(monkeypatch, partition)
    records = iter(log.reader(STREAM, 0, from_offset=4, follow=True))
    got = [next(records) for _ in range(2)]  # 4, 5: the batch in the ring
    assert reads == []
    values = [b"later-%03d" % n + b"." * 200 for n in range(90)]
    for n in range(0, 90, 3):  # thirty batches; the ring keeps the last one only
        log.append_batch_sync(STREAM, values[n:n + 3])
    assert partition.ring.find(6) is None and len(partition.segments) > 1
    got += [next(records) for _ in range(90)]
    assert pairs(got) == [(4, b"r04"), (5, b"r05")] + [(6 + n, v) for n, v in enumerate(values)]
    assert reads[0] == 6 and set(reads) <= set(range(6, 96, 3))
    disk_reads = len(reads)
    log.append_sync(STREAM, b"live")  # caught up: back on the ring
    assert pairs([next(records)]) == [(96, b"live")]
    assert len(reads) == disk_reads


# -- transactions ----------------------------------------------------------------------------


def test_read_committed_stops_at_an_open_transaction_and_resumes_after_its_commit(make_log):
    log = make_log()
    txn = log.new_txn_id()
    log.append_batch_sync(STREAM, [b"a", b"b"])
    log.append_batch_sync(STREAM, [b"t1", b"t2"], txn_id=txn)
    log.append_sync(STREAM, b"c")  # committed data, but after the open transaction
    assert log.last_stable_offset(STREAM) == 2
    assert [r.value for r in log.reader(STREAM, 0)] == [b"a", b"b"]
    assert [r.value for r in log.reader(STREAM, 0, read_committed=False)] == [
        b"a", b"b", b"t1", b"t2", b"c"]
    follower = Follower(log.reader(STREAM, 0, follow=True, to_offset=7))
    follower.start()
    assert follower.has(2)
    time.sleep(0.1)
    assert [r.value for r in follower.received] == [b"a", b"b"]  # still blocked at 2
    marker = log.commit_txn(STREAM, 0, txn, tag="q", marker=b"m")
    assert marker == 5
    log.append_sync(STREAM, b"d")
    follower.join(WAIT_S)
    assert not follower.is_alive() and follower.error is None
    expected = [(0, b"a"), (1, b"b"), (2, b"t1"), (3, b"t2"), (4, b"c"), (6, b"d")]
    assert pairs(follower.received) == expected  # the marker (5) is not data
    assert pairs(log.reader(STREAM, 0)) == expected
    assert [r.txn_id for r in follower.received] == [0, 0, txn, txn, 0, 0]


@pytest.mark.parametrize("source", ["tail", "disk"])
def test_aborted_data_is_skipped_and_control_records_are_not_delivered(make_log, source):
    log = make_log()
    kept, dropped = log.new_txn_id(), log.new_txn_id()
    log.append_batch_sync(STREAM, [b"a"])
    log.append_batch_sync(STREAM, [b"x1", b"x2"], txn_id=dropped)  # 1, 2
    log.append_batch_sync(STREAM, [b"k1"], txn_id=kept)  # 3
    log.append_batch_sync(STREAM, [b"x3"], txn_id=dropped)  # 4
    log.abort_txn(STREAM, 0, dropped)  # 5
    log.commit_txn(STREAM, 0, kept, tag="t", marker=b"m")  # 6
    log.append_batch_sync(STREAM, [b"b", b"note", b"c"], kinds=[0, RecordKind.CHECKPOINT, 0])
    if source == "disk":
        log = reopen(log, make_log)
    assert pairs(log.reader(STREAM, 0)) == [(0, b"a"), (3, b"k1"), (7, b"b"), (9, b"c")]
    assert pairs(log.reader(STREAM, 0, from_offset=2, to_offset=4)) == [(3, b"k1")]
    assert pairs(log.reader(STREAM, 0, to_offset=2)) == [(0, b"a")]
    # Control records come out only when asked for; the abort marker belongs to the
    # aborted transaction and is skipped with it.
    committed = list(log.reader(STREAM, 0, data_only=False))
    assert [(r.offset, r.kind) for r in committed] == [
        (0, RecordKind.DATA), (3, RecordKind.DATA), (6, RecordKind.COMMIT),
        (7, RecordKind.DATA), (8, RecordKind.CHECKPOINT), (9, RecordKind.DATA)]
    assert committed[2].value == encode_commit("t", b"m")
    everything = list(log.reader(STREAM, 0, data_only=False, read_committed=False))
    assert [r.offset for r in everything] == list(range(10))
    assert everything[5].kind is RecordKind.ABORT
    raw = list(log.reader(STREAM, 0, read_committed=False))
    assert [r.value for r in raw] == [b"a", b"x1", b"x2", b"k1", b"x3", b"b", b"c"]
    assert [(o, v) for _, o, _, _, v in arrow_rows(log.reader(STREAM, 0))] == pairs(
        log.reader(STREAM, 0))


# -- timestamps ------------------------------------------------------------------------------


# Timestamps out of order: the high-water mark (running max) decides where a timestamp
# bound falls, not the record's own timestamp.
TIMESTAMPS = [[10, 20, 30], [25, 5, 40], [50], [45, 60]]
HWM = [10, 20, 30, 30, 30, 40, 50, 50, 60]


@pytest.mark.parametrize("source", ["tail", "disk"])
@pytest.mark.parametrize("timestamp", [-5, 10, 11, 30, 31, 40, 45, 50, 60, 61])
def test_timestamp_bounds_fall_where_the_high_water_mark_reaches_them(make_log, source,
                                                                       timestamp):
    log = make_log()
    for n, stamps in enumerate(TIMESTAMPS):
        log.append_batch_sync(STREAM, [b"b%d-%d" % (n, i) for i in range(len(stamps))],
                              timestamps_us=stamps)
    if source == "disk":
        log = reopen(log, make_log)
    first = next((n for n, hwm in enumerate(HWM) if hwm >= timestamp), len(HWM))
    assert log.offset_for_timestamp(STREAM, 0, timestamp) == first
    assert [r.offset for r in log.reader(STREAM, 0, from_timestamp_us=timestamp)] == list(
        range(first, len(HWM)))
    assert [r.offset for r in log.reader(STREAM, 0, to_timestamp_us=timestamp)] == list(
        range(first))
    # Records after the start whose own timestamps are lower are still delivered.
    stamps = [t for batch in TIMESTAMPS for t in batch]
    delivered = [r.timestamp_us for r in log.reader(STREAM, 0, from_timestamp_us=timestamp)]
    assert delivered == stamps[first:]


def test_a_start_offset_past_where_the_timestamp_is_reached_wins(make_log):
    log = make_log()
    fill_batches(log, 2, 5)  # timestamps 0, 10, ..., 90
    partition = log._partition(STREAM, 0)
    with Reader(partition, start_offset=3, start_timestamp_us=15) as reader:
        assert [r.offset for r in reader] == list(range(3, 10))
    with Reader(partition, start_offset=3, start_timestamp_us=65) as reader:
        assert [r.offset for r in reader] == list(range(7, 10))


def test_a_follower_from_a_timestamp_starts_at_the_first_new_record_that_reaches_it(
        make_log):
    log = make_log()
    log.append_batch_sync(STREAM, [b"old"], timestamps_us=[100])
    follower = Follower(log.reader(STREAM, 0, from_timestamp_us=500, follow=True,
                                   to_offset=6))
    follower.start()
    log.append_batch_sync(STREAM, [b"early", b"reach"], timestamps_us=[200, 600])
    log.append_batch_sync(STREAM, [b"late", b"x", b"y"], timestamps_us=[300, 700, 400])
    follower.join(WAIT_S)
    assert not follower.is_alive() and follower.error is None
    assert pairs(follower.received) == [(2, b"reach"), (3, b"late"), (4, b"x"), (5, b"y")]


# -- Arrow -----------------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["tail", "disk"])
@pytest.mark.parametrize("start, stop", [(0, None), (2, 9), (5, 6)])
def test_arrow_and_records_agree(make_log, source, start, stop):
    log = make_log()
    log.append_batch_sync(STREAM, [b"a", b"", b"c"], keys=[b"k", None, b""],
                          timestamps_us=[30, 10, 20], headers=[{"h": b"1"}, None, ()])
    log.append_batch_sync(STREAM, [b"d", b"e", b"f", b"g"], timestamps_us=[5, 6, 7, 8],
                          kinds=[0, RecordKind.CHECKPOINT, 0, 0])
    log.append_batch_sync(STREAM, [b"h" * 300, b"i"], keys=[None, b"key"],
                          headers=[None, {"x": b"y", "z": b""}])
    if source == "disk":
        log = reopen(log, make_log)
    for data_only in (True, False):
        options = dict(from_offset=start, to_offset=stop, data_only=data_only)
        rows = record_rows(log.reader(STREAM, 0, **options))
        assert rows and arrow_rows(log.reader(STREAM, 0, **options)) == rows
        with_headers = record_rows(log.reader(STREAM, 0, **options), headers=True)
        assert arrow_rows(log.reader(STREAM, 0, **options), include_headers=True) == [
            row[:5] + (row[5] or (),) for row in with_headers]
    assert any(row[5] for row in record_rows(log.reader(STREAM, 0), headers=True))


# -- holds against retention -----------------------------------------------------------------


def fill_segments(log, count: int) -> None:
    for n in range(count):
        log.append_sync(STREAM, b"%04d" % n + b"x" * 996, timestamp_us=n)


def segment_bases(log) -> list[int]:
    return [s.base_offset for s in log._partition(STREAM, 0).segments]


def test_a_readers_hold_follows_its_position_and_keeps_retention_behind_it(make_log):
    log = make_log(retention_bytes=1, **SEGMENT_SMALL)  # every sealed segment may go
    fill_segments(log, 30)
    bases = segment_bases(log)
    assert len(bases) >= 6
    partition = log._partition(STREAM, 0)
    reader = log.reader(STREAM, 0, from_offset=bases[2] + 1)
    assert partition.min_hold() == bases[2] + 1
    deleted = log.apply_retention()
    assert len(deleted) == 2 and not any(log.fileio.exists(p) for p in deleted)
    assert segment_bases(log) == bases[2:]
    records = iter(reader)
    while next(records).offset < bases[4]:
        pass
    assert partition.min_hold() == bases[4] + 1  # where the reader goes on from
    assert log.apply_retention()
    assert segment_bases(log) == bases[4:]
    assert [r.offset for r in records] == list(range(bases[4] + 1, 30))
    # Having reached the end, the reader let go: retention goes on to the active segment.
    assert partition.min_hold() is None
    log.apply_retention()
    assert segment_bases(log) == bases[-1:]


def test_close_releases_the_hold(make_log):
    log = make_log(retention_bytes=1, **SEGMENT_SMALL)
    fill_segments(log, 20)
    partition = log._partition(STREAM, 0)
    reader = log.reader(STREAM, 0, from_offset=0, follow=True)
    assert next(iter(reader)).offset == 0
    assert log.apply_retention() == []
    reader.close()
    assert partition.min_hold() is None
    assert log.apply_retention()
    assert log.start_offset(STREAM, 0) == segment_bases(log)[0] > 0
    assert list(reader) == []  # a closed reader delivers nothing more


# -- truncation ------------------------------------------------------------------------------


def test_a_reader_past_the_cut_of_a_truncate_is_told(make_log):
    log = make_log()
    fill_batches(log, 4, 5)
    records = iter(log.reader(STREAM, 0))
    got = [next(records) for _ in range(15)]  # it has delivered up to offset 14
    assert log.truncate_after(STREAM, 0, 9) == 10
    log.append_batch_sync(STREAM, [b"new"] * 10)
    with pytest.raises(OffsetOutOfRange, match="truncated to end at offset 10"):
        next(records)
    assert [r.value for r in got[:10]] == [b"r%02d" % n for n in range(10)]


@pytest.mark.parametrize("delivered", [5, 10])
def test_a_reader_at_or_before_the_cut_goes_on_with_the_new_records(make_log, delivered):
    log = make_log()
    fill_batches(log, 4, 5)
    records = iter(log.reader(STREAM, 0))
    got = [next(records) for _ in range(delivered)]
    log.truncate_after(STREAM, 0, 9)
    log.append_batch_sync(STREAM, [b"new%d" % n for n in range(10)])
    got += list(records)
    assert pairs(got) == [(n, b"r%02d" % n) for n in range(10)] + [
        (10 + n, b"new%d" % n) for n in range(10)]


def test_a_reader_reading_from_disk_never_delivers_truncated_records(make_log):
    log = make_log(tail_ring_batches_max=1)
    for n in range(20):
        log.append_sync(STREAM, b"old%d" % n, timestamp_us=n)
    log = reopen(log, make_log, tail_ring_batches_max=1)
    records = iter(log.reader(STREAM, 0))
    got = [next(records) for _ in range(5)]  # reading frames of the first chunk
    log.truncate_after(STREAM, 0, 9)
    for n in range(10):
        log.append_sync(STREAM, b"new%d" % n, timestamp_us=100 + n)
    try:
        for record in records:
            got.append(record)
    except OffsetOutOfRange:
        pass
    current = {r.offset: r.value for r in log.reader(STREAM, 0)}
    stale = [(r.offset, r.value) for r in got if current[r.offset] != r.value]
    assert stale == []
