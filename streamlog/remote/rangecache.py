"""The block cache of objects read from the store: ranges of immutable objects, fetched
in blocks, kept up to a bound, fetched ahead of a scan on a few threads (RangeCache's
docstring says how). Readers anywhere (storefs.py) read every segment object and tail
piece through it."""

from __future__ import annotations

import collections
import logging
import threading

from ..errors import CorruptObject, ObjectNotFound

log = logging.getLogger("streamlog.remote")


class RangeCache:
    """Byte ranges of immutable objects, fetched in blocks of `block_bytes` and kept up
    to `capacity_bytes` (least recently used out first). Thread-safe.

    Strategy: a read takes the blocks it spans from the cache; the ones it lacks it
    fetches itself, each contiguous run with one ranged GET (the manifest gives the
    object's size, so no range goes past the end and no HEAD is needed). A scan is a
    read that continues the previous one of the same object (the same block or the
    next), or one of a block or more from an object's start: ahead of it the cache
    keeps up to `readahead` blocks fetched or in flight, so the next GETs overlap the
    reader's decoding instead of following it. Those GETs go to up to `fetchers`
    background threads, `fetch_blocks` blocks each (concurrent GETs use more of a
    store's bandwidth than one), and are issued only once at least `fetch_blocks`
    blocks of the window are missing, so each is a large one. The window stops at the
    object's end, or goes on into the object the caller says `following` it (a
    replay's next segment object, whose first read then continues the scan); it is
    at most half the capacity (a scan never pushes out its own next blocks), and the
    bytes queued or in flight ahead of all scans are at most half the capacity too. A
    reader that needs a block queued ahead that no fetcher has begun does that GET
    itself rather than wait. (The defaults, 4 MiB blocks, 16 ahead, 8 MiB GETs and 3
    fetchers, were the fastest replay of bench/remote.py against Ceph on loopback.)

    Every block being fetched, by a reader or ahead of one, is registered in flight:
    a read that needs it waits for that GET rather than issuing a second. A GET that
    failed leaves nothing behind; the read that needs its blocks fetches them again
    itself, so it gets the data or raises the store's error of that moment
    (StoreUnavailable once the store's retries are spent, CorruptObject for an object
    missing or shorter than its manifest says), and a transient failure ahead of a
    reader costs it one GET, never a wrong answer.

    The fetcher threads are daemons, started when a scan first needs them and ended
    after `IDLE_S` with nothing to do or at `close()`; a closed cache goes on serving
    reads, fetching on the reader's thread only.
    """

    IDLE_S = 5.0  # a fetcher thread with nothing to do this long ends
    SCANS_MAX = 1024  # objects whose last read block is remembered (scan detection)

    def __init__(self, store, *, block_bytes: int = 4 * 2**20,
                 capacity_bytes: int = 256 * 2**20, readahead: int = 16,
                 fetch_blocks: int = 2, fetchers: int = 3) -> None:
        if block_bytes <= 0 or readahead < 0 or fetch_blocks < 1 or fetchers < 0:
            raise ValueError(f"RangeCache: block_bytes must be positive, readahead and "
                             f"fetchers at least 0, fetch_blocks at least 1 (got "
                             f"block_bytes={block_bytes}, readahead={readahead}, "
                             f"fetchers={fetchers}, fetch_blocks={fetch_blocks})")
        self.store = store
        self.block_bytes = block_bytes
        self.capacity_bytes = max(capacity_bytes, block_bytes)
        capacity_blocks = self.capacity_bytes // block_bytes
        self.readahead = min(readahead, capacity_blocks // 2) if fetchers else 0
        self.fetch_blocks = max(1, min(fetch_blocks, self.readahead))
        self.fetchers = fetchers
        self._blocks: collections.OrderedDict[tuple[str, int], memoryview] = (
            collections.OrderedDict())
        self._bytes = 0
        self._inflight: dict[tuple[str, int], _Fetch] = {}
        self._ahead_bytes = 0  # of the GETs queued or running ahead of scans
        self._last: dict[str, int] = {}  # key -> the last block read of it (LRU order)
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # the fetchers wait on it
        self._queue: collections.deque[tuple[str, int, _Fetch]] = collections.deque()
        self._threads: set[threading.Thread] = set()
        self._idle = 0  # fetcher threads waiting for work
        self._closed = False
        self.stats = {"hits": 0, "misses": 0, "requests": 0, "bytes_fetched": 0,
                      "prefetched": 0, "waits": 0, "prefetch_errors": 0}

    def read(self, key: str, object_size: int, position: int, size: int, *,
             following: tuple[str, int] | None = None) -> bytes:
        """Bytes [position, position + size) of the object `key`, which the manifest
        says is `object_size` long (shorter at its end, as pread is). `following`:
        the (key, size) of the object a scan of this one goes on to, if known. Raises
        CorruptObject when the store lacks it or holds fewer bytes, StoreError."""
        end = min(position + size, object_size)
        if end <= position:
            return b""
        block = self.block_bytes
        first, last = position // block, (end - 1) // block
        with self._lock:
            previous = self._last.pop(key, None)
            self._last[key] = last
            if len(self._last) > self.SCANS_MAX:
                del self._last[next(iter(self._last))]
            if self.readahead and (previous in (first - 1, first) or (
                    previous is None and position == 0 and size >= block)):
                self._read_ahead(key, object_size, last, following)
        found = self._obtain(key, object_size, range(first, last + 1))
        start, stop = position - first * block, end - last * block
        if first == last:
            return bytes(found[first][start:stop])
        parts = [found[b] for b in range(first, last + 1)]
        parts[0], parts[-1] = parts[0][start:], parts[-1][:stop]
        return b"".join(parts)  # (views until here: the bytes are copied once)

    def close(self) -> None:
        """End the fetcher threads (one in a GET ends when it returns). GETs queued and
        not begun are dropped: a read waiting for one fetches its blocks itself."""
        with self._lock:
            self._closed = True
            dropped, self._queue = list(self._queue), collections.deque()
            for key, _, fetch in dropped:
                self._settle(key, fetch, error=_Dropped())
            self._work.notify_all()
            threads = list(self._threads)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout=1.0)

    # -- the blocks a read needs ---------------------------------------------------------

    def _obtain(self, key: str, object_size: int, blocks: range) -> dict[int, memoryview]:
        """{block: its bytes} for `blocks`: cached ones, ones in flight (waited for),
        the rest fetched here. Raises what this thread's own GET raises."""
        found: dict[int, memoryview] = {}
        pending = list(blocks)
        counted = False
        while pending:
            waits: dict[int, _Fetch] = {}
            with self._lock:
                missing = []
                for b in pending:
                    data = self._blocks.get((key, b))
                    if data is not None:
                        self._blocks.move_to_end((key, b))
                        found[b] = data
                    elif (key, b) in self._inflight:
                        waits[b] = self._inflight[(key, b)]
                    else:
                        missing.append(b)
                mine = [self._claim(key, run) for run in _runs(missing)]
                if not counted:  # (waits: blocks on their way, taken or waited for)
                    self.stats["hits"] += len(pending) - len(waits) - len(missing)
                    self.stats["misses"] += len(missing)
                    self.stats["waits"] += len(waits)
                    counted = True
                for b, fetch in list(waits.items()):
                    if not fetch.started:  # queued ahead, no fetcher on it yet: take it
                        self._queue.remove(fetch.queued)
                        fetch.started = True
                        mine.append(fetch)
                        del waits[b]
            try:
                for fetch in mine:
                    self._get(key, object_size, fetch)
                    found.update((b, fetch.data[b]) for b in fetch.blocks if b in blocks)
            except BaseException as error:
                with self._lock:
                    for fetch in mine:
                        if not fetch.done.is_set():
                            self._settle(key, fetch, error=error)
                raise
            pending = []
            for b, fetch in waits.items():
                fetch.done.wait()
                if fetch.error is None:
                    found[b] = fetch.data[b]
                else:  # (another's GET failed: try it here, and raise what this one does)
                    pending.append(b)
        return found

    def _claim(self, key: str, blocks: list[int]) -> "_Fetch":
        """Register one GET of the contiguous `blocks` in flight (the lock held)."""
        fetch = _Fetch(blocks)
        for b in blocks:
            self._inflight[(key, b)] = fetch
        return fetch

    def _get(self, key: str, object_size: int, fetch: "_Fetch") -> None:
        """Do `fetch`'s ranged GET; its blocks go to the cache and to `fetch.data`, as
        views of what arrived (no copy). Raises the store's error, after settling."""
        block = self.block_bytes
        start = fetch.blocks[0] * block
        stop = min((fetch.blocks[-1] + 1) * block, object_size)
        try:
            try:
                data = self.store.get_range(key, start, stop)
            except ObjectNotFound:
                raise CorruptObject(key, start, "missing from the store, though a "
                                    "committed manifest generation names it") from None
            if len(data) != stop - start:
                raise CorruptObject(key, start + len(data), f"the object is shorter than "
                                    f"the {object_size} bytes its manifest says")
        except BaseException as error:
            with self._lock:
                self._settle(key, fetch, error=error)
            raise
        view = memoryview(data)
        fetched = {b: view[b * block - start:min((b + 1) * block, object_size) - start]
                   for b in fetch.blocks}
        with self._lock:
            self.stats["requests"] += 1
            self.stats["bytes_fetched"] += len(data)
            for b, part in fetched.items():
                if (key, b) not in self._blocks:
                    self._blocks[(key, b)] = part
                    self._bytes += len(part)
            while self._bytes > self.capacity_bytes and len(self._blocks) > 1:
                _, dropped = self._blocks.popitem(last=False)
                self._bytes -= len(dropped)
            self._settle(key, fetch, data=fetched)

    def _settle(self, key: str, fetch: "_Fetch", *, data=None, error=None) -> None:
        """`fetch` is over (the lock held): out of flight, its waiters woken."""
        for b in fetch.blocks:
            if self._inflight.get((key, b)) is fetch:
                del self._inflight[(key, b)]
        if fetch.ahead:
            self._ahead_bytes -= len(fetch.blocks) * self.block_bytes
        fetch.data, fetch.error = data, error
        fetch.done.set()

    # -- reading ahead of a scan ------------------------------------------------------

    def _read_ahead(self, key: str, object_size: int, last: int,
                    following: tuple[str, int] | None) -> None:
        """Queue GETs for the blocks of the window after block `last` that are neither
        cached nor in flight, going on into the object `following` (key, size) when
        the window passes this one's end (the lock held); see the class docstring."""
        if self._closed:
            return
        block = self.block_bytes
        window = [(key, object_size, b) for b in range(
            last + 1, min(last + self.readahead, (object_size - 1) // block) + 1)]
        if following is not None and len(window) < self.readahead and following[1] > 0:
            after, after_size = following
            window += [(after, after_size, b) for b in range(
                min(self.readahead - len(window), (after_size - 1) // block + 1))]
            self._last.setdefault(after, -1)  # (its first read continues this scan)
        for at, (k, _, b) in enumerate(window):
            if (k, b) not in self._blocks and (k, b) not in self._inflight:
                break
        else:
            return  # the window is full
        if len(window) - at < self.fetch_blocks and len(window) == self.readahead:
            return  # too little of it is missing for a large GET: later
        runs: list[list[tuple[str, int, int]]] = []
        for k, size, b in window[at:]:
            if (k, b) in self._blocks or (k, b) in self._inflight:
                continue
            run = runs[-1] if runs else None
            if run and run[-1][0] == k and run[-1][2] == b - 1 and len(run) < self.fetch_blocks:
                run.append((k, size, b))
            else:
                runs.append([(k, size, b)])
        budget = self.capacity_bytes // 2 - self._ahead_bytes
        queued = 0
        for run in runs:
            if len(run) * block > budget:
                break
            budget -= len(run) * block
            k, size, _ = run[0]
            fetch = self._claim(k, [b for _, _, b in run])
            fetch.ahead, fetch.started = True, False
            fetch.queued = (k, size, fetch)
            self._ahead_bytes += len(run) * block
            self._queue.append(fetch.queued)
            self.stats["prefetched"] += len(run)
            queued += 1
        if queued:
            self._start_fetchers()
            self._work.notify(queued)

    def _start_fetchers(self) -> None:
        """Enough fetcher threads for the queue, at most `fetchers` (the lock held)."""
        while len(self._threads) < self.fetchers and self._idle < len(self._queue):
            thread = threading.Thread(target=self._fetcher, name="streamlog-store-fetch",
                                      daemon=True)
            self._threads.add(thread)
            self._idle += 1  # (counted idle until it takes its first GET)
            thread.start()

    def _fetcher(self) -> None:
        me = threading.current_thread()
        while True:
            with self._lock:
                while not self._queue:
                    if self._closed or (not self._work.wait(self.IDLE_S) and not self._queue):
                        self._idle -= 1
                        self._threads.discard(me)
                        return
                key, object_size, fetch = self._queue.popleft()
                fetch.started = True
                self._idle -= 1
            try:
                self._get(key, object_size, fetch)
            except BaseException as error:  # (in fetch.error: the reader fetches again)
                with self._lock:
                    self.stats["prefetch_errors"] += 1
                log.debug("reading ahead in %s: %s", key, error)
            with self._lock:
                self._idle += 1


class _Fetch:
    """One ranged GET of contiguous blocks: in flight until `done` is set, then its
    blocks' bytes (`data`) or the error it raised."""

    __slots__ = ("blocks", "done", "data", "error", "ahead", "queued", "started")

    def __init__(self, blocks: list[int]) -> None:
        self.blocks = blocks
        self.done = threading.Event()
        self.data: dict[int, memoryview] | None = None
        self.error: BaseException | None = None
        self.ahead = False  # queued ahead of a scan (counted in _ahead_bytes)
        self.queued: tuple | None = None  # its entry in the fetchers' queue, if ahead
        self.started = True  # a fetcher or a reader is doing its GET


class _Dropped(Exception):
    """A GET queued ahead of a scan that the cache's close dropped before it began."""


def _runs(blocks: list[int]) -> list[list[int]]:
    """`blocks` (ascending) cut into runs of consecutive numbers."""
    runs: list[list[int]] = []
    for b in blocks:
        if runs and runs[-1][-1] == b - 1:
            runs[-1].append(b)
        else:
            runs.append([b])
    return runs
