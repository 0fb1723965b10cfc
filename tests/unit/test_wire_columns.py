"""What a READ's pull makes of a reader's slices (wire/columns.pull_batches): stored
batches as they are, small consecutive ones of one layout and transaction joined into
one BATCH whose payload decodes to the rows of all of them, and a reader's error
returned after the batches before it."""

from __future__ import annotations

import pytest

from streamlog.errors import CorruptSegment
from streamlog.payload import encode_payload_columns
from streamlog.wire.columns import (END, FAILED, JOIN_BYTES, MORE, decode_records,
                                    pull_batches)


def _stored(base: int, n: int, *, size: int = 10, txn_id: int = 0, nulls: bool = False,
            headers: bool = False):
    values = [None if nulls and i % 3 == 0 else bytes([i % 251]) * size for i in range(n)]
    keys = [None if i % 4 == 0 else b"k%d" % (base + i) for i in range(n)]
    pairs = [(("h", b"%d" % i),) if headers and i % 2 else () for i in range(n)]
    _, _, columns = encode_payload_columns(
        [base + i for i in range(n)], keys, values, headers=pairs if headers else None,
        base_offset=base, txn_id=txn_id)
    return columns


def _rows(columns) -> list:
    from streamlog.payload import columns_to_records
    return [r[1:] for r in columns_to_records(columns, 0, 0, len(columns), True)]


def _decoded(batch):
    base, count, txn_id, flags, payload = batch
    return decode_records(payload, flags, count, base_offset=base, txn_id=txn_id)


def test_small_batches_are_joined_by_layout_and_transaction_and_decode_to_their_rows():
    stored = [_stored(0, 10), _stored(10, 7), _stored(17, 5, nulls=True),
              _stored(22, 6, nulls=True), _stored(28, 4, txn_id=9), _stored(32, 3, txn_id=9),
              _stored(35, 8, headers=True), _stored(43, 2, headers=True), _stored(45, 9)]
    batches, status, error = pull_batches(iter([(c, 0, len(c)) for c in stored]), 1 << 30)
    assert (status, error) == (END, None)
    # layouts: plain, with None values, a transaction's, with headers, plain again
    assert [(b[0], b[1], b[2]) for b in batches] == [
        (0, 17, 0), (17, 11, 0), (28, 7, 9), (35, 10, 0), (45, 9, 0)]
    assert batches[-1][4] is stored[-1].raw  # alone: its payload as stored, not copied
    for batch, parts in zip(batches, ([0, 1], [2, 3], [4, 5], [6, 7], [8])):
        assert _rows(_decoded(batch)) == [row for p in parts for row in _rows(stored[p])]


def test_a_batch_over_the_join_size_goes_as_it_is_and_joins_stop_at_it():
    big = JOIN_BYTES // 100
    stored = [_stored(0, 10), _stored(10, big, size=100), _stored(10 + big, 10)]
    batches, _, _ = pull_batches(iter([(c, 0, len(c)) for c in stored]), 1 << 30)
    assert [b[4] is c.raw for b, c in zip(batches, stored)] == [True, True, True]


def test_the_budget_stops_a_pull_and_the_next_one_goes_on():
    stored = [_stored(10 * i, 10, size=1000) for i in range(10)]
    slices = iter([(c, 0, len(c)) for c in stored])
    first, status, _ = pull_batches(slices, 25_000)
    second, status_after, _ = pull_batches(slices, 1 << 30)
    assert (status, status_after) == (MORE, END)
    assert sum(b[1] for b in first) + sum(b[1] for b in second) == 100
    assert first[-1][0] + first[-1][1] == second[0][0]


def test_a_reader_error_comes_after_the_batches_before_it():
    stored = [_stored(0, 10), _stored(10, 10)]

    def slices():
        yield stored[0], 0, 10
        yield stored[1], 0, 10
        raise CorruptSegment("segment", 123, "payload checksum mismatch")

    batches, status, error = pull_batches(slices(), 1 << 30)
    assert status is FAILED and isinstance(error, CorruptSegment)
    assert [row for b in batches for row in _rows(_decoded(b))] == (
        _rows(stored[0]) + _rows(stored[1]))


@pytest.mark.parametrize("lo, hi", [(3, 10), (0, 4)])
def test_slices_of_stored_batches_are_joined_with_their_neighbours(lo, hi):
    stored = [_stored(0, 10), _stored(10, 10), _stored(20, 10)]
    slices = [(stored[0], lo, 10), (stored[1], 0, 10), (stored[2], 0, hi)]
    batches, _, _ = pull_batches(iter(slices), 1 << 30)
    (batch,) = batches
    assert batch[0] == lo and batch[1] == 20 - lo + hi
    expected = _rows(stored[0])[lo:] + _rows(stored[1]) + _rows(stored[2])[:hi]
    assert _rows(_decoded(batch)) == expected
