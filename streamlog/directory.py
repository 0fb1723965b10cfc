"""A log directory's own files, and who may write it.

Strategy: a log is a directory with a format marker (`streamlog.json`), and under
`streams/` one directory per stream holding `stream.json` (its partition count) and
one directory per partition (layout.py). The marker and each `stream.json` are written
whole and atomically (fileio.write_file_atomic); a stream is created under a lock file
so that writers in two processes creating it at once agree. Several processes may write
one log (locks.py's writer registry); within one process a second writable open of the
same directory is refused (LMDB allows one environment per file per process): the
process's writers are kept here by the directory's identity (device, inode). Every
durable byte goes through the FileIO port.
"""

from __future__ import annotations

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


def partition_count(fileio, path: str, name: str) -> int:
    """The partition count a stream's `stream.json` records."""
    meta_path = os.path.join(layout.stream_dir(path, name), STREAM_META_NAME)
    try:
        count = int(json.loads(read_file(fileio, meta_path))["partitions"])
    except (ValueError, KeyError, TypeError):
        raise StreamLogError(f"{meta_path} is damaged") from None
    return count


def create_stream(fileio, path: str, name: str, partitions: int, opened) -> None:
    """Create stream `name` unless a writer in another process has: `opened()` says
    whether the stream is known (it opens one found new); called under the lock."""
    directory = layout.stream_dir(path, name)
    fileio.makedirs(directory)
    guard = fileio.open(os.path.join(layout.streams_dir(path), ".lock"), writable=True,
                        create=True)
    try:
        fileio.lock(guard, exclusive=True)
        if not opened():
            write_stream_meta(fileio, path, name, partitions)
            fileio.fsync_dir(layout.streams_dir(path))
    finally:
        fileio.close(guard)


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
