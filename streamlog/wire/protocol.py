"""The daemon's wire protocol, sans I/O: bytes <-> messages, and the connection rules.

Strategy (h11's): nothing here touches a socket, a file or an event loop. A `Connection`
buffers the bytes its owner received (`receive_data`), hands back one message at a time
(`next_event`, or the sentinels `NEED_DATA` / `CLOSED`), and turns a message to send into
bytes (`send`). `server.py` and `client.py` are the thin shells that move those bytes.

Frame layout (big-endian; every message is one frame):

    offset size type  field
         0    4  u32  length       bytes after this field: 5 + body (at most the limit)
         4    1  u8   type         MessageType
         5    4  u32  request_id   chosen by the client; a reply or a pushed batch carries
                                   the id of the request it answers
         9    .  .    body         the message's fields, in the order of its FIELDS

Field kinds: u8 u16 u32 i32 i64 u64; `str` (u16 length + UTF-8); `blob` (u32 length +
bytes); `rest` / `view` (every remaining byte, last field only; `view` is a memoryview
of the received body, so a record payload is copied once, out of the receive buffer,
and is sent without being copied into its frame: `send_parts`). Records travel as the
log's own columnar payload (payload.py: timestamps, key and value lengths, blobs), so
neither side loops over records to frame them and a client turns a batch into Arrow
without one.

Rules (Rule 1: the client speaks first): a connection starts with the client's HELLO
(token); the server answers HELLO_OK or ERROR and, after an ERROR, closes. Then the
client sends requests, pipelined, each with a fresh request_id, and the server answers
each, in any order. READ subscribes: the server sends BATCH messages as long as the
client's credit (bytes) lasts, topped up by CREDIT, and READ_END when the range is done
(a follow read never ends by itself; CANCEL ends it). Rule 2: anything that breaks these
rules, or a frame over the limit, is a `RemoteProtocolError` on the receiving side and
the connection is in the sticky ERROR state: the only thing left to send is an ERROR.

Errors: our own code raises `LocalProtocolError` ("you broke it"); `next_event`, the
one entry point for peer bytes, re-raises it as `RemoteProtocolError` ("the peer did").
`ErrorCode` numbers are stable: codes are added, never renumbered (Kafka's Errors).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import struct
from typing import ClassVar

import numpy as np

from ..errors import (CorruptFrame, CorruptionError, InvalidAppend, InvalidArgument,
                      LogClosed, OffsetOutOfRange, PartitionFailed, ReadOnlyLog,
                      StreamLogError, UnknownStream)
from ..frame import CODEC_NONE, FLAG_HAS_CONTROL, FLAG_HAS_HEADERS, Frame
from ..payload import Columns, decode_columns, decode_headers, encode_payload
from ..records import RecordKind

WIRE_VERSION = 1
HEADER = struct.Struct(">IBI")
assert HEADER.size == 9
FRAME_BYTES_MIN = 5  # type + request_id
# Default bound of one frame's length field; a server announces its own in HELLO_OK.
FRAME_BYTES_MAX = 32 * 1024 * 1024
# Before the HELLO is accepted, a peer gets no more than this (no 32 MiB pre-auth buffer).
HELLO_BYTES_MAX = 64 * 1024
ERROR_MESSAGE_CHARS_MAX = 2000
PAYLOAD_FLAGS_KNOWN = FLAG_HAS_CONTROL | FLAG_HAS_HEADERS
REQUEST_ID_MAX = (1 << 32) - 1


# -- errors ----------------------------------------------------------------------------

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


_EXCEPTION_CODES: tuple[tuple[type, ErrorCode], ...] = (
    (InvalidAppend, ErrorCode.INVALID_APPEND),
    (InvalidArgument, ErrorCode.INVALID_ARGUMENT),
    (UnknownStream, ErrorCode.UNKNOWN_STREAM),
    (OffsetOutOfRange, ErrorCode.OFFSET_OUT_OF_RANGE),
    (LogClosed, ErrorCode.LOG_CLOSED),
    (ReadOnlyLog, ErrorCode.READ_ONLY),
    (PartitionFailed, ErrorCode.PARTITION_FAILED),
    (CorruptionError, ErrorCode.CORRUPTION),
    (AuthenticationFailed, ErrorCode.UNAUTHENTICATED),
    (StreamLogError, ErrorCode.STREAMLOG_ERROR),
)

_CODE_EXCEPTIONS: dict[ErrorCode, type] = {
    ErrorCode.INVALID_APPEND: InvalidAppend,
    ErrorCode.INVALID_ARGUMENT: InvalidArgument,
    ErrorCode.UNKNOWN_STREAM: UnknownStream,
    ErrorCode.OFFSET_OUT_OF_RANGE: OffsetOutOfRange,
    ErrorCode.LOG_CLOSED: LogClosed,
    ErrorCode.READ_ONLY: ReadOnlyLog,
    ErrorCode.PARTITION_FAILED: PartitionFailed,
    ErrorCode.CORRUPTION: CorruptionError,
    ErrorCode.UNAUTHENTICATED: AuthenticationFailed,
    ErrorCode.TOO_MANY_CONNECTIONS: DaemonUnavailable,
    ErrorCode.SHUTTING_DOWN: DaemonUnavailable,
    ErrorCode.STREAMLOG_ERROR: StreamLogError,
    ErrorCode.LIMIT_EXCEEDED: InvalidArgument,
}


def error_code_for(error: BaseException) -> ErrorCode:
    """The ErrorCode an ERROR message about `error` carries."""
    if isinstance(error, ProtocolError):
        return error.error_code
    for kind, code in _EXCEPTION_CODES:
        if isinstance(error, kind):
            return code
    return ErrorCode.INTERNAL


def exception_for(code: int, message: str) -> StreamLogError:
    """The exception a client raises for an ERROR message: the same class the local log
    would have raised, so code written for a local log handles a remote one."""
    try:
        known = ErrorCode(code)
    except ValueError:
        return RemoteError(f"{message} (unknown error code {code})")
    if known in (ErrorCode.PROTOCOL_ERROR, ErrorCode.FRAME_TOO_LARGE,
                 ErrorCode.UNSUPPORTED_VERSION):
        return RemoteProtocolError(message, known)
    return _CODE_EXCEPTIONS.get(known, RemoteError)(message)


# -- sentinels and states --------------------------------------------------------------

class _Sentinel(type):
    """A class whose type is itself: `NEED_DATA`, `READY`, ... (h11 `_util.Sentinel`)."""

    def __new__(cls, name, bases, namespace):
        assert bases == (_Sentinel,)
        self = super().__new__(cls, name, bases, namespace)
        self.__class__ = self
        return self

    def __repr__(self) -> str:
        return self.__name__


class NEED_DATA(_Sentinel, metaclass=_Sentinel):
    """next_event(): no whole message is buffered yet."""


class CLOSED(_Sentinel, metaclass=_Sentinel):
    """next_event(): the peer closed its side cleanly; nothing more will come."""


class START(_Sentinel, metaclass=_Sentinel):
    """Client: nothing sent yet."""


class AWAIT_HELLO(_Sentinel, metaclass=_Sentinel):
    """Server: waiting for the client's HELLO."""


class HELLO_SENT(_Sentinel, metaclass=_Sentinel):
    """Client: HELLO sent, waiting for HELLO_OK."""


class HELLO_RECEIVED(_Sentinel, metaclass=_Sentinel):
    """Server: HELLO received; the shell checks the token and sends HELLO_OK or ERROR."""


class READY(_Sentinel, metaclass=_Sentinel):
    """Requests and replies flow."""


class DONE(_Sentinel, metaclass=_Sentinel):
    """The handshake was refused; the connection is over."""


class ERROR(_Sentinel, metaclass=_Sentinel):
    """A protocol error happened: sticky; only an ERROR message may still be sent."""


class Role(enum.Enum):
    CLIENT = "client"
    SERVER = "server"


# -- field codec -----------------------------------------------------------------------

_SCALARS = {name: struct.Struct(">" + code) for name, code in
            (("u8", "B"), ("u16", "H"), ("u32", "I"), ("i32", "i"), ("i64", "q"),
             ("u64", "Q"))}
_U16, _U32 = _SCALARS["u16"], _SCALARS["u32"]


class _Cursor:
    """Reads fields from a frame body; raises LocalProtocolError when it runs short."""

    __slots__ = ("view", "position")

    def __init__(self, view: memoryview) -> None:
        self.view = view
        self.position = 0

    def take(self, size: int) -> memoryview:
        end = self.position + size
        if end > len(self.view):
            raise LocalProtocolError("message body is shorter than its fields")
        chunk = self.view[self.position:end]
        self.position = end
        return chunk

    def field(self, kind: str):
        scalar = _SCALARS.get(kind)
        if scalar is not None:
            return scalar.unpack(self.take(scalar.size))[0]
        if kind == "str":
            (size,) = _U16.unpack(self.take(2))
            try:
                return str(self.take(size), "utf-8")
            except UnicodeDecodeError:
                raise LocalProtocolError("a text field is not valid UTF-8") from None
        if kind == "blob":
            (size,) = _U32.unpack(self.take(4))
            return bytes(self.take(size))
        rest = self.take(len(self.view) - self.position)
        if kind == "view":
            return rest  # a view of the (immutable) frame body: records are not copied again
        assert kind == "rest"
        return bytes(rest)


def _encode_field(kind: str, value) -> bytes:
    scalar = _SCALARS.get(kind)
    if scalar is not None:
        try:
            return scalar.pack(value)
        except struct.error:
            raise LocalProtocolError(f"{value!r} does not fit a {kind} field") from None
    if kind == "str":
        data = value.encode()
        if len(data) > 0xFFFF:
            raise LocalProtocolError("a text field is longer than 65535 bytes")
        return _U16.pack(len(data)) + data
    if kind == "blob":
        return _U32.pack(len(value)) + bytes(value)
    assert kind in ("rest", "view")
    return value


# -- messages --------------------------------------------------------------------------

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


@dataclasses.dataclass(frozen=True, slots=True)
class Message:
    """Base of every message: `request_id` ties a reply to its request."""

    request_id: int
    TYPE: ClassVar[MessageType]
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = ()
    FROM: ClassVar[Role]

    def check(self) -> None:
        """Raise LocalProtocolError for values the protocol does not allow."""


def _message(type_: MessageType, role: Role, *fields: tuple[str, str]):
    def register(cls):
        cls.TYPE, cls.FROM, cls.FIELDS = type_, role, fields
        assert type_ not in MESSAGES
        MESSAGES[type_] = cls
        return cls
    return register


MESSAGES: dict[MessageType, type] = {}
_C, _S = Role.CLIENT, Role.SERVER


@_message(MessageType.HELLO, _C, ("version", "u16"), ("token", "blob"), ("client", "str"))
@dataclasses.dataclass(frozen=True, slots=True)
class Hello(Message):
    version: int
    token: bytes
    client: str = ""


@_message(MessageType.PING, _C)
@dataclasses.dataclass(frozen=True, slots=True)
class Ping(Message):
    pass


@_message(MessageType.CREATE_STREAM, _C, ("stream", "str"), ("partitions", "u32"))
@dataclasses.dataclass(frozen=True, slots=True)
class CreateStream(Message):
    stream: str
    partitions: int


@_message(MessageType.APPEND, _C, ("stream", "str"), ("partition", "i32"), ("txn_id", "u64"),
          ("timestamps_given", "u8"), ("record_count", "u32"), ("payload_flags", "u8"),
          ("payload", "view"))
@dataclasses.dataclass(frozen=True, slots=True)
class Append(Message):
    """Records in the payload layout; partition -1 lets the log choose (key hash or
    round robin); timestamps_given 0: the daemon stamps append time."""

    stream: str
    partition: int
    txn_id: int
    timestamps_given: int
    record_count: int
    payload_flags: int
    payload: bytes
    # Not on the wire: the payload's columns, decoded (and so checked) once by check().
    columns: Columns | None = dataclasses.field(default=None, compare=False, repr=False)

    def check(self) -> None:
        if self.partition < -1 or self.timestamps_given not in (0, 1):
            raise LocalProtocolError("APPEND has an impossible partition or flag")
        if self.columns is None:
            columns = decode_records(self.payload, self.payload_flags, self.record_count)
            if columns.header_lengths is not None:  # rare: worth a loop to refuse garbage
                try:
                    for blob in _split(bytes(columns.headers), columns.header_lengths):
                        decode_headers(blob)
                except CorruptFrame as error:
                    raise LocalProtocolError(f"bad record headers: {error.reason}") from None
            object.__setattr__(self, "columns", columns)


class Start(enum.IntEnum):
    LOG_START = 0
    OFFSET = 1
    TIMESTAMP = 2


class Stop(enum.IntEnum):
    NONE = 0
    OFFSET = 1
    TIMESTAMP = 2


READ_FOLLOW, READ_DATA_ONLY, READ_COMMITTED = 1, 2, 4


@_message(MessageType.READ, _C, ("stream", "str"), ("partition", "u32"), ("start", "u8"),
          ("start_value", "i64"), ("stop", "u8"), ("stop_value", "i64"), ("flags", "u8"),
          ("credit_bytes", "u32"))
@dataclasses.dataclass(frozen=True, slots=True)
class Read(Message):
    stream: str
    partition: int
    start: int
    start_value: int
    stop: int
    stop_value: int
    flags: int
    credit_bytes: int

    def check(self) -> None:
        if self.start not in tuple(Start) or self.stop not in tuple(Stop):
            raise LocalProtocolError("READ has an unknown start or stop kind")
        if self.flags & ~(READ_FOLLOW | READ_DATA_ONLY | READ_COMMITTED):
            raise LocalProtocolError("READ has unknown flags")


@_message(MessageType.CREDIT, _C, ("credit_bytes", "u32"))
@dataclasses.dataclass(frozen=True, slots=True)
class Credit(Message):
    credit_bytes: int


@_message(MessageType.CANCEL, _C)
@dataclasses.dataclass(frozen=True, slots=True)
class Cancel(Message):
    pass


@_message(MessageType.OFFSETS, _C, ("stream", "str"), ("partition", "u32"))
@dataclasses.dataclass(frozen=True, slots=True)
class Offsets(Message):
    stream: str
    partition: int


@_message(MessageType.OFFSET_FOR_TIMESTAMP, _C, ("stream", "str"), ("partition", "u32"),
          ("timestamp_us", "i64"))
@dataclasses.dataclass(frozen=True, slots=True)
class OffsetForTimestamp(Message):
    stream: str
    partition: int
    timestamp_us: int


@_message(MessageType.INFO, _C)
@dataclasses.dataclass(frozen=True, slots=True)
class Info(Message):
    pass


@_message(MessageType.STREAMS, _C)
@dataclasses.dataclass(frozen=True, slots=True)
class Streams(Message):
    pass


@_message(MessageType.COMMIT_TXN, _C, ("stream", "str"), ("partition", "u32"),
          ("txn_id", "u64"), ("tag", "str"), ("marker", "blob"))
@dataclasses.dataclass(frozen=True, slots=True)
class CommitTxn(Message):
    stream: str
    partition: int
    txn_id: int
    tag: str
    marker: bytes


@_message(MessageType.ABORT_TXN, _C, ("stream", "str"), ("partition", "u32"), ("txn_id", "u64"))
@dataclasses.dataclass(frozen=True, slots=True)
class AbortTxn(Message):
    stream: str
    partition: int
    txn_id: int


@_message(MessageType.LAST_COMMIT, _C, ("stream", "str"), ("partition", "u32"), ("tag", "str"))
@dataclasses.dataclass(frozen=True, slots=True)
class LastCommit(Message):
    stream: str
    partition: int
    tag: str


@_message(MessageType.TRUNCATE_AFTER, _C, ("stream", "str"), ("partition", "u32"),
          ("offset", "i64"))
@dataclasses.dataclass(frozen=True, slots=True)
class TruncateAfter(Message):
    stream: str
    partition: int
    offset: int


@_message(MessageType.TXN_STATE, _C, ("stream", "str"), ("partition", "u32"), ("txn_id", "u64"))
@dataclasses.dataclass(frozen=True, slots=True)
class TxnStateRequest(Message):
    stream: str
    partition: int
    txn_id: int


@_message(MessageType.HELLO_OK, _S, ("version", "u16"), ("frame_bytes_max", "u32"),
          ("idle_timeout_ms", "u32"), ("server", "str"))
@dataclasses.dataclass(frozen=True, slots=True)
class HelloOk(Message):
    version: int
    frame_bytes_max: int
    idle_timeout_ms: int
    server: str = ""


@_message(MessageType.PONG, _S)
@dataclasses.dataclass(frozen=True, slots=True)
class Pong(Message):
    pass


@_message(MessageType.ERROR, _S, ("code", "u16"), ("message", "str"))
@dataclasses.dataclass(frozen=True, slots=True)
class Error(Message):
    code: int
    message: str


@_message(MessageType.APPENDED, _S, ("records", "u32"), ("ranges", "rest"))
@dataclasses.dataclass(frozen=True, slots=True)
class Appended(Message):
    """`ranges`: packed (u32 partition, i64 first, i64 last) triples; see ranges_of()."""

    records: int
    ranges: bytes

    def check(self) -> None:
        if len(self.ranges) % _RANGE.size:
            raise LocalProtocolError("APPENDED ranges are not whole triples")


_RANGE = struct.Struct(">Iqq")


def pack_ranges(ranges: dict[int, tuple[int, int]]) -> bytes:
    return b"".join(_RANGE.pack(p, first, last) for p, (first, last) in sorted(ranges.items()))


def ranges_of(message: Appended) -> dict[int, tuple[int, int]]:
    return {p: (first, last) for p, first, last in _RANGE.iter_unpack(message.ranges)}


@_message(MessageType.BATCH, _S, ("partition", "u32"), ("base_offset", "i64"),
          ("txn_id", "u64"), ("record_count", "u32"), ("payload_flags", "u8"),
          ("payload", "view"))
@dataclasses.dataclass(frozen=True, slots=True)
class Batch(Message):
    """Records [base_offset, base_offset + record_count) of a READ, control records
    included (the client filters them as a local reader would)."""

    partition: int
    base_offset: int
    txn_id: int
    record_count: int
    payload_flags: int
    payload: bytes

    def check(self) -> None:
        if self.base_offset < 0 or self.record_count < 1:
            raise LocalProtocolError("BATCH has an impossible offset or count")
        if self.payload_flags & ~PAYLOAD_FLAGS_KNOWN:
            raise LocalProtocolError("BATCH has unknown payload flags")


@_message(MessageType.READ_OPENED, _S, ("start_offset", "i64"))
@dataclasses.dataclass(frozen=True, slots=True)
class ReadOpened(Message):
    start_offset: int


@_message(MessageType.READ_END, _S, ("next_offset", "i64"))
@dataclasses.dataclass(frozen=True, slots=True)
class ReadEnd(Message):
    next_offset: int


@_message(MessageType.RESULT_INT, _S, ("value", "i64"))
@dataclasses.dataclass(frozen=True, slots=True)
class ResultInt(Message):
    value: int


@_message(MessageType.RESULT_OFFSETS, _S, ("start_offset", "i64"), ("end_offset", "i64"),
          ("stable_offset", "i64"))
@dataclasses.dataclass(frozen=True, slots=True)
class ResultOffsets(Message):
    start_offset: int
    end_offset: int
    stable_offset: int  # Log.last_stable_offset: the oldest open transaction's start


@_message(MessageType.RESULT_JSON, _S, ("body", "rest"))
@dataclasses.dataclass(frozen=True, slots=True)
class ResultJson(Message):
    body: bytes

    def value(self):
        return json.loads(self.body)

    def check(self) -> None:
        try:
            json.loads(self.body)
        except ValueError:
            raise LocalProtocolError("RESULT_JSON is not JSON") from None


@_message(MessageType.RESULT_BYTES, _S, ("present", "u8"), ("value", "rest"))
@dataclasses.dataclass(frozen=True, slots=True)
class ResultBytes(Message):
    present: int
    value: bytes


def encode_message(message: Message) -> bytes:
    """One whole frame for `message`. Raises LocalProtocolError for values that do not
    fit their fields or that check() refuses."""
    return b"".join(encode_message_parts(message))


def encode_message_parts(message: Message) -> list:
    """The frame for `message` as [head, payload]: a record payload is not copied into
    the frame (the caller writes both parts back to back), other messages are [frame]."""
    if not 0 <= message.request_id <= REQUEST_ID_MAX:
        raise LocalProtocolError(f"request_id {message.request_id} is out of range")
    message.check()
    parts = [b""]
    for name, kind in message.FIELDS:
        parts.append(_encode_field(kind, getattr(message, name)))
    length = FRAME_BYTES_MIN + sum(map(len, parts))
    parts[0] = HEADER.pack(length, message.TYPE, message.request_id)
    if message.FIELDS and message.FIELDS[-1][1] == "view":
        return [b"".join(parts[:-1]), parts[-1]]
    return [b"".join(parts)]


def decode_message(type_code: int, request_id: int, body) -> Message:
    """The message of one frame. Raises LocalProtocolError for a body that is not one;
    the connection re-raises it as RemoteProtocolError."""
    try:
        cls = MESSAGES[MessageType(type_code)]
    except ValueError:
        raise LocalProtocolError(f"unknown message type {type_code}") from None
    cursor = _Cursor(memoryview(body))
    values = [cursor.field(kind) for _, kind in cls.FIELDS]
    if cursor.position != len(cursor.view):
        raise LocalProtocolError(f"{cls.TYPE.name} has {len(cursor.view) - cursor.position}"
                                 f" bytes after its fields")
    message = cls(request_id, *values)
    message.check()
    return message


def error_message(request_id: int, error: BaseException) -> Error:
    """The ERROR message that tells a peer about `error`."""
    text = str(error) or type(error).__name__
    return Error(request_id, int(error_code_for(error)), text[:ERROR_MESSAGE_CHARS_MAX])


# -- records <-> payload ---------------------------------------------------------------

def encode_records(timestamps_us, keys, values, kinds=None, headers=None) -> tuple[bytes, int]:
    """The payload of an APPEND: the log's columnar layout (payload.encode_payload).
    The caller has checked types (bytes values and keys, int timestamps)."""
    return encode_payload(timestamps_us, keys, values, kinds, headers)


def decode_records(payload, payload_flags: int, record_count: int, *, base_offset: int = 0,
                   txn_id: int = 0) -> Columns:
    """Columns of an APPEND or BATCH payload, checked; LocalProtocolError if they do not
    add up (no zstd on the wire: loopback and LAN links are faster than decompression)."""
    if payload_flags & ~PAYLOAD_FLAGS_KNOWN:
        raise LocalProtocolError(f"unknown payload flags {payload_flags:#x}")
    if record_count < 1:
        raise LocalProtocolError("a record payload must hold at least one record")
    frame = Frame(0, base_offset, record_count, 0, 0, txn_id, payload_flags | CODEC_NONE,
                  len(payload), payload)
    try:
        columns = decode_columns(frame)
    except CorruptFrame as error:
        raise LocalProtocolError(f"bad record payload: {error.reason}") from None
    if columns.kinds is not None and int(columns.kinds.max()) > _KIND_MAX:
        raise LocalProtocolError("record payload has an unknown record kind")
    if columns.header_lengths is not None and int(columns.header_lengths.min()) < 0:
        raise LocalProtocolError("record payload has a negative header length")
    return columns


_KIND_MAX = max(RecordKind)


def encode_slice(columns: Columns, lo: int, hi: int) -> tuple[bytes, int]:
    """Payload of rows [lo, hi) of a decoded batch, with no loop per record."""
    assert 0 <= lo < hi <= len(columns)
    flags = 0
    whole = lo == 0 and hi == len(columns)
    parts = [columns.timestamps_us[lo:hi].tobytes(), columns.key_lengths[lo:hi].tobytes(),
             columns.value_lengths[lo:hi].tobytes()]
    if columns.header_lengths is not None:
        flags |= FLAG_HAS_HEADERS
        parts.append(columns.header_lengths[lo:hi].tobytes())
    if columns.kinds is not None:
        flags |= FLAG_HAS_CONTROL
        parts.append(columns.kinds[lo:hi].tobytes())
    if whole:
        parts += [columns.keys, columns.values]
        if columns.headers is not None:
            parts.append(columns.headers)
    else:
        parts.append(_blob_slice(np.maximum(columns.key_lengths, 0), columns.keys, lo, hi))
        parts.append(_blob_slice(columns.value_lengths, columns.values, lo, hi))
        if columns.headers is not None:
            parts.append(_blob_slice(columns.header_lengths, columns.headers, lo, hi))
    return b"".join(parts), flags


def encode_slices(slices) -> tuple[bytes, int]:
    """One payload for several (columns, lo, hi) slices of consecutive offsets, so a
    replay sends few large BATCH messages; still no loop per record."""
    if len(slices) == 1:
        return encode_slice(*slices[0])
    headers = any(c.header_lengths is not None for c, _, _ in slices)
    control = any(c.kinds is not None for c, _, _ in slices)
    parts = [c.timestamps_us[lo:hi].tobytes() for c, lo, hi in slices]
    parts += [c.key_lengths[lo:hi].tobytes() for c, lo, hi in slices]
    parts += [c.value_lengths[lo:hi].tobytes() for c, lo, hi in slices]
    if headers:
        parts += [_or_zeros(c.header_lengths, lo, hi, "<i4") for c, lo, hi in slices]
    if control:
        parts += [_or_zeros(c.kinds, lo, hi, "u1") for c, lo, hi in slices]
    parts += [_blob_slice(np.maximum(c.key_lengths, 0), c.keys, lo, hi) for c, lo, hi in slices]
    parts += [_blob_slice(c.value_lengths, c.values, lo, hi) for c, lo, hi in slices]
    if headers:
        parts += [_blob_slice(c.header_lengths, c.headers, lo, hi) for c, lo, hi in slices
                  if c.header_lengths is not None]
    flags = (FLAG_HAS_HEADERS if headers else 0) | (FLAG_HAS_CONTROL if control else 0)
    return b"".join(parts), flags


def _or_zeros(column: np.ndarray | None, lo: int, hi: int, dtype: str) -> bytes:
    return (column[lo:hi] if column is not None else np.zeros(hi - lo, dtype)).tobytes()


def _blob_slice(lengths: np.ndarray, blob, lo: int, hi: int):
    if lo == 0 and hi == len(lengths):
        return blob
    start = int(lengths[:lo].sum())
    return blob[start:start + int(lengths[lo:hi].sum())]


def columns_to_lists(columns: Columns, *, timestamps: bool = True):
    """(timestamps, keys, values, kinds, headers) lists of a decoded APPEND, for
    Log.append_batch. kinds / headers are None when the payload has none; timestamps
    None when not asked for."""
    timestamps = columns.timestamps_us.tolist() if timestamps else None
    values = _split(bytes(columns.values), columns.value_lengths)
    key_lengths = columns.key_lengths
    if len(key_lengths) and int(key_lengths.min()) >= 0:
        keys = _split(bytes(columns.keys), key_lengths)
    elif int(key_lengths.max()) < 0:
        keys = [None] * len(key_lengths)
    else:
        present = iter(_split(bytes(columns.keys), np.maximum(key_lengths, 0)))
        keys = [next(present) if length >= 0 else (next(present), None)[1]
                for length in key_lengths.tolist()]
    kinds = columns.kinds.tolist() if columns.kinds is not None else None
    headers = None
    if columns.header_lengths is not None:
        headers = [decode_headers(blob) for blob in
                   _split(bytes(columns.headers), columns.header_lengths)]
    return timestamps, keys, values, kinds, headers


def _split(blob: bytes, lengths: np.ndarray) -> list[bytes]:
    ends = np.cumsum(lengths, dtype=np.int64).tolist()
    return [blob[start:end] for start, end in zip([0, *ends], ends)]  # faster than map()


# -- the connection --------------------------------------------------------------------

_SEND_TRANSITIONS = {
    (Role.CLIENT, START, Hello): HELLO_SENT,
    (Role.SERVER, HELLO_RECEIVED, HelloOk): READY,
    (Role.SERVER, HELLO_RECEIVED, Error): DONE,
    (Role.SERVER, AWAIT_HELLO, Error): DONE,
    (Role.SERVER, ERROR, Error): ERROR,
}
_RECEIVE_TRANSITIONS = {
    (Role.SERVER, AWAIT_HELLO, Hello): HELLO_RECEIVED,
    (Role.CLIENT, HELLO_SENT, HelloOk): READY,
    (Role.CLIENT, HELLO_SENT, Error): DONE,
    (Role.CLIENT, START, Error): DONE,  # refused (connection limit) before our HELLO
}


class Connection:
    """One side of one connection. Used by one task at a time (not thread-safe).

    Args:
        role: Role.CLIENT or Role.SERVER.
        frame_bytes_max: the largest length field accepted from the peer once the
            handshake is done (before it, HELLO_BYTES_MAX).
    """

    def __init__(self, role: Role, frame_bytes_max: int = FRAME_BYTES_MAX) -> None:
        assert frame_bytes_max >= HELLO_BYTES_MAX
        self.role = role
        self.frame_bytes_max = frame_bytes_max
        self.state = START if role is Role.CLIENT else AWAIT_HELLO
        self._buffer = bytearray()
        self._start = 0
        self._eof = False

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer) - self._start

    def receive_data(self, data: bytes) -> None:
        """Buffer bytes from the peer; b"" means the peer closed its side."""
        if not data:
            self._eof = True
            return
        if self._start and self._start * 2 >= len(self._buffer):
            del self._buffer[:self._start]
            self._start = 0
        self._buffer += data

    def next_event(self):
        """The next whole message, NEED_DATA, or CLOSED. Raises RemoteProtocolError for
        bytes or messages the protocol forbids (and stays in ERROR)."""
        if self.state is ERROR:
            raise RemoteProtocolError("the connection already failed")
        try:
            return self._next_event()
        except LocalProtocolError as error:
            self.state = ERROR
            raise RemoteProtocolError(str(error), error.error_code) from None

    def _next_event(self):
        available = len(self._buffer) - self._start
        if available < HEADER.size:
            return self._starved(available)
        length, type_code, request_id = HEADER.unpack_from(self._buffer, self._start)
        limit = self.frame_bytes_max if self.state is READY else HELLO_BYTES_MAX
        if length > limit:
            raise LocalProtocolError(f"frame of {length} bytes is over the limit of {limit}",
                                     ErrorCode.FRAME_TOO_LARGE)
        if length < FRAME_BYTES_MIN:
            raise LocalProtocolError(f"frame length {length} is impossible")
        if available < 4 + length:
            return self._starved(available)
        body = bytes(memoryview(self._buffer)[self._start + HEADER.size:self._start + 4 + length])
        self._start += 4 + length
        message = decode_message(type_code, request_id, body)
        self._transition_received(message)
        return message

    def _starved(self, available: int):
        if not self._eof:
            return NEED_DATA
        if available:
            raise LocalProtocolError(f"the peer closed the connection inside a frame "
                                     f"({available} bytes of it received)")
        return CLOSED

    def _transition_received(self, message: Message) -> None:
        target = _RECEIVE_TRANSITIONS.get((self.role, self.state, type(message)))
        if target is not None:
            self.state = target
            return
        if self.state is READY and message.FROM is not self.role and not isinstance(
                message, (Hello, HelloOk)):
            return
        if self.role is Role.SERVER and self.state is AWAIT_HELLO:
            raise LocalProtocolError(f"expected HELLO, got {message.TYPE.name}",
                                     ErrorCode.UNAUTHENTICATED)
        raise LocalProtocolError(f"{message.TYPE.name} is not allowed in state "
                                 f"{self.state!r} from the {message.FROM.value}")

    def send(self, message: Message) -> bytes:
        """Bytes to write for `message`. Raises LocalProtocolError if this side may not
        send it now."""
        return b"".join(self.send_parts(message))

    def send_parts(self, message: Message) -> list:
        """send(), as buffers to write in order (a record payload is not copied)."""
        target = _SEND_TRANSITIONS.get((self.role, self.state, type(message)))
        if target is None:
            if not (self.state is READY and message.FROM is self.role
                    and not isinstance(message, (Hello, HelloOk))):
                raise LocalProtocolError(f"cannot send {message.TYPE.name} in state "
                                         f"{self.state!r} as the {self.role.value}")
            target = READY
        parts = encode_message_parts(message)
        self.state = target
        return parts

    def send_failed(self) -> None:
        """The shell could not write; nothing more should be sent or parsed."""
        self.state = ERROR
