"""A large columnar append is a frame of its own, written from the caller's buffers with
one gathered write (FileIO.pwritev, no payload joined) and handed to the live tail as
columns: what is on disk, what a follower is handed and what append_batch would have
written are the same records, and a caller reusing its arrays afterwards changes none
of them."""

from __future__ import annotations

import asyncio
import os
import threading

import numpy as np
import pyarrow as pa
import pytest

import streamlog
from streamlog.check import check_partition
from streamlog import columnar
from streamlog.config import LogConfig
from streamlog.encoder import COLUMNS_ALONE_BYTES, Compressor, encode_commit
from streamlog.fileio import OsFileIO

STREAM = "s"
ROWS = 6_000  # ~ 100 bytes a record: one piece over COLUMNS_ALONE_BYTES


def records(reader, count: int) -> list[tuple]:
    out = []
    for record in reader.records():
        out.append((record.offset, record.key, record.value, record.timestamp_us))
        if len(out) == count:
            break
    return out


def big_batch(rng) -> tuple[dict, list]:
    values = [None if i % 97 == 0 else rng.bytes(int(rng.integers(0, 160)))
              for i in range(ROWS)]
    keys = [None if i % 5 == 0 else rng.bytes(int(rng.integers(0, 24))) for i in range(ROWS)]
    stamps = rng.integers(0, 1 << 40, ROWS).astype(np.int64)  # out of order
    data = {"value": pa.array(values, pa.binary()), "key": pa.array(keys, pa.binary()),
            "timestamp": stamps}
    expected = [(i, keys[i], values[i], int(stamps[i])) for i in range(ROWS)]
    return data, expected


@pytest.mark.parametrize("compression", ["none", "auto"])
def test_what_a_follower_is_handed_is_what_is_on_disk(tmp_path, compression):
    rng = np.random.default_rng(7)
    data, expected = big_batch(rng)
    assert sum(len(v or b"") + len(k or b"") for _, k, v, _ in expected) > COLUMNS_ALONE_BYTES
    log = streamlog.open_log(str(tmp_path / "log"), fsync="always", compression=compression)
    log.create_stream(STREAM, partitions=1)
    followed: list = []
    follower = log.reader(STREAM, 0, from_offset=0, follow=True)
    thread = threading.Thread(target=lambda: followed.extend(records(follower, 2 * ROWS)))
    thread.start()
    log.append_columns_sync(STREAM, data, partition=0)
    data["timestamp"][:] = -1  # the caller reuses its array once the append returned
    again, expected_again = big_batch(rng)
    log.append_columns_sync(STREAM, again, partition=0)
    thread.join(30)
    follower.close()
    expected += [(ROWS + o, k, v, t) for o, k, v, t in expected_again]
    assert followed == expected
    with log.reader(STREAM, 0) as reader:
        assert records(reader, 2 * ROWS) == expected
    assert log.stats()[f"{STREAM}/0"]["frames"] == 2
    log.close()
    checked = check_partition(STREAM, 0, str(tmp_path / "log" / "streams" / STREAM / "0"))
    assert not checked.damaged and checked.records == 2 * ROWS, checked.as_dict()
    with streamlog.open_log(str(tmp_path / "log")) as reopened:
        with reopened.reader(STREAM, 0) as reader:
            assert records(reader, 2 * ROWS) == expected


def test_a_columnar_frame_is_byte_for_byte_what_append_batch_writes(tmp_path):
    rng = np.random.default_rng(11)
    data, expected = big_batch(rng)
    paths = {}
    for name in ("columns", "batch"):
        log = streamlog.open_log(str(tmp_path / name), fsync="never", compression="none",
                                 batch_records_max=ROWS)
        log.create_stream(STREAM, partitions=1)
        if name == "columns":
            log.append_columns_sync(STREAM, data, partition=0)
        else:
            log.append_batch_sync(STREAM, [v for _, _, v, _ in expected],
                                  keys=[k for _, k, _, _ in expected],
                                  timestamps_us=[t for _, _, _, t in expected], partition=0)
        log.close()
        (segment,) = [f for f in os.listdir(tmp_path / name / "streams" / STREAM / "0")
                      if f.endswith(".log")]
        paths[name] = tmp_path / name / "streams" / STREAM / "0" / segment
    assert paths["columns"].read_bytes() == paths["batch"].read_bytes()


def test_a_gathered_write_of_more_buffers_than_one_call_takes(tmp_path):
    fileio = OsFileIO()
    path = str(tmp_path / "f")
    handle = fileio.open(path, writable=True, create=True)
    rng = np.random.default_rng(3)
    buffers = [rng.bytes(int(rng.integers(0, 9))) for _ in range(5_000)]  # > IOV_MAX
    buffers += [np.arange(7, dtype="<i8"), memoryview(b"tail"), bytearray(b"!")]
    fileio.pwrite(handle, b"head", 0)
    fileio.pwritev(handle, buffers, 4)
    fileio.close(handle)
    expected = b"head" + b"".join(bytes(memoryview(b).cast("B")) for b in buffers)
    with open(path, "rb") as file:
        assert file.read() == expected


def test_numpy_columns_reused_by_the_caller_leave_the_tail_as_appended(tmp_path):
    values = np.array([b"%0200d" % i for i in range(3_000)])  # 'S200': 600 KB, one piece
    stamps = np.arange(3_000, dtype=np.int64)
    with streamlog.open_log(str(tmp_path / "log"), fsync="never") as log:
        log.create_stream(STREAM, partitions=1)
        log.append_columns_sync(STREAM, {"value": values, "timestamp": stamps}, partition=0)
        values[:] = b"overwritten"
        stamps[:] = 0
        with log.reader(STREAM, 0) as reader:  # the tail ring holds the batch
            got = records(reader, 3_000)
    assert got == [(i, None, b"%0200d" % i, i) for i in range(3_000)]


def test_small_columnar_pieces_queued_together_share_a_frame_and_read_back(tmp_path):
    """The daemon's APPENDs of a thousand records each: merged as list pieces are."""
    async def main():
        async with streamlog.open_log(str(tmp_path / "log"), fsync="always") as log:
            log.create_stream(STREAM, partitions=1)
            batches = [{"value": pa.array([b"%d-%d" % (b, i) for i in range(1_000)])}
                       for b in range(16)]
            results = await asyncio.gather(*(log.append_columns(STREAM, batch, partition=0)
                                             for batch in batches))
            with log.reader(STREAM, 0) as reader:
                got = [r.value for r in reader.records()]
            return results, got, log.stats()[f"{STREAM}/0"]["frames"]

    results, got, frames = asyncio.run(main())
    assert [r.ranges[0] for r in results] == [(b * 1_000, b * 1_000 + 999) for b in range(16)]
    assert got == [b"%d-%d" % (b, i) for b in range(16) for i in range(1_000)]
    assert 1 <= frames <= 16


def test_the_encoder_merges_small_columnar_pieces_and_leaves_a_large_one_alone():
    config = LogConfig()
    small = [columnar.encode(columnar.rows_from({"value": pa.array([b"x" * 100] * 1_000),
                                                 "timestamp": np.arange(1_000)},
                                                record_bytes_max=config.record_bytes_max),
                             0, frame_bytes_max=config.frame_bytes_max,
                             batch_records_max=config.batch_records_max)
             for _ in range(8)]
    large = columnar.encode(columnar.rows_from({"value": pa.array([b"y" * 100] * 4_000),
                                                "timestamp": np.arange(4_000)},
                                               record_bytes_max=config.record_bytes_max),
                            0, frame_bytes_max=config.frame_bytes_max,
                            batch_records_max=config.batch_records_max)
    assert all(p.nbytes < COLUMNS_ALONE_BYTES for pieces in small for p in pieces)
    assert large[0].nbytes >= COLUMNS_ALONE_BYTES
    commit = encode_commit([*small[:4], large, *small[4:]], 0, None, config,
                           Compressor(config))
    assert [frame.record_count for frame in commit.frames] == [4_000, 4_000, 4_000]
    assert commit.firsts == [0, 1_000, 2_000, 3_000, 4_000, 8_000, 9_000, 10_000, 11_000]
