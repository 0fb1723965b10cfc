"""Every append rule in one place: what an append may hold, and how it becomes pieces.

Strategy: whatever form records come in (one record, parallel lists, Arrow or NumPy
columns, a daemon's prepared piece, a Kafka producer's stamped batch), `AppendRules`
turns them into one value, a `Submission`: the stream, and for each partition the
pieces its writer takes, each fitting one frame. On the way it checks the records
(validate.py, columnar.py: the same errors whatever the form), bounds each record's
size (record_bytes_max; a record counts RECORD_OVERHEAD_BYTES beyond its key and value),
stamps the append time from the log's clock when none was given, picks partitions (the
named one, a key's stable hash, or round robin for records without a key) and cuts each
partition's share into frame-sized pieces. `Log.submit` (sync, async, or with a waiter
the writer resolves) is then the one door to the partitions' writers: Log's own appends,
the Producer, the daemon and the Kafka listener all come through it, and it takes the
transaction checks (txn_jobs.check_appendable) on the way in. The one exception is a
plain single record awaited with Log.append (`plain`: no headers, no transaction),
which joins its event loop's batch for the partition (coalesce.py), whose pieces reach
the same writer.

Pure but for the clock and the round-robin counters (one per stream, under a lock).
"""

from __future__ import annotations

import threading
from typing import NamedTuple

import numpy as np
import xxhash

from . import columnar, validate
from .config import LogConfig
from .encoder import Piece
from .errors import InvalidAppend, InvalidArgument
from .frame import SEQUENCE_MAX, ProducerStamp
from .payload import EncodedRows
from .records import RECORD_OVERHEAD_BYTES, AppendResult, RecordKind

INT64_MIN, INT64_MAX = validate.INT64_MIN, validate.INT64_MAX


class Submission(NamedTuple):
    """One append, ready for the partitions' writers."""

    stream: str
    pieces: dict  # partition number -> [Piece or payload.EncodedRows], each one frame
    txn_id: int = 0  # the transaction every piece is appended under (0: none)
    internal: bool = False  # through the door to streamlog's own streams (Log.*_internal*)

    def result(self, firsts) -> AppendResult:
        """The AppendResult, given each partition's first offset (in `pieces` order)."""
        ranges, total = {}, 0
        for (number, pieces), first in zip(self.pieces.items(), firsts):
            count = sum(p.record_count for p in pieces)
            ranges[number] = (first, first + count - 1)
            total += count
        return AppendResult(ranges, total)


def partition_for_key(key: bytes, count: int) -> int:
    """Stable across processes and versions: xxh3_64 of the key, modulo the count."""
    return xxhash.xxh3_64_intdigest(key) % count


def check_partition(stream: str, partition, count: int) -> int:
    """`partition` when it names one of the stream's `count` partitions."""
    if isinstance(partition, bool) or not isinstance(partition, int) or not (
            0 <= partition < count):
        raise InvalidArgument(f"stream {stream!r} has partitions 0..{count - 1} "
                              f"(got {partition!r})")
    return partition


def check_txn_id(txn_id) -> None:
    if isinstance(txn_id, bool) or not isinstance(txn_id, int) or not 0 <= txn_id < 1 << 64:
        raise InvalidAppend(f"txn_id must be an int in 0..2**64-1 (got {txn_id!r})")


class AppendRules:
    """One log's append rules: its limits (config), its clock, its round-robin
    counters. Each method takes records in one form and returns a Submission."""

    def __init__(self, config: LogConfig, clock) -> None:
        self.config = config
        self.clock = clock
        self._lock = threading.Lock()
        self._round_robin: dict[str, int] = {}

    def one(self, stream: str, count: int, value, key, timestamp_us, partition, headers,
            kind, txn_id: int) -> Submission:
        """A single record: the common case through `plain`, the rest through the
        general checks (which give the same errors)."""
        plain = self.plain(stream, count, value, key, timestamp_us, partition, headers,
                           kind, txn_id)
        if plain is not None:
            number, timestamp_us, size = plain
            return Submission(stream, {number: [Piece([timestamp_us], [key], [value],
                                                      None, None, size, 0)]})
        return self.rows(stream, count, [value], [key],
                         None if timestamp_us is None else [timestamp_us], partition,
                         [headers] if headers else None,
                         None if kind == RecordKind.DATA else [kind], txn_id)

    def plain(self, stream: str, count: int, value, key, timestamp_us, partition,
              headers, kind, txn_id: int) -> tuple[int, int, int] | None:
        """A plain single record (bytes or None, no headers, a data record outside any
        transaction, within the limits), checked inline: (partition, timestamp, size as
        a piece counts it). None for anything else, which `one` checks the general way.
        (Once per record from Log.append: the checks in the order that fails fastest.)"""
        if headers or kind or txn_id:  # (RecordKind.DATA is 0)
            return None
        if type(value) is bytes:
            size = len(value)
        elif value is None:
            size = 0
        else:
            return None
        if key is not None:
            if type(key) is not bytes:
                return None
            size += len(key)
        if size > self.config.record_bytes_max:
            return None
        if timestamp_us is None:
            timestamp_us = self.clock.wall_us()
        elif type(timestamp_us) is not int or not INT64_MIN < timestamp_us <= INT64_MAX:
            return None
        if partition is None:
            if count == 1:
                partition = 0
            elif key is not None:
                partition = partition_for_key(key, count)
            else:
                partition = self.route(stream, [key], count).popitem()[0]
        elif type(partition) is not int or not 0 <= partition < count:
            return None
        return partition, timestamp_us, size + RECORD_OVERHEAD_BYTES

    def rows(self, stream: str, count: int, values, keys, timestamps_us, partition,
             headers, kinds, txn_id: int) -> Submission:
        """Records as parallel sequences (append_batch)."""
        values, keys, timestamps, headers, kinds = validate.records(
            values, keys, timestamps_us, headers, kinds)
        check_sizes(values, keys, self.config.record_bytes_max)
        if timestamps is None:
            timestamps = [self.clock.wall_us()] * len(values)
        check_txn_id(txn_id)
        if partition is not None:
            assignment = {check_partition(stream, partition, count): range(len(values))}
        else:
            assignment = self.route(stream, keys, count)
        return Submission(stream, {
            number: cut(rows, values, keys, timestamps, headers, kinds, txn_id, self.config)
            for number, rows in assignment.items()}, txn_id)

    def columns(self, stream: str, count: int, data, partition, txn_id: int) -> Submission:
        """Records as Arrow / NumPy columns (append_columns): checked, partitioned, cut
        and encoded from the buffers (columnar.py)."""
        rows = columnar.rows_from(data, record_bytes_max=self.config.record_bytes_max)
        if rows.timestamps_us is None:
            rows = rows.stamped(self.clock.wall_us())
        check_txn_id(txn_id)
        if partition is not None:
            groups = {check_partition(stream, partition, count): rows}
        elif count == 1:
            groups = {0: rows}
        else:
            with self._lock:
                numbers, self._round_robin[stream] = columnar.partition_numbers(
                    rows, count, self._round_robin.get(stream, 0))
            groups = columnar.split(rows, numbers)
        config = self.config
        return Submission(stream, {
            number: columnar.encode(group, txn_id, frame_bytes_max=config.frame_bytes_max,
                                    batch_records_max=config.batch_records_max)
            for number, group in groups.items()}, txn_id)

    def prepared(self, stream: str, count: int, partition, piece) -> Submission:
        """Records already in the writer's form, as one frame (the daemon's APPEND)."""
        check_partition(stream, partition, count)
        check_prepared(piece, self.config)
        return Submission(stream, {partition: [piece]}, piece.txn_id)

    def stamped(self, stream: str, count: int, partition, producer: ProducerStamp, *,
                data=None, values=None, keys=None, timestamps_us=None,
                headers=None, txn_id: int = 0) -> Submission:
        """A Kafka producer's batch, as one frame carrying its stamp (under the
        transaction `txn_id`, 0: none). A stamp describes one frame, written whole or
        not at all: a batch cut into several frames could be found half-written after a
        crash and taken for appended, so it is refused (as Kafka refuses a batch over
        max.message.bytes)."""
        if (data is None) == (values is None):
            raise InvalidArgument("give the records as data (columns) or as values")
        if isinstance(partition, bool) or not isinstance(partition, int):
            raise InvalidArgument(f"partition must be an int (got {partition!r})")
        if data is not None:
            submission = self.columns(stream, count, data, partition, txn_id)
        else:
            submission = self.rows(stream, count, values, keys, timestamps_us, partition,
                                   headers, None, txn_id)
        check_stamp(producer)
        (pieces,) = submission.pieces.values()  # the partition was named
        if len(pieces) != 1:
            raise InvalidAppend(f"a producer's batch must fit one frame: "
                                f"{sum(p.record_count for p in pieces)} records cut into "
                                f"{len(pieces)} (frame_bytes_max, batch_records_max)")
        pieces[0].producer = producer
        return submission

    def route(self, stream: str, keys, count: int) -> dict[int, list[int]]:
        """{partition: rows} by key hash, round robin for rows without a key."""
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


def check_stamp(producer) -> None:
    if not isinstance(producer, ProducerStamp) or not (
            0 <= producer.producer_id < 1 << 63 and 0 <= producer.producer_epoch <= 0x7FFF
            and 0 <= producer.base_sequence <= SEQUENCE_MAX):
        raise InvalidArgument(f"producer must be a ProducerStamp with an id in 0..2**63-1, "
                              f"an epoch in 0..32767 and a sequence in 0..2**31-1 "
                              f"(got {producer!r})")


def check_prepared(piece, config: LogConfig) -> None:
    """A prepared piece's checks: no loop per record in Python."""
    if not isinstance(piece, (EncodedRows, Piece)) or piece.producer is not None:
        raise InvalidArgument(f"piece must be a payload.EncodedRows or an encoder.Piece "
                              f"without a producer stamp (got {type(piece).__name__})")
    check_txn_id(piece.txn_id)
    count = piece.record_count
    if not 1 <= count <= config.batch_records_max or piece.nbytes > (
            config.frame_bytes_max // 2):
        raise InvalidAppend(f"a prepared piece must fit one frame: {count} records of "
                            f"{piece.nbytes} bytes (batch_records_max, frame_bytes_max)")
    if isinstance(piece, EncodedRows):
        check_encoded(piece, config.record_bytes_max)
        return
    assert len(piece.values) == len(piece.keys) == len(piece.timestamps_us) == count
    check_sizes(piece.values, piece.keys, config.record_bytes_max)
    if piece.kinds is not None:
        validate.no_null_markers(piece.values, piece.kinds)
    if set(map(type, piece.timestamps_us)) != {int} or not (
            min(piece.timestamps_us) > INT64_MIN and max(piece.timestamps_us) <= INT64_MAX):
        raise InvalidAppend("a prepared piece's timestamps must be ints in int64's range "
                            "above its minimum")
    if piece.kinds is not None:
        validate.record_kinds(piece.kinds)  # raises for a kind only the log writes


def check_encoded(piece: EncodedRows, limit: int) -> None:
    assert len(piece.key_lengths) == len(piece.value_lengths) == piece.record_count
    if int(piece.value_lengths.min()) < -1 or int(piece.key_lengths.min()) < -1:
        raise InvalidAppend("a prepared piece's lengths must be -1 (None) or more")
    sizes = (np.maximum(piece.value_lengths, 0).astype(np.int64)
             + np.maximum(piece.key_lengths, 0))
    if int(sizes.max()) > limit:
        row = int(np.flatnonzero(sizes > limit)[0])
        raise InvalidAppend(f"record {row} is {int(sizes[row])} bytes; the limit is {limit} "
                            f"(record_bytes_max)")
    if int(piece.timestamps_us.min()) <= INT64_MIN:
        raise InvalidAppend("a prepared piece's timestamps must be above int64's minimum")


def record_bytes(value, key) -> int:
    """What a record's key and value count against the limits: their bytes (None: 0)."""
    return (len(value) if value is not None else 0) + (len(key) if key is not None else 0)


def check_sizes(values, keys, limit: int) -> None:
    """InvalidAppend naming the first record whose key and value are over `limit`."""
    # filter(None, ...) drops None (no key, a tombstone) and b"" (adds nothing) at C speed
    if (max(map(len, filter(None, values)), default=0)
            + max(map(len, filter(None, keys)), default=0) > limit):
        for i in range(len(values)):
            size = record_bytes(values[i], keys[i])
            if size > limit:
                raise InvalidAppend(f"record {i} is {size} bytes; the limit is {limit} "
                                    f"(record_bytes_max)")


def cut(rows, values, keys, timestamps, headers, kinds, txn_id, config) -> list[Piece]:
    """Split the rows going to one partition into pieces that each fit one frame."""
    budget = config.frame_bytes_max // 2
    if isinstance(rows, range) and len(rows) == len(values) and len(rows) <= (
            config.batch_records_max):
        size = (sum(map(len, filter(None, values))) + sum(map(len, filter(None, keys)))
                + RECORD_OVERHEAD_BYTES * len(rows))
        if size <= budget:
            return [_piece(rows, values, keys, timestamps, headers, kinds, txn_id, size)]
    pieces, current, size = [], [], 0
    for row in rows:
        record = record_bytes(values[row], keys[row]) + RECORD_OVERHEAD_BYTES
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
