"""Walk frames over a buffer and classify how it ends. Pure: no I/O.

Strategy: `scan_buffer` decodes frames one after another and stops at the first thing
that is not a whole valid frame that continues the sequence, saying why (`StopReason`).
`resync` searches for the next position where a valid (continuing) frame starts. What
a stop means (torn tail, stale tail, corruption) is integrity.py's decision.
"""

from __future__ import annotations

import dataclasses
import enum

from .errors import CorruptFrame
from .frame import INCOMPLETE, MAGIC_BYTES, Frame, decode_frame


class StopReason(enum.Enum):
    END = "end"  # the buffer ends exactly after a frame
    INCOMPLETE = "incomplete"  # the buffer ends inside a frame
    BAD = "bad"  # bytes at `end` can never be a frame


@dataclasses.dataclass(slots=True)
class ScanResult:
    frames: list[Frame]
    end: int  # position after the last valid frame
    stop: StopReason
    reason: str = ""
    # Base offset of a checksummed frame that stopped the scan by not continuing the
    # sequence (integrity.classify_stop tells a stale copy from a gap by it).
    found_base: int | None = None


def scan_buffer(buf, position: int = 0, *, frames_max: int | None = None,
                expect_offset: int | None = None) -> ScanResult:
    """Decode frames from `position` until the buffer ends or a frame is bad.

    `expect_offset`, when given, is the base offset the first frame must have; each
    frame must then continue where the previous one ended (a frame out of sequence is
    as bad as one with a wrong checksum).
    """
    frames: list[Frame] = []
    limit = len(buf)
    while position < limit:
        if frames_max is not None and len(frames) >= frames_max:
            return ScanResult(frames, position, StopReason.END)
        try:
            frame = decode_frame(buf, position)
        except CorruptFrame as error:
            return ScanResult(frames, position, StopReason.BAD, error.reason)
        if frame is INCOMPLETE:
            return ScanResult(frames, position, StopReason.INCOMPLETE)
        if expect_offset is not None and frame.base_offset != expect_offset:
            return ScanResult(frames, position, StopReason.BAD,
                              f"frame has base offset {frame.base_offset}, "
                              f"expected {expect_offset}", frame.base_offset)
        frames.append(frame)
        expect_offset = frame.next_offset
        position = frame.end_position
    return ScanResult(frames, position, StopReason.END)


def resync(buf, position: int, *, min_base: int | None = None) -> int | None:
    """Position of the first valid whole frame strictly after `position`, or None.
    With `min_base`, frames whose base offset is below it (stale copies) are passed
    over: only a frame that continues the partition counts."""
    search_from = position + 1
    while True:
        found = bytes_find(buf, MAGIC_BYTES, search_from)
        if found < 0:
            return None
        try:
            frame = decode_frame(buf, found)
        except CorruptFrame:
            frame = None
        if frame is not None and frame is not INCOMPLETE and (
                min_base is None or frame.base_offset >= min_base):
            return found
        search_from = found + 1


def bytes_find(buf, needle: bytes, start: int) -> int:
    if isinstance(buf, memoryview):
        buf = buf.obj if buf.obj is not None and len(buf) == len(buf.obj) else bytes(buf)
    return buf.find(needle, start)
