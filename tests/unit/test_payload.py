"""payload.py and arrowconv.py: the columnar batch payload. Pure: no disk.

A payload is built from parallel columns, wrapped in a frame, decoded back to columns,
and turned into Records or an Arrow RecordBatch; the two views must agree row for row.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamlog.arrowconv import SCHEMA, SCHEMA_WITH_HEADERS, columns_to_arrow
from streamlog.errors import CorruptFrame
from streamlog.frame import (CODEC_NONE, CODEC_ZSTD, FLAG_HAS_CONTROL, FLAG_HAS_HEADERS,
                             decode_frame, encode_frame)
from streamlog.payload import (NO_TIME, advance_hwm, columns_to_records, compress,
                               decode_columns, decode_headers, encode_headers,
                               encode_payload, encode_payload_columns, frame_time_us,
                               running_max)
from streamlog.records import Record, RecordKind


def frame_of(timestamps, keys, values, kinds=None, headers=None, *, base_offset=0,
             txn_id=0, zstd=False):
    raw, flags = encode_payload(timestamps, keys, values, kinds, headers)
    stored = raw
    if zstd:
        stored = zstandard.ZstdCompressor(level=1).compress(raw)
        flags |= CODEC_ZSTD
    data = encode_frame(base_offset=base_offset, record_count=len(values),
                        min_timestamp_us=min(timestamps), max_timestamp_us=max(timestamps),
                        txn_id=txn_id, flags=flags, raw_bytes=len(raw), payload=stored)
    return decode_frame(data)


def records_of(timestamps, keys, values, kinds=None, headers=None, *, base_offset=0,
               partition=0, txn_id=0):
    kinds = kinds or [0] * len(values)
    headers = headers or [()] * len(values)
    return [Record(partition, base_offset + i, t, k, v, RecordKind(kind), tuple(h), txn_id)
            for i, (t, k, v, kind, h) in enumerate(zip(timestamps, keys, values, kinds,
                                                      headers))]


def arrow_rows(batch: pa.RecordBatch):
    """(partition, offset, timestamp_us, key, value) rows; timestamps read as int64
    (to_pylist would turn them into datetimes, which cannot hold every int64)."""
    return list(zip(batch.column("partition").to_pylist(), batch.column("offset").to_pylist(),
                    batch.column("timestamp").cast(pa.int64()).to_pylist(),
                    batch.column("key").to_pylist(), batch.column("value").to_pylist()))


def record_rows(records):
    return [(r.partition, r.offset, r.timestamp_us, r.key, r.value) for r in records]


# -- round trips ----------------------------------------------------------------------


@pytest.mark.parametrize("zstd", [False, True])
def test_keys_none_empty_and_binary_round_trip(zstd):
    keys = [None, b"", b"\x00\xff\x00", None, b"k" * 300]
    values = [b"", b"v1", bytes(range(256)), b"\x00", b"last"]
    timestamps = [5, -3, 5, 1 << 50, 0]
    frame = frame_of(timestamps, keys, values, base_offset=40, txn_id=9, zstd=zstd)
    assert frame.codec == (CODEC_ZSTD if zstd else CODEC_NONE)
    columns = decode_columns(frame)
    assert len(columns) == 5
    assert columns.timestamps_us.tolist() == timestamps
    assert columns.key_lengths.tolist() == [-1, 0, 3, -1, 300]
    assert columns.kinds is None
    assert columns.headers is None
    got = list(columns_to_records(columns, partition=3))
    assert got == records_of(timestamps, keys, values, base_offset=40, partition=3, txn_id=9)
    assert got[0].key is None
    assert got[1].key == b""


def test_headers_round_trip_and_set_the_flag():
    headers = [(("a", b"1"),), (), (("ünïcode", b""), ("b", b"\x00" * 10)), ()]
    values = [b"w", b"x", b"y", b"z"]
    raw, flags = encode_payload([1, 2, 3, 4], [None] * 4, values, None, headers)
    assert flags & FLAG_HAS_HEADERS
    assert not flags & FLAG_HAS_CONTROL
    frame = frame_of([1, 2, 3, 4], [None] * 4, values, None, headers)
    got = list(columns_to_records(decode_columns(frame), 0))
    assert [r.headers for r in got] == [tuple(h) for h in headers]


def test_all_empty_headers_are_not_stored():
    raw_without, flags_without = encode_payload([1, 2], [None, None], [b"a", b"b"])
    raw_empty, flags_empty = encode_payload([1, 2], [None, None], [b"a", b"b"], None, [(), ()])
    assert flags_empty == flags_without == 0
    assert raw_empty == raw_without


def test_control_kinds_round_trip_and_set_the_flag():
    kinds = [0, int(RecordKind.COMMIT), 0, int(RecordKind.G_OPEN), int(RecordKind.G_CHECK),
             int(RecordKind.ABORT), int(RecordKind.CHECKPOINT)]
    n = len(kinds)
    values = [b"v%d" % i for i in range(n)]
    frame = frame_of(list(range(n)), [None] * n, values, kinds)
    assert frame.has_control
    columns = decode_columns(frame)
    everything = list(columns_to_records(columns, 0, data_only=False))
    assert [r.kind for r in everything] == [RecordKind(k) for k in kinds]
    assert [r.offset for r in everything] == list(range(n))
    data = list(columns_to_records(columns, 0, data_only=True))
    assert [r.offset for r in data] == [0, 2]
    assert all(r.kind is RecordKind.DATA for r in data)


def test_all_data_kinds_are_not_stored():
    _, flags = encode_payload([1], [None], [b"a"], [0])
    assert not flags & FLAG_HAS_CONTROL


def test_records_slice_start_stop():
    n = 6
    frame = frame_of(list(range(n)), [b"k%d" % i for i in range(n)],
                     [b"v%d" % i for i in range(n)], base_offset=100)
    columns = decode_columns(frame)
    got = list(columns_to_records(columns, 0, 2, 5))
    assert [r.offset for r in got] == [102, 103, 104]
    assert [r.key for r in got] == [b"k2", b"k3", b"k4"]
    assert list(columns_to_records(columns, 0, 3, 3)) == []


def test_compress_only_when_it_pays():
    compressor = zstandard.ZstdCompressor(level=1)
    repetitive = b"abcd" * 1000
    packed = compress(repetitive, compressor)
    assert packed is not None and len(packed) < len(repetitive)
    assert zstandard.ZstdDecompressor().decompress(packed) == repetitive
    noise = np.random.default_rng(1).bytes(4000)
    assert compress(noise, compressor) is None


def test_running_max():
    columns = decode_columns(frame_of([5, 3, 7, 7, 1, 9], [None] * 6, [b""] * 6))
    assert running_max(columns, None).tolist() == [5, 5, 7, 7, 7, 9]
    assert running_max(columns, 8).tolist() == [8, 8, 8, 8, 8, 9]


def test_control_records_never_move_the_high_water_mark():
    """DESIGN 5: a marker written now (its timestamp the wall clock) leaves the mark."""
    now = 1_800_000_000_000_000
    data, control = RecordKind.DATA, RecordKind.COMMIT
    mixed = frame_of([now, 5, now, 9, 1], [None] * 5, [b""] * 5,
                     kinds=[control, data, control, data, data])
    columns = decode_columns(mixed)
    assert running_max(columns, None).tolist() == [NO_TIME, 5, 5, 9, 9]
    assert running_max(columns, 7).tolist() == [7, 7, 7, 9, 9]
    assert mixed.max_timestamp_us == now  # the header covers every record
    assert frame_time_us(mixed) == 9
    only_markers = frame_of([now], [None], [b""], kinds=[control])
    assert frame_time_us(only_markers) is None
    assert frame_time_us(frame_of([3, 4], [None] * 2, [b""] * 2)) == 4
    assert advance_hwm(None, None) is None and advance_hwm(5, None) == 5
    assert advance_hwm(None, 4) == 4 and advance_hwm(5, 4) == 5 and advance_hwm(5, 6) == 6


def test_headers_codec():
    pairs = (("x", b"1"), ("", b""), ("long", b"v" * 70000))
    assert decode_headers(encode_headers(pairs)) == pairs
    assert encode_headers(()) == b""
    assert decode_headers(b"") == ()


# -- Arrow and Records agree ------------------------------------------------------------


def test_arrow_schema_and_nulls():
    frame = frame_of([1, 2, 3], [None, b"k", b""], [b"a", b"", b"c"], base_offset=7)
    batch = columns_to_arrow(decode_columns(frame), 2, 0, 3)
    assert batch.schema == SCHEMA
    assert batch.column("key").to_pylist() == [None, b"k", b""]
    assert batch.column("key").null_count == 1
    assert batch.column("value").to_pylist() == [b"a", b"", b"c"]
    assert batch.column("offset").to_pylist() == [7, 8, 9]
    assert batch.column("partition").to_pylist() == [2, 2, 2]
    batch.validate(full=True)


def test_arrow_headers_column():
    headers = [(("a", b"1"),), (), (("b", b"2"), ("c", b"3"))]
    frame = frame_of([1, 2, 3], [None] * 3, [b"x", b"y", b"z"], None, headers)
    batch = columns_to_arrow(decode_columns(frame), 0, 0, 3, include_headers=True)
    assert batch.schema == SCHEMA_WITH_HEADERS
    assert batch.column("headers").to_pylist() == [
        [{"key": "a", "value": b"1"}], None,
        [{"key": "b", "value": b"2"}, {"key": "c", "value": b"3"}]]
    plain = frame_of([1], [None], [b"x"])
    batch = columns_to_arrow(decode_columns(plain), 0, 0, 1, include_headers=True)
    assert batch.column("headers").to_pylist() == [None]


def test_arrow_filters_control_records_when_data_only():
    kinds = [1, 0, 3, 0, 0, 4]
    n = len(kinds)
    frame = frame_of(list(range(n)), [None] * n, [b"%d" % i for i in range(n)], kinds)
    columns = decode_columns(frame)
    data = columns_to_arrow(columns, 0, 0, n, data_only=True)
    assert data.column("offset").to_pylist() == [1, 3, 4]
    everything = columns_to_arrow(columns, 0, 0, n, data_only=False)
    assert everything.column("offset").to_pylist() == list(range(n))
    sliced = columns_to_arrow(columns, 0, 2, 5, data_only=True)
    assert sliced.column("offset").to_pylist() == [3, 4]


rows = st.lists(st.tuples(
    st.integers(-(1 << 62), 1 << 62),
    st.one_of(st.none(), st.binary(max_size=20)),
    st.binary(max_size=40),
    st.sampled_from([0, 0, 0, 1, 2, 3, 4, 5]),
    st.lists(st.tuples(st.text(max_size=5), st.binary(max_size=5)), max_size=2)),
    min_size=1, max_size=30)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows, st.data())
def test_payload_round_trip_and_arrow_agrees_with_records(batch, data):
    timestamps = [r[0] for r in batch]
    keys = [r[1] for r in batch]
    values = [r[2] for r in batch]
    kinds = [r[3] for r in batch]
    headers = [tuple(r[4]) for r in batch]
    n = len(batch)
    base = data.draw(st.integers(0, 1 << 40), "base")
    zstd = data.draw(st.booleans(), "zstd")
    frame = frame_of(timestamps, keys, values, kinds, headers, base_offset=base, zstd=zstd)
    columns = decode_columns(frame)
    everything = list(columns_to_records(columns, 1, data_only=False))
    assert everything == records_of(timestamps, keys, values, kinds, headers,
                                    base_offset=base, partition=1)
    lo = data.draw(st.integers(0, n), "lo")
    hi = data.draw(st.integers(lo, n), "hi")
    for data_only in (True, False):
        records = list(columns_to_records(columns, 1, lo, hi, data_only=data_only))
        batch_arrow = columns_to_arrow(columns, 1, lo, hi, data_only=data_only,
                                       include_headers=True)
        batch_arrow.validate(full=True)
        assert arrow_rows(batch_arrow) == record_rows(records)
        expected_headers = [[{"key": k, "value": v} for k, v in r.headers] or None
                            for r in records]
        assert batch_arrow.column("headers").to_pylist() == expected_headers
        if data_only:
            assert all(r.kind is RecordKind.DATA for r in records)
            assert len(records) == sum(1 for k in kinds[lo:hi] if k == 0)


# -- inconsistent payloads (only a buggy writer makes these: the checksum held) --------


def forged(payload: bytes, *, record_count: int, flags: int = 0, raw_bytes=None):
    return decode_frame(encode_frame(
        base_offset=0, record_count=record_count, min_timestamp_us=0, max_timestamp_us=0,
        txn_id=0, flags=flags, raw_bytes=len(payload) if raw_bytes is None else raw_bytes,
        payload=payload))


def test_lengths_that_do_not_add_up_are_corrupt():
    raw, _ = encode_payload([1], [None], [b"abc"])
    with pytest.raises(CorruptFrame, match="add up"):
        decode_columns(forged(raw + b"x", record_count=1))
    with pytest.raises(CorruptFrame, match="add up"):
        decode_columns(forged(raw[:-1], record_count=1))


def test_payload_shorter_than_its_columns_is_corrupt():
    raw, _ = encode_payload([1], [None], [b"abc"])
    with pytest.raises(CorruptFrame, match="shorter"):
        decode_columns(forged(raw, record_count=10))


def test_negative_length_is_corrupt():
    raw = (np.array([1], "<i8").tobytes() + np.array([-1], "<i4").tobytes()
           + np.array([-5], "<i4").tobytes())
    with pytest.raises(CorruptFrame, match="negative"):
        decode_columns(forged(raw, record_count=1))


def test_raw_length_disagreeing_with_header_is_corrupt():
    raw, _ = encode_payload([1], [None], [b"abc"])
    with pytest.raises(CorruptFrame, match="length"):
        decode_columns(forged(raw, record_count=1, raw_bytes=len(raw) + 1))


def test_bad_zstd_is_corrupt():
    with pytest.raises(CorruptFrame, match="zstd"):
        decode_columns(forged(b"not zstd at all", record_count=1, flags=CODEC_ZSTD,
                              raw_bytes=100))


def test_bad_headers_blob_is_corrupt():
    with pytest.raises(CorruptFrame, match="headers"):
        decode_headers(b"\x05\x00\x01")
    with pytest.raises(CorruptFrame, match="headers"):
        decode_headers(b"\x01\x00\x02\x00\xff\xfe\x00\x00\x00\x00")


@given(rows, st.data())
def test_the_columns_made_while_encoding_are_those_a_reader_decodes(batch, data):
    """The writer hands the live tail the columns it made while encoding
    (encode_payload_columns) instead of decoding its own payload: they must be what a
    reader of the frame decodes, field by field."""
    timestamps = [r[0] for r in batch]
    keys = [r[1] for r in batch]
    values = [r[2] for r in batch]
    kinds = data.draw(st.sampled_from([None, [r[3] for r in batch]]), "kinds")
    headers = data.draw(st.sampled_from([None, [tuple(r[4]) for r in batch]]), "headers")
    base = data.draw(st.integers(0, 1 << 40), "base")
    txn_id = data.draw(st.integers(0, (1 << 64) - 1), "txn_id")
    raw, flags, made = encode_payload_columns(timestamps, keys, values, kinds, headers,
                                              base_offset=base, txn_id=txn_id)
    assert (raw, flags) == encode_payload(timestamps, keys, values, kinds, headers)
    decoded = decode_columns(frame_of(timestamps, keys, values, kinds, headers,
                                      base_offset=base, txn_id=txn_id))
    assert (made.base_offset, made.txn_id, made.producer) == (base, txn_id, None)
    for name in ("timestamps_us", "kinds", "key_lengths", "value_lengths", "header_lengths"):
        mine, theirs = getattr(made, name), getattr(decoded, name)
        assert (mine is None) == (theirs is None), name
        if mine is not None:
            assert mine.dtype == theirs.dtype and mine.tolist() == theirs.tolist(), name
    for name in ("keys", "values", "headers", "raw"):
        mine, theirs = getattr(made, name), getattr(decoded, name)
        assert (mine is None) == (theirs is None), name
        if mine is not None:
            assert bytes(mine) == bytes(theirs), name
    assert list(columns_to_records(made, 3, data_only=False)) == list(
        columns_to_records(decoded, 3, data_only=False))
