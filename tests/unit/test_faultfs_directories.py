"""FaultFileIO's model of directories (testing/faultfs.py): the rename of a directory is
one change that a power loss undoes whole unless an fsync_dir made it durable, and
rmdir is durable at once with the changes in the directory before it. delete_stream
stands on these (directory.set_aside, remove_tree). In memory."""

from __future__ import annotations

import random

import pytest

from streamlog.fileio import read_file, write_file_atomic
from streamlog.testing import CrashMode, FaultFileIO, MemoryFileIO


def machine() -> tuple[FaultFileIO, MemoryFileIO]:
    disk = MemoryFileIO()
    disk.makedirs("/log/streams/s/0")
    for name, data in (("/log/streams/s/stream.json", b"meta"),
                       ("/log/streams/s/0/seg", b"frames")):
        handle = disk.open(name, writable=True, create=True)  # there before the model
        disk.pwrite(handle, data, 0)
        disk.close(handle)
    return FaultFileIO(1, inner=disk), disk


def tree(disk: MemoryFileIO, root: str = "/log/streams") -> dict[str, bytes]:
    out, pending = {}, [root]
    while pending:
        directory = pending.pop()
        for name in disk.listdir(directory):
            path = f"{directory}/{name}"
            try:
                out[path] = read_file(disk, path)
            except IsADirectoryError:
                pending.append(path)
                out[path + "/"] = b""
    return out


def test_an_unsynced_rename_of_a_directory_is_undone_whole():
    fs, disk = machine()
    before = tree(disk)
    fs.rename("/log/streams/s", "/log/streams/.deleted.x.s")
    fs.unlink("/log/streams/.deleted.x.s/0/seg")
    fs.crash(random.Random(1), CrashMode.DROP_UNSYNCED)
    assert tree(disk) == before  # back where it was, with the file it held


def test_a_synced_rename_of_a_directory_stays_and_rmdir_is_durable_at_once():
    fs, disk = machine()
    fs.rename("/log/streams/s", "/log/streams/.deleted.x.s")
    fs.fsync_dir("/log/streams")
    fs.unlink("/log/streams/.deleted.x.s/0/seg")
    fs.fsync_dir("/log/streams/.deleted.x.s/0")
    fs.rmdir("/log/streams/.deleted.x.s/0")
    fs.crash(random.Random(2), CrashMode.DROP_UNSYNCED)
    assert tree(disk) == {"/log/streams/.deleted.x.s/": b"",
                          "/log/streams/.deleted.x.s/stream.json": b"meta"}


def test_rmdir_takes_the_unsynced_unlinks_in_it_along():
    fs, disk = machine()
    write_file_atomic(fs, "/log/streams/s/0/new", b"n")
    fs.unlink("/log/streams/s/0/new")
    fs.unlink("/log/streams/s/0/seg")
    fs.rmdir("/log/streams/s/0")
    assert fs.trace[-1][1] == "rmdir"
    fs.crash(random.Random(3), CrashMode.DROP_UNSYNCED)
    assert tree(disk) == {"/log/streams/s/": b"", "/log/streams/s/stream.json": b"meta"}
    with pytest.raises(OSError):
        MemoryFileIO().rmdir("/nowhere")


def test_a_torn_crash_keeps_a_prefix_of_the_directory_changes():
    outcomes = set()
    for seed in range(40):
        fs, disk = machine()
        fs.rename("/log/streams/s", "/log/streams/.deleted.x.s")
        write_file_atomic(fs, "/log/streams/t.json", b"t")  # syncs streams/ itself
        fs.rename("/log/streams/t.json", "/log/streams/u.json")
        fs.crash(random.Random(seed), CrashMode.TORN)
        names = set(disk.listdir("/log/streams"))
        assert names in ({".deleted.x.s", "t.json"}, {".deleted.x.s", "u.json"}), names
        outcomes.add(frozenset(names))
        moved = tree(disk, "/log/streams/.deleted.x.s")
        assert moved["/log/streams/.deleted.x.s/0/seg"] == b"frames"
    assert len(outcomes) == 2
