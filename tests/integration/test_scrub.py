"""scrub.py on a real log: segments written by streamlog, sealed here with seal.py, then
scrubbed with an injected clock and sleep (no real waiting, except in the stop tests)."""

from __future__ import annotations

import errno
import glob
import json
import logging
import os
import threading
import time

import pytest

import streamlog
from streamlog.fileio import OsFileIO
from streamlog.frame import HEADER_BYTES
from streamlog.scan import scan_buffer
from streamlog.scrub import (SCRUB_FILE, Scrubber, locate_bad_frame, read_scrub_status,
                             summarize)
from streamlog.seal import SealOutcome, hash_file, seal_path, write_seal
from streamlog.testing.faultfs import flip_bit

STREAM = "s"
KEY = (STREAM, 0)


class FakeTime:
    """A clock that only moves when something sleeps on it."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []
        self.on_sleep = None

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep()


@pytest.fixture
def partition(log_dir):
    """A closed log with 5 segments in partition 0; the first 4 sealed, the last (the
    active one) not. Returns (partition_dir, segment paths)."""
    with streamlog.open_log(log_dir, segment_bytes_max=4096, compression="none",
                            fsync="never") as log:
        log.create_stream(STREAM, partitions=1)
        for batch in range(40):
            log.append_batch_sync(STREAM, [b"value-%05d-%d" % (batch, i) * 4 for i in range(5)])
    directory = os.path.join(log_dir, "streams", STREAM, "0")
    paths = [os.path.join(directory, name) for name in sorted(os.listdir(directory))
             if name.endswith(".log")]
    assert len(paths) == 5
    fileio = OsFileIO()
    for path in paths[:-1]:
        size = os.path.getsize(path)
        write_seal(fileio, path, size_bytes=size, digest=hash_file(fileio, path, size),
                   sealed_at_us=time.time_ns() // 1000)
    return directory, paths


def scrubber_for(paths, directory, fake: FakeTime | None = None, **options) -> Scrubber:
    fake = fake or FakeTime()
    return Scrubber(OsFileIO(), lambda: [(KEY, directory, path) for path in paths],
                    clock=fake.clock, sleep=fake.sleep, **options)


def frame_positions(path: str) -> list[int]:
    with open(path, "rb") as file:
        return [frame.position for frame in scan_buffer(file.read()).frames]


def test_clean_pass_writes_scrub_json(partition):
    directory, paths = partition
    seen = []
    scrubber = scrubber_for(paths, directory, on_result=seen.append)
    results = scrubber.run_pass()
    assert [r.outcome for r in results] == [SealOutcome.OK] * 4 + [SealOutcome.NO_SEAL]
    assert seen == results
    sealed_bytes = sum(os.path.getsize(p) for p in paths[:-1])
    assert (scrubber.segments_checked, scrubber.bytes_checked, scrubber.problems) == \
        (5, sealed_bytes, 0)
    assert scrubber.passes_completed == 1
    status = read_scrub_status(OsFileIO(), directory)
    assert status["result"] == "ok"
    assert (status["segments"], status["bytes"], status["unsealed_segments"]) == \
        (4, sealed_bytes, 1)
    assert status["findings"] == []
    assert abs(status["verified_at_us"] - time.time_ns() // 1000) < 60_000_000
    # The log still opens with seals and scrub.json beside its segments.
    with streamlog.open_log(os.path.dirname(os.path.dirname(os.path.dirname(directory))),
                            readonly=True) as log:
        assert sum(1 for _ in log.reader(STREAM, 0)) == 200


def test_rate_limit_is_honoured(partition):
    directory, paths = partition
    fake = FakeTime()
    scrubber = scrubber_for(paths, directory, fake, bytes_per_s=10_000, chunk_bytes=1000)
    scrubber.run_pass()
    total = scrubber.bytes_checked
    assert total > 10_000
    assert sum(fake.sleeps) == pytest.approx(total / 10_000)
    assert max(fake.sleeps) <= 1000 / 10_000 + 1e-9  # never more than one chunk ahead
    # After a long idle gap the bucket holds at most one chunk: no burst beyond it.
    fake.now += 3600
    fake.sleeps.clear()
    scrubber.run_pass()
    assert sum(fake.sleeps) >= (total - 1000) / 10_000 - 1e-9


@pytest.mark.parametrize("chunk_bytes", [100, 1000, 1 << 20])
@pytest.mark.parametrize("where", ["payload", "header"])
def test_flipped_byte_is_found_at_its_frame(partition, caplog, chunk_bytes, where):
    directory, paths = partition
    target = paths[1]
    frame_position = frame_positions(target)[3]
    flip_bit(target, frame_position + (HEADER_BYTES + 5 if where == "payload" else 20), 2)
    scrubber = scrubber_for(paths, directory, chunk_bytes=chunk_bytes)
    with caplog.at_level(logging.DEBUG, logger="streamlog.scrub"):
        results = scrubber.run_pass()
    bad = [r for r in results if r.check.is_problem]
    assert [r.segment_path for r in bad] == [target]
    assert bad[0].outcome is SealOutcome.DIGEST_MISMATCH
    assert bad[0].finding.position == frame_position
    assert f"{where} checksum mismatch" in bad[0].finding.reason
    assert scrubber.problems == 1
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert target in errors[0].getMessage()
    assert f"at position {frame_position}" in errors[0].getMessage()
    status = read_scrub_status(OsFileIO(), directory)
    assert status["result"] == "corrupt"
    assert status["findings"] == [{"segment": os.path.basename(target),
                                   "position": frame_position,
                                   "reason": bad[0].finding.reason,
                                   "outcome": "digest_mismatch"}]


def test_truncated_segment_is_a_size_mismatch(partition):
    directory, paths = partition
    position = frame_positions(paths[0])[2]
    os.truncate(paths[0], position + 30)
    results = scrubber_for(paths, directory, chunk_bytes=500).run_pass()
    assert results[0].outcome is SealOutcome.SIZE_MISMATCH
    assert results[0].finding.position == position
    assert results[0].finding.reason.startswith("frame cut short")
    assert read_scrub_status(OsFileIO(), directory)["result"] == "corrupt"


def test_grown_segment_with_valid_frames(partition):
    directory, paths = partition
    with open(paths[0], "rb") as file:
        data = file.read()
    with open(paths[0], "ab") as file:  # a copy of frame 0: valid checksum, wrong offset
        file.write(data[:frame_positions(paths[0])[1]])
    result = scrubber_for(paths[:1], directory).run_pass()[0]
    assert result.outcome is SealOutcome.SIZE_MISMATCH
    assert result.finding.position == len(data)
    assert "expected" in result.finding.reason  # "base offset 0, expected N"


def test_damaged_seal_is_not_reported_as_corruption(partition, caplog):
    directory, paths = partition
    flip_bit(seal_path(paths[2]), 12)
    with caplog.at_level(logging.WARNING, logger="streamlog.scrub"):
        results = scrubber_for(paths, directory).run_pass()
    assert results[2].outcome is SealOutcome.SEAL_DAMAGED
    assert results[2].finding.position is None
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "not data corruption" in caplog.records[0].getMessage()
    status = read_scrub_status(OsFileIO(), directory)
    assert status["result"] == "seal_damaged"
    assert status["segments"] == 4
    assert status["bytes"] == sum(os.path.getsize(p) for p in paths[:-1]) \
        - os.path.getsize(paths[2])


def test_vanished_segments_are_skipped(partition):
    directory, paths = partition
    fake = FakeTime()

    def retention():  # deletes segment 2 (seal first) while segment 0 is being read
        if os.path.exists(paths[2]):
            os.unlink(seal_path(paths[2]))
            os.unlink(paths[2])

    fake.on_sleep = retention
    listed = paths[:-1] + [os.path.join(directory, "00000000000000999999.log")]
    scrubber = scrubber_for(listed, directory, fake, bytes_per_s=1e6, chunk_bytes=4096)
    results = scrubber.run_pass()
    assert [r.segment_path for r in results] == [paths[0], paths[1], paths[3]]
    assert all(r.outcome is SealOutcome.OK for r in results)
    assert scrubber.problems == 0
    assert read_scrub_status(OsFileIO(), directory)["segments"] == 3


def test_on_result_failure_does_not_stop_the_pass(partition, caplog):
    directory, paths = partition

    def broken(result):
        raise RuntimeError("metrics are down")

    results = scrubber_for(paths, directory, on_result=broken).run_pass()
    assert len(results) == 5
    assert "on_result callback failed" in caplog.text


def test_stop_is_prompt_mid_segment_and_between_passes(partition):
    directory, paths = partition
    slow = Scrubber(OsFileIO(), lambda: [(KEY, directory, p) for p in paths],
                    bytes_per_s=1000, chunk_bytes=1000)  # 4 s per segment
    slow.start()
    time.sleep(0.2)
    started = time.monotonic()
    slow.stop()
    assert time.monotonic() - started < 1.0
    assert not slow._thread.is_alive()
    assert slow.passes_completed == 0
    assert read_scrub_status(OsFileIO(), directory) is None  # no partial status

    idle = Scrubber(OsFileIO(), lambda: [(KEY, directory, p) for p in paths],
                    bytes_per_s=1 << 30, interval_s=3600)
    idle.start()
    deadline = time.monotonic() + 10
    while idle.passes_completed == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert idle.passes_completed == 1
    started = time.monotonic()
    idle.stop()
    assert time.monotonic() - started < 1.0
    assert not idle._thread.is_alive()
    assert read_scrub_status(OsFileIO(), directory)["result"] == "ok"


def test_a_failing_segments_callable_does_not_kill_the_thread(partition, caplog):
    directory, paths = partition
    calls = threading.Semaphore(0)

    def segments():
        calls.release()
        raise OSError("listing failed")

    scrubber = Scrubber(OsFileIO(), segments, interval_s=0.01)
    scrubber.start()
    assert calls.acquire(timeout=5) and calls.acquire(timeout=5)  # a second pass ran
    scrubber.stop()
    assert "scrub pass failed" in caplog.text


def test_read_scrub_status_never_raises(tmp_path):
    fileio, directory = OsFileIO(), str(tmp_path)
    assert read_scrub_status(fileio, directory) is None
    path = tmp_path / SCRUB_FILE
    for text in ("", "{", "[]", '{"result": "ok"}', "\xff",
                 json.dumps({"verified_at_us": 1, "result": "fine", "segments": 0,
                             "bytes": 0, "unsealed_segments": 0, "findings": []}),
                 json.dumps({"verified_at_us": 1, "result": "ok", "segments": -1,
                             "bytes": 0, "unsealed_segments": 0, "findings": []}),
                 json.dumps({"verified_at_us": 1, "result": "ok", "segments": 0,
                             "bytes": 0, "unsealed_segments": 0, "findings": [{}]})):
        path.write_text(text, encoding="latin-1")
        assert read_scrub_status(fileio, directory) is None, text
    os.mkdir(tmp_path / "sub")
    os.mkdir(tmp_path / "sub" / SCRUB_FILE)  # a directory where the file should be
    assert read_scrub_status(fileio, str(tmp_path / "sub")) is None


def test_summarize_of_nothing_is_ok():
    assert summarize([], verified_at_us=5) == {
        "verified_at_us": 5, "result": "ok", "segments": 0, "bytes": 0,
        "unsealed_segments": 0, "findings": []}


def test_locate_bad_frame_on_a_clean_segment(partition):
    _, paths = partition
    assert locate_bad_frame(OsFileIO(), paths[0], chunk_bytes=77) is None


class FailingReads(OsFileIO):
    """Reads of the paths in `failing` raise EIO, as a dying disk's would."""

    def __init__(self) -> None:
        super().__init__()
        self.failing: set[str] = set()

    def pread(self, handle, size, position):
        if self.path_of(handle) in self.failing:
            raise OSError(errno.EIO, "Input/output error")
        return super().pread(handle, size, position)


def test_read_errors_are_reported_as_such(partition):
    directory, paths = partition
    fileio, fake = FailingReads(), FakeTime()
    fileio.failing = {seal_path(paths[1]), paths[2]}
    scrubber = Scrubber(fileio, lambda: [(KEY, directory, p) for p in paths[:3]],
                        clock=fake.clock, sleep=fake.sleep)
    results = scrubber.run_pass()
    assert [r.outcome for r in results] == \
        [SealOutcome.OK, SealOutcome.SEAL_DAMAGED, SealOutcome.READ_ERROR]
    assert "cannot read seal" in results[1].finding.reason
    assert "cannot read segment" in results[2].finding.reason
    assert results[2].finding.position is None
    assert scrubber.problems == 2
    assert read_scrub_status(fileio, directory)["result"] == "read_error"


def test_unwritable_scrub_json_is_logged(partition, caplog):
    directory, paths = partition
    os.mkdir(os.path.join(directory, SCRUB_FILE))
    assert len(scrubber_for(paths, directory).run_pass()) == 5
    assert f"cannot write {SCRUB_FILE}" in caplog.text


# -- wired in: a local writer that asks for it, and the daemon --------------------------

def _wait_for(predicate, timeout_s: float = 20.0):
    import time
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_a_writer_that_asks_scrubs_its_sealed_segments_and_info_shows_it(tmp_path):
    path = str(tmp_path / "log")
    with streamlog.open_log(path, segment_bytes_max=4096, compression="none",
                            scrub_bytes_per_s=1 << 30, scrub_interval_s=0.05) as log:
        log.create_stream("s")
        for batch in range(30):
            log.append_batch_sync("s", [b"%d" % batch * 50] * 4)
        assert log.scrubber is not None
        # A pass may run while the appends still seal segments: wait for one that saw
        # at least two of them.
        status = _wait_for(lambda: (lambda v: v if v and v["segments"] >= 2 else None)(
            log.info()["streams"]["s"]["partitions"][0]["verified"]))
        assert status["result"] == "ok" and status["segments"] >= 2
        sealed = sorted(glob.glob(os.path.join(path, "streams", "s", "0", "*.log")))[0]
        with open(sealed, "r+b") as handle:  # bit rot in a sealed segment, under a writer
            handle.seek(200)
            byte = handle.read(1)[0]
            handle.seek(200)
            handle.write(bytes([byte ^ 1]))
        status = _wait_for(lambda: (lambda s: s if s and s["result"] == "corrupt" else None)(
            log.info()["streams"]["s"]["partitions"][0]["verified"]))
        assert status["findings"][0]["segment"] == os.path.basename(sealed)
        assert log.scrubber.problems >= 1


def test_the_daemon_scrubs_by_default_and_reports_it(tmp_path, monkeypatch):
    from streamlog.testing.serve import ServeProcess
    path = str(tmp_path / "log")
    with streamlog.open_log(path, segment_bytes_max=4096, compression="none") as log:
        log.create_stream("s")
        for batch in range(30):
            log.append_batch_sync("s", [b"%d" % batch * 50] * 4)
    daemon = ServeProcess(path, "--scrub-interval-s", "0.05", token="scrub-test-token")
    monkeypatch.setenv("STREAMLOG_TOKEN", "scrub-test-token")
    try:
        with streamlog.open_log(daemon.url) as remote:
            status = _wait_for(
                lambda: remote.info()["streams"]["s"]["partitions"][0].get("verified"))
        assert status["result"] == "ok" and status["segments"] >= 2
    finally:
        assert daemon.stop() == 0
