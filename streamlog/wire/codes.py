"""The wire's numbers, and the one map between error codes and exceptions.

Strategy: everything a deployed peer relies on by number lives here, so a change to a
number is a change to this file (and to tests/unit/test_golden.py, which pins them).
`MessageType` numbers every message; `ErrorCode` numbers every error an ERROR message
can carry. Names may change; numbers never: they are added, never renumbered (Kafka's
`Errors`).

`ERRORS` is the only map between codes and exceptions, read both ways:

  - the daemon sends, for an exception, the code of the nearest class in its method
    resolution order that the map names (the first code listed, for a class listed
    twice); a `ProtocolError` carries its own code; anything else is INTERNAL.
  - a client raises, for a code, the class the map gives it, so code written against a
    local log catches the same exception from a remote one; a code it does not know
    is a `RemoteError`.

The exceptions only the wire raises (protocol errors, an unreachable daemon, a refused
token, an unclassified failure in the daemon) are defined here too, beside their codes.
"""

from __future__ import annotations

import enum

from ..errors import (CorruptionError, InvalidAppend, InvalidArgument, LogClosed,
                      OffsetOutOfRange, PartitionFailed, ProducerFenced, ReadOnlyLog,
                      StreamLogError, UnknownStream)


class MessageType(enum.IntEnum):
    """Message type numbers: stable, like ErrorCode. 1-63 client, 64-127 server."""

    HELLO = 1
    PING = 2
    CREATE_STREAM = 3
    APPEND = 4
    READ = 5
    CREDIT = 6
    CANCEL = 7
    OFFSETS = 8
    OFFSET_FOR_TIMESTAMP = 9
    INFO = 10
    STREAMS = 11
    COMMIT_TXN = 12
    ABORT_TXN = 13
    LAST_COMMIT = 14
    TRUNCATE_AFTER = 15
    TXN_STATE = 16
    INIT_PRODUCER = 17
    BEGIN_TXN = 18
    OPEN_TRANSACTIONS = 19
    APPLY_RETENTION = 20
    HOLD = 21
    RELEASE_HOLD = 22
    HOLDS = 23
    HELLO_OK = 64
    PONG = 65
    ERROR = 66
    APPENDED = 67
    BATCH = 68
    READ_OPENED = 69
    READ_END = 70
    RESULT_INT = 71
    RESULT_OFFSETS = 72
    RESULT_JSON = 73
    RESULT_BYTES = 74


CLIENT_TYPES_MAX = 63  # 1..63 are sent by clients, 64.. by the daemon


class ErrorCode(enum.IntEnum):
    """Wire error codes. Names may change; numbers never (add, never renumber)."""

    INTERNAL = 1
    PROTOCOL_ERROR = 2
    FRAME_TOO_LARGE = 3
    UNAUTHENTICATED = 4
    UNSUPPORTED_VERSION = 5
    TOO_MANY_CONNECTIONS = 6
    SHUTTING_DOWN = 7
    LIMIT_EXCEEDED = 8
    INVALID_ARGUMENT = 10
    INVALID_APPEND = 11
    UNKNOWN_STREAM = 12
    OFFSET_OUT_OF_RANGE = 13
    LOG_CLOSED = 14
    READ_ONLY = 15
    PARTITION_FAILED = 16
    CORRUPTION = 17
    STREAMLOG_ERROR = 18
    PRODUCER_FENCED = 19


# -- the wire's own exceptions ---------------------------------------------------------

class ProtocolError(StreamLogError):
    """Abstract: the protocol's rules were broken. `error_code` says which ErrorCode an
    ERROR message about it carries."""

    def __init__(self, message: str, error_code: ErrorCode = ErrorCode.PROTOCOL_ERROR):
        if type(self) is ProtocolError:
            raise TypeError("ProtocolError is abstract; raise Local- or RemoteProtocolError")
        super().__init__(message)
        self.error_code = ErrorCode(error_code)


class LocalProtocolError(ProtocolError):
    """This side tried to do something the protocol forbids."""


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes or a message the protocol forbids."""


class DaemonError(StreamLogError):
    """Cannot reach, or cannot stay connected to, or authenticate to a daemon (exit 3)."""


class DaemonUnavailable(DaemonError):
    """Connection refused or lost, the daemon is full or shutting down."""


class AuthenticationFailed(DaemonError):
    """The daemon refused the token."""


class RemoteError(StreamLogError):
    """The daemon failed in a way it did not classify (an INTERNAL error)."""


# -- the error map ---------------------------------------------------------------------

ERRORS: tuple[tuple[ErrorCode, type[StreamLogError]], ...] = (
    (ErrorCode.INTERNAL, RemoteError),
    (ErrorCode.PROTOCOL_ERROR, RemoteProtocolError),
    (ErrorCode.FRAME_TOO_LARGE, RemoteProtocolError),
    (ErrorCode.UNAUTHENTICATED, AuthenticationFailed),
    (ErrorCode.UNSUPPORTED_VERSION, RemoteProtocolError),
    (ErrorCode.TOO_MANY_CONNECTIONS, DaemonUnavailable),
    (ErrorCode.SHUTTING_DOWN, DaemonUnavailable),
    (ErrorCode.INVALID_ARGUMENT, InvalidArgument),
    (ErrorCode.LIMIT_EXCEEDED, InvalidArgument),  # a daemon bound: the caller asked too much
    (ErrorCode.INVALID_APPEND, InvalidAppend),
    (ErrorCode.UNKNOWN_STREAM, UnknownStream),
    (ErrorCode.OFFSET_OUT_OF_RANGE, OffsetOutOfRange),
    (ErrorCode.LOG_CLOSED, LogClosed),
    (ErrorCode.READ_ONLY, ReadOnlyLog),
    (ErrorCode.PARTITION_FAILED, PartitionFailed),
    (ErrorCode.CORRUPTION, CorruptionError),
    (ErrorCode.PRODUCER_FENCED, ProducerFenced),
    (ErrorCode.STREAMLOG_ERROR, StreamLogError),
)

_CLASS_OF: dict[ErrorCode, type[StreamLogError]] = dict(ERRORS)
_CODE_OF: dict[type, ErrorCode] = {kind: code for code, kind in reversed(ERRORS)}
assert len(_CLASS_OF) == len(ERRORS), "a code is listed twice"
assert set(_CLASS_OF) == set(ErrorCode), "every code needs an exception"


def error_code_for(error: BaseException) -> ErrorCode:
    """The ErrorCode an ERROR message about `error` carries."""
    if isinstance(error, ProtocolError):
        return error.error_code
    for kind in type(error).__mro__:
        code = _CODE_OF.get(kind)
        if code is not None:
            return code
    return ErrorCode.INTERNAL


def exception_for(code: int, message: str) -> StreamLogError:
    """The exception a client raises for an ERROR message: the same class the local log
    would have raised, so code written for a local log handles a remote one."""
    try:
        known = ErrorCode(code)
    except ValueError:
        return RemoteError(f"{message} (unknown error code {code})")
    kind = _CLASS_OF[known]
    if issubclass(kind, ProtocolError):
        return kind(message, known)
    return kind(message)
