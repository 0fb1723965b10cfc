"""The log API's operations over the wire, in one table.

Strategy: each operation is one row, and the row is the only place that says how its
methods travel. For example

    Operation(MessageType.TRUNCATE_AFTER, (STREAM, PARTITION, ("offset", "i64")), INT,
              writable=True)

says that `truncate_after` is sent as a TRUNCATE_AFTER request whose fields, in wire
order, are the Log method's parameters `stream`, `partition` and `offset` (named as in
api.LogAPI, with their field kinds); that the daemon answers it by calling
`log.truncate_after(stream=..., partition=..., offset=...)` on its thread pool; that the
int the log returns travels back as RESULT_INT (`INT`); and that a read-only client
refuses it. Everything else is built from the rows:

  - the request's message class (`Operation.request`, messages.request_message), and
    `OperationTable.messages`: every message a daemon decodes;
  - the daemon's answer (`Operation.serve` and `Operation.answer`): one handler in
    session.py answers every row;
  - the client's methods: client.py gives RemoteLog one method per method of a row, with
    LogAPI's signature; it checks the arguments against the field kinds
    (`request_values`), sends the request and decodes the reply (`result`).

Adding an operation is: a number in codes.MessageType, a row here, the method in
api.LogAPI and on Log. tests/unit/test_wire_operations.py checks that every row is
declared by the API, implemented by Log and RemoteLog, and answered by the daemon.

A row may answer several methods that take the same arguments (OFFSETS: the daemon calls
start_offset, end_offset and last_stable_offset, and one reply carries the three
results), or compute its result itself (`serve_with`; STREAMS), each method then
saying how it takes its value from the result (`Method.pick`). APPEND and READ stream
records under credit and keep code of their own (session.py, client.py); their rows
(`streamed=True`) list their methods so the table covers the whole API. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import json
import numbers
from typing import Any, Callable, Iterable, Mapping

from ..api import LogAPI
from ..errors import InvalidArgument, UnknownStream
from ..txn import TxnState
from .codes import CLIENT_TYPES_MAX, MessageType, RemoteProtocolError
from .messages import (INT_BOUNDS, MESSAGES, Message, ResultBytes, ResultInt, ResultJson,
                       ResultOffsets, request_message)

# LogAPI methods that send no request of their own: a fresh transaction id, a refresh (a
# daemon's answers are always fresh), a producer (its batches are APPENDs), and the
# client's own lifetime.
CLIENT_SIDE = ("new_txn_id", "refresh", "producer", "close", "aclose")
# Client messages that are not operations: the handshake, the heartbeat, and the two
# that steer a READ's stream.
CONNECTION_MESSAGES = (MessageType.HELLO, MessageType.PING, MessageType.CREDIT,
                       MessageType.CANCEL)


# -- replies ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Reply:
    """How a result travels back: the reply message, the result as its fields
    (`encode`, the daemon), and the result again from a reply (`decode`, the client)."""

    message: type[Message]
    encode: Callable[[Any], tuple]
    decode: Callable[[Message], Any]


INT = Reply(ResultInt, lambda value: (value,), lambda reply: reply.value)
BOOL = Reply(ResultInt, lambda value: (int(bool(value)),), lambda reply: reply.value != 0)
NOTHING = Reply(ResultInt, lambda value: (0,), lambda reply: None)  # a method returning None
JSON = Reply(ResultJson, lambda value: (json.dumps(value, default=str).encode(),),
             lambda reply: reply.value())
# {int: int} as JSON pairs (JSON's keys would be text).
INT_MAP = Reply(ResultJson, lambda value: (json.dumps(sorted(value.items())).encode(),),
                lambda reply: {int(key): int(item) for key, item in reply.value()})
OPTIONAL_BYTES = Reply(ResultBytes, lambda value: (int(value is not None), value or b""),
                       lambda reply: bytes(reply.value) if reply.present else None)
OFFSETS = Reply(ResultOffsets, tuple,
                lambda reply: (reply.start_offset, reply.end_offset, reply.stable_offset))


def optional_enum(kind: type[enum.IntEnum]) -> Reply:
    """An enum member or None as RESULT_INT; the enum's values are never 0."""
    assert 0 not in {int(member) for member in kind}
    return Reply(ResultInt, lambda value: (0 if value is None else int(value),),
                 lambda reply: None if reply.value == 0 else kind(reply.value))


# -- rows ------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Method:
    """A LogAPI method answered by an operation. `pick(result, arguments)` turns the
    operation's result into the method's return value (the arguments of the call,
    `self` included); None: the result is the return value."""

    name: str
    pick: Callable[[Any, Mapping[str, Any]], Any] | None = None


@dataclasses.dataclass(frozen=True)
class Operation:
    """One row: see the module docstring.

    Args:
        type: the request's MessageType (any IntEnum member for a table of one's own).
        fields: the request's fields, (name, kind) in wire order, named as the
            parameters of the methods.
        reply: how the result travels back; None for a streamed operation.
        methods: the LogAPI methods it answers (names or Methods); default the one
            named after the type (TRUNCATE_AFTER: truncate_after).
        writable: a read-only client refuses it.
        blocking: the daemon answers it on its thread pool; False for in-memory reads
            answered on the event loop.
        serve_with: `(log, **fields) -> result`, when the result is not the methods'.
        streamed: APPEND and READ: code of their own; the request class is messages.py's.
    """

    type: enum.IntEnum
    fields: tuple[tuple[str, str], ...] = ()
    reply: Reply | None = None
    methods: tuple[Method | str, ...] = ()
    writable: bool = False
    blocking: bool = True
    serve_with: Callable[..., Any] | None = None
    streamed: bool = False
    request: type[Message] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        assert 0 < self.type <= CLIENT_TYPES_MAX, f"{self.type!r} is not a client message"
        assert (self.reply is None) == self.streamed, self.type
        methods = tuple(Method(m) if isinstance(m, str) else m for m in self.methods)
        methods = methods or (Method(self.name),)
        if len(methods) > 1 and self.serve_with is None:  # one result per method, in order
            methods = tuple(m if m.pick else Method(m.name, _nth(i))
                            for i, m in enumerate(methods))
        object.__setattr__(self, "methods", methods)
        request = (MESSAGES[self.type] if self.streamed
                   else request_message(self.type, tuple(self.fields)))
        object.__setattr__(self, "request", request)

    @property
    def name(self) -> str:
        return self.type.name.lower()

    # -- the daemon's side ---------------------------------------------------------

    def serve(self, log, request: Message):
        """The result of `request` on `log`: each method called with the request's
        fields as keyword arguments (one result, or a tuple of one per method)."""
        arguments = {name: getattr(request, name) for name, _ in self.fields}
        if self.serve_with is not None:
            return self.serve_with(log, **arguments)
        results = tuple(getattr(log, method.name)(**arguments) for method in self.methods)
        return results[0] if len(results) == 1 else results

    def answer(self, request_id: int, result) -> Message:
        """The reply that carries `result`."""
        return self.reply.message(request_id, *self.reply.encode(result))

    # -- the client's side ---------------------------------------------------------

    def request_values(self, arguments: Mapping[str, Any]) -> tuple:
        """The request's field values, taken by name from a call's arguments.
        Raises InvalidArgument for a value its field cannot carry."""
        return tuple(check_argument(name, kind, arguments[name]) for name, kind in self.fields)

    def result(self, method: Method, reply: Message, arguments: Mapping[str, Any]):
        """`method`'s return value from the daemon's reply."""
        if not isinstance(reply, self.reply.message):
            raise RemoteProtocolError(f"{self.type.name} was answered with {reply.TYPE.name}")
        value = self.reply.decode(reply)
        return value if method.pick is None else method.pick(value, arguments)


def _nth(index: int):
    return lambda result, arguments: result[index]


def check_argument(name: str, kind: str, value):
    """`value` as field kind `kind` carries it; InvalidArgument when it cannot."""
    if kind == "opt_i64":
        return None if value is None else check_argument(name, "i64", value)
    if kind == "str":
        if not isinstance(value, str):
            raise InvalidArgument(f"{name} must be a str (got {type(value).__name__})")
        return value
    if kind == "blob":
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise InvalidArgument(f"{name} must be bytes (got {type(value).__name__})")
        return bytes(value)
    low, high = INT_BOUNDS[kind]
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidArgument(f"{name} must be an int (got {type(value).__name__})")
    if not low <= value <= high:
        raise InvalidArgument(f"{name} must be in {low}..{high} (got {value})")
    return int(value)


# -- the table -------------------------------------------------------------------------

class OperationTable:
    """Rows by name, by request type and by method, checked against `api` (a LogAPI
    protocol: every method of a row must be declared there, with each field of its
    row as a parameter, unless the method picks its value itself)."""

    def __init__(self, operations: Iterable[Operation], *, api: type = LogAPI) -> None:
        self.operations = tuple(operations)
        self.api = api
        self.by_type = {int(op.type): op for op in self.operations}
        self.by_method = {m.name: (op, m) for op in self.operations for m in op.methods}
        assert len(self.by_type) == len(self.operations), "a type is used twice"
        assert len(self.by_method) == sum(len(op.methods) for op in self.operations), \
            "a method is in two rows"
        assert all(op.streamed or op.type not in MESSAGES for op in self.operations), \
            "a request's type is taken by a message of messages.py"
        self.messages = {**MESSAGES, **{int(op.type): op.request for op in self.operations}}
        for op in self.operations:
            for method in op.methods:
                self._check_declared(op, method)

    def _check_declared(self, op: Operation, method: Method) -> None:
        declared = getattr(self.api, method.name, None)
        assert declared is not None, f"{method.name} is not declared by {self.api.__name__}"
        if op.streamed or method.pick is not None:
            return
        parameters = inspect.signature(declared).parameters
        for name, _ in op.fields:
            assert name in parameters, f"{op.name}: {method.name} has no parameter {name}"

    def __iter__(self):
        return iter(self.operations)

    def __getitem__(self, name: str) -> Operation:
        for op in self.operations:
            if op.name == name:
                return op
        raise KeyError(name)

    def extended(self, *operations: Operation, api: type | None = None) -> "OperationTable":
        """This table with more rows (and the protocol that declares their methods)."""
        return OperationTable(self.operations + operations, api=api or self.api)


# -- the rows of the log API -----------------------------------------------------------

def _partitions_by_stream(log) -> dict[str, int]:
    return {name: log.partition_count(name) for name in log.streams()}


def _partition_count(counts: dict[str, int], arguments) -> int:
    stream = arguments["stream"]
    if not isinstance(stream, str) or stream not in counts:
        raise UnknownStream(f"no stream named {stream!r} in {arguments['self'].path}")
    return counts[stream]


STREAM, PARTITION, TXN_ID = ("stream", "str"), ("partition", "u32"), ("txn_id", "u64")
TRANSACTIONAL_ID = ("transactional_id", "str")
HOLD_NAME = ("name", "str")

OPERATIONS = OperationTable([
    Operation(MessageType.CREATE_STREAM, (("name", "str"), ("partitions", "u32")), INT,
              writable=True),
    Operation(MessageType.STREAMS, (), JSON, blocking=False, serve_with=_partitions_by_stream,
              methods=(Method("streams", lambda counts, arguments: sorted(counts)),
                       Method("partition_count", _partition_count))),
    Operation(MessageType.OFFSETS, (STREAM, PARTITION), OFFSETS, blocking=False,
              methods=("start_offset", "end_offset", "last_stable_offset")),
    Operation(MessageType.OFFSET_FOR_TIMESTAMP,
              (STREAM, PARTITION, ("timestamp_us", "i64")), INT),
    Operation(MessageType.INFO, (), JSON),
    Operation(MessageType.COMMIT_TXN,
              (STREAM, PARTITION, TXN_ID, ("tag", "str"), ("marker", "blob")), INT,
              writable=True),
    Operation(MessageType.ABORT_TXN, (STREAM, PARTITION, TXN_ID), INT, writable=True),
    Operation(MessageType.TXN_STATE, (STREAM, PARTITION, TXN_ID), optional_enum(TxnState)),
    Operation(MessageType.INIT_PRODUCER, (STREAM, PARTITION, TRANSACTIONAL_ID), INT,
              writable=True),
    Operation(MessageType.BEGIN_TXN, (STREAM, PARTITION, TRANSACTIONAL_ID, ("epoch", "i64")),
              INT, writable=True),
    Operation(MessageType.LAST_COMMIT, (STREAM, PARTITION, ("tag", "str")), OPTIONAL_BYTES),
    Operation(MessageType.TRUNCATE_AFTER, (STREAM, PARTITION, ("offset", "i64")), INT,
              writable=True),
    Operation(MessageType.OPEN_TRANSACTIONS, (STREAM, PARTITION), INT_MAP),
    Operation(MessageType.APPLY_RETENTION, (("now_us", "opt_i64"),), JSON, writable=True),
    # A hold is allowed to a read-only open (a consumer holds the input it still needs).
    Operation(MessageType.HOLD, (STREAM, PARTITION, HOLD_NAME, ("offset", "i64")), NOTHING),
    Operation(MessageType.RELEASE_HOLD, (STREAM, PARTITION, HOLD_NAME), BOOL),
    Operation(MessageType.HOLDS, (STREAM, PARTITION), JSON),
    Operation(MessageType.APPEND, streamed=True, writable=True,
              methods=("append", "append_sync", "append_batch", "append_batch_sync",
                       "append_columns", "append_columns_sync")),
    Operation(MessageType.READ, streamed=True, methods=("reader",)),
])
