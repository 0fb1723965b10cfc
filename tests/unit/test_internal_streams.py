"""Stream names by Kafka's topic rule, streamlog's own streams (names starting with
"__"), the Kafka listener's committed offsets in `__consumer_offsets` (carried over
from an old log's `kafka.consumer_offsets`), and ListOffsets MAX_TIMESTAMP."""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pytest

import streamlog
from streamlog.errors import InternalStream, InvalidArgument, InvalidStreamName
from streamlog.kafka.broker import Broker
from streamlog.kafka.errors import ErrorCode
from streamlog.kafka.offsets import CARRIED_OVER, OFFSETS_STREAM
from streamlog.testing import MemoryFileIO
from streamlog.testing.memindex import MemoryIndexStorage


def test_names_kafka_accepts_are_streams_and_keep_their_records(tmp_path):
    names = ["_schemas", "-leading-dash", ".hidden", ".lock", "a" * 249, "x.y_z-0",
             "_confluent-ksql-default__command_topic", "..."]
    with streamlog.open_log(tmp_path / "log") as log:
        for number, name in enumerate(names):
            log.create_stream(name, 1)
            log.append_sync(name, b"%d" % number)
        assert log.streams() == sorted(names)
    with streamlog.open_log(tmp_path / "log") as log:  # found again from the folders
        assert log.streams() == sorted(names)
        for number, name in enumerate(names):
            assert [r.value for r in log.reader(name, 0)] == [b"%d" % number]
    # the log's own file is not a stream, and a "." name has a folder of its own
    assert (tmp_path / "log" / "streams" / ".lock").is_file()
    assert (tmp_path / "log" / "streams" / "%.lock" / "stream.json").is_file()


@pytest.mark.parametrize("name", ["", ".", "..", "a" * 250, "with space", "slash/x",
                                  "colon:x", "é", "%x", None, 7])
def test_names_kafka_refuses_are_refused(tmp_path, name):
    with streamlog.open_log(tmp_path / "log") as log:
        with pytest.raises(InvalidStreamName):
            log.create_stream(name, 1)
        assert log.streams() == []


def test_internal_streams_are_read_by_all_and_written_only_through_the_door():
    fileio = MemoryFileIO()
    with streamlog.open_log("/log", fileio=fileio,
                            index_storage=MemoryIndexStorage()) as log:
        with pytest.raises(InternalStream):
            log.create_stream("__mine", 1)
        with pytest.raises(InvalidArgument, match="not an internal stream name"):
            log.create_internal_stream("plain", 1)
        assert log.create_internal_stream("__mine", 2) == 2
        log.append_internal_sync("__mine", [b"ok"], keys=[b"k"], partition=1)
        for write in (lambda: log.append_sync("__mine", b"forged", partition=1),
                      lambda: log.append_batch_sync("__mine", [b"forged"], partition=1),
                      lambda: log.append_columns_sync("__mine", {"value": pa.array([b"forged"])},
                                                      partition=1)):
            with pytest.raises(InternalStream):
                write()
        with log.producer("__mine") as producer:
            with pytest.raises(InternalStream):
                producer.send(b"forged", partition=1).result(timeout=5)
        assert [r.value for r in log.reader("__mine", 1)] == [b"ok"]
        with pytest.raises(InvalidArgument, match="not an internal stream"):
            log.append_internal_sync("plain", [b"x"])


def test_committed_offsets_are_internal_and_a_forged_produce_is_refused(tmp_path):
    with streamlog.open_log(tmp_path / "log") as log:
        log.create_stream("t", 1)
        broker = Broker(log)
        assert broker.commit_offsets("g", [("t", 0, 5, "m")])[("t", 0)] == ErrorCode.none
        assert OFFSETS_STREAM in log.streams()
        with pytest.raises(InternalStream):  # the attack that worked on the old stream
            log.append_sync(OFFSETS_STREAM, json.dumps({"offset": 0}).encode(),
                            key=b"g\0t\x000")
        code, _base = broker._produce_partition("t", 0, b"")  # (a plain stream: fine)
        assert code == ErrorCode.none
    with streamlog.open_log(tmp_path / "log") as log:
        assert Broker(log).committed("g") == {("t", 0): (5, "m")}


def _old_log_with_commits(path) -> None:
    """A log as the listener wrote it before the offsets stream was internal."""
    with streamlog.open_log(path) as log:
        log.create_stream("t", 2)
        log.create_stream("kafka.consumer_offsets", 1)
        rows = [("g", 0, 3, None), ("g", 1, 9, "meta"), ("h", 0, 1, None),
                ("g", 0, 4, "later")]
        log.append_batch_sync("kafka.consumer_offsets", [
            json.dumps({"offset": o, "metadata": m}).encode() for _g, _p, o, m in rows],
            keys=[f"{g}\0t\0{p}".encode() for g, p, _o, _m in rows], partition=0)
        log.append_sync("kafka.consumer_offsets", b"not json", key=b"g\0t\x001")


def test_an_old_logs_offsets_are_carried_over_once(tmp_path):
    _old_log_with_commits(tmp_path / "log")
    expected = {"g": {("t", 0): (4, "later"), ("t", 1): (9, "meta")},
                "h": {("t", 0): (1, None)}}
    for _ in range(2):  # the second start reads the copy, copies nothing again
        with streamlog.open_log(tmp_path / "log") as log:
            broker = Broker(log)
            assert {g: broker.committed(g) for g in ("g", "h")} == expected
            keys = [r.key for r in log.reader(OFFSETS_STREAM, 0)]
            assert keys.count(CARRIED_OVER) == 1 and len(keys) == 5
    with streamlog.open_log(tmp_path / "log") as log:  # the old stream now counts for nothing
        log.append_sync("kafka.consumer_offsets", json.dumps({"offset": 0}).encode(),
                        key=b"g\0t\x000")
        assert Broker(log).committed("g")[("t", 0)] == (4, "later")


def test_a_carry_over_cut_short_is_done_again(tmp_path):
    _old_log_with_commits(tmp_path / "log")
    with streamlog.open_log(tmp_path / "log") as log:  # a copy killed before its end
        log.create_internal_stream(OFFSETS_STREAM, 1)
        log.append_internal_sync(OFFSETS_STREAM, [json.dumps({"offset": 3}).encode()],
                                 keys=[b"g\0t\x000"])
    with streamlog.open_log(tmp_path / "log") as log:
        broker = Broker(log)
        assert broker.committed("g") == {("t", 0): (4, "later"), ("t", 1): (9, "meta")}
        assert [r.key for r in log.reader(OFFSETS_STREAM, 0)].count(CARRIED_OVER) == 1


def test_deleted_offsets_stay_deleted_after_a_restart(tmp_path):
    with streamlog.open_log(tmp_path / "log") as log:
        log.create_stream("t", 2)
        broker = Broker(log)
        broker.commit_offsets("g", [("t", 0, 5, None), ("t", 1, 6, None)])
        broker.commit_offsets("h", [("t", 0, 1, None)])
        assert broker.offsets.delete("g", [("t", 1), ("t", 9)]) == 1
        assert broker.offsets.delete("h") == 1
        assert broker.offsets.groups() == ["g"]
    with streamlog.open_log(tmp_path / "log") as log:
        broker = Broker(log)
        assert broker.committed("g") == {("t", 0): (5, None)}
        assert broker.committed("h") == {} and broker.offsets.groups() == ["g"]


def _brute_force_max(timestamps):
    top = max(timestamps)
    return timestamps.index(top), top


@pytest.mark.parametrize("seed", range(4))
def test_list_offsets_max_timestamp_is_the_first_record_with_the_largest(tmp_path, seed):
    rng = random.Random(seed)
    timestamps = [rng.randrange(1_000, 50_000) * 1000 for _ in range(300)]
    with streamlog.open_log(tmp_path / "log", segment_bytes_max=4096) as log:
        log.create_stream("t", 1)
        broker = Broker(log)
        assert broker._list_offset("t", 0, -3, committed=False) == {
            "offset": -1, "timestamp": -1}  # empty: Kafka's answer
        for at in range(0, len(timestamps), 37):
            log.append_batch_sync("t", [b"v"] * len(timestamps[at:at + 37]),
                                  timestamps_us=timestamps[at:at + 37], partition=0)
        offset, top = _brute_force_max(timestamps)
        assert broker._list_offset("t", 0, -3, committed=False) == {
            "offset": offset, "timestamp": top // 1000}
    with streamlog.open_log(tmp_path / "log") as log:  # the same after a reopen
        assert Broker(log)._list_offset("t", 0, -3, committed=False) == {
            "offset": offset, "timestamp": top // 1000}


def test_max_timestamp_is_a_data_record_when_a_marker_holds_the_largest(tmp_path):
    """A transaction's commit marker is stamped at append time, after its data's event
    times: MAX_TIMESTAMP still names the data record with the largest timestamp."""
    with streamlog.open_log(tmp_path / "log") as log:
        log.create_stream("t", 1)
        log.append_batch_sync("t", [b"a", b"b", b"c"], partition=0,
                              timestamps_us=[5_000, 9_000, 7_000])
        txn = log.new_txn_id()
        log.append_batch_sync("t", [b"d", b"e"], partition=0, txn_id=txn,
                              timestamps_us=[8_000, 9_000])
        log.commit_txn("t", 0, txn)  # stamped now: far past 9 ms
        assert Broker(log)._list_offset("t", 0, -3, committed=False) == {
            "offset": 1, "timestamp": 9}
        only = log.new_txn_id()
        log.create_stream("u", 1)
        log.append_batch_sync("u", [b"x"], partition=0, txn_id=only, timestamps_us=[1_000])
        log.abort_txn("u", 0, only)
        assert Broker(log)._list_offset("u", 0, -3, committed=False) == {
            "offset": 0, "timestamp": 1}
