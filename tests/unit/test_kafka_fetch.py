"""The Fetch path's NumPy encoder and its kept readers.

`record_encoding.ArraysPlan` (through `encode_arrays`) must give the bytes
`encode_columns`, the per-record encoder, gives for the same records: every shape of
key and value (null, empty, large), timestamps in any order, batches long enough for
two- and three-byte offset deltas, on both of its ways of writing (runs of one layout,
and rows of mixed layouts). `fetching.FetchCursors` must give what a new reader per
Fetch gives (batches.read), whatever the budget, and start anew where a kept reader
would give what the partition no longer has.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

import streamlog
from streamlog.kafka import codec, record_decoding, record_encoding
from streamlog.kafka.errors import ErrorCode
from streamlog.kafka.batches import read as read_batches
from streamlog.kafka.fetching import FetchCursors

# -- the array encoder -------------------------------------------------------------------------


def _encode_both(rng: random.Random, base: int, stamps, keys, values, producer=None):
    """(encode_arrays' bytes, encode_columns' bytes, the plan) for one batch."""
    producer = producer or {}
    expected = record_encoding.encode_columns(base, list(range(len(values))), stamps, keys,
                                              values, **producer)
    key_lengths = [-1 if k is None else len(k) for k in keys]
    value_lengths = [-1 if v is None else len(v) for v in values]
    plan = record_encoding.ArraysPlan(stamps, key_lengths, value_lengths)
    got = plan.encode(base, b"".join(k for k in keys if k), b"".join(v for v in values if v),
                      **producer)
    assert plan.size == len(got)
    return bytes(got), expected, plan


def _bytes(rng: random.Random, size: int | None) -> bytes | None:
    return None if size is None else rng.randbytes(size)


def test_array_encoder_matches_the_record_encoder_on_random_records():
    rng = random.Random(3)
    shapes = [None, 0, 1, 16, 63, 64, 100, 8191, 8192, 20_000]
    for trial in range(150):
        count = rng.choice([1, 2, 5, 63, 64, 65, 300])
        stamps = [rng.randint(-10 ** rng.randint(0, 12), 10 ** rng.randint(0, 13))
                  for _ in range(count)]
        keys = [_bytes(rng, rng.choice(shapes)) for _ in range(count)]
        values = [_bytes(rng, rng.choice(shapes)) for _ in range(count)]
        producer = {} if trial % 3 else {"producer_id": rng.randint(0, 1 << 40),
                                         "producer_epoch": rng.randint(0, 32767),
                                         "base_sequence": rng.randint(0, 1 << 30)}
        got, expected, _plan = _encode_both(rng, trial * 1000, stamps, keys, values, producer)
        assert got == expected


@pytest.mark.parametrize("key_size,value_size", [(16, 100), (None, 0), (0, None),
                                                 (8, 20_000), (None, None)])
def test_array_encoder_in_runs_of_one_layout_matches_the_record_encoder(key_size, value_size):
    rng = random.Random(key_size or 0)
    count = 9000  # offset deltas of one, two and three bytes
    start = 1_700_000_000_000
    stamps = [start + i // 300 + rng.randint(-3, 3) for i in range(count)]  # out of order
    keys = [_bytes(rng, key_size) for _ in range(count)]
    values = [_bytes(rng, value_size) for _ in range(count)]
    got, expected, plan = _encode_both(rng, 42, stamps, keys, values)
    assert plan.layout_runs() is not None  # written as runs: the 2-D way
    assert got == expected


def test_array_encoder_with_a_few_odd_rows_among_runs_matches_the_record_encoder():
    rng = random.Random(5)
    count = 4096
    stamps = [1_000 + i for i in range(count)]
    keys = [b"k" * 16 for _ in range(count)]
    values = [b"v" * 100 for _ in range(count)]
    for row in rng.sample(range(count), 5):  # tombstones, null keys, longer values
        choice = rng.randrange(3)
        if choice == 0:
            values[row] = None
        elif choice == 1:
            keys[row] = None
        else:
            values[row] = rng.randbytes(300)
    stamps[100] = -5  # one far back: every timestamp delta grows
    got, expected, plan = _encode_both(rng, 7, stamps, keys, values)
    assert plan.layout_runs() is not None
    assert got == expected
    mixed = [rng.randbytes(rng.randint(0, 200)) for _ in range(count)]
    got, expected, plan = _encode_both(rng, 7, stamps, keys, mixed)
    assert plan.layout_runs() is None  # no long runs: rows put one by one
    assert got == expected


def test_array_encoder_takes_numpy_columns_and_memoryviews():
    stamps = np.array([5, 3, 9], dtype=np.int64)
    key_lengths = np.array([2, -1, 0], dtype=np.int32)
    value_lengths = np.array([1, 3, -1], dtype=np.int32)
    got = record_encoding.encode_arrays(9, stamps, key_lengths, memoryview(b"ab"),
                                        value_lengths, memoryview(b"xyzw")[:4])
    assert bytes(got) == record_encoding.encode_columns(
        9, [0, 1, 2], [5, 3, 9], [b"ab", None, b""], [b"x", b"yzw", None])


# -- kept readers ------------------------------------------------------------------------------

def _records(chunks) -> list:
    """What a consumer sees of Fetch answers: each record's kind, offset, timestamp,
    key, value and headers."""
    out = []
    for chunk in chunks:
        for batch in record_decoding.decode_batches(bytes(chunk)):
            out += [("control" if batch.is_control else "data",
                     batch.base_offset + r.offset_delta, r.timestamp_ms, r.key, r.value,
                     r.headers) for r in batch.records]
    return out


def _fill_log(log, rng: random.Random) -> None:
    """Frames of every kind: plain columns, headers, tombstones, an aborted and a
    committed transaction, and a large batch cut into several Kafka batches."""
    log.create_stream("t", 1)
    log.append_batch_sync("t", [rng.randbytes(100) for _ in range(5000)],
                          keys=[rng.randbytes(16) for _ in range(5000)], partition=0)
    log.append_batch_sync("t", [b"h1", None, b""], keys=[b"a", b"b", None], partition=0,
                          headers=[[("x", b"1")], [], [("y", None)]])
    aborted = log.new_txn_id()
    log.append_batch_sync("t", [b"gone"] * 50, partition=0, txn_id=aborted)
    log.abort_txn("t", 0, aborted)
    kept = log.new_txn_id()
    log.append_batch_sync("t", [b"kept"] * 50, partition=0, txn_id=kept)
    log.commit_txn("t", 0, kept)
    log.append_batch_sync("t", [None if i % 7 == 0 else rng.randbytes(rng.randint(0, 300))
                                for i in range(3000)], partition=0,
                          timestamps_us=[rng.randint(0, 10 ** 12) for _ in range(3000)])


def _consume(read, end: int, max_bytes: int, committed: bool) -> list:
    """Fetch after Fetch from offset 0, as a consumer does: the next from the offset
    after the last batch it got."""
    out, offset = [], 0
    while offset < end:
        got = _records(read(offset, max_bytes, committed))
        assert got, f"no progress at {offset}"
        out += got
        offset = got[-1][1] + 1
    return out


@pytest.mark.parametrize("committed", [False, True])
def test_kept_readers_give_what_a_new_reader_per_fetch_gives(tmp_path, committed):
    with streamlog.open_log(tmp_path / "log") as log:
        _fill_log(log, random.Random(1))
        end = log.end_offset("t", 0)
        whole = _records(read_batches(log, "t", 0, 0, 1 << 30, committed, at_least_one=True))
        cursors = FetchCursors()
        for max_bytes in (300, 50_000, 700_000):
            fresh = _consume(lambda offset, size, c: read_batches(
                log, "t", 0, offset, size, c, at_least_one=True), end, max_bytes, committed)
            kept = _consume(lambda offset, size, c: cursors.read(
                log, "t", 0, offset, size, c, at_least_one=True), end, max_bytes, committed)
            assert kept == fresh == whole
            assert len(cursors) == 0  # at the end the reader closed
        if not committed:
            assert any(kind == "control" for kind, *_rest in whole)
            assert any(value is None for *_rest, value, _headers in whole)


def test_a_kept_reader_goes_on_and_is_bounded(tmp_path):
    now = [0.0]
    with streamlog.open_log(tmp_path / "log") as log:
        _fill_log(log, random.Random(2))
        cursors = FetchCursors(cursors_max=2, idle_s=5, clock=lambda: now[0])
        first = _records(cursors.read(log, "t", 0, 0, 100_000, False, at_least_one=True))
        assert len(cursors) == 1
        after = first[-1][1] + 1
        second = _records(cursors.read(log, "t", 0, after, 100_000, False, at_least_one=True))
        assert second[0][1] == after and len(cursors) == 1  # taken, and kept again
        for offset in (10, 20, 30):  # other consumers: the oldest reader closes
            cursors.read(log, "t", 0, offset, 1000, False, at_least_one=True)
        assert len(cursors) == 2
        now[0] = 4.0
        assert cursors.expire() == 0
        now[0] = 10.0
        assert cursors.expire() == 2 and len(cursors) == 0
        cursors.read(log, "t", 0, 0, 1000, False, at_least_one=True)
        cursors.close()
        assert len(cursors) == 0


def test_a_kept_reader_is_not_used_past_a_truncate_or_a_deleted_stream(tmp_path):
    with streamlog.open_log(tmp_path / "log") as log:
        log.create_stream("t", 1)
        log.append_batch_sync("t", [b"old-%d" % i for i in range(6000)], partition=0)
        cursors = FetchCursors()
        first = _records(cursors.read(log, "t", 0, 0, 30_000, False, at_least_one=True))
        after = first[-1][1] + 1
        assert len(cursors) == 1 and after < 6000
        log.truncate_after("t", 0, after + 9)  # cut what the kept reader holds...
        log.append_batch_sync("t", [b"new-%d" % i for i in range(100)], partition=0)
        got = _records(cursors.read(log, "t", 0, after, 1 << 20, False, at_least_one=True))
        fresh = _records(read_batches(log, "t", 0, after, 1 << 20, False, at_least_one=True))
        assert got == fresh  # ...so it was not used: the new records come
        assert [r[4] for r in got] == [b"old-%d" % i for i in range(after, after + 10)] + [
            b"new-%d" % i for i in range(100)]
        cut_above = _records(cursors.read(log, "t", 0, 0, 300, False, at_least_one=True))
        log.truncate_after("t", 0, 5000)  # a cut above what it gave out: it goes on
        assert len(cursors) == 1
        more = _records(cursors.read(log, "t", 0, cut_above[-1][1] + 1, 300, False,
                                     at_least_one=True))
        assert more[0][1] == cut_above[-1][1] + 1
        log.delete_stream("t")
        log.create_stream("t", 1)
        log.append_batch_sync("t", [b"again-%d" % i for i in range(6000)], partition=0)
        again = _records(cursors.read(log, "t", 0, more[-1][1] + 1, 300, False,
                                      at_least_one=True))
        assert again[0][4] == b"again-%d" % (more[-1][1] + 1)


# -- the response, in parts ---------------------------------------------------------------------

@pytest.mark.parametrize("version", [4, 11, 12])
@pytest.mark.parametrize("sizes", [[], [10, 20], [70_000], [100, 70_000, 5, 300_000]])
def test_a_fetch_response_in_parts_is_the_response_in_bytes(version, sizes):
    rng = random.Random(version)
    chunks = [rng.randbytes(size) for size in sizes]
    request = codec.Request(1, version, 77, "c", None)

    def response(records):
        return codec.build(codec.response_schema(request), error_code=ErrorCode.none,
                           session_id=0, responses=[{"topic": "t", "partitions": [
                               {"partition_index": 0, "error_code": ErrorCode.none,
                                "high_watermark": 9, "last_stable_offset": 9,
                                "log_start_offset": 0, "aborted_transactions": None,
                                "preferred_read_replica": -1, "records": records}]}])

    whole = codec.encode_response(request, response(b"".join(chunks)))
    arrays = [np.frombuffer(chunk, dtype=np.uint8) for chunk in chunks]
    parts = codec.encode_response_parts(request, response(codec.Pieces(arrays)))
    assert b"".join(parts) == whole
    assert codec.encode_response(request, response(codec.Pieces(arrays))) == whole
    for array in arrays:  # large records are parts of their own, not copied
        uncopied = any(np.shares_memory(np.frombuffer(part, dtype=np.uint8), array)
                       for part in parts)
        assert uncopied == (sum(sizes) >= 65536)
