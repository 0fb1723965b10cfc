"""A log directory: named streams, each with P partitions.

Strategy: `open_log` validates options, joins the log's writers (locks.py: several
processes may write one log, each commit holding its partition's lock) and opens every
partition, which runs its recovery. The Log object routes
appends to partitions (by the named partition, a stable hash of the key, or round robin)
and creates readers. Every public method checks its arguments and raises
`InvalidArgument` (also a ValueError) with a sentence naming what was wrong.

Thread-safety: appends and readers may be used from many threads and event loops at
once; create_stream, truncate_after, apply_retention and close are serialised by a lock.

Why ~1,200 lines: it is the public API, and each method checks its arguments and says
what it does (Args/Returns/Raises); the work is done by the partitions.
"""

from __future__ import annotations

import functools
import json
import math
import numbers
import os
import threading
import time
import weakref

import numpy as np
import xxhash

from . import columnar, holds as holds_module, layout
from .appender import Piece
from .config import LogConfig
from .errors import (CorruptIndex, InvalidAppend, InvalidArgument, LogClosed, LogLocked,
                     ReadOnlyLog, StreamLogError, UnknownStream)
from .clock import SYSTEM_CLOCK
from .fileio import OsFileIO, read_file, write_file_atomic
from .frame import SEQUENCE_MAX, ProducerStamp
from .locks import WriterRegistry, exclusive_writer
from .partition import Partition
from . import txn as txn_module
from .payload import EncodedRows
from .reader import Reader
from .scrub import read_scrub_status
from . import validate
from .validate import INT64_MAX as _INT64_MAX, INT64_MIN as _INT64_MIN, as_bytes as _as_bytes
from .records import RECORD_OVERHEAD_BYTES, AppendResult, RecordKind, RecordPosition

FORMAT = {"format": "streamlog", "version": 1}


def open_log(path, *, fsync: str = "always", readonly: bool = False, create: bool = True,
             config: LogConfig | None = None, fileio=None, progress=None, clock=None,
             index_storage=None, **options) -> "Log":
    """Open (and by default create) the log at directory `path`, or connect to the
    daemon at a `streamlog://HOST:PORT` URL (token from STREAMLOG_TOKEN).

    Args:
        fsync: "always" | "interval" | "never" (see FsyncPolicy).
        readonly: a view: never modifies a file (several processes may write the
            log; a following reader of a view takes their appends in by itself, and
            refresh() takes everything in).
        create: create the directory when missing.
        config: a LogConfig; keyword `options` override its fields.
        progress: called with (partition name, bytes scanned) during recovery.
        clock: where time comes from (streamlog.clock.Clock; the machine's by default).
        index_storage: where the partitions' indexes live instead of LMDB files (tests:
            streamlog.testing.memindex.MemoryIndexStorage, which a simulated power loss
            rolls back with the files).
    Raises:
        InvalidArgument for a bad option, StreamLogError when the directory is not a
        log, LogLocked when this process has it open for writing already (share that
        Log: writer_in_this_process), CorruptionError when recovery finds mid-log
        corruption (writable opens). Other processes may have it open for writing.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgument(f"path must be a str or os.PathLike (got {type(path).__name__})")
    if isinstance(path, str) and path.startswith(("streamlog://", "streamlog+tls://")):
        from .wire.client import open_remote  # the daemon: same API over the network
        return open_remote(path, readonly=readonly, **options)
    base = config or LogConfig()
    unknown = set(options) - set(LogConfig.__dataclass_fields__)
    if unknown:
        raise InvalidArgument(f"unknown option(s): {', '.join(sorted(unknown))}")
    import dataclasses
    try:
        merged = dataclasses.replace(base, fsync=fsync, **options)
    except TypeError as error:
        raise InvalidArgument(str(error)) from None
    return Log(os.fspath(path), merged.validate(), readonly=readonly, create=create,
               fileio=fileio or OsFileIO(), progress=progress, clock=clock or SYSTEM_CLOCK,
               index_storage=index_storage)


class Log:
    def __init__(self, path: str, config: LogConfig, *, readonly: bool, create: bool,
                 fileio, progress=None, clock=SYSTEM_CLOCK, index_storage=None) -> None:
        self.path = path
        self.index_storage = index_storage
        self.config = config
        self.readonly = readonly
        self.fileio = fileio
        self.clock = clock
        self._lock = threading.RLock()
        self._registry: WriterRegistry | None = None
        self._settled = False
        self._round_robin: dict[str, int] = {}
        self._streams: dict[str, list[Partition]] = {}
        # A view's partitions that were opened again while readers still held them
        # (closed once none does: _reopened).
        self._retired: list[Partition] = []
        self.closed = False
        self.scrubber = None
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
            lambda: not readonly or not writer_alive(path_))
        try:
            for name in self._stream_names():
                self._open_stream(name, progress)
        except BaseException:
            self._close_partitions()
            self._release_lock()
            raise
        if self._registry is not None:
            self._registry.settle()  # other writer processes may come in now
        self._settled = True
        if not readonly and config.scrub_bytes_per_s is not None:
            self.start_scrubber()

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

    # -- directory, lock, streams ---------------------------------------------------

    def _prepare_directory(self, create: bool) -> None:
        marker = os.path.join(self.path, "streamlog.json")
        if not os.path.isdir(self.path):
            if self.readonly or not create:
                raise StreamLogError(f"no log at {self.path}")
            os.makedirs(self.path, exist_ok=True)
        if not os.path.exists(marker):
            if self.readonly:
                raise StreamLogError(f"{self.path} is not a streamlog log (no streamlog.json)")
            if any(name not in ("LOCK", "streamlog.json.tmp") for name in os.listdir(self.path)):
                raise StreamLogError(f"{self.path} is not empty and not a streamlog log; "
                                     f"refusing to write into it")
            self._take_lock()
            write_file_atomic(self.fileio, marker, json.dumps(FORMAT).encode())
            return
        try:
            found = json.loads(read_file(self.fileio, marker))
        except ValueError:
            raise StreamLogError(f"{marker} is damaged") from None
        if found.get("format") != "streamlog" or found.get("version") != 1:
            raise StreamLogError(f"{self.path}: unsupported log format {found}")
        if not self.readonly:
            self._take_lock()

    def _take_lock(self) -> None:
        if self._registry is None:
            key = _directory_key(self.path)
            with _OPEN_HERE_LOCK:
                other = _OPEN_HERE.get(key)
                if other is not None and not other.closed:
                    raise LogLocked(f"{self.path} is already open for writing in this "
                                    f"process: share that Log object")
                _OPEN_HERE[key] = self
            self._open_key = key
            self._registry = WriterRegistry(self.fileio, self.path)
            # An abandoned Log (its open failed half-way) lets go when it is collected.
            self._finalizer = weakref.finalize(self, _close_quietly, self._registry)

    def _release_lock(self) -> None:
        if self._registry is not None:
            _close_quietly(self._registry)
            self._registry = None
        with _OPEN_HERE_LOCK:
            if _OPEN_HERE.get(getattr(self, "_open_key", None)) is self:
                del _OPEN_HERE[self._open_key]

    def _stream_names(self) -> list[str]:
        directory = layout.streams_dir(self.path)
        if not os.path.isdir(directory):
            return []
        return sorted(n for n in os.listdir(directory)
                      if os.path.exists(os.path.join(directory, n, "stream.json")))

    def _open_stream(self, name: str, progress) -> None:
        meta_path = os.path.join(layout.stream_dir(self.path, name), "stream.json")
        try:
            count = int(json.loads(read_file(self.fileio, meta_path))["partitions"])
        except (ValueError, KeyError, TypeError):
            raise StreamLogError(f"{meta_path} is damaged") from None
        partitions = []
        self._streams[name] = partitions
        for number in range(count):
            partitions.append(self._open_partition(name, number, progress))

    def _open_partition(self, name: str, number: int, progress=None) -> Partition:
        alone = self._registry is not None and self._registry.alone and not self._settled
        return Partition(
            layout.partition_dir(self.path, name, number), f"{name}/{number}", number,
            self.config, self.fileio, readonly=self.readonly, alone=alone,
            probe_unsealed=self._probe_unsealed, clock=self.clock,
            index_storage=self.index_storage, progress=(lambda scanned, n=f"{name}/{number}": progress(n, scanned))
            if progress else None)

    def refresh(self) -> None:
        """A read-only view follows the writer (in another process): new streams, and
        in every partition the frames and segments added and the segments retention
        removed since the open or the last refresh. A partition that was truncated
        meanwhile is reopened (a follower goes on in the new one, or gets
        OffsetOutOfRange when records it delivered were cut; other readers finish
        what they started). Far cheaper than reopening the log. A following reader
        does this for its own partition without being asked (Reader.wait). A
        writable log takes in what writers in other processes appended (its own
        appends are always current)."""
        if not self.readonly:
            self._check_open()
            for name in self._stream_names():
                self._find_stream(name)
            for partitions in list(self._streams.values()):
                for part in partitions:
                    part.poll()
            return
        with self._lock:
            self._check_open()
            for name in self._stream_names():
                if name not in self._streams:
                    self._open_stream(name, None)
            for name, partitions in self._streams.items():
                for number, part in enumerate(partitions):
                    if not part.refresh():
                        self._reopened(name, number, part)

    def _reopened(self, stream: str, number: int, stale: Partition) -> Partition:
        """A view's partition `number` of `stream` as it is now: opened again when the
        one here is still `stale` (it could not follow the files in place), else the
        one here. The stale one is closed once no reader holds it. Any thread (a
        following Reader asks); LogClosed once the log is closed."""
        with self._lock:
            self._check_open()
            partitions = self._streams[stream]
            if partitions[number] is stale:
                partitions[number] = self._open_partition(stream, number)
                stale.retire()
                self._retired.append(stale)
            self._retired = [part for part in self._retired if not part.close_if_idle()]
            return partitions[number]

    def create_stream(self, name: str, partitions: int = 1) -> int:
        """Create stream `name` with `partitions` partitions; a no-op when it exists
        with that many. Returns the partition count."""
        self._check_open()
        if not layout.valid_stream_name(name):
            raise InvalidArgument(f"invalid stream name {name!r}: use letters, digits, "
                                  f"'.', '_' and '-', at most 200 characters")
        if isinstance(partitions, bool) or not isinstance(partitions, int) or not (
                1 <= partitions <= self.config.partitions_max):
            raise InvalidArgument(f"partitions must be an int in 1..{self.config.partitions_max}"
                                  f" (got {partitions!r})")
        with self._lock:
            if name in self._streams:
                existing = len(self._streams[name])
                if existing != partitions:
                    raise _partitions_differ(name, existing, partitions)
                return existing
            if self.readonly:
                raise ReadOnlyLog("the log was opened read-only")
            directory = layout.stream_dir(self.path, name)
            os.makedirs(directory, exist_ok=True)
            guard = self.fileio.open(os.path.join(layout.streams_dir(self.path), ".lock"),
                                     writable=True, create=True)
            try:  # a writer in another process may be creating it too
                self.fileio.lock(guard, exclusive=True)
                if not self._find_stream(name):
                    write_file_atomic(self.fileio, os.path.join(directory, "stream.json"),
                                      json.dumps({"partitions": partitions}).encode())
                    self.fileio.fsync_dir(layout.streams_dir(self.path))
                    self._open_stream(name, None)
            finally:
                self.fileio.close(guard)
            existing = len(self._streams[name])
            if existing != partitions:
                raise _partitions_differ(name, existing, partitions)
            return partitions

    def _find_stream(self, name: str) -> bool:
        """Is `name` a stream, perhaps one another process created since this one
        opened the log? Opens it when it is new here."""
        with self._lock:
            if name in self._streams:
                return True
            if not layout.valid_stream_name(name) or not os.path.exists(
                    os.path.join(layout.stream_dir(self.path, name), "stream.json")):
                return False
            self._open_stream(name, None)
            return True

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
        if isinstance(partition, bool) or not isinstance(partition, int) or not (
                0 <= partition < len(partitions)):
            raise InvalidArgument(f"stream {stream!r} has partitions 0..{len(partitions) - 1}"
                                  f" (got {partition!r})")
        return partitions[partition]

    def _check_open(self) -> None:
        if self.closed:
            raise LogClosed(f"the log at {self.path} is closed")

    # -- appends --------------------------------------------------------------------

    async def append(self, stream: str, value, *, key=None, timestamp_us=None,
                     partition=None, headers=None, kind=RecordKind.DATA,
                     txn_id: int = 0) -> RecordPosition:
        """Append one record; returns where it landed once durable under the policy."""
        part, pieces = self._prepare_one(stream, value, key, timestamp_us, partition, headers,
                                         kind, txn_id)
        return RecordPosition(part.number, await part.submit_async(pieces))

    def append_sync(self, stream: str, value, *, key=None, timestamp_us=None, partition=None,
                    headers=None, kind=RecordKind.DATA, txn_id: int = 0) -> RecordPosition:
        """Blocking append() for code that is not asyncio."""
        part, pieces = self._prepare_one(stream, value, key, timestamp_us, partition, headers,
                                         kind, txn_id)
        return RecordPosition(part.number, part.submit(pieces))

    def _prepare_one(self, stream, value, key, timestamp_us, partition, headers, kind, txn_id):
        """The single-record path: the common case checked inline, the rest through the
        general batch checks (which give the same errors)."""
        partitions = self._streams.get(stream) if type(stream) is str else None
        if (partitions is not None and not self.closed and not self.readonly
                and type(value) is bytes and (key is None or type(key) is bytes)
                and (timestamp_us is None or type(timestamp_us) is int
                     and _INT64_MIN < timestamp_us <= _INT64_MAX)
                and not headers and kind == RecordKind.DATA and txn_id == 0
                and (partition is None or type(partition) is int
                     and 0 <= partition < len(partitions))
                and len(value) + (len(key) if key is not None else 0)
                <= self.config.record_bytes_max):
            if partition is None:
                partition = self._assign(stream, [key], len(partitions)).popitem()[0]
            if timestamp_us is None:
                timestamp_us = self.clock.wall_us()
            size = len(value) + (len(key) if key is not None else 0) + RECORD_OVERHEAD_BYTES
            return partitions[partition], [Piece([timestamp_us], [key], [value], None, None,
                                                 size, 0)]
        target, pieces = self._prepare(stream, [value], [key], _one(timestamp_us), partition,
                                       [headers] if headers else None, _kinds(kind), txn_id)
        (number, piece_list), = pieces.items()
        return target[number], piece_list

    async def append_batch(self, stream: str, values, *, keys=None, timestamps_us=None,
                           partition=None, headers=None, kinds=None,
                           txn_id: int = 0) -> AppendResult:
        """Append records given as parallel sequences; each partition's share lands
        contiguously. Returns {partition: (first, last)} once durable."""
        import asyncio
        target, pieces = self._prepare(stream, values, keys, timestamps_us, partition,
                                       headers, kinds, txn_id)
        numbers = list(pieces)
        firsts = await asyncio.gather(*(target[n].submit_async(pieces[n]) for n in numbers))
        return _result(numbers, firsts, pieces)

    def append_batch_sync(self, stream: str, values, *, keys=None, timestamps_us=None,
                          partition=None, headers=None, kinds=None,
                          txn_id: int = 0) -> AppendResult:
        target, pieces = self._prepare(stream, values, keys, timestamps_us, partition,
                                       headers, kinds, txn_id)
        numbers = list(pieces)
        firsts = [target[n].submit(pieces[n]) for n in numbers]
        return _result(numbers, firsts, pieces)

    def append_stamped_sync(self, stream: str, partition: int, producer: ProducerStamp, *,
                            data=None, values=None, keys=None, timestamps_us=None,
                            headers=None) -> AppendResult:
        """Append one Kafka producer's batch as one frame that carries its stamp
        (frame.py: producer id, epoch, base sequence), from which the Kafka listener
        rebuilds its producers' state (kafka/producer_state.py). The records come as
        append_columns' `data` or as append_batch's `values` (with `keys`,
        `timestamps_us`, `headers`), not both. Local only (api.LOCAL_ONLY): the
        Kafka listener runs beside the log.

        Returns:
            AppendResult once durable, as append_batch.
        Raises:
            InvalidAppend when the records do not fit one frame (frame_bytes_max,
            batch_records_max; nothing is appended), and as append_batch and
            append_columns do; InvalidArgument for a bad stamp or partition.
        """
        if (data is None) == (values is None):
            raise InvalidArgument("give the records as data (columns) or as values")
        if isinstance(partition, bool) or not isinstance(partition, int):
            raise InvalidArgument(f"partition must be an int (got {partition!r})")
        if data is not None:
            target, pieces = self._prepare_columns(stream, data, partition, 0)
        else:
            target, pieces = self._prepare(stream, values, keys, timestamps_us, partition,
                                           headers, None, 0)
        _stamp(pieces, producer)
        numbers = list(pieces)
        firsts = [target[n].submit(pieces[n]) for n in numbers]
        return _result(numbers, firsts, pieces)

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
                appender.Piece (records as lists, control kinds allowed except those
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
        part = self._partition(stream, partition)
        if self.readonly:
            raise ReadOnlyLog("the log was opened read-only")
        _check_prepared(piece, self.config)
        if piece.txn_id:
            part.check_appendable(piece.txn_id)
            part.txns_written_here.add(piece.txn_id)
        first = await part.submit_async([piece])
        count = piece.record_count
        return AppendResult({part.number: (first, first + count - 1)}, count)

    def producer(self, stream: str, **options):
        """Returns a Producer of `stream` (producer.py): records sent one at a time,
        written in group-committed batches; `options` are Producer's (linger_ms, ...)."""
        from .producer import Producer
        return Producer(self, stream, **options)

    def _prepare(self, stream, values, keys, timestamps_us, partition, headers, kinds, txn_id):
        partitions = self._partitions(stream)
        if self.readonly:
            raise ReadOnlyLog("the log was opened read-only")
        values, keys, timestamps, headers, kinds = _validate(
            values, keys, timestamps_us, headers, kinds, self.config, self.clock)
        _check_txn_id(txn_id)
        if partition is not None:
            self._partition(stream, partition)
            assignment = {partition: range(len(values))}
        else:
            assignment = self._assign(stream, keys, len(partitions))
        pieces = {}
        for number, rows in assignment.items():
            pieces[number] = _cut(rows, values, keys, timestamps, headers, kinds, txn_id,
                                  self.config)
            if txn_id:
                partitions[number].check_appendable(txn_id)
                partitions[number].txns_written_here.add(txn_id)
        return partitions, pieces

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
        import asyncio
        target, pieces = self._prepare_columns(stream, data, partition, txn_id)
        numbers = list(pieces)
        firsts = await asyncio.gather(*(target[n].submit_async(pieces[n]) for n in numbers))
        return _result(numbers, firsts, pieces)

    def append_columns_sync(self, stream: str, data, *, partition: int | None = None,
                            txn_id: int = 0) -> AppendResult:
        """Blocking append_columns() for code that is not asyncio."""
        target, pieces = self._prepare_columns(stream, data, partition, txn_id)
        numbers = list(pieces)
        firsts = [target[n].submit(pieces[n]) for n in numbers]
        return _result(numbers, firsts, pieces)

    def _prepare_columns(self, stream, data, partition, txn_id):
        """append_columns' checks, partition choice and encoding (columnar.py): the
        partitions and {partition number: [EncodedRows]}."""
        partitions = self._partitions(stream)
        if self.readonly:
            raise ReadOnlyLog("the log was opened read-only")
        rows = columnar.rows_from(data, record_bytes_max=self.config.record_bytes_max)
        if rows.timestamps_us is None:
            rows = rows.stamped(self.clock.wall_us())
        _check_txn_id(txn_id)
        if partition is not None:
            self._partition(stream, partition)
            groups = {partition: rows}
        elif len(partitions) == 1:
            groups = {0: rows}
        else:
            with self._lock:
                numbers, self._round_robin[stream] = columnar.partition_numbers(
                    rows, len(partitions), self._round_robin.get(stream, 0))
            groups = columnar.split(rows, numbers)
        pieces = {number: columnar.encode(group, txn_id,
                                          frame_bytes_max=self.config.frame_bytes_max,
                                          batch_records_max=self.config.batch_records_max)
                  for number, group in groups.items()}
        if txn_id:
            for number in pieces:
                partitions[number].check_appendable(txn_id)
                partitions[number].txns_written_here.add(txn_id)
        return partitions, pieces

    def _assign(self, stream: str, keys, count: int) -> dict[int, list[int]]:
        if count == 1:
            return {0: range(len(keys))}
        out: dict[int, list[int]] = {}
        with self._lock:
            next_robin = self._round_robin.get(stream, 0)
            for row, key in enumerate(keys):
                if key is None:
                    number, next_robin = next_robin % count, next_robin + 1
                else:
                    number = partition_for_key(key, count)
                out.setdefault(number, []).append(row)
            self._round_robin[stream] = next_robin
        return out

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
            start = part.offset_for_timestamp(from_timestamp_us)
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
        return part.offset_for_timestamp(_clamp(timestamp_us))

    def end_offset(self, stream: str, partition: int = 0) -> int:
        return self._partition(stream, partition).next_offset

    def start_offset(self, stream: str, partition: int = 0) -> int:
        return self._partition(stream, partition).start_offset

    # -- waiting for appends (a long poll: the Kafka listener's fetch) ---------------

    def wait_for(self, stream: str, partition: int, offset: int, timeout_s: float) -> bool:
        """Block until the partition's acknowledged end is past `offset` (a record at
        `offset` can be read), or `timeout_s` has passed. Waits on the live tail as a
        following Reader does (Reader.wait): woken by this process's writer (or a
        view's refresh), and every poll interval (follow_poll_s; a view's
        view_poll_s) taking in what writers in other processes appended. A view's
        partition that cannot be followed in place is opened again, as for a
        follower. Local only (api.LOCAL_ONLY): a daemon's client follows with
        reader(..., follow=True). Any thread.

        Args:
            offset: an offset >= 0; the end is past it when end_offset() > offset.
            timeout_s: the longest wait, in seconds (a finite number >= 0).
        Returns:
            True once end_offset(stream, partition) > offset; False on timeout.
        Raises:
            UnknownStream, InvalidArgument (a bad partition, offset or timeout), and
            LogClosed when the log is closed, before or during the wait.
        """
        deadline = _wait_deadline(offset, timeout_s)
        while True:
            part = self._waiting_on(stream, partition)
            if part.next_offset > offset:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if part.ring.wait(offset, min(remaining, _follow_poll_s(part))):
                return True
            if _others_were_here(part):
                part.poll()

    async def wait_for_async(self, stream: str, partition: int, offset: int,
                             timeout_s: float) -> bool:
        """`wait_for` for an event loop: the same answer, without blocking the loop. A
        task cancelled while waiting leaves nothing behind."""
        import asyncio
        deadline = _wait_deadline(offset, timeout_s)
        while True:
            part = self._partition(stream, partition)
            if part.closed or part.stale:  # (opening a view's partition again reads files)
                part = await asyncio.to_thread(self._waiting_on, stream, partition)
            if part.next_offset > offset:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if await part.ring.wait_async(offset, min(remaining, _follow_poll_s(part))):
                return True
            if _others_were_here(part):
                await asyncio.to_thread(part.poll)

    def _waiting_on(self, stream: str, partition: int) -> Partition:
        """The partition a wait watches now. A writable log's partitions close only
        with the log; a view's one that could not follow its files is replaced by the
        one opened again (`_reopened`, which raises LogClosed once the log is)."""
        part = self._partition(stream, partition)
        if not (part.closed or part.stale):
            return part
        if not self.readonly:
            raise LogClosed(f"the log at {self.path} was closed while waiting")
        return self._reopened(stream, partition, part)

    # -- transactions (DESIGN 6, txn.py) ---------------------------------------------

    new_txn_id = staticmethod(txn_module.new_txn_id)

    def commit_txn(self, stream: str, partition: int, txn_id: int, *, tag: str = "",
                   marker: bytes = b"") -> int:
        """Append the COMMIT marker of an open transaction; returns its offset once
        durable. `tag`/`marker` are remembered for last_commit(tag). ProducerFenced when
        the transaction's producer was fenced (init_producer)."""
        if not isinstance(tag, str) or len(tag.encode()) >= 1 << 16:
            raise InvalidArgument("tag must be a str shorter than 64 KiB")
        if tag.startswith(txn_module.PRODUCER_TAG_PREFIX):
            raise InvalidArgument(f"tags starting with {txn_module.PRODUCER_TAG_PREFIX!r} "
                                  f"are reserved for producers' fences")
        return self._txn_partition(stream, partition, txn_id).end_txn(
            txn_id, RecordKind.COMMIT,
            txn_module.encode_commit(tag, _as_bytes(marker, "marker", 0)))

    def abort_txn(self, stream: str, partition: int, txn_id: int) -> int:
        """Append the ABORT marker of an open transaction: its data is never visible."""
        return self._txn_partition(stream, partition, txn_id).end_txn(txn_id,
                                                                      RecordKind.ABORT)

    def init_producer(self, stream: str, partition: int, transactional_id: str) -> int:
        """Start a transactional producer (DESIGN 6, txn.py): abort at once the open
        transactions that earlier producers with this id began in the partition, and
        fence them (their later begins, appends and commits raise ProducerFenced).
        Returns this producer's epoch, for begin_txn."""
        return self._partition(stream, partition).init_producer(
            txn_module.check_transactional_id(transactional_id))

    def begin_txn(self, stream: str, partition: int, transactional_id: str,
                  epoch: int) -> int:
        """Open a transaction of the producer (transactional_id, epoch) and return its
        id: append under it, then commit_txn or abort_txn. ProducerFenced when a later
        producer with the id has started."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise InvalidArgument(f"epoch must be an int >= 0, from init_producer "
                                  f"(got {epoch!r})")
        return self._partition(stream, partition).begin_txn(
            txn_module.check_transactional_id(transactional_id), epoch)

    def txn_state(self, stream: str, partition: int, txn_id: int):
        """TxnState of a transaction in a partition, or None when it has no data there."""
        return self._partition(stream, partition).txn_state(txn_id)

    def last_stable_offset(self, stream: str, partition: int = 0) -> int:
        """First offset of the oldest open transaction, or the end: a read_committed
        reader delivers nothing at or past it until that transaction ends."""
        return self._partition(stream, partition).last_stable_offset()

    def batch_holding(self, stream: str, partition: int, offset: int):
        """(base_offset, stored frame bytes, columns) of the batch that holds `offset`:
        the unit an operator reading a log backwards steps by (operators/cec.py).
        Local only (api.LOCAL_ONLY): it hands out the stored batch, the unit of this
        log's files; a daemon's client reads ranges (reader)."""
        entry, columns = self._partition(stream, partition).batch_holding(offset)
        return entry.base_offset, entry.frame_bytes, columns

    def open_transactions(self, stream: str, partition: int) -> dict[int, int]:
        """The transactions the partition's index says are still open: what an
        operator (or the daemon's sweep of stale transactions) looks at before it
        ends them. commit_txn and abort_txn confirm from the segments before they
        write a marker for one this process did not write.

        Returns:
            {txn_id: first offset of its records}.
        Raises:
            UnknownStream, InvalidArgument for a bad partition, LogClosed.
        """
        return self._partition(stream, partition).open_txn_candidates()

    def last_commit(self, stream: str, partition: int, tag: str) -> bytes | None:
        """Marker of the latest commit made with `tag` in the partition, or None."""
        return self._partition(stream, partition).last_commit(tag)

    def _txn_partition(self, stream: str, partition: int, txn_id: int):
        if isinstance(txn_id, bool) or not isinstance(txn_id, int) or not 0 < txn_id < 1 << 64:
            raise InvalidArgument(f"txn_id must be an int in 1..2**64-1 (got {txn_id!r})")
        return self._partition(stream, partition)

    # -- maintenance ----------------------------------------------------------------

    def truncate_after(self, stream: str, partition: int, offset: int) -> int:
        """Forget every record after `offset` (crash-safe). Returns the new end offset."""
        return self._partition(stream, partition).truncate_after(offset)

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
        holds_module.set_hold(self.fileio, part.directory, name, offset,
                              self.clock.wall_us())

    def release_hold(self, stream: str, partition: int, name: str) -> bool:
        """Remove the durable hold `name` (a damaged hold file too). Allowed on a
        read-only open, as hold is.

        Returns:
            True when it was there, False when there was none.
        Raises:
            InvalidArgument for a bad name or partition; UnknownStream, LogClosed.
        """
        self._check_open()
        return holds_module.release(self.fileio, self._partition(stream, partition).directory,
                                    name)

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
                deleted += part.apply_retention(now_us)
        return deleted

    def info(self) -> dict:
        """Streams, partitions, offsets, time range and sizes."""
        out = {"path": self.path, "streams": {}}
        for stream in self.streams():
            parts = []
            for part in self._partitions(stream):
                try:
                    first = part.index.first_entry()
                except CorruptIndex:  # info reports; the next open rebuilds the index
                    first = None
                parts.append({
                    "partition": part.number, "start_offset": part.start_offset,
                    "end_offset": part.next_offset, "segments": len(part.segments),
                    "bytes": part.size_bytes(),
                    "min_timestamp_us": first.min_timestamp_us if first else None,
                    "max_timestamp_us": part.hwm_us,
                    "recovery": part.report.as_dict(),
                    "verified": read_scrub_status(self.fileio, part.directory),
                    "holds": holds_module.read_holds(self.fileio, part.directory)})
            out["streams"][stream] = {"partitions": parts}
        return out

    def stats(self) -> dict:
        """Counters of this process's writer threads (appender.py: writes, fsyncs,
        records, bytes, ...) by "stream/partition". Local only (api.LOCAL_ONLY): they
        count this process's work, not the log's; a daemon publishes its own on its
        metrics port."""
        return {f"{s}/{p.number}": dict(p.appender.stats) for s in self.streams()
                for p in self._partitions(s) if p.appender is not None}

    def close(self) -> None:
        """Drain queued appends, fsync, leave the log's writers (the last one seals the
        indexes). Idempotent."""
        with self._lock:
            if self.closed:
                return
            if self.scrubber is not None:
                self.scrubber.stop()
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
        import asyncio
        await asyncio.to_thread(self.close)

    def __enter__(self) -> "Log":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    async def __aenter__(self) -> "Log":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


class _Exclusive:
    def __init__(self, fileio, handle: int) -> None:
        self.fileio, self.handle = fileio, handle

    def close(self) -> None:
        self.fileio.close(self.handle)


def take_writer_lock(path: str):
    """Be the log's only writer (`streamlog repair`): LOG/LOCK held exclusively.
    Returns an object whose close() lets go. Raises LogLocked when a writer has the
    log open."""
    fileio = OsFileIO()
    return _Exclusive(fileio, exclusive_writer(fileio, path))


# (device, inode) -> the Log this process has open for writing there
_OPEN_HERE: "weakref.WeakValueDictionary[tuple[int, int], Log]" = weakref.WeakValueDictionary()
_OPEN_HERE_LOCK = threading.Lock()


def writer_in_this_process(path) -> "Log | None":
    """The Log this process has open for writing at directory `path`, if any (a second
    writable open in the same process is refused: share this one)."""
    try:
        key = _directory_key(os.fspath(path))
    except (OSError, TypeError, ValueError):
        return None  # no such directory (or a daemon URL)
    with _OPEN_HERE_LOCK:
        found = _OPEN_HERE.get(key)
    return found if found is not None and not found.closed else None


def _close_quietly(registry: WriterRegistry) -> None:
    try:
        registry.close()
    except OSError:
        pass  # the file system is gone (a simulated power loss): nothing is held


def _directory_key(path: str) -> tuple[int, int]:
    """The log directory's identity (device, inode): one writable Log per process (LMDB
    allows one environment per file per process)."""
    found = os.stat(path)
    return found.st_dev, found.st_ino


def writer_alive(path: str) -> bool:
    """Does a process hold the log's writer lock now? Read from /proc/locks without
    touching the lock (taking it, even for a moment, could turn a writer away). Where
    that cannot be read, the answer is yes (the cautious one for its callers)."""
    try:
        inode = os.stat(os.path.join(path, "LOCK")).st_ino
    except OSError:
        return False  # no LOCK file: no writer has ever opened the log
    try:
        with open("/proc/locks", "rb") as handle:
            table = handle.read().decode("ascii", "replace")
    except OSError:
        return True
    for line in table.splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5].rsplit(":", 1)[-1] == str(
                inode):
            return True
    return False


def partition_for_key(key: bytes, count: int) -> int:
    """Stable across processes and versions: xxh3_64 of the key, modulo the count."""
    return xxhash.xxh3_64_intdigest(key) % count


def _wait_deadline(offset, timeout_s) -> float:
    """wait_for's arguments checked; its deadline on the monotonic clock. (Real time,
    not the log's clock: the waits under it are a Condition's and an event loop's.)"""
    if isinstance(offset, bool) or not isinstance(offset, numbers.Integral) or offset < 0:
        raise InvalidArgument(f"offset must be an int >= 0 (got {offset!r})")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real) or not (
            math.isfinite(timeout_s) and timeout_s >= 0):
        raise InvalidArgument(f"timeout_s must be a finite number of seconds >= 0 "
                              f"(got {timeout_s!r})")
    return time.monotonic() + timeout_s


def _others_were_here(part: Partition) -> bool:
    """May another process have changed the partition since this one took it in? The
    commit lock's counter says so with a memory read (locks.PartitionLock.moved, never
    a false no), so a wait asks the writer thread for a poll (a job, the lock taken)
    only then: a long poll on many quiet partitions costs no job per interval."""
    return part.lock.moved() or part.lock.handle is None


def _follow_poll_s(part: Partition) -> float:
    """How long a wait at the end goes before it asks for other processes' appends:
    a view's look is cheap (config.view_poll_s), as for a following Reader."""
    config = part.config
    return config.view_poll_s if part.readonly else config.follow_poll_s


def _clamp(timestamp_us) -> int:
    """Query timestamps outside int64 mean 'before everything' or 'after everything'."""
    return min(max(int(timestamp_us), _INT64_MIN + 1), _INT64_MAX)


def _partitions_differ(name: str, existing: int, asked: int) -> InvalidArgument:
    noun = "partition" if existing == 1 else "partitions"
    return InvalidArgument(f"stream {name!r} has {existing} {noun}, not {asked}")


def _check_txn_id(txn_id) -> None:
    if isinstance(txn_id, bool) or not isinstance(txn_id, int) or not 0 <= txn_id < 1 << 64:
        raise InvalidAppend(f"txn_id must be an int in 0..2**64-1 (got {txn_id!r})")


def _kinds(kind):
    return None if kind == RecordKind.DATA else [kind]


def _one(timestamp_us):
    return None if timestamp_us is None else [timestamp_us]


def _validate(values, keys, timestamps_us, headers, kinds, config: LogConfig, clock):
    """Check and normalise one append's columns (validate.records), bound each record's
    size, and stamp the append time when the caller gave no timestamps."""
    values, keys, timestamps, headers, kinds = validate.records(values, keys, timestamps_us,
                                                                headers, kinds)
    _check_sizes(values, keys, config.record_bytes_max)
    if timestamps is None:
        timestamps = [clock.wall_us()] * len(values)
    return values, keys, timestamps, headers, kinds




def _check_prepared(piece, config: LogConfig) -> None:
    """append_prepared's checks of a piece: no loop per record in Python."""
    if not isinstance(piece, (EncodedRows, Piece)) or piece.producer is not None:
        raise InvalidArgument(f"piece must be a payload.EncodedRows or an appender.Piece "
                              f"without a producer stamp (got {type(piece).__name__})")
    _check_txn_id(piece.txn_id)
    count = piece.record_count
    if not 1 <= count <= config.batch_records_max or piece.nbytes > (
            config.frame_bytes_max // 2):
        raise InvalidAppend(f"a prepared piece must fit one frame: {count} records of "
                            f"{piece.nbytes} bytes (batch_records_max, frame_bytes_max)")
    if isinstance(piece, EncodedRows):
        _check_encoded(piece, config.record_bytes_max)
        return
    assert len(piece.values) == len(piece.keys) == len(piece.timestamps_us) == count
    _check_sizes(piece.values, piece.keys, config.record_bytes_max)
    if set(map(type, piece.timestamps_us)) != {int} or not (
            min(piece.timestamps_us) > _INT64_MIN and max(piece.timestamps_us) <= _INT64_MAX):
        raise InvalidAppend("a prepared piece's timestamps must be ints in int64's range "
                            "above its minimum")
    if piece.kinds is not None:
        validate.record_kinds(piece.kinds)  # raises for a kind only the log writes


def _check_encoded(piece: EncodedRows, limit: int) -> None:
    assert len(piece.key_lengths) == len(piece.value_lengths) == piece.record_count
    sizes = piece.value_lengths.astype(np.int64) + np.maximum(piece.key_lengths, 0)
    if int(sizes.max()) > limit:
        row = int(np.flatnonzero(sizes > limit)[0])
        raise InvalidAppend(f"record {row} is {int(sizes[row])} bytes; the limit is {limit} "
                            f"(record_bytes_max)")
    if int(piece.timestamps_us.min()) <= _INT64_MIN:
        raise InvalidAppend("a prepared piece's timestamps must be above int64's minimum")


def _check_sizes(values, keys, limit: int) -> None:
    """InvalidAppend naming the first record whose key and value are over `limit`."""
    # filter(None, ...) drops None (no key) and b"" (adds nothing) at C speed
    if max(map(len, values)) + max(map(len, filter(None, keys)), default=0) > limit:
        for i in range(len(values)):
            size = len(values[i]) + (len(keys[i]) if keys[i] is not None else 0)
            if size > limit:
                raise InvalidAppend(f"record {i} is {size} bytes; the limit is {limit} "
                                    f"(record_bytes_max)")


def _stamp(pieces: dict, producer: ProducerStamp) -> None:
    """Give the one piece of a Kafka producer's batch its stamp. A stamp describes one
    frame, written whole or not at all: a batch cut into several frames could be found
    half-written after a crash and taken for appended, so it is refused (as Kafka
    refuses a batch over max.message.bytes)."""
    if not isinstance(producer, ProducerStamp) or not (
            0 <= producer.producer_id < 1 << 63 and 0 <= producer.producer_epoch <= 0x7FFF
            and 0 <= producer.base_sequence <= SEQUENCE_MAX):
        raise InvalidArgument(f"producer must be a ProducerStamp with an id in 0..2**63-1, "
                              f"an epoch in 0..32767 and a sequence in 0..2**31-1 "
                              f"(got {producer!r})")
    assert len(pieces) == 1  # the partition was named
    (piece_list,) = pieces.values()
    if len(piece_list) != 1:
        raise InvalidAppend(f"a producer's batch must fit one frame: "
                            f"{sum(p.record_count for p in piece_list)} records cut into "
                            f"{len(piece_list)} (frame_bytes_max, batch_records_max)")
    piece_list[0].producer = producer


def _cut(rows, values, keys, timestamps, headers, kinds, txn_id, config) -> list[Piece]:
    """Split the rows going to one partition into pieces that each fit one frame."""
    budget = config.frame_bytes_max // 2
    if isinstance(rows, range) and len(rows) == len(values) and len(rows) <= (
            config.batch_records_max):
        size = (sum(map(len, values)) + sum(map(len, filter(None, keys)))
                + RECORD_OVERHEAD_BYTES * len(rows))
        if size <= budget:
            return [_piece(rows, values, keys, timestamps, headers, kinds, txn_id, size)]
    pieces, current, size = [], [], 0
    for row in rows:
        record = (len(values[row]) + (len(keys[row]) if keys[row] is not None else 0)
                  + RECORD_OVERHEAD_BYTES)
        if current and (size + record > budget or len(current) >= config.batch_records_max):
            pieces.append(_piece(current, values, keys, timestamps, headers, kinds, txn_id,
                                 size))
            current, size = [], 0
        current.append(row)
        size += record
    pieces.append(_piece(current, values, keys, timestamps, headers, kinds, txn_id, size))
    return pieces


def _piece(rows, values, keys, timestamps, headers, kinds, txn_id, size) -> Piece:
    if isinstance(rows, range) and rows.start == 0 and rows.stop == len(values):
        return Piece(list(timestamps), keys, values, kinds, headers, size, txn_id)
    return Piece([timestamps[r] for r in rows], [keys[r] for r in rows],
                 [values[r] for r in rows],
                 None if kinds is None else [kinds[r] for r in rows],
                 None if headers is None else [headers[r] for r in rows], size, txn_id)


def _result(numbers, firsts, pieces) -> AppendResult:
    ranges, total = {}, 0
    for number, first in zip(numbers, firsts):
        count = sum(p.record_count for p in pieces[number])
        ranges[number] = (first, first + count - 1)
        total += count
    return AppendResult(ranges, total)
