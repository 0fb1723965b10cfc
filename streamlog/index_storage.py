"""Where an index's environment lives, and the file work around it: open, seal, wipe.

Strategy: `index.Index` holds the index's logic (keys, checksummed values, the
read-only overlay) and asks an `IndexStorage` for the environment it keeps its tables
in, so the same logic runs on LMDB files (`LmdbIndexStorage`, the default) or in
memory (`testing.memindex.MemoryIndexStorage`, which a simulated power loss rolls
back). A storage answers three questions: is there an index at this path (`exists`),
give me its environment (`open`), and forget it (`remove`, the wipe of a damaged index
the partition then rebuilds from the segments; `wipe_index` is the one way to ask).

LMDB checks nothing itself, and a damaged page can make it raise, return a wrong record
or even crash the process (seen: SIGBUS and assertion aborts in a sweep of single-bit
flips over page headers). So a writer that closes cleanly seals the index: `index.seal`
beside it holds the size and xxh3_64 of `data.mdb` (seal.py's format). An open that
finds a seal hashes the file before LMDB reads a byte of it (a few ms per MiB of index)
and refuses it (CorruptIndex: the partition rebuilds) when it does not match; a
writable open removes the seal before it first changes the file. An open of an index
without a seal (its writer was killed, or the machine lost power, and LMDB runs without
sync) first checks LMDB's meta pages (`check_lmdb_meta`) and, when the caller says so,
lets a child process walk every page and try a write (`probe_index`, ~20 ms): if the
child dies, the index is refused. A read-only open of a live writer's index (never
sealed while it runs) uses it with the checks above only: a damaged page there can
still crash the reading process.

What goes through the FileIO: the seal (written with `write_file_atomic`, read,
removed), the wipe, and whether there is an index at all. LMDB's own files
(`data.mdb`, `lock.mdb`) are written by LMDB itself, not through our FileIO, so what
this module reads of their bytes (their size, the hash, the meta pages) is read
plainly from the file system: a FileIO could only show a stale or absent copy of bytes
it never wrote.

LMDB allows one environment per file and process: a read-only open borrows the
environment another read-only open of the same file has in this process (a Spark
driver's view beside its planner's), and the last one to close it closes it. A writable
open has its own (its read transactions write to the lock file; a read-only open writes
nothing).
"""

from __future__ import annotations

import os
import struct
import threading
import time
from typing import Callable, Protocol

import lmdb

from .errors import CorruptIndex
from .fileio import FileIO, OsFileIO, read_file, write_file_atomic
from .index_format import DATABASES
from .seal import SealDamaged, decode_seal, encode_seal, hash_file

DATA_FILE = "data.mdb"
SEAL_SUFFIX = ".seal"
PROBE_TIMEOUT_S = 60
# LMDB writes its files itself: they are read plainly, never through a caller's FileIO
# (see the module docstring).
_LMDB_FILES = OsFileIO()


class IndexEnv(Protocol):
    """The part of py-lmdb's Environment the index uses, plus what a storage adds:
    `verified` (the file matched its seal, or there was no file: a record it lacks is
    truly absent) and a `close` that seals."""

    verified: bool

    def open_db(self, name: bytes, *, create: bool): ...
    def begin(self, *, write: bool = False, buffers: bool = False): ...
    def sync(self, force: bool = False) -> None: ...
    def close(self, *, seal: bool = False) -> None: ...


class IndexStorage(Protocol):
    """Where index environments live, by the index directory's path."""

    def exists(self, path: str) -> bool: ...
    def open(self, path: str, *, readonly: bool, map_bytes: int,
             probe_unsealed: Callable[[], bool]) -> IndexEnv: ...
    def remove(self, path: str) -> None: ...


def index_seal_path(path: str) -> str:
    """The seal of the index directory `path`: `PARTITION/index.seal`."""
    return path + SEAL_SUFFIX


def wipe_index(path: str, *, storage: IndexStorage | None = None,
               fileio: FileIO | None = None) -> None:
    """Forget the index at `path` (damaged, or describing segments that were cut): the
    next writable open starts it empty and recovery rebuilds it from the segments.

    Args:
        storage: where it lives; None: LMDB files, removed through `fileio`.
        fileio: the file system for LMDB files (None: OsFileIO).
    Raises:
        OSError from the file system.
    """
    (storage if storage is not None else LmdbIndexStorage(fileio)).remove(path)


class LmdbIndexStorage:
    """Indexes in LMDB files, one directory per index, sealed at a clean close.

    Args:
        fileio: the file system the seal and the wipe go through (None: OsFileIO).

    Thread-safety: any thread; the environments shared in this process are guarded by
    one lock.
    """

    def __init__(self, fileio: FileIO | None = None) -> None:
        self.fileio = fileio if fileio is not None else OsFileIO()

    def exists(self, path: str) -> bool:
        return self.fileio.exists(os.path.join(path, DATA_FILE))

    def open(self, path: str, *, readonly: bool, map_bytes: int,
             probe_unsealed: Callable[[], bool] = lambda: True) -> "LmdbEnv":
        """The environment of the index at `path` (created when writable).

        Args:
            probe_unsealed: says whether an index without a seal must be probed in a
                child process before use (probe_index).
        Raises:
            CorruptIndex when the file fails its seal or its checks; lmdb.Error when
            LMDB cannot open it.
        """
        if readonly:
            shared = _borrow(path)
            if shared is not None:
                return LmdbEnv(self, path, shared, sealed=False)
        verified, sealed = self._check_seal(path)
        if not verified:
            problem = check_lmdb_meta(os.path.join(path, DATA_FILE))
            if problem is None and probe_unsealed():
                problem = probe_index(path, map_bytes, writable=not readonly)
            if problem is not None:
                raise CorruptIndex(f"index {path} failed its check: {problem}")
        env = lmdb.open(path, map_size=map_bytes, max_dbs=6, subdir=True,
                        readonly=readonly, lock=not readonly, sync=False,
                        metasync=False, readahead=False, create=not readonly)
        shared = _Shared(env, writable=not readonly, verified=verified)
        with _SHARED_LOCK:
            _SHARED[os.path.realpath(path)] = shared
        return LmdbEnv(self, path, shared, sealed=sealed and not readonly)

    def remove(self, path: str) -> None:
        """Wipe the index at `path`: its seal first (no seal outlives the file it
        describes), then every file of its directory. Nothing there is fine."""
        seal = index_seal_path(path)
        if self.fileio.exists(seal):
            self.fileio.unlink(seal)
        try:
            names = self.fileio.listdir(path)
        except (FileNotFoundError, NotADirectoryError):
            names = []
        for name in names:
            self.fileio.unlink(os.path.join(path, name))

    def seal(self, path: str) -> None:
        """Write the seal of the (synced, closed) index at `path`."""
        data_path = os.path.join(path, DATA_FILE)
        size = os.path.getsize(data_path)
        write_file_atomic(self.fileio, index_seal_path(path), encode_seal(
            size_bytes=size, digest=hash_file(_LMDB_FILES, data_path, size),
            sealed_at_us=time.time_ns() // 1000))

    def unseal(self, path: str) -> None:
        """Remove the seal, durably, before the index's file first changes."""
        seal = index_seal_path(path)
        try:
            self.fileio.unlink(seal)
        except FileNotFoundError:
            pass  # another writer process removed it first
        self.fileio.fsync_dir(os.path.dirname(seal))

    def _check_seal(self, path: str) -> tuple[bool, bool]:
        """(verified, sealed): compare data.mdb with the seal a clean close left.
        (True, False) when there is no file at all (a writer builds it from scratch),
        (False, False) when there is no seal; raises CorruptIndex when they differ."""
        data_path = os.path.join(path, DATA_FILE)
        seal_path = index_seal_path(path)
        if not self.fileio.exists(data_path):
            return True, False
        if not self.fileio.exists(seal_path):
            return False, False
        try:
            seal = decode_seal(read_file(self.fileio, seal_path))
            if isinstance(seal, SealDamaged):
                raise CorruptIndex(f"index seal {seal_path} is damaged: {seal.reason}")
            size = os.path.getsize(data_path)
            if size != seal.size_bytes or hash_file(_LMDB_FILES, data_path,
                                                    size) != seal.digest:
                raise CorruptIndex(f"index {data_path} does not match its seal (it changed "
                                   f"after a clean close)")
        except OSError as error:
            raise CorruptIndex(f"cannot check index {data_path}: {error}") from None
        return True, True


class LmdbEnv:
    """One Index's use of an LMDB environment (read-only ones may share it), with the
    seal: the first write transaction removes it, a clean close writes it."""

    def __init__(self, storage: LmdbIndexStorage, path: str, shared: "_Shared", *,
                 sealed: bool) -> None:
        self.storage, self.path = storage, path
        self.verified = shared.verified
        self._shared = shared
        self._sealed = sealed  # a writable open's seal, still on disk

    def open_db(self, name: bytes, *, create: bool):
        with _SHARED_LOCK:  # (mdb_dbi_open must not run in two threads at once)
            db = self._shared.dbs.get(name)
            if db is None:
                db = self._shared.dbs[name] = self._shared.env.open_db(name, create=create)
        return db

    def begin(self, *, write: bool = False, buffers: bool = False):
        if write and self._sealed:
            self.storage.unseal(self.path)
            self._sealed = False
        return self._shared.env.begin(write=write, buffers=buffers)

    def sync(self, force: bool = False) -> None:
        self._shared.env.sync(force)

    def close(self, *, seal: bool = False) -> None:
        """Stop using the environment (the last user closes it); `seal` (a writer's
        clean close) syncs first and seals the file after."""
        if seal:
            assert self._shared.writable
            try:
                self._shared.env.sync(True)
            except lmdb.Error:
                seal = False
        _release(self.path, self._shared)
        if seal:
            self.storage.seal(self.path)


class _Shared:
    """An LMDB environment open in this process, and how many LmdbEnvs use it."""

    __slots__ = ("env", "writable", "users", "dbs", "verified")

    def __init__(self, env, *, writable: bool, verified: bool) -> None:
        self.env, self.writable, self.verified = env, writable, verified
        self.users = 1
        self.dbs: dict[bytes, object] = {}


_SHARED: dict[str, _Shared] = {}  # by the index directory's real path
_SHARED_LOCK = threading.Lock()


def _borrow(path: str) -> _Shared | None:
    """The environment a read-only open in this process has of `path` already, or
    None. A writable one is not lent: its read transactions write to the lock file,
    and a read-only open changes no file."""
    with _SHARED_LOCK:
        shared = _SHARED.get(os.path.realpath(path))
        if shared is None or shared.writable:
            return None
        shared.users += 1
        return shared


def _release(path: str, shared: _Shared) -> None:
    """One user fewer; the last closes the environment."""
    with _SHARED_LOCK:
        key = os.path.realpath(path)
        if _SHARED.get(key) is shared:
            shared.users -= 1
            if shared.users > 0:
                return
            del _SHARED[key]
    shared.env.close()


# -- checks of a file before LMDB maps it ------------------------------------------------

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
        with open(data_path, "rb") as handle:  # LMDB's file: read plainly
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
        for name in sys.argv[4:]:  # the index's databases (index_format.DATABASES)
            db = env.open_db(name.encode(), txn=txn, create=False)
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
                               "writable" if writable else "readonly",
                               *(name.decode() for name in DATABASES)],
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
