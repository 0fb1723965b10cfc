"""Restore (remote/restore.py): a tiered open of an empty or missing directory continues
from the store: every record the store has, at its offset, with exact seeks, commit
markers and transactions; the index from the index objects, not from reading the
segments; the lost tail reported under durability "local"; the older writer fenced; a
damaged object refused; a restore that died half-way taken up again. In memory: a
MemoryFileIO per machine, MemoryStore for the store."""

from __future__ import annotations

import logging

import pytest

import streamlog
from streamlog.errors import CorruptObject, Fenced, StoreUnavailable, StreamLogError
from streamlog.remote import manifest as manifests
from streamlog.remote.restore import INTENT_NAME
from streamlog.testing import MemoryFileIO
from streamlog.testing.memindex import MemoryIndexStorage
from streamlog.testing.memstore import MemoryBucket, MemoryStore

SMALL = dict(segment_bytes_max=4096, compression="none", fsync="never")
T0 = 5_000_000


def machine() -> dict:
    """A new machine's disk: nothing on it."""
    return {"fileio": MemoryFileIO(), "index_storage": MemoryIndexStorage()}


def open_tiered(bucket, disk, **options):
    log = streamlog.open_log("/data/log", remote=MemoryStore(bucket), **disk,
                             **{**SMALL, **options})
    log.tiering.close()  # rounds by hand
    return log


def fill(log, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        log.append_sync("s", b"%05d" % i + b"." * 90, partition=i % 2,
                        timestamp_us=T0 + 10 * i - (35 if i % 11 == 5 else 0))


def records(log, n: int, **bounds) -> list[tuple]:
    return [(r.offset, r.timestamp_us, r.value, r.kind, r.txn_id)
            for r in log.reader("s", n, data_only=False, read_committed=False, **bounds)]


@pytest.fixture
def lost_machine():
    """A writer that tiered 700 records (and a transaction) and then lost its machine:
    (bucket, what it had: {partition: records up to the store's end}, its local ends,
    the store's ends). The writer is left open, as a machine cut off is."""
    bucket = MemoryBucket()
    old = open_tiered(bucket, machine())
    old.create_stream("s", 2)
    txn = old.new_txn_id()
    old.append_batch_sync("s", [b"t1", b"t2"], partition=1, txn_id=txn)
    old.commit_txn("s", 1, txn, tag="query", marker=b"batch 9")
    fill(old, 700)
    old.tiering.run_once()
    ends = {n: manifests.latest(MemoryStore(bucket)).partitions[f"s/{n}"].committed_end
            for n in (0, 1)}
    had = {n: records(old, n, to_offset=ends[n]) for n in (0, 1)}
    local_ends = {n: old.end_offset("s", n) for n in (0, 1)}
    yield bucket, had, local_ends, ends, old
    try:
        old.close()
    except StreamLogError:
        pass


def test_an_empty_directory_continues_from_the_store(lost_machine):
    bucket, had, local_ends, ends, old = lost_machine
    with open_tiered(bucket, machine()) as log:
        assert log.streams() == ["s"]
        for n in (0, 1):
            assert log.end_offset("s", n) == ends[n] > 0
            assert records(log, n) == had[n]
            for t in range(T0 - 50, T0 + 7100, 9):
                assert log.offset_for_timestamp("s", n, t) == min(
                    old.offset_for_timestamp("s", n, t), ends[n]), t
        assert log.last_commit("s", 1, "query") == b"batch 9"
        assert [r.value for r in log.reader("s", 1)][:2] == [b"t1", b"t2"]
        # appends go on after the store's end, and go up in the next round
        fill(log, 300, 700)
        log.tiering.run_once()
        assert log.info()["restored"]["segments"] >= 4
    with streamlog.open_log(MemoryStore(bucket)) as view:
        for n in (0, 1):
            assert records(view, n, to_offset=ends[n]) == had[n]
            assert view.end_offset("s", n) > ends[n]


def test_the_index_comes_from_the_index_objects_not_the_segments(lost_machine):
    bucket, had, local_ends, ends, old = lost_machine
    store = MemoryStore(bucket)
    fetched = []
    real_get = store.get
    store.get = lambda key: fetched.append(key) or real_get(key)
    disk = machine()
    log = streamlog.open_log("/data/log", remote=store, **disk, **SMALL)
    try:
        log.tiering.close()
        segments = [s for n in (0, 1) for s in manifests.latest(store).partitions[
            f"s/{n}"].segments]
        assert sorted(k for k in fetched if k.endswith(".log")) == sorted(
            s.key for s in segments)  # each segment object once, whole
        for n in (0, 1):
            report = log._partition("s", n).report
            assert report.frames_indexed == 0 and not report.rebuilt_index
            assert report.scanned_bytes < 4096  # one frame checked, none read through
    finally:
        log.close()


def test_the_lost_tail_is_reported_by_offsets(lost_machine, caplog):
    bucket, had, local_ends, ends, old = lost_machine
    with caplog.at_level(logging.WARNING), open_tiered(bucket, machine()) as log:
        lost = log.info()["restored"]["lost"]
    assert lost == {f"s/{n}": [ends[n], local_ends[n]] for n in (0, 1)
                    if local_ends[n] > ends[n]}
    assert lost  # the active segments had records the store lacked
    for name, (first, end) in lost.items():
        assert f"restored {name}" in caplog.text and f"offsets {first}..{end - 1}" in (
            caplog.text)


def test_the_older_writer_is_fenced_by_the_restore(lost_machine):
    bucket, had, local_ends, ends, old = lost_machine
    with open_tiered(bucket, machine()):
        with pytest.raises(Fenced):
            old.tiering.run_once()
        with pytest.raises(Fenced):
            old.append_sync("s", b"late", partition=0)


def test_a_damaged_segment_object_is_refused_and_no_log_is_left_half_made(lost_machine):
    bucket, had, local_ends, ends, old = lost_machine
    segment = manifests.latest(MemoryStore(bucket)).partitions["s/0"].segments[1]
    MemoryStore(bucket).flip_bit(segment.key, 100, 2)
    disk = machine()
    with pytest.raises(CorruptObject, match=segment.key):
        streamlog.open_log("/data/log", remote=MemoryStore(bucket), **disk, **SMALL)
    assert disk["fileio"].exists("/data/log/" + INTENT_NAME)
    with pytest.raises(StreamLogError, match="not empty and not a streamlog log"):
        streamlog.open_log("/data/log", **disk, **SMALL)  # nothing half-made is a log


def test_a_restore_that_died_half_way_is_taken_up_again(lost_machine):
    bucket, had, local_ends, ends, old = lost_machine
    flaky = MemoryStore(bucket)
    disk = machine()
    real_get = flaky.get
    calls = []

    def get(key):
        calls.append(key)
        if len(calls) == 5:
            raise StoreUnavailable("the store went away", key=key)
        return real_get(key)

    flaky.get = get
    with pytest.raises(StoreUnavailable):
        streamlog.open_log("/data/log", remote=flaky, **disk, **SMALL)
    assert disk["fileio"].exists("/data/log/" + INTENT_NAME)
    with open_tiered(bucket, disk) as log:
        assert not disk["fileio"].exists("/data/log/" + INTENT_NAME)
        for n in (0, 1):
            assert records(log, n) == had[n]


def test_a_directory_holding_a_log_keeps_it_and_takes_in_what_the_store_holds_more_of(
        lost_machine):
    """A tiered open of a directory that holds a log does not restore over it: its
    streams stay as they are; what the store holds and the directory lacks (here the
    lost machine's stream) is restored beside them, so the local log never writes
    other records at offsets the store has."""
    bucket, had, local_ends, ends, old = lost_machine
    disk = machine()
    with streamlog.open_log("/data/log", **disk, **SMALL) as local:
        local.create_stream("mine")
        local.append_sync("mine", b"kept")
    with open_tiered(bucket, disk) as log:
        assert sorted(log.streams()) == ["mine", "s"]
        assert [r.value for r in log.reader("mine", 0)] == [b"kept"]
        for n in (0, 1):
            assert records(log, n, to_offset=ends[n]) == had[n]
            assert log.end_offset("s", n) == ends[n]
        assert log.restored.segments > 0 and log.restored.lost == {}
    with open_tiered(bucket, disk) as log:  # caught up: nothing to restore again
        assert log.restored is None
