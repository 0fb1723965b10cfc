"""The daemon's messages: frame layout, field kinds, message classes, encode / decode.

Strategy: a message is a frozen dataclass whose class says its type number (`TYPE`),
which side sends it (`FROM`) and its fields in wire order (`FIELDS`: name and kind);
`encode_message` and `decode_message` walk FIELDS, so a message class is its codec.
This module holds the messages with code of their own (the handshake, APPEND and READ
and what a READ streams back, the replies); the request of each request/reply
operation is built from its row in operations.py by `request_message`. Pure: no
socket, no event loop.

Frame layout (big-endian; every message is one frame):

    offset size type  field
         0    4  u32  length       bytes after this field: 5 + body (at most the limit)
         4    1  u8   type         MessageType
         5    4  u32  request_id   chosen by the client; a reply or a pushed batch carries
                                   the id of the request it answers
         9    .  .    body         the message's fields, in the order of its FIELDS

Field kinds: u8 u16 u32 i32 i64 u64; `opt_i64` (u8 present, 0 or 1, + i64: an int or
None, whose i64 is 0); `str` (u16 length + UTF-8); `blob` (u32 length +
bytes); `rest` / `view` (every remaining byte, last field only; `view` is a memoryview
of the received body, so a record payload is copied once, out of the receive buffer,
and is sent without being copied into its frame: `encode_message_parts`). Record
payloads are columns.py's.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import struct
from typing import ClassVar

from ..payload import Columns
from .codes import LocalProtocolError, MessageType, error_code_for
from .columns import PAYLOAD_FLAGS_KNOWN, check_headers, decode_records

WIRE_VERSION = 1
HEADER = struct.Struct(">IBI")
assert HEADER.size == 9
FRAME_BYTES_MIN = 5  # type + request_id
# Default bound of one frame's length field; a server announces its own in HELLO_OK.
FRAME_BYTES_MAX = 32 * 1024 * 1024
# Before the HELLO is accepted, a peer gets no more than this (no 32 MiB pre-auth buffer).
HELLO_BYTES_MAX = 64 * 1024
REQUEST_ID_MAX = (1 << 32) - 1
ERROR_MESSAGE_CHARS_MAX = 2000


class Role(enum.Enum):
    CLIENT = "client"
    SERVER = "server"


# -- field codec -----------------------------------------------------------------------

_SCALARS = {name: struct.Struct(">" + code) for name, code in
            (("u8", "B"), ("u16", "H"), ("u32", "I"), ("i32", "i"), ("i64", "q"),
             ("u64", "Q"))}
_U16, _U32 = _SCALARS["u16"], _SCALARS["u32"]
_OPTIONAL_I64 = struct.Struct(">Bq")
# The values each integer kind holds: what a client checks arguments against.
INT_BOUNDS = {name: ((0, (1 << 8 * s.size) - 1) if name[0] == "u"
                     else (-(1 << 8 * s.size - 1), (1 << 8 * s.size - 1) - 1))
              for name, s in _SCALARS.items()}
assert INT_BOUNDS["i64"] == (-(1 << 63), (1 << 63) - 1)
assert INT_BOUNDS["u32"] == (0, (1 << 32) - 1)
FIELD_KINDS = (*_SCALARS, "opt_i64", "str", "blob", "rest", "view")
_FIELD_TYPES = {**{name: int for name in _SCALARS}, "opt_i64": int | None, "str": str,
                "blob": bytes, "rest": bytes, "view": bytes}


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
        if kind == "opt_i64":
            present, value = _OPTIONAL_I64.unpack(self.take(_OPTIONAL_I64.size))
            if present > 1 or (not present and value):
                raise LocalProtocolError("an optional int field is neither an int nor None")
            return value if present else None
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
    if kind == "opt_i64":
        try:
            return _OPTIONAL_I64.pack(value is not None, value or 0)
        except struct.error:
            raise LocalProtocolError(f"{value!r} does not fit an {kind} field") from None
    if kind == "str":
        data = value.encode()
        if len(data) > 0xFFFF:
            raise LocalProtocolError("a text field is longer than 65535 bytes")
        return _U16.pack(len(data)) + data
    if kind == "blob":
        return _U32.pack(len(value)) + bytes(value)
    assert kind in ("rest", "view")
    return value


# -- message classes -------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class Message:
    """Base of every message: `request_id` ties a reply to its request."""

    request_id: int
    TYPE: ClassVar[enum.IntEnum]
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = ()
    FROM: ClassVar[Role]

    def check(self) -> None:
        """Raise LocalProtocolError for values the protocol does not allow."""


# The messages defined here, by type number; an operation table adds its requests to
# its own copy (operations.OperationTable.messages).
MESSAGES: dict[int, type[Message]] = {}


def _message(type_: MessageType, role: Role, *fields: tuple[str, str]):
    def register(cls):
        _describe(cls, type_, role, fields)
        assert type_ not in MESSAGES
        MESSAGES[type_] = cls
        return cls
    return register


def _describe(cls, type_: enum.IntEnum, role: Role, fields) -> None:
    assert all(kind in FIELD_KINDS for _, kind in fields), fields
    assert all(kind not in ("rest", "view") for _, kind in fields[:-1]), "rest is last"
    cls.TYPE, cls.FROM, cls.FIELDS = type_, role, tuple(fields)


def request_message(type_: enum.IntEnum, fields: tuple[tuple[str, str], ...]) -> type[Message]:
    """The message class of a client request with `fields` (name, kind), named after its
    type (CREATE_STREAM: CreateStream). Registered nowhere: the table that asks keeps it."""
    name = "".join(part.title() for part in type_.name.split("_"))
    cls = dataclasses.make_dataclass(
        name, [(field, _FIELD_TYPES[kind]) for field, kind in fields], bases=(Message,),
        frozen=True, slots=True)
    cls.__module__ = __name__
    _describe(cls, type_, Role.CLIENT, fields)
    return cls


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
            check_headers(columns)
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


# -- the replies of request/reply operations (operations.py says which carries what) ---

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


# -- encode / decode -------------------------------------------------------------------

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


def decode_message(type_code: int, request_id: int, body,
                   messages: dict[int, type[Message]] = MESSAGES) -> Message:
    """The message of one frame, of a class in `messages` (by type number). Raises
    LocalProtocolError for a body that is not one; the connection re-raises it as
    RemoteProtocolError."""
    cls = messages.get(type_code)
    if cls is None:
        raise LocalProtocolError(f"unknown message type {type_code}")
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
