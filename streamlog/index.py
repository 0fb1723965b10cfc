"""The partition index: a cache of the segments, rebuilt from them when in doubt.

Strategy: an `Index` keeps, per partition, one entry per batch frame, a time index of
the running max, transaction states and commit markers, in five tables of one
environment (their keys and checksummed values: index_format.py). The environment
lives in LMDB files, or in memory for tests (index_storage.py: the storage opens it,
seals it at a clean close, checks the seal at open, and wipes it).

The index is untrusted input (DESIGN 4). Every stored value carries a checksum of its
key and value; every LMDB or decoding failure is raised as `CorruptIndex`, never as a
raw library error; the partition rebuilds the index from the segments when it sees
one. What a checksum cannot catch (a lost record, an entry that points at the wrong
frame) the callers catch by checking entries against the segments before acting on
them.

The environment is opened with sync off: the segments are the truth, and recovery
reconciles the index with them on every unclean open. Transactions are always used in
`with` blocks and never held across a wait.

A read-only open must not write anything, so entries it discovers past the stored
index (an unflushed tail, or a log with no index at all) go to an in-memory overlay.
Only the partition's writer thread mutates an Index; readers call the lookups from any
thread (read transactions are per call). Writers in several processes share the
environment (LMDB locks it); each holds the partition's commit lock while it writes.
"""

from __future__ import annotations

import bisect
import functools
import logging
import struct
from typing import Protocol

import lmdb

from .errors import CorruptIndex
from .index_format import (DATABASES, FORMAT, KEY, NO_HWM, RECOVERY, TXN, IndexEntry,
                           RecoveryPoint, checked, checksummed, decode_entry, entry_item,
                           time_key, time_value)
from .index_storage import IndexStorage, LmdbIndexStorage

log = logging.getLogger("streamlog.index")


def _guard(method):
    """Turn any failure of LMDB or of decoding its bytes into CorruptIndex."""
    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except CorruptIndex:
            raise
        except (lmdb.Error, struct.error, ValueError, OverflowError, TypeError) as error:
            raise CorruptIndex(f"index {self.path} cannot be read: "
                               f"{type(error).__name__}: {error}") from None
    return guarded


class IndexStore(Protocol):
    """What the partition, its views, recovery and maintenance ask of an index: the
    interface `Index` (LMDB) implements. Every answer is a claim that its caller checks
    against the segments (the index is a cache, DESIGN 2)."""

    last_entry: IndexEntry | None
    verified: bool  # matched its seal at open, or was rebuilt here
    reopened_txns: list[int]  # set by drop_from: ended transactions the cut reopened
    dropped_commits: list[str]  # set by drop_from: tags whose latest commit it cut

    # writes (one writer at a time: the partition's writer thread, under its lock)
    def put(self, entries: list[IndexEntry], recovery: RecoveryPoint | None = None,
            events=()) -> None: ...
    def put_txn_state(self, txn_id: int, state: int, first: int, marker_at: int) -> None: ...
    def put_commit(self, tag: str, offset: int, marker: bytes) -> None: ...
    def set_recovery_point(self, point: RecoveryPoint) -> None: ...
    def set_meta(self, name: str, value: bytes) -> None: ...
    def drop_from(self, offset: int) -> None: ...
    def drop_before(self, offset: int) -> None: ...
    def clear(self) -> None: ...
    def sync(self) -> None: ...
    def close(self, *, seal: bool = False) -> None: ...
    def reload_last(self) -> None: ...

    # reads (any thread)
    def recovery_point(self) -> RecoveryPoint | None: ...
    def get_meta(self, name: str) -> bytes | None: ...
    def lookup_offset(self, offset: int) -> IndexEntry | None: ...
    def lookup_time(self, timestamp_us: int) -> IndexEntry | None: ...
    def first_entry(self) -> IndexEntry | None: ...
    def txn_state(self, txn_id: int) -> tuple[int, int, int] | None: ...
    def open_txns(self) -> dict[int, int]: ...
    def last_commit(self, tag: str) -> tuple[int, bytes] | None: ...


class Index:
    def __init__(self, path: str, *, readonly: bool, map_bytes: int,
                 probe_unsealed=lambda: True, storage: IndexStorage | None = None) -> None:
        """Open the index at `path` (created when writable); raises CorruptIndex when it
        cannot be used (the partition then rebuilds it from the segments).

        Args:
            probe_unsealed: says whether an index without a seal must be probed in a
                child process before use (index_storage.probe_index).
            storage: where the environment lives: None for LMDB files
                (index_storage.LmdbIndexStorage: sealed at a clean close, checked at
                open), or `testing.memindex.MemoryIndexStorage` (the same index logic
                on storage a simulated power loss rolls back).
        """
        self.path = path
        self.readonly = readonly
        self.storage = storage if storage is not None else LmdbIndexStorage()
        self._env = None
        self._overlay: list[IndexEntry] = []
        self._overlay_bases: list[int] = []
        self._overlay_times: list[tuple[int, int]] = []
        self._overlay_txns: dict[int, tuple[int, int]] = {}
        self._overlay_commits: dict[str, tuple[int, bytes]] = {}
        # Read-only: stored entries from this offset on are hidden (a live writer may be
        # ahead of what this open scanned); the overlay stands in for them.
        self._hidden_from: int | None = None
        # True when the file matched its seal at open (or was rebuilt here): a record
        # it lacks is then truly absent, not lost to a damaged page.
        self.verified = False
        self.reopened_txns: list[int] = []
        self.stale_entries_dropped = 0  # times put found entries no frame backs
        # Tags whose latest commit a drop_from cut off (the partition re-derives them).
        self.dropped_commits: list[str] = []
        self.last_entry = None
        if readonly and not self.storage.exists(path):
            return  # nothing stored: lookups answer from the overlay alone
        try:
            self._env = self.storage.open(path, readonly=readonly, map_bytes=map_bytes,
                                          probe_unsealed=probe_unsealed)
        except lmdb.Error as error:
            raise CorruptIndex(f"cannot open index {path}: {error}") from None
        self.verified = self._env.verified
        try:
            self._offsets, self._times, self._meta, self._txns, self._open = (
                self._env.open_db(name, create=not readonly)
                for name in DATABASES)
            self._check_format()
            self.last_entry = self._last_stored()
        except (lmdb.Error, CorruptIndex, struct.error, ValueError) as error:
            env, self._env = self._env, None
            env.close()
            raise CorruptIndex(f"cannot open index {path}: {error}") from None

    def _read(self):
        """A read transaction whose values are views, checked before they are copied."""
        return self._env.begin(buffers=True)

    def _write(self):
        """A write transaction (the storage removes a seal before the first one)."""
        return self._env.begin(write=True)


    def _check_format(self) -> None:
        with self._read() as txn:
            stored = txn.get(b"format", db=self._meta)
            if stored is not None:
                if checked(b"format", stored) != FORMAT:
                    raise CorruptIndex("index written by another format version")
                return
            if txn.stat(self._offsets)["entries"] or txn.stat(self._meta)["entries"]:
                raise CorruptIndex("index written by another format version")
        if not self.readonly:
            with self._write() as txn:
                txn.put(b"format", checksummed(b"format", FORMAT), db=self._meta)

    # -- writes (writer thread only) ------------------------------------------------

    @_guard
    def put(self, entries: list[IndexEntry], recovery: RecoveryPoint | None = None,
            events=()) -> None:
        """Add batch entries (in offset order, after every existing one), transaction
        events (txn.frame_events) and optionally move the recovery point, in one
        transaction."""
        if not entries and recovery is None and not events:
            return
        hwm_before = self.last_entry.hwm_after_us if self.last_entry else None
        if self.last_entry is not None and entries:
            assert entries[0].base_offset == self.last_entry.next_offset
        times = []
        for entry in entries:
            if entry.hwm_after_us == NO_HWM:
                continue  # no data record yet: nothing to find by time
            if hwm_before is None or entry.hwm_after_us > hwm_before:
                times.append((entry.hwm_after_us, entry.base_offset))
                hwm_before = entry.hwm_after_us
        if self._env is None or self.readonly:
            self._overlay_put(entries, times)
            for txn_id, state, first, tag, marker in events:
                known = self._overlay_txns.get(txn_id) or self._stored_txn(txn_id)
                if state == 1 and known is not None:
                    continue
                self._overlay_txns[txn_id] = (state, known[1] if known else first,
                                              0 if state == 1 else first)
                if tag:
                    self._overlay_commits[tag] = (first, bytes(marker))
        else:
            with self._write() as txn:
                items = [entry_item(e) for e in entries]
                time_items = [(k, checksummed(k, KEY.pack(b)))
                              for k, b in ((time_key(h), b) for h, b in times)]
                if not self._append(txn, items, time_items):
                    # Entries at or past these offsets, or time keys at or past these
                    # marks, outlived the frames they described (MDB_APPEND refuses to
                    # add before them, silently). The frames being indexed are the
                    # truth: forget everything from them on, then add them.
                    log.warning("index %s held entries past offset %d that no frame "
                                "backs: dropped", self.path, entries[0].base_offset
                                if entries else -1)
                    self.stale_entries_dropped += 1
                    self._drop_keys_from(txn, self._offsets, items[0][0] if items else None)
                    self._drop_keys_from(txn, self._times,
                                         time_items[0][0] if time_items else None)
                    assert self._append(txn, items, time_items)
                if recovery is not None:
                    txn.put(b"recovery", checksummed(b"recovery", RECOVERY.pack(*recovery)),
                            db=self._meta)
                for txn_id, state, first, tag, marker in events:
                    self._apply_event(txn, txn_id, state, first, tag, marker)
        if entries:
            self.last_entry = entries[-1]

    def _append(self, txn, items: list, time_items: list) -> bool:
        """Append entries and time keys after every stored one; False (nothing or part
        added) when a stored key is not below the first new one."""
        added = txn.cursor(self._offsets).putmulti(items, append=True)[1] if items else 0
        timed = txn.cursor(self._times).putmulti(time_items, append=True)[1] \
            if time_items else 0
        return added == len(items) and timed == len(time_items)

    @staticmethod
    def _drop_keys_from(txn, db, key: bytes | None) -> None:
        if key is None:
            return
        cursor = txn.cursor(db)
        if cursor.set_range(key):
            while cursor.delete():
                pass

    def _apply_event(self, txn, txn_id, state, offset, tag, marker) -> None:
        key = KEY.pack(txn_id)
        known = txn.get(key, db=self._txns)
        if state == 1:  # OPEN: only the first data frame of a transaction opens it
            if known is None:
                self._put_txn(txn, key, state, offset, 0)
            return
        first = TXN.unpack(checked(key, known, TXN.size))[1] if known is not None else offset
        self._put_txn(txn, key, state, first, offset)
        if tag:
            meta_key = b"commit:" + tag.encode()
            txn.put(meta_key, checksummed(meta_key, KEY.pack(offset) + bytes(marker)),
                    db=self._meta)

    def _put_txn(self, txn, key: bytes, state: int, first: int, marker_at: int) -> None:
        txn.put(key, checksummed(key, TXN.pack(state, first, marker_at)), db=self._txns)
        if state == 1:
            txn.put(key, checksummed(key, KEY.pack(first)), db=self._open)
        else:
            txn.delete(key, db=self._open)

    @_guard
    def put_txn_state(self, txn_id: int, state: int, first: int, marker_at: int) -> None:
        """Record a transaction state re-derived from the segments (writer thread)."""
        if self._env is None or self.readonly:
            self._overlay_txns[txn_id] = (state, first, marker_at)
            return
        with self._write() as txn:
            self._put_txn(txn, KEY.pack(txn_id), state, first, marker_at)

    def txn_state(self, txn_id: int) -> tuple[int, int, int] | None:
        """(state, first offset, marker offset) of a transaction, or None when unknown."""
        found = self._overlay_txns.get(txn_id)
        return found if found is not None else self._stored_txn(txn_id)

    @_guard
    def _stored_txn(self, txn_id: int):
        if self._env is None or self._hidden_from == 0:
            return None  # no index, or a read-only rebuild that replaced it all
        key = KEY.pack(txn_id)
        with self._read() as txn:
            value = txn.get(key, db=self._txns)
            if value is None:
                return None
            found = TXN.unpack(checked(key, value, TXN.size))
        if found[0] not in (1, 2, 3):
            raise CorruptIndex(f"transaction {txn_id} has an impossible state")
        if self._hidden_from is not None and found[1] >= self._hidden_from:
            return None
        return found

    @_guard
    def open_txns(self) -> dict[int, int]:
        """{txn_id: first offset} of transactions with no commit or abort yet."""
        out = {}
        if self._env is not None:
            with self._read() as txn:
                for key, value in txn.cursor(self._open):
                    (first,) = KEY.unpack(checked(key, value, KEY.size))
                    if self._hidden_from is None or first < self._hidden_from:
                        out[KEY.unpack(key)[0]] = first
        for txn_id, (state, first, _) in self._overlay_txns.items():
            if state == 1:
                out[txn_id] = first
            else:
                out.pop(txn_id, None)
        return out

    def last_commit(self, tag: str) -> tuple[int, bytes] | None:
        """(offset, marker) of the latest commit under `tag` the index knows of: a
        claim, checked against the segments by its reader (view.View.last_commit)."""
        if tag in self._overlay_commits:
            return self._overlay_commits[tag]
        stored = self._get_meta(b"commit:" + tag.encode())
        if stored is None:
            return None
        if len(stored) < KEY.size:
            raise CorruptIndex(f"index {self.path} has an impossible commit marker")
        return KEY.unpack_from(stored)[0], stored[KEY.size:]

    @_guard
    def put_commit(self, tag: str, offset: int, marker: bytes) -> None:
        """Record the latest commit under `tag`, re-derived from the segments."""
        if self._env is None or self.readonly:
            self._overlay_commits[tag] = (offset, marker)
            return
        meta_key = b"commit:" + tag.encode()
        with self._write() as txn:
            txn.put(meta_key, checksummed(meta_key, KEY.pack(offset) + marker), db=self._meta)

    def check_txns(self) -> None:
        """Read every cached transaction state; raises CorruptIndex on any damage.
        Runs at a writable open before any marker could be written from them."""
        if self._env is None:
            return
        with self._read() as txn:
            for db, size in ((self._txns, TXN.size), (self._open, KEY.size)):
                for key, value in txn.cursor(db):
                    if len(key) != KEY.size:
                        raise CorruptIndex("transaction key of a wrong length")
                    checked(key, value, size)

    def _overlay_put(self, entries, times) -> None:
        self._overlay.extend(entries)
        self._overlay_bases.extend(e.base_offset for e in entries)
        self._overlay_times.extend(times)

    @_guard
    def set_meta(self, name: str, value: bytes) -> None:
        if self._env is None or self.readonly:
            return
        key = name.encode()
        with self._write() as txn:
            txn.put(key, checksummed(key, value), db=self._meta)

    def set_recovery_point(self, point: RecoveryPoint) -> None:
        self.put([], point)

    @_guard
    def drop_from(self, offset: int) -> None:
        """Forget every batch whose base offset is >= offset (and their time entries)."""
        if self._nothing_from(offset):
            return
        if self._env is not None and not self.readonly:
            with self._write() as txn:
                cursor = txn.cursor(self._offsets)
                if cursor.set_range(KEY.pack(offset)):
                    while cursor.delete():
                        pass
                self._drop_times_from(txn, offset)
                self.reopened_txns = self._drop_txns_from(txn, offset)
                self.dropped_commits += self._drop_commits_from(txn, offset)
        elif self._env is not None:
            self._hidden_from = offset if self._hidden_from is None else min(
                self._hidden_from, offset)
        self._overlay_txns = {t: v for t, v in self._overlay_txns.items() if v[1] < offset}
        self._overlay_commits = {t: v for t, v in self._overlay_commits.items()
                                 if v[0] < offset}
        keep = bisect.bisect_left(self._overlay_bases, offset)
        del self._overlay[keep:], self._overlay_bases[keep:]
        self._overlay_times = [(h, b) for h, b in self._overlay_times if b < offset]
        self.last_entry = self._overlay[-1] if self._overlay else self._last_stored()

    def _nothing_from(self, offset: int) -> bool:
        """No entry and no transaction reaches `offset` (a writable open of a cleanly
        closed log changes nothing, so a refused open leaves the files as they were)."""
        if self._env is None or self.readonly or self._overlay:
            return False
        if self.last_entry is not None and self.last_entry.next_offset > offset:
            return False
        with self._read() as txn:
            # (what is stored, not only what this object last wrote: an entry or a time
            # key at or past `offset` must go whoever left it)
            for db in (self._offsets, self._times):
                cursor = txn.cursor(db)
                if cursor.last() and (db == self._times and time_value(
                        cursor.key(), cursor.value()) >= offset or db == self._offsets
                        and KEY.unpack(bytes(cursor.key()))[0] >= offset):
                    return False
            for key, value in txn.cursor(self._txns):
                _, first, marker_at = TXN.unpack(checked(key, value, TXN.size))
                if first >= offset or marker_at >= offset:
                    return False
        return True

    def _drop_commits_from(self, txn, offset: int) -> list[str]:
        """Forget the commits (per tag) at or after `offset`; returns their tags (the
        caller finds each tag's latest commit before the cut in the segments)."""
        dropped = []
        cursor = txn.cursor(self._meta)
        if cursor.set_range(b"commit:"):
            while cursor.key().startswith(b"commit:"):
                key = bytes(cursor.key())
                stored = checked(key, cursor.value())
                if len(stored) < KEY.size or KEY.unpack_from(stored)[0] >= offset:
                    dropped.append(key[len(b"commit:"):].decode(errors="replace"))
                    if not cursor.delete():
                        break
                elif not cursor.next():
                    break
        return dropped

    def _drop_txns_from(self, txn, offset: int) -> list[int]:
        """Forget transactions that start at or after `offset`; reopen those whose
        marker is cut off. Returns the reopened ids (the caller aborts them)."""
        reopened = []
        for key, value in list(txn.cursor(self._txns)):
            state, first, marker_at = TXN.unpack(checked(key, value, TXN.size))
            if first >= offset:
                txn.delete(key, db=self._txns)
                txn.delete(key, db=self._open)
                if state != 1:  # ended: re-indexing a kept part of its data reopens it
                    reopened.append(KEY.unpack(key)[0])
            elif state != 1 and marker_at >= offset:
                self._put_txn(txn, key, 1, first, 0)
                reopened.append(KEY.unpack(key)[0])
        return reopened

    @_guard
    def drop_before(self, offset: int) -> None:
        """Forget batches that start before `offset` (retention removed their segment)."""
        if self._env is None or self.readonly:
            return
        with self._write() as txn:
            cursor = txn.cursor(self._offsets)
            if cursor.first():
                while cursor.key() and KEY.unpack(cursor.key())[0] < offset:
                    if not cursor.delete():
                        break
            cursor = txn.cursor(self._times)
            # hwm grows with the offset, so the doomed entries are the first ones
            while cursor.first() and time_value(cursor.key(), cursor.value()) < offset:
                cursor.delete()
        self.last_entry = self._overlay[-1] if self._overlay else self._last_stored()

    def _drop_times_from(self, txn, offset: int) -> None:
        cursor = txn.cursor(self._times)
        # hwm grows with the offset, so the doomed entries are the last ones
        while cursor.last() and time_value(cursor.key(), cursor.value()) >= offset:
            cursor.delete()

    @_guard
    def clear(self) -> None:
        """Forget everything (before a rebuild from the segments)."""
        self.verified = True
        if self._env is not None and not self.readonly:
            with self._write() as txn:
                for db in (self._offsets, self._times, self._meta, self._txns, self._open):
                    txn.drop(db, delete=False)
                txn.put(b"format", checksummed(b"format", FORMAT), db=self._meta)
        self._overlay, self._overlay_bases, self._overlay_times = [], [], []
        self._overlay_txns, self._overlay_commits = {}, {}
        if self._env is not None and self.readonly:
            self._hidden_from = 0  # read-only rebuild: the overlay replaces everything
        self.last_entry = None

    # -- reads (any thread) ---------------------------------------------------------

    def recovery_point(self) -> RecoveryPoint | None:
        value = self._get_meta(b"recovery")
        if value is None:
            return None
        point = RecoveryPoint(*RECOVERY.unpack(value)) if len(value) == RECOVERY.size \
            else None
        if point is None or point.position < 0 or point.next_offset < point.segment_base:
            raise CorruptIndex(f"index {self.path} has an impossible recovery point")
        return point

    def get_meta(self, name: str) -> bytes | None:
        return self._get_meta(name.encode())

    @_guard
    def _get_meta(self, key: bytes) -> bytes | None:
        if self._env is None:
            return None
        with self._read() as txn:
            stored = txn.get(key, db=self._meta)
            return None if stored is None else checked(key, stored)

    @_guard
    def lookup_offset(self, offset: int) -> IndexEntry | None:
        """The batch that holds `offset`, or the last batch before it."""
        if self._overlay_bases and offset >= self._overlay_bases[0]:
            return self._overlay[bisect.bisect_right(self._overlay_bases, offset) - 1]
        if self._env is None:
            return None
        if self._hidden_from is not None:
            if self._hidden_from == 0:
                return None
            offset = min(offset, self._hidden_from - 1)
        with self._read() as txn:
            cursor = txn.cursor(self._offsets)
            key = KEY.pack(offset)
            if cursor.set_range(key):
                if cursor.key() == key:
                    return decode_entry(key, cursor.value())
                if not cursor.prev():
                    return None
            elif not cursor.last():
                return None
            return decode_entry(cursor.key(), cursor.value())

    @_guard
    def lookup_time(self, timestamp_us: int) -> IndexEntry | None:
        """The first batch whose running-max timestamp reaches `timestamp_us`, or None."""
        base = None
        if self._env is not None:
            with self._read() as txn:
                cursor = txn.cursor(self._times)
                if cursor.set_range(time_key(timestamp_us)):
                    base = time_value(cursor.key(), cursor.value())
                    if self._hidden_from is not None and base >= self._hidden_from:
                        base = None
        if base is None and self._overlay_times:
            at = bisect.bisect_left(self._overlay_times, (timestamp_us, -1))
            if at < len(self._overlay_times):
                base = self._overlay_times[at][1]
        return None if base is None else self.lookup_offset(base)

    @_guard
    def first_entry(self) -> IndexEntry | None:
        if self._env is not None:
            with self._read() as txn:
                cursor = txn.cursor(self._offsets)
                if cursor.first():
                    entry = decode_entry(cursor.key(), cursor.value())
                    if self._hidden_from is None or entry.base_offset < self._hidden_from:
                        return entry
        return self._overlay[0] if self._overlay else None

    @_guard
    def reload_last(self) -> None:
        """Re-read the last entry (a writer in another process may have added some)."""
        self.last_entry = self._overlay[-1] if self._overlay else self._last_stored()

    def _last_stored(self) -> IndexEntry | None:
        if self._env is None:
            return None
        if self._hidden_from is not None:
            return self.lookup_offset(self._hidden_from - 1) if self._hidden_from else None
        with self._read() as txn:
            cursor = txn.cursor(self._offsets)
            if cursor.last():
                return decode_entry(cursor.key(), cursor.value())
        return None

    @_guard
    def sync(self) -> None:
        if self._env is not None and not self.readonly:
            self._env.sync(True)

    def close(self, *, seal: bool = False) -> None:
        """Close; `seal` (a writer's clean close) syncs and seals the file."""
        env, self._env = self._env, None
        if env is not None:
            env.close(seal=seal and not self.readonly)
