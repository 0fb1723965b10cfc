"""frame.py: the batch-frame codec. Pure: bytes in, Frame / INCOMPLETE / CorruptFrame out.

The feeding pattern is h11's `tr()`: every frame is decoded whole, one byte at a time
(INCOMPLETE until the last byte arrives) and with trailing bytes that must stay
unconsumed. The fuzz invariant comes first: garbage never raises anything but
CorruptFrame and never decodes to a Frame whose checksums do not hold.
"""

from __future__ import annotations

import struct

import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamlog.errors import CorruptFrame, CorruptionError
from streamlog.frame import (CODEC_ZSTD, FLAG_HAS_CONTROL, FLAG_HAS_HEADERS,
                             FRAME_BYTES_LIMIT, HEADER, HEADER_BYTES, INCOMPLETE, MAGIC,
                             MAGIC_BYTES, VERSION, Frame, FrameHeader, decode_frame,
                             decode_header, encode_frame, frame_size_hint)


def make_frame(*, base_offset: int = 0, payload: bytes = b"hello, frame", record_count: int = 1,
               min_timestamp_us: int = 10, max_timestamp_us: int = 20, txn_id: int = 0,
               flags: int = 0, raw_bytes: int | None = None) -> bytes:
    return encode_frame(base_offset=base_offset, record_count=record_count,
                        min_timestamp_us=min_timestamp_us, max_timestamp_us=max_timestamp_us,
                        txn_id=txn_id, flags=flags,
                        raw_bytes=len(payload) if raw_bytes is None else raw_bytes,
                        payload=payload)


def forge_header(**changes) -> bytes:
    """A header with the given raw field values and a *correct* header checksum, so
    the check under test is the one that has to catch it (not the checksum)."""
    payload = changes.pop("payload", b"")
    fields = dict(magic=MAGIC, version=VERSION, flags=0, reserved=0, base_offset=0,
                  min_timestamp_us=0, max_timestamp_us=0, txn_id=0, record_count=1,
                  payload_bytes=len(payload), raw_bytes=len(payload), reserved2=0,
                  payload_checksum=xxhash.xxh3_64_intdigest(payload), header_checksum=0)
    fields.update(changes)
    head = HEADER.pack(*fields.values())
    checksum = xxhash.xxh3_64_intdigest(head[:64])
    return head[:64] + struct.pack("<Q", checksum) + payload


def checksums_hold(data: bytes, frame: Frame) -> bool:
    """Recompute both checksums of a decoded frame from the buffer it came from."""
    start = frame.position
    stored_header = struct.unpack_from("<Q", data, start + 64)[0]
    stored_payload = struct.unpack_from("<Q", data, start + 56)[0]
    payload = bytes(data[start + HEADER_BYTES:frame.end_position])
    return (xxhash.xxh3_64_intdigest(bytes(data[start:start + 64])) == stored_header
            and xxhash.xxh3_64_intdigest(payload) == stored_payload
            and payload == bytes(frame.payload))


# -- round trip --------------------------------------------------------------------


def test_round_trip_keeps_every_field():
    data = make_frame(base_offset=1234, payload=b"p" * 100, record_count=7,
                      min_timestamp_us=-5, max_timestamp_us=1 << 40, txn_id=(1 << 64) - 1,
                      flags=CODEC_ZSTD | FLAG_HAS_CONTROL | FLAG_HAS_HEADERS, raw_bytes=999)
    frame = decode_frame(data)
    assert isinstance(frame, Frame)
    assert frame.position == 0
    assert frame.base_offset == 1234
    assert frame.record_count == 7
    assert frame.next_offset == 1241
    assert (frame.min_timestamp_us, frame.max_timestamp_us) == (-5, 1 << 40)
    assert frame.txn_id == (1 << 64) - 1
    assert frame.codec == CODEC_ZSTD
    assert frame.has_control
    assert frame.raw_bytes == 999
    assert bytes(frame.payload) == b"p" * 100
    assert frame.size == len(data) == HEADER_BYTES + 100
    assert frame.end_position == len(data)


def test_header_layout_is_pinned():
    data = make_frame(base_offset=3)
    assert HEADER_BYTES == 72
    assert data[:4] == MAGIC_BYTES == b"SLOG"
    assert data[4] == VERSION
    assert struct.unpack_from("<q", data, 8)[0] == 3


def test_empty_payload_round_trips():
    frame = decode_frame(make_frame(payload=b""))
    assert isinstance(frame, Frame)
    assert bytes(frame.payload) == b""
    assert frame.size == HEADER_BYTES


def test_decode_at_a_position_inside_a_larger_buffer():
    first = make_frame(base_offset=0, record_count=2, payload=b"one")
    second = make_frame(base_offset=2, record_count=3, payload=b"two!")
    buf = first + second
    frame = decode_frame(buf, len(first))
    assert frame.position == len(first)
    assert frame.base_offset == 2
    assert frame.end_position == len(buf)
    assert bytes(frame.payload) == b"two!"


def test_accepts_memoryview_and_bytearray():
    data = make_frame(payload=b"view")
    for buf in (memoryview(data), bytearray(data), memoryview(b"xx" + data)[2:]):
        frame = decode_frame(buf)
        assert isinstance(frame, Frame)
        assert bytes(frame.payload) == b"view"


# -- h11-style feeding: whole, byte at a time, trailing bytes ------------------------


FRAMES = [
    make_frame(payload=b""),
    make_frame(payload=b"x"),
    make_frame(base_offset=77, record_count=3, payload=bytes(range(256)) * 3,
               flags=FLAG_HAS_HEADERS),
]


@pytest.mark.parametrize("data", FRAMES)
def test_whole(data):
    frame = decode_frame(data)
    assert isinstance(frame, Frame)
    assert frame.end_position == len(data)


@pytest.mark.parametrize("data", FRAMES)
def test_byte_at_a_time_is_incomplete_until_the_last_byte(data):
    for cut in range(len(data)):
        assert decode_frame(data[:cut]) is INCOMPLETE, cut
    assert isinstance(decode_frame(data), Frame)


@pytest.mark.parametrize("data", FRAMES)
@pytest.mark.parametrize("trailing", [b"\x00", b"SLOG", b"garbage that is not a frame",
                                      FRAMES[1]])
def test_trailing_bytes_are_left_untouched(data, trailing):
    buf = bytearray(data + trailing)
    before = bytes(buf)
    frame = decode_frame(buf)
    assert isinstance(frame, Frame)
    assert frame.end_position == len(data)
    assert bytes(frame.payload) == data[HEADER_BYTES:]
    assert bytes(buf) == before
    assert bytes(buf[frame.end_position:]) == trailing


def test_position_past_the_end_is_incomplete():
    data = make_frame()
    assert decode_frame(data, len(data)) is INCOMPLETE
    assert decode_frame(b"", 0) is INCOMPLETE


# -- things that can never become a frame -------------------------------------------


def test_bad_magic_is_corrupt_even_when_short():
    with pytest.raises(CorruptFrame, match="magic"):
        decode_frame(b"X")
    with pytest.raises(CorruptFrame, match="magic"):
        decode_frame(b"SLOX")
    with pytest.raises(CorruptFrame, match="magic"):
        decode_frame(b"\x00" * 200)


def test_corrupt_frame_reports_its_position():
    buf = make_frame() + b"\x00" * HEADER_BYTES
    with pytest.raises(CorruptFrame) as caught:
        decode_frame(buf, len(buf) - HEADER_BYTES)
    assert caught.value.position == len(buf) - HEADER_BYTES
    assert isinstance(caught.value, CorruptionError)


def test_header_checksum_mismatch():
    data = bytearray(make_frame())
    data[9] ^= 1  # base_offset
    with pytest.raises(CorruptFrame, match="header checksum"):
        decode_frame(bytes(data))


def test_payload_checksum_mismatch():
    data = bytearray(make_frame(payload=b"abcdef"))
    data[-1] ^= 0x80
    with pytest.raises(CorruptFrame, match="payload checksum"):
        decode_frame(bytes(data))


@pytest.mark.parametrize("changes, reason", [
    (dict(version=2), "version"),
    (dict(version=0), "version"),
    (dict(flags=0b1000000), "flags"),  # bit 6 is not a flag
    (dict(flags=0b10), "flags"),  # codec 2 does not exist
    (dict(flags=0b11), "flags"),
    (dict(record_count=0), "impossible"),
    (dict(base_offset=-1), "impossible"),
    (dict(min_timestamp_us=5, max_timestamp_us=4), "impossible"),
    (dict(payload_bytes=FRAME_BYTES_LIMIT + 1), "length"),
    (dict(raw_bytes=FRAME_BYTES_LIMIT + 1), "length"),
])
def test_impossible_headers_are_corrupt_not_incomplete(changes, reason):
    # The header checksum holds, so only the field check can catch these; an
    # impossible length in particular must not be mistaken for "wait for more bytes".
    with pytest.raises(CorruptFrame, match=reason):
        decode_frame(forge_header(**changes))


def test_forged_header_with_sane_fields_decodes():
    frame = decode_frame(forge_header(payload=b"ok", base_offset=9, record_count=2))
    assert isinstance(frame, Frame)
    assert frame.base_offset == 9


def test_every_flipped_bit_of_a_small_frame_is_detected():
    data = make_frame(base_offset=5, record_count=2, payload=b"tiny payload",
                      flags=FLAG_HAS_CONTROL, txn_id=3)
    assert len(data) * 8 == (HEADER_BYTES + 12) * 8
    for bit in range(len(data) * 8):
        damaged = bytearray(data)
        damaged[bit // 8] ^= 1 << (bit % 8)
        try:
            result = decode_frame(bytes(damaged))
        except CorruptFrame:
            continue
        assert result is INCOMPLETE, f"bit {bit} flipped and the frame still decoded"


def test_frame_size_hint():
    data = make_frame(payload=b"z" * 40)
    assert frame_size_hint(data, 0) == len(data)
    assert frame_size_hint(data[:HEADER_BYTES], 0) == len(data)  # header alone suffices
    assert frame_size_hint(data[:HEADER_BYTES - 1], 0) is None
    assert frame_size_hint(b"\x00" * 100, 0) is None


def test_decode_header_three_ways():
    data = make_frame(base_offset=4)
    assert decode_header(data[:10]) is INCOMPLETE
    assert decode_header(data).base_offset == 4
    with pytest.raises(CorruptFrame):
        decode_header(b"nope" + data)


def test_decode_header_names_every_field_of_the_table():
    data = make_frame(base_offset=7, payload=b"p" * 30, record_count=3, min_timestamp_us=10,
                      max_timestamp_us=20, txn_id=9, flags=FLAG_HAS_HEADERS, raw_bytes=40)
    header = decode_header(b"xx" + data, 2)
    assert isinstance(header, FrameHeader)
    assert (header.magic, header.version, header.flags) == (MAGIC, VERSION, FLAG_HAS_HEADERS)
    assert (header.base_offset, header.record_count, header.txn_id) == (7, 3, 9)
    assert (header.min_timestamp_us, header.max_timestamp_us) == (10, 20)
    assert (header.payload_bytes, header.raw_bytes) == (30, 40)
    assert header.payload_checksum == xxhash.xxh3_64_intdigest(b"p" * 30)
    assert header.header_checksum == xxhash.xxh3_64_intdigest(data[:64])
    assert (header.reserved_6, header.reserved_52) == (0, 0)
    assert header.frame_bytes == len(data)
    assert tuple(header) == HEADER.unpack_from(data, 0)


# -- fuzz: garbage and mutations -----------------------------------------------------


def decode_outcome(buf):
    """Decode and check the invariant; returns the outcome for the caller to inspect."""
    try:
        result = decode_frame(buf)
    except CorruptFrame:
        return "corrupt"
    if result is INCOMPLETE:
        return "incomplete"
    assert isinstance(result, Frame)
    assert checksums_hold(bytes(buf), result), "a Frame came back with a wrong checksum"
    assert result.end_position <= len(buf)
    return result


FUZZ = settings(max_examples=400, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes_never_raise_anything_but_corrupt_frame(buf):
    decode_outcome(buf)
    decode_outcome(MAGIC_BYTES + buf)  # past the magic check, into the header checks


@st.composite
def mutated_frames(draw):
    payload = draw(st.binary(max_size=64))
    data = bytearray(make_frame(
        base_offset=draw(st.integers(0, 1 << 40)), record_count=draw(st.integers(1, 100)),
        payload=payload, txn_id=draw(st.integers(0, (1 << 64) - 1)),
        flags=draw(st.sampled_from([0, CODEC_ZSTD, FLAG_HAS_CONTROL, FLAG_HAS_HEADERS]))))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and data:
            data[at] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete" and data:
            del data[at:at + draw(st.integers(1, 8))]
        elif kind == "truncate":
            del data[at:]
    return bytes(data), payload


@FUZZ
@given(mutated_frames())
def test_mutated_frames_never_decode_wrongly(case):
    data, payload = case
    outcome = decode_outcome(data)
    if isinstance(outcome, Frame):
        # Only a mutation that left the frame itself intact (e.g. bytes changed after
        # its end) may decode, and then to exactly the original payload.
        assert bytes(outcome.payload) == payload


@FUZZ
@given(st.binary(max_size=64), st.binary(max_size=64))
def test_any_valid_frame_with_any_trailing_bytes(payload, trailing):
    data = make_frame(payload=payload)
    frame = decode_frame(data + trailing)
    assert isinstance(frame, Frame)
    assert bytes(frame.payload) == payload
    assert frame.end_position == len(data)


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(parts=st.lists(st.binary(max_size=300), min_size=1, max_size=6),
       base=st.integers(0, 1 << 40), count=st.integers(1, 10_000),
       txn=st.integers(0, (1 << 63) - 1))
def test_a_frame_built_from_parts_is_the_frame_of_their_concatenation(parts, base, count,
                                                                      txn):
    import numpy as np
    from streamlog.frame import encode_frame_from_parts
    parts = parts + [np.arange(3, dtype="<i8")]  # NumPy columns are parts too
    payload = b"".join(bytes(memoryview(p).cast("B")) for p in parts)
    fields = dict(base_offset=base, record_count=count, min_timestamp_us=-5,
                  max_timestamp_us=7, txn_id=txn, flags=0)
    built = encode_frame_from_parts(parts=parts, **fields)
    assert bytes(built) == encode_frame(raw_bytes=len(payload), payload=payload, **fields)
    frame = decode_frame(bytes(built))
    assert bytes(frame.payload) == payload and frame.base_offset == base
