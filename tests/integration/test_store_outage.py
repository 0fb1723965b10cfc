"""The store gone for a while under load (DESIGN 11), the real store behind a proxy that
cuts every connection and refuses new ones: no process dies, nothing acknowledged is
lost, and the backlog drains when it is back.

* in a process, durability "remote": appends during the outage fail with StoreTimeout
  (the typed timeout) and nothing else; once the store is back they are acknowledged
  again, and everything acknowledged is in the store at its offset;
* through the daemon, durability "local": appends go on being acknowledged (the local
  fsync) through the outage; /metrics counts the store's failures and shows the
  backlog, which drains when the store is back.

`STREAMLOG_OUTAGE_S` sets the outage's length: 15 s in the suite (which runs on 2 cores
within its time budget); `STREAMLOG_OUTAGE_S=30` is the 30 s outage the closing figures
come from."""

from __future__ import annotations

import os
import re
import threading
import time
import urllib.request
from urllib.parse import urlsplit

import pytest

import streamlog
from streamlog.testing.serve import ServeProcess
from tests.harness.tcp_proxy import TcpProxy

OUTAGE_S = float(os.environ.get("STREAMLOG_OUTAGE_S", 15))


@pytest.fixture
def proxy(s3_server):
    endpoint = urlsplit(s3_server.endpoint)
    proxy = TcpProxy((endpoint.hostname, endpoint.port)).start()
    yield proxy
    proxy.close()


class Appender:
    """Appends from a thread until stopped; records acks, timeouts and anything else."""

    def __init__(self, append) -> None:
        self.append = append
        self.acked: dict[tuple[int, int], bytes] = {}
        self.timeouts = 0
        self.others: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            value = b"r%06d" % i
            partition = i % 2
            i += 1
            try:
                offset = self.append(value, partition)
            except streamlog.StoreTimeout:
                self.timeouts += 1
                continue
            except BaseException as error:  # noqa: BLE001 - the test reports it
                self.others.append(error)
                return
            self.acked[(partition, offset)] = value
            time.sleep(0.002)

    def __enter__(self) -> "Appender":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(60)


def in_the_store(s3_server, url: str) -> dict[tuple[int, int], bytes]:
    with streamlog.open_log(url, storage_options=s3_server.storage_options) as view:
        return {(n, r.offset): r.value for n in range(2) for r in view.reader("s", n)}


@pytest.mark.xdist_group("s3")
def test_an_outage_under_remote_durability_is_timeouts_then_nothing_lost(
        tmp_path, s3_server, proxy):
    url = s3_server.url(s3_server.new_prefix())
    options = {**s3_server.storage_options, "endpoint": proxy.endpoint}
    with streamlog.open_log(tmp_path / "log", remote=url, storage_options=options,
                            durability="remote", remote_timeout_s=3, fsync="never",
                            segment_bytes_max=64 * 1024) as log:
        log.create_stream("s", 2)
        with Appender(lambda value, n: log.append_sync("s", value, partition=n).offset) as app:
            time.sleep(2)
            before = len(app.acked)
            proxy.down()
            time.sleep(OUTAGE_S)
            during = len(app.acked)
            proxy.up()
            time.sleep(5)
        assert not app.others, app.others
        assert before > 10 and app.timeouts >= 1
        assert during - before <= 2 * 64  # (acks in flight when it went down)
        assert len(app.acked) > during + 10  # acknowledged again once it was back
        deadline = time.monotonic() + 60
        while log.info()["streams"]["s"]["partitions"][0]["remote_lag_records"] and (
                time.monotonic() < deadline):
            time.sleep(0.2)
        assert proxy.refused > 0
    stored = in_the_store(s3_server, url)
    lost = {key: value for key, value in app.acked.items() if stored.get(key) != value}
    assert not lost, f"{len(lost)} acknowledged records not in the store"


def metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    total = 0.0
    for line in text.decode().splitlines():
        match = re.match(rf"{name}(\{{[^}}]*\}})? ([0-9.e+-]+)$", line)
        if match:
            total += float(match.group(2))
    return total


@pytest.mark.xdist_group("s3")
def test_an_outage_through_the_daemon_under_local_durability_drains(
        tmp_path, s3_server, proxy, monkeypatch):
    url = s3_server.url(s3_server.new_prefix())
    for name, value in {**s3_server.env, "AWS_ENDPOINT_URL": proxy.endpoint}.items():
        monkeypatch.setenv(name, value)
    daemon = ServeProcess(tmp_path / "log", "--remote", url, "--remote-max-lag-s", "1",
                          "--fsync", "never", token="t", metrics_port="0")
    try:
        with streamlog.open_log(daemon.url, token="t") as client:
            client.create_stream("s", 2)
            with Appender(lambda value, n: client.append_sync(
                    "s", value, partition=n).offset) as app:
                time.sleep(3)
                proxy.down()
                time.sleep(OUTAGE_S / 2)
                mid = len(app.acked)
                backlog = metric(daemon.metrics_port, "streamlog_remote_backlog_bytes")
                time.sleep(OUTAGE_S / 2)
                assert len(app.acked) > mid  # acknowledged all through the outage
                failures = metric(daemon.metrics_port, "streamlog_store_failures_total")
                proxy.up()
                time.sleep(2)
            assert not app.others and app.timeouts == 0, app.others
            assert backlog > 0 and failures > 0
            assert daemon.proc.poll() is None  # no process died
            deadline = time.monotonic() + 90
            while metric(daemon.metrics_port, "streamlog_remote_backlog_bytes") > 0:
                assert time.monotonic() < deadline, "the backlog did not drain"
                time.sleep(0.5)
    finally:
        daemon.stop()
    stored = in_the_store(s3_server, url)
    lost = {key: value for key, value in app.acked.items() if stored.get(key) != value}
    assert not lost, f"{len(lost)} acknowledged records not in the store"
