"""Who may write when: the log's writer registry and each partition's commit lock.

Several processes may append to one local log (DESIGN 9). Two flocks arrange it, both
through the file layer (fileio.py), both released by the kernel when a process dies:

* `LOG/LOCK`, the registry: every writable open holds it shared for its life. An open
  that gets it exclusively (without waiting) is the only writer: it alone may take an
  open transaction for the orphan of a crashed writer and abort it. A close that gets it
  exclusively after letting go is the last writer, and seals the indexes (index.py).
  `streamlog repair` needs it exclusively. A read-only view never takes it; it asks
  /proc/locks whether a writer is alive (log.writer_alive).
* `PARTITION/writer.lock`, the commit lock: held exclusively while a commit writes,
  fsyncs and indexes, and while recovery, truncate or retention change the files. A
  read-only view holds it shared while it refreshes, so it never takes in a frame whose
  commit has not finished (with fsync=always: one that is not yet durable).

The commit lock's file holds a change counter (8 bytes, little-endian, read and written
through a shared mapping; not durable and not needed to be: every open recovers from
the segments). A holder about to change the
partition's files bumps it first, so a writer that finds a counter other than the one
it left knows another process has been there (even one killed half-way) and catches up
before it writes (partition.py).
"""

from __future__ import annotations

import mmap
import os
import struct

from .errors import LogLocked

_COUNTER = struct.Struct("<Q")
PARTITION_LOCK_NAME = "writer.lock"
REGISTRY_NAME = "LOCK"


class PartitionLock:
    """The commit lock of one partition and its change counter (a shared mapping of
    the lock file's first 8 bytes: reading and bumping it costs no system call)."""

    def __init__(self, fileio, directory: str, *, writable: bool) -> None:
        self.fileio = fileio
        self.path = os.path.join(directory, PARTITION_LOCK_NAME)
        self.writable = writable
        self.handle: int | None = None
        self._map: mmap.mmap | None = None
        if writable:
            self.handle = fileio.open(self.path, writable=True, create=True)
        elif fileio.exists(self.path):
            self.handle = fileio.open(self.path, writable=False)
        self.seen: int | None = None  # the counter as this process last left it
        self.held = False

    def acquire(self, *, exclusive: bool = True) -> bool:
        """Wait for the lock. Returns True when another process changed the partition
        since this one last held it (or this one never held it)."""
        if self.handle is None:
            return True  # a read-only view of a log no writer has opened since
        self.fileio.lock(self.handle, exclusive=exclusive)
        self.held = True
        return self._counter() != self.seen

    def bump(self) -> None:
        """Say (before changing any file) that the partition changes."""
        assert self.held and self.writable
        if self._map is None and self.fileio.size(self.handle) < _COUNTER.size:
            self.fileio.truncate(self.handle, _COUNTER.size)  # a new file
        self.seen = (self._counter() + 1) & 0xFFFF_FFFF_FFFF_FFFF
        _COUNTER.pack_into(self._map, 0, self.seen)

    def settle(self) -> None:
        """This process has taken in everything up to now (a view after refreshing)."""
        if self.handle is not None:
            self.seen = self._counter()

    def release(self) -> None:
        if self.held and self.handle is not None:
            self.held = False
            self.fileio.unlock(self.handle)

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        if self.handle is not None:
            self.fileio.close(self.handle)  # also lets go of the lock
            self.handle, self.held = None, False

    def _counter(self) -> int:
        if self._map is None:
            if self.fileio.size(self.handle) < _COUNTER.size:
                return 0  # no writer has bumped it yet
            self._map = mmap.mmap(self.handle, _COUNTER.size, access=mmap.ACCESS_WRITE
                                  if self.writable else mmap.ACCESS_READ)
        return _COUNTER.unpack_from(self._map, 0)[0]


class WriterRegistry:
    """This process's membership of the log's writers (`LOG/LOCK`)."""

    def __init__(self, fileio, path: str) -> None:
        self.fileio = fileio
        self.path = os.path.join(path, REGISTRY_NAME)
        self.handle: int | None = fileio.open(self.path, writable=True, create=True)
        self.alone = self.fileio.lock(self.handle, exclusive=True, blocking=False)
        if not self.alone:
            self.fileio.lock(self.handle, exclusive=False)

    def settle(self) -> None:
        """After the open: let other writers in (shared from now on)."""
        if self.alone and self.handle is not None:
            self.fileio.lock(self.handle, exclusive=False)

    def leave(self) -> bool:
        """Let go; returns True when this was the last writer. Then the registry is
        held exclusively until `close`, so no writer opens while the indexes are
        sealed."""
        if self.handle is None:
            return False
        self.fileio.unlock(self.handle)
        return self.fileio.lock(self.handle, exclusive=True, blocking=False)

    def close(self) -> None:
        if self.handle is not None:
            self.fileio.close(self.handle)
            self.handle = None


def exclusive_writer(fileio, path: str) -> int:
    """Hold `LOG/LOCK` exclusively (a repair: no other writer at all). Returns the
    handle; closing it lets go. Raises LogLocked when a writer has the log open."""
    handle = fileio.open(os.path.join(path, REGISTRY_NAME), writable=True, create=True)
    if not fileio.lock(handle, exclusive=True, blocking=False):
        fileio.close(handle)
        raise LogLocked(f"{path} is open for writing by another process")
    return handle
