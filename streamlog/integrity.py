"""The one decision table for what a partition's bytes mean. Pure: no I/O.

Strategy: every part of streamlog that looks at a partition's files (a writable open, a
read-only open, `verify`, `info`, `dump`, `repair`) first turns what it saw into an
`Observation`: what the index claims (`IndexClaim`), how the scan of the segments ended
(`TailKind`), whether a frame that continues the partition follows the bad spot, and
whether the bad spot lies inside what the index records as durable. `decide` maps that
to exactly one `Verdict`, and `ACTIONS` says what a writer and a reader do about it. So
the tools cannot disagree about the same bytes: they share this table, not copies of it.

The rules (DESIGN section 4), as rows (a `None` cell matches anything):

    index       tail                      continues  durable  verdict
    UNREADABLE  -                         -          -        REBUILD_INDEX
    DISAGREES   -                         -          -        REBUILD_INDEX
    CONFIRMED   END                       -          -        CLEAN
    or ABSENT   GAP                       -          -        CORRUPT
                SHORT, BAD or STALE       yes        -        CORRUPT
                SHORT or BAD              no         no       TORN_TAIL
                STALE                     no         no       STALE_TAIL
                SHORT, BAD or STALE       no         yes      DAMAGED_DURABLE

- A frame is valid at a position only if its checksum holds AND it continues the
  partition (its base offset is where the previous frame ended). A checksummed frame
  with an older base offset (a stale copy a power loss exposed) is tail garbage
  (`STALE`); one with a newer base offset means records are missing (`GAP`).
- "continues" is a valid frame anywhere after the bad spot whose base offset is at
  least the offset the bad spot should have held: valid data after damage is
  corruption, never a tear.
- "durable" is the index's recovery point (itself checked against the segments) lying
  past the bad spot: an acknowledged, fsynced frame is never torn, so a checksum
  mismatch there is damage even at the very end of the log.
- An index that cannot be read or does not fit the segments is rebuilt from them; the
  scan is then classified again with `IndexClaim.ABSENT`.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools


class IndexClaim(enum.Enum):
    CONFIRMED = "confirmed"  # readable, and its recovery point checks out on disk
    ABSENT = "absent"  # no index or no recovery point: nothing is claimed durable
    UNREADABLE = "unreadable"  # library error, checksum mismatch, damaged seal
    DISAGREES = "disagrees"  # readable, but its claims do not fit the segments


class TailKind(enum.Enum):
    """How a walk of the segments from a known-good point ended."""

    END = "end"  # the files end exactly after a valid frame
    SHORT = "short"  # the files end inside a frame
    BAD = "bad"  # bytes that can never be a frame (checksum, magic, length)
    STALE = "stale"  # a checksummed frame with an older base offset than expected
    GAP = "gap"  # a checksummed frame with a newer base offset than expected


class Verdict(enum.Enum):
    """Values are the stable words of `info --json`, `verify --json` and reports."""

    CLEAN = "clean"
    TORN_TAIL = "torn"
    STALE_TAIL = "stale"
    DAMAGED_DURABLE = "damaged"
    CORRUPT = "corrupt"
    REBUILD_INDEX = "rebuild-index"

    @property
    def description(self) -> str:
        return _DESCRIPTIONS[self]

    @property
    def is_damage(self) -> bool:
        """Acknowledged data is damaged: refuse writes, fail readers that reach it."""
        return self in (Verdict.DAMAGED_DURABLE, Verdict.CORRUPT)

    @property
    def is_tail_garbage(self) -> bool:
        """Bytes after the last acknowledged frame that a writer cuts off."""
        return self in (Verdict.TORN_TAIL, Verdict.STALE_TAIL)


_DESCRIPTIONS = {
    Verdict.CLEAN: "clean",
    Verdict.TORN_TAIL: "torn tail",
    Verdict.STALE_TAIL: "stale tail (a checksummed frame that does not continue the log)",
    Verdict.DAMAGED_DURABLE: "damaged durable frame",
    Verdict.CORRUPT: "mid-log corruption",
    Verdict.REBUILD_INDEX: "the index disagrees with the segments",
}


@dataclasses.dataclass(frozen=True, slots=True)
class Observation:
    index: IndexClaim
    tail: TailKind
    continues_after: bool  # a valid, continuing frame follows the bad spot
    in_durable: bool  # the bad spot is before the index's (confirmed) recovery point


class Action(enum.Enum):
    KEEP = "keep"
    TRUNCATE = "truncate the tail"
    REFUSE = "refuse to open for writing"
    REBUILD = "rebuild the index, then decide again"
    STOP_BEFORE = "serve up to the bad spot; nothing after it"
    FAIL_AT = "serve up to the bad spot; a reader that reaches it raises"


_DAMAGED = (TailKind.SHORT, TailKind.BAD, TailKind.STALE)
_TRUSTED = (IndexClaim.CONFIRMED, IndexClaim.ABSENT)

# (index, tail, continues_after, in_durable) -> verdict; a None cell matches anything.
ROWS: tuple[tuple[tuple, Verdict], ...] = (
    (((IndexClaim.UNREADABLE,), None, None, None), Verdict.REBUILD_INDEX),
    (((IndexClaim.DISAGREES,), None, None, None), Verdict.REBUILD_INDEX),
    ((_TRUSTED, (TailKind.END,), None, None), Verdict.CLEAN),
    ((_TRUSTED, (TailKind.GAP,), None, None), Verdict.CORRUPT),
    ((_TRUSTED, _DAMAGED, (True,), None), Verdict.CORRUPT),
    ((_TRUSTED, (TailKind.SHORT, TailKind.BAD), (False,), (False,)), Verdict.TORN_TAIL),
    ((_TRUSTED, (TailKind.STALE,), (False,), (False,)), Verdict.STALE_TAIL),
    ((_TRUSTED, _DAMAGED, (False,), (True,)), Verdict.DAMAGED_DURABLE),
)

# verdict -> (what a writable open does, what a read-only open does)
ACTIONS: dict[Verdict, tuple[Action, Action]] = {
    Verdict.CLEAN: (Action.KEEP, Action.KEEP),
    Verdict.TORN_TAIL: (Action.TRUNCATE, Action.STOP_BEFORE),
    Verdict.STALE_TAIL: (Action.TRUNCATE, Action.STOP_BEFORE),
    Verdict.DAMAGED_DURABLE: (Action.REFUSE, Action.FAIL_AT),
    Verdict.CORRUPT: (Action.REFUSE, Action.FAIL_AT),
    Verdict.REBUILD_INDEX: (Action.REBUILD, Action.REBUILD),
}


def _matches(cells: tuple, observation: Observation) -> bool:
    values = (observation.index, observation.tail, observation.continues_after,
              observation.in_durable)
    return all(cell is None or value in cell for cell, value in zip(cells, values))


def matching_rows(observation: Observation) -> list[Verdict]:
    """Every row that matches (the table is right when this is always one)."""
    return [verdict for cells, verdict in ROWS if _matches(cells, observation)]


def decide(observation: Observation) -> Verdict:
    """The one verdict for an observation."""
    found = matching_rows(observation)
    assert len(found) == 1, (observation, found)
    return found[0]


def all_observations():
    """Every combination of the table's inputs (for the test that enumerates them)."""
    for index, tail, continues, durable in itertools.product(
            IndexClaim, TailKind, (False, True), (False, True)):
        yield Observation(index, tail, continues, durable)


def classify_stop(stopped_bad: bool, stopped_short: bool, found_base: int | None,
                  expected_base: int | None) -> TailKind:
    """The TailKind of a scan's stop. `found_base` is the base offset of a checksummed
    frame that stopped the scan by not continuing the sequence (else None)."""
    if found_base is not None:
        assert expected_base is not None
        assert found_base != expected_base
        return TailKind.STALE if found_base < expected_base else TailKind.GAP
    if stopped_bad:
        return TailKind.BAD
    if stopped_short:
        return TailKind.SHORT
    return TailKind.END


def is_continuation(base_offset: int, expected_base: int | None) -> bool:
    """Is a checksummed frame found after a bad spot valid data of this partition?
    It is when its base offset is at least the offset the bad spot should have held
    (the damaged frame had at least one record); an older one is a stale copy."""
    return expected_base is None or base_offset >= expected_base
