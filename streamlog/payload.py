"""The columnar batch payload: records <-> columns, with no Python loop on decode.

Strategy: a payload is fixed-width columns followed by variable-length blobs, so a
reader turns a whole batch into NumPy views and Arrow arrays with a few vectorised calls.
Layout for n records (little-endian, column starts 8-byte aligned by construction):

    timestamps_us  i64[n]
    key_lengths    i32[n]   -1 = no key
    value_lengths  i32[n]   -1 = None (a tombstone), only when FLAG_HAS_NULLS
    header_lengths i32[n]   only when FLAG_HAS_HEADERS
    kinds          u8[n]    only when FLAG_HAS_CONTROL (else all DATA)
    keys blob, values blob, headers blob (each the concatenation of its items; a None
    key or value takes no bytes)

Headers of one record are encoded as u16 count, then per header u16 name length, name
(UTF-8), u32 value length, value; a None header value has length 0xFFFFFFFF and no
bytes, only when FLAG_HAS_NULLS (no header value is that long: a frame is at most
1 GiB). The writer sets FLAG_HAS_NULLS only for a payload that holds a None, so a
payload without one is byte for byte what it was before None values existed (frame.py
says what an older reader does with the flag). zstd compresses the whole payload when
it pays, nulls or not.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import operator
import struct
import threading

import numpy as np
import zstandard

from .errors import CorruptFrame
from .frame import (CODEC_NONE, CODEC_ZSTD, FLAG_HAS_CONTROL, FLAG_HAS_HEADERS,
                    FLAG_HAS_NULLS, Frame, ProducerStamp)
from .records import Record, RecordKind

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
# The flags that say what a payload's layout holds (frame.py has the codec and the stamp
# besides): a payload travels on the daemon's wire with these.
PAYLOAD_FLAGS = FLAG_HAS_CONTROL | FLAG_HAS_HEADERS | FLAG_HAS_NULLS
NULL_HEADER_LENGTH = 0xFFFFFFFF  # a None header value's length (with FLAG_HAS_NULLS)
_NULL_HEADER = _U32.pack(NULL_HEADER_LENGTH)
# zstd pays when it saves at least this fraction of the payload. Compressing costs about
# 3-4 ms per MiB at level 1 on a server core, longer than writing and fsyncing that MiB on
# an SSD (1-2 ms), and every reader pays the decompression: a saving of a tenth is not
# worth it (payloads of random bytes save about 11%: their length and time columns);
# text, JSON and repetitive values save 50-90% and are still compressed.
_ZSTD_GAIN_MIN = 0.25


@dataclasses.dataclass(slots=True)
class Columns:
    """One decoded batch as columns. Arrays are views into the payload bytes."""

    base_offset: int
    timestamps_us: np.ndarray
    kinds: np.ndarray | None  # None: every record is DATA
    key_lengths: np.ndarray
    value_lengths: np.ndarray
    header_lengths: np.ndarray | None
    keys: memoryview
    values: memoryview
    headers: memoryview | None
    txn_id: int = 0
    # The whole (uncompressed) payload these columns are views of, when they came from
    # one: a server sends it on as it is for a whole batch (wire/columns.py).
    raw: memoryview | None = None
    # The frame's producer stamp (frame.py): the Kafka producer that sent the batch.
    producer: ProducerStamp | None = None
    # FLAG_HAS_NULLS: a value length may be -1 (None) and a header value None.
    nulls: bool = False

    def __len__(self) -> int:
        return len(self.timestamps_us)

    def key_offsets(self) -> np.ndarray:
        return offsets_of(np.maximum(self.key_lengths, 0))

    def value_offsets(self) -> np.ndarray:
        return offsets_of(self.value_bytes())

    def value_bytes(self) -> np.ndarray:
        """Each value's bytes in the values blob: its length, 0 for a None value."""
        return np.maximum(self.value_lengths, 0) if self.nulls else self.value_lengths

    @property
    def flags(self) -> int:
        """The payload flags of these columns (codec and producer stamp aside)."""
        return ((FLAG_HAS_HEADERS if self.header_lengths is not None else 0)
                | (FLAG_HAS_CONTROL if self.kinds is not None else 0)
                | (FLAG_HAS_NULLS if self.nulls else 0))


def encode_payload(timestamps_us, keys, values, kinds=None, headers=None) -> tuple[bytes, int]:
    """Encode parallel sequences into a raw payload. Returns (payload, flags).

    `kinds` None means all DATA; `headers` None means no record has headers. A key,
    a value or a header value may be None. The caller has validated types and sizes
    (validate.records).
    """
    payload, flags, _ = _encode(timestamps_us, keys, values, kinds, headers)
    return payload, flags


def encode_payload_columns(timestamps_us, keys, values, kinds=None, headers=None, *,
                           base_offset: int = 0, txn_id: int = 0,
                           producer: ProducerStamp | None = None):
    """encode_payload, and the payload's Columns as a reader would decode them (the
    arrays the payload was made from, and views of its blobs), for a frame at
    `base_offset`: the writer hands them to the live tail without decoding what it has
    just encoded. Returns (payload, flags, columns)."""
    payload, flags, made = _encode(timestamps_us, keys, values, kinds, headers)
    timestamps, key_lengths, value_lengths, header_lengths, kind_column, blobs_at, \
        keys_bytes, values_bytes = made
    view = memoryview(payload)
    values_at = blobs_at + keys_bytes
    headers_at = values_at + values_bytes
    return payload, flags, Columns(
        base_offset, timestamps, kind_column, key_lengths, value_lengths, header_lengths,
        view[blobs_at:values_at], view[values_at:headers_at],
        view[headers_at:] if header_lengths is not None else None, txn_id, view, producer,
        bool(flags & FLAG_HAS_NULLS))


def _encode(timestamps_us, keys, values, kinds, headers):
    """(payload, flags, (timestamps, key lengths, value lengths, header lengths or
    None, kinds or None, where the blobs start, keys' and values' blob sizes))."""
    n = len(values)
    assert n >= 1
    assert len(keys) == n and len(timestamps_us) == n
    flags = 0
    timestamps = np.asarray(timestamps_us, dtype="<i8")
    key_lengths = lengths_or_null(keys, n)
    value_lengths = lengths_or_null(values, n)
    if int(value_lengths.min()) < 0:
        flags |= FLAG_HAS_NULLS
    parts = [timestamps.tobytes(), key_lengths.tobytes(), value_lengths.tobytes()]
    header_blobs = header_lengths = kind_column = None
    if headers is not None and any(headers):
        flags |= FLAG_HAS_HEADERS
        header_blobs = [encode_headers(h) for h in headers]
        header_lengths = np.fromiter(map(len, header_blobs), "<i4", n)
        parts.append(header_lengths.tobytes())
        if any(value is None for pairs in headers if pairs for _, value in pairs):
            flags |= FLAG_HAS_NULLS
    if kinds is not None and any(kinds):
        flags |= FLAG_HAS_CONTROL
        kind_column = np.asarray(kinds, dtype="u1")
        parts.append(kind_column.tobytes())
    blobs_at = sum(map(len, parts))
    key_blob = b"".join(filter(None, keys))  # skips None and b"" at C speed
    value_blob = b"".join(filter(None, values) if flags & FLAG_HAS_NULLS else values)
    parts += [key_blob, value_blob]
    if header_blobs is not None:
        parts.append(b"".join(header_blobs))
    return b"".join(parts), flags, (timestamps, key_lengths, value_lengths, header_lengths,
                                    kind_column, blobs_at, len(key_blob), len(value_blob))


@dataclasses.dataclass(slots=True)
class EncodedRows:
    """Rows of a columnar append (columnar.py) already in payload form: each field is
    one column part of the layout above for these rows, as bytes-like objects (NumPy
    arrays, or memoryviews into the caller's Arrow buffers). Consecutive pieces join
    into one payload by concatenating part by part (encoded_parts), with no work per
    record. Data records only: no kinds, no headers (flags 0, or FLAG_HAS_NULLS when a
    value is None: encoded_flags)."""

    timestamps_us: np.ndarray  # <i8[n]
    key_lengths: np.ndarray  # <i4[n], -1 = no key
    value_lengths: np.ndarray  # <i4[n], -1 = None
    keys: memoryview | bytes
    values: memoryview | bytes
    min_timestamp_us: int
    max_timestamp_us: int
    nbytes: int  # the size estimate the appender packs frames by (as Piece.nbytes)
    txn_id: int = 0
    producer: ProducerStamp | None = None  # a stamped piece is a frame of its own

    @property
    def record_count(self) -> int:
        return len(self.timestamps_us)


def encoded_parts(pieces: list[EncodedRows]) -> list:
    """The buffers that, in order, make the raw payload (flags 0) of consecutive
    EncodedRows pieces: every piece's timestamps, then every piece's key lengths, and
    so on."""
    assert pieces
    for piece in pieces:
        assert piece.timestamps_us.dtype == np.dtype("<i8")
        assert len(piece.key_lengths) == len(piece.value_lengths) == piece.record_count
    parts = [piece.timestamps_us for piece in pieces]
    parts += [piece.key_lengths for piece in pieces]
    parts += [piece.value_lengths for piece in pieces]
    parts += [piece.keys for piece in pieces]
    parts += [piece.values for piece in pieces]
    return parts


def encoded_flags(pieces: list[EncodedRows]) -> int:
    """The payload flags of consecutive EncodedRows pieces joined: FLAG_HAS_NULLS when
    one of their values is None, else 0."""
    nulls = any(int(piece.value_lengths.min()) < 0 for piece in pieces)
    return FLAG_HAS_NULLS if nulls else 0


def join_encoded(pieces: list[EncodedRows]) -> bytes:
    """encoded_parts joined: the raw payload as one bytes (one copy of the bytes)."""
    return b"".join(encoded_parts(pieces))


def lengths_or_null(items, n: int) -> np.ndarray:
    """The payload's length column of keys or values: each item's length, -1 for None."""
    try:
        return np.fromiter(map(len, items), "<i4", n)  # no None among them: the common case
    except TypeError:
        return np.fromiter((-1 if item is None else len(item) for item in items), "<i4", n)


def compress(raw: bytes, compressor: zstandard.ZstdCompressor) -> bytes | None:
    """zstd of `raw` when it saves enough to pay for decompression, else None."""
    packed = compressor.compress(raw)
    if len(packed) <= len(raw) * (1 - _ZSTD_GAIN_MIN):
        return packed
    return None


# zstandard objects must not be used from several threads at once (reader threads, the
# daemon's worker pool, Spark tasks): each thread gets its own decompressor, lazily.
_THREAD_CODECS = threading.local()


def _decompressor() -> zstandard.ZstdDecompressor:
    """This thread's zstd decompressor (created on first use in the thread)."""
    try:
        return _THREAD_CODECS.decompressor
    except AttributeError:
        decompressor = _THREAD_CODECS.decompressor = zstandard.ZstdDecompressor()
        return decompressor


def decode_columns(frame: Frame) -> Columns:
    """Columns of a verified frame. Raises CorruptFrame if the payload is inconsistent
    (possible only for a frame written by a buggy writer: the checksum already held)."""
    payload = frame.payload
    if frame.codec == CODEC_ZSTD:
        try:
            payload = _decompressor().decompress(payload, max_output_size=frame.raw_bytes)
        except zstandard.ZstdError as error:
            raise CorruptFrame(f"zstd: {error}", frame.position) from None
    elif frame.codec != CODEC_NONE:
        raise CorruptFrame(f"unknown codec {frame.codec}", frame.position)
    if len(payload) != frame.raw_bytes:
        raise CorruptFrame("payload length disagrees with header", frame.position)
    return _split_columns(memoryview(payload), frame)


def _split_columns(buf: memoryview, frame: Frame) -> Columns:
    n = frame.record_count
    has_headers = bool(frame.flags & FLAG_HAS_HEADERS)
    fixed = n * (16 + (4 if has_headers else 0) + (1 if frame.has_control else 0))
    if fixed > len(buf):
        raise CorruptFrame("payload shorter than its columns", frame.position)
    position = 0
    timestamps = np.frombuffer(buf, "<i8", n, position)
    position += 8 * n
    key_lengths = np.frombuffer(buf, "<i4", n, position)
    position += 4 * n
    value_lengths = np.frombuffer(buf, "<i4", n, position)
    position += 4 * n
    header_lengths = None
    if has_headers:
        header_lengths = np.frombuffer(buf, "<i4", n, position)
        position += 4 * n
    kinds = None
    if frame.has_control:
        kinds = np.frombuffer(buf, "u1", n, position)
        position += n
    nulls = bool(frame.flags & FLAG_HAS_NULLS)
    if (value_lengths < (-1 if nulls else 0)).any() or (key_lengths < -1).any() or (
            header_lengths is not None and (header_lengths < 0).any()):
        raise CorruptFrame("negative length in payload", frame.position)
    if nulls and kinds is not None and kinds[value_lengths < 0].any():
        raise CorruptFrame("a control record with a None value", frame.position)
    keys_total = int(np.maximum(key_lengths, 0).sum())
    values_total = int((np.maximum(value_lengths, 0) if nulls else value_lengths).sum())
    headers_total = int(header_lengths.sum()) if header_lengths is not None else 0
    if position + keys_total + values_total + headers_total != len(buf):
        raise CorruptFrame("payload lengths do not add up", frame.position)
    keys = buf[position:position + keys_total]
    position += keys_total
    values = buf[position:position + values_total]
    position += values_total
    headers = buf[position:position + headers_total] if has_headers else None
    return Columns(frame.base_offset, timestamps, kinds, key_lengths, value_lengths,
                   header_lengths, keys, values, headers, frame.txn_id, buf, frame.producer,
                   nulls)


def columns_to_records(columns: Columns, partition: int, start: int = 0,
                       stop: int | None = None, data_only: bool = True):
    """Records for rows [start, stop) of a batch: one Record (a tuple) per record, built
    by C-level map/zip over the columns; only batches with headers take a Python loop.
    A record without a key has key None, a tombstone value None (never b"")."""
    stop = len(columns) if stop is None else stop
    if stop <= start:
        return iter(())
    rows: list[int] | range = range(start, stop)
    kinds = None
    if columns.kinds is not None:
        selected = columns.kinds[start:stop]
        if data_only:
            rows = (np.flatnonzero(selected == 0) + start).tolist()
        else:
            kinds = list(map(RecordKind, selected.tolist()))
    if columns.header_lengths is not None:
        return _records_with_headers(columns, partition, rows, kinds)
    key_offsets = columns.key_offsets().tolist()
    value_offsets = columns.value_offsets().tolist()
    keys, values = bytes(columns.keys), bytes(columns.values)
    timestamps = columns.timestamps_us.tolist()
    base, count = columns.base_offset, len(rows)
    contiguous = isinstance(rows, range)
    if contiguous:
        lo, hi = rows.start, rows.stop
        value_starts, value_ends = value_offsets[lo:hi], value_offsets[lo + 1:hi + 1]
        key_starts, key_ends = key_offsets[lo:hi], key_offsets[lo + 1:hi + 1]
        stamps = timestamps[lo:hi]
        key_lengths = columns.key_lengths[lo:hi]
        value_lengths = columns.value_lengths[lo:hi]
    else:
        value_starts = [value_offsets[i] for i in rows]
        value_ends = [value_offsets[i + 1] for i in rows]
        key_starts = [key_offsets[i] for i in rows]
        key_ends = [key_offsets[i + 1] for i in rows]
        stamps = [timestamps[i] for i in rows]
        key_lengths = columns.key_lengths[rows] if count else columns.key_lengths[:0]
        value_lengths = (columns.value_lengths[rows] if count
                         else columns.value_lengths[:0])
    record_values = map(operator.getitem, itertools.repeat(values),
                        map(slice, value_starts, value_ends))
    record_keys = map(operator.getitem, itertools.repeat(keys),
                      map(slice, key_starts, key_ends))
    if (key_lengths < 0).any():  # records without a key: None, not b""
        present = (key_lengths >= 0).tolist()
        record_keys = map(_or_none, record_keys, present)
    if columns.nulls and (value_lengths < 0).any():  # tombstones: None, not b""
        present = (value_lengths >= 0).tolist()
        record_values = map(_or_none, record_values, present)
    offsets = (range(base + rows.start, base + rows.stop) if contiguous
               else map(base.__add__, rows))
    return map(_new_record, zip(
        itertools.repeat(partition, count), offsets, stamps, record_keys, record_values,
        itertools.repeat(RecordKind.DATA, count) if kinds is None else kinds,
        itertools.repeat((), count), itertools.repeat(columns.txn_id, count)))


def _or_none(item: bytes, present: bool) -> bytes | None:
    return item if present else None


# tuple.__new__ bound to Record: a C call per record where Record._make is a Python one.
_new_record = functools.partial(tuple.__new__, Record)


def _records_with_headers(columns: Columns, partition: int, rows, kinds):
    key_offsets = columns.key_offsets().tolist()
    value_offsets = columns.value_offsets().tolist()
    key_lengths = columns.key_lengths.tolist()
    value_lengths = columns.value_lengths.tolist()
    timestamps = columns.timestamps_us.tolist()
    header_offsets = offsets_of(columns.header_lengths).tolist()
    keys, values = bytes(columns.keys), bytes(columns.values)
    base, txn_id, nulls = columns.base_offset, columns.txn_id, columns.nulls
    first = rows[0] if len(rows) else 0
    for i in rows:
        kind = RecordKind.DATA if kinds is None else kinds[i - first]
        key = keys[key_offsets[i]:key_offsets[i + 1]] if key_lengths[i] >= 0 else None
        value = (values[value_offsets[i]:value_offsets[i + 1]] if value_lengths[i] >= 0
                 else None)
        headers = decode_headers(columns.headers[header_offsets[i]:header_offsets[i + 1]],
                                 nulls=nulls)
        yield Record(partition, base + i, timestamps[i], key, value, kind, headers, txn_id)


def encode_headers(headers) -> bytes:
    """One record's headers, (name, bytes or None) pairs, as the layout above."""
    if not headers:
        return b""
    parts = [_U16.pack(len(headers))]
    for name, value in headers:
        name_bytes = name.encode()
        parts += [_U16.pack(len(name_bytes)), name_bytes]
        parts += ([_NULL_HEADER] if value is None
                  else [_U32.pack(len(value)), bytes(value)])
    return b"".join(parts)


def decode_headers(buf, *, nulls: bool = False) -> tuple[tuple[str, bytes | None], ...]:
    """One record's headers. `nulls`: the payload has FLAG_HAS_NULLS, so a value length
    of 0xFFFFFFFF is a None value; without it that length, like any name or value that
    runs past the record's headers or bytes left after the last one, is CorruptFrame."""
    buf = bytes(buf)
    if not buf:
        return ()
    try:
        (count,), position, out = _U16.unpack_from(buf, 0), 2, []
        for _ in range(count):
            (name_length,) = _U16.unpack_from(buf, position)
            end = position + 2 + name_length
            name = buf[position + 2:end].decode()
            (value_length,) = _U32.unpack_from(buf, end)
            position = end + 4
            if value_length == NULL_HEADER_LENGTH and nulls:
                out.append((name, None))
                continue
            if position + value_length > len(buf):
                raise CorruptFrame("bad record headers: a header runs past the record's")
            out.append((name, buf[position:position + value_length]))
            position += value_length
    except (struct.error, UnicodeDecodeError) as error:
        raise CorruptFrame(f"bad record headers: {error}") from None
    if position != len(buf):
        raise CorruptFrame("bad record headers: bytes after the last header")
    return tuple(out)


# -- the high-water-mark rule (DESIGN 5), in one place ------------------------------
# A record's high-water mark is the largest timestamp of the DATA records up to it.
# Control records (commit and abort markers, checkpoint notes, footprints) never move
# it: a marker written now must not make a replay of last year's data start at its end.
# The frame header's min/max cover every record (verify checks that), so only a frame
# with control records needs its payload to say what its data contributes.

NO_TIME = -(1 << 63)  # "no data record yet"; below every valid timestamp (int64 min + 1)


def data_timestamps(timestamps_us: np.ndarray, kinds: np.ndarray | None) -> np.ndarray:
    """The timestamps with each control record's replaced by NO_TIME."""
    if kinds is None:
        return timestamps_us
    return np.where(kinds == 0, timestamps_us, NO_TIME)


def running_max(columns: "Columns", prior_max: int | None) -> np.ndarray:
    """High-water mark of each record of a batch: the max of prior_max and every data
    record's timestamp up to it (NO_TIME while there has been none)."""
    stamps = data_timestamps(columns.timestamps_us, columns.kinds)
    hwm = np.maximum.accumulate(stamps)
    return hwm if prior_max is None else np.maximum(hwm, prior_max)


def frame_time_us(frame: Frame) -> int | None:
    """What a frame adds to the high-water mark: its data records' largest timestamp,
    None when it holds none. The header says it for a frame without control records."""
    if not frame.has_control:
        return frame.max_timestamp_us
    columns = decode_columns(frame)
    latest = int(data_timestamps(columns.timestamps_us, columns.kinds).max())
    return None if latest == NO_TIME else latest


def advance_hwm(hwm: int | None, time_us: int | None) -> int | None:
    """The high-water mark after something that adds `time_us` (None: nothing)."""
    if time_us is None:
        return hwm
    return time_us if hwm is None or time_us > hwm else hwm


def offsets_of(lengths: np.ndarray) -> np.ndarray:
    """Start offsets of items with `lengths` (none negative), and the end: n + 1
    values from 0."""
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out
