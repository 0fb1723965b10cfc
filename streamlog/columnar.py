"""Columnar appends: Arrow or NumPy columns in, frame-sized payload pieces out, with no
Python loop per record.

Strategy: `rows_from` turns what the caller gave (a pyarrow RecordBatch or Table, or a
dict of Arrow / NumPy arrays) into `Rows`: one Arrow binary array of values, an optional
nullable one of keys, and int64 microsecond timestamps (None: the log stamps the append
time, as append_batch does). Every check is a whole-column NumPy expression; when one
fails, `np.flatnonzero` finds the first bad row and the error names it, with the same
sentences as validate.py. `encode` then reads the Arrow buffers directly: lengths are
differences of the offsets, a piece's values blob is the data buffer between its first
and last offset, and a null key or value has length -1, which is the payload layout
(payload.py) already. Pieces are cut by a cumulative sum of record sizes and
`np.searchsorted`, so the one loop is per frame, not per record, and it cuts exactly
where log._cut would.

The one per-record step left: when keys choose the partition of a multi-partition
stream (no `partition=`), each key is hashed with xxh3 (append.partition_for_key), which
has no vectorised form here; the keys become Python bytes and are hashed with a C-level
`map`. Pass `partition=` (or use a one-partition stream) and nothing is per record.

Column types (anything else raises InvalidAppend naming the column):
  value      Arrow binary, large_binary, string, large_string, fixed_size_binary,
             binary_view or string_view (text is stored as its UTF-8 bytes and read back
             as binary); an Arrow null is a None value, a tombstone (an empty value is
             b""); or a NumPy bytes array, dtype 'S<n>', whose items follow NumPy's own
             rule: trailing NUL bytes are not part of an item (what `array[i]` returns
             is what is stored), and which has no nulls. Values that may end in NUL
             bytes must come as an Arrow array.
  key        the same types; an Arrow null is a record without a key (a NumPy 'S' array
             has no nulls: every record has a key, perhaps empty).
  timestamp  microseconds since the epoch: an Arrow or NumPy integer array, an Arrow
             timestamp array of any unit or a NumPy datetime64 array (W, D, h, m, s, ms,
             us, ns: converted to microseconds; finer units are floored). No nulls.
  headers    only when every row is null (what a reader's arrow(include_headers=True)
             gives for records without headers); records with headers need append_batch.

Pure: no I/O, no clock, no event loop; the log supplies the time and the partitions.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np
import xxhash

# pyarrow is imported by each function that uses it, not here: it costs about 40 MiB
# and a tenth of a second, which a process never given Arrow columns (the daemon, the
# command line) should not pay for.
if TYPE_CHECKING:
    import pyarrow as pa

from .errors import InvalidAppend
from .records import RECORD_OVERHEAD_BYTES
from .payload import EncodedRows
from .validate import INT64_MAX, INT64_MIN

COLUMN_NAMES = ("value", "key", "timestamp", "headers")
# NumPy datetime64 units -> (multiplier, divisor) to microseconds.
_DATETIME_UNITS = {"W": (7 * 86_400_000_000, 1), "D": (86_400_000_000, 1),
                   "h": (3_600_000_000, 1), "m": (60_000_000, 1), "s": (1_000_000, 1),
                   "ms": (1_000, 1), "us": (1, 1), "ns": (1, 1_000),
                   "ps": (1, 1_000_000), "fs": (1, 1_000_000_000),
                   "as": (1, 1_000_000_000_000)}


@dataclasses.dataclass(slots=True)
class Rows:
    """Checked columns of one columnar append: `values` and `keys` are one-chunk Arrow
    binary or large_binary arrays (a null: a None value, no key), `timestamps_us` int64
    (None: not given)."""

    values: pa.Array
    keys: pa.Array | None
    timestamps_us: np.ndarray | None

    def __len__(self) -> int:
        return len(self.values)

    def stamped(self, now_us: int) -> "Rows":
        """These rows with every timestamp `now_us` (the append time)."""
        return Rows(self.values, self.keys, np.full(len(self), now_us, dtype="<i8"))

    def take(self, indices: np.ndarray) -> "Rows":
        """The rows at `indices`, in that order (Arrow's take: no loop per record)."""
        import pyarrow as pa
        chosen = pa.array(indices, type=pa.int64())
        return Rows(self.values.take(chosen),
                    None if self.keys is None else self.keys.take(chosen),
                    None if self.timestamps_us is None else self.timestamps_us[indices])


# -- input: what the caller gave -> Rows ---------------------------------------------------


def rows_from(data, *, record_bytes_max: int) -> Rows:
    """Check and normalise one columnar append (see the module docstring for the types).

    Raises InvalidAppend naming the column (and the first bad record) for a missing
    value column, an unknown column, a wrong type, a null timestamp, a record
    larger than `record_bytes_max` (key + value bytes), a timestamp outside int64
    microseconds, or no rows at all.
    """
    columns = _columns_of(data)
    unknown = sorted(set(columns) - set(COLUMN_NAMES))
    if unknown:
        raise InvalidAppend(f"unknown column(s) {', '.join(map(repr, unknown))}: "
                            f"append_columns takes 'value' and optional 'key' and "
                            f"'timestamp' (select those columns first)")
    if "value" not in columns:
        raise InvalidAppend("append_columns needs a 'value' column (binary or string)")
    if "headers" in columns:
        _check_no_headers(columns["headers"])
    values = _binary_column(columns["value"], "value")
    n = len(values)
    if n == 0:
        raise InvalidAppend("nothing to append: the columns have no rows")
    keys = _binary_column(columns["key"], "key") if "key" in columns else None
    timestamps = (_timestamps(columns["timestamp"]) if "timestamp" in columns else None)
    for name, column in (("key", keys), ("timestamp", timestamps)):
        if column is not None and len(column) != n:
            raise InvalidAppend(f"{name} column has {len(column)} rows for {n} values")
    _check_sizes(values, keys, record_bytes_max)
    return Rows(values, keys, timestamps)


def _columns_of(data) -> dict:
    import pyarrow as pa
    if isinstance(data, (pa.RecordBatch, pa.Table)):
        names = data.schema.names
        if len(set(names)) != len(names):
            raise InvalidAppend(f"duplicate column names in {names}")
        return dict(zip(names, data.columns))
    if isinstance(data, dict):
        if not all(isinstance(name, str) for name in data):
            raise InvalidAppend("column names must be str")
        return dict(data)
    raise InvalidAppend(f"append_columns takes a pyarrow RecordBatch or Table, or a dict "
                        f"of Arrow / NumPy arrays (got {type(data).__name__}); lists of "
                        f"bytes go to append_batch")


def _check_no_headers(column) -> None:
    import pyarrow as pa
    if isinstance(column, np.ndarray) or not isinstance(column, (pa.Array, pa.ChunkedArray)):
        raise InvalidAppend("append_columns does not write headers: append records with "
                            "headers with append_batch(headers=...)")
    if column.null_count != len(column):
        raise InvalidAppend("append_columns does not write headers (some rows have "
                            "them): append records with headers with "
                            "append_batch(headers=...)")


def _one_array(column, name: str) -> pa.Array:
    """An Arrow array (one chunk) of a column given as Array or ChunkedArray."""
    import pyarrow as pa
    if isinstance(column, pa.Array):
        return column
    if isinstance(column, pa.ChunkedArray):
        if column.num_chunks == 1:
            return column.chunk(0)
        if column.num_chunks == 0:
            return pa.array([], type=column.type)
        try:
            return pa.concat_arrays(column.chunks)
        except pa.ArrowInvalid:  # more than 2 GiB of binary data: 64-bit offsets
            return pa.concat_arrays([c.cast(pa.large_binary()) for c in column.chunks])
    raise InvalidAppend(f"{name} column must be an Arrow or NumPy array "
                        f"(got {type(column).__name__})")


def _binary_column(column, name: str) -> pa.Array:
    """A binary or large_binary Array of a value or key column (nulls kept)."""
    import pyarrow as pa
    if isinstance(column, np.ndarray):
        return _binary_from_numpy(column, name)
    array = _one_array(column, name)
    kind = array.type
    if pa.types.is_string(kind):
        return array.view(pa.binary())
    if pa.types.is_large_string(kind):
        return array.view(pa.large_binary())
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return array
    if (pa.types.is_fixed_size_binary(kind) or pa.types.is_binary_view(kind)
            or pa.types.is_string_view(kind)):
        return array.cast(pa.large_binary())
    raise InvalidAppend(f"{name} column must be binary or string (got Arrow type {kind})")


def _binary_from_numpy(array: np.ndarray, name: str) -> pa.Array:
    """A NumPy 'S<n>' array as an Arrow binary array, items as NumPy sees them
    (trailing NUL bytes dropped), gathered with one boolean mask."""
    import pyarrow as pa
    if array.dtype.kind != "S" or array.ndim != 1:
        hint = (" (NumPy str arrays are UTF-32: use an Arrow string array)"
                if array.dtype.kind == "U" else "")
        raise InvalidAppend(f"{name} column must be a 1-D NumPy bytes array, dtype "
                            f"'S<n>', or an Arrow array (got dtype {array.dtype}, "
                            f"{array.ndim}-D){hint}")
    width = array.dtype.itemsize
    lengths = np.char.str_len(array).astype(np.int64) if width else np.zeros(len(array),
                                                                             np.int64)
    offsets = np.zeros(len(array) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    matrix = np.ascontiguousarray(array).view(np.uint8).reshape(len(array), width)
    if (lengths == width).all():
        data = matrix.tobytes()
    else:
        data = matrix[np.arange(width) < lengths[:, None]].tobytes()
    return pa.Array.from_buffers(pa.large_binary(), len(array),
                                 [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _timestamps(column) -> np.ndarray:
    """Microseconds since the epoch as <i8, checked: integers as they are, Arrow
    timestamps and NumPy datetime64 converted by their unit."""
    import pyarrow as pa
    if isinstance(column, np.ndarray):
        raw, kind = column, column.dtype
        if column.ndim != 1:
            raise InvalidAppend(f"timestamp column must be 1-D (got {column.ndim}-D)")
        if kind.kind == "M":
            if np.isnat(column).any():
                row = _first(np.isnat(column))
                raise InvalidAppend(f"timestamp of record {row} is NaT; give every record "
                                    f"a timestamp, or leave the column out")
            unit, count = np.datetime_data(kind)
            raw = column.view("<i8")
            return _scaled(raw, unit, count)
    else:
        array = _one_array(column, "timestamp")
        if array.null_count:
            row = _first(~_valid(array))
            raise InvalidAppend(f"timestamp of record {row} is null; give every record a "
                                f"timestamp, or leave the column out")
        if pa.types.is_timestamp(array.type):
            return _scaled(array.cast(pa.int64()).to_numpy(), array.type.unit, 1)
        raw, kind = array.to_numpy(zero_copy_only=False), array.type
    if raw.dtype.kind not in "iu":
        raise InvalidAppend(f"timestamp column must be integer microseconds since the "
                            f"epoch or a timestamp type (got {kind})")
    return _scaled(raw, "us", 1)


def _scaled(raw: np.ndarray, unit: str, count: int) -> np.ndarray:
    """`raw` integers in `count` x `unit` as checked int64 microseconds."""
    if unit not in _DATETIME_UNITS:
        raise InvalidAppend(f"timestamp unit {unit!r} has no fixed length in microseconds")
    multiplier, divisor = _DATETIME_UNITS[unit]
    multiplier *= count
    if raw.dtype.kind == "u":
        too_big = raw > INT64_MAX
        if too_big.any():
            raise InvalidAppend(f"timestamp of record {_first(too_big)} is out of the "
                                f"int64 range")
    values = raw.astype("<i8")
    if multiplier != 1:
        bound = INT64_MAX // multiplier
        outside = (values > bound) | (values < -bound)
        if outside.any():
            raise InvalidAppend(f"timestamp of record {_first(outside)} is out of the "
                                f"int64 range in microseconds")
        values = values * multiplier
    if divisor != 1:
        values = np.floor_divide(values, divisor)
    at_min = values == INT64_MIN  # reserved: payload.NO_TIME (validate.timestamp)
    if at_min.any():
        raise InvalidAppend(f"timestamp of record {_first(at_min)} is out of the int64 "
                            f"range")
    return np.ascontiguousarray(values, dtype="<i8")


def _check_sizes(values: pa.Array, keys: pa.Array | None, limit: int) -> None:
    sizes = (np.maximum(_null_lengths(values), 0)
             + (np.maximum(_null_lengths(keys), 0) if keys is not None else 0))
    too_big = sizes > limit
    if too_big.any():
        row = _first(too_big)
        raise InvalidAppend(f"record {row} is {int(sizes[row])} bytes; the limit is "
                            f"{limit} (record_bytes_max)")


# -- partitions ------------------------------------------------------------------------


def partition_numbers(rows: Rows, count: int, next_robin: int) -> tuple[np.ndarray, int]:
    """Each row's partition as log._assign picks it: a key's xxh3 modulo `count`
    (append.partition_for_key), and round robin from `next_robin` for rows without a
    key. Returns (numbers, the next round-robin position)."""
    import pyarrow as pa
    assert count >= 1
    n = len(rows)
    numbers = np.empty(n, dtype=np.int64)
    has_key = (np.zeros(n, dtype=bool) if rows.keys is None else _valid(rows.keys))
    robin = ~has_key
    robin_count = int(robin.sum())
    numbers[robin] = (next_robin + np.arange(robin_count, dtype=np.int64)) % count
    if robin_count < n:
        keys = rows.keys if robin_count == 0 else rows.keys.filter(pa.array(has_key))
        hashes = np.fromiter(map(xxhash.xxh3_64_intdigest, keys.to_pylist()),
                             dtype=np.uint64, count=n - robin_count)
        numbers[has_key] = (hashes % np.uint64(count)).astype(np.int64)
    return numbers, next_robin + robin_count


def split(rows: Rows, numbers: np.ndarray) -> dict[int, Rows]:
    """{partition: its rows, in their order}: one stable sort, one take per partition."""
    assert len(numbers) == len(rows)
    order = np.argsort(numbers, kind="stable")
    ordered = numbers[order]
    starts = np.flatnonzero(np.diff(ordered)) + 1
    bounds = [0, *starts.tolist(), len(order)]
    return {int(ordered[lo]): rows.take(order[lo:hi]) for lo, hi in zip(bounds, bounds[1:])}


# -- output: Rows -> payload pieces ---------------------------------------------------------


def cut_points(sizes: np.ndarray, *, budget: int, records_max: int) -> list[tuple[int, int]]:
    """[lo, hi) row ranges, each as long as fits: at most `records_max` rows whose sizes
    add up to at most `budget` (one row at least). Greedy, as log._cut; one
    searchsorted per range."""
    n = len(sizes)
    ends = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(sizes, out=ends[1:])
    bounds, lo = [], 0
    while lo < n:  # each pass takes at least one row: at most n passes
        hi = int(np.searchsorted(ends, ends[lo] + budget, side="right")) - 1
        hi = min(max(hi, lo + 1), lo + records_max, n)
        bounds.append((lo, hi))
        lo = hi
    assert bounds[-1][1] == n
    return bounds


def encode(rows: Rows, txn_id: int, *, frame_bytes_max: int,
           batch_records_max: int) -> list[EncodedRows]:
    """The rows of one partition as payload-ready pieces that each fit one frame (the
    bounds the appender packs frames by: frame_bytes_max // 2 of estimated bytes,
    batch_records_max records). No copy of the key and value bytes here: the pieces
    hold views of the Arrow buffers, joined into a payload by the writer."""
    assert rows.timestamps_us is not None
    values_data, value_offsets, value_lengths = _payload_column(rows.values)
    if rows.keys is None:
        keys_data, key_offsets = b"", np.zeros(len(rows) + 1, dtype=np.int64)
        key_lengths = np.full(len(rows), -1, dtype=np.int64)
    else:
        keys_data, key_offsets, key_lengths = _payload_column(rows.keys)
    sizes = (np.maximum(value_lengths, 0) + np.maximum(key_lengths, 0)
             + RECORD_OVERHEAD_BYTES)
    assert value_lengths.max() < 1 << 31
    assert key_lengths.max() < 1 << 31
    value_lengths_i4 = value_lengths.astype("<i4")
    key_lengths_i4 = key_lengths.astype("<i4")
    stamps = rows.timestamps_us
    pieces = []
    for lo, hi in cut_points(sizes, budget=frame_bytes_max // 2,
                             records_max=batch_records_max):
        piece_stamps = stamps[lo:hi]
        pieces.append(EncodedRows(
            piece_stamps, key_lengths_i4[lo:hi], value_lengths_i4[lo:hi],
            keys_data[key_offsets[lo]:key_offsets[hi]],
            values_data[value_offsets[lo]:value_offsets[hi]],
            int(piece_stamps.min()), int(piece_stamps.max()),
            int(sizes[lo:hi].sum()), txn_id))
    return pieces


# -- Arrow buffers --------------------------------------------------------------------------


def _payload_column(array: pa.Array) -> tuple[memoryview, np.ndarray, np.ndarray]:
    """(data buffer, offsets into it: int64[n + 1], lengths with -1 for a null) of a key
    or value column, in the payload's form: a null takes no bytes."""
    import pyarrow as pa
    import pyarrow.compute as pc
    data, offsets = _buffers(array)
    lengths = offsets[1:] - offsets[:-1]
    if array.null_count:
        null = ~_valid(array)
        if lengths[null].any():  # Arrow lets a null own bytes; the payload does not
            array = pc.fill_null(array, pa.scalar(b"", array.type))
            data, offsets = _buffers(array)
        lengths = np.where(null, -1, lengths)
    return data, offsets, lengths


def _buffers(array: pa.Array) -> tuple[memoryview, np.ndarray]:
    """(data buffer, offsets into it: int64[n + 1]) of a binary or large_binary array,
    honouring the array's slice offset."""
    import pyarrow as pa
    width = 8 if pa.types.is_large_binary(array.type) else 4
    assert width == 8 or pa.types.is_binary(array.type)
    _, offsets_buffer, data_buffer = array.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=f"<i{width}", count=len(array) + 1,
                            offset=array.offset * width).astype(np.int64)
    data = memoryview(data_buffer) if data_buffer is not None else memoryview(b"")
    return data, offsets


def _lengths(array: pa.Array) -> np.ndarray:
    offsets = _buffers(array)[1]
    return offsets[1:] - offsets[:-1]


def _null_lengths(array: pa.Array) -> np.ndarray:
    """Byte length of each key or value, -1 where it is null (no key, a None value)."""
    lengths = _lengths(array)
    if array.null_count:
        lengths = np.where(_valid(array), lengths, -1)
    return lengths


def _valid(array: pa.Array) -> np.ndarray:
    import pyarrow.compute as pc
    if not array.null_count:
        return np.ones(len(array), dtype=bool)
    return pc.is_valid(array).to_numpy(zero_copy_only=False)


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])
