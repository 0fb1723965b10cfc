"""Log.wait_for and wait_for_async: a long poll on a partition's acknowledged end (the
Kafka listener's fetch waits with it). Woken by this process's appends at once, by
another process's appends within a poll interval, and by nothing else before the
timeout."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time

import pytest

import streamlog

STREAM = "w"
# Wake-ups that should be immediate get this long before the test calls them late (a
# loaded two-core machine); the waits themselves are 30 s, so a missed wake-up fails.
PROMPT_S = 2.0


@pytest.fixture
def log(open_logs, log_dir):
    opened = open_logs(log_dir)
    opened.create_stream(STREAM, partitions=2)
    opened.append_batch_sync(STREAM, [b"a", b"b"], partition=0)
    return opened


def _append_later(log, delay_s: float, partition: int = 0) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(delay_s), log.append_sync(
        STREAM, b"late", partition=partition)))
    thread.start()
    return thread


def test_an_end_already_past_the_offset_answers_at_once(log):
    assert log.wait_for(STREAM, 0, 1, 0) is True
    assert log.wait_for(STREAM, 0, 0, 30) is True


def test_nothing_appended_is_a_timeout(log):
    started = time.monotonic()
    assert log.wait_for(STREAM, 0, 2, 0.3) is False
    assert 0.3 <= time.monotonic() - started < 0.3 + PROMPT_S
    assert log.wait_for(STREAM, 0, 2, 0) is False


def test_an_append_here_wakes_the_wait_at_once(log):
    writer = _append_later(log, 0.2)
    started = time.monotonic()
    assert log.wait_for(STREAM, 0, 2, 30) is True
    assert time.monotonic() - started < PROMPT_S
    writer.join()
    assert log.end_offset(STREAM, 0) == 3


def test_an_append_to_another_partition_does_not_end_the_wait(log):
    writer = _append_later(log, 0.05, partition=1)
    assert log.wait_for(STREAM, 0, 2, 0.5) is False
    writer.join()
    assert log.end_offset(STREAM, 1) == 1


def test_another_processs_append_is_seen_within_a_poll_interval(log, log_dir):
    child = subprocess.run([sys.executable, "-c", (
        "import streamlog, sys\n"
        "with streamlog.open_log(sys.argv[1]) as log:\n"
        f"    log.append_sync({STREAM!r}, b'from another process', partition=0)\n"),
        log_dir], capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr
    started = time.monotonic()
    assert log.wait_for(STREAM, 0, 2, 30) is True
    assert time.monotonic() - started < log.config.follow_poll_s + PROMPT_S
    assert [r.value for r in log.reader(STREAM, 0, from_offset=2)] == [
        b"from another process"]


def test_a_read_only_view_sees_the_writers_appends(log, log_dir, open_logs):
    view = open_logs(log_dir, readonly=True)
    writer = _append_later(log, 0.2)
    assert view.wait_for(STREAM, 0, 2, 30) is True
    writer.join()
    assert view.end_offset(STREAM, 0) == 3


def test_closing_the_log_ends_a_wait_with_log_closed(log_dir):
    log = streamlog.open_log(log_dir)
    log.create_stream(STREAM)
    closer = threading.Timer(0.2, log.close)
    closer.start()
    with pytest.raises(streamlog.LogClosed):
        log.wait_for(STREAM, 0, 0, 30)
    closer.join()
    with pytest.raises(streamlog.LogClosed):
        log.wait_for(STREAM, 0, 0, 0)


@pytest.mark.parametrize("offset, timeout_s, match", [
    (-1, 1, "offset must be an int >= 0"), ("0", 1, "offset must be an int >= 0"),
    (True, 1, "offset must be an int >= 0"), (0, -1, "timeout_s must be a finite number"),
    (0, float("inf"), "timeout_s must be a finite number"),
    (0, None, "timeout_s must be a finite number"),
])
def test_bad_arguments_are_refused(log, offset, timeout_s, match):
    with pytest.raises(streamlog.InvalidArgument, match=match):
        log.wait_for(STREAM, 0, offset, timeout_s)


def test_an_unknown_stream_or_partition_is_refused(log):
    with pytest.raises(streamlog.UnknownStream):
        log.wait_for("nope", 0, 0, 1)
    with pytest.raises(streamlog.InvalidArgument, match=r"has partitions 0\.\.1"):
        log.wait_for(STREAM, 2, 0, 1)


async def test_the_async_wait_is_woken_by_an_append_without_blocking_its_loop(log):
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    beat = asyncio.ensure_future(ticker())
    writer = _append_later(log, 0.3)
    started = time.monotonic()
    assert await log.wait_for_async(STREAM, 0, 2, 30) is True
    assert time.monotonic() - started < PROMPT_S
    beat.cancel()
    writer.join()
    assert ticks >= 5  # the loop ran while it waited


async def test_the_async_wait_times_out_and_can_be_cancelled(log):
    assert await log.wait_for_async(STREAM, 0, 2, 0.2) is False
    waiting = asyncio.ensure_future(log.wait_for_async(STREAM, 0, 2, 30))
    await asyncio.sleep(0.3)  # across a poll or two
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    writer = _append_later(log, 0.1)  # a wait after a cancelled one is woken as ever
    assert await log.wait_for_async(STREAM, 0, 2, 30) is True
    writer.join()
