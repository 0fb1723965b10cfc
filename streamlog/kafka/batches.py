"""Kafka record batches <-> the log's batches: a produced batch appended, a partition
read as Kafka batches. No sockets, no broker state.

Cost per record: a produced batch without headers is decoded into Arrow arrays
(record_decoding.py: one Python step per record, to hop to the next) and appended with
append_columns; a batch with headers goes through lists and append_batch. A fetched
log batch of data without headers is encoded with NumPy from its columns
(record_encoding.ArraysPlan: its size first, so a Kafka batch that does not fit the
Fetch's budget is never encoded); control records and records with headers take the
per-record encoder.

A null value (a tombstone) or a null header value is stored as None, which the log
keeps apart from an empty value (DESIGN 1), and fetched back as null (length -1).
"""

from __future__ import annotations

import functools

import numpy as np

from ..records import RecordKind
from . import record_encoding

_BATCH_RECORDS_MAX = 4096  # records per batch in a Fetch response
_CHUNK_BYTES = 1 << 20  # about this many key and value bytes per batch too


def append(log, topic: str, partition: int, batch, stamp=None, txn_id: int = 0) -> int:
    """Append a batch's records (stamped, for an idempotent producer's batch: then one
    frame; under the log transaction `txn_id`, for a transactional producer's); returns
    the first offset once durable."""
    if batch.arrays is not None:  # no headers: columns as they are
        columns = {"value": batch.arrays["value"], "key": batch.arrays["key"]}
        if batch.base_timestamp_ms >= 0:
            columns["timestamp"] = batch.arrays["timestamp"].to_numpy() * 1000
        if stamp is not None:
            result = log.append_stamped_sync(topic, partition, stamp, data=columns,
                                             txn_id=txn_id)
        else:
            result = log.append_columns_sync(topic, columns, partition=partition,
                                             txn_id=txn_id)
        return result.ranges[partition][0]
    if batch.base_timestamp_ms < 0:  # the producer gave none: the append time
        stamps = None
    else:
        stamps = [ms * 1000 for ms in batch.timestamps_ms]
    if stamp is not None:
        result = log.append_stamped_sync(topic, partition, stamp, values=batch.values,
                                         keys=batch.keys, timestamps_us=stamps,
                                         headers=batch.headers, txn_id=txn_id)
    else:
        result = log.append_batch_sync(topic, batch.values, keys=batch.keys,
                                       timestamps_us=stamps, partition=partition,
                                       headers=batch.headers, txn_id=txn_id)
    return result.ranges[partition][0]


def read(log, topic: str, partition: int, offset: int, max_bytes: int, committed: bool, *,
         at_least_one: bool) -> list:
    """Kafka batches (bytes-like) of the partition from `offset` (see `chunks`), up to
    `max_bytes` in all, with a reader of its own (the broker keeps its readers between
    Fetches: fetching.py)."""
    reader = log.reader(topic, partition, from_offset=offset, data_only=False,
                        read_committed=committed)
    source = chunks(reader, partition)
    try:
        out, _rest, _after = fill(functools.partial(next, source, None), max_bytes,
                                  at_least_one=at_least_one, after=offset)
    finally:
        source.close()
        reader.close()
    return out


def fill(next_batch, max_bytes: int, *, at_least_one: bool, after: int):
    """Encode batches from `next_batch()` ((size, last offset, encode) as `chunks`
    yields, or None at the end) while they fit `max_bytes` in all; the first is taken
    whatever its size when `at_least_one` (a consumer must make progress).

    Returns:
        (the encoded batches, the batch that did not fit or None at the end, the offset
        after the last batch taken: `after` when none was).
    """
    out, total = [], 0
    while (batch := next_batch()) is not None:
        size, last, encode = batch
        if total + size > max_bytes and (out or not at_least_one):
            return out, batch, after
        out.append(encode())
        total, after = total + size, last + 1
    return out, None, after


def chunks(reader, partition: int):
    """Generator: the Kafka batches of `reader` (a Reader of every kind of record, not
    following) from its position to its end, each as (size in bytes, last offset, a
    function that gives the batch, bytes-like): data records in batches (their offsets
    kept, so skipped aborted records leave gaps as compaction does), each control
    record a control batch. A batch's size is known before it is encoded, so one that
    does not fit a Fetch's budget costs no encoding. The reader closes at its end."""
    last = reader.next_offset - 1
    for columns, lo, hi in _slices(reader):
        if columns.kinds is None and columns.header_lengths is None:
            batches = _array_chunks(columns, lo, hi)  # data only, no headers: NumPy
        else:
            batches = _kafka_chunks(list(_columns_records(columns, partition, lo, hi)),
                                    columns)
        for size, last, encode in batches:
            yield size, last, encode
    if reader.next_offset - 1 > last:
        # read_committed skipped an aborted transaction (its marker included) at the
        # end: a control batch on its last offset moves the consumer past it
        yield _ready(record_encoding.encode_control_batch(reader.next_offset - 1, 0,
                                                          commit=False), reader.next_offset - 1)


def _slices(reader):
    from ..reader import WAIT
    for item in reader.slices():
        if item is WAIT:  # not following: never happens, but never wait here
            return
        yield item


def _columns_records(columns, partition, lo, hi):
    from ..payload import columns_to_records
    return columns_to_records(columns, partition, lo, hi, data_only=False)


def _kafka_chunks(records, columns):
    """Encode log records (of the batch `columns`) as Kafka batches: runs of data,
    control records alone. Yields what `chunks` does (each batch encoded already, to
    learn its size)."""
    run: list = []
    for record in records:
        if record.kind == RecordKind.DATA:
            run.append(record)
            if len(run) >= _BATCH_RECORDS_MAX:
                yield _ready(_data_batch(run, columns), run[-1].offset)
                run = []
            continue
        if run:
            yield _ready(_data_batch(run, columns), run[-1].offset)
            run = []
        yield _ready(record_encoding.encode_control_batch(
            record.offset, record.timestamp_us // 1000,
            commit=record.kind != RecordKind.ABORT), record.offset)
    if run:
        yield _ready(_data_batch(run, columns), run[-1].offset)


def _ready(batch: bytes, last: int):
    """An encoded batch as `chunks` yields it: (size, last offset, a function giving
    it)."""
    return len(batch), last, functools.partial(_as_is, batch)


def _as_is(batch: bytes) -> bytes:
    return batch


def _producer_fields(columns, row: int) -> dict:
    """The producer id, epoch and base sequence of a Kafka batch that starts at `row`
    of the log batch `columns`, as the producer sent them (-1s: no producer)."""
    stamp = columns.producer
    if stamp is None:
        return {}
    return {"producer_id": stamp.producer_id, "producer_epoch": stamp.producer_epoch,
            "base_sequence": stamp.sequence_at(row)}


def _array_chunks(columns, lo: int, hi: int):
    """Rows [lo, hi) of a log batch of data records without headers, as Kafka batches
    of at most _BATCH_RECORDS_MAX records and about _CHUNK_BYTES each, encoded from
    the batch's columns without a loop per record (a None value's length, -1, is
    Kafka's null). Yields (batch size, last offset, a function that encodes it)."""
    key_offsets, value_offsets = columns.key_offsets(), columns.value_offsets()
    stamps_ms = columns.timestamps_us // 1000
    sizes = value_offsets + key_offsets  # bytes before each row
    start = lo
    while start < hi:
        limit = sizes[start] + _CHUNK_BYTES
        end = min(hi, start + _BATCH_RECORDS_MAX,
                  max(start + 1, int(np.searchsorted(sizes, limit, side="right")) - 1))
        plan = record_encoding.ArraysPlan(stamps_ms[start:end],
                                          columns.key_lengths[start:end],
                                          columns.value_lengths[start:end])
        encode = functools.partial(
            plan.encode, columns.base_offset + start,
            columns.keys[key_offsets[start]:key_offsets[end]],
            columns.values[value_offsets[start]:value_offsets[end]],
            **_producer_fields(columns, start))
        yield plan.size, columns.base_offset + end - 1, encode
        start = end


def _data_batch(run, columns) -> bytes:
    base = run[0].offset
    headers = [r.headers for r in run]
    return record_encoding.encode_columns(
        base, [r.offset - base for r in run], [r.timestamp_us // 1000 for r in run],
        [r.key for r in run], [r.value for r in run], headers if any(headers) else None,
        **_producer_fields(columns, base - columns.base_offset))
