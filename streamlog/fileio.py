"""File I/O behind a protocol, so tests can inject faults.

Strategy: segment, recovery and retention code never call `os` directly; they take a
`FileIO`. `OsFileIO` is the real thing. `streamlog.testing.faultfs.FaultFileIO` wraps it
to simulate torn writes, unsynced data lost in a crash and flipped bits. Handles are
plain integers (file descriptors for OsFileIO).
"""

from __future__ import annotations

import fcntl
import os
from typing import Protocol


class FileIO(Protocol):
    def open(self, path: str, *, writable: bool, create: bool = False) -> int: ...
    def close(self, handle: int) -> None: ...
    def size(self, handle: int) -> int: ...
    def pread(self, handle: int, size: int, position: int) -> bytes: ...
    def pwrite(self, handle: int, data, position: int) -> None: ...
    def fsync(self, handle: int) -> None: ...
    def truncate(self, handle: int, size: int) -> None: ...
    def listdir(self, path: str) -> list[str]: ...
    def exists(self, path: str) -> bool: ...
    def makedirs(self, path: str) -> None: ...
    def rename(self, source: str, target: str) -> None: ...
    def unlink(self, path: str) -> None: ...
    def fsync_dir(self, path: str) -> None: ...
    def path_of(self, handle: int) -> str: ...
    def lock(self, handle: int, *, exclusive: bool, blocking: bool = True) -> bool: ...
    def open_shared(self, path: str, size: int, *, writable: bool) -> int: ...
    def unlock(self, handle: int) -> None: ...


class OsFileIO:
    """The real file system. Writes loop until every byte is written."""

    def __init__(self) -> None:
        self._paths: dict[int, str] = {}

    def open(self, path: str, *, writable: bool, create: bool = False) -> int:
        flags = os.O_RDWR if writable else os.O_RDONLY
        if create:
            flags |= os.O_CREAT
        handle = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o644)
        self._paths[handle] = path
        return handle

    def close(self, handle: int) -> None:
        self._paths.pop(handle, None)
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

    def fsync(self, handle: int) -> None:
        os.fdatasync(handle) if hasattr(os, "fdatasync") else os.fsync(handle)

    def truncate(self, handle: int, size: int) -> None:
        os.ftruncate(handle, size)

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(path))

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def rename(self, source: str, target: str) -> None:
        os.replace(source, target)

    def unlink(self, path: str) -> None:
        os.unlink(path)

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
        at least `size` bytes when writable and never shrunk. Not durable data: no
        fsync, and a fault model leaves it alone (a power loss ends every process that
        maps it; an open never trusts what it holds)."""
        flags = (os.O_RDWR | os.O_CREAT) if writable else os.O_RDONLY
        handle = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o644)
        current = os.fstat(handle).st_size if writable else size
        if current < size:
            # written, not ftruncated: the block is allocated now, so a full disk fails
            # here and not later, as a SIGBUS on the mapping
            os.pwrite(handle, bytes(size - current), current)
        self._paths[handle] = path
        return handle

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
