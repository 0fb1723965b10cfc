"""Segments: a partition's segments as one immutable value, looked up by offset."""

from __future__ import annotations

import dataclasses

import pytest

from streamlog.segments import Segments


@dataclasses.dataclass(eq=False)
class Fake:
    base_offset: int
    size_bytes: int = 10


def make(*bases: int) -> Segments:
    return Segments(Fake(base) for base in bases)


def test_lookups_by_offset_and_base():
    segments = make(0, 100, 250)
    assert segments.holding(0) is segments[0]
    assert segments.holding(99) is segments[0]
    assert segments.holding(100) is segments[1]
    assert segments.holding(10**9) is segments[2]
    assert segments.by_base(100) is segments[1]
    assert segments.by_base(101) is None and segments.by_base(-1) is None
    assert segments.after(segments[0]) is segments[1]
    assert segments.after(segments[2]) is None
    assert [segments.number(s) for s in segments] == [0, 1, 2]
    assert segments.active is segments[2]
    assert (segments.start_offset, Segments().start_offset) == (0, 0)
    assert segments.size_bytes() == 30


def test_an_offset_before_the_first_segment_is_looked_for_in_the_first():
    segments = make(50, 60)
    assert segments.holding(10) is segments[0]


def test_changes_make_new_values_and_leave_the_old_one_alone():
    segments = make(0, 100)
    rolled = segments.rolled(Fake(200))
    assert [s.base_offset for s in rolled] == [0, 100, 200]
    assert [s.base_offset for s in segments] == [0, 100]
    assert isinstance(rolled[1:], Segments) and rolled[1:].start_offset == 100
    assert [s.base_offset for s in rolled.through(150)] == [0, 100]
    assert [s.base_offset for s in rolled.through(200)] == [0, 100, 200]
    assert len(rolled.through(-1)) == 0
    with pytest.raises(TypeError):
        segments[0] = Fake(5)  # type: ignore[index]


def test_out_of_order_segments_are_refused():
    with pytest.raises(AssertionError):
        make(100, 0)
    with pytest.raises(AssertionError):
        make(0, 0)
