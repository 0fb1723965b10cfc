"""A log in an object store, seen as a read-only directory: the file layer over one
manifest generation.

Strategy (DESIGN 11, readers anywhere): every reader of a local log (recovery, views,
readers by offset and by time, Arrow, read_committed, the CLI) goes through the file
layer (fileio.py). So a log in the store is read by giving that same code a FileIO
whose directory is a manifest generation: `streamlog.json`, each stream's
`stream.json` and each partition's segment files are what the generation names, a
segment file's bytes are its object's, read by ranges through a bounded cache that
fetches ahead of a scan on background threads (rangecache.py). Nothing is written, and
nothing local is needed.

`pin(manifest)` moves the directory to a newer generation: new sealed segments
appear, segments retention dropped disappear, a truncated one is a different object.
Each partition's commit lock file (`writer.lock`, locks.py) is a few bytes in memory
whose change counter `pin` bumps for every partition the new generation changed, so a
view's followers notice it as they notice a writer in another process, and refresh.
A file opened keeps reading the object it was opened on (objects are immutable; a
replaced one is deleted only after the grace period); its size is the object's.

Damage: an object a committed generation names but the store lacks, or that is shorter
than the generation says, is `CorruptObject` (named by key and position); a flipped
bit is found by the frame checksums every reader verifies before it delivers a record.
"""

from __future__ import annotations

import collections
import errno
import itertools
import json
import os
import struct
import threading
from typing import NamedTuple

from ..directory import FORMAT, MARKER_NAME, STREAM_META_NAME
from ..layout import partition_dir, segment_name, stream_dir, streams_dir
from ..locks import LAYOUT_AT, PARTITION_LOCK_NAME, STATE_BYTES
from ..maintenance import NO_HWM, START_MARKS_NAME
from .manifest import Manifest, PartitionManifest, SegmentObject, TailPiece
from .rangecache import RangeCache

_COUNTER = struct.Struct("<Q")  # the first of a commit lock's fields (locks.py)


class _Pieces(NamedTuple):
    """A segment the store holds as tail pieces (durability "remote"): its first
    `size` bytes, piece after piece."""

    pieces: tuple[TailPiece, ...]

    @property
    def size(self) -> int:
        last = self.pieces[-1]
        return last.position + last.size

    def read(self, cache: RangeCache, position: int, size: int) -> bytes:
        end = min(position + size, self.size)
        out = []
        for piece in self.pieces:
            lo, hi = max(position, piece.position), min(end, piece.position + piece.size)
            if lo < hi:
                at = piece.at + lo - piece.position
                out.append(cache.read(piece.key, piece.object_size, at, hi - lo))
        return b"".join(out)


def _grown(old, new) -> bool:
    """Is `new` the same segment file as `old`, with as many bytes or more (a segment
    whose pieces grew, or that went up whole since)?"""
    if not isinstance(old, _Pieces) or not isinstance(new, (_Pieces, SegmentObject)):
        return False
    if isinstance(new, SegmentObject):
        return new.size >= old.size
    return new.pieces[:len(old.pieces)] == old.pieces


class _Tree:
    """The directory a manifest generation makes: {path: bytes or SegmentObject},
    {directory: sorted names}."""

    def __init__(self, root: str, manifest: Manifest) -> None:
        self.root = root
        self.manifest = manifest
        self.files: dict[str, bytes | SegmentObject | None] = {}
        self.dirs: dict[str, set[str]] = collections.defaultdict(set)
        self.partitions: dict[str, str] = {}  # partition directory -> "stream/number"
        self.following: dict[str, SegmentObject] = {}  # segment path -> the next object
        self.dirs[root]
        self._add(os.path.join(root, MARKER_NAME), json.dumps(FORMAT).encode())
        self._add(streams_dir(root), None, directory=True)
        for stream, count in sorted(manifest.streams.items()):
            directory = stream_dir(root, stream)
            self._add(os.path.join(directory, STREAM_META_NAME),
                      json.dumps({"partitions": count}).encode())
            for number in range(count):
                name = f"{stream}/{number}"
                part = manifest.partitions.get(name, PartitionManifest())
                pdir = partition_dir(root, stream, number)
                self.partitions[pdir] = name
                self._add(os.path.join(pdir, PARTITION_LOCK_NAME), None)
                if part.start_offset > 0:  # (inside a segment after delete_records)
                    self._add(os.path.join(pdir, START_MARKS_NAME), json.dumps(
                        {"marks": [[part.start_offset, NO_HWM if part.start_hwm_us is None
                                    else part.start_hwm_us]]}).encode())
                previous = None
                for segment in part.segments:
                    path = os.path.join(pdir, segment_name(segment.base_offset))
                    self._add(path, segment)
                    if previous is not None:
                        self.following[previous] = segment
                    previous = path
                by_segment: dict[int, list[TailPiece]] = {}
                for piece in part.tail:
                    by_segment.setdefault(piece.segment_base, []).append(piece)
                for base, pieces in by_segment.items():
                    self._add(os.path.join(pdir, segment_name(base)), _Pieces(tuple(pieces)))
        self.dirs = {path: sorted(names) for path, names in self.dirs.items()}

    def _add(self, path: str, entry, *, directory: bool = False) -> None:
        if directory:
            self.dirs[path]
        else:
            self.files[path] = entry  # None: a commit lock's bytes (StoreFileIO._counter)
        child = path
        while child != self.root:
            parent, name = os.path.split(child)
            self.dirs[parent].add(name)
            child = parent


def _read_only(path: str) -> OSError:
    return OSError(errno.EROFS, "a log in an object store is read-only here", path)


class StoreFileIO:
    """A read-only FileIO (fileio.FileIO) over the manifest generation pinned last:
    see the module docstring. `root` is the path the log is opened at (its URL).
    `read_on`: a scan nearing the end of a segment object reads ahead into the next
    segment object of its partition (RangeCache's `following`), as a replay goes on
    to it; off for readers that stop at an object's end (Spark's splits)."""

    def __init__(self, store, root: str, manifest: Manifest, *,
                 cache: RangeCache | None = None, read_on: bool = True) -> None:
        self.store = store
        self.read_on = read_on
        self.root = root
        self.cache = cache or RangeCache(store)
        self._tree = _Tree(root, manifest)
        self._handles: dict[int, tuple[str, bytes | SegmentObject | None]] = {}
        self._numbers = itertools.count(1)
        self._counters: dict[str, bytearray] = {}  # writer.lock path -> its bytes
        self._pin_lock = threading.Lock()

    @property
    def manifest(self) -> Manifest:
        return self._tree.manifest

    def pin(self, manifest: Manifest) -> list[str]:
        """Show `manifest`'s generation from now on; returns the partitions it changed
        (their lock counters are bumped, so followers refresh)."""
        with self._pin_lock:
            old = self._tree.manifest
            if manifest.generation <= old.generation:
                return []
            tree = _Tree(self.root, manifest)
            changed = [name for name in sorted(set(old.partitions) | set(manifest.partitions))
                       if old.partitions.get(name) != manifest.partitions.get(name)]
            self._tree = tree
            for pdir, name in tree.partitions.items():
                counter = self._counters.get(os.path.join(pdir, PARTITION_LOCK_NAME))
                if counter is not None and name in changed:
                    _COUNTER.pack_into(counter, 0, _COUNTER.unpack_from(counter, 0)[0] + 1)
                    before, after = old.partitions.get(name), manifest.partitions.get(name)
                    if None in (before, after) or before.start_offset != after.start_offset:
                        # a new layout: the view reads the partition's start again
                        _COUNTER.pack_into(counter, LAYOUT_AT, _COUNTER.unpack_from(
                            counter, LAYOUT_AT)[0] + 1)
            return changed

    def segment_object(self, path: str) -> SegmentObject | None:
        """The object a segment file of the pinned generation is (None: not one)."""
        entry = self._tree.files.get(path)
        return entry if isinstance(entry, SegmentObject) else None

    # -- reading -------------------------------------------------------------------------

    def open(self, path: str, *, writable: bool, create: bool = False) -> int:
        if writable:
            raise _read_only(path)
        entry = self._entry(path)
        handle = next(self._numbers)
        self._handles[handle] = (path, entry)
        return handle

    def _entry(self, path: str):
        tree = self._tree
        if path not in tree.files:
            if path in tree.dirs:
                raise IsADirectoryError(errno.EISDIR, "is a directory", path)
            raise FileNotFoundError(errno.ENOENT, "not in the store's manifest", path)
        return tree.files[path]

    def _handle(self, handle: int):
        try:
            return self._handles[handle]
        except KeyError:
            raise OSError(errno.EBADF, f"handle {handle} is not open") from None

    def close(self, handle: int) -> None:
        self._handles.pop(handle, None)

    def _current(self, handle: int):
        """(path, entry) of a handle, moved to the pinned generation's entry when that
        is the same segment grown (new tail pieces, or the whole object since)."""
        path, entry = self._handle(handle)
        if isinstance(entry, _Pieces):
            now = self._tree.files.get(path)
            if now is not entry and _grown(entry, now):
                self._handles[handle] = (path, now)
                entry = now
        return path, entry

    def size(self, handle: int) -> int:
        path, entry = self._current(handle)
        if isinstance(entry, (SegmentObject, _Pieces)):
            return entry.size
        if entry is None:
            return STATE_BYTES
        return len(entry)

    def pread(self, handle: int, size: int, position: int) -> bytes:
        path, entry = self._current(handle)
        if isinstance(entry, SegmentObject):
            after = self._tree.following.get(path) if self.read_on else None
            return self.cache.read(entry.key, entry.size, position, size, following=(
                None if after is None else (after.key, after.size)))
        if isinstance(entry, _Pieces):
            return entry.read(self.cache, position, size)
        if entry is None:
            return bytes(self._counter(path)[position:position + size])
        return entry[position:position + size]

    def listdir(self, path: str) -> list[str]:
        tree = self._tree
        if path not in tree.dirs:
            if path in tree.files:
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", path)
            raise FileNotFoundError(errno.ENOENT, "not in the store's manifest", path)
        return list(tree.dirs[path])

    def exists(self, path: str) -> bool:
        return path in self._tree.files or path in self._tree.dirs

    def identity(self, path: str) -> tuple:
        entry = self._entry(path) if path not in self._tree.dirs else path
        if isinstance(entry, _Pieces):  # the same file as it grows
            return ("store", path, entry.pieces[0].key)
        return ("store", entry.key if isinstance(entry, SegmentObject) else path)

    def path_of(self, handle: int) -> str:
        return self._handle(handle)[0]

    # -- the commit locks: counters in memory that pin() bumps ----------------------

    def open_shared(self, path: str, size: int, *, writable: bool) -> int:
        if writable:
            raise _read_only(path)
        if self._tree.files.get(path, b"") is not None:
            raise FileNotFoundError(errno.ENOENT, "no such lock in the store's log", path)
        return self.open(path, writable=False)

    def _counter(self, path: str) -> bytearray:
        with self._pin_lock:
            counter = self._counters.get(path)
            if counter is None:  # counter 1, no tail state: a view looks at the files
                counter = self._counters[path] = bytearray(STATE_BYTES)
                _COUNTER.pack_into(counter, 0, 1)
            return counter

    def map_shared(self, handle: int, size: int):
        path, entry = self._handle(handle)
        if entry is not None or size > STATE_BYTES:
            raise ValueError(f"{path} cannot be mapped")
        return memoryview(self._counter(path)).toreadonly()[:size]

    def lock(self, handle: int, *, exclusive: bool, blocking: bool = True) -> bool:
        self._handle(handle)
        return True  # nobody commits here: a generation is whole when it is pinned

    def unlock(self, handle: int) -> None:
        self._handle(handle)

    # -- no writing ----------------------------------------------------------------------

    def pwritev(self, handle: int, buffers: list, position: int) -> None:  # (joined)
        self.pwrite(handle, b"".join(buffers), position)

    def pwrite(self, handle: int, data, position: int) -> None:
        raise _read_only(self.path_of(handle))

    def fsync(self, handle: int) -> None:
        raise _read_only(self.path_of(handle))

    def truncate(self, handle: int, size: int) -> None:
        raise _read_only(self.path_of(handle))

    def makedirs(self, path: str) -> None:
        raise _read_only(path)

    def rename(self, source: str, target: str) -> None:
        raise _read_only(source)

    def unlink(self, path: str) -> None:
        raise _read_only(path)

    def rmdir(self, path: str) -> None:
        raise _read_only(path)

    def fsync_dir(self, path: str) -> None:
        raise _read_only(path)
