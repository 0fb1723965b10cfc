"""Group commit: one writer thread per partition turns queued appends into frames.

Strategy: callers (asyncio tasks or plain threads) validate their records, cut them into
pieces no larger than a frame, and queue them with a waiter. The writer thread takes
everything queued (up to the in-flight bounds), merges consecutive pieces into as few
frames as fit, writes them with one write, fsyncs once (policy `always`), indexes them,
publishes them to the live tail, then resolves every waiter. So a thousand concurrent
single-record appends cost one write and one fsync. A thread, not a coroutine: fsync
blocks, and sync callers (Spark executors) must be able to append too.

Sticky failure: if a write or fsync raises, the partition is FAILED; every queued and
later append gets PartitionFailed, and fsync is never retried.

Only the writer thread touches segments, the index and the offsets; callers touch only
the queue, under `_cond`.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import threading

import numpy as np
import zstandard

from .config import Compression, FsyncPolicy, LogConfig
from .errors import LogClosed, PartitionFailed
from .frame import (CODEC_ZSTD, FLAG_HAS_PRODUCER, Frame, ProducerStamp, encode_frame,
                    encode_frame_from_parts, payload_start)
from .index import IndexEntry, RecoveryPoint
from .payload import (NO_TIME, EncodedRows, advance_hwm, compress, data_timestamps,
                      encode_payload, encoded_parts)
from .txn import frame_events

log = logging.getLogger("streamlog.appender")


@dataclasses.dataclass(slots=True)
class Piece:
    """Records of one append that fit one frame. `kinds`/`headers` None when unused."""

    timestamps_us: list
    keys: list
    values: list
    kinds: list | None
    headers: list | None
    nbytes: int
    txn_id: int = 0
    # A Kafka producer's batch (frame.py's stamp): always a frame of its own.
    producer: ProducerStamp | None = None

    @property
    def record_count(self) -> int:
        return len(self.values)


class Waiter:
    """Resolution of one append: the first offset it got, or the error."""

    __slots__ = ("loop", "future", "event", "result", "error")

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = loop
        self.future = loop.create_future() if loop is not None else None
        self.event = None if loop is not None else threading.Event()
        self.result = None
        self.error: BaseException | None = None

    def wait(self):
        assert self.event is not None
        self.event.wait()
        if self.error is not None:
            raise self.error
        return self.result


@dataclasses.dataclass(slots=True)
class Committed:
    """What one commit wrote: the partition's new end, the index entries and
    transaction events to record, and the frames to publish to the live tail."""

    next_offset: int
    hwm_us: int | None
    end_position: int  # in the active segment
    record_count: int
    entries: list
    events: list
    recovery: RecoveryPoint | None  # set when the commit was fsynced
    published: list  # (Frame, running max before it)


@dataclasses.dataclass(slots=True)
class Pending:
    pieces: list  # Piece, or payload.EncodedRows (columnar appends)
    waiter: Waiter | None
    nbytes: int
    job: object = None  # a callable run on the writer thread instead of an append


def resolve_waiters(done: list[tuple[Waiter, object, BaseException | None]]) -> None:
    """Resolve waiters from the writer thread: sync ones directly, async ones with one
    call_soon_threadsafe per event loop (not one per append)."""
    on_loops = []
    for waiter, result, error in done:
        if waiter is None:
            continue
        if waiter.loop is None:
            waiter.result, waiter.error = result, error
            waiter.event.set()
        else:
            on_loops.append((waiter.loop, (waiter.future, result, error)))
    resolve_on_loops(on_loops)


def resolve_on_loops(entries) -> None:
    """Resolve asyncio futures from another thread: `entries` are (loop, (future,
    result, error)); one call_soon_threadsafe per loop, not one per future."""
    by_loop: dict = collections.defaultdict(list)
    for loop, item in entries:
        by_loop[loop].append(item)
    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(_resolve_futures, items)
        except RuntimeError:  # the loop was closed; nobody is waiting any more
            pass


def _resolve_futures(items) -> None:
    for future, result, error in items:
        if future.done():
            continue
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)


class Appender:
    """The writer thread of one partition. `partition` supplies segments, index, ring."""

    def __init__(self, partition, config: LogConfig) -> None:
        self.partition = partition
        self.config = config
        self._cond = threading.Condition()
        self._queue: collections.deque[Pending] = collections.deque()
        self._queued_bytes = 0
        self._space_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []
        self._closing = False
        self.failed: BaseException | None = None
        self._dirty = False
        self._last_fsync = self.partition.clock.monotonic_s()
        self._compressor = zstandard.ZstdCompressor(level=config.zstd_level)
        self._zstd_skip = 0
        self.stats = {"writes": 0, "fsyncs": 0, "frames": 0, "records": 0}
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"streamlog-writer-{partition.name}")
        self._thread.start()

    # -- callers ----------------------------------------------------------------------

    def submit(self, pending: Pending) -> None:
        """Queue from a plain thread, blocking while the in-flight window is full."""
        with self._cond:
            while self._full(pending) and not self._closing and self.failed is None:
                self._cond.wait()
            self._enqueue_locked(pending)

    async def submit_async(self, pending: Pending) -> None:
        """Queue from an event loop, awaiting (not blocking) while the window is full."""
        loop = asyncio.get_running_loop()
        while True:
            with self._cond:
                if not self._full(pending) or self._closing or self.failed is not None:
                    self._enqueue_locked(pending)
                    return
                future = loop.create_future()
                self._space_waiters.append((loop, future))
            await future

    def _full(self, pending: Pending) -> bool:
        if not self._queue:
            return False  # an oversize append still goes through, alone
        return (len(self._queue) >= self.config.inflight_appends_max
                or self._queued_bytes + pending.nbytes > self.config.inflight_bytes_max)

    def _enqueue_locked(self, pending: Pending) -> None:
        if self.failed is not None:
            raise PartitionFailed(f"partition {self.partition.name} failed earlier "
                                  f"({self.failed}); reopen the log to recover")
        if self._closing:
            raise LogClosed(f"partition {self.partition.name} is closed")
        self._queue.append(pending)
        self._queued_bytes += pending.nbytes
        self._cond.notify_all()

    def close(self) -> None:
        """Drain the queue, fsync, stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()

    # -- writer thread ----------------------------------------------------------------

    def _run(self) -> None:
        while True:
            group = self._take()
            if group is None:
                break
            if group:
                self._handle(group)
            elif self._dirty and self.failed is None:
                self._guarded(self._sync_interval)
        if self.failed is None:
            self._guarded(self.partition.writer_close)

    def _take(self) -> list[Pending] | None:
        """Next group of queued appends ([] when an interval fsync is due, None to stop)."""
        with self._cond:
            while not self._queue:
                if self._closing:
                    return None
                timeout = self._fsync_due_in()
                if timeout is not None and timeout <= 0:
                    return []
                self._cond.wait(timeout)
            group, size = [], 0
            while self._queue and (not group or size + self._queue[0].nbytes
                                   <= self.config.inflight_bytes_max):
                pending = self._queue.popleft()
                group.append(pending)
                size += pending.nbytes
                if pending.job is not None:
                    break
            self._queued_bytes -= size
            self._cond.notify_all()
            waiters, self._space_waiters = self._space_waiters, []
        for loop, future in waiters:
            try:
                loop.call_soon_threadsafe(_wake, future)
            except RuntimeError:
                pass
        return group

    def _fsync_due_in(self) -> float | None:
        if not self._dirty or self.config.fsync is not FsyncPolicy.INTERVAL or (
                self.failed is not None):  # a failed partition is never fsynced again
            return None
        return (self._last_fsync + self.config.fsync_interval_ms / 1000
                - self.partition.clock.monotonic_s())

    def _handle(self, group: list[Pending]) -> None:
        if self.failed is not None:
            error = PartitionFailed(f"partition {self.partition.name} failed: {self.failed}")
            resolve_waiters([(p.waiter, None, error) for p in group])
            return
        if group[-1].job is not None:
            appends, job = group[:-1], group[-1]
        else:
            appends, job = group, None
        if appends:
            try:
                results = self._commit(appends)
            except BaseException as error:  # noqa: BLE001 - sticky failure, see above
                self._fail(error)
                failure = PartitionFailed(f"write failed: {error}")
                resolve_waiters([(p.waiter, None, failure) for p in group])
                return
            resolve_waiters(results)
        if job is not None:
            try:
                resolve_waiters([(job.waiter, job.job(), None)])
            except OSError as error:  # an I/O error is as sticky here as in an append
                self._fail(error)
                resolve_waiters([(job.waiter, None, PartitionFailed(f"I/O failed: {error}"))])
            except BaseException as error:  # noqa: BLE001 - handed to the caller
                resolve_waiters([(job.waiter, None, error)])

    def _guarded(self, action) -> None:
        try:
            action()
        except OSError as error:
            self._fail(error)

    def _fail(self, error: BaseException) -> None:
        log.error("partition %s failed: %s", self.partition.name,
                  error if str(error) else type(error).__name__,
                  exc_info=not isinstance(error, OSError))
        self.failed = error
        with self._cond:
            self._cond.notify_all()

    def _commit(self, group: list[Pending]) -> list:
        """Commit a group under the partition's commit lock (the partition first takes
        in other processes' appends), hand the partition what was committed, and
        return the waiters' results."""
        part = self.partition
        with part.exclusive():
            committed, owners = self._write(group, *part.end())
            part.record(committed)
        self.stats["frames"] += len(committed.entries)
        self.stats["records"] += committed.record_count
        return [(pending.waiter, first, None) for pending, first in owners]

    def _write(self, group: list[Pending], offset: int, hwm) -> tuple["Committed", list]:
        """Encode the group as frames from `offset` on (the partition's end, with
        running max `hwm`), write them with one write and fsync under the policy.
        Returns what was committed and (pending, first offset) of each append."""
        first_offset = offset
        frames: list = []
        frame_pieces: list[Piece] = []
        owners, running = [], offset
        for pending in group:
            owners.append((pending, running))
            running += sum(piece.record_count for piece in pending.pieces)
            for piece in pending.pieces:
                if frame_pieces and not self._fits(frame_pieces, piece):
                    offset, hwm = self._emit(frame_pieces, offset, hwm, frames)
                    frame_pieces = []
                frame_pieces.append(piece)
        if frame_pieces:
            offset, hwm = self._emit(frame_pieces, offset, hwm, frames)
        segment, position = self.partition.segment_for_write(sum(len(f[0]) for f in frames))
        written_at = segment.append(frames[0][0] if len(frames) == 1  # (not copied again)
                                    else b"".join(f[0] for f in frames))
        assert written_at == position
        self.stats["writes"] += 1
        entries, events, published = [], [], []
        for data, base, count, hwm_before, hwm_after, min_ts, max_ts, raw, flags, txn_id, \
                frame_txn_events, producer in frames:
            events += frame_txn_events
            entries.append(IndexEntry(base, segment.base_offset, position, count,
                                      len(data), min_ts, max_ts,
                                      NO_TIME if hwm_after is None else hwm_after))
            published.append((Frame(position, base, count, min_ts, max_ts, txn_id, flags,
                                    len(raw), raw, producer), hwm_before))
            position += len(data)
        recovery = None
        if self.config.fsync is FsyncPolicy.ALWAYS:
            segment.fsync()
            self.stats["fsyncs"] += 1
            recovery = RecoveryPoint(segment.base_offset, position, offset,
                                     NO_TIME if hwm is None else hwm)
        else:
            self._dirty = True
        return Committed(offset, hwm, position, offset - first_offset, entries, events,
                         recovery, published), owners

    def write_from_job(self, pieces: list[Piece]) -> int:
        """Append from inside a job already running on the writer thread."""
        assert threading.current_thread() is self._thread
        ((_, first, _),) = self._commit([Pending(pieces, None, sum(p.nbytes for p in pieces))])
        return first

    def _fits(self, pieces: list, piece) -> bool:
        """Can `piece` join the frame of `pieces`? Only a piece of the same kind
        (Piece, or columnar EncodedRows) under the same transaction, within the bounds,
        and neither stamped: a stamp describes its frame's records and no others."""
        if piece.txn_id != pieces[0].txn_id or type(piece) is not type(pieces[0]):
            return False
        if piece.producer is not None or pieces[0].producer is not None:
            return False
        count = sum(p.record_count for p in pieces) + piece.record_count
        size = sum(p.nbytes for p in pieces) + piece.nbytes
        return count <= self.config.batch_records_max and size <= self.config.frame_bytes_max // 2

    def _emit(self, pieces: list, offset: int, hwm, frames: list):
        """Encode pieces as one frame; append (bytes, base, values, hwm_before, ...) to
        `frames`; return the next offset and running max."""
        txn_id, producer = pieces[0].txn_id, pieces[0].producer
        assert producer is None or len(pieces) == 1
        if isinstance(pieces[0], EncodedRows):
            # Columns: the parts are copied once, straight into the frame, whose
            # payload is then the raw payload too (compressed only if that pays).
            count, min_ts, max_ts = _encoded_bounds(pieces)
            data = encode_frame_from_parts(base_offset=offset, record_count=count,
                                           min_timestamp_us=min_ts, max_timestamp_us=max_ts,
                                           txn_id=txn_id, flags=0,
                                           parts=encoded_parts(pieces), producer=producer)
            raw, flags, data_max_ts, kinds, value_at = (
                memoryview(data)[payload_start(data):], 0, max_ts, None, None)
            stored = self._maybe_compress(raw)
        else:
            raw, flags, count, min_ts, max_ts, data_max_ts, kinds, value_at = (
                _list_payload(pieces))
            stored = self._maybe_compress(raw)
            data = None
        if data is None or stored is not raw:
            stored_flags = flags | CODEC_ZSTD if stored is not raw else flags
            data = encode_frame(base_offset=offset, record_count=count,
                                min_timestamp_us=min_ts, max_timestamp_us=max_ts,
                                txn_id=txn_id, flags=stored_flags, raw_bytes=len(raw),
                                payload=stored, producer=producer)
            assert len(data) == payload_start(data) + len(stored)
        if producer is not None:
            flags |= FLAG_HAS_PRODUCER  # as decode_frame gives it to readers of the tail
        # control records never move the high-water mark (payload.py)
        hwm_after = advance_hwm(hwm, data_max_ts)
        events = frame_events(pieces[0].txn_id, offset, kinds, value_at)
        frames.append((data, offset, count, hwm, hwm_after, min_ts, max_ts, raw, flags,
                       pieces[0].txn_id, events, producer))
        return offset + count, hwm_after

    def _maybe_compress(self, raw: bytes) -> bytes:
        mode = self.config.compression
        if mode is Compression.NONE or len(raw) < 512:
            return raw
        if mode is Compression.AUTO and self._zstd_skip > 0:
            self._zstd_skip -= 1
            return raw
        packed = compress(raw, self._compressor)
        if packed is None:
            self._zstd_skip = 32  # it did not pay; try again a few dozen frames later
            return raw
        return packed

    def _sync_interval(self) -> None:
        self.partition.sync_active()
        self._dirty = False
        self._last_fsync = self.partition.clock.monotonic_s()
        self.stats["fsyncs"] += 1


def _list_payload(pieces: list[Piece]):
    """(raw payload, flags, record count, min and max timestamp, largest data-record
    timestamp or None, kinds, value getter) of list pieces merged into one frame."""
    if len(pieces) == 1:
        p = pieces[0]
        timestamps, keys, values, kinds, headers = (p.timestamps_us, p.keys, p.values,
                                                    p.kinds, p.headers)
    else:
        timestamps = [t for p in pieces for t in p.timestamps_us]
        keys = [k for p in pieces for k in p.keys]
        values = [v for p in pieces for v in p.values]
        kinds = _merge_optional(pieces, "kinds", 0)
        headers = _merge_optional(pieces, "headers", ())
    raw, flags = encode_payload(timestamps, keys, values, kinds, headers)
    ts = np.asarray(timestamps, dtype=np.int64)
    min_ts, max_ts = int(ts.min()), int(ts.max())
    data_max_ts = max_ts
    if kinds is not None:
        latest = int(data_timestamps(ts, np.asarray(kinds, dtype=np.uint8)).max())
        data_max_ts = None if latest == NO_TIME else latest
    return raw, flags, len(values), min_ts, max_ts, data_max_ts, kinds, values.__getitem__


def _encoded_bounds(pieces: list[EncodedRows]) -> tuple[int, int, int]:
    """(record count, min and max timestamp) of columnar pieces (all data records)."""
    count = sum(p.record_count for p in pieces)
    return (count, min(p.min_timestamp_us for p in pieces),
            max(p.max_timestamp_us for p in pieces))


def _merge_optional(pieces: list[Piece], name: str, default):
    if all(getattr(p, name) is None for p in pieces):
        return None
    out = []
    for p in pieces:
        column = getattr(p, name)
        out.extend(column if column is not None else [default] * len(p.values))
    return out


def _wake(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
