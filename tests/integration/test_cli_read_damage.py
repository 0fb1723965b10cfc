"""`streamlog read` on a log damaged in the middle (DESIGN 4 and 10).

A reader delivers every record before a damaged frame, then raises naming the segment
and position; the command writes and flushes every record it got, then prints one line
`streamlog: error: corruption in segment PATH at position N: REASON` on stderr and
exits 1, with no traceback. A bounded read that stops before the damage is a plain
success. The log is built with batches of a few records (one frame each), closed, and
one bit is flipped in the payload of a frame in the middle.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys

import pytest

import streamlog
from streamlog.frame import HEADER_BYTES, decode_frame

STREAM = "events"
BATCH = 5
BATCHES = 10
DAMAGED_BATCH = 5  # offsets 25..29
BASE_US = 1_767_225_600_000_000
ERROR_LINE = re.compile(r"^streamlog: error: corruption in segment (.+) at position (\d+): "
                        r"(.+)$")


def value_of(offset: int) -> str:
    return f"value {offset}"


def build_damaged_log(path: str, *, batch: int = BATCH, batches: int = BATCHES,
                      damaged: int = DAMAGED_BATCH):
    """A one-partition log of `batches` frames of `batch` records; returns (segment path,
    damaged frame) after flipping one payload bit of frame number `damaged`."""
    with streamlog.open_log(path, fsync="always") as log:
        log.create_stream(STREAM, partitions=1)
        for number in range(batches):
            offsets = range(number * batch, (number + 1) * batch)
            log.append_batch_sync(STREAM, [value_of(o).encode() for o in offsets],
                                  keys=[f"k{o % 3}".encode() for o in offsets],
                                  timestamps_us=[BASE_US + o for o in offsets])
    (segment,) = glob.glob(os.path.join(path, "streams", STREAM, "0", "*.log"))
    frames = frames_of(segment)
    assert [f.base_offset for f in frames] == [n * batch for n in range(batches)]
    frame = frames[damaged]
    with open(segment, "r+b") as handle:
        spot = frame.position + HEADER_BYTES + len(frame.payload) // 2
        handle.seek(spot)
        byte = handle.read(1)[0]
        handle.seek(spot)
        handle.write(bytes([byte ^ 0x10]))
    return segment, frame


def frames_of(segment: str) -> list:
    with open(segment, "rb") as handle:
        data = handle.read()
    frames, position = [], 0
    while position < len(data):
        frame = decode_frame(data, position)
        frames.append(frame)
        position += HEADER_BYTES + len(frame.payload)
    return frames


def streamlog_cli(*args: str, merge_stderr: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "streamlog", *args], capture_output=not merge_stderr,
        stdout=subprocess.PIPE if merge_stderr else None,
        stderr=subprocess.STDOUT if merge_stderr else None, timeout=60)


def offsets_in(stdout: bytes) -> list[int]:
    rows = [json.loads(line) for line in stdout.decode().splitlines()]
    for row in rows:
        assert row["stream"] == STREAM and row["partition"] == 0
        assert row["value"] == value_of(row["offset"])
        assert row["timestamp"] == BASE_US + row["offset"]
    return [row["offset"] for row in rows]


def assert_names_the_damage(stderr: bytes, segment: str, frame) -> None:
    text = stderr.decode()
    assert "Traceback" not in text
    lines = text.splitlines()
    assert len(lines) == 1, text
    match = ERROR_LINE.match(lines[0])
    assert match, lines[0]
    assert os.path.samefile(match.group(1), segment)
    assert int(match.group(2)) == frame.position


@pytest.fixture
def damaged(tmp_path):
    path = str(tmp_path / "log")
    segment, frame = build_damaged_log(path)
    return path, segment, frame


def test_full_read_prints_every_record_before_the_damage_then_fails(damaged):
    path, segment, frame = damaged
    result = streamlog_cli("read", path, "--stream", STREAM)
    assert offsets_in(result.stdout) == list(range(frame.base_offset))
    assert_names_the_damage(result.stderr, segment, frame)
    assert result.returncode == 1


def test_records_are_flushed_before_the_error_line(damaged):
    path, segment, frame = damaged
    result = streamlog_cli("read", path, "--stream", STREAM, "--partition", "0",
                           "--from-offset", "7", merge_stderr=True)
    *records, last = result.stdout.splitlines()
    assert offsets_in(b"\n".join(records)) == list(range(7, frame.base_offset))
    assert_names_the_damage(last, segment, frame)
    assert result.returncode == 1


def test_read_to_an_offset_before_the_damage_succeeds(damaged):
    path, _, frame = damaged
    result = streamlog_cli("read", path, "--stream", STREAM, "--from-offset", "0",
                           "--to-offset", "10")
    assert (result.returncode, result.stderr) == (0, b"")
    assert offsets_in(result.stdout) == list(range(10))
    # Up to the damaged frame's first offset: every record before it, still a success.
    result = streamlog_cli("read", path, "--stream", STREAM, "--from-offset", "3",
                           "--to-offset", str(frame.base_offset))
    assert (result.returncode, result.stderr) == (0, b"")
    assert offsets_in(result.stdout) == list(range(3, frame.base_offset))


def test_read_to_a_timestamp_before_the_damage_succeeds(damaged):
    path, _, frame = damaged
    result = streamlog_cli("read", path, "--stream", STREAM,
                           "--to-timestamp", str(BASE_US + 12))
    assert (result.returncode, result.stderr) == (0, b"")
    assert offsets_in(result.stdout) == list(range(12))


def test_read_into_the_damage_prints_what_is_before_it_and_fails(damaged):
    path, segment, frame = damaged
    result = streamlog_cli("read", path, "--stream", STREAM, "--from-offset", "20",
                           "--to-offset", str(frame.base_offset + 2))
    assert offsets_in(result.stdout) == list(range(20, frame.base_offset))
    assert_names_the_damage(result.stderr, segment, frame)
    assert result.returncode == 1


def test_read_to_a_timestamp_inside_the_damage_prints_what_is_before_it(damaged):
    """The batch that reaches T is the damaged one: the stop cannot be resolved there,
    so the read goes up to the damage and fails there, after every record before it."""
    path, segment, frame = damaged
    result = streamlog_cli("read", path, "--stream", STREAM, "--from-offset", "18",
                           "--to-timestamp", str(BASE_US + frame.base_offset + 2))
    assert offsets_in(result.stdout) == list(range(18, frame.base_offset))
    assert_names_the_damage(result.stderr, segment, frame)
    assert result.returncode == 1


def test_more_records_than_one_write_chunk_before_the_damage(tmp_path):
    """Over 1024 lines before the damage: the lines written in chunks and the ones still
    pending when the reader raises all come out."""
    path = str(tmp_path / "log")
    segment, frame = build_damaged_log(path, batch=100, batches=16, damaged=13)
    result = streamlog_cli("read", path, "--stream", STREAM, "--from-offset", "0")
    assert offsets_in(result.stdout) == list(range(1300))
    assert_names_the_damage(result.stderr, segment, frame)
    assert result.returncode == 1
