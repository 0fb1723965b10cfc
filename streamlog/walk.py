"""Walk a partition's segments frame by frame and observe where valid data ends.

Strategy: one walker for every tool that must judge a partition's bytes. `walk` reads
the segments in large sequential chunks from a known-good point, hands each run of
valid, continuing frames to a callback (recovery indexes them, verify counts and
checks them), and stops at the first spot that is not one, returning a `WalkEnd` that
says where and why. `continues_after` then looks past that spot for a valid frame that
continues the partition, and `observe` turns both into an `integrity.Observation`, so
the decision itself stays in the pure table (integrity.py).

Segments are objects with `base_offset`, `path`, `size_bytes` and `read(position,
size)` (segment.Segment, or a read-only view); nothing here writes.
"""

from __future__ import annotations

import dataclasses

from .errors import CorruptFrame
from .frame import (HEADER_BYTES, INCOMPLETE, Frame, decode_frame, decode_header,
                    frame_size_hint)
from .integrity import IndexClaim, Observation, TailKind, classify_stop, is_continuation
from .scan import StopReason, resync, scan_buffer


@dataclasses.dataclass(slots=True)
class WalkEnd:
    kind: TailKind
    number: int  # index into the segment list where the walk stopped
    position: int  # byte position of the bad spot (or the end) in that segment
    next_offset: int  # the offset the bad spot should have held
    reason: str = ""
    found_base: int | None = None


def walk(segments, *, number: int, position: int, next_offset: int, chunk_bytes: int,
         on_frames=None, sealed=None) -> WalkEnd:
    """Walk from (segments[number], position), where offset `next_offset` must start.

    `on_frames(number, frames)` receives each run of valid frames (positions within
    the segment file) in order. `sealed(number)`, when given, returns the end offset
    a segment's whole-file seal records when the file still matches it (else None): it
    is then passed over whole. Returns where the valid, continuing frames end.
    """
    assert 0 <= number < len(segments)
    while True:
        segment = segments[number]
        if position == 0 and segment.base_offset != next_offset:
            kind = TailKind.GAP if segment.base_offset > next_offset else TailKind.STALE
            return WalkEnd(kind, number, 0, next_offset,
                           f"segment starts at offset {segment.base_offset}, expected "
                           f"{next_offset}", segment.base_offset)
        end_offset = sealed(number) if (
            position == 0 and sealed is not None and number + 1 < len(segments)) else None
        if end_offset is not None:
            number, next_offset = number + 1, end_offset
            continue
        runs = segment_frames(segment, position, next_offset, chunk_bytes)
        while True:
            try:
                frames = next(runs)
            except StopIteration as stop:
                end = dataclasses.replace(stop.value, number=number)
                break
            if on_frames is not None:
                on_frames(number, frames)
        if end.kind is not TailKind.END or number + 1 == len(segments):
            return end
        number, position, next_offset = number + 1, 0, end.next_offset


def segment_frames(segment, position: int, next_offset: int | None, chunk_bytes: int):
    """Generator: yields runs (lists) of valid frames of one segment from `position`
    (positions within the file), each continuing the last (from `next_offset`; None:
    no continuity asked, as for dump), and returns the WalkEnd (number 0) where they
    stop."""
    size = segment.size_bytes
    while position < size:
        data = segment.read(position, min(size - position, chunk_bytes))
        result = scan_buffer(data, 0, expect_offset=next_offset)
        if result.stop is StopReason.INCOMPLETE and result.end == 0 and (
                len(data) < size - position):
            # one frame larger than a chunk: read it whole (its header says how long)
            head = data if len(data) >= HEADER_BYTES else segment.read(position, HEADER_BYTES)
            data = segment.read(position, min(size - position, _frame_bytes(head, chunk_bytes)))
            result = scan_buffer(data, 0, expect_offset=next_offset)
        if result.frames:
            frames = [dataclasses.replace(f, position=position + f.position)
                      for f in result.frames]
            if next_offset is not None:
                next_offset = frames[-1].next_offset
            yield frames
        position += result.end
        if result.stop is StopReason.END:
            continue
        if result.stop is StopReason.INCOMPLETE and result.frames:
            continue
        kind = classify_stop(result.stop is StopReason.BAD,
                             result.stop is StopReason.INCOMPLETE, result.found_base,
                             next_offset if result.found_base is not None else None)
        reason = result.reason or (f"frame cut short: the file ends "
                                   f"{size - position} bytes into it")
        return WalkEnd(kind, 0, position, next_offset if next_offset is not None else -1,
                       reason, result.found_base)
    return WalkEnd(TailKind.END, 0, size, next_offset if next_offset is not None else -1)


def _frame_bytes(data: bytes, chunk_bytes: int) -> int:
    return max(frame_size_hint(data, 0) or 0, chunk_bytes)


def continues_after(segments, end: WalkEnd, chunk_bytes: int) -> bool:
    """Is there a valid frame that continues the partition anywhere after the bad spot?
    Reads the rest of that segment whole: this runs only when something is wrong."""
    if end.kind is TailKind.END:
        return False
    if end.kind is TailKind.GAP:
        return True
    segment = segments[end.number]
    data = segment.read(end.position, max(segment.size_bytes - end.position, 0))
    if data and resync(data, 0, min_base=end.next_offset) is not None:
        return True
    for later in segments[end.number + 1:]:
        if is_continuation(later.base_offset, end.next_offset) and later.size_bytes > 0:
            data = later.read(0, later.size_bytes)
            if resync(data, -1, min_base=end.next_offset) is not None:
                return True
    return False


def observe(claim: IndexClaim, end: WalkEnd, *, continues: bool,
            durable_until: tuple[int, int] | None, segments) -> Observation:
    """The table's inputs for a walk's end. `durable_until` is the index's confirmed
    recovery point as (segment base offset, position), or None."""
    in_durable, kind = False, end.kind
    if durable_until is not None:
        spot = (segments[end.number].base_offset, end.position)
        in_durable = spot < durable_until
        if kind is TailKind.END and in_durable:
            kind = TailKind.SHORT  # the files end before what was acknowledged
    return Observation(claim, kind, continues, in_durable)


@dataclasses.dataclass(frozen=True, slots=True)
class FrameDamage:
    """Why there is no whole valid frame at a position (frame_at): the file ends inside
    it (`TailKind.SHORT`) or its bytes can never be one (`TailKind.BAD`). `reason` is
    the words shown to users."""

    kind: TailKind
    reason: str

    def __post_init__(self) -> None:
        assert self.kind in (TailKind.SHORT, TailKind.BAD), self.kind
        assert self.reason


def frame_at(segment, position: int) -> Frame | FrameDamage:
    """The whole valid frame at `position` of `segment`, or why there is none."""
    head = segment.read(position, HEADER_BYTES)
    try:
        header = decode_header(head, 0)
    except CorruptFrame as error:
        return FrameDamage(TailKind.BAD, error.reason)
    if header is INCOMPLETE:
        return FrameDamage(TailKind.SHORT, "frame cut short: the file ends inside its header")
    size = header.frame_bytes
    data = segment.read(position, size)
    try:
        frame = decode_frame(data, 0)
    except CorruptFrame as error:
        return FrameDamage(TailKind.BAD, error.reason)
    if frame is INCOMPLETE:
        return FrameDamage(TailKind.SHORT,
                           f"frame cut short: {len(data)} of its {size} bytes are in the file")
    return dataclasses.replace(frame, position=position)
