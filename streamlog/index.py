"""The partition index in LMDB: a cache of the segments, rebuilt from them when in doubt.

Strategy: five named databases in one LMDB environment per partition.

    offsets  key u64 BE base_offset       -> IndexEntry (one entry per batch frame)
    times    key u64 BE (hwm + 2**63)     -> u64 BE base_offset of the first batch whose
                                             running-max timestamp reaches that hwm; an
                                             entry is added only when the running max grows
    meta     key ascii                    -> value bytes (format, recovery point, last
                                             commit marker per tag as "commit:TAG")
    txns     key u64 BE txn_id            -> u8 state + u64 first offset + u64 marker
                                             offset (txn.py)
    open     key u64 BE txn_id            -> u64 first offset, for transactions still open

The index is untrusted input (DESIGN 4). Every stored value ends with an xxh3_64 of its
key and value, so a flipped bit in a key or a value reads as damage, never as a
different answer; every LMDB or decoding failure is raised as `CorruptIndex`, never as
a raw library error; the partition rebuilds the index from the segments when it sees
one. What a checksum cannot catch (a lost record, an entry that points at the wrong
frame) the callers catch by checking entries against the segments before acting on
them. An index written by an older format has no checksums and is rebuilt.

LMDB checks nothing itself, and a damaged page can make it raise, return a wrong record
or even crash the process (seen: SIGBUS and assertion aborts in a sweep of single-bit
flips over page headers). So a writer that closes cleanly seals the index: `index.seal`
beside it holds the size and xxh3_64 of `data.mdb` (seal.py's format). An open that
finds a seal hashes the file before LMDB reads a byte of it (a few ms per MiB of index)
and rebuilds the index when it does not match; a writable open removes the seal before
it first changes the file. A writable open of an index without a seal (its writer was
killed, or the machine lost power, and LMDB runs without sync) first lets a child
process walk every page and try a write (`probe_index`, ~20 ms): if the child dies,
the index is rebuilt; so does a read-only open when no writer is alive. A read-only
open of a live writer's index (never sealed while it runs) uses it with the checks
above only: a damaged page there can still crash the reading process.

Big-endian fixed-width keys make byte order numeric order, so `set_range` is a seek.
The environment is opened with sync off: the segments are the truth, and recovery
reconciles the index with them on every unclean open. Transactions are always used in
`with` blocks and never held across a wait.

A read-only open must not write anything, so entries it discovers past the stored
index (an unflushed tail, or a log with no index at all) go to an in-memory overlay.
Only the partition's writer thread mutates an Index; readers call the lookups from any
thread (LMDB read transactions are per call). Writers in several processes share the
environment (LMDB locks it); each holds the partition's commit lock while it writes.

Why one module of ~700 lines: the stored format (keys, checksummed values), the checks
of a file before LMDB maps it (seal, probe) and the read-only overlay must agree byte
for byte, so they are kept together.
"""

from __future__ import annotations

import bisect
import functools
import logging
import os
import struct
import threading
import time
from typing import NamedTuple, Protocol

import lmdb
import xxhash

from .errors import CorruptIndex
from .payload import NO_TIME as NO_HWM  # noqa: F401 - the index speaks of NO_HWM
from .fileio import OsFileIO, write_file_atomic
from .seal import SealDamaged, decode_seal, encode_seal, hash_file

log = logging.getLogger("streamlog.index")

_KEY = struct.Struct(">Q")
_ENTRY = struct.Struct("<QQIIqqq")
_RECOVERY = struct.Struct("<QQQq")
_TXN = struct.Struct("<BQQ")  # state, first data offset, marker offset (0: none)
_HWM_BIAS = 1 << 63
# Stands for "no record yet" where a running max must be an int (the recovery point).
assert _ENTRY.size == 48
assert _RECOVERY.size == 32
_SUM = struct.Struct("<Q")
_KEY_BYTES_MAX = 511  # LMDB's own limit
_VALUE_BYTES_MAX = 4096  # meta values (commit markers) are small
FORMAT = b"4"  # 2: every value carries a checksum of its key and value;
#                3: a commit marker is stored with its offset;
#                4: control records never move the high-water mark (time keys rebuilt)


def _seal(key: bytes, value: bytes) -> bytes:
    """A stored value: the value, then xxh3_64 of key and value."""
    return value + _SUM.pack(xxhash.xxh3_64_intdigest(key + value))


def _open(key, stored, size: int | None = None) -> bytes:
    """The value of a stored value, checked; raises CorruptIndex when damaged.

    `key` and `stored` may be LMDB buffers (views of the map): their lengths are checked
    before a byte is copied, since a damaged length can reach past the end of the file
    (reading there is SIGBUS, not an exception)."""
    limit = _VALUE_BYTES_MAX if size is None else size + _SUM.size
    if len(key) > _KEY_BYTES_MAX or not _SUM.size <= len(stored) <= limit or (
            size is not None and len(stored) != limit):
        raise CorruptIndex("an index key or value has a wrong length")
    key, stored = bytes(key), bytes(stored)
    value = stored[:-_SUM.size]
    if _SUM.unpack(stored[-_SUM.size:])[0] != xxhash.xxh3_64_intdigest(key + value):
        raise CorruptIndex(f"index value of key {key.hex()} fails its checksum")
    return value


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


_LMDB_META = struct.Struct("<IIQQ")  # mm_magic, mm_version, mm_address, mm_mapsize
_LMDB_MAGIC = 0xBEEFC0DE
_P_INVALID = (1 << 64) - 1


def check_lmdb_meta(data_path: str) -> str | None:
    """What is wrong with an LMDB file's two meta pages, or None. Cheap (8 KiB read),
    and it matters: LMDB trusts the newer meta's last page number and roots, and a bad
    one makes it read past the end of the file (SIGBUS) instead of failing. Layout
    (lmdb.h, 64-bit): page header 16 bytes, then magic u32, version u32, address u64,
    mapsize u64, two MDB_db records of 48 bytes (the first's u32 pad is the page size;
    each ends with its root page), last page u64, txnid u64."""
    try:
        with open(data_path, "rb") as handle:
            head = handle.read(2 * 65536)
        size = os.path.getsize(data_path)
    except OSError as error:
        return f"cannot read: {error}"
    if len(head) < 160:
        return "shorter than its meta pages"
    page_bytes = struct.unpack_from("<I", head, 16 + 24)[0]
    if page_bytes not in (4096, 8192, 16384, 65536) or len(head) < page_bytes + 160:
        return f"impossible page size {page_bytes}"
    metas = []
    for number in (0, 1):
        at = number * page_bytes + 16
        magic, version, _, _ = _LMDB_META.unpack_from(head, at)
        roots = [struct.unpack_from("<Q", head, at + 24 + 48 * i + 40)[0] for i in (0, 1)]
        last_page, txnid = struct.unpack_from("<QQ", head, at + 24 + 96)
        sane = (magic == _LMDB_MAGIC and version == 1 and (last_page + 1) * page_bytes <= size
                and all(r == _P_INVALID or 2 <= r <= last_page for r in roots))
        metas.append((txnid, sane))
    newest = max(metas)
    return None if newest[1] else "its current meta page is damaged"


_PROBE = """
import sys, lmdb
writable = sys.argv[3] == "writable"  # a read-only probe changes no file, lock.mdb neither
env = lmdb.open(sys.argv[1], map_size=int(sys.argv[2]), max_dbs=6, subdir=True,
                readonly=not writable, lock=writable, sync=False, metasync=False,
                readahead=False, create=False)
with open("/dev/null", "wb") as sink:
    env.copyfd(sink.fileno(), compact=True)  # walks every page of every tree, in C
if writable:
    with env.begin(write=True) as txn:  # and the write path: free pages, the dbi table
        for name in (b"offsets", b"times", b"meta", b"txns", b"open"):
            db = env.open_db(name, txn=txn, create=False)
            txn.put(b"~probe", b"", db=db)
        txn.abort()
env.close()
"""


def probe_index(path: str, map_bytes: int, *, writable: bool) -> str | None:
    """Let a child process use an index no clean close sealed (its writer was killed,
    or the machine lost power with LMDB unsynced) before this process does: LMDB can
    crash on a damaged page, and a crash there is a rebuild here, not a dead writer.
    Walks every page in C (mdb_env_copy with compaction) and, for a writer, tries a
    write that it aborts (a reader's probe opens the file read-only, without even
    LMDB's lock file). Returns None when the child succeeded, else what happened."""
    import subprocess
    import sys
    try:
        done = subprocess.run([sys.executable, "-I", "-c", _PROBE, path, str(map_bytes),
                               "writable" if writable else "readonly"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"the probe did not finish in {PROBE_TIMEOUT_S} s"
    if done.returncode == 0:
        return None
    lines = done.stderr.decode(errors="replace").strip().splitlines()
    how = (f"killed by signal {-done.returncode}" if done.returncode < 0
           else f"exit {done.returncode}")
    return f"{how}: {lines[-1] if lines else 'no message'}"


PROBE_TIMEOUT_S = 60


def _time_key(hwm_us: int) -> bytes:
    return _KEY.pack(hwm_us + _HWM_BIAS)


def _time_value(key: bytes, stored) -> int:
    return _KEY.unpack(_open(key, stored, _KEY.size))[0]


def _entry_item(entry: IndexEntry) -> tuple[bytes, bytes]:
    key = _KEY.pack(entry.base_offset)
    return key, _seal(key, _ENTRY.pack(*entry[1:]))


def _entry(key: bytes, stored) -> IndexEntry:
    (base_offset,) = _KEY.unpack(key)
    entry = IndexEntry(base_offset, *_ENTRY.unpack(_open(key, stored, _ENTRY.size)))
    if entry.record_count < 1 or entry.frame_bytes < 1 or entry.position < 0:
        raise CorruptIndex(f"index entry for offset {base_offset} is impossible")
    return entry


class _Shared:
    """An LMDB environment open in this process, and how many Index objects use it."""

    __slots__ = ("env", "writable", "users", "dbs", "verified")

    def __init__(self, env, writable: bool, users: int, dbs: tuple, verified: bool) -> None:
        self.env, self.writable, self.users = env, writable, users
        self.dbs, self.verified = dbs, verified


_SHARED: dict[str, _Shared] = {}  # by the index directory's real path
_SHARED_LOCK = threading.Lock()


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
                 probe_unsealed=lambda: True, storage=None) -> None:
        """`probe_unsealed()` says whether an index without a seal must be probed in a
        child process before use (probe_index). `storage`: where the environment
        lives instead of an LMDB file (`testing.memindex.MemoryIndexStorage`: the same
        index logic on storage a simulated power loss rolls back); it has no seal and
        needs no probe."""
        self.path = path
        self.readonly = readonly
        self.storage = storage
        self._env = None
        self._overlay: list[IndexEntry] = []
        self._overlay_bases: list[int] = []
        self._overlay_times: list[tuple[int, int]] = []
        self._overlay_txns: dict[int, tuple[int, int]] = {}
        self._overlay_commits: dict[str, tuple[int, bytes]] = {}
        # Read-only: stored entries from this offset on are hidden (a live writer may be
        # ahead of what this open scanned); the overlay stands in for them.
        self._hidden_from: int | None = None
        self._sealed = False  # a writable open's seal still on disk (see _write)
        # True when the file matched its seal at open (or was rebuilt here): a record
        # it lacks is then truly absent, not lost to a damaged page.
        self.verified = False
        self.reopened_txns: list[int] = []
        self.stale_entries_dropped = 0  # times put found entries no frame backs
        # Tags whose latest commit a drop_from cut off (the partition re-derives them).
        self.dropped_commits: list[str] = []
        if storage is not None:
            self._open_in(storage)
            return
        if readonly and not os.path.exists(os.path.join(path, "data.mdb")):
            self.last_entry = None
            return
        if readonly and self._borrow():
            return
        if not self._check_seal():
            problem = check_lmdb_meta(os.path.join(path, "data.mdb"))
            if problem is None and probe_unsealed():
                problem = probe_index(path, map_bytes, writable=not readonly)
            if problem is not None:
                raise CorruptIndex(f"index {path} failed its check: {problem}")
        try:
            self._env = lmdb.open(path, map_size=map_bytes, max_dbs=6, subdir=True,
                                  readonly=readonly, lock=not readonly, sync=False,
                                  metasync=False, readahead=False, create=not readonly)
            self._offsets = self._env.open_db(b"offsets", create=not readonly)
            self._times = self._env.open_db(b"times", create=not readonly)
            self._meta = self._env.open_db(b"meta", create=not readonly)
            self._txns = self._env.open_db(b"txns", create=not readonly)
            self._open = self._env.open_db(b"open", create=not readonly)
            self._check_format()
            self.last_entry = self._last_stored()
        except (lmdb.Error, CorruptIndex, struct.error, ValueError) as error:
            if self._env is not None:
                self._env.close()
                self._env = None
            raise CorruptIndex(f"cannot open index {path}: {error}") from None
        with _SHARED_LOCK:
            _SHARED[os.path.realpath(path)] = _Shared(
                self._env, not readonly, 1, (self._offsets, self._times, self._meta,
                                             self._txns, self._open), self.verified)

    def _open_in(self, storage) -> None:
        """Open the environment `storage` holds for this path (see __init__)."""
        self.verified = True  # nothing can damage it but the index's own writes
        if self.readonly and not storage.exists(self.path):
            self.last_entry = None
            return
        try:
            self._env = storage.open(self.path, readonly=self.readonly)
            self._offsets, self._times, self._meta, self._txns, self._open = (
                self._env.open_db(name, create=not self.readonly)
                for name in (b"offsets", b"times", b"meta", b"txns", b"open"))
            self._check_format()
            self.last_entry = self._last_stored()
        except (lmdb.Error, CorruptIndex) as error:
            self._env = None
            raise CorruptIndex(f"cannot open index {self.path}: {error}") from None

    def _borrow(self) -> bool:
        """A read-only open of an index this process has open read-only already (LMDB
        allows one environment per file and process): use that environment. False if
        there is none (the open then tries its own). A writable one is not borrowed:
        its read transactions would write to the lock file, and a read-only open
        changes no file."""
        with _SHARED_LOCK:
            shared = _SHARED.get(os.path.realpath(self.path))
            if shared is None or shared.writable:
                return False
            shared.users += 1
        self._env, self.verified = shared.env, shared.verified
        self._offsets, self._times, self._meta, self._txns, self._open = shared.dbs
        try:
            self._check_format()
            self.last_entry = self._last_stored()
        except (lmdb.Error, CorruptIndex, struct.error, ValueError) as error:
            self._release()
            raise CorruptIndex(f"cannot open index {self.path}: {error}") from None
        return True

    def _release(self) -> None:
        """Stop using the environment; the last user closes it."""
        env, self._env = self._env, None
        with _SHARED_LOCK:
            key = os.path.realpath(self.path)
            shared = _SHARED.get(key)
            if shared is not None and shared.env is env:
                shared.users -= 1
                if shared.users > 0:
                    return
                del _SHARED[key]
        env.close()

    @property
    def seal_path(self) -> str:
        return self.path + ".seal"

    def _check_seal(self) -> bool:
        """Compare data.mdb with the seal a clean close left (see the docstring);
        raises CorruptIndex when they differ. Returns False when there is no seal."""
        data_path = os.path.join(self.path, "data.mdb")
        if not os.path.exists(data_path):
            self.verified = True  # no index at all: this writer builds it from scratch
            return True
        if not os.path.exists(self.seal_path):
            return False
        try:
            with open(self.seal_path, "rb") as handle:
                seal = decode_seal(handle.read())
            if isinstance(seal, SealDamaged):
                raise CorruptIndex(f"index seal {self.seal_path} is damaged: {seal.reason}")
            size = os.path.getsize(data_path)
            if size != seal.size_bytes or hash_file(OsFileIO(), data_path, size) != seal.digest:
                raise CorruptIndex(f"index {data_path} does not match its seal (it changed "
                                   f"after a clean close)")
        except OSError as error:
            raise CorruptIndex(f"cannot check index {data_path}: {error}") from None
        self._sealed = not self.readonly  # removed before the first write (_write)
        self.verified = True
        return True

    def _read(self):
        """A read transaction whose values are views, checked before they are copied."""
        return self._env.begin(buffers=True)

    def _write(self):
        """A write transaction; the first one removes the seal (the file changes)."""
        if self._sealed:
            try:
                os.unlink(self.seal_path)
            except FileNotFoundError:
                pass  # another writer process removed it first
            OsFileIO().fsync_dir(os.path.dirname(self.seal_path))
            self._sealed = False
        return self._env.begin(write=True)

    def _check_format(self) -> None:
        with self._read() as txn:
            stored = txn.get(b"format", db=self._meta)
            if stored is not None:
                if _open(b"format", stored) != FORMAT:
                    raise CorruptIndex("index written by another format version")
                return
            if txn.stat(self._offsets)["entries"] or txn.stat(self._meta)["entries"]:
                raise CorruptIndex("index written by another format version")
        if not self.readonly:
            with self._write() as txn:
                txn.put(b"format", _seal(b"format", FORMAT), db=self._meta)

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
                items = [_entry_item(e) for e in entries]
                time_items = [(k, _seal(k, _KEY.pack(b)))
                              for k, b in ((_time_key(h), b) for h, b in times)]
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
                    txn.put(b"recovery", _seal(b"recovery", _RECOVERY.pack(*recovery)),
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
        key = _KEY.pack(txn_id)
        known = txn.get(key, db=self._txns)
        if state == 1:  # OPEN: only the first data frame of a transaction opens it
            if known is None:
                self._put_txn(txn, key, state, offset, 0)
            return
        first = _TXN.unpack(_open(key, known, _TXN.size))[1] if known is not None else offset
        self._put_txn(txn, key, state, first, offset)
        if tag:
            meta_key = b"commit:" + tag.encode()
            txn.put(meta_key, _seal(meta_key, _KEY.pack(offset) + bytes(marker)),
                    db=self._meta)

    def _put_txn(self, txn, key: bytes, state: int, first: int, marker_at: int) -> None:
        txn.put(key, _seal(key, _TXN.pack(state, first, marker_at)), db=self._txns)
        if state == 1:
            txn.put(key, _seal(key, _KEY.pack(first)), db=self._open)
        else:
            txn.delete(key, db=self._open)

    @_guard
    def put_txn_state(self, txn_id: int, state: int, first: int, marker_at: int) -> None:
        """Record a transaction state re-derived from the segments (writer thread)."""
        if self._env is None or self.readonly:
            self._overlay_txns[txn_id] = (state, first, marker_at)
            return
        with self._write() as txn:
            self._put_txn(txn, _KEY.pack(txn_id), state, first, marker_at)

    def txn_state(self, txn_id: int) -> tuple[int, int, int] | None:
        """(state, first offset, marker offset) of a transaction, or None when unknown."""
        found = self._overlay_txns.get(txn_id)
        return found if found is not None else self._stored_txn(txn_id)

    @_guard
    def _stored_txn(self, txn_id: int):
        if self._env is None or self._hidden_from == 0:
            return None  # no index, or a read-only rebuild that replaced it all
        key = _KEY.pack(txn_id)
        with self._read() as txn:
            value = txn.get(key, db=self._txns)
            if value is None:
                return None
            found = _TXN.unpack(_open(key, value, _TXN.size))
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
                    (first,) = _KEY.unpack(_open(key, value, _KEY.size))
                    if self._hidden_from is None or first < self._hidden_from:
                        out[_KEY.unpack(key)[0]] = first
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
        if len(stored) < _KEY.size:
            raise CorruptIndex(f"index {self.path} has an impossible commit marker")
        return _KEY.unpack_from(stored)[0], stored[_KEY.size:]

    @_guard
    def put_commit(self, tag: str, offset: int, marker: bytes) -> None:
        """Record the latest commit under `tag`, re-derived from the segments."""
        if self._env is None or self.readonly:
            self._overlay_commits[tag] = (offset, marker)
            return
        meta_key = b"commit:" + tag.encode()
        with self._write() as txn:
            txn.put(meta_key, _seal(meta_key, _KEY.pack(offset) + marker), db=self._meta)

    def check_txns(self) -> None:
        """Read every cached transaction state; raises CorruptIndex on any damage.
        Runs at a writable open before any marker could be written from them."""
        if self._env is None:
            return
        with self._read() as txn:
            for db, size in ((self._txns, _TXN.size), (self._open, _KEY.size)):
                for key, value in txn.cursor(db):
                    if len(key) != _KEY.size:
                        raise CorruptIndex("transaction key of a wrong length")
                    _open(key, value, size)

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
            txn.put(key, _seal(key, value), db=self._meta)

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
                if cursor.set_range(_KEY.pack(offset)):
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
                if cursor.last() and (db == self._times and _time_value(
                        cursor.key(), cursor.value()) >= offset or db == self._offsets
                        and _KEY.unpack(bytes(cursor.key()))[0] >= offset):
                    return False
            for key, value in txn.cursor(self._txns):
                _, first, marker_at = _TXN.unpack(_open(key, value, _TXN.size))
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
                stored = _open(key, cursor.value())
                if len(stored) < _KEY.size or _KEY.unpack_from(stored)[0] >= offset:
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
            state, first, marker_at = _TXN.unpack(_open(key, value, _TXN.size))
            if first >= offset:
                txn.delete(key, db=self._txns)
                txn.delete(key, db=self._open)
                if state != 1:  # ended: re-indexing a kept part of its data reopens it
                    reopened.append(_KEY.unpack(key)[0])
            elif state != 1 and marker_at >= offset:
                self._put_txn(txn, key, 1, first, 0)
                reopened.append(_KEY.unpack(key)[0])
        return reopened

    @_guard
    def drop_before(self, offset: int) -> None:
        """Forget batches that start before `offset` (retention removed their segment)."""
        if self._env is None or self.readonly:
            return
        with self._write() as txn:
            cursor = txn.cursor(self._offsets)
            if cursor.first():
                while cursor.key() and _KEY.unpack(cursor.key())[0] < offset:
                    if not cursor.delete():
                        break
            cursor = txn.cursor(self._times)
            # hwm grows with the offset, so the doomed entries are the first ones
            while cursor.first() and _time_value(cursor.key(), cursor.value()) < offset:
                cursor.delete()
        self.last_entry = self._overlay[-1] if self._overlay else self._last_stored()

    def _drop_times_from(self, txn, offset: int) -> None:
        cursor = txn.cursor(self._times)
        # hwm grows with the offset, so the doomed entries are the last ones
        while cursor.last() and _time_value(cursor.key(), cursor.value()) >= offset:
            cursor.delete()

    @_guard
    def clear(self) -> None:
        """Forget everything (before a rebuild from the segments)."""
        self.verified = True
        if self._env is not None and not self.readonly:
            with self._write() as txn:
                for db in (self._offsets, self._times, self._meta, self._txns, self._open):
                    txn.drop(db, delete=False)
                txn.put(b"format", _seal(b"format", FORMAT), db=self._meta)
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
        point = RecoveryPoint(*_RECOVERY.unpack(value)) if len(value) == _RECOVERY.size \
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
            return None if stored is None else _open(key, stored)

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
            key = _KEY.pack(offset)
            if cursor.set_range(key):
                if cursor.key() == key:
                    return _entry(key, cursor.value())
                if not cursor.prev():
                    return None
            elif not cursor.last():
                return None
            return _entry(cursor.key(), cursor.value())

    @_guard
    def lookup_time(self, timestamp_us: int) -> IndexEntry | None:
        """The first batch whose running-max timestamp reaches `timestamp_us`, or None."""
        base = None
        if self._env is not None:
            with self._read() as txn:
                cursor = txn.cursor(self._times)
                if cursor.set_range(_time_key(timestamp_us)):
                    base = _time_value(cursor.key(), cursor.value())
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
                    entry = _entry(cursor.key(), cursor.value())
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
                return _entry(cursor.key(), cursor.value())
        return None

    @_guard
    def sync(self) -> None:
        if self._env is not None and not self.readonly:
            self._env.sync(True)

    def close(self, *, seal: bool = False) -> None:
        """Close; `seal` (a writer's clean close) syncs and seals the file."""
        if self._env is None:
            return
        if self.storage is not None:
            env, self._env = self._env, None
            if seal and not self.readonly:
                env.sync(True)
            env.close()
            return
        if seal and not self.readonly:
            try:
                self._env.sync(True)
            except lmdb.Error:
                seal = False
        self._release()  # (read-only users may keep it open: they never write to it)
        if seal and not self.readonly:
            data_path = os.path.join(self.path, "data.mdb")
            size = os.path.getsize(data_path)
            write_file_atomic(OsFileIO(), self.seal_path, encode_seal(
                size_bytes=size, digest=hash_file(OsFileIO(), data_path, size),
                sealed_at_us=time.time_ns() // 1000))
