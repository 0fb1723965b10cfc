"""A partition's segments in offset order, as one immutable value.

Strategy: the writer thread never changes a `Segments`; to roll, delete or cut it makes
a new one and swaps it in (Partition.segments), so a reader that took the value keeps a
consistent set while the writer moves on (the files of deleted segments stay readable
through their open handles). Lookups are by base offset (bisect): the segment holding
an offset, the one with a given base, the one after another.
"""

from __future__ import annotations

import bisect


def _base(segment) -> int:
    return segment.base_offset


class Segments(tuple):
    """Segments (segment.Segment or a read-only stand-in) in ascending base offset."""

    __slots__ = ()

    def __new__(cls, segments=()):
        segments = tuple(segments)
        assert all(a.base_offset < b.base_offset for a, b in zip(segments, segments[1:]))
        return super().__new__(cls, segments)

    def __getitem__(self, key):
        found = super().__getitem__(key)
        return Segments(found) if isinstance(key, slice) else found

    @property
    def active(self):
        """The last segment: the one a writer appends to."""
        return tuple.__getitem__(self, -1)

    @property
    def start_offset(self) -> int:
        return self[0].base_offset if self else 0

    def by_base(self, base_offset: int):
        """The segment whose first offset is `base_offset`, or None."""
        at = bisect.bisect_left(self, base_offset, key=_base)
        return self[at] if at < len(self) and self[at].base_offset == base_offset else None

    def holding(self, offset: int):
        """The segment whose records include `offset`, by the names alone (the first one
        for an offset before it)."""
        at = bisect.bisect_right(self, offset, key=_base)
        return self[max(at - 1, 0)]

    def after(self, segment):
        """The segment after `segment` (by base offset), or None."""
        at = bisect.bisect_right(self, segment.base_offset, key=_base)
        return self[at] if at < len(self) else None

    def number(self, segment) -> int:
        """Where `segment` is in the set (it must be there)."""
        at = bisect.bisect_left(self, segment.base_offset, key=_base)
        assert self[at] is segment
        return at

    def rolled(self, segment) -> "Segments":
        """This set and a new last segment."""
        return Segments((*self, segment))

    def through(self, base_offset: int) -> "Segments":
        """The segments whose base offset is at most `base_offset`."""
        return self[:bisect.bisect_right(self, base_offset, key=_base)]

    def size_bytes(self) -> int:
        return sum(segment.size_bytes for segment in self)
