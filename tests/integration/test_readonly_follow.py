"""A read-only view's follower takes in another process's appends by itself: no
refresh() call, only `reader(..., follow=True)` (DESIGN 9: readers in any process see
other writers' records).

The writer is a separate process driven line by line on its stdin (WRITER below), so
each test decides what the follower has seen before the writer goes on. Followers run
on threads of the test process and are given a generous deadline; no timing is asserted
beyond it.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time

import pytest

import streamlog
from streamlog import layout

pytestmark = pytest.mark.slow

DEADLINE_S = 30.0

WRITER = r"""
import sys, time, streamlog
path = sys.argv[1]
log = streamlog.open_log(path, segment_bytes_max=4096, compression="none",
                         retention_bytes=6000)
log.create_stream("s")
txn = 0
print("ready", flush=True)
for line in sys.stdin:
    command, *args = line.split()
    if command == "append":  # COUNT PREFIX [SECONDS]: one record per append, spread out
        count, prefix = int(args[0]), args[1]
        pause = float(args[2]) / count if len(args) > 2 else 0.0
        for n in range(count):
            log.append_sync("s", f"{prefix}{n}".encode() * 8)
            time.sleep(pause)
    elif command == "txn":  # COUNT PREFIX: appended under a transaction left open
        txn = log.new_txn_id()
        for n in range(int(args[0])):
            log.append_sync("s", f"{args[1]}{n}".encode(), txn_id=txn)
    elif command == "commit":
        log.commit_txn("s", 0, txn)
    elif command == "abort":
        log.abort_txn("s", 0, txn)
    elif command == "truncate":  # OFFSET: keep offsets <= OFFSET
        log.truncate_after("s", 0, int(args[0]))
    elif command == "retention":
        log.apply_retention()
    print("ok", log.end_offset("s", 0), flush=True)
log.close()
"""


class Writer:
    """The writer process: `do("append 10 a")` returns the end offset after it;
    `do(first, second)` sends both at once (the second follows without a pause)."""

    def __init__(self, path) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", WRITER, str(path)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True)
        assert self.process.stdout.readline().strip() == "ready"

    def do(self, *commands: str) -> int:
        self.process.stdin.write("".join(command + "\n" for command in commands))
        self.process.stdin.flush()
        for command in commands:
            reply = self.process.stdout.readline().split()
            assert reply and reply[0] == "ok", f"the writer failed at {command!r}"
        return int(reply[1])

    def close(self) -> None:
        self.process.stdin.close()
        assert self.process.wait(timeout=60) == 0


class Follower:
    """A reader with follow=True iterated on its own thread (through an event loop
    when `asynchronous`); what it delivered so far is in `got` (offset, value), and
    the exception that ended it in `error`."""

    def __init__(self, view, *, asynchronous: bool = False, **options) -> None:
        self.reader = view.reader("s", 0, follow=True, **options)
        self.got: list[tuple[int, bytes]] = []
        self.error: BaseException | None = None
        run = (lambda: asyncio.run(self._follow_async())) if asynchronous else self._follow
        self.thread = threading.Thread(target=self._run, args=(run,), daemon=True)
        self.thread.start()

    def _run(self, follow) -> None:
        try:
            follow()
        except BaseException as error:  # noqa: BLE001  (the test looks at it)
            self.error = error

    def _follow(self) -> None:
        for record in self.reader.records():
            self.got.append((record.offset, record.value))

    async def _follow_async(self) -> None:
        async for record in self.reader:
            self.got.append((record.offset, record.value))

    def wait_for(self, count: int) -> list[tuple[int, bytes]]:
        """What it delivered once it has `count` records (or the deadline passed)."""
        deadline = time.monotonic() + DEADLINE_S
        while len(self.got) < count and self.error is None and time.monotonic() < deadline:
            time.sleep(0.005)
        return list(self.got)

    def wait_for_error(self) -> BaseException | None:
        self.thread.join(DEADLINE_S)
        return self.error


def values(prefix: str, count: int, start: int = 0) -> list[bytes]:
    return [f"{prefix}{n}".encode() * 8 for n in range(start, start + count)]


@pytest.fixture
def log_path(tmp_path):
    path = tmp_path / "log"
    with streamlog.open_log(path) as log:
        log.create_stream("s")
    return path


@pytest.fixture
def writer(log_path):
    started = Writer(log_path)
    yield started
    started.close()


def test_a_read_only_follower_sees_another_processs_appends(log_path, writer):
    # (small read chunks: a reader is inside a segment when retention removes it)
    view = streamlog.open_log(log_path, readonly=True, read_chunk_bytes=256)
    try:
        # Three on one partition, racing each other's refreshes; one on an event loop.
        followers = [Follower(view), Follower(view), Follower(view, asynchronous=True)]
        writer.do("append 50 a 1.0")  # 50 appends over about a second
        for follower in followers:
            assert follower.wait_for(50) == list(enumerate(values("a", 50)))
        lagging = view.reader("s", 0).records()  # a replay on this thread, left behind
        assert [next(lagging).offset for _ in range(3)] == [0, 1, 2]
        writer.do("append 20 b")  # rolls segments
        for follower in followers:
            assert len(follower.wait_for(70)) == 70
        writer.do("retention")  # removes the oldest segments
        writer.do("append 5 c")
        expected = list(enumerate(values("a", 50) + values("b", 20) + values("c", 5)))
        for follower in followers:
            assert follower.wait_for(75) == expected
        assert view.start_offset("s", 0) > 3  # the view took the retention in too
        # The replay finishes the segment retention removed under it (its handle is
        # kept open while a reader here is before the start), and reads on to the end.
        assert [(r.offset, r.value) for r in lagging] == expected[3:]
    finally:
        view.close()
    for follower in followers:
        assert isinstance(follower.wait_for_error(), streamlog.LogClosed)
        assert len(follower.got) == 75  # nothing more, nothing twice


def test_a_read_committed_follower_waits_for_the_commit(log_path, writer):
    view = streamlog.open_log(log_path, readonly=True)
    try:
        committed = Follower(view)
        uncommitted = Follower(view, read_committed=False)
        writer.do("append 3 a")
        writer.do("txn 4 t")  # offsets 3..6, still open
        assert uncommitted.wait_for(7) == list(enumerate(values("a", 3) + [
            b"t0", b"t1", b"t2", b"t3"]))
        assert committed.wait_for(3) == list(enumerate(values("a", 3)))
        writer.do("append 2 b")  # 7, 8: after the open transaction
        writer.do("abort")  # 9: its marker
        writer.do("txn 2 u")  # 10, 11
        writer.do("commit")  # 12
        expected = list(enumerate(values("a", 3))) + [(7, values("b", 1)[0]),
                                                      (8, values("b", 2)[1]),
                                                      (10, b"u0"), (11, b"u1")]
        assert committed.wait_for(7) == expected
    finally:
        view.close()
    assert len(committed.got) == 7


# A view that looks often sees the cut partition; one that looks seldom finds it
# written past the cut again, and must tell from the records themselves.
@pytest.mark.parametrize("view_poll_s", [0.01, 0.5])
def test_a_follower_of_a_truncated_partition_carries_on_as_a_writers_follower_does(
        log_path, writer, view_poll_s):
    view = streamlog.open_log(log_path, readonly=True, view_poll_s=view_poll_s)
    try:
        blocked = Follower(view)  # read_committed: waits before the open transaction
        ahead = Follower(view, read_committed=False)  # has delivered the transaction
        writer.do("append 5 a")
        writer.do("txn 3 t")  # 5..7, open
        assert ahead.wait_for(8)[-1] == (7, b"t2")
        assert blocked.wait_for(5) == list(enumerate(values("a", 5)))
        # The transaction is cut off; 5..7 are written again, with new records.
        assert writer.do("truncate 4", "append 3 b") == 8
        # Past the cut: it delivered records that are gone, so it is told (as a
        # follower in a writer's process is), rather than silently going on.
        assert isinstance(ahead.wait_for_error(), streamlog.OffsetOutOfRange)
        # At the cut: nothing it delivered was cut; it goes on with the new records.
        assert blocked.wait_for(8) == list(enumerate(values("a", 5) + values("b", 3)))
        writer.do("append 1 c")
        assert blocked.wait_for(9)[-1] == (8, values("c", 1)[0])
    finally:
        view.close()
    assert len(blocked.got) == 9


def test_a_writers_follower_at_a_transaction_that_a_truncate_cut_goes_on(log_path):
    """What the view's followers match: in the writer's own process, a follower
    waiting at an open transaction goes on with what is appended after a truncate
    cut it off, even when the end comes back to where it was."""
    with streamlog.open_log(log_path) as log:
        log.append_batch_sync("s", values("a", 5))
        txn = log.new_txn_id()
        log.append_batch_sync("s", [b"t0", b"t1", b"t2"], txn_id=txn)  # 5..7, open
        follower = Follower(log)
        assert follower.wait_for(5) == list(enumerate(values("a", 5)))
        log.truncate_after("s", 0, 4)
        log.append_batch_sync("s", values("b", 3))  # 5..7 again: the end is 8 again
        assert follower.wait_for(8) == list(enumerate(values("a", 5) + values("b", 3)))


def test_a_follower_of_a_stream_whose_partition_a_writer_creates_later(tmp_path):
    path = tmp_path / "log"
    with streamlog.open_log(path):
        pass  # the log, without the stream
    # The stream's description without its partitions: what a writer that was killed
    # while creating it (or is still creating it) leaves for a view to open.
    os.makedirs(layout.stream_dir(str(path), "s"))
    with open(os.path.join(layout.stream_dir(str(path), "s"), "stream.json"), "w") as out:
        json.dump({"partitions": 1}, out)
    view = streamlog.open_log(path, readonly=True)
    try:
        follower = Follower(view)
        writer = Writer(path)
        try:
            writer.do("append 10 a 0.2")
            assert follower.wait_for(10) == list(enumerate(values("a", 10)))
        finally:
            writer.close()
    finally:
        view.close()
    assert len(follower.got) == 10
