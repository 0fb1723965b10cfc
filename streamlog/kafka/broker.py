"""The Kafka broker's answers, as functions over a streamlog Log. No sockets.

Strategy: `Broker` holds the log and the little state Kafka keeps beside it (producer
ids and their sequence numbers, committed offsets); each `handle_*` method takes a
parsed `Request` (codec.py) and returns its response entity (or None: Produce with
acks=0 has no response). Every method may block (an fsync, a segment read), so the
I/O shell (server.py) runs them on its thread pool; Fetch is split so that the shell
does the waiting (`fetch_once` reads what is there and says what to wait on). The
consumer-group membership lives in groups.py.

Mapping (DESIGN 9): a topic is a stream, partitions and offsets are the same; this
daemon is the one broker (node 0) and the leader of every partition. Timestamps are
milliseconds on the wire and microseconds in the log. Control records (commit and abort
markers, footprints) keep their offsets and are served as Kafka control batches, which
consumers skip; read_committed is applied here (aborted and open transactions' data is
not sent), so the aborted-transactions list is always empty.

The translation between Kafka's record batches and the log's is batches.py; a Fetch
goes on with the reader the consumer's last Fetch left (fetching.py).

Idempotent producers: InitProducerId gives a new producer id (epoch 0) every time, as
Kafka does for a producer without a transactional id, never one handed out before
(producer_state.ProducerIds). A batch with a producer id is judged by Kafka's sequence
rules (producers.py): appended when it continues the producer's sequence in the
partition, answered with the offset it got the first time when it is a retry of one of
the producer's last five batches (nothing appended), refused with
OUT_OF_ORDER_SEQUENCE_NUMBER or INVALID_PRODUCER_EPOCH otherwise. An appended batch is
one frame stamped with its producer id, epoch and base sequence (frame.py), from which
the state is rebuilt after a restart or a crash (producer_state.py), and which Fetch
returns in the batch header as Kafka does.

Transactional producers (a transactional_id): InitProducerId, AddPartitionsToTxn,
AddOffsetsToTxn, TxnOffsetCommit and EndTxn are transactions.py's coordinator; a
transactional batch is appended as an idempotent one, under the log transaction its
partition has in the producer's open transaction.

Committed offsets are records of the internal stream `__consumer_offsets`
(offsets.py). Streams whose names start with "__" are streamlog's own: Metadata says
they are internal, and Produce into one is refused with INVALID_TOPIC_EXCEPTION, as
Kafka refuses client writes to its internal topics.
"""

from __future__ import annotations

import dataclasses
import logging

from .. import errors as log_errors
from ..layout import is_internal
from . import batches, record_decoding, records as kafka_records
from .codec import Pieces, Request, build, response_schema
from .errors import ErrorCode
from .fetching import FetchCursors
from .offsets import CommittedOffsets
from .producer_state import ProducerState
from .producers import Batch as SequencedBatch, SequenceVerdict
from .transactions import TRANSACTION_TIMEOUT_MAX_MS, TransactionCoordinator, TxnError

NODE_ID = 0
CLUSTER_ID = "streamlog"
_LOG = logging.getLogger("streamlog.kafka")
_VERDICT_CODES = {SequenceVerdict.OUT_OF_ORDER: ErrorCode.out_of_order_sequence_number,
                  SequenceVerdict.FENCED: ErrorCode.invalid_producer_epoch}


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """Where clients reach this broker (the address they connected to)."""

    host: str
    port: int


class Broker:
    """Kafka's answers over `log` (a local, writable streamlog Log)."""

    def __init__(self, log, *, default_partitions: int = 1,
                 auto_create_topics: bool = True) -> None:
        self.log = log
        self.default_partitions = default_partitions
        self.auto_create_topics = auto_create_topics
        self.transaction_timeout_max_ms = TRANSACTION_TIMEOUT_MAX_MS
        self.producers = ProducerState(log)
        self.offsets = CommittedOffsets(log)
        self.transactions = TransactionCoordinator(log, self.producers, self.offsets)
        self.fetches = FetchCursors()

    # -- topics ----------------------------------------------------------------------

    def partition_count(self, topic: str) -> int | None:
        try:
            return self.log.partition_count(topic)
        except (log_errors.UnknownStream, log_errors.InvalidArgument, TypeError):
            return None

    def handle_metadata(self, request: Request, endpoint: Endpoint):
        body = request.body
        if body.topics is None or (request.api_version == 0 and not body.topics):
            names = self.log.streams()
        else:
            names = [t.name for t in body.topics]
        allow_create = getattr(body, "allow_auto_topic_creation", True)
        topics = []
        for name in names:
            count = self.partition_count(name)
            error = ErrorCode.none
            if count is None and allow_create and self.auto_create_topics and name:
                error, count = self._create(name, self.default_partitions)
            elif count is None:
                error = ErrorCode.unknown_topic_or_partition
            topics.append({
                "error_code": error, "name": name, "is_internal": is_internal(name),
                "partitions": [_partition_metadata(p) for p in range(count or 0)]})
        return build(response_schema(request),
                     brokers=[{"node_id": NODE_ID, "host": endpoint.host,
                               "port": endpoint.port}],
                     cluster_id=CLUSTER_ID, controller_id=NODE_ID, topics=topics)

    def _create(self, name: str, partitions: int) -> tuple[ErrorCode, int | None]:
        try:
            return ErrorCode.none, self.log.create_stream(name, partitions)
        except (log_errors.InvalidStreamName, log_errors.InternalStream):
            return ErrorCode.invalid_topic_exception, None
        except log_errors.InvalidArgument:  # created meanwhile with another count
            count = self.partition_count(name)
            return (ErrorCode.none, count) if count else (ErrorCode.invalid_partitions, None)

    def handle_create_topics(self, request: Request):
        results = []
        for topic in request.body.topics:
            partitions = topic.num_partitions
            if partitions == -1:
                partitions = self.default_partitions if not topic.assignments else len(
                    topic.assignments)
            result = {"name": topic.name, "error_code": ErrorCode.none,
                      "num_partitions": partitions, "replication_factor": 1}
            if self.partition_count(topic.name) is not None:
                result.update(error_code=ErrorCode.topic_already_exists,
                              error_message=f"topic {topic.name!r} already exists")
            elif topic.replication_factor not in (-1, 1):
                result.update(error_code=ErrorCode.invalid_replication_factor,
                              error_message="this broker is the only one: replication "
                                            "factor 1")
            elif not 1 <= partitions <= self.log.config.partitions_max:
                result.update(error_code=ErrorCode.invalid_partitions,
                              error_message=f"partitions must be 1.."
                                            f"{self.log.config.partitions_max}")
            elif not request.body.validate_only:
                error, _count = self._create(topic.name, partitions)
                if error != ErrorCode.none:
                    result.update(error_code=error,
                                  error_message=f"invalid topic name {topic.name!r}")
            results.append(result)
        return build(response_schema(request), topics=results)

    # -- producing -------------------------------------------------------------------

    def handle_init_producer_id(self, request: Request):
        body = request.body
        schema = response_schema(request)
        if body.transactional_id is not None:
            try:
                producer_id, epoch = self.transactions.init_producer(
                    body.transactional_id, int(body.transaction_timeout.total_seconds()
                                               * 1000),
                    getattr(body, "producer_id", -1), getattr(body, "producer_epoch", -1))
            except TxnError as error:
                _LOG.warning("kafka_txn_refused", extra={"fields": {
                    "transactional_id": body.transactional_id, "error": str(error)}})
                return build(schema, error_code=error.code, producer_id=-1,
                             producer_epoch=-1)
            return build(schema, producer_id=producer_id, producer_epoch=epoch)
        # Without a transactional id, Kafka hands out a new id even to a producer that
        # names its current one (KIP-360's bump): its batches then start at sequence 0.
        try:
            producer_id = self.producers.next_producer_id()
        except OSError as error:
            _LOG.error("kafka_producer_id_failed", extra={"fields": {"error": str(error)}})
            return build(schema, error_code=ErrorCode.kafka_storage_error, producer_id=-1,
                         producer_epoch=-1)
        return build(schema, producer_id=producer_id, producer_epoch=0)

    def close(self) -> None:
        """Close the readers kept between Fetches and write the idempotent producers'
        snapshots (before the log closes)."""
        self.fetches.close()
        self.producers.close()

    def handle_produce(self, request: Request):
        """Append every partition's batches. Returns None for acks=0."""
        body = request.body
        acks = body.acks
        topics = []
        for topic in body.topic_data:
            partitions = []
            for data in topic.partition_data:
                if acks not in (0, 1, -1):
                    code, base = ErrorCode.invalid_required_acks, -1
                elif is_internal(topic.name):  # as Kafka: no client writes them
                    code, base = ErrorCode.invalid_topic_exception, -1
                else:
                    code, base = self._produce_partition(topic.name, data.index,
                                                         data.records or b"",
                                                         body.transactional_id)
                partitions.append({"index": data.index, "error_code": code,
                                   "base_offset": base, "log_start_offset": -1,
                                   "record_errors": []})
            topics.append({"name": topic.name, "partition_responses": partitions})
        if acks == 0:
            return None
        return build(response_schema(request), responses=topics)

    def _produce_partition(self, topic: str, partition: int, data: bytes,
                           transactional_id: str | None = None):
        count = self.partition_count(topic)
        if count is None or not 0 <= partition < count:
            return ErrorCode.unknown_topic_or_partition, -1
        try:
            batches = record_decoding.decode_batches(data, as_arrays=True)
        except kafka_records.BatchError as error:
            _LOG.warning("kafka_bad_batch", extra={"fields": {
                "topic": topic, "partition": partition, "error": str(error)}})
            return error.code, -1
        first = -1
        for batch in batches:
            try:
                code, base = self._append_batch(topic, partition, batch,
                                                 len(data) // len(batches),
                                                 transactional_id)
            except log_errors.InvalidAppend as error:
                _LOG.warning("kafka_append_refused", extra={"fields": {"error": str(error)}})
                return ErrorCode.message_too_large, -1
            except log_errors.LogClosed:
                return ErrorCode.kafka_storage_error, -1
            except log_errors.StreamLogError as error:  # a failed or damaged partition
                _LOG.error("kafka_append_failed", extra={"fields": {
                    "topic": topic, "partition": partition, "error": str(error)}})
                return ErrorCode.kafka_storage_error, -1
            if code != ErrorCode.none:
                return code, -1
            first = base if first < 0 else first
        return ErrorCode.none, first

    def _append_batch(self, topic: str, partition: int, batch, nbytes: int,
                      transactional_id: str | None = None) -> tuple[ErrorCode, int]:
        if batch.is_control or not len(batch):
            return ErrorCode.invalid_record if batch.is_control else ErrorCode.none, -1
        if transactional_id is not None or batch.is_transactional:
            if transactional_id is None or not batch.is_transactional:
                return ErrorCode.invalid_record, -1  # Kafka: both or neither
            try:
                with self.transactions.producing(transactional_id, batch.producer_id,
                                                 batch.producer_epoch,
                                                 (topic, partition)) as txn_id:
                    code, base = self._sequenced(topic, partition, batch, nbytes, txn_id)
                    if code != ErrorCode.none:  # (not written: the block must not end well)
                        raise TxnError(code)
                    return code, base
            except TxnError as error:
                return error.code, -1
        if batch.producer_id < 0:
            return ErrorCode.none, self._append(topic, partition, batch)
        return self._sequenced(topic, partition, batch, nbytes, 0)

    def _sequenced(self, topic: str, partition: int, batch, nbytes: int,
                   txn_id: int) -> tuple[ErrorCode, int]:
        """A batch with a producer id, by Kafka's sequence rules (producers.py)."""
        if not (0 <= batch.producer_epoch and 0 <= batch.base_sequence):
            return ErrorCode.invalid_record, -1  # a producer id without its sequence
        decision = self.producers.produce(
            topic, partition, batch.producer_id,
            SequencedBatch(batch.producer_epoch, batch.base_sequence, len(batch)),
            nbytes=nbytes,
            append=lambda stamp: self._append(topic, partition, batch, stamp, txn_id))
        if decision.verdict in (SequenceVerdict.APPEND, SequenceVerdict.DUPLICATE):
            return ErrorCode.none, decision.base_offset
        _LOG.warning("kafka_sequence_refused", extra={"fields": {
            "topic": topic, "partition": partition, "producer_id": batch.producer_id,
            "verdict": decision.verdict.value, "reason": decision.reason}})
        return _VERDICT_CODES[decision.verdict], -1

    def _append(self, topic: str, partition: int, batch, stamp=None, txn_id: int = 0) -> int:
        return batches.append(self.log, topic, partition, batch, stamp, txn_id)

    # -- consuming -------------------------------------------------------------------

    def fetch_once(self, request: Request):
        """(response, bytes of records in it, waits): what the log holds now, in one
        pass; `waits` are the (topic, partition, end offset seen) a long poll waits on
        (Log.wait_for_async: an append past that end may bring more)."""
        body = request.body
        committed = getattr(body, "isolation_level", 0) == 1
        budget = body.max_bytes if request.api_version >= 3 else 1 << 30
        topics, total, waits = [], 0, []
        for topic in body.topics:
            partitions = []
            for asked in topic.partitions:
                entry, size = self._fetch_partition(
                    topic.topic, asked.partition, asked.fetch_offset,
                    min(asked.partition_max_bytes, max(budget - total, 0)), committed,
                    first=total == 0)
                total += size
                partitions.append(entry)
                if entry["error_code"] == ErrorCode.none:
                    waits.append((topic.topic, asked.partition, entry["high_watermark"]))
            topics.append({"topic": topic.topic, "partitions": partitions})
        response = build(response_schema(request), error_code=ErrorCode.none, session_id=0,
                         responses=topics)
        return response, total, waits

    def _fetch_partition(self, topic, partition, offset, max_bytes, committed, first):
        entry = {"partition_index": partition, "error_code": ErrorCode.none,
                 "high_watermark": -1, "last_stable_offset": -1, "log_start_offset": -1,
                 "aborted_transactions": [] if committed else None,
                 "preferred_read_replica": -1, "records": b""}
        count = self.partition_count(topic)
        if count is None or not 0 <= partition < count:
            entry["error_code"] = ErrorCode.unknown_topic_or_partition
            return entry, 0
        log = self.log
        start, end = log.start_offset(topic, partition), log.end_offset(topic, partition)
        stable = log.last_stable_offset(topic, partition)
        entry.update(high_watermark=end, last_stable_offset=stable, log_start_offset=start)
        if not start <= offset <= end:
            entry["error_code"] = ErrorCode.offset_out_of_range
            return entry, 0
        if offset == end or (committed and offset >= stable):
            return entry, 0
        try:
            chunks = self.fetches.read(log, topic, partition, offset, max_bytes, committed,
                                       at_least_one=first)
        except log_errors.OffsetOutOfRange:
            entry["error_code"] = ErrorCode.offset_out_of_range
            return entry, 0
        except log_errors.CorruptionError as error:
            _LOG.error("kafka_fetch_corrupt", extra={"fields": {"error": str(error)}})
            entry["error_code"] = ErrorCode.kafka_storage_error
            return entry, 0
        data = Pieces(chunks)  # written to the socket as they are (codec.py)
        entry["records"] = data
        return entry, len(data)

    def handle_list_offsets(self, request: Request):
        committed = getattr(request.body, "isolation_level", 0) == 1
        topics = []
        for topic in request.body.topics:
            partitions = []
            for asked in topic.partitions:
                result = {"partition_index": asked.partition_index,
                          "error_code": ErrorCode.none, "timestamp": -1, "offset": -1,
                          "leader_epoch": 0}
                count = self.partition_count(topic.name)
                if count is None or not 0 <= asked.partition_index < count:
                    result["error_code"] = ErrorCode.unknown_topic_or_partition
                else:
                    result.update(self._list_offset(topic.name, asked.partition_index,
                                                    asked.timestamp, committed))
                partitions.append(result)
            topics.append({"name": topic.name, "partitions": partitions})
        return build(response_schema(request), topics=topics)

    def _list_offset(self, topic: str, partition: int, timestamp: int, committed: bool):
        log = self.log
        if timestamp == -2:  # earliest
            return {"offset": log.start_offset(topic, partition)}
        if timestamp == -1:  # latest
            if committed:
                return {"offset": log.last_stable_offset(topic, partition)}
            return {"offset": log.end_offset(topic, partition)}
        if timestamp == -3:  # the record with the largest timestamp (KIP-734)
            highest = _max_timestamp_us(log, topic, partition)
            if highest is None:
                return {"offset": -1, "timestamp": -1}
            return self._first_at(topic, partition, highest)
        if timestamp < 0:
            return {"error_code": ErrorCode.invalid_request}
        return self._first_at(topic, partition, timestamp * 1000)

    def _first_at(self, topic: str, partition: int, timestamp_us: int):
        """The first record at which the partition's high-water mark reaches
        `timestamp_us` (DESIGN 5): its offset and timestamp in milliseconds."""
        log = self.log
        offset = log.offset_for_timestamp(topic, partition, timestamp_us)
        if offset >= log.end_offset(topic, partition):
            return {"offset": -1, "timestamp": -1}
        with log.reader(topic, partition, from_offset=offset, read_committed=False) as reader:
            record = next(iter(reader.records()), None)
        if record is None:
            return {"offset": -1, "timestamp": -1}
        return {"offset": record.offset, "timestamp": record.timestamp_us // 1000}

    # -- committed offsets -----------------------------------------------------------

    def commit_offsets(self, group: str, commits: list[tuple[str, int, int, str | None]]):
        """Append (topic, partition, offset, metadata) commits durably, then remember
        them. Returns {(topic, partition): ErrorCode}."""
        return self.offsets.commit(group, commits, self.partition_count)

    def committed(self, group: str) -> dict[tuple[str, int], tuple[int, str | None]]:
        return self.offsets.of(group)


def _partition_metadata(number: int) -> dict:
    return {"error_code": ErrorCode.none, "partition_index": number, "leader_id": NODE_ID,
            "leader_epoch": 0, "replica_nodes": [NODE_ID], "isr_nodes": [NODE_ID],
            "offline_replicas": []}


def _max_timestamp_us(log, topic: str, partition: int) -> int | None:
    """The largest timestamp in the partition (None when it is empty): the partition's
    high-water mark, found as the largest t whose seek by time (offset_for_timestamp:
    the first offset whose high-water mark reaches t) lands before the end. About 64
    index lookups; the first record at that mark is the first with that timestamp."""
    end = log.end_offset(topic, partition)
    low, high = -(1 << 63) + 1, (1 << 63) - 1
    if log.offset_for_timestamp(topic, partition, low) >= end:
        return None
    while low < high:  # invariant: a seek to `low` lands before the end
        middle = (low + high + 1) // 2
        if log.offset_for_timestamp(topic, partition, middle) < end:
            low = middle
        else:
            high = middle - 1
    return low
