"""The wire's parts of the operations added to the API (holds, retention, open
transactions): the optional int field apply_retention's `now_us` travels in, and the
replies of hold, release_hold and open_transactions. No sockets: the message codec."""

import pytest

from streamlog.errors import InvalidArgument
from streamlog.wire.codes import LocalProtocolError
from streamlog.wire.messages import Role, decode_message, encode_message
from streamlog.wire.operations import BOOL, INT_MAP, NOTHING, OPERATIONS, check_argument


def _through_the_wire(message):
    data = encode_message(message)
    return decode_message(data[4], message.request_id, data[9:], OPERATIONS.messages)


@pytest.mark.parametrize("now_us", [None, 0, -(1 << 63), (1 << 63) - 1, 1_700_000_000_000_000])
def test_an_optional_int_goes_through_as_it_was_given(now_us):
    request = OPERATIONS["apply_retention"].request(7, now_us)
    assert _through_the_wire(request).now_us == now_us


def test_an_optional_int_is_a_presence_byte_and_an_i64():
    absent = encode_message(OPERATIONS["apply_retention"].request(1, None))
    present = encode_message(OPERATIONS["apply_retention"].request(1, 5))
    assert absent[9:] == bytes(9)
    assert present[9:] == b"\x01" + (5).to_bytes(8, "big")


@pytest.mark.parametrize("body, reason", [
    (b"\x02" + bytes(8), "neither an int nor None"),  # a presence byte other than 0 / 1
    (b"\x00" + (5).to_bytes(8, "big"), "neither an int nor None"),  # absent, yet a value
    (b"\x01" + bytes(3), "shorter than its fields"),
])
def test_an_optional_int_the_protocol_does_not_allow_is_refused(body, reason):
    request = OPERATIONS["apply_retention"].request
    assert request.FROM is Role.CLIENT
    with pytest.raises(LocalProtocolError, match=reason):
        decode_message(int(request.TYPE), 1, body, OPERATIONS.messages)


@pytest.mark.parametrize("value, expected", [(None, None), (0, 0), (-3, -3)])
def test_an_optional_int_argument_is_checked_as_an_i64_unless_none(value, expected):
    assert check_argument("now_us", "opt_i64", value) == expected


@pytest.mark.parametrize("value, match", [
    ("5", "now_us must be an int"), (True, "now_us must be an int"),
    (1 << 63, r"now_us must be in -9223372036854775808\.\.9223372036854775807"),
])
def test_an_optional_int_argument_that_does_not_fit_is_refused(value, match):
    with pytest.raises(InvalidArgument, match=match):
        check_argument("now_us", "opt_i64", value)


@pytest.mark.parametrize("reply, value", [
    (BOOL, True), (BOOL, False), (NOTHING, None),
    (INT_MAP, {}), (INT_MAP, {(1 << 64) - 1: 0, 5: 12}),
])
def test_each_new_reply_carries_its_value(reply, value):
    message = _through_the_wire(reply.message(4, *reply.encode(value)))
    assert reply.decode(message) == value


@pytest.mark.parametrize("name, writable", [
    ("hold", False), ("release_hold", False),  # a read-only client holds its input
    ("holds", False), ("open_transactions", False), ("apply_retention", True),
])
def test_what_a_read_only_client_may_ask(name, writable):
    operation, _ = OPERATIONS.by_method[name]
    assert operation.writable is writable
