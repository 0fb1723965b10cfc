"""The byte layouts of the windowed aggregate operator (aggregate.py): the value of every
record it writes, the typed reader of its results, and its CRB checkpoint state.

Strategy: one fixed-size value, `WINDOW_RECORD`, serves the results (`R`, DATA records)
and the footprints (`G_OPEN` / `G_CHECK`, control records a data reader never sees): the
input offset being processed, `N` (open windows after this record was produced), the
operator's high-water mark, and the window's state. A fixed size lets the recovery walk
(aggregate_recovery.py) decode a whole batch of footprints at once as a NumPy record
array (`FOOTPRINT_DTYPE`), and lets `read_aggregate_results` refuse anything else. An open
window (`Window`) packs itself into that layout. The CRB state is a header (magic,
version, high-water mark, last offset, window count) then, per open window, its key
length, fields and key.

Thread-safety: pure functions and values; `read_aggregate_results` reads a log the
caller owns.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np

from ..errors import CorruptionError

# Value of every output record: in_offset, n_open, hwm_us, first_offset, last_offset,
# start_us, end_us, count, sum, min, max (int64) and avg (float64), little-endian.
WINDOW_RECORD = struct.Struct("<qqqqqqqqqqqd")
assert WINDOW_RECORD.size == 96
_STATE_HEADER = struct.Struct("<4sHqqI")  # magic, version, hwm_us, last_offset, windows
_STATE_WINDOW = struct.Struct("<Iqqqqqqqq")  # key length, first, last, start, end, count,
#                                              sum, min, max
_STATE_MAGIC = b"AGG1"


class WindowRecord(NamedTuple):
    in_offset: int
    n_open: int
    hwm_us: int
    first_offset: int
    last_offset: int
    start_us: int
    end_us: int
    count: int
    sum: int
    min: int
    max: int
    avg: float


# The value layout of WINDOW_RECORD as a NumPy record, to decode footprints in bulk.
FOOTPRINT_DTYPE = np.dtype([(name, "<f8" if name == "avg" else "<i8")
                            for name in WindowRecord._fields])
assert FOOTPRINT_DTYPE.itemsize == WINDOW_RECORD.size


def decode_window_record(value: bytes) -> WindowRecord:
    """Decode an output value. Raises CorruptionError for a value of the wrong size."""
    if len(value) != WINDOW_RECORD.size:
        raise CorruptionError(f"not an aggregate output record ({len(value)} bytes)")
    return WindowRecord(*WINDOW_RECORD.unpack(value))


class AggregateResult(NamedTuple):
    """One closed window's aggregate, as `read_aggregate_results` yields it. `start_us`
    and `end_us`: the window's bounds (time windows) or its first and last record's
    timestamps (count windows); `first_offset` / `last_offset`: the input offsets of its
    first and last record; `offset` / `timestamp_us`: the result's place in the output."""

    key: bytes | None
    start_us: int
    end_us: int
    count: int
    sum: int
    min: int
    max: int
    avg: float
    first_offset: int
    last_offset: int
    offset: int
    timestamp_us: int


def read_aggregate_results(log, stream: str, partition: int = 0, *, from_offset=None,
                           to_offset=None, follow: bool = False):
    """The results of an AggregateOperator's output, typed (footprints and position
    notes are control records and never appear). Raises CorruptionError for a record
    that is not an aggregate result."""
    reader = log.reader(stream, partition, from_offset=from_offset, to_offset=to_offset,
                        follow=follow)
    try:
        for record in reader:
            r = decode_window_record(record.value)
            yield AggregateResult(record.key, r.start_us, r.end_us, r.count, r.sum, r.min,
                                  r.max, r.avg, r.first_offset, r.last_offset, record.offset,
                                  record.timestamp_us)
    finally:
        reader.close()


class Window:
    """One open window. fp_in / fp_out: input and output offsets of its newest
    footprint (CEC); start_us / end_us: first and last record time (count windows) or
    the window bounds (time windows)."""

    __slots__ = ("first_offset", "last_offset", "start_us", "end_us", "count", "total",
                 "low", "high", "fp_in", "fp_out")

    def __init__(self, first_offset, last_offset, start_us, end_us, count, total, low, high,
                 fp_in=-1, fp_out=-1) -> None:
        self.first_offset, self.last_offset = first_offset, last_offset
        self.start_us, self.end_us = start_us, end_us
        self.count, self.total, self.low, self.high = count, total, low, high
        self.fp_in, self.fp_out = fp_in, fp_out

    def record(self, in_offset: int, n_open: int, hwm_us: int) -> bytes:
        return WINDOW_RECORD.pack(in_offset, n_open, hwm_us, self.first_offset,
                                  self.last_offset, self.start_us, self.end_us, self.count,
                                  self.total, self.low, self.high, self.total / self.count)


# -- the CRB state ----------------------------------------------------------------------

def encode_state(windows: dict[bytes, Window], *, hwm_us: int, last_offset: int) -> bytes:
    """Every open window, the high-water mark and the last offset (module docstring)."""
    parts = [_STATE_HEADER.pack(_STATE_MAGIC, 1, hwm_us, last_offset, len(windows))]
    pack = _STATE_WINDOW.pack
    for key, w in windows.items():
        parts.append(pack(len(key), w.first_offset, w.last_offset, w.start_us, w.end_us,
                          w.count, w.total, w.low, w.high))
        parts.append(key)
    return b"".join(parts)


def decode_state_header(data: bytes) -> tuple[int, int, int]:
    """(hwm_us, last_offset, window count) of a CRB state.

    Raises:
        CorruptionError: too short, or not a state this operator wrote.
    """
    if len(data) < _STATE_HEADER.size:
        raise CorruptionError("aggregate checkpoint state too short")
    magic, version, hwm, last_offset, count = _STATE_HEADER.unpack_from(data, 0)
    if magic != _STATE_MAGIC or version != 1:
        raise CorruptionError("not an aggregate checkpoint state")
    return hwm, last_offset, count


def decode_state_windows(data: bytes, count: int, into: dict[bytes, Window]) -> None:
    """Add the `count` windows of a CRB state (after its header) to `into`, in order.

    Raises:
        CorruptionError: the state is truncated or has trailing bytes.
    """
    position = _STATE_HEADER.size
    try:
        for _ in range(count):
            key_bytes, *fields = _STATE_WINDOW.unpack_from(data, position)
            position += _STATE_WINDOW.size
            key = bytes(data[position:position + key_bytes])
            position += key_bytes
            into[key] = Window(*fields)
    except struct.error:
        raise CorruptionError("aggregate checkpoint state truncated") from None
    if position != len(data):
        raise CorruptionError("aggregate checkpoint state has trailing bytes")
