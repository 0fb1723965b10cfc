"""Durable holds, retention and open transactions through a daemon (streamlog://): the
operations added to the API answer as the local log does, with its errors, and a
read-only client may hold the input it still needs."""

from __future__ import annotations

import asyncio
import random
import threading

import pytest

import streamlog
from streamlog.wire.client import open_remote
from streamlog.wire.metrics import Metrics
from streamlog.wire.server import LogServer, ServerConfig

pytestmark = pytest.mark.slow

TOKEN = "holds-test-token"
STREAM = "h"
DAY_US = 86_400 * 1_000_000
T0_US = 1_700_000_000_000_000  # the records' event time


class Daemon:
    """A LogServer on its own event loop thread over a log with small segments and a
    one-day retention by age (as tests/integration/test_daemon.py's ThreadedDaemon)."""

    def __init__(self, path: str) -> None:
        self.log = streamlog.open_log(path, segment_bytes_max=4096, retention_age_s=86_400)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        config = ServerConfig(token=TOKEN.encode(), port=0, metrics_port=None)
        self.server = LogServer(self.log, config, Metrics())
        self.run(self.server.start())
        self.url = f"streamlog://127.0.0.1:{self.server.port}"

    def run(self, coroutine, timeout_s: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def connect(self, **options):
        return open_remote(self.url, TOKEN, **options)

    def stop(self) -> None:
        self.run(self.server.drain())  # closes the log
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def daemon(tmp_path):
    started = Daemon(str(tmp_path / "log"))
    yield started
    started.stop()


@pytest.fixture
def remote(daemon):
    with daemon.connect() as client:
        yield client


def _fill(log, batches: int = 40) -> None:
    """A record of ~1 KiB (that does not compress) per batch, written at T0: several
    sealed segments of 4 KiB."""
    log.create_stream(STREAM)
    noise = random.Random(7)
    for i in range(batches):
        log.append_batch_sync(STREAM, [noise.randbytes(1000)], timestamps_us=[T0_US + i])


def test_a_hold_is_set_listed_and_released_as_locally(daemon, remote):
    _fill(daemon.log, batches=2)
    assert remote.hold(STREAM, 0, "op-1", 1) is None
    listed = remote.holds(STREAM, 0)
    assert listed == daemon.log.holds(STREAM, 0)
    assert listed["op-1"]["offset"] == 1 and set(listed) == {"op-1"}
    assert remote.release_hold(STREAM, 0, "op-1") is True
    assert remote.release_hold(STREAM, 0, "op-1") is False
    assert remote.holds(STREAM, 0) == daemon.log.holds(STREAM, 0) == {}


def test_retention_through_the_daemon_keeps_what_a_hold_keeps(daemon, remote):
    _fill(daemon.log)
    segments = daemon.log.info()["streams"][STREAM]["partitions"][0]["segments"]
    assert segments >= 4
    # measured a minute after the records were written: nothing is a day old
    assert remote.apply_retention(now_us=T0_US + 60_000_000) == []
    remote.hold(STREAM, 0, "reader", 20)
    deleted = remote.apply_retention()  # the daemon's clock: everything is old
    assert deleted and all(isinstance(path, str) for path in deleted)
    start = remote.start_offset(STREAM, 0)
    assert 0 < start <= 20  # whole segments below the hold only
    remote.release_hold(STREAM, 0, "reader")
    assert remote.apply_retention(now_us=T0_US + 2 * DAY_US)
    assert remote.start_offset(STREAM, 0) > 20
    assert daemon.log.start_offset(STREAM, 0) == remote.start_offset(STREAM, 0)


def test_open_transactions_through_the_daemon(daemon, remote):
    remote.create_stream("t", partitions=2)
    txn = remote.new_txn_id()
    remote.append_batch_sync("t", [b"a"], partition=1)
    remote.append_batch_sync("t", [b"b", b"c"], partition=1, txn_id=txn)
    assert remote.open_transactions("t", 1) == daemon.log.open_transactions("t", 1) == {
        txn: 1}
    assert remote.open_transactions("t", 0) == {}
    remote.commit_txn("t", 1, txn)
    assert remote.open_transactions("t", 1) == {}


def test_a_read_only_client_may_hold_but_not_delete(daemon):
    _fill(daemon.log, batches=2)
    with daemon.connect(readonly=True) as reader:
        reader.hold(STREAM, 0, "consumer", 0)
        assert set(reader.holds(STREAM, 0)) == {"consumer"}
        with pytest.raises(streamlog.ReadOnlyLog):
            reader.apply_retention()
        assert reader.release_hold(STREAM, 0, "consumer") is True


def test_errors_arrive_as_the_local_ones(daemon, remote):
    _fill(daemon.log, batches=1)
    with pytest.raises(streamlog.UnknownStream):
        remote.holds("nope", 0)
    with pytest.raises(streamlog.UnknownStream):
        remote.open_transactions("nope", 0)
    with pytest.raises(streamlog.InvalidArgument, match="hold name 'no way' must be"):
        remote.hold(STREAM, 0, "no way", 0)  # the daemon's log says so
    with pytest.raises(streamlog.InvalidArgument, match="offset must be an int >= 0"):
        remote.hold(STREAM, 0, "h", -1)
    with pytest.raises(streamlog.InvalidArgument, match=r"has partitions 0\.\.0"):
        remote.release_hold(STREAM, 3, "h")
    with pytest.raises(streamlog.InvalidArgument, match="now_us must be an int"):
        remote.apply_retention(now_us="today")  # refused before a request is sent
    assert remote.holds(STREAM, 0) == {}  # and the connection survived
