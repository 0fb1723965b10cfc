"""What a user of the window operator writes and picks (windows.py runs it): the window
assigners Tumbling, Hopping and Sliding, the WindowFunction protocol with the records and
windows it sees, and ready functions (CountRecords, SumInt64, TopN, CollectOffsets).

Strategy: plain, frozen values checked when built, so a bad argument fails where it is
written, with InvalidArgument, not deep inside a running operator. A window function's
state is any value its codec can serialise (MessagePack by default: numbers, strings,
bytes, lists, tuples, dicts); `absorb` may change the state in place and return it.

Window assignment (sizes in records for by="count", in microseconds of event time for
by="time"; time windows are aligned to the epoch, as Azure's):

- `Tumbling(size)`: by count, a key's records 0..size-1, size..2*size-1, ...; by time,
  [k*size, (k+1)*size).
- `Hopping(size=, hop=)`: windows of `size` that start every `hop` (1 <= hop <= size),
  so a record belongs to about size/hop windows. By count, a key's window j holds its
  records j*hop .. j*hop+size-1 (only whole windows are emitted); by time,
  [k*hop, k*hop+size).
- `Sliding(size)`: output only when a window's content changes (an event enters or
  leaves), every window holding at least one event. By count, every record of a key
  enters its window (and, once it is full, pushes the oldest out), so each record emits
  the window of the key's last min(n, size) records. By time, a key's change points are
  each accepted event's timestamp t (it enters) and t + size (it leaves); the window at
  change point T holds the key's events with T - size < timestamp <= T, reported as
  [T - size + 1, T + 1), and is emitted, when not empty, once the high-water mark
  passes T.

Time: the high-water mark is the running max input timestamp (DESIGN 5). A time window
[start, end) closes when the high-water mark reaches `end`; a record whose window has
closed is late for it. Tumbling and hopping: a record is dropped from the windows that
have closed and absorbed by the others; one that fits none is dropped and counted
(`stats.late_records`). Sliding by time: an event is late (dropped, counted) when
timestamp + size <= high-water mark; an older event that is not late is absorbed by the
change points still open, and its own entry point, already passed, is not emitted.

Thread-safety: every object here is immutable or stateless; share them freely.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any, NamedTuple, Protocol

from ..errors import InvalidArgument

# Bounds (house style: a limit on everything).
WINDOWS_PER_RECORD_MAX = 1 << 10  # hopping: size / hop
SLIDING_RECORDS_MAX = 1 << 12  # sliding by count: size (each result folds the window)
SLIDING_EVENTS_MAX = 1 << 16  # sliding by time: events one key's buffer may hold
_INT64 = struct.Struct("<q")


class Window(NamedTuple):
    """A window's bounds, [start, end): event time in microseconds (by="time"), or input
    offsets (by="count": the first record's offset, the last one's + 1; `end` is None
    in `open` while a count window's last record is not known yet)."""

    start: int
    end: int | None


class WindowInput(NamedTuple):
    """An input record as `absorb` sees it."""

    offset: int
    timestamp_us: int
    key: bytes
    value: bytes


class WindowFunction(Protocol):
    """What a window computes. `open(key, window)` returns a window's first state;
    `absorb(state, record)` returns it with the record added (it may change `state` in
    place); `close(state, key, window)` returns the result, written as it is when it is
    bytes, else through the operator's codec. All three must be deterministic. For
    sliding windows the operator runs open, absorb over the window's records in input
    order, and close, once per result; it saves the records, not the state."""

    def open(self, key: bytes, window: Window) -> Any: ...

    def absorb(self, state: Any, record: WindowInput) -> Any: ...

    def close(self, state: Any, key: bytes, window: Window) -> Any: ...


# -- window assigners ----------------------------------------------------------------------

def _check_int(name: str, value, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (
            high is not None and value > high):
        bound = f"in {low}..{high}" if high is not None else f">= {low}"
        raise InvalidArgument(f"{name} must be an int {bound} (got {value!r})")


def _check_by(by) -> None:
    if by not in ("count", "time"):
        raise InvalidArgument(f"by must be 'count' (size in records) or 'time' (size in "
                              f"microseconds of event time) (got {by!r})")


@dataclasses.dataclass(frozen=True)
class Tumbling:
    """Windows of `size` records (by="count") or microseconds (by="time") that do not
    overlap (module docstring)."""

    size: int
    by: str = dataclasses.field(kw_only=True)

    def __post_init__(self) -> None:
        _check_by(self.by)
        _check_int("size", self.size, 1)

    @property
    def hop(self) -> int:
        return self.size


@dataclasses.dataclass(frozen=True, kw_only=True)
class Hopping:
    """Windows of `size` starting every `hop` (1 <= hop <= size, size / hop at most
    WINDOWS_PER_RECORD_MAX), by "count" or "time" (module docstring)."""

    size: int
    hop: int
    by: str

    def __post_init__(self) -> None:
        _check_by(self.by)
        _check_int("size", self.size, 1)
        _check_int("hop", self.hop, 1, self.size)
        if -(-self.size // self.hop) > WINDOWS_PER_RECORD_MAX:
            raise InvalidArgument(f"size / hop is {-(-self.size // self.hop)}: a record would "
                                  f"belong to more than {WINDOWS_PER_RECORD_MAX} windows")


@dataclasses.dataclass(frozen=True)
class Sliding:
    """Windows emitted when their content changes (module docstring); by="count" keeps
    at most SLIDING_RECORDS_MAX records."""

    size: int
    by: str = dataclasses.field(kw_only=True)

    def __post_init__(self) -> None:
        _check_by(self.by)
        _check_int("size", self.size, 1, SLIDING_RECORDS_MAX if self.by == "count" else None)

    @property
    def hop(self) -> None:
        return None


# -- ready window functions ------------------------------------------------------------------

class CountRecords:
    """The number of records in the window (an int)."""

    def open(self, key, window):
        return 0

    def absorb(self, state, record):
        return state + 1

    def close(self, state, key, window):
        return state


def _int64_at(record: WindowInput, field_offset: int) -> int:
    if len(record.value) < field_offset + 8:
        raise InvalidArgument(f"input offset {record.offset}: a {len(record.value)}-byte value "
                              f"has no int64 at byte {field_offset}")
    return _INT64.unpack_from(record.value, field_offset)[0]


class SumInt64:
    """The sum of the little-endian int64 at byte `field_offset` of each value."""

    def __init__(self, field_offset: int = 0) -> None:
        _check_int("field_offset", field_offset, 0)
        self.field_offset = field_offset

    def open(self, key, window):
        return 0

    def absorb(self, state, record):
        return state + _int64_at(record, self.field_offset)

    def close(self, state, key, window):
        return state


class TopN:
    """The `n` largest int64 fields (as SumInt64) with their input offsets: a list of
    [value, offset], largest first, the older record first among equals."""

    def __init__(self, n: int, field_offset: int = 0) -> None:
        _check_int("n", n, 1, 1 << 16)
        _check_int("field_offset", field_offset, 0)
        self.n, self.field_offset = n, field_offset

    def open(self, key, window):
        return []

    def absorb(self, state, record):
        state.append([_int64_at(record, self.field_offset), record.offset])
        state.sort(key=lambda pair: (-pair[0], pair[1]))
        del state[self.n:]
        return state

    def close(self, state, key, window):
        return state


class CollectOffsets:
    """The input offsets of the window's records, in the order absorbed: shows exactly
    which records a window holds (tests, examples). At most `records_max` per window."""

    def __init__(self, records_max: int = 1 << 16) -> None:
        _check_int("records_max", records_max, 1)
        self.records_max = records_max

    def open(self, key, window):
        return []

    def absorb(self, state, record):
        if len(state) >= self.records_max:
            raise InvalidArgument(f"a window holds more than {self.records_max} records")
        state.append(record.offset)
        return state

    def close(self, state, key, window):
        return state
