"""A log directory's own files, and who may write it.

Strategy: a log is a directory with a format marker (`streamlog.json`), and under
`streams/` one directory per stream holding `stream.json` (its partition count) and
one directory per partition (layout.py). The marker and each `stream.json` are written
whole and atomically (fileio.write_file_atomic). A stream is created, deleted or given
more partitions holding `streams/.lock` exclusively (`streams_guard`), and a writer
opens a stream holding it shared, so writers in several processes agree on which
streams there are and none makes a folder for a stream another is deleting.

A stream is deleted in one step: its folder is renamed to a deletion name in
`streams/` (`.deleted.<unique>.<folder>`: it starts with "." and is not "%"-escaped,
so no stream's folder has it) and `streams/` is fsynced; then the folder is removed
file by file (`remove_tree`). A crash before the fsync leaves the stream whole, after
it leaves a deletion folder that is no stream, which the next writable open removes
(`remove_leftovers`) with any folder without `stream.json` (what a crash left of a
creation, or what a writer in another process made for a stream being deleted).

Several processes may write one log (locks.py's writer registry); within one process
a second writable open of the same directory is refused (LMDB allows one environment
per file per process): the process's writers are kept here by the directory's identity
(device, inode). Every durable byte goes through the FileIO port.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import weakref

from . import layout
from .errors import LogLocked, LogNotFound, StreamLogError
from .fileio import OsFileIO, read_file, write_file_atomic
from .locks import WriterRegistry, exclusive_writer

FORMAT = {"format": "streamlog", "version": 1}
MARKER_NAME = "streamlog.json"
STREAM_META_NAME = "stream.json"
GUARD_NAME = ".lock"  # in streams/: held while streams are created, deleted, resized
DELETED_PREFIX = ".deleted."  # a stream folder being removed: .deleted.<unique>.<folder>
TREE_DEPTH_MAX = 8  # directories below a stream's folder (partition/index/...: 2)


def prepare(fileio, path: str, *, readonly: bool, create: bool) -> bool:
    """Check (or, writable, make) the log directory at `path`. Returns True when the
    caller must join the log's writers before going on (a writable open); the marker of
    a new log is written only once it has (`write_marker`)."""
    marker = os.path.join(path, MARKER_NAME)
    if not fileio.exists(path):
        if readonly or not create:
            raise LogNotFound(f"no log at {path}")
        fileio.makedirs(path)
    if not fileio.exists(marker):
        if readonly:
            raise StreamLogError(f"{path} is not a streamlog log (no {MARKER_NAME})")
        if any(name not in ("LOCK", MARKER_NAME + ".tmp") for name in fileio.listdir(path)):
            raise StreamLogError(f"{path} is not empty and not a streamlog log; refusing "
                                 f"to write into it")
        return True
    try:
        found = json.loads(read_file(fileio, marker))
    except ValueError:
        raise StreamLogError(f"{marker} is damaged") from None
    if not isinstance(found, dict) or found.get("format") != "streamlog" or (
            found.get("version") != 1):
        raise StreamLogError(f"{path}: unsupported log format {found}")
    return not readonly


def write_marker(fileio, path: str) -> None:
    """Make `path` a log (once its writer lock is held)."""
    marker = os.path.join(path, MARKER_NAME)
    if not fileio.exists(marker):
        write_file_atomic(fileio, marker, json.dumps(FORMAT).encode())


def stream_names(fileio, path: str) -> list[str]:
    directory = layout.streams_dir(path)
    if not fileio.exists(directory):
        return []
    names = filter(None, map(layout.stream_of_folder, fileio.listdir(directory)))
    return sorted(n for n in names if stream_exists(fileio, path, n))


def stream_exists(fileio, path: str, name: str) -> bool:
    return layout.valid_stream_name(name) and fileio.exists(
        os.path.join(layout.stream_dir(path, name), STREAM_META_NAME))


def partition_count(fileio, path: str, name: str) -> int | None:
    """The partition count a stream's `stream.json` records; None when the stream is
    gone (deleted since it was listed)."""
    meta_path = os.path.join(layout.stream_dir(path, name), STREAM_META_NAME)
    try:
        count = int(json.loads(read_file(fileio, meta_path))["partitions"])
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        raise StreamLogError(f"{meta_path} is damaged") from None
    return count


# Guards this thread holds, by log directory: a holder may call code that asks for the
# guard again (creating a stream opens it), which must not wait for itself.
_GUARDS_HELD = threading.local()


@contextlib.contextmanager
def streams_guard(fileio, path: str, *, exclusive: bool = True):
    """Hold `streams/.lock`: exclusively to create, delete or resize a stream, shared
    to open one (see the module docstring). Re-entrant in a thread (a shared request
    inside an exclusive hold is satisfied by it)."""
    held = _GUARDS_HELD.__dict__.setdefault("paths", {})
    key = os.path.abspath(path)
    if key in held:
        assert held[key] or not exclusive, "an exclusive hold inside a shared one"
        yield
        return
    fileio.makedirs(layout.streams_dir(path))
    guard = fileio.open(os.path.join(layout.streams_dir(path), GUARD_NAME), writable=True,
                        create=True)
    try:
        fileio.lock(guard, exclusive=exclusive)
        held[key] = exclusive
        try:
            yield
        finally:
            del held[key]
    finally:
        fileio.close(guard)


def create_stream(fileio, path: str, name: str, partitions: int, opened) -> None:
    """Create stream `name` unless a writer in another process has: `opened()` says
    whether the stream is known (it opens one found new); called under the guard. What
    is in the stream's folder without a `stream.json` is no stream's: it goes first, so
    a new stream never starts with another's files."""
    fileio.makedirs(layout.stream_dir(path, name))
    with streams_guard(fileio, path):
        if not opened():
            directory = layout.stream_dir(path, name)
            if fileio.exists(directory) and fileio.listdir(directory):
                remove_tree(fileio, set_aside(fileio, path, layout.stream_folder(name)))
            write_stream_meta(fileio, path, name, partitions)
            fileio.fsync_dir(layout.streams_dir(path))


def set_aside(fileio, path: str, folder: str, renamed=None) -> str:
    """Rename the folder `folder` of `streams/` to a deletion name, durably (the
    directory fsynced): from then on it is no stream's. `renamed()` is called once the
    rename is made, before the fsync (what was in the folder is gone for every
    process, though a crash may still undo it). Returns its new path."""
    streams = layout.streams_dir(path)
    doomed = os.path.join(streams, f"{DELETED_PREFIX}{os.urandom(8).hex()}.{folder}")
    fileio.rename(os.path.join(streams, folder), doomed)
    if renamed is not None:
        renamed()
    fileio.fsync_dir(streams)
    return doomed


def remove_tree(fileio, directory: str) -> None:
    """Remove `directory` and everything under it (a deletion folder): each
    directory's files, then the directory (fsynced before its rmdir, so a crash never
    finds a file whose directory is gone). What is already gone is fine: two
    processes may be removing the same leftovers."""
    pending = [(directory, 0)]
    order = []
    while pending:
        current, depth = pending.pop()
        order.append(current)
        try:
            names = fileio.listdir(current)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for name in names:
            child = os.path.join(current, name)
            if _is_directory(fileio, child):
                if depth + 1 > TREE_DEPTH_MAX:
                    raise StreamLogError(f"{child}: deeper than a stream's folders go; "
                                         f"not removed")
                pending.append((child, depth + 1))
                continue
            try:
                fileio.unlink(child)
            except FileNotFoundError:
                pass
    for current in reversed(order):  # the deepest first
        try:
            fileio.fsync_dir(current)
            fileio.rmdir(current)
        except FileNotFoundError:
            pass


def _is_directory(fileio, path: str) -> bool:
    try:
        fileio.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def remove_leftovers(fileio, path: str) -> None:
    """A writable open: remove the deletion folders a crash (or another process's
    delete under way) left in `streams/`, and stream folders without `stream.json`
    (see the module docstring), holding the guard so no stream is being created."""
    streams = layout.streams_dir(path)
    if not fileio.exists(streams):
        return
    with streams_guard(fileio, path):
        for folder in fileio.listdir(streams):
            name = layout.stream_of_folder(folder)
            if folder.startswith(DELETED_PREFIX):
                remove_tree(fileio, os.path.join(streams, folder))
            elif name is not None and not stream_exists(fileio, path, name):
                remove_tree(fileio, set_aside(fileio, path, folder))


def write_stream_meta(fileio, path: str, name: str, partitions: int) -> None:
    """Record that stream `name` has `partitions` partitions (its `stream.json`,
    written atomically; its directory is made if missing)."""
    directory = layout.stream_dir(path, name)
    fileio.makedirs(directory)
    write_file_atomic(fileio, os.path.join(directory, STREAM_META_NAME),
                      json.dumps({"partitions": partitions}).encode())


# -- one writable open per directory in this process ---------------------------------

# (device, inode) -> the Log this process has open for writing there
_OPEN_HERE: "weakref.WeakValueDictionary[tuple[int, int], object]" = (
    weakref.WeakValueDictionary())
_OPEN_HERE_LOCK = threading.Lock()


class ProcessWriter:
    """This process's writable open of a log: its place among the process's writers,
    and its membership of the log's writer registry (locks.py)."""

    def __init__(self, fileio, path: str, log) -> None:
        self.key = fileio.identity(path)
        with _OPEN_HERE_LOCK:
            other = _OPEN_HERE.get(self.key)
            if other is not None and not other.closed:
                raise LogLocked(f"{path} is already open for writing in this process: "
                                f"share that Log object")
            _OPEN_HERE[self.key] = log
        self._log = weakref.ref(log)
        self.registry = WriterRegistry(fileio, path)
        # An abandoned Log (its open failed half-way) lets go when it is collected.
        self._finalizer = weakref.finalize(log, close_quietly, self.registry)

    def release(self) -> None:
        close_quietly(self.registry)
        with _OPEN_HERE_LOCK:
            if _OPEN_HERE.get(self.key) is self._log():
                del _OPEN_HERE[self.key]


def writer_in_this_process(path):
    """The Log this process has open for writing at directory `path`, if any (a second
    writable open in the same process is refused: share this one)."""
    try:
        key = OsFileIO().identity(os.fspath(path))
    except (OSError, TypeError, ValueError):
        return None  # no such directory (or a daemon URL)
    with _OPEN_HERE_LOCK:
        found = _OPEN_HERE.get(key)
    return found if found is not None and not found.closed else None


def close_quietly(registry: WriterRegistry) -> None:
    try:
        registry.close()
    except OSError:
        pass  # the file system is gone (a simulated power loss): nothing is held


class _Exclusive:
    def __init__(self, fileio, handle: int) -> None:
        self.fileio, self.handle = fileio, handle

    def close(self) -> None:
        self.fileio.close(self.handle)


def take_writer_lock(path: str):
    """Be the log's only writer (`streamlog repair`): LOG/LOCK held exclusively.
    Returns an object whose close() lets go. Raises LogLocked when a writer has the
    log open."""
    fileio = OsFileIO()
    return _Exclusive(fileio, exclusive_writer(fileio, path))


def writer_alive(path: str) -> bool:
    """Does a process hold the log's writer lock now? Read from /proc/locks without
    touching the lock (taking it, even for a moment, could turn a writer away). Where
    that cannot be read, the answer is yes (the cautious one for its callers)."""
    try:
        inode = os.stat(os.path.join(path, "LOCK")).st_ino
    except OSError:
        return False  # no LOCK file: no writer has ever opened the log
    try:
        with open("/proc/locks", "rb") as handle:
            table = handle.read().decode("ascii", "replace")
    except OSError:
        return True
    for line in table.splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5].rsplit(":", 1)[-1] == str(
                inode):
            return True
    return False
