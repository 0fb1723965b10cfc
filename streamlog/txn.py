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
    while True:
        txn_id = int.from_bytes(os.urandom(8), "big")
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
