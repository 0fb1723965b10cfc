"""PartitionLock's counter and tail state, WriterRegistry's alone/last answers. Two
handles on one file stand for two processes (flock locks belong to an open file)."""

from __future__ import annotations

import pytest

from streamlog.errors import LogLocked
from streamlog.fileio import OsFileIO
from streamlog.locks import PartitionLock, TailState, WriterRegistry, exclusive_writer


def test_a_holder_that_changed_the_partition_is_seen_by_the_next(tmp_path):
    a = PartitionLock(OsFileIO(), str(tmp_path), writable=True)
    b = PartitionLock(OsFileIO(), str(tmp_path), writable=True)
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


def test_a_holder_killed_before_it_left_its_tail_leaves_no_tail_state(tmp_path):
    a = PartitionLock(OsFileIO(), str(tmp_path), writable=True)
    a.acquire()
    a.bump()
    a.leave_tail(5, 0, 100, 1)
    a.release()
    a.acquire()
    a.bump()  # then dies: no leave_tail
    a.close()
    b = PartitionLock(OsFileIO(), str(tmp_path), writable=True)
    assert b.acquire() and b.tail_state() is None  # read the files instead
    b.close()


def test_the_layout_generation_moves_only_when_asked(tmp_path):
    a = PartitionLock(OsFileIO(), str(tmp_path), writable=True)
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


def test_a_read_only_handle_waits_for_an_exclusive_holder(tmp_path):
    writer = PartitionLock(OsFileIO(), str(tmp_path), writable=True)
    writer.acquire()
    writer.bump()
    view = PartitionLock(OsFileIO(), str(tmp_path), writable=False)
    fileio = OsFileIO()
    assert not fileio.lock(view.handle, exclusive=False, blocking=False)
    writer.release()
    assert view.acquire(exclusive=False)
    view.settle()
    view.release()
    assert not view.acquire(exclusive=False)  # settled: nothing new
    view.release()
    writer.close()
    view.close()


def test_registry_alone_and_last(tmp_path):
    first = WriterRegistry(OsFileIO(), str(tmp_path))
    assert first.alone
    first.settle()
    second = WriterRegistry(OsFileIO(), str(tmp_path))
    assert not second.alone
    with pytest.raises(LogLocked):
        exclusive_writer(OsFileIO(), str(tmp_path))
    assert not first.leave()  # the second is still there
    first.close()
    assert second.leave()  # the last one; holds the registry until close
    with pytest.raises(LogLocked):
        exclusive_writer(OsFileIO(), str(tmp_path))
    second.close()
    handle = exclusive_writer(OsFileIO(), str(tmp_path))
    OsFileIO().close(handle)
