"""Open-time recovery of one partition: the segments are the truth, the index follows.

Strategy: first decide what the index claims (`claim_index`): its recovery point is
only believed when the frame just before it is where the index says, with the base
offset it says. Then walk the segments from that point only (everything before it was
fsynced and indexed), so recovery time is bounded by the unflushed tail, not by the
log's size. The walk's end and the claim go through the one decision table
(integrity.py), and its action is carried out: a writer truncates a torn or stale tail
and refuses damage; a read-only open changes nothing, stops before a torn tail and
records damage so that a reader reaching it raises. An index that cannot be read or
does not fit is rebuilt from the first segment (the table is then asked again).
"""

from __future__ import annotations

import dataclasses
import logging
import time

from .errors import CorruptIndex, CorruptSegment
from .index import NO_HWM, Index, IndexEntry, RecoveryPoint
from .integrity import ACTIONS, Action, IndexClaim, Observation, TailKind, Verdict, decide
from .payload import advance_hwm, decode_columns, frame_time_us
from .txn import frame_events
from .walk import FrameDamage, WalkEnd, continues_after, frame_at, observe, walk

log = logging.getLogger("streamlog.recovery")


@dataclasses.dataclass
class PartitionRecovery:
    """What opening (or catching up with) a partition found in its files and did about
    it: the verdict, what was walked, indexed and cut. `info` shows it (as_dict)."""

    verdict: Verdict = Verdict.CLEAN
    scanned_bytes: int = 0
    truncated_bytes: int = 0
    frames_indexed: int = 0
    rebuilt_index: bool = False
    index_problem: str | None = None
    seconds: float = 0.0
    corruption: CorruptSegment | None = None

    def as_dict(self) -> dict:
        return {"tail": self.verdict.value, "scanned_bytes": self.scanned_bytes,
                "truncated_bytes": self.truncated_bytes, "frames_indexed": self.frames_indexed,
                "rebuilt_index": self.rebuilt_index, "index_problem": self.index_problem,
                "seconds": round(self.seconds, 6),
                "corruption": str(self.corruption) if self.corruption else None}


@dataclasses.dataclass
class ScanState:
    next_offset: int
    hwm_us: int | None
    end_segment: int  # index into segments
    end_position: int
    # Read-only opens: (offset, error) of damage a reader must raise when it gets there.
    damage: tuple[int, CorruptSegment] | None = None


@dataclasses.dataclass
class Claim:
    """What the index claims, checked against the segments."""

    kind: IndexClaim
    point: RecoveryPoint | None = None  # where to walk from (CONFIRMED)
    damaged: WalkEnd | None = None  # the last durable frame, when it is damaged
    problem: str = ""


def claim_index(segments, index: Index) -> Claim:
    """Check the index's recovery point against the segments (read-only: no change)."""
    try:
        point = index.recovery_point()
        if point is None:
            has_entries = index.last_entry is not None
            return Claim(IndexClaim.DISAGREES if has_entries else IndexClaim.ABSENT,
                         problem="entries but no recovery point" if has_entries else "")
        return _check_point(segments, index, point)
    except CorruptIndex as error:
        return Claim(IndexClaim.UNREADABLE, problem=str(error))


def _check_point(segments, index: Index, point: RecoveryPoint) -> Claim:
    by_base = {s.base_offset: n for n, s in enumerate(segments)}
    number = by_base.get(point.segment_base)
    if number is None:
        return Claim(IndexClaim.DISAGREES, problem="recovery point names a missing segment")
    # A recovery point past the end of its file is not doubted: it is written only
    # after the bytes before it are fsynced (and truncate_after keeps it in step through
    # its intent file), so the file lost acknowledged bytes; the check of the frame
    # before the point below finds that frame cut short: damage, never a torn tail.
    if point.next_offset == segments[0].base_offset and (number, point.position) == (0, 0):
        return Claim(IndexClaim.CONFIRMED, point)
    entry = index.lookup_offset(point.next_offset - 1)
    if entry is None or entry.next_offset != point.next_offset or not _point_follows(
            entry, point):
        return Claim(IndexClaim.DISAGREES, problem="recovery point does not follow an entry")
    holder = by_base.get(entry.segment_base)
    if holder is None:
        return Claim(IndexClaim.DISAGREES, problem="entry names a missing segment")
    found = frame_at(segments[holder], entry.position)
    if isinstance(found, FrameDamage):  # the last durable frame is damaged
        return Claim(IndexClaim.CONFIRMED, point, WalkEnd(
            found.kind, holder, entry.position, entry.base_offset,
            f"durable frame damaged: {found.reason}"))
    if (found.base_offset, found.record_count, found.size) != (
            entry.base_offset, entry.record_count, entry.frame_bytes):
        return Claim(IndexClaim.DISAGREES, problem="entry disagrees with its frame")
    return Claim(IndexClaim.CONFIRMED, point)


def _point_follows(entry: IndexEntry, point: RecoveryPoint) -> bool:
    if entry.segment_base == point.segment_base:
        return entry.position + entry.frame_bytes == point.position
    return point.position == 0 and point.segment_base == entry.next_offset


def recover(segments: list, index: Index, *, writable: bool, chunk_bytes: int,
            progress=None) -> tuple[ScanState, PartitionRecovery]:
    """Recover a partition from `segments` (ascending, at least one).

    Writable: truncates a torn or stale tail (dropping now-empty later segments from
    `segments`), raises CorruptSegment for damage. Read-only: changes no file.
    Raises CorruptIndex only when a writable index cannot even be cleared (the caller
    then recreates it).
    """
    started = time.monotonic()
    report = PartitionRecovery()
    claim = claim_index(segments, index)
    if claim.kind in (IndexClaim.UNREADABLE, IndexClaim.DISAGREES):
        report.verdict = decide(Observation(claim.kind, TailKind.END, False, False))
        assert report.verdict is Verdict.REBUILD_INDEX
        log.warning("index of %s: %s: rebuilding it from the segments",
                    segments[0].path, claim.problem)
        report.rebuilt_index, report.index_problem = True, claim.problem
        index.clear()
        claim = Claim(IndexClaim.ABSENT)
    state, end = _walk_tail(segments, index, claim, report, chunk_bytes, progress)
    if claim.kind is IndexClaim.ABSENT:
        index.verified = True  # every entry came from the segments just now
        report.rebuilt_index = report.frames_indexed > 0
    _judge(segments, index, claim, report, state, end, writable, chunk_bytes)
    if writable:  # an empty partition gets one too: entries without a point are doubted
        last = segments[state.end_segment]
        point = RecoveryPoint(last.base_offset, state.end_position, state.next_offset,
                              index.last_entry.hwm_after_us if index.last_entry is not None
                              else NO_HWM)
        if point != claim.point:  # a clean open changes nothing (the index stays sealed)
            last.fsync()
            index.set_recovery_point(point)
    report.seconds = time.monotonic() - started
    return state, report


def catch_up(segments: list, index: Index, *, start: RecoveryPoint,
             chunk_bytes: int) -> tuple[ScanState, PartitionRecovery]:
    """A writer, holding the partition's commit lock, takes in what writers in other
    processes appended after its own end `start` (a point it wrote or walked itself, so
    it is confirmed). Their frames are indexed already; frames a writer killed after
    writing left unindexed are indexed here. How the walk ends is judged by the same
    table as an open: a torn or stale tail (a writer killed mid-write: nobody else can
    be writing now) is cut; damage raises CorruptSegment."""
    report = PartitionRecovery()
    number = next(n for n, s in enumerate(segments) if s.base_offset == start.segment_base)
    indexed = index.last_entry.next_offset if index.last_entry is not None else 0
    state, end = index_from(segments, index, number=number, position=start.position,
                            next_offset=start.next_offset,
                            hwm_us=None if start.hwm_us == NO_HWM else start.hwm_us,
                            chunk_bytes=chunk_bytes, indexed_to=indexed)
    if end.kind is TailKind.END:
        state.end_segment, state.end_position = end.number, end.position
    if indexed > state.next_offset:
        index.drop_from(state.next_offset)  # entries for frames the walk did not find
    _judge(segments, index, Claim(IndexClaim.CONFIRMED, start), report, state, end, True,
           chunk_bytes)
    return state, report


def _judge(segments, index: Index, claim: Claim, report: PartitionRecovery, state: ScanState,
           end: WalkEnd, writable: bool, chunk_bytes: int) -> None:
    """Classify how the walk ended (integrity.decide) and carry out the action."""
    durable = (claim.point.segment_base, claim.point.position) if claim.point else None
    continues = continues_after(segments, end, chunk_bytes)
    observation = observe(claim.kind, end, continues=continues, durable_until=durable,
                          segments=segments)
    report.verdict = decide(observation)
    _act(segments, index, report, state, end, writable)


def _walk_tail(segments, index: Index, claim: Claim, report: PartitionRecovery,
               chunk_bytes: int, progress) -> tuple[ScanState, WalkEnd]:
    """Index every valid frame after the recovery point; return the state and where
    the valid frames end."""
    point = claim.point
    if point is None:
        point = RecoveryPoint(segments[0].base_offset, 0, segments[0].base_offset, NO_HWM)
    number = next(n for n, s in enumerate(segments) if s.base_offset == point.segment_base)
    state = ScanState(point.next_offset, None if point.hwm_us == NO_HWM else point.hwm_us,
                      number, point.position)
    index.drop_from(point.next_offset)
    if claim.damaged is not None:
        end = claim.damaged
        before = index.lookup_offset(end.next_offset - 1)
        state.next_offset = end.next_offset
        state.hwm_us = before.hwm_after_us if before is not None else None
        state.end_segment, state.end_position = end.number, end.position
        return state, end

    def counted(frames) -> None:
        report.frames_indexed += len(frames)
        report.scanned_bytes += sum(f.size for f in frames)
        if progress is not None:
            progress(report.scanned_bytes)

    state, end = index_from(segments, index, number=number, position=point.position,
                            next_offset=point.next_offset, hwm_us=state.hwm_us,
                            chunk_bytes=chunk_bytes, on_run=counted)
    if end.kind is TailKind.END:
        state.end_segment, state.end_position = end.number, end.position
    return state, end


def index_from(segments, index: Index, *, number: int, position: int, next_offset: int,
               hwm_us: int | None, chunk_bytes: int, on_run=None,
               indexed_to: int = 0) -> tuple[ScanState, WalkEnd]:
    """Walk from (segments[number], position) and index every valid, continuing frame
    (its entry, with the running max timestamp, and its transaction events) from offset
    `indexed_to` on. Returns where the valid frames end and where the walk stopped. Used
    by recovery, by truncate_after's re-index of the cut segment, by a writer catching
    up with other processes and by a read-only view's refresh."""
    state = ScanState(next_offset, hwm_us, number, position)

    def index_frames(segment_number: int, frames) -> None:
        entries, events = [], []
        for frame in frames:
            state.hwm_us = advance_hwm(state.hwm_us, frame_time_us(frame))
            if frame.base_offset < indexed_to:
                continue
            events += txn_events(frame)
            entries.append(IndexEntry(frame.base_offset, segments[segment_number].base_offset,
                                      frame.position, frame.record_count, frame.size,
                                      frame.min_timestamp_us, frame.max_timestamp_us,
                                      NO_HWM if state.hwm_us is None else state.hwm_us))
        index.put(entries, None, events)
        state.next_offset = frames[-1].next_offset
        state.end_segment, state.end_position = segment_number, frames[-1].end_position
        if on_run is not None:
            on_run(frames)

    end = walk(segments, number=number, position=position, next_offset=next_offset,
               chunk_bytes=chunk_bytes, on_frames=index_frames)
    return state, end


def _act(segments, index: Index, report: PartitionRecovery, state: ScanState, end: WalkEnd,
         writable: bool) -> None:
    """Carry out the table's action for the verdict."""
    action = ACTIONS[report.verdict][0 if writable else 1]
    if action is Action.KEEP:
        return
    segment = segments[end.number]
    state.end_segment, state.end_position = end.number, end.position
    state.next_offset = end.next_offset
    if report.verdict.is_damage:
        error = CorruptSegment(segment.path, end.position,
                               f"{report.verdict.description}: {end.reason}")
        report.corruption = error
        log.error("%s", error)
        if action is Action.REFUSE:
            raise error
        assert action is Action.FAIL_AT
        state.damage = (end.next_offset, error)
        return
    assert action in (Action.TRUNCATE, Action.STOP_BEFORE)
    report.truncated_bytes = sum(s.size_bytes for s in segments[end.number + 1:]) + (
        segment.size_bytes - end.position)
    log.warning("%s in %s at position %d: %d bytes %s (%s)", report.verdict.description,
                segment.path, end.position, report.truncated_bytes,
                "truncated" if writable else "not shown", end.reason)
    if end.position == 0 and end.number > 0 and (
            segments[end.number].base_offset != end.next_offset):
        # the whole segment is garbage (named for offsets that do not follow): the
        # valid data ends with the previous segment, and a writer removes this one
        state.end_segment = end.number - 1
        state.end_position = segments[end.number - 1].size_bytes
        if action is Action.TRUNCATE:
            _truncate_tail(segments, end.number - 1, state.end_position)
        return
    if action is Action.TRUNCATE:
        _truncate_tail(segments, end.number, end.position)


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


def _truncate_tail(segments: list, number: int, position: int) -> None:
    segments[number].truncate_to(position)  # removes its seal first, if it has one
    segments[number].fsync()
    for later in segments[number + 1:]:
        later.truncate_to(0)
        later.fsync()
        later.close()
        later.fileio.unlink(later.path)
    del segments[number + 1:]
