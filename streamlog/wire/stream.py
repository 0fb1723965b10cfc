"""A connection's socket: the thin asyncio shell both ends share.

Strategy: a `Channel` is an asyncio.BufferedProtocol over one socket. Received bytes go
straight into its `connection.Connection`'s buffers (`get_buffer` / `buffer_updated`):
a large frame's body, the records of an APPEND or a BATCH, is written by the kernel into
a buffer of its own and never copied in user space. What arrived is parsed by the owner
(session.py on the daemon, link.py in a client), which is told by `on_data` or waits for
`readable()`. The writer's side is what those two used of asyncio.StreamWriter: `write`,
`drain` (flow control from the transport's pause_writing/resume_writing), `close`,
`wait_closed`, `get_extra_info`, `transport`. Event-loop thread only.
"""

from __future__ import annotations

import asyncio
from typing import Callable

from .connection import Connection


class Channel(asyncio.BufferedProtocol):
    """One socket of `conn`. Callbacks run on the loop: `on_made(channel)` once
    connected, `on_data()` after bytes or the peer's end arrived, `on_lost(exc)` when
    the connection is gone (exc None for a clean close)."""

    def __init__(self, conn: Connection, *, on_made: Callable | None = None,
                 on_data: Callable | None = None, on_lost: Callable | None = None) -> None:
        self.conn = conn
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.received = 0  # bytes so far (a frame in progress is not silence)
        self._on_made, self._on_data, self._on_lost = on_made, on_data, on_lost
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._closed: asyncio.Future | None = None

    # -- asyncio.BufferedProtocol ----------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        self._closed = asyncio.get_running_loop().create_future()
        if self._on_made is not None:
            self._on_made(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.conn.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self.conn.buffer_updated(nbytes)
        self.received += nbytes
        if self.conn.has_event():  # a part of a frame wakes nobody
            self._arrived()

    def eof_received(self) -> bool:
        self.conn.receive_data(b"")
        self._arrived()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(None)
        self._writable.set()  # wake drain(), which then raises
        self._arrived()
        if self._on_lost is not None:
            self._on_lost(exc)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def _arrived(self) -> None:
        self._readable.set()
        if self._on_data is not None:
            self._on_data()

    # -- the reading side ------------------------------------------------------------

    async def readable(self) -> None:
        """Wait until bytes or the peer's end arrived since the last call; raise
        ConnectionResetError once the connection is gone (what was buffered before
        that has been handed over by then: parse before calling again)."""
        await self._readable.wait()
        self._readable.clear()
        if self.lost:
            raise ConnectionResetError("connection lost")

    def pause_reading(self) -> None:
        """Stop taking bytes from the socket (the peer's TCP window fills up)."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    # -- the writing side (asyncio.StreamWriter's) -----------------------------------

    def write(self, data) -> None:
        self.transport.write(data)

    async def drain(self) -> None:
        """Wait while the transport's write buffer is over its high mark; raise
        ConnectionResetError when the connection is gone."""
        if not self.lost and self.transport.is_closing():
            await asyncio.sleep(0)  # let connection_lost run
        if self.lost:
            raise ConnectionResetError("connection lost")
        await self._writable.wait()
        if self.lost:
            raise ConnectionResetError("connection lost")

    def is_closing(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    async def wait_closed(self) -> None:
        if self._closed is not None:
            await asyncio.shield(self._closed)

    def get_extra_info(self, name: str, default=None):
        return self.transport.get_extra_info(name, default)
