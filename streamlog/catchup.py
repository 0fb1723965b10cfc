"""Several writer processes on one partition: the commit lock, and taking in what the
others did before changing anything.

Strategy: every change to a partition's files holds its commit lock (locks.py: an
flock, with a change counter and the last holder's tail state in a shared mapping).
`Exclusive`, entered by the writer thread, takes the lock and, when the counter says
another process was there, catches up first: from the tail state the last holder left
when the segment set is unchanged (`take_tail`: no file is read), else from the files
(`catch_up`: new and removed segments, then recovery.catch_up walks from this process's
end, indexes what a killed writer left unindexed and cuts what it left half-written).
Anything else (a truncate, done or under way) and the partition is taken in again as an
open would (`reload`). A stream another process deleted shows here too: the lock's
file is no longer the one at its path (`PartitionLock.gone`), and nothing more is
written (Partition.mark_deleted raises UnknownStream). These are functions over a partition's state (partition.py):
they read `part.state` and change it only through `part.publish`.
"""

from __future__ import annotations

import os

from . import maintenance, opening
from . import recovery as recovery_module
from .index import NO_HWM
from .layout import parse_segment_name
from .segment import Segment
from .segments import Segments
from .state import after_cut, recovery_point


class Exclusive:
    """The commit lock, as a context the writer thread enters (Partition.exclusive):
    held, with what other processes did taken in. Re-entrant (a job that appends). A
    class, not a generator: a commit enters it every time."""

    __slots__ = ("part", "depth")

    def __init__(self, part) -> None:
        self.part = part
        self.depth = 0

    def __enter__(self) -> None:
        self.enter(changing=True)

    def __exit__(self, kind, error, traceback) -> None:
        self.exit(failed=kind is not None)

    def enter(self, *, changing: bool) -> None:
        """`changing`: the holder is about to change the files (it bumps the counter);
        False for a poll, which only takes in what others did (what it may cut, a
        killed writer's half-written tail, that writer's own bump announced)."""
        self.depth += 1
        if self.depth > 1:
            return
        part = self.part
        try:
            changed = part.lock.acquire()
            if changed and part.lock.gone():  # (a delete bumps the counter first)
                part.mark_deleted(by_another=True)
            tail = part.lock.tail_state() if changed else None
            if changing:
                part.lock.bump()
            if changed and not (tail is not None and take_tail(part, tail)):
                catch_up(part)
                part.layout = part.lock.layout()  # this process knows the set now
            if not changing:
                part.lock.settle()
        except BaseException:
            self.exit(failed=True)
            raise

    def exit(self, *, failed: bool) -> None:
        self.depth -= 1
        if self.depth == 0:
            try:
                if not failed:  # else the next holder reads what this one left
                    leave_tail(self.part)
            finally:
                self.part.lock.release()


def poll_job(part) -> None:
    """A job on the writer thread: take in what other processes appended, now."""
    part.exclusive.enter(changing=False)  # entering catches up; nothing else to do
    part.exclusive.exit(failed=False)


def leave_tail(part) -> None:
    """Leave this holder's tail state in the lock's mapping for the next holder."""
    point = recovery_point(part.state)
    part.lock.leave_tail(point.next_offset, point.segment_base, point.position,
                         point.hwm_us)


def take_tail(part, tail) -> bool:
    """Catch up from the tail state the last holder left, when this process knows the
    segment set it describes (only appends happened since): no file is read. Returns
    False when it cannot (the caller reads what was added)."""
    state = part.state
    active = state.segments.active
    if tail.layout != part.layout or tail.active_base != active.base_offset or (
            tail.end_offset < state.end_offset):
        return False
    active.adopt_size()
    if active.size_bytes != tail.position:
        return False
    part.index.reload_last()
    part.publish_end(tail.end_offset, None if tail.hwm_us == NO_HWM else tail.hwm_us,
                     tail.position)
    part.ring.reset(tail.end_offset)
    return True


def catch_up(part) -> None:
    """Writer, under the commit lock: take in the frames and segments other processes
    added, the segments their retention removed, and cut what a writer killed mid-commit
    left half-written (recovery.catch_up). Anything else (a truncate) and the partition
    is taken in again as an open would."""
    ours = part.state.segments
    segments = segments_now(part, ours.active, writable=True)
    if segments is None:
        reload(part)
        return
    part.index.reload_last()
    state, _ = recovery_module.catch_up(segments, part.index,
                                        start=recovery_point(part.state),
                                        chunk_bytes=part.config.read_chunk_bytes)
    changes = dict(end_offset=state.next_offset, hwm_us=state.hwm_us)
    if segments != list(ours):  # (catch_up may have removed a torn new segment)
        changes.update(segments=Segments(segments))
    part.publish(**changes)
    if state.end_segment != len(segments) - 1:
        reload(part)  # not a shape a crash mid-commit leaves: read it all again
        return
    segments[-1].unseal()  # a writer killed between sealing and rolling
    part.publish(active_position=state.end_position, end_segment=state.end_segment)
    opening.load_start(part)  # (retention, or delete_records, may have moved it)
    opening.rederive_commits(part)
    part.ring.reset(part.state.end_offset)


def segments_now(part, end_segment, *, writable: bool,
                 removed: list | None = None) -> list | None:
    """The segments as the directory holds them now, when they differ from this
    process's only as other processes' appends, rolls and retention make them differ
    (sizes from `end_segment` on, new segments after it, the oldest ones removed); the
    removed ones are closed, or added to `removed`. None when anything else changed (a
    truncate, done or under way): the caller takes the partition in again."""
    names = set(part.fileio.listdir(part.directory))
    ours = part.state.segments
    present = Segments(s for s in ours if os.path.basename(s.path) in names)
    gone = len(ours) - len(present)
    if maintenance.INTENT_NAME in names or present != ours[gone:] or (
            end_segment not in present) or isinstance(end_segment,
                                                      maintenance.PatchedSegment) or (
            part.fileio.size(end_segment.handle) < part.state.active_position):
        return None
    for segment in present[present.index(end_segment):]:
        segment.adopt_size()
    newer = sorted(b for b in map(parse_segment_name, names)
                   if b is not None and b > present.active.base_offset)
    for segment in ours[:gone]:
        if removed is None:
            segment.close()
        else:
            removed.append(segment)
    return [*present, *(Segment(part.fileio, part.directory, base, writable=writable,
                                clock=part.clock) for base in newer)]


def reload(part) -> None:
    """Another process truncated the partition (or was killed doing it): take it in
    again from its files, as an open does."""
    before = part.state.end_offset
    for segment in part.state.segments:
        segment.close()
    opening.load(part)
    if part.state.end_offset < before:
        part.publish(**after_cut(part.state, part.state.end_offset))
    part.ring.reset(part.state.end_offset)
