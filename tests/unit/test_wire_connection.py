"""The sans-I/O connection's `events(data)`: what both shells (session.py, link.py) use
to turn the bytes of one socket read into messages."""

import pytest

from streamlog.wire.codes import RemoteProtocolError
from streamlog.wire.connection import CLOSED, Connection
from streamlog.wire.messages import Hello, HelloOk, Ping, Role, encode_message
from streamlog.wire.operations import OPERATIONS


def _ready_server() -> Connection:
    server = Connection(Role.SERVER)
    assert list(server.events(encode_message(Hello(0, 1, b"t")))) == [Hello(0, 1, b"t")]
    server.send(HelloOk(0, 1, 1 << 20, 1000))
    return server


def test_events_yields_every_whole_message_and_keeps_the_rest():
    server = _ready_server()
    info = OPERATIONS["info"].request(2)
    data = encode_message(Ping(1)) + encode_message(info)
    assert list(server.events(data[:-3])) == [Ping(1)]
    assert list(server.events(data[-3:])) == [info]
    assert list(server.events(encode_message(Ping(3))[:4])) == []
    assert server.buffered_bytes == 4


def test_events_ends_with_closed_when_the_peer_closes():
    server = _ready_server()
    assert list(server.events(encode_message(Ping(1)))) == [Ping(1)]
    assert list(server.events(b"")) == [CLOSED]


def test_events_raises_for_a_peer_that_closes_inside_a_frame():
    server = _ready_server()
    assert list(server.events(encode_message(Ping(1))[:5])) == []
    with pytest.raises(RemoteProtocolError, match="inside a frame"):
        list(server.events(b""))
