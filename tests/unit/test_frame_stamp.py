"""frame.py's producer stamp (flag bit 5): the first 16 bytes of a stamped frame's
stored payload, never compressed, covered by the payload checksum; `Frame.payload` is
what follows it. Frames without a stamp are byte for byte what they were (the golden
bytes in test_golden.py pin that)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import xxhash
import zstandard

from streamlog.errors import CorruptFrame
from streamlog.frame import (CODEC_ZSTD, FLAG_HAS_HEADERS, FLAG_HAS_PRODUCER, HEADER,
                             HEADER_BYTES, INCOMPLETE, MAGIC, SEQUENCE_MAX, STAMP,
                             STAMP_BYTES, VERSION, Frame, ProducerStamp, decode_frame,
                             encode_frame, encode_frame_from_parts, frame_size_hint,
                             payload_start)
from streamlog.payload import decode_columns, encode_payload
from streamlog.scan import StopReason, scan_buffer

STAMP_VALUE = ProducerStamp(producer_id=(1 << 62) + 5, producer_epoch=3,
                            base_sequence=SEQUENCE_MAX - 1)


def stamped(payload: bytes = b"payload!", flags: int = 0, producer=STAMP_VALUE, **fields):
    values = dict(base_offset=40, record_count=2, min_timestamp_us=1, max_timestamp_us=9,
                  txn_id=0, flags=flags, raw_bytes=len(payload), payload=payload,
                  producer=producer)
    values.update(fields)
    return encode_frame(**values)


def test_a_stamped_frame_decodes_to_its_stamp_and_the_payload_after_it():
    data = stamped(flags=FLAG_HAS_HEADERS)
    frame = decode_frame(data)
    assert frame.producer == STAMP_VALUE
    assert frame.flags == FLAG_HAS_HEADERS | FLAG_HAS_PRODUCER
    assert bytes(frame.payload) == b"payload!" and frame.raw_bytes == 8
    assert frame.size == frame.end_position == len(data) == HEADER_BYTES + 16 + 8
    assert frame_size_hint(data, 0) == len(data)
    assert payload_start(data) == HEADER_BYTES + STAMP_BYTES
    assert data[HEADER_BYTES:payload_start(data)] == STAMP.pack(
        STAMP_VALUE.producer_id, 3, 0, SEQUENCE_MAX - 1)
    # the payload checksum covers the stamp too
    assert struct.unpack_from("<Q", data, 56)[0] == xxhash.xxh3_64_intdigest(
        data[HEADER_BYTES:])


def test_without_a_stamp_nothing_changes():
    plain = encode_frame(base_offset=40, record_count=2, min_timestamp_us=1,
                         max_timestamp_us=9, txn_id=0, flags=0, raw_bytes=8,
                         payload=b"payload!")
    assert plain == stamped(producer=None)
    assert decode_frame(plain).producer is None and payload_start(plain) == HEADER_BYTES


def test_stamped_frames_scan_one_after_another_and_torn_ones_are_incomplete():
    first = stamped(b"a" * 30)
    second = stamped(b"b" * 5, base_offset=42, producer=ProducerStamp(9, 0, 0))
    result = scan_buffer(first + second, expect_offset=40)
    assert result.stop is StopReason.END
    assert [(f.base_offset, f.producer.producer_id) for f in result.frames] == [
        (40, STAMP_VALUE.producer_id), (42, 9)]
    for cut in (HEADER_BYTES + 3, HEADER_BYTES + STAMP_BYTES, len(first) - 1):
        assert decode_frame(first[:cut]) is INCOMPLETE


def test_the_stamp_is_never_compressed_and_columns_carry_it():
    raw, flags = encode_payload([5, 6], [b"k", None], [b"v" * 400, b"w" * 400])
    packed = zstandard.ZstdCompressor().compress(raw)
    data = stamped(packed, flags=flags | CODEC_ZSTD, raw_bytes=len(raw))
    frame = decode_frame(data)
    assert frame.producer == STAMP_VALUE  # read without decompressing anything
    columns = decode_columns(frame)
    assert columns.producer == STAMP_VALUE
    assert bytes(columns.values) == b"v" * 400 + b"w" * 400
    assert decode_columns(decode_frame(stamped(raw, flags=flags))).producer == STAMP_VALUE


def test_a_stamped_frame_from_parts_is_the_stamped_frame_of_their_concatenation():
    parts = [np.arange(3, dtype="<i8"), b"xyz", memoryview(b"tail")]
    payload = b"".join(bytes(memoryview(p).cast("B")) for p in parts)
    fields = dict(base_offset=7, record_count=3, min_timestamp_us=0, max_timestamp_us=0,
                  txn_id=0, flags=0, producer=STAMP_VALUE)
    built = encode_frame_from_parts(parts=parts, **fields)
    assert bytes(built) == encode_frame(raw_bytes=len(payload), payload=payload, **fields)
    assert bytes(memoryview(built)[payload_start(built):]) == payload


def test_a_sequence_runs_on_from_the_base_and_wraps():
    assert STAMP_VALUE.sequence_at(0) == SEQUENCE_MAX - 1
    assert STAMP_VALUE.sequence_at(1) == SEQUENCE_MAX
    assert STAMP_VALUE.sequence_at(3) == 1


def forge(stamp_bytes: bytes, *, payload_bytes: int | None = None) -> bytes:
    """A stamped frame with the given stamp bytes and correct checksums, so only the
    stamp check can refuse it."""
    stored = stamp_bytes + b"p"
    size = len(stored) if payload_bytes is None else payload_bytes
    head = HEADER.pack(MAGIC, VERSION, FLAG_HAS_PRODUCER, 0, 0, 0, 0, 0, 1, size, 1, 0,
                       xxhash.xxh3_64_intdigest(stored[:size]), 0)
    head = head[:64] + struct.pack("<Q", xxhash.xxh3_64_intdigest(head[:64]))
    return head + stored[:size]


@pytest.mark.parametrize("stamp_bytes, payload_bytes, reason", [
    (STAMP.pack(-1, 0, 0, 0), None, "impossible producer stamp"),
    (STAMP.pack(1, -2, 0, 0), None, "impossible producer stamp"),
    (STAMP.pack(1, 0, 0, -5), None, "impossible producer stamp"),
    (STAMP.pack(1, 0, 9, 0), None, "impossible producer stamp"),  # reserved must be 0
    (STAMP.pack(1, 0, 0, 0), STAMP_BYTES - 1, "impossible payload length"),
])
def test_impossible_stamps_are_corrupt(stamp_bytes, payload_bytes, reason):
    assert isinstance(decode_frame(forge(STAMP.pack(1, 0, 0, 0))), Frame)
    with pytest.raises(CorruptFrame, match=reason):
        decode_frame(forge(stamp_bytes, payload_bytes=payload_bytes))
