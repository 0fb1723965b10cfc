"""Records as callers see them.

Strategy: immutable values. `Record` is a NamedTuple: a replay builds one per record
from columns with C-level map/zip (payload.columns_to_records), several times faster
than a frozen dataclass, whose __init__ sets each field through object.__setattr__.
`RecordKind`
values are stored on disk, one byte per record: add kinds, never renumber them.
Control kinds share the offset sequence with data (the CEC paper needs footprints
interleaved with results) and are filtered out for readers that asked for data only.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

# What the log counts per record on top of its key and value bytes when it sizes frames,
# buffers and bounds (the payload's per-record columns: timestamp, lengths, kind). One
# constant for every path that cuts or buffers records.
RECORD_OVERHEAD_BYTES = 24


class RecordKind(enum.IntEnum):
    DATA = 0
    COMMIT = 1  # transaction commit marker; value = tag and marker (txn.encode_commit)
    ABORT = 2  # transaction abort marker; value empty
    G_OPEN = 3  # CEC footprint written when a window opens
    G_CHECK = 4  # CEC footprint written for a slow window
    CHECKPOINT = 5  # operator checkpoint note (CRB)
    PRODUCER = 6  # a transactional producer's fence; value = its transactional id (txn.py)
    BEGIN = 7  # opens a transactional producer's transaction; value = txn.encode_begin

    @property
    def appendable(self) -> bool:
        """False for the kinds only the log writes (init_producer, begin_txn): a forged
        fence or BEGIN could otherwise abort or fence another producer."""
        return self not in (RecordKind.PRODUCER, RecordKind.BEGIN)

    @property
    def is_control(self) -> bool:
        return self is not RecordKind.DATA


class Record(NamedTuple):
    """One record of a partition (immutable; `_replace` makes a changed copy).

    `timestamp_us` is microseconds since the epoch (event time, or append time when the
    producer gave none). `key` is None when absent. `value` is None for a tombstone,
    which is not b"" (DESIGN 1); a record's size counts a None value as 0 bytes.
    `headers` is a tuple of (name, value) pairs, empty when absent; a header value
    may be None too.
    """

    partition: int
    offset: int
    timestamp_us: int
    key: bytes | None
    value: bytes | None
    kind: RecordKind = RecordKind.DATA
    headers: tuple[tuple[str, bytes | None], ...] = ()
    txn_id: int = 0


class RecordPosition(NamedTuple):
    """Where an appended record landed."""

    partition: int
    offset: int


class AppendResult(NamedTuple):
    """Where a batch landed: per partition, the first and last offset it took."""

    ranges: dict[int, tuple[int, int]]
    records: int
