"""A partition's whole state, as one immutable value.

Strategy: the partition's writer (or a read-only view's refresh) replaces the state in
one assignment after every change (`Partition.publish`, the only place it is written);
everyone else reads whichever value they took, and never sees half of a change (a
segment set without the offsets that go with it). Readers get it through a
`view.View`.

Truncations: a reader needs to know whether the partition was cut below its position
since it last looked. `generation` counts the cuts, and `cuts` keeps what answers "the
lowest cut since generation g" in a few entries: a stack of (generation, new end) whose
ends rise (a cut at or below an entry's end supersedes it: no reader can need the higher
one any more). It is bounded by `CUTS_MAX`; past the bound the two oldest entries merge
into (the newer generation, the lower end), which can only make a reader more
careful (it may refuse a position a lost entry would have allowed, never the reverse).
"""

from __future__ import annotations

from typing import NamedTuple

from .index import NO_HWM, RecoveryPoint
from .segments import Segments

CUTS_MAX = 32


class PartitionState(NamedTuple):
    start_offset: int
    end_offset: int  # the next offset to be written: the acknowledged end
    hwm_us: int | None  # running max timestamp of every record (None: none yet)
    start_hwm_us: int | None  # ... of the records retention removed (None: none removed)
    segments: Segments
    # Where the acknowledged end is: the position in the active segment for a writer;
    # for a read-only view, in the segment `end_segment` (an index into `segments`: a
    # writer in another process may have rolled past it). Only views read end_segment.
    active_position: int = 0
    end_segment: int = 0
    # Read-only: (offset, CorruptSegment) where acknowledged data is damaged; a reader
    # that reaches the offset raises the error.
    damage: tuple | None = None
    generation: int = 0  # truncations taken in since the partition was opened
    cuts: tuple = ()  # (generation, new end offset): see the module docstring
    failed: BaseException | None = None  # a write or fsync failed: appends refused


def after_cut(state: PartitionState, new_end: int) -> dict:
    """The changes that record a cut to `new_end` (for `Partition.publish`)."""
    generation = state.generation + 1
    cuts = [c for c in state.cuts if c[1] < new_end] + [(generation, new_end)]
    while len(cuts) > CUTS_MAX:
        cuts[0:2] = [(cuts[1][0], cuts[0][1])]
    return dict(generation=generation, cuts=tuple(cuts))


def lowest_cut_since(state: PartitionState, generation: int) -> int | None:
    """The lowest new end of the cuts made after `generation` (None: none made)."""
    for made_at, end in state.cuts:
        if made_at > generation:
            return end
    return None


def recovery_point(state: PartitionState) -> RecoveryPoint:
    """Where recovery may start from when `state` is durable (a writer's: its end is in
    the active segment)."""
    return RecoveryPoint(state.segments.active.base_offset, state.active_position,
                         state.end_offset, NO_HWM if state.hwm_us is None else state.hwm_us)
