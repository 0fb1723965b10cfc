"""Several writer processes on one local log (DESIGN 9), one situation at a time.

This process holds the log open for writing; a child process (a short script) is the
other writer. Each test leaves the files as a writer killed at a chosen point would, or
has the other writer roll, delete or truncate, then shows that this writer catches up
before it writes: offsets stay dense, nothing acknowledged is lost, a torn tail is cut,
and `streamlog verify` finds the log sound. tests/sim/test_multi_writer.py kills real
writers at random.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import streamlog
from streamlog.fileio import OsFileIO
from streamlog.frame import encode_frame
from streamlog.locks import PartitionLock
from streamlog.payload import encode_payload
from streamlog.txn import TxnState

STREAM = "s"


def other(path: str, body: str, *, check: bool = True) -> subprocess.CompletedProcess:
    """Run `body` in another process with `log` open for writing at `path`."""
    script = ("import os, signal, sys, streamlog\n"
              "log = streamlog.open_log(sys.argv[1], segment_bytes_max=8192)\n"
              + textwrap.dedent(body))
    done = subprocess.run([sys.executable, "-c", script, path], capture_output=True,
                          text=True, timeout=120)
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


def verify(path: str) -> None:
    done = subprocess.run([sys.executable, "-m", "streamlog", "verify", path],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def values(log, partition: int = 0) -> list[bytes]:
    return [r.value for r in log.reader(STREAM, partition)]


def active_segment(path: str) -> str:
    return sorted(glob.glob(os.path.join(path, "streams", STREAM, "0", "*.log")))[-1]


def frame_bytes(base_offset: int, value: bytes) -> bytes:
    raw, flags = encode_payload([1000], [None], [value], None, None)
    return encode_frame(base_offset=base_offset, record_count=1, min_timestamp_us=1000,
                        max_timestamp_us=1000, txn_id=0, flags=flags, raw_bytes=len(raw),
                        payload=raw)


@pytest.fixture
def log_path(tmp_path):
    path = str(tmp_path / "log")
    with streamlog.open_log(path) as log:
        log.create_stream(STREAM)
    return path


def killed_mid_commit(path: str, tail: str) -> None:
    """The other writer appends one record, then dies holding the commit lock with
    `tail` (a Python bytes literal) half-written."""
    done = other(path, f"""
        log.append_sync("s", b"theirs", timestamp_us=1000)
        from streamlog.locks import PartitionLock
        from streamlog.fileio import OsFileIO
        lock = PartitionLock(OsFileIO(), os.path.join(sys.argv[1], "streams", "s", "0"),
                             writable=True)
        lock.acquire()
        lock.bump()
        import glob
        segment = sorted(glob.glob(os.path.join(os.path.dirname(lock.path), "*.log")))[-1]
        with open(segment, "ab") as handle:
            handle.write({tail})
        os.kill(os.getpid(), signal.SIGKILL)
    """, check=False)
    assert done.returncode == -9, done.stderr  # died where it was meant to


def test_a_torn_frame_left_by_a_killed_writer_is_cut_before_the_next_commit(log_path):
    with streamlog.open_log(log_path) as log:
        log.append_sync(STREAM, b"mine")
        size_before = os.path.getsize(active_segment(log_path))
        from streamlog.frame import HEADER_BYTES
        killed_mid_commit(log_path, f"{frame_bytes(2, b'torn' * 50)[:HEADER_BYTES + 7]!r}")
        assert os.path.getsize(active_segment(log_path)) > size_before
        assert log.append_sync(STREAM, b"mine again").offset == 2
        assert values(log) == [b"mine", b"theirs", b"mine again"]
    verify(log_path)


def test_a_whole_frame_a_killed_writer_did_not_index_is_taken_in(log_path):
    with streamlog.open_log(log_path) as log:
        log.append_sync(STREAM, b"mine", timestamp_us=500)
        killed_mid_commit(log_path, f"{frame_bytes(2, b'written, never acknowledged')!r}")
        assert log.append_sync(STREAM, b"mine again", timestamp_us=2000).offset == 3
        assert values(log) == [b"mine", b"theirs", b"written, never acknowledged",
                               b"mine again"]
        assert log.offset_for_timestamp(STREAM, 0, 1000) == 1
        assert log.offset_for_timestamp(STREAM, 0, 1500) == 3
    with streamlog.open_log(log_path, readonly=True) as view:
        assert view.end_offset(STREAM, 0) == 4
    verify(log_path)


def test_rolls_retention_and_truncate_by_another_writer(log_path):
    def numbers(log):
        return [int(r.value[:5]) for r in log.reader(STREAM, 0)]

    with streamlog.open_log(log_path, segment_bytes_max=8192) as log:
        for n in range(20):
            log.append_sync(STREAM, b"%05d" % n + os.urandom(500))
        # The other writer appends enough to roll several segments, then applies
        # retention: this writer's segments are sealed and deleted under it.
        other(log_path, """
            for n in range(20, 80):
                log.append_sync("s", b"%05d" % n + os.urandom(500))
            log.close()
            log = streamlog.open_log(sys.argv[1], segment_bytes_max=8192,
                                     retention_bytes=20000)
            assert len(log.apply_retention()) > 0
        """)
        assert log.append_sync(STREAM, b"00080").offset == 80
        start = log.start_offset(STREAM, 0)
        assert start > 0  # this writer saw the retention
        assert numbers(log) == list(range(start, 81))
        # Now the other writer truncates; this one's next append follows the cut.
        other(log_path, "assert log.truncate_after('s', 0, 70) == 71")
        assert log.append_sync(STREAM, b"00071").offset == 71
        assert numbers(log) == list(range(start, 72))
    verify(log_path)


def test_a_follower_in_a_writer_process_sees_the_other_writers_appends(log_path):
    with streamlog.open_log(log_path) as log:
        seen = []
        reader = log.reader(STREAM, 0, follow=True)

        def follow():
            for record in reader:
                seen.append(record.value)
                if len(seen) == 3:
                    return

        thread = threading.Thread(target=follow, daemon=True)
        thread.start()
        log.append_sync(STREAM, b"mine")
        other(log_path, 'log.append_sync("s", b"theirs"); log.append_sync("s", b"more")')
        thread.join(timeout=10)
        assert seen == [b"mine", b"theirs", b"more"]
        reader.close()


def test_a_read_only_view_waits_for_a_commit_in_progress(log_path):
    with streamlog.open_log(log_path) as log:
        log.append_sync(STREAM, b"one")
        view = streamlog.open_log(log_path, readonly=True)
        try:
            # Hold the commit lock as a writer in the middle of a commit would, with a
            # whole frame written: the view must not take it in before the lock goes.
            lock = PartitionLock(OsFileIO(), os.path.dirname(active_segment(log_path)),
                                 writable=True)
            lock.acquire()
            lock.bump()
            with open(active_segment(log_path), "ab") as handle:
                handle.write(frame_bytes(1, b"committing"))
            refreshed = threading.Event()
            threading.Thread(target=lambda: (view.refresh(), refreshed.set()),
                             daemon=True).start()
            time.sleep(0.3)
            assert not refreshed.is_set()
            assert view.end_offset(STREAM, 0) == 1
            lock.release()
            assert refreshed.wait(10)
            assert view.end_offset(STREAM, 0) == 2
            lock.close()
        finally:
            view.close()
        # The writer takes the frame in too, and goes on after it.
        assert log.append_sync(STREAM, b"three").offset == 2


def test_transactions_of_a_live_writer_are_not_taken_for_orphans(log_path):
    ready = os.path.join(log_path, "..", "ready")
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import os, sys, time, streamlog
        log = streamlog.open_log(sys.argv[1])
        log.append_sync("s", b"in a transaction", txn_id=77)
        open(sys.argv[2], "w").close()
        time.sleep(60)
    """), log_path, ready])
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(ready):
            assert time.monotonic() < deadline and child.poll() is None
            time.sleep(0.05)
        with streamlog.open_log(log_path) as log:  # not alone: the other is alive
            assert log.txn_state(STREAM, 0, 77) is TxnState.OPEN
    finally:
        child.kill()
        child.wait()
    with streamlog.open_log(log_path) as log:  # alone now: the writer died; abort it
        assert log.txn_state(STREAM, 0, 77) is TxnState.ABORTED
        assert values(log) == [b"in a transaction", b""] or log.last_stable_offset(
            STREAM, 0) == log.end_offset(STREAM, 0)


def test_only_the_last_writer_to_close_seals_the_index(log_path):
    seal = os.path.join(log_path, "streams", STREAM, "0", "index.seal")
    assert os.path.exists(seal)  # the fixture's writer closed alone
    with streamlog.open_log(log_path) as log:
        log.append_sync(STREAM, b"mine")
        assert not os.path.exists(seal)
        other(log_path, 'log.append_sync("s", b"theirs")')
        assert not os.path.exists(seal)  # the other one was not the last
        repair = subprocess.run([sys.executable, "-m", "streamlog", "repair", log_path],
                                capture_output=True, text=True, timeout=120)
        assert repair.returncode != 0 and "open for writing" in repair.stderr
    assert os.path.exists(seal)
    with streamlog.open_log(log_path, readonly=True) as view:
        assert values(view) == [b"mine", b"theirs"]
        recovery = view.info()["streams"][STREAM]["partitions"][0]["recovery"]
        assert not recovery["rebuilt_index"] and recovery["index_problem"] is None
