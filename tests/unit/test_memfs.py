"""MemoryFileIO (streamlog/testing/memfs.py): the FileIO protocol in memory, answering
and failing as the OS does (the errors expected here are the ones Linux gives), with
flock semantics per handle and shared mappings every handle of a file sees. No disk."""

from __future__ import annotations

import errno
import threading

import pytest

from streamlog.fileio import read_file, write_file_atomic
from streamlog.testing import MemoryFileIO


@pytest.fixture
def fs() -> MemoryFileIO:
    memory = MemoryFileIO()
    memory.makedirs("/log/s")
    return memory


def write(fs: MemoryFileIO, path: str, data: bytes) -> None:
    handle = fs.open(path, writable=True, create=True)
    fs.pwrite(handle, data, 0)
    fs.close(handle)


# -- bytes ------------------------------------------------------------------------------

def test_writes_reads_and_truncates_as_a_file_does(fs):
    handle = fs.open("/log/s/a", writable=True, create=True)
    assert fs.size(handle) == 0 and fs.path_of(handle) == "/log/s/a"
    fs.pwrite(handle, b"hello", 0)
    fs.pwrite(handle, memoryview(b"XY"), 8)  # past the end: a hole of zeros
    assert fs.pread(handle, 100, 0) == b"hello\0\0\0XY"
    assert fs.pread(handle, 4, 3) == b"lo\0\0" and fs.pread(handle, 4, 50) == b""
    fs.truncate(handle, 3)
    assert fs.size(handle) == 3
    fs.truncate(handle, 6)  # grows with zeros
    assert fs.pread(handle, 10, 0) == b"hel\0\0\0"
    fs.fsync(handle)
    fs.close(handle)
    assert read_file(fs, "/log/s/a") == b"hel\0\0\0"


def test_write_file_atomic_and_read_file_work_on_it(fs):
    write_file_atomic(fs, "/log/s/meta.json", b"{}")
    write_file_atomic(fs, "/log/s/meta.json", b'{"a": 1}')
    assert read_file(fs, "/log/s/meta.json") == b'{"a": 1}'
    assert fs.listdir("/log/s") == ["meta.json"]  # the temporary file was renamed


def test_a_handle_follows_its_file_through_a_rename_and_an_unlink(fs):
    write(fs, "/log/s/a", b"one")
    handle = fs.open("/log/s/a", writable=True)
    fs.rename("/log/s/a", "/log/s/b")
    fs.pwrite(handle, b"two", 0)
    assert read_file(fs, "/log/s/b") == b"two"
    fs.unlink("/log/s/b")
    assert not fs.exists("/log/s/b")
    assert fs.pread(handle, 3, 0) == b"two"  # the bytes live while the handle does
    write(fs, "/log/s/b", b"new")  # a new file under the old name
    assert fs.pread(handle, 3, 0) == b"two"
    fs.close(handle)


def test_paths_are_normalised(fs):
    write(fs, "/log/s/../s/./a", b"x")
    assert fs.exists("/log//s/a") and fs.listdir("/log/s/") == ["a"]


# -- errors, as the OS raises them ----------------------------------------------------

def _missing_open(fs):
    fs.open("/log/s/missing", writable=False)


@pytest.mark.parametrize("operation, code", [
    (_missing_open, errno.ENOENT),
    (lambda fs: fs.open("/log/nowhere/a", writable=True, create=True), errno.ENOENT),
    (lambda fs: fs.open("/log/s/file/a", writable=True, create=True), errno.ENOTDIR),
    (lambda fs: fs.open("/log/s", writable=False), errno.EISDIR),
    (lambda fs: fs.unlink("/log/s/missing"), errno.ENOENT),
    (lambda fs: fs.unlink("/log/s"), errno.EISDIR),
    (lambda fs: fs.listdir("/log/nowhere"), errno.ENOENT),
    (lambda fs: fs.listdir("/log/s/file"), errno.ENOTDIR),
    (lambda fs: fs.fsync_dir("/log/nowhere"), errno.ENOENT),
    (lambda fs: fs.fsync_dir("/log/s/file"), errno.ENOTDIR),
    (lambda fs: fs.makedirs("/log/s/file"), errno.EEXIST),
    (lambda fs: fs.makedirs("/log/s/file/deeper"), errno.ENOTDIR),
    (lambda fs: fs.rename("/log/s/missing", "/log/s/b"), errno.ENOENT),
    (lambda fs: fs.rename("/log/s/file", "/log/s"), errno.EISDIR),
    (lambda fs: fs.rename("/log/s/file", "/log/nowhere/b"), errno.ENOENT),
    (lambda fs: fs.rename("/log", "/log/s/file"), errno.ENOTDIR),
    (lambda fs: fs.rename("/log/s", "/log/s/inside"), errno.EINVAL),
    (lambda fs: fs.open_shared("/log/s/missing", 8, writable=False), errno.ENOENT),
], ids=lambda value: getattr(value, "__name__", str(value)))
def test_errors_are_the_os_errors(fs, operation, code):
    write(fs, "/log/s/file", b"x")
    with pytest.raises(OSError) as caught:
        operation(fs)
    assert caught.value.errno == code
    assert type(caught.value) is type(OSError(code, "x"))  # FileNotFoundError for ENOENT...


@pytest.mark.parametrize("call", [
    lambda fs, h: fs.size(h), lambda fs, h: fs.pread(h, 1, 0),
    lambda fs, h: fs.pwrite(h, b"x", 0), lambda fs, h: fs.fsync(h),
    lambda fs, h: fs.truncate(h, 0), lambda fs, h: fs.close(h),
    lambda fs, h: fs.path_of(h), lambda fs, h: fs.lock(h, exclusive=True),
    lambda fs, h: fs.unlock(h), lambda fs, h: fs.map_shared(h, 1)])
def test_a_closed_handle_is_ebadf_and_handles_are_never_reused(fs, call):
    handle = fs.open("/log/s/a", writable=True, create=True)
    fs.close(handle)
    again = fs.open("/log/s/a", writable=True)
    assert again != handle  # a stale handle never reaches another file
    with pytest.raises(OSError) as caught:
        call(fs, handle)
    assert caught.value.errno == errno.EBADF


def test_a_read_only_handle_refuses_writes_as_the_os_does(fs):
    write(fs, "/log/s/a", b"abc")
    handle = fs.open("/log/s/a", writable=False)
    with pytest.raises(OSError) as caught:
        fs.pwrite(handle, b"x", 0)
    assert caught.value.errno == errno.EBADF
    with pytest.raises(OSError) as caught:
        fs.truncate(handle, 0)
    assert caught.value.errno == errno.EINVAL
    with pytest.raises(OSError) as caught:
        fs.pread(handle, 1, -1)
    assert caught.value.errno == errno.EINVAL
    fs.fsync(handle)  # allowed, as fsync of a read-only descriptor is
    assert fs.pread(handle, 3, 0) == b"abc"


# -- names -------------------------------------------------------------------------------

def test_directories_are_made_listed_and_renamed(fs):
    fs.makedirs("/log/s/0/index")
    fs.makedirs("/log/s/0")  # exist_ok
    write(fs, "/log/s/0/00.log", b"frames")
    write(fs, "/log/s/0/index/data.mdb", b"pages")
    assert fs.listdir("/log/s") == ["0"]
    assert fs.listdir("/log/s/0") == ["00.log", "index"]
    assert fs.listdir("/") == ["log"]
    fs.fsync_dir("/log/s/0")
    fs.makedirs("/log/t")
    fs.rename("/log/s/0", "/log/t/0")  # over nothing
    assert fs.listdir("/log/s") == [] and fs.listdir("/log/t/0") == ["00.log", "index"]
    assert read_file(fs, "/log/t/0/index/data.mdb") == b"pages"
    fs.makedirs("/log/t/1/full")
    with pytest.raises(OSError) as caught:
        fs.rename("/log/t/0", "/log/t/1")
    assert caught.value.errno == errno.ENOTEMPTY
    fs.makedirs("/log/u")
    fs.rename("/log/t/0", "/log/u")  # over an empty directory
    assert fs.listdir("/log/u") == ["00.log", "index"] and not fs.exists("/log/t/0")


def test_rename_replaces_a_file_at_once(fs):
    write(fs, "/log/s/a", b"new")
    write(fs, "/log/s/b", b"old")
    fs.rename("/log/s/a", "/log/s/b")
    assert fs.listdir("/log/s") == ["b"] and read_file(fs, "/log/s/b") == b"new"


# -- flocks --------------------------------------------------------------------------------

def test_flocks_belong_to_handles(fs):
    write(fs, "/log/LOCK", b"")
    a, b = (fs.open("/log/LOCK", writable=True) for _ in range(2))
    assert fs.lock(a, exclusive=False) and fs.lock(b, exclusive=False)  # shared: both
    assert not fs.lock(a, exclusive=True, blocking=False)  # b is in the way
    # Linux: a conversion lets go first, so the refused upgrade left `a` with nothing.
    assert fs.lock(b, exclusive=True, blocking=False)
    assert not fs.lock(a, exclusive=False, blocking=False)
    assert fs.lock(b, exclusive=True)  # held already: at once
    fs.lock(b, exclusive=False)  # a downgrade always succeeds when alone
    assert fs.lock(a, exclusive=False, blocking=False)
    fs.unlock(a)
    fs.unlock(a)  # nothing held: nothing to do
    fs.close(b)  # closing lets go
    assert fs.lock(a, exclusive=True, blocking=False)
    fs.close(a)


def test_a_blocking_lock_waits_until_the_holder_lets_go(fs):
    write(fs, "/log/LOCK", b"")
    holder, waiter = (fs.open("/log/LOCK", writable=True) for _ in range(2))
    fs.lock(holder, exclusive=True)
    order = []
    thread = threading.Thread(target=lambda: order.append(fs.lock(waiter, exclusive=False)))
    thread.start()
    thread.join(0.2)
    assert thread.is_alive() and order == []
    order.append("released")
    fs.unlock(holder)
    thread.join(10)
    assert order == ["released", True]
    assert not fs.lock(holder, exclusive=True, blocking=False)


def test_a_wait_ends_in_ebadf_when_its_handle_is_closed(fs):
    write(fs, "/log/LOCK", b"")
    holder, waiter = (fs.open("/log/LOCK", writable=True) for _ in range(2))
    fs.lock(holder, exclusive=True)
    errors = []

    def wait() -> None:
        try:
            fs.lock(waiter, exclusive=True)
        except OSError as error:
            errors.append(error.errno)

    thread = threading.Thread(target=wait)
    thread.start()
    thread.join(0.2)
    fs.close(waiter)
    fs.close(holder)  # wakes the waiter, which finds its handle gone
    thread.join(10)
    assert errors == [errno.EBADF]


# -- shared mappings ----------------------------------------------------------------------

def test_a_shared_mapping_is_one_buffer_for_every_handle(fs):
    writer = fs.open_shared("/log/s/writer.lock", 16, writable=True)
    reader = fs.open_shared("/log/s/writer.lock", 16, writable=False)
    mine, theirs = fs.map_shared(writer, 16), fs.map_shared(reader, 16)
    mine[3] = 7
    assert theirs[3] == 7 and theirs.readonly and not mine.readonly
    with pytest.raises(TypeError):
        theirs[0] = 1
    again = fs.open_shared("/log/s/writer.lock", 8, writable=True)  # never shrinks
    assert fs.size(again) == 16
    fs.close(reader)
    with pytest.raises(ValueError):
        theirs[3]  # the mapping ended with its handle
    assert mine[3] == 7
    with pytest.raises(OSError) as caught:
        fs.truncate(again, 0)  # a mapped file keeps its size here
    assert caught.value.errno == errno.EBUSY
    fs.close(writer)
    fs.truncate(again, 0)
    fs.close(again)


def test_a_file_shorter_than_the_mapping_is_not_mapped(fs):
    handle = fs.open("/log/s/writer.lock", writable=True, create=True)  # being created
    with pytest.raises(ValueError):
        fs.map_shared(handle, 16)
    fs.close(handle)


def test_threads_writing_at_once_lose_nothing(fs):
    handle = fs.open("/log/s/a", writable=True, create=True)

    def fill(number: int) -> None:
        for turn in range(200):
            fs.pwrite(handle, bytes([number]) * 4, (turn * 4 + number) * 4)

    threads = [threading.Thread(target=fill, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    data = fs.pread(handle, 4 * 4 * 200, 0)
    assert all(data[at] == (at // 4) % 4 for at in range(len(data)))
    fs.close(handle)
