"""The Kafka wire codec: frames, request headers and bodies, responses. No I/O.

Strategy: the message schemas are kio's (`kio` on PyPI, Apache-2.0): dataclasses
generated from the JSON message definitions in Kafka's own source tree, one per API
key and version, flexible versions and tagged fields included, with a native parser
that reads from a buffer and writers that write to a file-like object. So this module
only frames and dispatches:

  - `FrameReader` buffers bytes (`receive(data)`) and hands out whole frames
    (`next_frame()`, None until one is complete): a 4-byte big-endian size, then that
    many bytes. A size above the bound, or negative, raises FrameTooLarge before the
    body is buffered (as our own port does).
  - `parse_request(frame)` reads api key and version, refuses what `SERVED` does not
    list (UnsupportedRequest, with an UNSUPPORTED_VERSION response when Kafka's schema
    has one for that key and version), then parses header and body as Kafka's broker
    does: a tagged field whose tag the schema does not know is skipped (KIP-482: a
    client may send tags a broker does not know; librdkafka's Metadata v9 for all topics
    ends in bytes that read as one), and bytes after a whole request are ignored.
    kio's native reader refuses unknown tags, so it parses first (the common case, fast)
    and `_lenient_reader`, the same walk over kio's schema with unknown tags skipped,
    parses what it refused; kio reads every primitive field in both.
  - `encode_response(request, body)` picks the response header version (the body's,
    except that ApiVersions always answers with header v0, as Kafka's brokers do) and
    returns the framed bytes; `encode_response_parts` the same as parts to write one
    after the other, a Fetch's records (bytes, or `Pieces`) among them uncopied.
  - `build(cls, **fields)` makes a response entity from plain values (nested lists of
    dicts), dropping the fields this version does not have and zero-filling the
    required ones not given, so the broker writes one handler per API, not per version.

Errors: KafkaProtocolError (garbage: the connection ends, its reason logged),
UnsupportedRequest (see above).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import struct
import typing
import uuid

from kio.index import KioIndexError, load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer
from kio.serial._introspect import classify_field, get_field_tag, is_optional
from kio.serial._parse import get_field_reader
from kio.serial.readers import (read_compact_array_length, read_int8,
                                read_legacy_array_length, read_unsigned_varint)
from kio.static.constants import EntityType

from .errors import ErrorCode, FrameTooLarge, KafkaProtocolError, UnsupportedRequest

# api key -> (name, min version, max version) that this broker serves. The maxima are
# those current clients negotiate (librdkafka 2.x, kafka-python 2.x/3.x, aiokafka 0.1x)
# short of the versions that need topic ids (Fetch 13+, Metadata 10+) or KIP-848's
# consumer protocol; the minima are the oldest versions kio has schemas for.
SERVED: dict[int, tuple[str, int, int]] = {
    0: ("Produce", 3, 9),
    1: ("Fetch", 4, 12),
    2: ("ListOffsets", 1, 7),
    3: ("Metadata", 0, 9),
    8: ("OffsetCommit", 2, 8),
    9: ("OffsetFetch", 1, 7),
    10: ("FindCoordinator", 0, 3),
    11: ("JoinGroup", 0, 7),
    12: ("Heartbeat", 0, 4),
    13: ("LeaveGroup", 0, 4),
    14: ("SyncGroup", 0, 5),
    15: ("DescribeGroups", 0, 5),
    16: ("ListGroups", 0, 5),
    17: ("SaslHandshake", 0, 1),
    18: ("ApiVersions", 0, 4),
    19: ("CreateTopics", 2, 5),
    20: ("DeleteTopics", 1, 6),
    21: ("DeleteRecords", 0, 2),
    22: ("InitProducerId", 0, 4),
    24: ("AddPartitionsToTxn", 0, 3),
    25: ("AddOffsetsToTxn", 0, 3),
    26: ("EndTxn", 0, 3),
    28: ("TxnOffsetCommit", 0, 3),
    32: ("DescribeConfigs", 1, 4),
    36: ("SaslAuthenticate", 0, 2),
    37: ("CreatePartitions", 0, 3),
    42: ("DeleteGroups", 0, 2),
    47: ("OffsetDelete", 0, 0),
    60: ("DescribeCluster", 0, 1),
}
API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
FRAME_BYTES_MAX = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes default
_SIZE = struct.Struct(">i")
_KEY_VERSION_CORRELATION = struct.Struct(">hhi")
# kio finds a schema class by importing its module by name each time: once is enough
_request_schema = functools.cache(load_request_schema)
_response_schema = functools.cache(load_response_schema)


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """A parsed request: the header's fields and the kio body entity."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: typing.Any

    @property
    def name(self) -> str:
        return SERVED[self.api_key][0]


class FrameReader:
    """Size-prefixed frames out of a byte stream. `receive` only buffers."""

    def __init__(self, frame_bytes_max: int = FRAME_BYTES_MAX) -> None:
        self.frame_bytes_max = frame_bytes_max
        self._buffer = bytearray()
        self._position = 0

    def receive(self, data: bytes) -> None:
        self._buffer += data

    @property
    def buffered(self) -> int:
        return len(self._buffer) - self._position

    def next_frame(self) -> bytes | None:
        """The next whole frame's body, or None when more bytes are needed.

        Raises FrameTooLarge for a size above the bound or below zero."""
        if self.buffered < 4:
            return None
        (size,) = _SIZE.unpack_from(self._buffer, self._position)
        if size < 0 or size > self.frame_bytes_max:
            raise FrameTooLarge(f"a request of {size} bytes (the bound is "
                                f"{self.frame_bytes_max})")
        if self.buffered < 4 + size:
            return None
        start = self._position + 4
        frame = bytes(self._buffer[start:start + size])
        self._position = start + size
        if self._position > 65536 and self._position * 2 > len(self._buffer):
            del self._buffer[:self._position]  # compact now and then, not per frame
            self._position = 0
        return frame


def parse_request(frame: bytes) -> Request:
    """Header and body of one request frame.

    Raises:
        UnsupportedRequest: an API key or version not in SERVED.
        KafkaProtocolError: bytes that do not parse as the request they claim to be.
    """
    if len(frame) < _KEY_VERSION_CORRELATION.size:
        raise KafkaProtocolError(f"a request of {len(frame)} bytes has no header")
    api_key, version, correlation_id = _KEY_VERSION_CORRELATION.unpack_from(frame, 0)
    served = SERVED.get(api_key)
    if served is None or not served[1] <= version <= served[2]:
        raise UnsupportedRequest(
            f"api key {api_key} version {version} is not served"
            + ("" if served is None else f" ({served[0]} {served[1]}..{served[2]})"),
            api_key, version, correlation_id, _unsupported_response(
                api_key, version, correlation_id))
    schema = _request_schema(api_key, version)
    try:
        header, used = _parse(schema.__header_schema__, frame, 0)
        body, _size = _parse(schema, frame, used)  # bytes after it: ignored, as by Kafka
    except Exception as error:  # kio's readers raise several kinds for bad bytes
        raise KafkaProtocolError(f"{served[0]} v{version} does not parse: "
                                 f"{type(error).__name__}: {error}") from None
    return Request(api_key, version, correlation_id, header.client_id, body)


def response_schema(request: Request):
    return _response_schema(request.api_key, request.api_version)


def encode_response(request: Request, body) -> bytes:
    """The framed response to `request` (body: an entity of its response schema)."""
    return b"".join(encode_response_parts(request, body))


def encode_response_parts(request: Request, body) -> list:
    """`encode_response` as bytes-like parts to write in order: a large field (a
    Fetch's records, given as they are or as `Pieces`) stays where it was, uncopied."""
    return _encode_parts(request.api_key, request.correlation_id, body)


class Pieces:
    """A bytes field given in pieces (a Fetch's record batches), for a response whose
    parts are written one after the other: kio takes its length (len) and writes it
    (to `_Parts`, which keeps the pieces), as it does with bytes."""

    __slots__ = ("pieces", "size")

    def __init__(self, pieces) -> None:
        self.pieces = [memoryview(piece).cast("B") for piece in pieces]
        self.size = sum(len(piece) for piece in self.pieces)

    def __len__(self) -> int:
        return self.size


def _encode(api_key: int, correlation_id: int, body) -> bytes:
    return b"".join(_encode_parts(api_key, correlation_id, body))


def _encode_parts(api_key: int, correlation_id: int, body) -> list:
    out = _Parts()
    out.write(b"\0\0\0\0")  # the size, set below
    if api_key == API_VERSIONS:
        out.write(_SIZE.pack(correlation_id))  # header v0 always (KIP-511)
    else:
        header_schema = type(body).__header_schema__
        _writer(header_schema)(out, header_schema(correlation_id=correlation_id))
    _writer(type(body))(out, body)
    parts = out.parts()
    parts[0][:4] = _SIZE.pack(out.size - 4)
    return parts


class _Parts:
    """What kio's writers write to: small writes gathered in a bytearray, large ones
    (a Fetch's records) kept as they are, so that the response is not copied here."""

    _LARGE_BYTES = 64 * 1024

    def __init__(self) -> None:
        self._parts: list = []
        self._small = bytearray()
        self.size = 0

    def write(self, data) -> None:
        pieces = data.pieces if isinstance(data, Pieces) else [data]
        self.size += len(data)
        if len(data) < self._LARGE_BYTES:
            for piece in pieces:
                self._small += piece
            return
        if self._small or not self._parts:
            self._parts.append(self._small)
            self._small = bytearray()
        self._parts += pieces

    def parts(self) -> list:
        """The parts in order; the first is a bytearray (the frame's size goes there)."""
        return [*self._parts, self._small] if self._small or not self._parts else self._parts


def _unsupported_response(api_key: int, version: int, correlation_id: int) -> bytes | None:
    """UNSUPPORTED_VERSION in the shape the client expects: for ApiVersions, v0 with
    our versions (the client then retries with one of them, as KIP-511 says); for
    other keys, the asked version's schema with every error code set, when kio has it."""
    if api_key == API_VERSIONS:
        schema = load_response_schema(API_VERSIONS, 0)
        return _encode(api_key, correlation_id,
                       build(schema, error_code=ErrorCode.unsupported_version,
                             api_keys=api_versions_list()))
    schema = _response_schema_or_oldest(api_key, version)
    if schema is None:
        return None
    return _encode(api_key, correlation_id, zero(schema, ErrorCode.unsupported_version))


# Versions Kafka 4 dropped (kio has no schema for them) whose response has the same
# top-level fields as a version kio has: an UNSUPPORTED_VERSION answer in that version,
# every array empty, reads the same to the old client (DescribeConfigs v0: throttle
# time, results; v1 added fields inside the results only).
_ANSWER_AS = {(32, 0): 1}


def _response_schema_or_oldest(api_key: int, version: int):
    """The response schema to answer `api_key` `version` in: its own, or the one
    _ANSWER_AS names; None when there is none (the connection then ends)."""
    try:
        return load_response_schema(api_key, _ANSWER_AS.get((api_key, version), version))
    except (KioIndexError, KeyError, ValueError):
        return None


def api_versions_list() -> list[dict]:
    return [{"api_key": key, "min_version": low, "max_version": high}
            for key, (_name, low, high) in sorted(SERVED.items())]


# -- reading requests ------------------------------------------------------------------

def _parse(schema, frame: bytes, offset: int):
    """(entity, size) of `schema` at `offset`: kio's native reader, or when it refuses
    the bytes (an unknown tagged field, or garbage), the lenient one, whose error is
    the one reported."""
    try:
        return _reader(schema)(frame, offset)
    except Exception:
        return _lenient_reader(schema)(frame, offset)


@functools.cache
def _lenient_reader(schema):
    """A reader of `schema` (a request, its header or a nested struct) that skips the
    tagged fields it does not know, as Kafka's generated readers do. Fields are read in
    the schema's order: the untagged ones, then in a flexible version the tagged-field
    section (a count, then tag, size and value of each): an unknown tag's value is
    skipped by its size, a known one's is read; tagged fields not sent keep their
    defaults."""
    is_header = schema.__type__ is EntityType.header
    untagged, tagged = [], {}
    for field in dataclasses.fields(schema):
        tag = get_field_tag(field)
        read = _lenient_field_reader(schema, field, is_header, tag is not None)
        if tag is None:
            untagged.append((field.name, read))
        else:
            tagged[tag] = (field.name, read)
    flexible = schema.__flexible__

    def read(buffer, offset: int):
        start = offset
        values = {}
        for name, read_field in untagged:
            values[name], size = read_field(buffer, offset)
            offset += size
        if flexible:
            count, size = read_unsigned_varint(buffer, offset)
            offset += size
            for _ in range(count):
                tag, size = read_unsigned_varint(buffer, offset)
                offset += size
                length, size = read_unsigned_varint(buffer, offset)
                offset += size
                end = offset + length
                if end > len(buffer):
                    raise KafkaProtocolError(f"tagged field {tag} of {schema.__name__}: "
                                             f"{length} bytes, past the request's end")
                known = tagged.get(tag)
                if known is None:
                    offset = end
                else:  # read as its schema says, the size not consulted (as Kafka, kio)
                    name, read_field = known
                    values[name], size = read_field(buffer, offset)
                    offset += size
        return schema(**values), offset - start

    return read


def _lenient_field_reader(schema, field, is_header: bool, is_tagged: bool):
    """The reader of one field: kio's for primitives and arrays of them; for a struct
    or an array of structs, the lenient reader of the struct (kio's would refuse an
    unknown tag inside it)."""
    kind = classify_field(field)
    if not dataclasses.is_dataclass(kind.type_):
        return get_field_reader(schema, field, is_header, is_tagged)
    item = _lenient_reader(kind.type_)
    if not kind.is_array:
        if not is_optional(field):
            return item

        def read_nullable(buffer, offset: int):  # a nullable struct: int8 -1 or 1 first
            marker, size = read_int8(buffer, offset)
            if marker < 0:
                return None, size
            value, used = item(buffer, offset + size)
            return value, size + used

        return read_nullable
    read_length = read_compact_array_length if schema.__flexible__ else \
        read_legacy_array_length

    def read_array(buffer, offset: int):
        length, size = read_length(buffer, offset)
        if length is None or length < 0:
            if not is_optional(field):
                raise KafkaProtocolError(f"{schema.__name__}.{field.name} is null")
            return None, size
        start = offset
        offset += size
        items = []
        for _ in range(length):
            value, size = item(buffer, offset)
            items.append(value)
            offset += size
        return tuple(items), offset - start

    return read_array


# -- building entities from plain values ------------------------------------------------

@functools.cache
def _reader(schema):
    return entity_reader(schema)


@functools.cache
def _writer(schema):
    return entity_writer(schema)


@functools.cache
def _fields(cls) -> tuple[tuple[str, typing.Any, str | None, bool], ...]:
    """(name, type hint, kafka_type, has default) of each field of an entity class."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name], f.metadata.get("kafka_type"),
                  f.default is not dataclasses.MISSING
                  or f.default_factory is not dataclasses.MISSING)
                 for f in dataclasses.fields(cls))


def _entity_of(hint):
    """The entity class a field holds (itself, in a tuple, or optional), else None."""
    for candidate in (hint, *typing.get_args(hint)):
        if dataclasses.is_dataclass(candidate):
            return candidate
        for inner in typing.get_args(candidate):
            if dataclasses.is_dataclass(inner):
                return inner
    return None


def _is_tuple(hint) -> bool:
    return typing.get_origin(hint) is tuple or any(
        typing.get_origin(a) is tuple for a in typing.get_args(hint))


def _convert(hint, kafka_type, value):
    if value is None:
        return None
    entity = _entity_of(hint)
    if entity is not None:
        if _is_tuple(hint):
            return tuple(v if dataclasses.is_dataclass(v) else build(entity, **v)
                         for v in value)
        return value if dataclasses.is_dataclass(value) else build(entity, **value)
    if kafka_type == "error_code":
        return ErrorCode(int(value))
    if kafka_type in ("timedelta_i32", "timedelta_i64") and isinstance(value, int):
        return datetime.timedelta(milliseconds=value)
    if _is_tuple(hint):
        return tuple(value)
    return value


def build(cls, **values):
    """An entity of `cls` from plain values: fields this version lacks are dropped,
    required fields not given are zero-filled (error codes: NONE)."""
    kwargs = {}
    for name, hint, kafka_type, has_default in _fields(cls):
        if name in values:
            kwargs[name] = _convert(hint, kafka_type, values[name])
        elif not has_default:
            kwargs[name] = _zero_value(hint, kafka_type, ErrorCode.none)
    return cls(**kwargs)


def zero(cls, code: ErrorCode):
    """An entity of `cls` with every required field zero and every error code `code`."""
    kwargs = {}
    for name, hint, kafka_type, has_default in _fields(cls):
        if kafka_type == "error_code" or not has_default:
            kwargs[name] = _zero_value(hint, kafka_type, code)
    return cls(**kwargs)


def _zero_value(hint, kafka_type, code: ErrorCode):
    if kafka_type == "error_code":
        return code
    if _is_tuple(hint):
        return ()
    entity = _entity_of(hint)
    if entity is not None:
        return zero(entity, code)
    if type(None) in typing.get_args(hint):
        return None
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(0)
    if kafka_type == "string":
        return ""
    if kafka_type in ("bytes", "records"):
        return b""
    if kafka_type == "bool":
        return False
    if kafka_type == "uuid":
        return uuid.UUID(int=0)
    if kafka_type == "float64":
        return 0.0
    return 0
