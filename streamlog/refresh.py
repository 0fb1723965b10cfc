"""A read-only view that follows a writer in another process.

Strategy: a view takes in what writers added (new frames, new segments, segments
retention removed) by refreshing under the commit lock held shared, so no commit is half
done while it looks; its followers refresh when the lock's change counter moved
(`poll`, a memory read when it has not). What appends and retention cannot do (a
truncate, done or under way, files changed under it, a writer that created the partition
after the view opened it, a deleted stream) makes the view `stale`: the Log opens the partition again and
followers move to the new one. The segments retention removed stay open while a reader
here may still be reading them. Functions over a read-only partition (partition.py),
each called holding `part.refresh_lock`: the commit lock is the process's, not a
thread's (two threads holding it shared would let go of it for each other).
"""

from __future__ import annotations

from . import catchup, opening
from . import recovery as recovery_module
from .errors import CorruptFrame, CorruptIndex
from .frame import HEADER_BYTES, INCOMPLETE, decode_header
from .segment import Segment
from .segments import Segments


def poll(part) -> bool:
    """A follower at the end: refresh when the commit lock's counter says a writer has
    been here since the last look. Returns True when the end moved."""
    if part.closed or part.stale:
        return False
    if part.lock.handle is None:  # no writer had opened the partition
        if part.fileio.exists(part.lock.path):
            part.stale = True  # one has since: open it again, and take its lock
        return False
    if not part.lock.moved():
        return False
    before = part.state.end_offset
    refresh(part)
    return part.state.end_offset != before


def refresh(part) -> bool:
    """Take in what writers added since the view was made or last refreshed. False (and
    the partition `stale`) when it cannot follow."""
    if part.closed or part.stale:
        return False
    part.lock.acquire(exclusive=False)  # no commit half done while this looks
    try:
        if _refresh_locked(part):
            part.lock.settle()  # (the counter cannot move while this holds the lock)
            return True
    finally:
        part.lock.release()
    part.stale = True
    return False


def _refresh_locked(part) -> bool:
    if part.lock.handle is None and part.fileio.exists(part.lock.path):
        return False  # a writer came since the open: reopen (and take its lock)
    if part.lock.gone():
        return False  # its stream was deleted (perhaps created again): the Log looks
    state = part.state
    if not state.segments:
        return False
    end_segment = state.segments[state.end_segment]
    segments = catchup.segments_now(part, end_segment, writable=False, removed=part.removed)
    if segments is None or not end_frame_intact(part, segments):
        return False  # not what appends and retention do: reopen
    part.publish(segments=Segments(segments), end_segment=segments.index(end_segment))
    layout = part.lock.layout() if part.lock.handle is not None else None
    if layout != part.layout or segments[0] is not state.segments[0]:
        part.layout = layout  # retention or delete_records moved the start: read it
        opening.load_start(part)
    follow_tail(part)
    close_removed(part)
    return True


def close_removed(part) -> None:
    """Close the segments retention removed once no reader here holds an offset before
    the start. (A removed file stays readable through its handle: a reader on another
    thread that was in it finishes it, instead of reading a closed, or reused, file
    descriptor.)"""
    lowest = part.lowest_reader_hold()
    if lowest is None or lowest >= part.state.start_offset:
        for segment in part.removed:
            segment.close()
        part.removed.clear()


def end_frame_intact(part, segments) -> bool:
    """Is the view's last frame still there, the same frame? A truncate cuts it, and by
    the next refresh the file may have grown past the cut again (the sizes alone do not
    show it; the view would read on from inside another frame)."""
    if part.end_frame is None:
        return True  # no frame yet (or the index could not say where it was)
    base, position, checksum = part.end_frame
    segment = next((s for s in segments if s.base_offset == base), None)
    return segment is not None and header_checksum(segment, position) == checksum


def end_frame_now(part) -> tuple[int, int, int] | None:
    """(segment base, position, header checksum) of the view's last frame, read from the
    file; None when it has none or the index cannot say where it is."""
    state = part.state
    if state.end_offset <= state.start_offset or not state.segments:
        return None
    try:
        entry = part.index.lookup_offset(state.end_offset - 1)
    except CorruptIndex:
        return None
    if entry is None or entry.next_offset != state.end_offset:
        return None
    segment = state.segments.by_base(entry.segment_base)
    try:
        checksum = None if segment is None else header_checksum(segment, entry.position)
    except OSError:
        return None  # unread, the view only loses the check (readers get the error)
    return None if checksum is None else (entry.segment_base, entry.position, checksum)


def follow_tail(part) -> None:
    """Index the valid frames after the view's end; stop quietly at anything else (a
    writer mid-frame is not damage)."""
    state = part.state
    number, position = state.end_segment, state.active_position
    if position == state.segments[number].size_bytes and number + 1 < len(state.segments):
        number, position = number + 1, 0  # the end is where the next segment starts
    found, _ = recovery_module.index_from(
        state.segments, part.index, number=number, position=position,
        next_offset=state.end_offset, hwm_us=state.hwm_us,
        chunk_bytes=part.config.read_chunk_bytes)
    moved = found.next_offset != state.end_offset
    part.publish(end_offset=found.next_offset, hwm_us=found.hwm_us,
                 end_segment=found.end_segment, active_position=found.end_position)
    if moved:
        part.end_frame = end_frame_now(part)
    part.ring.reset(found.next_offset)  # this view's readers read the new frames from disk


def header_checksum(segment: Segment, position: int) -> int | None:
    """The header checksum of the frame at `position` (it covers the payload's), or None
    when no intact frame header is there."""
    try:
        header = decode_header(segment.read(position, HEADER_BYTES), 0)
    except CorruptFrame:
        return None
    return None if header is INCOMPLETE else header.header_checksum
