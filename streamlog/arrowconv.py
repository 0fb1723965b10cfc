"""Batch columns -> pyarrow.RecordBatch, with no Python loop per record.

Strategy: the payload already holds Arrow's physical layout for binary columns (a data
blob plus lengths), so we build offsets with one cumsum and wrap the blobs as buffers.
A length of -1 (no key, a None value) is a null; so is a None header value.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .payload import Columns, decode_headers, offsets_of

TIMESTAMP = pa.timestamp("us", tz="UTC")
HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
SCHEMA = pa.schema([("partition", pa.int32(), False), ("offset", pa.int64(), False),
                    ("timestamp", TIMESTAMP, False), ("key", pa.binary(), True),
                    ("value", pa.binary(), True)])
SCHEMA_WITH_HEADERS = SCHEMA.append(pa.field("headers", HEADERS, True))


def columns_to_arrow(columns: Columns, partition: int, lo: int, hi: int, *,
                     data_only: bool = True, include_headers: bool = False) -> pa.RecordBatch:
    n = hi - lo
    timestamps = np.ascontiguousarray(columns.timestamps_us[lo:hi])
    arrays = [
        pa.array(np.full(n, partition, dtype=np.int32)),
        pa.array(np.arange(columns.base_offset + lo, columns.base_offset + hi, dtype=np.int64)),
        pa.Array.from_buffers(TIMESTAMP, n, [None, pa.py_buffer(timestamps)]),
        _binary(columns.key_lengths, columns.keys, lo, hi),
        _binary(columns.value_lengths, columns.values, lo, hi),
    ]
    schema = SCHEMA
    if include_headers:
        arrays.append(_headers(columns, lo, hi))
        schema = SCHEMA_WITH_HEADERS
    batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
    if data_only and columns.kinds is not None:
        mask = columns.kinds[lo:hi] == 0
        if not mask.all():
            batch = batch.filter(pa.array(mask))
    return batch


def _binary(lengths: np.ndarray, blob, lo: int, hi: int) -> pa.Array:
    """Rows [lo, hi) of a key or value column: a null where the length is -1."""
    n = hi - lo
    clipped = np.maximum(lengths[lo:hi], 0)
    offsets = offsets_of(clipped)
    start = int(offsets_of(np.maximum(lengths[:lo], 0))[-1]) if lo else 0
    data = pa.py_buffer(blob[start:start + int(offsets[-1])])
    validity = None
    valid = lengths[lo:hi] >= 0
    null_count = int(n - valid.sum())
    if null_count:
        validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(pa.binary(), n,
                                 [validity, pa.py_buffer(offsets.astype(np.int32)), data],
                                 null_count=null_count)


def _headers(columns: Columns, lo: int, hi: int) -> pa.Array:
    if columns.header_lengths is None:
        return pa.array([None] * (hi - lo), type=HEADERS)
    offsets = offsets_of(columns.header_lengths)
    rows = []
    for i in range(lo, hi):
        pairs = decode_headers(columns.headers[offsets[i]:offsets[i + 1]],
                               nulls=columns.nulls)
        rows.append([{"key": k, "value": v} for k, v in pairs] if pairs else None)
    return pa.array(rows, type=HEADERS)
