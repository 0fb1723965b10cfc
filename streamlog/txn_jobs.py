"""Transactions' decisions, each a job on a partition's writer thread.

Strategy: a transaction ends, a producer starts (fencing its predecessors) and a
transaction begins by writing a record; whether that record may be written is decided
on the writer thread, under the commit lock, after taking in what other processes wrote
(catchup.py): a marker never races another process's abort or fence. The index only
names candidates: an OPEN that only the index says, for a transaction this process wrote
none of, is confirmed from the segments first, so no marker is ever written on the
strength of index data alone (DESIGN 4). The epochs are commits under a reserved tag
(txn.py). Functions over a partition (partition.py).
"""

from __future__ import annotations

import logging

from .encoder import Piece
from .errors import InvalidArgument, ProducerFenced
from .records import RECORD_OVERHEAD_BYTES, RecordKind
from .txn import (TxnState, encode_begin, encode_commit, encode_epoch, new_txn_id,
                  producer_tag, random_txn_id)

log = logging.getLogger("streamlog.partition")


def marker_piece(part, txn_id: int, kind, value: bytes = b"") -> Piece:
    return Piece([part.clock.wall_us()], [None], [value], [int(kind)], None,
                 len(value) + RECORD_OVERHEAD_BYTES, txn_id)


def abort_orphans(part, decided: dict[int, bytes]) -> None:
    """Abort transactions that a crashed writer left open (DESIGN 6), except those a
    commit of several partitions had decided (`decided`: {txn_id: the COMMIT record's
    value}, txn_decisions.py): those are committed."""
    view = part.view()
    for txn_id, first in sorted(view.open_txn_candidates().items()):
        found = view.derive_txn(txn_id, first)
        if found is not None and found[0] == TxnState.OPEN and txn_id in decided:
            part.submit([marker_piece(part, txn_id, RecordKind.COMMIT, decided[txn_id])])
        elif found is not None and found[0] == TxnState.OPEN or (
                found is None and first < view.start_offset):
            # (the second: retention removed all its data; only its state is left, and
            # it would hold the last stable offset back for good)
            part.submit([marker_piece(part, txn_id, RecordKind.ABORT)])


def confirmed_txn_state(part, txn_id: int):
    """TxnState of a transaction (None: no data here), an index-only OPEN confirmed
    from the segments (see the module docstring)."""
    view = part.view()
    state = view.txn_state(txn_id)
    if state is TxnState.OPEN and txn_id not in part.txns_written_here:
        found = view.derive_txn(txn_id, view.txn_first_offset(txn_id))
        state = None if found is None else TxnState(found[0])
    return state


def end_txn(part, txn_id: int, kind: RecordKind, value: bytes = b"") -> int:
    """Write a transaction's COMMIT or ABORT marker; returns its offset. That it is
    still open (and, for a commit, that its producer was not fenced) is decided on the
    writer thread under the commit lock."""
    def job() -> int:
        with part.exclusive:
            check_open(part, txn_id)
            if kind == RecordKind.COMMIT:
                check_producer(part, txn_id)
            return part.appender.write_from_job([marker_piece(part, txn_id, kind, value)])
    return part.run_job(job)


def init_producer(part, transactional_id: str) -> int:
    """Start a producer with a transactional id: abort the open transactions that
    earlier producers with the id began, write its fence; returns its epoch."""
    def job() -> int:
        with part.exclusive:
            view = part.view()
            pieces = []
            for txn_id in sorted(view.open_txn_candidates()):
                if confirmed_txn_state(part, txn_id) is not TxnState.OPEN:
                    continue
                producer = view.producer_of(txn_id)
                if producer is not None and producer[0] == transactional_id:
                    pieces.append(marker_piece(part, txn_id, RecordKind.ABORT))
            epoch = part.state.end_offset + len(pieces)  # the fence's own offset
            name = transactional_id.encode()
            pieces.append(Piece([part.clock.wall_us()] * 2, [None, None],
                                [name, encode_commit(producer_tag(transactional_id),
                                                     encode_epoch(epoch))],
                                [int(RecordKind.PRODUCER), int(RecordKind.COMMIT)], None,
                                len(name) + 64 + 2 * RECORD_OVERHEAD_BYTES, new_txn_id()))
            first = part.appender.write_from_job(pieces)
            assert first + len(pieces) - 1 == epoch
            if len(pieces) > 1:
                log.info("%s: producer %r (epoch %d) aborted %d open transaction(s) of its "
                         "predecessors", part.name, transactional_id, epoch, len(pieces) - 1)
            return epoch
    return part.run_job(job)


def begin_txn(part, transactional_id: str, epoch: int) -> int:
    """Open a transaction of the producer (transactional_id, epoch) with its BEGIN
    record; returns the transaction id. ProducerFenced when a later producer with the id
    has started."""
    def job() -> int:
        with part.exclusive:
            check_epoch(part, transactional_id, epoch)
            txn_id, value = random_txn_id(63), encode_begin(transactional_id, epoch)
            part.txns_written_here.add(txn_id)
            part.appender.write_from_job([marker_piece(part, txn_id, RecordKind.BEGIN,
                                                       value)])
            return txn_id
    return part.run_job(job)


def check_appendable(part, txn_id: int) -> None:
    """Before an append under a transaction this process did not begin here: it must not
    have ended (a fenced producer's were aborted). Checked ahead of the write: an append
    that races an abort lands after the marker, where no reader ever sees it (the first
    marker decides a transaction's state)."""
    state = part.view().txn_state(txn_id)
    if state is None or state is TxnState.OPEN:
        return
    check_producer(part, txn_id)
    raise InvalidArgument(f"transaction {txn_id:#x} is {state.name.lower()} in "
                          f"{part.name}: nothing more can be appended to it")


def check_open(part, txn_id: int) -> None:
    state = confirmed_txn_state(part, txn_id)
    if state is not TxnState.OPEN:
        if state is not None:
            check_producer(part, txn_id)  # a fenced one's: say so
        what = "has no data" if state is None else f"is {state.name.lower()}"
        raise InvalidArgument(f"transaction {txn_id:#x} {what} in {part.name}")


def check_producer(part, txn_id: int) -> None:
    """ProducerFenced when a producer began the transaction and has been fenced."""
    producer = part.view().producer_of(txn_id)
    if producer is not None:
        check_epoch(part, *producer)


def check_epoch(part, transactional_id: str, epoch: int) -> None:
    latest = part.view().producer_epoch(transactional_id)
    if latest is not None and epoch != latest:
        raise ProducerFenced(
            f"producer {transactional_id!r} of {part.name} with epoch {epoch} was fenced: "
            f"a producer with the same transactional id started at epoch {latest} and "
            f"aborted this one's open transactions")


def abort_reopened(part) -> None:
    """After a truncate: a transaction whose commit marker was cut off is not committed
    any more; abort each one the segments confirm open."""
    for txn_id in part.index.reopened_txns:
        state = part.index.txn_state(txn_id)
        found = part.view().derive_txn(txn_id, state[1]) if state is not None else None
        if found is not None and found[0] == TxnState.OPEN:  # confirmed on disk
            part.appender.write_from_job([marker_piece(part, txn_id, RecordKind.ABORT)])
    part.index.reopened_txns = []
