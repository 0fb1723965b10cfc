"""The error map (streamlog/wire/codes.py `ERRORS`): every exception it names crosses
the wire as the same class with the same message, read both ways from one table."""

import pytest

from streamlog.errors import (CorruptionError, CorruptSegment, InvalidAppend, InvalidArgument,
                              LogLocked, StreamLogError, UnknownStream)
from streamlog.wire.codes import (ERRORS, DaemonUnavailable, ErrorCode, LocalProtocolError,
                                  ProtocolError, RemoteError, RemoteProtocolError,
                                  error_code_for, exception_for)
from streamlog.wire.messages import (ERROR_MESSAGE_CHARS_MAX, Error, decode_message,
                                     encode_message, error_message)


def _across(error: BaseException) -> StreamLogError:
    """What a client raises for `error` raised in the daemon: ERROR message, bytes,
    message again, exception."""
    data = encode_message(error_message(7, error))
    reply = decode_message(data[4], 7, data[9:])
    assert isinstance(reply, Error) and reply.request_id == 7
    return exception_for(reply.code, reply.message)


def test_every_code_has_an_exception_and_every_code_is_listed_once():
    codes = [code for code, _ in ERRORS]
    assert sorted(codes) == sorted(ErrorCode)


@pytest.mark.parametrize("code, kind", ERRORS, ids=lambda item: getattr(item, "name", ""))
def test_each_error_in_the_map_survives_the_wire(code, kind):
    if issubclass(kind, ProtocolError):  # the daemon raises its own kind, with the code
        arrived = _across(LocalProtocolError("the rules were broken", code))
        assert type(arrived) is RemoteProtocolError and arrived.error_code is code
        assert str(arrived) == "the rules were broken"
        return
    arrived = _across(kind(f"a {kind.__name__} happened"))
    assert type(arrived) is kind
    assert str(arrived) == f"a {kind.__name__} happened"


@pytest.mark.parametrize("code, kind", ERRORS, ids=lambda item: getattr(item, "name", ""))
def test_a_code_and_the_exception_it_raises_agree(code, kind):
    raised = exception_for(code, "m")
    assert type(raised) is kind
    assert type(exception_for(error_code_for(raised), "m")) is kind  # and back again


def test_a_class_listed_twice_is_sent_as_its_first_code():
    assert error_code_for(InvalidArgument("x")) is ErrorCode.INVALID_ARGUMENT
    assert exception_for(ErrorCode.LIMIT_EXCEEDED, "x").__class__ is InvalidArgument
    assert error_code_for(DaemonUnavailable("x")) is ErrorCode.TOO_MANY_CONNECTIONS
    assert exception_for(ErrorCode.SHUTTING_DOWN, "x").__class__ is DaemonUnavailable


@pytest.mark.parametrize("error, kind", [
    (CorruptSegment("s.log", 40, "bad checksum"), CorruptionError),  # nearest named base
    (InvalidAppend("too big"), InvalidAppend),  # the most specific class, not its base
    (LogLocked("held by pid 9"), StreamLogError),
    (ValueError("a bug"), RemoteError),  # not ours: INTERNAL
    (UnknownStream("no stream named 'x'"), UnknownStream),
])
def test_other_exceptions_cross_as_the_nearest_class_the_map_names(error, kind):
    arrived = _across(error)
    assert type(arrived) is kind
    assert str(arrived) == str(error)


def test_an_unknown_code_is_a_remote_error_that_names_it():
    arrived = exception_for(999, "from a newer daemon")
    assert type(arrived) is RemoteError and "999" in str(arrived)


def test_a_long_message_is_cut_and_an_empty_one_named():
    assert len(_across(InvalidArgument("x" * 10_000)).args[0]) == ERROR_MESSAGE_CHARS_MAX
    assert str(_across(InvalidArgument())) == "InvalidArgument"
