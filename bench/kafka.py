"""Kafka benchmark: an unmodified Kafka client (confluent-kafka, librdkafka) against
`streamlog serve --kafka-port`, beside streamlog's own client in the same run.

Command (from the repository root; `./dev bench kafka` runs the same):

    .venv/bin/python bench/kafka.py                   # 1,000,000 records
    .venv/bin/python bench/kafka.py --records 200000  # a shorter run
    .venv/bin/python bench/kafka.py --kafka-consumer fetch.queue.backoff.ms=10
                                      # kafka_consume with a consumer setting of its own

Writes bench/results/kafka.json (flat: named numbers, plus "command" and "cpu_count"),
prints progress on stderr and a table with ratios and targets on stdout.

Data: bench/core.py's dataset (16-byte random keys, 100-byte random values). One
`streamlog serve --fsync always --kafka-port 0` on loopback (SASL/PLAIN, the token as
password); each contender writes its own 1-partition stream on it, then reads it back.

  ours_produce_rps     streamlog's client: open_remote(url).producer(stream,
                       linger_ms=5), one send(value, key=) per record, then flush():
                       single records batched by the client, each batch one durable
                       APPEND (fsync before the acknowledgement).
  kafka_produce_rps    confluent_kafka.Producer, acks=all, linger.ms=5, one produce()
                       per record (poll(0) every 1,000; a full queue waits in poll),
                       then flush(); every delivery report checked for an error.
                       acks=all is durable under the daemon's fsync=always.
  kafka_idempotent_produce_rps   the same with enable.idempotence (its own stream).
  kafka_txn_produce_rps          the same with a transactional.id: begin_transaction,
                       1,000 produce(), commit_transaction, over and over (its own
                       stream); the baseline is the idempotent producer's rate.
  ours_consume_rps     RemoteReader.records() of the whole stream (a Record per record).
  kafka_consume_rps    confluent_kafka.Consumer assigned partition 0 from offset 0 (no
                       group), consume(10,000, timeout) until every record has come;
                       every message checked for an error, and the count exact.
                       librdkafka's defaults, plus each --kafka-consumer KEY=VALUE
                       (named in the results as kafka_consumer_config).
  kafka_consume_prompt_rps  the same, in the same run, with fetch.queue.backoff.ms=10
                       (below: what the client's prefetch pauses cost).

What bounds kafka_consume: the consumer's own loop (a Message object per record,
about 1.5 us each on this machine), and librdkafka's prefetch: it fetches ahead until
queued.min.messages (100,000) wait in its queue, and then pauses fetching for
fetch.queue.backoff.ms (1,000 ms by default) before it looks again. When the daemon
answers Fetches faster than the loop takes the records, the queue reaches 100,000 and
the loop, done with them in about 0.15 s, waits out the rest of the second, again and
again: the faster the server, the slower the run (librdkafka's `debug=fetch` log
shows each pause as "Fetch backoff for 1000ms: Local: Queue full"). The pauses are
the client's, whatever the broker. `--kafka-consumer fetch.queue.backoff.ms=10` takes
them out, as the property's documentation advises for a consumer that sees ~1 s
delays between messages.

Targets: kafka produce >= 0.5x and kafka consume >= 0.8x our own client's rates;
transactional produce >= 0.5x the idempotent producer's. The
machine is shared and noisy: read the ratios, measured in the same run.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root

from _common import (  # noqa: E402  (bench/ is on sys.path when run as a script)
    DEFAULT_WORKDIR, Row, Stopwatch, Target, attempt, fresh_dir, phase, progress, publish,
    rate, ratio, remove)
from core import Dataset, make_dataset  # noqa: E402  (bench/core.py's records)

TOKEN = "bench-kafka-token"
OURS, THEIRS = "ours", "kafka"


# librdkafka pausing its prefetch for 10 ms, not a second, once its queue is full
PROMPT = {"fetch.queue.backoff.ms": 10}


def kafka_config(port: int) -> dict:
    return {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "PLAIN", "sasl.username": "streamlog",
            "sasl.password": TOKEN}


def ours_produce(url: str, data: Dataset) -> float:
    from streamlog.wire.client import open_remote
    with open_remote(url, TOKEN) as log:
        log.create_stream(OURS, partitions=1)
        watch = Stopwatch()
        with log.producer(OURS, linger_ms=5) as producer:
            send = producer.send
            for key, value in zip(data.keys, data.values):
                send(value, key=key)
            producer.flush()
        seconds = watch.elapsed
        if producer.stats["acknowledged"] != len(data) or producer.stats["failed"]:
            raise RuntimeError(f"our producer: {producer.stats}")
        if log.end_offset(OURS, 0) != len(data):
            raise RuntimeError(f"our stream ends at {log.end_offset(OURS, 0):,}")
    return seconds


def kafka_produce(port: int, url: str, data: Dataset) -> float:
    return kafka_produce_sequenced(port, url, data, THEIRS, idempotent=False,
                                   transactional=False)


def kafka_produce_sequenced(port: int, url: str, data: Dataset, stream: str, *,
                            idempotent: bool = True, transactional: bool,
                            commit_every: int = 1000) -> float:
    """confluent-kafka, acks=all: plain, with enable.idempotence, or with a
    transactional.id and a commit every `commit_every` records (begin, produce,
    commit_transaction: the commit waits for every delivery of its records); poll(0)
    every `commit_every` records (a full queue waits in poll); every delivery checked."""
    from confluent_kafka import KafkaException, Producer

    from streamlog.wire.client import open_remote
    with open_remote(url, TOKEN) as log:
        log.create_stream(stream, partitions=1)
    config = {**kafka_config(port), "acks": "all", "linger.ms": 5,
              "enable.idempotence": idempotent, "queue.buffering.max.messages": 200_000}
    if transactional:
        config["transactional.id"] = f"bench-{stream}"
    producer = Producer(config)
    outcome = {"delivered": 0, "errors": 0, "first_error": None}

    def delivered(error, _message) -> None:
        if error is None:
            outcome["delivered"] += 1
        else:
            outcome["errors"] += 1
            outcome["first_error"] = outcome["first_error"] or str(error)

    if transactional:
        producer.init_transactions(30)
    watch = Stopwatch()
    produce, poll = producer.produce, producer.poll
    for start in range(0, len(data), commit_every):
        if transactional:
            producer.begin_transaction()
        for key, value in zip(data.keys[start:start + commit_every],
                              data.values[start:start + commit_every]):
            while True:
                try:
                    produce(stream, value, key, partition=0, on_delivery=delivered)
                    break
                except BufferError:
                    poll(0.01)
        poll(0)
        if transactional:
            producer.commit_transaction(60)
    if producer.flush(120) != 0:
        raise RuntimeError("confluent-kafka: messages left undelivered after 120 s")
    seconds = watch.elapsed
    if outcome["errors"] or outcome["delivered"] != len(data):
        raise KafkaException(f"{outcome['errors']} delivery errors (first: "
                             f"{outcome['first_error']}), {outcome['delivered']:,} delivered")
    return seconds


def ours_consume(url: str, count: int) -> float:
    from streamlog.wire.client import open_remote
    with open_remote(url, TOKEN) as log:
        watch = Stopwatch()
        seen = value_bytes = 0
        with log.reader(OURS, 0) as reader:
            for record in reader.records():
                seen += 1
                value_bytes += len(record.value)
        seconds = watch.elapsed
    if seen != count:
        raise RuntimeError(f"our reader: {seen:,} records, expected {count:,}")
    return seconds


def kafka_consume(port: int, count: int, settings: dict | None = None) -> float:
    """`settings`: consumer properties beside the ones set here (--kafka-consumer)."""
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({**kafka_config(port), "group.id": "bench-unused",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         **(settings or {})})
    try:
        consumer.assign([TopicPartition(THEIRS, 0, 0)])
        watch = Stopwatch()
        seen = value_bytes = 0
        deadline = time.monotonic() + 300
        while seen < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"confluent-kafka: {seen:,} of {count:,} in 300 s")
            for message in consumer.consume(10_000, timeout=1.0):
                if message.error() is not None:
                    raise RuntimeError(f"confluent-kafka: {message.error()}")
                seen += 1
                value_bytes += len(message.value())
        seconds = watch.elapsed
    finally:
        consumer.close()
    if seen != count:
        raise RuntimeError(f"confluent-kafka: {seen:,} messages, expected {count:,}")
    return seconds


def run(args) -> tuple[dict, list[str]]:
    from streamlog.testing.serve import ServeProcess
    figures: dict = {"records": args.records, "key_bytes": 16, "value_bytes": 100,
                     "linger_ms": 5}
    if args.kafka_consumer:
        figures["kafka_consumer_config"] = ",".join(args.kafka_consumer)
    failures: list[str] = []
    work = fresh_dir(args.workdir)
    data = make_dataset(args.records, seed=1)
    n = len(data)
    daemon = ServeProcess(work / "log", "--fsync", "always", token=TOKEN, kafka_port="0")
    try:
        url, port = daemon.url, daemon.kafka_port

        def measure(name: str, fn, *fn_args) -> None:
            with phase(name):
                seconds = fn(*fn_args)
            figures[f"{name}_rps"] = rate(n, seconds)
            progress(f"{name}: {figures[f'{name}_rps']:,.0f} rec/s")

        attempt("ours_produce", lambda: measure("ours_produce", ours_produce, url, data),
                failures)
        attempt("kafka_produce",
                lambda: measure("kafka_produce", kafka_produce, port, url, data), failures)
        for name, transactional in (("kafka_idempotent_produce", False),
                                    ("kafka_txn_produce", True)):
            attempt(name, lambda name=name, transactional=transactional: measure(
                name, functools.partial(kafka_produce_sequenced,
                                        transactional=transactional),
                port, url, data, name), failures)
        attempt("ours_consume", lambda: measure("ours_consume", ours_consume, url, n),
                failures)
        attempt("kafka_consume",
                lambda: measure("kafka_consume", kafka_consume, port, n,
                                consumer_settings(args.kafka_consumer)), failures)
        attempt("kafka_consume_prompt",
                lambda: measure("kafka_consume_prompt", kafka_consume, port, n,
                                {**PROMPT, **consumer_settings(args.kafka_consumer)}),
                failures)
        figures["daemon_sigterm_exit"] = daemon.stop()
    finally:
        daemon.kill()
        if not args.keep:
            remove(work)
    for name in ("produce", "consume"):
        value = ratio(figures.get(f"kafka_{name}_rps"), figures.get(f"ours_{name}_rps"))
        if value is not None:
            figures[f"kafka_vs_ours_{name}"] = value
    value = ratio(figures.get("kafka_consume_prompt_rps"), figures.get("ours_consume_rps"))
    if value is not None:
        figures["kafka_prompt_vs_ours_consume"] = value
    value = ratio(figures.get("kafka_txn_produce_rps"),
                  figures.get("kafka_idempotent_produce_rps"))
    if value is not None:
        figures["txn_vs_idempotent_produce"] = value
    return figures, failures


VS = {"vs ours": None}
ROWS = [
    Row("streamlog client: producer, single sends", "ours_produce_rps", "rec/s"),
    Row("confluent-kafka: produce, acks=all", "kafka_produce_rps", "rec/s",
        {"vs ours": "ours_produce_rps"}),
    Row("confluent-kafka: produce, idempotent", "kafka_idempotent_produce_rps", "rec/s",
        {"vs ours": "ours_produce_rps"}),
    Row("confluent-kafka: produce, transactional (commit per 1,000)",
        "kafka_txn_produce_rps", "rec/s", {"vs ours": "ours_produce_rps"}),
    Row("streamlog client: records replay", "ours_consume_rps", "rec/s"),
    Row("confluent-kafka: consume", "kafka_consume_rps", "rec/s",
        {"vs ours": "ours_consume_rps"}),
    Row("confluent-kafka: consume, fetch.queue.backoff.ms=10", "kafka_consume_prompt_rps",
        "rec/s", {"vs ours": "ours_consume_rps"}),
]
TARGETS = [
    Target("kafka produce >= 0.5x our client's",
           lambda f: None if "kafka_vs_ours_produce" not in f
           else f["kafka_vs_ours_produce"] >= 0.5),
    Target("kafka consume >= 0.8x our client's",
           lambda f: None if "kafka_vs_ours_consume" not in f
           else f["kafka_vs_ours_consume"] >= 0.8),
    Target("transactional produce (commit per 1,000) >= 0.5x idempotent produce",
           lambda f: None if "txn_vs_idempotent_produce" not in f
           else f["txn_vs_idempotent_produce"] >= 0.5),
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR / "kafka")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--kafka-consumer", action="append", default=[], metavar="KEY=VALUE",
                        help="a confluent-kafka consumer property for kafka_consume "
                             "(repeatable; default: librdkafka's defaults)")
    args = parser.parse_args(argv)
    consumer_settings(args.kafka_consumer)  # a malformed one fails here, not after produce
    return args


def consumer_settings(pairs: list[str]) -> dict:
    """{property: value} of --kafka-consumer KEY=VALUE options."""
    settings = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--kafka-consumer takes KEY=VALUE (got {pair!r})")
        settings[key] = value
    return settings


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    figures, failures = run(args)
    publish("kafka", figures, failures, ROWS, list(VS), TARGETS)


if __name__ == "__main__":
    main()
