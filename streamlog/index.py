"""The partition index in LMDB: a cache of the segments, rebuilt from them when in doubt.

Strategy: three named databases in one LMDB environment per partition.

    offsets  key u64 BE base_offset       -> IndexEntry (one entry per batch frame)
    times    key u64 BE (hwm + 2**63)     -> u64 BE base_offset of the first batch whose
                                             running-max timestamp reaches that hwm; an
                                             entry is added only when the running max grows
    meta     key ascii                    -> value bytes (recovery point, last commit
                                             marker per tag as "commit:TAG")
    txns     key u64 BE txn_id            -> u8 state + u64 first offset (txn.py)
    open     key u64 BE txn_id            -> u64 first offset, for transactions still open

Big-endian fixed-width keys make byte order numeric order, so `set_range` is a seek.
The environment is opened with sync off: the segments are the truth, and recovery
reconciles the index with them on every unclean open. Transactions are always used in
`with` blocks and never held across a wait.

A read-only open must not write anything, so entries it discovers past the stored
index (an unflushed tail, or a log with no index at all) go to an in-memory overlay.
Only the partition's writer thread mutates an Index; readers call the lookups from any
thread (LMDB read transactions are per call).
"""

from __future__ import annotations

import bisect
import os
import struct
from typing import NamedTuple

import lmdb

from .errors import CorruptIndex

_KEY = struct.Struct(">Q")
_ENTRY = struct.Struct("<QQIIqqq")
_RECOVERY = struct.Struct("<QQQq")
_TXN = struct.Struct("<BQQ")  # state, first data offset, marker offset (0: none)
_HWM_BIAS = 1 << 63
# Stands for "no record yet" where a running max must be an int (the recovery point).
NO_HWM = -(1 << 63)
assert _ENTRY.size == 48
assert _RECOVERY.size == 32


class IndexEntry(NamedTuple):
    base_offset: int
    segment_base: int
    position: int
    record_count: int
    frame_bytes: int
    min_timestamp_us: int
    max_timestamp_us: int
    hwm_after_us: int  # running max timestamp of the partition after this batch

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.record_count


class RecoveryPoint(NamedTuple):
    """Everything before (segment_base, position) was fsynced and indexed."""

    segment_base: int
    position: int
    next_offset: int
    hwm_us: int


def _time_key(hwm_us: int) -> bytes:
    return _KEY.pack(hwm_us + _HWM_BIAS)


def _entry(base_offset: int, value: bytes) -> IndexEntry:
    return IndexEntry(base_offset, *_ENTRY.unpack(value))


class Index:
    def __init__(self, path: str, *, readonly: bool, map_bytes: int) -> None:
        self.path = path
        self.readonly = readonly
        self._env = None
        self._overlay: list[IndexEntry] = []
        self._overlay_bases: list[int] = []
        self._overlay_times: list[tuple[int, int]] = []
        self._overlay_txns: dict[int, tuple[int, int]] = {}
        self._overlay_commits: dict[str, bytes] = {}
        # Read-only: stored entries from this offset on are hidden (a live writer may be
        # ahead of what this open scanned); the overlay stands in for them.
        self._hidden_from: int | None = None
        self.reopened_txns: list[int] = []
        if readonly and not os.path.exists(os.path.join(path, "data.mdb")):
            self.last_entry = None
            return
        try:
            self._env = lmdb.open(path, map_size=map_bytes, max_dbs=6, subdir=True,
                                  readonly=readonly, lock=not readonly, sync=False,
                                  metasync=False, readahead=False, create=not readonly)
            self._offsets = self._env.open_db(b"offsets", create=not readonly)
            self._times = self._env.open_db(b"times", create=not readonly)
            self._meta = self._env.open_db(b"meta", create=not readonly)
            self._txns = self._env.open_db(b"txns", create=not readonly)
            self._open = self._env.open_db(b"open", create=not readonly)
        except lmdb.Error as error:
            if self._env is not None:
                self._env.close()
                self._env = None
            raise CorruptIndex(f"cannot open index {path}: {error}") from None
        self.last_entry = self._last_stored()

    # -- writes (writer thread only) ------------------------------------------------

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
                    self._overlay_commits[tag] = marker
        else:
            with self._env.begin(write=True) as txn:
                cursor = txn.cursor(self._offsets)
                cursor.putmulti([(_KEY.pack(e.base_offset), _ENTRY.pack(*e[1:]))
                                 for e in entries], append=True)
                time_cursor = txn.cursor(self._times)
                time_cursor.putmulti([(_time_key(h), _KEY.pack(b)) for h, b in times],
                                     append=True)
                if recovery is not None:
                    txn.put(b"recovery", _RECOVERY.pack(*recovery), db=self._meta)
                for txn_id, state, first, tag, marker in events:
                    self._apply_event(txn, txn_id, state, first, tag, marker)
        if entries:
            self.last_entry = entries[-1]

    def _apply_event(self, txn, txn_id, state, offset, tag, marker) -> None:
        key = _KEY.pack(txn_id)
        known = txn.get(key, db=self._txns)
        if state == 1:  # OPEN: only the first data frame of a transaction opens it
            if known is None:
                txn.put(key, _TXN.pack(state, offset, 0), db=self._txns)
                txn.put(key, _KEY.pack(offset), db=self._open)
            return
        first = _TXN.unpack(known)[1] if known is not None else offset
        txn.put(key, _TXN.pack(state, first, offset), db=self._txns)
        txn.delete(key, db=self._open)
        if tag:
            txn.put(b"commit:" + tag.encode(), marker, db=self._meta)

    def txn_state(self, txn_id: int) -> tuple[int, int, int] | None:
        """(state, first offset, marker offset) of a transaction, or None when unknown."""
        found = self._overlay_txns.get(txn_id)
        return found if found is not None else self._stored_txn(txn_id)

    def _stored_txn(self, txn_id: int):
        if self._env is None:
            return None
        with self._env.begin() as txn:
            value = txn.get(_KEY.pack(txn_id), db=self._txns)
        return _TXN.unpack(value) if value else None

    def open_txns(self) -> dict[int, int]:
        """{txn_id: first offset} of transactions with no commit or abort yet."""
        out = {}
        if self._env is not None:
            with self._env.begin() as txn:
                out = {_KEY.unpack(k)[0]: _KEY.unpack(v)[0]
                       for k, v in txn.cursor(self._open)}
        for txn_id, (state, first, _) in self._overlay_txns.items():
            if state == 1:
                out[txn_id] = first
            else:
                out.pop(txn_id, None)
        return out

    def last_commit(self, tag: str) -> bytes | None:
        if tag in self._overlay_commits:
            return self._overlay_commits[tag]
        return self._get_meta(b"commit:" + tag.encode())

    def _overlay_put(self, entries, times) -> None:
        self._overlay.extend(entries)
        self._overlay_bases.extend(e.base_offset for e in entries)
        self._overlay_times.extend(times)

    def set_meta(self, name: str, value: bytes) -> None:
        if self._env is None or self.readonly:
            return
        with self._env.begin(write=True) as txn:
            txn.put(name.encode(), value, db=self._meta)

    def set_recovery_point(self, point: RecoveryPoint) -> None:
        self.put([], point)

    def drop_from(self, offset: int) -> None:
        """Forget every batch whose base offset is >= offset (and their time entries)."""
        if self._env is not None and not self.readonly:
            with self._env.begin(write=True) as txn:
                cursor = txn.cursor(self._offsets)
                if cursor.set_range(_KEY.pack(offset)):
                    while cursor.delete():
                        pass
                self._drop_times_from(txn, offset)
                self.reopened_txns = self._drop_txns_from(txn, offset)
        elif self._env is not None:
            self._hidden_from = offset if self._hidden_from is None else min(
                self._hidden_from, offset)
        self._overlay_txns = {t: v for t, v in self._overlay_txns.items() if v[1] < offset}
        keep = bisect.bisect_left(self._overlay_bases, offset)
        del self._overlay[keep:], self._overlay_bases[keep:]
        self._overlay_times = [(h, b) for h, b in self._overlay_times if b < offset]
        self.last_entry = self._overlay[-1] if self._overlay else self._last_stored()

    def _drop_txns_from(self, txn, offset: int) -> list[int]:
        """Forget transactions that start at or after `offset`; reopen those whose
        marker is cut off. Returns the reopened ids (the caller aborts them)."""
        reopened = []
        for key, value in list(txn.cursor(self._txns)):
            state, first, marker_at = _TXN.unpack(value)
            if first >= offset:
                txn.delete(key, db=self._txns)
                txn.delete(key, db=self._open)
            elif state != 1 and marker_at >= offset:
                txn.put(key, _TXN.pack(1, first, 0), db=self._txns)
                txn.put(key, _KEY.pack(first), db=self._open)
                reopened.append(_KEY.unpack(key)[0])
        return reopened

    def drop_before(self, offset: int) -> None:
        """Forget batches that start before `offset` (retention removed their segment)."""
        if self._env is None or self.readonly:
            return
        with self._env.begin(write=True) as txn:
            cursor = txn.cursor(self._offsets)
            if cursor.first():
                while cursor.key() and _KEY.unpack(cursor.key())[0] < offset:
                    if not cursor.delete():
                        break
            cursor = txn.cursor(self._times)
            # hwm grows with the offset, so the doomed entries are the first ones
            while cursor.first() and _KEY.unpack(cursor.value())[0] < offset:
                cursor.delete()
        self.last_entry = self._overlay[-1] if self._overlay else self._last_stored()

    def _drop_times_from(self, txn, offset: int) -> None:
        cursor = txn.cursor(self._times)
        # hwm grows with the offset, so the doomed entries are the last ones
        while cursor.last() and _KEY.unpack(cursor.value())[0] >= offset:
            cursor.delete()

    def clear(self) -> None:
        """Forget everything (before a rebuild from the segments)."""
        if self._env is not None and not self.readonly:
            with self._env.begin(write=True) as txn:
                for db in (self._offsets, self._times, self._meta, self._txns, self._open):
                    txn.drop(db, delete=False)
        self._overlay, self._overlay_bases, self._overlay_times = [], [], []
        self._overlay_txns, self._overlay_commits = {}, {}
        if self._env is not None and self.readonly:
            self._hidden_from = 0  # read-only rebuild: the overlay replaces everything
        self.last_entry = None

    # -- reads (any thread) ---------------------------------------------------------

    def recovery_point(self) -> RecoveryPoint | None:
        value = self._get_meta(b"recovery")
        return RecoveryPoint(*_RECOVERY.unpack(value)) if value else None

    def get_meta(self, name: str) -> bytes | None:
        return self._get_meta(name.encode())

    def _get_meta(self, key: bytes) -> bytes | None:
        if self._env is None:
            return None
        with self._env.begin() as txn:
            return txn.get(key, db=self._meta)

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
        with self._env.begin() as txn:
            cursor = txn.cursor(self._offsets)
            key = _KEY.pack(offset)
            if cursor.set_range(key):
                if cursor.key() == key:
                    return _entry(offset, cursor.value())
                if not cursor.prev():
                    return None
            elif not cursor.last():
                return None
            return _entry(_KEY.unpack(cursor.key())[0], cursor.value())

    def lookup_time(self, timestamp_us: int) -> IndexEntry | None:
        """The first batch whose running-max timestamp reaches `timestamp_us`, or None."""
        base = None
        if self._env is not None:
            with self._env.begin() as txn:
                cursor = txn.cursor(self._times)
                if cursor.set_range(_time_key(timestamp_us)):
                    base = _KEY.unpack(cursor.value())[0]
                    if self._hidden_from is not None and base >= self._hidden_from:
                        base = None
        if base is None and self._overlay_times:
            at = bisect.bisect_left(self._overlay_times, (timestamp_us, -1))
            if at < len(self._overlay_times):
                base = self._overlay_times[at][1]
        return None if base is None else self.lookup_offset(base)

    def first_entry(self) -> IndexEntry | None:
        if self._env is not None:
            with self._env.begin() as txn:
                cursor = txn.cursor(self._offsets)
                if cursor.first():
                    entry = _entry(_KEY.unpack(cursor.key())[0], cursor.value())
                    if self._hidden_from is None or entry.base_offset < self._hidden_from:
                        return entry
        return self._overlay[0] if self._overlay else None

    def count(self) -> int:
        stored = 0
        if self._env is not None:
            with self._env.begin() as txn:
                stored = txn.stat(self._offsets)["entries"]
        return stored + len(self._overlay)

    def _last_stored(self) -> IndexEntry | None:
        if self._env is None:
            return None
        if self._hidden_from is not None:
            return self.lookup_offset(self._hidden_from - 1) if self._hidden_from else None
        with self._env.begin() as txn:
            cursor = txn.cursor(self._offsets)
            if cursor.last():
                return _entry(_KEY.unpack(cursor.key())[0], cursor.value())
        return None

    def sync(self) -> None:
        if self._env is not None and not self.readonly:
            self._env.sync(True)

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None
