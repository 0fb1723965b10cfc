"""Idempotent Kafka producers' state, as durable as the records: rebuilt from the
partitions, with snapshots beside them so that a rebuild reads only a bounded tail.

Strategy: the records of a batch an idempotent producer sent are appended as one frame
stamped with the producer's id, epoch and base sequence (frame.py), so the partition
itself says which producer batches it holds, whatever killed the daemon and when: the
stamp is written, fsynced and torn together with the records. The sequence rules are
producers.py's; this module keeps, per partition, the table they run on:

  - Loading (the first idempotent batch for a partition since the daemon started): the
    partition's snapshot is read and checked against the partition (below); a good
    one gives the table as of its offset, and the frames from there to the end are
    read and every stamped one replayed. Without a good snapshot the whole partition
    is read (from its start). Then a snapshot is written, so the next load starts
    there.
  - Producing: under the producer's lock, `decide`; an APPEND is appended with its
    stamp, and only once it is durable does the table take it in (`appended`). A
    batch whose append failed is not in the table; if its frame was written anyway
    (a failed fsync), the partition is failed and the next daemon rebuilds from the
    frames.
  - Snapshots: a partition's table is written as of the partition's end, at a moment
    when no stamped append of it is in flight (so every stamped frame below that end
    is in the table and none at or after it): after a load, after SNAPSHOT_BATCHES
    stamped batches, SNAPSHOT_BYTES of them, or SNAPSHOT_RECORDS records of growth
    (whoever appended them), and at a clean close. Written with a rename, so a crash
    leaves the old one or the new one.

Checking a snapshot: it names the last record before its offset (the anchor: offset,
its batch's base offset, timestamp, a digest of key and value, its batch's stamp). It
is used only if the partition still reaches its offset and the batch holding the
anchor ends exactly there and holds that record. A partition truncated below it,
deleted and created again, or restored from another copy fails the check and is read
whole instead; so does one whose anchor retention removed (the producers whose batches
went with it are forgotten, as Kafka expires them).

Bound on a load: the frames after the last snapshot, which is at most SNAPSHOT_BATCHES
idempotent batches, SNAPSHOT_BYTES of them and SNAPSHOT_RECORDS records back, plus
whatever other clients appended to the partition after the last idempotent batch (they
trigger no snapshot). Producer ids: handed out from blocks of ID_BLOCK reserved in a
file (with an flock, fsynced) before the first id of a block is used, so no id is
handed out twice, across restarts and crashes; a block starts no lower than the time
in milliseconds shifted left by 12 bits, so ids stay above those an earlier version of
the daemon handed out (it used that clock alone) and, with a clock that does not go
back, above any a lost file knew.

Files (beside the streams: the log's own layout does not know them):

    LOG/kafka/producer_ids.json          {"next": N}: no id at or above N handed out yet
    LOG/kafka/producer_ids.lock          flocked while a block is reserved
    LOG/kafka/producers/STREAM/P.json    partition P's snapshot (producers.py's codec)

Thread-safety: every method may be called from any thread (the broker runs on the
listener's thread pool). Two daemons serving Kafka producers on one log do not see each
other's tables: a producer must keep to one daemon, as it keeps to a partition's leader.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time

import xxhash

from .. import errors as log_errors
from ..fileio import read_file, write_file_atomic
from ..frame import ProducerStamp
from . import producers
from .producers import Anchor, Batch, Decision, SequenceVerdict, Snapshot

_LOG = logging.getLogger("streamlog.kafka")
ID_BLOCK = 1000
SNAPSHOT_BATCHES = 1000
SNAPSHOT_BYTES = 64 * 1024 * 1024
SNAPSHOT_RECORDS = 100_000
_PRODUCER_LOCKS = 64  # a producer's appends to a partition are serialised by one of these


class ProducerIds:
    """Producer ids that are never handed out twice (see the module docstring)."""

    def __init__(self, fileio, directory: str, *, now_ms=lambda: int(time.time() * 1000)
                 ) -> None:
        self.fileio = fileio
        self.directory = directory
        self._now_ms = now_ms
        self._lock = threading.Lock()
        self._next = self._limit = 0

    def next_id(self) -> int:
        with self._lock:
            if self._next == self._limit:
                self._next, self._limit = self._reserve()
            assert self._next < self._limit
            producer_id, self._next = self._next, self._next + 1
            return producer_id

    def _reserve(self) -> tuple[int, int]:
        """Reserve the next block durably; returns its bounds."""
        _makedirs(self.fileio, self.directory)
        handle = self.fileio.open(os.path.join(self.directory, "producer_ids.lock"),
                                  writable=True, create=True)
        try:
            self.fileio.lock(handle, exclusive=True)  # another daemon on the same log
            path = os.path.join(self.directory, "producer_ids.json")
            stored = 0
            if self.fileio.exists(path):
                try:
                    stored = int(json.loads(read_file(self.fileio, path))["next"])
                except (ValueError, KeyError, TypeError):
                    _LOG.warning("kafka_producer_ids_damaged", extra={"fields": {
                        "path": path}})  # the clock below still keeps ids apart
            start = max(stored, self._now_ms() << 12)
            assert start + ID_BLOCK < 1 << 63
            write_file_atomic(self.fileio, path,
                              json.dumps({"next": start + ID_BLOCK}).encode())
        finally:
            self.fileio.close(handle)  # and with it the flock
        return start, start + ID_BLOCK


class PartitionProducers:
    """One partition's producer table. `lock` guards `entries` and the counters (held
    briefly, never across an append); a producer's lock (`for_producer`) is held from
    its verdict to its table update, so its batches are judged one at a time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.snapshot_lock = threading.Lock()  # one snapshot written at a time
        self.entries: dict[int, producers.ProducerEntry] = {}
        self.in_flight = 0  # stamped appends between their verdict and their update
        self.snapshot_offset = 0
        self.batches_since = 0  # since the snapshot
        self.bytes_since = 0
        self._producer_locks = [threading.Lock() for _ in range(_PRODUCER_LOCKS)]

    def for_producer(self, producer_id: int) -> threading.Lock:
        return self._producer_locks[producer_id % _PRODUCER_LOCKS]

    def snapshot_due(self, end_offset: int) -> bool:
        return (self.batches_since >= SNAPSHOT_BATCHES or self.bytes_since >= SNAPSHOT_BYTES
                or end_offset - self.snapshot_offset >= SNAPSHOT_RECORDS)


class ProducerState:
    """The idempotent producers of every partition of `log` (a local, writable Log).

    Usage: `produce(...)` for each stamped batch, `next_producer_id()` for
    InitProducerId, `close()` before the log closes (writes the snapshots)."""

    def __init__(self, log) -> None:
        self.log = log
        self.directory = os.path.join(log.path, "kafka")
        self.ids = ProducerIds(log.fileio, self.directory)
        self._tables: dict[tuple[str, int], PartitionProducers] = {}
        self._loading: dict[tuple[str, int], threading.Lock] = {}
        self._lock = threading.Lock()

    def next_producer_id(self) -> int:
        return self.ids.next_id()

    def produce(self, stream: str, partition: int, producer_id: int, batch: Batch, *,
                nbytes: int, append) -> Decision:
        """Judge `batch` of producer `producer_id` for the partition and, when it is to
        be appended, call `append(stamp)`, which appends the records stamped and
        returns their base offset once durable. Returns the decision, its base_offset
        the batch's (the new one for APPEND, the first one for DUPLICATE). Errors of
        `append` are raised; the table does not take the batch in then."""
        assert producer_id >= 0
        table = self._table(stream, partition)
        with table.for_producer(producer_id):
            with table.lock:
                decision = producers.decide(table.entries.get(producer_id), batch)
                if decision.verdict is not SequenceVerdict.APPEND:
                    return decision
                table.in_flight += 1
            base = None
            try:
                base = append(ProducerStamp(producer_id, batch.epoch, batch.first_sequence))
            finally:
                with table.lock:
                    table.in_flight -= 1
                    if base is not None:
                        table.entries[producer_id] = producers.appended(
                            table.entries.get(producer_id), batch, base)
                        table.entries = producers.trimmed(table.entries)
                        table.batches_since += 1
                        table.bytes_since += nbytes
                    due = base is not None and table.snapshot_due(
                        base + batch.record_count)
        if due:
            self._snapshot(table, stream, partition)
        return Decision(SequenceVerdict.APPEND, base_offset=base)

    def close(self) -> None:
        """Snapshot every table that changed since its snapshot (a clean shutdown's
        next load then reads nothing)."""
        with self._lock:
            tables = list(self._tables.items())
        for (stream, partition), table in tables:
            if table.batches_since:
                try:
                    self._snapshot(table, stream, partition)
                except (OSError, log_errors.StreamLogError) as error:
                    _LOG.warning("kafka_producers_snapshot_failed", extra={"fields": {
                        "stream": stream, "partition": partition, "error": str(error)}})

    # -- loading -----------------------------------------------------------------------

    def _table(self, stream: str, partition: int) -> PartitionProducers:
        key = (stream, partition)
        with self._lock:
            table = self._tables.get(key)
            if table is not None:
                return table
            loading = self._loading.setdefault(key, threading.Lock())
        with loading:  # the first caller loads, the others wait for it
            with self._lock:
                table = self._tables.get(key)
            if table is None:
                table = self._load(stream, partition)
                with self._lock:
                    self._tables[key] = table
                    self._loading.pop(key, None)
        return table

    def _load(self, stream: str, partition: int) -> PartitionProducers:
        started = time.monotonic()
        log = self.log
        start, end = log.start_offset(stream, partition), log.end_offset(stream, partition)
        snapshot = self._read_snapshot(stream, partition)
        if snapshot is not None and self._matches(snapshot, stream, partition, start, end):
            entries, scan_from = dict(snapshot.entries), snapshot.offset
        else:
            entries, scan_from = {}, start
        table = PartitionProducers()
        scanned = self._replay(stream, partition, scan_from, end, entries)
        table.entries = producers.trimmed(entries)
        table.snapshot_offset = scan_from
        _LOG.info("kafka_producers_loaded", extra={"fields": {
            "stream": stream, "partition": partition, "producers": len(table.entries),
            "snapshot": None if snapshot is None else snapshot.offset,
            "from_offset": scan_from, "records_read": scanned,
            "seconds": round(time.monotonic() - started, 3)}})
        if scanned or snapshot is None or scan_from != snapshot.offset:
            self._snapshot(table, stream, partition)
        return table

    def _replay(self, stream: str, partition: int, start: int, end: int,
                entries: dict) -> int:
        """Replay the stamped frames of [start, end) into `entries`; returns how many
        records were read."""
        if start >= end:
            return 0
        read = 0
        with self.log.reader(stream, partition, from_offset=start, to_offset=end,
                             data_only=False, read_committed=False) as reader:
            for item in reader.slices():
                if not isinstance(item, tuple):  # the follow sentinel: not following
                    break
                columns, lo, hi = item
                read += hi - lo
                stamp = columns.producer
                if stamp is not None:  # (a batch the log start cut into counts too)
                    batch = Batch(stamp.producer_epoch, stamp.base_sequence, len(columns))
                    entries[stamp.producer_id] = producers.replayed(
                        entries.get(stamp.producer_id), batch, columns.base_offset)
        return read

    def _matches(self, snapshot: Snapshot, stream: str, partition: int, start: int,
                 end: int) -> bool:
        """Does the partition still hold what `snapshot` was taken over?"""
        if (snapshot.stream, snapshot.partition) != (stream, partition):
            return False
        if snapshot.offset > end:
            return False
        if snapshot.anchor is None:
            return True  # taken over an empty partition: everything is read
        if snapshot.anchor.offset < start:
            return False  # retention took the anchor: cannot be checked
        return self._anchor(stream, partition, snapshot.offset) == snapshot.anchor

    # -- snapshots ---------------------------------------------------------------------

    def _path(self, stream: str, partition: int) -> str:
        return os.path.join(self.directory, "producers", stream, f"{partition}.json")

    def _read_snapshot(self, stream: str, partition: int) -> Snapshot | None:
        path = self._path(stream, partition)
        fileio = self.log.fileio
        if not fileio.exists(path):
            return None
        try:
            return producers.decode_snapshot(read_file(fileio, path))
        except (ValueError, OSError) as error:
            _LOG.warning("kafka_producers_snapshot_unusable", extra={"fields": {
                "path": path, "error": str(error)}})
            return None

    def _snapshot(self, table: PartitionProducers, stream: str, partition: int) -> None:
        """Write the table as of the partition's end, unless a stamped append is in
        flight (then the next one writes it)."""
        with table.snapshot_lock:
            with table.lock:
                if table.in_flight:
                    return
                offset = self.log.end_offset(stream, partition)
                entries = dict(table.entries)
                batches, nbytes = table.batches_since, table.bytes_since
                table.batches_since = table.bytes_since = 0
                table.snapshot_offset = offset
            anchor = self._anchor(stream, partition, offset) if offset else None
            if offset and anchor is None:  # retention removed every record: no anchor
                return
            data = producers.encode_snapshot(Snapshot(stream, partition, offset, anchor,
                                                      entries))
            path = self._path(stream, partition)
            try:
                _makedirs(self.log.fileio, os.path.dirname(path))
                write_file_atomic(self.log.fileio, path, data)
            except BaseException:
                with table.lock:  # not written: the next append tries again
                    table.batches_since += batches
                    table.bytes_since += nbytes
                raise

    def _anchor(self, stream: str, partition: int, offset: int) -> Anchor | None:
        """The anchor of a snapshot at `offset`: the last record before it, if the
        batch holding it ends at `offset`; else None."""
        assert offset > 0
        try:
            reader = self.log.reader(stream, partition, from_offset=offset - 1,
                                     to_offset=offset, data_only=False,
                                     read_committed=False)
        except log_errors.OffsetOutOfRange:
            return None
        with reader:
            for item in reader.slices():
                if not isinstance(item, tuple):
                    return None
                columns, _lo, _hi = item
                if columns.base_offset + len(columns) != offset:
                    return None
                return _anchor_of(columns, offset - 1 - columns.base_offset)
        return None


def _anchor_of(columns, row: int) -> Anchor:
    key_offsets, value_offsets = columns.key_offsets(), columns.value_offsets()
    key_length = int(columns.key_lengths[row])
    digest = xxhash.xxh3_64()
    digest.update(key_length.to_bytes(4, "little", signed=True))
    digest.update(columns.keys[key_offsets[row]:key_offsets[row + 1]])
    digest.update(columns.values[value_offsets[row]:value_offsets[row + 1]])
    stamp = columns.producer
    return Anchor(columns.base_offset + row, columns.base_offset,
                  int(columns.timestamps_us[row]), digest.intdigest(),
                  None if stamp is None else (stamp.producer_id, stamp.producer_epoch,
                                              stamp.base_sequence))


def _makedirs(fileio, path: str) -> None:
    """Create `path` and make each new directory's name durable in its parent."""
    missing = []
    while not fileio.exists(path):
        missing.append(path)
        path = os.path.dirname(path)
    for directory in reversed(missing):
        fileio.makedirs(directory)
        fileio.fsync_dir(os.path.dirname(directory))
