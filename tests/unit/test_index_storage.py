"""Where an index lives (streamlog/index_storage.py): the wipe of a damaged index
through its storage, and the LMDB storage's seal going through the FileIO it is given.
The LMDB test needs real files (LMDB writes them itself); the others need no disk."""

from __future__ import annotations

import os

import pytest

from streamlog.errors import CorruptIndex
from streamlog.fileio import read_file, write_file_atomic
from streamlog.index import Index, IndexEntry, RecoveryPoint
from streamlog.index_storage import LmdbIndexStorage, index_seal_path, wipe_index
from streamlog.seal import decode_seal
from streamlog.testing import FaultFileIO, MemoryFileIO
from streamlog.testing.memindex import MemoryIndexStorage

MAP_BYTES = 1 << 22


def entry(base: int) -> IndexEntry:
    return IndexEntry(base, 0, base * 10, 1, 10, base, base, base)


def test_wipe_index_forgets_an_index_held_in_memory():
    storage = MemoryIndexStorage()
    index = Index("p/index", readonly=False, map_bytes=MAP_BYTES, storage=storage)
    index.put([entry(0)], RecoveryPoint(0, 10, 1, 0))
    index.close(seal=True)
    wipe_index("p/index", storage=storage)
    assert not storage.exists("p/index")
    fresh = Index("p/index", readonly=False, map_bytes=MAP_BYTES, storage=storage)
    assert fresh.last_entry is None and fresh.recovery_point() is None
    fresh.close()


def test_wipe_index_removes_lmdb_files_and_the_seal_through_the_fileio():
    disk = MemoryFileIO()
    disk.makedirs("/log/p/index")
    for name in ("data.mdb", "lock.mdb"):
        write_file_atomic(disk, f"/log/p/index/{name}", b"pages")
    write_file_atomic(disk, index_seal_path("/log/p/index"), b"seal")
    write_file_atomic(disk, "/log/p/00000000000000000000.log", b"frames")
    wipe_index("/log/p/index", fileio=disk)
    assert disk.listdir("/log/p/index") == []
    assert disk.listdir("/log/p") == ["00000000000000000000.log", "index"]
    wipe_index("/log/p/index", fileio=disk)  # nothing there: nothing to do
    wipe_index("/log/q/index", fileio=disk)  # not even a directory


def test_the_lmdb_seal_is_written_and_removed_through_the_fileio(tmp_path):
    path = str(tmp_path / "index")
    fs = FaultFileIO(0)
    index = Index(path, readonly=False, map_bytes=MAP_BYTES, storage=LmdbIndexStorage(fs))
    index.put([entry(0)], RecoveryPoint(0, 10, 1, 0))
    index.close(seal=True)
    seal_path, temporary = path + ".seal", path + ".seal.tmp"
    assert [step[1:] for step in fs.trace] == [  # write_file_atomic's steps, and no other
        ("create", temporary), ("truncate", temporary), ("pwrite", temporary),
        ("fsync", temporary), ("rename", f"{temporary} -> {seal_path}"),
        ("fsync_dir", str(tmp_path))]
    seal = decode_seal(read_file(fs, seal_path))
    assert seal.size_bytes == os.path.getsize(os.path.join(path, "data.mdb"))
    writer = Index(path, readonly=False, map_bytes=MAP_BYTES, storage=LmdbIndexStorage(fs))
    assert writer.verified and fs.exists(path + ".seal")  # nothing written yet
    writer.put([entry(1)])
    assert fs.trace[-2][1:] == ("unlink", path + ".seal")  # the seal goes first...
    assert fs.trace[-1][1:] == ("fsync_dir", str(tmp_path))  # ...durably
    writer.close()
    wipe_index(path, fileio=fs)
    assert not os.path.exists(os.path.join(path, "data.mdb"))
    assert Index(path, readonly=True, map_bytes=MAP_BYTES).last_entry is None


def test_a_damaged_seal_read_through_the_fileio_refuses_the_index(tmp_path):
    path = str(tmp_path / "index")
    index = Index(path, readonly=False, map_bytes=MAP_BYTES)
    index.put([entry(0)], RecoveryPoint(0, 10, 1, 0))
    index.close(seal=True)
    fs = FaultFileIO(1)
    fs.flip_bit(path + ".seal", 20)
    with pytest.raises(CorruptIndex, match="seal"):
        Index(path, readonly=True, map_bytes=MAP_BYTES, storage=LmdbIndexStorage(fs))
