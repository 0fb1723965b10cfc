"""The live tail: recent acknowledged batches kept in memory for followers.

Strategy: one bounded ring per partition, shared by every follower, instead of a queue
per follower. The writer thread publishes each batch after it is durable under the
fsync policy (persist, then forward). A follower whose next offset is still in the ring
reads from memory; one that fell behind the ring's start reads the segments, as any
replay does, and comes back to the ring when it catches up. So a slow follower costs
disk reads, never unbounded memory, and a fast one never touches the file.

Waiting: sync followers wait on a Condition; async followers register a future that the
writer thread resolves through their event loop. Nobody polls.
"""

from __future__ import annotations

import asyncio
import collections
import threading

from .payload import Columns


class TailRing:
    def __init__(self, *, batches_max: int, bytes_max: int) -> None:
        self._batches_max = batches_max
        self._bytes_max = bytes_max
        self._ring: collections.deque[tuple[int, int, Columns, int]] = collections.deque()
        self._bytes = 0
        self._lock = threading.Lock()
        self.changed = threading.Condition(self._lock)
        self._async_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []
        self.end_offset = 0  # acknowledged end, published with the batches
        self.closed = False

    def publish(self, batches: list[tuple[int, Columns, int]], end_offset: int) -> None:
        """Writer thread: add (base_offset, columns, hwm_before) batches; wake followers."""
        with self._lock:
            for base, columns, hwm_before in batches:
                size = len(columns.values) + len(columns.keys) + 16 * len(columns)
                self._ring.append((base, base + len(columns), columns, hwm_before))
                self._bytes += size
            while self._ring and (len(self._ring) > self._batches_max
                                  or self._bytes > self._bytes_max):
                _, _, old, _ = self._ring.popleft()
                self._bytes -= len(old.values) + len(old.keys) + 16 * len(old)
            assert end_offset >= self.end_offset
            self.end_offset = end_offset
            self._wake_locked()

    def reset(self, end_offset: int) -> None:
        """Forget the ring (after truncate_after): followers re-read from disk."""
        with self._lock:
            self._ring.clear()
            self._bytes = 0
            self.end_offset = end_offset
            self._wake_locked()

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self._wake_locked()

    def _wake_locked(self) -> None:
        self.changed.notify_all()
        waiters, self._async_waiters = self._async_waiters, []
        for loop, future in waiters:
            try:
                loop.call_soon_threadsafe(_resolve, future)
            except RuntimeError:  # that follower's event loop is closed: nobody waits
                pass

    def find(self, offset: int):
        """(base, columns, hwm_before) of the ring batch holding `offset`, or None."""
        with self._lock:
            ring = self._ring
            if not ring or offset < ring[0][0] or offset >= ring[-1][1]:
                return None
            for base, next_offset, columns, hwm_before in reversed(ring):
                if base <= offset < next_offset:
                    return base, columns, hwm_before
        return None

    def wait(self, offset: int, timeout: float | None) -> bool:
        """Block until the end passes `offset` (True) or the timeout/close (False)."""
        with self._lock:
            if self.end_offset > offset:
                return True
            if self.closed:
                return False
            self.changed.wait(timeout)
            return self.end_offset > offset

    async def wait_async(self, offset: int, timeout: float | None = None) -> bool:
        """`wait` for an event loop. The timeout is a timer on the same future rather
        than asyncio.wait_for, which (before Python 3.12) can swallow a cancellation that
        arrives as the wait completes: a cancelled follower would follow on."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self.end_offset > offset:
                return True
            if self.closed:
                return False
            future = loop.create_future()
            entry = (loop, future)
            self._async_waiters.append(entry)
        timer = None if timeout is None else loop.call_later(timeout, _resolve, future)
        try:
            await future
        finally:
            if timer is not None:
                timer.cancel()
            with self._lock:
                if entry in self._async_waiters:
                    self._async_waiters.remove(entry)
        return self.end_offset > offset


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
