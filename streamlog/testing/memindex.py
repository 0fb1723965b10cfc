"""An in-memory twin of the index's LMDB environment, which a power loss rolls back.

Strategy: the index's environment in memory (streamlog/memindex.py: `Index` runs its
whole logic on `MemoryEnv`s instead of LMDB files) plus the way the real one loses
data, so a test or the partition simulator runs the real index code on storage that
crashes the way the real one does:

  * a write transaction is all or nothing: a crash never shows half of one;
  * LMDB runs without sync (the segments are the truth), so a committed transaction is
    durable only once `sync()` ran after it. A power loss keeps every synced
    transaction and a random prefix of the later ones (all of them or none, by mode);
  * a process crash alone (no power loss) keeps every committed transaction, as the page
    cache does.

Attach it to a `FaultFileIO` (`attach`) and the file system's power loss crashes the
index in the same instant, with the same mode and random choices.

Not thread-safe beyond what the index needs: one writer thread, readers on snapshots.
"""

from __future__ import annotations

import random

from .. import memindex as _core
from ..memindex import IndexState, MemoryEnv, Table

__all__ = ["MemoryEnv", "MemoryIndexStorage"]


class _Store(IndexState):
    """What one index directory holds: its current state, the last synced one, and
    every state committed since (a power loss keeps one of those)."""

    def __init__(self) -> None:
        super().__init__()
        self.synced: dict[bytes, Table] = {}
        self.since_sync: list[dict[bytes, Table]] = []

    def commit(self, changed: dict[bytes, Table]) -> None:
        with self.lock:
            self.state = {**self.state, **changed}
            self.since_sync.append(self.state)

    def sync(self) -> None:
        with self.lock:
            self.synced, self.since_sync = self.state, []

    def lose_power(self, rng: random.Random, keep_all: bool, keep_none: bool) -> int:
        """Roll back to a state the disk may hold; returns how many unsynced
        transactions were kept."""
        with self.lock:
            if keep_all:
                kept = len(self.since_sync)
            elif keep_none:
                kept = 0
            else:
                kept = rng.randint(0, len(self.since_sync))
            self.state = self.since_sync[kept - 1] if kept else self.synced
            self.synced, self.since_sync = self.state, []
            return kept


class MemoryIndexStorage(_core.MemoryIndexStorage):
    """Index directories held in memory (`Index(..., storage=this)`, the interface of
    index_storage.IndexStorage); see the module docstring. `crash` (or the attached
    file system's power loss) rolls every one of them back at once."""

    store_class = _Store

    def __init__(self) -> None:
        super().__init__()
        self.kept_after_crash: list[int] = []  # unsynced transactions kept, per crash

    def crash(self, rng: random.Random, mode: str = "drop_unsynced") -> None:
        """Lose power: each index keeps what it synced and, unless `mode` is
        "drop_unsynced", a random prefix of its later transactions. Later writes are
        refused until `reboot`."""
        self.crashed = True
        for path in sorted(self._stores):
            self.kept_after_crash.append(self._stores[path].lose_power(
                rng, keep_all=False, keep_none=str(getattr(mode, "value", mode))
                == "drop_unsynced"))

    def reboot(self) -> None:
        """The machine is back: opens and writes work again."""
        self.crashed = False

    def attach(self, fileio) -> None:
        """Crash with `fileio` (a FaultFileIO): its power loss is this one's too."""
        self.reboot()
        fileio.crash_hooks.append(self.crash)
