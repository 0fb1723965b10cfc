"""The row schema of format("streamlog") and the Arrow batches that match it exactly.

Strategy: Spark checks the first Arrow batch a reader yields against
`to_arrow_schema(schema, timezone="UTC")` field by field (names, order, types,
nullability) and passes later batches through unchecked, so every batch is built against
that one target schema. The log's reader already gives Arrow columns (partition int32,
offset int64, timestamp[us, UTC], key binary, value binary, headers); we add the
`stream` column (one string repeated: built from two buffers, no Python loop), order
the columns as Spark declared them, and cast only where a type differs (the headers'
list item name, nothing else in practice).

    stream     string     not null
    partition  int        not null
    offset     bigint     not null
    timestamp  timestamp  not null   (event time; microseconds, shown in the session zone)
    timestampType int     not null   0, as Kafka's CreateTime: a record has one timestamp,
                                     the one its producer gave (or the writing process's
                                     clock when it gave none); the log keeps no second,
                                     append-time stamp (Kafka's 1, LogAppendTime)
    key        binary     null when the record has no key
    value      binary     null for a tombstone (a None value; an empty value is empty)
    headers    array<struct<key: string, value: binary>>   only with includeHeaders=true
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType, StringType,
                               StructField, StructType, TimestampType)
from streamlog import InvalidArgument

HEADERS_TYPE = ArrayType(StructType([StructField("key", StringType(), True),
                                     StructField("value", BinaryType(), True)]), True)
_BASE_FIELDS = [
    StructField("stream", StringType(), False),
    StructField("partition", IntegerType(), False),
    StructField("offset", LongType(), False),
    StructField("timestamp", TimestampType(), False),
    StructField("timestampType", IntegerType(), False),
    StructField("key", BinaryType(), True),
    StructField("value", BinaryType(), True),
]


def spark_schema(include_headers: bool) -> StructType:
    fields = list(_BASE_FIELDS)
    if include_headers:
        fields.append(StructField("headers", HEADERS_TYPE, True))
    return StructType(fields)


def target_arrow_schema(schema: StructType, include_headers: bool) -> pa.Schema:
    """The Arrow schema Spark will demand for `schema`, after checking that `schema`
    (which the user may have given with .schema(...)) is the source's own schema up to
    nullability.

    Raises:
        InvalidArgument naming the expected schema.
    """
    from pyspark.sql.pandas.types import to_arrow_schema
    ours = spark_schema(include_headers)
    given = [(f.name, f.dataType) for f in schema.fields]
    if given != [(f.name, f.dataType) for f in ours.fields]:
        hint = "" if include_headers or "headers" not in schema.fieldNames() else (
            " (set includeHeaders=true for the headers column)")
        raise InvalidArgument(f"format('streamlog') has a fixed schema: {ours.simpleString()}"
                              f"; got {schema.simpleString()}{hint}")
    return to_arrow_schema(schema, timezone="UTC")


def stream_column(name: str, rows: int) -> pa.Array:
    """`name` repeated `rows` times as an Arrow string array, built from two buffers."""
    encoded = name.encode()
    offsets = np.arange(0, (rows + 1) * len(encoded), len(encoded) or 1, dtype=np.int32)
    if not encoded:
        offsets = np.zeros(rows + 1, dtype=np.int32)
    assert len(offsets) == rows + 1
    return pa.Array.from_buffers(pa.string(), rows,
                                 [None, pa.py_buffer(offsets), pa.py_buffer(encoded * rows)])


CREATE_TIME = 0  # Kafka's timestampType of a producer's timestamp


def create_time_column(rows: int) -> pa.Array:
    """CREATE_TIME repeated `rows` times, as an int32 array built from one buffer."""
    return pa.Array.from_buffers(pa.int32(), rows,
                                 [None, pa.py_buffer(np.zeros(rows, dtype=np.int32))])


def to_spark_batch(batch: pa.RecordBatch, stream: str, target: pa.Schema) -> pa.RecordBatch:
    """A batch from `Reader.arrow()` as a batch of exactly `target`."""
    columns = {name: batch.column(name) for name in batch.schema.names}
    columns["stream"] = stream_column(stream, batch.num_rows)
    columns["timestampType"] = create_time_column(batch.num_rows)
    arrays = []
    for field in target:
        array = columns[field.name]
        if not array.type.equals(field.type):
            array = array.cast(field.type)
        arrays.append(array)
    return pa.RecordBatch.from_arrays(arrays, schema=target)
