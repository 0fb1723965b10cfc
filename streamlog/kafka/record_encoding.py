"""Encoding Kafka RecordBatch v2 (records.py has the layout): what consumers get.

Strategy: pure functions from columns to bytes, no I/O. `encode_columns` is the general
path, one Python loop per record with the varints of small numbers from a table;
`encode_arrays` builds the same bytes with NumPy for records without headers (the
common Fetch case); `encode_batch` and `encode_control_batch` are for
KafkaRecords and transaction markers. Encoding never compresses: the consumer is on the
other end of a socket the daemon serves locally, and the cost of compression is the
daemon's CPU.
"""

from __future__ import annotations

import itertools
import struct

import crc32c as _crc32c
import numpy as np

from .records import COMPRESSION_MASK, CONTROL, TRANSACTIONAL, KafkaRecord, share_mask


def _zigzag(value: int) -> bytes:
    value = (value << 1) ^ (value >> 63)
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL = [_zigzag(n) for n in range(-1, 256)]


def _varint_bytes(value: int) -> bytes:
    return _SMALL[value + 1] if -1 <= value < 255 else _zigzag(value)


def encode_batch(base_offset: int, records, *, attributes: int = 0, producer_id: int = -1,
                 producer_epoch: int = -1, base_sequence: int = -1,
                 last_offset_delta: int | None = None) -> bytes:
    """One uncompressed batch of KafkaRecords (offset deltas from `base_offset`).
    `last_offset_delta` defaults to the last record's delta."""
    assert records, "a batch has at least one record"
    headers = [r.headers for r in records]
    return encode_columns(
        base_offset, [r.offset_delta for r in records], [r.timestamp_ms for r in records],
        [r.key for r in records], [r.value for r in records],
        headers if any(headers) else None, attributes=attributes, producer_id=producer_id,
        producer_epoch=producer_epoch, base_sequence=base_sequence,
        last_offset_delta=last_offset_delta)


def encode_columns(base_offset: int, offset_deltas, timestamps_ms, keys, values,
                   headers=None, *, attributes: int = 0, producer_id: int = -1,
                   producer_epoch: int = -1, base_sequence: int = -1,
                   last_offset_delta: int | None = None) -> bytes:
    """One uncompressed batch from parallel columns (headers: None, or a sequence of
    (name, value) tuples per record). The per-record loop is the Fetch path's cost:
    varints of small numbers come from a table."""
    assert len(values) > 0, "a batch has at least one record"
    assert attributes & COMPRESSION_MASK == 0, "encode_columns does not compress"
    base_ts, max_ts = min(timestamps_ms), max(timestamps_ms)
    small, varint = _SMALL, _zigzag
    parts = []
    append = parts.append
    rows = zip(offset_deltas, timestamps_ms, keys, values,
               headers if headers is not None else itertools.repeat(()))
    for delta, stamp, key, value, pairs in rows:
        stamp -= base_ts
        record = [b"\x00", small[stamp + 1] if stamp < 255 else varint(stamp),
                  small[delta + 1] if delta < 255 else varint(delta)]
        if key is None:
            record.append(b"\x01")
        else:
            size = len(key)
            record += (small[size + 1] if size < 255 else varint(size), key)
        if value is None:
            record.append(b"\x01")
        else:
            size = len(value)
            record += (small[size + 1] if size < 255 else varint(size), value)
        record.append(_encode_headers(pairs) if pairs else b"\x00")
        joined = b"".join(record)
        size = len(joined)
        append(small[size + 1] if size < 255 else varint(size))
        append(joined)
    if last_offset_delta is None:
        last_offset_delta = offset_deltas[-1]
    header = (attributes, last_offset_delta, base_ts, max_ts, producer_id, producer_epoch,
              base_sequence, len(values))
    return _pack_batch(base_offset, header, b"".join(parts))


def _pack_batch(base_offset: int, header: tuple, payload: bytes) -> bytes:
    """The batch: base_offset, batch_length, a zero leader epoch, magic 2 and the CRC of
    the rest, which is `header` (attributes through record_count, in layout order) and
    the records' bytes."""
    tail = struct.pack(">hiqqqhii", *header) + payload
    crc = _crc32c.crc32c(tail)
    return struct.pack(">qiibI", base_offset, len(tail) + 9, 0, 2, crc) + tail


def _encode_headers(pairs) -> bytes:
    out = [_varint_bytes(len(pairs))]
    for name, value in pairs:
        encoded = name.encode()
        out += [_varint_bytes(len(encoded)), encoded]
        if value is None:
            out.append(b"\x01")
        else:
            out += [_varint_bytes(len(value)), value]
    return b"".join(out)


def encode_control_batch(offset: int, timestamp_ms: int, commit: bool,
                         producer_id: int = -1) -> bytes:
    """A control batch of one marker (COMMIT or ABORT), as a transaction coordinator
    writes: consumers skip it and move past its offset."""
    key = struct.pack(">hh", 0, 1 if commit else 0)
    value = struct.pack(">hi", 0, 0)
    return encode_batch(offset, [KafkaRecord(0, timestamp_ms, key, value)],
                        attributes=TRANSACTIONAL | CONTROL, producer_id=producer_id,
                        producer_epoch=0)


# -- encoding whole columns without a loop per record (the Fetch path) ------------------------

def encode_arrays(base_offset: int, timestamps_ms, key_lengths, keys, value_lengths,
                  values, *, producer_id: int = -1, producer_epoch: int = -1,
                  base_sequence: int = -1) -> bytes:
    """The batch `encode_columns` makes for records without headers and offset deltas
    0..n-1, built with NumPy from the columns a log batch already has: a length of -1
    is a null key or value (Kafka's varint -1), and `keys` and `values` are the
    concatenated bytes (nulls take none). Byte for byte the same as encode_columns
    (tests check it).

    Strategy: every varint of every record is computed at once (zigzag, byte count,
    then one pass per byte position); record sizes give each record's start; keys and
    values are copied with one gather each."""
    count = len(timestamps_ms)
    assert count > 0, "a batch has at least one record"
    stamps = np.asarray(timestamps_ms, dtype=np.int64)
    key_lengths = np.asarray(key_lengths, dtype=np.int64)
    value_lengths = np.asarray(value_lengths, dtype=np.int64)
    base_ts, max_ts = int(stamps.min()), int(stamps.max())
    fields = [_zigzag_array(stamps - base_ts), _zigzag_array(np.arange(count, dtype=np.int64)),
              _zigzag_array(key_lengths), _zigzag_array(value_lengths)]
    sizes = [_varint_sizes(z) for z in fields]
    key_bytes, value_bytes = np.maximum(key_lengths, 0), np.maximum(value_lengths, 0)
    body = 2 + sizes[0] + sizes[1] + sizes[2] + key_bytes + sizes[3] + value_bytes
    length = _zigzag_array(body)
    length_size = _varint_sizes(length)
    record_sizes = length_size + body
    starts = np.zeros(count, dtype=np.int64)
    np.cumsum(record_sizes[:-1], out=starts[1:])
    out = np.zeros(int(starts[-1] + record_sizes[-1]), dtype=np.uint8)  # zero: attributes
    position = starts.copy()                                             # and header count
    _put_varints(out, position, length, length_size)
    position += length_size + 1  # the attributes byte
    for field, size in zip(fields[:3], sizes[:3]):
        _put_varints(out, position, field, size)
        position += size
    _gather(out, position, key_bytes, keys)
    position += key_bytes
    _put_varints(out, position, fields[3], sizes[3])
    position += sizes[3]
    _gather(out, position, value_bytes, values)
    header = (0, count - 1, base_ts, max_ts, producer_id, producer_epoch, base_sequence,
              count)
    return _pack_batch(base_offset, header, out.tobytes())


def _zigzag_array(values: np.ndarray) -> np.ndarray:
    values = values.astype(np.int64, copy=False)
    return ((values << 1) ^ (values >> 63)).view(np.uint64)


def _varint_sizes(zigzagged: np.ndarray) -> np.ndarray:
    sizes = np.ones(len(zigzagged), dtype=np.int64)
    for shift in range(7, 64, 7):
        over = zigzagged >= np.uint64(1 << shift)
        if not over.any():
            break
        sizes += over
    return sizes


def _put_varints(out: np.ndarray, position: np.ndarray, zigzagged: np.ndarray,
                 sizes: np.ndarray) -> None:
    smallest = int(sizes.min())
    for index in range(int(sizes.max())):
        rows = slice(None) if index < smallest else sizes > index  # all: no mask
        part = (zigzagged[rows] >> np.uint64(7 * index)) & np.uint64(0x7F)
        more = (sizes[rows] > index + 1).astype(np.uint64) << np.uint64(7)
        out[position[rows] + index] = (part | more).astype(np.uint8)


def _gather(out: np.ndarray, position: np.ndarray, lengths: np.ndarray, data) -> None:
    """Copy the concatenated `data` into `out`, each record's share at its position
    (shares never touch: records have other bytes between them)."""
    total = int(lengths.sum())
    if total == 0:
        return
    source = np.frombuffer(data, dtype=np.uint8, count=total)
    out[share_mask(position, lengths, len(out))] = source
