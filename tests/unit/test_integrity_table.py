"""The integrity decision table (integrity.py): every combination of its inputs matches
exactly one row, and the rules DESIGN section 4 states hold for each."""

import pytest

from streamlog.integrity import (ACTIONS, Action, IndexClaim, Observation, TailKind, Verdict,
                                 all_observations, classify_stop, decide, is_continuation,
                                 matching_rows)

ALL = list(all_observations())


def test_every_combination_matches_exactly_one_row():
    assert len(ALL) == len(IndexClaim) * len(TailKind) * 2 * 2
    for observation in ALL:
        assert len(matching_rows(observation)) == 1, observation


def test_every_verdict_is_reachable_and_has_actions():
    assert {decide(o) for o in ALL} == set(Verdict)
    assert set(ACTIONS) == set(Verdict)


@pytest.mark.parametrize("observation", ALL, ids=str)
def test_rules(observation):
    verdict = decide(observation)
    if observation.index in (IndexClaim.UNREADABLE, IndexClaim.DISAGREES):
        assert verdict is Verdict.REBUILD_INDEX  # a damaged cache is rebuilt, never trusted
        return
    if observation.tail is TailKind.END:
        assert verdict is Verdict.CLEAN
        return
    if observation.tail is TailKind.GAP or observation.continues_after:
        assert verdict is Verdict.CORRUPT  # valid data after damage is never a tear
        return
    if observation.in_durable:
        assert verdict is Verdict.DAMAGED_DURABLE  # an acknowledged frame is never torn
        return
    expected = Verdict.STALE_TAIL if observation.tail is TailKind.STALE else Verdict.TORN_TAIL
    assert verdict is expected


def test_damage_refuses_writes_and_fails_readers():
    for verdict in Verdict:
        writable, readonly = ACTIONS[verdict]
        if verdict.is_damage:
            assert (writable, readonly) == (Action.REFUSE, Action.FAIL_AT)
        if verdict.is_tail_garbage:
            assert (writable, readonly) == (Action.TRUNCATE, Action.STOP_BEFORE)
        assert not (verdict.is_damage and verdict.is_tail_garbage)


def test_classify_stop():
    assert classify_stop(False, False, None, 10) is TailKind.END
    assert classify_stop(False, True, None, 10) is TailKind.SHORT
    assert classify_stop(True, False, None, 10) is TailKind.BAD
    assert classify_stop(True, False, 3, 10) is TailKind.STALE
    assert classify_stop(True, False, 11, 10) is TailKind.GAP


def test_continuation():
    assert is_continuation(10, 10)
    assert is_continuation(15, 10)
    assert not is_continuation(9, 10)
    assert is_continuation(0, None)


def test_case_one_bit_in_the_last_durable_frame_is_damage_not_a_tear():
    seen = Observation(IndexClaim.CONFIRMED, TailKind.BAD, False, True)
    assert decide(seen) is Verdict.DAMAGED_DURABLE


def test_case_stale_copy_after_a_torn_frame_is_tail_garbage():
    # a torn frame, then an old frame: nothing continues, nothing durable was hit
    seen = Observation(IndexClaim.CONFIRMED, TailKind.SHORT, False, False)
    assert decide(seen) is Verdict.TORN_TAIL
    seen = Observation(IndexClaim.CONFIRMED, TailKind.STALE, False, False)
    assert decide(seen) is Verdict.STALE_TAIL
