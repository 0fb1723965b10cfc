"""A Log's maintenance: truncate, retention, durable holds, the scrubber, info and
stats, and the door to streamlog's own streams. Part of class Log (log.py).

Strategy: truncate_after and retention run as jobs on each partition's writer thread,
under its commit lock (partition.py, maintenance.py); durable holds are files beside
the partition (holds.py) that every process's retention respects; the scrubber
re-verifies sealed segments in the background (scrub.py).
"""

from __future__ import annotations

import numbers

from . import holds as holds_module, layout, validate
from .errors import CorruptIndex, InvalidArgument, ReadOnlyLog
from .records import AppendResult
from .scrub import read_scrub_status


class AdminOperations:
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
                             partition: int = 0) -> AppendResult:
        """append_batch_sync into one of streamlog's own streams (create_internal_stream):
        the door its components use; every other append to them raises InternalStream.
        Local only (api.LOCAL_ONLY), as create_internal_stream."""
        if not layout.is_internal(stream):
            raise InvalidArgument(f"{stream!r} is not an internal stream")
        return self.submit(self._rules.rows(
            stream, len(self._partitions(stream)), values, keys, None, partition, None,
            None, 0)._replace(internal=True))

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
        part = self._partition(stream, partition)
        self._check_holds_here()
        holds_module.set_hold(self.fileio, part.directory, name, offset,
                              self.clock.wall_us())

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
        part = self._partition(stream, partition)
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
