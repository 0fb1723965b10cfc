"""The daemon sink through a driver crash (DESIGN 6): a streaming query writing to a
daemon's log is SIGKILLed after its tasks appended a micro-batch in open transactions
and before the driver committed them. Those orphans would hold every read_committed
reader back until the daemon's transaction timeout; the restarted query's tasks, the
same producers (query, partition, task), abort them as they start. So within a second
of the restarted query's first commit nothing of the killed attempt is open, and in
the end every input's result is there exactly once."""

from __future__ import annotations

import collections
import os
import signal
import time

import pytest
from spark_helpers import EPOCH_US, write_log
from test_spark_exactly_once import Job

import streamlog
from streamlog.testing.serve import ServeProcess
from streamlog.txn import TxnState

pytestmark = pytest.mark.slow
TOKEN = "daemon-kill-test-token"


def open_txns(log) -> set[int]:
    ids = {r.txn_id for n in range(2)
           for r in log.reader("out", n, read_committed=False, data_only=False) if r.txn_id}
    return {t for t in ids if any(log.txn_state("out", n, t) is TxnState.OPEN
                                  for n in range(2))}


@pytest.mark.timeout(900)
def test_a_killed_query_through_a_daemon_hides_nothing_after_its_restart(tmp_path,
                                                                        monkeypatch):
    monkeypatch.setenv("STREAMLOG_TOKEN", TOKEN)
    source, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    rows = {n: [(b"k%d" % (i % 11), b"d%d-%04d" % (n, i), EPOCH_US + i) for i in range(150)]
            for n in range(2)}  # 3 micro-batches of 100 offsets
    write_log(source, "in", rows)
    inputs = [value for records in rows.values() for _, value, _ in records]
    daemon = ServeProcess(tmp_path / "out", token=TOKEN)
    try:
        args = [str(source), daemon.url, str(checkpoint), "transactional"]
        crashed = Job(args + ["before-commit:1"], tmp_path / "job-crash.log")
        code = crashed.finish(timeout_s=600)[1]
        assert code == -signal.SIGKILL, (tmp_path / "job-crash.log").read_text()[-3000:]
        with streamlog.open_log(daemon.url) as log:
            orphans = open_txns(log)
            assert orphans, "the crash left no open transaction to clean up"
            hidden = [log.last_stable_offset("out", n) < log.end_offset("out", n)
                      for n in range(2)]
            assert any(hidden)

            restarted = Job(args, tmp_path / "job-final.log")
            assert restarted.wait_for_progress(1, timeout_s=300)
            committed_at = time.monotonic()
            while orphans & open_txns(log):
                assert time.monotonic() - committed_at < 1.0, \
                    f"still open: {sorted(orphans & open_txns(log))}"
                time.sleep(0.05)
            for txn in orphans:
                assert all(log.txn_state("out", n, txn) in (None, TxnState.ABORTED)
                           for n in range(2))
            output, code = restarted.finish(timeout_s=600)
            assert code == 0, (tmp_path / "job-final.log").read_text()[-3000:]
            assert output.endswith("done")
            values = [r.value for n in range(2) for r in log.reader("out", n)]
            assert not open_txns(log)
    finally:
        assert daemon.stop() == 0
    counts = collections.Counter(values)
    assert set(counts) == {b"out-" + value for value in inputs}
    assert [v for v, c in counts.items() if c > 1] == []
    assert os.path.isdir(checkpoint)
