"""Idempotent Kafka producers while the daemon is stopped and started again under them.

A confluent-kafka (librdkafka, `enable.idempotence=true`) or aiokafka
(`enable_idempotence=True`) producer sends numbered records continuously to a
three-partition topic while the daemon on its Kafka port is stopped at random moments,
by SIGTERM (a drain) or SIGKILL (a crash), and started again on the same port. Then
every acknowledged record must be in the log exactly once, at the offset its
acknowledgement named, every partition must hold its records in the order they were
sent, and no record may be there twice (a producer's retry of a batch the daemon
appended but did not get to acknowledge is answered as a duplicate, also after a
restart). Each SIGTERM must end the daemon with exit code 0 after a "draining" line,
within DRAIN_BOUND_S, with the producer sending.

The counts of each run are printed (pytest -s shows them).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import struct
import subprocess
import threading
import time

import pytest
from kio.index import load_response_schema
from kio.serial import entity_reader

import streamlog
from streamlog.kafka import record_encoding, records
from streamlog.kafka.server import KafkaConfig, KafkaServer
from streamlog.testing.serve import ServeProcess
from harness.kafka_requests import framed, produce_fields, request_bytes

confluent_kafka = pytest.importorskip("confluent_kafka")
aiokafka = pytest.importorskip("aiokafka")

pytestmark = pytest.mark.slow

TOKEN = "kafka-restart-token"
TOPIC = "events"
PARTITIONS = 3
RESTARTS = {signal.SIGTERM: 10, signal.SIGKILL: 10}
DRAIN_BOUND_S = 10.0  # a drain with nothing stuck takes well under a second
BETWEEN_KILLS_S = (0.02, 0.3)  # after the first acknowledgement from the new daemon


class Daemon:
    """`streamlog serve` on one log and one Kafka port, stopped and started again."""

    def __init__(self, path, kafka_port: int) -> None:
        self.path, self.kafka_port = path, kafka_port
        self.serve = self._start()
        self.drain_seconds: list[float] = []

    def _start(self) -> ServeProcess:
        return ServeProcess(self.path, "--scrub-mib-per-s", "0", token=TOKEN,
                            kafka_port=str(self.kafka_port))

    def stop(self, signum: int) -> None:
        """SIGTERM: a drain that must end with exit 0 within DRAIN_BOUND_S; SIGKILL."""
        if signum == signal.SIGKILL:
            self.serve.kill()
            return
        started = time.monotonic()
        self.serve.proc.send_signal(signal.SIGTERM)
        try:
            code = self.serve.proc.wait(DRAIN_BOUND_S)
        except subprocess.TimeoutExpired:
            self.serve.kill()
            raise AssertionError(f"SIGTERM was not acted on within {DRAIN_BOUND_S} s; "
                                 f"the daemon logged {self.serve.events()[-20:]}") from None
        self.drain_seconds.append(time.monotonic() - started)
        assert code == 0, self.serve.lines[-10:]
        assert "draining" in self.serve.events()

    def restart(self, signum: int) -> None:
        self.stop(signum)
        self.serve = self._start()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def restart_while_sending(daemon: Daemon, acknowledged: list, signum: int,
                          rng: random.Random, failures: list) -> int:
    """Stop and start the daemon RESTARTS[signum] times, each a random moment after
    the new daemon's first acknowledgement. Returns the number of restarts."""
    for _ in range(RESTARTS[signum]):
        seen = len(acknowledged)
        deadline = time.monotonic() + 30
        while len(acknowledged) == seen and not failures:
            assert time.monotonic() < deadline, "no acknowledgement for 30 s"
            time.sleep(0.002)
        time.sleep(rng.uniform(*BETWEEN_KILLS_S))
        daemon.restart(signum)
    return RESTARTS[signum]


def check_exactly_once(path, acknowledged: list, sent: int) -> dict:
    """Every acknowledged record (partition, offset, number) exactly once where its
    acknowledgement said, none stored twice, each partition in sending order. Returns
    the counts."""
    with streamlog.open_log(path) as log:
        stored = {p: [(r.offset, int(r.value)) for r in log.reader(TOPIC, p).records()]
                  for p in range(PARTITIONS)}
    numbers = [number for rows in stored.values() for _offset, number in rows]
    at = {(p, offset): number for p, rows in stored.items() for offset, number in rows}
    lost = [row for row in acknowledged if at.get(row[:2]) != row[2]]
    counts = {"sent": sent, "acknowledged": len(acknowledged), "found": len(numbers),
              "duplicates": len(numbers) - len(set(numbers)), "lost": len(lost)}
    assert counts["duplicates"] == 0, counts
    assert lost == [], (counts, lost[:10])
    for p, rows in stored.items():
        in_order = [number for _offset, number in rows]
        assert in_order == sorted(in_order), f"partition {p} out of sending order"
        assert all(number % PARTITIONS == p for number in in_order)
    return counts


# -- the producers -----------------------------------------------------------------------

def run_confluent(port: int, stop: threading.Event, acknowledged: list,
                  failures: list) -> int:
    """Send 0, 1, 2, ... (record n to partition n % 3) until `stop`, then flush.
    Returns how many were handed to the producer."""
    producer = confluent_kafka.Producer({
        "bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "PLAIN", "sasl.username": "streamlog", "sasl.password": TOKEN,
        "enable.idempotence": True, "acks": "all", "linger.ms": 2,
        "message.timeout.ms": 120_000, "reconnect.backoff.ms": 10,
        "reconnect.backoff.max.ms": 50, "retry.backoff.ms": 10, "retry.backoff.max.ms": 50,
        "topic.metadata.refresh.fast.interval.ms": 20, "log_level": 0})

    def report(error, message):
        if error is not None:
            failures.append(str(error))
        else:
            acknowledged.append((message.partition(), message.offset(),
                                 int(message.value())))

    number = 0
    while not stop.is_set():  # about 2,500 records a second
        for _ in range(10):
            producer.produce(TOPIC, value=b"%d" % number, partition=number % PARTITIONS,
                             on_delivery=report)
            number += 1
        producer.poll(0.004)
    assert producer.flush(120) == 0
    return number


def run_aiokafka(port: int, stop: threading.Event, acknowledged: list,
                 failures: list) -> int:
    """run_confluent with aiokafka, on an event loop of this thread."""

    async def send() -> int:
        producer = aiokafka.AIOKafkaProducer(
            bootstrap_servers=f"127.0.0.1:{port}", security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="PLAIN", sasl_plain_username="streamlog",
            sasl_plain_password=TOKEN, enable_idempotence=True, acks="all", linger_ms=2,
            request_timeout_ms=120_000, retry_backoff_ms=20)
        await producer.start()
        pending: set[asyncio.Future] = set()

        def report(future: asyncio.Future, number: int) -> None:
            pending.discard(future)
            if future.exception() is not None:
                failures.append(repr(future.exception()))
            else:
                metadata = future.result()
                acknowledged.append((metadata.partition, metadata.offset, number))

        number = 0
        try:
            while not stop.is_set():
                future = await producer.send(TOPIC, b"%d" % number,
                                             partition=number % PARTITIONS)
                pending.add(future)
                future.add_done_callback(lambda f, n=number: report(f, n))
                number += 1
                if len(pending) >= 300:
                    await asyncio.wait(set(pending), return_when=asyncio.FIRST_COMPLETED)
            await producer.flush()
            if pending:
                await asyncio.wait(set(pending))
        finally:
            await producer.stop()
        return number

    return asyncio.run(send())


PRODUCERS = {"confluent": run_confluent, "aiokafka": run_aiokafka}


# Each client with each signal with STREAMLOG_LONG=1; by default each client once and each
# signal once (about 19 s a run, of the suite's 15 minutes).
_RESTART_RUNS = [("aiokafka", signal.SIGKILL), ("confluent", signal.SIGTERM)] + (
    [("aiokafka", signal.SIGTERM), ("confluent", signal.SIGKILL)]
    if os.environ.get("STREAMLOG_LONG") else [])


@pytest.mark.parametrize("client, signum", _RESTART_RUNS,
                         ids=[f"{c}-{signal.Signals(s).name.lower()}"
                              for c, s in _RESTART_RUNS])
def test_idempotent_producer_exactly_once_across_restarts(tmp_path, client, signum):
    rng = random.Random(f"{client}-{signum}")
    path, port = tmp_path / "log", free_port()
    with streamlog.open_log(path) as log:
        log.create_stream(TOPIC, PARTITIONS)
    daemon = Daemon(path, port)
    acknowledged, failures, stop, result = [], [], threading.Event(), {}

    def produce():
        try:
            result["sent"] = PRODUCERS[client](port, stop, acknowledged, failures)
        except BaseException as error:  # noqa: BLE001 - reported by the test thread
            result["error"] = error

    thread = threading.Thread(target=produce, daemon=True)
    try:
        thread.start()
        restarts = restart_while_sending(daemon, acknowledged, signum, rng, failures)
        time.sleep(0.2)
        stop.set()
        thread.join(150)
        assert not thread.is_alive(), "the producer did not finish"
        assert "error" not in result, result.get("error")
        assert failures == [], failures[:5]
        daemon.stop(signal.SIGTERM)
    finally:
        stop.set()
        daemon.serve.kill()
    counts = check_exactly_once(path, acknowledged, result["sent"])
    assert counts["acknowledged"] == counts["sent"]  # every record was delivered
    drains = daemon.drain_seconds
    print(f"\n{client} {signal.Signals(signum).name}: restarts={restarts} {counts} "
          f"drain_s max={max(drains):.2f}")


# -- the Kafka listener's drain, in this process ------------------------------------------

async def answer(reader: asyncio.StreamReader) -> bytes:
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    return await reader.readexactly(size)


async def listening(log) -> KafkaServer:
    server = await KafkaServer.bind(KafkaConfig(token=b"t", port=0, auth="none"))
    await server.start(log)
    return server


def test_drain_answers_a_produce_whose_append_is_under_way(tmp_path):
    """close() while a Produce is appending: the append finishes, its answer reaches
    the client, then the connection ends; close() waited for it."""
    batch = record_encoding.encode_batch(
        0, [records.KafkaRecord(0, 1_700_000_000_000, b"k", b"v")], producer_id=5,
        producer_epoch=0, base_sequence=0)
    produce = framed(request_bytes(0, 8, **produce_fields(TOPIC, 0, batch)))

    async def main(log) -> None:
        server = await listening(log)
        entered, gate = threading.Event(), threading.Event()
        appending = server.broker.handle_produce

        def held_produce(parsed):
            entered.set()
            gate.wait(5)
            return appending(parsed)

        server.broker.handle_produce = held_produce
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(produce)
        assert await asyncio.to_thread(entered.wait, 5)
        closing = asyncio.ensure_future(server.close())
        await asyncio.sleep(0.3)
        assert not closing.done()  # it waits for the append under way
        gate.set()
        body, _size = entity_reader(load_response_schema(0, 8))(await answer(reader), 4)
        (partition,) = body.responses[0].partition_responses
        assert (partition.error_code, partition.base_offset) == (0, 0)
        assert await reader.read() == b""  # and then the connection ends
        await asyncio.wait_for(closing, 5)
        writer.close()

    with streamlog.open_log(tmp_path / "log") as log:
        log.create_stream(TOPIC, 1)
        asyncio.run(main(log))
        assert [r.value for r in log.reader(TOPIC, 0).records()] == [b"v"]


def test_drain_ends_busy_connections_every_time(tmp_path):
    """close() at random moments while clients keep requests coming back to back:
    every time, every connection ends and close() returns within its bound. (A cancel
    lost in a read that completes as it arrives kept a connection serving, and close()
    waiting for it, forever.)"""
    rng = random.Random(7)
    api_versions = framed(request_bytes(18, 2))

    async def client(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while True:
                writer.write(api_versions)
                await answer(reader)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the daemon ended the connection
        finally:
            writer.close()

    async def trial(log) -> float:
        server = await listening(log)
        clients = [asyncio.ensure_future(client(server.port)) for _ in range(8)]
        await asyncio.sleep(rng.uniform(0.01, 0.05))
        started = time.monotonic()
        closing = asyncio.ensure_future(server.close())
        done, _pending = await asyncio.wait([closing], timeout=8)
        took = time.monotonic() - started
        assert closing in done, "close() did not return: a connection went on serving"
        await asyncio.wait_for(asyncio.gather(*clients), 5)
        return took

    async def main(log) -> list[float]:
        return [await trial(log) for _ in range(200)]

    with streamlog.open_log(tmp_path / "log") as log:
        took = asyncio.run(main(log))
    assert max(took) < 5.0, max(took)  # nothing waited for drain_timeout_s (30 s)
