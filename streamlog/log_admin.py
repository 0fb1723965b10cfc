"""A Log's maintenance: opening, deleting and resizing streams, truncate, retention,
delete_records, durable holds, the scrubber, info and stats, and the doors of what
runs beside the log (streamlog's own streams, the Kafka listener's stamped batches, the
daemon's prepared ones). Part of class Log (log.py).

Strategy: truncate_after, retention and delete_records run as jobs on each partition's
writer thread, under its commit lock (partition.py, maintenance.py); durable holds are
files beside the partition (holds.py) that every process's retention respects; the
scrubber re-verifies sealed segments in the background (scrub.py).

Streams (directory.py): a writer opens a stream holding the streams guard shared, and
creates, deletes or resizes one holding it exclusively. A delete stops the stream's
writer threads, takes every partition's commit lock (no other process is mid-commit;
the counter it bumps sends the next holder to look), renames the folder away and
fsyncs: the commit point. Another writer process finds out under the commit lock,
whose file is no longer the one at its path (PartitionLock.gone): its appends and
waits get UnknownStream, and its Log forgets the stream (`_gone`, `_forget_gone`); a
read-only view forgets it at its next refresh. On a tiered log the store's generation
without the stream is committed first (remote/changes.py).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import numbers
import os

from . import directory, holds as holds_module, layout, validate
from .errors import (CorruptIndex, Fenced, InternalStream, InvalidArgument, OffsetOutOfRange,
                     ReadOnlyLog, StoreError, UnknownStream)
from .frame import ProducerStamp
from .index_storage import wipe_index
from .records import AppendResult
from .scrub import read_scrub_status
from .still import Still

log = logging.getLogger("streamlog")


class AdminOperations:
    # -- streams: opening, deleting, more partitions ----------------------------------

    def _open_stream(self, name: str, progress) -> bool:
        """Open stream `name`'s partitions, as many as its stream.json says, holding
        the streams guard shared (a writer: no other process deletes it meanwhile).
        False when it is gone."""
        with self._streams_guard(exclusive=False):
            count = directory.partition_count(self.fileio, self.path, name)
            if count is None:
                return False
            partitions = self._streams[name] = []
            for number in range(count):
                partitions.append(self._open_partition(name, number, progress))
        return True

    def _find_stream(self, name: str) -> bool:
        """Is `name` a stream, perhaps one another process created since this one
        opened the log? Opens it when it is new here."""
        with self._lock:
            if name in self._streams:
                return True
            if not directory.stream_exists(self.fileio, self.path, name):
                return False
            return self._open_stream(name, None)

    def _grown(self, stream: str) -> list:
        """The partitions of `stream`, with those another process added since this one
        looked (add_partitions) opened here."""
        with self._lock:
            partitions = self._partitions(stream)
            if partitions[0].lock.gone():  # deleted (perhaps created again) meanwhile
                self._retire_stream(stream)
                partitions = self._partitions(stream)
            with self._streams_guard(exclusive=False):
                count = directory.partition_count(self.fileio, self.path, stream) or 0
                while len(partitions) < count:  # (one list: it only grows)
                    partitions.append(self._open_partition(stream, len(partitions)))
            return partitions

    def _streams_guard(self, *, exclusive: bool):
        if self.readonly:  # a view changes no file (and makes no folder)
            return contextlib.nullcontext()
        return directory.streams_guard(self.fileio, self.path, exclusive=exclusive)

    def delete_stream(self, name: str) -> None:
        """Delete stream `name`, crash-safe: after a crash at any moment it is there
        whole or gone whole (its folder is renamed away in one durable step, then
        removed; directory.py). Its durable holds go with it. The name may be created
        again, and starts at offset 0. Local only (api.LOCAL_ONLY): the Kafka
        listener's DeleteTopics, beside the log; a daemon's client does not serve it.

        In this process its appends get UnknownStream from then on; a reader already
        open reads on what it was reading, and gets UnknownStream when it reaches the
        end (a follower at once). Another writer process finds out at its next commit,
        poll or refresh on it (the commit lock's file is gone: UnknownStream, and it
        never writes into the deleted folder); a read-only view at its next refresh.
        On a tiered log the store's manifest drops the stream first (its objects are
        deleted after the grace period), then the local folder goes.

        Raises:
            InternalStream for one of streamlog's own streams ("__..."),
            InvalidStreamName, UnknownStream (also when another process deleted it
            first), ReadOnlyLog, LogClosed, Fenced (a tiered log taken over), and the
            store's errors on a tiered log (then nothing is deleted).
        """
        validate.stream_name(name)
        if layout.is_internal(name):
            raise InternalStream(f"{name!r} is one of streamlog's own streams: it cannot "
                                 f"be deleted")
        with self._lock:
            partitions = self._writable(name)
            if self.tiering is None:
                self._delete_here(name, partitions, None)
            else:
                self.tiering.drop_stream(
                    name, lambda tell_store: self._delete_here(name, partitions, tell_store))

    def _delete_here(self, name: str, partitions: list, tell_store) -> None:
        """The local delete (see the module docstring); `tell_store()`, on a tiered
        log, once nothing more is written and before the commit point."""
        with self._streams_guard(exclusive=True), Still(partitions) as still:
            if any(part.lock.gone() for part in partitions):
                for part in partitions:
                    part.mark_deleted()  # (by another process: forgotten below)
                raise UnknownStream(f"stream {name!r} was deleted by another process")
            if tell_store is not None:
                tell_store()
            doomed = directory.set_aside(self.fileio, self.path, layout.stream_folder(name),
                                         renamed=functools.partial(setattr, still,
                                                                   "deleted", True))
            for part in partitions:  # (an index kept outside the files: testing)
                wipe_index(os.path.join(part.directory, "index"), storage=part.index_storage)
        self._retire_stream(name)
        try:
            directory.remove_tree(self.fileio, doomed)
        except OSError as error:  # (deleted all the same: the next open removes it)
            log.warning("stream %r is deleted; removing its files failed: %s", name, error)

    def _retire_stream(self, name: str) -> None:
        """Take a deleted stream out of this Log: its partitions refuse appends and
        tell their readers at the end (Partition.mark_deleted), and are closed once no
        reader holds them (else when the log closes)."""
        partitions = self._streams.pop(name, [])
        for part in partitions:
            if not part.deleted:
                part.mark_deleted()
            if self.tiering is not None:
                self.tiering.let_go(part)
        self._gone.discard(name)
        self._retired = [part for part in (*self._retired, *partitions)
                         if not part.close_if_idle()]

    def _forget_gone(self) -> None:
        """Forget the streams a partition found deleted by another process (its commit
        lock's file gone, catchup.py); their partitions are closed when the log is, or
        at the next delete or refresh (this may run on a writer thread, which cannot
        stop itself)."""
        with self._lock:
            for name in list(self._gone):
                partitions = self._streams.get(name, [])
                if any(part.deleted for part in partitions):
                    del self._streams[name]
                    for part in partitions:
                        if not part.deleted:
                            part.mark_deleted()
                    self._retired.extend(partitions)
                self._gone.discard(name)

    def add_partitions(self, stream: str, count: int) -> int:
        """Raise the stream's partition count to `count` (Kafka's CreatePartitions).
        Crash-safe: the new partitions' folders are made first and `stream.json`,
        written atomically, then names them; a crash before leaves folders no count
        names, which a later call takes. Keys are routed by their hash modulo the
        partition count (append.partition_for_key), so from now on a key may go to
        another partition than its earlier records, as in Kafka. Other writer
        processes and read-only views take the new count in at their next refresh,
        or when asked for a partition past the count they know. On a tiered log the
        store's manifest names the new partitions from the next generation (at once
        when the store answers; else the tiering job's next round). Local only
        (api.LOCAL_ONLY): the Kafka listener's CreatePartitions, beside the log.

        Returns:
            The new partition count.
        Raises:
            InvalidArgument when `count` is not more than today's (Kafka's
            INVALID_PARTITIONS) or past config.partitions_max; InternalStream,
            InvalidStreamName, UnknownStream, ReadOnlyLog, LogClosed, Fenced.
        """
        validate.stream_name(stream)
        if layout.is_internal(stream):
            raise InternalStream(f"{stream!r} is one of streamlog's own streams")
        validate.partition_count(count, self.config.partitions_max)
        with self._lock:
            partitions = self._writable(stream)
            self._check_not_fenced()
            with self._streams_guard(exclusive=True):
                known = directory.partition_count(self.fileio, self.path, stream)
                if known is None or partitions[0].lock.gone():
                    partitions[0].mark_deleted()  # (by another process)
                    raise UnknownStream(f"stream {stream!r} was deleted by another process")
                if count <= known:
                    raise InvalidArgument(
                        f"stream {stream!r} has {known} partitions: {count} would not add "
                        f"any (partitions are only ever added)")
                added = []
                try:
                    for number in range(len(partitions), count):  # (some may be known)
                        added.append(self._open_partition(stream, number))
                    directory.write_stream_meta(self.fileio, self.path, stream, count)
                except BaseException:
                    for part in added:
                        part.close(seal=False)
                    raise
                partitions.extend(added)
        if self.tiering is not None:
            self._tell_store_soon()
        return count

    def _tell_store_soon(self) -> None:
        """A tiered log: a round now, which names the new partitions (a store that
        does not answer is left to the tiering job's next round)."""
        try:
            self.tiering.run_once(full=False)
        except StoreError as error:
            log.warning("the store names the new partitions at the next round: %s", error)

    def _check_not_fenced(self) -> None:
        if self.tiering is not None and self.tiering.fenced:
            raise Fenced(f"the log at {self.path} was taken over in its store by a newer "
                         f"writer: this one changes it no more ({self.tiering.error})")

    def delete_records(self, stream: str, partition: int, offset: int) -> int:
        """Move the partition's start forward to `offset` (Kafka's DeleteRecords): the
        records before it are never read again, durably (a start mark,
        maintenance.py: it survives a restart and a crash at any moment), and the
        whole segments below it go as retention removes them (but those a reader in
        this process still reads, which a later retention removes). Never backwards:
        an offset at or before the start changes nothing. Readers and seeks below the
        new start get OffsetOutOfRange, as below retention's start; a seek by time
        keeps the high-water-mark rule exactly (the running max of the records before
        the start is kept with it). A reader already open below it reads on what it
        was reading. On a tiered log the store's manifest starts there too, in a new
        generation (as retention). Local only (api.LOCAL_ONLY): the Kafka listener's
        DeleteRecords, beside the log.

        A durable hold (hold()) below `offset` refuses it: a hold is a consumer's
        promise that it can replay from there (an operator's recovery, DESIGN 7), and
        a delete is an explicit act that must not break it silently; release the hold
        first.

        Args:
            offset: the new start, <= end_offset (Kafka's high watermark).
        Returns:
            The partition's start offset after it.
        Raises:
            OffsetOutOfRange for an offset past the end (Kafka's OFFSET_OUT_OF_RANGE);
            InvalidArgument for a bad offset or partition, or a durable hold below
            `offset`; InternalStream, UnknownStream, ReadOnlyLog, LogClosed, Fenced,
            PartitionFailed, and the store's errors on a tiered log.
        """
        validate.stream_name(stream)
        if layout.is_internal(stream):
            raise InternalStream(f"{stream!r} is one of streamlog's own streams")
        if isinstance(offset, bool) or not isinstance(offset, numbers.Integral) or offset < 0:
            raise InvalidArgument(f"offset must be an int >= 0 (got {offset!r})")
        self._writable(stream)
        part = self._live(self._partition(stream, partition))
        self._check_not_fenced()
        if offset > part.end_offset:
            raise OffsetOutOfRange(f"offset {offset} of {part.name} is past its end "
                                   f"({part.end_offset})")
        if offset <= part.start_offset:
            return part.start_offset  # (nothing moves: no hold is in the way)
        for name, held in holds_module.read_holds(self.fileio, part.directory).items():
            if held["offset"] < offset:
                raise InvalidArgument(
                    f"the durable hold {name!r} keeps offset {held['offset']} of "
                    f"{part.name}" + (f" (its file is damaged: {held['damaged']})"
                                      if "damaged" in held else "")
                    + f": release it before deleting the records before {offset}")
        if self.tiering is None:
            return part.delete_records(int(offset))
        self.tiering.keep(part)
        start = part.delete_records(int(offset))
        self.tiering.retain(part)  # the store's copy starts there too
        self.tiering.keep(part)
        return start

    def create_internal_stream(self, name: str, partitions: int = 1) -> int:
        """create_stream for one of streamlog's own streams (a name starting with
        "__"): the door its components (the Kafka listener's committed offsets and
        transaction state) use; clients cannot create or write them. Local only
        (api.LOCAL_ONLY): streamlog's components run beside the log."""
        validate.stream_name(name)
        if not layout.is_internal(name):
            raise InvalidArgument(f"{name!r} is not an internal stream name (they start "
                                  f"with {layout.INTERNAL_PREFIX!r})")
        return self._create_stream(name, partitions)

    def append_internal_sync(self, stream: str, values, *, keys=None,
                             partition: int = 0, txn_id: int = 0) -> AppendResult:
        """append_batch_sync into one of streamlog's own streams (create_internal_stream):
        the door its components use; every other append to them raises InternalStream.
        `txn_id`: under this open transaction (0: none), as append_batch. Local only
        (api.LOCAL_ONLY), as create_internal_stream."""
        if not layout.is_internal(stream):
            raise InvalidArgument(f"{stream!r} is not an internal stream")
        return self.submit(self._rules.rows(
            stream, len(self._partitions(stream)), values, keys, None, partition, None,
            None, txn_id)._replace(internal=True))

    def append_stamped_sync(self, stream: str, partition: int, producer: ProducerStamp, *,
                            data=None, values=None, keys=None, timestamps_us=None,
                            headers=None, txn_id: int = 0) -> AppendResult:
        """Append one Kafka producer's batch as one frame that carries its stamp
        (frame.py: producer id, epoch, base sequence), from which the Kafka listener
        rebuilds its producers' state (kafka/producer_state.py). The records come as
        append_columns' `data` or as append_batch's `values` (with `keys`,
        `timestamps_us`, `headers`), not both, under the open transaction `txn_id`
        (0: none). Local only (api.LOCAL_ONLY): the Kafka listener runs beside the log.

        Returns:
            AppendResult once durable, as append_batch.
        Raises:
            InvalidAppend when the records do not fit one frame (frame_bytes_max,
            batch_records_max; nothing is appended), and as append_batch and
            append_columns do; InvalidArgument for a bad stamp or partition.
        """
        return self.submit(self._rules.stamped(
            stream, len(self._writable(stream)), partition, producer, data=data,
            values=values, keys=keys, timestamps_us=timestamps_us, headers=headers,
            txn_id=txn_id))

    async def append_prepared(self, stream: str, partition: int, piece) -> AppendResult:
        """Append records already in the form a partition's writer takes, as one frame:
        the daemon's APPEND path (wire/session.py), which checks a received batch as
        NumPy columns, so its records are not checked again one by one as
        append_batch would. The log still checks, at C or NumPy speed, every bound a
        frame and a transaction need. Local only (api.LOCAL_ONLY): a daemon's client
        sends records (append_batch, append_columns).

        Args:
            partition: the partition's number.
            piece: a payload.EncodedRows (data records in payload form) or an
                encoder.Piece (records as lists, control kinds allowed except those
                only the log writes), with its timestamps, appended under its txn_id
                (0: no transaction). No producer stamp (append_stamped_sync).
        Returns:
            AppendResult: {partition: (first, last offset)} once durable.
        Raises:
            InvalidAppend for a piece that does not fit one frame (more than
            batch_records_max records, or nbytes over frame_bytes_max / 2), a record
            over record_bytes_max, a timestamp outside int64's range above its minimum
            or a kind only the log writes; nothing is appended. InvalidArgument for a
            bad partition or piece, or a transaction that has ended; ProducerFenced
            for a fenced producer's transaction; UnknownStream, ReadOnlyLog, LogClosed,
            PartitionFailed.
        """
        return await self.submit_async(self._rules.prepared(
            stream, len(self._writable(stream)), partition, piece))

    def start_scrubber(self, *, bytes_per_s: int | None = None, on_result=None):
        """Re-verify sealed segments in the background (scrub.py) at `bytes_per_s` (or
        the configured rate), recording each partition's result for `streamlog info`.
        Returns the Scrubber; close() stops it. Local only (api.LOCAL_ONLY): a thread
        of the process that has the log open (`streamlog serve --scrub-mib-per-s`)."""
        from .scrub import Scrubber
        assert self.scrubber is None
        rate = bytes_per_s or self.config.scrub_bytes_per_s or 32 * 1024 * 1024
        self.scrubber = Scrubber(self.fileio, self._sealed_segments, bytes_per_s=rate,
                                 interval_s=self.config.scrub_interval_s,
                                 on_result=on_result)
        self.scrubber.start()
        return self.scrubber

    def _sealed_segments(self):
        """(partition name, directory, path) of every segment that is not active."""
        out = []
        for stream in self.streams():
            for part in self._partitions(stream):
                out += [(part.name, part.directory, s.path) for s in part.segments[:-1]]
        return out

    def truncate_after(self, stream: str, partition: int, offset: int) -> int:
        """Forget every record after `offset` (crash-safe). Returns the new end offset."""
        part = self._partition(stream, partition)
        if self.tiering is not None:  # the store's copy is cut in the same step
            return self.tiering.truncate(part, lambda: part.truncate_after(offset))
        return part.truncate_after(offset)

    # -- durable holds (holds.py): positions retention keeps, across processes --------

    def hold(self, stream: str, partition: int, name: str, offset: int) -> None:
        """Keep offsets >= `offset` of the partition from retention under `name`, in
        every process and across restarts, until `release_hold` (a hold file,
        holds.py; setting it again moves it). Allowed on a read-only open (a consumer
        holds the input it still needs).

        Args:
            name: the hold's name, with a stream name's characters.
            offset: the first offset kept, >= 0.
        Returns:
            None, once the hold is durable.
        Raises:
            InvalidArgument for a bad name, offset or partition; UnknownStream,
            LogClosed.
        """
        self._check_open()
        part = self._live(self._partition(stream, partition))
        self._check_holds_here()
        holds_module.set_hold(self.fileio, part.directory, name, offset,
                              self.clock.wall_us())

    def _live(self, part):
        """`part`, unless its stream was deleted, here or by another process (its
        commit lock's file is gone: one stat): then UnknownStream, before a file is
        written for it (a hold's folder would be a stream's folder made again)."""
        if not part.deleted and part.lock.gone():
            part.mark_deleted()
        if part.deleted:
            raise UnknownStream(f"stream {part.name.rpartition('/')[0]!r} was deleted")
        return part

    def _check_holds_here(self) -> None:
        if self.remote_view is not None:
            raise ReadOnlyLog("a log read from its object store keeps no holds here: its "
                              "retention is its writer's (hold in the writer's log)")

    def release_hold(self, stream: str, partition: int, name: str) -> bool:
        """Remove the durable hold `name` (a damaged hold file too). Allowed on a
        read-only open, as hold is.

        Returns:
            True when it was there, False when there was none.
        Raises:
            InvalidArgument for a bad name or partition; UnknownStream, LogClosed.
        """
        self._check_open()
        part = self._live(self._partition(stream, partition))
        self._check_holds_here()
        return holds_module.release(self.fileio, part.directory, name)

    def holds(self, stream: str, partition: int = 0) -> dict[str, dict]:
        """The partition's durable holds.

        Returns:
            {name: {"offset": first offset kept, "updated_us": when it was set}}; a
            damaged hold file shows "damaged" and holds everything.
        Raises:
            InvalidArgument for a bad partition; UnknownStream, LogClosed.
        """
        self._check_open()
        return holds_module.read_holds(self.fileio, self._partition(stream, partition).directory)

    def apply_retention(self, now_us: int | None = None) -> list[str]:
        """Delete, in every partition, the whole sealed segments past the retention
        bounds (retention_age_s, retention_bytes), never one holding an offset a reader
        or a durable hold keeps. Each partition's deletion is a job on its writer
        thread, under its commit lock.

        Args:
            now_us: the time ages are measured at, microseconds since the epoch; None:
                the log's clock now.
        Returns:
            The deleted segment files' paths (on the machine that has the log).
        Raises:
            InvalidArgument for a now_us that is not an int; ReadOnlyLog on a read-only
            open; LogClosed, PartitionFailed.
        """
        if now_us is not None and (isinstance(now_us, bool) or not isinstance(
                now_us, numbers.Integral)):
            raise InvalidArgument(f"now_us must be an int of microseconds or None "
                                  f"(got {type(now_us).__name__})")
        now_us = self.clock.wall_us() if now_us is None else int(now_us)
        deleted = []
        for stream in self.streams():
            for part in self._partitions(stream):
                if self.tiering is not None:  # never a segment the store lacks
                    self.tiering.keep(part)
                deleted += part.apply_retention(now_us)
                if self.tiering is not None:  # the store's copy starts there too
                    self.tiering.retain(part)
        return deleted

    def info(self) -> dict:
        """Streams, partitions, offsets, time range and sizes; for a log tiered to a
        store, its remote state ("remote") and each partition's remote committed end
        (exclusive, like end_offset)."""
        out = {"path": self.path, "streams": {}}
        tiering, view = self.tiering, self.remote_view
        remote = tiering.manifest if tiering is not None else (
            view.fs.manifest if view is not None else None)
        if remote is not None:
            error = (tiering or view).error
            out["remote"] = {"url": getattr((tiering or view.fs).store, "url", None),
                             "generation": remote.generation, "epoch": remote.epoch,
                             "writer": remote.writer,
                             "fenced": tiering.fenced if tiering is not None else None,
                             "error": None if error is None else str(error)}
        if self.restored is not None:
            out["restored"] = self.restored.as_dict()
        for stream in self.streams():
            parts = []
            for part in self._partitions(stream):
                try:
                    first = part.index.first_entry()
                except CorruptIndex:  # info reports; the next open rebuilds the index
                    first = None
                parts.append({
                    "partition": part.number, "start_offset": part.start_offset,
                    "end_offset": part.end_offset, "segments": len(part.segments),
                    "bytes": part.size_bytes(),
                    "min_timestamp_us": first.min_timestamp_us if first else None,
                    "max_timestamp_us": part.state.hwm_us,
                    "recovery": part.report.as_dict(),
                    "verified": read_scrub_status(self.fileio, part.directory),
                    "holds": holds_module.read_holds(self.fileio, part.directory)})
                if remote is not None:
                    found = remote.partitions.get(part.name)
                    committed = found.committed_end if found is not None else 0
                    parts[-1]["remote_committed_offset"] = committed
                    # what the store lacks yet: records and bytes of local segments
                    parts[-1]["remote_lag_records"] = max(0, part.end_offset - committed)
                    parts[-1]["remote_lag_bytes"] = sum(
                        segment.size_bytes for segment in part.segments
                        if segment.base_offset >= committed)
            out["streams"][stream] = {"partitions": parts}
        return out

    def stats(self) -> dict:
        """Counters of this process's writer threads (appender.py: writes, fsyncs,
        records, bytes, ...) by "stream/partition". Local only (api.LOCAL_ONLY): they
        count this process's work, not the log's; a daemon publishes its own on its
        metrics port."""
        return {f"{s}/{p.number}": dict(p.appender.stats) for s in self.streams()
                for p in self._partitions(s) if p.appender is not None}
