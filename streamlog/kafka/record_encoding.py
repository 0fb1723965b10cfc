"""Encoding Kafka RecordBatch v2 (records.py has the layout): what consumers get.

Strategy: pure functions from columns to bytes, no I/O. `encode_columns` is the general
path, one Python loop per record with the varints of small numbers from a table;
`ArraysPlan` (and `encode_arrays`, which uses it) builds the same bytes with NumPy for
records without headers (the common Fetch case), sizing the batch before writing it;
`encode_batch` and `encode_control_batch` are for KafkaRecords and transaction
markers. Encoding never compresses: the consumer is on the
other end of a socket the daemon serves locally, and the cost of compression is the
daemon's CPU.
"""

from __future__ import annotations

import itertools
import struct

import crc32c as _crc32c
import numpy as np

from .records import (COMPRESSION_MASK, CONTROL, CRC_START, HEADER_BYTES, LENGTH_PREFIX_BYTES,
                      TRANSACTIONAL, KafkaRecord, share_mask)


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
    """The batch of `payload` (the records' bytes): `header` is attributes through
    record_count, in layout order (_seal)."""
    batch = bytearray(HEADER_BYTES + len(payload))
    batch[HEADER_BYTES:] = payload
    _seal(batch, base_offset, header)
    return bytes(batch)


_LEADING = struct.Struct(">qiibI")  # base_offset through crc
_CRC_COVERED = struct.Struct(">hiqqqhii")  # attributes through record_count
assert _LEADING.size == CRC_START
assert _LEADING.size + _CRC_COVERED.size == HEADER_BYTES


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
                  base_sequence: int = -1) -> memoryview:
    """The batch `encode_columns` makes for records without headers and offset deltas
    0..n-1, built with NumPy from the columns a log batch already has: a length of -1
    is a null key or value (Kafka's varint -1), and `keys` and `values` are the
    concatenated bytes (nulls take none). Byte for byte the same as encode_columns
    (tests check it); a bytes-like view of a buffer of its own."""
    plan = ArraysPlan(timestamps_ms, key_lengths, value_lengths)
    return plan.encode(base_offset, keys, values, producer_id=producer_id,
                       producer_epoch=producer_epoch, base_sequence=base_sequence)


class ArraysPlan:
    """Where each byte of a batch of records without headers goes, worked out before
    any is written: `size` says whether the batch fits a Fetch's budget, and `encode`
    writes it only when it is sent.

    Strategy: every varint of every record is computed at once (zigzag, then its byte
    count); record sizes give each record's start. Writing goes one of two ways. Rows
    in long runs of one layout (the same byte count for every varint, key and value:
    fixed-size keys and values, as most streams have) are a 2-D array per run, each
    field a column range, so each varint byte and each key and value is one strided
    copy for the whole run. Otherwise each varint byte is scattered by position and
    keys and values are copied with one masked assignment each."""

    __slots__ = ("count", "base_ts", "max_ts", "varints", "varint_sizes", "key_bytes",
                 "value_bytes", "record_sizes", "starts", "size")

    def __init__(self, timestamps_ms, key_lengths, value_lengths) -> None:
        count = len(timestamps_ms)
        assert count > 0, "a batch has at least one record"
        stamps = np.asarray(timestamps_ms, dtype=np.int64)
        key_lengths = np.asarray(key_lengths, dtype=np.int64)
        value_lengths = np.asarray(value_lengths, dtype=np.int64)
        assert len(key_lengths) == count and len(value_lengths) == count
        self.count = count
        self.base_ts, self.max_ts = int(stamps.min()), int(stamps.max())
        # The record's varints in layout order (_LENGTH ... _VALUE_LENGTH): length (set
        # below), timestamp delta, offset delta, key length, value length.
        fields = [_zigzag_array(stamps - self.base_ts),
                  _zigzag_array(np.arange(count, dtype=np.int64)),
                  _zigzag_array(key_lengths), _zigzag_array(value_lengths)]
        sizes = [_varint_sizes(z) for z in fields]
        self.key_bytes = np.maximum(key_lengths, 0)
        self.value_bytes = np.maximum(value_lengths, 0)
        # attributes and the header count are one zero byte each
        body = 2 + sizes[0] + sizes[1] + sizes[2] + self.key_bytes + sizes[3] + self.value_bytes
        length = _zigzag_array(body)
        self.varints = [length, *fields]
        self.varint_sizes = [_varint_sizes(length), *sizes]
        self.record_sizes = self.varint_sizes[0] + body
        self.starts = np.zeros(count, dtype=np.int64)
        np.cumsum(self.record_sizes[:-1], out=self.starts[1:])
        self.size = HEADER_BYTES + int(self.starts[-1] + self.record_sizes[-1])

    def encode(self, base_offset: int, keys, values, *, producer_id: int = -1,
               producer_epoch: int = -1, base_sequence: int = -1) -> memoryview:
        """The batch at `base_offset` with these keys and values (the concatenated
        bytes of the lengths the plan was made with)."""
        out = np.zeros(self.size, dtype=np.uint8)  # zero: attributes and header counts
        records = out[HEADER_BYTES:]
        keys = np.frombuffer(keys, dtype=np.uint8, count=int(self.key_bytes.sum()))
        values = np.frombuffer(values, dtype=np.uint8, count=int(self.value_bytes.sum()))
        runs = self.layout_runs()
        if runs is None:
            self._scatter(records, keys, values)
        else:
            key_starts = np.zeros(self.count + 1, dtype=np.int64)
            np.cumsum(self.key_bytes, out=key_starts[1:])
            value_starts = np.zeros(self.count + 1, dtype=np.int64)
            np.cumsum(self.value_bytes, out=value_starts[1:])
            for first, end in zip(runs[:-1], runs[1:]):
                self._fill_run(records, int(first), int(end), keys[key_starts[first]:],
                               values[value_starts[first]:])
        header = (0, self.count - 1, self.base_ts, self.max_ts, producer_id,
                  producer_epoch, base_sequence, self.count)
        _seal(out, base_offset, header)
        return memoryview(out)

    def layout_runs(self) -> np.ndarray | None:
        """Where runs of rows of one layout start (and the end), when they are long
        enough for the 2-D writing to pay (_RUN_ROWS_MIN on average); else None."""
        changed = np.zeros(self.count, dtype=np.bool_)
        for column in (*self.varint_sizes, self.key_bytes, self.value_bytes):
            changed[1:] |= column[1:] != column[:-1]
        changed[0] = True
        firsts = np.flatnonzero(changed)
        if len(firsts) * _RUN_ROWS_MIN > self.count:
            return None
        return np.append(firsts, self.count)

    def _fill_run(self, records: np.ndarray, first: int, end: int, keys: np.ndarray,
                  values: np.ndarray) -> None:
        """Rows [first, end), all of one layout: a (rows, record size) array whose
        columns are the fields. `keys` and `values` start at the run's first row."""
        rows = end - first
        size = int(self.record_sizes[first])
        start = int(self.starts[first])
        table = records[start:start + rows * size].reshape(rows, size)
        column = 0
        for number, (varint, sizes) in enumerate(zip(self.varints, self.varint_sizes)):
            column = _put_varint_columns(table, column, varint[first:end], int(sizes[first]))
            if number == _LENGTH:
                column += 1  # the attributes byte
            elif number in (_KEY_LENGTH, _VALUE_LENGTH):  # then the key (value) itself
                blob, lengths = ((keys, self.key_bytes) if number == _KEY_LENGTH
                                 else (values, self.value_bytes))
                field = int(lengths[first])
                if field:
                    table[:, column:column + field] = blob[:rows * field].reshape(rows, field)
                column += field
        assert column + 1 == size, "the header count is the record's last byte"

    def _scatter(self, records: np.ndarray, keys: np.ndarray, values: np.ndarray) -> None:
        """Rows of mixed layouts: each varint byte put by position, keys and values
        copied by mask."""
        position = self.starts.copy()
        for number, (varint, sizes) in enumerate(zip(self.varints, self.varint_sizes)):
            _put_varints(records, position, varint, sizes)
            position += sizes
            if number == _LENGTH:
                position += 1  # the attributes byte
            elif number in (_KEY_LENGTH, _VALUE_LENGTH):  # then the key (value) itself
                blob, lengths = ((keys, self.key_bytes) if number == _KEY_LENGTH
                                 else (values, self.value_bytes))
                _gather(records, position, lengths, blob)
                position += lengths


# ArraysPlan.varints, in layout order
_LENGTH, _TIMESTAMP_DELTA, _OFFSET_DELTA, _KEY_LENGTH, _VALUE_LENGTH = range(5)
_RUN_ROWS_MIN = 256  # rows per run, on average, for the 2-D writing to pay (a run costs
# about what 150 rows cost written one by one)


def _seal(batch, base_offset: int, header: tuple) -> None:
    """Write the batch header into the first HEADER_BYTES of `batch` (a writable
    buffer whose records follow): `header` is attributes through record_count, in
    layout order; base_offset, batch_length, a zero leader epoch, magic 2 and the CRC
    of everything from the attributes on."""
    _CRC_COVERED.pack_into(batch, CRC_START, *header)
    crc = _crc32c.crc32c(memoryview(batch)[CRC_START:])
    _LEADING.pack_into(batch, 0, base_offset, len(batch) - LENGTH_PREFIX_BYTES, 0, 2, crc)


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


def _put_varint_columns(table: np.ndarray, column: int, zigzagged: np.ndarray,
                        size: int) -> int:
    """Varints of one byte count `size`, one per row, into columns [column,
    column + size) of `table`; returns the column after them."""
    for index in range(size):
        part = (zigzagged >> np.uint64(7 * index)) & np.uint64(0x7F)
        if index + 1 < size:
            part |= np.uint64(0x80)
        table[:, column + index] = part
    return column + size


def _put_varints(out: np.ndarray, position: np.ndarray, zigzagged: np.ndarray,
                 sizes: np.ndarray) -> None:
    smallest = int(sizes.min())
    for index in range(int(sizes.max())):
        rows = slice(None) if index < smallest else sizes > index  # all: no mask
        part = (zigzagged[rows] >> np.uint64(7 * index)) & np.uint64(0x7F)
        more = (sizes[rows] > index + 1).astype(np.uint64) << np.uint64(7)
        out[position[rows] + index] = (part | more).astype(np.uint8)


def _gather(out: np.ndarray, position: np.ndarray, lengths: np.ndarray,
            source: np.ndarray) -> None:
    """Copy the concatenated `source` into `out`, each record's share at its position
    (shares never touch: records have other bytes between them)."""
    if len(source) == 0:
        return
    out[share_mask(position, lengths, len(out))] = source
