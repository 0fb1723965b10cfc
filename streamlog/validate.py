"""Checks of what callers append, shared by the local log and the daemon client.

Strategy: each function takes one column (or one item) and either returns it in the
form the writer wants or raises InvalidAppend with a sentence naming the record. Plain
functions, no I/O, so both `log.py` and `wire/client.py` give the same errors.
"""

from __future__ import annotations

import numbers

from .errors import InvalidAppend
from .records import RecordKind

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
BYTES_TYPES = (bytes, bytearray, memoryview)
KEY_TYPES = {bytes, type(None)}
KIND_VALUES = frozenset(int(kind) for kind in RecordKind)


def column(column, n: int, name: str):
    if isinstance(column, (*BYTES_TYPES, str)) or not hasattr(column, "__len__"):
        raise InvalidAppend(f"{name} must be a list with one item per record")
    if len(column) != n:
        raise InvalidAppend(f"{name} has {len(column)} items for {n} values")
    return column


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


def headers(headers, row: int):
    if headers is None or headers == ():
        return ()
    items = headers.items() if isinstance(headers, dict) else headers
    out = []
    try:
        for name, value in items:
            if not isinstance(name, str):
                raise TypeError
            out.append((name, as_bytes(value, "header value", row)))
    except (TypeError, ValueError):
        raise InvalidAppend(f"headers of record {row} must be (str, bytes) pairs") from None
    if len(out) >= 1 << 16:
        raise InvalidAppend(f"record {row} has {len(out)} headers; at most 65535")
    for name, value in out:
        try:
            encoded = name.encode()
        except UnicodeEncodeError:
            raise InvalidAppend(f"header name of record {row} is not valid UTF-8") from None
        if len(encoded) >= 1 << 16 or len(value) >= 1 << 32:
            raise InvalidAppend(f"header {name[:40]!r} of record {row} is too long "
                                f"(names < 64 KiB, values < 4 GiB)")
    return tuple(out)


def not_bool(kind):
    if isinstance(kind, bool):
        raise TypeError(f"{kind!r} is not a RecordKind")
    return kind


def len_or_zero(item) -> int:
    return 0 if item is None else len(item)
