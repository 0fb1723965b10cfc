"""The one segment walker (walk.py) over in-memory segments: how each kind of end is
seen, and what counts as a frame that continues the partition."""

from streamlog.frame import encode_frame
from streamlog.integrity import IndexClaim, TailKind, Verdict, decide
from streamlog.payload import encode_payload
from streamlog.walk import FrameDamage, continues_after, frame_at, observe, walk


class MemorySegment:
    def __init__(self, base_offset: int, data: bytes) -> None:
        self.base_offset, self.data = base_offset, bytearray(data)
        self.path = f"mem/{base_offset:020d}.log"

    @property
    def size_bytes(self) -> int:
        return len(self.data)

    def read(self, position: int, size: int) -> bytes:
        return bytes(self.data[position:position + size])


def frame(base: int, count: int = 3) -> bytes:
    raw, flags = encode_payload(list(range(count)), [None] * count,
                                [b"v%d" % (base + i) for i in range(count)])
    return encode_frame(base_offset=base, record_count=count, min_timestamp_us=0,
                        max_timestamp_us=count - 1, txn_id=0, flags=flags,
                        raw_bytes=len(raw), payload=raw)


def run(segments, chunk_bytes=64):
    seen = []
    end = walk(segments, number=0, position=0, next_offset=segments[0].base_offset,
               chunk_bytes=chunk_bytes, on_frames=lambda n, fs: seen.extend(
                   (n, f.base_offset, f.position) for f in fs))
    return end, seen


def test_clean_walk_across_segments_for_any_chunk_size():
    first = MemorySegment(0, frame(0) + frame(3))
    second = MemorySegment(6, frame(6))
    for chunk in (16, 100, 1 << 20):
        end, seen = run([first, second], chunk)
        assert end.kind is TailKind.END and end.next_offset == 9
        assert [(n, b) for n, b, _ in seen] == [(0, 0), (0, 3), (1, 6)]


def test_torn_bad_stale_and_gap():
    whole = frame(0) + frame(3)
    torn = MemorySegment(0, whole + frame(6)[:30])
    assert run([torn])[0].kind is TailKind.SHORT
    damaged = bytearray(whole)
    damaged[len(frame(0)) + 80] ^= 1
    end, seen = run([MemorySegment(0, bytes(damaged))])
    assert (end.kind, end.position, end.next_offset) == (TailKind.BAD, len(frame(0)), 3)
    assert [b for _, b, _ in seen] == [0]
    stale = run([MemorySegment(0, whole + frame(0))])[0]
    assert (stale.kind, stale.found_base) == (TailKind.STALE, 0)
    gap = run([MemorySegment(0, whole + frame(9))])[0]
    assert (gap.kind, gap.found_base) == (TailKind.GAP, 9)
    gap_segment = run([MemorySegment(0, whole), MemorySegment(12, frame(12))])[0]
    assert (gap_segment.kind, gap_segment.number, gap_segment.position) == (TailKind.GAP, 1, 0)


def test_a_stale_copy_after_damage_does_not_continue_the_partition():
    torn_then_stale = MemorySegment(0, frame(0) + frame(3) + frame(6)[:40] + frame(3))
    end, _ = run([torn_then_stale])
    assert not continues_after([torn_then_stale], end, 64)
    seen = observe(IndexClaim.CONFIRMED, end, continues=False, durable_until=None,
                   segments=[torn_then_stale])
    assert decide(seen) is Verdict.TORN_TAIL
    damaged = bytearray(frame(0) + frame(3) + frame(6))
    damaged[len(frame(0)) + 5] ^= 1  # the middle frame, a valid one after it
    segment = MemorySegment(0, bytes(damaged))
    end, _ = run([segment])
    assert continues_after([segment], end, 64)


def test_damage_before_the_durable_point_is_never_a_tear():
    data = bytearray(frame(0) + frame(3))
    data[-3] ^= 1  # the last frame, which the index says is durable
    segment = MemorySegment(0, bytes(data))
    end, _ = run([segment])
    seen = observe(IndexClaim.CONFIRMED, end, continues=False,
                   durable_until=(0, len(data)), segments=[segment])
    assert decide(seen) is Verdict.DAMAGED_DURABLE
    short = MemorySegment(0, frame(0))  # files end before what was acknowledged
    end, _ = run([short])
    seen = observe(IndexClaim.CONFIRMED, end, continues=False,
                   durable_until=(0, len(frame(0)) + 50), segments=[short])
    assert decide(seen) is Verdict.DAMAGED_DURABLE


def test_a_sealed_segment_is_passed_over_with_its_recorded_end():
    first, second = MemorySegment(0, b"\0" * 100), MemorySegment(6, frame(6))
    end = walk([first, second], number=0, position=0, next_offset=0, chunk_bytes=64,
               sealed=lambda n: 6 if n == 0 else None)
    assert end.kind is TailKind.END and end.next_offset == 9
    end = walk([first, second], number=0, position=0, next_offset=0, chunk_bytes=64,
               sealed=lambda n: 5 if n == 0 else None)
    assert end.kind is TailKind.GAP  # the seal says it ended at 5: offset 5 is missing


def test_frame_at_says_what_kind_of_damage_it_found():
    data = frame(0) + frame(3)
    found = frame_at(MemorySegment(0, data), len(frame(0)))
    assert (found.base_offset, found.position) == (3, len(frame(0)))
    header_cut = frame_at(MemorySegment(0, data[:len(frame(0)) + 30]), len(frame(0)))
    assert header_cut == FrameDamage(TailKind.SHORT,
                                     "frame cut short: the file ends inside its header")
    payload_cut = frame_at(MemorySegment(0, data[:-2]), len(frame(0)))
    size = len(frame(3))
    assert payload_cut == FrameDamage(
        TailKind.SHORT, f"frame cut short: {size - 2} of its {size} bytes are in the file")
    flipped = bytearray(data)
    flipped[-3] ^= 1
    assert frame_at(MemorySegment(0, bytes(flipped)), len(frame(0))) == FrameDamage(
        TailKind.BAD, "payload checksum mismatch")
    assert frame_at(MemorySegment(0, data), 5) == FrameDamage(TailKind.BAD, "bad magic")
