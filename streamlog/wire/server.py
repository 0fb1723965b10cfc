"""The log daemon: one writable streamlog.Log served over TCP to many clients.

Strategy: a thin asyncio shell around `protocol.Connection`. Each connection is a
`_Session`: one task reads the socket and dispatches whole messages; each request runs
as its own task (requests are pipelined and answered in any order; appends from one
connection are submitted to the log in the order they arrived). Anything that can block
(fsync'ing stream creation, commits, truncation, index look-ups, segment reads for a
replay) runs on a small thread pool, never on the event loop. The log does the real
work: one writer thread per partition, group commit, the live-tail ring. An APPEND's
records arrive as columns, are checked as columns (NumPy), and go to the partition's
writer as one piece (`_append_records`); a READ's batches leave as the columns the
reader produced (`protocol.encode_slice`), one pull ahead of the socket.

Bounds (TigerStyle "put a limit on everything"), all in `ServerConfig`:
  - connections_max connections; the next one gets ERROR TOO_MANY_CONNECTIONS.
  - a frame's length field above frame_bytes_max (64 KiB before the HELLO) ends the
    connection before its body is buffered.
  - a fast producer: while its appends in flight pass inflight_bytes_max (or it has
    requests_inflight_max requests open), the session stops reading its socket, so TCP
    slows the producer down; nothing is dropped. A connection holds at most that
    window, one frame being received and one socket read (READ_CHUNK_BYTES).
  - a slow consumer: a READ sends only as many bytes as the client granted (credit) and
    waits for the transport to drain below send_buffer_bytes; the rest stays on disk.
    A follower that falls behind the tail ring reads segments, never daemon memory.
  - a silent peer: no HELLO within handshake_timeout_s, or nothing (not even a PING)
    for idle_timeout_s, and the connection is closed; its reads release their holds.

Shutdown (`drain`): stop listening, stop reading every socket, let appends already read
finish (their acknowledgements are written: each was durable under the fsync policy
before it was acknowledged), end reads with ERROR SHUTTING_DOWN, close the log (fsync,
writer lock released). Nothing is acknowledged that the log has not made durable.

Logs are JSON lines (`configure_json_logging`); /healthz and Prometheus /metrics are
served on a second, plain-HTTP port, without a token, on the same host as the data port.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import datetime
import functools
import hmac
import json
import logging
import ssl
import threading
import time

import numpy as np

from ..appender import Piece
from ..errors import LogClosed, StreamLogError
from ..fileio import OsFileIO
from ..records import AppendResult
from . import protocol as p

log = logging.getLogger("streamlog.wire.server")

READ_CHUNK_BYTES = 256 * 1024
PULL_BYTES_MAX = 1024 * 1024
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
RATE_WINDOW_S = 10


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
    frame_bytes_max: int = p.FRAME_BYTES_MAX
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
        if self.frame_bytes_max < p.HELLO_BYTES_MAX:
            raise StreamLogError(f"frame_bytes_max must be at least {p.HELLO_BYTES_MAX}")
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


def _event(level: int, event: str, **fields) -> None:
    log.log(level, event, extra={"fields": fields})


# -- metrics ---------------------------------------------------------------------------

class Histogram:
    """A Prometheus histogram; observe() may be called from any thread."""

    def __init__(self, buckets=LATENCY_BUCKETS_S) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        with self._lock:
            for i, bound in enumerate(self.buckets):
                if seconds <= bound:
                    self.counts[i] += 1
                    break
            else:
                self.counts[-1] += 1
            self.total += seconds

    def render(self, name: str, help_text: str) -> list[str]:
        with self._lock:
            counts, total = list(self.counts), self.total
        lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        running = 0
        for bound, count in zip(self.buckets, counts):
            running += count
            lines.append(f'{name}_bucket{{le="{bound}"}} {running}')
        running += counts[-1]
        lines += [f'{name}_bucket{{le="+Inf"}} {running}', f"{name}_sum {total:.6f}",
                  f"{name}_count {running}"]
        return lines


class TimedFileIO(OsFileIO):
    """OsFileIO that times every fsync of a segment (the latency an append waits for)."""

    def __init__(self, histogram: Histogram) -> None:
        super().__init__()
        self.histogram = histogram

    def fsync(self, handle: int) -> None:
        start = time.perf_counter()
        super().fsync(handle)
        self.histogram.observe(time.perf_counter() - start)


class Metrics:
    """Counters and gauges of one daemon; loop-thread only, except the histograms."""

    def __init__(self) -> None:
        self.counters = collections.Counter()
        self.fsync_seconds = Histogram()
        self.append_seconds = Histogram()
        self._samples: collections.deque[tuple[float, int]] = collections.deque(
            maxlen=RATE_WINDOW_S + 1)

    def sample(self) -> None:
        self._samples.append((time.monotonic(), self.counters["append_records"]))

    def appends_per_second(self) -> float:
        if len(self._samples) < 2:
            return 0.0
        (t0, n0), (t1, n1) = self._samples[0], self._samples[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0


_COUNTERS = (
    ("append_requests", "streamlog_append_requests_total", "APPEND requests acknowledged"),
    ("append_records", "streamlog_append_records_total", "records appended and acknowledged"),
    ("append_bytes", "streamlog_append_bytes_total", "payload bytes of acknowledged appends"),
    ("read_records", "streamlog_read_records_total", "records sent to readers and tailers"),
    ("read_bytes", "streamlog_read_bytes_total", "payload bytes sent to readers and tailers"),
    ("connections", "streamlog_connections_total", "connections accepted"),
    ("auth_failures", "streamlog_auth_failures_total", "HELLOs refused for a wrong token"),
    ("protocol_errors", "streamlog_protocol_errors_total", "connections ended for garbage"),
    ("refused", "streamlog_connections_refused_total", "connections over connections_max"),
    ("request_errors", "streamlog_request_errors_total", "requests answered with ERROR"),
    ("scrub_segments", "streamlog_scrub_segments_total",
     "sealed segments re-verified by the background scrubber"),
    ("scrub_bytes", "streamlog_scrub_bytes_total", "bytes re-verified by the scrubber"),
    ("scrub_problems", "streamlog_scrub_problems_total",
     "scrubbed segments that failed their whole-file checksum (or could not be read)"),
)


# -- the server ------------------------------------------------------------------------

def count_scrub_result(metrics, result) -> None:
    """The scrubber's on_result callback (its thread): feed the counters above."""
    metrics.counters["scrub_segments"] += 1
    metrics.counters["scrub_bytes"] += result.check.bytes_hashed
    metrics.counters["scrub_problems"] += int(result.check.is_problem)


class LogServer:
    """Serves `log` (a writable streamlog.Log) until drain(). Loop-thread only.

    Usage: `server = LogServer(log, config); await server.start(); ...;
    await server.drain()` (drain closes the log).
    """

    def __init__(self, log, config: ServerConfig, metrics: Metrics | None = None) -> None:
        self.log = log
        self.config = config.validate()
        self.metrics = metrics or Metrics()
        self.sessions: set[_Session] = set()
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

    async def start(self) -> None:
        """Listen on the data port (and the metrics port); log where."""
        config = self.config
        tls = self._tls_context()
        server = await asyncio.start_server(
            self._accept, config.host, config.port, ssl=tls, limit=READ_CHUNK_BYTES,
            ssl_handshake_timeout=config.handshake_timeout_s if tls else None)
        self._servers.append(server)
        self.port = server.sockets[0].getsockname()[1]
        if config.metrics_port is not None:
            http = await asyncio.start_server(self._http, config.host, config.metrics_port)
            self._servers.append(http)
            self.metrics_port = http.sockets[0].getsockname()[1]
        self._ticker = asyncio.create_task(self._tick())
        _event(logging.INFO, "listening", host=config.host, port=self.port,
               metrics_port=self.metrics_port, tls=tls is not None, log=self.log.path,
               fsync=self.log.config.fsync.value)

    def _tls_context(self) -> ssl.SSLContext | None:
        if not self.config.tls_cert:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.config.tls_cert, self.config.tls_key)
        return context

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
                    _event(logging.WARNING, "txn_timeout_failed", reason=repr(error))
            await asyncio.sleep(1.0)

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
                    _event(logging.WARNING, "txn_timeout", stream=stream, partition=number,
                           txn=f"{txn_id:#x}", seconds=self.config.txn_timeout_s)
        self._txn_seen = seen
        return aborted

    async def blocking(self, fn, *args, **kwargs):
        """Run fn on the daemon's thread pool; await its result."""
        return await asyncio.get_running_loop().run_in_executor(
            self._executor, functools.partial(fn, *args, **kwargs))

    def submit_blocking(self, fn, *args) -> concurrent.futures.Future:
        return self._executor.submit(fn, *args)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._next_id += 1
        peer = _peer(writer)
        if self.draining or len(self.sessions) >= self.config.connections_max:
            self.metrics.counters["refused"] += 1
            code = p.ErrorCode.SHUTTING_DOWN if self.draining else p.ErrorCode.TOO_MANY_CONNECTIONS
            _event(logging.WARNING, "connection_refused", peer=peer, reason=code.name.lower(),
                   connections=len(self.sessions))
            await _refuse(writer, code, f"daemon refused the connection: {code.name.lower()}")
            return
        session = _Session(self, reader, writer, self._next_id, peer)
        self.sessions.add(session)
        self.metrics.counters["connections"] += 1
        try:
            await session.run()
        finally:
            self.sessions.discard(session)

    async def drain(self) -> None:
        """Graceful shutdown; see the module docstring. Idempotent."""
        if self.draining:
            return
        self.draining = True
        started = time.monotonic()
        _event(logging.INFO, "draining", connections=len(self.sessions))
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
        await self.blocking(self.log.close)
        for server in self._servers[1:]:
            server.close()
        if self._ticker is not None:
            self._ticker.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)
        _event(logging.INFO, "stopped", seconds=round(time.monotonic() - started, 3),
               appended_records=self.metrics.counters["append_records"])

    # -- HTTP: /healthz and /metrics ----------------------------------------------------

    async def _http(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            method, path, *_ = request.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            status, kind, body = self._http_answer(method, path.split("?", 1)[0])
            head = (f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
            writer.write(head.encode() + body)
            await writer.drain()
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ConnectionError, ValueError):
            pass
        finally:
            writer.close()

    def _http_answer(self, method: str, path: str) -> tuple[str, str, bytes]:
        if method != "GET":
            return "405 Method Not Allowed", "text/plain", b"GET only\n"
        if path == "/healthz":
            healthy = not self.draining and not self.log.closed
            body = json.dumps({"status": "ok" if healthy else "draining",
                               "connections": len(self.sessions)}).encode() + b"\n"
            return ("200 OK" if healthy else "503 Service Unavailable"), "application/json", body
        if path == "/metrics":
            return "200 OK", "text/plain; version=0.0.4", self.render_metrics().encode()
        return "404 Not Found", "text/plain", b"try /healthz or /metrics\n"

    def render_metrics(self) -> str:
        counters, lines = self.metrics.counters, []
        for key, name, help_text in _COUNTERS:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter",
                      f"{name} {counters[key]}"]
        tailers = [s for session in self.sessions for s in session.subscriptions.values()
                   if s.follow]
        lags = [s.lag() for s in tailers]
        gauges = (
            ("streamlog_appends_per_second", "records appended per second, last 10 s",
             round(self.metrics.appends_per_second(), 3)),
            ("streamlog_connections", "open connections", len(self.sessions)),
            ("streamlog_tailers", "follow reads open", len(tailers)),
            ("streamlog_tail_lag_records", "records acknowledged but not yet sent, summed"
             " over tailers", sum(lags)),
            ("streamlog_tail_lag_records_max", "largest lag of one tailer", max(lags, default=0)),
            ("streamlog_draining", "1 while shutting down", int(self.draining)),
        )
        for name, help_text, value in gauges:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {value}"]
        lines += self.metrics.fsync_seconds.render(
            "streamlog_fsync_seconds", "duration of each segment fsync")
        lines += self.metrics.append_seconds.render(
            "streamlog_append_ack_seconds", "APPEND received to acknowledged (write + fsync)")
        return "\n".join(lines) + "\n"


async def _refuse(writer: asyncio.StreamWriter, code: p.ErrorCode, message: str) -> None:
    connection = p.Connection(p.Role.SERVER)
    try:
        writer.write(connection.send(p.Error(0, int(code), message)))
        await asyncio.wait_for(writer.drain(), 1.0)
    except (ConnectionError, asyncio.TimeoutError):
        pass
    finally:
        writer.close()


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)


# -- one connection --------------------------------------------------------------------

class _Stop(Exception):
    """Ends a session's read loop with a reason for the log."""


class _Session:
    def __init__(self, server: LogServer, reader, writer, number: int, peer: str) -> None:
        self.server = server
        self.config = server.config
        self.reader = reader
        self.writer = writer
        self.number = number
        self.peer = peer
        self.conn = p.Connection(p.Role.SERVER, server.config.frame_bytes_max)
        self.tasks: set[asyncio.Task] = set()
        self.subscriptions: dict[int, _Subscription] = {}
        self.inflight_bytes = 0
        self.room = asyncio.Event()
        self.finished = asyncio.Event()
        self.closed = False
        self.requests = 0
        self._hello_id = 0
        self._stopping = False
        self._read_task: asyncio.Task | None = None
        transport = writer.transport
        transport.set_write_buffer_limits(high=server.config.send_buffer_bytes)

    async def run(self) -> None:
        reason = "closed by peer"
        self._read_task = asyncio.create_task(self._read_loop())
        try:
            reason = await self._read_task or reason
        except asyncio.CancelledError:
            reason = "daemon draining" if self.server.draining else "cancelled"
        except p.RemoteProtocolError as error:
            reason = f"protocol error: {error}"
            self._protocol_error(error)
        except (ConnectionError, OSError) as error:
            reason = f"connection error: {error}"
        except _Stop as stop:
            reason = str(stop)
        except Exception as error:  # noqa: BLE001 - logged; one client never stops the daemon
            reason = f"internal error: {error!r}"
            log.exception("session_failed", extra={"fields": {"peer": self.peer}})
        try:
            await self._finish()
        finally:
            _event(logging.INFO, "connection_closed", peer=self.peer, connection=self.number,
                   reason=reason, requests=self.requests)
            self.finished.set()

    def _protocol_error(self, error: p.RemoteProtocolError) -> None:
        counter = ("auth_failures" if error.error_code is p.ErrorCode.UNAUTHENTICATED
                   else "protocol_errors")
        self.server.metrics.counters[counter] += 1
        _event(logging.WARNING, "protocol_error", peer=self.peer, connection=self.number,
               reason=str(error), code=error.error_code.name)
        self.send(p.Error(self._hello_id, int(error.error_code), str(error)))

    def stop_reading(self) -> None:
        self._stopping = True
        if self._read_task is not None and not self._read_task.done():
            self._read_task.cancel()

    def abort(self, why: str) -> None:
        _event(logging.WARNING, "connection_aborted", peer=self.peer, reason=why)
        self.closed = True
        self.writer.transport.abort()

    async def _finish(self) -> None:
        """Let requests already read finish and be answered; end reads; close."""
        if self.tasks:
            await asyncio.wait(list(self.tasks))
        for subscription in list(self.subscriptions.values()):
            subscription.end(p.ErrorCode.SHUTTING_DOWN if self.server.draining else None)
        if self.subscriptions:
            await asyncio.wait([s.task for s in self.subscriptions.values()])
        self.closed = True
        try:
            await asyncio.wait_for(self.writer.drain(), 5.0)
        except (ConnectionError, asyncio.TimeoutError, OSError):
            pass
        self.writer.close()

    # -- reading ---------------------------------------------------------------------

    async def _read_loop(self) -> str | None:
        await self._handshake()
        while True:
            await self._wait_for_room()
            data = await self._read(self.config.idle_timeout_s, "idle timeout")
            self.conn.receive_data(data)
            while True:
                message = self.conn.next_event()
                if message is p.NEED_DATA:
                    break
                if message is p.CLOSED:
                    return "closed by peer"
                self.requests += 1
                self._dispatch(message)

    async def _read(self, timeout: float, why: str) -> bytes:
        # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that
        # arrives as the read completes, and a drain must stop every read loop.
        try:
            async with asyncio.timeout(timeout):
                data = await self.reader.read(READ_CHUNK_BYTES)
        except TimeoutError:
            raise _Stop(f"{why} ({timeout:g} s without data)") from None
        if self._stopping:
            raise asyncio.CancelledError
        return data

    async def _handshake(self) -> None:
        deadline = time.monotonic() + self.config.handshake_timeout_s
        while True:
            message = self.conn.next_event()
            if message is p.CLOSED:
                raise _Stop("closed before HELLO")
            if message is not p.NEED_DATA:
                break
            data = await self._read(max(deadline - time.monotonic(), 0.0), "no HELLO")
            self.conn.receive_data(data)
        assert isinstance(message, p.Hello)
        if message.version != p.WIRE_VERSION:
            self._hello_id = message.request_id
            raise p.RemoteProtocolError(f"wire version {message.version} is not supported "
                                        f"(this daemon speaks {p.WIRE_VERSION})",
                                        p.ErrorCode.UNSUPPORTED_VERSION)
        if not hmac.compare_digest(message.token, self.config.token):
            self._hello_id = message.request_id
            raise p.RemoteProtocolError("wrong token", p.ErrorCode.UNAUTHENTICATED)
        self.send(p.HelloOk(message.request_id, p.WIRE_VERSION, self.config.frame_bytes_max,
                            int(self.config.idle_timeout_s * 1000), "streamlog"))
        _event(logging.INFO, "connection_open", peer=self.peer, connection=self.number,
               client=message.client[:100])

    async def _wait_for_room(self) -> None:
        """Back-pressure on a producer: stop reading while too much is in flight, or
        while what we owe it has not drained into the socket."""
        while (self.inflight_bytes > self.config.inflight_bytes_max
               or len(self.tasks) >= self.config.requests_inflight_max):
            self.room.clear()
            await self.room.wait()
        await self.writer.drain()

    # -- requests --------------------------------------------------------------------

    def _dispatch(self, message: p.Message) -> None:
        kind = type(message)
        if kind is p.Append:
            self._spawn(self._append(message), len(message.payload))
        elif kind is p.Read:
            self._open_read(message)
        elif kind is p.Credit:
            subscription = self.subscriptions.get(message.request_id)
            if subscription is not None:  # it may have ended already: not an error
                subscription.add_credit(message.credit_bytes)
        elif kind is p.Cancel:
            subscription = self.subscriptions.get(message.request_id)
            if subscription is not None:
                subscription.end(None)
        elif kind is p.Ping:
            self.send(p.Pong(message.request_id))
        else:
            handler = _HANDLERS[kind]
            self._spawn(self._answer(message, handler), 0)

    def _spawn(self, coroutine, nbytes: int) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self.tasks.add(task)
        self.inflight_bytes += nbytes
        task.add_done_callback(functools.partial(self._done, nbytes=nbytes))

    def _done(self, task: asyncio.Task, nbytes: int) -> None:
        self.tasks.discard(task)
        self.inflight_bytes -= nbytes
        self.room.set()

    async def _append(self, message: p.Append) -> None:
        started = time.perf_counter()
        try:
            result = await _append_records(self.server.log, message)
        except Exception as error:  # noqa: BLE001 - answered with ERROR
            self._fail(message, error)
            return
        metrics = self.server.metrics
        metrics.append_seconds.observe(time.perf_counter() - started)
        metrics.counters["append_requests"] += 1
        metrics.counters["append_records"] += result.records
        metrics.counters["append_bytes"] += len(message.payload)
        self.send(p.Appended(message.request_id, result.records, p.pack_ranges(result.ranges)))

    async def _answer(self, message: p.Message, handler) -> None:
        try:
            reply = await handler(self.server, message)
        except Exception as error:  # noqa: BLE001 - answered with ERROR
            self._fail(message, error)
            return
        self.send(reply)

    def _fail(self, message: p.Message, error: BaseException) -> None:
        self.server.metrics.counters["request_errors"] += 1
        if p.error_code_for(error) is p.ErrorCode.INTERNAL:
            log.error("request_failed", exc_info=error,
                      extra={"fields": {"peer": self.peer, "request": message.TYPE.name}})
        self.send(p.error_message(message.request_id, error))

    def _open_read(self, message: p.Read) -> None:
        if message.request_id in self.subscriptions:
            self._fail(message, p.LocalProtocolError(
                f"request id {message.request_id} already has a read open",
                p.ErrorCode.LIMIT_EXCEEDED))
        elif len(self.subscriptions) >= self.config.subscriptions_max:
            self._fail(message, p.LocalProtocolError(
                f"at most {self.config.subscriptions_max} reads per connection",
                p.ErrorCode.LIMIT_EXCEEDED))
        else:
            self.subscriptions[message.request_id] = _Subscription(self, message)

    def send(self, message: p.Message) -> None:
        if self.closed or self.writer.transport.is_closing():
            return
        if self.conn.state in (p.ERROR, p.DONE) and not isinstance(message, p.Error):
            return  # the connection failed: replies to requests still running are moot
        try:
            parts = self.conn.send_parts(message)
        except p.LocalProtocolError as error:
            log.error("send_refused", extra={"fields": {"peer": self.peer,
                                                        "reason": str(error)}})
            return
        for part in parts:
            self.writer.write(part)


# -- request handlers (blocking work goes to the thread pool) --------------------------

async def _append_records(log, message: p.Append) -> AppendResult:
    """Append an APPEND's records. The common case (one partition named or implied, no
    headers, records that fit one frame) is checked with NumPy on the received columns
    and handed to the partition's writer as one piece: Log.append_batch would check
    again, record by record, what the columns already prove (half the log's CPU per
    record). Anything else goes through Log.append_batch, its checks and its errors."""
    direct = _direct_piece(log, message)
    if direct is not None:
        partition, piece = direct
        first = await partition.submit_async([piece])
        count = len(piece.values)
        return AppendResult({partition.number: (first, first + count - 1)}, count)
    timestamps, keys, values, kinds, headers = p.columns_to_lists(message.columns)
    return await log.append_batch(
        message.stream, values, keys=keys,
        timestamps_us=timestamps if message.timestamps_given else None,
        partition=None if message.partition < 0 else message.partition,
        headers=headers, kinds=kinds, txn_id=message.txn_id)


def _direct_piece(log, message: p.Append):
    """(partition, Piece) when the records pass the log's checks as columns, else None.
    The same bounds as Log.append_batch: record_bytes_max per record, a frame's share
    (frame_bytes_max / 2, batch_records_max) per piece, int64 timestamps above the
    minimum; kinds were checked when the payload was decoded."""
    columns, config = message.columns, log.config
    count = len(columns)
    if columns.header_lengths is not None or count > config.batch_records_max:
        return None
    if message.partition >= 0:
        number = message.partition
    elif log.partition_count(message.stream) == 1:
        number = 0
    else:
        return None  # key hash or round robin: the log's choice
    partition = log.partition(message.stream, number)  # raises as the log would
    sizes = columns.value_lengths + np.maximum(columns.key_lengths, 0)
    nbytes = int(sizes.sum()) + _PIECE_RECORD_BYTES * count
    if int(sizes.max()) > config.record_bytes_max or nbytes > config.frame_bytes_max // 2:
        return None
    if message.timestamps_given:
        if int(columns.timestamps_us.min()) <= _INT64_MIN:
            return None
        timestamps = columns.timestamps_us.tolist()
    else:
        timestamps = [time.time_ns() // 1000] * count
    _, keys, values, kinds, _ = p.columns_to_lists(columns, timestamps=False)
    if message.txn_id:
        partition.txns_written_here.add(message.txn_id)
    return partition, Piece(timestamps, keys, values, kinds, None, nbytes, message.txn_id)


_INT64_MIN = -(1 << 63)
_PIECE_RECORD_BYTES = 24  # what Log._cut counts per record beyond key and value

async def _create_stream(server: LogServer, m: p.CreateStream):
    count = await server.blocking(server.log.create_stream, m.stream, m.partitions)
    return p.ResultInt(m.request_id, count)


async def _offsets(server: LogServer, m: p.Offsets):
    log_ = server.log
    return p.ResultOffsets(m.request_id, log_.start_offset(m.stream, m.partition),
                           log_.end_offset(m.stream, m.partition),
                           log_.last_stable_offset(m.stream, m.partition))


async def _offset_for_timestamp(server: LogServer, m: p.OffsetForTimestamp):
    offset = await server.blocking(server.log.offset_for_timestamp, m.stream, m.partition,
                                   m.timestamp_us)
    return p.ResultInt(m.request_id, offset)


async def _info(server: LogServer, m: p.Info):
    info = await server.blocking(server.log.info)
    return p.ResultJson(m.request_id, json.dumps(info, default=str).encode())


async def _streams(server: LogServer, m: p.Streams):
    log_ = server.log
    body = {name: log_.partition_count(name) for name in log_.streams()}
    return p.ResultJson(m.request_id, json.dumps(body).encode())


async def _commit_txn(server: LogServer, m: p.CommitTxn):
    offset = await server.blocking(server.log.commit_txn, m.stream, m.partition, m.txn_id,
                                   tag=m.tag, marker=m.marker)
    return p.ResultInt(m.request_id, offset)


async def _abort_txn(server: LogServer, m: p.AbortTxn):
    offset = await server.blocking(server.log.abort_txn, m.stream, m.partition, m.txn_id)
    return p.ResultInt(m.request_id, offset)


async def _last_commit(server: LogServer, m: p.LastCommit):
    marker = await server.blocking(server.log.last_commit, m.stream, m.partition, m.tag)
    return p.ResultBytes(m.request_id, int(marker is not None), marker or b"")


async def _truncate_after(server: LogServer, m: p.TruncateAfter):
    end = await server.blocking(server.log.truncate_after, m.stream, m.partition, m.offset)
    return p.ResultInt(m.request_id, end)


async def _txn_state(server: LogServer, m: p.TxnStateRequest):
    state = await server.blocking(server.log.txn_state, m.stream, m.partition, m.txn_id)
    return p.ResultInt(m.request_id, 0 if state is None else int(state))


_HANDLERS = {
    p.CreateStream: _create_stream, p.Offsets: _offsets,
    p.OffsetForTimestamp: _offset_for_timestamp, p.Info: _info, p.Streams: _streams,
    p.CommitTxn: _commit_txn, p.AbortTxn: _abort_txn, p.LastCommit: _last_commit,
    p.TruncateAfter: _truncate_after, p.TxnStateRequest: _txn_state,
}


# -- reads and tails -------------------------------------------------------------------

_MORE, _WAIT, _END = "more", "wait", "end"


def _pull(slices, bytes_budget: int) -> tuple[list[tuple], str]:
    """Thread pool: advance a reader's slice generator until `bytes_budget` payload bytes
    are encoded, the reader must wait for appends, or it is done. Consecutive slices of
    one transaction (0 for most) go out as one BATCH."""
    out, group, size, status = [], [], 0, _END
    for item in slices:
        if not isinstance(item, tuple):  # the reader's wait sentinel: at the live end
            status = _WAIT
            break
        columns, lo, hi = item
        if group and not _continues(group[-1], columns, lo):
            out.append(_batch(group))
            group = []
        group.append(item)
        size += int(columns.value_lengths[lo:hi].sum()) + 16 * (hi - lo)
        if size >= bytes_budget:
            status = _MORE
            break
    if group:
        out.append(_batch(group))
    return out, status


def _continues(previous, columns, lo: int) -> bool:
    last, _, hi = previous
    return (columns.txn_id == last.txn_id
            and columns.base_offset + lo == last.base_offset + hi)


def _batch(group) -> tuple:
    first, lo, _ = group[0]
    count = sum(hi - lo for _, lo, hi in group)
    payload, flags = p.encode_slices(group)
    return first.base_offset + lo, count, first.txn_id, flags, payload


class _Subscription:
    """One READ: pushes BATCH messages while the client's credit lasts."""

    def __init__(self, session: _Session, request: p.Read) -> None:
        self.session = session
        self.request = request
        self.follow = bool(request.flags & p.READ_FOLLOW)
        self.credit = min(request.credit_bytes, session.config.credit_bytes_max)
        self.credit_event = asyncio.Event()
        self.reader = None
        self._pulling: concurrent.futures.Future | None = None
        self._ended = False
        self._end_code: p.ErrorCode | None = None
        self.task = asyncio.get_running_loop().create_task(self._run())

    def add_credit(self, nbytes: int) -> None:
        self.credit = min(self.credit + nbytes, self.session.config.credit_bytes_max)
        self.credit_event.set()

    def end(self, code: p.ErrorCode | None) -> None:
        """Stop: READ_END (cancel) or ERROR `code` (shutdown)."""
        if not self._ended:
            self._ended, self._end_code = True, code
            self.task.cancel()

    def lag(self) -> int:
        reader = self.reader
        return 0 if reader is None else max(reader.partition.next_offset - reader.next_offset, 0)

    def _open(self):
        r = self.request
        start = {p.Start.OFFSET: "from_offset", p.Start.TIMESTAMP: "from_timestamp_us"}
        stop = {p.Stop.OFFSET: "to_offset", p.Stop.TIMESTAMP: "to_timestamp_us"}
        options = {}
        if r.start in start:
            options[start[r.start]] = r.start_value
        if r.stop in stop:
            options[stop[r.stop]] = r.stop_value
        return self.session.server.log.reader(
            r.stream, r.partition, follow=self.follow,
            data_only=bool(r.flags & p.READ_DATA_ONLY),
            read_committed=bool(r.flags & p.READ_COMMITTED), **options)

    async def _run(self) -> None:
        session, rid = self.session, self.request.request_id
        try:
            self.reader = await session.server.blocking(self._open)
            session.send(p.ReadOpened(rid, self.reader.next_offset))
            await self._stream(self.reader)
            session.send(p.ReadEnd(rid, self.reader.next_offset))
        except asyncio.CancelledError:
            if self._end_code is not None:
                session.send(p.Error(rid, int(self._end_code), "the daemon is shutting down"))
            elif self._ended:
                session.send(p.ReadEnd(rid, self.reader.next_offset if self.reader else 0))
        except Exception as error:  # noqa: BLE001 - answered with ERROR
            session._fail(self.request, error)
        finally:
            self._release()
            session.subscriptions.pop(rid, None)

    async def _stream(self, reader) -> None:
        """Pull batches on the thread pool and send them, one pull ahead: while the loop
        writes one pull's batches, a pool thread reads and encodes the next (if the
        credit left after those batches allows it)."""
        slices = reader.slices()  # (columns, lo, hi) or the WAIT sentinel; see reader.py
        server = self.session.server
        while True:
            while self.credit <= 0:
                self.credit_event.clear()
                await self.credit_event.wait()
            if self._pulling is None:
                self._pulling = server.submit_blocking(_pull, slices,
                                                       min(self.credit, PULL_BYTES_MAX))
            batches, status = await asyncio.wrap_future(self._pulling)
            self._pulling = None
            left = self.credit - sum(len(batch[4]) for batch in batches)
            if status is _MORE and left > 0:
                self._pulling = server.submit_blocking(_pull, slices,
                                                       min(left, PULL_BYTES_MAX))
            await self._send(reader, batches)
            if status is _END:
                return
            if status is _WAIT:
                await reader.partition.ring.wait_async(reader.wait_offset())
                if reader.partition.closed:
                    raise LogClosed("the log was closed while following it")

    async def _send(self, reader, batches) -> None:
        session, counters = self.session, self.session.server.metrics.counters
        rid, number = self.request.request_id, reader.partition.number
        for base, count, txn_id, flags, payload in batches:
            session.send(p.Batch(rid, number, base, txn_id, count, flags, payload))
            self.credit -= len(payload)
            counters["read_records"] += count
            counters["read_bytes"] += len(payload)
        await session.writer.drain()

    def _release(self) -> None:
        """Close the reader (releasing its hold against retention) once no pool thread
        is still advancing it."""
        reader, pulling = self.reader, self._pulling
        if reader is None:
            return
        if pulling is not None and not pulling.done():
            pulling.add_done_callback(lambda _: reader.close())
        else:
            reader.close()
