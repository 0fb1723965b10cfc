"""Any sequence of appends replays identically, and timestamp bounds follow the
high-water-mark rule, checked against a plain Python model.

Each example appends single records and batches (random keys including None, random
timestamps including equal and out-of-order ones and some left to the log, explicit or
chosen partitions) to a log with tiny segments, a tiny live-tail ring and tiny read
chunks, so segments roll, readers mix ring and disk, and frames straddle read chunks.
It then replays every partition as Records and as Arrow, from offsets and from
timestamps, before and after a close and reopen, appends more after the reopen, and
checks once more through a read-only open.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import random
import tempfile
import time

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import streamlog
from streamlog import partition_for_key

STREAM = "events"
OPTIONS = dict(segment_bytes_max=4096, tail_ring_batches_max=3, tail_ring_bytes_max=4096,
               read_chunk_bytes=1024)
TAG = "row"


@dataclasses.dataclass
class Row:
    key: bytes | None
    value: bytes
    timestamp_us: int | None  # None: the log stamps it; bounds below
    headers: tuple
    stamped_after_us: int = 0
    stamped_before_us: int = 0


# -- strategies -------------------------------------------------------------------------

values = st.one_of(
    st.binary(max_size=80),
    st.builds(lambda unit, times: unit * times, st.binary(min_size=1, max_size=4),
              st.integers(1, 300)),  # compressible, and sometimes larger than a read chunk
)
keys = st.one_of(st.none(), st.just(b""), st.binary(min_size=1, max_size=12))
timestamps = st.one_of(
    st.integers(0, 40).map(lambda t: 1_000_000 + t * 1000),  # many equal, out of order
    st.integers(-(1 << 62), 1 << 62),
    st.just(None),
)
headers = st.one_of(st.just(()), st.lists(
    st.tuples(st.sampled_from(["h", "trace", "ü"]), st.binary(max_size=6)),
    min_size=1, max_size=2).map(tuple))
records = st.tuples(values, keys, timestamps, headers)


@st.composite
def bulk(draw):
    """A larger batch drawn cheaply from a seed, so that segments roll in most examples."""
    rng = random.Random(draw(st.integers(0, 1 << 32)))
    count = draw(st.integers(10, 60))
    base = draw(st.sampled_from([0, 1_000_000, -(1 << 40)]))
    spread = draw(st.sampled_from([0, 5, 1000]))  # 0: every timestamp equal
    items = []
    for _ in range(count):
        value = rng.randbytes(rng.randint(0, 200)) if rng.random() < 0.7 else (
            b"z" * rng.randint(0, 1500))
        key = rng.choice([None, b"", b"a", b"b", b"key-%d" % rng.randint(0, 9)])
        items.append((value, key, base + rng.randint(0, spread) * 1000, ()))
    return items


@st.composite
def scenarios(draw):
    partitions = draw(st.integers(1, 3))
    target = st.one_of(st.none(), st.integers(0, partitions - 1))
    op = st.one_of(
        st.tuples(st.just("one"), st.lists(records, min_size=1, max_size=1), target),
        st.tuples(st.just("batch"), st.lists(records, min_size=1, max_size=12), target),
        st.tuples(st.just("batch"), bulk(), target),
        st.tuples(st.just("batch"), bulk(), st.none()))
    ops = draw(st.lists(op, min_size=2, max_size=20))
    split = draw(st.integers(0, len(ops)))
    fsync = draw(st.sampled_from(["never", "never", "always"]))
    compression = draw(st.sampled_from(["auto", "none", "zstd"]))
    return partitions, ops[:split], ops[split:], fsync, compression


# -- appending, and the model ------------------------------------------------------------


def append_all(log, partitions: int, ops, model: list[list[Row]], tags) -> None:
    for kind, items, target in ops:
        rows = []
        for value, key, timestamp_us, extra in items:
            row_headers = extra
            if partitions > 1 and target is None and key is None and kind == "batch":
                # Round robin decides where this row goes: tag it to find it again.
                row_headers = extra + ((TAG, str(next(tags)).encode()),)
            rows.append(Row(key, value, timestamp_us, row_headers))
        if kind == "one":
            append_one(log, rows[0], target, partitions, model)
        else:
            append_batch(log, rows, target, partitions, model)


def append_one(log, row: Row, target, partitions: int, model) -> None:
    before = time.time_ns() // 1000
    position = log.append_sync(STREAM, row.value, key=row.key, timestamp_us=row.timestamp_us,
                               partition=target, headers=row.headers or None)
    row.stamped_after_us, row.stamped_before_us = before, time.time_ns() // 1000
    expected = known_partition(row, target, partitions)
    if expected is not None:
        assert position.partition == expected
    assert position.offset == len(model[position.partition])
    model[position.partition].append(row)


def append_batch(log, rows: list[Row], target, partitions: int, model) -> None:
    stamped = any(r.timestamp_us is None for r in rows)
    before = time.time_ns() // 1000
    result = log.append_batch_sync(
        STREAM, [r.value for r in rows], keys=[r.key for r in rows],
        timestamps_us=None if stamped else [r.timestamp_us for r in rows],
        partition=target, headers=[r.headers for r in rows])
    after = time.time_ns() // 1000
    for row in rows:
        if stamped:
            row.timestamp_us = None
        row.stamped_after_us, row.stamped_before_us = before, after
    assert result.records == len(rows)
    placed = {p: [] for p in range(partitions)}
    for row in rows:
        number = known_partition(row, target, partitions)
        if number is None:
            number = tagged_partition(log, row, partitions, model)
        placed[number].append(row)
    assert result.ranges == {p: (len(model[p]), len(model[p]) + len(share) - 1)
                             for p, share in placed.items() if share}
    for number, share in placed.items():
        model[number].extend(share)


def known_partition(row: Row, target, partitions: int) -> int | None:
    if target is not None:
        return target
    if partitions == 1:
        return 0
    if row.key is not None:
        return partition_for_key(row.key, partitions)
    return None


def tagged_partition(log, row: Row, partitions: int, model) -> int:
    """The partition whose newest records (those of this batch) hold the row's tag."""
    tag = dict(row.headers)[TAG]
    found = [p for p in range(partitions)
             if any(dict(r.headers).get(TAG) == tag
                    for r in log.reader(STREAM, p, from_offset=len(model[p])))]
    assert len(found) == 1, found
    return found[0]


# -- checking ------------------------------------------------------------------------------


def check_partition(log, number: int, rows: list[Row], rng: random.Random) -> None:
    n = len(rows)
    assert log.start_offset(STREAM, number) == 0
    assert log.end_offset(STREAM, number) == n
    got = list(log.reader(STREAM, number))
    assert [r.offset for r in got] == list(range(n))
    for record, row in zip(got, rows):
        assert record.partition == number
        assert record.value == row.value
        assert record.key == row.key
        assert record.headers == row.headers
        assert record.kind is streamlog.RecordKind.DATA
        if row.timestamp_us is None:
            assert row.stamped_after_us <= record.timestamp_us <= row.stamped_before_us
        else:
            assert record.timestamp_us == row.timestamp_us
    stamps = [r.timestamp_us for r in got]  # now exact, append-time stamps included
    assert arrow_rows(log.reader(STREAM, number).arrow()) == [
        (number, r.offset, r.timestamp_us, r.key, r.value) for r in got]

    middle = rng.randint(0, n)
    assert [r.offset for r in log.reader(STREAM, number, from_offset=middle)] == list(
        range(middle, n))
    stop = rng.randint(middle, n)
    assert [r.offset for r in log.reader(STREAM, number, from_offset=middle,
                                         to_offset=stop)] == list(range(middle, stop))
    check_timestamps(log, number, stamps, rng)


def check_timestamps(log, number: int, stamps: list[int], rng: random.Random) -> None:
    """from_timestamp_us=T starts at the first record whose running max is >= T;
    to_timestamp_us=T stops just before it; offset_for_timestamp agrees."""
    n = len(stamps)
    hwm = list(itertools.accumulate(stamps, max))
    candidates = sorted({t + d for t in stamps for d in (-1, 0, 1)} | {0})
    for t in rng.sample(candidates, min(len(candidates), 6)):
        first = bisect.bisect_left(hwm, t)  # hwm is non-decreasing
        assert first == next((i for i, h in enumerate(hwm) if h >= t), n)
        assert log.offset_for_timestamp(STREAM, number, t) == first, t
        assert [r.offset for r in log.reader(STREAM, number, from_timestamp_us=t)] == list(
            range(first, n)), t
        assert [r.offset for r in log.reader(STREAM, number, to_timestamp_us=t)] == list(
            range(first)), t
        start = rng.randint(0, n)
        assert [r.offset for r in log.reader(STREAM, number, from_offset=start,
                                             to_timestamp_us=t)] == list(
            range(start, max(start, first))), (t, start)
        arrow = arrow_rows(log.reader(STREAM, number, from_timestamp_us=t).arrow())
        assert [row[1] for row in arrow] == list(range(first, n)), t


def arrow_rows(batches) -> list[tuple]:
    out = []
    for batch in batches:
        assert isinstance(batch, pa.RecordBatch)
        assert batch.num_rows > 0
        out += zip(batch.column("partition").to_pylist(), batch.column("offset").to_pylist(),
                   batch.column("timestamp").cast(pa.int64()).to_pylist(),
                   batch.column("key").to_pylist(), batch.column("value").to_pylist())
    return out


def check_all(log, partitions: int, model, rng: random.Random) -> None:
    assert log.streams() == [STREAM]
    assert log.partition_count(STREAM) == partitions
    for number in range(partitions):
        check_partition(log, number, model[number], rng)


# -- the property --------------------------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.randoms(use_true_random=False))
def test_appends_replay_identically(scenario, rng):
    partitions, first_ops, second_ops, fsync, compression = scenario
    model: list[list[Row]] = [[] for _ in range(partitions)]
    tags = itertools.count()
    with tempfile.TemporaryDirectory() as directory:
        path = f"{directory}/log"
        options = dict(OPTIONS, fsync=fsync, compression=compression)
        with streamlog.open_log(path, **options) as log:
            log.create_stream(STREAM, partitions)
            append_all(log, partitions, first_ops, model, tags)
            check_all(log, partitions, model, rng)
        with streamlog.open_log(path, **options) as log:
            check_all(log, partitions, model, rng)
            append_all(log, partitions, second_ops, model, tags)
            check_all(log, partitions, model, rng)
        with streamlog.open_log(path, readonly=True, **options) as log:
            check_all(log, partitions, model, rng)
