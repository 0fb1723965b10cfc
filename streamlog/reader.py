"""Replay and follow: records and Arrow batches from an offset or a timestamp.

Strategy: one loop (`_slices`) yields (columns, lo, hi) row ranges of batches in offset
order, taking each batch from the live-tail ring when it is there and from the segments
(large sequential chunks) otherwise. At the acknowledged end it returns, or, when
following, waits for more (below). `records()` and `arrow()` only format those
slices. The async iterators use the same loop and await the tail instead of blocking
the event loop.

Following: at the acknowledged end the reader waits on the partition's tail ring, which
this process's writer (or a view's refresh) wakes, and every poll interval asks the
partition to take in what writers in other processes appended (`Partition.poll`: a job
on the writer thread; in a read-only view, a refresh when the commit lock's counter
moved). A view's partition that cannot follow the files in place (a writer truncated
it, or created it after the view looked) is opened again by the Log, and the follower
goes on in the new one from its position, as a follower in a writer's process goes on
after a truncate: OffsetOutOfRange when records it passed were cut, else on with what
is there now.

Range rules (DESIGN 5 and 10): the start is inclusive, the end exclusive; a timestamp
bound is resolved by the high-water mark (running max timestamp), so `from_timestamp_us=T`
starts at the first record whose high-water mark is >= T and `to_timestamp_us=T` stops
before it.

A Reader is used by one thread or task at a time. It holds its position against
retention until closed.
"""

from __future__ import annotations

import itertools
import weakref

import numpy as np

from .errors import CorruptFrame, CorruptSegment, LogClosed, OffsetOutOfRange
from .payload import Columns, columns_to_records, decode_columns, running_max
from .records import RecordKind
from .state import lowest_cut_since
from .waits import poll_interval
from .txn import TxnState

_tokens = itertools.count(1)
# What Reader.slices() yields instead of a slice when a follower is at the acknowledged
# end: wait (Reader.wait / wait_async), then go on. A reader that does not follow never
# yields it.
WAIT = object()


class Reader:
    def __init__(self, partition, *, start_offset: int, stop_offset: int | None = None,
                 start_timestamp_us: int | None = None,
                 stop_timestamp_us: int | None = None, follow: bool = False,
                 data_only: bool = True, read_committed: bool = True,
                 stream: str | None = None, reopen=None) -> None:
        """`reopen(partition)`: a view's Log gives it; it returns the partition as the
        view has it now, opened again when the given one is stale (see the module
        docstring). None for a writable log, whose partitions are never replaced."""
        partition.view().check_offset(start_offset)
        self.partition = partition
        self.stream = stream
        self.next_offset = start_offset
        self.stop_offset = stop_offset
        self.stop_timestamp_us = stop_timestamp_us
        # Still to be reached by the high-water mark (a follower that started at the end
        # skips records whose running max is below it); None once reached.
        self.start_timestamp_us = start_timestamp_us
        self._generation = partition.state.generation
        self.follow = follow
        self.data_only = data_only
        self.read_committed = read_committed
        self._txn_states: dict[int, object] = {}
        self._blocked_at: int | None = None  # end offset when an open txn blocked us
        # read_committed: the last stable offset as of this pass; nothing at or after it
        # is delivered (the first record of the oldest open transaction is there).
        self._stable: int | None = None
        self._stable_at: int | None = None  # the end offset _stable was computed at
        self.done = False
        self._token = next(_tokens)
        self._hwm: int | None = None
        self._hwm_known = False
        self.reopen = reopen
        # A view's reader: (offset, batch base offset, timestamp, value length, txn id)
        # of the last record it went past, to tell after a reopen whether it was cut.
        self._passed: tuple[int, int, int, int, int] | None = None
        partition.hold(self._token, start_offset)
        # An abandoned reader must not hold retention back forever.
        self._finalizer = weakref.finalize(self, partition.release, self._token)

    # -- public iteration -----------------------------------------------------------

    def records(self):
        """Records from the start to the end (or forever, when following): an iterator
        chained in C over each batch's records, no Python frame per record."""
        number, data_only = self.partition.number, self.data_only
        return itertools.chain.from_iterable(
            columns_to_records(columns, number, lo, hi, data_only)
            for columns, lo, hi in self._slices_sync())

    def arrow(self, *, include_headers: bool = False):
        """pyarrow.RecordBatch per log batch (columns partition, offset, timestamp, key,
        value[, headers]); control records removed when reading data only."""
        from .arrowconv import columns_to_arrow
        for columns, lo, hi in self._slices_sync():
            batch = columns_to_arrow(columns, self.partition.number, lo, hi,
                                     data_only=self.data_only, include_headers=include_headers)
            if batch.num_rows:
                yield batch

    def __iter__(self):
        return self.records()

    async def arecords(self):
        async for columns, lo, hi in self._slices_async():
            for record in columns_to_records(columns, self.partition.number, lo, hi,
                                             self.data_only):
                yield record

    def __aiter__(self):
        return self.arecords()

    def close(self) -> None:
        self.done = True
        self.partition.release(self._token)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the loop -------------------------------------------------------------------

    def slices(self):
        """The raw loop for servers that ship columns as they are: yields (columns, lo,
        hi) row ranges, or the WAIT sentinel when following at the end (then await
        `reader.wait_async()`)."""
        return self._slices()

    def check_position(self) -> None:
        """For a server that keeps rows this reader gave out, to send them later: they
        are still the partition's while this raises nothing. Raises OffsetOutOfRange
        when the partition was truncated below this reader's position since it last
        read (as the next read would), UnknownStream when its stream was deleted (the
        name may hold a new stream now), LogClosed when the partition was closed."""
        partition = self.partition
        if partition.closed:
            raise LogClosed(f"{partition.name} was closed")
        if partition.deleted:
            raise partition.state.damage[1]
        self._check_truncated()

    def wait_offset(self) -> int:
        return self._wait_offset()

    def _wait_offset(self) -> int:
        return self.next_offset if self._blocked_at is None else self._blocked_at

    def wait(self) -> None:
        """Following at the end: wait until there may be more (a batch published by
        this process's writer, or, polled, one appended by another process).
        Raises LogClosed when the log was closed, OffsetOutOfRange when a view's
        partition was truncated under what this reader passed."""
        partition = self.partition
        if not partition.ring.wait(self._wait_offset(), timeout=poll_interval(partition)):
            partition.poll()
        if partition.closed or partition.stale:
            self._go_on_reopened()

    async def wait_async(self) -> None:
        """`wait` for an event loop."""
        import asyncio
        partition = self.partition
        if not await partition.ring.wait_async(self._wait_offset(), poll_interval(partition)):
            # (a view's look is a memory read when no writer has been here)
            if not partition.readonly or partition.lock.moved() or (
                    partition.lock.handle is None):
                await asyncio.to_thread(partition.poll)
        if partition.closed or partition.stale:
            await asyncio.to_thread(self._go_on_reopened)

    def _go_on_reopened(self) -> None:
        """The partition was closed, or is a view's that cannot follow its files: go
        on in the one the view has now (opened again), from this reader's position."""
        if self.reopen is None:  # a writable log's partition closes with the log
            raise LogClosed("the log was closed while following it")
        old = self.partition
        new = self.reopen(old)  # LogClosed when the log was closed
        assert new is not old
        self._finalizer.detach()
        old.release(self._token)
        new.hold(self._token, self.next_offset)
        self._finalizer = weakref.finalize(self, new.release, self._token)
        self.partition = new
        self._generation = new.state.generation
        self._forget_txns()
        self._check_passed_still_there(new)

    def _check_passed_still_there(self, partition) -> None:
        """After a reopen: OffsetOutOfRange when the partition was cut before this
        reader's position, as `_check_truncated` says in a writer's process. The cut
        itself is not known here (the writer may have appended past it again), so the
        last record this reader went past is looked at where it was."""
        if partition.end_offset < self.next_offset:
            raise OffsetOutOfRange(
                f"{partition.name} was truncated to end at offset {partition.end_offset}"
                f", before this reader's position {self.next_offset}")
        if self._passed is None or self._passed[0] < partition.start_offset:
            return  # nothing passed yet, or retention removed it (it was not cut)
        offset, base, timestamp_us, value_bytes, txn_id = self._passed
        _, columns = partition.view().batch_holding(offset)
        row = offset - columns.base_offset
        assert 0 <= row < len(columns)
        if (columns.base_offset, int(columns.timestamps_us[row]),
                int(columns.value_lengths[row]), columns.txn_id) != (
                base, timestamp_us, value_bytes, txn_id):
            raise OffsetOutOfRange(
                f"{partition.name} was truncated before this reader's position "
                f"{self.next_offset} (at or before offset {offset}) and written again")

    def _forget_txns(self) -> None:
        """Transaction states may have changed under a cut (markers removed)."""
        self._stable_at = None
        self._blocked_at = None
        self._txn_states = {}

    def _note_passed(self, columns: Columns) -> None:
        """A view's reader went past rows of `columns` up to next_offset."""
        if self.reopen is None:
            return  # (a writer's process learns the cut itself: _check_truncated)
        row = self.next_offset - 1 - columns.base_offset
        if 0 <= row < len(columns):
            self._passed = (self.next_offset - 1, columns.base_offset,
                            int(columns.timestamps_us[row]),
                            int(columns.value_lengths[row]), columns.txn_id)

    def _slices_sync(self):
        for item in self._slices():
            if item is WAIT:
                self.wait()
                continue
            yield item

    async def _slices_async(self):
        for item in self._slices():
            if item is WAIT:
                await self.wait_async()
                continue
            yield item

    def _slices(self):
        """Yield (columns, lo, hi) slices, or WAIT when following at the end."""
        # A generator dropped half-way does not close the reader (it may be iterated
        # again); the Reader's finalizer releases the hold once it is garbage.
        yield from self._slices_loop()
        self.close()

    def _check_damage(self) -> None:
        """A read-only open that found damaged acknowledged data ends the partition
        there; a reader that gets there raises it rather than stopping quietly."""
        damage = self.partition.state.damage
        if damage is not None and self.next_offset >= damage[0] and (
                self.stop_offset is None or self.stop_offset > damage[0]):
            raise damage[1]

    def _check_truncated(self) -> None:
        partition = self.partition
        state = partition.state
        if state.generation == self._generation:
            return
        cut = lowest_cut_since(state, self._generation)
        self._generation = state.generation
        self._forget_txns()  # transactions may have been reopened by the cut
        if self.next_offset > cut:
            raise OffsetOutOfRange(f"{partition.name} was truncated to end at offset {cut}, "
                                   f"before this reader's position {self.next_offset}")

    def _slices_loop(self):
        while not self.done:
            partition = self.partition  # (a view's follower may have moved to a new one)
            self._check_truncated()
            if self.stop_offset is not None and self.next_offset >= self.stop_offset:
                break
            if self.next_offset >= partition.end_offset:
                self._check_damage()
                if not self.follow or partition.closed:
                    break
                yield WAIT
                continue
            if self._blocked_at is not None:
                if not self.follow:
                    break
                if partition.end_offset <= self._blocked_at:
                    yield WAIT
                    continue
                self._blocked_at, self._txn_states = None, {}
            if self.read_committed:
                end = partition.end_offset
                if self._stable_at != end:  # it moves only with appends (and truncates)
                    self._stable, self._stable_at = partition.view().last_stable_offset(), end
                if self.next_offset >= self._stable:  # an open transaction starts here
                    self._blocked_at = partition.end_offset
                    continue
            found = partition.ring.find(self.next_offset)
            if found is not None:
                base, columns, hwm_before = found
                yield from self._visible(columns, hwm_before)
                continue
            for frame in partition.view().disk_frames(self.next_offset):
                if partition.state.generation != self._generation:
                    break  # the chunk this frame came from may be older than the cut
                if frame.next_offset <= self.next_offset:
                    continue
                yield from self._visible(_decode(partition, frame), None)
                if self.done or self._blocked_at is not None or partition.ring.find(
                        self.next_offset) is not None:
                    break
                if self.stop_offset is not None and self.next_offset >= self.stop_offset:
                    break  # do not read (and judge) frames past the bound
                if self._stable is not None and self.next_offset >= self._stable:
                    break

    def _visible(self, columns: Columns, hwm_before):
        """Apply read_committed to a batch: emit it, skip it (aborted), or stop before
        it (its transaction is still open: the last stable offset)."""
        txn_id = columns.txn_id
        if txn_id == 0 or not self.read_committed:
            yield from self._emit(columns, hwm_before)
            return
        state = self._txn_states.get(txn_id)
        if state is None:
            state = self._txn_states[txn_id] = self.partition.view().txn_state(
                txn_id, seen_at=columns.base_offset)
        if state is TxnState.COMMITTED:
            yield from self._emit(columns, hwm_before)
        elif state is TxnState.ABORTED:
            self._hwm_known = False
            self.next_offset = columns.base_offset + len(columns)
            if self.stop_offset is not None:
                self.next_offset = min(self.next_offset, self.stop_offset)
            self._note_passed(columns)
        else:
            self._blocked_at = self.partition.end_offset

    def _emit(self, columns: Columns, hwm_before):
        base = columns.base_offset
        lo = self.next_offset - base
        hi = min(len(columns), self.partition.end_offset - base)
        if self._stable is not None:
            hi = min(hi, self._stable - base)
        if self.stop_offset is not None:
            hi = min(hi, self.stop_offset - base)
        if self.stop_timestamp_us is not None or self.start_timestamp_us is not None:
            prior = self._prior_hwm(columns, hwm_before)
            hwm = running_max(columns, prior)
            self._hwm, self._hwm_known = int(hwm[-1]), True
            if self.start_timestamp_us is not None:
                reached = int(np.searchsorted(hwm, self.start_timestamp_us, side="left"))
                if reached >= hi:
                    self.next_offset = base + hi  # nothing here reaches the start yet
                    self._note_passed(columns)
                    return
                lo, self.start_timestamp_us = max(lo, reached), None
            if self.stop_timestamp_us is not None:
                cut = int(np.searchsorted(hwm, self.stop_timestamp_us, side="left"))
                if cut < hi:
                    hi, self.done = max(cut, lo), True
        if hi > lo:
            self.next_offset = base + hi
            self._note_passed(columns)
            self.partition.hold(self._token, self.next_offset)
            yield columns, lo, hi
        elif self.done:
            return

    def _prior_hwm(self, columns: Columns, hwm_before):
        """Running max just before this batch: the ring knows it, a continuing reader
        remembers it, and the first batch read from disk asks the index."""
        if hwm_before is not None:
            return hwm_before
        if self._hwm_known:
            return self._hwm
        return self.partition.view().hwm_before_offset(columns.base_offset)


def is_data(kind: int) -> bool:
    return kind == RecordKind.DATA


def _decode(partition, frame) -> Columns:
    """Columns of a checksummed frame; a payload that does not decode names its spot."""
    try:
        return decode_columns(frame)
    except CorruptFrame as error:
        segment = partition.state.segments.holding(frame.base_offset)
        raise CorruptSegment(segment.path, frame.position, error.reason) from None
