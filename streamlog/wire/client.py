"""The daemon client: `RemoteLog` has the streamlog.Log API over a daemon connection.

Strategy: a connection (`_Link`) is a protocol.Connection and the event loop that moves
its bytes. Sync methods and readers use one driven by a private I/O thread: they hand
it a coroutine and block on the result, so they work from any thread (plain scripts,
Spark executors). Async methods (append, append_batch) use a connection on the caller's
own event loop, opened on first use: no thread hop, no GIL hand-off per request (which
costs milliseconds while the caller's thread is busy). So `open_remote(url)` works
wherever `open_log(path)` does, and code switches by URL alone.

Records are encoded in the caller's thread (the log's columnar payload, no per-record
framing) and decoded in the consumer's thread (Arrow without a loop per record), so
the I/O thread only moves bytes. Requests are pipelined: each carries an id and the
daemon answers in any order; appends from one thread (or one event loop) are written,
and so land, in call order.

Reads are subscriptions with credit: the reader grants the daemon `credit_bytes` and
tops it up as the consumer takes batches, so a slow consumer holds at most that much
in memory, here and in the daemon. Errors come back as the exception the local log
would have raised (UnknownStream, OffsetOutOfRange, InvalidAppend, ...); a connection
that cannot be made or is lost raises DaemonUnavailable, a refused token
AuthenticationFailed (both DaemonError: the CLI's exit code 3). The I/O thread's
connection is not reopened by itself: once lost, what was in flight fails (an append in
flight may or may not have landed) and the RemoteLog must be opened again; an event
loop's connection is opened afresh on the next async call.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import numbers
import os
import ssl
import threading
import urllib.parse

from ..errors import (InvalidAppend, InvalidArgument, LogClosed, ReadOnlyLog, StreamLogError,
                      UnknownStream)
from ..records import AppendResult, RecordKind, RecordPosition
from .. import validate
from ..txn import new_txn_id
from . import protocol as p

DEFAULT_PORT = 7541
SCHEMES = ("streamlog", "streamlog+tls")
CREDIT_BYTES = 8 * 1024 * 1024
CONNECT_TIMEOUT_S = 10.0
READ_CHUNK_BYTES = 1024 * 1024
# StreamReader pauses the socket past twice this: room for a credit window in flight
STREAM_LIMIT_BYTES = 4 * 1024 * 1024
# An APPEND larger than the daemon's frame limit less this slack is sent in pieces.
FRAME_SLACK_BYTES = 64 * 1024
# Options of open_log that mean nothing for a daemon's log: accepted and ignored.
_LOCAL_ONLY = {"fsync", "create", "fileio", "progress", "config"}


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


def open_remote(url: str, token: str | bytes | None = None, *, readonly: bool = False,
                tls: bool | ssl.SSLContext | None = None, tls_ca: str | None = None,
                connect_timeout_s: float = CONNECT_TIMEOUT_S,
                credit_bytes: int = CREDIT_BYTES, client_name: str = "",
                **options) -> "RemoteLog":
    """Connect to a daemon and authenticate.

    Args:
        url: `streamlog://HOST:PORT` (`streamlog+tls://` or tls=True for TLS).
        token: the daemon's token; default the STREAMLOG_TOKEN environment variable.
        readonly: refuse writes in this client (the daemon's log stays writable).
        tls: True, or an ssl.SSLContext; tls_ca: a CA file to verify the daemon with.
        credit_bytes: how much a reader lets the daemon send ahead of the consumer.
        options: open_log options that only make sense locally (fsync, create, ...)
            are accepted and ignored; any other raises InvalidArgument.
    Raises:
        InvalidArgument for a bad URL or option; AuthenticationFailed without a token or
        for a refused one; DaemonUnavailable when the daemon cannot be reached.
    """
    address = parse_url(url)
    unknown = set(options) - _LOCAL_ONLY
    if unknown:
        raise InvalidArgument(f"option(s) {', '.join(sorted(unknown))} are set on the "
                              f"daemon, not by a client")
    if token is None:
        token = os.environ.get("STREAMLOG_TOKEN")
    if not token:
        raise p.AuthenticationFailed("no token for the daemon: set STREAMLOG_TOKEN")
    context = _tls_context(address, tls, tls_ca)
    return RemoteLog(url, address, token.encode() if isinstance(token, str) else bytes(token),
                     context, readonly=readonly, connect_timeout_s=connect_timeout_s,
                     credit_bytes=credit_bytes, client_name=client_name)


def _tls_context(address: Address, tls, tls_ca) -> ssl.SSLContext | None:
    if isinstance(tls, ssl.SSLContext):
        return tls
    if not (tls or tls_ca or address.tls):
        return None
    return ssl.create_default_context(cafile=tls_ca)


# -- the connection, on the I/O thread -------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Credentials:
    address: Address
    token: bytes
    context: ssl.SSLContext | None
    timeout_s: float
    client_name: str


class _Link:
    """One authenticated connection and the event loop that drives it. A threaded link
    runs its own loop on a private thread (for sync callers, readers, and async callers
    of other loops); a native link lives on an async caller's loop (no thread hops).
    Everything but call()/acall()/post()/close_soon() runs on `loop`."""

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 thread: threading.Thread | None) -> None:
        self.loop = loop
        self.thread = thread
        self.conn = p.Connection(p.Role.CLIENT)
        self.pending: dict[int, asyncio.Future] = {}
        self.subscriptions: dict[int, "RemoteReader"] = {}
        self.frame_bytes_max = p.FRAME_BYTES_MAX
        self.failure: StreamLogError | None = None
        self._ids = itertools.count(1)
        self._writer = None
        self._tasks: list[asyncio.Task] = []

    @classmethod
    def threaded(cls, credentials: _Credentials) -> "_Link":
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
    async def native(cls, credentials: _Credentials) -> "_Link":
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

    async def _connect(self, credentials: _Credentials):
        address, context, timeout_s = (credentials.address, credentials.context,
                                       credentials.timeout_s)
        where = f"{address.host}:{address.port}"
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(
                address.host, address.port, ssl=context, limit=STREAM_LIMIT_BYTES,
                server_hostname=address.host if context else None), timeout_s)
        except (OSError, asyncio.TimeoutError, ssl.SSLError) as error:
            raise p.DaemonUnavailable(f"cannot reach the streamlog daemon at {where}: "
                                      f"{error or type(error).__name__}") from None
        self._writer = writer
        hello = p.Hello(0, p.WIRE_VERSION, credentials.token,
                        credentials.client_name or f"pid {os.getpid()}")
        try:
            writer.write(self.conn.send(hello))
            reply = await asyncio.wait_for(self._handshake(reader, where), timeout_s)
        except BaseException as error:
            writer.close()
            if isinstance(error, asyncio.TimeoutError):
                raise p.DaemonUnavailable(f"no answer to HELLO from {where} within "
                                          f"{timeout_s:g} s") from None
            if isinstance(error, (p.RemoteProtocolError, OSError)):
                raise p.DaemonUnavailable(f"{where} did not answer as a streamlog daemon: "
                                          f"{error}") from None
            raise
        self.frame_bytes_max = reply.frame_bytes_max
        self._tasks = [asyncio.create_task(self._receive(reader)),
                       asyncio.create_task(self._heartbeat(reply.idle_timeout_ms / 3000))]

    async def _handshake(self, reader, where: str) -> p.HelloOk:
        while True:
            message = self.conn.next_event()
            if isinstance(message, p.HelloOk):
                return message
            if isinstance(message, p.Error):
                raise p.exception_for(message.code, f"daemon at {where}: {message.message}")
            if message is p.CLOSED:
                raise p.DaemonUnavailable(f"the daemon at {where} closed the connection")
            data = await reader.read(READ_CHUNK_BYTES)
            self.conn.receive_data(data)

    async def _receive(self, reader) -> None:
        try:
            while True:
                data = await reader.read(READ_CHUNK_BYTES)
                self.conn.receive_data(data)
                while True:
                    message = self.conn.next_event()
                    if message is p.NEED_DATA:
                        break
                    if message is p.CLOSED:
                        raise p.DaemonUnavailable("the daemon closed the connection")
                    self._route(message)
        except asyncio.CancelledError:
            self._fail_all(LogClosed("the client was closed"))
            if self._writer is not None:  # asyncio.run() ending under a native link
                self._writer.close()
            raise
        except p.RemoteProtocolError as error:
            self._fail_all(error)
        except StreamLogError as error:
            self._fail_all(error)
        except (OSError, ConnectionError) as error:
            self._fail_all(p.DaemonUnavailable(f"connection to the daemon lost: {error}"))

    def _route(self, message: p.Message) -> None:
        reader = self.subscriptions.get(message.request_id)
        if reader is not None:
            reader._deliver(message)
            return
        future = self.pending.pop(message.request_id, None)
        if future is None:
            if isinstance(message, p.Error) and message.request_id == 0:
                raise p.exception_for(message.code, f"daemon: {message.message}")
            return  # a reply to something we gave up on (a cancelled read's batch)
        if future.done():
            return
        if isinstance(message, p.Error):
            future.set_exception(p.exception_for(message.code, message.message))
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
            reader._deliver_failure(error)
        self.subscriptions.clear()

    async def _heartbeat(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(max(interval_s, 0.05))
            if self.failure is None:
                self._write(p.Ping(self._next_id()))

    def _next_id(self) -> int:
        while True:
            request_id = next(self._ids) % (p.REQUEST_ID_MAX + 1)
            if request_id and request_id not in self.pending and (
                    request_id not in self.subscriptions):
                return request_id

    def _write(self, message: p.Message) -> None:
        self._writer.write(self.conn.send(message))

    async def request(self, make) -> p.Message:
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
        self._write(make(request_id))
        return request_id

    def send_nowait(self, message: p.Message) -> None:
        if self.failure is None and self._writer is not None and not self._writer.is_closing():
            self._write(message)

    async def _close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
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
        if self._writer is not None:
            self._writer.close()


# -- the Log API -----------------------------------------------------------------------

class RemoteLog:
    """streamlog.Log's API on a daemon's log. Thread-safe: any thread or event loop.

    Sync methods block the calling thread; async methods (append, append_batch,
    aclose) await without blocking the caller's event loop.
    """

    def __init__(self, url: str, address: Address, token: bytes, context, *,
                 readonly: bool, connect_timeout_s: float, credit_bytes: int,
                 client_name: str) -> None:
        self.path = url
        self.url = url
        self.readonly = readonly
        self.credit_bytes = credit_bytes
        self.closed = False
        self._credentials = _Credentials(address, token, context, connect_timeout_s,
                                         client_name)
        self._link = _Link.threaded(self._credentials)
        # async callers get a connection on their own event loop (opened on first use)
        self._native: dict[asyncio.AbstractEventLoop, asyncio.Task] = {}
        self._native_lock = threading.Lock()

    # -- streams -------------------------------------------------------------------

    def create_stream(self, name: str, partitions: int = 1) -> int:
        self._check_open()
        if self.readonly:
            raise ReadOnlyLog("this client was opened read-only")
        if not isinstance(name, str):
            raise InvalidArgument(f"invalid stream name {name!r}")
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise InvalidArgument(f"partitions must be a positive int (got {partitions!r})")
        return self._call(lambda rid: p.CreateStream(rid, name, partitions)).value

    def _streams(self) -> dict[str, int]:
        return self._call(lambda rid: p.Streams(rid)).value()

    def streams(self) -> list[str]:
        return sorted(self._streams())

    def partition_count(self, stream: str) -> int:
        counts = self._streams()
        if stream not in counts:
            raise UnknownStream(f"no stream named {stream!r} in {self.url}")
        return counts[stream]

    # -- appends ---------------------------------------------------------------------

    async def append(self, stream: str, value, *, key=None, timestamp_us=None,
                     partition=None, headers=None, kind=RecordKind.DATA,
                     txn_id: int = 0) -> RecordPosition:
        """Append one record; returns where it landed once the daemon made it durable."""
        result = await self.append_batch(stream, [value], keys=[key],
                                         timestamps_us=_one(timestamp_us),
                                         partition=partition, headers=_one(headers),
                                         kinds=_kinds(kind), txn_id=txn_id)
        (number, (first, _)), = result.ranges.items()
        return RecordPosition(number, first)

    def append_sync(self, stream: str, value, *, key=None, timestamp_us=None, partition=None,
                    headers=None, kind=RecordKind.DATA, txn_id: int = 0) -> RecordPosition:
        result = self.append_batch_sync(stream, [value], keys=[key],
                                        timestamps_us=_one(timestamp_us),
                                        partition=partition, headers=_one(headers),
                                        kinds=_kinds(kind), txn_id=txn_id)
        (number, (first, _)), = result.ranges.items()
        return RecordPosition(number, first)

    async def append_batch(self, stream: str, values, *, keys=None, timestamps_us=None,
                           partition=None, headers=None, kinds=None,
                           txn_id: int = 0) -> AppendResult:
        """Append records given as parallel sequences. Returns {partition: (first, last)}
        once durable. A batch over the daemon's frame limit goes as several requests, in
        order; each lands contiguously, and the range reported spans them."""
        requests = self._prepare(stream, values, keys, timestamps_us, partition, headers,
                                 kinds, txn_id)
        link = await self._native_link()
        return await link.acall(_append_all(link, requests))

    def append_batch_sync(self, stream: str, values, *, keys=None, timestamps_us=None,
                          partition=None, headers=None, kinds=None,
                          txn_id: int = 0) -> AppendResult:
        requests = self._prepare(stream, values, keys, timestamps_us, partition, headers,
                                 kinds, txn_id)
        return self._link.call(_append_all(self._link, requests))

    async def _native_link(self) -> _Link:
        """The connection of the running event loop, opened on first use; a failed one
        is replaced by a new connection on the next call."""
        loop = asyncio.get_running_loop()
        with self._native_lock:
            self._check_open()
            task = self._native.get(loop)
            if task is None or _unusable(task):
                task = loop.create_task(_Link.native(self._credentials))
                self._native = {other: t for other, t in self._native.items()
                                if not other.is_closed()}
                self._native[loop] = task
        return await asyncio.shield(task)

    def _prepare(self, stream, values, keys, timestamps_us, partition, headers, kinds, txn_id):
        """Check and encode in the caller's thread; returns request factories."""
        self._check_open()
        if self.readonly:
            raise ReadOnlyLog("this client was opened read-only")
        if not isinstance(stream, str):
            raise InvalidArgument(f"stream must be a str (got {type(stream).__name__})")
        if partition is not None and (isinstance(partition, bool) or not isinstance(
                partition, int) or partition < 0):
            raise InvalidArgument(f"partition must be an int >= 0 (got {partition!r})")
        if isinstance(txn_id, bool) or not isinstance(txn_id, int) or not 0 <= txn_id < 1 << 64:
            raise InvalidAppend(f"txn_id must be an int in 0..2**64-1 (got {txn_id!r})")
        columns = _columns(values, keys, timestamps_us, headers, kinds)
        target = -1 if partition is None else partition
        given = int(timestamps_us is not None)
        requests = []
        for rows in _pieces(columns, self._link.frame_bytes_max - FRAME_SLACK_BYTES):
            payload, flags = p.encode_records(*_take(columns, rows))
            requests.append(_append_factory(stream, target, txn_id, given, len(rows), flags,
                                            payload))
        return requests

    # -- reads -----------------------------------------------------------------------

    def reader(self, stream: str, partition: int = 0, *, from_offset: int | None = None,
               from_timestamp_us: int | None = None, to_offset: int | None = None,
               to_timestamp_us: int | None = None, follow: bool = False,
               data_only: bool = True, read_committed: bool = True) -> "RemoteReader":
        """A reader of one partition, with Log.reader's rules and errors (raised here,
        when the daemon opens it)."""
        self._check_open()
        if from_offset is not None and from_timestamp_us is not None:
            raise InvalidArgument("give from_offset or from_timestamp_us, not both")
        if to_offset is not None and to_timestamp_us is not None:
            raise InvalidArgument("give to_offset or to_timestamp_us, not both")
        for name, value in (("from_offset", from_offset), ("to_offset", to_offset),
                            ("from_timestamp_us", from_timestamp_us),
                            ("to_timestamp_us", to_timestamp_us), ("partition", partition)):
            if value is not None and (isinstance(value, bool) or not isinstance(
                    value, numbers.Integral)):
                raise InvalidArgument(f"{name} must be an int (got {type(value).__name__})")
        start = (p.Start.OFFSET, from_offset) if from_offset is not None else (
            (p.Start.TIMESTAMP, from_timestamp_us) if from_timestamp_us is not None
            else (p.Start.LOG_START, 0))
        stop = (p.Stop.OFFSET, to_offset) if to_offset is not None else (
            (p.Stop.TIMESTAMP, to_timestamp_us) if to_timestamp_us is not None
            else (p.Stop.NONE, 0))
        flags = ((p.READ_FOLLOW if follow else 0) | (p.READ_DATA_ONLY if data_only else 0)
                 | (p.READ_COMMITTED if read_committed else 0))
        return RemoteReader(self._link, stream, int(partition), int(start[0]), int(start[1]),
                            int(stop[0]), int(stop[1]), flags, self.credit_bytes)

    def offset_for_timestamp(self, stream: str, partition: int, timestamp_us: int) -> int:
        return self._call(lambda rid: p.OffsetForTimestamp(rid, stream, partition,
                                                           int(timestamp_us))).value

    def end_offset(self, stream: str, partition: int = 0) -> int:
        return self._call(lambda rid: p.Offsets(rid, stream, partition)).end_offset

    def start_offset(self, stream: str, partition: int = 0) -> int:
        return self._call(lambda rid: p.Offsets(rid, stream, partition)).start_offset

    def last_stable_offset(self, stream: str, partition: int = 0) -> int:
        """As Log.last_stable_offset: the first offset of the oldest open transaction,
        or the end."""
        return self._call(lambda rid: p.Offsets(rid, stream, partition)).stable_offset

    # -- transactions ----------------------------------------------------------------

    new_txn_id = staticmethod(new_txn_id)

    def commit_txn(self, stream: str, partition: int, txn_id: int, *, tag: str = "",
                   marker: bytes = b"") -> int:
        self._check_writable()
        return self._call(lambda rid: p.CommitTxn(rid, stream, partition, txn_id, tag,
                                                  bytes(marker))).value

    def abort_txn(self, stream: str, partition: int, txn_id: int) -> int:
        self._check_writable()
        return self._call(lambda rid: p.AbortTxn(rid, stream, partition, txn_id)).value

    def txn_state(self, stream: str, partition: int, txn_id: int):
        from ..txn import TxnState
        value = self._call(lambda rid: p.TxnStateRequest(rid, stream, partition, txn_id)).value
        return None if value == 0 else TxnState(value)

    def last_commit(self, stream: str, partition: int, tag: str) -> bytes | None:
        reply = self._call(lambda rid: p.LastCommit(rid, stream, partition, tag))
        return bytes(reply.value) if reply.present else None

    # -- maintenance -----------------------------------------------------------------

    def truncate_after(self, stream: str, partition: int, offset: int) -> int:
        self._check_writable()
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise InvalidArgument("offset must be an int")
        return self._call(lambda rid: p.TruncateAfter(rid, stream, partition, offset)).value

    def info(self) -> dict:
        return self._call(lambda rid: p.Info(rid)).value()

    def refresh(self) -> None:
        """Nothing to do: every answer comes from the daemon's live log."""

    def close(self) -> None:
        """Close the connections (readers of this client end). Idempotent."""
        with self._native_lock:
            if self.closed:
                return
            self.closed = True
            native, self._native = self._native, {}
        for loop, task in native.items():
            if loop.is_closed():
                continue
            if task.done() and not _unusable(task):
                task.result().stop()
            else:
                loop.call_soon_threadsafe(task.cancel)
        self._link.stop()

    async def aclose(self) -> None:
        task = self._native.get(asyncio.get_running_loop())
        if task is not None and task.done() and not _unusable(task):
            await task.result()._close()
        await asyncio.to_thread(self.close)

    def __enter__(self) -> "RemoteLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    async def __aenter__(self) -> "RemoteLog":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"RemoteLog({self.url!r}{', closed' if self.closed else ''})"

    # -- helpers ---------------------------------------------------------------------

    def _call(self, make) -> p.Message:
        self._check_open()
        return self._link.call(self._link.request(make))

    def _check_open(self) -> None:
        if self.closed:
            raise LogClosed(f"the client of {self.url} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self.readonly:
            raise ReadOnlyLog("this client was opened read-only")


async def _append_all(link: _Link, requests) -> AppendResult:
    replies = await asyncio.gather(*(link.request(make) for make in requests))
    ranges: dict[int, tuple[int, int]] = {}
    total = 0
    for reply in replies:
        total += reply.records
        for number, (first, last) in p.ranges_of(reply).items():
            old = ranges.get(number)
            ranges[number] = (first, last) if old is None else (old[0], last)
    return AppendResult(ranges, total)


def _unusable(task: asyncio.Task) -> bool:
    if not task.done():
        return False
    if task.cancelled() or task.exception() is not None:
        return True
    return task.result().failure is not None


def _append_factory(stream, target, txn_id, given, count, flags, payload):
    return lambda rid: p.Append(rid, stream, target, txn_id, given, count, flags, payload)


def _one(item):
    return None if item is None else [item]


def _kinds(kind):
    return None if kind == RecordKind.DATA else [kind]


# -- record checks (the same rules and messages as Log.append_batch) -------------------

@dataclasses.dataclass(slots=True)
class _Columns:
    values: list
    keys: list
    timestamps: list
    headers: list | None
    kinds: list | None


def _columns(values, keys, timestamps_us, headers, kinds) -> _Columns:
    """The log's checks (validate.records); the daemon bounds record sizes itself and
    stamps the append time when no timestamps are given (sent as zeros)."""
    values, keys, timestamps, headers, kinds = validate.records(values, keys, timestamps_us,
                                                                headers, kinds)
    if timestamps is None:
        timestamps = [0] * len(values)
    if headers is not None and not any(headers):
        headers = None
    if kinds is not None and not any(kinds):
        kinds = None
    return _Columns(values, keys, timestamps, headers, kinds)


def _pieces(columns: _Columns, bytes_max: int) -> list[range]:
    """Row ranges whose encoded payload stays under bytes_max (one range, usually)."""
    n = len(columns.values)
    sizes = None
    keys = columns.keys
    key_bytes = (sum(map(len, keys)) if keys[0] is not None and None not in keys
                 else sum(len(k) for k in keys if k))
    total = sum(map(len, columns.values)) + key_bytes + 17 * n
    if columns.headers is not None:
        sizes = [len(v) + (len(k) if k else 0) + 21 + _headers_size(h) for v, k, h in
                 zip(columns.values, columns.keys, columns.headers)]
        total = sum(sizes)
    if total <= bytes_max:
        return [range(n)]
    if sizes is None:
        sizes = [len(v) + (len(k) if k else 0) + 17 for v, k in
                 zip(columns.values, columns.keys)]
    out, start, size = [], 0, 0
    for row, record in enumerate(sizes):
        if record > bytes_max:
            raise InvalidAppend(f"record {row} is {record} bytes; the daemon takes frames of"
                                f" at most {bytes_max + FRAME_SLACK_BYTES}")
        if size + record > bytes_max:
            out.append(range(start, row))
            start, size = row, 0
        size += record
    out.append(range(start, n))
    return out


def _take(columns: _Columns, rows: range):
    if len(rows) == len(columns.values):
        return (columns.timestamps, columns.keys, columns.values, columns.kinds,
                columns.headers)
    cut = slice(rows.start, rows.stop)
    return (columns.timestamps[cut], columns.keys[cut], columns.values[cut],
            columns.kinds[cut] if columns.kinds is not None else None,
            columns.headers[cut] if columns.headers is not None else None)


def _headers_size(headers) -> int:
    return 2 + sum(8 + len(name.encode()) + len(value) for name, value in headers)


# -- readers ---------------------------------------------------------------------------

_END = object()


class _Inbox:
    """Batches from the I/O thread to one consumer (a thread or an event loop).
    Bounded by the credit the consumer granted, not by a size of its own."""

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


class RemoteReader:
    """Log.reader's API over a daemon READ: records(), arrow(), iteration, async
    iteration, close(). Used by one thread or task at a time, as a local Reader."""

    def __init__(self, link: _Link, stream: str, partition: int, start: int,
                 start_value: int, stop: int, stop_value: int, flags: int,
                 credit_bytes: int) -> None:
        self._link = link
        self.stream = stream
        self.partition = partition
        self.follow = bool(flags & p.READ_FOLLOW)
        self.data_only = bool(flags & p.READ_DATA_ONLY)
        self.done = False
        self._inbox = _Inbox()
        self._credit_bytes = max(credit_bytes, 64 * 1024)
        self._consumed = 0
        self._opened: asyncio.Future | None = None
        self._request_id = 0
        make = lambda rid: p.Read(rid, stream, partition, start, start_value, stop,  # noqa: E731
                                  stop_value, flags, self._credit_bytes)
        self.next_offset = link.call(self._open(make))

    async def _open(self, make) -> int:
        self._opened = self._link.loop.create_future()
        self._request_id = await self._link.subscribe(self, make)
        try:
            return await self._opened
        except BaseException:
            self._link.subscriptions.pop(self._request_id, None)
            raise

    # I/O thread ---------------------------------------------------------------------

    def _deliver(self, message: p.Message) -> None:
        opened = self._opened
        if isinstance(message, p.ReadOpened):
            if opened is not None and not opened.done():
                opened.set_result(message.start_offset)
        elif isinstance(message, p.Batch):
            self._inbox.put(message)
        elif isinstance(message, p.ReadEnd):
            self._link.subscriptions.pop(message.request_id, None)
            self._inbox.put(message)
        elif isinstance(message, p.Error):
            self._deliver_failure(p.exception_for(message.code, message.message))

    def _deliver_failure(self, error: BaseException) -> None:
        self._link.subscriptions.pop(self._request_id, None)
        opened = self._opened
        if opened is not None and not opened.done():
            opened.set_exception(error)
        else:
            self._inbox.put(error)

    # consumer -----------------------------------------------------------------------

    def _columns(self, item):
        """Columns of one BATCH, or None at the end; raises what the daemon reported."""
        if item is _END:
            self.done = True
            return None
        if isinstance(item, p.ReadEnd):
            self.done = True
            self.next_offset = item.next_offset  # past skipped (aborted) batches too
            return None
        if isinstance(item, BaseException):
            self.done = True
            raise item
        try:
            columns = p.decode_records(item.payload, item.payload_flags, item.record_count,
                                       base_offset=item.base_offset, txn_id=item.txn_id)
        except p.LocalProtocolError as error:
            self.close()
            raise p.RemoteProtocolError(str(error)) from None
        self.next_offset = item.base_offset + item.record_count
        self._consumed += len(item.payload)
        if self._consumed >= self._credit_bytes // 2:
            consumed, self._consumed = self._consumed, 0
            self._link.post(self._link.send_nowait, p.Credit(self._request_id, consumed))
        return columns

    def _batches(self):
        while not self.done:
            columns = self._columns(self._inbox.get())
            if columns is not None:
                yield columns

    def records(self):
        """Records from the start to the end (or forever, when following)."""
        from ..payload import columns_to_records
        for columns in self._batches():
            yield from columns_to_records(columns, self.partition, 0, len(columns),
                                          self.data_only)

    def arrow(self, *, include_headers: bool = False):
        """pyarrow.RecordBatch per log batch, as Reader.arrow()."""
        from ..arrowconv import columns_to_arrow
        for columns in self._batches():
            batch = columns_to_arrow(columns, self.partition, 0, len(columns),
                                     data_only=self.data_only, include_headers=include_headers)
            if batch.num_rows:
                yield batch

    def __iter__(self):
        return self.records()

    async def arecords(self):
        from ..payload import columns_to_records
        while not self.done:
            columns = self._columns(await self._inbox.get_async())
            if columns is not None:
                for record in columns_to_records(columns, self.partition, 0, len(columns),
                                                 self.data_only):
                    yield record

    def __aiter__(self):
        return self.arecords()

    def close(self) -> None:
        """Stop the read (the daemon releases its position). Idempotent."""
        if not self.done:
            self.done = True
            self._link.post(self._cancel)
            self._inbox.put(_END)  # wakes a consumer blocked in another thread

    def _cancel(self) -> None:
        if self._link.subscriptions.pop(self._request_id, None) is not None:
            self._link.send_nowait(p.Cancel(self._request_id))

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
