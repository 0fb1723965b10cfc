"""Tombstones: a value None, and a header value None, kept apart from b"" (DESIGN 1).

Every way in (append, append_sync, append_batch, append_columns, a Producer) and every
way out (records, Arrow, read_committed, after a reopen, compressed or not) keeps None
as None and b"" as b"". The payload writes None as a value length of -1 and a header
value length of 0xFFFFFFFF under the frame flag FLAG_HAS_NULLS: a payload without None
is byte for byte what it was before (the golden bytes), and the bytes no writer makes
(-1 without the flag, -2, a control record with a None value) are corruption to every
reader and checker of the same bytes.
"""

from __future__ import annotations

import asyncio
import itertools
import pathlib

import numpy as np
import pyarrow as pa
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

import streamlog
from streamlog import CorruptionError, InvalidAppend
from streamlog import frame as frame_module
from streamlog.check import check_partition, open_segments, payload_problem, segment_events
from streamlog.errors import CorruptFrame
from streamlog.frame import (CODEC_ZSTD, FLAG_HAS_CONTROL, FLAG_HAS_HEADERS, FLAG_HAS_NULLS,
                             FLAGS_KNOWN, Frame, decode_frame, encode_frame)
from streamlog.arrowconv import columns_to_arrow
from streamlog.payload import (columns_to_records, decode_columns, decode_headers,
                               encode_headers, encode_payload, encode_payload_columns)
from streamlog.records import RecordKind
from streamlog.wire.codes import LocalProtocolError
from streamlog.wire.columns import (check_headers, columns_to_lists, decode_records,
                                    encode_slice, encode_slices)
from tests.unit.test_golden import FRAME_HEAD, PAYLOAD

STREAM = "s"
VALUES = [None, b"", b"v", None, b""]


def open_log(path, **options):
    return streamlog.open_log(path, fsync="never", **options)


def values_of(log, partition: int = 0, **options) -> list:
    with log.reader(STREAM, partition, **options) as reader:
        return [r.value for r in reader.records()]


def arrow_values(log, partition: int = 0) -> list:
    with log.reader(STREAM, partition) as reader:
        batches = list(reader.arrow())
    return pa.Table.from_batches(batches).column("value").to_pylist()


def partition_dir(path) -> str:
    return str(pathlib.Path(path, "streams", STREAM, "0"))


def stored_flags(path) -> list[int]:
    """The flags of every frame in partition 0's segments, as stored."""
    out = []
    for segment in open_segments(partition_dir(path)):
        out += [event.flags for event in segment_events(segment) if isinstance(event, Frame)]
        segment.close()
    return out


# -- the API, both ways -------------------------------------------------------------------


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_none_and_empty_stay_apart_through_every_append(tmp_path, compression):
    big = b"abc" * 400  # repetitive: zstd pays, so the zstd run stores compressed frames
    with open_log(tmp_path / "log", compression=compression) as log:
        log.create_stream(STREAM, 1)
        log.append_sync(STREAM, None, key=b"k")
        log.append_sync(STREAM, b"")
        asyncio.run(log.append(STREAM, None))
        log.append_batch_sync(STREAM, [big, None, b"", None], keys=[None, b"k", None, b""])
        asyncio.run(log.append_batch(STREAM, (None, big)))
        log.append_columns_sync(STREAM, {"value": pa.array([b"", None, big, None])})
        log.append_columns_sync(STREAM, pa.record_batch(
            {"value": pa.array(["t", None, ""], pa.string()),
             "key": pa.array([None, b"k", None])}))
        with log.producer(STREAM, linger_ms=0) as producer:
            handles = [producer.send(None, key=b"p"), producer.send(b""),
                       producer.send(None, headers={"h": None})]
            producer.flush(timeout=30)
        assert [h.result(0) for h in handles] == [(0, 16), (0, 17), (0, 18)]
        expected = [None, b"", None, big, None, b"", None, None, big, b"", None, big, None,
                    b"t", None, b"", None, b"", None]
        assert values_of(log) == expected
        assert arrow_values(log) == expected
        assert values_of(log, read_committed=False) == expected
        keys = [r.key for r in log.reader(STREAM, 0).records()]
        assert keys[:7] == [b"k", None, None, None, b"k", None, b""]
    flags = stored_flags(tmp_path / "log")
    assert any(f & FLAG_HAS_NULLS for f in flags)
    assert not flags[1] & FLAG_HAS_NULLS  # the b"" record alone: a frame as before
    assert any(f & CODEC_ZSTD for f in flags) == (compression == "zstd")
    with open_log(tmp_path / "log", readonly=True) as log:  # reopened: the same values
        assert values_of(log) == expected
        assert arrow_values(log) == expected
    result = check_partition(STREAM, 0, partition_dir(tmp_path / "log"))
    assert not result.damaged and result.records == len(expected)


def test_header_values_none_and_empty(tmp_path):
    with open_log(tmp_path / "log") as log:
        log.create_stream(STREAM, 1)
        log.append_sync(STREAM, b"v", headers={"a": None, "b": b""})
        log.append_batch_sync(STREAM, [None, b""], headers=[[("x", None), ("x", b"1")], None])
        with log.reader(STREAM, 0) as reader:
            got = [(r.value, r.headers) for r in reader.records()]
        assert got == [(b"v", (("a", None), ("b", b""))),
                       (None, (("x", None), ("x", b"1"))), (b"", ())]
        with log.reader(STREAM, 0) as reader:
            batch = pa.Table.from_batches(list(reader.arrow(include_headers=True)))
        assert batch.column("headers").to_pylist() == [
            [{"key": "a", "value": None}, {"key": "b", "value": b""}],
            [{"key": "x", "value": None}, {"key": "x", "value": b"1"}], None]
        assert batch.column("value").to_pylist() == [b"v", None, b""]
        assert batch.schema.field("value").nullable


def test_a_follower_gets_none_from_the_live_tail(tmp_path):
    """A following reader takes new batches from memory: the columns the writer made
    (lists) or decoded from its own frame (Arrow columns) say None as the file does."""
    with open_log(tmp_path / "log") as log:
        log.create_stream(STREAM, 1)
        with log.reader(STREAM, 0, follow=True) as reader:
            log.append_batch_sync(STREAM, [None, b""], headers=[{"h": None}, None])
            log.append_columns_sync(STREAM, {"value": pa.array([b"", None])})
            got = [(r.value, r.headers) for r in itertools.islice(reader.records(), 4)]
    assert got == [(None, (("h", None),)), (b"", ()), (b"", ()), (None, ())]


def test_tombstones_in_a_transaction_read_committed(tmp_path):
    with open_log(tmp_path / "log") as log:
        log.create_stream(STREAM, 1)
        txn_id = log.new_txn_id()
        log.append_batch_sync(STREAM, [None, b""], partition=0, txn_id=txn_id)
        assert values_of(log) == []  # not committed yet
        log.commit_txn(STREAM, 0, txn_id)
        assert values_of(log) == [None, b""]
        assert arrow_values(log) == [None, b""]


def test_size_counts_a_none_value_as_zero_bytes(tmp_path):
    with open_log(tmp_path / "log", record_bytes_max=4) as log:
        log.create_stream(STREAM, 1)
        log.append_sync(STREAM, None, key=b"kkkk")  # 4 key bytes + 0: within the limit
        log.append_batch_sync(STREAM, [None], keys=[b"kkkk"])
        log.append_columns_sync(STREAM, {"value": pa.array([None], pa.binary()),
                                         "key": pa.array([b"kkkk"])})
        with pytest.raises(InvalidAppend, match="record 0 is 5 bytes"):
            log.append_sync(STREAM, b"v", key=b"kkkk")
        assert values_of(log) == [None, None, None]


def test_arrow_nulls_that_own_bytes_sliced_and_cut_into_frames(tmp_path):
    """Arrow lets a null slot span bytes; the payload gives a None value none. A sliced
    array, several partitions and a cut into several frames keep every None."""
    owning = pa.Array.from_buffers(pa.binary(), 3, [
        pa.py_buffer(np.packbits([1, 0, 1], bitorder="little")),
        pa.py_buffer(np.array([0, 1, 4, 5], dtype=np.int32)), pa.py_buffer(b"aXYZc")],
        null_count=1)
    assert owning.to_pylist() == [b"a", None, b"c"]
    many = pa.array([None if i % 3 == 0 else b"" if i % 3 == 1 else b"x" * 50
                     for i in range(400)], pa.large_binary())
    with open_log(tmp_path / "log", frame_bytes_max=8192, record_bytes_max=1024) as log:
        log.create_stream(STREAM, 2)
        log.append_columns_sync(STREAM, {"value": owning}, partition=0)
        log.append_columns_sync(STREAM, {"value": many.slice(1)}, partition=0)
        log.append_columns_sync(STREAM, {"value": many, "key": pa.array(
            [b"%d" % (i % 7) for i in range(400)])})
        assert values_of(log)[:3] == [b"a", None, b"c"]
        assert values_of(log)[3:402] == many.slice(1).to_pylist()
        routed = sorted(values_of(log)[402:] + values_of(log, 1), key=lambda v: (v is None, v))
        assert routed == sorted(many.to_pylist(), key=lambda v: (v is None, v))
        assert arrow_values(log, 1) == values_of(log, 1)
    assert len(stored_flags(tmp_path / "log")) > 3  # cut into several frames


@pytest.mark.parametrize("call, match", [
    (lambda log: log.append_sync(STREAM, 7), "value of record 0 must be bytes, not int"),
    (lambda log: log.append_sync(STREAM, "text"), "encode"),
    (lambda log: log.append_batch_sync(STREAM, [None, 1.5]),
     "value of record 1 must be bytes, not float"),
    (lambda log: log.append_sync(STREAM, b"v", headers={"h": 3}),
     "headers of record 0 must be"),
    (lambda log: log.append_batch_sync(STREAM, [None], kinds=[RecordKind.CHECKPOINT]),
     "record 0 is None in a CHECKPOINT record"),
    (lambda log: log.append_columns_sync(STREAM, {"value": np.array([b"a", None],
                                                                   dtype=object)}),
     "dtype object"),
])
def test_bad_types_are_still_refused(tmp_path, call, match):
    with open_log(tmp_path / "log") as log:
        log.create_stream(STREAM, 1)
        with pytest.raises(InvalidAppend, match=match):
            call(log)
        assert log.end_offset(STREAM, 0) == 0


def test_a_producer_refuses_a_bad_value_but_takes_none(tmp_path):
    with open_log(tmp_path / "log") as log:
        log.create_stream(STREAM, 1)
        with log.producer(STREAM, linger_ms=0) as producer:
            bad = producer.send(3)
            good = producer.send(None)
            producer.flush(timeout=30)
        assert isinstance(bad.exception(0), InvalidAppend)
        assert good.result(0) == (0, 0)
        assert values_of(log) == [None]


# -- the payload's bytes ------------------------------------------------------------------


def test_a_payload_without_none_is_the_golden_bytes():
    raw, flags = encode_payload([1, 2], [b"k", None], [b"v1", b"value-2"], [0, 1],
                                [[("h", b"x")], ()])
    assert flags == FLAG_HAS_CONTROL | FLAG_HAS_HEADERS  # no FLAG_HAS_NULLS
    assert raw.hex() == PAYLOAD
    data = encode_frame(base_offset=7, record_count=2, min_timestamp_us=1, max_timestamp_us=2,
                        txn_id=5, flags=flags, raw_bytes=len(raw), payload=raw)
    assert data.hex() == FRAME_HEAD + PAYLOAD


def test_the_bytes_of_none():
    """A None value is length -1 and no bytes; a None header value is length
    0xFFFFFFFF and no bytes; the flag says the payload may hold them."""
    assert FLAG_HAS_NULLS == 0b10000 and FLAGS_KNOWN & FLAG_HAS_NULLS
    raw, flags = encode_payload([1, 2], [None, b"k"], [None, b""], None,
                                [[("h", None)], [("h", b"")]])
    assert flags == FLAG_HAS_HEADERS | FLAG_HAS_NULLS
    assert raw.hex() == (
        "0100000000000000" "0200000000000000"  # timestamps
        "ffffffff" "01000000"  # key lengths: none, 1
        "ffffffff" "00000000"  # value lengths: None, b""
        "09000000" "09000000"  # header lengths
        "6b"  # the key; no value bytes at all
        "0100" "0100" "68" "ffffffff"  # (h, None)
        "0100" "0100" "68" "00000000")  # (h, b"")
    assert encode_headers([("h", None)]) == bytes.fromhex("0100010068ffffffff")
    assert decode_headers(bytes.fromhex("0100010068ffffffff"), nulls=True) == (("h", None),)


def forged(payload: bytes, flags: int, *, record_count: int, base_offset: int = 0) -> bytes:
    """A frame whose checksums hold around `payload` (flags as given)."""
    return encode_frame(base_offset=base_offset, record_count=record_count,
                        min_timestamp_us=1, max_timestamp_us=1, txn_id=0, flags=flags,
                        raw_bytes=len(payload), payload=payload)


def _lengths(value_length: int) -> bytes:
    return (np.array([1], "<i8").tobytes() + np.array([-1], "<i4").tobytes()
            + np.array([value_length], "<i4").tobytes())


def _header_without_flag() -> tuple[bytes, int]:
    raw, flags = encode_payload([1], [None], [b"v"], None, [[("h", None)]])
    return raw, flags & ~FLAG_HAS_NULLS


def _control_with_none() -> tuple[bytes, int]:
    raw, flags = encode_payload([1], [None], [None], [int(RecordKind.CHECKPOINT)])
    assert flags == FLAG_HAS_CONTROL | FLAG_HAS_NULLS
    return raw, flags


CORRUPT = {
    "-1 without the flag": (lambda: (_lengths(-1), 0), "negative length"),
    "-2 with the flag": (lambda: (_lengths(-2), FLAG_HAS_NULLS), "negative length"),
    "-2 without the flag": (lambda: (_lengths(-2), 0), "negative length"),
    "null header without the flag": (_header_without_flag, "bad record headers"),
    "control record with None": (_control_with_none, "control record with a None value"),
}


@pytest.mark.parametrize("name", sorted(CORRUPT))
def test_bytes_no_writer_makes_are_corrupt_to_every_reader(tmp_path, name):
    make, reason = CORRUPT[name]
    payload, flags = make()
    frame = decode_frame(forged(payload, flags, record_count=1))
    # the decoder (every reader of a frame: the log's readers, recovery, dump)
    with pytest.raises(CorruptFrame, match=reason):
        list(columns_to_records(decode_columns(frame), 0))
    # verify, dump and repair's judge of a payload
    assert reason in payload_problem(frame)
    # the daemon's wire, both ways: the same payload refused as the peer's fault
    with pytest.raises(LocalProtocolError, match=reason):
        check_headers(decode_records(payload, flags, 1))
    # a log whose segment ends with that frame: a reader stops at it, the check names it
    path = tmp_path / "log"
    with open_log(path) as log:
        log.create_stream(STREAM, 1)
        log.append_sync(STREAM, None)
    segment = pathlib.Path(partition_dir(path), f"{0:020d}.log")
    with open(segment, "ab") as file:
        file.write(forged(payload, flags, record_count=1, base_offset=1))
    result = check_partition(STREAM, 0, partition_dir(path))
    assert result.damaged
    assert [f.offset for f in result.payload_findings] == [1]
    assert reason in result.payload_findings[0].reason
    got = []
    with pytest.raises(CorruptionError, match=reason):
        with open_log(path, readonly=True) as log, log.reader(STREAM, 0) as reader:
            for record in reader.records():
                got.append(record.value)
    # A reader delivers every record before the damage, then raises. A frame with
    # control records is decoded by the open itself (for its data records' high-water
    # mark), which raises there.
    assert got == ([] if flags & FLAG_HAS_CONTROL else [None])


def test_legal_nulls_are_not_corrupt_to_any_checker():
    raw, flags = encode_payload([1, 1], [None, None], [None, b""], [0, 0],
                                [[("h", None)], ()])
    frame = decode_frame(forged(raw, flags, record_count=2))
    assert payload_problem(frame) is None
    columns = decode_records(raw, flags, 2)
    check_headers(columns)
    assert columns_to_lists(columns)[2] == [None, b""]
    assert [r.value for r in columns_to_records(decode_columns(frame), 0)] == [None, b""]


def test_an_older_reader_refuses_a_frame_with_none_and_reads_the_others(monkeypatch):
    """An older streamlog's FLAGS_KNOWN lacks FLAG_HAS_NULLS: it refuses a frame with a
    None as 'unknown flags' rather than taking the -1 for an empty value, and still
    reads every frame without one (written before or after None existed)."""
    with_none = forged(*encode_payload([1], [None], [None]), record_count=1)
    without = forged(*encode_payload([1], [None], [b""]), record_count=1)
    assert decode_frame(with_none).flags == FLAG_HAS_NULLS
    monkeypatch.setattr(frame_module, "FLAGS_KNOWN", FLAGS_KNOWN & ~FLAG_HAS_NULLS)
    with pytest.raises(CorruptFrame, match="unknown flags 0x10"):
        decode_frame(with_none)
    assert [r.value for r in columns_to_records(decode_columns(decode_frame(without)), 0)] \
        == [b""]


def test_wire_slices_carry_the_flag():
    raw, flags = encode_payload([1, 2, 3], [None] * 3, [b"a", None, b""])
    columns = decode_records(raw, flags, 3)
    assert columns.nulls and columns.flags == FLAG_HAS_NULLS
    part, part_flags = encode_slice(columns, 1, 3)
    assert columns_to_lists(decode_records(part, part_flags, 2))[2] == [None, b""]
    part, part_flags = encode_slice(columns, 0, 1)  # no None in it: flag kept, harmless
    assert columns_to_lists(decode_records(part, part_flags, 1))[2] == [b"a"]
    plain = decode_records(*encode_payload([4], [None], [b"z"]), 1)
    joined, joined_flags = encode_slices([(columns, 1, 3), (plain, 0, 1)])
    assert joined_flags == FLAG_HAS_NULLS
    assert columns_to_lists(decode_records(joined, joined_flags, 3))[2] == [None, b"", b"z"]


def _data_only_none(row):
    """A None value only in a data record (kind 0): control records carry a value."""
    stamp, key, value, kind, headers = row
    return (stamp, key, b"" if value is None and kind else value, kind, headers)


null_rows = st.lists(st.tuples(
    st.integers(-(1 << 62), 1 << 62),
    st.one_of(st.none(), st.binary(max_size=8)),
    st.one_of(st.none(), st.just(b""), st.binary(max_size=20)),
    st.sampled_from([0, 0, 0, 1, 3]),
    st.lists(st.tuples(st.sampled_from(["h", "ü"]),
                       st.one_of(st.none(), st.binary(max_size=4))), max_size=2),
).map(_data_only_none), min_size=1, max_size=20)


@settings(max_examples=150, deadline=None)
@given(null_rows, st.booleans(), st.data())
def test_round_trip_of_any_mix_of_none_and_bytes(batch, zstd, data):
    """Records, Arrow, the columns the writer makes and the wire's slices all agree,
    None for None and b"" for b"", compressed or not."""
    timestamps, keys, values, kinds, headers = (list(column) for column in zip(*batch))
    raw, flags, made = encode_payload_columns(timestamps, keys, values, kinds, headers)
    has_none = None in values or any(v is None for h in headers for _, v in h)
    assert bool(flags & FLAG_HAS_NULLS) == has_none
    stored = zstandard.ZstdCompressor(level=1).compress(raw) if zstd else raw
    frame = decode_frame(encode_frame(
        base_offset=0, record_count=len(batch), min_timestamp_us=min(timestamps),
        max_timestamp_us=max(timestamps), txn_id=0, flags=flags | (CODEC_ZSTD if zstd else 0),
        raw_bytes=len(raw), payload=stored))
    assert payload_problem(frame) is None
    columns = decode_columns(frame)
    records = list(columns_to_records(columns, 0, data_only=False))
    assert [(r.key, r.value, r.headers) for r in records] == [
        (k, v, tuple(h)) for k, v, h in zip(keys, values, headers)]
    assert [(r.key, r.value) for r in columns_to_records(made, 0, data_only=False)] == [
        (k, v) for k, v in zip(keys, values)]
    lo = data.draw(st.integers(0, len(batch) - 1), "lo")
    hi = data.draw(st.integers(lo + 1, len(batch)), "hi")
    arrow = columns_to_arrow(columns, 0, lo, hi, data_only=False, include_headers=True)
    arrow.validate(full=True)
    assert arrow.column("value").to_pylist() == values[lo:hi]
    assert arrow.column("headers").to_pylist() == [
        [{"key": k, "value": v} for k, v in h] or None for h in headers[lo:hi]]
    part, part_flags = encode_slice(columns, lo, hi)
    sliced = decode_records(part, part_flags, hi - lo)
    check_headers(sliced)
    assert columns_to_lists(sliced)[1:3] == (keys[lo:hi], values[lo:hi])
