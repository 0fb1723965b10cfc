"""Concurrent reads of zstd-compressed partitions (DESIGN 4: codecs are never shared
across threads unless the library says they may be).

zstandard's ZstdDecompressor must not be used by two threads at once: a shared one gave
false "Data corruption detected" errors and segfaults under concurrent readers. Covered:
8 threads calling payload.decode_columns in a tight loop; 8 reader threads on one open
local log; 8 client threads reading through `streamlog serve`, whose pool threads decode
the frames. Every test first checks that the frames on disk really are zstd.
"""

from __future__ import annotations

import glob
import os
import threading
import time

import pyarrow as pa
import zstandard

import streamlog
from streamlog import payload
from streamlog.testing.serve import ServeProcess
from streamlog.frame import CODEC_ZSTD, HEADER_BYTES, decode_frame, encode_frame

THREADS = 8
STREAM = "clicks"
PARTITIONS = 4
FRAMES_PER_PARTITION = 6
RECORDS_PER_FRAME = 500
TOKEN = "concurrent-reads-token"


def value_of(partition: int, offset: int) -> bytes:
    """Compressible (zstd pays) but distinct per record, so a mix-up shows."""
    return (f"partition {partition} offset {offset:07d} page /catalog/item/{offset % 97} "
            f"user u{offset % 13} ").encode() * 2


def expected_values() -> dict[int, list[bytes]]:
    total = FRAMES_PER_PARTITION * RECORDS_PER_FRAME
    return {p: [value_of(p, i) for i in range(total)] for p in range(PARTITIONS)}


def build_log(path: str, expected: dict[int, list[bytes]]) -> None:
    with streamlog.open_log(path, fsync="never", compression="zstd") as log:
        log.create_stream(STREAM, partitions=PARTITIONS)
        for partition, values in expected.items():
            for start in range(0, len(values), RECORDS_PER_FRAME):
                log.append_batch_sync(STREAM, values[start:start + RECORDS_PER_FRAME],
                                      partition=partition)


def frames_on_disk(path: str) -> list:
    frames = []
    for segment in sorted(glob.glob(os.path.join(path, "streams", "*", "*", "*.log"))):
        with open(segment, "rb") as handle:
            data = handle.read()
        position = 0
        while position < len(data):
            frame = decode_frame(data, position)
            frames.append(frame)
            position += HEADER_BYTES + len(frame.payload)
    return frames


def assert_all_zstd(path: str) -> None:
    frames = frames_on_disk(path)
    assert len(frames) == PARTITIONS * FRAMES_PER_PARTITION
    assert all(frame.codec == CODEC_ZSTD for frame in frames)
    assert all(len(frame.payload) < frame.raw_bytes // 2 for frame in frames)


def run_threads(work, count: int = THREADS) -> list[str]:
    """Run work(number, barrier) on `count` threads; return what they failed with."""
    barrier = threading.Barrier(count)
    failures: list[str] = []

    def guarded(number: int) -> None:
        try:
            work(number, barrier)
        except BaseException as error:  # noqa: BLE001 - reported by the test
            failures.append(f"thread {number}: {error!r}")
            barrier.abort()

    threads = [threading.Thread(target=guarded, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads), "a reader thread hung"
    return failures


def read_everything(log, number: int, round_: int, expected: dict[int, list[bytes]]) -> None:
    """One pass over every partition (in a per-thread order), by records or by Arrow."""
    for step in range(PARTITIONS):
        partition = (number + step + round_) % PARTITIONS
        with log.reader(STREAM, partition) as reader:
            if (number + round_) % 2:
                got = [record.value for record in reader.records()]
                assert got == expected[partition], f"partition {partition} differs"
            else:
                batches = list(reader.arrow())
                table = pa.Table.from_batches(batches)
                assert table.column("offset").to_pylist() == list(
                    range(len(expected[partition])))
                assert table.column("value").combine_chunks().equals(
                    pa.array(expected[partition], pa.binary())), f"partition {partition}"


# -- the codec itself ------------------------------------------------------------------

def test_decode_columns_from_many_threads_at_once():
    frames = []
    for number in range(THREADS):
        values = [value_of(number, i) * 4 for i in range(2000)]
        raw, flags = payload.encode_payload(list(range(len(values))), [None] * len(values),
                                            values)
        stored = zstandard.ZstdCompressor(level=1).compress(raw)
        data = encode_frame(base_offset=0, record_count=len(values), min_timestamp_us=0,
                            max_timestamp_us=len(values) - 1, txn_id=0,
                            flags=flags | CODEC_ZSTD, raw_bytes=len(raw), payload=stored)
        frames.append((decode_frame(data), b"".join(values)))
    assert all(frame.codec == CODEC_ZSTD for frame, _ in frames)

    def work(number: int, barrier: threading.Barrier) -> None:
        barrier.wait()
        for i in range(150):
            frame, values = frames[(number + i) % len(frames)]
            columns = payload.decode_columns(frame)
            assert bytes(columns.values) == values

    assert run_threads(work) == []


# -- one open local log ----------------------------------------------------------------

def test_many_threads_read_one_local_log(tmp_path):
    path = str(tmp_path / "log")
    expected = expected_values()
    build_log(path, expected)
    assert_all_zstd(path)
    rounds = 6
    with streamlog.open_log(path, readonly=True, create=False) as log:  # nothing cached
        def work(number: int, barrier: threading.Barrier) -> None:
            barrier.wait()
            for round_ in range(rounds):
                read_everything(log, number, round_, expected)

        started = time.monotonic()
        assert run_threads(work) == []
    assert time.monotonic() - started < 20


# -- through the daemon ----------------------------------------------------------------

def test_many_threads_read_through_the_daemon(tmp_path, monkeypatch):
    path = str(tmp_path / "log")
    expected = expected_values()
    build_log(path, expected)
    assert_all_zstd(path)
    monkeypatch.setenv("STREAMLOG_TOKEN", TOKEN)
    daemon = ServeProcess(path, token=TOKEN)
    rounds = 3
    try:
        shared = streamlog.open_log(daemon.url)  # half the threads share one client
        try:
            def work(number: int, barrier: threading.Barrier) -> None:
                own = streamlog.open_log(daemon.url) if number % 2 else None
                try:
                    barrier.wait()
                    for round_ in range(rounds):
                        read_everything(own or shared, number, round_, expected)
                finally:
                    if own is not None:
                        own.close()

            started = time.monotonic()
            failures = run_threads(work)
            elapsed = time.monotonic() - started
        finally:
            shared.close()
        assert daemon.proc.poll() is None, f"the daemon died: {daemon.lines[-5:]}"
        assert failures == [], (failures, daemon.lines[-5:])
        assert elapsed < 20
    finally:
        code = daemon.stop()
    assert code == 0, daemon.lines[-5:]
