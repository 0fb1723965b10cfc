"""seal.py: the seal layout, the running digest, and checking a segment against its
seal. Pure: the I/O functions run on a small in-memory FileIO defined here."""

from __future__ import annotations

import errno
import os
import random
import struct

import pytest
import xxhash

from streamlog.errors import CorruptionError
from streamlog.seal import (MAGIC, SEAL_BYTES, STRUCT, Seal, SealDamaged, SealOutcome,
                            SegmentDigest, check_sealed_segment, decode_seal, encode_seal,
                            hash_file, read_seal, remove_seal, seal_path, write_seal)

SEGMENT = "/p/00000000000000001234.log"
FIELDS = dict(size_bytes=123_456, digest=0xDEAD_BEEF_0123_4567,
              sealed_at_us=1_767_225_600_000_000)


class MemoryFileIO:
    """Just enough of the FileIO protocol over a dict of path -> bytearray."""

    def __init__(self) -> None:
        self.files: dict[str, bytearray] = {}
        self.handles: dict[int, str] = {}
        self.eio_paths: set[str] = set()
        self.dir_fsyncs: list[str] = []

    def open(self, path, *, writable, create=False):
        if path not in self.files:
            if not create:
                raise FileNotFoundError(errno.ENOENT, "no such file", path)
            self.files[path] = bytearray()
        handle = len(self.handles) + 3
        self.handles[handle] = path
        return handle

    def close(self, handle):
        self.handles.pop(handle)

    def size(self, handle):
        return len(self.files[self.handles[handle]])

    def pread(self, handle, size, position):
        path = self.handles[handle]
        if path in self.eio_paths:
            raise OSError(errno.EIO, "I/O error", path)
        return bytes(self.files[path][position:position + size])

    def pwrite(self, handle, data, position):
        self.files[self.handles[handle]][position:position + len(data)] = data

    def truncate(self, handle, size):
        del self.files[self.handles[handle]][size:]

    def fsync(self, handle):
        pass

    def exists(self, path):
        return path in self.files

    def rename(self, source, target):
        self.files[target] = self.files.pop(source)

    def unlink(self, path):
        if path not in self.files:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        del self.files[path]

    def fsync_dir(self, path):
        self.dir_fsyncs.append(path)

    def path_of(self, handle):
        return self.handles[handle]


def sealed(data: bytes) -> MemoryFileIO:
    fileio = MemoryFileIO()
    fileio.files[SEGMENT] = bytearray(data)
    write_seal(fileio, SEGMENT, size_bytes=len(data), digest=xxhash.xxh3_64_intdigest(data),
               sealed_at_us=7)
    return fileio


# -- layout ----------------------------------------------------------------------------


def test_seal_path_is_beside_the_segment():
    assert seal_path(SEGMENT) == "/p/00000000000000001234.seal"


def test_round_trip():
    data = encode_seal(**FIELDS)
    assert len(data) == SEAL_BYTES == 48
    assert decode_seal(data) == Seal(**FIELDS)
    assert decode_seal(memoryview(data)) == Seal(**FIELDS)
    assert decode_seal(bytearray(data)) == Seal(**FIELDS)


@pytest.mark.parametrize("fields", [dict(size_bytes=0, digest=0, sealed_at_us=0),
                                    dict(size_bytes=2**64 - 1, digest=2**64 - 1,
                                         sealed_at_us=-(2**63))])
def test_round_trip_extremes(fields):
    assert decode_seal(encode_seal(**fields)) == Seal(**fields)


def test_every_single_bit_flip_is_damaged():
    data = encode_seal(**FIELDS)
    for bit in range(len(data) * 8):
        flipped = bytearray(data)
        flipped[bit // 8] ^= 1 << (bit % 8)
        assert isinstance(decode_seal(bytes(flipped)), SealDamaged), bit


def test_truncated_and_extended_input_is_damaged():
    data = encode_seal(**FIELDS)
    for length in range(len(data)):
        assert isinstance(decode_seal(data[:length]), SealDamaged), length
    assert isinstance(decode_seal(data + b"\0"), SealDamaged)


def test_garbage_is_damaged_never_an_exception():
    rng = random.Random(1)
    for _ in range(2000):
        garbage = rng.randbytes(rng.choice((SEAL_BYTES, rng.randrange(0, 100))))
        assert isinstance(decode_seal(garbage), SealDamaged)
    assert decode_seal(b"\0" * SEAL_BYTES) == SealDamaged("bad magic")


def test_unknown_version_with_a_valid_checksum_is_damaged():
    head = STRUCT.pack(MAGIC, 2, 0, 1, 2, 3, -1, 0)[:40]
    data = head + struct.pack("<Q", xxhash.xxh3_64_intdigest(head))
    assert decode_seal(data) == SealDamaged("unknown seal version 2")


# -- digests ---------------------------------------------------------------------------


def test_segment_digest_equals_hash_of_the_file():
    rng = random.Random(2)
    data = rng.randbytes(300_001)
    digest = SegmentDigest()
    position = 0
    while position < len(data):  # pieces as the writer appends them: frames of any size
        size = rng.randrange(1, 5000)
        digest.update(memoryview(data)[position:position + size])
        position += size
    fileio = MemoryFileIO()
    fileio.files[SEGMENT] = bytearray(data)
    assert digest.size_bytes == len(data)
    assert digest.digest() == xxhash.xxh3_64_intdigest(data)
    assert digest.digest() == hash_file(fileio, SEGMENT, len(data), chunk_bytes=4096)
    handle = fileio.open(SEGMENT, writable=False)
    assert digest.digest() == hash_file(fileio, handle, len(data))
    assert fileio.handles == {handle: SEGMENT}  # a handle passed in stays open


def test_digest_from_file_continues_with_updates():
    data = random.Random(3).randbytes(10_000)
    fileio = MemoryFileIO()
    fileio.files[SEGMENT] = bytearray(data[:6000])
    digest = SegmentDigest.from_file(fileio, SEGMENT, 6000, chunk_bytes=1000)
    digest.update(data[6000:])
    assert digest.size_bytes == 10_000
    assert digest.digest() == xxhash.xxh3_64_intdigest(data)
    assert fileio.handles == {}


def test_hash_file_of_a_prefix_and_pacing():
    data = bytes(range(256)) * 40
    fileio = MemoryFileIO()
    fileio.files[SEGMENT] = bytearray(data)
    paced: list[int] = []
    assert hash_file(fileio, SEGMENT, 5000, chunk_bytes=1024, pace=paced.append) == \
        xxhash.xxh3_64_intdigest(data[:5000])
    assert paced == [1024] * 4 + [904]
    assert hash_file(fileio, SEGMENT, 0) == xxhash.xxh3_64_intdigest(b"")


def test_hash_file_of_a_short_file_raises_corruption():
    fileio = MemoryFileIO()
    fileio.files[SEGMENT] = bytearray(100)
    with pytest.raises(CorruptionError, match="ends at position 100"):
        hash_file(fileio, SEGMENT, 101)
    assert fileio.handles == {}


# -- seal files ------------------------------------------------------------------------


def test_write_read_remove():
    fileio = MemoryFileIO()
    assert read_seal(fileio, SEGMENT) is None
    write_seal(fileio, SEGMENT, **FIELDS)
    assert read_seal(fileio, SEGMENT) == Seal(**FIELDS)
    assert set(fileio.files) == {seal_path(SEGMENT)}  # the temporary file was renamed
    remove_seal(fileio, SEGMENT)
    assert read_seal(fileio, SEGMENT) is None
    remove_seal(fileio, SEGMENT)  # missing: no error
    assert fileio.dir_fsyncs == ["/p"] * 3
    assert fileio.handles == {}


def test_read_seal_of_a_damaged_or_unreadable_file():
    fileio = MemoryFileIO()
    fileio.files[seal_path(SEGMENT)] = bytearray(encode_seal(**FIELDS) + b"x" * 1000)
    assert read_seal(fileio, SEGMENT) == SealDamaged("seal has 49 bytes, expected 48")
    fileio.eio_paths.add(seal_path(SEGMENT))
    damaged = read_seal(fileio, SEGMENT)
    assert isinstance(damaged, SealDamaged) and "cannot read seal" in damaged.reason
    assert fileio.handles == {}


# -- check_sealed_segment --------------------------------------------------------------


def test_check_ok():
    data = os.urandom(5000)
    check = check_sealed_segment(sealed(data), SEGMENT, chunk_bytes=1000)
    assert check.outcome is SealOutcome.OK
    assert (check.bytes_hashed, check.file_bytes, check.seal.size_bytes) == (5000,) * 3
    assert check.seconds >= 0
    assert not check.is_problem


def test_check_no_seal_and_missing():
    fileio = MemoryFileIO()
    assert check_sealed_segment(fileio, SEGMENT).outcome is SealOutcome.MISSING
    fileio.files[SEGMENT] = bytearray(b"abc")
    assert check_sealed_segment(fileio, SEGMENT).outcome is SealOutcome.NO_SEAL


def test_check_seal_damaged_is_not_a_data_problem():
    fileio = sealed(b"data")
    fileio.files[seal_path(SEGMENT)][20] ^= 0x10
    check = check_sealed_segment(fileio, SEGMENT)
    assert check.outcome is SealOutcome.SEAL_DAMAGED
    assert check.reason == "seal damaged: seal checksum mismatch"
    assert check.bytes_hashed == 0


def test_check_size_and_digest_mismatch():
    fileio = sealed(b"0123456789")
    fileio.files[SEGMENT].extend(b"more")
    check = check_sealed_segment(fileio, SEGMENT)
    assert check.outcome is SealOutcome.SIZE_MISMATCH
    assert check.reason == "segment has 14 bytes, its seal says 10"
    fileio = sealed(b"0123456789")
    fileio.files[SEGMENT][3] ^= 1
    check = check_sealed_segment(fileio, SEGMENT)
    assert check.outcome is SealOutcome.DIGEST_MISMATCH
    assert check.bytes_hashed == 10
    assert fileio.handles == {}


def test_check_read_error_is_an_outcome():
    fileio = sealed(b"0123456789")
    fileio.eio_paths.add(SEGMENT)
    check = check_sealed_segment(fileio, SEGMENT)
    assert check.outcome is SealOutcome.READ_ERROR
    assert "I/O error" in check.reason
    assert check.is_problem
    assert fileio.handles == {}


def test_pace_exceptions_propagate_and_close_the_file():
    fileio = sealed(b"x" * 100)

    def pace(size):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        check_sealed_segment(fileio, SEGMENT, pace=pace)
    assert fileio.handles == {}
