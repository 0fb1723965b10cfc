"""The index's environment held in memory instead of in LMDB files.

Strategy: `index.Index` keeps its whole logic (keys, checksummed values, the read-only
overlay, every drop and lookup) and asks an environment for ordered tables, as it asks
LMDB. `MemoryIndexStorage` hands it `MemoryEnv`s instead of LMDB files, so an index
can live where there is no local directory for one: a view of a log in an object
store (remote/view.py) builds each partition's index in memory from the store's
index objects. A write transaction is all or nothing; readers see the state their
transaction began on.

The subset of py-lmdb's API the index uses is implemented with py-lmdb's semantics,
including the ones that bite: `Cursor.putmulti(append=True)` skips (and does not add) a
key that is not greater than the table's last one, as MDB_APPEND answers MDB_KEYEXIST;
`Cursor.delete` moves to the next item and leaves the cursor unpositioned (`key()` is
b"") after the last.

Memory is not a disk: nothing here is lost or damaged. testing/memindex.py builds on
this a twin that a simulated power loss rolls back, for tests and the partition
simulator.

Not thread-safe beyond what the index needs: one writer thread, readers on snapshots.
"""

from __future__ import annotations

import bisect
import threading

import lmdb


class Table:
    """One named database: sorted keys and their values."""

    __slots__ = ("keys", "values")

    def __init__(self, keys=(), values=None) -> None:
        self.keys: list[bytes] = list(keys)
        self.values: dict[bytes, bytes] = dict(values or {})

    def copy(self) -> "Table":
        return Table(self.keys, self.values)

    def put(self, key: bytes, value: bytes) -> None:
        if key not in self.values:
            bisect.insort(self.keys, key)
        self.values[key] = value

    def delete(self, key: bytes) -> bool:
        if key not in self.values:
            return False
        del self.values[key]
        del self.keys[bisect.bisect_left(self.keys, key)]
        return True


class _Cursor:
    """py-lmdb's Cursor over one table of a transaction."""

    def __init__(self, txn: "_Txn", name: bytes) -> None:
        self._txn, self._name = txn, name
        self._at: bytes | None = None  # the current key; None: unpositioned

    @property
    def _table(self) -> Table:
        return self._txn._table(self._name, write=False)

    def _go(self, index: int) -> bool:
        keys = self._table.keys
        self._at = keys[index] if 0 <= index < len(keys) else None
        return self._at is not None

    def key(self) -> bytes:
        return b"" if self._at is None else self._at

    def value(self) -> bytes:
        return b"" if self._at is None else self._table.values[self._at]

    def item(self) -> tuple[bytes, bytes]:
        return self.key(), self.value()

    def first(self) -> bool:
        return self._go(0)

    def last(self) -> bool:
        return self._go(len(self._table.keys) - 1)

    def set_range(self, key: bytes) -> bool:
        return self._go(bisect.bisect_left(self._table.keys, bytes(key)))

    def next(self) -> bool:
        if self._at is None:
            return self.first()
        return self._go(bisect.bisect_right(self._table.keys, self._at))

    def prev(self) -> bool:
        if self._at is None:
            return self.last()
        return self._go(bisect.bisect_left(self._table.keys, self._at) - 1)

    def delete(self) -> bool:
        if self._at is None:
            return False
        table = self._txn._table(self._name, write=True)
        at = bisect.bisect_left(table.keys, self._at)
        table.delete(self._at)
        self._go(at)
        return True

    def putmulti(self, items, *, append: bool = False, dupdata: bool = True,
                 overwrite: bool = True) -> tuple[int, int]:
        table = self._txn._table(self._name, write=True)
        consumed = added = 0
        for key, value in items:
            consumed += 1
            key, value = bytes(key), bytes(value)
            if append and table.keys and key <= table.keys[-1]:
                continue  # MDB_APPEND refuses it with MDB_KEYEXIST: not added
            if not overwrite and key in table.values:
                continue
            table.put(key, value)
            self._at = key
            added += 1
        return consumed, added

    def __iter__(self):
        if self._at is None and not self.first():
            return
        while True:
            yield self.item()
            if not self.next():
                return


class _Txn:
    """A transaction: a read one sees the state it began on; a write one works on
    copies of the tables it changes and installs them at commit."""

    def __init__(self, env: "MemoryEnv", write: bool) -> None:
        self._env, self._write = env, write
        self._state = env._store.state
        self._changed: dict[bytes, Table] = {}
        self._done = False

    def _table(self, name: bytes, *, write: bool) -> Table:
        if name in self._changed:
            return self._changed[name]
        table = self._state.get(name)
        if table is None:
            raise lmdb.NotFoundError(f"no database {name!r}")
        if not write:
            return table
        if not self._write:
            raise lmdb.ReadonlyError("write in a read-only transaction")
        self._changed[name] = table = table.copy()
        return table

    def get(self, key, default=None, db=None):
        return self._table(db, write=False).values.get(bytes(key), default)

    def put(self, key, value, db=None, **_) -> bool:
        self._table(db, write=True).put(bytes(key), bytes(value))
        return True

    def delete(self, key, value=b"", db=None) -> bool:
        return self._table(db, write=True).delete(bytes(key))

    def cursor(self, db=None) -> _Cursor:
        self._table(db, write=False)  # raises for an unknown database
        return _Cursor(self, db)

    def drop(self, db, delete: bool = True) -> None:
        self._table(db, write=True)
        self._changed[db] = Table()

    def stat(self, db) -> dict:
        return {"entries": len(self._table(db, write=False).keys)}

    def commit(self) -> None:
        if self._done:
            return
        self._done = True
        if self._write and self._changed:
            self._env._store.commit(self._changed)

    def abort(self) -> None:
        self._done = True

    def __enter__(self) -> "_Txn":
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.commit()
        else:
            self.abort()


class IndexState:
    """What one index directory holds: its current state (tables by name)."""

    def __init__(self) -> None:
        self.state: dict[bytes, Table] = {}
        self.lock = threading.Lock()

    def commit(self, changed: dict[bytes, Table]) -> None:
        with self.lock:
            self.state = {**self.state, **changed}

    def sync(self) -> None:
        """Make what is committed durable: in memory, it already is as durable as
        it gets."""


class MemoryEnv:
    """py-lmdb's Environment, over a `IndexState` of `MemoryIndexStorage`, as the index
    asks a storage for one (index_storage.IndexEnv)."""

    # Nothing damages it but the index's own writes: what it lacks is truly absent.
    verified = True

    def __init__(self, storage: "MemoryIndexStorage", store: IndexState, readonly: bool) -> None:
        self._storage, self._store, self._readonly = storage, store, readonly
        self._closed = False

    def open_db(self, name: bytes, txn=None, create: bool = True, **_) -> bytes:
        with self._store.lock:
            if name not in self._store.state:
                if not create or self._readonly:
                    raise lmdb.NotFoundError(f"no database {name!r}")
                self._store.state = {**self._store.state, name: Table()}
        return name

    def begin(self, write: bool = False, buffers: bool = False, **_) -> _Txn:
        if self._closed:
            raise lmdb.Error("environment closed")
        if write and (self._readonly or self._storage.crashed):
            raise lmdb.ReadonlyError("the index cannot be written now")
        return _Txn(self, write)

    def sync(self, force: bool = False) -> None:
        if not self._readonly and not self._storage.crashed:
            self._store.sync()

    def close(self, *, seal: bool = False) -> None:
        """Close; `seal` (a writer's clean close) syncs first. There is no seal file:
        memory cannot be damaged behind the index's back."""
        if seal:
            self.sync(True)
        self._closed = True


class MemoryIndexStorage:
    """Index directories held in memory (`Index(..., storage=this)`, the interface of
    index_storage.IndexStorage); see the module docstring."""

    store_class = IndexState  # what one directory's tables live in

    def __init__(self) -> None:
        self._stores: dict[str, IndexState] = {}
        self.crashed = False  # (while True, writes are refused: see testing/memindex.py)

    def exists(self, path: str) -> bool:
        return path in self._stores

    def open(self, path: str, *, readonly: bool, map_bytes: int = 0,
             probe_unsealed=None) -> MemoryEnv:
        """The environment of `path` (created when writable). `map_bytes` and
        `probe_unsealed` are LMDB's business: memory has no map size, nor pages a
        crash could leave damaged."""
        store = self._stores.get(path)
        if store is None:
            if readonly:
                raise lmdb.Error(f"no index at {path}")
            store = self._stores[path] = self.store_class()
        return MemoryEnv(self, store, readonly)

    def remove(self, path: str) -> None:
        """Wipe an index (the partition rebuilds a damaged one from the segments)."""
        self._stores.pop(path, None)
