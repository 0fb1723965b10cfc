"""The client's connections to a daemon: where to connect, and one link per connection.

Strategy: a `Link` is a connection.Connection and the event loop that moves its bytes.
A threaded link runs its own loop on a private I/O thread: sync callers (plain scripts,
Spark executors) and readers hand it a coroutine and block on the result, so they work
from any thread. A native link lives on an async caller's own event loop, opened on
first use: no thread hop, no GIL hand-off per request (which costs milliseconds while
the caller's thread is busy). client.py decides which link a call uses.

A link sends requests pipelined, each with a fresh request id, and routes each reply to
the future that waits for it (`request`) or to the reader whose READ it belongs to
(`subscribe`); the daemon answers in any order. An ERROR reply raises the exception the
local log would have (codes.exception_for). A link that cannot connect, or loses its
connection, raises DaemonUnavailable (a refused token AuthenticationFailed) to
everything in flight and is not reopened by itself. An `Inbox` carries a reader's
batches from the link's loop to the thread or event loop that consumes them.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import os
import ssl
import threading
import urllib.parse
from typing import TYPE_CHECKING

from ..errors import InvalidArgument, LogClosed, StreamLogError
from .codes import DaemonUnavailable, RemoteProtocolError, exception_for
from .connection import CLOSED, NEED_DATA, Connection
from .messages import (FRAME_BYTES_MAX, REQUEST_ID_MAX, WIRE_VERSION, Error, Hello, HelloOk,
                       Message, Ping, Role)
from .stream import Channel

if TYPE_CHECKING:
    from .client import RemoteReader

DEFAULT_PORT = 7541
# A client receives into scratch buffers this large (a few of a READ's BATCHes, which
# are stored frames: a frame that does not fit the room left is the one copied), and
# while a read streams, its connection keeps this many bytes of receive buffers to use
# again once the consumer is done with what they hold (connection.BufferPool): a
# reader's credit and the scratch buffer the kernel is writing into.
READ_SCRATCH_BYTES = 4 * 1024 * 1024
READ_BUFFERS_BYTES = 32 * 1024 * 1024
SCHEMES = ("streamlog", "streamlog+tls")
CONNECT_TIMEOUT_S = 10.0


@dataclasses.dataclass(frozen=True)
class Address:
    host: str
    port: int
    tls: bool


def parse_url(url: str) -> Address:
    """`streamlog://HOST[:PORT][/]` (or `streamlog+tls://`); IPv6 hosts in brackets."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in SCHEMES or not parts.hostname:
        raise InvalidArgument(f"not a daemon URL: {url!r} (expected streamlog://HOST:PORT)")
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError:
        raise InvalidArgument(f"bad port in {url!r}") from None
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise InvalidArgument(f"daemon URL {url!r} has a path or query; give only HOST:PORT")
    return Address(parts.hostname, port, parts.scheme == "streamlog+tls")


def tls_context(address: Address, tls, tls_ca) -> ssl.SSLContext | None:
    """The SSLContext open_remote's `tls` / `tls_ca` and the URL's scheme ask for."""
    if isinstance(tls, ssl.SSLContext):
        return tls
    if not (tls or tls_ca or address.tls):
        return None
    return ssl.create_default_context(cafile=tls_ca)


# -- one connection --------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Credentials:
    """Where and how a link connects and authenticates."""

    address: Address
    token: bytes
    context: ssl.SSLContext | None
    timeout_s: float
    client_name: str


class Link:
    """One authenticated connection and the event loop that drives it. A threaded link
    runs its own loop on a private thread (for sync callers, readers, and async callers
    of other loops); a native link lives on an async caller's loop (no thread hops).
    Everything but call()/acall()/post()/close_soon() runs on `loop`."""

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 thread: threading.Thread | None) -> None:
        self.loop = loop
        self.thread = thread
        self.conn = Connection(Role.CLIENT, scratch_bytes=READ_SCRATCH_BYTES)
        self.pending: dict[int, asyncio.Future] = {}
        self.subscriptions: dict[int, "RemoteReader"] = {}
        self.frame_bytes_max = FRAME_BYTES_MAX
        self.failure: StreamLogError | None = None
        self._ids = itertools.count(1)
        self._writer: Channel | None = None
        self._hello: asyncio.Future | None = None
        self._tasks: list[asyncio.Task] = []

    @classmethod
    def threaded(cls, credentials: Credentials) -> "Link":
        address = credentials.address
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, daemon=True,
                                  name=f"streamlog-client-{address.host}:{address.port}")
        thread.start()
        link = cls(loop, thread)
        try:
            link.call(link._connect(credentials))
        except BaseException:
            link.stop()
            raise
        return link

    @classmethod
    async def native(cls, credentials: Credentials) -> "Link":
        link = cls(asyncio.get_running_loop(), None)
        await link._connect(credentials)
        return link

    # -- crossing threads ----------------------------------------------------------

    def call(self, coroutine):
        """Run `coroutine` on the link's loop; block until its result (threaded only)."""
        assert self.thread is not None
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    async def acall(self, coroutine):
        """Await `coroutine` on the link's loop from the caller's loop."""
        if self.thread is None:
            return await coroutine  # a native link: we are on its loop already
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, self.loop))

    def post(self, function, *args) -> None:
        """Run a plain function on the link's loop, without waiting."""
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(function, *args)

    # -- I/O loop ------------------------------------------------------------------

    async def _connect(self, credentials: Credentials):
        address, context, timeout_s = (credentials.address, credentials.context,
                                       credentials.timeout_s)
        where = f"{address.host}:{address.port}"
        self._hello = self.loop.create_future()  # the handshake's answer
        try:
            _, channel = await asyncio.wait_for(self.loop.create_connection(
                lambda: Channel(self.conn, on_made=self._made, on_data=self._received,
                                on_lost=self._connection_lost),
                address.host, address.port, ssl=context,
                server_hostname=address.host if context else None), timeout_s)
        except (OSError, asyncio.TimeoutError, ssl.SSLError) as error:
            raise DaemonUnavailable(f"cannot reach the streamlog daemon at {where}: "
                                    f"{error or type(error).__name__}") from None
        hello = Hello(0, WIRE_VERSION, credentials.token,
                      credentials.client_name or f"pid {os.getpid()}")
        try:
            if not self._hello.done():  # else refused already (a connection limit)
                channel.write(self.conn.send(hello))
            reply = await asyncio.wait_for(self._handshake(where), timeout_s)
        except BaseException as error:
            channel.close()
            if isinstance(error, asyncio.TimeoutError):
                raise DaemonUnavailable(f"no answer to HELLO from {where} within "
                                        f"{timeout_s:g} s") from None
            if isinstance(error, (RemoteProtocolError, OSError)):
                raise DaemonUnavailable(f"{where} did not answer as a streamlog daemon: "
                                        f"{error}") from None
            raise
        self.frame_bytes_max = reply.frame_bytes_max
        self._tasks = [asyncio.create_task(self._heartbeat(reply.idle_timeout_ms / 3000))]

    async def _handshake(self, where: str) -> HelloOk:
        message = await self._hello
        if isinstance(message, HelloOk):
            return message
        if isinstance(message, Error):
            raise exception_for(message.code, f"daemon at {where}: {message.message}")
        if isinstance(message, BaseException):
            raise message
        raise DaemonUnavailable(f"the daemon at {where} closed the connection")

    def _made(self, channel: Channel) -> None:
        self._writer = channel  # before any byte arrives (an early refusal)

    def _connection_lost(self, exc: Exception | None) -> None:
        why = f": {exc}" if exc else ""
        self._lost(DaemonUnavailable(f"connection to the daemon lost{why}"))

    def _received(self) -> None:
        """The channel got bytes (or the end): route every whole message."""
        try:
            while (message := self.conn.next_event()) is not NEED_DATA:
                if not self._hello.done():  # HELLO_OK, ERROR or CLOSED
                    self._hello.set_result(message)
                    if isinstance(message, HelloOk):
                        continue
                    return
                if message is CLOSED:
                    raise DaemonUnavailable("the daemon closed the connection")
                self._route(message)
        except (RemoteProtocolError, StreamLogError) as error:
            self._lost(error)

    def _lost(self, error: StreamLogError) -> None:
        if self._hello is not None and not self._hello.done():
            self._hello.set_result(error)
        self._fail_all(error)
        if self._writer is not None:
            self._writer.close()

    def _route(self, message: Message) -> None:
        reader = self.subscriptions.get(message.request_id)
        if reader is not None:
            reader.deliver(message)
            return
        future = self.pending.pop(message.request_id, None)
        if future is None:
            if isinstance(message, Error) and message.request_id == 0:
                raise exception_for(message.code, f"daemon: {message.message}")
            return  # a reply to something we gave up on (a cancelled read's batch)
        if future.done():
            return
        if isinstance(message, Error):
            future.set_exception(exception_for(message.code, message.message))
        else:
            future.set_result(message)

    def _fail_all(self, error: StreamLogError) -> None:
        if self.failure is None:
            self.failure = error
        pending, self.pending = self.pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)
        for reader in list(self.subscriptions.values()):
            reader.deliver_failure(error)
        self.subscriptions.clear()
        self.conn.buffers.keep(0)

    async def _heartbeat(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(max(interval_s, 0.05))
            if self.failure is None:
                self._write(Ping(self._next_id()))

    def _next_id(self) -> int:
        while True:
            request_id = next(self._ids) % (REQUEST_ID_MAX + 1)
            if request_id and request_id not in self.pending and (
                    request_id not in self.subscriptions):
                return request_id

    def _write(self, message: Message) -> None:
        self._writer.write(self.conn.send(message))

    async def request(self, make) -> Message:
        """Send `make(request_id)`; return the reply, or raise what the daemon said."""
        if self.failure is not None:
            raise self.failure
        request_id = self._next_id()
        future = self.loop.create_future()
        self.pending[request_id] = future
        self._write(make(request_id))
        try:
            await self._writer.drain()
        except (OSError, ConnectionError):
            pass  # the receive task reports the lost connection to every waiter
        return await future

    async def subscribe(self, reader: "RemoteReader", make) -> int:
        if self.failure is not None:
            raise self.failure
        request_id = self._next_id()
        self.subscriptions[request_id] = reader
        self.conn.buffers.keep(READ_BUFFERS_BYTES)
        self._write(make(request_id))
        return request_id

    def unsubscribe(self, request_id: int):
        """Forget a read (it ended or was cancelled); returns its reader, or None when
        it was forgotten already. Once no read is left, no buffers wait for one."""
        reader = self.subscriptions.pop(request_id, None)
        if not self.subscriptions:
            self.conn.buffers.keep(0)
        return reader

    def send_nowait(self, message: Message) -> None:
        if self.failure is None and self._writer is not None and not self._writer.is_closing():
            self._write(message)

    async def _close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._fail_all(LogClosed("the client was closed"))
        if self._writer is not None:
            self._writer.close()
            try:
                await asyncio.wait_for(self._writer.wait_closed(), 2.0)
            except (OSError, ConnectionError, asyncio.TimeoutError, ssl.SSLError):
                pass

    def stop(self) -> None:
        """Close the connection (and end the I/O thread of a threaded link). Idempotent;
        from any thread."""
        if self.thread is None:
            self.close_soon()
            return
        if self.loop.is_closed():
            return
        if self.thread.is_alive():
            try:
                self.call(self._close())
            except Exception:  # noqa: BLE001 - closing anyway
                pass
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()
        self.loop.close()

    def close_soon(self) -> None:
        """Native link: close without waiting, from its loop's thread or another."""
        if self.loop.is_closed():
            return
        try:
            on_loop = asyncio.get_running_loop() is self.loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self._abort()
        else:
            self.post(self._abort)

    def _abort(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._fail_all(LogClosed("the client was closed"))
        if self._writer is not None:
            self._writer.close()


def unusable(task: asyncio.Task) -> bool:
    """True when the task that opens a native link failed, or its link has failed."""
    if not task.done():
        return False
    if task.cancelled() or task.exception() is not None:
        return True
    return task.result().failure is not None


# -- crossing to a consumer's thread ---------------------------------------------------

class Inbox:
    """Items from a link's loop to one consumer (a thread or another event loop): a
    reader's batches. Bounded by the credit the consumer granted, not by a size of its
    own."""

    def __init__(self) -> None:
        self._items: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []

    def put(self, item) -> None:
        with self._cond:
            self._items.append(item)
            self._cond.notify_all()
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            try:
                loop.call_soon_threadsafe(_wake, future)
            except RuntimeError:  # that loop is closed: nobody waits any more
                pass

    def get(self):
        with self._cond:
            while not self._items:
                self._cond.wait(1.0)
            return self._items.popleft()

    async def get_async(self):
        loop = asyncio.get_running_loop()
        while True:
            with self._cond:
                if self._items:
                    return self._items.popleft()
                future = loop.create_future()
                self._waiters.append((loop, future))
            await future


def _wake(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
