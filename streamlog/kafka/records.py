"""Kafka RecordBatch v2 (magic 2): decode what producers send, encode what consumers get.

Strategy: pure functions over bytes, no I/O. A batch is laid out as Kafka's
DefaultRecordBatch documents it:

    base_offset int64 | batch_length int32 | partition_leader_epoch int32 | magic int8
    | crc uint32 | attributes int16 | last_offset_delta int32 | base_timestamp int64
    | max_timestamp int64 | producer_id int64 | producer_epoch int16
    | base_sequence int32 | record_count int32 | records...

`batch_length` counts the bytes after itself; the CRC (CRC32C, Castagnoli) covers
everything from `attributes` to the end, so that the broker may rewrite base_offset
and partition_leader_epoch without recomputing it. Attributes: bits 0-2 the
compression (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd), bit 3 the timestamp type, bit 4
transactional, bit 5 control. A record is a varint length, then attributes int8,
timestamp delta (varlong), offset delta (varint), key and value (varint length, -1 for
null, then bytes) and headers (varint count, each a varint-length key and value).

Compressed batches are decoded with well-kept libraries: gzip (zlib, the standard
library), snappy and lz4 (cramjam; snappy either raw or in the xerial framing Java
clients write), zstd (zstandard). Encoding (Fetch) never compresses: the consumer is
on the other end of a socket the daemon serves locally, and the cost of compression is
the daemon's CPU.

Errors: `BatchError(code, message)` with the Kafka error code the Produce response
carries: CORRUPT_MESSAGE for a bad CRC, a short batch or a malformed record,
UNSUPPORTED_FOR_MESSAGE_FORMAT for magic 0 and 1, UNSUPPORTED_COMPRESSION_TYPE for a
codec number Kafka does not define.
"""

from __future__ import annotations

import dataclasses
import itertools
import struct
import zlib

import crc32c as _crc32c
import numpy as np

from .errors import ErrorCode

HEADER = struct.Struct(">qiibIhiqqqhii")  # through record_count: 61 bytes
HEADER_BYTES = HEADER.size
CRC_START = 21  # attributes begins here; the CRC covers [21, end)
_LENGTH_PREFIX = 12  # base_offset + batch_length

COMPRESSION_MASK = 0x07
TIMESTAMP_LOG_APPEND = 0x08
TRANSACTIONAL = 0x10
CONTROL = 0x20

NONE, GZIP, SNAPPY, LZ4, ZSTD = range(5)
CODEC_NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_DECOMPRESSED_BYTES_MAX = 256 * 1024 * 1024  # a zip bomb is refused, not buffered


class BatchError(ValueError):
    """A batch that cannot be taken; `code` is the Kafka error code to answer with."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclasses.dataclass(frozen=True, slots=True)
class KafkaRecord:
    """One record as Kafka sees it: timestamp in milliseconds, headers as (str, bytes)
    pairs (a null header value or record value is given as None)."""

    offset_delta: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Batch:
    """One decoded batch: the header fields a broker acts on, and its records as
    parallel columns (what an append takes): Python lists, or, from
    `decode_batches(as_arrays=True)` when no record has headers or a null value, Arrow
    arrays in `arrays` ({"value", "key", "timestamp" (ms)}) and the lists None.
    `records` gives them one by one either way."""

    base_offset: int
    attributes: int
    last_offset_delta: int
    base_timestamp_ms: int
    max_timestamp_ms: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    count: int
    offset_deltas: list[int] | None
    timestamps_ms: list[int] | None
    keys: list[bytes | None] | None
    values: list[bytes | None] | None
    headers: list[tuple] | None  # None: no record has headers
    arrays: dict | None = None

    def __len__(self) -> int:
        return self.count

    @property
    def records(self) -> tuple[KafkaRecord, ...]:
        if self.arrays is not None:
            arrays = self.arrays
            return tuple(map(KafkaRecord, arrays["offset_delta"].to_pylist(),
                             arrays["timestamp"].to_pylist(), arrays["key"].to_pylist(),
                             arrays["value"].to_pylist(), [()] * self.count))
        headers = self.headers or [()] * len(self)
        return tuple(map(KafkaRecord, self.offset_deltas, self.timestamps_ms, self.keys,
                         self.values, headers))

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL)


# -- decoding ------------------------------------------------------------------------

def decode_batches(data: bytes, *, check_crc: bool = True,
                   as_arrays: bool = False) -> list[Batch]:
    """Every batch in a Produce request's `records` bytes (usually one); with
    `as_arrays`, batches without headers or null values come as Arrow arrays (see
    Batch), decoded without a Python step per field.

    Raises:
        BatchError: a bad CRC, a short or malformed batch, an old magic, an unknown
            compression codec (with the Kafka error code to answer).
    """
    view = memoryview(data)
    batches, position = [], 0
    while position < len(view):
        if len(view) - position < HEADER_BYTES:
            raise BatchError(ErrorCode.corrupt_message,
                             f"{len(view) - position} bytes left: not a whole batch header")
        batch_length = struct.unpack_from(">i", view, position + 8)[0]
        end = position + _LENGTH_PREFIX + batch_length
        if batch_length < HEADER_BYTES - _LENGTH_PREFIX or end > len(view):
            raise BatchError(ErrorCode.corrupt_message,
                             f"batch length {batch_length} does not fit the "
                             f"{len(view) - position} bytes given")
        batches.append(decode_batch(view[position:end], check_crc=check_crc,
                                    as_arrays=as_arrays))
        position = end
    return batches


def decode_batch(view: memoryview, *, check_crc: bool = True,
                 as_arrays: bool = False) -> Batch:
    """One whole batch (its bytes exactly)."""
    (base_offset, _length, _epoch, magic, crc, attributes, last_offset_delta, base_ts,
     max_ts, producer_id, producer_epoch, base_sequence, count) = HEADER.unpack_from(view, 0)
    if magic != 2:
        raise BatchError(ErrorCode.unsupported_for_message_format,
                         f"message format magic {magic}: only magic 2 (RecordBatch) is served")
    if check_crc and _crc32c.crc32c(view[CRC_START:]) != crc:
        raise BatchError(ErrorCode.corrupt_message, "the batch's CRC32C does not match")
    codec = attributes & COMPRESSION_MASK
    body = view[HEADER_BYTES:]
    if codec != NONE:
        body = memoryview(decompress(codec, body))
    if count < 0 or count > len(body):  # each record takes at least one byte
        raise BatchError(ErrorCode.corrupt_message, f"record count {count} is impossible")
    body = bytes(body)
    header = (base_offset, attributes, last_offset_delta, base_ts, max_ts, producer_id,
              producer_epoch, base_sequence, count)
    try:
        if as_arrays and count:
            arrays = _decode_arrays(body, count, base_ts)
            if arrays is not None:
                return Batch(*header, None, None, None, None, None, arrays)
        columns, used = _decode_records(body, count, base_ts)
    except (IndexError, UnicodeDecodeError, ValueError) as error:
        raise BatchError(ErrorCode.corrupt_message, f"a malformed record: {error}") from None
    if used != len(body):
        raise BatchError(ErrorCode.corrupt_message,
                         f"{len(body) - used} bytes after the batch's {count} records")
    return Batch(*header, *columns)


def decompress(codec: int, data) -> bytes:
    """The decompressed bytes of a batch body; BatchError for an unknown codec or data
    that does not decompress."""
    try:
        if codec == GZIP:
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
            out = inflater.decompress(data, _DECOMPRESSED_BYTES_MAX)
            if inflater.unconsumed_tail:
                raise BatchError(ErrorCode.record_list_too_large,
                                 "the gzip batch inflates past 256 MiB")
            return out
        if codec == SNAPPY:
            import cramjam
            return _snappy(cramjam, bytes(data))
        if codec == LZ4:
            import cramjam
            return bytes(cramjam.lz4.decompress(bytes(data)))
        if codec == ZSTD:
            import zstandard
            return zstandard.ZstdDecompressor().decompress(
                bytes(data), max_output_size=_DECOMPRESSED_BYTES_MAX)
    except BatchError:
        raise
    except Exception as error:  # each library has its own error classes
        name = CODEC_NAMES[codec]
        raise BatchError(ErrorCode.corrupt_message,
                         f"the {name} batch does not decompress: {error}") from None
    raise BatchError(ErrorCode.unsupported_compression_type,
                     f"compression codec {codec} is not one Kafka defines")


def _snappy(cramjam, data: bytes) -> bytes:
    """Raw snappy (librdkafka) or xerial framing (the Java client: a 16-byte header,
    then blocks, each a big-endian int32 length and a raw snappy block)."""
    if not data.startswith(_XERIAL_MAGIC):
        return bytes(cramjam.snappy.decompress_raw(data))
    out, position = [], 16
    while position < len(data):
        (size,) = struct.unpack_from(">i", data, position)
        position += 4
        out.append(bytes(cramjam.snappy.decompress_raw(data[position:position + size])))
        position += size
    return b"".join(out)


def _varint(buf, position: int) -> tuple[int, int]:
    """A zigzag varint at `position`: (value, next position)."""
    raw, position = _uvarint(buf, position)
    return (raw >> 1) ^ -(raw & 1), position


def _decode_records(body: bytes, count: int, base_ts: int):
    """Columns of `count` records: (offset deltas, timestamps ms, keys, values, headers
    or None), and the bytes used. One Python loop, no call per field: varints of one
    or two bytes (deltas and lengths below 8 KiB, the common case) are decoded inline,
    longer ones by `_uvarint`. Each `raw` is the unsigned varint; `(raw >> 1) ^ -(raw &
    1)` undoes the zigzag."""
    deltas, stamps, keys, values = [], [], [], []
    headers: list | None = None
    uvarint, position = _uvarint, 0
    for row in range(count):
        raw = body[position]
        if raw < 0x80:
            position += 1
        elif body[position + 1] < 0x80:
            raw, position = (raw & 0x7F) | (body[position + 1] << 7), position + 2
        else:
            raw, position = uvarint(body, position)
        length = (raw >> 1) ^ -(raw & 1)
        end = position + length
        if length < 0 or end > len(body):
            raise ValueError(f"record length {length}")
        position += 1  # attributes: unused in v2
        raw = body[position]
        if raw < 0x80:
            position += 1
        elif body[position + 1] < 0x80:
            raw, position = (raw & 0x7F) | (body[position + 1] << 7), position + 2
        else:
            raw, position = uvarint(body, position)
        stamps.append(base_ts + ((raw >> 1) ^ -(raw & 1)))
        raw = body[position]
        if raw < 0x80:
            position += 1
        elif body[position + 1] < 0x80:
            raw, position = (raw & 0x7F) | (body[position + 1] << 7), position + 2
        else:
            raw, position = uvarint(body, position)
        deltas.append((raw >> 1) ^ -(raw & 1))
        raw = body[position]
        if raw < 0x80:
            position += 1
        elif body[position + 1] < 0x80:
            raw, position = (raw & 0x7F) | (body[position + 1] << 7), position + 2
        else:
            raw, position = uvarint(body, position)
        if raw & 1:  # negative: -1 is a null key, anything else is nonsense
            if raw != 1:
                raise ValueError(f"key length {-(raw + 1) >> 1}")
            keys.append(None)
        else:
            size = raw >> 1  # a length: never negative but -1
            keys.append(body[position:position + size])
            position += size
        raw = body[position]
        if raw < 0x80:
            position += 1
        elif body[position + 1] < 0x80:
            raw, position = (raw & 0x7F) | (body[position + 1] << 7), position + 2
        else:
            raw, position = uvarint(body, position)
        if raw & 1:
            if raw != 1:
                raise ValueError(f"value length {-(raw + 1) >> 1}")
            values.append(None)
        else:
            size = raw >> 1
            values.append(body[position:position + size])
            position += size
        if body[position] == 0:  # no headers
            position += 1
            if headers is not None:
                headers.append(())
        else:
            found, position = _decode_headers(body, position)
            if headers is None:
                headers = [()] * row
            headers.append(found)
        if position != end:
            raise ValueError(f"record of {length} bytes holds {position - end + length}")
    return (deltas, stamps, keys, values, headers), position


def _uvarint(buf, position: int) -> tuple[int, int]:
    """An unsigned varint at `position` (at most 10 bytes): (value, next position)."""
    shift = result = 0
    while True:
        byte = buf[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, position
        shift += 7
        if shift > 63:
            raise ValueError("a varint longer than 10 bytes")


def _decode_arrays(body: bytes, count: int, base_ts: int) -> dict | None:
    """The records as Arrow arrays, or None when one has headers or a null value (the
    list decoder takes those). Only the hop from record to record is a Python loop (one
    varint each); every field is then read for all records at once. ValueError for
    malformed records."""
    import pyarrow as pa
    found: list[int] = []
    append, uvarint, position = found.append, _uvarint, 0
    for _ in range(count):
        append(position)
        raw = body[position]
        if raw < 0x80:
            position += 1 + (raw >> 1)
        elif body[position + 1] < 0x80:
            raw = (raw & 0x7F) | (body[position + 1] << 7)
            position += 2 + (raw >> 1)
        else:
            raw, position = uvarint(body, position)
            position += raw >> 1
        if raw & 1:
            raise ValueError(f"record length {-(raw + 1) >> 1}")
    if position != len(body):
        raise ValueError(f"the records take {position} of the body's {len(body)} bytes")
    starts = np.array(found, dtype=np.int64)
    buf = np.frombuffer(body, dtype=np.uint8)
    raw, size = _read_uvarints(buf, starts)
    ends = starts + size + (raw >> np.uint64(1)).astype(np.int64)
    position = starts + size + 1  # past the attributes byte
    fields = []
    for _name in ("timestamp", "offset_delta", "key_length", "value_length"):
        raw, size = _read_uvarints(buf, position)
        value = (raw >> np.uint64(1)).astype(np.int64) ^ -(raw & np.uint64(1)).astype(np.int64)
        fields.append(value)
        position = position + size
        if _name == "key_length":
            key_positions = position
            position = position + np.maximum(value, 0)
        elif _name == "value_length":
            value_positions = position
            position = position + np.maximum(value, 0)
    stamps, deltas, key_lengths, value_lengths = fields
    if (value_lengths < 0).any() or (key_lengths < -1).any():
        if (value_lengths < -1).any() or (key_lengths < -1).any():
            raise ValueError("a negative key or value length")
        return None  # a null value (a tombstone): the list decoder keeps it
    if (position >= ends).any() or buf[np.minimum(position, len(buf) - 1)].any():
        if (position >= ends).any():
            raise ValueError("a record ends inside its fields")
        return None  # headers
    if not np.array_equal(position + 1, ends):
        raise ValueError("a record's fields do not fill its length")
    key_bytes = np.maximum(key_lengths, 0)
    keys = _select(buf, key_positions, key_bytes)
    values = _select(buf, value_positions, value_lengths)
    key_offsets = np.zeros(count + 1, dtype=np.int32)
    np.cumsum(key_bytes, out=key_offsets[1:])
    value_offsets = np.zeros(count + 1, dtype=np.int32)
    np.cumsum(value_lengths, out=value_offsets[1:])
    nulls = key_lengths < 0
    validity = pa.py_buffer(np.packbits(~nulls, bitorder="little")) if nulls.any() else None
    return {
        "value": pa.Array.from_buffers(pa.binary(), count, [
            None, pa.py_buffer(value_offsets), pa.py_buffer(values)]),
        "key": pa.Array.from_buffers(pa.binary(), count, [
            validity, pa.py_buffer(key_offsets), pa.py_buffer(keys)],
            null_count=int(nulls.sum())),
        "timestamp": pa.array(stamps + base_ts, type=pa.int64()),
        "offset_delta": pa.array(deltas, type=pa.int64())}


def _read_uvarints(buf: np.ndarray, position: np.ndarray):
    """The unsigned varint at each position: (values uint64, sizes in bytes). Reads
    past the buffer's end are clipped; the callers' length checks catch them."""
    result = np.zeros(len(position), dtype=np.uint64)
    sizes = np.zeros(len(position), dtype=np.int64)
    alive = np.ones(len(position), dtype=np.bool_)
    for index in range(10):
        byte = buf.take(position + index, mode="clip").astype(np.uint64)
        result |= np.where(alive, (byte & np.uint64(0x7F)) << np.uint64(7 * index),
                           np.uint64(0))
        sizes += alive
        alive &= byte >= 0x80
        if not alive.any():
            return result, sizes
    raise ValueError("a varint longer than 10 bytes")


def _select(buf: np.ndarray, position: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The bytes of each record's share, concatenated (the reverse of _gather)."""
    if int(lengths.sum()) == 0:
        return np.zeros(0, dtype=np.uint8)
    ends = position + lengths
    runs = np.empty(2 * len(lengths) + 1, dtype=np.int64)
    runs[1:-1:2] = lengths
    runs[0] = position[0]
    runs[2:-1:2] = position[1:] - ends[:-1]
    runs[-1] = len(buf) - ends[-1]
    if (runs < 0).any():
        raise ValueError("keys or values overlap")
    pattern = np.zeros(len(runs), dtype=np.bool_)
    pattern[1::2] = True
    return buf[np.repeat(pattern, runs)]


def _decode_headers(body: bytes, position: int):
    count, position = _varint(body, position)
    if count < 0:
        raise ValueError(f"header count {count}")
    out = []
    for _ in range(count):
        name_length, position = _varint(body, position)
        if name_length < 0:
            raise ValueError("a header with a null key")
        name = str(body[position:position + name_length], "utf-8")
        position += name_length
        value_length, position = _varint(body, position)
        value = None
        if value_length >= 0:
            value = body[position:position + value_length]
            position += value_length
        out.append((name, value))
    return tuple(out), position


# -- encoding ------------------------------------------------------------------------

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
    payload = b"".join(parts)
    if last_offset_delta is None:
        last_offset_delta = offset_deltas[-1]
    tail = struct.pack(">hiqqqhii", attributes, last_offset_delta, base_ts, max_ts,
                       producer_id, producer_epoch, base_sequence, len(values)) + payload
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
    """The batch `encode_columns` makes for records without headers, offset deltas
    0..n-1 and no nulls but keys (key length -1), built with NumPy from the columns a
    log batch already has: `keys` and `values` are the concatenated bytes (null keys
    take none). Byte for byte the same as encode_columns (tests check it).

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
    key_bytes, value_bytes = np.maximum(key_lengths, 0), value_lengths
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
    payload = out.tobytes()
    tail = struct.pack(">hiqqqhii", 0, count - 1, base_ts, max_ts, producer_id,
                       producer_epoch, base_sequence, count) + payload
    crc = _crc32c.crc32c(tail)
    return struct.pack(">qiibI", base_offset, len(tail) + 9, 0, 2, crc) + tail


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
    (shares never touch: records have other bytes between them). The bytes to fill
    are a mask of alternating runs (gap, share, gap, share, ..., gap) made by one
    np.repeat: a byte per output byte, where an index per copied byte costs eight."""
    total = int(lengths.sum())
    if total == 0:
        return
    source = np.frombuffer(data, dtype=np.uint8, count=total)
    ends = position + lengths
    runs = np.empty(2 * len(lengths) + 1, dtype=np.int64)
    runs[1:-1:2] = lengths
    runs[0] = position[0]
    runs[2:-1:2] = position[1:] - ends[:-1]
    runs[-1] = len(out) - ends[-1]
    pattern = np.zeros(len(runs), dtype=np.bool_)
    pattern[1::2] = True
    out[np.repeat(pattern, runs)] = source
