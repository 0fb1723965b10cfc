"""A Producer's batch and the handle of each record sent into it (producer.py).

Strategy: a batch is records bound for one partition, handed to the log as one piece,
and also the waiter the partition's writer resolves (appender.resolve_waiters stores
the first offset or the error on it, then calls `event.set()`, which here is
`Batch.set`): every handle of the batch is resolved at once, per batch, never per
record. A handle (`RecordFuture`) is a (batch, index) tuple, built by tuple's C
constructor: one is made per send. A handle's RecordPosition is built only when asked
for.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from .records import RecordPosition

log = logging.getLogger("streamlog.producer")


class RecordFuture(tuple):
    """Where one sent record landed, once the log has acknowledged it (durable under
    fsync="always"). The concurrent.futures.Future methods that make sense for a
    record already sent (it cannot be cancelled), and awaitable from asyncio code.

    A (batch, index) tuple underneath: built by tuple's C constructor, since one is
    made per send and a Python __init__ would cost a tenth of the send.
    """

    __slots__ = ()

    def done(self) -> bool:
        return self[0].done

    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return not self[0].done

    def cancel(self) -> bool:
        return False  # a record handed to send() is written or failed, never withdrawn

    def result(self, timeout: float | None = None) -> RecordPosition:
        """Block until acknowledged; return RecordPosition(partition, offset).

        Raises:
            TimeoutError when `timeout` seconds pass first; the record's error
            (InvalidAppend, PartitionFailed, LogClosed, ...) when it failed.
        """
        batch = self._wait(timeout)
        if batch.error is not None:
            raise batch.error
        return RecordPosition(batch.partition, batch.result + self[1])

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self._wait(timeout).error

    def add_done_callback(self, fn) -> None:
        """Call fn(self) once resolved: at once when it is, else on the writer thread."""
        if not self[0].watch(None, (fn, self)):
            call_back(fn, self)

    def _wait(self, timeout: float | None) -> "Batch":
        batch = self[0]
        if not batch.done and not batch.finished.wait(timeout):
            raise TimeoutError(f"record not acknowledged within {timeout} s")
        return batch

    def __await__(self):
        batch = self[0]
        if not batch.done:
            loop = asyncio.get_running_loop()
            future = loop.create_future()
            if batch.watch(loop, future):
                # shield: one awaiter cancelled must not cancel the wake-up of the others
                yield from asyncio.shield(future).__await__()
        return self.result(0)

    def __iter__(self):
        # `partition, offset = producer.send(...)` must not unpack (batch, index)
        raise TypeError("a RecordFuture is not a RecordPosition: call .result() (or await "
                        "it) for (partition, offset)")

    def __repr__(self) -> str:
        batch = self[0]
        state = "pending" if not batch.done else (
            f"error={batch.error!r}" if batch.error else "done")
        return f"<RecordFuture partition={batch.partition} {state}>"


class Batch:
    """Records bound for one partition, handed to the appender as one Piece, and the
    Waiter the appender resolves (`loop`, `future`, `result`, `error`, `event`)."""

    __slots__ = ("owner", "lock", "partition", "timestamps_us", "keys", "values", "headers",
                 "nbytes", "opened_s", "done", "finished", "watchers", "loop", "future",
                 "result", "error")

    def __init__(self, owner, partition: int, opened_s: float, lock=None) -> None:
        """`owner`: the Producer (None for a rejected record's batch, done at once),
        whose `finish_batch` it calls once resolved; `lock`: the owner's lock."""
        self.owner = owner
        self.lock = lock
        self.partition = partition
        self.timestamps_us: list = []
        self.keys: list = []
        self.values: list = []
        self.headers: list | None = None  # None until a record of the batch has headers
        self.nbytes = 0
        self.opened_s = opened_s
        self.done = False
        self.finished = threading.Event()
        self.watchers: list | None = None  # (loop or None, future or (fn, handle))
        self.loop = None  # a sync waiter to resolve_waiters: result/error, then event.set()
        self.future = None
        self.result: int | None = None  # first offset
        self.error: BaseException | None = None

    @property
    def event(self) -> "Batch":
        """The waiter's event is the batch itself (a property, not a slot: a batch
        that referred to itself would wait for the cyclic collector to be freed)."""
        return self

    def set(self) -> None:
        """Called by appender.resolve_waiters once result or error is stored."""
        self.owner.finish_batch(self)

    def resolve(self, first_offset: int | None, error: BaseException | None) -> None:
        """A daemon's client appended the batch (RemoteLog.send_batch), or failed to."""
        self.result, self.error = first_offset, error
        self.owner.finish_batch(self)

    def watch(self, loop, item) -> bool:
        """Register a wake-up for when the batch resolves; False when it already has."""
        if self.done:  # a rejected record's batch has no owner, and is done
            return False
        with self.lock:
            if self.done:
                return False
            if self.watchers is None:
                self.watchers = []
            self.watchers.append((loop, item))
            return True

def add_headers(batch: Batch, index: int, headers) -> None:
    """Headers of record `index` of a batch: the column exists from the first record
    that has some (earlier ones get none)."""
    if batch.headers is None:
        batch.headers = [()] * index
    batch.headers.append(headers or ())


def call_back(fn, handle) -> None:
    try:
        fn(handle)
    except Exception:  # noqa: BLE001 - as concurrent.futures: logged, not raised
        log.exception("producer: a done-callback raised")
