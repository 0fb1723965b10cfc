"""Awaited single appends, gathered on their event loop into one append per turn.

Strategy: a thousand asyncio tasks each awaiting `Log.append` of one record would each
take the writer's lock, queue an append of their own and be resolved one by one. Here
each plain record (no headers, no transaction) joins its loop's open batch for the
partition instead: three list appends and a future, on the loop's own thread, with no
lock. The batch's first record schedules a `flush` (loop.call_soon), which runs once the
tasks ready in this turn of the loop have run, and hands the batch to the writer as one
append of one piece: append_batch's path, so the writer does nothing per record that it
would not do for a batch. The writer resolves the batch's futures in one callback on the
loop (appender.resolve_waiters: record i gets the batch's first offset + i).

A batch holds at most a frame's worth (batch_records_max, frame_bytes_max / 2: what
append.cut gives a piece); a fuller turn makes several, handed over in order. When the
writer's in-flight window is full, the batches wait here, in order, and the flush runs
again when the writer takes some (Appender.offer). The records of one loop reach the
partition in the order they were appended. Everything here runs on the loop's thread:
closing the log from another thread asks each loop to flush (`hand_over`).
"""

from __future__ import annotations

import asyncio
import collections

from .encoder import Piece
from .errors import LogClosed, PartitionFailed, UnknownStream


class Batch:
    """Records of one loop for one partition, and their futures; the waiter the writer
    resolves (appender.resolve_waiters: `future` is the list of the records' futures)."""

    __slots__ = ("loop", "future", "timestamps", "keys", "values", "nbytes")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.future: list[asyncio.Future] = []
        self.timestamps: list[int] = []
        self.keys: list = []
        self.values: list = []
        self.nbytes = 0

    def piece(self) -> Piece:
        return Piece(self.timestamps, self.keys, self.values, None, None, self.nbytes, 0)

    def fail(self, error: BaseException) -> None:
        for future in self.future:
            if not future.done():
                future.set_exception(error)


class Singles:
    """One loop's single appends to one partition (its writer's `singles[loop]`)."""

    __slots__ = ("appender", "loop", "open", "ready", "scheduled", "records_max",
                 "bytes_max")

    def __init__(self, appender, loop: asyncio.AbstractEventLoop) -> None:
        self.appender = appender
        self.loop = loop
        self.open: Batch | None = None
        self.ready: collections.deque[Batch] = collections.deque()
        self.scheduled = False
        self.records_max = appender.config.batch_records_max
        self.bytes_max = appender.config.frame_bytes_max // 2

    def start(self) -> Batch:
        """A new open batch (the open one, full, waits for the flush)."""
        if self.open is not None:
            self.ready.append(self.open)
        self.open = Batch(self.loop)
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self.flush)
        return self.open

    def flush(self) -> None:
        """Hand the batches to the writer, in order, as far as its window has room."""
        self.scheduled = False
        if self.open is not None:
            self.ready.append(self.open)
            self.open = None
        while self.ready:
            batch = self.ready[0]
            try:
                if not self.appender.offer(batch.piece(), batch, self.loop, self.flush):
                    return  # the window is full: flush runs again when it has room
            except (LogClosed, PartitionFailed, UnknownStream) as error:
                batch.fail(error)
            self.ready.popleft()
        if self.appender.singles.get(self.loop) is self:
            del self.appender.singles[self.loop]  # (a loop that ends leaves nothing)


def append(appender, timestamp_us: int, key, value, nbytes: int) -> asyncio.Future:
    """Join the running loop's open batch for `appender`'s partition (a new one when it
    is full); the future gets the record's offset once it is durable under the policy.
    (One function, no method calls: it runs once per record.)"""
    loop = asyncio.get_running_loop()
    singles = appender.singles.get(loop)
    if singles is None:
        singles = appender.singles[loop] = Singles(appender, loop)
    batch = singles.open
    if batch is None or len(batch.values) >= singles.records_max or (
            batch.nbytes + nbytes > singles.bytes_max):
        batch = singles.start()
    future = loop.create_future()
    batch.future.append(future)
    batch.timestamps.append(timestamp_us)
    batch.keys.append(key)
    batch.values.append(value)
    batch.nbytes += nbytes
    return future


def hand_over(singles: dict) -> None:
    """Closing: the running loop's batches go to the writer now; other loops' at their
    next turn (a loop that is closed has nobody waiting any more)."""
    try:
        here = asyncio.get_running_loop()
    except RuntimeError:
        here = None
    for loop, waiting in list(singles.items()):
        if loop is here:
            waiting.flush()
        else:
            try:
                loop.call_soon_threadsafe(waiting.flush)
            except RuntimeError:
                pass
