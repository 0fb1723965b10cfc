"""An in-memory FileIO: the whole protocol of streamlog/fileio.py, with no disk.

Strategy: a file is an *inode* (`_File`: a bytearray and its flock state) that names
point to; a directory is an entry in a set; a handle is an int that points to an inode,
not to a name, so a rename or an unlink leaves open handles reading and writing the
same bytes, as on a POSIX file system. Paths are normalised absolute paths
(`os.path.abspath`), the same keys `FaultFileIO` uses, so it can sit on top
(`FaultFileIO(seed, inner=MemoryFileIO())`) and model power loss without a disk.

What the OS would do, it does:

  * errors: FileNotFoundError (a missing file or parent directory), FileExistsError
    (`makedirs` over a file), IsADirectoryError (a file operation on a directory),
    NotADirectoryError (a directory operation on a file, or a file as a parent),
    OSError(EBADF) for a handle that is not open or a write through a read-only one,
    OSError(EINVAL) for a negative position or size or a truncate through a read-only
    handle, OSError(ENOTEMPTY) for a rename over (or an rmdir of) a directory that is not
    empty;
  * flocks (`lock` / `unlock`) belong to a handle: two handles on one file conflict even
    in one thread, as two processes would. Shared or exclusive; taking the other mode
    first lets go of the one held (Linux: a conversion is not atomic, and a refused
    non-blocking one leaves nothing held); a blocking request waits on a Condition
    until no other handle is in the way; `close` lets go;
  * shared mappings (`map_shared`): a memoryview of the file's one bytearray, so every
    handle of the file (two "processes" in one test) sees every byte at once.

Not modelled: durability (`fsync` and `fsync_dir` only check their argument; every
write is there at once: losing unsynced writes is FaultFileIO's business), permissions,
links, and time. Limits, said plainly: a directory cannot be opened (OsFileIO can open
one read-only; nothing here needs to), and a file cannot change size while it is mapped
(a bytearray with a live view cannot be resized): a write or truncate that would is
refused with OSError(EBUSY). Shared files are grown once, by `open_shared`, and never
written otherwise, so this does not arise in the log.

Thread-safety: one lock serialises every call; blocking `lock` calls wait on a
Condition of it. Handles are never reused, so a stale one fails with EBADF instead of
reaching another file.
"""

from __future__ import annotations

import errno
import os
import threading

ROOT = os.path.abspath(os.sep)


class _File:
    """One file (an inode): its bytes, who holds its flock, and its live mappings."""

    __slots__ = ("data", "exclusive", "shared", "mappings")

    def __init__(self) -> None:
        self.data = bytearray()
        self.exclusive: int | None = None  # the handle holding it exclusively
        self.shared: set[int] = set()  # the handles holding it shared
        self.mappings = 0  # live views of `data`: while any, its size cannot change

    def holds(self, handle: int) -> bool:
        return self.exclusive == handle or handle in self.shared

    def in_the_way(self, handle: int, *, exclusive: bool) -> bool:
        """Would another handle's lock refuse `handle` this mode now?"""
        if self.exclusive is not None and self.exclusive != handle:
            return True
        return exclusive and bool(self.shared - {handle})

    def let_go(self, handle: int) -> bool:
        """Drop `handle`'s lock; True when it held one."""
        held = self.holds(handle)
        if self.exclusive == handle:
            self.exclusive = None
        self.shared.discard(handle)
        return held


class _Handle:
    __slots__ = ("file", "path", "writable", "views")

    def __init__(self, file: _File, path: str, writable: bool) -> None:
        self.file, self.path, self.writable = file, path, writable
        self.views: list[memoryview] = []  # map_shared's, released by close


class MemoryFileIO:
    """The FileIO protocol over memory; see the module docstring. Starts with only the
    root directory: `makedirs` the directories a test uses."""

    def __init__(self) -> None:
        self._files: dict[str, _File] = {}
        self._dirs: set[str] = {ROOT}
        self._handles: dict[int, _Handle] = {}
        self._next_handle = 3  # (0-2 look like stdio: never handed out)
        self._lock = threading.RLock()
        self._lock_released = threading.Condition(self._lock)

    def __repr__(self) -> str:
        return (f"MemoryFileIO(files={len(self._files)}, dirs={len(self._dirs)}, "
                f"open_handles={len(self._handles)})")

    # -- files through handles ------------------------------------------------------

    def open(self, path: str, *, writable: bool, create: bool = False) -> int:
        with self._lock:
            path = _normal(path)
            file = self._files.get(path)
            if file is None:
                self._check_parent(path)
                if path in self._dirs:
                    raise _error(errno.EISDIR, path)
                if not create:
                    raise _error(errno.ENOENT, path)
                file = self._files[path] = _File()
            return self._new_handle(file, path, writable)

    def close(self, handle: int) -> None:
        with self._lock:
            opened = self._handle(handle)
            del self._handles[handle]
            for view in opened.views:
                view.release()
            opened.file.mappings -= len(opened.views)
            if opened.file.let_go(handle):
                self._lock_released.notify_all()

    def size(self, handle: int) -> int:
        with self._lock:
            return len(self._handle(handle).file.data)

    def pread(self, handle: int, size: int, position: int) -> bytes:
        with self._lock:
            data = self._handle(handle).file.data
            if size < 0 or position < 0:
                raise _error(errno.EINVAL, self.path_of(handle))
            return bytes(data[position:position + size])

    def pwritev(self, handle: int, buffers: list, position: int) -> None:  # (joined)
        self.pwrite(handle, b"".join(buffers), position)

    def pwrite(self, handle: int, data, position: int) -> None:
        with self._lock:
            opened = self._handle(handle)
            if not opened.writable:
                raise OSError(errno.EBADF, f"handle {handle} is not open for writing")
            if position < 0:
                raise _error(errno.EINVAL, opened.path)
            data = bytes(data)
            end = position + len(data)
            if end > len(opened.file.data):
                self._resize(opened, end)
            opened.file.data[position:end] = data

    def fsync(self, handle: int) -> None:
        """Checks the handle; every write is already "durable" here."""
        with self._lock:
            self._handle(handle)

    def truncate(self, handle: int, size: int) -> None:
        with self._lock:
            opened = self._handle(handle)
            if not opened.writable or size < 0:
                raise _error(errno.EINVAL, opened.path)
            self._resize(opened, size)

    def path_of(self, handle: int) -> str:
        """The path `handle` was opened with (a later rename does not change it)."""
        with self._lock:
            return self._handle(handle).path

    # -- names -----------------------------------------------------------------------

    def listdir(self, path: str) -> list[str]:
        with self._lock:
            path = self._directory(path)
            return sorted(os.path.basename(name) for name in (*self._files, *self._dirs)
                          if name != path and os.path.dirname(name) == path)

    def exists(self, path: str) -> bool:
        with self._lock:
            path = _normal(path)
            return path in self._files or path in self._dirs

    def identity(self, path: str) -> tuple:
        """(this file system, the file's inode or the directory's path)."""
        with self._lock:
            normal = _normal(path)
            if normal in self._files:
                return id(self), id(self._files[normal])
            if normal in self._dirs:
                return id(self), normal
            raise _error(errno.ENOENT, path)

    def makedirs(self, path: str) -> None:
        """`os.makedirs(path, exist_ok=True)`."""
        with self._lock:
            path = _normal(path)
            if path in self._files:
                raise _error(errno.EEXIST, path)
            missing = []
            while path not in self._dirs:
                if path in self._files:
                    raise _error(errno.ENOTDIR, path)
                missing.append(path)
                path = os.path.dirname(path)
            self._dirs.update(missing)

    def rename(self, source: str, target: str) -> None:
        """`os.replace`: a file over a file, or a directory over nothing or an empty
        directory, in one step."""
        with self._lock:
            source, target = _normal(source), _normal(target)
            self._check_parent(source)
            self._check_parent(target)
            if source in self._files:
                if target in self._dirs:
                    raise _error(errno.EISDIR, target)
                self._files[target] = self._files.pop(source)
            elif source in self._dirs:
                self._rename_directory(source, target)
            else:
                raise _error(errno.ENOENT, source)

    def unlink(self, path: str) -> None:
        """Removes the name; open handles keep the file's bytes."""
        with self._lock:
            path = _normal(path)
            self._check_parent(path)
            if path in self._dirs:
                raise _error(errno.EISDIR, path)
            if self._files.pop(path, None) is None:
                raise _error(errno.ENOENT, path)

    def rmdir(self, path: str) -> None:
        """`os.rmdir`: an empty directory only."""
        with self._lock:
            path = self._directory(path)
            if any(os.path.dirname(name) == path for name in (*self._files, *self._dirs)
                   if name != path):
                raise _error(errno.ENOTEMPTY, path)
            self._dirs.discard(path)

    def fsync_dir(self, path: str) -> None:
        """Checks that `path` is a directory; nothing is volatile here."""
        with self._lock:
            self._directory(path)

    # -- flocks and shared mappings ----------------------------------------------------

    def lock(self, handle: int, *, exclusive: bool, blocking: bool = True) -> bool:
        with self._lock:
            file = self._handle(handle).file
            if (file.exclusive == handle) if exclusive else (handle in file.shared):
                return True  # held in this mode already
            if file.let_go(handle):  # a conversion lets go first (as Linux does)
                self._lock_released.notify_all()
            while file.in_the_way(handle, exclusive=exclusive):
                if not blocking:
                    return False
                self._lock_released.wait()
                self._handle(handle)  # closed meanwhile: EBADF, as flock would say
            if exclusive:
                file.exclusive = handle
            else:
                file.shared.add(handle)
            return True

    def unlock(self, handle: int) -> None:
        with self._lock:
            if self._handle(handle).file.let_go(handle):
                self._lock_released.notify_all()

    def open_shared(self, path: str, size: int, *, writable: bool) -> int:
        """See FileIO.open_shared: created and grown to `size` bytes when writable."""
        with self._lock:
            handle = self.open(path, writable=writable, create=writable)
            opened = self._handles[handle]
            if writable and len(opened.file.data) < size:
                self._resize(opened, size)
            return handle

    def map_shared(self, handle: int, size: int) -> memoryview:
        """A view of the file's first `size` bytes, shared by every handle of the file
        (read-only through a read-only handle); released by `close(handle)`."""
        with self._lock:
            opened = self._handle(handle)
            if len(opened.file.data) < size:
                raise ValueError(f"{opened.path} is shorter than the {size} bytes to map")
            with memoryview(opened.file.data) as whole:
                view = whole[:size] if opened.writable else whole[:size].toreadonly()
            opened.views.append(view)
            opened.file.mappings += 1
            return view

    # -- helpers ---------------------------------------------------------------------

    def _new_handle(self, file: _File, path: str, writable: bool) -> int:
        handle = self._next_handle
        self._next_handle += 1
        self._handles[handle] = _Handle(file, path, writable)
        return handle

    def _handle(self, handle: int) -> _Handle:
        opened = self._handles.get(handle)
        if opened is None:
            raise OSError(errno.EBADF, f"handle {handle} is not open")
        return opened

    def _resize(self, opened: _Handle, size: int) -> None:
        data = opened.file.data
        if opened.file.mappings:
            raise OSError(errno.EBUSY, f"{opened.path} is mapped: its size cannot "
                                       f"change in memory")
        if size < len(data):
            del data[size:]
        else:
            data.extend(bytes(size - len(data)))

    def _check_parent(self, path: str) -> None:
        """The directory `path` would be in exists (the OS's errors otherwise)."""
        parent = os.path.dirname(path)
        while parent not in self._dirs:
            if parent in self._files:
                raise _error(errno.ENOTDIR, path)
            if parent == ROOT:
                break
            parent = os.path.dirname(parent)
        if os.path.dirname(path) not in self._dirs:
            raise _error(errno.ENOENT, path)

    def _directory(self, path: str) -> str:
        """`path` normalised, when it is a directory; the OS's error otherwise."""
        path = _normal(path)
        if path in self._files:
            raise _error(errno.ENOTDIR, path)
        if path not in self._dirs:
            raise _error(errno.ENOENT, path)
        return path

    def _rename_directory(self, source: str, target: str) -> None:
        if target in self._files:
            raise _error(errno.ENOTDIR, target)
        if target == source:
            return
        if _under(target, source):
            raise _error(errno.EINVAL, target)
        if target in self._dirs and any(_under(name, target) and name != target
                                        for name in (*self._files, *self._dirs)):
            raise _error(errno.ENOTEMPTY, target)
        moved = {name for name in self._dirs if _under(name, source)}
        self._dirs = (self._dirs - moved - {target}) | {
            target + name[len(source):] for name in moved}
        for name in [name for name in self._files if _under(name, source)]:
            self._files[target + name[len(source):]] = self._files.pop(name)


def _normal(path) -> str:
    return os.path.abspath(os.fspath(path))


def _under(path: str, directory: str) -> bool:
    """Is `path` the directory itself or anything below it?"""
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def _error(code: int, path: str) -> OSError:
    """The OSError subclass the OS raises for `code` (FileNotFoundError for ENOENT)."""
    return OSError(code, os.strerror(code), path)
