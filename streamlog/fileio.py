"""File I/O behind a protocol, so tests can inject faults or run with no disk at all.

Strategy: segment, recovery and retention code never call `os` directly; they take a
`FileIO`. `OsFileIO` is the real thing. `streamlog.testing.memfs.MemoryFileIO` is its
in-memory twin, and `streamlog.testing.faultfs.FaultFileIO` wraps either one to
simulate torn writes, unsynced data lost in a crash and flipped bits. Handles are plain
integers (file descriptors for OsFileIO). Errors are the OS's: FileNotFoundError,
FileExistsError, IsADirectoryError, NotADirectoryError, OSError(EBADF) for a handle
that is not open, OSError(EIO) from a failing disk.

Two things live beside the durable files: flocks (`lock` / `unlock`, advisory, one per
open handle, released by `close` or by the death of the process) and shared mappings
(`open_shared` + `map_shared`, a few bytes several processes read and write without a
system call: a lock's counters, locks.py). Neither is durable data: a power loss ends
every process that holds them, and nothing that opens trusts what they hold.
"""

from __future__ import annotations

import fcntl
import mmap
import os
from typing import Protocol

# buffers one gathered write takes at most (IOV_MAX)
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


class FileIO(Protocol):
    """What storage code asks of a file system. Paths are strings; a handle is an int
    that stays valid until `close(handle)`."""

    def open(self, path: str, *, writable: bool, create: bool = False) -> int: ...
    def close(self, handle: int) -> None: ...
    def size(self, handle: int) -> int: ...
    def pread(self, handle: int, size: int, position: int) -> bytes: ...
    def pwrite(self, handle: int, data, position: int) -> None: ...
    def pwritev(self, handle: int, buffers: list, position: int) -> None:
        """pwrite of the buffers' concatenation (one gathered write where the system
        has one: the buffers are not joined first)."""
    def fsync(self, handle: int) -> None: ...
    def truncate(self, handle: int, size: int) -> None: ...
    def listdir(self, path: str) -> list[str]: ...
    def exists(self, path: str) -> bool: ...
    def identity(self, path: str) -> tuple: ...
    def makedirs(self, path: str) -> None: ...
    def rename(self, source: str, target: str) -> None: ...
    def unlink(self, path: str) -> None: ...
    def rmdir(self, path: str) -> None: ...
    def fsync_dir(self, path: str) -> None: ...
    def path_of(self, handle: int) -> str: ...

    def lock(self, handle: int, *, exclusive: bool, blocking: bool = True) -> bool:
        """flock semantics: the lock belongs to the handle (two handles on one file
        conflict even in one process); taking the other mode first lets go of the one
        held; returns False when `blocking` is off and another handle is in the way."""

    def unlock(self, handle: int) -> None: ...

    def open_shared(self, path: str, size: int, *, writable: bool) -> int:
        """A handle on a file that processes share through a mapping (created and grown
        to at least `size` bytes when `writable`; never shrunk). Lockable like any
        handle. Raises FileNotFoundError for a read-only open of a missing file."""

    def map_shared(self, handle: int, size: int):
        """A buffer over the first `size` bytes of the file `handle` (from
        `open_shared`) has open, writable when the handle is: every mapping of that
        file, in any process or through any handle, sees the same bytes at once.
        The mapping is the handle's: `close(handle)` ends it, and using the buffer
        after that raises ValueError. Raises ValueError when the file is shorter
        than `size` (a writer is still creating it: map again later)."""


class OsFileIO:
    """The real file system. Writes loop until every byte is written."""

    def __init__(self) -> None:
        self._paths: dict[int, str] = {}
        self._maps: dict[int, list[mmap.mmap]] = {}

    def open(self, path: str, *, writable: bool, create: bool = False) -> int:
        flags = os.O_RDWR if writable else os.O_RDONLY
        if create:
            flags |= os.O_CREAT
        handle = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o644)
        self._paths[handle] = path
        return handle

    def close(self, handle: int) -> None:
        self._paths.pop(handle, None)
        for mapping in self._maps.pop(handle, ()):
            mapping.close()
        os.close(handle)

    def size(self, handle: int) -> int:
        return os.fstat(handle).st_size

    def pread(self, handle: int, size: int, position: int) -> bytes:
        return os.pread(handle, size, position)

    def pwrite(self, handle: int, data, position: int) -> None:
        view = memoryview(data)
        while view:
            written = os.pwrite(handle, view, position)
            view, position = view[written:], position + written

    def pwritev(self, handle: int, buffers: list, position: int) -> None:
        views = [view for view in (memoryview(b).cast("B") for b in buffers) if view.nbytes]
        at = 0
        while at < len(views):  # (a write may stop short, or exceed IOV_MAX buffers)
            written = os.pwritev(handle, views[at:at + _IOV_MAX], position)
            position += written
            while at < len(views) and written >= views[at].nbytes:
                written -= views[at].nbytes
                at += 1
            if written:
                views[at] = views[at][written:]

    def fsync(self, handle: int) -> None:
        os.fdatasync(handle) if hasattr(os, "fdatasync") else os.fsync(handle)

    def truncate(self, handle: int, size: int) -> None:
        os.ftruncate(handle, size)

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(path))

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def identity(self, path: str) -> tuple:
        """What names the file or directory whatever the path that reaches it:
        (device, inode). FileNotFoundError when there is none."""
        found = os.stat(path)
        return found.st_dev, found.st_ino

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def rename(self, source: str, target: str) -> None:
        os.replace(source, target)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def rmdir(self, path: str) -> None:
        """Remove an empty directory (OSError ENOTEMPTY when it is not)."""
        os.rmdir(path)

    def fsync_dir(self, path: str) -> None:
        handle = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(handle)
        finally:
            os.close(handle)

    def path_of(self, handle: int) -> str:
        return self._paths[handle]

    def open_shared(self, path: str, size: int, *, writable: bool) -> int:
        """A file that processes share through a mapping (a lock's counters), grown to
        at least `size` bytes when writable and never shrunk (see FileIO.open_shared).
        Not durable data: no fsync, and a fault model leaves it alone (a power loss
        ends every process that maps it; an open never trusts what it holds)."""
        flags = (os.O_RDWR | os.O_CREAT) if writable else os.O_RDONLY
        handle = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o644)
        current = os.fstat(handle).st_size if writable else size
        if current < size:
            # written, not ftruncated: the block is allocated now, so a full disk fails
            # here and not later, as a SIGBUS on the mapping
            os.pwrite(handle, bytes(size - current), current)
        self._paths[handle] = path
        return handle

    def map_shared(self, handle: int, size: int) -> mmap.mmap:
        """An mmap of the file's first `size` bytes (see FileIO.map_shared)."""
        writable = fcntl.fcntl(handle, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDWR
        mapping = mmap.mmap(handle, size, access=mmap.ACCESS_WRITE if writable
                            else mmap.ACCESS_READ)
        self._maps.setdefault(handle, []).append(mapping)
        return mapping

    def lock(self, handle: int, *, exclusive: bool, blocking: bool = True) -> bool:
        """flock the file (advisory, per open file, released by close or death).
        Returns False when `blocking` is off and another holder is in the way."""
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        try:
            fcntl.flock(handle, mode if blocking else mode | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def unlock(self, handle: int) -> None:
        fcntl.flock(handle, fcntl.LOCK_UN)


def write_file_atomic(fileio: FileIO, path: str, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves the old or the new file whole:
    write a temporary file, fsync it, rename it over, fsync the directory."""
    temporary = path + ".tmp"
    handle = fileio.open(temporary, writable=True, create=True)
    try:
        fileio.truncate(handle, 0)
        fileio.pwrite(handle, data, 0)
        fileio.fsync(handle)
    finally:
        fileio.close(handle)
    fileio.rename(temporary, path)
    fileio.fsync_dir(os.path.dirname(path) or ".")


def read_file(fileio: FileIO, path: str) -> bytes:
    handle = fileio.open(path, writable=False)
    try:
        return fileio.pread(handle, fileio.size(handle), 0)
    finally:
        fileio.close(handle)
