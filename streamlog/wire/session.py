"""The daemon's side of one connection: a session, its requests and its reads.

Strategy: a thin asyncio shell around `connection.Connection`. Each connection is a
`Session`: one task reads the socket and dispatches whole messages; each request runs
as its own task (requests are pipelined and answered in any order; appends from one
connection are submitted to the log in the order they arrived). Every request/reply
operation is answered by one handler, `_answer`, from its row of the operation table
(operations.py): the row's methods run on the server's thread pool (or on the event
loop, for in-memory reads) and the row encodes the result. APPEND and READ have code
of their own: an APPEND's records arrive as columns, are checked as columns (NumPy),
and go to the partition's writer as one piece (`_append_records`,
Log.append_prepared); a READ
(`_Subscription`) sends the columns the reader produced (`columns.pull_batches`), one
pull ahead of the socket, as far as the client's credit goes. The bounds it keeps are
ServerConfig's (server.py says why each exists). Event-loop thread only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import hmac
import logging
import time
from typing import TYPE_CHECKING

import numpy as np

from ..encoder import Piece
from ..errors import StreamLogError
from ..payload import EncodedRows
from ..records import RECORD_OVERHEAD_BYTES, AppendResult, RecordKind
from .codes import ErrorCode, LocalProtocolError, MessageType, RemoteProtocolError, error_code_for
from .columns import END, FAILED, MORE, WAIT, columns_to_lists, pull_batches
from .connection import CLOSED, DONE, ERROR, NEED_DATA, SCRATCH_BYTES, BufferPool
from .messages import (READ_COMMITTED, READ_DATA_ONLY, READ_FOLLOW, WIRE_VERSION, Append,
                       Appended, Batch, Cancel, Credit, Error, Hello, HelloOk, Message, Ping,
                       Pong, Read, ReadEnd, ReadOpened, Start, Stop, error_message,
                       pack_ranges)
from .operations import Operation
from .stream import Channel

if TYPE_CHECKING:
    from .server import LogServer

log = logging.getLogger("streamlog.wire.server")

# What one connection may hold beyond its window of appends: the bytes received but not
# yet parsed (the channel's scratch buffer).
READ_CHUNK_BYTES = SCRATCH_BYTES
PULL_BYTES_MAX = 4 * 1024 * 1024
# A read's BATCHes of small stored batches joined are copied into buffers it uses again
# once sent (connection.BufferPool): two pulls' worth of them.
JOINED_BYTES_MAX = 2 * PULL_BYTES_MAX


def event(level: int, name: str, **fields) -> None:
    """Log one event as a JSON line's `event` and fields (server.configure_json_logging)."""
    log.log(level, name, extra={"fields": fields})


# -- one connection --------------------------------------------------------------------

class _Stop(Exception):
    """Ends a session's read loop with a reason for the log."""


class Session:
    """One connection of `server`; see the module docstring."""

    # Messages with code of their own (handler method names): the streamed operations,
    # the two messages that steer a READ, the heartbeat. Every other request is a row
    # of the server's operation table, answered by _answer.
    HANDLERS = {MessageType.APPEND: "_on_append", MessageType.READ: "_on_read",
                MessageType.CREDIT: "_on_credit", MessageType.CANCEL: "_on_cancel",
                MessageType.PING: "_on_ping"}

    def __init__(self, server: LogServer, channel: Channel, number: int, peer: str) -> None:
        self.server = server
        self.config = server.config
        self.channel = self.writer = channel
        self.number = number
        self.peer = peer
        # The channel buffered (nothing is parsed before this): this server's messages.
        self.conn = channel.conn
        self.conn.frame_bytes_max = server.config.frame_bytes_max
        self.conn.messages = server.operations.messages
        self._operations = server.operations.by_type
        # (the class's functions, not bound methods: those would hold this session)
        self._handlers = {type_: getattr(Session, name) for type_, name in self.HANDLERS.items()}
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
        transport = channel.transport
        transport.set_write_buffer_limits(high=server.config.send_buffer_bytes)

    async def run(self) -> None:
        reason = "closed by peer"
        self._read_task = asyncio.create_task(self._read_loop())
        try:
            reason = await self._read_task or reason
        except asyncio.CancelledError:
            reason = "daemon draining" if self.server.draining else "cancelled"
        except RemoteProtocolError as error:
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
            # The read task keeps the exception that ended it, whose traceback holds this
            # session: a cycle that kept the session's buffers until a full collection.
            self._read_task = None
            event(logging.INFO, "connection_closed", peer=self.peer, connection=self.number,
                  reason=reason, requests=self.requests)
            self.finished.set()

    def _protocol_error(self, error: RemoteProtocolError) -> None:
        counter = ("auth_failures" if error.error_code is ErrorCode.UNAUTHENTICATED
                   else "protocol_errors")
        self.server.metrics.counters[counter] += 1
        event(logging.WARNING, "protocol_error", peer=self.peer, connection=self.number,
              reason=str(error), code=error.error_code.name)
        self.send(Error(self._hello_id, int(error.error_code), str(error)))

    def stop_reading(self) -> None:
        self._stopping = True
        if self._read_task is not None and not self._read_task.done():
            self._read_task.cancel()

    def abort(self, why: str) -> None:
        event(logging.WARNING, "connection_aborted", peer=self.peer, reason=why)
        self.closed = True
        self.writer.transport.abort()

    async def _finish(self) -> None:
        """Let requests already read finish and be answered; end reads; close."""
        if self.tasks:
            await asyncio.wait(list(self.tasks))
        for subscription in list(self.subscriptions.values()):
            subscription.end(ErrorCode.SHUTTING_DOWN if self.server.draining else None)
        if self.subscriptions:
            await asyncio.wait([s.task for s in self.subscriptions.values()])
        self.closed = True
        try:  # (not wait_for: its task, kept by the error's traceback, keeps the error)
            async with asyncio.timeout(5.0):
                await self.writer.drain()
        except (ConnectionError, TimeoutError, OSError):
            pass
        self.writer.close()

    # -- reading ---------------------------------------------------------------------

    async def _read_loop(self) -> str | None:
        await self._handshake()
        while True:
            while (message := self.conn.next_event()) is not NEED_DATA:
                if message is CLOSED:
                    return "closed by peer"
                self.requests += 1
                self._dispatch(message)
                if self._room_short():
                    await self._wait_for_room()
            await self._wait_for_room()
            await self._read(self.config.idle_timeout_s, "idle timeout")

    async def _read(self, timeout: float, why: str, *, deadline: bool = False) -> None:
        """Wait for the peer's next whole message (the channel puts bytes in
        self.conn). Silence for `timeout` ends the session; bytes of a frame still
        arriving are not silence, unless the timeout is a `deadline`."""
        # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that
        # arrives as the read completes, and a drain must stop every read loop.
        while True:
            seen = self.channel.received
            try:
                async with asyncio.timeout(timeout):
                    await self.channel.readable()
                break
            except TimeoutError:
                if deadline or self.channel.received == seen:
                    raise _Stop(f"{why} ({timeout:g} s without data)") from None
        if self._stopping:
            raise asyncio.CancelledError

    async def _handshake(self) -> None:
        deadline = time.monotonic() + self.config.handshake_timeout_s
        while True:
            message = self.conn.next_event()
            if message is CLOSED:
                raise _Stop("closed before HELLO")
            if message is not NEED_DATA:
                break
            await self._read(max(deadline - time.monotonic(), 0.0), "no HELLO", deadline=True)
        assert isinstance(message, Hello)
        if message.version != WIRE_VERSION:
            self._hello_id = message.request_id
            raise RemoteProtocolError(f"wire version {message.version} is not supported "
                                      f"(this daemon speaks {WIRE_VERSION})",
                                      ErrorCode.UNSUPPORTED_VERSION)
        if not hmac.compare_digest(message.token, self.config.token):
            self._hello_id = message.request_id
            raise RemoteProtocolError("wrong token", ErrorCode.UNAUTHENTICATED)
        self.send(HelloOk(message.request_id, WIRE_VERSION, self.config.frame_bytes_max,
                          int(self.config.idle_timeout_s * 1000), "streamlog"))
        event(logging.INFO, "connection_open", peer=self.peer, connection=self.number,
              client=message.client[:100])

    def _room_short(self) -> bool:
        return (self.inflight_bytes > self.config.inflight_bytes_max
                or len(self.tasks) >= self.config.requests_inflight_max)

    async def _wait_for_room(self) -> None:
        """Back-pressure on a producer: stop reading its socket while too much is in
        flight, or while what we owe it has not drained into the socket (TCP then
        slows it down; nothing is dropped)."""
        if not self._room_short():
            await self.writer.drain()
            return
        self.channel.pause_reading()
        try:
            while self._room_short():
                self.room.clear()
                await self.room.wait()
            await self.writer.drain()
        finally:
            self.channel.resume_reading()

    # -- requests --------------------------------------------------------------------

    def _dispatch(self, message: Message) -> None:
        handler = self._handlers.get(message.TYPE)
        if handler is not None:
            handler(self, message)
        else:
            self._spawn(self._answer(message, self._operations[message.TYPE]), 0)

    def _on_append(self, message: Append) -> None:
        self._spawn(self._append(message), len(message.payload))

    def _on_credit(self, message: Credit) -> None:
        subscription = self.subscriptions.get(message.request_id)
        if subscription is not None:  # it may have ended already: not an error
            subscription.add_credit(message.credit_bytes)

    def _on_cancel(self, message: Cancel) -> None:
        subscription = self.subscriptions.get(message.request_id)
        if subscription is not None:
            subscription.end(None)

    def _on_ping(self, message: Ping) -> None:
        self.send(Pong(message.request_id))

    def _spawn(self, coroutine, nbytes: int) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self.tasks.add(task)
        self.inflight_bytes += nbytes
        task.add_done_callback(functools.partial(self._done, nbytes=nbytes))

    def _done(self, task: asyncio.Task, nbytes: int) -> None:
        self.tasks.discard(task)
        self.inflight_bytes -= nbytes
        self.room.set()

    async def _append(self, message: Append) -> None:
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
        self.send(Appended(message.request_id, result.records, pack_ranges(result.ranges)))

    async def _answer(self, message: Message, operation: Operation) -> None:
        """Answer a request/reply operation: its methods' result, encoded by its row."""
        server = self.server
        try:
            if operation.blocking:
                result = await server.blocking(operation.serve, server.log, message)
            else:
                result = operation.serve(server.log, message)
            reply = operation.answer(message.request_id, result)
        except Exception as error:  # noqa: BLE001 - answered with ERROR
            self._fail(message, error)
            return
        self.send(reply)

    def _fail(self, message: Message, error: BaseException) -> None:
        self.server.metrics.counters["request_errors"] += 1
        if error_code_for(error) is ErrorCode.INTERNAL:
            log.error("request_failed", exc_info=error,
                      extra={"fields": {"peer": self.peer, "request": message.TYPE.name}})
        self.send(error_message(message.request_id, error))

    def _on_read(self, message: Read) -> None:
        if message.request_id in self.subscriptions:
            self._fail(message, LocalProtocolError(
                f"request id {message.request_id} already has a read open",
                ErrorCode.LIMIT_EXCEEDED))
        elif len(self.subscriptions) >= self.config.subscriptions_max:
            self._fail(message, LocalProtocolError(
                f"at most {self.config.subscriptions_max} reads per connection",
                ErrorCode.LIMIT_EXCEEDED))
        else:
            self.subscriptions[message.request_id] = _Subscription(self, message)

    def send(self, message: Message) -> None:
        if self.closed or self.writer.transport.is_closing():
            return
        if self.conn.state in (ERROR, DONE) and not isinstance(message, Error):
            return  # the connection failed: replies to requests still running are moot
        try:
            parts = self.conn.send_parts(message)
        except LocalProtocolError as error:
            log.error("send_refused", extra={"fields": {"peer": self.peer,
                                                        "reason": str(error)}})
            if not isinstance(message, Error):  # the request is answered, never dropped
                self.send(Error(message.request_id, int(ErrorCode.INTERNAL),
                                f"the daemon could not encode its reply: {error}"))
            return
        for part in parts:
            self.writer.write(part)


# -- appends ---------------------------------------------------------------------------

APPENDABLE = np.array([RecordKind(k).appendable if k in set(RecordKind) else False
                       for k in range(256)])

async def _append_records(log, message: Append) -> AppendResult:
    """Append an APPEND's records. The common case (one partition named or implied, no
    headers, records that fit one frame) is checked with NumPy on the received columns
    and handed to the partition's writer as one piece (Log.append_prepared):
    Log.append_batch would check again, record by record, what the columns already
    prove (half the log's CPU per record). Anything else goes through
    Log.append_batch, its checks and its errors."""
    direct = _direct_piece(log, message)
    if direct is not None:
        number, piece = direct
        return await log.append_prepared(message.stream, number, piece)
    timestamps, keys, values, kinds, headers = columns_to_lists(message.columns)
    return await log.append_batch(
        message.stream, values, keys=keys,
        timestamps_us=timestamps if message.timestamps_given else None,
        partition=None if message.partition < 0 else message.partition,
        headers=headers, kinds=kinds, txn_id=message.txn_id)


def _direct_piece(log, message: Append):
    """(partition number, piece) when the records pass the log's checks as columns,
    else None.
    The same bounds as Log.append_batch: record_bytes_max per record, a frame's share
    (frame_bytes_max / 2, batch_records_max) per piece, int64 timestamps above the
    minimum; kinds were checked when the payload was decoded. Data records go to the
    writer as they arrived (payload.EncodedRows: the received columns are the parts of
    the payload the writer joins), with no Python object per record; records with
    control kinds become a list Piece."""
    columns, config = message.columns, log.config
    count = len(columns)
    if columns.header_lengths is not None or count > config.batch_records_max or (
            columns.kinds is not None and not APPENDABLE[columns.kinds].all()):
        return None  # (Log.append_batch refuses the kinds only the log writes)
    if message.partition >= 0:
        number = message.partition
    elif log.partition_count(message.stream) == 1:
        number = 0
    else:
        return None  # key hash or round robin: the log's choice
    sizes = columns.value_bytes() + np.maximum(columns.key_lengths, 0)
    nbytes = int(sizes.sum()) + RECORD_OVERHEAD_BYTES * count
    if int(sizes.max()) > config.record_bytes_max or nbytes > config.frame_bytes_max // 2:
        return None
    if message.timestamps_given:
        stamps = np.ascontiguousarray(columns.timestamps_us, dtype="<i8")
        if int(stamps.min()) <= _INT64_MIN:
            return None
    else:
        stamps = np.full(count, time.time_ns() // 1000, dtype="<i8")
    if columns.kinds is None or not columns.kinds.any():
        return number, EncodedRows(
            stamps, np.ascontiguousarray(columns.key_lengths, dtype="<i4"),
            np.ascontiguousarray(columns.value_lengths, dtype="<i4"), columns.keys,
            columns.values, int(stamps.min()), int(stamps.max()), nbytes, message.txn_id)
    _, keys, values, kinds, _ = columns_to_lists(columns, timestamps=False)
    return number, Piece(stamps.tolist(), keys, values, kinds, None, nbytes,
                         message.txn_id)


_INT64_MIN = -(1 << 63)


# -- reads and tails -------------------------------------------------------------------

class _Subscription:
    """One READ: pushes BATCH messages while the client's credit lasts."""

    def __init__(self, session: Session, request: Read) -> None:
        self.session = session
        self.request = request
        self.follow = bool(request.flags & READ_FOLLOW)
        self.credit = min(request.credit_bytes, session.config.credit_bytes_max)
        self.credit_event = asyncio.Event()
        self.reader = None
        self._pulling: concurrent.futures.Future | None = None
        self._joined = BufferPool(JOINED_BYTES_MAX)  # used by one pull at a time
        self._ended = False
        self._end_code: ErrorCode | None = None
        self.task = asyncio.get_running_loop().create_task(self._run())

    def add_credit(self, nbytes: int) -> None:
        self.credit = min(self.credit + nbytes, self.session.config.credit_bytes_max)
        self.credit_event.set()

    def end(self, code: ErrorCode | None) -> None:
        """Stop: READ_END (cancel) or ERROR `code` (shutdown)."""
        if not self._ended:
            self._ended, self._end_code = True, code
            self.task.cancel()

    def lag(self) -> int:
        reader = self.reader
        if reader is None:
            return 0
        try:
            end = self.session.server.log.end_offset(self.request.stream, self.request.partition)
        except StreamLogError:  # the log is closing: nothing more to send
            return 0
        return max(end - reader.next_offset, 0)

    def _open(self):
        r = self.request
        start = {Start.OFFSET: "from_offset", Start.TIMESTAMP: "from_timestamp_us"}
        stop = {Stop.OFFSET: "to_offset", Stop.TIMESTAMP: "to_timestamp_us"}
        options = {}
        if r.start in start:
            options[start[r.start]] = r.start_value
        if r.stop in stop:
            options[stop[r.stop]] = r.stop_value
        return self.session.server.log.reader(
            r.stream, r.partition, follow=self.follow,
            data_only=bool(r.flags & READ_DATA_ONLY),
            read_committed=bool(r.flags & READ_COMMITTED), **options)

    async def _run(self) -> None:
        session, rid = self.session, self.request.request_id
        try:
            self.reader = await session.server.blocking(self._open)
            session.send(ReadOpened(rid, self.reader.next_offset))
            await self._stream(self.reader)
            session.send(ReadEnd(rid, self.reader.next_offset))
        except asyncio.CancelledError:
            if self._end_code is not None:
                session.send(Error(rid, int(self._end_code), "the daemon is shutting down"))
            elif self._ended:
                session.send(ReadEnd(rid, self.reader.next_offset if self.reader else 0))
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
            if self._ended:  # end() cancels the task; never follow on past an end
                raise asyncio.CancelledError
            while self.credit <= 0:
                self.credit_event.clear()
                await self.credit_event.wait()
            if self._pulling is None:
                self._pulling = server.submit_blocking(pull_batches, slices,
                                                       min(self.credit, PULL_BYTES_MAX),
                                                       self._joined.take)
            batches, status, error = await asyncio.wrap_future(self._pulling)
            self._pulling = None
            left = self.credit - sum(len(batch[4]) for batch in batches)
            if status is MORE and left > 0:
                self._pulling = server.submit_blocking(pull_batches, slices,
                                                       min(left, PULL_BYTES_MAX),
                                                       self._joined.take)
            await self._send(reader, batches)
            del batches  # (the chunk they view is freed before the next pull reads one)
            if status is FAILED:
                raise error
            if status is END:
                return
            if status is WAIT:
                await reader.wait_async()  # raises LogClosed when the log closes

    async def _send(self, reader, batches) -> None:
        session = self.session
        rid, number = self.request.request_id, self.request.partition
        records = nbytes = 0
        for base, count, txn_id, flags, payload in batches:
            session.send(Batch(rid, number, base, txn_id, count, flags, payload))
            records += count
            nbytes += len(payload)
        self.credit -= nbytes
        if batches:  # once per pull: a counter's update takes locks
            counters = session.server.metrics.counters
            counters["read_records"] += records
            counters["read_bytes"] += nbytes
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
