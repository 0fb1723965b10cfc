"""columnar.py, pure: columns -> payload pieces. What the columnar path encodes must be
byte for byte what encode_payload makes of the same records as lists, and its cuts and
partition choices must be those of the list path (append.cut, AppendRules.route)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from streamlog import columnar
from streamlog.append import cut, partition_for_key
from streamlog.payload import encode_payload, join_encoded

RECORDS = st.lists(
    st.tuples(st.binary(max_size=40), st.none() | st.binary(max_size=20),
              st.integers(-(1 << 63) + 1, (1 << 63) - 1)),
    min_size=1, max_size=60)


def rows_of(records, *, sliced: bool = False) -> columnar.Rows:
    values, keys, stamps = (list(column) for column in zip(*records))
    if sliced:  # an Arrow slice: offsets and validity start mid-buffer
        values, keys, stamps = [b"pad", *values], [b"pad", *keys], [0, *stamps]
    data = {"value": pa.array(values, pa.binary()), "key": pa.array(keys, pa.binary()),
            "timestamp": pa.array(stamps, pa.int64())}
    batch = pa.record_batch(data)
    if sliced:
        batch = batch.slice(1)
    return columnar.rows_from(batch, record_bytes_max=1 << 20)


@settings(max_examples=150, deadline=None)
@given(RECORDS, st.integers(64, 2000), st.integers(1, 20), st.booleans())
def test_pieces_join_to_the_list_payload(records, frame_bytes_max, records_max, sliced):
    values, keys, stamps = (list(column) for column in zip(*records))
    pieces = columnar.encode(rows_of(records, sliced=sliced), 0,
                             frame_bytes_max=frame_bytes_max, batch_records_max=records_max)
    expected, flags = encode_payload(stamps, keys, values)
    assert flags == 0
    assert join_encoded(pieces) == expected
    # each piece is also a valid payload on its own, of the rows the list path cuts
    listed_pieces = cut(range(len(values)), values, keys, stamps, None, None, 0,
                          _Config(frame_bytes_max, records_max))
    assert [p.record_count for p in pieces] == [len(p.values) for p in listed_pieces]
    assert [p.nbytes for p in pieces] == [p.nbytes for p in listed_pieces]
    row = 0
    for piece, listed in zip(pieces, listed_pieces):
        assert join_encoded([piece]) == encode_payload(listed.timestamps_us, listed.keys,
                                                       listed.values)[0]
        assert piece.min_timestamp_us == min(stamps[row:row + piece.record_count])
        assert piece.max_timestamp_us == max(stamps[row:row + piece.record_count])
        row += piece.record_count


class _Config:
    def __init__(self, frame_bytes_max: int, batch_records_max: int) -> None:
        self.frame_bytes_max = frame_bytes_max
        self.batch_records_max = batch_records_max


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(24, 500), min_size=1, max_size=200), st.integers(1, 3000),
       st.integers(1, 50))
def test_cut_points_are_the_greedy_cut(sizes, budget, records_max):
    expected, lo, total = [], 0, 0
    for row, size in enumerate(sizes):  # the reference: append.cut's loop
        if row > lo and (total + size > budget or row - lo >= records_max):
            expected.append((lo, row))
            lo, total = row, 0
        total += size
    expected.append((lo, len(sizes)))
    got = columnar.cut_points(np.array(sizes, dtype=np.int64), budget=budget,
                              records_max=records_max)
    assert got == expected


@settings(max_examples=100, deadline=None)
@given(RECORDS, st.integers(1, 9), st.integers(0, 100))
def test_partition_numbers_are_log_assign(records, count, next_robin):
    keys = [key for _, key, _ in records]
    numbers, after = columnar.partition_numbers(rows_of(records), count, next_robin)
    robin, expected = next_robin, []
    for key in keys:
        if key is None:
            expected.append(robin % count)
            robin += 1
        else:
            expected.append(partition_for_key(key, count))
    assert numbers.tolist() == expected
    assert after == robin


def test_split_keeps_row_order_within_each_partition():
    rows = columnar.rows_from({"value": pa.array([b"%d" % i for i in range(10)]),
                               "timestamp": np.arange(10)}, record_bytes_max=100)
    groups = columnar.split(rows, np.array([2, 0, 2, 1, 0, 2, 2, 1, 0, 0]))
    assert {p: g.values.to_pylist() for p, g in groups.items()} == {
        0: [b"1", b"4", b"8", b"9"], 1: [b"3", b"7"], 2: [b"0", b"2", b"5", b"6"]}
    assert groups[1].timestamps_us.tolist() == [3, 7]
