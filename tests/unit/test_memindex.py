"""The in-memory index environment (streamlog/testing/memindex.py): the same answers as
LMDB for what the index asks, and a power loss that keeps whole transactions only."""

from __future__ import annotations

import logging
import random

import lmdb
import pytest

from streamlog.index import Index, IndexEntry, RecoveryPoint
from streamlog.testing.memindex import MemoryIndexStorage

NAMES = (b"a", b"b")


def _operate(env, dbs, rng: random.Random) -> list:
    """One random write transaction, the same on any environment given the same rng
    state; returns what its reads answered."""
    answers = []
    with env.begin(write=True) as txn:
        for _ in range(rng.randint(1, 8)):
            db = dbs[rng.choice(NAMES)]
            key = bytes([rng.randint(0, 20)])
            choice = rng.random()
            if choice < 0.35:
                answers.append(txn.put(key, bytes([rng.randint(0, 255)]), db=db))
            elif choice < 0.5:
                answers.append(txn.delete(key, db=db))
            elif choice < 0.7:
                items = sorted({bytes([rng.randint(0, 20)]) for _ in range(3)})
                answers.append(txn.cursor(db).putmulti([(k, b"v") for k in items],
                                                       append=True))
            elif choice < 0.85:
                cursor = txn.cursor(db)
                found = cursor.set_range(key)
                answers.append((found, bytes(cursor.key())))
                while found and rng.random() < 0.5:
                    found = cursor.delete()
                    answers.append((found, bytes(cursor.key())))
            elif choice < 0.95:
                cursor = txn.cursor(db)
                answers.append((cursor.last(), bytes(cursor.key()), cursor.prev(),
                                bytes(cursor.key()), cursor.first(), bytes(cursor.key())))
            else:
                txn.drop(db, delete=False)
        answers.append({name: [(bytes(k), bytes(v)) for k, v in txn.cursor(dbs[name])]
                        for name in NAMES})
    return answers


@pytest.mark.parametrize("seed", range(5))
def test_it_answers_as_lmdb_does(tmp_path, seed):
    real = lmdb.open(str(tmp_path / "lmdb"), max_dbs=4, sync=False)
    twin = MemoryIndexStorage().open("index", readonly=False)
    envs = [(real, {n: real.open_db(n) for n in NAMES}),
            (twin, {n: twin.open_db(n) for n in NAMES})]
    for step in range(150):
        answers = [_operate(env, dbs, random.Random(seed * 1000 + step))
                   for env, dbs in envs]
        assert answers[0] == answers[1], f"step {step}"
    real.close()


def _entry(base: int, hwm: int) -> IndexEntry:
    return IndexEntry(base, 0, base * 10, 1, 10, hwm, hwm, hwm)


def _point(end: int) -> RecoveryPoint:
    return RecoveryPoint(0, end * 10, end, end)


def test_a_power_loss_keeps_what_was_synced_and_whole_transactions_only():
    storage = MemoryIndexStorage()
    index = Index("p/index", readonly=False, map_bytes=1 << 20, storage=storage)
    index.put([_entry(0, 5), _entry(1, 7)], _point(2))
    index.sync()
    index.put([_entry(2, 9)], _point(3))  # committed, never synced
    storage.crash(random.Random(1), "drop_unsynced")
    storage.reboot()
    again = Index("p/index", readonly=False, map_bytes=1 << 20, storage=storage)
    assert again.last_entry == _entry(1, 7)
    assert again.recovery_point() == _point(2)
    assert again.lookup_time(8) is None  # the lost batch's time key went with it
    # A torn power loss keeps a prefix of the unsynced transactions, each whole.
    kept = set()
    for seed in range(20):
        storage = MemoryIndexStorage()
        index = Index("p/index", readonly=False, map_bytes=1 << 20, storage=storage)
        for base in range(4):
            index.put([_entry(base, base)], _point(base + 1))
        storage.crash(random.Random(seed), "torn")
        storage.reboot()
        again = Index("p/index", readonly=False, map_bytes=1 << 20, storage=storage)
        end = again.last_entry.next_offset if again.last_entry else 0
        point = again.recovery_point()
        assert (point.next_offset if point else 0) == end  # entry and point: one txn
        kept.add(end)
    assert len(kept) > 2  # different prefixes were kept


def test_writes_after_the_power_loss_are_refused_until_the_reboot():
    storage = MemoryIndexStorage()
    index = Index("p/index", readonly=False, map_bytes=1 << 20, storage=storage)
    storage.crash(random.Random(0))
    with pytest.raises(Exception) as caught:
        index.put([_entry(0, 1)], _point(1))
    assert "cannot be read" in str(caught.value) or "written" in str(caught.value)


def test_entries_no_frame_backs_are_dropped_when_frames_are_indexed_again(caplog):
    """A put at an offset the store already holds entries (and time keys) past: LMDB's
    append would skip them silently and keep the old ones, with their old high-water
    marks; the index drops them and adds the new ones."""
    caplog.set_level(logging.WARNING, logger="streamlog.index")
    storage = MemoryIndexStorage()
    index = Index("p/index", readonly=False, map_bytes=1 << 20, storage=storage)
    index.put([_entry(0, 5), _entry(1, 50), _entry(2, 60)], _point(3))
    index.last_entry = _entry(0, 5)  # what a stale view of the store would say
    index.put([_entry(1, 6), _entry(2, 7)], _point(3))
    assert index.stale_entries_dropped == 1
    assert "no frame backs" in caplog.text
    assert index.lookup_offset(2) == _entry(2, 7)
    assert index.lookup_time(7).base_offset == 2
    assert index.lookup_time(8) is None  # the old marks 50 and 60 are gone
