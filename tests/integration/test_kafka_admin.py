"""The admin APIs Kafka tools call, driven by unmodified clients on loopback:
confluent-kafka's AdminClient (librdkafka) and kafka-python's KafkaAdminClient: groups
listed, described, reset and deleted; configs described; records and topics deleted;
partitions added; the cluster described; ListOffsets MAX_TIMESTAMP; topic names by
Kafka's rule; no client writes to an internal stream."""

from __future__ import annotations

import struct
import time

import pytest

import streamlog
from streamlog.testing.serve import ServeProcess

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")

from confluent_kafka import (Consumer, ConsumerGroupState, KafkaError,  # noqa: E402
                             KafkaException, Producer, TopicPartition)
from confluent_kafka.admin import (AdminClient, ConfigResource, NewPartitions,  # noqa: E402
                                   NewTopic, OffsetSpec)
from kafka.admin import KafkaAdminClient  # noqa: E402

TOKEN = "kafka-admin-token"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    serve = ServeProcess(tmp_path_factory.mktemp("kafka-admin") / "log",
                         "--scrub-mib-per-s", "0", token=TOKEN, kafka_port="0")
    yield serve
    serve.stop()


def conf(port: int) -> dict:
    return {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "PLAIN", "sasl.username": "streamlog",
            "sasl.password": TOKEN}


def python_admin(port: int) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{port}",
                            security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                            sasl_plain_username="streamlog", sasl_plain_password=TOKEN)


def wait_all(futures: dict, timeout: float = 20) -> dict:
    return {key: future.result(timeout) for key, future in futures.items()}


def produce(port: int, topic: str, count: int, partition: int | None = None,
            timestamps=None) -> None:
    producer = Producer({**conf(port), "acks": "all", "linger.ms": 2})
    errors = []
    for i in range(count):
        extra = {} if partition is None else {"partition": partition}
        if timestamps is not None:
            extra["timestamp"] = timestamps[i]
        producer.produce(topic, key=b"k%d" % (i % 7), value=b"v%d" % i,
                         on_delivery=lambda e, m: errors.append(e) if e else None, **extra)
    assert producer.flush(30) == 0 and not errors, errors


def consumer_for(port: int, group: str, topic: str) -> Consumer:
    consumer = Consumer({**conf(port), "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "session.timeout.ms": 6000})
    consumer.subscribe([topic])
    return consumer


def consume(consumer: Consumer, count: int, timeout_s: float = 30) -> list:
    out, deadline = [], time.monotonic() + timeout_s
    while len(out) < count and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None:
            assert message.error() is None, message.error()
            out.append(message)
    return out


def test_groups_listed_described_reset_and_deleted(daemon):
    port = daemon.kafka_port
    admin = AdminClient(conf(port))
    wait_all(admin.create_topics([NewTopic("admin-g", 2, 1)]))
    produce(port, "admin-g", 40)
    consumer = consumer_for(port, "g-active", "admin-g")
    got = consume(consumer, 40)
    assert len(got) == 40
    consumer.commit(asynchronous=False)

    listed = admin.list_consumer_groups().result(20)
    states = {g.group_id: g.state for g in listed.valid}
    assert states["g-active"] == ConsumerGroupState.STABLE
    (described,) = wait_all(admin.describe_consumer_groups(["g-active"])).values()
    assert described.state == ConsumerGroupState.STABLE
    assert not described.is_simple_consumer_group and len(described.members) == 1
    assert described.partition_assignor in ("range", "roundrobin", "cooperative-sticky")
    member = described.members[0]
    assert {(tp.topic, tp.partition) for tp in member.assignment.topic_partitions} == {
        ("admin-g", 0), ("admin-g", 1)}
    assert member.host.startswith("/127.0.0.1")

    # an active group is neither reset nor deleted (Kafka's answers)
    (refused,) = wait_all(admin.alter_consumer_group_offsets([
        confluent_kafka.ConsumerGroupTopicPartitions(
            "g-active", [TopicPartition("admin-g", 0, 0)])])).values()
    assert [tp.error.code() for tp in refused.topic_partitions] == [
        KafkaError.UNKNOWN_MEMBER_ID]
    with pytest.raises(KafkaException) as caught:
        wait_all(admin.delete_consumer_groups(["g-active"]))
    assert caught.value.args[0].code() == KafkaError.NON_EMPTY_GROUP

    consumer.close()
    (described,) = wait_all(admin.describe_consumer_groups(["g-active"])).values()
    assert described.state == ConsumerGroupState.EMPTY and not described.members
    # reset partition 0 to 5 and partition 1 to the earliest, as tools do
    wait_all(admin.alter_consumer_group_offsets([
        confluent_kafka.ConsumerGroupTopicPartitions(
            "g-active", [TopicPartition("admin-g", 0, 5), TopicPartition("admin-g", 1, 0)])]))
    (offsets,) = wait_all(admin.list_consumer_group_offsets([
        confluent_kafka.ConsumerGroupTopicPartitions("g-active")])).values()
    assert {(tp.partition, tp.offset) for tp in offsets.topic_partitions} == {(0, 5), (1, 0)}
    again = consumer_for(port, "g-active", "admin-g")
    per_partition = {0: 0, 1: 0}
    for message in got:
        per_partition[message.partition()] += 1
    expected = per_partition[0] - 5 + per_partition[1]
    resumed = consume(again, expected)
    assert len(resumed) == expected
    assert min(m.offset() for m in resumed if m.partition() == 0) == 5
    again.close()

    wait_all(admin.delete_consumer_groups(["g-active"]))
    listed = admin.list_consumer_groups().result(20)
    assert "g-active" not in {g.group_id for g in listed.valid}
    with pytest.raises(KafkaException) as caught:
        wait_all(admin.delete_consumer_groups(["never-was"]))
    assert caught.value.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND

    # kafka-python's admin client sees the same, and resets and deletes offsets
    python = python_admin(port)
    try:
        consumer = consumer_for(port, "g-python", "admin-g")
        assert len(consume(consumer, 40)) == 40
        consumer.commit(asynchronous=False)
        consumer.close()
        groups = {g["group_id"]: g for g in python.list_groups()}
        assert groups["g-python"]["group_state"] == "Empty"
        assert python.describe_groups(["g-python"])["g-python"]["group_state"] == "Empty"
        committed = python.list_group_offsets({"g-python": None})["g-python"]
        assert sum(meta.offset for meta in committed.values()) == 40
        zero = kafka.TopicPartition("admin-g", 0)
        python.reset_group_offsets("g-python", {zero: kafka.admin.OffsetSpec.EARLIEST})
        committed = python.list_group_offsets({"g-python": None})["g-python"]
        assert committed[zero].offset == 0
        answer = python.delete_group_offsets("g-python", [zero])
        assert [error.__name__ for error in answer.values()] == ["NoError"]
        assert zero not in python.list_group_offsets({"g-python": None})["g-python"]
        python.delete_groups(["g-python"])
        assert "g-python" not in {g["group_id"] for g in python.list_groups()}
    finally:
        python.close()


def test_configs_and_the_cluster_are_described(daemon):
    port = daemon.kafka_port
    admin = AdminClient(conf(port))
    wait_all(admin.create_topics([NewTopic("admin-c", 1, 1)]))
    (topic,) = wait_all(admin.describe_configs([
        ConfigResource(confluent_kafka.admin.RESOURCE_TOPIC, "admin-c")])).values()
    assert topic["cleanup.policy"].value == "delete"
    assert topic["message.timestamp.type"].value == "CreateTime"
    assert int(topic["segment.bytes"].value) > 0
    assert topic["retention.ms"].value == "-1"  # the daemon keeps everything by default
    (broker,) = wait_all(admin.describe_configs([
        ConfigResource(confluent_kafka.admin.RESOURCE_BROKER, "0")])).values()
    assert broker["broker.id"].value == "0"
    assert broker["transaction.max.timeout.ms"].value == "900000"
    with pytest.raises(KafkaException):
        wait_all(admin.describe_configs([
            ConfigResource(confluent_kafka.admin.RESOURCE_TOPIC, "no-such-topic")]))
    cluster = admin.describe_cluster().result(20)
    assert cluster.cluster_id == "streamlog" and cluster.controller.id == 0
    assert [(n.id, n.port) for n in cluster.nodes] == [(0, port)]
    python = python_admin(port)
    try:
        from kafka.admin import ConfigResource as PythonResource, ConfigResourceType
        answer = python.describe_configs([PythonResource(ConfigResourceType.TOPIC,
                                                         "admin-c")], config_filter="all")
        assert answer["topic"]["admin-c"]["cleanup.policy"]["value"] == "delete"
    finally:
        python.close()


def test_records_and_topics_deleted_partitions_added(daemon):
    port = daemon.kafka_port
    admin = AdminClient(conf(port))
    wait_all(admin.create_topics([NewTopic("admin-d", 1, 1)]))
    produce(port, "admin-d", 30, partition=0)
    (deleted,) = wait_all(admin.delete_records([TopicPartition("admin-d", 0, 12)])).values()
    assert deleted.low_watermark == 12
    consumer = Consumer({**conf(port), "group.id": "g-d", "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition("admin-d", 0, confluent_kafka.OFFSET_BEGINNING)])
    got = consume(consumer, 18)
    assert [m.offset() for m in got] == list(range(12, 30))
    consumer.close()
    with pytest.raises(KafkaException) as caught:  # past the end
        wait_all(admin.delete_records([TopicPartition("admin-d", 0, 99)]))
    assert caught.value.args[0].code() == KafkaError.OFFSET_OUT_OF_RANGE

    wait_all(admin.create_partitions([NewPartitions("admin-d", 3)]))
    assert len(admin.list_topics("admin-d", timeout=10).topics["admin-d"].partitions) == 3
    produce(port, "admin-d", 5, partition=2)
    with pytest.raises(KafkaException) as caught:  # fewer is refused
        wait_all(admin.create_partitions([NewPartitions("admin-d", 2)]))
    assert caught.value.args[0].code() == KafkaError.INVALID_PARTITIONS

    wait_all(admin.delete_topics(["admin-d"]))
    assert "admin-d" not in admin.list_topics(timeout=10).topics
    wait_all(admin.create_topics([NewTopic("admin-d", 1, 1)]))  # again, from offset 0
    produce(port, "admin-d", 1, partition=0)
    low, high = Consumer({**conf(port), "group.id": "x"}).get_watermark_offsets(
        TopicPartition("admin-d", 0), timeout=10)
    assert (low, high) == (0, 1)
    with pytest.raises(KafkaException):
        wait_all(admin.delete_topics(["__consumer_offsets"]))
    python = python_admin(port)
    try:
        python.create_topics([kafka.admin.NewTopic("admin-p", 1, 1)])
        python.create_partitions({"admin-p": kafka.admin.NewPartitions(2)})
        python.delete_topics(["admin-p"])
        assert "admin-p" not in python.list_topics()
    finally:
        python.close()


def test_max_timestamp_names_the_record_with_the_largest_timestamp(daemon):
    port = daemon.kafka_port
    admin = AdminClient(conf(port))
    wait_all(admin.create_topics([NewTopic("admin-t", 1, 1)]))
    stamps = [1_000_000, 1_000_900, 1_000_300, 1_000_900, 1_000_100]
    produce(port, "admin-t", len(stamps), partition=0, timestamps=stamps)
    (found,) = wait_all(admin.list_offsets(
        {TopicPartition("admin-t", 0): OffsetSpec.max_timestamp()})).values()
    assert (found.offset, found.timestamp) == (1, 1_000_900)


def test_kafka_names_and_internal_streams(daemon, tmp_path):
    port = daemon.kafka_port
    admin = AdminClient(conf(port))
    wait_all(admin.create_topics([NewTopic("_schemas", 1, 1), NewTopic("-dash", 1, 1)]))
    produce(port, "_schemas", 3)
    topics = admin.list_topics(timeout=10).topics
    assert {"_schemas", "-dash"} <= set(topics)
    with pytest.raises(KafkaException) as caught:
        wait_all(admin.create_topics([NewTopic("bad name", 1, 1)]))
    assert caught.value.args[0].code() == KafkaError.TOPIC_EXCEPTION
    # committed offsets are an internal topic, readable, refused to producers
    consumer = consumer_for(port, "g-internal", "_schemas")
    assert len(consume(consumer, 3)) == 3
    consumer.commit(asynchronous=False)
    consumer.close()
    assert "__consumer_offsets" in topics or "__consumer_offsets" in admin.list_topics(
        timeout=10).topics
    producer = Producer({**conf(port), "acks": "all", "retries": 0})
    errors = []
    producer.produce("__consumer_offsets", key=b"g-internal\0_schemas\x000",
                     value=b'{"offset": 0}', on_delivery=lambda e, m: errors.append(e))
    producer.flush(20)
    assert [e.code() for e in errors] == [KafkaError.TOPIC_EXCEPTION]
    (offsets,) = wait_all(admin.list_consumer_group_offsets([
        confluent_kafka.ConsumerGroupTopicPartitions("g-internal")])).values()
    assert [(tp.partition, tp.offset) for tp in offsets.topic_partitions] == [(0, 3)]
    reader = Consumer({**conf(port), "group.id": "reader", "auto.offset.reset": "earliest"})
    reader.assign([TopicPartition("__consumer_offsets", 0, 0)])
    low, high = reader.get_watermark_offsets(TopicPartition("__consumer_offsets", 0), 10)
    records = consume(reader, high - low)
    reader.close()
    assert [m.value() for m in records if m.key() == b"g-internal\0_schemas\x000"] == [
        b'{"offset": 3, "metadata": ""}']


def test_describe_configs_v0_gets_an_answer_not_a_closed_connection(daemon):
    """A client that asks DescribeConfigs v0 (Kafka 4 dropped it) gets
    UNSUPPORTED_VERSION in the shape it reads, after authenticating."""
    import socket
    port = daemon.kafka_port

    def request(api_key, version, correlation, body=b""):
        header = struct.pack(">hhih", api_key, version, correlation, 1) + b"t"
        return struct.pack(">i", len(header) + len(body)) + header + body

    token = b"\0streamlog\0" + TOKEN.encode()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request(17, 1, 1, struct.pack(">h", 5) + b"PLAIN"))
        _read_frame(sock)
        sock.sendall(request(36, 0, 2, struct.pack(">i", len(token)) + token))
        _read_frame(sock)
        # DescribeConfigs v0: one topic resource, all keys
        body = struct.pack(">ib", 1, 2) + struct.pack(">h", 1) + b"x" + struct.pack(">i", -1)
        sock.sendall(request(32, 0, 3, body))
        answer = _read_frame(sock)
        correlation, throttle, results = struct.unpack_from(">iii", answer)
        assert (correlation, throttle, results) == (3, 0, 0)
        sock.sendall(request(32, 1, 4, body + b"\0"))  # the connection is still there
        assert struct.unpack_from(">i", _read_frame(sock))[0] == 4


def _read_frame(sock) -> bytes:
    size = struct.unpack(">i", _read_exactly(sock, 4))[0]
    return _read_exactly(sock, size)


def _read_exactly(sock, count: int) -> bytes:
    out = b""
    while len(out) < count:
        chunk = sock.recv(count - len(out))
        assert chunk, "the connection closed"
        out += chunk
    return out


def test_offsets_move_to_the_internal_stream_when_an_old_log_is_served(tmp_path):
    import json
    with streamlog.open_log(tmp_path / "log") as log:  # as an older daemon left it
        log.create_stream("t", 1)
        log.append_batch_sync("t", [b"a", b"b", b"c"])
        log.create_stream("kafka.consumer_offsets", 1)
        log.append_sync("kafka.consumer_offsets", json.dumps(
            {"offset": 2, "metadata": None}).encode(), key=b"old-group\0t\x000")
    serve = ServeProcess(tmp_path / "log", "--scrub-mib-per-s", "0", token=TOKEN,
                         kafka_port="0")
    try:
        admin = AdminClient(conf(serve.kafka_port))
        (offsets,) = wait_all(admin.list_consumer_group_offsets([
            confluent_kafka.ConsumerGroupTopicPartitions("old-group")])).values()
        assert [(tp.topic, tp.partition, tp.offset) for tp in offsets.topic_partitions] == [
            ("t", 0, 2)]
    finally:
        serve.stop()
