"""Records produced by an unmodified Kafka client (confluent-kafka) to
`streamlog serve --kafka-port` are read back by format("streamlog") through the daemon
URL: the same partitions, offsets, keys, values and timestamps."""

from __future__ import annotations

import os

import pytest

from streamlog.testing.serve import ServeProcess

confluent_kafka = pytest.importorskip("confluent_kafka")

pytestmark = pytest.mark.slow

# Spark's workers inherit the driver's environment: the token is set at import
TOKEN = os.environ.setdefault("STREAMLOG_TOKEN", "spark-daemon-test-token")


def test_spark_reads_what_kafka_clients_produced(spark, tmp_path):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    serve = ServeProcess(tmp_path / "log", "--scrub-mib-per-s", "0", token=TOKEN,
                         kafka_port="0")
    try:
        conf = {"bootstrap.servers": f"127.0.0.1:{serve.kafka_port}",
                "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN",
                "sasl.username": "streamlog", "sasl.password": TOKEN}
        admin = AdminClient(conf)  # kept: its futures need it alive
        for future in admin.create_topics([NewTopic("fromkafka", 3, 1)]).values():
            future.result(20)
        delivered = []
        producer = Producer({**conf, "acks": "all", "enable.idempotence": True})
        for i in range(90):
            producer.produce("fromkafka", key=b"k%d" % (i % 9), value=b"v%d" % i,
                             timestamp=1_700_000_000_000 + i,
                             on_delivery=lambda error, m: delivered.append(
                                 (m.partition(), m.offset(), m.key(), m.value(),
                                  m.timestamp()[1] * 1000)))
        assert producer.flush(30) == 0
        rows = (spark.read.format("streamlog").option("path", serve.url)
                .option("stream", "fromkafka").load().collect())
        got = sorted((r.partition, r.offset, bytes(r.key), bytes(r.value),
                      int(r.timestamp.timestamp() * 1_000_000)) for r in rows)
        assert got == sorted(delivered) and len(got) == 90
    finally:
        serve.stop()
