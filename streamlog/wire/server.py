"""The log daemon: one writable streamlog.Log served over TCP to many clients.

Strategy: `LogServer` listens, accepts connections and hands each to a session
(session.py: one task per connection, the requests and reads on it); it owns what the
sessions share: the log, the thread pool anything that can block runs on (fsync'ing
stream creation, commits, truncation, index look-ups, segment reads for a replay), the
metrics, and the operation table (operations.py) whose rows say how each request is
answered. The log does the real work: one writer thread per partition, group commit,
the live-tail ring.

Bounds (TigerStyle "put a limit on everything"), all in `ServerConfig`:
  - connections_max connections; the next one gets ERROR TOO_MANY_CONNECTIONS.
  - a frame's length field above frame_bytes_max (64 KiB before the HELLO) ends the
    connection before its body is buffered.
  - a fast producer: while its appends in flight pass inflight_bytes_max (or it has
    requests_inflight_max requests open), the session stops reading its socket, so TCP
    slows the producer down; nothing is dropped. A connection holds at most that
    window, one frame being received and the bytes not yet parsed (the channel's
    scratch buffer, session.READ_CHUNK_BYTES).
  - a slow consumer: a READ sends only as many bytes as the client granted (credit) and
    waits for the transport to drain below send_buffer_bytes; the rest stays on disk.
    A follower that falls behind the tail ring reads segments, never daemon memory.
  - a silent peer: no HELLO within handshake_timeout_s, or nothing (not even a PING)
    for idle_timeout_s, and the connection is closed; its reads release their holds.

Shutdown (`drain`): stop listening, stop reading every socket, let appends already read
finish (their acknowledgements are written: each was durable under the fsync policy
before it was acknowledged), end reads with ERROR SHUTTING_DOWN, close the log (fsync,
writer lock released). Nothing is acknowledged that the log has not made durable.

Logs are JSON lines (`configure_json_logging`); /healthz and Prometheus /metrics
(metrics.py: prometheus_client, a registry per daemon) are served on a second,
plain-HTTP port, without a token, on the same host as the data port. `Listeners` binds
both ports before the log is opened, so that a port in use fails before the daemon
creates anything.

Memory after a flood: each connection, refused ones too, holds a receive buffer of
SCRATCH_BYTES (1 MiB, connection.py). An ended session is freed by its reference count
(session.py keeps no cycle: no bound methods of its own, no finished read task, no
wait_for around the last drain), so its buffer is freed at once; but a freed buffer may
still not go back to the system: glibc serves the first from mmap and gives it back,
but then raises its mmap threshold above that size, so the buffers of later
connections come from the heap, whose freed pages below its top it keeps. So once
RELEASE_AFTER_ENDED connections have ended and the open ones are down to half their
peak, the ticker runs `release_freed_memory` on the thread pool: a full collection (for
any cycle still left), then glibc's malloc_trim(0). A daemon whose connections come and
go at a steady count keeps its heap for the next ones.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import datetime
import functools
import gc
import json
import logging
import os
import ssl
import time

from ..errors import StreamLogError
from .codes import ErrorCode
from .connection import Connection
from .messages import FRAME_BYTES_MAX, HELLO_BYTES_MAX, Error, Role
from .metrics import Metrics
from .operations import OPERATIONS, OperationTable
from .session import Session, event
from .stream import Channel

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
RATE_WINDOW_S = 10
RELEASE_AFTER_ENDED = 32  # connections ended (about 32 MiB of buffers) before a release


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """Every option and bound of the daemon. `token` is required and never logged."""

    token: bytes
    host: str = "127.0.0.1"
    port: int = 7541
    metrics_port: int | None = 7542  # None: no HTTP port; 0: any free port
    tls_cert: str | None = None
    tls_key: str | None = None
    connections_max: int = 256
    frame_bytes_max: int = FRAME_BYTES_MAX
    inflight_bytes_max: int = 16 * 1024 * 1024  # per connection: appends not yet acked
    requests_inflight_max: int = 1024  # per connection
    subscriptions_max: int = 256  # per connection
    credit_bytes_max: int = 64 * 1024 * 1024  # most a client may have granted at once
    send_buffer_bytes: int = 1024 * 1024  # transport high-water mark
    handshake_timeout_s: float = 10.0
    idle_timeout_s: float = 120.0
    drain_timeout_s: float = 30.0
    threads_max: int = 8
    # A transaction left open this long is aborted (Kafka's transaction.timeout.ms): a
    # client that died between its data and its commit must not stall read_committed
    # readers of the partition until the daemon restarts. 0 disables.
    txn_timeout_s: float = 900.0

    def validate(self) -> "ServerConfig":
        if not self.token:
            raise StreamLogError("the daemon needs a token")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise StreamLogError("TLS needs both a certificate and a key")
        if self.frame_bytes_max < HELLO_BYTES_MAX:
            raise StreamLogError(f"frame_bytes_max must be at least {HELLO_BYTES_MAX}")
        for name in ("connections_max", "inflight_bytes_max", "requests_inflight_max",
                     "subscriptions_max", "credit_bytes_max", "send_buffer_bytes",
                     "threads_max"):
            if getattr(self, name) < 1:
                raise StreamLogError(f"{name} must be positive")
        return self


# -- structured logs -------------------------------------------------------------------

class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, event, then the event's fields."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
               .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
               "level": record.levelname.lower(), "logger": record.name,
               "event": record.getMessage()}
        out.update(getattr(record, "fields", {}))
        if record.exc_info:
            out["traceback"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_json_logging(stream, level: int = logging.INFO) -> logging.Handler:
    """Send the streamlog loggers' records to `stream` as JSON lines."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("streamlog")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    return handler


# -- listening -------------------------------------------------------------------------

class ListenError(OSError):
    """A port could not be bound or listened on; names the listener ("data" or
    "metrics") and the address. str(): one line for the operator."""

    def __init__(self, listener: str, host: str, port: int, error: OSError) -> None:
        # asyncio's own message repeats the address: the errno's words say enough
        super().__init__(error.errno, os.strerror(error.errno) if error.errno else str(error))
        self.listener, self.host, self.port = listener, host, port

    def __str__(self) -> str:
        where = f"[{self.host}]" if ":" in self.host else self.host
        return (f"cannot listen on {where}:{self.port} ({self.listener} port): "
                f"{self.strerror}")


def tls_context(config: ServerConfig) -> ssl.SSLContext | None:
    """The data port's TLS context, or None; raises ssl.SSLError or OSError for bad files."""
    if not config.tls_cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(config.tls_cert, config.tls_key)
    return context


class Listeners:
    """The daemon's ports, bound and listening before the log is opened (so that a port
    in use fails before anything is created), handed to a LogServer by `start`.

    `await Listeners.bind(config)` loads the TLS files (raising their ssl.SSLError or
    OSError), then binds the data port and the metrics port (ListenError). A client that
    connects before a server takes them waits (its data connection) or is told
    503 "starting" (HTTP); `close()` without a server ends them.
    """

    def __init__(self) -> None:
        self.server: LogServer | None = None
        self.data: asyncio.AbstractServer | None = None
        self.http: asyncio.AbstractServer | None = None
        self._attached = asyncio.Event()
        self._accepting: set[asyncio.Task] = set()  # sessions started on the data port

    @classmethod
    async def bind(cls, config: ServerConfig) -> "Listeners":
        tls = tls_context(config)
        listeners = cls()
        try:
            loop = asyncio.get_running_loop()
            listeners.data = await _listen(
                "data", loop.create_server, listeners._channel(config), config.host,
                config.port, ssl=tls,
                ssl_handshake_timeout=config.handshake_timeout_s if tls else None)
            if config.metrics_port is not None:
                listeners.http = await _listen("metrics", asyncio.start_server,
                                               listeners._http, config.host,
                                               config.metrics_port)
        except BaseException:
            listeners.close()
            raise
        return listeners

    @property
    def port(self) -> int:
        return self.data.sockets[0].getsockname()[1]

    @property
    def metrics_port(self) -> int | None:
        return None if self.http is None else self.http.sockets[0].getsockname()[1]

    def attach(self, server: "LogServer") -> None:
        self.server = server
        self._attached.set()

    def close(self) -> None:
        """Stop listening on both ports (a server's drain closes them itself)."""
        for server in (self.data, self.http):
            if server is not None:
                server.close()
        self._attached.set()

    def _channel(self, config: ServerConfig):
        """The data port's protocol factory: a Channel per connection (stream.py), its
        session started once the server is attached."""
        def made(channel: Channel) -> None:
            task = asyncio.get_running_loop().create_task(self._accept(channel))
            self._accepting.add(task)
            task.add_done_callback(self._accepting.discard)
        return lambda: Channel(Connection(Role.SERVER, config.frame_bytes_max), on_made=made)

    async def _accept(self, channel: Channel):
        await self._attached.wait()
        if self.server is None:
            channel.close()
        else:
            await self.server._accept(channel)

    async def _http(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        """One HTTP/1.1 request (GET or HEAD), answered by the server, then close."""
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            lines = request.decode("latin-1").split("\r\n")
            method, target, *_ = lines[0].split(" ")
            headers = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
            accept = next((v.strip() for k, v in headers.items() if k.lower() == "accept"), "")
            if self.server is None:
                status, kind, body = ("503 Service Unavailable", "application/json",
                                      b'{"status": "starting"}\n')
            else:
                status, kind, body = self.server._http_answer(
                    method, target.split("?", 1)[0], accept)
            head = (f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
            writer.write(head.encode() + (b"" if method == "HEAD" else body))
            await writer.drain()
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ConnectionError, ValueError):
            pass
        finally:
            writer.close()


async def _listen(listener: str, serve, handler, host: str, port: int, **options):
    try:
        return await serve(handler, host, port, **options)
    except OSError as error:
        raise ListenError(listener, host, port, error) from error


# -- the server ------------------------------------------------------------------------

class LogServer:
    """Serves `log` (a writable streamlog.Log) until drain(). Loop-thread only.

    Usage: `server = LogServer(log, config); await server.start(); ...;
    await server.drain()` (drain closes the log). `operations`: the table of the
    requests it answers (a larger one serves operations of one's own).
    """

    def __init__(self, log, config: ServerConfig, metrics: Metrics | None = None, *,
                 operations: OperationTable = OPERATIONS) -> None:
        self.log = log
        self.operations = operations
        self.config = config.validate()
        self.metrics = metrics or Metrics()
        self.metrics.watch(self)
        self.sessions: set[Session] = set()
        self.draining = False
        self.port: int | None = None
        self.metrics_port: int | None = None
        self._servers: list[asyncio.AbstractServer] = []
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=config.threads_max, thread_name_prefix="streamlog-serve")
        self._ticker: asyncio.Task | None = None
        self._next_id = 0
        self._txn_seen: dict[tuple[str, int, int], float] = {}  # first seen open, monotonic
        self._txn_checked = 0.0
        # Since the freed memory was last released: connections ended, most open at once.
        self._ended = 0
        self._peak = 0

    async def start(self, listeners: Listeners | None = None) -> None:
        """Serve on `listeners` (bound by `Listeners.bind` before the log was opened), or
        bind the data port and the metrics port now (ListenError, ssl.SSLError); log
        where."""
        config = self.config
        if listeners is None:
            listeners = await Listeners.bind(config)
        self._servers = [listeners.data] + ([listeners.http] if listeners.http else [])
        self.port, self.metrics_port = listeners.port, listeners.metrics_port
        listeners.attach(self)
        self._ticker = asyncio.create_task(self._tick())
        event(logging.INFO, "listening", host=config.host, port=self.port,
              metrics_port=self.metrics_port, tls=bool(config.tls_cert), log=self.log.path,
              fsync=self.log.config.fsync.value)

    async def _tick(self) -> None:
        while True:
            self.metrics.sample()
            timeout = self.config.txn_timeout_s
            now = time.monotonic()
            if timeout > 0 and now - self._txn_checked >= min(timeout / 4, 10.0):
                self._txn_checked = now
                try:
                    await self.blocking(self.abort_stale_txns, now)
                except Exception as error:  # noqa: BLE001 - logged; the daemon goes on
                    event(logging.WARNING, "txn_timeout_failed", reason=repr(error))
            await self._release_memory()
            await asyncio.sleep(1.0)

    async def _release_memory(self) -> None:
        """Once many connections have ended and the open ones are down to half their
        peak: give the freed memory back (the module docstring says why)."""
        open_now = len(self.sessions)
        if self._ended < RELEASE_AFTER_ENDED or open_now > self._peak // 2:
            return
        ended, self._ended, self._peak = self._ended, 0, open_now
        started = time.monotonic()
        released = await self.blocking(release_freed_memory)
        event(logging.INFO, "memory_released", connections_ended=ended,
              connections=open_now, released=released,
              seconds=round(time.monotonic() - started, 3))

    def abort_stale_txns(self, now: float) -> list[tuple[str, int, int]]:
        """Abort transactions seen open for longer than txn_timeout_s; returns them."""
        seen, aborted = {}, []
        for stream in self.log.streams():
            for number in range(self.log.partition_count(stream)):
                for txn_id in self.log.open_transactions(stream, number):
                    key = (stream, number, txn_id)
                    seen[key] = self._txn_seen.get(key, now)
                    if now - seen[key] < self.config.txn_timeout_s:
                        continue
                    try:
                        self.log.abort_txn(stream, number, txn_id)
                    except StreamLogError:
                        continue  # committed or aborted meanwhile
                    del seen[key]
                    aborted.append(key)
                    self.metrics.counters["txn_timeouts"] += 1
                    event(logging.WARNING, "txn_timeout", stream=stream, partition=number,
                          txn=f"{txn_id:#x}", seconds=self.config.txn_timeout_s)
        self._txn_seen = seen
        return aborted

    async def blocking(self, fn, *args, **kwargs):
        """Run fn on the daemon's thread pool; await its result."""
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, functools.partial(fn, *args, **kwargs))

    def submit_blocking(self, fn, *args) -> concurrent.futures.Future:
        return self._executor.submit(fn, *args)

    async def _accept(self, channel: Channel):
        self._next_id += 1
        peer = _peer(channel)
        if self.draining or len(self.sessions) >= self.config.connections_max:
            self.metrics.counters["refused"] += 1
            code = ErrorCode.SHUTTING_DOWN if self.draining else ErrorCode.TOO_MANY_CONNECTIONS
            event(logging.WARNING, "connection_refused", peer=peer, reason=code.name.lower(),
                  connections=len(self.sessions))
            try:
                await _refuse(channel, code,
                              f"daemon refused the connection: {code.name.lower()}")
            finally:
                self._ended += 1
            return
        session = Session(self, channel, self._next_id, peer)
        self.sessions.add(session)
        self._peak = max(self._peak, len(self.sessions))
        self.metrics.counters["connections"] += 1
        try:
            await session.run()
        finally:
            self.sessions.discard(session)
            self._ended += 1

    async def drain(self, *, beside=()) -> None:
        """Graceful shutdown; see the module docstring. Idempotent. `beside`:
        coroutines that drain other listeners of the same log (the Kafka port's), run
        at the same time as this port's drain and finished before the log is closed;
        each must bound its own time."""
        if self.draining:
            return
        self.draining = True
        started = time.monotonic()
        event(logging.INFO, "draining", connections=len(self.sessions))
        others = [asyncio.ensure_future(other) for other in beside]
        for server in self._servers[:1]:
            server.close()
        sessions = list(self.sessions)
        for session in sessions:
            session.stop_reading()
        waits = [asyncio.ensure_future(s.finished.wait()) for s in sessions]
        if waits:
            done, pending = await asyncio.wait(waits, timeout=self.config.drain_timeout_s)
            for session in self.sessions:
                session.abort("drain timed out")
            for future in pending:
                future.cancel()
        for outcome in await asyncio.gather(*others, return_exceptions=True):
            if isinstance(outcome, BaseException):
                event(logging.ERROR, "drain_failed", reason=repr(outcome))
        await self.blocking(self.log.close)
        for server in self._servers[1:]:
            server.close()
        if self._ticker is not None:
            self._ticker.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)
        event(logging.INFO, "stopped", seconds=round(time.monotonic() - started, 3),
              appended_records=self.metrics.counters["append_records"])

    # -- HTTP: /healthz and /metrics (served by Listeners._http) ------------------------

    def _http_answer(self, method: str, path: str, accept: str = "") -> tuple[str, str, bytes]:
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", "text/plain", b"GET only\n"
        if path == "/healthz":
            healthy = not self.draining and not self.log.closed
            body = json.dumps({"status": "ok" if healthy else "draining",
                               "connections": len(self.sessions)}).encode() + b"\n"
            return ("200 OK" if healthy else "503 Service Unavailable"), "application/json", body
        if path == "/metrics":
            body, kind = self.metrics.exposition(accept)
            return "200 OK", kind, body
        return "404 Not Found", "text/plain", b"try /healthz or /metrics\n"


async def _refuse(writer: Channel, code: ErrorCode, message: str) -> None:
    try:  # (the channel's own connection: a second one would be another receive buffer)
        writer.write(writer.conn.send(Error(0, int(code), message)))
        await asyncio.wait_for(writer.drain(), 1.0)
    except (ConnectionError, asyncio.TimeoutError):
        pass
    finally:
        writer.close()


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None (another C library has none)."""
    import ctypes
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_freed_memory() -> bool:
    """Free what ended connections left behind: collect the reference cycles that hold
    their buffers, then give the pages the C heap holds free back to the system
    (malloc_trim(0)). Returns whether malloc_trim released any; False where the C
    library has none (not glibc). Blocks the interpreter for the collection: tens of
    milliseconds."""
    gc.collect()
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False


def _peer(writer: Channel) -> str:
    peer = writer.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)

