"""DESIGN 5: control records (commit markers, checkpoint notes) never move the
high-water mark, so an event-time replay of a sink-written log starts where its data
reaches the time, not at the first commit (whose timestamp is the wall clock)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import streamlog

T0 = 1_600_000_000_000_000  # the data's event time (2020); commits are written "now"
DATA = Path(__file__).parent.parent / "fixtures" / "index3_sink_log"


def _write(path) -> None:
    """Data, a committed transaction, more data: offsets 0-2, 3-4 (txn), 5 (commit), 6."""
    with streamlog.open_log(path) as log:
        log.create_stream("clicks", partitions=1)
        log.append_batch_sync("clicks", [b"a", b"b", b"c"],
                              timestamps_us=[T0, T0 + 10, T0 + 5], partition=0)
        txn = log.new_txn_id()
        log.append_batch_sync("clicks", [b"d", b"e"], timestamps_us=[T0 + 20, T0 + 30],
                              partition=0, txn_id=txn)
        log.commit_txn("clicks", 0, txn, tag="q", marker=b"0 5")
        log.append_batch_sync("clicks", [b"f"], timestamps_us=[T0 + 40], partition=0)


def _check(log) -> None:
    seek = lambda t: log.offset_for_timestamp("clicks", 0, t)  # noqa: E731
    assert seek(T0 + 25) == 4  # e (T0+30) is the first to reach it
    assert seek(T0 + 35) == 6  # not the commit at 5: its mark is still T0+30
    assert seek(T0 + 1000) == 7  # nothing reaches it: the end
    values = lambda t, **kw: [(r.offset, r.value) for r in log.reader(  # noqa: E731
        "clicks", 0, from_timestamp_us=t, **kw)]
    assert values(T0 + 35) == [(6, b"f")]
    assert values(T0 + 1000) == []
    assert [r.offset for r in log.reader("clicks", 0, from_timestamp_us=T0 + 25,
                                         data_only=False)] == [4, 5, 6]
    # a stop by time is the same rule: the commit does not end a replay early
    assert [r.offset for r in log.reader("clicks", 0, from_offset=0,
                                         to_timestamp_us=T0 + 35)] == [0, 1, 2, 3, 4]
    assert log.info()["streams"]["clicks"]["partitions"][0]["max_timestamp_us"] == T0 + 40


def test_commit_markers_do_not_move_the_high_water_mark(tmp_path):
    _write(tmp_path / "log")
    with streamlog.open_log(tmp_path / "log") as log:
        _check(log)
    with streamlog.open_log(tmp_path / "log", readonly=True) as log:
        _check(log)


def test_a_marker_first_leaves_no_mark(tmp_path):
    with streamlog.open_log(tmp_path / "log") as log:
        log.create_stream("s")
        log.append_sync("s", b"note", kind=streamlog.RecordKind.CHECKPOINT, partition=0)
        assert log.offset_for_timestamp("s", 0, 0) == 1  # a control record reaches no time
        log.append_sync("s", b"x", timestamp_us=T0, partition=0)
        assert log.offset_for_timestamp("s", 0, T0) == 1
    with streamlog.open_log(tmp_path / "log") as log:  # the same after recovery
        assert log.offset_for_timestamp("s", 0, T0) == 1
        assert [r.offset for r in log.reader("s", 0, from_timestamp_us=T0 - 1)] == [1]


@pytest.mark.parametrize("readonly", [False, True])
def test_a_log_written_before_the_rule_reads_by_it(tmp_path, readonly):
    """tests/fixtures/index3_sink_log was written by the previous index format (3), whose
    time index let the commit at offset 5 move the mark to the wall clock. Its index is
    derived data: it is rebuilt (or, read-only, bypassed) and the seeks follow DESIGN 5."""
    path = tmp_path / "log"
    shutil.copytree(DATA, path)
    with streamlog.open_log(path, readonly=readonly) as log:
        _check(log)
    done = subprocess.run([sys.executable, "-m", "streamlog", "verify", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
