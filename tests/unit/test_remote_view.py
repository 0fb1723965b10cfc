"""A log read straight from the store (remote/view.py, remote/storefs.py): the same
answers a local read gives for everything the store holds (records, seeks by time,
Arrow, read_committed, commit markers), following new generations, and damage in
the store named and never delivered. In memory: MemoryFileIO for the writer's disk,
MemoryStore for the store; the reader has no local state at all."""

from __future__ import annotations

import logging
import threading

import pyarrow as pa
import pytest

import streamlog
from streamlog.errors import CorruptionError, CorruptObject, ReadOnlyLog, StreamLogError
from streamlog.remote import manifest as manifests
from streamlog.remote.rangecache import RangeCache
from streamlog.testing import MemoryFileIO
from streamlog.testing.memindex import MemoryIndexStorage
from streamlog.testing.memstore import MemoryBucket, MemoryStore

SMALL = dict(segment_bytes_max=4096, compression="none", fsync="never")
T0 = 1_000_000


@pytest.fixture
def tiered():
    """A writer tiered to a store (rounds by hand), and the store's bucket."""
    bucket = MemoryBucket()
    log = streamlog.open_log("/memory/log", remote=MemoryStore(bucket), fileio=MemoryFileIO(),
                             index_storage=MemoryIndexStorage(), **SMALL)
    log.tiering.close()
    log.create_stream("s", 2)
    yield log, bucket
    log.close()


def fill(log, count: int, start: int = 0, *, jitter: bool = True) -> None:
    """Records whose timestamps go back now and then, so the high-water mark and the
    timestamps differ (DESIGN 5 seeks by the running max)."""
    for i in range(start, start + count):
        back = 40 if jitter and i % 9 == 4 else 0
        log.append_sync("s", b"%05d" % i + b"." * 100, partition=i % 2,
                        timestamp_us=T0 + 10 * i - back)


def tiered_partition(log, bucket, partition: str):
    """600 records in the store; the manifest's entry for `partition`."""
    fill(log, 600)
    log.tiering.run_once()
    return manifests.latest(MemoryStore(bucket)).partitions[partition]


def remote_end(bucket, partition: str) -> int:
    return manifests.latest(MemoryStore(bucket)).partitions[partition].committed_end


def as_tuples(records) -> list[tuple]:
    return [(r.offset, r.timestamp_us, r.key, r.value, r.kind, r.txn_id) for r in records]


def test_everything_the_store_has_reads_as_the_local_log_does(tiered):
    log, bucket = tiered
    fill(log, 600)
    log.tiering.run_once()
    with streamlog.open_log(MemoryStore(bucket)) as view:
        assert view.streams() == ["s"] and view.partition_count("s") == 2
        for n in (0, 1):
            end = remote_end(bucket, f"s/{n}")
            assert 0 < end < log.end_offset("s", n)  # the active segment stays local
            assert view.end_offset("s", n) == end and view.start_offset("s", n) == 0
            local = as_tuples(log.reader("s", n, to_offset=end, data_only=False))
            assert as_tuples(view.reader("s", n, data_only=False)) == local
            for start in (0, 1, end // 3, end - 1):
                assert as_tuples(view.reader("s", n, from_offset=start)) == as_tuples(
                    log.reader("s", n, from_offset=start, to_offset=end))
            for t in range(T0 - 50, T0 + 10 * 600 + 50, 7):
                expected = min(log.offset_for_timestamp("s", n, t), end)
                assert view.offset_for_timestamp("s", n, t) == expected, t
                first = next(iter(view.reader("s", n, from_timestamp_us=t)), None)
                assert (first.offset if first else end) == expected
            local_table = pa.Table.from_batches(list(log.reader("s", n, to_offset=end).arrow()))
            assert pa.Table.from_batches(list(view.reader("s", n).arrow())).equals(local_table)


def test_transactions_read_committed_and_markers_come_from_the_index_objects(tiered):
    log, bucket = tiered
    committed, aborted, still_open = log.new_txn_id(), log.new_txn_id(), log.new_txn_id()
    log.append_batch_sync("s", [b"c1", b"c2"], partition=0, txn_id=committed)
    log.append_batch_sync("s", [b"a1"], partition=0, txn_id=aborted)
    log.commit_txn("s", 0, committed, tag="query", marker=b"batch 7")
    log.abort_txn("s", 0, aborted)
    log.append_batch_sync("s", [b"o1"], partition=0, txn_id=still_open)
    fill(log, 400)
    log.tiering.run_once()
    store = MemoryStore(bucket)
    with streamlog.open_log(store) as view:
        values = [r.value for r in view.reader("s", 0)]
        assert {b"c1", b"c2"} <= set(values) and not {b"a1", b"o1"} & set(values)
        # read_committed stops at the open transaction's first record (the LSO)
        assert values == [r.value for r in log.reader("s", 0)][:len(values)]
        everything = {r.value for r in view.reader("s", 0, read_committed=False)}
        assert {b"c1", b"c2", b"a1", b"o1"} <= everything
        assert view.last_commit("s", 0, "query") == log.last_commit("s", 0, "query")
        assert view.txn_state("s", 0, committed) == log.txn_state("s", 0, committed)
        assert view.txn_state("s", 0, aborted) == log.txn_state("s", 0, aborted)
    # the index objects alone said so: no segment was read but one frame per partition
    reads = []
    real = store.get_ranges
    store.get_ranges = lambda key, ranges: reads.append(key) or real(key, ranges)
    with streamlog.open_log(store) as view:
        assert view.last_commit("s", 0, "query") == b"batch 7"
    # the frame before each partition's recovery point, and the commit record that
    # last_commit checks the index's answer against: never a whole scan
    assert len(reads) <= 3, reads


def test_a_follower_of_the_store_gets_each_new_generation(tiered):
    log, bucket = tiered
    fill(log, 300)
    log.tiering.run_once()
    with streamlog.open_log(MemoryStore(bucket), remote_poll_ms=20) as view:
        reader = view.reader("s", 0, follow=True)
        got: list[bytes] = []
        wanted = 0

        def follow():
            for record in reader:
                got.append(record.value)
                if len(got) >= wanted:
                    return

        fill(log, 600, 300)
        log.tiering.run_once()
        wanted = remote_end(bucket, "s/0")
        thread = threading.Thread(target=follow)
        thread.start()
        thread.join(30)
        assert not thread.is_alive(), f"the follower stopped at {len(got)} of {wanted}"
        reader.close()
        assert got == [r.value for r in log.reader("s", 0, to_offset=wanted)]
        fill(log, 400, 900)
        log.tiering.run_once()
        view.refresh()  # looks at once, without waiting for the poll
        assert view.end_offset("s", 0) == remote_end(bucket, "s/0")


def test_a_new_stream_appears_to_a_refreshed_view(tiered):
    log, bucket = tiered
    fill(log, 300)
    log.tiering.run_once()
    with streamlog.open_log(MemoryStore(bucket)) as view:
        log.create_stream("t", 1)
        for i in range(200):
            log.append_sync("t", b"t%04d" % i + b"-" * 100)
        log.tiering.run_once()
        view.refresh()
        assert view.streams() == ["s", "t"]
        end = remote_end(bucket, "t/0")
        assert [r.value for r in view.reader("t", 0)] == [
            r.value for r in log.reader("t", 0, to_offset=end)]


def test_a_view_of_the_store_refuses_writes_and_a_store_without_a_log_is_named(tiered):
    log, bucket = tiered
    fill(log, 300)
    log.tiering.run_once()
    with streamlog.open_log(MemoryStore(bucket)) as view:
        with pytest.raises(ReadOnlyLog):
            view.append_sync("s", b"x")
    with pytest.raises(StreamLogError, match="no log at memory://elsewhere"):
        streamlog.open_log(MemoryStore(MemoryBucket("elsewhere")))
    with pytest.raises(streamlog.InvalidArgument, match="takes no remote"):
        streamlog.open_log(MemoryStore(bucket), remote=MemoryStore(bucket))


def test_a_flipped_bit_in_a_segment_object_is_never_delivered(tiered):
    log, bucket = tiered
    part = tiered_partition(log, bucket, "s/0")
    damaged = part.segments[1]
    MemoryStore(bucket).flip_bit(damaged.key, damaged.size // 2, 3)
    local = as_tuples(log.reader("s", 0, to_offset=part.committed_end))
    with streamlog.open_log(MemoryStore(bucket)) as view:
        got = []
        with pytest.raises(CorruptionError) as caught:
            for record in view.reader("s", 0):
                got.append(record)
        assert as_tuples(got) == local[:len(got)]  # what came was right
        assert got[-1].offset < damaged.end_offset - 1  # and stopped in the damage
        assert "00000000000000000" in str(caught.value)  # the segment is named


def test_a_missing_segment_object_is_named_by_its_key(tiered):
    log, bucket = tiered
    gone = tiered_partition(log, bucket, "s/1").segments[0]
    MemoryStore(bucket).remove(gone.key)
    with streamlog.open_log(MemoryStore(bucket)) as view:
        with pytest.raises(CorruptObject, match=gone.key) as caught:
            list(view.reader("s", 1))
        assert "missing from the store" in str(caught.value)
        # the rest of the partition still reads, from where the damage ends
        assert [r.offset for r in view.reader("s", 1, from_offset=gone.end_offset)][:1] == [
            gone.end_offset]


@pytest.mark.parametrize("damage", ["flip", "remove"])
def test_a_damaged_index_object_is_rebuilt_from_the_segments(tiered, caplog, damage):
    log, bucket = tiered
    part = tiered_partition(log, bucket, "s/0")
    key = part.segments[2].index_key
    if damage == "flip":
        MemoryStore(bucket).flip_bit(key, 40, 1)
    else:
        MemoryStore(bucket).remove(key)
    with caplog.at_level(logging.WARNING), streamlog.open_log(MemoryStore(bucket)) as view:
        assert as_tuples(view.reader("s", 0)) == as_tuples(
            log.reader("s", 0, to_offset=part.committed_end))
        for t in range(T0, T0 + 6000, 13):
            assert view.offset_for_timestamp("s", 0, t) == min(
                log.offset_for_timestamp("s", 0, t), part.committed_end)
    assert key in caplog.text and "rebuilding it from the segments" in caplog.text


def test_the_cache_stays_bounded_and_a_scan_reads_ahead():
    store = MemoryStore()
    data = bytes(range(256)) * 4096  # 1 MiB
    store.put("k", data)
    cache = RangeCache(store, block_bytes=64 * 1024, capacity_bytes=512 * 1024, readahead=4,
                       fetch_blocks=4)
    out = b"".join(cache.read("k", len(data), at, 10_000) for at in range(0, len(data), 10_000))
    cache.close()
    assert out == data
    assert cache._bytes <= 512 * 1024
    assert cache.stats["requests"] <= len(data) // (64 * 1024) // 4 + 2  # 4 blocks a GET
    assert cache.read("k", len(data), len(data) - 5, 100) == data[-5:]
    assert cache.read("k", len(data), len(data), 100) == b""
    store.put("short", data[:1000])
    with pytest.raises(CorruptObject, match="shorter than"):
        RangeCache(store).read("short", 5000, 0, 5000)


def test_the_store_down_while_following_keeps_the_view_serving(tiered):
    log, bucket = tiered
    fill(log, 300)
    log.tiering.run_once()
    store = MemoryStore(bucket)
    with streamlog.open_log(store, remote_poll_ms=10) as view:
        before = [r.value for r in view.reader("s", 0)]  # (cached now)
        store.down()
        with pytest.raises(streamlog.StoreError):
            view.refresh()
        assert [r.value for r in view.reader("s", 0)] == before
        store.up()
        fill(log, 300, 300)
        log.tiering.run_once()
        view.refresh()
        assert view.end_offset("s", 0) == remote_end(bucket, "s/0") > len(before)


def test_info_shows_the_generation_and_each_partitions_remote_end(tiered):
    log, bucket = tiered
    fill(log, 600)
    log.tiering.run_once()
    newest = manifests.latest(MemoryStore(bucket))
    written = log.info()
    assert written["remote"]["generation"] == newest.generation
    with streamlog.open_log(MemoryStore(bucket)) as view:
        info = view.info()
        assert info["path"] == "memory://memory"
        assert {k: info["remote"][k] for k in ("generation", "epoch", "fenced", "error")} == {
            "generation": newest.generation, "epoch": 1, "fenced": None, "error": None}
        for n, part in enumerate(info["streams"]["s"]["partitions"]):
            end = newest.partitions[f"s/{n}"].committed_end
            assert part["end_offset"] == part["remote_committed_offset"] == end
            assert part["remote_lag_records"] == 0
            mine = written["streams"]["s"]["partitions"][n]
            assert mine["remote_committed_offset"] == end
            assert mine["remote_lag_records"] == log.end_offset("s", n) - end > 0
            assert mine["remote_lag_bytes"] == log._partition("s", n).segments[-1].size_bytes


def test_a_view_of_the_store_keeps_no_holds(tiered):
    log, bucket = tiered
    fill(log, 300)
    log.tiering.run_once()
    with streamlog.open_log(MemoryStore(bucket)) as view:
        with pytest.raises(ReadOnlyLog, match="keeps no holds"):
            view.hold("s", 0, "reader", 5)
        with pytest.raises(ReadOnlyLog, match="keeps no holds"):
            view.release_hold("s", 0, "reader")
