"""Kafka record batches <-> the log's batches: a produced batch appended, a partition
read as Kafka batches. No sockets, no broker state.

Cost per record: a produced batch without headers is decoded into Arrow arrays
(record_decoding.py: one Python step per record, to hop to the next) and appended with
append_columns; a batch with headers goes through lists and append_batch. A fetched
log batch of data without headers is encoded with NumPy from its columns
(record_encoding.encode_arrays); control records and records with headers take the
per-record encoder.

A null value (a tombstone) or a null header value is stored as None, which the log
keeps apart from an empty value (DESIGN 1), and fetched back as null (length -1).
"""

from __future__ import annotations

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
         at_least_one: bool) -> list[bytes]:
    """Kafka batches of the partition from `offset`: data records in batches (their
    offsets kept, so skipped aborted records leave gaps as compaction does), each
    control record a control batch. Stops before passing `max_bytes`, except that the
    first batch is always sent when `at_least_one` (a consumer must make progress)."""
    out, total, last_sent = [], 0, offset - 1
    reader = log.reader(topic, partition, from_offset=offset, data_only=False,
                        read_committed=committed)
    try:
        for columns, lo, hi in _slices(reader):
            if columns.kinds is None and columns.header_lengths is None:
                chunks = _array_chunks(columns, lo, hi)  # data only, no headers: NumPy
            else:
                chunks = _kafka_chunks(list(_columns_records(columns, partition, lo, hi)),
                                       columns)
            for chunk, last in chunks:
                if total + len(chunk) > max_bytes and (out or not at_least_one):
                    return out
                out.append(chunk)
                total, last_sent = total + len(chunk), last
        if reader.next_offset - 1 > last_sent:
            # read_committed skipped an aborted transaction (its marker included) at
            # the end: a control batch on its last offset moves the consumer past it
            out.append(record_encoding.encode_control_batch(reader.next_offset - 1, 0,
                                                          commit=False))
    finally:
        reader.close()
    return out


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
    control records alone. Yields (batch bytes, its last offset)."""
    run: list = []
    for record in records:
        if record.kind == RecordKind.DATA:
            run.append(record)
            if len(run) >= _BATCH_RECORDS_MAX:
                yield _data_batch(run, columns), run[-1].offset
                run = []
            continue
        if run:
            yield _data_batch(run, columns), run[-1].offset
            run = []
        yield record_encoding.encode_control_batch(
            record.offset, record.timestamp_us // 1000,
            commit=record.kind != RecordKind.ABORT), record.offset
    if run:
        yield _data_batch(run, columns), run[-1].offset


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
    Kafka's null). Yields (batch bytes, last offset)."""
    key_offsets, value_offsets = columns.key_offsets(), columns.value_offsets()
    stamps_ms = columns.timestamps_us // 1000
    sizes = value_offsets + key_offsets  # bytes before each row
    start = lo
    while start < hi:
        limit = sizes[start] + _CHUNK_BYTES
        end = min(hi, start + _BATCH_RECORDS_MAX,
                  max(start + 1, int(np.searchsorted(sizes, limit, side="right")) - 1))
        yield record_encoding.encode_arrays(
            columns.base_offset + start, stamps_ms[start:end], columns.key_lengths[start:end],
            columns.keys[key_offsets[start]:key_offsets[end]],
            columns.value_lengths[start:end],
            columns.values[value_offsets[start]:value_offsets[end]],
            **_producer_fields(columns, start)), columns.base_offset + end - 1
        start = end


def _data_batch(run, columns) -> bytes:
    base = run[0].offset
    headers = [r.headers for r in run]
    return record_encoding.encode_columns(
        base, [r.offset - base for r in run], [r.timestamp_us // 1000 for r in run],
        [r.key for r in run], [r.value for r in run], headers if any(headers) else None,
        **_producer_fields(columns, base - columns.base_offset))
