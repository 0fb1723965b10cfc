"""Kafka RecordBatch v2 (magic 2): the layout, its constants and the decoded types.

Strategy: this module holds what both directions share and nothing that walks bytes:
record_decoding.py decodes what producers send (and checks it), record_encoding.py
encodes what consumers get. All three are pure functions and values over bytes, no I/O.
A batch is laid out as Kafka's DefaultRecordBatch documents it:

    base_offset int64 | batch_length int32 | partition_leader_epoch int32 | magic int8
    | crc uint32 | attributes int16 | last_offset_delta int32 | base_timestamp int64
    | max_timestamp int64 | producer_id int64 | producer_epoch int16
    | base_sequence int32 | record_count int32 | records...

`batch_length` counts the bytes after itself; the CRC (CRC32C, Castagnoli) covers
everything from `attributes` to the end, so that the broker may rewrite base_offset
and partition_leader_epoch without recomputing it. Attributes: bits 0-2 the
compression (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd), bit 3 the timestamp type, bit 4
transactional, bit 5 control. A record is a varint length, then attributes int8,
timestamp delta (varlong), offset delta (varint), key and value (varint length, -1 for
null, then bytes) and headers (varint count, each a varint-length key and value).

Errors: `BatchError(code, message)` with the Kafka error code the Produce response
carries: CORRUPT_MESSAGE for a bad CRC, a short batch or a malformed record,
UNSUPPORTED_FOR_MESSAGE_FORMAT for magic 0 and 1, UNSUPPORTED_COMPRESSION_TYPE for a
codec number Kafka does not define.
"""

from __future__ import annotations

import dataclasses
import struct

import numpy as np

from .errors import ErrorCode

HEADER = struct.Struct(">qiibIhiqqqhii")  # through record_count: 61 bytes
HEADER_BYTES = HEADER.size
CRC_START = 21  # attributes begins here; the CRC covers [21, end)
LENGTH_PREFIX_BYTES = 12  # base_offset + batch_length

COMPRESSION_MASK = 0x07
TIMESTAMP_LOG_APPEND = 0x08
TRANSACTIONAL = 0x10
CONTROL = 0x20

NONE, GZIP, SNAPPY, LZ4, ZSTD = range(5)
CODEC_NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}


class BatchError(ValueError):
    """A batch that cannot be taken; `code` is the Kafka error code to answer with."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclasses.dataclass(frozen=True, slots=True)
class KafkaRecord:
    """One record as Kafka sees it: timestamp in milliseconds, headers as (str, bytes)
    pairs (a null header value or record value is given as None)."""

    offset_delta: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Batch:
    """One decoded batch: the header fields a broker acts on, and its records as
    parallel columns (what an append takes): Python lists, or, from
    `record_decoding.decode_batches(as_arrays=True)` when no record has headers, Arrow
    arrays in `arrays` ({"value", "key", "timestamp" (ms)}; a null key or value is an
    Arrow null) and the lists None. `records` gives them one by one either way."""

    base_offset: int
    attributes: int
    last_offset_delta: int
    base_timestamp_ms: int
    max_timestamp_ms: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    count: int
    offset_deltas: list[int] | None
    timestamps_ms: list[int] | None
    keys: list[bytes | None] | None
    values: list[bytes | None] | None
    headers: list[tuple] | None  # None: no record has headers
    arrays: dict | None = None

    def __len__(self) -> int:
        return self.count

    @property
    def records(self) -> tuple[KafkaRecord, ...]:
        if self.arrays is not None:
            arrays = self.arrays
            return tuple(map(KafkaRecord, arrays["offset_delta"].to_pylist(),
                             arrays["timestamp"].to_pylist(), arrays["key"].to_pylist(),
                             arrays["value"].to_pylist(), [()] * self.count))
        headers = self.headers or [()] * len(self)
        return tuple(map(KafkaRecord, self.offset_deltas, self.timestamps_ms, self.keys,
                         self.values, headers))

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL)



# -- shared by the NumPy paths of both directions -----------------------------------------

def share_mask(position: np.ndarray, lengths: np.ndarray, size: int) -> np.ndarray:
    """A bool per byte of a `size`-byte buffer, True in each record's share (`lengths[i]`
    bytes from `position[i]`, in order). The mask is alternating runs (gap, share, gap,
    share, ..., gap) made by one np.repeat: a byte per buffer byte, where an index per
    selected byte costs eight. ValueError when shares overlap or run past the end.

    Args:
        position: where each share starts, ascending (int64).
        lengths: each share's byte count (int64, none negative).
        size: the buffer's length in bytes.
    """
    ends = position + lengths
    runs = np.empty(2 * len(lengths) + 1, dtype=np.int64)
    runs[1:-1:2] = lengths
    runs[0] = position[0]
    runs[2:-1:2] = position[1:] - ends[:-1]
    runs[-1] = size - ends[-1]
    if (runs < 0).any():
        raise ValueError("keys or values overlap")
    pattern = np.zeros(len(runs), dtype=np.bool_)
    pattern[1::2] = True
    return np.repeat(pattern, runs)
