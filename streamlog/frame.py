"""Batch frames: the unit the log writes, checksums and indexes.

Strategy: pure functions over bytes; no I/O. A segment file is frames back to back.
`decode_frame(buf, position)` returns a `Frame`, or `INCOMPLETE` when the buffer ends
inside the frame, and raises `CorruptFrame` only for bytes that can never become a valid
frame. Whether a bad frame is a torn write or corruption is `scan.py`'s decision, since
it depends on what follows it.

Header layout (little-endian, 72 bytes):

    offset size type  field
         0    4  u32  magic            0x474F4C53 ("SLOG" on disk), lets verify resync
         4    1  u8   version          1
         5    1  u8   flags            bits 0-1 codec (0 none, 1 zstd), bit 2 has control
                                       records, bit 3 has headers, bit 4 has nulls (None
                                       values or header values), bit 5 has a producer
                                       stamp
         6    2  u16  reserved         0
         8    8  i64  base_offset      offset of the first record
        16    8  i64  min_timestamp_us
        24    8  i64  max_timestamp_us
        32    8  u64  txn_id           0 when the batch is not transactional
        40    4  u32  record_count     >= 1
        44    4  u32  payload_bytes    stored (possibly compressed) payload length
        48    4  u32  raw_bytes        payload length before compression
        52    4  u32  reserved         0
        56    8  u64  payload_checksum xxh3_64 of the stored payload
        64    8  u64  header_checksum  xxh3_64 of bytes 0..63

The header checksum covers every other header byte, payload checksum included, so one
64-bit check proves header and payload together, and a payload can be checked without
the header being trusted first (dump reports which of the two is wrong). Checksumming
the *stored* bytes means recovery never decompresses (as Kafka's CRC does).

Producer stamp (flag bit 5). A batch a Kafka idempotent producer sent carries who sent
it, as Kafka's own batch header does, so that the broker can rebuild which batches each
producer has appended from the partition itself (kafka/producer_state.py). The stamp is
the first 16 bytes of the stored payload, never compressed:

    offset size type  field
         0    8  i64  producer_id      >= 0
         8    2  i16  producer_epoch   >= 0
        10    2  u16  reserved         0
        12    4  i32  base_sequence    >= 0, the sequence number of the first record

payload_bytes and the payload checksum count it, raw_bytes does not, and
`Frame.payload` is what follows it: everything downstream of decode_frame sees the
payload as it would without a stamp. Why there and not in the header: the header's
reserved bytes (6) are too few, and this way every reader that sizes a frame from its
header (HEADER_BYTES + payload_bytes) stays right. Why in the frame at all: a frame is
written whole or detected as torn, so the stamp is exactly as durable as the records it
describes; a side file written after the append could not say whether a frame cut off
by a crash was that producer's. Frames without the flag are byte for byte as before.

Nulls (flag bit 4). A record's value may be None (a tombstone), distinct from b"", and
so may a header value (DESIGN 1). The payload writes a None value as value length -1
and a None header value as header value length 0xFFFFFFFF (payload.py), and sets this
flag only when the frame holds one: a frame without None is byte for byte what it was
before None existed, and a frame with one is refused by an older reader, whose
FLAGS_KNOWN lacks the bit ("unknown flags"), instead of misread as an empty value.
Without the flag, a value length of -1 or a header value length of 0xFFFFFFFF is
corruption, as any other negative or oversized length is.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import NamedTuple

import xxhash

from .errors import CorruptFrame

MAGIC = 0x474F4C53
VERSION = 1
HEADER = struct.Struct("<IBBHqqqQIIIIQQ")
assert HEADER.size == 72
HEADER_BYTES = HEADER.size
_CHECKED = struct.Struct("<Q")
MAGIC_BYTES = struct.pack("<I", MAGIC)

CODEC_NONE = 0
CODEC_ZSTD = 1
CODEC_MASK = 0b11
FLAG_HAS_CONTROL = 0b100
FLAG_HAS_HEADERS = 0b1000
FLAG_HAS_NULLS = 0b10000
FLAG_HAS_PRODUCER = 0b100000
FLAGS_KNOWN = (CODEC_MASK | FLAG_HAS_CONTROL | FLAG_HAS_HEADERS | FLAG_HAS_NULLS
               | FLAG_HAS_PRODUCER)

STAMP = struct.Struct("<qhHi")
assert STAMP.size == 16
STAMP_BYTES = STAMP.size
SEQUENCE_MAX = (1 << 31) - 1  # Kafka's sequence numbers: int32, wrapping to 0 after it

# No frame is ever larger than this, whatever the config: a length field above it is
# corruption, not a frame we have not finished reading.
FRAME_BYTES_LIMIT = 1 << 30


class FrameHeader(NamedTuple):
    """A decoded, checked frame header (decode_header): the fields of the layout table
    above, in its order (the two reserved fields are named by their offset). A
    NamedTuple, made straight from the tuple `HEADER.unpack_from` gives."""

    magic: int
    version: int
    flags: int
    reserved_6: int
    base_offset: int
    min_timestamp_us: int
    max_timestamp_us: int
    txn_id: int
    record_count: int
    payload_bytes: int  # stored (possibly compressed) payload, any producer stamp included
    raw_bytes: int
    reserved_52: int
    payload_checksum: int
    header_checksum: int

    @property
    def frame_bytes(self) -> int:
        """The whole frame's size: this header and its stored payload."""
        return HEADER_BYTES + self.payload_bytes


assert len(FrameHeader._fields) == len(HEADER.unpack(bytes(HEADER_BYTES)))


class _Incomplete:
    """Sentinel: the buffer ends inside the frame (h11's NEED_DATA)."""

    def __repr__(self) -> str:
        return "INCOMPLETE"


INCOMPLETE = _Incomplete()


@dataclasses.dataclass(frozen=True, slots=True)
class ProducerStamp:
    """Who appended a batch: a Kafka idempotent producer's id and epoch, and the
    sequence number of the batch's first record (the next records follow it)."""

    producer_id: int
    producer_epoch: int
    base_sequence: int

    def sequence_at(self, row: int) -> int:
        """Sequence number of the batch's record `row` (Kafka's wrap after int32 max)."""
        assert row >= 0
        return (self.base_sequence + row) % (SEQUENCE_MAX + 1)


def encode_stamp(stamp: ProducerStamp) -> bytes:
    assert 0 <= stamp.producer_id < 1 << 63
    assert 0 <= stamp.producer_epoch <= 0x7FFF
    assert 0 <= stamp.base_sequence <= SEQUENCE_MAX
    return STAMP.pack(stamp.producer_id, stamp.producer_epoch, 0, stamp.base_sequence)


def decode_stamp(buf, position: int) -> ProducerStamp:
    """The stamp at `position` (the checksum over it already held). CorruptFrame for
    values no writer writes."""
    producer_id, epoch, reserved, sequence = STAMP.unpack_from(buf, position)
    if producer_id < 0 or epoch < 0 or sequence < 0 or reserved:
        raise CorruptFrame("impossible producer stamp", position)
    return ProducerStamp(producer_id, epoch, sequence)


@dataclasses.dataclass(frozen=True, slots=True)
class Frame:
    position: int
    base_offset: int
    record_count: int
    min_timestamp_us: int
    max_timestamp_us: int
    txn_id: int
    flags: int
    raw_bytes: int
    payload: memoryview | bytes  # the stored payload after the stamp, if any
    producer: ProducerStamp | None = None

    @property
    def codec(self) -> int:
        return self.flags & CODEC_MASK

    @property
    def has_control(self) -> bool:
        return bool(self.flags & FLAG_HAS_CONTROL)

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.record_count

    @property
    def size(self) -> int:
        stamp = STAMP_BYTES if self.producer is not None else 0
        return HEADER_BYTES + stamp + len(self.payload)

    @property
    def end_position(self) -> int:
        return self.position + self.size


def encode_frame(*, base_offset: int, record_count: int, min_timestamp_us: int,
                 max_timestamp_us: int, txn_id: int, flags: int, raw_bytes: int,
                 payload: bytes, producer: ProducerStamp | None = None) -> bytes:
    """Return header + payload for one batch (`flags` without FLAG_HAS_PRODUCER: a
    `producer` stamp sets it). Asserts what decode_frame verifies."""
    assert base_offset >= 0
    assert record_count >= 1
    assert min_timestamp_us <= max_timestamp_us
    assert flags & ~FLAGS_KNOWN == 0
    assert flags & FLAG_HAS_PRODUCER == 0
    if producer is not None:
        flags |= FLAG_HAS_PRODUCER
        payload = encode_stamp(producer) + payload
    assert HEADER_BYTES + len(payload) <= FRAME_BYTES_LIMIT
    payload_checksum = xxhash.xxh3_64_intdigest(payload)
    head = HEADER.pack(MAGIC, VERSION, flags, 0, base_offset, min_timestamp_us,
                       max_timestamp_us, txn_id, record_count, len(payload), raw_bytes, 0,
                       payload_checksum, 0)
    header_checksum = xxhash.xxh3_64_intdigest(memoryview(head)[:64])
    return b"".join((head[:64], _CHECKED.pack(header_checksum), payload))


def encode_frame_from_parts(*, base_offset: int, record_count: int, min_timestamp_us: int,
                            max_timestamp_us: int, txn_id: int, flags: int,
                            parts: list,
                            producer: ProducerStamp | None = None) -> bytes:
    """encode_frame of an uncompressed payload given as buffers to concatenate, as one
    buffer (frame_buffers joined)."""
    return b"".join(frame_buffers(base_offset=base_offset, record_count=record_count,
                                  min_timestamp_us=min_timestamp_us,
                                  max_timestamp_us=max_timestamp_us, txn_id=txn_id,
                                  flags=flags, parts=parts, producer=producer))


def frame_buffers(*, base_offset: int, record_count: int, min_timestamp_us: int,
                  max_timestamp_us: int, txn_id: int, flags: int, parts: list,
                  producer: ProducerStamp | None = None) -> list:
    """encode_frame of an uncompressed payload given as buffers to concatenate, as
    buffers: the header (with the stamp, if any), then the parts themselves, not
    copied. The frame is their concatenation (one gathered write: FileIO.pwritev);
    the payload checksum is computed over the parts in turn."""
    views = [view for view in (memoryview(part).cast("B") for part in parts) if view.nbytes]
    size = sum(view.nbytes for view in views)
    assert base_offset >= 0 and record_count >= 1
    assert min_timestamp_us <= max_timestamp_us
    assert flags & ~FLAGS_KNOWN == 0 and flags & CODEC_MASK == 0
    assert flags & FLAG_HAS_PRODUCER == 0
    stamp = b"" if producer is None else encode_stamp(producer)
    if producer is not None:
        flags |= FLAG_HAS_PRODUCER
    assert HEADER_BYTES + len(stamp) + size <= FRAME_BYTES_LIMIT
    hasher = xxhash.xxh3_64(stamp)
    for view in views:
        hasher.update(view)
    head = bytearray(HEADER_BYTES + len(stamp))
    HEADER.pack_into(head, 0, MAGIC, VERSION, flags, 0, base_offset, min_timestamp_us,
                     max_timestamp_us, txn_id, record_count, len(stamp) + size, size, 0,
                     hasher.intdigest(), 0)
    _CHECKED.pack_into(head, 64, xxhash.xxh3_64_intdigest(memoryview(head)[:64]))
    head[HEADER_BYTES:] = stamp
    return [head, *views]


def decode_header(buf, position: int = 0) -> FrameHeader | _Incomplete:
    """Decode and check the header at `position`. Returns a FrameHeader, or INCOMPLETE
    when `buf` ends inside a header that may still become valid; raises CorruptFrame."""
    fields = _checked_header(buf, position)
    return fields if fields is INCOMPLETE else FrameHeader._make(fields)


def _checked_header(buf, position: int):
    """decode_header's checks, returning the plain tuple `HEADER.unpack_from` gives
    (FrameHeader's fields, in its order) or INCOMPLETE. decode_frame runs this once a
    frame in every scan, where making a FrameHeader costs a measurable share of the
    scan, so it takes the tuple apart into named locals instead."""
    if len(buf) - position < HEADER_BYTES:
        if _magic_prefix_ok(buf, position):
            return INCOMPLETE
        raise CorruptFrame("bad magic", position)
    fields = HEADER.unpack_from(buf, position)
    (magic, version, flags, _, base_offset, min_timestamp_us, max_timestamp_us, _,
     record_count, payload_bytes, raw_bytes, _, _, header_checksum) = fields
    if magic != MAGIC:
        raise CorruptFrame("bad magic", position)
    if xxhash.xxh3_64_intdigest(memoryview(buf)[position:position + 64]) != header_checksum:
        raise CorruptFrame("header checksum mismatch", position)
    if version != VERSION:
        raise CorruptFrame(f"unknown format version {version}", position)
    if flags & ~FLAGS_KNOWN or flags & CODEC_MASK > CODEC_ZSTD:
        raise CorruptFrame(f"unknown flags {flags:#x}", position)
    if record_count < 1 or base_offset < 0 or min_timestamp_us > max_timestamp_us:
        raise CorruptFrame("impossible header values", position)
    if payload_bytes > FRAME_BYTES_LIMIT or raw_bytes > FRAME_BYTES_LIMIT or (
            flags & FLAG_HAS_PRODUCER and payload_bytes < STAMP_BYTES):
        raise CorruptFrame("impossible payload length", position)
    return fields


def payload_start(frame: bytes | bytearray | memoryview) -> int:
    """Where the payload proper (after any stamp) begins in a frame encoded here."""
    return HEADER_BYTES + (STAMP_BYTES if frame[5] & FLAG_HAS_PRODUCER else 0)


def decode_frame(buf, position: int = 0) -> Frame | _Incomplete:
    """Decode the frame that starts at `position` in `buf` (bytes or memoryview).

    Returns a Frame whose payload is a view into `buf`, or INCOMPLETE when `buf` ends
    before the frame does. Raises CorruptFrame for bytes that can never be a frame.
    """
    fields = _checked_header(buf, position)
    if fields is INCOMPLETE:
        return INCOMPLETE
    (_, _, flags, _, base_offset, min_timestamp_us, max_timestamp_us, txn_id, record_count,
     payload_bytes, raw_bytes, _, payload_checksum, _) = fields
    start = position + HEADER_BYTES
    if len(buf) - start < payload_bytes:
        return INCOMPLETE
    payload = memoryview(buf)[start:start + payload_bytes]
    if xxhash.xxh3_64_intdigest(payload) != payload_checksum:
        raise CorruptFrame("payload checksum mismatch", position)
    producer = None
    if flags & FLAG_HAS_PRODUCER:
        producer = decode_stamp(buf, start)
        payload = payload[STAMP_BYTES:]
    return Frame(position=position, base_offset=base_offset, record_count=record_count,
                 min_timestamp_us=min_timestamp_us, max_timestamp_us=max_timestamp_us,
                 txn_id=txn_id, flags=flags, raw_bytes=raw_bytes, payload=payload,
                 producer=producer)


def frame_size_hint(buf, position: int) -> int | None:
    """Total size of the frame at `position` if its header is intact, else None."""
    try:
        header = decode_header(buf, position)
    except CorruptFrame:
        return None
    if header is INCOMPLETE:
        return None
    return header.frame_bytes


def _magic_prefix_ok(buf, position: int) -> bool:
    tail = bytes(memoryview(buf)[position:position + 4])
    return MAGIC_BYTES.startswith(tail)
