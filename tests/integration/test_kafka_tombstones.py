"""Tombstones through `streamlog serve --kafka-port`: a record produced with a null
value (Kafka's length -1) is stored as None, not b"", and fetched back as null; a null
header value likewise. Each client produces and consumes: kcat (-Z: empty means NULL),
confluent-kafka and kafka-python; the library reads the same records back as None.

Batches without headers take the Produce path's Arrow arrays and the Fetch path's NumPy
encoder; batches with headers take the per-record lists and encoder: both are covered.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

import streamlog
from streamlog.testing.serve import ServeProcess

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

TOKEN = "kafka-tombstone-token"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    serve = ServeProcess(tmp_path_factory.mktemp("kafka-tombstones") / "log",
                         "--scrub-mib-per-s", "0", token=TOKEN, kafka_port="0")
    yield serve
    serve.stop()


def confluent_conf(port: int) -> dict:
    return {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "PLAIN", "sasl.username": "streamlog", "sasl.password": TOKEN}


def python_conf(port: int) -> dict:
    return {"bootstrap_servers": f"127.0.0.1:{port}", "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "PLAIN", "sasl_plain_username": "streamlog",
            "sasl_plain_password": TOKEN}


def kcat_args(kcat: str, port: int) -> list[str]:
    return [kcat, "-b", f"127.0.0.1:{port}", "-X", "security.protocol=SASL_PLAINTEXT",
            "-X", "sasl.mechanisms=PLAIN", "-X", "sasl.username=streamlog",
            "-X", f"sasl.password={TOKEN}"]


def create_topic(port: int, name: str) -> None:
    admin = AdminClient(confluent_conf(port))
    for future in admin.create_topics([NewTopic(name, 1, 1)]).values():
        future.result(20)


def stored(daemon, topic: str) -> list[tuple]:
    """(key, value, headers) of every record of the topic, through the library."""
    with streamlog.open_log(daemon.url, token=TOKEN) as log:
        return [(r.key, r.value, r.headers) for r in log.reader(topic, 0).records()]


def consume_confluent(port: int, topic: str, count: int) -> list[tuple]:
    consumer = Consumer({**confluent_conf(port), "group.id": f"{topic}-readers",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    out, deadline = [], time.monotonic() + 30
    while len(out) < count and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is None:
            continue
        assert message.error() is None, message.error()
        out.append((message.key(), message.value(), tuple(message.headers() or ())))
    consumer.close()
    return out


def consume_kafka_python(port: int, topic: str, count: int) -> list[tuple]:
    consumer = kafka.KafkaConsumer(**python_conf(port), auto_offset_reset="earliest",
                                   consumer_timeout_ms=3000)
    consumer.assign([kafka.TopicPartition(topic, 0)])
    out, deadline = [], time.monotonic() + 30
    while len(out) < count and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            out += [(r.key, r.value, tuple(r.headers)) for r in records]
    consumer.close()
    return out


# Sent in two batches: without headers (the Arrow and NumPy paths), then with them.
PLAIN = [(b"k1", None), (b"k2", b""), (b"k3", b"v"), (None, b""), (b"k1", None)]
WITH_HEADERS = [(b"k4", None, [("h", None), ("g", b"")]), (b"k5", b"", [("h", b"x")]),
                (b"k6", b"w", [("n", None)])]
EXPECTED = ([(k, v, ()) for k, v in PLAIN]
            + [(k, v, tuple(h)) for k, v, h in WITH_HEADERS])


def test_confluent_kafka_tombstones_and_null_headers(daemon):
    port = daemon.kafka_port
    create_topic(port, "confluent-tombstones")
    errors = []
    producer = Producer({**confluent_conf(port), "acks": "all", "enable.idempotence": True,
                         "linger.ms": 5})

    def report(error, _message):
        if error is not None:
            errors.append(error)

    for key, value in PLAIN:
        producer.produce("confluent-tombstones", key=key, value=value, on_delivery=report)
    assert producer.flush(30) == 0
    for key, value, headers in WITH_HEADERS:
        producer.produce("confluent-tombstones", key=key, value=value, headers=headers,
                         on_delivery=report)
    assert producer.flush(30) == 0 and not errors, errors
    assert stored(daemon, "confluent-tombstones") == EXPECTED
    assert consume_confluent(port, "confluent-tombstones", len(EXPECTED)) == EXPECTED
    assert consume_kafka_python(port, "confluent-tombstones", len(EXPECTED)) == EXPECTED


def test_kafka_python_tombstones_and_null_headers(daemon):
    port = daemon.kafka_port
    create_topic(port, "python-tombstones")
    producer = kafka.KafkaProducer(**python_conf(port), acks="all", linger_ms=5)
    futures = [producer.send("python-tombstones", key=key, value=value)
               for key, value in PLAIN if key is not None]  # kafka-python needs one of them
    producer.flush()
    # kafka-python's producer refuses a None header value (its consumer reads one: see
    # the confluent-kafka test), so its headers here are bytes, b"" among them
    headers_sent = [[(name, b"" if v is None else v) for name, v in headers]
                    for _key, _value, headers in WITH_HEADERS]
    futures += [producer.send("python-tombstones", key=key, value=value, headers=headers)
                for (key, value, _), headers in zip(WITH_HEADERS, headers_sent)]
    producer.flush()
    for future in futures:
        future.get(10)
    producer.close()
    expected = [(k, v, ()) for k, v in PLAIN if k is not None] + [
        (k, v, tuple(h)) for (k, v, _), h in zip(WITH_HEADERS, headers_sent)]
    assert stored(daemon, "python-tombstones") == expected
    assert consume_kafka_python(port, "python-tombstones", len(expected)) == expected
    assert consume_confluent(port, "python-tombstones", len(expected)) == expected


def test_kcat_sends_and_prints_null(daemon, kcat):
    """kcat -Z sends an empty value as NULL; consuming, %S prints a value's length, -1
    for NULL."""
    port = daemon.kafka_port
    create_topic(port, "kcat-tombstones")
    done = subprocess.run(kcat_args(kcat, port) + ["-P", "-t", "kcat-tombstones", "-K:",
                                                   "-Z"],
                          input="a:\nb:value\nc:\n", capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    done = subprocess.run(kcat_args(kcat, port) + ["-P", "-t", "kcat-tombstones", "-K:"],
                          input="d:\n", capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr  # without -Z: an empty value, not NULL
    expected = [(b"a", None, ()), (b"b", b"value", ()), (b"c", None, ()), (b"d", b"", ())]
    assert stored(daemon, "kcat-tombstones") == expected
    done = subprocess.run(kcat_args(kcat, port) + [
        "-C", "-t", "kcat-tombstones", "-e", "-q", "-f", "%k\t%S\n"],
        capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["a\t-1", "b\t5", "c\t-1", "d\t0"]
    done = subprocess.run(kcat_args(kcat, port) + ["-C", "-t", "kcat-tombstones", "-e",
                                                   "-q", "-J"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    payloads = [json.loads(line)["payload"] for line in done.stdout.splitlines()]
    assert payloads == [None, "value", None, ""]
    assert consume_confluent(port, "kcat-tombstones", 4) == expected
