"""A log directory: named streams, each with P partitions.

Strategy: opening (connect.open_log validates the options) checks the directory and joins the log's
writers (directory.py; locks.py: several processes may write one log, each commit
holding its partition's lock) and opens every partition, which runs its recovery. The
Log turns every append into a Submission (append.py: the records checked, routed to
partitions and cut into frames) and hands it to the partitions' writers through its
one door, `submit` (sync, async, or with a waiter); a plain record awaited with
`append` joins its event loop's batch for the partition instead (coalesce.py: one
append per turn of the loop, however many tasks await). It creates readers, and waits
at a partition's end (waits.py). Every public method checks its arguments and raises
`InvalidArgument` (also a ValueError) with a sentence naming what was wrong. The
transaction operations are in log_txn.py; maintenance, holds, opening, deleting and
resizing streams and the doors of what runs beside the log (the Kafka listener's
stamped batches, the daemon's prepared ones) in log_admin.py; a view's refresh and the
waits at a partition's end in log_follow.py.

Thread-safety: appends and readers may be used from many threads and event loops at
once; create_stream, delete_stream, add_partitions, truncate_after, apply_retention
and close are serialised by a lock.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import numbers
import os
import socket
import threading

from . import directory, layout
from .append import AppendRules, Submission, check_partition
from .clock import SYSTEM_CLOCK
from .config import LogConfig
from .errors import (Fenced, InternalStream, InvalidArgument, LogClosed, ReadOnlyLog, StoreBacklogFull,
                     UnknownStream)
from .locks import WriterRegistry
from .log_admin import AdminOperations
from .log_follow import FollowOperations
from .log_txn import TxnOperations
from .partition import Partition
from .reader import Reader
from .records import AppendResult, RecordKind, RecordPosition
from . import validate
from .validate import INT64_MAX as _INT64_MAX, INT64_MIN as _INT64_MIN

FORMAT = {"format": "streamlog", "version": 1}

log = logging.getLogger("streamlog")


class Log(FollowOperations, TxnOperations, AdminOperations):
    """A log opened in this process (streamlog.open_log, connect.py). Its transactions' operations are in
    log_txn.py, its maintenance and holds in log_admin.py, its refresh and waits in
    log_follow.py (one class, in four files)."""

    def __init__(self, path: str, config: LogConfig, *, readonly: bool, create: bool,
                 fileio, progress=None, clock=SYSTEM_CLOCK, index_storage=None,
                 remote=None) -> None:
        self.path = path
        self.index_storage = index_storage
        self.config = config
        self.readonly = readonly
        self.fileio = fileio
        self.clock = clock
        self._lock = threading.RLock()
        self._writer: directory.ProcessWriter | None = None
        self._registry: WriterRegistry | None = None
        self._settled = False
        self._rules = AppendRules(config, clock)  # what an append may hold (append.py)
        self._streams: dict[str, list[Partition]] = {}
        self._gone: set[str] = set()  # streams a partition found deleted (log_admin.py)
        # {(stream, partition): {txn_id: COMMIT value}}: commits decided before a crash,
        # completed as the partitions open (txn_decisions.py)
        self._decided: dict[tuple[str, int], dict[int, bytes]] = {}
        # A view's partitions that were opened again while readers still held them
        # (closed once none does: _reopened).
        self._retired: list[Partition] = []
        self.closed = False
        self.scrubber = None
        self.tiering = None  # remote/tiering.py, when the log is tiered to a store
        self.remote_view = None  # remote/view.py's poller, when read from a store
        self.restored = None  # remote/restore.py's report, when the open restored
        taken = None
        if remote is not None and not readonly:
            taken = self._restore_if_empty(remote, progress)
        try:
            self._prepare_directory(create)
        except BaseException:
            self._release_lock()
            raise
        # An index no clean close sealed is probed in a child process before use by a
        # writer, and by a reader when no writer is alive (one was killed): see index.py.
        # Asked only when an index has no seal (/proc/locks can take milliseconds).
        path_ = self.path  # not self: an abandoned Log must not live on in a cycle
        self._probe_unsealed = functools.cache(
            lambda: not readonly or not directory.writer_alive(path_))
        try:
            self._open_streams(progress)  # (log_txn.py: decided commits first)
            if remote is not None and not readonly and taken is None:
                taken = self._catch_up_with_store(remote, progress)
        except BaseException:
            self._close_partitions()
            self._release_lock()
            raise
        if self._registry is not None:
            self._registry.settle()  # other writer processes may come in now
        self._settled = True
        if not readonly and config.scrub_bytes_per_s is not None:
            self.start_scrubber()
        if remote is not None:
            self._start_tiering(remote, taken)

    def _writer_name(self) -> str:
        return f"{socket.gethostname()}:{os.getpid()}:{self.clock.wall_us()}"

    def _restore_if_empty(self, store, progress):
        """A tiered open of an empty or missing directory continues from the store
        (remote/restore.py): take the log over first (fencing an older writer), then
        write what that generation holds. Returns the generation taken over, or None
        (the directory holds a log: the tiering takes over)."""
        from .remote import manifest as manifests, restore
        if not restore.needs_restore(self.fileio, self.path):
            return None
        taken = manifests.take_over(store, self._writer_name())
        if taken.streams:
            self.restored = restore.restore(
                store, taken, self.path, fileio=self.fileio, index_storage=self.index_storage,
                map_bytes=self.config.index_map_bytes, clock=self.clock,
                progress=progress)
        return taken

    def _catch_up_with_store(self, store, progress):
        """A tiered open of a directory that holds a log: take the log over, then
        restore from the store every partition it holds more of (restore.catch_up):
        under durability "remote" an ack does not wait for the local fsync, so a power
        loss can leave the local log behind the store. Returns the generation taken."""
        from .remote import manifest as manifests, restore
        taken = manifests.take_over(store, self._writer_name())
        if self._registry is not None and not self._registry.alone:
            return taken  # (a log with writers in other processes is theirs too)
        ends = {name: [part.end_offset for part in parts]
                for name, parts in self._streams.items()}
        behind = restore.behind(taken, ends)
        for stream, number in behind:
            if number < len(self._streams.get(stream, ())):
                self._streams[stream][number].close()
        if behind:
            self.restored = restore.catch_up(
                store, taken, self.path, behind, ends, fileio=self.fileio,
                index_storage=self.index_storage, map_bytes=self.config.index_map_bytes,
                clock=self.clock, progress=progress)
        for stream, number in behind:
            local = self._streams.setdefault(stream, [])
            if number < len(local):
                local[number] = self._open_partition(stream, number, progress)
            while len(local) <= number:  # a stream, or partitions, new here
                local.append(self._open_partition(stream, len(local), progress))
        return taken

    def _start_tiering(self, store, taken=None) -> None:
        from .remote.tiering import Tiering  # (only a tiered log loads the store's code)
        try:
            config = self.config
            self.tiering = Tiering(
                store, self._all_partitions, writer=self._writer_name(),
                interval_s=min(1.0, config.remote_max_lag_s / 4),
                lag_max_s=config.remote_max_lag_s, manifest=taken,
                durability=config.durability, commit_interval_s=config.remote_commit_ms / 1000,
                commit_bytes=config.remote_commit_bytes, ack_timeout_s=config.remote_timeout_s,
                grace_s=config.remote_grace_s, clock=self.clock)
            for part in self._all_partitions():
                part.ack_gate = self.tiering.gate
            self.tiering.start()
        except BaseException:
            self.close()
            raise

    def _all_partitions(self) -> list[Partition]:
        """Every open partition, without the log's lock: the tiering job asks while
        close() holds it and waits for the job (a snapshot of the dict; list() of its
        values is one step)."""
        return [part for partitions in list(self._streams.values()) for part in partitions]

    # -- directory, lock, streams ---------------------------------------------------

    def _prepare_directory(self, create: bool) -> None:
        if directory.prepare(self.fileio, self.path, readonly=self.readonly, create=create):
            self._writer = directory.ProcessWriter(self.fileio, self.path, self)
            self._registry = self._writer.registry
            directory.write_marker(self.fileio, self.path)
            directory.remove_leftovers(self.fileio, self.path)  # of deleted streams

    def _release_lock(self) -> None:
        if self._writer is not None:
            self._writer.release()
            self._writer = self._registry = None

    def _stream_names(self) -> list[str]:
        return directory.stream_names(self.fileio, self.path)

    def _open_partition(self, name: str, number: int, progress=None) -> Partition:
        alone = self._registry is not None and self._registry.alone and not self._settled
        part = Partition(
            layout.partition_dir(self.path, name, number), f"{name}/{number}", number,
            self.config, self.fileio, readonly=self.readonly, alone=alone,
            probe_unsealed=self._probe_unsealed, clock=self.clock,
            index_storage=self.index_storage, progress=(lambda scanned, n=f"{name}/{number}": progress(n, scanned))
            if progress else None, on_deleted=functools.partial(self._gone.add, name),
            decided=self._decided.get((name, number)))
        if self.tiering is not None:  # a stream created since the open
            part.ack_gate = self.tiering.gate
        return part

    def create_stream(self, name: str, partitions: int = 1) -> int:
        """Create stream `name` with `partitions` partitions; a no-op when it exists
        with that many. Returns the partition count. InvalidStreamName for a name
        outside Kafka's topic rule; InternalStream for a name starting with "__"."""
        if layout.is_internal(validate.stream_name(name)):
            raise InternalStream(f"{name!r}: names starting with "
                                 f"{layout.INTERNAL_PREFIX!r} are streamlog's own streams")
        return self._create_stream(name, partitions)

    def _create_stream(self, name: str, partitions: int) -> int:
        self._check_open()
        validate.partition_count(partitions, self.config.partitions_max)
        with self._lock:
            if name not in self._streams:
                if self.readonly:
                    raise ReadOnlyLog("the log was opened read-only")
                # (a writer in another process may be creating it too)
                directory.create_stream(self.fileio, self.path, name, partitions,
                                        lambda: self._find_stream(name))
                self._find_stream(name)
            existing = len(self._streams[name])
            if existing != partitions:
                noun = "partition" if existing == 1 else "partitions"
                raise InvalidArgument(f"stream {name!r} has {existing} {noun}, "
                                      f"not {partitions}")
            return existing

    def streams(self) -> list[str]:
        return sorted(self._streams)

    def partition_count(self, stream: str) -> int:
        return len(self._partitions(stream))

    def _partitions(self, stream: str) -> list[Partition]:
        self._check_open()
        try:
            return self._streams[stream]
        except (KeyError, TypeError):
            if isinstance(stream, str) and self._find_stream(stream):
                return self._streams[stream]
            raise UnknownStream(f"no stream named {stream!r} in {self.path}") from None

    def _partition(self, stream: str, partition: int) -> Partition:
        """Partition `partition` of `stream`: the storage core's own object (the core's
        modules and their tests use it); what sits above the core uses the public
        operations, which say what it needs."""
        partitions = self._partitions(stream)
        if isinstance(partition, int) and partition >= len(partitions):
            partitions = self._grown(stream)  # (another process may have added some)
        return partitions[check_partition(stream, partition, len(partitions))]

    def _check_open(self) -> None:
        if self.closed:
            raise LogClosed(f"the log at {self.path} is closed")
        if self._gone:  # a partition found its stream deleted: forget it (log_admin.py)
            self._forget_gone()

    # -- appends --------------------------------------------------------------------

    async def append(self, stream: str, value, *, key=None, timestamp_us=None,
                     partition=None, headers=None, kind=RecordKind.DATA,
                     txn_id: int = 0) -> RecordPosition:
        """Append one record; returns where it landed once durable under the policy.
        Plain records awaited from many tasks at once go to the writer together, one
        batch per turn of the event loop (coalesce.py)."""
        partitions = self._writable(stream)
        plain = self._rules.plain(stream, len(partitions), value, key, timestamp_us,
                                  partition, headers, kind, txn_id)
        if plain is None:
            submission = self._rules.one(stream, len(partitions), value, key,
                                         timestamp_us, partition, headers, kind, txn_id)
            (first,) = await self._firsts_async(submission)
            return RecordPosition(next(iter(submission.pieces)), first)
        number, timestamp_us, size = plain
        part = partitions[number]
        if self.tiering is not None:
            self._admit(Submission(stream, {number: []}))  # fenced, the store's backlog
        offset = await part.append_one(timestamp_us, key, value, size)
        return tuple.__new__(RecordPosition, (number, offset))  # (faster than its __new__)

    def append_sync(self, stream: str, value, *, key=None, timestamp_us=None, partition=None,
                    headers=None, kind=RecordKind.DATA, txn_id: int = 0) -> RecordPosition:
        """Blocking append() for code that is not asyncio."""
        submission = self._rules.one(stream, len(self._writable(stream)), value, key,
                                     timestamp_us, partition, headers, kind, txn_id)
        (first,) = self._firsts(submission)
        return RecordPosition(next(iter(submission.pieces)), first)

    async def append_batch(self, stream: str, values, *, keys=None, timestamps_us=None,
                           partition=None, headers=None, kinds=None,
                           txn_id: int = 0) -> AppendResult:
        """Append records given as parallel sequences; each partition's share lands
        contiguously. Returns {partition: (first, last)} once durable."""
        return await self.submit_async(self._rules.rows(
            stream, len(self._writable(stream)), values, keys, timestamps_us, partition,
            headers, kinds, txn_id))

    def append_batch_sync(self, stream: str, values, *, keys=None, timestamps_us=None,
                          partition=None, headers=None, kinds=None,
                          txn_id: int = 0) -> AppendResult:
        return self.submit(self._rules.rows(
            stream, len(self._writable(stream)), values, keys, timestamps_us, partition,
            headers, kinds, txn_id))

    def producer(self, stream: str, **options):
        """Returns a Producer of `stream` (producer.py): records sent one at a time,
        written in group-committed batches; `options` are Producer's (linger_ms, ...)."""
        from .producer import Producer
        return Producer(self, stream, **options)

    async def append_columns(self, stream: str, data, *, partition: int | None = None,
                             txn_id: int = 0) -> AppendResult:
        """Append records given as columns: a pyarrow RecordBatch or Table, or a dict
        of Arrow / NumPy arrays, with a `value` column and optional `key` and
        `timestamp` columns (types in columnar.py; missing timestamps are the append
        time). Checked, partitioned, cut into frames and encoded from the buffers with
        no Python loop per record, except that keys choosing the partition of a
        multi-partition stream (no `partition`) are hashed one by one. The same path
        to the partitions as append_batch: durability, group commit, transactions
        and visibility are the same, and each partition's share lands contiguously.

        Args:
            partition: the partition for every row; None: by key hash, round robin
                for rows without a key (as append_batch).
            txn_id: append under this open transaction (0: none).
        Returns:
            AppendResult: {partition: (first, last offset)} once durable.
        Raises:
            InvalidAppend for bad columns (the first bad record named); nothing is
            appended. InvalidArgument for a bad partition, UnknownStream, ReadOnlyLog.
            Records with headers need append_batch.
        """
        return await self.submit_async(self._rules.columns(
            stream, len(self._writable(stream)), data, partition, txn_id))

    def append_columns_sync(self, stream: str, data, *, partition: int | None = None,
                            txn_id: int = 0) -> AppendResult:
        """Blocking append_columns() for code that is not asyncio."""
        return self.submit(self._rules.columns(
            stream, len(self._writable(stream)), data, partition, txn_id))

    # -- the one door to the partitions' writers (append.py) ------------------------

    def submit(self, submission: Submission) -> AppendResult:
        """Append a Submission (append.AppendRules made it): every append of this log,
        its Producer's, the daemon's and the Kafka listener's comes through here, or
        through submit_async or submit_then. Blocks until durable under the policy.
        Local only (api.LOCAL_ONLY): a daemon's client sends records."""
        return submission.result(self._firsts(submission))

    async def submit_async(self, submission: Submission) -> AppendResult:
        """submit, awaited."""
        return submission.result(await self._firsts_async(submission))

    def submit_then(self, submission: Submission, waiter) -> None:
        """submit without waiting: the writer thread resolves `waiter` (an
        appender.Waiter, or an object with the same fields: the Producer's batches),
        storing the first offset or the error. One partition only. Local only
        (api.LOCAL_ONLY): the local Producer's path."""
        ((number, pieces),) = submission.pieces.items()
        part = self._admit(submission)[0]
        part.submit_then(pieces, waiter)

    def _writable(self, stream: str, internal: bool = False) -> list[Partition]:
        partitions = self._partitions(stream)  # UnknownStream, LogClosed
        if self.readonly:
            raise ReadOnlyLog("the log was opened read-only")
        if not internal and layout.is_internal(stream):
            raise InternalStream(f"{stream!r} is one of streamlog's own streams: "
                                 f"readable, written only by streamlog")
        return partitions

    def _admit(self, submission: Submission) -> list[Partition]:
        """The partitions a submission goes to, in its order, its transaction checked
        in each (txn_jobs.check_appendable). Fenced once a newer writer has taken a
        tiered log over in its store."""
        partitions = self._writable(submission.stream, submission.internal)
        if self.tiering is not None and self.tiering.fenced:
            raise Fenced(f"the log at {self.path} was taken over in its store by a newer "
                         f"writer: this one appends no more ({self.tiering.error})")
        targets = [partitions[number] for number in submission.pieces]
        if self.tiering is not None and self.tiering.gate is None:
            self._check_backlog(targets)
        if submission.txn_id:
            for part in targets:
                part.check_appendable(submission.txn_id)
                part.txns_written_here.add(submission.txn_id)
        return targets

    def _check_backlog(self, targets: list[Partition]) -> None:
        """Durability "local": back-pressure once the store lags too far."""
        bound = self.config.remote_max_backlog_bytes
        if bound is None:
            return
        for part in targets:
            backlog = self.tiering.backlog_bytes(part)
            if backlog >= bound:
                raise StoreBacklogFull(
                    f"{part.name} holds {backlog} bytes the store does not have yet "
                    f"(remote_max_backlog_bytes {bound}): the store is down or too slow "
                    f"({self.tiering.error or 'uploading'}); try again later")

    def _firsts(self, submission: Submission) -> list[int]:
        return [part.submit(pieces) for part, pieces in
                zip(self._admit(submission), submission.pieces.values())]

    async def _firsts_async(self, submission: Submission) -> list[int]:
        targets = self._admit(submission)
        if len(targets) == 1:
            return [await targets[0].submit_async(next(iter(submission.pieces.values())))]
        return await asyncio.gather(*(part.submit_async(pieces) for part, pieces in
                                      zip(targets, submission.pieces.values())))

    # -- reads ----------------------------------------------------------------------

    def reader(self, stream: str, partition: int = 0, *, from_offset: int | None = None,
               from_timestamp_us: int | None = None, to_offset: int | None = None,
               to_timestamp_us: int | None = None, follow: bool = False,
               data_only: bool = True, read_committed: bool = True) -> Reader:
        """A Reader of one partition. Start: `from_offset` (inclusive) or the first
        record whose high-water mark is >= `from_timestamp_us`, else the log start.
        End (exclusive): `to_offset` or `to_timestamp_us` by the same rule, else the
        acknowledged end (or never, with follow=True).

        Raises OffsetOutOfRange for a start before the log start (retention) or past
        its end; InvalidArgument for wrong types or both bounds of one kind given.
        """
        options = dict(from_offset=from_offset, from_timestamp_us=from_timestamp_us,
                       to_offset=to_offset, to_timestamp_us=to_timestamp_us, follow=follow,
                       data_only=data_only, read_committed=read_committed)
        if not self.readonly:
            return self._reader(self._partition(stream, partition), stream, **options)
        with self._lock:  # a view: not on a partition that is being replaced
            part = self._partition(stream, partition)
            if part.stale:
                part = self._reopened(stream, partition, part)
            # Its follower takes in new frames by itself, and goes on in the partition
            # opened again when this one cannot follow the files (a truncate).
            return self._reader(part, stream, **options,
                                reopen=functools.partial(self._reopened, stream, partition))

    def _reader(self, part: Partition, stream: str, *, from_offset, from_timestamp_us,
                to_offset, to_timestamp_us, follow, data_only, read_committed,
                reopen=None) -> Reader:
        if from_offset is not None and from_timestamp_us is not None:
            raise InvalidArgument("give from_offset or from_timestamp_us, not both")
        if to_offset is not None and to_timestamp_us is not None:
            raise InvalidArgument("give to_offset or to_timestamp_us, not both")
        for name, value in (("from_offset", from_offset), ("to_offset", to_offset),
                            ("from_timestamp_us", from_timestamp_us),
                            ("to_timestamp_us", to_timestamp_us)):
            if value is not None and (isinstance(value, bool) or not isinstance(
                    value, numbers.Integral)):
                raise InvalidArgument(f"{name} must be an int (got {type(value).__name__})")
        if from_timestamp_us is not None:
            from_timestamp_us = _clamp(from_timestamp_us)
            start = part.view().offset_for_timestamp(from_timestamp_us)
        elif from_offset is not None:
            start = int(from_offset)
        else:
            start = part.start_offset
        return Reader(part, start_offset=start, stop_offset=to_offset,
                      start_timestamp_us=from_timestamp_us,
                      stop_timestamp_us=None if to_timestamp_us is None else _clamp(
                          to_timestamp_us), follow=follow, data_only=data_only,
                      read_committed=read_committed, stream=stream, reopen=reopen)

    def offset_for_timestamp(self, stream: str, partition: int, timestamp_us: int) -> int:
        """First offset whose high-water mark is >= timestamp_us (the end if none)."""
        part = self._partition(stream, partition)
        if isinstance(timestamp_us, bool) or not isinstance(timestamp_us, numbers.Integral):
            raise InvalidArgument(f"timestamp_us must be an int of microseconds "
                                  f"(got {type(timestamp_us).__name__})")
        return part.view().offset_for_timestamp(_clamp(timestamp_us))

    def end_offset(self, stream: str, partition: int = 0) -> int:
        return self._partition(stream, partition).end_offset

    def start_offset(self, stream: str, partition: int = 0) -> int:
        return self._partition(stream, partition).start_offset

    def close(self) -> None:
        """Drain queued appends, fsync, leave the log's writers (the last one seals the
        indexes). Idempotent."""
        with self._lock:
            if self.closed:
                return
            if self.scrubber is not None:
                self.scrubber.stop()
            if self.tiering is not None:
                for part in self._all_partitions():
                    part.stop_writing()  # what is queued is written (its acks held)...
                self.tiering.close()  # ...and goes up in a last tail round
            if self.remote_view is not None:
                self.remote_view.close()
            self._close_partitions()
            for part in self._retired:
                part.close()
            self._retired = []
            self.closed = True
            self._release_lock()

    def _close_partitions(self) -> None:
        """Stop every writer thread, then close the files; the indexes are sealed
        only by the last writer process (WriterRegistry.leave)."""
        parts = [part for partitions in self._streams.values() for part in partitions]
        for part in parts:
            part.stop_writing()
        last = True
        if self._registry is not None:
            try:
                last = self._registry.leave()
            except OSError:
                last = False
        for part in parts:
            part.close(seal=last)

    async def aclose(self) -> None:
        await asyncio.sleep(0)  # this loop's single appends go to their writers first
        await asyncio.to_thread(self.close)

    def __enter__(self) -> "Log":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    async def __aenter__(self) -> "Log":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


def _clamp(timestamp_us) -> int:
    """Query timestamps outside int64 mean 'before everything' or 'after everything'."""
    return min(max(int(timestamp_us), _INT64_MIN + 1), _INT64_MAX)
