"""Kafka's transaction coordinator, over the log's transactions (DESIGN 6 and 9).

Strategy: a Kafka transaction spans partitions; the log's transactions are each one
partition's. So a Kafka transaction is a set of the log's: AddPartitionsToTxn gives
each partition a fresh transaction id of the log's, under which that partition's
transactional batches are appended (stamped, as an idempotent producer's: the sequence
rules of producers.py still hold); TxnOffsetCommit appends the group's offsets to
`__consumer_offsets` under a transaction id of its own, so they count only once
committed (offsets.py reads that stream read_committed). EndTxn with commit is
Log.commit_txns over all of them: one decision, written to the log's
`__transaction_state` before any commit marker, so that a crash part-way is completed
by the next open (the commit was decided); EndTxn with abort writes an abort marker in
each. A crash before the decision leaves the log's transactions open, and the next open
of the log aborts them, as it aborts every transaction a crashed writer left: so a
daemon killed mid-transaction aborts it, and one killed mid-commit completes it, as
Kafka's coordinator does.

The coordinator's own table (transactional id -> producer id, epoch, what the open
transaction holds) lives in memory. After a restart it is empty: a producer that comes
back with its old producer id is told INVALID_PRODUCER_ID_MAPPING (its transaction was
aborted or completed by the open) and starts again with InitProducerId, which fences
nothing it should not: producer ids are never handed out twice (producer_state.py), so a
zombie from before the restart matches no entry.

Fencing, as Kafka: InitProducerId for a transactional id that has an entry aborts its
open transaction and bumps the epoch; any request with an older epoch gets
PRODUCER_FENCED (INVALID_PRODUCER_EPOCH for Produce, as Kafka answers it there).

Timeout: a transaction open longer than the producer's transaction.timeout.ms (at most
TRANSACTION_TIMEOUT_MAX_MS, Kafka's transaction.max.timeout.ms default of 15 minutes;
librdkafka's default is 60 s) is aborted by `expire` (the listener's timer) and its
producer fenced (the epoch bumped), as Kafka does since KIP-588.

Thread-safety: every method blocks on the log (appends, markers) and may be called from
any thread: a lock guards the table, and each transaction has a lock of its own held
while a request changes it (a Produce's append included), so an EndTxn never races the
appends it ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time

from .. import errors as log_errors
from ..layout import is_internal
from .errors import ErrorCode
from .offsets import OFFSETS_STREAM

TRANSACTION_TIMEOUT_MAX_MS = 900_000  # Kafka's transaction.max.timeout.ms default
EPOCH_MAX = 32767  # epochs are int16: past it, a new producer id
_LOG = logging.getLogger("streamlog.kafka")

Place = tuple[str, int]  # (topic, partition)


class TxnError(Exception):
    """A request refused with a Kafka error code."""

    def __init__(self, code: ErrorCode, message: str = "") -> None:
        super().__init__(message or code.name)
        self.code = code


@dataclasses.dataclass
class Transaction:
    """A transactional id's producer and its open transaction."""

    transactional_id: str
    producer_id: int
    epoch: int
    timeout_s: float
    ongoing: bool = False
    started: float = 0.0
    partitions: dict[Place, int] = dataclasses.field(default_factory=dict)  # -> log txn
    written: set[Place] = dataclasses.field(default_factory=set)  # partitions with data
    groups: set[str] = dataclasses.field(default_factory=set)  # AddOffsetsToTxn
    offsets_txn: int = 0  # the log txn of its offsets in __consumer_offsets (0: none)
    offsets: list = dataclasses.field(default_factory=list)  # [(group, kept commits)]
    last_outcome: bool | None = None  # the last EndTxn's: committed?
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)


class TransactionCoordinator:
    """Every transactional producer of the listener."""

    def __init__(self, log, producer_ids, offsets, *, clock=time.monotonic) -> None:
        self.log = log
        self.producer_ids = producer_ids  # producer_state.ProducerState
        self.offsets = offsets  # offsets.CommittedOffsets
        self.clock = clock
        self._table: dict[str, Transaction] = {}
        self._lock = threading.Lock()

    # -- InitProducerId --------------------------------------------------------------

    def init_producer(self, transactional_id: str, timeout_ms: int,
                      producer_id: int = -1, epoch: int = -1) -> tuple[int, int]:
        """(producer id, epoch) for a producer starting with `transactional_id`: the
        same id with the next epoch when it has one (its open transaction aborted, its
        predecessor fenced), else a new id at epoch 0. Raises TxnError."""
        if not transactional_id:
            raise TxnError(ErrorCode.invalid_request, "an empty transactional id")
        if not 0 < timeout_ms <= TRANSACTION_TIMEOUT_MAX_MS:
            raise TxnError(ErrorCode.invalid_transaction_timeout,
                           f"transaction.timeout.ms must be in 1..{TRANSACTION_TIMEOUT_MAX_MS}")
        with self._lock:
            txn = self._table.get(transactional_id)
        known = txn is not None  # (a new one ignores the id and epoch it is given)
        if txn is None:
            txn = Transaction(transactional_id, self._new_producer_id(), -1, 0)
            with self._lock:
                txn = self._table.setdefault(transactional_id, txn)
        with txn.lock:
            if known and producer_id >= 0 and (producer_id, epoch) != (txn.producer_id,
                                                                       txn.epoch):
                raise TxnError(ErrorCode.producer_fenced, "a newer producer has this id")
            if txn.ongoing:
                self._abort(txn)
            txn.timeout_s = timeout_ms / 1000
            if txn.epoch >= EPOCH_MAX:
                txn.producer_id, txn.epoch = self._new_producer_id(), 0
            else:
                txn.epoch += 1
            txn.last_outcome = None
            _LOG.info("kafka_txn_producer", extra={"fields": {
                "transactional_id": transactional_id, "producer_id": txn.producer_id,
                "epoch": txn.epoch}})
            return txn.producer_id, txn.epoch

    def _new_producer_id(self) -> int:
        try:
            return self.producer_ids.next_producer_id()
        except OSError as error:
            raise TxnError(ErrorCode.kafka_storage_error, str(error)) from None

    # -- the open transaction --------------------------------------------------------

    @contextlib.contextmanager
    def _current(self, transactional_id: str, producer_id: int, epoch: int):
        """The transaction, locked, when (producer_id, epoch) is its producer's."""
        with self._lock:
            txn = self._table.get(transactional_id)
        if txn is None or txn.producer_id != producer_id:
            raise TxnError(ErrorCode.invalid_producer_id_mapping,
                           f"no producer {producer_id} for transactional id "
                           f"{transactional_id!r} (the daemon may have restarted)")
        with txn.lock:
            if epoch != txn.epoch:
                raise TxnError(ErrorCode.producer_fenced,
                               f"epoch {epoch} of {transactional_id!r} was fenced by "
                               f"epoch {txn.epoch}")
            yield txn

    def _begin(self, txn: Transaction) -> None:
        if not txn.ongoing:
            txn.ongoing, txn.started, txn.last_outcome = True, self.clock(), None

    def add_partitions(self, transactional_id: str, producer_id: int, epoch: int,
                       places: list[Place], partition_count) -> dict[Place, ErrorCode]:
        """AddPartitionsToTxn: each partition gets a log transaction id.
        `partition_count(topic)` is None for an unknown topic."""
        bad = {p for p in places if is_internal(p[0]) or partition_count(p[0]) is None
               or not 0 <= p[1] < partition_count(p[0])}
        if bad:  # Kafka: the bad ones named, the rest not attempted
            return {p: (ErrorCode.unknown_topic_or_partition if not is_internal(p[0])
                        else ErrorCode.invalid_topic_exception) if p in bad
                    else ErrorCode.operation_not_attempted for p in places}
        with self._current(transactional_id, producer_id, epoch) as txn:
            self._begin(txn)
            for place in places:
                if place not in txn.partitions:
                    txn.partitions[place] = self.log.new_txn_id()
        return {place: ErrorCode.none for place in places}

    def add_offsets(self, transactional_id: str, producer_id: int, epoch: int,
                    group: str) -> None:
        """AddOffsetsToTxn: the group's offsets may be committed in the transaction."""
        with self._current(transactional_id, producer_id, epoch) as txn:
            self._begin(txn)
            txn.groups.add(group)
            if not txn.offsets_txn:
                txn.offsets_txn = self.log.new_txn_id()

    def commit_offsets(self, transactional_id: str, producer_id: int, epoch: int,
                       group: str, commits, partition_count) -> dict[Place, ErrorCode]:
        """TxnOffsetCommit: appended under the transaction, counted at its commit."""
        with self._current(transactional_id, producer_id, epoch) as txn:
            if group not in txn.groups:
                raise TxnError(ErrorCode.invalid_txn_state,
                               f"group {group!r} was not added to the transaction")
            codes, kept = self.offsets.commit_in_txn(group, commits, partition_count,
                                                     txn.offsets_txn)
            if kept:
                txn.offsets.append((group, kept))
            return codes

    @contextlib.contextmanager
    def producing(self, transactional_id: str, producer_id: int, epoch: int,
                  place: Place):
        """Around a transactional Produce to `place`: yields the log transaction id to
        append under; the partition counts as written once the block ends without an
        error. Raises TxnError (INVALID_PRODUCER_EPOCH for an older epoch, as Kafka
        answers a Produce; INVALID_TXN_STATE for a partition not added)."""
        try:
            with self._current(transactional_id, producer_id, epoch) as txn:
                txn_id = txn.partitions.get(place) if txn.ongoing else None
                if txn_id is None:
                    raise TxnError(ErrorCode.invalid_txn_state,
                                   f"{place[0]}/{place[1]} is not in the open transaction "
                                   f"of {transactional_id!r}")
                yield txn_id
                txn.written.add(place)
        except TxnError as error:
            if error.code == ErrorCode.producer_fenced:
                raise TxnError(ErrorCode.invalid_producer_epoch, str(error)) from None
            raise

    # -- EndTxn ----------------------------------------------------------------------

    def end(self, transactional_id: str, producer_id: int, epoch: int,
            commit: bool) -> None:
        """EndTxn: commit (one decision over every partition, completed by the next
        open after a crash) or abort."""
        with self._current(transactional_id, producer_id, epoch) as txn:
            if not txn.ongoing:
                if txn.last_outcome is commit:
                    return  # a retry of the EndTxn that ended it
                raise TxnError(ErrorCode.invalid_txn_state,
                               f"{transactional_id!r} has no open transaction")
            if commit:
                self._commit(txn)
            else:
                self._abort(txn)
            txn.last_outcome = commit

    def _commit(self, txn: Transaction) -> None:
        parts = _written_parts(txn)
        try:
            if parts:
                self.log.commit_txns(parts, tag=f"kafka:{txn.transactional_id}")
        except log_errors.StreamLogError as error:
            _LOG.error("kafka_txn_commit_failed", extra={"fields": {
                "transactional_id": txn.transactional_id, "error": str(error)}})
            raise TxnError(ErrorCode.kafka_storage_error, str(error)) from None
        for group, kept in txn.offsets:
            self.offsets.remember(group, kept)
        self._clear(txn)

    def _abort(self, txn: Transaction) -> None:
        parts = _written_parts(txn)
        for topic, number, txn_id in parts:
            try:
                self.log.abort_txn(topic, number, txn_id)
            except log_errors.StreamLogError as error:
                # a partition that failed: the next open aborts what is left open
                _LOG.error("kafka_txn_abort_failed", extra={"fields": {
                    "transactional_id": txn.transactional_id, "partition":
                    f"{topic}/{number}", "error": str(error)}})
        self._clear(txn)

    def _clear(self, txn: Transaction) -> None:
        txn.ongoing = False
        txn.partitions, txn.written, txn.groups = {}, set(), set()
        txn.offsets_txn, txn.offsets = 0, []

    # -- time ------------------------------------------------------------------------

    def expire(self) -> list[str]:
        """Abort the transactions open longer than their timeout and fence their
        producers (the listener's timer calls this on its thread pool). Returns the
        transactional ids aborted."""
        now = self.clock()
        with self._lock:
            late = [t for t in self._table.values()
                    if t.ongoing and now - t.started > t.timeout_s]
        done = []
        for txn in late:
            with txn.lock:
                if txn.ongoing and now - txn.started > txn.timeout_s:
                    self._abort(txn)
                    txn.epoch += 1  # the producer is fenced (KIP-588)
                    done.append(txn.transactional_id)
                    _LOG.warning("kafka_txn_timed_out", extra={"fields": {
                        "transactional_id": txn.transactional_id,
                        "timeout_s": txn.timeout_s}})
        return done

    def has_open(self) -> bool:
        with self._lock:
            return any(t.ongoing for t in self._table.values())

    def describe(self) -> list[dict]:
        """The open transactions: for `streamlog info`-like views and tests."""
        with self._lock:
            return [{"transactional_id": t.transactional_id, "producer_id": t.producer_id,
                     "epoch": t.epoch, "partitions": sorted(t.partitions)}
                    for t in self._table.values() if t.ongoing]


def _written_parts(txn: Transaction) -> list[tuple[str, int, int]]:
    """(stream, partition, log txn id) of what the transaction wrote: the partitions
    with data, and its offsets in __consumer_offsets when it committed any."""
    parts = [(topic, number, txn.partitions[(topic, number)])
             for topic, number in sorted(txn.written)]
    if txn.offsets:
        parts.append((OFFSETS_STREAM, 0, txn.offsets_txn))
    return parts
