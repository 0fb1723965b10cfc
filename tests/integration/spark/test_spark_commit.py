"""The sink's driver-side commit without Spark: what a replayed, half-done or crashed
micro-batch leaves in the log, in both modes. Spark only calls these functions; the
crash cases are set up here directly, and in a child process killed mid-transaction."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pyarrow as pa
import pytest
from pyspark.sql import types as T

import streamlog
from spark_sink._columns import ColumnMap, staged_schema
from spark_sink._commit import commit_streaming, ensure_stream, parse_marker
from spark_sink._options import parse_sink_options
from spark_sink._staging import Stager, collect_garbage, staging_root

SCHEMA = T.StructType([T.StructField("key", T.StringType()),
                       T.StructField("value", T.BinaryType())])
TAG = "query-1"


def sink(path, mode="transactional", **options):
    parsed = parse_sink_options({"path": str(path), "stream": "out", "partitions": "2",
                                 "mode": mode, **options})
    ensure_stream(parsed)
    return parsed


def stage(options, batch_id: int, values: list[bytes]) -> str:
    columns = ColumnMap.from_schema(SCHEMA, 2)
    stager = Stager(os.path.join(staging_root(options.path), TAG, str(batch_id)),
                    staged_schema(False))
    keys = [f"k{i % 7}" for i in range(len(values))]
    stager.write(columns.stage(pa.record_batch({"key": pa.array(keys),
                                                 "value": pa.array(values, pa.binary())})))
    return stager.finish()


def batch_values(batch_id: int, count: int = 20) -> list[bytes]:
    return [b"b%d-%03d" % (batch_id, i) for i in range(count)]


def visible(path, *, read_committed=True) -> list[bytes]:
    with streamlog.open_log(path, readonly=True) as log:
        return sorted(r.value for n in range(2)
                      for r in log.reader("out", n, read_committed=read_committed))


def markers(path) -> list:
    with streamlog.open_log(path, readonly=True) as log:
        return [parse_marker(log.last_commit("out", n, TAG)) for n in range(2)]


@pytest.mark.parametrize("mode", ["transactional", "truncate"])
def test_replayed_batch_is_skipped(tmp_path, mode):
    options = sink(tmp_path / "log", mode)
    for batch_id in (0, 1):
        outcome = commit_streaming(options, [stage(options, batch_id, batch_values(batch_id))],
                                   batch_id, TAG)
        assert set(outcome.values()) == {"committed"}
    before = visible(tmp_path / "log", read_committed=False)
    again = commit_streaming(options, [stage(options, 1, batch_values(1))], 1, TAG)
    assert again == {0: "skipped", 1: "skipped"}
    assert visible(tmp_path / "log", read_committed=False) == before
    assert visible(tmp_path / "log") == sorted(batch_values(0) + batch_values(1))
    assert [m[0] for m in markers(tmp_path / "log")] == [1, 1]


def test_commit_that_died_between_partitions_is_completed_once(tmp_path):
    options = sink(tmp_path / "log")
    commit_streaming(options, [stage(options, 0, batch_values(0))], 0, TAG)
    # Batch 1 reached partition 0 only: commit its rows there by hand, as the commit did.
    path = stage(options, 1, batch_values(1))
    from spark_sink._commit import _append_in_txn, gather_runs
    with streamlog.open_log(tmp_path / "log") as log:
        _append_in_txn(log, "out", 0, gather_runs([path])[0], TAG, "1")
    assert [m[0] for m in markers(tmp_path / "log")] == [1, 0]
    outcome = commit_streaming(options, [path], 1, TAG)
    assert outcome == {0: "skipped", 1: "committed"}
    assert visible(tmp_path / "log") == sorted(batch_values(0) + batch_values(1))


CRASH_IN_TXN = """
import os, signal, sys
import streamlog
with streamlog.open_log(sys.argv[1]) as log:
    txn = log.new_txn_id()
    log.append_batch_sync("out", [b"half-done"] * 5, partition=0, txn_id=txn)
    if sys.argv[2] == "plain":
        log.append_batch_sync("out", [b"half-done"] * 5, partition=1)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def crash_mid_commit(path, how: str) -> None:
    """A child process appends like a commit would, and is killed before its marker."""
    run = subprocess.run([sys.executable, "-c", CRASH_IN_TXN, str(path), how], timeout=60)
    assert run.returncode == -9


def test_data_of_a_crashed_commit_never_becomes_visible(tmp_path):
    options = sink(tmp_path / "log")
    commit_streaming(options, [stage(options, 0, batch_values(0))], 0, TAG)
    crash_mid_commit(tmp_path / "log", "txn")
    commit_streaming(options, [stage(options, 1, batch_values(1))], 1, TAG)
    assert visible(tmp_path / "log") == sorted(batch_values(0) + batch_values(1))
    assert b"half-done" in visible(tmp_path / "log", read_committed=False)


def test_truncate_mode_cuts_output_after_the_last_marker(tmp_path):
    options = sink(tmp_path / "log", "truncate")
    crash_mid_commit(tmp_path / "log", "plain")  # before any marker: start markers come first
    commit_streaming(options, [stage(options, 0, batch_values(0))], 0, TAG)
    # The junk before batch 0's start markers stays: it was there before the query.
    assert visible(tmp_path / "log").count(b"half-done") == 5
    crash_mid_commit(tmp_path / "log", "plain")  # batch 1's first attempt dies
    commit_streaming(options, [stage(options, 1, batch_values(1))], 1, TAG)
    expected = sorted(batch_values(0) + batch_values(1) + [b"half-done"] * 5)
    assert visible(tmp_path / "log") == expected
    # Batch 1's leftovers are gone from disk; only the first crash's (5 plain, and 5 in
    # a transaction aborted by the next writable open) remain before the start markers.
    assert visible(tmp_path / "log", read_committed=False).count(b"half-done") == 10


def test_truncate_mode_first_batch_leftovers_are_cut(tmp_path):
    options = sink(tmp_path / "log", "truncate")
    values = batch_values(0)
    path = stage(options, 0, values)
    from spark_sink._commit import START_BATCH, _append_runs, _marker, gather_runs
    with streamlog.open_log(tmp_path / "log") as log:  # the first attempt got this far
        _marker(log, "out", 1, TAG, START_BATCH)
        _append_runs(log, "out", 1, gather_runs([path])[1], txn_id=0)
    assert markers(tmp_path / "log")[1][0] == START_BATCH
    commit_streaming(options, [path], 0, TAG)
    assert visible(tmp_path / "log", read_committed=False) == sorted(values)


def test_commit_goes_on_while_another_process_writes_the_log(tmp_path):
    """DESIGN 9: the driver's commit does not wait for another writer process to
    close the log; both appends land, each under its own offsets."""
    options = sink(tmp_path / "log")
    path = stage(options, 0, batch_values(0))
    ready = tmp_path / "ready"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time, streamlog\n"
        "log = streamlog.open_log(sys.argv[1])\n"
        "log.append_sync('out', b'theirs', partition=0)\n"
        "open(sys.argv[2], 'w').close()\n"
        "time.sleep(120)\n"), str(tmp_path / "log"), str(ready)])
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert holder.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        assert set(commit_streaming(options, [path], 0, TAG).values()) == {"committed"}
        assert holder.poll() is None  # it was open for writing all along
    finally:
        holder.kill()
        holder.wait()
    assert visible(tmp_path / "log") == sorted(batch_values(0) + [b"theirs"])


def test_foreign_marker_under_our_tag_is_an_error(tmp_path):
    options = sink(tmp_path / "log")
    with streamlog.open_log(tmp_path / "log") as log:
        txn = log.new_txn_id()
        log.append_batch_sync("out", [b"x"], partition=0, txn_id=txn)
        log.commit_txn("out", 0, txn, tag=TAG, marker=b"not a batch")
    with pytest.raises(streamlog.StreamLogError, match="same transactionalId"):
        commit_streaming(options, [stage(options, 0, batch_values(0))], 0, TAG)


def test_garbage_collection_of_staging(tmp_path):
    options = sink(tmp_path / "log")
    for batch_id in (3, 4, 5):
        stage(options, batch_id, [b"x"])
    collect_garbage(options.path, TAG, through_batch=4)
    assert os.listdir(os.path.join(staging_root(options.path), TAG)) == ["5"]


def test_a_killed_commit_is_aborted_at_the_restarts_first_commit_beside_a_producer(tmp_path):
    """A producer process keeps the log open for writing throughout (so no open of
    the log aborts anything), a commit is SIGKILLed mid-transaction, and the restarted
    query's first commit aborts its open transaction (DESIGN 6): everything committed
    is visible at once, nothing of the killed attempt ever is."""
    options = sink(tmp_path / "log")
    producer = subprocess.Popen([sys.executable, "-c", (
        "import sys, time, streamlog\n"
        "log = streamlog.open_log(sys.argv[1])\n"
        "for i in range(10**6):\n"
        "    log.append_sync('out', b'p%06d' % i, partition=i % 2)\n"
        "    if i == 0:\n"
        "        print('appending', flush=True)\n"
        "    time.sleep(0.005)\n"), str(tmp_path / "log")], stdout=subprocess.PIPE,
        text=True)
    try:
        assert producer.stdout.readline().strip() == "appending"  # it writes beside us
        killed = subprocess.run([sys.executable, "-c", (
            "import os, signal, sys, streamlog\n"
            "log = streamlog.open_log(sys.argv[1])\n"
            f"epoch = log.init_producer('out', 0, {TAG + '/0'!r})\n"
            f"txn = log.begin_txn('out', 0, {TAG + '/0'!r}, epoch)\n"
            "log.append_batch_sync('out', [b'killed'] * 50, partition=0, txn_id=txn)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n"), str(tmp_path / "log")],
            capture_output=True, text=True, timeout=120)
        assert killed.returncode == -9, killed.stderr
        with streamlog.open_log(tmp_path / "log", readonly=True) as log:
            assert log.last_stable_offset("out", 0) < log.end_offset("out", 0)
        started = time.monotonic()
        outcome = commit_streaming(options, [stage(options, 0, batch_values(0))], 0, TAG)
        assert set(outcome.values()) == {"committed"}
        assert time.monotonic() - started < 30  # no lock wait, no transaction timeout
        producer.kill()  # (a moving end would make the comparison below racy)
        producer.wait(10)
        with streamlog.open_log(tmp_path / "log", readonly=True) as log:
            stable = [log.last_stable_offset("out", n) for n in range(2)]
            ends = [log.end_offset("out", n) for n in range(2)]
        assert stable == ends  # nothing open holds read_committed readers back
        seen = visible(tmp_path / "log")
        assert b"killed" not in seen
        assert sorted(v for v in seen if v.startswith(b"b0-")) == sorted(batch_values(0))
        assert any(v.startswith(b"p") for v in seen)  # the producer's records are there
    finally:
        producer.kill()
        producer.wait(10)


def test_commits_that_alternate_between_processes_fence_nothing_of_their_own(tmp_path):
    """Spark may run a query's successive commits in different Python processes. Each
    process starts the query's producer on its first commit, which fences the epoch
    another process cached: that process's next commit starts the producer again
    rather than failing the query, and every batch lands exactly once."""
    options = sink(tmp_path / "log")
    child = ("import sys\n"
             "from spark_sink._commit import commit_streaming\n"
             "from spark_sink._options import parse_sink_options\n"
             "options = parse_sink_options({'path': sys.argv[1], 'stream': 'out',\n"
             "                              'partitions': '2'})\n"
             "print(commit_streaming(options, [sys.argv[2]], int(sys.argv[3]), sys.argv[4]))\n")
    for batch_id in range(4):
        path = stage(options, batch_id, batch_values(batch_id))
        if batch_id % 2:
            done = subprocess.run([sys.executable, "-c", child, str(tmp_path / "log"), path,
                                   str(batch_id), TAG], capture_output=True, text=True,
                                  timeout=120)
            assert done.returncode == 0, done.stderr
            assert "committed" in done.stdout
        else:  # this process: its cached epoch was fenced by the child's commit
            assert set(commit_streaming(options, [path], batch_id, TAG).values()) == {"committed"}
    assert visible(tmp_path / "log") == sorted(v for b in range(4) for v in batch_values(b))
    assert [m[0] for m in markers(tmp_path / "log")] == [3, 3]


def test_a_producer_fenced_right_after_starting_it_is_not_retried(tmp_path, monkeypatch):
    """Only an epoch cached from an earlier commit is started again: one this commit
    started and then found fenced means a second writer under the same tag, and the
    commit fails with ProducerFenced."""
    from spark_sink import _commit
    options = sink(tmp_path / "log")
    path = stage(options, 0, batch_values(0))
    monkeypatch.setattr(_commit, "_EPOCHS", {})
    real_begin = streamlog.Log.begin_txn

    def begin_after_a_rival(self, stream, number, producer, epoch):
        self.init_producer(stream, number, producer)  # a rival starts it in between
        return real_begin(self, stream, number, producer, epoch)

    monkeypatch.setattr(streamlog.Log, "begin_txn", begin_after_a_rival)
    with pytest.raises(streamlog.ProducerFenced):
        commit_streaming(options, [path], 0, TAG)
