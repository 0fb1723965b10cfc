"""Decoding Kafka RecordBatch v2 (records.py has the layout): what producers send.

Strategy: pure functions over bytes, no I/O. `decode_batches` walks a Produce request's
`records` bytes batch by batch; each batch's header is checked (magic, CRC, record
count) before its records are read, and every malformed byte raises `BatchError` with
the Kafka error code to answer. Records come out as parallel columns: Python lists
from one loop with the common varints inline, or, with `as_arrays`, Arrow arrays read
for all records at once with NumPy.

Compressed batches are decoded with well-kept libraries: gzip (zlib, the standard
library), snappy and lz4 (cramjam; snappy either raw or in the xerial framing Java
clients write), zstd (zstandard).
"""

from __future__ import annotations

import struct
import zlib

import crc32c as _crc32c
import numpy as np

from .errors import ErrorCode
from .records import (CODEC_NAMES, COMPRESSION_MASK, CRC_START, GZIP, HEADER, HEADER_BYTES,
                      LENGTH_PREFIX_BYTES, LZ4, NONE, SNAPPY, ZSTD, Batch, BatchError,
                      share_mask)

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_DECOMPRESSED_BYTES_MAX = 256 * 1024 * 1024  # a zip bomb is refused, not buffered


def decode_batches(data: bytes, *, check_crc: bool = True,
                   as_arrays: bool = False) -> list[Batch]:
    """Every batch in a Produce request's `records` bytes (usually one); with
    `as_arrays`, batches without headers come as Arrow arrays (see Batch), decoded
    without a Python step per field.

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
        end = position + LENGTH_PREFIX_BYTES + batch_length
        if batch_length < HEADER_BYTES - LENGTH_PREFIX_BYTES or end > len(view):
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
    """The records as Arrow arrays (a null key or value is an Arrow null), or None when
    one has headers (the list decoder takes those). Only the hop from record to record
    is a Python loop (one varint each); every field is then read for all records at
    once. ValueError for malformed records."""
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
    if (value_lengths < -1).any() or (key_lengths < -1).any():
        raise ValueError("a negative key or value length")
    if (position >= ends).any() or buf[np.minimum(position, len(buf) - 1)].any():
        if (position >= ends).any():
            raise ValueError("a record ends inside its fields")
        return None  # headers
    if not np.array_equal(position + 1, ends):
        raise ValueError("a record's fields do not fill its length")
    return {"value": _binary_array(buf, value_positions, value_lengths),
            "key": _binary_array(buf, key_positions, key_lengths),
            "timestamp": pa.array(stamps + base_ts, type=pa.int64()),
            "offset_delta": pa.array(deltas, type=pa.int64())}


def _binary_array(buf: np.ndarray, position: np.ndarray, lengths: np.ndarray):
    """An Arrow binary array of each record's key or value (`lengths[i]` bytes at
    `position[i]`), a null where the length is -1."""
    import pyarrow as pa
    count = len(lengths)
    shares = np.maximum(lengths, 0)
    data = _select(buf, position, shares)
    offsets = np.zeros(count + 1, dtype=np.int32)
    np.cumsum(shares, out=offsets[1:])
    nulls = lengths < 0
    validity = pa.py_buffer(np.packbits(~nulls, bitorder="little")) if nulls.any() else None
    return pa.Array.from_buffers(pa.binary(), count, [
        validity, pa.py_buffer(offsets), pa.py_buffer(data)], null_count=int(nulls.sum()))


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
    """The bytes of each record's share, concatenated (the reverse of
    record_encoding's gather)."""
    if int(lengths.sum()) == 0:
        return np.zeros(0, dtype=np.uint8)
    return buf[share_mask(position, lengths, len(buf))]


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
        if value_length < -1:
            raise ValueError(f"header value length {value_length}")
        value = None
        if value_length >= 0:
            value = body[position:position + value_length]
            position += value_length
        out.append((name, value))
    return tuple(out), position

