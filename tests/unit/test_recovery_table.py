"""The recovery decision table (recovery.py) enumerated: every combination of how a scan
stopped and what follows the stop maps to exactly one tail state."""

import itertools

import pytest

from streamlog.recovery import decide
from streamlog.scan import StopReason, TailState

# (stop, valid frame after the stop) -> the one expected state
TABLE = {
    (StopReason.END, False): TailState.CLEAN,
    (StopReason.END, True): TailState.CLEAN,  # END means nothing follows; flag is moot
    (StopReason.INCOMPLETE, False): TailState.TORN,
    (StopReason.INCOMPLETE, True): TailState.CORRUPT,
    (StopReason.BAD, False): TailState.TORN,
    (StopReason.BAD, True): TailState.CORRUPT,
}


def test_table_covers_every_combination():
    combinations = set(itertools.product(StopReason, (False, True)))
    assert combinations == set(TABLE)


@pytest.mark.parametrize("stop,valid_after", sorted(TABLE, key=str))
def test_each_row(stop, valid_after):
    assert decide(stop, valid_after) is TABLE[(stop, valid_after)]


def test_a_valid_frame_after_damage_is_never_a_tear():
    for stop in (StopReason.INCOMPLETE, StopReason.BAD):
        assert decide(stop, True) is TailState.CORRUPT
