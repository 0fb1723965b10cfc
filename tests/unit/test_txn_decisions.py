"""Log.commit_txns: transactions of several partitions committed as one, all or none,
whatever the moment a process dies (txn_decisions.py). The crashes are real: a child
process appends under three transactions and dies (os._exit) at a chosen step of the
commit; the parent opens the log and reads."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import streamlog
from streamlog.errors import InvalidArgument
from streamlog.txn import TxnState

CHILD = textwrap.dedent("""
    import os, sys
    import streamlog
    from streamlog import txn_decisions
    path, step = sys.argv[1], sys.argv[2]
    log = streamlog.open_log(path)
    log.create_stream("a", 2)
    log.create_stream("b", 1)
    parts = []
    for stream, number in (("a", 0), ("a", 1), ("b", 0)):
        txn = log.new_txn_id()
        log.append_batch_sync(stream, [b"%s%d-x" % (stream.encode(), number)] * 3,
                              partition=number, txn_id=txn)
        parts.append((stream, number, txn))
    commits = 0
    real_commit, real_append = log.commit_txn, log.append_internal_sync
    def commit_txn(*args, **kwargs):
        global commits
        if step == "after-1-marker" and commits == 1:
            os._exit(9)
        commits += 1
        return real_commit(*args, **kwargs)
    def append_internal_sync(stream, values, **kwargs):
        if step == "before-decision" and values[0]:
            os._exit(9)
        result = real_append(stream, values, **kwargs)
        if step == "after-decision" and values[0]:
            os._exit(9)
        if step == "before-completion" and not values[0]:
            os._exit(9)
        return result
    log.commit_txn, log.append_internal_sync = commit_txn, append_internal_sync
    log.commit_txns(parts, tag="job", marker=b"batch-7")
    os._exit(0)
""")


def run_child(path, step: str) -> int:
    return subprocess.run([sys.executable, "-c", CHILD, str(path), step],
                          capture_output=True, text=True, timeout=60).returncode


def committed_values(log) -> dict[str, list[bytes]]:
    out = {}
    for stream, number in (("a", 0), ("a", 1), ("b", 0)):
        out[f"{stream}/{number}"] = [r.value for r in log.reader(stream, number)]
    return out


@pytest.mark.parametrize("step, committed", [
    ("before-decision", False),  # nothing decided: the open aborts all three
    ("after-decision", True),  # decided, no marker yet: the open commits all three
    ("after-1-marker", True),  # one marker written: the open commits the other two
    ("before-completion", True),  # every marker, no completion record: nothing to do
    ("none", True),
])
def test_a_crash_at_any_step_commits_all_or_none(tmp_path, step, committed):
    code = run_child(tmp_path / "log", step)
    assert code == (0 if step == "none" else 9)
    with streamlog.open_log(tmp_path / "log") as log:
        found = committed_values(log)
        if committed:
            assert found == {"a/0": [b"a0-x"] * 3, "a/1": [b"a1-x"] * 3,
                             "b/0": [b"b0-x"] * 3}
            assert log.last_commit("a", 1, "job") == b"batch-7"
        else:
            assert found == {"a/0": [], "a/1": [], "b/0": []}
        for stream, number in (("a", 0), ("a", 1), ("b", 0)):  # nothing left open
            assert log.last_stable_offset(stream, number) == log.end_offset(stream, number)
    with streamlog.open_log(tmp_path / "log") as log:  # a second open changes nothing
        assert committed_values(log) == found
        ends = {s: log.end_offset(*s) for s in (("a", 0), ("a", 1), ("b", 0))}
    with streamlog.open_log(tmp_path / "log") as log:
        assert {s: log.end_offset(*s) for s in ends} == ends


def test_commit_txns_refuses_what_it_cannot_commit_whole(tmp_path):
    with streamlog.open_log(tmp_path / "log") as log:
        log.create_stream("a", 2)
        first, second = log.new_txn_id(), log.new_txn_id()
        log.append_batch_sync("a", [b"1"], partition=0, txn_id=first)
        log.append_batch_sync("a", [b"2"], partition=1, txn_id=second)
        log.abort_txn("a", 1, second)
        with pytest.raises(InvalidArgument, match="aborted"):
            log.commit_txns([("a", 0, first), ("a", 1, second)])
        assert log.txn_state("a", 0, first) is TxnState.OPEN  # nothing was committed
        with pytest.raises(InvalidArgument, match="no data"):
            log.commit_txns([("a", 0, first), ("a", 1, log.new_txn_id())])
        with pytest.raises(InvalidArgument, match="at most once"):
            log.commit_txns([("a", 0, first), ("a", 0, first)])
        offsets = log.commit_txns([("a", 0, first)])
        assert offsets == [1] and log.txn_state("a", 0, first) is TxnState.COMMITTED
        assert log.commit_txns([("a", 0, first)]) == [None]  # a retry: already done
