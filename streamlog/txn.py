"""Transactions: data under a transaction id becomes visible with its commit marker.

Strategy (DESIGN 6): a writer appends data frames whose header carries `txn_id`, then a
COMMIT (or ABORT) control record under the same id. The partition keeps each id's
state (OPEN, COMMITTED, ABORTED) in its index, derived from the frames, so it can be
rebuilt from the segments like everything else in the index. A `read_committed`
reader shows a transaction's data only once it is committed, skips aborted data, and
stops at the first record of a still-open transaction (the last stable offset, as
Kafka's consumers do). A writable open aborts every transaction a crashed writer left
open.

A COMMIT record's value is `u16 tag length, tag (UTF-8), marker bytes`: the tag names
who committed (a Spark query id) and the marker what (its batch id), so a sink can ask
`last_commit(tag)` after a restart and skip a batch it already committed.
"""

from __future__ import annotations

import enum
import os
import struct

from .records import RecordKind

_TAG = struct.Struct("<H")


class TxnState(enum.IntEnum):
    OPEN = 1
    COMMITTED = 2
    ABORTED = 3


def new_txn_id() -> int:
    """A fresh random transaction id (nonzero, 64-bit)."""
    return random_txn_id(64)


def random_txn_id(bits: int) -> int:
    """A fresh random id, nonzero and `bits` wide (begin_txn's are 63-bit: they travel
    as a signed result on the wire)."""
    while True:
        txn_id = int.from_bytes(os.urandom(8), "big") >> (64 - bits)
        if txn_id:
            return txn_id


def encode_commit(tag: str, marker: bytes) -> bytes:
    tag_bytes = tag.encode()
    assert len(tag_bytes) < 1 << 16
    return _TAG.pack(len(tag_bytes)) + tag_bytes + bytes(marker)


def decode_commit(value: bytes) -> tuple[str, bytes]:
    if len(value) < 2:
        return "", b""
    (length,) = _TAG.unpack_from(value, 0)
    return value[2:2 + length].decode(errors="replace"), bytes(value[2 + length:])


def frame_events(txn_id: int, base_offset: int, kinds, values) -> list[tuple]:
    """Transaction events of one frame: [(txn_id, state, offset, tag, marker)], where
    offset is the first data record's for OPEN and the marker's own for the others.

    `kinds` is None for an all-data frame; `values(i)` returns record i's value.
    """
    if txn_id == 0:
        return []
    events = [(txn_id, TxnState.OPEN, base_offset, None, None)]
    if kinds is None:
        return events
    for i, kind in enumerate(kinds):
        if kind == RecordKind.COMMIT:
            tag, marker = decode_commit(values(i))
            events.append((txn_id, TxnState.COMMITTED, base_offset + i, tag, marker))
        elif kind == RecordKind.ABORT:
            events.append((txn_id, TxnState.ABORTED, base_offset + i, None, None))
    return events


# -- transactional producers (DESIGN 6) -------------------------------------------------
#
# A producer names a transactional id that is stable across its restarts. Starting one
# (Log.init_producer) writes, in one commit under the partition's lock: an ABORT for
# every open transaction that an earlier producer with the id began, then a committed
# fence: a PRODUCER record (value: the id) under a fresh transaction, committed with the
# reserved tag `producer_tag(id)` and the fence's own offset as its marker. That offset
# is the producer's epoch. The epochs are therefore in the log itself, derived like any
# commit (cached by the index, checked against the record, found by a walk when the
# index cannot say), and they only grow. A transaction the producer begins
# (Log.begin_txn) opens with a BEGIN record naming the id and epoch, so the next
# producer with the id can tell which open transactions are its predecessors'. A begin
# or commit whose epoch is not the id's latest is refused (ProducerFenced), and so is an
# append to a transaction that is no longer open.

PRODUCER_TAG_PREFIX = "streamlog.producer/"
_EPOCH = struct.Struct("<q")
TRANSACTIONAL_ID_BYTES_MAX = 255


def check_transactional_id(transactional_id) -> str:
    """The id, or InvalidArgument (a non-empty str of at most 255 UTF-8 bytes)."""
    from .errors import InvalidArgument
    if not isinstance(transactional_id, str) or not transactional_id or (
            len(transactional_id.encode()) > TRANSACTIONAL_ID_BYTES_MAX):
        raise InvalidArgument(f"transactional_id must be a non-empty str of at most "
                              f"{TRANSACTIONAL_ID_BYTES_MAX} UTF-8 bytes "
                              f"(got {transactional_id!r})")
    return transactional_id


def producer_tag(transactional_id: str) -> str:
    """The commit tag under which a producer's fences are committed."""
    return PRODUCER_TAG_PREFIX + transactional_id


def encode_epoch(epoch: int) -> bytes:
    return _EPOCH.pack(epoch)


def decode_epoch(marker: bytes | None) -> int | None:
    if marker is None or len(marker) != _EPOCH.size:
        return None
    return _EPOCH.unpack(marker)[0]


def encode_begin(transactional_id: str, epoch: int) -> bytes:
    return _EPOCH.pack(epoch) + transactional_id.encode()


def decode_begin(value: bytes) -> tuple[str, int] | None:
    """(transactional id, epoch) of a BEGIN record's value; None if it is not one."""
    if len(value) <= _EPOCH.size:
        return None
    return bytes(value[_EPOCH.size:]).decode(errors="replace"), _EPOCH.unpack_from(value)[0]
