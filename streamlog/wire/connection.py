"""One side of one daemon connection, sans I/O: bytes in, messages out, and the rules.

Strategy (h11's): nothing here touches a socket, a file or an event loop. A `Connection`
buffers the bytes its owner received (`receive_data`, or straight from the socket with
`get_buffer` / `buffer_updated`, stream.py), hands back one message at a time
(`next_event`, or the sentinels `NEED_DATA` / `CLOSED`), and turns a message to send into
bytes (`send`). session.py / server.py and link.py are the thin shells that move those
bytes; messages.py says what the bytes are.

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
The transitions are data (`_SEND_TRANSITIONS`, `_RECEIVE_TRANSITIONS`); in READY, each
side may send any message of its own role but the handshake's.
"""

from __future__ import annotations

import struct
import sys

import numpy as np

from .codes import ErrorCode, LocalProtocolError, RemoteProtocolError
from .messages import (FRAME_BYTES_MAX, FRAME_BYTES_MIN, HEADER, HELLO_BYTES_MAX, Error, Hello,
                       HelloOk, Message, Role, decode_message, encode_message_parts)
from .operations import OPERATIONS

# Unparsed bytes wait in a scratch buffer (SCRATCH_BYTES unless the owner asks for
# more), received into it by the kernel, as much as it has room for: a frame of
# VIEW_FRAME_BYTES or more found whole there (an APPEND or BATCH of records) is handed
# on as a view of it, not copied. A frame that does not fit in the room left moves to a
# fresh scratch buffer (the part received so far is copied), or, when it is larger than
# half a scratch buffer (LARGE_FRAME_BYTES for the default size), is received into a
# buffer of its own size.
SCRATCH_BYTES = 1024 * 1024
_LENGTH = struct.Struct(">I")  # a frame's first field (messages.HEADER)
VIEW_FRAME_BYTES = 64 * 1024
LARGE_FRAME_BYTES = SCRATCH_BYTES // 2


class BufferPool:
    """Receive buffers (scratch buffers, large frames' bodies), used again once nothing
    refers to them.

    Memory fresh from the system costs a page fault per 4 KiB page as the kernel writes
    the received bytes into it, more than the copy itself (the allocator gives freed
    megabytes back and takes them again). A pool keeps the buffers it handed out, up to
    `bytes_max` bytes of them (0: none, the default; `keep` changes it), and hands one
    out again once no view of it is left: every view of a buffer (a memoryview, a NumPy
    array or an Arrow buffer over any part of it) holds a reference to it, so a buffer
    nothing but the pool refers to is free. Buffers are not zero-filled: the connection
    reads no byte it has not received. Used by one thread at a time (the connection's
    owner); other threads (a reader's consumer) only drop their views.
    """

    def __init__(self, bytes_max: int = 0) -> None:
        assert bytes_max >= 0
        self.bytes_max = bytes_max
        self._buffers: list[np.ndarray] = []  # in use or free

    @property
    def pooled_bytes(self) -> int:
        return sum(len(buffer) for buffer in self._buffers)

    def take(self, size: int) -> memoryview:
        """A writable buffer of `size` bytes, its content undefined."""
        assert size > 0
        for index in range(len(self._buffers)):
            if (size <= len(self._buffers[index]) <= 2 * size
                    and _references(self._buffers, index) == _UNUSED_REFERENCES):
                return memoryview(self._buffers[index])[:size]
        if not self.bytes_max:
            return memoryview(np.empty(size, dtype=np.uint8))
        # room for a slightly larger frame next time
        buffer = np.empty(-(-(size + size // 8) // _POOL_GRAIN) * _POOL_GRAIN, np.uint8)
        if self.pooled_bytes + len(buffer) <= self.bytes_max:
            self._buffers.append(buffer)
        return memoryview(buffer)[:size]

    def keep(self, bytes_max: int) -> None:
        """From now on keep at most `bytes_max` bytes of buffers (0: none; the buffers
        let go are freed once their last view is)."""
        assert bytes_max >= 0
        self.bytes_max = bytes_max
        while self._buffers and self.pooled_bytes > bytes_max:
            self._buffers.pop()


_POOL_GRAIN = 64 * 1024


def _references(buffers: list, index: int) -> int:
    return sys.getrefcount(buffers[index])


# What _references says of a buffer only its list refers to, as this interpreter counts
# (the call's own references included): a view anywhere makes it more.
_UNUSED_REFERENCES = _references([np.empty(1, dtype=np.uint8)], 0)


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
        messages: the message classes by type number that the peer may send (an
            operation table's `messages`; the standard table's by default).
        scratch_bytes: the size of a scratch buffer; a client reading batches of a
            few MiB asks for more than the default.

    `buffers` is the connection's BufferPool (empty unless its owner asks for one).
    """

    def __init__(self, role: Role, frame_bytes_max: int = FRAME_BYTES_MAX, *,
                 messages: dict[int, type[Message]] | None = None,
                 scratch_bytes: int = SCRATCH_BYTES) -> None:
        assert frame_bytes_max >= HELLO_BYTES_MAX
        assert scratch_bytes >= 2 * VIEW_FRAME_BYTES
        self.role = role
        self.frame_bytes_max = frame_bytes_max
        self.messages = OPERATIONS.messages if messages is None else messages
        self.state = START if role is Role.CLIENT else AWAIT_HELLO
        self.buffers = BufferPool()
        self.scratch_bytes = scratch_bytes
        # Bytes not yet parsed are _scratch[_start:_end]. Buffers are never resized (a
        # shell may still hold a view of one), only replaced, so a message may keep a view.
        self._scratch = self.buffers.take(scratch_bytes)
        self._start = self._end = 0
        # A large frame's body is received straight into a buffer of its own size (no
        # copy of the payload in user space); (type, request id, body, bytes filled).
        self._large: tuple[int, int, memoryview] | None = None
        self._large_filled = 0
        self._into_large = False
        self._eof = False

    @property
    def buffered_bytes(self) -> int:
        large = self._large_filled if self._large is not None else 0
        return self._end - self._start + large

    def receive_data(self, data: bytes) -> None:
        """Buffer bytes from the peer (copied); b"" means the peer closed its side."""
        if not data:
            self._eof = True
            return
        data = memoryview(data)
        while data:
            into = self.get_buffer()
            size = min(len(into), len(data))
            into[:size] = data[:size]
            self.buffer_updated(size)
            data = data[size:]

    def get_buffer(self) -> memoryview:
        """Where the peer's next bytes should go (asyncio.BufferedProtocol.get_buffer):
        the rest of a large frame's body, or free room in the scratch buffer. Then call
        buffer_updated(n) with the count written."""
        large = self._large
        self._into_large = large is not None and self._large_filled < len(large[2])
        if self._into_large:
            return large[2][self._large_filled:]
        if self._end == len(self._scratch):
            self._renew_scratch()
        return self._scratch[self._end:]

    def buffer_updated(self, nbytes: int) -> None:
        """`nbytes` were written into the view get_buffer() returned."""
        if self._into_large:
            self._large_filled += nbytes
        else:
            self._end += nbytes

    def has_event(self) -> bool:
        """Would next_event() give something other than NEED_DATA? (A whole frame, a
        frame over the limit, or the end.) Cheap: for a shell deciding whether to wake
        its parser after each socket read."""
        if self._eof:
            return True
        if self._large is not None:
            return self._large_filled >= len(self._large[2])
        available = self._end - self._start
        if available < HEADER.size:
            return False
        (length,) = _LENGTH.unpack_from(self._scratch, self._start)
        limit = self.frame_bytes_max if self.state is READY else HELLO_BYTES_MAX
        # whole, refused, or it does not fit where it is (next_event moves it)
        return (available >= 4 + length or length > limit
                or self._start + 4 + length > len(self._scratch))

    def _renew_scratch(self, need: int = 0) -> None:
        """A fresh scratch buffer holding the unparsed bytes (a partial frame)."""
        rest = self._scratch[self._start:self._end]
        scratch = self.buffers.take(max(self.scratch_bytes, 2 * len(rest), need))
        scratch[:len(rest)] = rest
        self._scratch, self._start, self._end = scratch, 0, len(rest)

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

    def events(self, data: bytes):
        """receive_data(data), then each whole message now buffered, in order; CLOSED
        last if the peer closed its side. Raises as next_event does."""
        self.receive_data(data)
        while (event := self.next_event()) is not NEED_DATA:
            yield event
            if event is CLOSED:
                return

    def _next_event(self):
        if self._large is not None:
            type_code, request_id, body = self._large
            if self._large_filled < len(body):
                return self._starved(self._large_filled + 1)
            self._large = None
            return self._decode(type_code, request_id, body)
        available = self._end - self._start
        if available < HEADER.size:
            return self._starved(available)
        length, type_code, request_id = HEADER.unpack_from(self._scratch, self._start)
        limit = self.frame_bytes_max if self.state is READY else HELLO_BYTES_MAX
        if length > limit:
            raise LocalProtocolError(f"frame of {length} bytes is over the limit of {limit}",
                                     ErrorCode.FRAME_TOO_LARGE)
        if length < FRAME_BYTES_MIN:
            raise LocalProtocolError(f"frame length {length} is impossible")
        body_start, end = self._start + HEADER.size, self._start + 4 + length
        if available < 4 + length:
            if end <= len(self._scratch):
                pass  # it fits where it is: the rest arrives behind it
            elif 4 + length > self.scratch_bytes // 2:  # the rest goes straight to its own
                body = self.buffers.take(end - body_start)
                have = self._end - body_start
                body[:have] = self._scratch[body_start:self._end]
                self._large, self._large_filled = (type_code, request_id, body), have
                self._start = self._end
            else:
                self._renew_scratch(4 + length)
            return self._starved(available)
        self._start = end
        if length >= VIEW_FRAME_BYTES:  # a view: the scratch buffer is never rewritten
            return self._decode(type_code, request_id, self._scratch[body_start:end])
        return self._decode(type_code, request_id, bytes(self._scratch[body_start:end]))

    def _decode(self, type_code: int, request_id: int, body):
        message = decode_message(type_code, request_id, body, self.messages)
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
