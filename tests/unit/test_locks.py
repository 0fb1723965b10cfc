"""PartitionLock's counter and tail state, WriterRegistry's alone/last answers. Two
handles on one file stand for two processes (flock locks belong to an open file).

Each test runs on the real file system (a FileIO per "process", as two processes have)
and on one MemoryFileIO shared by both "processes" (testing/memfs.py): its shared
mapping is one buffer every handle of the file sees, as an mmap is."""

from __future__ import annotations

import threading

import pytest

from streamlog.errors import LogLocked
from streamlog.fileio import OsFileIO
from streamlog.locks import PartitionLock, TailState, WriterRegistry, exclusive_writer
from streamlog.testing.memfs import MemoryFileIO


@pytest.fixture(params=["os", "memory"])
def place(request, tmp_path):
    """(directory, new_fileio): where the lock lives, and the FileIO of a new "process"."""
    if request.param == "os":
        return str(tmp_path), OsFileIO
    memory = MemoryFileIO()
    memory.makedirs("/log/p")
    return "/log/p", lambda: memory


def test_a_holder_that_changed_the_partition_is_seen_by_the_next(place):
    directory, fileio = place
    a = PartitionLock(fileio(), directory, writable=True)
    b = PartitionLock(fileio(), directory, writable=True)
    assert a.acquire()  # never held here: take everything in
    a.bump()
    a.leave_tail(10, 0, 500, 1234)
    a.release()
    assert b.acquire()  # a was there
    assert b.tail_state() == TailState(10, 0, 500, 1234, 0)
    b.bump()
    b.leave_tail(11, 0, 600, 1300)
    b.release()
    assert a.acquire() and a.tail_state().end_offset == 11
    a.release()
    assert not b.acquire()  # nobody came since b left
    b.release()
    for lock in (a, b):
        lock.close()


def test_a_holder_killed_before_it_left_its_tail_leaves_no_tail_state(place):
    directory, fileio = place
    a = PartitionLock(fileio(), directory, writable=True)
    a.acquire()
    a.bump()
    a.leave_tail(5, 0, 100, 1)
    a.release()
    a.acquire()
    a.bump()  # then dies: no leave_tail
    a.close()
    b = PartitionLock(fileio(), directory, writable=True)
    assert b.acquire() and b.tail_state() is None  # read the files instead
    b.close()


def test_the_layout_generation_moves_only_when_asked(place):
    directory, fileio = place
    a = PartitionLock(fileio(), directory, writable=True)
    a.acquire()
    a.bump()
    first = a.next_layout()
    a.leave_tail(1, 0, 10, 1)
    assert a.layout() == first and a.tail_state().layout == first
    a.bump()
    a.leave_tail(2, 0, 20, 2)
    assert a.layout() == first  # appends keep the layout
    assert a.next_layout() == first + 1
    a.release()
    a.close()


def test_a_read_only_handle_waits_for_an_exclusive_holder(place):
    directory, fileio = place
    writer = PartitionLock(fileio(), directory, writable=True)
    writer.acquire()
    writer.bump()
    view = PartitionLock(fileio(), directory, writable=False)
    assert not view.fileio.lock(view.handle, exclusive=False, blocking=False)
    writer.release()
    assert view.acquire(exclusive=False)
    view.settle()
    view.release()
    assert not view.acquire(exclusive=False)  # settled: nothing new
    view.release()
    writer.close()
    view.close()


def test_a_view_sees_a_move_without_the_lock_and_stops_once_closed(place):
    directory, fileio = place
    writer = PartitionLock(fileio(), directory, writable=True)
    view = PartitionLock(fileio(), directory, writable=False)
    assert view.moved()  # not mapped yet: look under the lock
    view.acquire(exclusive=False)
    view.settle()
    view.release()
    assert not view.moved()
    writer.acquire()
    writer.bump()  # seen through the mapping, no system call, no lock
    assert view.moved()
    writer.release()
    view.close()
    assert not view.moved()
    writer.close()


def test_a_blocked_holder_gets_the_lock_when_the_other_lets_go(place):
    directory, fileio = place
    first = PartitionLock(fileio(), directory, writable=True)
    second = PartitionLock(fileio(), directory, writable=True)
    first.acquire()
    first.bump()
    got = threading.Event()
    waiter = threading.Thread(target=lambda: (second.acquire(), got.set()))
    waiter.start()
    assert not got.wait(0.2)  # waits while the first holds it
    first.release()
    assert got.wait(10)
    waiter.join()
    second.release()
    first.close()
    second.close()


def test_registry_alone_and_last(place):
    directory, fileio = place
    first = WriterRegistry(fileio(), directory)
    assert first.alone
    first.settle()
    second = WriterRegistry(fileio(), directory)
    assert not second.alone
    with pytest.raises(LogLocked):
        exclusive_writer(fileio(), directory)
    assert not first.leave()  # the second is still there
    first.close()
    assert second.leave()  # the last one; holds the registry until close
    with pytest.raises(LogLocked):
        exclusive_writer(fileio(), directory)
    second.close()
    opened = fileio()
    handle = exclusive_writer(opened, directory)
    opened.close(handle)
