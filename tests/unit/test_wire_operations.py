"""The operation table (streamlog/wire/operations.py) is the one definition of every
request/reply operation: these tests check that each row is declared by the API,
implemented by Log and RemoteLog, answered by the daemon's session, and that a request
goes from a call's arguments through the daemon's log and back to the caller's value
(no sockets: the row's own encode and decode, through the message codec)."""

import enum
import inspect

import pytest

from streamlog.api import OPERATIONS as API_METHODS
from streamlog.api import LogAPI
from streamlog.errors import InvalidArgument, UnknownStream
from streamlog.log import Log
from streamlog.txn import TxnState
from streamlog.wire.client import RemoteLog
from streamlog.wire.codes import CLIENT_TYPES_MAX, MessageType, RemoteProtocolError
from streamlog.wire.messages import (INT_BOUNDS, MESSAGES, Role, decode_message,
                                     encode_message)
from streamlog.wire.operations import (CLIENT_SIDE, CONNECTION_MESSAGES, INT, JSON, OFFSETS,
                                       OPERATIONS, OPTIONAL_BYTES, Operation, check_argument,
                                       optional_enum)
from streamlog.wire.session import Session

SAMPLE_VALUES = {"str": "s-1", "u32": 7, "i64": -5, "u64": 1 << 63, "blob": b"m",
                 "opt_i64": -6}


def _shape(function) -> list[tuple[str, object]]:
    return [(p.name, p.kind) for p in inspect.signature(function).parameters.values()]


def _through_the_wire(message):
    data = encode_message(message)
    return decode_message(data[4], message.request_id, data[9:], OPERATIONS.messages)


def test_every_api_method_is_a_row_of_the_table_or_needs_no_request():
    in_rows = set(OPERATIONS.by_method)
    assert in_rows.isdisjoint(CLIENT_SIDE)
    assert in_rows | set(CLIENT_SIDE) == set(API_METHODS)


@pytest.mark.parametrize("name", sorted(OPERATIONS.by_method))
def test_each_method_of_a_row_is_on_log_and_remote_log_with_the_api_signature(name):
    declared = getattr(LogAPI, name)
    for implementation in (Log, RemoteLog):
        found = getattr(implementation, name, None)
        assert found is not None, f"{implementation.__name__} has no {name}"
        assert _shape(found) == _shape(declared), f"{implementation.__name__}.{name}"
    operation, method = OPERATIONS.by_method[name]
    if not operation.streamed and method.pick is None:  # the daemon calls it by keywords
        inspect.signature(getattr(Log, name)).bind(None, **{
            field: SAMPLE_VALUES[kind] for field, kind in operation.fields})


def test_every_client_message_is_a_row_or_a_message_of_the_connection():
    client_types = {t for t in MessageType if t <= CLIENT_TYPES_MAX}
    rows = {op.type for op in OPERATIONS}
    assert rows.isdisjoint(CONNECTION_MESSAGES)
    assert rows | set(CONNECTION_MESSAGES) == client_types


def test_the_session_has_a_handler_for_what_is_not_answered_by_the_table():
    streamed = {op.type for op in OPERATIONS if op.streamed}
    assert set(Session.HANDLERS) == streamed | set(CONNECTION_MESSAGES) - {MessageType.HELLO}
    for name in Session.HANDLERS.values():
        assert callable(getattr(Session, name))
    answered = {op.type for op in OPERATIONS} - set(Session.HANDLERS)
    assert answered == {op.type for op in OPERATIONS if not op.streamed}


@pytest.mark.parametrize("operation", list(OPERATIONS), ids=lambda op: op.name)
def test_each_request_class_is_built_from_its_row(operation):
    request = operation.request
    assert request.TYPE is operation.type and request.FROM is Role.CLIENT
    if operation.streamed:
        assert request is MESSAGES[operation.type]  # APPEND and READ: messages.py's
        return
    assert request.__name__ == operation.name.title().replace("_", "")
    assert request.FIELDS == operation.fields
    message = request(9, *(SAMPLE_VALUES[kind] for _, kind in operation.fields))
    assert _through_the_wire(message) == message


class FakeLog:
    """What a daemon's log returns, per method, recording each call."""

    RESULTS = {"create_stream": 3, "offset_for_timestamp": 11, "info": {"path": "x"},
               "commit_txn": 4, "abort_txn": 5, "txn_state": TxnState.ABORTED,
               "last_commit": b"marker", "truncate_after": 6, "start_offset": 1,
               "end_offset": 8, "last_stable_offset": 7, "streams": ["a", "b"],
               "partition_count": 2, "init_producer": 12, "begin_txn": 0xfeed,
               "open_transactions": {1 << 63: 4, 9: 0}, "apply_retention": ["a", "b"],
               "hold": None, "release_hold": True, "holds": {"h": {"offset": 3}}}

    def __init__(self) -> None:
        self.calls = []

    def __getattr__(self, name):
        def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            return self.RESULTS[name]
        return call


class FakeRemote:
    path = "streamlog://fake"


@pytest.mark.parametrize("name", sorted(n for n, (op, _) in OPERATIONS.by_method.items()
                                        if not op.streamed))
def test_a_call_goes_to_the_log_and_its_result_comes_back(name):
    operation, method = OPERATIONS.by_method[name]
    signature = inspect.signature(getattr(LogAPI, name))
    given = {field: SAMPLE_VALUES[kind] for field, kind in operation.fields}
    if name == "partition_count":  # a stream the daemon's answer names
        given = {"stream": "b"}
    arguments = signature.bind(FakeRemote(), **given).arguments
    values = operation.request_values(arguments)
    log = FakeLog()
    request = _through_the_wire(operation.request(3, *values))
    reply = _through_the_wire(operation.answer(3, operation.serve(log, request)))
    assert reply.request_id == 3
    assert operation.result(method, reply, arguments) == FakeLog.RESULTS[name]
    if operation.serve_with is None:
        fields = {field: value for (field, _), value in zip(operation.fields, values)}
        assert log.calls == [(m.name, (), fields) for m in operation.methods]


def test_a_row_for_several_methods_calls_each_and_answers_them_in_one_reply():
    operation = OPERATIONS["offsets"]
    log = FakeLog()
    result = operation.serve(log, operation.request(1, "s", 0))
    assert result == (1, 8, 7)
    reply = operation.answer(1, result)
    picked = {m.name: operation.result(m, reply, {}) for m in operation.methods}
    assert picked == {"start_offset": 1, "end_offset": 8, "last_stable_offset": 7}


def test_partition_count_of_an_unknown_stream_is_refused_as_locally():
    operation, method = OPERATIONS.by_method["partition_count"]
    reply = operation.answer(1, {"a": 2})
    with pytest.raises(UnknownStream, match="'nope' in streamlog://fake"):
        operation.result(method, reply, {"self": FakeRemote(), "stream": "nope"})


def test_a_reply_of_another_type_is_the_peers_fault():
    operation, method = OPERATIONS.by_method["end_offset"]
    with pytest.raises(RemoteProtocolError, match="OFFSETS was answered with RESULT_INT"):
        operation.result(method, INT.message(1, 5), {})


@pytest.mark.parametrize("reply, value", [
    (INT, -(1 << 63)), (INT, 0), (JSON, {"a": [1, None, "x"]}), (OFFSETS, (0, 5, 3)),
    (OPTIONAL_BYTES, b""), (OPTIONAL_BYTES, b"m"), (OPTIONAL_BYTES, None),
    (optional_enum(TxnState), None), (optional_enum(TxnState), TxnState.OPEN),
])
def test_each_reply_carries_its_value(reply, value):
    message = _through_the_wire(reply.message(4, *reply.encode(value)))
    assert reply.decode(message) == value


@pytest.mark.parametrize("kind, value, expected", [
    ("str", "s", "s"), ("blob", bytearray(b"ab"), b"ab"), ("blob", memoryview(b"c"), b"c"),
    ("u32", 0, 0), ("u32", INT_BOUNDS["u32"][1], (1 << 32) - 1), ("i64", -(1 << 63), -(1 << 63)),
    ("u64", (1 << 64) - 1, (1 << 64) - 1),
])
def test_arguments_that_fit_their_field(kind, value, expected):
    assert check_argument("x", kind, value) == expected


@pytest.mark.parametrize("kind, value, match", [
    ("str", 5, "x must be a str"), ("str", b"s", "x must be a str"),
    ("blob", "text", "x must be bytes"), ("u32", True, "x must be an int"),
    ("i64", 1.5, "x must be an int"), ("i64", "5", "x must be an int"),
    ("u32", -1, r"x must be in 0\.\.4294967295"), ("i64", 1 << 63, "x must be in"),
    ("u64", 1 << 64, "x must be in"),
])
def test_arguments_that_do_not_fit_are_refused_as_invalid(kind, value, match):
    with pytest.raises(InvalidArgument, match=match):
        check_argument("x", kind, value)


class Spare(enum.IntEnum):
    SPARE = 62  # a client type number MessageType does not use


def test_a_table_checks_its_rows():
    with pytest.raises(AssertionError, match="type is used twice"):
        OPERATIONS.extended(Operation(MessageType.INFO, (), JSON, methods=("refresh",)))
    with pytest.raises(AssertionError, match="in two rows"):
        OPERATIONS.extended(Operation(Spare.SPARE, (), JSON, methods=("info",)))
    with pytest.raises(AssertionError, match="not declared by LogAPI"):
        OPERATIONS.extended(Operation(Spare.SPARE, (), JSON, methods=("stats",)))
    with pytest.raises(AssertionError, match="no parameter offset"):
        OPERATIONS.extended(Operation(Spare.SPARE, (("offset", "i64"),), INT,
                                      methods=("refresh",)))
    with pytest.raises(AssertionError, match="messages.py"):
        OPERATIONS.extended(Operation(MessageType.PING, (), INT, methods=("refresh",)))
    with pytest.raises(AssertionError, match="not a client message"):
        Operation(MessageType.RESULT_INT, (), INT)


def test_remote_log_methods_are_built_from_the_rows():
    method = RemoteLog.end_offset
    assert method.__qualname__ == "RemoteLog.end_offset"
    assert "OFFSETS request" in method.__doc__
    assert inspect.signature(method) == inspect.signature(LogAPI.end_offset)
