"""One partition's owner: opening and recovery, the writer side, several writer
processes, a read-only view's refresh.

Strategy: the writer thread (appender.py) owns the partition's mutable state; everyone
else reads an immutable `view.Snapshot` (offsets, high-water marks, segments), published
in one assignment after every change, through a `view.View`. Opening runs recovery
(recovery.py) under the partition's commit lock, then starts the writer thread when
writable. Every change to the files (a commit, a roll, truncate_after and retention,
which run as jobs on the writer thread between groups of appends, through
maintenance.py) holds the commit lock (locks.py) and first takes in what writers in
other processes did. A read-only view follows writers with `refresh`, which its
followers call themselves when the commit lock's counter moved (`poll`).

States (`state`): "open"; "failed" (a write or fsync failed: appends are refused until
the log is reopened, reads go on); "closed".

Why one module of ~700 lines: it is the one place that changes the partition's state;
reads live in view.py, file work for truncate and retention in maintenance.py.
"""

from __future__ import annotations

import logging
import os
import threading

from . import holds, maintenance
from .appender import Appender, Pending, Piece, Waiter
from .records import RECORD_OVERHEAD_BYTES, RecordKind
from .txn import (TxnState, encode_begin, encode_commit, encode_epoch, new_txn_id,
                  producer_tag, random_txn_id)
from .clock import SYSTEM_CLOCK
from .config import LogConfig
from . import recovery as recovery_module
from .errors import (CorruptFrame, CorruptIndex, InvalidArgument, LogClosed,
                     OffsetOutOfRange, PartitionFailed, ProducerFenced, ReadOnlyLog)
from .frame import HEADER_BYTES, INCOMPLETE, decode_header
from .index import NO_HWM, Index, IndexEntry, RecoveryPoint
from .layout import DELETED_SUFFIX, SEGMENT_SUFFIX, parse_segment_name
from .seal import SEAL_SUFFIX
from .payload import Columns, decode_columns
from .recovery import PartitionRecovery, recover
from .segment import Segment
from .segments import Segments
from .tail import TailRing
from .view import Snapshot, View
from .locks import PartitionLock

log = logging.getLogger("streamlog.partition")


class Partition:
    def __init__(self, directory: str, name: str, number: int, config: LogConfig,
                 fileio, *, readonly: bool, progress=None, probe_unsealed=lambda: True,
                 clock=SYSTEM_CLOCK, alone: bool = True, index_storage=None) -> None:
        """`alone`: no other process has the log open for writing (then a transaction
        left open is a crashed writer's orphan, and is aborted). `index_storage`: where
        the index lives instead of LMDB files (see index.Index)."""
        self.directory = directory
        self.name = name
        self.number = number
        self.config = config
        self.fileio = fileio
        self.readonly = readonly
        self.probe_unsealed = probe_unsealed
        self.index_storage = index_storage
        self.clock = clock
        # Transactions this process appended data under (their index state is its own).
        self.txns_written_here: set[int] = set()
        self.closed = False
        self._holds: dict[int, int] = {}
        self.truncations: list[int] = []  # new end offsets, one per truncate_after
        self._holds_lock = threading.Lock()
        self._exclusive_depth = 0
        self._exclusive = _Exclusive(self)
        self._layout: int | None = None  # the segment-set generation last known here
        # A view: one refresh at a time in this process (see refresh); `stale` once it
        # cannot follow the files in place and the Log must open the partition again.
        self._refresh_lock = threading.Lock()
        self.stale = False
        # A view: (segment base, position, header checksum) of its last frame; the
        # segments retention removed that a reader here may still be reading.
        self._end_frame: tuple[int, int, int] | None = None
        self._removed: list[Segment] = []
        if not readonly:
            fileio.makedirs(directory)
        self._index_problem: str | None = None
        self.index = self._open_index()
        self._snapshot = Snapshot(0, 0, None, None, Segments())
        self.report = PartitionRecovery()
        self.active_position = 0
        self._end_number = 0
        # Read-only: (offset, CorruptSegment) where acknowledged data is damaged; a
        # reader that reaches the offset raises the error.
        self.damage: tuple[int, object] | None = None
        self.lock = PartitionLock(fileio, directory, writable=not readonly)
        try:
            self.lock.acquire(exclusive=not readonly)  # no other process mid-commit
            try:
                if not readonly:
                    self.lock.bump()
                self._load(progress)
                self.lock.settle()
                if not readonly:
                    self._leave_tail()
                else:
                    self._end_frame = self._end_frame_now()
            finally:
                self.lock.release()
        except BaseException:
            self._close_files()
            raise
        self.ring = TailRing(batches_max=config.tail_ring_batches_max,
                             bytes_max=config.tail_ring_bytes_max)
        self.ring.end_offset = self.next_offset
        self.appender = None if readonly else Appender(self, config)
        if not readonly and alone:
            self._abort_orphans()

    def _load(self, progress=None) -> None:
        """Take the partition in from its files: finish (or, read-only, show as
        finished) an interrupted truncate, open the segments, recover."""
        if not self.readonly:
            self._clean_leftovers()
        try:  # the index was opened before the lock: a writer may have added to it since
            self.index.reload_last()
        except CorruptIndex:
            pass  # recovery finds out, and rebuilds it
        segments = self._open_segments()
        self._publish(segments=segments, start_offset=segments.start_offset)
        # Running max of the records retention removed (None when none were removed).
        self._load_start_hwm()
        if not self.readonly:
            self._finish_intent()
        else:
            self._view_intent()
        if self.segments:
            self._recover(progress)
        if not self.readonly:
            self._forget_removed()

    def _forget_removed(self) -> None:
        """Index entries of segments that are gone (a crash inside retention, after the
        delete reached the disk and before the index heard of it) are dropped; the
        running max of what was removed is in the start marks (maintenance.py), made
        durable before the delete."""
        try:
            first = self.index.first_entry()
            if first is None or first.base_offset >= self.start_offset:
                return
            self.index.drop_before(self.start_offset)
        except CorruptIndex:
            pass  # recovery has judged the index; reads check every entry they use

    def _load_start_hwm(self) -> None:
        """The running max of the records retention removed: the start mark of the
        partition's start (None when nothing was removed). A log retention trimmed
        before start marks existed has it only in its index."""
        if self.start_offset == 0:
            self._publish(start_hwm_us=None)
            return
        try:
            found = maintenance.read_start_marks(self.fileio, self.directory).get(
                self.start_offset)
        except ValueError as error:
            log.warning("%s: seeks by time before the start's first record may start "
                        "late", error)
            found = None
        if found is None:
            try:
                stored = self.index.get_meta("start_hwm")
            except CorruptIndex:
                stored = None
            found = int(stored) if stored else None
        self._publish(start_hwm_us=found)

    def _recover(self, progress) -> None:
        """Run recovery; an index that fails even while being rebuilt is recreated."""
        segments = list(self.segments)  # a writer's recovery may remove later ones
        try:
            state, self.report = recover(segments, self.index, writable=not self.readonly,
                                         chunk_bytes=self.config.read_chunk_bytes,
                                         progress=progress)
        except CorruptIndex as error:
            self._index_problem = str(error)
            log.warning("%s: rebuilding it from the segments", error)
            self.index.close()
            self.index = self._fresh_index()
            state, self.report = recover(segments, self.index, writable=not self.readonly,
                                         chunk_bytes=self.config.read_chunk_bytes,
                                         progress=progress)
        if self._index_problem is not None:
            self.report.rebuilt_index = True
            self.report.index_problem = self.report.index_problem or self._index_problem
        self._publish(segments=Segments(segments), end_offset=state.next_offset,
                      hwm_us=state.hwm_us)
        self.active_position = state.end_position
        self._end_number = state.end_segment  # the segment the view's end is in
        self.damage = state.damage
        if not self.readonly:
            self._rederive_commits()

    def _abort_orphans(self) -> None:
        """Abort transactions that a crashed writer left open (DESIGN 6). The index only
        names candidates: each is confirmed open from the segments first, so no marker
        is ever written on the strength of index data alone."""
        for txn_id, first in sorted(self.open_txn_candidates().items()):
            found = self.derive_txn(txn_id, first)
            if found is not None and found[0] == TxnState.OPEN or (
                    found is None and first < self.start_offset):
                # (the second: retention removed all its data; only its state is left,
                # and it would hold the last stable offset back for good)
                self.append_marker(txn_id, RecordKind.ABORT, b"")

    def append_marker(self, txn_id: int, kind, value: bytes) -> int:
        return self.submit([self._marker_piece(txn_id, kind, value)])

    # -- transactions: each decision taken under the commit lock (txn.py) ------------

    def confirmed_txn_state(self, txn_id: int):
        """TxnState of a transaction (None: no data here). An OPEN that only the index
        says, for a transaction this process wrote none of, is confirmed from the
        segments: no marker is written on the strength of index data alone (DESIGN 4)."""
        state = self.txn_state(txn_id)
        if state is TxnState.OPEN and txn_id not in self.txns_written_here:
            found = self.derive_txn(txn_id, self.txn_first_offset(txn_id))
            state = None if found is None else TxnState(found[0])
        return state

    def end_txn(self, txn_id: int, kind: RecordKind, value: bytes = b"") -> int:
        """Write a transaction's COMMIT or ABORT marker; returns its offset. That it is
        still open (and, for a commit, that its producer was not fenced) is decided on
        the writer thread under the commit lock, after taking in what other processes
        wrote: a marker never races another process's abort or fence."""
        def job() -> int:
            with self.exclusive():
                self._check_open(txn_id)
                if kind == RecordKind.COMMIT:
                    self._check_producer(txn_id)
                return self.appender.write_from_job([self._marker_piece(txn_id, kind, value)])
        return self.run_job(job)

    def init_producer(self, transactional_id: str) -> int:
        """Start a producer with a transactional id: abort the open transactions that
        earlier producers with the id began, write its fence; returns its epoch."""
        def job() -> int:
            with self.exclusive():
                view = self.view()
                pieces = []
                for txn_id in sorted(view.open_txn_candidates()):
                    if self.confirmed_txn_state(txn_id) is not TxnState.OPEN:
                        continue
                    producer = view.producer_of(txn_id)
                    if producer is not None and producer[0] == transactional_id:
                        pieces.append(self._marker_piece(txn_id, RecordKind.ABORT, b""))
                epoch = self.next_offset + len(pieces)  # the fence's own offset
                fence = new_txn_id()
                name = transactional_id.encode()
                pieces.append(Piece([self.clock.wall_us()] * 2, [None, None],
                                    [name, encode_commit(producer_tag(transactional_id),
                                                         encode_epoch(epoch))],
                                    [int(RecordKind.PRODUCER), int(RecordKind.COMMIT)], None,
                                    len(name) + 64 + 2 * RECORD_OVERHEAD_BYTES, fence))
                first = self.appender.write_from_job(pieces)
                assert first + len(pieces) - 1 == epoch
                if len(pieces) > 1:
                    log.info("%s: producer %r (epoch %d) aborted %d open transaction(s) of "
                             "its predecessors", self.name, transactional_id, epoch,
                             len(pieces) - 1)
                return epoch
        return self.run_job(job)

    def begin_txn(self, transactional_id: str, epoch: int) -> int:
        """Open a transaction of the producer (transactional_id, epoch) with its BEGIN
        record; returns the transaction id. ProducerFenced when a later producer with
        the id has started."""
        def job() -> int:
            with self.exclusive():
                self._check_epoch(transactional_id, epoch)
                txn_id, value = random_txn_id(63), encode_begin(transactional_id, epoch)
                self.txns_written_here.add(txn_id)
                self.appender.write_from_job([Piece(
                    [self.clock.wall_us()], [None], [value], [int(RecordKind.BEGIN)], None,
                    len(value) + RECORD_OVERHEAD_BYTES, txn_id)])
                return txn_id
        return self.run_job(job)

    def check_appendable(self, txn_id: int) -> None:
        """Before an append under a transaction this process did not begin here: it
        must not have ended (a fenced producer's were aborted). Checked ahead of the
        write: an append that races an abort lands after the marker, where no reader
        ever sees it (the first marker decides a transaction's state)."""
        state = self.txn_state(txn_id)
        if state is None or state is TxnState.OPEN:
            return
        self._check_producer(txn_id)
        raise InvalidArgument(f"transaction {txn_id:#x} is {state.name.lower()} in "
                              f"{self.name}: nothing more can be appended to it")

    def _check_open(self, txn_id: int) -> None:
        state = self.confirmed_txn_state(txn_id)
        if state is not TxnState.OPEN:
            if state is not None:
                self._check_producer(txn_id)  # a fenced one's: say so
            what = "has no data" if state is None else f"is {state.name.lower()}"
            raise InvalidArgument(f"transaction {txn_id:#x} {what} in {self.name}")

    def _check_producer(self, txn_id: int) -> None:
        """ProducerFenced when a producer began the transaction and has been fenced."""
        producer = self.view().producer_of(txn_id)
        if producer is not None:
            self._check_epoch(*producer)

    def _check_epoch(self, transactional_id: str, epoch: int) -> None:
        latest = self.view().producer_epoch(transactional_id)
        if latest is not None and epoch != latest:
            raise ProducerFenced(
                f"producer {transactional_id!r} of {self.name} with epoch {epoch} was "
                f"fenced: a producer with the same transactional id started at epoch "
                f"{latest} and aborted this one's open transactions")

    def _marker_piece(self, txn_id: int, kind, value: bytes) -> Piece:
        return Piece([self.clock.wall_us()], [None], [value], [int(kind)], None,
                     len(value) + RECORD_OVERHEAD_BYTES, txn_id)

    # -- opening --------------------------------------------------------------------

    def _clean_leftovers(self) -> None:
        names = self.fileio.listdir(self.directory)
        for name in names:
            segment = name[:-len(SEAL_SUFFIX)] + SEGMENT_SUFFIX
            orphan_seal = name.endswith(SEAL_SUFFIX) and parse_segment_name(segment) is not None \
                and segment not in names
            if name.endswith(DELETED_SUFFIX) or name.endswith(".tmp") or orphan_seal:
                self.fileio.unlink(os.path.join(self.directory, name))

    def _open_index(self) -> Index:
        path = os.path.join(self.directory, "index")
        try:
            return Index(path, readonly=self.readonly, map_bytes=self.config.index_map_bytes,
                         probe_unsealed=self.probe_unsealed, storage=self.index_storage)
        except CorruptIndex as error:
            self._index_problem = str(error)
            log.warning("%s: rebuilding it from the segments", error)
            return self._fresh_index()

    def _fresh_index(self) -> Index:
        """An empty index: in memory for a read-only open (no file is touched), else
        the damaged files removed (a cache: rebuilt from the segments) and recreated."""
        if self.readonly:
            return Index(os.path.join(self.directory, "no-index"), readonly=True,
                         map_bytes=self.config.index_map_bytes, storage=self.index_storage)
        path = os.path.join(self.directory, "index")
        if self.index_storage is not None:
            self.index_storage.remove(path)
            return Index(path, readonly=False, map_bytes=self.config.index_map_bytes,
                         storage=self.index_storage)
        for name in os.listdir(path) if os.path.isdir(path) else ():
            os.unlink(os.path.join(path, name))
        if os.path.exists(path + ".seal"):
            os.unlink(path + ".seal")
        return Index(path, readonly=False, map_bytes=self.config.index_map_bytes)

    def _open_segments(self) -> Segments:
        names = self.fileio.listdir(self.directory) if self.fileio.exists(self.directory) else []
        bases = sorted(b for b in map(parse_segment_name, names) if b is not None)
        segments = [Segment(self.fileio, self.directory, base, writable=not self.readonly,
                            clock=self.clock)
                    for base in bases]
        if not segments and not self.readonly:
            segments = [Segment(self.fileio, self.directory, 0, writable=True, create=True,
                                clock=self.clock)]
            self.fileio.fsync_dir(self.directory)
        return Segments(segments)

    # -- writer-thread callbacks ----------------------------------------------------

    @property
    def active_segment(self) -> Segment:
        return self.segments.active

    def maybe_roll(self, incoming_bytes: int) -> None:
        segment = self.active_segment
        if segment.size_bytes == 0:
            return
        too_big = segment.size_bytes + incoming_bytes > self.config.segment_bytes_max
        too_old = (self.clock.monotonic_s() - segment.created_monotonic
                   > self.config.segment_age_max_s)
        if not (too_big or too_old):
            return
        segment.fsync()  # a sealed segment is always durable, whatever the policy
        segment.seal(self.clock.wall_us(), self.next_offset)
        new = Segment(self.fileio, self.directory, self.next_offset, writable=True, create=True,
                      clock=self.clock)
        self.fileio.fsync_dir(self.directory)
        self._publish(segments=self.segments.rolled(new))
        self.active_position = 0
        self.index.set_recovery_point(self._point())

    def _point(self) -> RecoveryPoint:
        return RecoveryPoint(self.active_segment.base_offset, self.active_position,
                             self.next_offset, NO_HWM if self.hwm_us is None else self.hwm_us)

    def end(self) -> tuple[int, int | None]:
        """Writer thread: (next offset, running max timestamp) to append after."""
        return self.next_offset, self.hwm_us

    def segment_for_write(self, nbytes: int) -> tuple[Segment, int]:
        """Writer thread: the segment `nbytes` of frames go to (rolled when full or
        old) and the position they start at."""
        self.maybe_roll(nbytes)
        segment = self.active_segment
        assert segment.size_bytes == self.active_position
        return segment, self.active_position

    def record(self, committed) -> None:
        """Writer thread, after a commit is durable under the policy: index it, then
        make it visible (persist, then forward)."""
        assert committed.next_offset > self.next_offset
        self.index.put(committed.entries, committed.recovery, committed.events)
        batches = [(frame.base_offset, decode_columns(frame), hwm_before)
                   for frame, hwm_before in committed.published]
        self.active_position = committed.end_position
        self._publish_end(committed.next_offset, committed.hwm_us)
        self.ring.publish(batches, committed.next_offset)

    def sync_active(self) -> None:
        with self.exclusive():
            self.active_segment.fsync()
            self.index.set_recovery_point(self._point())

    def writer_close(self) -> None:
        if self.segments:
            self.sync_active()
        self.index.sync()

    # -- several writer processes (locks.py) ----------------------------------------

    def exclusive(self) -> "_Exclusive":
        """Writer thread: a context that holds the commit lock, having first taken in
        what writers in other processes did since this one last held it. Re-entrant (a
        job that appends)."""
        return self._exclusive

    def _enter_exclusive(self, *, changing: bool = True) -> None:
        """`changing`: the holder is about to change the files (it bumps the counter);
        False for a poll, which only takes in what others did (what it may cut, a
        killed writer's half-written tail, that writer's own bump announced)."""
        self._exclusive_depth += 1
        if self._exclusive_depth > 1:
            return
        try:
            changed = self.lock.acquire()
            tail = self.lock.tail_state() if changed else None
            if changing:
                self.lock.bump()
            if changed and not (tail is not None and self._take_tail(tail)):
                self._catch_up()
                self._layout = self.lock.layout()  # this process knows the set now
            if not changing:
                self.lock.settle()
        except BaseException:
            self._exit_exclusive(failed=True)
            raise

    def _exit_exclusive(self, *, failed: bool) -> None:
        self._exclusive_depth -= 1
        if self._exclusive_depth == 0:
            try:
                if not failed:  # else the next holder reads what this one left
                    self._leave_tail()
            finally:
                self.lock.release()

    def _leave_tail(self) -> None:
        now = self._snapshot
        self.lock.leave_tail(now.end_offset, now.segments.active.base_offset,
                             self.active_position, NO_HWM if now.hwm_us is None else now.hwm_us)

    def _take_tail(self, tail) -> bool:
        """Catch up from the tail state the last holder left, when this process knows
        the segment set it describes (only appends happened since): no file is read.
        Returns False when it cannot (the caller reads what was added)."""
        active = self.segments.active
        if tail.layout != self._layout or tail.active_base != active.base_offset or (
                tail.end_offset < self.next_offset):
            return False
        active.adopt_size()
        if active.size_bytes != tail.position:
            return False
        self.index.reload_last()
        self.active_position = tail.position
        self._publish_end(tail.end_offset, None if tail.hwm_us == NO_HWM else tail.hwm_us)
        self.ring.reset(tail.end_offset)
        return True

    def poll(self) -> bool:
        """Take in what other processes appended, now (a follower in this process calls
        it while it waits at the end): a job on the writer thread, or, in a view, a
        refresh when the commit lock's counter says a writer was here (`_poll_view`).
        Any thread. Returns True when the end moved."""
        if self.closed:
            return False
        if self.readonly:
            return self._poll_view()
        before = self.next_offset
        try:
            self.run_job(self._poll_job)
        except (LogClosed, ReadOnlyLog, PartitionFailed):
            return False  # a closed or failed partition takes nothing more in
        return self.next_offset != before

    def _poll_job(self) -> None:
        self._enter_exclusive(changing=False)  # entering catches up; nothing else to do
        self._exit_exclusive(failed=False)

    def _catch_up(self) -> None:
        """Writer, under the commit lock: take in the frames and segments other
        processes added, the segments their retention removed, and cut what a writer
        killed mid-commit left half-written (recovery.catch_up). Anything else (a
        truncate) and the partition is taken in again as an open would."""
        ours = self.segments
        segments = self._segments_now(ours.active, writable=True)
        if segments is None:
            self._reload()
            return
        self.index.reload_last()
        start = RecoveryPoint(ours.active.base_offset, self.active_position, self.next_offset,
                              NO_HWM if self.hwm_us is None else self.hwm_us)
        state, _ = recovery_module.catch_up(segments, self.index, start=start,
                                            chunk_bytes=self.config.read_chunk_bytes)
        changes = dict(end_offset=state.next_offset, hwm_us=state.hwm_us)
        if segments != list(ours):  # (catch_up may have removed a torn new segment)
            changes.update(segments=Segments(segments), start_offset=segments[0].base_offset)
        self._publish(**changes)
        if state.end_segment != len(segments) - 1:
            self._reload()  # not a shape a crash mid-commit leaves: read it all again
            return
        segments[-1].unseal()  # a writer killed between sealing and rolling
        self.active_position = state.end_position
        if segments[0] is not ours[0]:  # retention removed some
            self._load_start_hwm()
        self._rederive_commits()
        self.ring.reset(self.next_offset)

    def _segments_now(self, end_segment, *, writable: bool,
                      removed: list | None = None) -> list | None:
        """The segments as the directory holds them now, when they differ from this
        process's only as other processes' appends, rolls and retention make them differ
        (sizes from `end_segment` on, new segments after it, the oldest ones removed);
        the removed ones are closed, or added to `removed`. None when anything else
        changed (a truncate, done or under way): the caller takes the partition in
        again."""
        names = set(self.fileio.listdir(self.directory))
        ours = self.segments
        present = Segments(s for s in ours if os.path.basename(s.path) in names)
        gone = len(ours) - len(present)
        if maintenance.INTENT_NAME in names or present != ours[gone:] or (
                end_segment not in present) or isinstance(end_segment,
                                                          maintenance.PatchedSegment) or (
                self.fileio.size(end_segment.handle) < self.active_position):
            return None
        for segment in present[present.index(end_segment):]:
            segment.adopt_size()
        newer = sorted(b for b in map(parse_segment_name, names)
                       if b is not None and b > present.active.base_offset)
        for segment in ours[:gone]:
            if removed is None:
                segment.close()
            else:
                removed.append(segment)
        return [*present, *(Segment(self.fileio, self.directory, base, writable=writable,
                                    clock=self.clock) for base in newer)]

    def _reload(self) -> None:
        """Another process truncated the partition (or was killed doing it): take it
        in again from its files, as an open does."""
        before = self.next_offset
        for segment in self.segments:
            segment.close()
        self._load()
        if self.next_offset < before:
            self.truncations.append(self.next_offset)
        self.ring.reset(self.next_offset)

    # -- appends --------------------------------------------------------------------

    def _check_writable(self) -> None:
        if self.closed:
            raise LogClosed(f"partition {self.name} is closed")
        if self.appender is None:
            raise ReadOnlyLog("the log was opened read-only")

    def submit(self, pieces) -> int:
        self._check_writable()
        waiter = Waiter()
        self.appender.submit(Pending(pieces, waiter, sum(p.nbytes for p in pieces)))
        return waiter.wait()

    async def submit_async(self, pieces) -> int:
        import asyncio
        self._check_writable()
        waiter = Waiter(asyncio.get_running_loop())
        await self.appender.submit_async(Pending(pieces, waiter,
                                                 sum(p.nbytes for p in pieces)))
        return await waiter.future

    def run_job(self, job):
        """Run `job()` on the writer thread between appends; return its result."""
        self._check_writable()
        waiter = Waiter()
        self.appender.submit(Pending([], waiter, 0, job))
        return waiter.wait()

    # -- reads: a View of the latest snapshot (view.py) ------------------------------

    @property
    def snapshot(self) -> Snapshot:
        """The partition as readers see it now: an immutable value."""
        return self._snapshot

    def _publish(self, **changes) -> None:
        """Writer (or a view's refresh): replace the snapshot, in one assignment. A
        writer that changes the segment set starts a new layout generation (locks.py)."""
        self._snapshot = self._snapshot._replace(**changes)
        if "segments" in changes and self.lock.held and not self.readonly:
            self._layout = self.lock.next_layout()

    def _publish_end(self, end_offset: int, hwm_us: int | None) -> None:
        """`_publish` for the common case, a commit."""
        now = self._snapshot
        self._snapshot = Snapshot(now.start_offset, end_offset, hwm_us, now.start_hwm_us,
                                  now.segments)

    @property
    def next_offset(self) -> int:
        return self._snapshot.end_offset

    @property
    def start_offset(self) -> int:
        return self._snapshot.start_offset

    @property
    def hwm_us(self) -> int | None:
        return self._snapshot.hwm_us

    @property
    def start_hwm_us(self) -> int | None:
        return self._snapshot.start_hwm_us

    @property
    def segments(self) -> Segments:
        return self._snapshot.segments

    def view(self) -> View:
        return View(self._snapshot, self.index, self.name, self.config.read_chunk_bytes)

    def check_offset(self, offset: int) -> None:
        self.view().check_offset(offset)

    def hwm_before_offset(self, base_offset: int) -> int | None:
        return self.view().hwm_before_offset(base_offset)

    def batch_holding(self, offset: int) -> tuple[IndexEntry, Columns]:
        return self.view().batch_holding(offset)

    def offset_for_timestamp(self, timestamp_us: int) -> int:
        return self.view().offset_for_timestamp(timestamp_us)

    def read_batch(self, entry: IndexEntry) -> Columns:
        return self.view().read_batch(entry)

    def segment_holding(self, offset: int) -> Segment:
        return self._snapshot.segments.holding(offset)

    def disk_frames(self, offset: int):
        return self.view().disk_frames(offset)

    def txn_state(self, txn_id: int, seen_at: int | None = None):
        return self.view().txn_state(txn_id, seen_at)

    def txn_first_offset(self, txn_id: int) -> int:
        return self.view().txn_first_offset(txn_id)

    def derive_txn(self, txn_id: int, first: int) -> tuple[int, int, int] | None:
        return self.view().derive_txn(txn_id, first)

    def open_txn_candidates(self) -> dict[int, int]:
        return self.view().open_txn_candidates()

    def last_stable_offset(self) -> int:
        return self.view().last_stable_offset()

    def last_commit(self, tag: str) -> bytes | None:
        return self.view().last_commit(tag)

    # -- holds (retention never removes an offset a reader holds) -------------------

    def hold(self, token: int, offset: int) -> None:
        with self._holds_lock:
            self._holds[token] = offset

    def release(self, token: int) -> None:
        with self._holds_lock:
            self._holds.pop(token, None)

    def min_hold(self) -> int | None:
        """The lowest offset held by a reader in this process or by a durable hold."""
        with self._holds_lock:
            held = list(self._holds.values())
        durable = holds.lowest(self.fileio, self.directory)
        if durable is not None:
            held.append(durable)
        return min(held, default=None)

    # -- truncate and retention (run on the writer thread) ---------------------------

    def truncate_after(self, offset: int) -> int:
        """Forget every record after `offset` (keep offsets <= offset). Crash-safe:
        an intent file holding the new tail frame is made durable first, and recovery
        finishes the job if a crash interrupts it. Returns the new end offset."""
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise InvalidArgument("offset must be an int")
        return self.run_job(lambda: self._exclusive_job(self._truncate_job, offset + 1))

    def _exclusive_job(self, job, *args):
        with self.exclusive():
            return job(*args)

    def _truncate_job(self, new_end: int) -> int:
        if new_end >= self.next_offset:
            return self.next_offset
        if new_end < self.start_offset:
            raise OffsetOutOfRange(f"cannot truncate {self.name} before its start "
                                   f"offset {self.start_offset}")
        self.active_segment.fsync()
        entry = self.index.lookup_offset(new_end)
        assert entry is not None
        intent = maintenance.truncate_intent(entry, new_end, self.read_batch(entry))
        maintenance.write_intent(self.fileio, self.directory, intent)
        self._apply_intent(intent)
        self.truncations.append(self.next_offset)
        self.ring.reset(self.next_offset)
        # A transaction whose commit marker was cut off is not committed any more.
        for txn_id in self.index.reopened_txns:
            state = self.index.txn_state(txn_id)
            found = self.derive_txn(txn_id, state[1]) if state is not None else None
            if found is not None and found[0] == TxnState.OPEN:  # confirmed on disk
                self.appender.write_from_job([self._marker_piece(txn_id, RecordKind.ABORT,
                                                                 b"")])
        self.index.reopened_txns = []
        self.index.sync()  # the index runs without sync; make this change stick
        return self.next_offset

    def _rederive_commits(self) -> None:
        """Tags whose latest commit a cut removed (Index.drop_from): their latest commit
        before the cut, from the segments."""
        tags, self.index.dropped_commits = self.index.dropped_commits, []
        for tag in dict.fromkeys(tags):
            found = self.view().scan_last_commit(tag)
            if found is not None:
                self.index.put_commit(tag, *found)

    def _apply_intent(self, intent: dict) -> None:
        cut = maintenance.apply_intent(self.fileio, self.directory, self.segments, self.index,
                                       intent, self.config.read_chunk_bytes,
                                       self.start_hwm_us)
        self._publish(segments=cut.segments)
        if cut.next_offset is not None:  # else recovery rebuilds the index and the end
            self._publish(end_offset=cut.next_offset, hwm_us=cut.hwm_us)
            self.active_position = self.segments.active.size_bytes
            self.index.set_recovery_point(self._point())
            self._rederive_commits()

    # -- a read-only view that follows a writer in another process ------------------

    def refresh(self) -> bool:
        """Read-only: take in what writers (other processes) added since this view was
        made or last refreshed: new frames, new segments, segments retention removed.
        Returns False when the view cannot follow (a truncate happened or is under way,
        the files changed under it, or a writer created the partition after the view
        opened it): the partition is then `stale`, and the Log opens it again
        (Log.refresh, or a following Reader). Any thread: one refresh of a partition at
        a time, since the commit lock is the process's, not a thread's (two threads
        holding it shared would let go of it for each other)."""
        assert self.readonly
        with self._refresh_lock:
            return self._refresh_now()

    def _poll_view(self) -> bool:
        """A view's follower at the end: refresh when the commit lock's counter says a
        writer has been here since the last look (a memory read when none has).
        Returns True when the end moved."""
        assert self.readonly
        with self._refresh_lock:
            if self.closed or self.stale:
                return False
            if self.lock.handle is None:  # no writer had opened the partition
                if self.fileio.exists(self.lock.path):
                    self.stale = True  # one has since: open it again, and take its lock
                return False
            if not self.lock.moved():
                return False
            before = self.next_offset
            self._refresh_now()
            return self.next_offset != before

    def _refresh_now(self) -> bool:
        """refresh, holding _refresh_lock."""
        assert self._refresh_lock.locked()
        if self.closed or self.stale:
            return False
        self.lock.acquire(exclusive=False)  # no commit half done while this looks
        try:
            if self._refresh_locked():
                self.lock.settle()  # (the counter cannot move while this holds the lock)
                return True
        finally:
            self.lock.release()
        self.stale = True
        return False

    def _refresh_locked(self) -> bool:
        if self.lock.handle is None and self.fileio.exists(self.lock.path):
            return False  # a writer came since the open: reopen (and take its lock)
        if not self.segments:
            return False
        end_segment = self.segments[self._end_number]
        segments = self._segments_now(end_segment, writable=False, removed=self._removed)
        if segments is None or not self._end_frame_intact(segments):
            return False  # not what appends and retention do: reopen
        self._publish(segments=Segments(segments), start_offset=segments[0].base_offset)
        self._end_number = self.segments.index(end_segment)
        self._follow_tail()
        self._close_removed()
        return True

    def _close_removed(self) -> None:
        """Close the segments retention removed once no reader here holds an offset
        before the start. (A removed file stays readable through its handle: a reader
        on another thread that was in it finishes it, instead of reading a closed, or
        reused, file descriptor.)"""
        with self._holds_lock:
            lowest = min(self._holds.values(), default=None)
        if lowest is None or lowest >= self.start_offset:
            for segment in self._removed:
                segment.close()
            self._removed = []

    def _end_frame_intact(self, segments) -> bool:
        """Is the view's last frame still there, the same frame? A truncate cuts it,
        and by the next refresh the file may have grown past the cut again (the sizes
        alone do not show it; the view would read on from inside another frame)."""
        if self._end_frame is None:
            return True  # no frame yet (or the index could not say where it was)
        base, position, checksum = self._end_frame
        segment = next((s for s in segments if s.base_offset == base), None)
        return segment is not None and _header_checksum(segment, position) == checksum

    def _end_frame_now(self) -> tuple[int, int, int] | None:
        """A view: (segment base, position, header checksum) of its last frame, read
        from the file; None when it has none or the index cannot say where it is."""
        if self.next_offset <= self.start_offset or not self.segments:
            return None
        try:
            entry = self.index.lookup_offset(self.next_offset - 1)
        except CorruptIndex:
            return None
        if entry is None or entry.next_offset != self.next_offset:
            return None
        segment = self.segments.by_base(entry.segment_base)
        try:
            checksum = None if segment is None else _header_checksum(segment,
                                                                     entry.position)
        except OSError:
            return None  # unread, the view only loses the check (readers get the error)
        return None if checksum is None else (entry.segment_base, entry.position, checksum)

    def retire(self) -> None:
        """A view the Log has opened again: its followers move to the new one (Reader);
        wake them now. The Log closes it once no reader holds it (close_if_idle)."""
        assert self.readonly
        self.stale = True
        self.ring.close()

    def close_if_idle(self) -> bool:
        """Close unless a reader holds it (a reader on another thread may be reading
        its files now); True when closed."""
        with self._holds_lock:
            idle = not self._holds
        if idle:
            self.close()
        return idle

    def _follow_tail(self) -> None:
        """Index the valid frames after the view's end; stop quietly at anything else
        (a writer mid-frame is not damage)."""
        number, position = self._end_number, self.active_position
        if position == self.segments[number].size_bytes and number + 1 < len(self.segments):
            number, position = number + 1, 0  # the end is where the next segment starts
        state, _ = recovery_module.index_from(
            self.segments, self.index, number=number, position=position,
            next_offset=self.next_offset, hwm_us=self.hwm_us,
            chunk_bytes=self.config.read_chunk_bytes)
        moved = state.next_offset != self.next_offset
        self._publish(end_offset=state.next_offset, hwm_us=state.hwm_us)
        self._end_number, self.active_position = state.end_segment, state.end_position
        if moved:
            self._end_frame = self._end_frame_now()
        self.ring.reset(self.next_offset)  # this view's readers read the new frames from disk

    def _view_intent(self) -> None:
        """Read-only: show an unfinished truncate as finished (maintenance.view_intent)."""
        intent = maintenance.read_intent(self.fileio, self.directory)
        if intent is not None:
            self._publish(segments=maintenance.view_intent(self.segments, intent))
            self.index.drop_from(intent["drop_from"])

    def _finish_intent(self) -> None:
        intent = maintenance.read_intent(self.fileio, self.directory)
        if intent is not None:
            self._apply_intent(intent)

    def apply_retention(self, now_us: int) -> list[str]:
        """Delete whole sealed segments past the age or size bound; never one holding an
        offset a reader holds. Returns the deleted paths."""
        return self.run_job(lambda: self._exclusive_job(self._retention_job, now_us))

    def _retention_job(self, now_us: int) -> list[str]:
        retained = maintenance.apply_retention(
            self.fileio, self.directory, self.segments, self.index,
            retention_age_s=self.config.retention_age_s,
            retention_bytes=self.config.retention_bytes, hold=self.min_hold(), now_us=now_us,
            start_hwm_us=self.start_hwm_us, chunk_bytes=self.config.read_chunk_bytes)
        self._publish(segments=retained.segments, start_offset=retained.segments.start_offset)
        if retained.start_hwm_us is not None:
            self._publish(start_hwm_us=retained.start_hwm_us)
        return retained.deleted

    # -- closing --------------------------------------------------------------------

    @property
    def state(self) -> str:
        if self.closed:
            return "closed"
        return "failed" if self.appender is not None and self.appender.failed else "open"

    def stop_writing(self) -> None:
        """Drain the queued appends, fsync, stop the writer thread. Idempotent."""
        if self.appender is not None:
            self.appender.close()

    def close(self, *, seal: bool = True) -> None:
        """`seal`: this was the log's last writer process (the index is sealed)."""
        if self.closed:
            return
        self.stop_writing()
        with self._refresh_lock:  # (a view's follower may be refreshing it on its thread)
            self.closed = True
            self.ring.close()
            for segment in self._removed:
                segment.close()
            self._close_files(clean=seal)

    def _close_files(self, *, clean: bool = False) -> None:
        for segment in self.segments:
            segment.close()
        self.index.close(seal=clean and not self.readonly)
        self.lock.close()

    def size_bytes(self) -> int:
        return self.segments.size_bytes()


def _header_checksum(segment: Segment, position: int) -> int | None:
    """The header checksum of the frame at `position` (it covers the payload's), or
    None when no intact frame header is there."""
    try:
        header = decode_header(segment.read(position, HEADER_BYTES), 0)
    except CorruptFrame:
        return None
    return None if header is INCOMPLETE else header.header_checksum


class _Exclusive:
    """The context of Partition.exclusive (a class: cheaper than a generator, and a
    commit enters it every time)."""

    __slots__ = ("partition",)

    def __init__(self, partition: Partition) -> None:
        self.partition = partition

    def __enter__(self) -> None:
        self.partition._enter_exclusive()

    def __exit__(self, kind, error, traceback) -> None:
        self.partition._exit_exclusive(failed=kind is not None)
