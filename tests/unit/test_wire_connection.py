"""The sans-I/O connection's `events(data)`: what both shells (session.py, link.py) use
to turn the bytes of one socket read into messages."""

import pytest

from streamlog.wire.codes import RemoteProtocolError
from streamlog.wire.connection import CLOSED, NEED_DATA, Connection
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


# -- receiving into the connection's buffers (get_buffer / buffer_updated) --------------

def _appends(sizes: list[int]) -> list:
    from streamlog.wire.columns import encode_records
    from streamlog.wire.messages import Append
    out = []
    for number, size in enumerate(sizes, start=1):
        values = [bytes([number % 251]) * size]
        payload, flags = encode_records([number], [None], values)
        out.append(Append(number, "s", 0, 0, 1, 1, flags, payload))
    return out


def _fed_by_buffers(server: Connection, data: bytes, chunks) -> list:
    """Write `data` into whatever get_buffer() offers, at most the next chunk size each
    time (as a socket's recv_into would), parsing after each write."""
    received, position, sizes = [], 0, iter(chunks)
    while position < len(data):
        into = server.get_buffer()
        assert len(into) > 0
        size = min(len(into), len(data) - position, next(sizes))
        into[:size] = data[position:position + size]
        del into  # a real transport drops its view too; the buffers never resize anyway
        server.buffer_updated(size)
        position += size
        while (event := server.next_event()) is not NEED_DATA:
            received.append(event)
    return received


@pytest.mark.parametrize("chunk", [1, 7, 1000, 65_536, 300_000, 5_000_000])
def test_messages_of_every_size_come_out_whole_however_the_bytes_arrive(chunk):
    import itertools
    from streamlog.wire import connection
    sizes = [10, connection.VIEW_FRAME_BYTES + 5, 3, connection.LARGE_FRAME_BYTES * 2, 1,
             connection.SCRATCH_BYTES + 17, 100, connection.VIEW_FRAME_BYTES - 100]
    if chunk == 1:
        sizes = [10, 3, 200, 1]  # a byte at a time: only small frames, to stay quick
    sent = _appends(sizes)
    data = b"".join(encode_message(m) for m in sent)
    server = _ready_server()
    got = _fed_by_buffers(server, data, itertools.cycle([chunk, chunk // 3 + 1]))
    assert [(m.request_id, bytes(m.payload)) for m in got] == [
        (m.request_id, bytes(m.payload)) for m in sent]
    assert server.buffered_bytes == 0
    # The same bytes through receive_data (copied in) give the same messages.
    other = _ready_server()
    assert [bytes(m.payload) for m in other.events(data)] == [bytes(m.payload) for m in sent]


def test_a_large_frame_is_received_into_its_own_buffer_and_handed_on_as_a_view():
    from streamlog.wire import connection
    (message,) = _appends([connection.LARGE_FRAME_BYTES * 3])
    data = encode_message(message)
    server = _ready_server()
    head = server.get_buffer()
    head[:1000] = data[:1000]
    del head
    server.buffer_updated(1000)
    assert server.next_event() is NEED_DATA
    body = server.get_buffer()  # the rest of that frame exactly: the kernel writes there
    assert len(body) == len(data) - 1000
    body[:] = data[1000:]
    del body
    server.buffer_updated(len(data) - 1000)
    (got,) = list(server.events(b""))[:1]
    assert isinstance(got.payload, memoryview) and bytes(got.payload) == bytes(message.payload)


def test_a_frame_over_the_limit_is_refused_before_its_body_is_buffered():
    server = Connection(Role.SERVER, frame_bytes_max=1 << 20)
    server.receive_data(encode_message(Hello(0, 1, b"t")))
    assert isinstance(server.next_event(), Hello)
    server.send(HelloOk(0, 1, 1 << 20, 1000))
    (message,) = _appends([2 << 20])
    server.receive_data(encode_message(message)[:64])
    with pytest.raises(RemoteProtocolError, match="over the limit"):
        server.next_event()


def test_a_peer_closing_inside_a_large_frame_is_a_protocol_error():
    from streamlog.wire import connection
    (message,) = _appends([connection.LARGE_FRAME_BYTES * 2])
    server = _ready_server()
    server.receive_data(encode_message(message)[:connection.LARGE_FRAME_BYTES])
    assert server.next_event() is NEED_DATA
    server.receive_data(b"")
    with pytest.raises(RemoteProtocolError, match="inside a frame"):
        server.next_event()


def test_has_event_says_whether_next_event_has_something():
    from streamlog.wire import connection
    sent = _appends([100, connection.SCRATCH_BYTES + 10])
    data = b"".join(encode_message(m) for m in sent)
    server = _ready_server()
    small = len(encode_message(sent[0]))
    assert not server.has_event()  # nothing yet
    for cut in (3, small - 1):
        probe = _ready_server()
        probe.receive_data(data[:cut])
        assert not probe.has_event() and probe.next_event() is NEED_DATA
    server.receive_data(data[:small + 20])
    assert server.has_event()
    assert server.next_event() == sent[0]
    # the header of a frame larger than the scratch buffer is in: parse it (its body
    # then goes to a buffer of its own)
    assert server.has_event() and server.next_event() is NEED_DATA
    assert not server.has_event()
    server.receive_data(data[small + 20:])
    assert server.has_event() and bytes(server.next_event().payload) == bytes(sent[1].payload)
    server.receive_data(b"")
    assert server.has_event() and server.next_event() is CLOSED


# -- receive buffers, used again (BufferPool) ------------------------------------------

def test_a_pooled_buffer_is_used_again_only_once_nothing_views_it():
    import numpy as np
    from streamlog.wire.connection import BufferPool
    pool = BufferPool(1 << 20)
    first = pool.take(100_000)
    first[:] = b"\x01" * 100_000
    backing = id(first.obj)  # (an id: a reference would keep it in use)
    view = first[10:20]  # what a message keeps: a view of the body
    del first
    other = pool.take(100_000)  # `first` is still viewed: another buffer
    assert id(other.obj) != backing and bytes(view) == b"\x01" * 10
    array = np.frombuffer(view, np.uint8)  # a view of the view holds it too
    del view
    assert id(pool.take(100_000).obj) != backing
    del array
    again = pool.take(90_000)  # nothing views it now: the same memory, not zero-filled
    assert id(again.obj) == backing and len(again) == 90_000 and again[0] == 1


def test_the_pool_keeps_no_more_than_its_bound_and_only_close_sizes():
    import weakref
    from streamlog.wire.connection import BufferPool
    pool = BufferPool(300_000)
    bodies = [pool.take(100_000) for _ in range(4)]
    assert 100_000 <= pool.pooled_bytes <= 300_000  # the fourth is not the pool's
    backings = [weakref.ref(body.obj) for body in bodies]  # (not references: ids)
    del bodies
    small = pool.take(20_000)  # too small a frame for those buffers
    assert all(backing() is not small.obj for backing in backings)
    again = pool.take(100_000)
    assert any(backing() is again.obj for backing in backings)
    pool.keep(0)
    assert pool.pooled_bytes == 0


def test_no_pool_gives_a_fresh_buffer_each_time():
    from streamlog.wire.connection import BufferPool
    pool = BufferPool()
    body = pool.take(70_000)
    backing = id(body.obj)
    other = pool.take(70_000)
    assert pool.pooled_bytes == 0 and id(other.obj) != backing


def test_a_frame_that_fits_is_received_in_place_and_one_that_does_not_moves():
    from streamlog.wire import connection
    sent = _appends([100, connection.SCRATCH_BYTES // 2 + 10_000,
                     connection.SCRATCH_BYTES // 2 - 200])
    data = b"".join(encode_message(m) for m in sent)
    server = _ready_server()
    first, second = len(encode_message(sent[0])), len(encode_message(sent[1]))
    server.receive_data(data[:first + 20])
    assert server.next_event() == sent[0]
    assert not server.has_event()  # the second fits behind the first: nothing to do yet
    server.receive_data(data[first + 20:first + second + 20])
    got = server.next_event()
    assert bytes(got.payload) == bytes(sent[1].payload)
    assert got.payload.obj is server.get_buffer().obj  # a view of the scratch buffer
    # the third does not fit in the room left: it moves to a fresh scratch buffer
    assert server.has_event() and server.next_event() is NEED_DATA
    server.receive_data(data[first + second + 20:])
    third = server.next_event()
    assert bytes(third.payload) == bytes(sent[2].payload)
    assert third.payload.obj is not got.payload.obj


def test_messages_received_into_pooled_buffers_keep_their_bytes():
    """Frames of every size through a connection with a pool, the consumer keeping
    some messages and dropping others: a kept message's payload is never overwritten
    by a frame received later into a buffer used again."""
    import itertools
    from streamlog.wire import connection
    sizes = [connection.LARGE_FRAME_BYTES * k // 4 + 7 for k in
             (1, 9, 3, 2, 12, 3, 1, 40, 3, 2, 3, 1, 5, 5, 5, 5, 9, 9, 1, 1)]
    sent = _appends(sizes)
    server = Connection(Role.SERVER)
    server.buffers.keep(64 << 20)
    assert list(server.events(encode_message(Hello(0, 1, b"t")))) == [Hello(0, 1, b"t")]
    server.send(HelloOk(0, 1, 1 << 20, 1000))
    data = b"".join(encode_message(m) for m in sent)
    kept, used = [], set()
    received, position, chunks = 0, 0, itertools.cycle([70_000, 300_000, 1 << 20, 3 << 20])
    while position < len(data):
        into = server.get_buffer()
        size = min(len(into), len(data) - position, next(chunks))
        into[:size] = data[position:position + size]
        del into
        server.buffer_updated(size)
        position += size
        while (message := server.next_event()) is not NEED_DATA:
            expected = sent[received]
            assert bytes(message.payload) == bytes(expected.payload)
            used.add(id(message.payload.obj))
            if received % 2 == 0:
                kept.append((expected, message))
            received += 1
            del message
    assert received == len(sent)
    assert len(used) < len(sent)  # buffers were used again
    for expected, message in kept:
        assert bytes(message.payload) == bytes(expected.payload)
