"""Open-time recovery of one partition: the segments are the truth, the index follows.

Strategy: scan from the last recovery point only (everything before it was fsynced and
indexed), so recovery time is bounded by the unflushed tail, not the log size. Each bad
spot is classified by the decision table below; a writer then truncates a torn tail,
and the index is reconciled (entries past the valid end dropped, missing ones added).
Read-only opens run the same scan but change nothing: they stop at a torn tail.

Decision table (what the scan found after the recovery point -> action):

    found                                          writable          read-only
    clean end                                      keep              keep
    short or bad frame, nothing valid after it     TORN: truncate    TORN: stop there
    bad frame, a valid frame after it              CORRUPT: refuse   CORRUPT: stop there
    file shorter than the recovery point           CORRUPT: refuse   CORRUPT: stop there
    last durable frame before the point is bad     CORRUPT: refuse   CORRUPT: stop there
    no index, or an index that disagrees           rebuild from the first segment
"""

from __future__ import annotations

import dataclasses
import logging
import time

from .errors import CorruptFrame, CorruptSegment
from .frame import HEADER_BYTES, INCOMPLETE, decode_frame, frame_size_hint
from .index import NO_HWM, Index, IndexEntry, RecoveryPoint
from .scan import StopReason, TailState, resync, scan_buffer
from .payload import decode_columns
from .segment import Segment
from .txn import frame_events

log = logging.getLogger("streamlog.recovery")


@dataclasses.dataclass
class RecoveryReport:
    tail_state: TailState = TailState.CLEAN
    scanned_bytes: int = 0
    truncated_bytes: int = 0
    frames_indexed: int = 0
    rebuilt_index: bool = False
    seconds: float = 0.0
    corruption: CorruptSegment | None = None

    def as_dict(self) -> dict:
        return {"tail": self.tail_state.value, "scanned_bytes": self.scanned_bytes,
                "truncated_bytes": self.truncated_bytes, "frames_indexed": self.frames_indexed,
                "rebuilt_index": self.rebuilt_index, "seconds": round(self.seconds, 6),
                "corruption": str(self.corruption) if self.corruption else None}


def decide(stop: StopReason, valid_after: bool) -> TailState:
    """The table's middle rows: how a scan that stopped early is classified."""
    if stop is StopReason.END:
        return TailState.CLEAN
    if valid_after:
        return TailState.CORRUPT
    return TailState.TORN


@dataclasses.dataclass
class ScanState:
    next_offset: int
    hwm_us: int | None
    end_segment: int  # index into segments
    end_position: int


def recover(segments: list[Segment], index: Index, *, writable: bool, chunk_bytes: int,
            progress=None) -> tuple[ScanState, RecoveryReport]:
    """Scan `segments` (ascending, at least one) from the index's recovery point.

    Truncates a torn tail and drops now-empty later segments from `segments` when
    writable. Raises CorruptSegment for corruption when writable; read-only opens get it
    in the report and stop before it.
    """
    started = time.monotonic()
    report = RecoveryReport()
    start = _start_point(segments, index, report)
    state = ScanState(start.next_offset, None if start.hwm_us == NO_HWM else start.hwm_us,
                      _segment_at(segments, start.segment_base), start.position)
    if not report.rebuilt_index:
        index.drop_from(start.next_offset)
        try:
            fits = _check_last_durable(segments, index, start)
        except CorruptSegment as error:
            return state, _corrupt(report, error, writable, started)
        if not fits:
            log.warning("index of %s disagrees with a valid frame: rebuilding",
                        segments[0].path)
            index.clear()
            report.rebuilt_index = True
            state = ScanState(segments[0].base_offset, None, 0, 0)
    for number in range(state.end_segment, len(segments)):
        segment = segments[number]
        if segment.base_offset != state.next_offset and number != state.end_segment:
            error = CorruptSegment(segment.path, 0, f"segment starts at offset "
                                   f"{segment.base_offset}, expected {state.next_offset}")
            return state, _corrupt(report, error, writable, started)
        position = state.end_position if number == state.end_segment else 0
        stop, reason, position = _scan_segment(segment, position, state, index, report,
                                               chunk_bytes, progress)
        state.end_segment, state.end_position = number, position
        if stop is StopReason.END:
            continue
        valid_after = _valid_after(segments, number, position, chunk_bytes)
        report.tail_state = decide(stop, valid_after)
        if report.tail_state is TailState.CORRUPT:
            error = CorruptSegment(segment.path, position, reason or "bad frame")
            return state, _corrupt(report, error, writable, started)
        report.truncated_bytes = sum(s.size_bytes for s in segments[number + 1:]) + (
            segment.size_bytes - position)
        log.warning("torn tail in %s at position %d: %d bytes %s", segment.path, position,
                    report.truncated_bytes, "truncated" if writable else "ignored")
        if writable:
            _truncate_tail(segments, number, position)
        break
    if writable and index.last_entry is not None:
        last = segments[state.end_segment]
        last.fsync()
        index.set_recovery_point(RecoveryPoint(last.base_offset, state.end_position,
                                               state.next_offset, index.last_entry.hwm_after_us))
    report.seconds = time.monotonic() - started
    return state, report



def _start_point(segments, index: Index, report: RecoveryReport) -> RecoveryPoint:
    """The recovery point to scan from, or the first segment's start (with an index
    rebuild) when the index has none or one that does not fit the files."""
    point = index.recovery_point()
    bases = {s.base_offset: s for s in segments}
    if point is not None and point.segment_base in bases:
        segment = bases[point.segment_base]
        if point.position <= segment.size_bytes:
            return point
        # The index runs without sync: after a power loss it can be older than the files
        # (e.g. from before a truncate_after). The segments outrank it: rebuild.
        log.warning("recovery point of %s is past the end of the file (%d > %d): "
                    "rebuilding the index", segment.path, point.position, segment.size_bytes)
    if point is not None or index.last_entry is not None:
        log.warning("index of %s does not match its segments: rebuilding",
                    segments[0].path)
    index.clear()
    report.rebuilt_index = True
    return RecoveryPoint(segments[0].base_offset, 0, segments[0].base_offset, NO_HWM)


def _check_last_durable(segments, index: Index, point: RecoveryPoint) -> bool:
    """An acknowledged frame is never 'torn': re-verify the last one before the point.
    Returns False when a valid frame there disagrees with the index (a stale cache, e.g.
    rolled back past a rewrite); raises CorruptSegment when the bytes are damaged."""
    entry = index.last_entry
    if entry is None or entry.next_offset != point.next_offset:
        return True
    segment = next((s for s in segments if s.base_offset == entry.segment_base), None)
    if segment is None:
        return False
    head = segment.read(entry.position, HEADER_BYTES)
    size = frame_size_hint(head, 0) or entry.frame_bytes
    data = segment.read(entry.position, size)
    try:
        frame = decode_frame(data, 0)
    except CorruptFrame as error:
        raise CorruptSegment(segment.path, entry.position,
                             f"durable frame damaged: {error.reason}") from None
    if frame is INCOMPLETE:
        raise CorruptSegment(segment.path, entry.position, "durable frame cut short")
    return (frame.base_offset == entry.base_offset and frame.record_count ==
            entry.record_count and frame.size == entry.frame_bytes)


def _scan_segment(segment: Segment, position: int, state: ScanState, index: Index,
                  report: RecoveryReport, chunk_bytes: int, progress):
    """Index every valid frame from `position`; return (stop, reason, end position)."""
    while True:
        size = segment.size_bytes - position
        if size <= 0:
            return StopReason.END, "", position
        data = segment.read(position, min(size, chunk_bytes))
        result = scan_buffer(data, 0, expect_offset=state.next_offset)
        if result.stop is StopReason.INCOMPLETE and result.end == 0 and len(data) < size:
            data = segment.read(position, min(size, _needed(data, chunk_bytes)))
            result = scan_buffer(data, 0, expect_offset=state.next_offset)
        entries, events = [], []
        for frame in result.frames:
            events += txn_events(frame)
            hwm_before = state.hwm_us
            state.hwm_us = frame.max_timestamp_us if hwm_before is None else max(
                hwm_before, frame.max_timestamp_us)
            entries.append(IndexEntry(frame.base_offset, segment.base_offset,
                                      position + frame.position, frame.record_count,
                                      frame.size, frame.min_timestamp_us,
                                      frame.max_timestamp_us, state.hwm_us))
            state.next_offset = frame.next_offset
        index.put(entries, None, events)
        report.frames_indexed += len(entries)
        report.scanned_bytes += result.end
        position += result.end
        if progress is not None:
            progress(report.scanned_bytes)
        if result.stop is StopReason.BAD:
            return StopReason.BAD, result.reason, position
        if result.stop is StopReason.INCOMPLETE and result.end == 0:
            return StopReason.INCOMPLETE, "frame cut short", position


def txn_events(frame) -> list:
    """Transaction events of a frame (decodes the payload only for control frames)."""
    if frame.txn_id == 0:
        return []
    if not frame.has_control:
        return frame_events(frame.txn_id, frame.base_offset, None, None)
    columns = decode_columns(frame)
    offsets = columns.value_offsets()
    values = bytes(columns.values)
    return frame_events(frame.txn_id, frame.base_offset, columns.kinds.tolist(),
                        lambda i: values[offsets[i]:offsets[i + 1]])


def _needed(data: bytes, chunk_bytes: int) -> int:
    hint = frame_size_hint(data, 0)
    return max(hint or 0, chunk_bytes)


def _valid_after(segments, number: int, position: int, chunk_bytes: int) -> bool:
    """Is there a valid frame anywhere after `position` (this segment or a later one)?
    Reads the rest of the segment whole: this runs only when something is already wrong."""
    segment = segments[number]
    data = segment.read(position, max(segment.size_bytes - position, 0))
    if data and resync(data, 0) is not None:
        return True
    for later in segments[number + 1:]:
        data = later.read(0, min(later.size_bytes, chunk_bytes))
        if data and resync(data, -1) is not None:
            return True
    return False


def _truncate_tail(segments: list[Segment], number: int, position: int) -> None:
    segments[number].truncate_to(position)
    segments[number].fsync()
    for later in segments[number + 1:]:
        later.truncate_to(0)
        later.fsync()
        later.close()
        later.fileio.unlink(later.path)
    del segments[number + 1:]


def _corrupt(report: RecoveryReport, error: CorruptSegment, writable: bool, started: float):
    report.tail_state = TailState.CORRUPT
    report.corruption = error
    report.seconds = time.monotonic() - started
    log.error("%s", error)
    if writable:
        raise error
    return report


def _segment_at(segments, base_offset: int) -> int:
    for number, segment in enumerate(segments):
        if segment.base_offset == base_offset:
            return number
    raise AssertionError(f"no segment with base {base_offset}")
