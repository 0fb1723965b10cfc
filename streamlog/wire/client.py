"""The daemon client: `RemoteLog` has the streamlog.Log API over a daemon connection.

Strategy: `open_remote(url)` works wherever `open_log(path)` does, so code switches by
URL alone. Sync methods and readers use a link driven by a private I/O thread; async
methods (append, append_batch) a link on the caller's own event loop (link.py). Every
request/reply method (create_stream, end_offset, commit_txn, ...) is built from its row
of the operation table (operations.py) with the signature api.LogAPI declares: it
checks its arguments against the request's field kinds, sends the request and decodes
the reply, so the remote API cannot drift from the local one. Appends and reads have
code of their own, here.

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
import inspect
import itertools
import numbers
import os
import ssl
import threading
from typing import TYPE_CHECKING

from .. import columnar
from ..api import LogAPI
from ..config import LogConfig
from ..errors import InvalidAppend, InvalidArgument, LogClosed, ReadOnlyLog
from ..payload import encoded_flags, join_encoded
from ..records import AppendResult, RecordKind, RecordPosition
from ..txn import new_txn_id
from .codes import AuthenticationFailed, LocalProtocolError, RemoteProtocolError, exception_for
from .columns import (FRAME_SLACK_BYTES, checked_columns, decode_records, encode_records,
                      pieces, take)
from .link import (CONNECT_TIMEOUT_S, Address, Credentials, Inbox, Link, parse_url,
                   tls_context, unusable)
from .messages import (READ_COMMITTED, READ_DATA_ONLY, READ_FOLLOW, Append, Batch, Cancel,
                       Credit, Error, Message, Read, ReadEnd, ReadOpened, Start, Stop,
                       ranges_of)
from .operations import OPERATIONS, Method, Operation, OperationTable

CREDIT_BYTES = 16 * 1024 * 1024
# Options of open_log that mean nothing for a daemon's log: accepted and ignored.
_LOCAL_ONLY = {"fsync", "create", "fileio", "progress", "config"}
# Records per APPEND of a columnar append (the log's default frame bound; the daemon cuts
# again if its own bound is lower).
_BATCH_RECORDS_MAX = LogConfig().batch_records_max


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
        raise AuthenticationFailed("no token for the daemon: set STREAMLOG_TOKEN")
    context = tls_context(address, tls, tls_ca)
    return RemoteLog(url, address, token.encode() if isinstance(token, str) else bytes(token),
                     context, readonly=readonly, connect_timeout_s=connect_timeout_s,
                     credit_bytes=credit_bytes, client_name=client_name)


# -- the Log API -----------------------------------------------------------------------

if TYPE_CHECKING:  # the methods built from the table are LogAPI's, as a type checker sees
    _TableMethods = LogAPI
else:
    _TableMethods = object


class RemoteLog(_TableMethods):
    """streamlog.Log's API on a daemon's log. Thread-safe: any thread or event loop.

    Sync methods block the calling thread; async methods (append, append_batch,
    aclose) await without blocking the caller's event loop. The request/reply methods
    (create_stream, end_offset, commit_txn, ...) are built from the operation table
    (operations.OPERATIONS); a subclass given a table of its own, `class
    Mine(RemoteLog, operations=table)`, has that table's methods (its daemon needs the
    same table: LogServer(..., operations=table)). Usually made by open_remote(url).
    """

    def __init_subclass__(cls, operations: OperationTable | None = None, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if operations is not None:
            _add_operations(cls, operations)

    def __init__(self, url: str, address: Address, token: bytes, context=None, *,
                 readonly: bool = False, connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 credit_bytes: int = CREDIT_BYTES, client_name: str = "") -> None:
        self.path = url
        self.url = url
        self.readonly = readonly
        self.credit_bytes = credit_bytes
        self.closed = False
        self._credentials = Credentials(address, token, context, connect_timeout_s,
                                        client_name)
        self._link = Link.threaded(self._credentials)
        # async callers get a connection on their own event loop (opened on first use)
        self._native: dict[asyncio.AbstractEventLoop, asyncio.Task] = {}
        self._native_lock = threading.Lock()

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

    async def append_columns(self, stream: str, data, *, partition: int | None = None,
                             txn_id: int = 0) -> AppendResult:
        """Log.append_columns over the wire: the columns are checked and encoded here
        with no loop per record (columnar.py), sent as APPEND payloads, and handed by
        the daemon to its writer as they arrived."""
        requests = self._prepare_columns(stream, data, partition, txn_id)
        link = await self._native_link()
        return await link.acall(_append_all(link, requests))

    def append_columns_sync(self, stream: str, data, *, partition: int | None = None,
                            txn_id: int = 0) -> AppendResult:
        requests = self._prepare_columns(stream, data, partition, txn_id)
        return self._link.call(_append_all(self._link, requests))

    def producer(self, stream: str, **options):
        """A Producer of `stream` (producer.py) through the daemon: records sent one at a
        time, sent as one APPEND per batch, several batches in flight."""
        from ..producer import Producer
        return Producer(self, stream, **options)

    def send_batch(self, stream: str, partition: int, timestamps_us, keys, values, headers,
                   done) -> None:
        """The Producer's path: append one batch to `partition` without waiting; then
        done(first offset, None) or done(None, error), on the link's I/O thread. Batches
        sent from one thread are appended in the order they were sent."""
        try:
            requests = self._prepare(stream, values, keys, timestamps_us, partition, headers,
                                     None, 0)
            future = asyncio.run_coroutine_threadsafe(_append_all(self._link, requests),
                                                      self._link.loop)
        except BaseException as error:  # noqa: BLE001 - the batch's records get it
            done(None, error)
            return

        def finished(future) -> None:
            try:
                result = future.result()
            except BaseException as error:  # noqa: BLE001 - the batch's records get it
                done(None, error)
                return
            done(result.ranges[partition][0], None)

        future.add_done_callback(finished)

    def _prepare_columns(self, stream, data, partition, txn_id):
        self._check_append(stream, partition, txn_id)
        budget = self._link.frame_bytes_max - FRAME_SLACK_BYTES
        rows = columnar.rows_from(data, record_bytes_max=budget)
        given = int(rows.timestamps_us is not None)
        if not given:
            rows = rows.stamped(0)  # the daemon stamps its append time
        target = -1 if partition is None else partition
        requests = []
        for piece in columnar.encode(rows, txn_id, frame_bytes_max=budget * 2,
                                     batch_records_max=_BATCH_RECORDS_MAX):
            requests.append(_append_factory(stream, target, txn_id, given,
                                            piece.record_count, encoded_flags([piece]),
                                            join_encoded([piece])))
        return requests

    async def _native_link(self) -> Link:
        """The connection of the running event loop, opened on first use; a failed one
        is replaced by a new connection on the next call."""
        loop = asyncio.get_running_loop()
        with self._native_lock:
            self._check_open()
            task = self._native.get(loop)
            if task is None or unusable(task):
                task = loop.create_task(Link.native(self._credentials))
                self._native = {other: t for other, t in self._native.items()
                                if not other.is_closed()}
                self._native[loop] = task
        return await asyncio.shield(task)

    def _check_append(self, stream, partition, txn_id) -> None:
        self._check_writable()
        if not isinstance(stream, str):
            raise InvalidArgument(f"stream must be a str (got {type(stream).__name__})")
        if partition is not None and (isinstance(partition, bool) or not isinstance(
                partition, int) or partition < 0):
            raise InvalidArgument(f"partition must be an int >= 0 (got {partition!r})")
        if isinstance(txn_id, bool) or not isinstance(txn_id, int) or not 0 <= txn_id < 1 << 64:
            raise InvalidAppend(f"txn_id must be an int in 0..2**64-1 (got {txn_id!r})")

    def _prepare(self, stream, values, keys, timestamps_us, partition, headers, kinds, txn_id):
        """Check and encode in the caller's thread; returns request factories."""
        self._check_append(stream, partition, txn_id)
        columns = checked_columns(values, keys, timestamps_us, headers, kinds)
        target = -1 if partition is None else partition
        given = int(timestamps_us is not None)
        requests = []
        for rows in pieces(columns, self._link.frame_bytes_max - FRAME_SLACK_BYTES):
            payload, flags = encode_records(*take(columns, rows))
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
        start = (Start.OFFSET, from_offset) if from_offset is not None else (
            (Start.TIMESTAMP, from_timestamp_us) if from_timestamp_us is not None
            else (Start.LOG_START, 0))
        stop = (Stop.OFFSET, to_offset) if to_offset is not None else (
            (Stop.TIMESTAMP, to_timestamp_us) if to_timestamp_us is not None
            else (Stop.NONE, 0))
        flags = ((READ_FOLLOW if follow else 0) | (READ_DATA_ONLY if data_only else 0)
                 | (READ_COMMITTED if read_committed else 0))
        return RemoteReader(self._link, stream, int(partition), int(start[0]), int(start[1]),
                            int(stop[0]), int(stop[1]), flags, self.credit_bytes)

    # -- what needs no request --------------------------------------------------------

    new_txn_id = staticmethod(new_txn_id)

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
            if task.done() and not unusable(task):
                task.result().stop()
            else:
                loop.call_soon_threadsafe(task.cancel)
        self._link.stop()

    async def aclose(self) -> None:
        task = self._native.get(asyncio.get_running_loop())
        if task is not None and task.done() and not unusable(task):
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

    def _op(self, operation: Operation, method: Method, arguments: dict):
        """Call `method` of a table's `operation` on the daemon: `arguments` are the
        call's, bound to the method's signature (`self` included)."""
        if operation.writable:
            self._check_writable()
        else:
            self._check_open()
        values = operation.request_values(arguments)
        reply = self._link.call(self._link.request(lambda rid: operation.request(rid, *values)))
        return operation.result(method, reply, arguments)

    def _check_open(self) -> None:
        if self.closed:
            raise LogClosed(f"the client of {self.url} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self.readonly:
            raise ReadOnlyLog("this client was opened read-only")


def _add_operations(cls: type, table: OperationTable) -> None:
    """Give `cls` a method for each request/reply method of `table`, with the signature
    its protocol (LogAPI) declares. The table is their only definition: a class does
    not write one of them itself."""
    for operation in table:
        if operation.streamed:
            continue
        for method in operation.methods:
            assert method.name not in vars(cls), f"{cls.__name__} defines {method.name}"
            setattr(cls, method.name, _table_method(cls, table, operation, method))


def _table_method(cls: type, table: OperationTable, operation: Operation, method: Method):
    declared = getattr(table.api, method.name)
    signature = inspect.signature(declared)

    def call(self, *args, **kwargs):
        arguments = signature.bind(self, *args, **kwargs)
        arguments.apply_defaults()
        return self._op(operation, method, arguments.arguments)

    call.__name__ = method.name
    call.__qualname__ = f"{cls.__qualname__}.{method.name}"
    call.__signature__ = signature
    call.__annotations__ = dict(getattr(declared, "__annotations__", {}))
    call.__doc__ = (f"{table.api.__name__}.{method.name}, answered by the daemon "
                    f"({operation.type.name} request).")
    return call


_add_operations(RemoteLog, OPERATIONS)


async def _append_all(link: Link, requests) -> AppendResult:
    replies = await asyncio.gather(*(link.request(make) for make in requests))
    ranges: dict[int, tuple[int, int]] = {}
    total = 0
    for reply in replies:
        total += reply.records
        for number, (first, last) in ranges_of(reply).items():
            old = ranges.get(number)
            ranges[number] = (first, last) if old is None else (old[0], last)
    return AppendResult(ranges, total)


def _append_factory(stream, target, txn_id, given, count, flags, payload):
    return lambda rid: Append(rid, stream, target, txn_id, given, count, flags, payload)


def _one(item):
    return None if item is None else [item]


def _kinds(kind):
    return None if kind == RecordKind.DATA else [kind]


# -- readers ---------------------------------------------------------------------------

_END = object()


class RemoteReader:
    """Log.reader's API over a daemon READ: records(), arrow(), iteration, async
    iteration, close(). Used by one thread or task at a time, as a local Reader."""

    def __init__(self, link: Link, stream: str, partition: int, start: int,
                 start_value: int, stop: int, stop_value: int, flags: int,
                 credit_bytes: int) -> None:
        self._link = link
        self.stream = stream
        self.partition = partition
        self.follow = bool(flags & READ_FOLLOW)
        self.data_only = bool(flags & READ_DATA_ONLY)
        self.done = False
        self._inbox = Inbox()
        self._credit_bytes = max(credit_bytes, 64 * 1024)
        self._consumed = 0
        self._opened: asyncio.Future | None = None
        self._request_id = 0
        make = lambda rid: Read(rid, stream, partition, start, start_value, stop,  # noqa: E731
                                stop_value, flags, self._credit_bytes)
        self.next_offset = link.call(self._open(make))

    async def _open(self, make) -> int:
        self._opened = self._link.loop.create_future()
        self._request_id = await self._link.subscribe(self, make)
        try:
            return await self._opened
        except BaseException:
            self._link.unsubscribe(self._request_id)
            raise

    # I/O thread ---------------------------------------------------------------------

    def deliver(self, message: Message) -> None:
        """The link hands over a message for this subscription."""
        opened = self._opened
        if isinstance(message, ReadOpened):
            if opened is not None and not opened.done():
                opened.set_result(message.start_offset)
        elif isinstance(message, Batch):
            self._inbox.put(message)
        elif isinstance(message, ReadEnd):
            self._link.unsubscribe(message.request_id)
            self._inbox.put(message)
        elif isinstance(message, Error):
            self.deliver_failure(exception_for(message.code, message.message))

    def deliver_failure(self, error: BaseException) -> None:
        self._link.unsubscribe(self._request_id)
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
        if isinstance(item, ReadEnd):
            self.done = True
            self.next_offset = item.next_offset  # past skipped (aborted) batches too
            return None
        if isinstance(item, BaseException):
            self.done = True
            raise item
        try:
            columns = decode_records(item.payload, item.payload_flags, item.record_count,
                                     base_offset=item.base_offset, txn_id=item.txn_id)
        except LocalProtocolError as error:
            self.close()
            raise RemoteProtocolError(str(error)) from None
        self.next_offset = item.base_offset + item.record_count
        self._consumed += len(item.payload)
        if self._consumed >= self._credit_bytes // 2:
            consumed, self._consumed = self._consumed, 0
            self._link.post(self._link.send_nowait, Credit(self._request_id, consumed))
        return columns

    def _batches(self):
        while not self.done:
            columns = self._columns(self._inbox.get())
            if columns is not None:
                yield columns

    def records(self):
        """Records from the start to the end (or forever, when following), chained in C
        as Reader.records()."""
        from ..payload import columns_to_records
        number, data_only = self.partition, self.data_only
        return itertools.chain.from_iterable(
            columns_to_records(columns, number, 0, len(columns), data_only)
            for columns in self._batches())

    def arrow(self, *, include_headers: bool = False):
        """pyarrow.RecordBatch per BATCH the daemon sent, as Reader.arrow() gives one
        per log batch: a stored batch, or consecutive small ones joined (up to about
        columns.JOIN_BYTES)."""
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
        if self._link.unsubscribe(self._request_id) is not None:
            self._link.send_nowait(Cancel(self._request_id))

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
