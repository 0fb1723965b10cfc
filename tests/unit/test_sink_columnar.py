"""The Spark sink's commit appends staged Arrow runs as columns when it can."""

from __future__ import annotations

import pyarrow as pa

import streamlog
from spark_sink import _commit


def _runs(headers: bool):
    columns = {"key": pa.array([b"k1", None], pa.binary()),
               "value": pa.array([b"v1", b"v2"], pa.binary()),
               "timestamp": pa.array([10, 20], pa.int64())}
    if headers:
        kv = pa.struct([("key", pa.string()), ("value", pa.binary())])
        columns["headers"] = pa.array([None, [{"key": "h", "value": b"x"}]], pa.list_(kv))
    return [pa.RecordBatch.from_pydict(columns)]


def test_runs_without_headers_go_in_as_columns_and_read_back(tmp_path):
    with streamlog.open_log(tmp_path / "log", fsync="never") as log:
        log.create_stream("s")
        assert _commit._columnar(log, _runs(False))
        assert not _commit._columnar(log, _runs(True))  # headers: append_batch
        assert not _commit._columnar(object(), _runs(False))  # no append_columns
        _commit._append_runs(log, "s", 0, _runs(False), txn_id=0)
        _commit._append_runs(log, "s", 0, _runs(True), txn_id=0)
        got = [(r.key, r.value, r.timestamp_us, r.headers) for r in log.reader("s", 0)]
    assert got == [(b"k1", b"v1", 10, ()), (None, b"v2", 20, ()),
                   (b"k1", b"v1", 10, ()), (None, b"v2", 20, (("h", b"x"),))]


def test_null_values_and_header_values_are_written_as_none(tmp_path):
    """A null value is a tombstone (None, not b""), a null header value None, whichever
    way the run goes in; a row with neither key nor value is routed by the hash of b""."""
    from pyspark.sql import types as T
    from spark_sink._columns import ColumnMap
    schema = T.StructType([T.StructField("key", T.BinaryType()),
                           T.StructField("value", T.BinaryType())])
    mapping = ColumnMap.from_schema(schema, partition_count=3)
    staged = mapping.stage(pa.RecordBatch.from_pydict({
        "key": pa.array([None, b"k", None], pa.binary()),
        "value": pa.array([None, None, b""], pa.binary())}))
    assert staged.column("value").to_pylist() == [None, None, b""]
    assert staged.column("partition").to_pylist() == [
        streamlog.partition_for_key(b"", 3), streamlog.partition_for_key(b"k", 3),
        streamlog.partition_for_key(b"", 3)]
    kv = pa.struct([("key", pa.string()), ("value", pa.binary())])
    plain = pa.RecordBatch.from_pydict({"key": pa.array([None, b"k"], pa.binary()),
                                        "value": pa.array([None, b""], pa.binary()),
                                        "timestamp": pa.array([1, 2], pa.int64())})
    with_headers = plain.append_column("headers", pa.array(
        [[{"key": "h", "value": None}], [{"key": "h", "value": b""}]], pa.list_(kv)))
    with streamlog.open_log(tmp_path / "log", fsync="never") as log:
        log.create_stream("s")
        _commit._append_runs(log, "s", 0, [plain], txn_id=0)
        _commit._append_runs(log, "s", 0, [with_headers], txn_id=0)
        got = [(r.key, r.value, r.headers) for r in log.reader("s", 0)]
    assert got == [(None, None, ()), (b"k", b"", ()),
                   (None, None, (("h", None),)), (b"k", b"", (("h", b""),))]
