"""Reading ahead of a scan in the store's block cache (remote/storefs.py RangeCache):
the next blocks are fetched on background threads while the reader decodes, several
GETs at once, each block once (a read that needs a block in flight waits for it), a
failed GET ahead of a reader is fetched again by the read that needs it (which
raises the store's error of that moment, or gets the data), the cache stays within
its capacity, and the fetcher threads end. In memory: MemoryStore, with its injected
faults and slowness, behind a wrapper that records every ranged GET."""

from __future__ import annotations

import os
import threading
import time

import pytest

import streamlog
from streamlog.errors import CorruptObject, StoreUnavailable
from streamlog.remote.rangecache import RangeCache
from streamlog.remote.store import Retrying, RetryPolicy
from streamlog.testing import MemoryFileIO
from streamlog.testing.memindex import MemoryIndexStorage
from streamlog.testing.memstore import MemoryBucket, MemoryStore

BLOCK = 64 * 1024
FETCHER = "streamlog-store-fetch"


class Recording:
    """A store that passes each call to `inner` and records every ranged GET, how many
    run at once at most, and (while `gate` is cleared) holds the GETs that start past
    `gate_from`."""

    def __init__(self, inner, *, delay_s: float = 0.0) -> None:
        self.inner = inner
        self.url = inner.url
        self.delay_s = delay_s
        self.ranges: list[tuple[str, int, int]] = []
        self.running = self.most_running = 0
        self.gate = threading.Event()
        self.gate.set()
        self.gate_from = 0
        self._lock = threading.Lock()

    def get_range(self, key: str, start: int, end: int) -> bytes:
        with self._lock:
            self.ranges.append((key, start, end))
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        try:
            if start >= self.gate_from:
                assert self.gate.wait(10), "the test never opened the gate"
            if self.delay_s:
                time.sleep(self.delay_s)
            return self.inner.get_range(key, start, end)
        finally:
            with self._lock:
                self.running -= 1

    def __getattr__(self, name):
        return getattr(self.inner, name)


def an_object(store, key: str = "k", blocks: int = 32) -> bytes:
    data = os.urandom(blocks * BLOCK - 100)  # the last block is short
    store.put(key, data)
    return data


def scan(cache: RangeCache, key: str, data: bytes, step: int = 20_000, **options) -> bytes:
    return b"".join(cache.read(key, len(data), at, step, **options)
                    for at in range(0, len(data), step))


def settle(cache: RangeCache, timeout_s: float = 10.0) -> None:
    """Wait until no GET is queued or running."""
    deadline = time.monotonic() + timeout_s
    while cache._inflight:
        assert time.monotonic() < deadline, "GETs still in flight"
        time.sleep(0.002)


def fetchers_alive() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == FETCHER and t.is_alive()]


def no_fetchers_within(timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while fetchers_alive():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def fetched_each_byte_once(ranges, key: str, size: int) -> bool:
    covered = sorted((start, end) for k, start, end in ranges if k == key)
    at = 0
    for start, end in covered:
        if start != at:
            return False
        at = end
    return at == size


def test_a_scan_reads_ahead_in_large_overlapping_gets_each_block_once():
    store = Recording(MemoryStore(), delay_s=0.02)
    data = an_object(store)
    cache = RangeCache(store, block_bytes=BLOCK, capacity_bytes=32 * BLOCK, readahead=8,
                       fetch_blocks=2, fetchers=3)
    try:
        assert scan(cache, "k", data) == data
        # 32 blocks: the reader's first one, then two blocks a GET, several at a time
        assert len(store.ranges) <= 1 + 32 // 2
        assert store.most_running >= 2
        assert fetched_each_byte_once(store.ranges, "k", len(data))
        assert cache.stats["prefetched"] >= 28 and cache.stats["misses"] <= 2
        # no reading ahead: one GET per block, one after another
        plain = Recording(store.inner, delay_s=0.02)
        serial = RangeCache(plain, block_bytes=BLOCK, capacity_bytes=32 * BLOCK,
                            fetchers=0)
        assert scan(serial, "k", data) == data
        assert len(plain.ranges) == 32 and plain.most_running == 1
    finally:
        cache.close()


def test_a_read_of_a_block_in_flight_waits_for_that_get():
    store = Recording(MemoryStore())
    data = an_object(store, blocks=8)
    cache = RangeCache(store, block_bytes=BLOCK, capacity_bytes=16 * BLOCK, readahead=4,
                       fetch_blocks=4, fetchers=1)
    try:
        store.gate.clear()
        store.gate_from = BLOCK  # block 0 passes, the GETs ahead are held
        assert cache.read("k", len(data), 0, BLOCK) == data[:BLOCK]  # a scan starts
        deadline = time.monotonic() + 5
        while not (cache._inflight.get(("k", 1)) and cache._inflight[("k", 1)].started):
            assert time.monotonic() < deadline, "the fetcher did not take the GET ahead"
            time.sleep(0.002)
        got: list[bytes] = []
        reader = threading.Thread(target=lambda: got.append(
            cache.read("k", len(data), BLOCK + 10, 2 * BLOCK)))
        reader.start()
        time.sleep(0.05)
        assert reader.is_alive()  # waiting for the fetcher's GET, not issuing its own
        assert sorted(start for _, start, _ in store.ranges) == [0, BLOCK]
        store.gate.set()
        reader.join(5)
        assert got == [data[BLOCK + 10:3 * BLOCK + 10]]
        assert cache.stats["waits"] >= 1
        settle(cache)
        assert sum(1 for _, start, _ in store.ranges if BLOCK <= start < 5 * BLOCK) == 1
        assert len({(start, end) for _, start, end in store.ranges}) == len(store.ranges)
    finally:
        store.gate.set()
        cache.close()


def test_a_failed_get_ahead_is_fetched_again_by_the_read_that_needs_it():
    memory = MemoryStore()
    store = Recording(memory)
    data = an_object(store, blocks=12)
    cache = RangeCache(store, block_bytes=BLOCK, capacity_bytes=32 * BLOCK, readahead=8,
                       fetch_blocks=2, fetchers=2)
    try:
        assert cache.read("k", len(data), 0, 1000) == data[:1000]  # block 0 only
        memory.fail_next("get_range", 4, StoreUnavailable)  # every GET ahead fails
        assert cache.read("k", len(data), 1000, 1000) == data[1000:2000]  # scan: 4 GETs
        settle(cache)
        assert cache.stats["prefetch_errors"] == 4
        assert not any(b > 0 for _, b in cache._blocks)  # a failure leaves nothing
        # transient: the reads fetch again, and get the data
        assert scan(cache, "k", data) == data
        # lasting: the read that needs the block raises the store's error
        cache.close()
        cache = RangeCache(store, block_bytes=BLOCK, capacity_bytes=32 * BLOCK,
                           readahead=8, fetch_blocks=2, fetchers=2)
        assert cache.read("k", len(data), 0, 1000) == data[:1000]
        memory.down()
        assert cache.read("k", len(data), 1000, 1000) == data[1000:2000]
        settle(cache)
        assert cache.stats["prefetch_errors"] >= 1
        with pytest.raises(StoreUnavailable, match="down"):
            cache.read("k", len(data), BLOCK, 1000)
        memory.up()
        assert cache.read("k", len(data), BLOCK, 1000) == data[BLOCK:BLOCK + 1000]
    finally:
        cache.close()


def test_an_object_gone_ahead_of_the_reader_is_corrupt_on_the_read_that_needs_it():
    memory = MemoryStore()
    data = an_object(memory, blocks=6)
    cache = RangeCache(memory, block_bytes=BLOCK, capacity_bytes=32 * BLOCK, readahead=4,
                       fetch_blocks=2, fetchers=2)
    try:
        assert cache.read("k", len(data), 0, 1000) == data[:1000]
        memory.remove("k")
        assert cache.read("k", len(data), 1000, 1000) == data[1000:2000]  # cached
        settle(cache)
        assert cache.stats["prefetch_errors"] >= 1
        with pytest.raises(CorruptObject, match="missing from the store") as caught:
            cache.read("k", len(data), 2 * BLOCK, 10)
        assert caught.value.key == "k"
    finally:
        cache.close()


def test_the_cache_and_what_it_fetches_ahead_stay_within_its_capacity():
    store = Recording(MemoryStore(), delay_s=0.002)
    objects = {f"k{n}": an_object(store, f"k{n}", blocks=40) for n in range(4)}
    capacity = 12 * BLOCK
    cache = RangeCache(store, block_bytes=BLOCK, capacity_bytes=capacity, readahead=50,
                       fetch_blocks=4, fetchers=4)
    assert cache.readahead == 6 and cache.fetch_blocks == 4  # half the capacity at most
    highest = {"bytes": 0, "ahead": 0}
    failures: list[BaseException] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            with cache._lock:
                highest["bytes"] = max(highest["bytes"], cache._bytes)
                highest["ahead"] = max(highest["ahead"], cache._ahead_bytes)
            time.sleep(0.0005)

    def reader(key: str) -> None:
        try:
            assert scan(cache, key, objects[key], step=30_000) == objects[key]
        except BaseException as error:  # (reported by the main thread)
            failures.append(error)

    watcher = threading.Thread(target=watch)
    watcher.start()
    readers = [threading.Thread(target=reader, args=(key,)) for key in objects]
    for thread in readers:
        thread.start()
    for thread in readers:
        thread.join(30)
    stop.set()
    watcher.join()
    cache.close()
    assert not failures, failures
    assert highest["bytes"] <= capacity
    assert highest["ahead"] <= capacity // 2
    assert cache._ahead_bytes == 0 and not cache._inflight


def test_concurrent_readers_on_a_flaky_store_get_every_byte_and_never_hang():
    memory = MemoryStore(failure_rate=0.2, seed=7)
    store = Retrying(memory, RetryPolicy(attempts_max=20, delay_base_s=0.0005,
                                         delay_max_s=0.002, deadline_s=10))
    objects = {f"k{n}": an_object(MemoryStore(memory.bucket), f"k{n}", blocks=24)
               for n in range(3)}
    cache = RangeCache(store, block_bytes=BLOCK, capacity_bytes=16 * BLOCK, readahead=6,
                       fetch_blocks=2, fetchers=3)
    failures: list[BaseException] = []

    def reader(key: str, step: int) -> None:
        try:
            data = objects[key]
            assert scan(cache, key, data, step=step) == data
            for at in range(0, len(data), 7 * BLOCK // 3):  # and a few jumps
                assert cache.read(key, len(data), at, 5000) == data[at:at + 5000]
        except BaseException as error:  # (reported by the main thread)
            failures.append(error)

    readers = [threading.Thread(target=reader, args=(key, step))
               for key in objects for step in (9_000, 100_000)]
    for thread in readers:
        thread.start()
    for thread in readers:
        thread.join(60)
    assert not any(thread.is_alive() for thread in readers)
    cache.close()
    assert not failures, failures
    assert memory.errors["get_range"] > 0  # the faults were met, and retried
    assert not cache._inflight and cache._ahead_bytes == 0


def test_a_scan_reads_on_into_the_object_that_follows():
    store = Recording(MemoryStore())
    first, second = an_object(store, "a", blocks=6), an_object(store, "b", blocks=6)
    cache = RangeCache(store, block_bytes=BLOCK, capacity_bytes=32 * BLOCK, readahead=4,
                       fetch_blocks=2, fetchers=2)
    try:
        assert scan(cache, "a", first, following=("b", len(second))) == first
        settle(cache)
        assert ("b", 0) in cache._blocks  # fetched ahead, before any read of it
        misses = cache.stats["misses"]
        assert scan(cache, "b", second) == second
        assert cache.stats["misses"] == misses  # its first read continued the scan
        assert fetched_each_byte_once(store.ranges, "b", len(second))
    finally:
        cache.close()


def test_fetcher_threads_end_when_idle_and_at_close():
    store = MemoryStore()
    data = an_object(store)
    cache = RangeCache(store, block_bytes=BLOCK, capacity_bytes=32 * BLOCK, readahead=8,
                       fetch_blocks=2, fetchers=3)
    cache.IDLE_S = 0.05
    assert scan(cache, "k", data) == data
    assert no_fetchers_within()  # idle: they ended by themselves
    assert scan(cache, "k", data[:]) == data  # cached; a new scan starts them again
    cache.close()
    assert no_fetchers_within()
    cache.read("k", len(data), 0, 10)  # a closed cache still reads, on this thread
    assert cache.read("k", len(data), 3 * BLOCK, 10) == data[3 * BLOCK:3 * BLOCK + 10]
    assert not fetchers_alive()


def test_closing_a_view_of_the_store_ends_its_fetchers():
    bucket = MemoryBucket()
    log = streamlog.open_log("/memory/log", remote=MemoryStore(bucket),
                             fileio=MemoryFileIO(), index_storage=MemoryIndexStorage(),
                             segment_bytes_max=64 * 1024, compression="none",
                             fsync="never")
    try:
        log.tiering.close()
        log.create_stream("s", 1)
        for i in range(3000):
            log.append_sync("s", b"%05d" % i + b"." * 200, timestamp_us=1_000_000 + i)
        log.tiering.run_once()
        expected = [r.value for r in log.reader("s", 0, to_offset=2000)]
        view = streamlog.open_log(MemoryStore(bucket))
        cache = view.remote_view.fs.cache
        got = [r.value for r in view.reader("s", 0, to_offset=2000)]
        assert got == expected
        assert cache.stats["prefetched"] > 0  # each segment object, ahead of its read
        view.close()
        assert cache._closed and no_fetchers_within()
    finally:
        log.close()
