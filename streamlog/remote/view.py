"""Reading a log straight from the store, from any machine, with no local state.

Strategy (DESIGN 11, readers anywhere): `open_view` opens the same read-only Log a
local view is (log.py), over the store's file layer (storefs.py: the latest manifest
generation as a directory, segment objects read by ranges through a bounded cache).
So reads by offset and by time, Arrow, read_committed and following behave exactly as
on a local view. Two things are the store's own:

* The indexes (`StoreIndexStorage`) are built in memory from the index objects beside
  the segments (their entries and transaction events), never by reading every segment;
  the recovery point is the end of the last segment object, so opening reads one frame
  per partition (recovery checks the frame before the point). An index object that is
  missing or damaged makes that partition's index be rebuilt from its segments, as a
  damaged local index is (DESIGN 4), with the key named in the log.
* Scans read ahead (storefs.RangeCache): while a reader decodes, the next blocks of
  its segment object, and of the partition's next one, are already being fetched by
  a few background threads, which the view's close ends.
* Following (`ManifestPoller`): a thread looks for a newer generation every
  `remote_poll_ms` (one GET of the next generation's key) and pins it; the partitions
  it changed see their commit lock's counter move, and their followers refresh.
  `Log.refresh()` looks at once.
"""

from __future__ import annotations

import logging
import os
import threading

from ..errors import CorruptIndex, CorruptObject, LogNotFound, StoreError
from ..index import Index
from ..memindex import MemoryIndexStorage
from . import manifest as manifests
from .segment_object import fill_index
from .rangecache import RangeCache
from .storefs import StoreFileIO

log = logging.getLogger("streamlog.remote")

INDEX_NAME = "index"


class StoreIndexStorage:
    """The partitions' indexes (index_storage.IndexStorage), built in memory from the
    index objects of the generation `fs` has pinned when a partition opens them."""

    def __init__(self, fs: StoreFileIO) -> None:
        self.fs = fs
        self._memory = MemoryIndexStorage()
        self._built: dict[str, tuple] = {}  # index path -> the segment keys it holds
        self._lock = threading.Lock()

    def _segments(self, path: str):
        directory, name = os.path.split(path)
        partition = self.fs._tree.partitions.get(directory) if name == INDEX_NAME else None
        if partition is None:
            return None
        part = self.fs.manifest.partitions.get(partition)
        return part.segments if part is not None else ()

    def exists(self, path: str) -> bool:
        return bool(self._segments(path))

    def open(self, path: str, *, readonly: bool, map_bytes: int = 0, probe_unsealed=None):
        assert readonly, "a log in the store is read here, never written"
        with self._lock:
            segments = self._segments(path)
            if not segments:
                raise CorruptIndex(f"no index at {path}")
            keys = tuple(segment.key for segment in segments)
            if self._built.get(path) != keys:
                self._build(path, segments)
                self._built[path] = keys
            return self._memory.open(path, readonly=True)

    def remove(self, path: str) -> None:
        with self._lock:
            self._memory.remove(path)
            self._built.pop(path, None)

    def _build(self, path: str, segments) -> None:
        self._memory.remove(path)
        index = Index(path, readonly=False, map_bytes=0, storage=self._memory)
        try:
            fill_index(self.fs.store, index, segments)
        except BaseException:
            index.close()
            self._memory.remove(path)
            raise
        index.close()


class ManifestPoller:
    """Pins the newest generation every `interval_s` (see the module docstring). A
    store that fails is logged once per kind and tried again next time; the view goes
    on showing the generation it has."""

    def __init__(self, fs: StoreFileIO, interval_s: float) -> None:
        self.fs = fs
        self.interval_s = interval_s
        self.error: BaseException | None = None
        self.polls = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "ManifestPoller":
        self._thread = threading.Thread(target=self._run, name="streamlog-manifest-poll",
                                        daemon=True)
        self._thread.start()
        return self

    def poll(self) -> list[str]:
        """Pin the newest generation now; returns the partitions it changed. Raises
        StoreError, CorruptObject (a damaged manifest)."""
        self.polls += 1
        return self.fs.pin(manifests.newer(self.fs.store, self.fs.manifest))

    def _run(self) -> None:
        reported = None
        while not self._stop.wait(self.interval_s):
            try:
                self.poll()
                self.error, reported = None, None
            except (StoreError, CorruptObject, OSError) as error:
                self.error = error
                if type(error) is not reported:
                    log.warning("following %s: %s (trying again every %.1f s)",
                                self.fs.root, error, self.interval_s)
                    reported = type(error)

    def close(self) -> None:
        """Stop polling, and end the block cache's fetcher threads (the view is
        closing: Log.close)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self.fs.cache.close()


def open_view(store, config, *, clock):
    """A read-only Log of the log in `store` (the newest generation, followed by
    polling). Raises LogNotFound when the store holds no log, StoreError when it
    cannot be reached."""
    from ..log import Log  # (the log's code imports nothing of the store's)
    newest = manifests.latest(store)
    root = store.url.rstrip("/")
    if newest is None:
        raise LogNotFound(f"no log at {root}: the store has no manifest there")
    fs = StoreFileIO(store, root, newest,
                     cache=RangeCache(store, capacity_bytes=config.remote_cache_bytes))
    view = Log(root, config, readonly=True, create=False, fileio=fs,
               index_storage=StoreIndexStorage(fs), clock=clock)
    view.remote_view = ManifestPoller(fs, config.remote_poll_ms / 1000)
    if config.remote_poll_ms > 0:  # (0: held at this generation until refresh())
        view.remote_view.start()
    return view
