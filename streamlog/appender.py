"""Group commit: one writer thread per partition turns queued appends into frames.

Strategy: callers (asyncio tasks or plain threads) validate their records, cut them into
pieces no larger than a frame, and queue them with a waiter. The writer thread takes
everything queued (up to the in-flight bounds), merges consecutive pieces into as few
frames as fit, writes them with one write, fsyncs once (policy `always`), indexes them,
publishes them to the live tail, then resolves every waiter. So a thousand concurrent
single-record appends cost one write and one fsync. A thread, not a coroutine: fsync
blocks, and sync callers (Spark executors) must be able to append too.

Sticky failure: if a write or fsync raises, the partition is FAILED; every queued and
later append gets PartitionFailed, and fsync is never retried. A partition whose stream
was deleted (Partition.mark_deleted) is failed the same way, with UnknownStream.

The writer loop is here whole, in `_commit`: take the commit lock (which first takes in
what writers in other processes did: catchup.py), encode (encoder.py, a pure function),
roll a full or old segment, write with one write, fsync under the policy, index, publish
the partition's new state, hand the frames to the live tail, let the lock go. Only the
writer thread touches segments, the index and the state; callers touch only the queue,
under `_cond`.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import threading

from . import coalesce
from .config import FsyncPolicy, LogConfig
from .encoder import Compressor, Piece, encode_commit
from .errors import LogClosed, PartitionFailed, UnknownStream
from .segment import Segment
from .state import recovery_point

log = logging.getLogger("streamlog.appender")


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
    """On the loop: resolve each waiter's future; a list of futures (a coalesce.Batch's
    records) gets the first offset + the record's index."""
    for future, result, error in items:
        if type(future) is list:
            if error is not None:
                for each in future:
                    if not each.done():
                        each.set_exception(error)
            else:
                for each in future:
                    if not each.done():
                        each.set_result(result)
                    result += 1
        elif future.done():
            continue
        elif error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)


class Appender:
    """The writer thread of one partition. `partition` holds the state it owns (the
    partition's files, index, state value and tail ring); see the module docstring."""

    def __init__(self, partition, config: LogConfig) -> None:
        self.partition = partition
        self.config = config
        self._cond = threading.Condition()
        self._queue: collections.deque[Pending] = collections.deque()
        self._queued_bytes = 0
        self._space_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []
        # each event loop's awaited single appends, gathered per turn (coalesce.py)
        self.singles: dict[asyncio.AbstractEventLoop, coalesce.Singles] = {}
        self._closing = False
        self._dirty = False
        self._last_fsync = self.partition.clock.monotonic_s()
        self._compressor = Compressor(config)
        self.stats = {"writes": 0, "fsyncs": 0, "frames": 0, "records": 0}
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"streamlog-writer-{partition.name}")
        self._thread.start()

    @property
    def failed(self) -> BaseException | None:
        """The error that failed the partition (sticky), or None."""
        return self.partition.state.failed

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

    def offer(self, piece, waiter, loop: asyncio.AbstractEventLoop, retry) -> bool:
        """Queue `piece` from an event loop without waiting: False (nothing queued)
        while the in-flight window is full, and `retry()` runs on the loop once the
        writer has taken some."""
        pending = Pending([piece], waiter, piece.nbytes)
        with self._cond:
            if not self._full(pending) or self._closing or self.failed is not None:
                self._enqueue_locked(pending)
                return True
            future = loop.create_future()
            future.add_done_callback(lambda _: retry())
            self._space_waiters.append((loop, future))
            return False

    def _full(self, pending: Pending) -> bool:
        if not self._queue:
            return False  # an oversize append still goes through, alone
        return (len(self._queue) >= self.config.inflight_appends_max
                or self._queued_bytes + pending.nbytes > self.config.inflight_bytes_max)

    def _enqueue_locked(self, pending: Pending) -> None:
        if isinstance(self.failed, UnknownStream):
            raise UnknownStream(str(self.failed))
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
        coalesce.hand_over(self.singles)
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
            self._guarded(self._sync_at_close)

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
            error = UnknownStream(str(self.failed)) if isinstance(
                self.failed, UnknownStream) else PartitionFailed(
                f"partition {self.partition.name} failed: {self.failed}")
            resolve_waiters([(p.waiter, None, error) for p in group])
            return
        if group[-1].job is not None:
            appends, job = group[:-1], group[-1]
        else:
            appends, job = group, None
        if appends:
            try:
                results = self._commit(appends)
            except UnknownStream as error:  # deleted (mark_deleted made it sticky)
                resolve_waiters([(p.waiter, None, error) for p in group])
                return
            except BaseException as error:  # noqa: BLE001 - sticky failure, see above
                self._fail(error)
                failure = PartitionFailed(f"write failed: {error}")
                resolve_waiters([(p.waiter, None, failure) for p in group])
                return
            self._acknowledge(results, sum(p.nbytes for p in appends))
        if job is not None:
            try:
                before = self.partition.state.end_offset
                done = [(job.waiter, job.job(), None)]
                if self.partition.state.end_offset == before:
                    resolve_waiters(done)  # wrote nothing: nothing for the store to hold
                else:
                    self._acknowledge(done, 0)
            except OSError as error:  # an I/O error is as sticky here as in an append
                self._fail(error)
                resolve_waiters([(job.waiter, None, PartitionFailed(f"I/O failed: {error}"))])
            except BaseException as error:  # noqa: BLE001 - handed to the caller
                resolve_waiters([(job.waiter, None, error)])

    def _acknowledge(self, results: list, nbytes: int) -> None:
        """Resolve the waiters of what was just committed: now, or, under durability
        "remote", once the store holds it (remote/group_commit.py's gate)."""
        gate = self.partition.ack_gate
        if gate is None:
            resolve_waiters(results)
        else:
            gate.hold(self.partition.name, self.partition.state.end_offset, results, nbytes)

    def _guarded(self, action) -> None:
        try:
            action()
        except UnknownStream:
            pass  # deleted by another process: nothing more is written (mark_deleted)
        except OSError as error:
            self._fail(error)

    def _fail(self, error: BaseException) -> None:
        log.error("partition %s failed: %s", self.partition.name,
                  error if str(error) else type(error).__name__,
                  exc_info=not isinstance(error, OSError))
        self.partition.publish(failed=error)
        with self._cond:
            self._cond.notify_all()

    def _commit(self, group: list[Pending]) -> list:
        """The writer loop's one commit, every step of it here: lock (and catch up),
        encode, roll, write, fsync, index, publish, tail. Returns the waiters' results."""
        part = self.partition
        with part.exclusive:  # the commit lock; first takes in other processes' writes
            state = part.state
            encoded = encode_commit([p.pieces for p in group], state.end_offset,
                                    state.hwm_us, self.config, self._compressor)
            roll_if_due(part, encoded.nbytes)
            state = part.state
            segment, position = state.segments.active, state.active_position
            assert segment.size_bytes == position
            written_at = segment.append(encoded.buffers)
            assert written_at == position
            self.stats["writes"] += 1
            end = position + encoded.nbytes
            recovery = None
            if self.config.fsync is FsyncPolicy.ALWAYS:
                segment.fsync()
                self.stats["fsyncs"] += 1
                recovery = recovery_point(state._replace(
                    end_offset=encoded.next_offset, hwm_us=encoded.hwm_us,
                    active_position=end))
            else:
                self._dirty = True
            entries, events, batches = [], [], []
            for frame in encoded.frames:
                entries.append(frame.index_entry(segment.base_offset, position))
                events += frame.events
                batches.append((frame.base_offset, frame.tail_columns(position),
                                frame.hwm_before))
                position += frame.nbytes
            part.index.put(entries, recovery, events)  # persist, then forward
            part.publish_end(encoded.next_offset, encoded.hwm_us, end)
            part.ring.publish(batches, encoded.next_offset)
        self.stats["frames"] += len(encoded.frames)
        self.stats["records"] += encoded.next_offset - state.end_offset
        return [(pending.waiter, first, None) for pending, first in zip(group, encoded.firsts)]

    def write_from_job(self, pieces: list[Piece]) -> int:
        """Append from inside a job already running on the writer thread."""
        assert threading.current_thread() is self._thread
        ((_, first, _),) = self._commit([Pending(pieces, None, sum(p.nbytes for p in pieces))])
        return first

    def _sync_interval(self) -> None:
        sync_active(self.partition)
        self._dirty = False
        self._last_fsync = self.partition.clock.monotonic_s()
        self.stats["fsyncs"] += 1

    def _sync_at_close(self) -> None:
        if self.partition.state.segments:
            sync_active(self.partition)
        self.partition.index.sync()


def roll_if_due(part, incoming_bytes: int, *, age_max_s: float | None = None) -> bool:
    """Writer, under the commit lock: seal the active segment and start the next one
    when `incoming_bytes` would make it too big, or it is older than `age_max_s` (by
    default the config's segment_age_max_s). An empty segment never rolls. Returns
    True when it rolled."""
    state, config = part.state, part.config
    segment = state.segments.active
    if segment.size_bytes == 0:
        return False
    age_max_s = config.segment_age_max_s if age_max_s is None else age_max_s
    too_big = segment.size_bytes + incoming_bytes > config.segment_bytes_max
    too_old = part.clock.monotonic_s() - segment.created_monotonic > age_max_s
    if not (too_big or too_old):
        return False
    segment.fsync()  # a sealed segment is always durable, whatever the policy
    segment.seal(part.clock.wall_us(), state.end_offset)
    new = Segment(part.fileio, part.directory, state.end_offset, writable=True, create=True,
                  clock=part.clock)
    part.fileio.fsync_dir(part.directory)
    part.publish(segments=state.segments.rolled(new), active_position=0)
    part.index.set_recovery_point(recovery_point(part.state))
    return True


def sync_active(part) -> None:
    """fsync the active segment and record the recovery point (policy `interval`, and
    at close)."""
    with part.exclusive:
        part.state.segments.active.fsync()
        part.index.set_recovery_point(recovery_point(part.state))


def _wake(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
