"""The exception tree of streamlog, and nothing else.

Strategy: one root, `StreamLogError`, so callers can catch everything the log raises
on purpose. Conditions that come from bytes on disk are `CorruptionError`s and carry
where they were found; conditions that come from the caller are `InvalidArgument`
(a `ValueError` too, so plain Python code that expects one still works). A torn tail
is not an error: it is an outcome of recovery (`integrity.Verdict.TORN_TAIL`), counted and
logged. The object store's failures are `StoreError`s; of those, `StoreUnavailable` is
the one a retry may cure.
"""

from __future__ import annotations


class StreamLogError(Exception):
    """Root of every error streamlog raises on purpose."""


class LogNotFound(StreamLogError):
    """No log where one was asked for: a missing directory opened read-only or not to
    be created, or an object store prefix with no manifest."""


class InvalidArgument(StreamLogError, ValueError):
    """The caller passed a value the log cannot accept (wrong type, out of range)."""


class InvalidAppend(InvalidArgument):
    """A record cannot be appended (wrong type, too large, bad timestamp)."""


class InvalidStreamName(InvalidArgument):
    """A stream name outside Kafka's topic rule (DESIGN 1): 1 to 249 characters of
    letters, digits, '.', '_' and '-', not "." or ".."."""


class InternalStream(InvalidArgument):
    """A write to one of streamlog's own streams (a name starting with "__": committed
    offsets, producer and transaction state), which only streamlog writes."""


class UnknownStream(StreamLogError, KeyError):
    """The named stream does not exist in this log."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want the sentence.
        return str(self.args[0]) if self.args else "unknown stream"


class OffsetOutOfRange(StreamLogError):
    """An offset outside [start_offset, end_offset] was asked for."""


class LogClosed(StreamLogError):
    """The log (or partition) was closed; open it again to use it."""


class LogLocked(StreamLogError):
    """The log is open for writing where that excludes this open: by this process
    already (share that Log), or by any process when `repair` needs it alone."""


class ReadOnlyLog(StreamLogError):
    """A write was attempted on a log opened read-only."""


class PartitionFailed(StreamLogError):
    """A write or fsync failed; the partition refuses appends until reopened.

    fsync is never retried: after a failed fsync the kernel may have dropped the dirty
    pages, so a retry that succeeds proves nothing (the 2018 PostgreSQL fsync lesson).
    """


class ProducerFenced(StreamLogError):
    """A producer with the same transactional id started after this one (DESIGN 6): this
    one's transactions were aborted, and its appends and commits are refused."""


class DataLossError(StreamLogError):
    """Recovering exactly needs input that is gone (removed by retention): input offsets
    `first_lost`..`last_lost` of `source` ("stream/partition"). Raised unless the caller
    opted in to data loss (`fail_on_data_loss=False`), as Spark's Kafka source does."""

    def __init__(self, source: str, first_lost: int, last_lost: int, why: str) -> None:
        self.source = source
        self.first_lost = first_lost
        self.last_lost = last_lost
        self.why = why
        super().__init__(f"cannot recover exactly: {why}; input {source} offsets "
                         f"{first_lost}..{last_lost} are gone (retention). Keep input "
                         f"longer (the operator holds its position, see Log.hold), or "
                         f"pass fail_on_data_loss=False to continue from the earliest "
                         f"retained input")


class ProducerTimeout(StreamLogError, TimeoutError):
    """A Producer's flush() or close() ran out of time with records still
    unacknowledged (they may still be written: their handles resolve when the log
    answers)."""


class BufferFull(ProducerTimeout):
    """A Producer's send() waited `block_ms_max` for buffer space: the log is not
    keeping up (or is stalled) and `buffer_bytes` of records are waiting for it."""


class CorruptionError(StreamLogError):
    """Bytes on disk are not what the log wrote."""


class CorruptFrame(CorruptionError):
    """A frame that can never become valid (bad magic, impossible length, bad checksum)."""

    def __init__(self, reason: str, position: int | None = None) -> None:
        self.reason = reason
        self.position = position
        where = f" at position {position}" if position is not None else ""
        super().__init__(f"corrupt frame{where}: {reason}")


class CorruptSegment(CorruptionError):
    """A segment has a bad frame followed by valid data: corruption, not a torn write."""

    def __init__(self, path: str, position: int, reason: str) -> None:
        self.path = path
        self.position = position
        self.reason = reason
        super().__init__(f"corruption in segment {path} at position {position}: {reason}")


class CorruptIndex(CorruptionError):
    """The LMDB index disagrees with itself; it is rebuilt from the segments."""


class CorruptObject(CorruptionError):
    """An object in the store (DESIGN 11) is not what the log wrote: named by its key,
    relative to the log's prefix, and the position of the damage in it. Nothing from it
    is delivered."""

    def __init__(self, key: str, position: int, reason: str) -> None:
        self.key = key
        self.position = position
        self.reason = reason
        super().__init__(f"corruption in object {key} at position {position}: {reason}")


class StoreError(StreamLogError):
    """The object store refused or failed a request (DESIGN 11): the base of the
    store's errors, and raised itself for what no retry changes (a refused credential,
    a request the store does not accept, an answer that makes no sense). `key` names
    the object, relative to the log's prefix, when there is one."""

    def __init__(self, message: str = "", *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class StoreUnavailable(StoreError):
    """The store could not answer now: a 5xx, SlowDown or other throttling, a timeout,
    a refused or dropped connection. Retryable, with backoff (remote.store.Retrying).
    A write that ends this way may or may not have taken effect: its response may be
    what was lost."""


class StoreTimeout(StoreError, TimeoutError):
    """Durability "remote": the store did not take an append's records within
    `remote_timeout_s` (it is down or too slow). The records are in the local log and
    may still reach the store: as with any timeout, the outcome is unknown."""


class StoreBacklogFull(StoreError):
    """Durability "local": a partition holds `remote_max_backlog_bytes` the store does
    not have yet (it is down or too slow), so appends are refused until the backlog
    drains: back-pressure, not a failure of the log. Try again later."""


class ObjectNotFound(StoreError):
    """No object has this key (or it was deleted)."""


class PreconditionFailed(StoreError):
    """A conditional write lost: the object exists where `if_absent` wanted none, or
    its ETag is not the one `if_match` named (HTTP 412). Retrying the same write cannot
    succeed; read what is there and decide again."""


class Fenced(StreamLogError):
    """A newer writer took this log over in the object store (DESIGN 11, one writer):
    this one's appends and commits are refused and it stops writing, so two writers
    never interleave. Only a new writable open takes the log back (and fences the
    other in turn)."""
