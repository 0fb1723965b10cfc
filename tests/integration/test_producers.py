"""Transactional producers (DESIGN 6, txn.py): a stable transactional id; starting a
producer with it aborts its predecessors' open transactions at once and fences them.
Locally, across processes (the predecessor SIGKILLed while another process keeps the
log open, so no open of the log aborts it), and through a daemon."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import pytest

import streamlog
from streamlog import InvalidArgument, ProducerFenced, RecordKind
from streamlog.testing.serve import ServeProcess
from streamlog.txn import TxnState

S, TID = "out", "query-7/0"
TOKEN = "producer-test-token"


def committed(log, partition: int = 0) -> list[bytes]:
    return [r.value for r in log.reader(S, partition)]


def exercise(log) -> None:
    """The contract on any LogAPI (a local Log or a RemoteLog)."""
    first = log.init_producer(S, 0, TID)
    txn = log.begin_txn(S, 0, TID, first)
    log.append_batch_sync(S, [b"a1", b"a2"], partition=0, txn_id=txn)
    other = log.init_producer(S, 0, "another-id")  # another id: not a predecessor
    keep = log.begin_txn(S, 0, "another-id", other)
    log.append_sync(S, b"b1", partition=0, txn_id=keep)
    plain = log.new_txn_id()
    log.append_sync(S, b"c1", partition=0, txn_id=plain)
    assert log.last_stable_offset(S, 0) == first + 2  # the fence is 2 records; then BEGIN

    second = log.init_producer(S, 0, TID)  # the restart: a1, a2 aborted at once
    assert second > first
    assert log.txn_state(S, 0, txn) is TxnState.ABORTED
    assert log.txn_state(S, 0, keep) is TxnState.OPEN
    assert log.txn_state(S, 0, plain) is TxnState.OPEN
    with pytest.raises(ProducerFenced, match="epoch"):
        log.commit_txn(S, 0, txn, tag="q", marker=b"0")
    with pytest.raises(ProducerFenced):
        log.append_sync(S, b"a3", partition=0, txn_id=txn)
    with pytest.raises(ProducerFenced):
        log.begin_txn(S, 0, TID, first)

    fresh = log.begin_txn(S, 0, TID, second)
    log.append_batch_sync(S, [b"n1", b"n2"], partition=0, txn_id=fresh)
    log.commit_txn(S, 0, fresh, tag="q", marker=b"1")
    log.commit_txn(S, 0, keep, tag="other", marker=b"x")
    log.abort_txn(S, 0, plain)
    assert log.last_stable_offset(S, 0) == log.end_offset(S, 0)
    assert committed(log) == [b"b1", b"n1", b"n2"]
    assert log.last_commit(S, 0, "q") == b"1"

    with pytest.raises(InvalidArgument, match="reserved"):
        log.commit_txn(S, 0, log.begin_txn(S, 0, TID, second),
                       tag="streamlog.producer/" + TID, marker=b"")
    with pytest.raises(InvalidArgument, match="transactional_id"):
        log.init_producer(S, 0, "")
    with pytest.raises(InvalidArgument, match="epoch"):
        log.begin_txn(S, 0, TID, -1)


def test_a_new_producer_aborts_and_fences_its_predecessor(tmp_path):
    with streamlog.open_log(tmp_path / "log") as log:
        log.create_stream(S)
        exercise(log)
        control = [r.kind for r in log.reader(S, 0, data_only=False)
                   if r.kind is not RecordKind.DATA]
        assert RecordKind.PRODUCER in control and RecordKind.BEGIN in control


def test_epochs_outlive_a_restart_and_a_lost_index(tmp_path):
    path = tmp_path / "log"
    with streamlog.open_log(path) as log:
        log.create_stream(S)
        old = log.init_producer(S, 0, TID)
        new = log.init_producer(S, 0, TID)
        txn = log.begin_txn(S, 0, TID, new)
        log.append_sync(S, b"kept", partition=0, txn_id=txn)
        log.commit_txn(S, 0, txn)
    shutil.rmtree(path / "streams" / S / "0" / "index")  # a cache: rebuilt from segments
    with streamlog.open_log(path) as log:
        with pytest.raises(ProducerFenced):
            log.begin_txn(S, 0, TID, old)
        log.commit_txn(S, 0, log.begin_txn(S, 0, TID, new))  # still the current one
        assert committed(log) == [b"kept"]


def test_a_killed_producer_process_is_aborted_by_its_successor_at_once(tmp_path):
    """This process keeps the log open for writing throughout, so nothing else would
    abort the killed producer's transaction (only a log's first writable open does)."""
    path = str(tmp_path / "log")
    with streamlog.open_log(path) as log:
        log.create_stream(S)
        log.append_sync(S, b"before", partition=0)
        script = textwrap.dedent(f"""
            import os, signal, sys, streamlog
            log = streamlog.open_log(sys.argv[1])
            epoch = log.init_producer({S!r}, 0, {TID!r})
            txn = log.begin_txn({S!r}, 0, {TID!r}, epoch)
            log.append_batch_sync({S!r}, [b"lost"] * 100, partition=0, txn_id=txn)
            print(epoch, txn, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        """)
        done = subprocess.run([sys.executable, "-c", script, path], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == -9, done.stderr
        epoch, txn = map(int, done.stdout.split())
        log.append_sync(S, b"after", partition=0)
        assert log.txn_state(S, 0, txn) is TxnState.OPEN
        assert committed(log) == [b"before"]  # the orphan holds read_committed back
        assert log.init_producer(S, 0, TID) > epoch
        assert log.txn_state(S, 0, txn) is TxnState.ABORTED
        assert committed(log) == [b"before", b"after"]
        assert log.last_stable_offset(S, 0) == log.end_offset(S, 0)


def test_through_a_daemon_and_its_fenced_client(tmp_path, monkeypatch):
    daemon = ServeProcess(tmp_path / "log", token=TOKEN)
    monkeypatch.setenv("STREAMLOG_TOKEN", TOKEN)
    try:
        with streamlog.open_log(daemon.url) as log:
            log.create_stream(S)
            exercise(log)
        with streamlog.open_log(daemon.url) as old, streamlog.open_log(daemon.url) as new:
            epoch = old.init_producer(S, 0, TID)
            txn = old.begin_txn(S, 0, TID, epoch)
            old.append_sync(S, b"zombie", partition=0, txn_id=txn)
            new.init_producer(S, 0, TID)  # another client: the old one is fenced
            with pytest.raises(ProducerFenced):
                old.commit_txn(S, 0, txn, tag="q", marker=b"2")
            assert b"zombie" not in committed(new)
            assert new.last_stable_offset(S, 0) == new.end_offset(S, 0)
    finally:
        assert daemon.stop() == 0


# -- the Spark sink's use of them through a daemon (spark_sink/_remote.py) -------------

class SinkOptions:
    stream = "cut"
    partitions = 1

    def __init__(self, url: str) -> None:
        self.path = url


def _task(log, task: int, values: list[bytes]) -> dict:
    """What a streaming task's append_task leaves: {partition: [txn, rows, task]}."""
    from spark_sink import _remote
    entry = _remote._begin(log, "cut", 0, "q", task)
    log.append_batch_sync("cut", values, partition=0, txn_id=entry[0])
    entry[1] = len(values)
    return {0: entry}


def test_the_sink_replay_aborts_orphans_and_completes_a_commit_cut_short(tmp_path,
                                                                        monkeypatch):
    from spark_sink import _remote
    daemon = ServeProcess(tmp_path / "log", token=TOKEN)
    monkeypatch.setenv("STREAMLOG_TOKEN", TOKEN)
    try:
        options = SinkOptions(daemon.url)
        with streamlog.open_log(daemon.url) as log:
            log.create_stream("cut")
            # batch 3: both tasks appended, then the driver died before committing
            orphans = [_task(log, 0, [b"x0"]), _task(log, 1, [b"x1"])]
            assert log.last_stable_offset("cut", 0) < log.end_offset("cut", 0)
            # the replay's tasks start: the orphans are aborted at once, not at a timeout
            replay = [_task(log, 0, [b"x0"]), _task(log, 1, [b"x1"])]
            for task in orphans:
                assert log.txn_state("cut", 0, task[0][0]) is TxnState.ABORTED
            assert _remote.commit_streaming(options, replay, 3, "q") == {0: "committed"}
            assert log.last_stable_offset("cut", 0) == log.end_offset("cut", 0)
            assert sorted(committed_of(log)) == [b"x0", b"x1"]

            # batch 4: the driver committed task 0's transaction, then died
            first = [_task(log, 0, [b"a0"]), _task(log, 1, [b"a1"])]
            txns = sorted(t[0][0] for t in first)
            tasks = {t[0][0]: t[0][2] for t in first}
            log.commit_txn("cut", 0, first[0][0][0], tag="q",
                           marker=_remote.encode_marker(4, 0, txns, tasks))
            # the replay: task 1's producer aborts the transaction left open...
            again = [_task(log, 0, [b"a0"]), _task(log, 1, [b"a1"])]
            assert log.txn_state("cut", 0, first[1][0][0]) is TxnState.ABORTED
            # ...and the commit puts task 1's new one in its place, task 0's aside
            assert _remote.commit_streaming(options, again, 4, "q") == {0: "completed"}
            assert sorted(committed_of(log)) == [b"a0", b"a1", b"x0", b"x1"]
            assert log.txn_state("cut", 0, again[0][0][0]) is TxnState.ABORTED
            assert log.last_stable_offset("cut", 0) == log.end_offset("cut", 0)
            # a later replay of batch 4 is skipped
            late = [_task(log, 0, [b"a0"])]
            assert _remote.commit_streaming(options, late, 4, "q") == {0: "skipped"}
            assert sorted(committed_of(log)) == [b"a0", b"a1", b"x0", b"x1"]
    finally:
        assert daemon.stop() == 0


def committed_of(log) -> list[bytes]:
    return [r.value for r in log.reader("cut", 0)]


@pytest.mark.parametrize("kind", [RecordKind.PRODUCER, RecordKind.BEGIN])
def test_only_the_log_writes_fences_and_begins(tmp_path, kind):
    """A forged fence or BEGIN could abort or fence someone else's producer."""
    with streamlog.open_log(tmp_path / "log") as log:
        log.create_stream(S)
        with pytest.raises(streamlog.InvalidAppend, match=kind.name):
            log.append_sync(S, TID.encode(), partition=0, kind=kind, txn_id=log.new_txn_id())
        assert log.end_offset(S, 0) == 0
