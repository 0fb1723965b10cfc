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
import json
import logging
import ssl
import threading
import time

from ..errors import StreamLogError
from ..fileio import OsFileIO
from .codes import ErrorCode
from .connection import Connection
from .messages import FRAME_BYTES_MAX, HELLO_BYTES_MAX, Error, Role
from .operations import OPERATIONS, OperationTable
from .session import READ_CHUNK_BYTES, Session, event

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
    await server.drain()` (drain closes the log). `operations`: the table of the
    requests it answers (a larger one serves operations of one's own).
    """

    def __init__(self, log, config: ServerConfig, metrics: Metrics | None = None, *,
                 operations: OperationTable = OPERATIONS) -> None:
        self.log = log
        self.operations = operations
        self.config = config.validate()
        self.metrics = metrics or Metrics()
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
        event(logging.INFO, "listening", host=config.host, port=self.port,
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
                    event(logging.WARNING, "txn_timeout_failed", reason=repr(error))
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

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._next_id += 1
        peer = _peer(writer)
        if self.draining or len(self.sessions) >= self.config.connections_max:
            self.metrics.counters["refused"] += 1
            code = ErrorCode.SHUTTING_DOWN if self.draining else ErrorCode.TOO_MANY_CONNECTIONS
            event(logging.WARNING, "connection_refused", peer=peer, reason=code.name.lower(),
                  connections=len(self.sessions))
            await _refuse(writer, code, f"daemon refused the connection: {code.name.lower()}")
            return
        session = Session(self, reader, writer, self._next_id, peer)
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
        event(logging.INFO, "draining", connections=len(self.sessions))
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
        event(logging.INFO, "stopped", seconds=round(time.monotonic() - started, 3),
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


async def _refuse(writer: asyncio.StreamWriter, code: ErrorCode, message: str) -> None:
    connection = Connection(Role.SERVER)
    try:
        writer.write(connection.send(Error(0, int(code), message)))
        await asyncio.wait_for(writer.drain(), 1.0)
    except (ConnectionError, asyncio.TimeoutError):
        pass
    finally:
        writer.close()


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)

