"""FaultFileIO over a MemoryFileIO (testing/faultfs.py, testing/memfs.py): the whole
fault model (drop_unsynced / torn / garbage crashes, crash_at_step, inject_eio,
flip_bit) with no disk. The memory outlives the crash: a new FaultFileIO over it is
the rebooted machine."""

from __future__ import annotations

import errno
import random

import pytest

from streamlog.fileio import read_file, write_file_atomic
from streamlog.index import Index, IndexEntry, RecoveryPoint
from streamlog.seal import SealOutcome, check_sealed_segment, write_seal
from streamlog.segment import Segment
from streamlog.testing import CrashMode, FaultFileIO, MemoryFileIO
from streamlog.testing.memindex import MemoryIndexStorage

DIRECTORY = "/log/p"


def machine(seed: int) -> tuple[FaultFileIO, MemoryFileIO]:
    disk = MemoryFileIO()
    disk.makedirs(DIRECTORY)
    return FaultFileIO(seed, inner=disk), disk


def at(name: str) -> str:
    return f"{DIRECTORY}/{name}"


def test_drop_unsynced_returns_to_the_last_fsync_and_the_reboot_sees_it():
    fs, disk = machine(1)
    handle = fs.open(at("file"), writable=True, create=True)
    fs.pwrite(handle, b"hello", 0)
    fs.fsync(handle)
    fs.fsync_dir(DIRECTORY)
    fs.truncate(handle, 2)
    fs.pwrite(handle, b"XYZW", 2)
    write_file_atomic(fs, at("named"), b"durable")
    unnamed = fs.open(at("unnamed"), writable=True, create=True)
    fs.fsync(unnamed)  # its bytes, not its name
    assert (read_file(disk, at("file")), fs.unsynced_bytes()) == (b"heXYZW", 4)
    fs.crash(random.Random(1), CrashMode.DROP_UNSYNCED)
    assert disk.listdir(DIRECTORY) == ["file", "named"]
    with pytest.raises(OSError):
        fs.pwrite(handle, b"late", 0)  # the machine is off
    fs.close(handle)
    fs.close(unnamed)
    rebooted = FaultFileIO(2, inner=disk)
    assert read_file(rebooted, at("file")) == b"hello"
    assert read_file(rebooted, at("named")) == b"durable"


def test_unsynced_renames_and_unlinks_are_undone():
    fs, disk = machine(2)
    for name in ("a", "b", "c"):
        write_file_atomic(fs, at(name), b"old " + name.encode())
    fs.rename(at("a"), at("b"))
    fs.unlink(at("c"))
    assert disk.listdir(DIRECTORY) == ["b"]
    fs.crash(random.Random(2), CrashMode.DROP_UNSYNCED)
    assert {name: read_file(disk, at(name)) for name in disk.listdir(DIRECTORY)} == {
        "a": b"old a", "b": b"old b", "c": b"old c"}


@pytest.mark.parametrize("synced", ["source", "target", "neither"])
def test_a_rename_across_directories_is_durable_with_either_directory(synced):
    fs, disk = machine(3)
    disk.makedirs("/log/quarantine")
    write_file_atomic(fs, at("segment"), b"frames")
    fs.rename(at("segment"), "/log/quarantine/segment")
    if synced != "neither":
        fs.fsync_dir(DIRECTORY if synced == "source" else "/log/quarantine")
    fs.crash(random.Random(3), CrashMode.DROP_UNSYNCED)
    moved = synced != "neither"
    assert disk.exists("/log/quarantine/segment") is moved
    assert disk.exists(at("segment")) is not moved
    where = "/log/quarantine/segment" if moved else at("segment")
    assert read_file(disk, where) == b"frames"


def crash_image(seed: int, mode: CrashMode, durable: bytes, unsynced: list[bytes]) -> bytes:
    """What a crash in `mode` leaves of a file: `durable` synced, `unsynced` appended."""
    fs, disk = machine(seed)
    write_file_atomic(fs, at("file"), durable)
    handle = fs.open(at("file"), writable=True)
    for piece in unsynced:
        fs.pwrite(handle, piece, fs.size(handle))
    fs.crash(random.Random(seed), mode)
    return read_file(disk, at("file"))


def test_torn_keeps_a_prefix_of_the_writes():
    durable, pieces = b"D" * 100, [bytes([n]) * 250 for n in range(1, 5)]
    images = {crash_image(seed, CrashMode.TORN, durable, pieces) for seed in range(30)}
    assert all(image.startswith(durable) for image in images)
    assert all((durable + b"".join(pieces)).startswith(image) for image in images)
    assert len(images) > 10, "the crashes never tore a write"


def test_garbage_keeps_the_length_with_junk_after_what_reached_the_disk():
    durable, pieces = b"D" * 100, [bytes([n]) * 250 for n in range(1, 5)]
    images = {crash_image(seed, CrashMode.GARBAGE, durable, pieces) for seed in range(30)}
    assert {len(image) for image in images} == {1100}
    assert all(image.startswith(durable) for image in images)
    junk = [image.rstrip(b"\0") for image in images]
    assert any(len(set(image[100:])) > 4 for image in junk)  # random bytes, somewhere
    assert len(images) > 10


def test_a_seed_replays_the_same_crash():
    def run(seed: int) -> bytes:
        fs, disk = machine(seed)
        handle = fs.open(at("file"), writable=True, create=True)
        for turn in range(20):
            fs.pwrite(handle, bytes([turn]) * 37, turn * 37)
        fs.crash(mode=CrashMode.GARBAGE)
        return read_file(disk, at("file")) if disk.exists(at("file")) else b"absent"

    assert run(7) == run(7)
    assert len({run(seed) for seed in range(8)}) > 1


def test_an_injected_partial_write_fails_after_a_prefix():
    fs, disk = machine(3)
    handle = fs.open(at("file"), writable=True, create=True)
    fs.inject_eio("pwrite", 1, partial=True)
    with pytest.raises(OSError, match="injected") as caught:
        fs.pwrite(handle, b"b" * 1000, 0)
    assert caught.value.errno == errno.EIO
    assert 0 <= fs.size(handle) < 1000 and not fs.crashed
    fs.inject_eio("rename", 1)
    with pytest.raises(OSError, match="injected"):
        fs.rename(at("file"), at("other"))
    assert disk.listdir(DIRECTORY) == ["file"]  # the failed rename changed nothing


def test_a_crash_at_a_step_fails_that_step_and_keeps_what_was_synced():
    fs, disk = machine(3)
    write_file_atomic(fs, at("file"), b"a" * 10)
    handle = fs.open(at("file"), writable=True)
    fs.crash_at_step(fs.steps + 2)
    fs.pwrite(handle, b"b" * 10, 10)  # step 1: into the page cache
    with pytest.raises(OSError, match="power loss during step"):
        fs.fsync(handle)  # step 2: the power fails before the disk acknowledges it
    assert fs.crashed and fs.trace[-1][1] == "fsync"
    fs.close(handle)
    assert read_file(disk, at("file")) == b"a" * 10


def test_flip_bit_is_durable_and_a_file_seen_first_is_taken_as_durable():
    fs, disk = machine(4)
    write_file_atomic(disk, at("before"), b"\x00" * 8)  # there before the model looked
    handle = fs.open(at("file"), writable=True, create=True)
    fs.pwrite(handle, b"\x00" * 8, 0)
    fs.fsync(handle)
    fs.fsync_dir(DIRECTORY)
    fs.flip_bit(at("file"), 3, 7)
    fs.flip_bit(at("before"), 0, 1)
    fs.crash(random.Random(4), CrashMode.DROP_UNSYNCED)
    fs.close(handle)
    assert read_file(disk, at("file")) == b"\x00\x00\x00\x80\x00\x00\x00\x00"
    assert read_file(disk, at("before")) == b"\x02" + b"\x00" * 7
    with pytest.raises(ValueError):
        fs.flip_bit(at("file"), 8)


def test_a_sealed_segment_written_through_the_model_checks_out_after_a_crash():
    """The storage code that runs on real files runs unchanged on memory: a segment
    appended, fsynced and sealed survives; what was appended after it does not."""
    fs, disk = machine(5)
    segment = Segment(fs, DIRECTORY, 0, writable=True, create=True)
    fs.fsync_dir(DIRECTORY)
    segment.append(b"x" * 100)
    segment.fsync()
    write_seal(fs, segment.path, size_bytes=100, digest=segment.digest.digest(),
               sealed_at_us=1, end_offset=10)
    segment.append(b"y" * 50)  # never synced
    fs.crash(random.Random(5), CrashMode.DROP_UNSYNCED)
    segment.close()
    check = check_sealed_segment(FaultFileIO(6, inner=disk), segment.path)
    assert check.outcome is SealOutcome.OK and check.seal.end_offset == 10


def test_the_in_memory_index_loses_power_with_the_files():
    fs, disk = machine(7)
    storage = MemoryIndexStorage()
    storage.attach(fs)
    index = Index(at("index"), readonly=False, map_bytes=1 << 20, storage=storage)
    index.put([IndexEntry(0, 0, 0, 1, 10, 5, 5, 5)], RecoveryPoint(0, 10, 1, 5))
    index.sync()
    index.put([IndexEntry(1, 0, 10, 1, 10, 6, 6, 6)], RecoveryPoint(0, 20, 2, 6))
    write_file_atomic(fs, at("meta"), b"m")
    fs.crash(random.Random(7), CrashMode.DROP_UNSYNCED)
    assert storage.crashed
    index.close()
    storage.reboot()
    again = Index(at("index"), readonly=False, map_bytes=1 << 20, storage=storage)
    assert again.last_entry.base_offset == 0  # the unsynced put went with the power
    assert read_file(disk, at("meta")) == b"m"
    again.close()
