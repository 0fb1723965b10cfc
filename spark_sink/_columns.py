"""DataFrame columns -> the record fields of streamlog, as Arrow, with clear errors.

Strategy: the driver checks the DataFrame's schema once (`ColumnMap.from_schema`), so a
missing `value` or a column of the wrong type fails before any task runs. Executors then
turn each incoming Arrow batch into a batch of the staged schema below with Arrow
compute calls; the only per-row Python work is the partition hash, and only when the
stream has more than one partition and the DataFrame gives no `partition`.

    column     accepted Spark types                  staged as
    value      binary, string (UTF-8)   required     binary, null = a tombstone (value None)
    key        binary, string           optional     binary, null = no key
    timestamp  timestamp, timestamp_ntz optional     int64 microseconds (UTC); null or
                                                     absent = time of staging
    partition  tinyint .. bigint        optional     int32; null or absent = by key
    headers    array<struct<key: string, value: binary|string>>   optional

Other columns (the `stream` and `offset` of rows read from a streamlog, say) are ignored,
as Spark's Kafka sink ignores what it does not use. Rows without a partition go to
`partition_for_key(key)` (the log's own rule for keyed appends: xxh3_64 modulo the
count) and, without a key, to the same hash of their value (of b"" for a null value).
Not round robin: a replayed micro-batch must route every
row exactly where its first attempt did, or a partition that already committed the batch
would skip rows that another partition then takes a second time.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash
from pyspark.sql import types as T
from streamlog import InvalidArgument

STAGED_HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
STAGED_FIELDS = [pa.field("partition", pa.int32(), False), pa.field("key", pa.binary()),
                 pa.field("value", pa.binary()), pa.field("timestamp", pa.int64(), False)]
_INTEGERS = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
_ACCEPTED = {
    "value": ((T.BinaryType, T.StringType), "binary or string"),
    "key": ((T.BinaryType, T.StringType), "binary or string"),
    "timestamp": ((T.TimestampType, T.TimestampNTZType),
                  "timestamp or timestamp_ntz (for microseconds in a long, use "
                  "timestamp_micros(col))"),
    "partition": (_INTEGERS, "an integer type"),
}


def staged_schema(with_headers: bool) -> pa.Schema:
    fields = list(STAGED_FIELDS)
    if with_headers:
        fields.append(pa.field("headers", STAGED_HEADERS))
    return pa.schema(fields)


@dataclasses.dataclass(frozen=True)
class ColumnMap:
    """Where each record field comes from: an input column name, or None."""

    value: str
    key: str | None
    timestamp: str | None
    partition: str | None
    headers: str | None
    partition_count: int

    @classmethod
    def from_schema(cls, schema: T.StructType, partition_count: int) -> "ColumnMap":
        """Raises InvalidArgument for a missing value column or a wrong type."""
        found: dict[str, T.StructField] = {}
        for field in schema.fields:
            name = field.name.lower()
            if name in _ACCEPTED or name == "headers":
                if name in found:
                    raise InvalidArgument(f"the DataFrame has two columns named {name!r}")
                found[name] = field
        if "value" not in found:
            raise InvalidArgument(
                f"format('streamlog') needs a 'value' column (binary or string); it also "
                f"takes key, timestamp, partition and headers. The DataFrame has: "
                f"{', '.join(schema.fieldNames()) or 'no columns'}")
        for name, field in found.items():
            if name == "headers":
                _check_headers(field)
                continue
            types, words = _ACCEPTED[name]
            if not isinstance(field.dataType, types):
                raise InvalidArgument(f"column {field.name!r} is {field.dataType.simpleString()}"
                                      f"; streamlog takes {words} for {name}")
        names = {name: field.name for name, field in found.items()}
        return cls(names["value"], names.get("key"), names.get("timestamp"),
                   names.get("partition"), names.get("headers"), partition_count)

    def stage(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """One incoming batch -> a batch of `staged_schema`, rows in input order.

        Raises InvalidArgument for a partition out of range.
        """
        n = batch.num_rows
        value = _binary(batch.column(self.value))
        key = (_binary(batch.column(self.key)) if self.key is not None
               else pa.nulls(n, pa.binary()))
        now_us = time.time_ns() // 1000
        if self.timestamp is not None:
            column = batch.column(self.timestamp)
            timestamp = pc.fill_null(column.cast(pa.timestamp("us", tz=column.type.tz))
                                     .cast(pa.int64()), now_us)
        else:
            timestamp = pa.array(np.full(n, now_us, dtype=np.int64))
        partition = self._partitions(batch, key, value)
        arrays = [pa.array(partition, type=pa.int32()), key, value, timestamp]
        if self.headers is not None:
            arrays.append(batch.column(self.headers).cast(STAGED_HEADERS))
        return pa.RecordBatch.from_arrays(arrays, schema=staged_schema(self.headers is not None))

    def _partitions(self, batch: pa.RecordBatch, key: pa.Array, value: pa.Array) -> np.ndarray:
        n, count = batch.num_rows, self.partition_count
        given = None
        if self.partition is not None:
            given = batch.column(self.partition)
            if given.null_count == 0:
                return _checked(given.to_numpy(zero_copy_only=False), count, self.partition)
        if count == 1 and given is None:
            return np.zeros(n, dtype=np.int32)
        routed = _hashed(key, value) % np.uint64(count)
        if given is not None:  # some rows name their partition, the others are hashed
            valid = given.is_valid().to_numpy(zero_copy_only=False)
            routed = np.where(valid, given.fill_null(0).to_numpy(zero_copy_only=False),
                              routed.astype(np.int64))
        return _checked(routed.astype(np.int64), count, self.partition)


def _hashed(key: pa.Array, value: pa.Array) -> np.ndarray:
    """xxh3_64 of each row's key, or of its value when it has none (b"" for a null
    value), as uint64: the digest `streamlog.partition_for_key` takes modulo the
    partition count."""
    digest = xxhash.xxh3_64_intdigest
    keys = key.to_pylist()
    if key.null_count:
        routed = [k if k is not None else v or b"" for k, v in zip(keys, value.to_pylist())]
    else:
        routed = keys
    return np.fromiter(map(digest, routed), dtype=np.uint64, count=len(routed))


def _check_headers(field: T.StructField) -> None:
    kind = field.dataType
    ok = (isinstance(kind, T.ArrayType) and isinstance(kind.elementType, T.StructType)
          and [f.name.lower() for f in kind.elementType.fields] == ["key", "value"]
          and isinstance(kind.elementType.fields[0].dataType, T.StringType)
          and isinstance(kind.elementType.fields[1].dataType, (T.BinaryType, T.StringType)))
    if not ok:
        raise InvalidArgument(f"column {field.name!r} is {kind.simpleString()}; streamlog "
                              f"takes array<struct<key:string,value:binary>> for headers")


def _binary(column: pa.Array) -> pa.Array:
    if pa.types.is_binary(column.type):
        return column
    return column.cast(pa.binary())  # string, large types: UTF-8 bytes as they are


def _checked(partitions: np.ndarray, count: int, column: str | None) -> np.ndarray:
    if len(partitions) and (partitions.min() < 0 or partitions.max() >= count):
        bad = int(partitions[(partitions < 0) | (partitions >= count)][0])
        raise InvalidArgument(f"column {column!r} holds partition {bad}; the stream has "
                              f"partitions 0..{count - 1}")
    return partitions.astype(np.int32, copy=False)
