"""The index's stored format: its tables, keys and checksummed values, and the entries
they hold.

Strategy: five named databases in one environment per partition (index.py uses them,
index_storage.py keeps them).

    offsets  key u64 BE base_offset       -> IndexEntry (one entry per batch frame)
    times    key u64 BE (hwm + 2**63)     -> u64 BE base_offset of the first batch whose
                                             running-max timestamp reaches that hwm; an
                                             entry is added only when the running max grows
    meta     key ascii                    -> value bytes (format, recovery point, last
                                             commit marker per tag as "commit:TAG")
    txns     key u64 BE txn_id            -> u8 state + u64 first offset + u64 marker
                                             offset (txn.py)
    open     key u64 BE txn_id            -> u64 first offset, for transactions still open

Big-endian fixed-width keys make byte order numeric order, so `set_range` is a seek.
Every stored value ends with an xxh3_64 of its key and value (`checksummed`), so a
flipped bit in a key or a value reads as damage (`checked` raises CorruptIndex), never
as a different answer. An index written by an older FORMAT has no checksums and is
rebuilt. Pure: bytes in, values out.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import xxhash

from .errors import CorruptIndex
# Stands for "no record yet" where a running max must be an int (the recovery point).
from .payload import NO_TIME as NO_HWM  # noqa: F401 - the index speaks of NO_HWM

DATABASES = (b"offsets", b"times", b"meta", b"txns", b"open")
KEY = struct.Struct(">Q")
ENTRY = struct.Struct("<QQIIqqq")
RECOVERY = struct.Struct("<QQQq")
TXN = struct.Struct("<BQQ")  # state, first data offset, marker offset (0: none)
_HWM_BIAS = 1 << 63
assert ENTRY.size == 48
assert RECOVERY.size == 32
_SUM = struct.Struct("<Q")
_KEY_BYTES_MAX = 511  # LMDB's own limit
_VALUE_BYTES_MAX = 4096  # meta values (commit markers) are small
FORMAT = b"4"  # 2: every value carries a checksum of its key and value;
#                3: a commit marker is stored with its offset;
#                4: control records never move the high-water mark (time keys rebuilt)


def checksummed(key: bytes, value: bytes) -> bytes:
    """A stored value: the value, then xxh3_64 of key and value."""
    return value + _SUM.pack(xxhash.xxh3_64_intdigest(key + value))


def checked(key, stored, size: int | None = None) -> bytes:
    """The value of a stored value, checked; raises CorruptIndex when damaged.

    `key` and `stored` may be LMDB buffers (views of the map): their lengths are checked
    before a byte is copied, since a damaged length can reach past the end of the file
    (reading there is SIGBUS, not an exception)."""
    limit = _VALUE_BYTES_MAX if size is None else size + _SUM.size
    if len(key) > _KEY_BYTES_MAX or not _SUM.size <= len(stored) <= limit or (
            size is not None and len(stored) != limit):
        raise CorruptIndex("an index key or value has a wrong length")
    key, stored = bytes(key), bytes(stored)
    value = stored[:-_SUM.size]
    if _SUM.unpack(stored[-_SUM.size:])[0] != xxhash.xxh3_64_intdigest(key + value):
        raise CorruptIndex(f"index value of key {key.hex()} fails its checksum")
    return value


class IndexEntry(NamedTuple):
    """One batch frame: where it is, what it holds, and the running max after it."""

    base_offset: int
    segment_base: int
    position: int
    record_count: int
    frame_bytes: int
    min_timestamp_us: int
    max_timestamp_us: int
    hwm_after_us: int  # running max timestamp of the partition after this batch

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.record_count


class RecoveryPoint(NamedTuple):
    """Everything before (segment_base, position) was fsynced and indexed."""

    segment_base: int
    position: int
    next_offset: int
    hwm_us: int


def time_key(hwm_us: int) -> bytes:
    return KEY.pack(hwm_us + _HWM_BIAS)


def time_value(key: bytes, stored) -> int:
    return KEY.unpack(checked(key, stored, KEY.size))[0]


def entry_item(entry: IndexEntry) -> tuple[bytes, bytes]:
    key = KEY.pack(entry.base_offset)
    return key, checksummed(key, ENTRY.pack(*entry[1:]))


def decode_entry(key: bytes, stored) -> IndexEntry:
    (base_offset,) = KEY.unpack(key)
    entry = IndexEntry(base_offset, *ENTRY.unpack(checked(key, stored, ENTRY.size)))
    if entry.record_count < 1 or entry.frame_bytes < 1 or entry.position < 0:
        raise CorruptIndex(f"index entry for offset {base_offset} is impossible")
    return entry
