"""Log.append_columns (columnar.py) on real files: what it appends reads back exactly as
what append_batch appends for the same records (offsets, timestamps, keys, values, frame
boundaries, partitions), and bad input raises with a sentence and appends nothing."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pyarrow as pa
import pytest

from streamlog import InvalidAppend, InvalidArgument, ReadOnlyLog, open_log
from streamlog.testing.clock import ManualClock
from streamlog.txn import TxnState

STREAM = "s"
VALUES = [b"v0", b"", b"value two", b"\x00bin\x00", b"", b"v5"]
KEYS = [b"k0", None, b"", b"k3", None, b"k5"]
STAMPS = [100, 90, 100, -7, 2_000_000_000_000_000, 5]


def contents(log, stream: str = STREAM) -> dict[int, list[tuple]]:
    return {p: [(r.offset, r.timestamp_us, r.key, r.value, r.headers)
                for r in log.reader(stream, p)]
            for p in range(log.partition_count(stream))}


def batch_sizes(log, partition: int = 0) -> list[int]:
    """Records per stored batch (reader.arrow() yields one RecordBatch per log batch)."""
    return [b.num_rows for b in log.reader(STREAM, partition).arrow()]


@pytest.fixture
def pair(tmp_path, open_logs):
    """Two logs opened alike: `columns` for append_columns, `batch` for append_batch."""
    def make(partitions: int = 1, **options):
        options.setdefault("fsync", "never")
        logs = []
        for name in ("columns", "batch"):
            log = open_logs(str(tmp_path / name), **options)
            log.create_stream(STREAM, partitions=partitions)
            logs.append(log)
        return logs
    return make


def as_table_in_chunks(batch: pa.RecordBatch) -> pa.Table:
    """`batch` as a Table whose columns are chunked at different rows."""
    arrays = {}
    for i, name in enumerate(batch.schema.names):
        column = batch.column(name)
        cut = 1 + i % (len(column) - 1)
        arrays[name] = pa.chunked_array([column.slice(0, cut), column.slice(cut)])
    table = pa.table(arrays)
    assert all(table.column(n).num_chunks == 2 for n in table.schema.names)
    return table


def reference_batch() -> pa.RecordBatch:
    return pa.record_batch({"value": pa.array(VALUES, pa.binary()),
                            "key": pa.array(KEYS, pa.binary()),
                            "timestamp": pa.array(STAMPS, pa.int64())})


INPUTS = {
    "record-batch": reference_batch,
    "table-chunks": lambda: as_table_in_chunks(reference_batch()),
    "large-binary": lambda: reference_batch().cast(pa.schema(
        [("value", pa.large_binary()), ("key", pa.large_binary()),
         ("timestamp", pa.int64())])),
    "dict-arrow": lambda: {"value": pa.array(VALUES), "key": pa.array(KEYS),
                           "timestamp": np.array(STAMPS, dtype=np.int64)},
    "sliced": lambda: pa.record_batch({
        "value": pa.array([b"junk", *VALUES, b"junk"]),
        "key": pa.array([b"junk", *KEYS, None]),
        "timestamp": pa.array([1, *STAMPS, 1], pa.int64())}).slice(1, len(VALUES)),
}


@pytest.mark.parametrize("make_input", INPUTS.values(), ids=INPUTS.keys())
def test_round_trip_matches_append_batch(pair, make_input):
    columns, batch = pair()
    data = make_input()
    result = columns.append_columns_sync(STREAM, data)
    expected = batch.append_batch_sync(STREAM, VALUES, keys=KEYS, timestamps_us=STAMPS)
    assert result == expected == ((({0: (0, len(VALUES) - 1)}), len(VALUES)))
    assert contents(columns) == contents(batch)
    assert [r.value for r in columns.reader(STREAM, 0)] == VALUES
    assert [r.key for r in columns.reader(STREAM, 0)] == KEYS
    got = pa.Table.from_batches(list(columns.reader(STREAM, 0).arrow()))
    want = pa.Table.from_batches(list(batch.reader(STREAM, 0).arrow()))
    assert got.equals(want)


def test_async_and_sync_agree_and_offsets_continue(pair):
    columns, batch = pair()
    first = asyncio.run(columns.append_columns(STREAM, reference_batch()))
    second = columns.append_columns_sync(STREAM, reference_batch())
    n = len(VALUES)
    assert first.ranges == {0: (0, n - 1)}
    assert second.ranges == {0: (n, 2 * n - 1)}
    batch.append_batch_sync(STREAM, VALUES, keys=KEYS, timestamps_us=STAMPS)
    batch.append_batch_sync(STREAM, VALUES, keys=KEYS, timestamps_us=STAMPS)
    assert contents(columns) == contents(batch)


def test_null_key_that_owns_bytes_is_stored_as_no_key(pair):
    """Arrow allows a null slot whose offsets span bytes; the payload must not keep them."""
    columns, _ = pair()
    offsets = np.array([0, 2, 5, 7], dtype=np.int32)  # row 1 is null but spans b"XYZ"
    keys = pa.Array.from_buffers(pa.binary(), 3, [
        pa.py_buffer(np.packbits([1, 0, 1], bitorder="little")), pa.py_buffer(offsets),
        pa.py_buffer(b"k0XYZk2")], null_count=1)
    assert keys.to_pylist() == [b"k0", None, b"k2"]
    columns.append_columns_sync(STREAM, {"value": pa.array([b"a", b"b", b"c"]), "key": keys})
    assert [(r.key, r.value) for r in columns.reader(STREAM, 0)] == [
        (b"k0", b"a"), (None, b"b"), (b"k2", b"c")]


def test_string_columns_store_their_utf8_bytes(pair):
    columns, batch = pair()
    text = ["h\u00e9llo", "", "\u2603"]
    for string_type in (pa.string(), pa.large_string(), pa.string_view()):
        columns.append_columns_sync(STREAM, {
            "value": pa.array(text, string_type),
            "key": pa.array(["a", None, "c"], string_type),
            "timestamp": pa.array([1, 2, 3], pa.int64())})
        batch.append_batch_sync(STREAM, [t.encode() for t in text], keys=[b"a", None, b"c"],
                                timestamps_us=[1, 2, 3])
    assert contents(columns) == contents(batch)
    assert [r.value for r in columns.reader(STREAM, 0)][:3] == [b"h\xc3\xa9llo", b"",
                                                               b"\xe2\x98\x83"]


def test_numpy_bytes_follow_numpy_items(pair):
    """An 'S<n>' array stores what array[i] returns: trailing NULs dropped, inner kept."""
    columns, _ = pair()
    values = np.array([b"ab", b"a\x00b", b"", b"full"], dtype="S4")
    keys = np.array([b"k", b"", b"kk", b"k\x00"], dtype="S2")
    columns.append_columns_sync(STREAM, {"value": values, "key": keys,
                                         "timestamp": np.arange(4, dtype=np.int32)})
    got = [(r.timestamp_us, r.key, r.value) for r in columns.reader(STREAM, 0)]
    assert got == [(0, b"k", b"ab"), (1, b"", b"a\x00b"), (2, b"kk", b""),
                   (3, b"k", b"full")]
    assert [r.value for r in columns.reader(STREAM, 0)] == values.tolist()


SECOND = 1_700_000_000
TIMESTAMP_INPUTS = {
    "arrow-s": pa.array([SECOND, SECOND + 1], pa.timestamp("s")),
    "arrow-ms-tz": pa.array([SECOND * 1000, SECOND * 1000 + 1], pa.timestamp("ms", tz="UTC")),
    "arrow-us": pa.array([SECOND * 10**6, SECOND * 10**6 + 1000], pa.timestamp("us")),
    "arrow-ns": pa.array([SECOND * 10**9 + 999, SECOND * 10**9 + 1_000_000],
                         pa.timestamp("ns")),
    "numpy-datetime64-ms": np.array([SECOND * 1000, SECOND * 1000 + 1], "datetime64[ms]"),
    "numpy-datetime64-D": np.array(["2023-11-14", "2023-11-15"], "datetime64[D]"),
    "arrow-uint32": pa.array([5, 6], pa.uint32()),
}
TIMESTAMP_EXPECTED = {
    "arrow-s": [SECOND * 10**6, (SECOND + 1) * 10**6],
    "arrow-ms-tz": [SECOND * 10**6, SECOND * 10**6 + 1000],
    "arrow-us": [SECOND * 10**6, SECOND * 10**6 + 1000],
    "arrow-ns": [SECOND * 10**6, SECOND * 10**6 + 1000],  # floored to microseconds
    "numpy-datetime64-ms": [SECOND * 10**6, SECOND * 10**6 + 1000],
    "numpy-datetime64-D": [1_699_920_000 * 10**6, 1_700_006_400 * 10**6],
    "arrow-uint32": [5, 6],
}


@pytest.mark.parametrize("name", TIMESTAMP_INPUTS)
def test_timestamp_types_become_microseconds(pair, name):
    columns, _ = pair()
    columns.append_columns_sync(STREAM, {"value": pa.array([b"a", b"b"]),
                                         "timestamp": TIMESTAMP_INPUTS[name]})
    assert [r.timestamp_us for r in columns.reader(STREAM, 0)] == TIMESTAMP_EXPECTED[name]


def test_negative_timestamps_before_1970_are_kept(pair):
    columns, batch = pair()
    stamps = [-1, -(1 << 62), (1 << 63) - 1]
    columns.append_columns_sync(STREAM, {"value": pa.array([b"a", b"b", b"c"]),
                                         "timestamp": np.array(stamps)})
    batch.append_batch_sync(STREAM, [b"a", b"b", b"c"], timestamps_us=stamps)
    assert contents(columns) == contents(batch)


def test_missing_timestamps_are_the_append_time(tmp_path, open_logs):
    clock = ManualClock(wall_us=1_234_567)
    log = open_logs(str(tmp_path / "log"), fsync="never", clock=clock)
    log.create_stream(STREAM)
    log.append_columns_sync(STREAM, {"value": pa.array([b"a", b"b"])})
    clock.advance(2.5)
    log.append_columns_sync(STREAM, pa.record_batch({"value": pa.array([b"c"])}))
    assert [r.timestamp_us for r in log.reader(STREAM, 0)] == [1_234_567, 1_234_567,
                                                               3_734_567]


def test_all_null_headers_column_is_accepted(pair):
    """A reader's arrow(include_headers=True) batch, without its position columns,
    appends as it was read (records without headers)."""
    columns, _ = pair()
    columns.append_columns_sync(STREAM, reference_batch())
    read = next(iter(columns.reader(STREAM, 0).arrow(include_headers=True)))
    again = read.select(["timestamp", "key", "value", "headers"])
    columns.append_columns_sync(STREAM, again)
    records = list(columns.reader(STREAM, 0))
    n = len(VALUES)
    assert [(r.timestamp_us, r.key, r.value, r.headers) for r in records[n:]] == [
        (r.timestamp_us, r.key, r.value, ()) for r in records[:n]]


# -- partitions ----------------------------------------------------------------------------


def test_partitions_by_key_and_round_robin_match_append_batch(pair):
    columns, batch = pair(partitions=5)
    rng = np.random.default_rng(7)
    keys = [None if rng.random() < 0.3 else rng.bytes(int(rng.integers(0, 12)))
            for _ in range(400)]
    values = [rng.bytes(int(rng.integers(0, 30))) for _ in range(400)]
    stamps = list(range(400))
    for lo, hi in ((0, 150), (150, 151), (151, 400)):  # round robin carries over
        got = columns.append_columns_sync(STREAM, {
            "value": pa.array(values[lo:hi], pa.binary()),
            "key": pa.array(keys[lo:hi], pa.binary()),
            "timestamp": np.array(stamps[lo:hi])})
        want = batch.append_batch_sync(STREAM, values[lo:hi], keys=keys[lo:hi],
                                       timestamps_us=stamps[lo:hi])
        assert got == want
    found = contents(columns)
    assert found == contents(batch)
    assert sum(1 for rows in found.values() if rows) == 5


def test_round_robin_is_shared_with_append_batch(pair):
    columns, batch = pair(partitions=3)
    columns.append_batch_sync(STREAM, [b"a"])
    columns.append_columns_sync(STREAM, {"value": pa.array([b"b", b"c"])})
    batch.append_batch_sync(STREAM, [b"a"])
    batch.append_batch_sync(STREAM, [b"b", b"c"])
    assert {p: [r[3] for r in rows] for p, rows in contents(columns).items()} == {
        0: [b"a"], 1: [b"b"], 2: [b"c"]}


def test_explicit_partition_ignores_keys(pair):
    columns, _ = pair(partitions=4)
    result = columns.append_columns_sync(STREAM, reference_batch(), partition=2)
    assert result.ranges == {2: (0, len(VALUES) - 1)}
    assert [r[3] for r in contents(columns)[2]] == VALUES


# -- frames --------------------------------------------------------------------------------


def test_frames_are_cut_where_append_batch_cuts_them(pair):
    columns, batch = pair(frame_bytes_max=1024, record_bytes_max=300, compression="none")
    rng = np.random.default_rng(3)
    values = [rng.bytes(int(rng.integers(0, 200))) for _ in range(300)]
    keys = [None if i % 7 == 0 else rng.bytes(int(rng.integers(0, 60))) for i in range(300)]
    stamps = list(range(300))
    columns.append_columns_sync(STREAM, {"value": pa.array(values, pa.binary()),
                                         "key": pa.array(keys, pa.binary()),
                                         "timestamp": np.array(stamps)})
    batch.append_batch_sync(STREAM, values, keys=keys, timestamps_us=stamps)
    sizes = batch_sizes(columns)
    assert len(sizes) > 10  # the small frame bound really did cut
    assert sizes == batch_sizes(batch)
    assert contents(columns) == contents(batch)


def test_batch_records_max_bounds_each_frame(pair):
    columns, _ = pair(batch_records_max=100)
    columns.append_columns_sync(STREAM, {"value": pa.array([b"x"] * 1050)})
    assert batch_sizes(columns) == [100] * 10 + [50]


def test_concurrent_columns_and_batches_share_frames_correctly(pair):
    """Queued appends of both kinds in one commit: each lands contiguously, whole."""
    columns, _ = pair()

    async def both():
        calls = []
        for i in range(20):
            values = [b"%d-%d" % (i, j) for j in range(5)]
            if i % 2:
                calls.append(columns.append_columns(STREAM, {"value": pa.array(values)}))
            else:
                calls.append(columns.append_batch(STREAM, values))
        return await asyncio.gather(*calls)

    results = asyncio.run(both())
    by_offset = {r.offset: r.value for r in columns.reader(STREAM, 0)}
    assert len(by_offset) == 100
    for i, result in enumerate(results):
        first, last = result.ranges[0]
        assert last - first == 4
        assert [by_offset[o] for o in range(first, last + 1)] == [
            b"%d-%d" % (i, j) for j in range(5)]


@pytest.mark.parametrize("kinds,frames", [
    ("ccc", [9]),  # queued columnar appends share one frame
    ("ccb", [6, 3]),  # a list append never shares a columnar frame
    ("cbc", [3, 3, 3]),
])
def test_queued_appends_merge_only_with_their_own_kind(pair, kinds, frames):
    columns, _ = pair()
    part = columns._partition(STREAM, 0)
    entered, release = threading.Event(), threading.Event()

    def hold_writer():
        entered.set()
        assert release.wait(10)

    holder = threading.Thread(target=part.run_job, args=(hold_writer,))
    holder.start()
    assert entered.wait(10)

    async def queue_then_release():
        tasks = []
        for i, kind in enumerate(kinds):
            values = [b"%d" % i] * 3
            call = (columns.append_columns(STREAM, {"value": pa.array(values)})
                    if kind == "c" else columns.append_batch(STREAM, values))
            tasks.append(asyncio.ensure_future(call))
        await asyncio.sleep(0.05)  # every task has queued its pieces
        release.set()
        return await asyncio.gather(*tasks)

    results = asyncio.run(queue_then_release())
    holder.join(10)
    assert [r.ranges[0] for r in results] == [(0, 2), (3, 5), (6, 8)]
    assert batch_sizes(columns) == frames
    assert [r.value for r in columns.reader(STREAM, 0)] == [b"0"] * 3 + [b"1"] * 3 + [b"2"] * 3


# -- transactions and durability ---------------------------------------------------------


def test_txn_data_is_visible_only_after_commit(pair):
    columns, _ = pair(partitions=2)
    txn = columns.new_txn_id()
    columns.append_columns_sync(STREAM, reference_batch(), partition=1, txn_id=txn)
    assert list(columns.reader(STREAM, 1)) == []
    assert len(list(columns.reader(STREAM, 1, read_committed=False))) == len(VALUES)
    assert columns.txn_state(STREAM, 1, txn) is TxnState.OPEN
    columns.commit_txn(STREAM, 1, txn)
    assert [r.value for r in columns.reader(STREAM, 1)] == VALUES
    aborted = columns.new_txn_id()
    columns.append_columns_sync(STREAM, reference_batch(), partition=1, txn_id=aborted)
    columns.abort_txn(STREAM, 1, aborted)
    assert [r.value for r in columns.reader(STREAM, 1)] == VALUES


def test_fsync_always_survives_reopen(tmp_path):
    path = str(tmp_path / "log")
    log = open_log(path, fsync="always")
    log.create_stream(STREAM)
    result = log.append_columns_sync(STREAM, reference_batch())
    assert log.stats()[f"{STREAM}/0"]["fsyncs"] >= 1
    log.close()
    reopened = open_log(path, readonly=True)
    try:
        assert [r.value for r in reopened.reader(STREAM, 0)] == VALUES
        assert reopened.end_offset(STREAM, 0) == result.ranges[0][1] + 1
    finally:
        reopened.close()


# -- bad input -----------------------------------------------------------------------------

V2 = pa.array([b"a", b"b"])
BAD = {
    "not-columns": ([b"a", b"b"], InvalidAppend, "RecordBatch or Table"),
    "no-value": ({"key": V2}, InvalidAppend, "needs a 'value' column"),
    "unknown-column": ({"value": V2, "offset": pa.array([1, 2])}, InvalidAppend,
                       "unknown column.*'offset'"),
    "value-int": ({"value": pa.array([1, 2])}, InvalidAppend,
                  "value column must be binary or string"),
    "value-list": ({"value": [b"a", b"b"]}, InvalidAppend, "must be an Arrow or NumPy array"),
    "value-numpy-str": ({"value": np.array(["a", "b"])}, InvalidAppend, "UTF-32"),
    "value-numpy-object": ({"value": np.array([b"a", None], dtype=object)}, InvalidAppend,
                           "dtype object"),
    "key-int": ({"value": V2, "key": pa.array([1, 2])}, InvalidAppend,
                "key column must be binary"),
    "key-short": ({"value": V2, "key": pa.array([b"k"])}, InvalidAppend,
                  "key column has 1 rows for 2 values"),
    "empty": ({"value": pa.array([], pa.binary())}, InvalidAppend, "nothing to append"),
    "oversize-value": ({"value": pa.array([b"a", b"x" * 101])}, InvalidAppend,
                       "record 1 is 101 bytes; the limit is 100"),
    "oversize-with-key": ({"value": pa.array([b"x" * 60, b"a"]),
                           "key": pa.array([b"k" * 41, None])}, InvalidAppend,
                          "record 0 is 101 bytes"),
    "timestamp-float": ({"value": V2, "timestamp": np.array([1.0, 2.0])}, InvalidAppend,
                        "integer microseconds"),
    "timestamp-string": ({"value": V2, "timestamp": pa.array(["1", "2"])}, InvalidAppend,
                         "integer microseconds"),
    "timestamp-null": ({"value": V2, "timestamp": pa.array([1, None], pa.int64())},
                       InvalidAppend, "timestamp of record 1 is null"),
    "timestamp-nat": ({"value": V2, "timestamp": np.array(["NaT", "2020-01-01"],
                                                          "datetime64[s]")},
                      InvalidAppend, "timestamp of record 0 is NaT"),
    "timestamp-int64-min": ({"value": V2, "timestamp": np.array([0, -(1 << 63)])},
                            InvalidAppend, "timestamp of record 1 is out of the int64"),
    "timestamp-uint64-overflow": ({"value": V2, "timestamp": np.array(
        [1, 1 << 63], dtype=np.uint64)}, InvalidAppend, "record 1 is out of the int64"),
    "timestamp-seconds-overflow": ({"value": V2, "timestamp": pa.array(
        [0, (1 << 62)], pa.timestamp("s"))}, InvalidAppend, "record 1 is out of the int64"),
    "timestamp-seconds-negative-overflow": ({"value": V2, "timestamp": np.array(
        [-(1 << 60), 0], "datetime64[s]")}, InvalidAppend, "record 0 is out of the int64"),
    "timestamp-2d": ({"value": V2, "timestamp": np.zeros((2, 1), dtype=np.int64)},
                     InvalidAppend, "1-D"),
    "timestamp-months": ({"value": V2, "timestamp": np.array(["2020-01", "2020-02"],
                                                             "datetime64[M]")},
                         InvalidAppend, "no fixed length"),
    "headers": ({"value": V2, "headers": pa.array([[{"key": "h", "value": b"v"}], None])},
                InvalidAppend, "headers with append_batch"),
    "duplicate-columns": (pa.table([V2, V2], names=["value", "value"]), InvalidAppend,
                          "duplicate column"),
}


@pytest.mark.parametrize("name", BAD)
def test_bad_columns_raise_and_append_nothing(pair, name):
    columns, _ = pair(partitions=2, record_bytes_max=100)
    data, error, match = BAD[name]
    with pytest.raises(error, match=match):
        columns.append_columns_sync(STREAM, data)
    with pytest.raises(error, match=match):
        asyncio.run(columns.append_columns(STREAM, data))
    assert [columns.end_offset(STREAM, p) for p in range(2)] == [0, 0]


@pytest.mark.parametrize("partition,txn_id,error,match", [
    (2, 0, InvalidArgument, "partitions 0..1"),
    (-1, 0, InvalidArgument, "partitions 0..1"),
    (True, 0, InvalidArgument, "partitions 0..1"),
    ("0", 0, InvalidArgument, "partitions 0..1"),
    (0, -1, InvalidAppend, "txn_id"),
    (0, 1 << 64, InvalidAppend, "txn_id"),
])
def test_bad_partition_or_txn_raises_and_appends_nothing(pair, partition, txn_id, error,
                                                         match):
    columns, _ = pair(partitions=2)
    with pytest.raises(error, match=match):
        columns.append_columns_sync(STREAM, reference_batch(), partition=partition,
                                    txn_id=txn_id)
    assert [columns.end_offset(STREAM, p) for p in range(2)] == [0, 0]


def test_closed_transaction_refuses_columns(pair):
    columns, _ = pair()
    txn = columns.new_txn_id()
    columns.append_columns_sync(STREAM, reference_batch(), txn_id=txn)
    columns.commit_txn(STREAM, 0, txn)
    end = columns.end_offset(STREAM, 0)
    with pytest.raises(InvalidArgument, match="committed"):
        columns.append_columns_sync(STREAM, reference_batch(), txn_id=txn)
    assert columns.end_offset(STREAM, 0) == end


def test_read_only_log_refuses_columns(tmp_path):
    path = str(tmp_path / "log")
    with open_log(path, fsync="never") as log:
        log.create_stream(STREAM)
    with open_log(path, readonly=True) as view:
        with pytest.raises(ReadOnlyLog):
            view.append_columns_sync(STREAM, reference_batch())
