"""Who may write when: the log's writer registry and each partition's commit lock.

Several processes may append to one local log (DESIGN 9). Two flocks arrange it, both
through the file layer (fileio.py), both released by the kernel when a process dies:

* `LOG/LOCK`, the registry: every writable open holds it shared for its life. An open
  that gets it exclusively (without waiting) is the only writer: it alone may take an
  open transaction for the orphan of a crashed writer and abort it. A close that gets it
  exclusively after letting go is the last writer, and seals the indexes (index.py).
  `streamlog repair` needs it exclusively. A read-only view never takes it; it asks
  /proc/locks whether a writer is alive (directory.writer_alive).
* `PARTITION/writer.lock`, the commit lock: held exclusively while a commit writes,
  fsyncs and indexes, and while recovery, truncate or retention change the files. A
  read-only view holds it shared while it refreshes, so it never takes in a frame whose
  commit has not finished (with fsync=always: one that is not yet durable).

The commit lock's file holds a change counter and the tail state its last holder left
(read and written through the shared mapping the FileIO gives, `map_shared`: an mmap of
the file, or in memory one buffer every handle of the file shares; not durable and not
needed to be: every open recovers from the segments). A holder about to change the
partition's files bumps the counter first, so a writer that finds a counter other than
the one it left knows another process has been there (even one killed half-way) and
catches up before it writes (catchup.py): from the tail state alone when the last
holder let go cleanly and the segment set is as it knows it, otherwise by reading what
was added. A read-only view's follower reads the counter between waits (`moved`) and
refreshes only when it changed.
"""

from __future__ import annotations

import os
import struct
from typing import NamedTuple

from .errors import LogLocked

_STATE = struct.Struct("<QQqqqqQ")
_U64 = struct.Struct("<Q")
_TAIL = struct.Struct("<Qqqqq")  # the tail state, after the counter
_LAYOUT_AT = _U64.size + _TAIL.size
LAYOUT_AT = _LAYOUT_AT  # where the layout generation is (a store's view bumps it too)
_EMPTY = (0, 1, 0, 0, 0, 0, 0)  # a counter of 0 and no valid tail state
_U64_MAX = 0xFFFF_FFFF_FFFF_FFFF
STATE_BYTES = _STATE.size  # the commit lock file's shared bytes
PARTITION_LOCK_NAME = "writer.lock"
REGISTRY_NAME = "LOCK"


class TailState(NamedTuple):
    """Where the partition ended when its last commit lock holder let go cleanly."""

    end_offset: int
    active_base: int  # base offset of the segment it was appending to
    position: int  # the end of the frames in that segment
    hwm_us: int  # index.NO_HWM when there is no record
    layout: int  # the segment-set generation (see PartitionLock)


class PartitionLock:
    """The commit lock of one partition, its change counter, and the tail state the
    last holder left (a shared mapping of the lock file's first bytes: reading and
    writing them costs no system call).

    Layout (little-endian u64/i64): counter | counter at which the tail state was
    written | end offset | active segment base | position | hwm | layout generation.
    The tail state is valid only when its counter is the current one: a holder killed
    after its bump never wrote one. The layout generation changes when a holder changes
    the segment set (a roll, retention, a truncate, a repair of what a killed holder
    left); a writer whose last known layout is still current, and whose active segment
    is the tail state's, takes the tail state in without reading a file."""

    def __init__(self, fileio, directory: str, *, writable: bool) -> None:
        self.fileio = fileio
        self.path = os.path.join(directory, PARTITION_LOCK_NAME)
        self.writable = writable
        self.handle: int | None = None
        self._map = None  # fileio.map_shared's buffer, once the file is whole
        if writable:
            self.handle = fileio.open_shared(self.path, _STATE.size, writable=True)
        elif fileio.exists(self.path):
            self.handle = fileio.open_shared(self.path, _STATE.size, writable=False)
        # The file this handle has open: a deleted stream's folder is renamed away, and
        # a stream created again under its name has another lock file (`gone`).
        self.identity = fileio.identity(self.path) if self.handle is not None else None
        self.seen: int | None = None  # the counter as this process last left it
        self.held = False

    def acquire(self, *, exclusive: bool = True) -> bool:
        """Wait for the lock. Returns True when another process changed the partition
        since this one last held it (or this one never held it)."""
        if self.handle is None:
            return True  # a read-only view of a log no writer has opened since
        self.fileio.lock(self.handle, exclusive=exclusive)
        self.held = True
        return self._fields()[0] != self.seen

    def tail_state(self) -> TailState | None:
        """The tail state the last holder left, when it let go cleanly."""
        fields = self._fields()
        return TailState(*fields[2:]) if fields[1] == fields[0] != 0 else None

    def bump(self) -> None:
        """Say (before changing any file) that the partition changes."""
        assert self.held and self.writable
        self.seen = (self._fields()[0] + 1) & _U64_MAX
        _U64.pack_into(self._map, 0, self.seen)

    def next_layout(self) -> int:
        """The segment set changes: a new layout generation (returned)."""
        layout = (self.layout() + 1) & _U64_MAX
        _U64.pack_into(self._map, _LAYOUT_AT, layout)
        return layout

    def layout(self) -> int:
        return self._fields()[6]

    def leave_tail(self, end_offset: int, active_base: int, position: int,
                   hwm_us: int) -> None:
        """Before letting go after a change: where the partition ends now."""
        _TAIL.pack_into(self._map, _U64.size, self.seen, end_offset, active_base, position,
                        hwm_us)

    def settle(self) -> None:
        """This process has taken in everything up to now (a view after refreshing)."""
        if self.handle is not None:
            self.seen = self._fields()[0]

    def moved(self) -> bool:
        """Has the counter changed since this process last took the partition in? A
        hint, read without the lock and without a system call, from any thread (a
        follower asks between waits); whoever acts on it looks under the lock. Never a
        false "no" while the lock is open: a holder bumps the counter before it changes
        any file. True when the file is not mapped yet (the look under the lock maps
        it), False once the lock is closed."""
        mapping = self._map
        if mapping is None:
            return self.handle is not None
        try:
            return _U64.unpack_from(mapping, 0)[0] != self.seen
        except ValueError:  # closed by another thread meanwhile
            return False

    def gone(self) -> bool:
        """Is this lock's file no longer the one at its path (its stream was deleted,
        and perhaps created again)? One stat. The handle keeps the old file open, so
        its identity cannot be reused meanwhile. False when no file was open."""
        if self.identity is None:
            return False
        try:
            return self.fileio.identity(self.path) != self.identity
        except FileNotFoundError:
            return True

    def release(self) -> None:
        if self.held and self.handle is not None:
            self.held = False
            self.fileio.unlock(self.handle)

    def close(self) -> None:
        self._map = None
        if self.handle is not None:
            self.fileio.close(self.handle)  # also unmaps, and lets go of the lock
            self.handle, self.held = None, False

    def _fields(self) -> tuple:
        """The mapping's fields (see the class docstring)."""
        if self._map is None:
            if self.fileio.size(self.handle) < _STATE.size:  # a writer is creating it
                return _EMPTY
            self._map = self.fileio.map_shared(self.handle, _STATE.size)
        return _STATE.unpack_from(self._map, 0)


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
