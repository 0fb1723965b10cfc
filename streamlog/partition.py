"""One partition's owner: its state, its faces to the log and to readers.

Strategy: a partition's whole state is one immutable value (state.py: offsets, marks,
segments, where the end is, damage, truncations, failure), replaced in one assignment by
`publish`, the only place it is written, by the writer thread (appender.py) or a
read-only view's refresh. Everyone else reads whichever value they took, through a
`view.View`. The work is in modules of its own, each a set of functions over the state:

    opening.py     taking the partition in from its files (recovery under the lock)
    appender.py    the writer thread: group commit, the whole loop of a commit
    catchup.py     the commit lock, and taking in what other writer processes did
    txn_jobs.py    transactions' decisions, as jobs on the writer thread
    refresh.py     a read-only view following a writer in another process
    maintenance.py truncate_after and retention (their file work, crash-safe)

What the rest of the library sees is narrow: the log's side (`submit`, `submit_async`,
`append_one`, `run_job`, the jobs), the readers' side (`state`, `view`, `ring`, holds,
`poll`) and closing. Nothing above the storage core gets a Partition (ARCHITECTURE.md).

States (`status`): "open"; "failed" (a write or fsync failed: appends are refused until
the log is reopened, reads go on); "closed".
"""

from __future__ import annotations

import asyncio
import threading

from . import catchup, coalesce, holds, maintenance, opening, refresh, txn_jobs
from .appender import Appender, Pending, Waiter, roll_if_due
from .clock import SYSTEM_CLOCK
from .config import LogConfig
from .errors import (InvalidArgument, LogClosed, OffsetOutOfRange, PartitionFailed, ReadOnlyLog,
                     UnknownStream)
from .index_storage import LmdbIndexStorage
from .locks import PartitionLock
from .recovery import PartitionRecovery
from .segments import Segments
from .state import PartitionState, after_cut
from .tail import TailRing
from .view import View


class Partition:
    def __init__(self, directory: str, name: str, number: int, config: LogConfig,
                 fileio, *, readonly: bool, progress=None, probe_unsealed=lambda: True,
                 clock=SYSTEM_CLOCK, alone: bool = True, index_storage=None,
                 on_deleted=None, decided=None) -> None:
        """`alone`: no other process has the log open for writing (then a transaction
        left open is a crashed writer's orphan, and is aborted, or committed when
        `decided` ({txn_id: COMMIT value}) names it: txn_decisions.py). `index_storage`: where
        the index lives instead of LMDB files (see index.Index). `on_deleted()`: called
        when its stream is found deleted (mark_deleted)."""
        self.directory = directory
        self.name = name
        self.number = number
        self.config = config
        self.fileio = fileio
        self.readonly = readonly
        self.probe_unsealed = probe_unsealed
        # LMDB files through this partition's FileIO unless told otherwise
        self.index_storage = index_storage or LmdbIndexStorage(fileio)
        self.clock = clock
        self._state = PartitionState(0, 0, None, None, Segments())
        # Transactions this process appended data under (their index state is its own).
        self.txns_written_here: set[int] = set()
        self.closed = False
        self.deleted = False  # its stream was deleted (mark_deleted)
        self.on_deleted = on_deleted
        self._reader_holds: dict[int, int] = {}
        self._holds_lock = threading.Lock()
        self.exclusive = catchup.Exclusive(self)  # the commit lock (catchup.py)
        self.layout: int | None = None  # the segment-set generation last known here
        # A view: one refresh at a time in this process (refresh.py); `stale` once it
        # cannot follow the files in place and the Log must open the partition again.
        self.refresh_lock = threading.Lock()
        self.stale = False
        # A view: (segment base, position, header checksum) of its last frame; the
        # segments retention removed that a reader here may still be reading.
        self.end_frame: tuple[int, int, int] | None = None
        self.removed: list = []
        if not readonly:
            fileio.makedirs(directory)
        self.index_problem: str | None = None
        self.index = opening.open_index(self)
        self.report = PartitionRecovery()
        self.lock = PartitionLock(fileio, directory, writable=not readonly)
        try:
            self.lock.acquire(exclusive=not readonly)  # no other process mid-commit
            try:
                if not readonly:
                    self.lock.bump()
                opening.load(self, progress)
                self.lock.settle()
                if not readonly:
                    catchup.leave_tail(self)
                else:
                    self.end_frame = refresh.end_frame_now(self)
            finally:
                self.lock.release()
        except BaseException:
            self._close_files()
            raise
        self.ring = TailRing(batches_max=config.tail_ring_batches_max,
                             bytes_max=config.tail_ring_bytes_max)
        self.ring.end_offset = self._state.end_offset
        # durability "remote": the gate that holds acks until the store has the records
        # (remote/group_commit.py; set by the Log)
        self.ack_gate = None
        self.appender = None if readonly else Appender(self, config)
        if not readonly and alone:
            txn_jobs.abort_orphans(self, decided or {})

    # -- the state: read by anyone, written here only -------------------------------

    @property
    def state(self) -> PartitionState:
        """The partition as readers see it now: an immutable value."""
        return self._state

    def publish(self, **changes) -> None:
        """Writer (or a view's refresh): replace the state, in one assignment. A writer
        that changes the segment set starts a new layout generation (locks.py)."""
        self._state = self._state._replace(**changes)
        if "segments" in changes and self.lock.held and not self.readonly:
            self.layout = self.lock.next_layout()

    def publish_end(self, end_offset: int, hwm_us: int | None, position: int) -> None:
        """`publish` for the common case, a commit (built field by field: faster than
        _replace, and a commit does it every time)."""
        now = self._state
        self._state = PartitionState(now.start_offset, end_offset, hwm_us, now.start_hwm_us,
                                     now.segments, position, now.end_segment, now.damage,
                                     now.generation, now.cuts, now.failed)

    @property
    def end_offset(self) -> int:
        """The acknowledged end: the offset the next record appended here gets."""
        return self._state.end_offset

    @property
    def start_offset(self) -> int:
        return self._state.start_offset

    @property
    def segments(self) -> Segments:
        return self._state.segments

    def view(self) -> View:
        return View(self._state, self.index, self.name, self.config.read_chunk_bytes)

    # -- the log's side: appends and jobs on the writer thread ----------------------

    def _writer(self) -> Appender:
        if self.closed:
            raise LogClosed(f"partition {self.name} is closed")
        if self.appender is None:
            raise ReadOnlyLog("the log was opened read-only")
        return self.appender

    def submit(self, pieces) -> int:
        waiter = Waiter()
        self._writer().submit(Pending(pieces, waiter, sum(p.nbytes for p in pieces)))
        return waiter.wait()

    async def submit_async(self, pieces) -> int:
        waiter = Waiter(asyncio.get_running_loop())
        await self._writer().submit_async(Pending(pieces, waiter, sum(p.nbytes for p in pieces)))
        return await waiter.future

    def append_one(self, timestamp_us: int, key, value, nbytes: int) -> asyncio.Future:
        """From an event loop: one plain record, batched per turn (coalesce.py)."""
        return coalesce.append(self._writer(), timestamp_us, key, value, nbytes)

    def submit_then(self, pieces, waiter) -> None:
        """Queue without waiting: the writer thread resolves `waiter` (Log.submit_then)."""
        self._writer().submit(Pending(pieces, waiter, sum(p.nbytes for p in pieces)))

    def run_job(self, job):
        """Run `job()` on the writer thread between appends; return its result."""
        return self.start_job(job).wait()

    def start_job(self, job) -> Waiter:
        """Queue `job()` for the writer thread; the Waiter's wait() gives its result."""
        waiter = Waiter()
        self._writer().submit(Pending([], waiter, 0, job))
        return waiter

    def end_txn(self, txn_id: int, kind, value: bytes = b"") -> int:
        return txn_jobs.end_txn(self, txn_id, kind, value)

    def init_producer(self, transactional_id: str) -> int:
        return txn_jobs.init_producer(self, transactional_id)

    def begin_txn(self, transactional_id: str, epoch: int) -> int:
        return txn_jobs.begin_txn(self, transactional_id, epoch)

    def check_appendable(self, txn_id: int) -> None:
        txn_jobs.check_appendable(self, txn_id)

    def truncate_after(self, offset: int) -> int:
        """Forget every record after `offset` (keep offsets <= offset). Crash-safe: an
        intent file holding the new tail frame is made durable first, and recovery
        finishes the job if a crash interrupts it. Returns the new end offset."""
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise InvalidArgument("offset must be an int")
        return self.run_job(lambda: self._truncate_job(offset + 1))

    def _truncate_job(self, new_end: int) -> int:
        with self.exclusive:
            state = self._state
            if new_end >= state.end_offset:
                return state.end_offset
            if new_end < state.start_offset:
                raise OffsetOutOfRange(f"cannot truncate {self.name} before its start "
                                       f"offset {state.start_offset}")
            state.segments.active.fsync()
            entry = self.index.lookup_offset(new_end)
            assert entry is not None
            intent = maintenance.truncate_intent(entry, new_end,
                                                 self.view().read_batch(entry))
            maintenance.write_intent(self.fileio, self.directory, intent)
            opening.apply_intent(self, intent)
            self.publish(**after_cut(self._state, self._state.end_offset))
            self.ring.reset(self._state.end_offset)
            txn_jobs.abort_reopened(self)
            self.index.sync()  # the index runs without sync; make this change stick
            return self._state.end_offset

    def roll_if_older(self, age_s: float) -> bool:
        """Seal the active segment when it holds records and is older than `age_s`,
        appends or not (a job on the writer thread: a tiered log's store lags by at most
        that). Returns True when it rolled."""
        def job() -> bool:
            with self.exclusive:
                return roll_if_due(self, 0, age_max_s=age_s)
        return self.run_job(job)

    def apply_retention(self, now_us: int) -> list[str]:
        """Delete whole sealed segments past the age or size bound; never one holding an
        offset a reader holds. Returns the deleted paths."""
        return self.run_job(lambda: self._retention_job(now_us))

    def _retention_job(self, now_us: int) -> list[str]:
        with self.exclusive:
            return self._retain(now_us=now_us, bounds=True)

    def _retain(self, *, now_us: int, bounds: bool) -> list[str]:
        """Under the commit lock: delete the whole segments below the start, and, with
        `bounds`, those past the retention bounds (maintenance.apply_retention); take
        the new start in. Returns the deleted paths."""
        state, config = self._state, self.config
        retained = maintenance.apply_retention(
            self.fileio, self.directory, state.segments, self.index,
            retention_age_s=config.retention_age_s if bounds else None,
            retention_bytes=config.retention_bytes if bounds else None,
            hold=self.min_hold(), now_us=now_us, start=state.start_offset,
            start_hwm_us=state.start_hwm_us, chunk_bytes=config.read_chunk_bytes)
        changes = dict(segments=retained.segments,  # (a new layout: see delete_records)
                       start_offset=max(state.start_offset, retained.segments.start_offset))
        if retained.start_hwm_us is not None:
            changes["start_hwm_us"] = retained.start_hwm_us
        self.publish(**changes)
        return retained.deleted

    def delete_records(self, offset: int) -> int:
        """Move the start forward to `offset` (<= the end): the records before it are
        no longer read, durably, and the whole segments below it that no reader here
        holds are deleted. A job on the writer thread (maintenance.py: the start mark
        first, then the files). Returns the new start offset (the old one when
        `offset` is not past it)."""
        return self.run_job(lambda: self._delete_records_job(offset))

    def _delete_records_job(self, offset: int) -> int:
        with self.exclusive:
            state = self._state
            if offset > state.end_offset:
                raise OffsetOutOfRange(f"cannot delete the records of {self.name} before "
                                       f"offset {offset}: it ends at {state.end_offset}")
            if offset <= state.start_offset:
                return state.start_offset
            state.segments.active.fsync()  # the mark never names records a crash loses
            hwm_us = maintenance.hwm_before(self.view(), offset)
            maintenance.write_start(self.fileio, self.directory, offset, hwm_us)
            self.publish(start_offset=offset, start_hwm_us=hwm_us)
            self._retain(now_us=self.clock.wall_us(), bounds=False)
            self.index.sync()
            return self._state.start_offset

    def mark_deleted(self, *, by_another: bool = False) -> None:
        """Its stream was deleted: appends are refused with UnknownStream from now on,
        and a reader that reaches the end gets it (after what was there to read);
        followers are woken. `by_another`: another process deleted it, found under the
        commit lock: raises the UnknownStream (nothing more is written)."""
        stream = self.name.rpartition("/")[0]
        error = UnknownStream(f"stream {stream!r} was deleted"
                              + (" by another process" if by_another else ""))
        self.deleted = True
        self.publish(failed=error, damage=(self._state.end_offset, error))
        self.ring.close()
        if self.on_deleted is not None:
            self.on_deleted()
        if by_another:
            raise error

    # -- the readers' side: holds, and taking in what other processes wrote ---------

    def hold(self, token: int, offset: int) -> None:
        with self._holds_lock:
            self._reader_holds[token] = offset

    def release(self, token: int) -> None:
        with self._holds_lock:
            self._reader_holds.pop(token, None)

    def lowest_reader_hold(self) -> int | None:
        """The lowest offset a reader in this process holds (None: no reader)."""
        with self._holds_lock:
            return min(self._reader_holds.values(), default=None)

    def min_hold(self) -> int | None:
        """The lowest offset held by a reader in this process or by a durable hold."""
        held = [h for h in (self.lowest_reader_hold(),
                            holds.lowest(self.fileio, self.directory)) if h is not None]
        return min(held, default=None)

    def poll(self) -> bool:
        """Take in what other processes appended, now (a follower in this process calls
        it while it waits at the end): a job on the writer thread, or, in a view, a
        refresh when the commit lock's counter says a writer was here. Any thread.
        Returns True when the end moved."""
        if self.closed:
            return False
        if self.readonly:
            with self.refresh_lock:
                return refresh.poll(self)
        before = self._state.end_offset
        try:
            self.run_job(lambda: catchup.poll_job(self))
        except (LogClosed, ReadOnlyLog, PartitionFailed, UnknownStream):
            return False  # a closed, failed or deleted partition takes nothing more in
        return self._state.end_offset != before

    def refresh(self) -> bool:
        """Read-only: take in what writers (other processes) added since this view was
        made or last refreshed. False when the view cannot follow (refresh.py): the
        partition is then `stale`, and the Log opens it again. Any thread."""
        assert self.readonly
        with self.refresh_lock:
            return refresh.refresh(self)

    def retire(self) -> None:
        """A view the Log has opened again: its followers move to the new one (Reader);
        wake them now. The Log closes it once no reader holds it (close_if_idle)."""
        assert self.readonly
        self.stale = True
        self.ring.close()

    def close_if_idle(self) -> bool:
        """Close unless a reader (on any thread) holds it; True when closed."""
        idle = self.lowest_reader_hold() is None
        if idle:
            self.close()
        return idle

    # -- closing --------------------------------------------------------------------

    @property
    def status(self) -> str:
        return ("closed" if self.closed else "failed" if self._state.failed is not None
                else "open")

    def stop_writing(self) -> None:
        """Drain the queued appends, fsync, stop the writer thread. Idempotent."""
        if self.appender is not None:
            self.appender.close()

    def close(self, *, seal: bool = True) -> None:
        """`seal`: this was the log's last writer process (the index is sealed)."""
        if self.closed:
            return
        self.stop_writing()
        with self.refresh_lock:  # (a view's follower may be refreshing it on its thread)
            self.closed = True
            self.ring.close()
            for segment in self.removed:
                segment.close()
            self._close_files(clean=seal)

    def _close_files(self, *, clean: bool = False) -> None:
        for segment in self._state.segments:
            segment.close()
        # (a failed partition's index is not sealed: its file system refused a write,
        # and the next open checks the index against the segments anyway)
        self.index.close(seal=clean and not self.readonly and self._state.failed is None)
        self.lock.close()

    def size_bytes(self) -> int:
        return self._state.segments.size_bytes()
