"""scan.py: walking frames over a buffer, and resynchronising after garbage. Pure."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamlog.frame import HEADER_BYTES, MAGIC_BYTES, encode_frame
from streamlog.scan import StopReason, resync, scan_buffer


def frame(base_offset: int, record_count: int = 1, payload: bytes = b"payload") -> bytes:
    return encode_frame(base_offset=base_offset, record_count=record_count,
                        min_timestamp_us=0, max_timestamp_us=0, txn_id=0, flags=0,
                        raw_bytes=len(payload), payload=payload)


def chain(*counts: int, start: int = 0) -> tuple[bytes, list[int]]:
    """Frames in sequence with the given record counts; returns (bytes, positions)."""
    parts, positions, position, offset = [], [], 0, start
    for count in counts:
        data = frame(offset, count, b"p" * (count * 3))
        parts.append(data)
        positions.append(position)
        position += len(data)
        offset += count
    return b"".join(parts), positions


def test_clean_end():
    buf, positions = chain(1, 3, 2)
    result = scan_buffer(buf)
    assert result.stop is StopReason.END
    assert result.end == len(buf)
    assert [f.position for f in result.frames] == positions
    assert [f.base_offset for f in result.frames] == [0, 1, 4]
    assert result.reason == ""


def test_empty_buffer_is_a_clean_end():
    result = scan_buffer(b"")
    assert (result.frames, result.end, result.stop) == ([], 0, StopReason.END)


def test_scan_from_a_position():
    buf, positions = chain(1, 1, 1)
    result = scan_buffer(buf, positions[1])
    assert [f.base_offset for f in result.frames] == [1, 2]
    assert result.end == len(buf)


@pytest.mark.parametrize("cut", [1, HEADER_BYTES - 1, HEADER_BYTES, HEADER_BYTES + 2])
def test_incomplete_tail(cut):
    buf, positions = chain(2, 2)
    torn = frame(4, 1, b"tail payload")[:cut]
    result = scan_buffer(buf + torn)
    assert result.stop is StopReason.INCOMPLETE
    assert result.end == len(buf)
    assert len(result.frames) == 2


def test_bad_frame_after_good_ones():
    buf, _ = chain(1, 1)
    result = scan_buffer(buf + b"\x00" * 100 + frame(2))
    assert result.stop is StopReason.BAD
    assert result.end == len(buf)
    assert len(result.frames) == 2
    assert "magic" in result.reason


def test_bad_checksum_is_bad_not_incomplete():
    buf, positions = chain(1, 1, 1)
    damaged = bytearray(buf)
    damaged[positions[1] + HEADER_BYTES] ^= 1  # payload of the second frame
    result = scan_buffer(bytes(damaged))
    assert result.stop is StopReason.BAD
    assert result.end == positions[1]
    assert "checksum" in result.reason


def test_frames_max():
    buf, positions = chain(1, 1, 1, 1)
    result = scan_buffer(buf, frames_max=2)
    assert result.stop is StopReason.END
    assert len(result.frames) == 2
    assert result.end == positions[2]


# -- expect_offset -----------------------------------------------------------------------


def test_expect_offset_accepts_a_dense_sequence():
    buf, _ = chain(3, 1, 5, start=10)
    result = scan_buffer(buf, expect_offset=10)
    assert result.stop is StopReason.END
    assert [f.base_offset for f in result.frames] == [10, 13, 14]


def test_expect_offset_rejects_a_wrong_first_frame():
    buf, _ = chain(3, start=10)
    result = scan_buffer(buf, expect_offset=11)
    assert result.stop is StopReason.BAD
    assert result.end == 0
    assert result.frames == []
    assert "expected 11" in result.reason


@pytest.mark.parametrize("bad_base", [3, 5, 0, 100])  # a gap, an overlap, a restart
def test_expect_offset_rejects_a_frame_out_of_sequence(bad_base):
    first = frame(0, 4)
    buf = first + frame(bad_base, 1) + frame(bad_base + 1, 1)
    result = scan_buffer(buf, expect_offset=0)
    assert result.stop is StopReason.BAD
    assert result.end == len(first)
    assert [f.base_offset for f in result.frames] == [0]
    assert f"base offset {bad_base}" in result.reason
    assert "expected 4" in result.reason


def test_without_expect_offset_the_first_frame_sets_the_sequence():
    assert scan_buffer(frame(100, 2) + frame(102, 1)).stop is StopReason.END
    result = scan_buffer(frame(0, 4) + frame(100, 1))
    assert result.stop is StopReason.BAD
    assert "expected 4" in result.reason


# -- resync --------------------------------------------------------------------------------


def test_resync_finds_the_next_valid_frame_after_garbage():
    good, _ = chain(1, 1)
    garbage = b"junk" + MAGIC_BYTES + b"\x01" * 90 + MAGIC_BYTES  # two false starts
    after = frame(2, 1) + frame(3, 1)
    buf = good + garbage + after
    result = scan_buffer(buf)
    assert result.stop is StopReason.BAD
    found = resync(buf, result.end)
    assert found == len(good) + len(garbage)
    rest = scan_buffer(buf, found)
    assert rest.stop is StopReason.END
    assert [f.base_offset for f in rest.frames] == [2, 3]


def test_resync_skips_a_damaged_frame():
    frames = [frame(i, 1, b"x" * 20) for i in range(3)]
    damaged = bytearray(frames[1])
    damaged[-1] ^= 0xFF
    buf = frames[0] + bytes(damaged) + frames[2]
    assert resync(buf, len(frames[0])) == len(frames[0]) + len(frames[1])


def test_resync_is_strictly_after_the_position():
    buf = frame(0) + frame(1)
    assert resync(buf, 0) == len(frame(0))
    assert resync(buf, -1) == 0


def test_resync_none_when_nothing_valid_follows():
    assert resync(frame(0) + b"\x00" * 50, 0) is None
    assert resync(b"", 0) is None
    # A frame that has only started is not a valid whole frame.
    assert resync(b"garbage" + frame(1)[:-1], 0) is None
    assert resync(b"garbage" + MAGIC_BYTES, 0) is None


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview,
                                  lambda b: memoryview(b"pre" + b)[3:]])
def test_resync_over_every_buffer_type(wrap):
    good = frame(0)
    buf = good + b"noise" + frame(1)
    assert resync(wrap(buf), len(good)) == len(good) + 5
    assert scan_buffer(wrap(buf)).end == len(good)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(1, 5), min_size=1, max_size=5), st.binary(min_size=1, max_size=80),
       st.lists(st.integers(1, 5), min_size=1, max_size=3))
def test_resync_after_random_garbage(before, garbage, after):
    head, _ = chain(*before)
    tail, tail_positions = chain(*after, start=1000)
    buf = head + garbage + tail
    result = scan_buffer(buf, expect_offset=0)
    assert result.stop is StopReason.BAD
    assert result.end == len(head)
    assert len(result.frames) == len(before)
    found = resync(buf, result.end)
    assert found == len(head) + len(garbage)
    rest = scan_buffer(buf, found, expect_offset=1000)
    assert rest.stop is StopReason.END
    assert [f.position for f in rest.frames] == [found + p for p in tail_positions]
