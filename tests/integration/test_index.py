"""Index (index.py): the LMDB cache of a partition, and what it does with damage."""

import os

import lmdb
import pytest

from streamlog.errors import CorruptIndex
from streamlog.index import Index, IndexEntry, RecoveryPoint

MAP_BYTES = 1 << 26


def entry(base: int, count: int, hwm: int) -> IndexEntry:
    return IndexEntry(base, 0, base * 100, count, 100 * count, hwm - 1, hwm, hwm)


@pytest.fixture
def index(tmp_path):
    opened = Index(str(tmp_path / "index"), readonly=False, map_bytes=MAP_BYTES)
    yield opened
    opened.close()


def test_lookups_by_offset_and_by_time(index):
    index.put([entry(0, 10, 5), entry(10, 10, 5), entry(20, 5, 9)],
              RecoveryPoint(0, 2500, 25, 9))
    assert index.lookup_offset(15).base_offset == 10
    assert index.lookup_offset(100).base_offset == 20  # the last batch before
    assert index.lookup_time(5).base_offset == 0  # the first batch reaching 5
    assert index.lookup_time(6).base_offset == 20
    assert index.lookup_time(10) is None
    assert index.recovery_point() == RecoveryPoint(0, 2500, 25, 9)
    index.drop_from(10)
    assert index.last_entry.base_offset == 0 and index.lookup_time(6) is None


def test_transaction_events_and_a_truncate_that_cuts_a_marker(index):
    index.put([entry(0, 10, 5)], None, [(7, 1, 0, None, None), (7, 2, 9, "q", b"m")])
    assert index.txn_state(7) == (2, 0, 9) and index.last_commit("q") == (9, b"m")
    assert index.open_txns() == {}
    index.drop_from(5)  # the commit marker at 9 is cut off: open again
    assert index.reopened_txns == [7] and index.open_txns() == {7: 0}


def test_a_damaged_value_is_corrupt_index_never_another_answer(tmp_path, index):
    index.put([entry(0, 10, 5), entry(10, 10, 6)], RecoveryPoint(0, 2000, 20, 6))
    index.close(seal=False)
    env = lmdb.open(str(tmp_path / "index"), max_dbs=6)
    offsets = env.open_db(b"offsets")
    with env.begin(write=True) as txn:
        key, value = next(iter(txn.cursor(offsets)))
        damaged = bytearray(value)
        damaged[3] ^= 0x40
        txn.put(key, bytes(damaged), db=offsets)
    env.close()
    reopened = Index(str(tmp_path / "index"), readonly=True, map_bytes=MAP_BYTES,
                     probe_unsealed=lambda: False)
    try:
        with pytest.raises(CorruptIndex):
            reopened.lookup_offset(3)
    finally:
        reopened.close()


def test_a_sealed_index_that_changed_is_refused_before_lmdb_reads_it(tmp_path, index):
    index.put([entry(0, 10, 5)], RecoveryPoint(0, 1000, 10, 5))
    index.close(seal=True)
    path = str(tmp_path / "index")
    assert os.path.exists(path + ".seal")
    with open(os.path.join(path, "data.mdb"), "r+b") as handle:
        handle.seek(5000)
        handle.write(b"\xff")
    with pytest.raises(CorruptIndex, match="seal"):
        Index(path, readonly=True, map_bytes=MAP_BYTES)


def test_an_untouched_sealed_index_is_verified_and_unsealed_by_its_first_write(tmp_path,
                                                                                index):
    index.put([entry(0, 10, 5)], RecoveryPoint(0, 1000, 10, 5))
    index.close(seal=True)
    path = str(tmp_path / "index")
    writer = Index(path, readonly=False, map_bytes=MAP_BYTES)
    try:
        assert writer.verified and os.path.exists(path + ".seal")  # nothing written yet
        writer.put([entry(10, 5, 6)])
        assert not os.path.exists(path + ".seal")  # the file changes: the seal goes first
    finally:
        writer.close(seal=True)
    assert os.path.exists(path + ".seal")


def test_index_implements_the_index_store_interface(index):
    """IndexStore is what the partition, views, recovery and maintenance use: Index has
    every method with the same parameters, and every attribute."""
    import inspect
    from streamlog.index import IndexStore
    declared = {name for name, value in vars(IndexStore).items()
                if callable(value) and not name.startswith("_")}
    assert declared >= {"put", "drop_from", "lookup_offset", "last_commit"}
    for name in sorted(declared):
        wanted = list(inspect.signature(getattr(IndexStore, name)).parameters)
        got = list(inspect.signature(getattr(Index, name)).parameters)
        assert got == wanted, (name, got, wanted)
    for name in IndexStore.__annotations__:
        assert hasattr(index, name), name


def test_read_only_opens_in_one_process_share_the_index(tmp_path, caplog):
    """LMDB allows one environment per file and process: a second read-only open (a
    Spark driver's view beside its planner's) uses the first's instead of failing and
    rebuilding the index from the segments."""
    import streamlog
    path = tmp_path / "log"
    with streamlog.open_log(path) as log:
        log.create_stream("s")
        log.append_batch_sync("s", [b"a", b"b"], timestamps_us=[1, 2])
    first = streamlog.open_log(path, readonly=True)
    with caplog.at_level("WARNING"):
        second = streamlog.open_log(path, readonly=True)
        assert second.offset_for_timestamp("s", 0, 2) == 1
    assert not [r for r in caplog.records if "rebuilding" in r.getMessage()]
    first.close()  # the second still reads through the shared environment
    assert [r.value for r in second.reader("s", 0)] == [b"a", b"b"]
    assert second.offset_for_timestamp("s", 0, 2) == 1
    second.close()
    third = streamlog.open_log(path, readonly=True)  # the last close closed it
    assert third.end_offset("s", 0) == 2
    third.close()
