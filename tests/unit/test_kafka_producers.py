"""kafka/producers.py: Kafka's sequence rules for idempotent producers, and the snapshot
codec. Pure: values in, verdicts and entries out."""

from __future__ import annotations

import dataclasses
import json

import pytest

from streamlog.frame import SEQUENCE_MAX
from streamlog.kafka.producers import (BATCHES_KEPT, Anchor, Batch, BatchMeta, Decision,
                                       ProducerEntry, SequenceVerdict, Snapshot, appended,
                                       decide, decode_snapshot, encode_snapshot, replayed,
                                       trimmed)


def entry_after(*batches: tuple[int, int, int, int]) -> ProducerEntry | None:
    """The entry after appending (epoch, first sequence, record count, base offset)
    batches in order, each checked to be an APPEND first."""
    entry = None
    for epoch, first, count, base in batches:
        batch = Batch(epoch, first, count)
        assert decide(entry, batch).verdict is SequenceVerdict.APPEND
        entry = appended(entry, batch, base)
    return entry


# -- decide -------------------------------------------------------------------------------

@pytest.mark.parametrize("first", [0, 1, 77, SEQUENCE_MAX])
def test_a_producer_with_no_entry_is_taken_at_any_sequence(first):
    # new, or every batch it wrote here is gone (retention): Kafka accepts any sequence
    assert decide(None, Batch(0, first, 3)) == Decision(SequenceVerdict.APPEND)


def test_the_next_sequence_is_appended_and_a_gap_is_out_of_order():
    entry = entry_after((0, 0, 3, 100))  # sequences 0..2
    assert decide(entry, Batch(0, 3, 1)).verdict is SequenceVerdict.APPEND
    gap = decide(entry, Batch(0, 4, 1))
    assert gap.verdict is SequenceVerdict.OUT_OF_ORDER and "expected 3" in gap.reason
    assert decide(entry, Batch(0, 2, 1)).verdict is SequenceVerdict.OUT_OF_ORDER  # overlaps


def test_a_retry_of_any_of_the_last_five_batches_is_a_duplicate_with_its_offset():
    batches = [(0, 2 * i, 2, 1000 + 10 * i) for i in range(7)]  # sequences 0..13
    entry = entry_after(*batches)
    assert len(entry.batches) == BATCHES_KEPT
    for _epoch, first, count, base in batches[-BATCHES_KEPT:]:
        assert decide(entry, Batch(0, first, count)) == Decision(SequenceVerdict.DUPLICATE,
                                                                 base_offset=base)
    # older than the last five: Kafka can no longer tell, and refuses it
    assert decide(entry, Batch(0, 2, 2)).verdict is SequenceVerdict.OUT_OF_ORDER
    # the same first sequence with another length is not the same batch
    assert decide(entry, Batch(0, 12, 1)).verdict is SequenceVerdict.OUT_OF_ORDER


def test_sequences_wrap_after_int32_max():
    entry = entry_after((0, SEQUENCE_MAX - 1, 2, 50))  # ..., MAX - 1, MAX
    assert entry.last_sequence == SEQUENCE_MAX
    assert decide(entry, Batch(0, 0, 4)).verdict is SequenceVerdict.APPEND
    across = Batch(0, SEQUENCE_MAX, 3)  # MAX, 0, 1
    assert across.last_sequence == 1
    entry = entry_after((0, SEQUENCE_MAX, 3, 7))
    assert decide(entry, Batch(0, 2, 1)).verdict is SequenceVerdict.APPEND
    assert decide(entry, Batch(0, SEQUENCE_MAX, 3)).base_offset == 7


def test_epochs_fence_older_and_restart_sequences_at_zero():
    entry = entry_after((3, 0, 5, 10))
    fenced = decide(entry, Batch(2, 5, 1))
    assert fenced.verdict is SequenceVerdict.FENCED and "older" in fenced.reason
    assert decide(entry, Batch(2, 0, 5)).verdict is SequenceVerdict.FENCED  # even its old batch
    assert decide(entry, Batch(4, 5, 1)).verdict is SequenceVerdict.OUT_OF_ORDER
    # the same sequence numbers in a new epoch are a new batch, not a duplicate
    assert decide(entry, Batch(4, 0, 5)) == Decision(SequenceVerdict.APPEND)
    bumped = appended(entry, Batch(4, 0, 5), 20)
    assert bumped == ProducerEntry(4, (BatchMeta(0, 4, 20),))


def test_appended_keeps_the_last_five_oldest_first():
    entry = entry_after(*[(0, i, 1, i * 10) for i in range(8)])
    assert [b.base_offset for b in entry.batches] == [30, 40, 50, 60, 70]
    assert (entry.last_sequence, entry.last_offset) == (7, 70)


def test_replay_is_the_append_rule_without_a_verdict():
    # a rebuild replays what the partition holds: a gap (an earlier batch removed by
    # retention) is no reason to stop, and the result is what appending built
    entry = None
    for first, base in ((0, 0), (1, 5), (9, 9)):
        entry = replayed(entry, Batch(0, first, 1), base)
    assert [(b.first_sequence, b.base_offset) for b in entry.batches] == [(0, 0), (1, 5),
                                                                          (9, 9)]
    built = entry_after((0, 0, 2, 0), (0, 2, 2, 4))
    assert replayed(replayed(None, Batch(0, 0, 2), 0), Batch(0, 2, 2), 4) == built
    # a batch of an older epoch after a newer one cannot be appended: it changes nothing
    newer = replayed(None, Batch(2, 0, 1), 0)
    assert replayed(newer, Batch(1, 1, 1), 1) is newer


def test_trimmed_drops_the_producers_least_recently_active():
    entries = {pid: entry_after((0, 0, 1, offset))
               for pid, offset in ((1, 50), (2, 10), (3, 40), (4, 30))}
    assert trimmed(entries, 4) is entries
    assert sorted(trimmed(entries, 2)) == [1, 3]


# -- snapshots ----------------------------------------------------------------------------

def snapshot() -> Snapshot:
    return Snapshot("orders", 2, 120, Anchor(119, 100, 1_700_000_000_000_000, 1 << 63,
                                             (7, 0, 40)),
                    {7: entry_after((0, 0, 20, 80), (0, 20, 20, 100)),
                     (1 << 62): entry_after((3, 0, 1, 5))})


def test_snapshot_round_trip():
    assert decode_snapshot(encode_snapshot(snapshot())) == snapshot()
    empty = Snapshot("orders", 0, 0, None, {})
    assert decode_snapshot(encode_snapshot(empty)) == empty
    unstamped = dataclasses.replace(snapshot(), anchor=dataclasses.replace(
        snapshot().anchor, stamp=None))
    assert decode_snapshot(encode_snapshot(unstamped)) == unstamped


def edited(change) -> bytes:
    found = json.loads(encode_snapshot(snapshot()))
    change(found)
    return json.dumps(found).encode()


@pytest.mark.parametrize("data, reason", [
    (b"", "Expecting value"),
    (b"[1, 2]", "not a producer snapshot"),
    (encode_snapshot(snapshot())[:-9], "Expecting"),
    (edited(lambda s: s.update(format=2)), "unknown snapshot format"),
    (edited(lambda s: s.pop("producers")), "not a producer snapshot"),
    (edited(lambda s: s.update(anchor=None)), "offset and anchor disagree"),
    (edited(lambda s: s["anchor"].update(offset=7)), "not the record before"),
    (edited(lambda s: s["producers"]["7"].update(epoch=-1)), "impossible snapshot entry"),
    (edited(lambda s: s["producers"]["7"].update(batches=[])), "impossible snapshot entry"),
    (edited(lambda s: s["producers"]["7"]["batches"][0].__setitem__(2, 120)),
     "impossible batch"),
    (edited(lambda s: s["producers"]["7"]["batches"][0].__setitem__(0, -1)),
     "impossible batch"),
    (edited(lambda s: s["producers"]["7"]["batches"][0].append(1)), "too many values"),
])
def test_a_damaged_snapshot_is_a_value_error_never_a_wrong_table(data, reason):
    with pytest.raises(ValueError, match=reason):
        decode_snapshot(data)
