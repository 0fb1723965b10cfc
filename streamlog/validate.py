"""Checks of what callers append, shared by the local log and the daemon client.

Strategy: each function takes one column (or one item) and either returns it in the
form the writer wants or raises InvalidAppend with a sentence naming the record. Plain
functions, no I/O, so both the log (append.py) and `wire/client.py` give the same errors.
"""

from __future__ import annotations

import numbers

from . import layout
from .errors import InvalidAppend, InvalidArgument, InvalidStreamName
from .records import RecordKind

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
BYTES_TYPES = (bytes, bytearray, memoryview)
NULLABLE_TYPES = {bytes, type(None)}  # of keys, values and header values
KIND_VALUES = frozenset(int(kind) for kind in RecordKind if kind.appendable)


def column(column, n: int, name: str):
    if isinstance(column, (*BYTES_TYPES, str)) or not hasattr(column, "__len__"):
        raise InvalidAppend(f"{name} must be a list with one item per record")
    if len(column) != n:
        raise InvalidAppend(f"{name} has {len(column)} items for {n} values")
    return column


def as_bytes_or_none(item, what: str, row: int) -> bytes | None:
    """A value or header value: bytes, or None (a tombstone, DESIGN 1)."""
    return None if item is None else as_bytes(item, what, row)


def as_bytes(item, what: str, row: int) -> bytes:
    if type(item) is bytes:
        return item
    if isinstance(item, BYTES_TYPES):
        return bytes(item)
    hint = " (encode text first, e.g. s.encode())" if isinstance(item, str) else ""
    raise InvalidAppend(f"{what} of record {row} must be bytes, not "
                        f"{type(item).__name__}{hint}")


def timestamp(value, row: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidAppend(f"timestamp of record {row} must be an int of microseconds "
                            f"since the epoch (got {type(value).__name__})")
    value = int(value)
    if not INT64_MIN < value <= INT64_MAX:
        raise InvalidAppend(f"timestamp of record {row} is out of the int64 range")
    return value


def record_headers(headers, row: int):
    if headers is None or headers == ():
        return ()
    items = headers.items() if isinstance(headers, dict) else headers
    out = []
    try:
        for name, value in items:
            if not isinstance(name, str):
                raise TypeError
            out.append((name, as_bytes_or_none(value, "header value", row)))
    except (TypeError, ValueError):
        raise InvalidAppend(f"headers of record {row} must be (str, bytes or None) "
                            f"pairs") from None
    if len(out) >= 1 << 16:
        raise InvalidAppend(f"record {row} has {len(out)} headers; at most 65535")
    for name, value in out:
        try:
            encoded = name.encode()
        except UnicodeEncodeError:
            raise InvalidAppend(f"header name of record {row} is not valid UTF-8") from None
        if len(encoded) >= 1 << 16 or len_or_zero(value) >= 1 << 32:
            raise InvalidAppend(f"header {name[:40]!r} of record {row} is too long "
                                f"(names < 64 KiB, values < 4 GiB)")
    return tuple(out)


def not_bool(kind):
    if isinstance(kind, bool):
        raise TypeError(f"{kind!r} is not a RecordKind")
    return kind


def len_or_zero(item) -> int:
    return 0 if item is None else len(item)


def records(values, keys, timestamps_us, headers, kinds):
    """Check and normalise one append's columns; returns (values, keys, timestamps,
    headers, kinds) with timestamps None when the caller gave none. A value may be None
    (a tombstone) in a data record. Fast paths keep this off the profile:
    set(map(type, ...)) checks a column at C speed, and the per-item loops (which name
    the bad record) run only when that fails."""
    if isinstance(values, (*BYTES_TYPES, str)) or not hasattr(values, "__len__"):
        raise InvalidAppend("values must be a list of bytes (one item per record)")
    n = len(values)
    if n == 0:
        raise InvalidAppend("nothing to append: values is empty")
    if not set(map(type, values)) <= NULLABLE_TYPES:
        values = [as_bytes_or_none(v, "value", i) for i, v in enumerate(values)]
    if keys is None:
        keys = [None] * n
    else:
        keys = column(keys, n, "keys")
        if not set(map(type, keys)) <= NULLABLE_TYPES:
            keys = [None if k is None else as_bytes(k, "key", i) for i, k in enumerate(keys)]
    timestamps = None
    if timestamps_us is not None:
        timestamps = column(timestamps_us, n, "timestamps_us")
        if set(map(type, timestamps)) != {int} or (
                min(timestamps) <= INT64_MIN or max(timestamps) > INT64_MAX):
            timestamps = [timestamp(t, i) for i, t in enumerate(timestamps)]
    if headers is not None:
        headers = [record_headers(h, i) for i, h in enumerate(column(headers, n, "headers"))]
    if kinds is not None:
        kinds = record_kinds(column(kinds, n, "kinds"))
        no_null_markers(values, kinds)
    return values, keys, timestamps, headers, kinds


def record_kinds(kinds) -> list[int]:
    if set(kinds) <= KIND_VALUES and bool not in set(map(type, kinds)):
        return list(map(int, kinds))  # RecordKind members hash and compare as their ints
    try:
        out = [RecordKind(not_bool(k)) for k in kinds]
    except (ValueError, TypeError) as error:
        raise InvalidAppend(f"bad record kind: {error}") from None
    for kind in out:
        if not kind.appendable:
            raise InvalidAppend(f"records of kind {kind.name} are written by init_producer "
                                f"and begin_txn only")
    return list(map(int, out))


def no_null_markers(values, kinds) -> None:
    """InvalidAppend naming the first control record whose value is None: a marker, a
    footprint or a checkpoint note is read for its value; only data may be a tombstone."""
    if None not in values:
        return
    for row, (value, kind) in enumerate(zip(values, kinds)):
        if value is None and kind != RecordKind.DATA:
            raise InvalidAppend(f"value of record {row} is None in a {RecordKind(kind).name} "
                                f"record; only data records may have a None value")


def stream_name(name) -> str:
    """`name` when it follows Kafka's topic rule (DESIGN 1), else InvalidStreamName."""
    if not layout.valid_stream_name(name):
        raise InvalidStreamName(
            f"invalid stream name {name!r}: 1 to 249 of letters, digits, '.', '_' and "
            f"'-', not '.' or '..'")
    return name


def partition_count(partitions, most: int) -> int:
    """`partitions` when it is an int in 1..`most`, else InvalidArgument."""
    if isinstance(partitions, bool) or not isinstance(partitions, int) or not (
            1 <= partitions <= most):
        raise InvalidArgument(f"partitions must be an int in 1..{most} (got {partitions!r})")
    return partitions
