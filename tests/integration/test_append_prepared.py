"""Log.append_prepared: records already in the writer's form (the daemon's APPEND path)
land as one frame, and the log still refuses what a frame or a transaction cannot take,
appending nothing."""

from __future__ import annotations

import numpy as np
import pytest

import streamlog
from streamlog.encoder import Piece
from streamlog.payload import EncodedRows
from streamlog.records import RecordKind

STREAM = "p"


@pytest.fixture
def log(open_logs, log_dir):
    opened = open_logs(log_dir, record_bytes_max=1024, frame_bytes_max=64 * 1024,
                       batch_records_max=100)
    opened.create_stream(STREAM, partitions=2)
    return opened


def encoded(values, keys, timestamps_us, txn_id: int = 0) -> EncodedRows:
    stamps = np.asarray(timestamps_us, dtype="<i8")
    key_lengths = np.asarray([-1 if k is None else len(k) for k in keys], dtype="<i4")
    value_lengths = np.asarray([len(v) for v in values], dtype="<i4")
    nbytes = sum(map(len, values)) + sum(len(k) for k in keys if k) + 24 * len(values)
    return EncodedRows(stamps, key_lengths, value_lengths, b"".join(k for k in keys if k),
                       b"".join(values), int(stamps.min()), int(stamps.max()), nbytes, txn_id)


def listed(values, keys, timestamps_us, kinds=None, txn_id: int = 0) -> Piece:
    nbytes = sum(map(len, values)) + sum(len(k) for k in keys if k) + 24 * len(values)
    return Piece(list(timestamps_us), list(keys), list(values), kinds, None, nbytes, txn_id)


def records(log, partition: int = 1):
    return [(r.offset, r.timestamp_us, r.key, r.value, r.kind)
            for r in log.reader(STREAM, partition, data_only=False, read_committed=False)]


async def test_encoded_rows_land_as_given(log):
    result = await log.append_prepared(STREAM, 1, encoded([b"v0", b"", b"v2"],
                                                          [b"k", None, b""], [5, 6, 7]))
    assert result.ranges == {1: (0, 2)} and result.records == 3
    assert records(log) == [(0, 5, b"k", b"v0", RecordKind.DATA),
                            (1, 6, None, b"", RecordKind.DATA),
                            (2, 7, b"", b"v2", RecordKind.DATA)]
    assert log.end_offset(STREAM, 0) == 0  # the named partition only


async def test_listed_records_may_carry_control_kinds(log):
    piece = listed([b"d", b"note"], [None, b"n"], [1, 2],
                   kinds=[int(RecordKind.DATA), int(RecordKind.CHECKPOINT)])
    assert (await log.append_prepared(STREAM, 1, piece)).ranges == {1: (0, 1)}
    assert [r[4] for r in records(log)] == [RecordKind.DATA, RecordKind.CHECKPOINT]


async def test_under_an_open_transaction_the_records_wait_for_its_commit(log):
    txn = log.new_txn_id()
    await log.append_prepared(STREAM, 1, encoded([b"t"], [None], [3], txn_id=txn))
    assert log.open_transactions(STREAM, 1) == {txn: 0}
    assert list(log.reader(STREAM, 1)) == []  # read_committed
    log.commit_txn(STREAM, 1, txn)
    assert [r.value for r in log.reader(STREAM, 1)] == [b"t"]


@pytest.mark.parametrize("piece, match", [
    (encoded([b"x" * 1025], [None], [1]), "record 0 is 1025 bytes; the limit is 1024"),
    (encoded([b"x" * 1000], [b"k" * 30], [1]), "record 0 is 1030 bytes"),
    (listed([b"ok", b"x" * 1030], [None, None], [1, 2]), "record 1 is 1030 bytes"),
    (encoded([b"x"] * 101, [None] * 101, range(101)), "must fit one frame: 101 records"),
    (listed([b"x" * 1000] * 40, [None] * 40, range(40)), "must fit one frame: 40 records"),
    (encoded([b"x"], [None], [-(1 << 63)]), "above int64's minimum"),
    (listed([b"x"], [None], [-(1 << 63)]), "above its minimum"),
    (listed([b"x"], [None], [1], kinds=[int(RecordKind.PRODUCER)]),
     "kind PRODUCER are written by init_producer and begin_txn only"),
])
async def test_what_a_frame_cannot_take_is_refused_and_nothing_lands(log, piece, match):
    with pytest.raises(streamlog.InvalidAppend, match=match):
        await log.append_prepared(STREAM, 1, piece)
    assert log.end_offset(STREAM, 1) == 0


async def test_a_transaction_that_ended_takes_no_more(log):
    txn = log.new_txn_id()
    log.append_batch_sync(STREAM, [b"a"], partition=1, txn_id=txn)
    log.abort_txn(STREAM, 1, txn)
    with pytest.raises(streamlog.InvalidArgument, match="is aborted"):
        await log.append_prepared(STREAM, 1, encoded([b"b"], [None], [1], txn_id=txn))
    assert log.end_offset(STREAM, 1) == 2  # the record and the marker


async def test_wrong_targets_and_pieces_are_refused(log, log_dir, open_logs):
    piece = encoded([b"x"], [None], [1])
    with pytest.raises(streamlog.UnknownStream):
        await log.append_prepared("nope", 0, piece)
    with pytest.raises(streamlog.InvalidArgument, match=r"has partitions 0\.\.1"):
        await log.append_prepared(STREAM, 2, piece)
    with pytest.raises(streamlog.InvalidArgument, match="got list"):
        await log.append_prepared(STREAM, 0, [b"x"])
    view = open_logs(log_dir, readonly=True)
    with pytest.raises(streamlog.ReadOnlyLog):
        await view.append_prepared(STREAM, 0, piece)
    assert log.end_offset(STREAM, 0) == 0
