"""Segment (segment.py): one file of frames, its running digest and its seal."""

import os

from streamlog.fileio import OsFileIO
from streamlog.seal import SealOutcome, check_sealed_segment, hash_file, read_seal, seal_path
from streamlog.segment import Segment
from streamlog.testing.clock import ManualClock


def test_append_read_seal_truncate(tmp_path):
    fileio, clock = OsFileIO(), ManualClock()
    segment = Segment(fileio, str(tmp_path), 40, writable=True, create=True, clock=clock)
    assert segment.path.endswith("00000000000000000040.log")
    assert segment.created_monotonic == clock.monotonic_s()
    assert segment.append(b"abc") == 0 and segment.append(b"defg") == 3
    assert segment.read(2, 3) == b"cde" and segment.size_bytes == 7
    segment.fsync()
    segment.seal(clock.wall_us(), end_offset=45)
    seal = read_seal(fileio, segment.path)
    assert (seal.size_bytes, seal.end_offset) == (7, 45)
    assert seal.digest == hash_file(fileio, segment.path, 7)  # the running digest agrees
    assert check_sealed_segment(fileio, segment.path).outcome is SealOutcome.OK
    segment.truncate_to(3)  # the seal goes before the file changes
    assert not os.path.exists(seal_path(segment.path))
    assert segment.digest is None  # unknown now: hashed from the file at the next seal
    segment.append(b"XY")
    segment.seal(clock.wall_us(), end_offset=44)
    assert read_seal(fileio, segment.path).digest == hash_file(fileio, segment.path, 5)
    segment.close()


def test_a_reopened_segment_hashes_its_file_when_it_seals(tmp_path):
    fileio = OsFileIO()
    first = Segment(fileio, str(tmp_path), 0, writable=True, create=True)
    first.append(b"x" * 1000)
    first.close()
    again = Segment(fileio, str(tmp_path), 0, writable=True)
    assert again.size_bytes == 1000 and again.digest is None
    again.append(b"y" * 10)
    again.seal(1, end_offset=3)
    assert check_sealed_segment(fileio, again.path).outcome is SealOutcome.OK
    again.close()
