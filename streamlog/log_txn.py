"""A Log's transaction operations (DESIGN 6, txn.py): part of class Log (log.py).

Strategy: each operation checks its arguments, finds the partition (UnknownStream,
InvalidArgument for a bad partition, LogClosed) and hands the decision to it: ending a
transaction, starting a producer and beginning a transaction are jobs on the partition's
writer thread, decided under its commit lock (txn_jobs.py); the states are read from a
View of the partition's current state.
"""

from __future__ import annotations

from . import txn as txn_module, txn_decisions
from .errors import InvalidArgument
from .records import RecordKind
from .validate import as_bytes


class TxnOperations:
    new_txn_id = staticmethod(txn_module.new_txn_id)

    def commit_txn(self, stream: str, partition: int, txn_id: int, *, tag: str = "",
                   marker: bytes = b"") -> int:
        """Append the COMMIT marker of an open transaction; returns its offset once
        durable. `tag`/`marker` are remembered for last_commit(tag). ProducerFenced when
        the transaction's producer was fenced (init_producer)."""
        if not isinstance(tag, str) or len(tag.encode()) >= 1 << 16:
            raise InvalidArgument("tag must be a str shorter than 64 KiB")
        if tag.startswith(txn_module.PRODUCER_TAG_PREFIX):
            raise InvalidArgument(f"tags starting with {txn_module.PRODUCER_TAG_PREFIX!r} "
                                  f"are reserved for producers' fences")
        return self._txn_partition(stream, partition, txn_id).end_txn(
            txn_id, RecordKind.COMMIT,
            txn_module.encode_commit(tag, as_bytes(marker, "marker", 0)))

    def commit_txns(self, parts, *, tag: str = "", marker: bytes = b"") -> list:
        """Commit open transactions of several partitions as one: all of them or none,
        whatever the moment of a crash (txn_decisions.py: a decision in the internal
        stream `__transaction_state` first, completed by the next writable open).
        Local only (api.LOCAL_ONLY): the Kafka listener's transactions, beside the log;
        the daemon's wire protocol does not carry it yet.

        Args:
            parts: [(stream, partition, txn_id)], each partition once.
            tag, marker: as commit_txn, for every commit marker.
        Returns:
            Each part's COMMIT marker offset once durable (None for one already
            committed: a retry).
        Raises:
            InvalidArgument for a transaction with no data or aborted in its partition
            (nothing is committed), and as commit_txn.
        """
        if not isinstance(tag, str) or len(tag.encode()) >= 1 << 16 or tag.startswith(
                txn_module.PRODUCER_TAG_PREFIX):
            raise InvalidArgument("tag must be a str shorter than 64 KiB, not a "
                                  "producer's fence")
        return txn_decisions.commit(self, list(parts), tag, as_bytes(marker, "marker", 0))

    def _open_streams(self, progress) -> None:
        """Open every stream of the directory: `__transaction_state` first, so that the
        partitions of a commit decided before a crash are told to complete it as they
        open (their orphans are committed, not aborted), and the decisions are then
        recorded complete."""
        names = self._stream_names()
        decisions = {}
        if txn_decisions.DECISIONS_STREAM in names:
            self._open_stream(txn_decisions.DECISIONS_STREAM, progress)
            alone = self._registry is not None and self._registry.alone
            if not self.readonly and alone:
                decisions = txn_decisions.pending(self)
                self._decided = txn_decisions.by_partition(decisions)
        for name in names:
            if name not in self._streams:
                self._open_stream(name, progress)
        self._decided = {}
        txn_decisions.complete(self, decisions)

    def abort_txn(self, stream: str, partition: int, txn_id: int) -> int:
        """Append the ABORT marker of an open transaction: its data is never visible."""
        return self._txn_partition(stream, partition, txn_id).end_txn(txn_id,
                                                                      RecordKind.ABORT)

    def init_producer(self, stream: str, partition: int, transactional_id: str) -> int:
        """Start a transactional producer (DESIGN 6, txn.py): abort at once the open
        transactions that earlier producers with this id began in the partition, and
        fence them (their later begins, appends and commits raise ProducerFenced).
        Returns this producer's epoch, for begin_txn."""
        return self._partition(stream, partition).init_producer(
            txn_module.check_transactional_id(transactional_id))

    def begin_txn(self, stream: str, partition: int, transactional_id: str,
                  epoch: int) -> int:
        """Open a transaction of the producer (transactional_id, epoch) and return its
        id: append under it, then commit_txn or abort_txn. ProducerFenced when a later
        producer with the id has started."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise InvalidArgument(f"epoch must be an int >= 0, from init_producer "
                                  f"(got {epoch!r})")
        return self._partition(stream, partition).begin_txn(
            txn_module.check_transactional_id(transactional_id), epoch)

    def txn_state(self, stream: str, partition: int, txn_id: int):
        """TxnState of a transaction in a partition, or None when it has no data there."""
        return self._partition(stream, partition).view().txn_state(txn_id)

    def last_stable_offset(self, stream: str, partition: int = 0) -> int:
        """First offset of the oldest open transaction, or the end: a read_committed
        reader delivers nothing at or past it until that transaction ends."""
        return self._partition(stream, partition).view().last_stable_offset()

    def batch_holding(self, stream: str, partition: int, offset: int):
        """(base_offset, stored frame bytes, columns) of the batch that holds `offset`:
        the unit an operator reading a log backwards steps by (operators/read_backwards.py).
        Local only (api.LOCAL_ONLY): it hands out the stored batch, the unit of this
        log's files; a daemon's client reads ranges (reader)."""
        entry, columns = self._partition(stream, partition).view().batch_holding(offset)
        return entry.base_offset, entry.frame_bytes, columns

    def open_transactions(self, stream: str, partition: int) -> dict[int, int]:
        """The transactions the partition's index says are still open: what an
        operator (or the daemon's sweep of stale transactions) looks at before it
        ends them. commit_txn and abort_txn confirm from the segments before they
        write a marker for one this process did not write.

        Returns:
            {txn_id: first offset of its records}.
        Raises:
            UnknownStream, InvalidArgument for a bad partition, LogClosed.
        """
        return self._partition(stream, partition).view().open_txn_candidates()

    def last_commit(self, stream: str, partition: int, tag: str) -> bytes | None:
        """Marker of the latest commit made with `tag` in the partition, or None."""
        return self._partition(stream, partition).view().last_commit(tag)

    def _txn_partition(self, stream: str, partition: int, txn_id: int):
        if isinstance(txn_id, bool) or not isinstance(txn_id, int) or not 0 < txn_id < 1 << 64:
            raise InvalidArgument(f"txn_id must be an int in 1..2**64-1 (got {txn_id!r})")
        return self._partition(stream, partition)
