"""A producer: records sent one at a time, written in group-committed batches.

Strategy: `send()` checks one record (the common case inline, the rest through
validate.py, so the errors are append_sync's), picks its partition and adds it to that
partition's open batch: four list appends under one lock, and a small handle back. A
batch closes when it reaches `batch_records` or `batch_bytes`, when it has been open
`linger_ms`, on flush()/close(), or when a sender waits for buffer space. One background
thread hands closed batches, in the order they closed, to the log's one door for
appends (Log.submit_then, append.py) as one Piece each (appender.py: one frame, and
with everything else queued one write and one fsync). So a million single sends cost a
few hundred appends, not a million, and no asyncio task or thread exists per record.

A batch is its own Waiter (appender.resolve_waiters stores the first offset or the
error on it, then calls `event.set()`, which here is `Batch.set`): the writer thread
resolves every handle of the batch at once, frees its buffer space and wakes whoever
waits, per batch, never per record. A handle's RecordPosition is built only when
asked for.

Memory is bounded: `buffer_bytes` counts every record from send() until its batch is
resolved; past it send() blocks (send_async awaits) up to `block_ms_max`, then raises
BufferFull. Nothing is dropped: a record that fails its checks gets a handle that
already holds the InvalidAppend; a batch the log refuses (PartitionFailed, LogClosed)
fails every handle in it with that error.

Order: one lock orders sends, and one thread submits batches in closing order, so the
records one thread sends to one partition land in the order it sent them.

Thread-safety: send, flush and close may be called from any thread; send_async,
flush_async and aclose from any event loop. Done-callbacks run on the log's writer
thread: keep them short, and never send() or flush() from one (either could wait for
that very thread).

The batch and the handles are in producer_batch.py; the send path is written out
inline because each call on it costs a few percent.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import threading
import time

from . import validate
from .append import Submission, partition_for_key, record_bytes
from .appender import resolve_on_loops
from .encoder import Piece
from .errors import (BufferFull, InvalidAppend, InvalidArgument, LogClosed, ProducerTimeout,
                     ReadOnlyLog, StreamLogError)
from .config import LogConfig
from .producer_batch import Batch, RecordFuture, add_headers, call_back
from .records import RECORD_OVERHEAD_BYTES

log = logging.getLogger("streamlog.producer")

_INT64_MIN, _INT64_MAX = validate.INT64_MIN, validate.INT64_MAX
# How often the background thread looks whether the log was closed under the producer
# (its open batches then fail with LogClosed instead of waiting out their linger).
_LOG_CHECK_S = 0.2
_NO_SPACE = object()  # _accept's answer to a non-blocking send when the buffer is full


class Producer:
    """Sends single records to one stream of a local writable Log in batches.

    Args:
        log: a Log opened for writing (open_log(path)); the stream must exist.
        stream: the stream every record goes to.
        linger_ms: how long a batch waits for more records before it is written.
        batch_records / batch_bytes: a batch is written as soon as it holds this many
            records / bytes (key + value + 24 per record; at most the log's
            batch_records_max and half its frame_bytes_max).
        buffer_bytes: key + value bytes (plus 24 per record) sent and not yet
            acknowledged, at most; past it send() blocks.
        block_ms_max: how long send() blocks for buffer space before BufferFull.
        partitioner: fn(key, partition_count) -> partition for records sent without
            `partition`; by default a key picks its partition as the log does
            (partition_for_key) and a record without a key goes to the partition whose
            batch is filling ("sticky", as Kafka's producer), moving on when it closes.
    Raises:
        InvalidArgument for a bad option, UnknownStream, ReadOnlyLog, LogClosed.

    Thread-safety: see the module's notes. Close the producer before the log: records
    still lingering when the log closes fail with LogClosed.
    """

    def __init__(self, log, stream: str, *, linger_ms: float = 5.0, batch_records: int = 4096,
                 batch_bytes: int = 1 << 20, buffer_bytes: int = 32 << 20,
                 block_ms_max: float = 60_000.0, partitioner=None) -> None:
        local = callable(getattr(log, "submit_then", None))  # a local Log
        if not local and not hasattr(log, "send_batch"):
            raise InvalidArgument(f"a Producer writes to a log from open_log(), "
                                  f"not a {type(log).__name__}")
        # A daemon's client checks records against the default limits (the daemon
        # enforces its own) and stamps them with this machine's clock, as Kafka's does.
        config = log.config if local else LogConfig()
        _check_options(config, linger_ms, batch_records, batch_bytes, buffer_bytes,
                       block_ms_max, partitioner)
        if log.readonly:
            raise ReadOnlyLog("the log was opened read-only")
        self._log = log
        self.stream = stream
        self._count = log.partition_count(stream)  # UnknownStream, LogClosed
        self._linger_s = linger_ms / 1000
        self._batch_bytes = batch_bytes
        self._buffer_bytes = buffer_bytes
        self._block_s = block_ms_max / 1000
        self._partitioner = partitioner
        self._last_index = batch_records - 1
        # the largest record: the log's limit, and what the buffer can ever hold
        self._size_max = min(config.record_bytes_max + RECORD_OVERHEAD_BYTES, buffer_bytes)
        self._wall_us = log.clock.wall_us if local else _wall_us
        self._remote = None if local else log.send_batch
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)  # senders waiting for buffer space
        self._wake = threading.Condition(self._lock)  # the background thread
        self._space_waiting = 0
        self._space_async: list = []  # (loop, future) of send_async waiting for space
        self._open: dict[int, Batch] = {}  # partition -> open batch, oldest first
        self._ready: collections.deque[Batch] = collections.deque()  # closed, to submit
        self._unresolved: dict[Batch, None] = {}  # every batch not yet resolved
        self._buffered = 0  # bytes of records sent and not yet resolved
        self._sticky = 0
        self._closing = False
        # batches handed to the log; records acknowledged; records failed (rejected or refused)
        self.stats = {"batches": 0, "acknowledged": 0, "failed": 0}
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"streamlog-producer-{stream}")
        self._thread.start()

    # -- sending ------------------------------------------------------------------------

    def send(self, value, *, key=None, timestamp_us=None, partition=None,
             headers=None) -> RecordFuture:
        """Queue one record; returns its RecordFuture at once (blocking only while the
        buffer is full). `value` is bytes, or None for a tombstone (a header value may
        be None too). A record that fails its checks gets a handle holding the
        InvalidAppend: other records are not affected.

        Raises:
            BufferFull after block_ms_max without buffer space; LogClosed after close().
        """
        return self._accept(value, key, timestamp_us, partition, headers, True)

    async def send_async(self, value, *, key=None, timestamp_us=None, partition=None,
                         headers=None) -> RecordFuture:
        """send() for asyncio code: awaits (never blocks the loop) while the buffer is
        full. Await the returned handle, or flush_async(), for the acknowledgement."""
        handle = self._accept(value, key, timestamp_us, partition, headers, False)
        if handle is not _NO_SPACE:
            return handle
        deadline = time.monotonic() + self._block_s
        loop = asyncio.get_running_loop()
        while True:
            future = loop.create_future()
            with self._lock:
                self._space_async.append((loop, future))
            # registered before the retry, so a batch resolving in between wakes us
            handle = self._accept(value, key, timestamp_us, partition, headers, False)
            if handle is not _NO_SPACE:
                return handle
            try:
                async with asyncio.timeout(deadline - time.monotonic()):
                    await future
            except TimeoutError:
                raise self._buffer_full() from None

    def _accept(self, value, key, timestamp_us, partition, headers, block: bool):
        """The hot path of send(): check, pick a partition, add to its open batch. The
        common record (bytes, no headers, partition by key) is checked inline; every
        other goes through _prepare. Each operation here costs about 1% of a send."""
        if timestamp_us is None:
            timestamp_us = self._wall_us()
        if (type(value) is bytes and (key is None or type(key) is bytes) and partition is None
                and type(timestamp_us) is int and _INT64_MIN < timestamp_us <= _INT64_MAX
                and not headers and self._partitioner is None):
            size = len(value) + RECORD_OVERHEAD_BYTES + (0 if key is None else len(key))
            if size > self._size_max:
                return self._reject(self._too_large(size))
            number = -1 if key is None or self._count == 1 else partition_for_key(
                key, self._count)  # -1: the sticky partition, chosen under the lock
        else:
            prepared = self._prepare(value, key, timestamp_us, partition, headers)
            if type(prepared) is RecordFuture:
                return prepared
            value, key, timestamp_us, headers, number, size = prepared
        with self._lock:
            if self._closing:
                raise LogClosed(f"the producer of stream {self.stream!r} is closed")
            if self._buffered + size > self._buffer_bytes:
                if not block:
                    self._make_room_locked(size)
                    return _NO_SPACE
                self._wait_for_space_locked(size)
            batch = self._open.get(self._sticky if number < 0 else number)
            if batch is None or batch.nbytes + size > self._batch_bytes:
                batch = self._batch_for_locked(number, size)
            values = batch.values
            index = len(values)
            values.append(value)
            batch.keys.append(key)
            batch.timestamps_us.append(timestamp_us)
            if headers or batch.headers is not None:
                add_headers(batch, index, headers)
            batch.nbytes += size
            self._buffered += size
            if index >= self._last_index:
                self._close_locked(batch)
        return RecordFuture((batch, index))

    def _prepare(self, value, key, timestamp_us, partition, headers):
        """The general path of a record's checks (validate.records, so the errors are
        append_sync's) and its partition: (value, key, timestamp_us, headers, partition,
        size), or a handle holding the InvalidAppend."""
        try:
            values, keys, timestamps, headers_column, _ = validate.records(
                [value], None if key is None else [key], [timestamp_us],
                [headers] if headers else None, None)
        except InvalidAppend as error:
            return self._reject(error)
        value, key, timestamp_us = values[0], keys[0], timestamps[0]
        size = record_bytes(value, key) + RECORD_OVERHEAD_BYTES
        if size > self._size_max:
            return self._reject(self._too_large(size))
        number = self._route(key, partition)
        if type(number) is not int:
            return self._reject(number)
        return (value, key, timestamp_us, headers_column[0] if headers_column else None,
                number, size)

    def _route(self, key, partition):
        """The partition for a record, -1 for "the sticky one", or an InvalidAppend."""
        count = self._count
        if partition is not None:
            if type(partition) is int and 0 <= partition < count:
                return partition
            return InvalidAppend(f"stream {self.stream!r} has partitions 0..{count - 1} "
                                 f"(got {partition!r})")
        if self._partitioner is not None:
            try:
                number = self._partitioner(key, count)
            except Exception as error:  # noqa: BLE001 - the caller's code; its record fails
                return InvalidAppend(f"partitioner raised {error!r}")
            if type(number) is int and 0 <= number < count:
                return number
            return InvalidAppend(f"partitioner returned {number!r}, not a partition "
                                 f"in 0..{count - 1}")
        return -1 if key is None or count == 1 else partition_for_key(key, count)

    def _reject(self, error: InvalidAppend) -> RecordFuture:
        """A handle that already holds the record's error."""
        batch = Batch(None, -1, 0.0)
        batch.error, batch.done = error, True
        batch.finished.set()
        with self._lock:
            self.stats["failed"] += 1
        return RecordFuture((batch, 0))

    def _too_large(self, size: int) -> InvalidAppend:
        limit = self._size_max
        return InvalidAppend(f"record is {size - RECORD_OVERHEAD_BYTES} bytes; the limit is "
                             f"{limit - RECORD_OVERHEAD_BYTES} (record_bytes_max, and "
                             f"buffer_bytes less {RECORD_OVERHEAD_BYTES} per record)")

    # -- batches (under _lock) ----------------------------------------------------------

    def _batch_for_locked(self, number: int, size: int) -> Batch:
        """The open batch a record of `size` bytes joins (number -1: the sticky
        partition's), closing a batch it would overflow; a new one when none is open."""
        for _ in range(self._count + 1):  # each turn closes a batch, and they are <= count
            target = self._sticky if number < 0 else number
            batch = self._open.get(target)
            if batch is None:
                return self._new_batch_locked(target)
            if batch.nbytes + size <= self._batch_bytes:
                return batch
            self._close_locked(batch)  # full: a keyless record moves on with the sticky
        raise AssertionError("unreachable: every open batch was closed")  # pragma: no cover

    def _new_batch_locked(self, number: int) -> Batch:
        assert number not in self._open
        if self._log.closed:  # checked per batch; a record joining one fails in it
            raise LogClosed(f"the log at {self._log.path} is closed")
        batch = Batch(self, number, time.monotonic(), self._lock)
        self._open[number] = batch
        self._unresolved[batch] = None
        if len(self._open) == 1:
            self._wake.notify()  # the background thread may be waiting with no deadline
        return batch

    def _close_locked(self, batch: Batch) -> None:
        """Move an open batch to the queue the background thread submits from."""
        assert self._open.get(batch.partition) is batch
        del self._open[batch.partition]
        self._ready.append(batch)
        self.stats["batches"] += 1
        if batch.partition == self._sticky:
            self._sticky = (self._sticky + 1) % self._count
        self._wake.notify()

    def _close_all_locked(self) -> None:
        for batch in list(self._open.values()):
            self._close_locked(batch)

    def _make_room_locked(self, size: int) -> None:
        """A sender waits for `size` bytes: when resolving what is in flight cannot free
        them, write the open batches now instead of after their linger."""
        open_bytes = sum(batch.nbytes for batch in self._open.values())
        if self._buffered - open_bytes + size > self._buffer_bytes:
            self._close_all_locked()

    def _wait_for_space_locked(self, size: int) -> None:
        deadline = time.monotonic() + self._block_s
        self._space_waiting += 1
        try:
            while self._buffered + size > self._buffer_bytes:
                if self._closing or self._log.closed:
                    raise LogClosed(f"the producer of stream {self.stream!r} is closed")
                self._make_room_locked(size)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._buffer_full()
                self._space.wait(min(remaining, _LOG_CHECK_S))  # the log may close
        finally:
            self._space_waiting -= 1

    def _buffer_full(self) -> BufferFull:
        return BufferFull(f"send() waited {self._block_s:g} s for buffer space: "
                          f"{self._buffered:,} bytes of records are waiting for the log "
                          f"(buffer_bytes={self._buffer_bytes:,}); the log is not keeping up "
                          f"or is stalled")

    # -- the background thread ----------------------------------------------------------

    def _run(self) -> None:
        """Close batches whose linger ran out, submit closed ones in order, until
        close() (or the log's close) and nothing is left."""
        while True:
            with self._lock:
                batches = self._due_locked()
                while not batches:
                    if (self._closing or self._log.closed) and not self._open:
                        return
                    self._wake.wait(self._next_deadline_locked())
                    batches = self._due_locked()
            for batch in batches:
                self._submit(batch)

    def _due_locked(self) -> list[Batch]:
        if self._closing or self._log.closed:
            self._close_all_locked()
        else:
            expiry = time.monotonic() - self._linger_s
            expired = []
            for batch in self._open.values():  # oldest first
                if batch.opened_s > expiry:
                    break
                expired.append(batch)
            for batch in expired:
                self._close_locked(batch)
        batches = list(self._ready)
        self._ready.clear()
        return batches

    def _next_deadline_locked(self) -> float:
        """Seconds until the oldest open batch's linger runs out, at most
        _LOG_CHECK_S: the log's close() does not tell producers, so this thread looks."""
        for batch in self._open.values():  # the oldest
            return min(_LOG_CHECK_S, max(0.0, batch.opened_s + self._linger_s
                                         - time.monotonic()))
        return _LOG_CHECK_S

    def _submit(self, batch: Batch) -> None:
        """Queue a batch at its partition's appender (which blocks only while the log's
        in-flight window is full); a refusal fails the batch, never drops it."""
        if self._remote is not None:
            self._remote(self.stream, batch.partition, batch.timestamps_us, batch.keys,
                         batch.values, batch.headers, batch.resolve)
            return
        piece = Piece(batch.timestamps_us, batch.keys, batch.values, None, batch.headers,
                      batch.nbytes, 0)
        try:
            self._log.submit_then(Submission(self.stream, {batch.partition: [piece]}), batch)
        except Exception as error:  # noqa: BLE001 - handed to every record of the batch
            if not isinstance(error, StreamLogError):
                log.exception("producer of %s: submitting a batch failed", self.stream)
            batch.result, batch.error = None, error
            batch.set()

    def finish_batch(self, batch: Batch) -> None:
        """A batch was resolved (on the writer thread): free its space, wake waiters.
        Never raises: an exception here would stop the partition's writer thread."""
        try:
            count = len(batch.values)
            batch.timestamps_us = batch.keys = batch.values = batch.headers = None
            with self._lock:
                batch.done = True
                del self._unresolved[batch]
                self._buffered -= batch.nbytes
                self.stats["failed" if batch.error else "acknowledged"] += count
                if self._space_waiting:
                    self._space.notify_all()
                watchers, batch.watchers = batch.watchers, None
                space_async, self._space_async = self._space_async, []
            batch.finished.set()
            _wake_loops([(loop, future) for loop, future in space_async]
                        + [(loop, item) for loop, item in watchers or () if loop is not None])
            for loop, item in watchers or ():
                if loop is None:
                    call_back(*item)
        except Exception:  # noqa: BLE001 - see the docstring
            log.exception("producer of %s: resolving a batch failed", self.stream)

    # -- flush and close ----------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> None:
        """Write every record sent so far now, and wait until the log has acknowledged
        each (durable under fsync="always"; each handle holds its own outcome).

        Raises:
            ProducerTimeout when `timeout` seconds pass first.
        """
        with self._lock:
            self._close_all_locked()
            batches = list(self._unresolved)
        deadline = None if timeout is None else time.monotonic() + timeout
        for batch in batches:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not batch.finished.wait(remaining):
                waiting = sum(len(b.values or ()) for b in batches if not b.done)
                raise ProducerTimeout(f"flush: {waiting:,} records not acknowledged within "
                                      f"{timeout} s")

    def close(self, timeout: float | None = None) -> None:
        """Refuse further sends, flush, stop the background thread. Idempotent.

        Raises:
            ProducerTimeout when the flush ran out of time (the thread still submits
            what is buffered; those handles resolve when the log answers).
        """
        with self._lock:
            self._closing = True
            self._wake.notify()
            self._space.notify_all()
        deadline = None if timeout is None else time.monotonic() + timeout
        self.flush(timeout)
        self._thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    async def flush_async(self, timeout: float | None = None) -> None:
        await asyncio.to_thread(self.flush, timeout)

    async def aclose(self, timeout: float | None = None) -> None:
        await asyncio.to_thread(self.close, timeout)

    @property
    def buffered_bytes(self) -> int:
        return self._buffered

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    async def __aenter__(self) -> "Producer":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


def _check_options(config, linger_ms, batch_records, batch_bytes, buffer_bytes,
                   block_ms_max, partitioner) -> None:
    def number(name, value, low):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                low <= value < math.inf):
            raise InvalidArgument(f"{name} must be a finite number >= {low} (got {value!r})")

    def integer(name, value, high):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
            raise InvalidArgument(f"{name} must be an int in 1..{high} (got {value!r})")

    number("linger_ms", linger_ms, 0)
    number("block_ms_max", block_ms_max, 0)
    integer("batch_records", batch_records, config.batch_records_max)
    integer("batch_bytes", batch_bytes, config.frame_bytes_max // 2)
    integer("buffer_bytes", buffer_bytes, 1 << 62)
    if partitioner is not None and not callable(partitioner):
        raise InvalidArgument("partitioner must be a callable (key, partition_count) -> int")


def _wall_us() -> int:
    return time.time_ns() // 1000


def _wake_loops(items) -> None:
    """Set (loop, future) futures done, from another thread (appender.resolve_on_loops)."""
    resolve_on_loops([(loop, (future, None, None)) for loop, future in items])
