"""Kafka transactions through `streamlog serve --kafka-port`, with unmodified clients:
confluent-kafka's transactional producer and consume-transform-produce loop
(init_transactions, send_offsets_to_transaction, commit_transaction), aiokafka's
transactional producer; fencing, the transaction timeout; and SIGKILLs of the pipeline
and the daemon at random moments (STREAMLOG_TXN_KILLS, default 3 to keep the suite
short; the 50-kill run sets it): every input record's output exactly once for a read_committed consumer, and the
committed input offsets in step with the outputs."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time

import pytest

from streamlog.testing.serve import ServeProcess

confluent_kafka = pytest.importorskip("confluent_kafka")
aiokafka = pytest.importorskip("aiokafka")

from confluent_kafka import (Consumer, KafkaError, KafkaException, Producer,  # noqa: E402
                             TopicPartition)
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

TOKEN = "kafka-txn-token"
CHILD = os.path.join(os.path.dirname(__file__), "..", "harness", "kafka_eos_child.py")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    serve = ServeProcess(tmp_path_factory.mktemp("kafka-txn") / "log", "--scrub-mib-per-s",
                         "0", token=TOKEN, kafka_port="0")
    yield serve
    serve.stop()


def conf(port: int) -> dict:
    return {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "PLAIN", "sasl.username": "streamlog",
            "sasl.password": TOKEN}


def create(port: int, name: str, partitions: int) -> None:
    admin = AdminClient(conf(port))  # (kept: its futures end with it)
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(20)


def read_all(port: int, topic: str, committed: bool, timeout_s: float = 10) -> list:
    """Every record of `topic` a consumer with that isolation level gets, up to the
    end offsets (the last stable offset for read_committed) seen at the start."""
    consumer = Consumer({**conf(port), "group.id": f"reader-{random.random()}",
                         "isolation.level": "read_committed" if committed
                         else "read_uncommitted", "enable.auto.commit": False})
    partitions = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    out, deadline = [], time.monotonic() + timeout_s
    idle = 0
    while time.monotonic() < deadline and idle < 6:
        message = consumer.poll(0.25)
        if message is None:
            idle += 1
            continue
        idle = 0
        if message.error() is None:
            out.append((message.partition(), message.offset(), message.value()))
    consumer.close()
    return out


def group_offsets(port: int, group: str) -> dict[tuple[str, int], int]:
    admin = AdminClient(conf(port))
    (found,) = [f.result(20) for f in admin.list_consumer_group_offsets([
        confluent_kafka.ConsumerGroupTopicPartitions(group)]).values()]
    return {(tp.topic, tp.partition): tp.offset for tp in found.topic_partitions}


def test_commit_is_seen_abort_is_not_and_offsets_count_at_the_commit(daemon):
    port = daemon.kafka_port
    create(port, "tx-a", 2)
    create(port, "tx-in", 1)
    producer = Producer({**conf(port), "transactional.id": "tx-basic"})
    producer.init_transactions(15)
    producer.begin_transaction()
    for i in range(10):
        producer.produce("tx-a", value=b"kept-%d" % i, partition=i % 2)
    metadata = Consumer({**conf(port), "group.id": "tx-group"}).consumer_group_metadata()
    producer.send_offsets_to_transaction([TopicPartition("tx-in", 0, 7)], metadata, 15)
    producer.flush(15)
    # before the commit: nothing for read_committed, nor the group's offset
    assert read_all(port, "tx-a", committed=True, timeout_s=3) == []
    assert group_offsets(port, "tx-group") == {}
    producer.commit_transaction(15)
    assert sorted(v for _p, _o, v in read_all(port, "tx-a", committed=True)) == sorted(
        b"kept-%d" % i for i in range(10))
    assert group_offsets(port, "tx-group") == {("tx-in", 0): 7}

    producer.begin_transaction()
    for i in range(5):
        producer.produce("tx-a", value=b"gone-%d" % i, partition=i % 2)
    producer.send_offsets_to_transaction([TopicPartition("tx-in", 0, 99)], metadata, 15)
    producer.flush(15)
    producer.abort_transaction(15)
    committed_values = [v for _p, _o, v in read_all(port, "tx-a", committed=True)]
    assert not [v for v in committed_values if v.startswith(b"gone")]
    assert len(committed_values) == 10
    uncommitted = [v for _p, _o, v in read_all(port, "tx-a", committed=False)]
    assert len([v for v in uncommitted if v.startswith(b"gone")]) == 5  # as Kafka shows
    assert group_offsets(port, "tx-group") == {("tx-in", 0): 7}


def test_a_new_producer_with_the_id_fences_the_old_one(daemon):
    port = daemon.kafka_port
    create(port, "tx-f", 1)
    old = Producer({**conf(port), "transactional.id": "tx-fence"})
    old.init_transactions(15)
    old.begin_transaction()
    old.produce("tx-f", value=b"zombie")
    old.flush(15)
    new = Producer({**conf(port), "transactional.id": "tx-fence"})
    new.init_transactions(15)  # aborts the old one's open transaction
    with pytest.raises(KafkaException) as caught:
        old.commit_transaction(15)
    assert caught.value.args[0].fatal() or caught.value.args[0].code() in (
        KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)
    new.begin_transaction()
    new.produce("tx-f", value=b"fresh")
    new.commit_transaction(15)
    assert [v for _p, _o, v in read_all(port, "tx-f", committed=True)] == [b"fresh"]


def test_a_transaction_left_open_is_aborted_at_its_timeout(daemon):
    port = daemon.kafka_port
    create(port, "tx-t", 1)
    producer = Producer({**conf(port), "transactional.id": "tx-timeout",
                         "transaction.timeout.ms": 1500})
    producer.init_transactions(15)
    producer.begin_transaction()
    producer.produce("tx-t", value=b"left open")
    producer.flush(15)
    assert _last_stable(port, "tx-t") == 0  # held at the open transaction's data
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and _last_stable(port, "tx-t") != 2:
        time.sleep(0.3)  # until the timeout aborts it: the data and its abort marker
    assert _last_stable(port, "tx-t") == 2
    assert read_all(port, "tx-t", committed=True, timeout_s=2) == []
    with pytest.raises(KafkaException):  # its producer was fenced
        producer.commit_transaction(10)


def _last_stable(port: int, topic: str) -> int:
    admin = AdminClient(conf(port))
    spec = {TopicPartition(topic, 0): confluent_kafka.admin.OffsetSpec.latest()}
    (found,) = [f.result(20) for f in admin.list_offsets(
        spec, isolation_level=confluent_kafka.IsolationLevel.READ_COMMITTED).values()]
    return found.offset


def test_aiokafka_transactional_producer(daemon):
    port = daemon.kafka_port
    create(port, "tx-aio", 1)

    async def run():
        producer = aiokafka.AIOKafkaProducer(
            bootstrap_servers=f"127.0.0.1:{port}", security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="PLAIN", sasl_plain_username="streamlog",
            sasl_plain_password=TOKEN, transactional_id="tx-aiokafka")
        await producer.start()
        try:
            async with producer.transaction():
                for i in range(3):
                    await producer.send_and_wait("tx-aio", b"aio-%d" % i)
            await producer.begin_transaction()
            await producer.send_and_wait("tx-aio", b"aborted")
            await producer.abort_transaction()
        finally:
            await producer.stop()

    asyncio.run(run())
    assert [v for _p, _o, v in read_all(port, "tx-aio", committed=True)] == [
        b"aio-0", b"aio-1", b"aio-2"]


def test_pipeline_and_daemon_killed_at_random_keep_exactly_once(tmp_path):
    kills = int(os.environ.get("STREAMLOG_TXN_KILLS", "3"))
    rng = random.Random(int(os.environ.get("STREAMLOG_TXN_SEED", "7")))
    serve = ServeProcess(tmp_path / "log", "--scrub-mib-per-s", "0", token=TOKEN,
                         kafka_port="0")
    port = serve.kafka_port
    create(port, "in", 2)
    create(port, "out", 3)
    inputs = 0

    def more_inputs(count: int = 1500) -> None:
        """Input record i is "v<i>" in partition i % 2, at offset i // 2."""
        nonlocal inputs
        producer = Producer({**conf(port), "acks": "all", "enable.idempotence": True})
        for i in range(inputs, inputs + count):
            producer.produce("in", value=b"v%06d" % i, partition=i % 2)
        assert producer.flush(30) == 0
        inputs += count

    def finished(child, timeout_s: float) -> int:
        try:
            code = child.wait(timeout_s)
        except subprocess.TimeoutExpired:
            child.kill()
            code = child.wait(10)
        log = (tmp_path / "child.log").read_text(errors="replace")
        assert code in (0, 3), f"exit {code}: {log[-3000:]}"
        return code

    more_inputs()
    killed, daemon_kills, started = 0, 0, time.monotonic()
    try:
        while True:
            with open(tmp_path / "child.log", "w") as log:  # (not a pipe: never full)
                child = subprocess.Popen([sys.executable, CHILD, str(port), TOKEN, "10"],
                                         stderr=log)
            if killed == kills:  # the last run, to the end
                if finished(child, 300) == 0:
                    break
                continue
            try:
                child.wait(rng.uniform(0.3, 2.5))
            except subprocess.TimeoutExpired:
                killed += 1
                last = killed == kills and daemon_kills == 0  # (at least one daemon kill)
                if rng.random() < 0.35 or last:  # the daemon, then the pipeline it served
                    serve.kill()
                    daemon_kills += 1
                child.kill()
                child.wait(10)
                if serve.proc.poll() is not None:
                    serve = ServeProcess(tmp_path / "log", "--scrub-mib-per-s", "0",
                                         token=TOKEN, kafka_port=str(port))
                _check_in_step(port, inputs)
                continue
            if finished(child, 0) == 0:  # done before its kill: more input for the next
                more_inputs()
        outputs = _check_in_step(port, inputs)
        assert len(outputs) == inputs
    finally:
        serve.stop()
    print(f"{killed} kills ({daemon_kills} of the daemon), {inputs} records exactly once, "
          f"{time.monotonic() - started:.1f} s")
    assert killed == kills and daemon_kills >= 1


def _check_in_step(port: int, inputs: int) -> list:
    """The outputs a read_committed consumer sees: no input twice, and exactly the inputs
    below the group's committed offsets (the offsets commit with the outputs)."""
    outputs = read_all(port, "out", committed=True, timeout_s=20)
    sources = [value.split(b":", 2) for _p, _o, value in outputs]
    seen = [(int(p), int(o)) for p, o, _v in sources]
    assert len(seen) == len(set(seen)), "an input record was output twice"
    committed = group_offsets(port, "eos")
    expected = {(p, o) for p in (0, 1) for o in range(committed.get(("in", p), 0))}
    assert set(seen) == expected
    assert all(v == b"v%06d" % (2 * o + p) for (p, o), (_p, _o, v) in zip(seen, sources))
    return outputs
