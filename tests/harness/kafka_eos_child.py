"""A Kafka exactly-once pipeline, as users write it with confluent-kafka: consume from
`in`, transform, produce to `out`, and commit the consumed offsets inside the same
transaction (init_transactions, begin_transaction, send_offsets_to_transaction,
commit_transaction). Run as a child process that tests kill at random moments.

    python kafka_eos_child.py PORT TOKEN BATCH

Partitions of `in` are assigned (not subscribed: no rebalance to wait for after a
kill), and the consumer starts from the group's committed offsets, read_committed. Each
output record's value is "<input partition>:<input offset>:<input value>". On an
abortable error the transaction is aborted and the consumer rewound to the committed
offsets; on a fatal one (a fenced producer, a daemon restarted under it) the process
exits 3, and the test starts it again, as an orchestrator would. Exits 0 once every
input record is consumed and committed.
"""

from __future__ import annotations

import sys

from confluent_kafka import (OFFSET_BEGINNING, Consumer, KafkaException, Producer,
                             TopicPartition)

GROUP, TXN_ID = "eos", "eos-pipeline"


def conf(port: str, token: str) -> dict:
    return {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "PLAIN", "sasl.username": "streamlog", "sasl.password": token}


def main() -> int:
    port, token, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
    base = conf(port, token)
    consumer = Consumer({**base, "group.id": GROUP, "enable.auto.commit": False,
                         "isolation.level": "read_committed",
                         "auto.offset.reset": "earliest"})
    producer = Producer({**base, "transactional.id": TXN_ID, "linger.ms": 1,
                         "transaction.timeout.ms": 10000})
    producer.init_transactions(15)
    partitions = sorted(consumer.list_topics("in", timeout=10).topics["in"].partitions)
    ends = {p: consumer.get_watermark_offsets(TopicPartition("in", p), timeout=10)[1]
            for p in partitions}
    rewind(consumer, partitions)
    idle = 0
    while True:
        positions = {tp.partition: tp.offset for tp in consumer.position(
            [TopicPartition("in", p) for p in partitions])}
        if all(positions[p] >= ends[p] for p in partitions if positions[p] >= 0):
            committed = consumer.committed([TopicPartition("in", p) for p in partitions],
                                           timeout=10)
            if all(tp.offset >= ends[tp.partition] for tp in committed):
                return 0
        messages = consumer.consume(batch, timeout=0.5)
        if not messages:
            idle += 1
            if idle % 20 == 0:  # (what a stuck run was waiting for, for its test)
                print(f"idle: positions {positions} ends {ends}", file=sys.stderr)
            continue
        idle = 0
        try:
            producer.begin_transaction()
            for message in messages:
                if message.error() is not None:
                    raise KafkaException(message.error())
                producer.produce("out", key=message.key(), value=b"%d:%d:%s" % (
                    message.partition(), message.offset(), message.value()))
            producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()), consumer.consumer_group_metadata(),
                15)
            producer.commit_transaction(15)
        except KafkaException as error:
            failure = error.args[0]
            if failure.fatal() or not failure.txn_requires_abort():
                print(f"fatal: {failure}", file=sys.stderr)
                return 3
            producer.abort_transaction(15)
            rewind(consumer, partitions)


def rewind(consumer, partitions) -> None:
    """Assign the partitions at the group's committed offsets (the beginning if none)."""
    committed = consumer.committed([TopicPartition("in", p) for p in partitions], timeout=10)
    consumer.assign([TopicPartition("in", tp.partition,
                                    tp.offset if tp.offset >= 0 else OFFSET_BEGINNING)
                     for tp in committed])


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KafkaException as error:
        print(f"fatal: {error}", file=sys.stderr)
        sys.exit(3)
