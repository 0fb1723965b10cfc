"""streamlog: a durable stream log with a timestamp index, exact replay, live tail and
crash recovery.

    import streamlog
    with streamlog.open_log("data/mylog", fsync="always") as log:
        log.create_stream("events", partitions=1)
        log.append_batch_sync("events", [b"a", b"b"], keys=[b"k1", b"k2"])
        for record in log.reader("events", 0, from_offset=0):
            print(record.offset, record.value)
"""

from .api import LogAPI
from .config import Compression, FsyncPolicy, LogConfig
from .errors import (CorruptFrame, CorruptIndex, CorruptionError, CorruptObject,
                     CorruptSegment, DataLossError, Fenced, InvalidAppend, InvalidArgument,
                     LogClosed, LogLocked, LogNotFound, OffsetOutOfRange, PartitionFailed, ProducerFenced,
                     ReadOnlyLog, StoreBacklogFull, StoreError, StoreTimeout, StoreUnavailable,
                     StreamLogError, UnknownStream)
from .append import partition_for_key
from .directory import writer_in_this_process
from .connect import open_log
from .log import Log
from .errors import BufferFull, ProducerTimeout
from .producer import Producer
from .producer_batch import RecordFuture
from .reader import Reader
from .records import AppendResult, Record, RecordKind, RecordPosition
from .txn import TxnState

# The operator layer (streamlog.operators) is exported here too, imported on first use:
# it loads Arrow compute and msgpack, which a plain append or read does not need.
_OPERATOR_NAMES = ("OperatorRuntime", "CheckpointStore", "ObjectCheckpointStore",
                   "CheckpointPolicy",
                   "AggregateOperator", "WindowSpec", "CECPolicy", "read_aggregate_results",
                   "WindowedOperator", "Tumbling", "Hopping", "Sliding",
                   "read_window_results")


def __getattr__(name: str):
    if name in _OPERATOR_NAMES:
        from . import operators
        return getattr(operators, name)
    if name == "RemoteLog":  # the daemon's client (open_log("streamlog://...")), on first use
        from .wire.client import RemoteLog
        return RemoteLog
    raise AttributeError(f"module 'streamlog' has no attribute {name!r}")

__all__ = [
    "open_log", "writer_in_this_process", "Log", "LogAPI", "RemoteLog", "Reader", "LogConfig",
    "FsyncPolicy", "Compression", "TxnState",
    "Record", "RecordKind", "RecordPosition", "AppendResult", "partition_for_key",
    "StreamLogError", "InvalidArgument", "InvalidAppend", "UnknownStream",
    "OffsetOutOfRange", "LogClosed", "LogLocked", "LogNotFound", "ReadOnlyLog", "PartitionFailed",
    "ProducerFenced", "DataLossError", "Producer", "RecordFuture", "BufferFull",
    "ProducerTimeout",
    *_OPERATOR_NAMES,
    "CorruptionError", "CorruptFrame", "CorruptSegment", "CorruptIndex", "CorruptObject",
    "StoreError", "StoreUnavailable", "StoreTimeout", "StoreBacklogFull", "Fenced",
]
