"""delete_stream, delete_records and add_partitions on a log tiered to a store
(remote/changes.py): the store's manifest agrees with the local log when each returns.
A deleted stream leaves the manifest (its objects are garbage, deleted after the grace
period; a pinned reader finishes), and a stream created again under its name gets
objects of its own; delete_records moves the manifest's start inside a segment as
retention moves it to a segment's base; added partitions show in the manifest's
stream counts. Under both durabilities, in memory."""

from __future__ import annotations

import time

import pytest

import streamlog
from streamlog.appender import Waiter
from streamlog.clock import SYSTEM_CLOCK
from streamlog.errors import Fenced, StoreUnavailable, UnknownStream
from streamlog.remote import manifest as manifests
from streamlog.remote.group_commit import AckGate
from streamlog.testing import FaultFileIO, MemoryFileIO
from streamlog.testing.memindex import MemoryIndexStorage
from streamlog.testing.memstore import MemoryBucket, MemoryStore

SMALL = dict(segment_bytes_max=4096, compression="none", fsync="never", remote_commit_ms=2)
T0 = 7_000_000
DURABILITIES = ["local", "remote"]


def machine() -> dict:
    return {"fileio": MemoryFileIO(), "index_storage": MemoryIndexStorage()}


def open_tiered(bucket, durability: str, on=None, **options):
    return streamlog.open_log("/data/log", remote=MemoryStore(bucket), **(on or machine()),
                              **{**SMALL, "durability": durability, **options})


def by_hand(log) -> None:
    """Full rounds by hand from here on (under durability "remote" the job keeps
    committing the tail: the acks need it)."""
    if log.tiering.gate is None:
        log.tiering.close()
    else:
        log.tiering.interval_s = 3600.0
        log.tiering._full_due = float("inf")


def stamp(i: int) -> int:
    return T0 + 10 * i - (25 if i % 6 == 1 else 0)


def fill(log, stream: str, count: int, *, start: int = 0, partition: int = 0) -> None:
    for first in range(start, start + count, 5):  # small batches: many frames
        batch = range(first, min(first + 5, start + count))
        log.append_batch_sync(stream, [b"%s%05d" % (stream.encode(), i) + b"~" * 80
                                       for i in batch],
                              timestamps_us=[stamp(i) for i in batch], partition=partition)


def newest(bucket):
    return manifests.latest(MemoryStore(bucket))


def records(log, stream: str, partition: int = 0, **options) -> list:
    return [(r.offset, r.value) for r in log.reader(stream, partition, **options)]


def same_as_local(log, bucket, stream: str = "s", partition: int = 0) -> None:
    """The store's copy reads as the local log does: start, records and seeks."""
    with streamlog.open_log(MemoryStore(bucket)) as view:
        end = view.end_offset(stream, partition)
        assert view.partition_count(stream) == log.partition_count(stream)
        assert view.start_offset(stream, partition) == log.start_offset(stream, partition)
        assert records(view, stream, partition) == records(log, stream, partition,
                                                           to_offset=end)
        # (a view of a partition the store holds nothing of yet cannot seek by time)
        for t in range(T0 - 100, T0 + 10 * 500, 13) if end else ():
            assert view.offset_for_timestamp(stream, partition, t) == min(
                log.offset_for_timestamp(stream, partition, t), end), t


def segment_keys(manifest, stream: str) -> set[str]:
    return {key for name, part in manifest.partitions.items() if name.startswith(stream + "/")
            for segment in part.segments for key in (segment.key, segment.index_key)}


# -- delete_stream ----------------------------------------------------------------------

@pytest.mark.parametrize("durability", DURABILITIES)
def test_a_deleted_stream_leaves_the_manifest_and_its_objects_go_after_the_grace(durability):
    bucket = MemoryBucket()
    store = MemoryStore(bucket)
    with open_tiered(bucket, durability, remote_grace_s=0.3) as log:
        by_hand(log)
        log.create_stream("s", 2)
        log.create_stream("t", 1)
        fill(log, "s", 300)
        fill(log, "s", 4, partition=1)
        fill(log, "t", 40)
        log.tiering.run_once()
        before = newest(bucket)
        old_keys = segment_keys(before, "s")
        assert old_keys and before.streams == {"s": 2, "t": 1}
        pinned = streamlog.open_log(MemoryStore(bucket))  # a reader of that generation
        expected = records(pinned, "s")
        log.delete_stream("s")
        after = newest(bucket)
        assert after == log.tiering.manifest
        assert after.streams == {"t": 1} and set(after.partitions) == {"t/0"}
        assert after.epoch == before.epoch + 1  # (new keys for a stream of that name)
        assert old_keys <= {key for key, _ in after.garbage}
        assert all(store.head(key) for key in old_keys)  # not yet deleted
        assert records(pinned, "s") == expected  # the pinned reader finishes
        pinned.refresh()  # (the newest generation: the stream is gone)
        assert pinned.streams() == ["t"]
        pinned.close()
        with streamlog.open_log(MemoryStore(bucket)) as view:
            assert view.streams() == ["t"]
        time.sleep(0.35)
        log.tiering.run_once()
        assert not old_keys & {meta.key for meta in store.list("segments")}
        log.create_stream("s", 1)  # the name again: objects of its own, from offset 0
        fill(log, "s", 150)
        log.tiering.run_once()
        again = newest(bucket)
        assert again.streams == {"s": 1, "t": 1}
        assert segment_keys(again, "s") and not segment_keys(again, "s") & old_keys
        same_as_local(log, bucket)
        same_as_local(log, bucket, "t")
        local = records(log, "s", to_offset=again.partitions["s/0"].committed_end)
    with open_tiered(bucket, durability) as restored:  # the machine lost: restored
        assert restored.streams() == ["s", "t"] and records(restored, "s") == local


def test_a_store_that_refuses_the_delete_leaves_the_stream_everywhere():
    bucket = MemoryBucket()
    with open_tiered(bucket, "local") as log:
        by_hand(log)
        log.create_stream("s", 1)
        fill(log, "s", 100)
        log.tiering.run_once()
        before = newest(bucket)
        log.tiering.store.down()
        with pytest.raises(StoreUnavailable):
            log.delete_stream("s")
        log.tiering.store.up()
        assert log.streams() == ["s"] and len(records(log, "s")) == 100
        assert newest(bucket) == before
        fill(log, "s", 10, start=100)  # its writer goes on
        log.delete_stream("s")
        assert log.streams() == [] and "s" not in newest(bucket).streams


def test_a_delete_that_dies_after_the_store_took_it_puts_the_stream_back_whole():
    """The store's generation goes first: a local failure after it (here the rename of
    the folder) leaves the stream whole locally, and the next round puts it back in
    the store, under keys of the new epoch (the old ones are garbage)."""
    bucket = MemoryBucket()
    disk = MemoryFileIO()
    fs = FaultFileIO(1, inner=disk)
    with open_tiered(bucket, "local", on={"fileio": fs,
                                          "index_storage": MemoryIndexStorage()}) as log:
        by_hand(log)
        log.create_stream("s", 1)
        fill(log, "s", 200)
        log.tiering.run_once()
        old_keys = segment_keys(newest(bucket), "s")
        fs.inject_eio("rename", 1)
        with pytest.raises(OSError):
            log.delete_stream("s")
        assert "s" not in newest(bucket).streams and log.streams() == ["s"]
        fill(log, "s", 50, start=200)
        log.tiering.run_once()
        assert newest(bucket).streams == {"s": 1}
        assert not segment_keys(newest(bucket), "s") & old_keys
        same_as_local(log, bucket)


def test_a_fenced_writer_changes_nothing():
    bucket = MemoryBucket()
    log = open_tiered(bucket, "local")
    by_hand(log)
    log.create_stream("s", 2)
    fill(log, "s", 50)
    log.tiering.run_once()
    newer = open_tiered(bucket, "local")  # another machine takes the log over
    with pytest.raises(Fenced):
        log.tiering.run_once()
    for change in (lambda: log.delete_stream("s"), lambda: log.add_partitions("s", 3),
                   lambda: log.delete_records("s", 0, 10)):
        with pytest.raises(Fenced):
            change()
    assert (log.streams(), log.partition_count("s"), log.start_offset("s", 0)) == (
        ["s"], 2, 0)
    newer.close()
    log.close()


# -- delete_records ---------------------------------------------------------------------

@pytest.mark.parametrize("durability", DURABILITIES)
def test_delete_records_moves_the_stores_start_inside_a_segment(durability):
    bucket = MemoryBucket()
    with open_tiered(bucket, durability) as log:
        by_hand(log)
        log.create_stream("s", 1)
        fill(log, "s", 400)
        log.tiering.run_once()
        before = newest(bucket).partitions["s/0"]
        assert log.delete_records("s", 0, 137) == 137
        after = newest(bucket).partitions["s/0"]
        state = log._partition("s", 0).state
        assert (after.start_offset, after.start_hwm_us) == (137, state.start_hwm_us)
        assert after.start_hwm_us == max(stamp(i) for i in range(137))
        dropped = {s.key for s in before.segments if s.end_offset <= 137}
        assert dropped and dropped <= {key for key, _ in newest(bucket).garbage}
        assert all(s.end_offset > 137 for s in after.segments)
        same_as_local(log, bucket)
        fill(log, "s", 60, start=400)
        log.tiering.run_once()
        same_as_local(log, bucket)
        end = newest(bucket).partitions["s/0"].committed_end
        local = records(log, "s", to_offset=end)
    with open_tiered(bucket, durability) as restored:
        assert restored.start_offset("s", 0) == 137 and records(restored, "s") == local
        for t in range(T0, T0 + 10 * 460, 17):  # DESIGN 5, by brute force
            assert restored.offset_for_timestamp("s", 0, t) == max(137, next(
                (i for i in range(end) if max(stamp(j) for j in range(i + 1)) >= t), end))


@pytest.mark.parametrize("durability", DURABILITIES)
def test_a_start_moved_before_the_store_had_the_partition_is_where_the_store_starts(
        durability):
    bucket = MemoryBucket()
    here = machine()
    with streamlog.open_log("/data/log", **here, **SMALL) as log:  # not tiered yet
        log.create_stream("s", 1)
        fill(log, "s", 300)
        log.delete_records("s", 0, 71)
    with open_tiered(bucket, durability, on=here) as log:
        by_hand(log)
        fill(log, "s", 5, start=300)  # (under "remote", the tail goes up with it)
        log.tiering.run_once()
        assert newest(bucket).partitions["s/0"].start_offset == 71
        same_as_local(log, bucket)


# -- add_partitions ---------------------------------------------------------------------

@pytest.mark.parametrize("durability", DURABILITIES)
def test_added_partitions_show_in_the_stores_stream_counts(durability):
    bucket = MemoryBucket()
    with open_tiered(bucket, durability) as log:
        by_hand(log)
        log.create_stream("s", 2)
        fill(log, "s", 30)
        log.tiering.run_once()
        assert log.add_partitions("s", 4) == 4
        assert newest(bucket).streams == {"s": 4}
        fill(log, "s", 80, partition=3)  # (more than a segment: it goes up sealed)
        log.tiering.run_once()
        assert newest(bucket).partitions["s/3"].committed_end > 0
        same_as_local(log, bucket, partition=3)
        log.tiering.store.down()  # the store answers later: the next round says it
        assert log.add_partitions("s", 5) == 5
        assert newest(bucket).streams == {"s": 4}
        log.tiering.store.up()
        log.tiering.run_once()
        assert newest(bucket).streams == {"s": 5}
        with streamlog.open_log(MemoryStore(bucket)) as view:
            assert view.partition_count("s") == 5 and view.end_offset("s", 4) == 0


def test_acks_held_for_a_deleted_stream_fail_and_the_others_stay_held():
    """Durability remote: what the gate holds for the stream's partitions when it is
    deleted fails with UnknownStream (the records are deleted); other streams' acks
    wait for the store as before."""
    gate = AckGate(lambda name: 0, lambda urgent=False: None, timeout_s=60.0,
                   clock=SYSTEM_CLOCK, wake_bytes=1 << 20)
    waiters = {name: Waiter() for name in ("s/0", "s/1", "st/0")}
    for name, waiter in waiters.items():
        gate.hold(name, 5, [(waiter, 0, None)])
    gate.forget("s", UnknownStream("stream 's' was deleted"))
    for name in ("s/0", "s/1"):
        with pytest.raises(UnknownStream):
            waiters[name].wait()
    assert not waiters["st/0"].event.is_set() and gate.waiting()


def test_a_cut_inside_the_tail_after_retention_keeps_what_is_below_it(tmp_path):
    """Retention leaves only the newest segments, then truncate_after cuts inside the
    segment the tail pieces begin before: the store keeps the records below the cut
    (as tail pieces), and its reader reads what the local log reads."""
    bucket = MemoryBucket()
    with streamlog.open_log(tmp_path / "log", remote=MemoryStore(bucket),
                            durability="remote", fsync="never", segment_bytes_max=4096,
                            retention_bytes=10_000, remote_grace_s=0.5) as log:
        log.create_stream("s")
        for i in range(400):
            log.append_sync("s", b"%05d" % i + b"." * 60, timestamp_us=1000 + i)
        log.tiering.run_once()
        assert log.apply_retention()
        log.truncate_after("s", 0, 350)
        expected = [(r.offset, r.value) for r in log.reader("s", 0)]
        start = log.start_offset("s", 0)
        with streamlog.open_log(MemoryStore(bucket)) as view:
            assert view.start_offset("s", 0) == start > 0
            assert [(r.offset, r.value) for r in view.reader("s", 0)] == expected
            assert expected[-1][0] == 350
