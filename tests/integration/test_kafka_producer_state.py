"""Idempotent producers' state through the broker over a real log on disk: the sequence
rules after the log is closed and opened again (a daemon restart; without the broker's
close, a crash), rebuilt from the stamped frames and checked snapshots; producer ids
never handed out twice; the stamp served back by Fetch."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pyarrow as pa
import pytest

import streamlog
from streamlog.kafka import record_decoding, record_encoding, records
from streamlog.kafka.batches import read as read_batches
from streamlog.kafka.broker import Broker
from streamlog.kafka.errors import ErrorCode
from streamlog.kafka.producer_state import ID_BLOCK, ProducerIds
from streamlog.testing.serve import ServeProcess
from harness.kafka_requests import parsed, produce_fields

TOPIC = "t"


def new_producer(broker: Broker) -> int:
    answer = broker.handle_init_producer_id(parsed(22, 4, transactional_id=None,
                                                   transaction_timeout=60000))
    assert (answer.error_code, answer.producer_epoch) == (ErrorCode.none, 0)
    return answer.producer_id


def batch(producer_id: int, sequence: int, count: int = 3, epoch: int = 0,
          headers: bool = False, value_bytes: int = 8) -> bytes:
    return record_encoding.encode_batch(0, [
        records.KafkaRecord(i, 1_700_000_000_000 + i, b"k%d" % i,
                            b"%d" % (sequence + i) * value_bytes,
                            (("h", b"x"),) if headers else ())
        for i in range(count)], producer_id=producer_id, producer_epoch=epoch,
        base_sequence=sequence)


def produce(broker: Broker, data: bytes, partition: int = 0) -> tuple[int, int]:
    response = broker.handle_produce(parsed(0, 8, **produce_fields(TOPIC, partition, data)))
    (answer,) = response.responses[0].partition_responses
    return answer.error_code, answer.base_offset


def snapshot_path(log_path, partition: int = 0) -> str:
    return os.path.join(log_path, "kafka", "producers", TOPIC, f"{partition}.json")


@pytest.fixture
def log_path(tmp_path):
    path = str(tmp_path / "log")
    with streamlog.open_log(path) as log:
        log.create_stream(TOPIC, 2)
    return path


def test_a_retry_after_a_crash_is_a_duplicate_answered_with_its_offset(log_path):
    with streamlog.open_log(log_path) as log:
        broker = Broker(log)
        first, second = new_producer(broker), new_producer(broker)
        assert produce(broker, batch(first, 0)) == (ErrorCode.none, 0)
        assert produce(broker, batch(second, 0, count=2)) == (ErrorCode.none, 3)
        assert produce(broker, batch(first, 3, headers=True)) == (ErrorCode.none, 5)
        # no broker.close(): what a SIGKILL leaves, the snapshot from before these
    with streamlog.open_log(log_path) as log:
        broker = Broker(log)
        assert produce(broker, batch(first, 3, headers=True)) == (ErrorCode.none, 5)
        assert produce(broker, batch(first, 0)) == (ErrorCode.none, 0)
        assert produce(broker, batch(second, 0, count=2)) == (ErrorCode.none, 3)
        assert log.end_offset(TOPIC, 0) == 8  # nothing appended twice
        assert produce(broker, batch(first, 7))[0] == ErrorCode.out_of_order_sequence_number
        assert produce(broker, batch(first, 6)) == (ErrorCode.none, 8)
        assert produce(broker, batch(second, 2, epoch=1))[0] == \
            ErrorCode.out_of_order_sequence_number  # a new epoch starts at 0
        assert produce(broker, batch(second, 0, count=2, epoch=1)) == (ErrorCode.none, 11)
        assert produce(broker, batch(second, 2))[0] == ErrorCode.invalid_producer_epoch
        # sequences are per partition: the first batch there starts where it likes
        assert produce(broker, batch(first, 40), partition=1) == (ErrorCode.none, 0)
        values = [r.value for r in log.reader(TOPIC, 0).records()]
    assert values == [b"0" * 8, b"1" * 8, b"2" * 8, b"0" * 8, b"1" * 8, b"3" * 8,
                      b"4" * 8, b"5" * 8, b"6" * 8, b"7" * 8, b"8" * 8, b"0" * 8, b"1" * 8]


def test_a_clean_close_leaves_a_snapshot_and_a_load_reads_only_what_follows_it(
        log_path, caplog):
    caplog.set_level(logging.INFO, logger="streamlog.kafka")
    with streamlog.open_log(log_path) as log:
        broker = Broker(log)
        producer = new_producer(broker)
        for i in range(6):
            assert produce(broker, batch(producer, 3 * i)) == (ErrorCode.none, 3 * i)
        broker.close()
        log.append_batch_sync(TOPIC, [b"from another client"], partition=0)
    with open(snapshot_path(log_path), "rb") as handle:
        assert json.loads(handle.read())["offset"] == 18
    with streamlog.open_log(log_path) as log:
        broker = Broker(log)
        caplog.clear()
        assert produce(broker, batch(producer, 15)) == (ErrorCode.none, 15)  # a retry
        (loaded,) = [r.fields for r in caplog.records if r.msg == "kafka_producers_loaded"]
        assert (loaded["snapshot"], loaded["from_offset"], loaded["records_read"]) == (
            18, 18, 1)
        assert produce(broker, batch(producer, 18)) == (ErrorCode.none, 19)


def test_a_snapshot_that_does_not_match_the_partition_is_not_used(log_path, caplog):
    caplog.set_level(logging.INFO, logger="streamlog.kafka")
    with streamlog.open_log(log_path) as log:
        broker = Broker(log)
        producer = new_producer(broker)
        for i in range(4):
            assert produce(broker, batch(producer, 3 * i)) == (ErrorCode.none, 3 * i)
        broker.close()
        # cut the last two batches: the snapshot now describes batches that are gone
        log.truncate_after(TOPIC, 0, 5)
    with streamlog.open_log(log_path) as log:
        broker = Broker(log)
        caplog.clear()
        # 6..8 is no longer in the partition: appended again, not answered from memory
        assert produce(broker, batch(producer, 6)) == (ErrorCode.none, 6)
        (loaded,) = [r.fields for r in caplog.records if r.msg == "kafka_producers_loaded"]
        assert (loaded["snapshot"], loaded["from_offset"], loaded["records_read"]) == (
            12, 0, 6)
        assert produce(broker, batch(producer, 3)) == (ErrorCode.none, 3)
        broker.close()
    with open(snapshot_path(log_path), "wb") as handle:
        handle.write(b"{not json")
    with streamlog.open_log(log_path) as log:
        broker = Broker(log)
        assert produce(broker, batch(producer, 6)) == (ErrorCode.none, 6)  # read whole
        assert log.end_offset(TOPIC, 0) == 9


def test_producer_ids_are_never_handed_out_twice(log_path):
    seen = set()
    for _ in range(3):
        with streamlog.open_log(log_path) as log:
            broker = Broker(log)
            ids = [new_producer(broker) for _ in range(5)]
        assert not seen & set(ids)
        assert ids == sorted(ids)
        seen |= set(ids)
    # a clock set back, and more ids than one block: still above all of them
    fileio = streamlog.fileio.OsFileIO()
    early = ProducerIds(fileio, os.path.join(log_path, "kafka"), now_ms=lambda: 1)
    ids = [early.next_id() for _ in range(ID_BLOCK + 2)]
    assert min(ids) > max(seen) and len(set(ids)) == len(ids)
    again = ProducerIds(fileio, os.path.join(log_path, "kafka"), now_ms=lambda: 1)
    assert again.next_id() > max(ids)


def test_fetch_returns_the_producer_id_epoch_and_sequence(log_path):
    with streamlog.open_log(log_path) as log:
        broker = Broker(log)
        producer = new_producer(broker)
        assert produce(broker, batch(producer, 10)) == (ErrorCode.none, 0)  # as columns
        assert produce(broker, batch(producer, 13, headers=True)) == (ErrorCode.none, 3)
        log.append_batch_sync(TOPIC, [b"plain"], partition=0)
        expected = {  # from a fetch offset inside a batch, its sequence there
            0: [(0, producer, 0, 10, 3), (3, producer, 0, 13, 3), (6, -1, -1, -1, 1)],
            1: [(1, producer, 0, 11, 2), (3, producer, 0, 13, 3), (6, -1, -1, -1, 1)],
            4: [(4, producer, 0, 14, 2), (6, -1, -1, -1, 1)]}
        for start, batches in expected.items():
            chunks = read_batches(log, TOPIC, 0, start, 1 << 20, False, at_least_one=True)
            assert [(b.base_offset, b.producer_id, b.producer_epoch, b.base_sequence,
                     len(b)) for chunk in chunks
                    for b in record_decoding.decode_batches(chunk)] == batches


def test_a_batch_that_does_not_fit_one_frame_is_refused_whole(tmp_path):
    with streamlog.open_log(tmp_path / "log", frame_bytes_max=64 * 1024,
                            record_bytes_max=16 * 1024) as log:
        log.create_stream(TOPIC, 1)
        broker = Broker(log)
        producer = new_producer(broker)
        # five 10 KiB records: more than half a frame, so more than one frame
        assert produce(broker, batch(producer, 0, count=5, value_bytes=10 * 1024)) == (
            ErrorCode.message_too_large, -1)
        assert log.end_offset(TOPIC, 0) == 0
        # the same records from a producer without an id are cut into frames
        assert produce(broker, batch(-1, 0, count=5, value_bytes=10 * 1024)) == (
            ErrorCode.none, 0)
        assert produce(broker, batch(producer, 0, count=2, value_bytes=10 * 1024)) == (
            ErrorCode.none, 5)


def test_every_reader_of_frames_takes_stamped_ones(log_path):
    """verify, dump, a read as records and as Arrow, and a reader through the daemon,
    over a partition of stamped frames (compressed or not) and plain ones. (Recovery
    after a kill: the SIGKILL tests of test_kafka_restart.py.)"""
    with streamlog.open_log(log_path) as log:
        broker = Broker(log)
        producer = new_producer(broker)
        assert produce(broker, batch(producer, 0, value_bytes=400)) == (ErrorCode.none, 0)
        assert produce(broker, batch(producer, 3, headers=True)) == (ErrorCode.none, 3)
        log.append_batch_sync(TOPIC, [b"plain"], partition=0)
        expected = [r.value for r in log.reader(TOPIC, 0).records()]
        assert expected[2] == b"2" * 400 and expected[-1] == b"plain"
        arrow = pa.Table.from_batches(list(log.reader(TOPIC, 0).arrow()))
        assert arrow.column("value").to_pylist() == expected
        stored_flags = [f["flags"] for f in _dump(log_path)]
    assert [flags & 0b100000 for flags in stored_flags] == [0b100000, 0b100000, 0]
    assert stored_flags[0] & 0b11 == 1  # zstd paid for 400-byte repeated values
    for command in (["verify", log_path], ["dump", "--records", log_path]):
        done = subprocess.run([sys.executable, "-m", "streamlog", *command],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
    serve = ServeProcess(log_path, "--scrub-mib-per-s", "0", token="token")
    try:
        with streamlog.open_log(serve.url, token="token") as remote:
            assert [r.value for r in remote.reader(TOPIC, 0).records()] == expected
    finally:
        assert serve.stop() == 0


def _dump(log_path) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "streamlog", "dump", "--json",
                           "--stream", TOPIC, "--partition", "0", log_path],
                          capture_output=True, text=True, check=True)
    return [row for row in map(json.loads, done.stdout.splitlines()) if "flags" in row]
