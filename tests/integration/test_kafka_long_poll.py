"""The Kafka port's fetch long poll (Log.wait_for_async): a consumer parked in a fetch
with a long fetch.max.wait gets a record as soon as it is appended, whether the daemon
appended it or another process that writes the same log did."""

from __future__ import annotations

import threading
import time

import pytest

import streamlog
from streamlog.testing.serve import ServeProcess
from streamlog.wire.client import open_remote

kafka = pytest.importorskip("kafka")

TOKEN = "kafka-long-poll-token"
MAX_WAIT_MS = 10_000  # what the consumer lets the daemon park its fetch for
PROMPT_S = 2.5  # a wake-up arrives well within this (the fetch would last 10 s)
pytestmark = pytest.mark.slow


@pytest.fixture
def daemon(tmp_path):
    serve = ServeProcess(tmp_path / "log", "--scrub-mib-per-s", "0", token=TOKEN,
                         kafka_port="0")
    serve.path = str(tmp_path / "log")
    yield serve
    serve.stop()


class ParkedConsumer:
    """A kafka-python consumer of one partition, polling on its own thread; `arrived`
    holds (monotonic time, value) of each record it got."""

    def __init__(self, port: int, topic: str) -> None:
        self.consumer = kafka.KafkaConsumer(
            bootstrap_servers=f"127.0.0.1:{port}", security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="PLAIN", sasl_plain_username="streamlog",
            sasl_plain_password=TOKEN, fetch_max_wait_ms=MAX_WAIT_MS,
            auto_offset_reset="earliest", enable_auto_commit=False)
        self.consumer.assign([kafka.TopicPartition(topic, 0)])
        self.arrived: list[tuple[float, bytes]] = []
        self.polls = 0
        self.stopping = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping:
            for records in self.consumer.poll(timeout_ms=100).values():
                now = time.monotonic()
                self.arrived += [(now, record.value) for record in records]
            self.polls += 1

    def wait_parked(self) -> None:
        """Until the consumer polled a while: its fetch is waiting in the daemon."""
        deadline = time.monotonic() + 30
        while self.polls < 10 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self.polls >= 10
        time.sleep(0.5)

    def first_after(self, value: bytes, timeout_s: float = 30) -> float:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for when, got in self.arrived:
                if got == value:
                    return when
            time.sleep(0.01)
        raise AssertionError(f"{value!r} never arrived: {self.arrived}")

    def close(self) -> None:
        self.stopping = True
        self.thread.join(30)
        self.consumer.close()


def test_an_append_through_the_daemon_ends_a_parked_fetch_at_once(daemon):
    with open_remote(daemon.url, TOKEN) as client:
        client.create_stream("lp")
        consumer = ParkedConsumer(daemon.kafka_port, "lp")
        try:
            consumer.wait_parked()
            appended = time.monotonic()
            client.append_sync("lp", b"now")
            assert consumer.first_after(b"now") - appended < PROMPT_S
        finally:
            consumer.close()


def test_an_append_by_another_writer_process_ends_a_parked_fetch(daemon):
    with open_remote(daemon.url, TOKEN) as client:
        client.create_stream("other")
    consumer = ParkedConsumer(daemon.kafka_port, "other")
    try:
        consumer.wait_parked()
        with streamlog.open_log(daemon.path) as beside:  # a second writer of the log
            appended = time.monotonic()
            beside.append_sync("other", b"from beside")
        # the daemon takes it in within a poll interval (follow_poll_s)
        assert consumer.first_after(b"from beside") - appended < PROMPT_S
    finally:
        consumer.close()
