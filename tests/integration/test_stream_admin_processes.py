"""delete_stream and add_partitions across real processes (DESIGN 9: several processes
may write one local log):

  * another writer process that had the stream open finds out at its next append
    (UnknownStream: the commit lock's file is no longer the one at its path), never
    writes into the deleted folder nor makes it again, and appends to the stream
    created again under the name from offset 0; it takes in added partitions at its
    refresh;
  * a writer killed with SIGKILL at random moments while it creates, fills, deletes
    and widens streams leaves every stream whole or gone: a read-only open sees only
    whole streams (each partition one incarnation, from offset 0), and the next
    writable open leaves no half-deleted folder behind.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

import streamlog

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stream_admin_child.py")
KILLS = 12
RUN_S_MIN, RUN_S_MAX = 0.05, 0.6


class Child:
    """A `serve` child: one command, one answer."""

    def __init__(self, path: str) -> None:
        self.process = subprocess.Popen([sys.executable, CHILD, "serve", path],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True)
        assert self.process.stdout.readline().strip() == "ready"

    def ask(self, command: str) -> str:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.process.stdout.readline().strip()

    def close(self) -> None:
        self.process.stdin.close()
        assert self.process.wait(30) == 0


def test_another_writer_process_finds_the_stream_deleted_and_never_remakes_it(tmp_path):
    path = str(tmp_path / "log")
    with streamlog.open_log(path) as log:
        log.create_stream("s", 1)
        log.append_sync("s", b"parent")
        child = Child(path)
        try:
            assert child.ask("append s 0") == "ok 1"
            assert child.ask("hold s 0 keep 1") == "ok"
            log.delete_stream("s")
            assert child.ask("hold s 0 keep 1") == "err UnknownStream"
            assert child.ask("append s 0") == "err UnknownStream"
            assert child.ask("append s 0") == "err UnknownStream"
            assert os.listdir(os.path.join(path, "streams")) == [".lock"]
            assert log.streams() == []
            log.create_stream("s", 2)
            assert log.holds("s", 0) == {}  # (the hold went with the stream)
            assert child.ask("append s 1") == "ok 0"  # the new one, from offset 0
            log.refresh()  # (what another process appended)
            assert [r.value for r in log.reader("s", 1)] == [b"child"]
            assert log.end_offset("s", 0) == 0
            log.add_partitions("s", 3)
            assert child.ask("append s 2") == "err InvalidArgument"  # the count it knows
            assert child.ask("refresh") == "ok"
            assert (child.ask("count s"), child.ask("append s 2")) == ("ok 3", "ok 0")
            log.delete_stream("s")
            assert child.ask("refresh") == "ok"
            assert child.ask("streams") == "ok"
        finally:
            child.close()
    assert os.listdir(os.path.join(path, "streams")) == [".lock"]


def _check_whole(log) -> None:
    """Every stream is whole: each partition one incarnation, dense from offset 0."""
    for name in log.streams():
        tags = set()
        for partition in range(log.partition_count(name)):
            assert log.start_offset(name, partition) == 0
            for record in log.reader(name, partition):
                stream, tag, number, index = record.value.split(b"|")
                assert (stream.decode(), int(number), int(index)) == (
                    name, partition, record.offset), record
                tags.add(tag)
        assert len(tags) <= 1, (name, tags)  # never records of two incarnations


@pytest.mark.timeout(120)
def test_a_writer_killed_while_deleting_and_recreating_streams_leaves_them_whole(tmp_path):
    path = str(tmp_path / "log")
    rng = random.Random(20250611)
    seen = set()
    streamlog.open_log(path).close()
    for kill in range(KILLS):
        child = subprocess.Popen([sys.executable, CHILD, "churn", path, str(kill)],
                                 stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "READY"
        time.sleep(rng.uniform(RUN_S_MIN, RUN_S_MAX))
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        folders = os.listdir(os.path.join(path, "streams"))
        seen.update(f for f in folders if f.startswith(".deleted."))
        with streamlog.open_log(path, readonly=True) as view:  # changes no file
            _check_whole(view)
        assert os.listdir(os.path.join(path, "streams")) == folders
        with streamlog.open_log(path) as log:
            _check_whole(log)
            streams = log.streams()
        folders = sorted(os.listdir(os.path.join(path, "streams")))
        assert folders == sorted([".lock", *(("%" + n) if n.startswith(".") else n
                                            for n in streams)]), folders
    print(f"{KILLS} kills; deletion folders found left by a kill: {len(seen)}")
