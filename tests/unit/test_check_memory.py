"""verify's and repair's shared path (streamlog/check.py) on a log held in memory: the
same verdicts through any FileIO, and a repair whose cut survives a power loss. No
disk: the partition's files live in a MemoryFileIO (under a FaultFileIO for the crash)."""

from __future__ import annotations

import json
import random

import pytest

from streamlog.check import check_partition, open_segments, partition_dirs, repair_partition
from streamlog.errors import CorruptionError, InvalidArgument
from streamlog.fileio import read_file, write_file_atomic
from streamlog.frame import encode_frame
from streamlog.integrity import IndexClaim, Verdict
from streamlog.layout import partition_dir, segment_name
from streamlog.payload import encode_payload
from streamlog.testing import CrashMode, FaultFileIO, MemoryFileIO

LOG = "/log"
DIRECTORY = partition_dir(LOG, "s", 0)


def frame(base: int) -> bytes:
    """One batch of three records: offsets base, base + 1, base + 2."""
    raw, flags = encode_payload([0, 1, 2], [None] * 3, [b"a", b"b", b"c"])
    return encode_frame(base_offset=base, record_count=3, min_timestamp_us=0,
                        max_timestamp_us=2, txn_id=0, flags=flags, raw_bytes=len(raw),
                        payload=raw)


def a_log(segments: dict[int, bytes], partitions: int = 1) -> MemoryFileIO:
    disk = MemoryFileIO()
    disk.makedirs(DIRECTORY)
    write_file_atomic(disk, f"{LOG}/streams/s/stream.json",
                      json.dumps({"partitions": partitions}).encode())
    for base, data in segments.items():
        write_file_atomic(disk, f"{DIRECTORY}/{segment_name(base)}", data)
    return disk


def test_partitions_and_segments_are_found_through_the_fileio():
    disk = a_log({0: frame(0), 3: frame(3)}, partitions=2)
    disk.makedirs(f"{LOG}/streams/not-a-stream")  # no stream.json: passed over
    assert list(partition_dirs(LOG, fileio=disk)) == [
        ("s", 0, DIRECTORY), ("s", 1, partition_dir(LOG, "s", 1))]
    assert list(partition_dirs(LOG, partition=1, fileio=disk)) == [
        ("s", 1, partition_dir(LOG, "s", 1))]
    assert list(partition_dirs("/nowhere", fileio=disk)) == []
    with pytest.raises(InvalidArgument):
        list(partition_dirs(LOG, "other", fileio=disk))
    segments = open_segments(DIRECTORY, disk)
    assert [s.base_offset for s in segments] == [0, 3]
    for segment in segments:
        segment.close()
    assert open_segments(partition_dir(LOG, "s", 1), disk) == []
    write_file_atomic(disk, f"{LOG}/streams/s/stream.json", b"{")
    with pytest.raises(CorruptionError):
        list(partition_dirs(LOG, fileio=disk))


def test_a_clean_partition_and_a_torn_tail():
    disk = a_log({0: frame(0) + frame(3), 6: frame(6)})
    result = check_partition("s", 0, DIRECTORY, fileio=disk)
    assert (result.verdict, result.index, result.end_offset, result.records) == (
        Verdict.CLEAN, IndexClaim.ABSENT, 9, 9)
    torn = a_log({0: frame(0) + frame(3)[:20]})
    result = check_partition("s", 0, DIRECTORY, fileio=torn)
    assert result.verdict is Verdict.TORN_TAIL and result.end_offset == 3


def test_a_repair_quarantines_the_cut_bytes_and_survives_a_power_loss():
    good, bad = frame(0), bytearray(frame(3))
    bad[-1] ^= 0x01  # a flipped bit in the payload: the frame's checksum fails
    disk = a_log({0: good + bytes(bad) + frame(6), 9: frame(9)})
    fs = FaultFileIO(0, inner=disk)
    result = check_partition("s", 0, DIRECTORY, fileio=fs)
    assert result.verdict is Verdict.CORRUPT and result.finding.position == len(good)
    lines = repair_partition(LOG, result, dry_run=False, fileio=fs)
    assert lines[0]["bytes_cut"] == len(bad) + len(frame(6)) + len(frame(9))
    fs.crash(random.Random(0), CrashMode.DROP_UNSYNCED)  # every step was made durable
    rebooted = FaultFileIO(1, inner=disk)
    again = check_partition("s", 0, DIRECTORY, fileio=rebooted)
    assert (again.verdict, again.end_offset) == (Verdict.CLEAN, 3)
    quarantine = lines[0]["quarantine"]
    assert sorted(disk.listdir(quarantine)) == [
        f"{segment_name(0)}.from-{len(good)}", segment_name(9)]
    assert read_file(disk, f"{quarantine}/{segment_name(9)}") == frame(9)
