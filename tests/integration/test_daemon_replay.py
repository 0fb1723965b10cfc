"""A replay through the daemon delivers what the local replay delivers (DESIGN 9).

The log is built and closed first, then served by a LogServer in this process (the
`ThreadedDaemon` of test_daemon.py), so both sides read the segments, not the tail
ring. Each case reads the same range twice, through `daemon.log.reader` (the local
replay, on the very log the daemon serves) and through a client's reader, and compares
the Arrow tables, the records and where each reader ends: keys and values (None among
them), headers, timestamps, offsets, read_committed leaving the aborted transaction and
an open one out, control records when asked for, zstd frames, bounds by offset and by
time (inside frames, so slices of stored batches travel), small stored batches the
daemon joins into one BATCH, and frames larger than a connection's scratch buffer,
received into buffers that are used again while the consumer keeps some batches and
drops others. A frame damaged on the daemon's disk ends the read with CorruptionError
after every record before it; nothing of it or after it is delivered.
"""

from __future__ import annotations

import glob
import os
import random

import pyarrow as pa
import pytest

import streamlog
from streamlog.frame import CODEC_ZSTD
from tests.integration.test_cli_read_damage import build_damaged_log, frames_of
from tests.integration.test_daemon import ThreadedDaemon

pytestmark = pytest.mark.slow

STREAM = "mix"
BASE_US = 1_767_225_600_000_000
LARGE_BATCH = 9000  # records of 16 + 120 bytes: a frame of about 1.3 MB
SMALL_BATCHES = 12  # then batches of 300 records: the daemon joins them


def _plain(rng: random.Random, n: int, start_us: int):
    """n records: no key every 5th, a None value every 7th, timestamps that go back a
    little now and then (the high-water mark, not the timestamp, bounds a time range)."""
    keys = [None if i % 5 == 0 else b"k%d" % rng.randrange(50) for i in range(n)]
    values = [None if i % 7 == 3 else rng.randbytes(rng.randrange(0, 40)) for i in range(n)]
    stamps = [start_us + i * 10 - (25 if i % 11 == 0 else 0) for i in range(n)]
    return values, keys, stamps


def _build(path: str) -> None:
    rng = random.Random(7)
    with streamlog.open_log(path) as log:
        log.create_stream(STREAM, partitions=1)
        values, keys, stamps = _plain(rng, 500, BASE_US)
        log.append_batch_sync(STREAM, values, keys=keys, timestamps_us=stamps)
        headers = [{"h": b"v%d" % i, "none": None} if i % 3 else None for i in range(50)]
        log.append_batch_sync(STREAM, [b"with headers %d" % i for i in range(50)],
                              headers=headers, timestamps_us=[BASE_US + 6000 + i
                                                              for i in range(50)])
        committed, aborted = log.new_txn_id(), log.new_txn_id()
        log.append_batch_sync(STREAM, [b"committed %d" % i for i in range(40)],
                              txn_id=committed)
        log.append_batch_sync(STREAM, [b"aborted %d" % i for i in range(30)], txn_id=aborted)
        values, keys, stamps = _plain(rng, 200, BASE_US + 7000)
        log.append_batch_sync(STREAM, values, keys=keys, timestamps_us=stamps)
        log.append_batch_sync(STREAM, [b"committed late %d" % i for i in range(20)],
                              txn_id=committed)
        log.commit_txn(STREAM, 0, committed)
        log.abort_txn(STREAM, 0, aborted)
        log.append_batch_sync(STREAM, [b"compressible " * 8 + b"%d" % i for i in range(3000)],
                              keys=[b"c%d" % (i % 10) for i in range(3000)],
                              timestamps_us=[BASE_US + 10_000 + i for i in range(3000)])
        for number in range(3):
            start = BASE_US + 20_000 + number * LARGE_BATCH
            log.append_batch_sync(STREAM, [rng.randbytes(120) for _ in range(LARGE_BATCH)],
                                  keys=[rng.randbytes(16) for _ in range(LARGE_BATCH)],
                                  timestamps_us=[start + i for i in range(LARGE_BATCH)])
        for number in range(SMALL_BATCHES):
            values, keys, stamps = _plain(rng, 300, BASE_US + 60_000 + number * 3000)
            if number == 5:  # a batch without a None value: another layout (flags)
                values = [value or b"x" for value in values]
            log.append_batch_sync(STREAM, values, keys=keys, timestamps_us=stamps)


def _leave_a_transaction_open(log) -> None:
    """(An open that finds a transaction left open aborts it: this one is appended
    once the daemon has the log open.) read_committed readers stop before it."""
    left_open = log.new_txn_id()
    log.append_batch_sync(STREAM, [b"open %d" % i for i in range(10)], txn_id=left_open)
    log.append_batch_sync(STREAM, [b"after the open one %d" % i for i in range(10)])


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("replay") / "log")
    _build(path)
    codecs = {frame.codec for segment in glob.glob(os.path.join(path, "streams", STREAM,
                                                                "0", "*.log"))
              for frame in frames_of(segment)}
    assert CODEC_ZSTD in codecs  # the compressible batch was stored compressed
    daemon = ThreadedDaemon(path)
    _leave_a_transaction_open(daemon.log)
    client = daemon.connect()
    yield daemon, client
    client.close()
    daemon.stop()


def _table(batches, include_headers: bool) -> pa.Table:
    from streamlog.arrowconv import SCHEMA, SCHEMA_WITH_HEADERS
    return pa.Table.from_batches(batches, SCHEMA_WITH_HEADERS if include_headers else SCHEMA)


_LARGE_START = 500 + 50 + 40 + 30 + 200 + 20 + 2 + 3000  # the first large frame's offset
_SMALL_START = _LARGE_START + 3 * LARGE_BATCH

CASES = {
    "everything": {},
    "uncommitted": {"read_committed": False},
    "control records": {"data_only": False},
    "control records, uncommitted": {"data_only": False, "read_committed": False},
    "offsets inside frames": {"from_offset": 123, "to_offset": 3456},
    "offsets inside large frames": {"from_offset": _LARGE_START + 4321,
                                    "to_offset": _LARGE_START + 2 * LARGE_BATCH + 17},
    "offsets inside small frames": {"from_offset": _SMALL_START + 450,
                                    "to_offset": _SMALL_START + 2950},
    "from the aborted transaction": {"from_offset": 600, "read_committed": False},
    "time": {"from_timestamp_us": BASE_US + 2000, "to_timestamp_us": BASE_US + 25_000},
    "time from inside a large frame": {"from_timestamp_us": BASE_US + 20_000 + 5000},
}


@pytest.mark.parametrize("include_headers", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_remote_replay_is_the_local_replay(served, case, include_headers):
    daemon, client = served
    options = CASES[case]
    local, remote = daemon.log.reader(STREAM, 0, **options), client.reader(STREAM, 0, **options)
    expected = _table(list(local.arrow(include_headers=include_headers)), include_headers)
    got = _table(list(remote.arrow(include_headers=include_headers)), include_headers)
    assert got.num_rows == expected.num_rows > 0
    assert got.equals(expected)
    assert remote.next_offset == local.next_offset
    records = list(client.reader(STREAM, 0, **options))
    assert records == list(daemon.log.reader(STREAM, 0, **options))


def test_the_cases_cover_what_they_name(served):
    daemon, client = served
    everything = list(daemon.log.reader(STREAM, 0, read_committed=False, data_only=False))
    assert any(r.key is None for r in everything) and any(r.value is None for r in everything)
    assert any(r.headers and dict(r.headers)["none"] is None for r in everything)
    assert any(r.kind != streamlog.RecordKind.DATA for r in everything)
    committed = {r.value for r in daemon.log.reader(STREAM, 0)}
    assert b"committed 0" in committed and b"aborted 0" not in committed
    assert b"open 0" not in committed and b"after the open one 0" not in committed
    # the small stored batches came joined: fewer Arrow batches than the local reader's
    options = {"from_offset": _SMALL_START, "to_offset": _SMALL_START + SMALL_BATCHES * 300}
    local = list(daemon.log.reader(STREAM, 0, **options).arrow())
    remote = list(client.reader(STREAM, 0, **options).arrow())
    assert len(local) == SMALL_BATCHES and 1 < len(remote) < len(local)


@pytest.mark.parametrize("keep", ["all", "none", "every other"])
def test_large_batches_stay_whole_whatever_the_consumer_keeps(served, keep):
    """Batches received into buffers used again: one the consumer still holds is never
    written over by a later one."""
    daemon, client = served
    options = {"from_offset": _LARGE_START - 1000}
    expected = _table(list(daemon.log.reader(STREAM, 0, **options).arrow()), False)
    kept, row = [], 0
    for number, batch in enumerate(client.reader(STREAM, 0, **options).arrow()):
        assert _table([batch], False).equals(expected.slice(row, batch.num_rows))
        if keep == "all" or (keep == "every other" and number % 2 == 0):
            kept.append((row, batch))
        row += batch.num_rows
        del batch
    assert row == expected.num_rows
    for start, batch in kept:
        assert _table([batch], False).equals(expected.slice(start, batch.num_rows))


@pytest.mark.parametrize("batch", [5, 9000])  # small frames, and frames over 64 KiB
def test_a_damaged_frame_is_reported_after_the_records_before_it(tmp_path, batch):
    path = str(tmp_path / "log")
    segment, frame = build_damaged_log(path, batch=batch, batches=6, damaged=3)
    daemon = ThreadedDaemon(path)
    try:
        with daemon.connect() as client:
            for read in ("arrow", "records"):
                offsets = []
                reader = client.reader("events", 0)
                with pytest.raises(streamlog.CorruptionError, match="checksum|corrupt"):
                    if read == "arrow":
                        for got in reader.arrow():
                            offsets += got.column("offset").to_pylist()
                    else:
                        for record in reader:
                            offsets.append(record.offset)
                assert offsets == list(range(frame.base_offset))
            # a bounded read that stops before the damage is a plain success
            bounded = list(client.reader("events", 0, to_offset=frame.base_offset))
            assert [r.offset for r in bounded] == list(range(frame.base_offset))
    finally:
        daemon.stop()
    assert os.path.exists(segment)
