"""The daemon over loopback (DESIGN 9, issue 5).

Two ways to run it: `daemon` runs a LogServer on an event loop in a thread of this
process (fast, and its config can be tightened to make limits bite); `DaemonProcess`
runs `streamlog serve` as a child process for what needs a real process: SIGKILL under
load, SIGTERM drain, the exit codes. `RawClient` speaks the protocol over a plain
socket to send what no well-behaved client would (garbage, oversize frames, half a
frame, appends it never reads the answers to).

Covered: append / replay / tail round trips (sync, async, Arrow, timestamps, headers,
transactions, truncation, info, the error classes), pipelining, many concurrent
clients, a wrong or missing token, malformed and oversize frames, half-open and silent
connections, the connection limit, back-pressure on a slow tailer and a fast producer,
TLS, /healthz and /metrics, no acknowledged record lost when the daemon is SIGKILLed
under load, and SIGTERM's drain; plus the sans-I/O protocol fed whole, byte by byte and
with garbage.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request

from typing import Protocol

import pytest

import streamlog
from streamlog.api import LogAPI
from streamlog.testing.serve import ServeProcess
from streamlog.wire import codes, columns, connection, messages
from streamlog.wire.client import RemoteLog, open_remote, parse_url
from streamlog.wire.operations import (JSON, OPERATIONS, PARTITION, STREAM, Operation,
                                       OperationTable, Reply)
from streamlog.wire.metrics import Metrics, TimedFileIO
from streamlog.wire.server import LogServer, ServerConfig
from streamlog.wire.session import READ_CHUNK_BYTES

pytestmark = pytest.mark.slow

TOKEN = "daemon-test-token"
READ_ALL_FLAGS = messages.READ_FOLLOW | messages.READ_DATA_ONLY | messages.READ_COMMITTED
SERVE = "from streamlog.wire.serve_cli import main; main()"


# -- harness ---------------------------------------------------------------------------

class ThreadedDaemon:
    """A LogServer on its own event loop thread, over a log opened in this process."""

    def __init__(self, path: str, operations: OperationTable = OPERATIONS, **config) -> None:
        self.metrics = Metrics()
        self.log = streamlog.open_log(path, fsync="always",
                                      fileio=TimedFileIO(self.metrics.fsync_seconds))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        options = dict(token=TOKEN.encode(), port=0, metrics_port=0)
        options.update(config)
        self.server = LogServer(self.log, ServerConfig(**options), self.metrics,
                                operations=operations)
        self.run(self.server.start())
        self.url = f"streamlog://127.0.0.1:{self.server.port}"
        self.stopped = False

    def run(self, coroutine, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def connect(self, **options):
        return open_remote(self.url, TOKEN, **options)

    def http(self, path: str) -> tuple[int, str]:
        url = f"http://127.0.0.1:{self.server.metrics_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def metric(self, name: str) -> float:
        for line in self.http("/metrics")[1].splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise KeyError(name)

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            self.run(self.server.drain())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


@pytest.fixture
def daemon_factory(tmp_path):
    started: list[ThreadedDaemon] = []

    def start(name: str = "log", **config) -> ThreadedDaemon:
        daemon = ThreadedDaemon(str(tmp_path / name), **config)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop()


@pytest.fixture
def daemon(daemon_factory) -> ThreadedDaemon:
    return daemon_factory()


@pytest.fixture
def remote(daemon):
    log = daemon.connect()
    yield log
    log.close()


class RawClient:
    """The protocol over a plain blocking socket, for misbehaving on purpose."""

    def __init__(self, port: int, *, hello: bool = True, token: str = TOKEN) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.conn = connection.Connection(messages.Role.CLIENT)
        if hello:
            self.send(messages.Hello(0, messages.WIRE_VERSION, token.encode(), "raw"))
            reply = self.receive()
            assert isinstance(reply, messages.HelloOk), reply

    def send(self, message: messages.Message) -> None:
        self.sock.sendall(self.conn.send(message))

    def receive(self, timeout: float = 10.0):
        """The next message, or connection.CLOSED when the daemon closed the connection."""
        self.sock.settimeout(timeout)
        while True:
            event = self.conn.next_event()
            if event is not connection.NEED_DATA:
                return event
            try:
                data = self.sock.recv(1 << 16)
            except ConnectionResetError:
                data = b""
            self.conn.receive_data(data)

    def closed_within(self, seconds: float) -> bool:
        """True if the daemon closes the connection within `seconds` (data before the
        close is read and dropped)."""
        deadline = time.monotonic() + seconds
        self.sock.settimeout(0.2)
        while time.monotonic() < deadline:
            try:
                if not self.sock.recv(1 << 16):
                    return True
            except socket.timeout:
                continue
            except ConnectionResetError:
                return True
        return False

    def close(self) -> None:
        self.sock.close()


def append_message(request_id: int, stream: str, values,
                   partition: int = 0) -> messages.Append:
    payload, flags = columns.encode_records([0] * len(values), [None] * len(values), values)
    return messages.Append(request_id, stream, partition, 0, 0, len(values), flags, payload)


def request(name: str) -> type[messages.Message]:
    """The request message class of a row of the operation table."""
    return OPERATIONS[name].request


def wait_until(predicate, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def events(caplog, name: str) -> list:
    return [r for r in caplog.records if r.getMessage() == name]


# -- round trips -----------------------------------------------------------------------

def test_append_and_replay_round_trip_sync(remote):
    assert remote.create_stream("events", partitions=2) == 2
    assert remote.create_stream("events", partitions=2) == 2  # a no-op, as locally
    assert remote.streams() == ["events"] and remote.partition_count("events") == 2
    values = [f"value-{i}".encode() for i in range(500)]
    keys = [f"key-{i % 7}".encode() if i % 3 else None for i in range(500)]
    stamps = [1_700_000_000_000_000 + i * 10 for i in range(500)]
    result = remote.append_batch_sync("events", values, keys=keys, timestamps_us=stamps)
    assert result.records == 500
    for number in range(2):
        records = list(remote.reader("events", number))
        assert remote.end_offset("events", number) == len(records)
        assert [r.offset for r in records] == list(range(len(records)))
        if records:
            assert result.ranges[number] == (0, len(records) - 1)
    got = {r.value: r for n in range(2) for r in remote.reader("events", n).records()}
    assert set(got) == set(values)
    for i, value in enumerate(values):
        assert got[value].key == keys[i] and got[value].timestamp_us == stamps[i]
        if keys[i] is not None:  # a key picks its partition by the same stable hash
            assert got[value].partition == streamlog.partition_for_key(keys[i], 2)


def test_single_appends_headers_and_daemon_time(remote):
    remote.create_stream("s")
    before = time.time_ns() // 1000
    position = remote.append_sync("s", b"one", key=b"k", headers={"trace": b"abc"})
    after = time.time_ns() // 1000
    assert position == streamlog.RecordPosition(0, 0)
    (record,) = list(remote.reader("s", 0))
    assert record.headers == (("trace", b"abc"),) and record.key == b"k"
    assert before - 5_000_000 <= record.timestamp_us <= after + 5_000_000  # daemon's clock
    batch, = list(remote.reader("s", 0).arrow(include_headers=True))
    assert batch.column("value").to_pylist() == [b"one"]
    assert batch.column("headers").to_pylist() == [[{"key": "trace", "value": b"abc"}]]
    remote.append_batch_sync("s", [b"two", b"three"])  # no headers: the columnar path
    later = time.time_ns() // 1000
    _, two, three = list(remote.reader("s", 0))
    assert (two.value, three.value, two.offset) == (b"two", b"three", 1)
    assert after - 5_000_000 <= two.timestamp_us == three.timestamp_us <= later + 5_000_000


def test_async_api_tail_and_timestamp_replay(remote):
    remote.create_stream("clicks")

    async def main():
        positions = await asyncio.gather(*(
            remote.append("clicks", f"c{i}".encode(), timestamp_us=1000 + (i * 7) % 50,
                          partition=0) for i in range(50)))
        assert sorted(pos.offset for pos in positions) == list(range(50))
        got = []
        reader = remote.reader("clicks", 0, from_offset=45, follow=True)

        async def follow():
            async for record in reader:
                got.append(record)
                if len(got) == 10:
                    return

        task = asyncio.create_task(follow())
        await asyncio.sleep(0.1)
        await remote.append_batch("clicks", [f"late{i}".encode() for i in range(5)],
                                  timestamps_us=[2000 + i for i in range(5)])
        await asyncio.wait_for(task, 10)
        reader.close()
        return got

    got = asyncio.run(main())
    stored = list(remote.reader("clicks", 0))
    assert [r.offset for r in got] == list(range(45, 55))
    assert got == stored[45:55]
    assert [r.value for r in got[5:]] == [f"late{i}".encode() for i in range(5)]
    # the high-water-mark rule, served remotely: from is inclusive, to exclusive
    hwm, running = [], None
    for record in stored:
        running = record.timestamp_us if running is None else max(running, record.timestamp_us)
        hwm.append(running)
    start = next(i for i, h in enumerate(hwm) if h >= 1010)
    end = next(i for i, h in enumerate(hwm) if h >= 1030)
    window = list(remote.reader("clicks", 0, from_timestamp_us=1010, to_timestamp_us=1030))
    assert window == stored[start:end] and window
    assert remote.offset_for_timestamp("clicks", 0, 1010) == start


def test_follow_reader_sees_appends_from_another_client(daemon):
    producer, consumer = daemon.connect(), daemon.connect()
    try:
        producer.create_stream("live")
        reader = consumer.reader("live", 0, follow=True)
        got = []

        def consume():
            for record in reader:
                got.append(record.value)
                if len(got) == 300:
                    break

        thread = threading.Thread(target=consume)
        thread.start()
        for start in range(0, 300, 30):
            producer.append_batch_sync("live", [b"x%d" % i for i in range(start, start + 30)])
        thread.join(10)
        assert got == [b"x%d" % i for i in range(300)]
        assert daemon.metric("streamlog_tailers") == 1
        reader.close()
        wait_until(lambda: daemon.metric("streamlog_tailers") == 0, what="tailer released")
    finally:
        producer.close()
        consumer.close()


def test_transactions_truncate_and_info(remote):
    remote.create_stream("tx")
    txn = remote.new_txn_id()
    remote.append_batch_sync("tx", [b"a", b"b"], txn_id=txn, partition=0)
    assert list(remote.reader("tx", 0)) == []  # read_committed: not yet visible
    assert remote.last_stable_offset("tx", 0) == 0  # held at the open transaction
    assert remote.end_offset("tx", 0) == 2
    assert len(list(remote.reader("tx", 0, read_committed=False))) == 2
    commit_offset = remote.commit_txn("tx", 0, txn, tag="query-1", marker=b"batch-7")
    assert remote.last_stable_offset("tx", 0) == remote.end_offset("tx", 0) == 3
    assert commit_offset == 2
    assert [r.value for r in remote.reader("tx", 0)] == [b"a", b"b"]
    assert len(list(remote.reader("tx", 0, data_only=False))) == 3  # the marker too
    assert remote.last_commit("tx", 0, "query-1") == b"batch-7"
    assert remote.last_commit("tx", 0, "nobody") is None
    assert remote.txn_state("tx", 0, txn).name == "COMMITTED"
    aborted = remote.new_txn_id()
    remote.append_batch_sync("tx", [b"gone"], txn_id=aborted, partition=0)
    remote.abort_txn("tx", 0, aborted)
    remote.append_batch_sync("tx", [b"c", b"d"], partition=0)
    assert [r.value for r in remote.reader("tx", 0)] == [b"a", b"b", b"c", b"d"]
    assert remote.truncate_after("tx", 0, 5) == 6
    assert [r.value for r in remote.reader("tx", 0)] == [b"a", b"b", b"c"]
    info = remote.info()
    assert info["streams"]["tx"]["partitions"][0]["end_offset"] == 6
    assert remote.start_offset("tx", 0) == 0


def test_errors_arrive_as_the_local_exceptions(remote):
    remote.create_stream("e")
    with pytest.raises(streamlog.UnknownStream):
        remote.append_sync("missing", b"x")
    with pytest.raises(streamlog.UnknownStream):
        remote.reader("missing", 0)
    with pytest.raises(streamlog.OffsetOutOfRange):
        remote.reader("e", 0, from_offset=5)
    with pytest.raises(streamlog.InvalidArgument):
        remote.reader("e", 3)
    with pytest.raises(streamlog.InvalidAppend):
        remote.append_batch_sync("e", ["text, not bytes"])
    with pytest.raises(streamlog.InvalidAppend):
        remote.append_batch_sync("e", [b"x" * (9 * 1024 * 1024)])  # record_bytes_max
    with pytest.raises(streamlog.InvalidArgument):
        remote.create_stream("e", partitions=3)
    with pytest.raises(streamlog.InvalidArgument):
        remote.commit_txn("e", 0, 12345)  # no such open transaction
    assert remote.append_sync("e", b"still fine").offset == 0  # the connection survived


# Arguments for each request/reply method that only reads: a new one must be added here.
READ_CALLS = {
    "streams": (), "partition_count": ("q",), "start_offset": ("q", 1),
    "end_offset": ("q", 1), "last_stable_offset": ("q", 0),
    "offset_for_timestamp": ("q", 1, 150), "info": (), "last_commit": ("q", 0, "job"),
    "txn_state": ("q", 0, "TXN"), "open_transactions": ("q", 0),
    # a hold is allowed to a read-only client: set, then read, then a release of none
    "hold": ("q", 0, "h", 1), "holds": ("q", 0), "release_hold": ("q", 0, "nobody"),
}


def test_every_operation_that_reads_answers_as_the_local_log(daemon, remote):
    local = daemon.log
    local.create_stream("q", partitions=2)
    local.append_batch_sync("q", [b"a", b"b", b"c"], timestamps_us=[100, 200, 300],
                            partition=1)
    txn = local.new_txn_id()
    local.append_batch_sync("q", [b"t"], partition=0, txn_id=txn)
    local.commit_txn("q", 0, txn, tag="job", marker=b"m-1")
    reads = {name for op in OPERATIONS if not (op.writable or op.streamed)
             for name in (m.name for m in op.methods)}
    assert reads == set(READ_CALLS)
    for name, args in READ_CALLS.items():
        args = tuple(txn if a == "TXN" else a for a in args)
        expected = getattr(local, name)(*args)
        if OPERATIONS.by_method[name][0].reply is JSON:  # what JSON can say of it
            expected = json.loads(json.dumps(expected, default=str))
        assert getattr(remote, name)(*args) == expected, name


def test_bad_arguments_are_refused_before_a_request_is_sent(remote):
    remote.create_stream("b")
    with pytest.raises(streamlog.InvalidArgument, match="partition must be in 0..4294967295"):
        remote.end_offset("b", -1)
    with pytest.raises(streamlog.InvalidArgument, match="timestamp_us must be an int"):
        remote.offset_for_timestamp("b", 0, "5")
    with pytest.raises(streamlog.InvalidArgument, match="marker must be bytes"):
        remote.commit_txn("b", 0, 1, marker="text")
    with pytest.raises(TypeError):
        remote.end_offset()  # the signature is LogAPI's
    assert remote.end_offset("b") == 0  # the connection survived


class AdminType(enum.IntEnum):
    BATCH_HOLDING = 63  # a client type number MessageType does not use


class AdminAPI(LogAPI, Protocol):
    def batch_holding(self, stream: str, partition: int, offset: int): ...


# (base offset, stored bytes) of the batch that holds an offset: its columns stay behind
BATCH_BOUNDS = Reply(JSON.message, lambda found: (json.dumps(found[:2]).encode(),),
                     lambda reply: tuple(reply.value()))
ADMIN = OPERATIONS.extended(
    Operation(AdminType.BATCH_HOLDING, (STREAM, PARTITION, ("offset", "i64")), BATCH_BOUNDS),
    api=AdminAPI)


class AdminRemoteLog(RemoteLog, operations=ADMIN):
    pass


def test_an_operation_added_to_a_table_works_locally_and_remotely(daemon_factory):
    """A row, a protocol that declares its method, and a Log that has it: nothing else."""
    daemon = daemon_factory(operations=ADMIN)
    local = daemon.log
    local.create_stream("x")
    local.append_batch_sync("x", [b"a", b"b"])
    local.append_batch_sync("x", [b"c"])
    with AdminRemoteLog(daemon.url, parse_url(daemon.url), TOKEN.encode()) as remote:
        assert remote.batch_holding("x", 0, 1) == local.batch_holding("x", 0, 1)[:2]
        assert remote.batch_holding("x", 0, 2)[0] == 2
        with pytest.raises(streamlog.UnknownStream):  # errors cross as for any row
            remote.batch_holding("nope", 0, 0)
        assert remote.end_offset("x") == 3  # the standard rows are still there
    assert not hasattr(RemoteLog, "batch_holding")


def test_batch_over_the_frame_limit_is_split_and_lands_whole(daemon_factory):
    daemon = daemon_factory(frame_bytes_max=256 * 1024)
    with daemon.connect() as log:
        log.create_stream("big")
        values = [bytes([i % 251]) * 1000 for i in range(1000)]  # ~1 MB, 4+ frames
        result = log.append_batch_sync("big", values)
        assert result.records == 1000 and result.ranges == {0: (0, 999)}
        assert [r.value for r in log.reader("big", 0)] == values


def test_pipelined_requests_are_answered_and_land_in_order(daemon):
    with daemon.connect() as log:
        log.create_stream("pipe")
    raw = RawClient(daemon.server.port)
    burst = b"".join(raw.conn.send(append_message(rid, "pipe", [b"r%d" % rid]))
                     for rid in range(1, 101))
    raw.sock.sendall(burst + raw.conn.send(request("offsets")(101, "pipe", 0)))
    replies = {}
    while len(replies) < 101:
        message = raw.receive()
        replies[message.request_id] = message
    raw.close()
    offsets = [messages.ranges_of(replies[rid])[0][0] for rid in range(1, 101)]
    assert offsets == list(range(100))  # sent in order, landed in order
    assert isinstance(replies[101], messages.ResultOffsets)
    with daemon.connect() as log:
        assert [r.value for r in log.reader("pipe", 0)] == [b"r%d" % i for i in range(1, 101)]


def test_many_concurrent_clients(daemon):
    with daemon.connect() as admin:
        admin.create_stream("many", partitions=3)
    clients, per_client, errors = 16, 40, []
    acked: dict[int, list] = {}

    def work(number: int) -> None:
        try:
            with daemon.connect(client_name=f"c{number}") as log:
                for i in range(per_client):
                    value = f"{number}:{i}".encode()
                    position = log.append_sync("many", value, key=str(number).encode())
                    acked.setdefault(number, []).append((position, value))
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    with daemon.connect() as log:
        stored = {(r.partition, r.offset): r.value for n in range(3)
                  for r in log.reader("many", n)}
    assert len(stored) == clients * per_client
    for number, items in acked.items():
        assert [v for _, v in items] == [f"{number}:{i}".encode() for i in range(per_client)]
        for position, value in items:
            assert stored[(position.partition, position.offset)] == value
        partitions = {pos.partition for pos, _ in items}
        assert len(partitions) == 1  # one key, one partition
        offsets = [pos.offset for pos, _ in items]
        assert offsets == sorted(offsets)  # one client's appends land in call order


# -- security and garbage --------------------------------------------------------------

def test_wrong_or_missing_token_is_refused(daemon, caplog, monkeypatch):
    with pytest.raises(codes.AuthenticationFailed):
        open_remote(daemon.url, "not-the-token")
    monkeypatch.delenv("STREAMLOG_TOKEN", raising=False)
    with pytest.raises(codes.AuthenticationFailed):
        open_remote(daemon.url)
    monkeypatch.setenv("STREAMLOG_TOKEN", TOKEN)
    with open_remote(daemon.url) as log:  # the environment's token
        log.create_stream("ok")
    wait_until(lambda: daemon.metric("streamlog_auth_failures_total") == 1, what="metric")
    assert any("wrong token" in r.fields["reason"] for r in events(caplog, "protocol_error"))


def test_requests_before_hello_are_refused(daemon):
    raw = RawClient(daemon.server.port, hello=False)
    raw.sock.sendall(messages.encode_message(request("streams")(1)))
    reply = raw.receive()
    assert isinstance(reply, messages.Error) and reply.code == codes.ErrorCode.UNAUTHENTICATED
    assert raw.closed_within(5)


def _with_bad_headers() -> bytes:
    payload, flags = columns.encode_records([1], [None], [b"v"], None, [(("a", b"b"),)])
    frame = messages.encode_message(messages.Append(1, "g", 0, 0, 1, 1, flags, payload))
    return frame[:-10] + b"\xff\xff" + frame[-8:]  # the header count, now 65535


@pytest.mark.parametrize("garbage", [
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # a length of ~1.2 GB: over the limit
    struct.pack(">IBI", 5, 250, 1),  # unknown message type
    struct.pack(">IBI", 3, 1, 1),  # impossible length
    struct.pack(">IBI", 9, codes.MessageType.OFFSETS, 1) + b"\x00\x10ab",  # body too short
    messages.encode_message(messages.Ping(1)) + b"\xff" * 3 + struct.pack(">IBI", 6, 2, 2)
    + b"x",
    messages.encode_message(  # a second HELLO
        messages.Hello(7, messages.WIRE_VERSION, TOKEN.encode(), "again")),
    messages.encode_message(messages.ReadEnd(1, 5)),  # a server's message, from a client
    _with_bad_headers(),  # an APPEND whose record headers do not parse
])
def test_garbage_disconnects_with_a_logged_reason_and_harms_nobody(daemon, caplog, garbage):
    good = daemon.connect()
    good.create_stream("g")
    raw = RawClient(daemon.server.port)
    raw.sock.sendall(garbage)
    message = raw.receive()
    while isinstance(message, messages.Pong):  # the valid PING before the garbage is answered
        message = raw.receive()
    assert isinstance(message, messages.Error), message
    assert message.code in (codes.ErrorCode.PROTOCOL_ERROR, codes.ErrorCode.FRAME_TOO_LARGE)
    assert raw.closed_within(5)
    raw.close()
    wait_until(lambda: events(caplog, "protocol_error"), what="a logged reason")
    assert events(caplog, "protocol_error")[0].fields["reason"]
    assert good.append_sync("g", b"unharmed").offset == 0
    good.close()


def test_oversize_frame_is_refused_before_its_body_is_read(daemon_factory):
    daemon = daemon_factory(frame_bytes_max=1024 * 1024)
    raw = RawClient(daemon.server.port)
    raw.sock.sendall(struct.pack(">IBI", 50 * 1024 * 1024, codes.MessageType.APPEND, 1))
    reply = raw.receive()
    assert isinstance(reply, messages.Error) and reply.code == codes.ErrorCode.FRAME_TOO_LARGE
    assert raw.closed_within(5)
    # before the HELLO, the bound is 64 KiB: no large pre-authentication buffers
    raw = RawClient(daemon.server.port, hello=False)
    raw.sock.sendall(struct.pack(">IBI", 200 * 1024, codes.MessageType.HELLO, 0))
    reply = raw.receive()
    assert isinstance(reply, messages.Error) and reply.code == codes.ErrorCode.FRAME_TOO_LARGE
    # a client splits its own large batches under the announced limit
    with daemon.connect() as log:
        log.create_stream("o")
        assert log.append_batch_sync("o", [b"v" * 1000] * 3000).records == 3000


def test_half_open_and_silent_connections_are_closed(daemon_factory, caplog):
    caplog.set_level(logging.INFO, logger="streamlog")
    daemon = daemon_factory(handshake_timeout_s=0.5, idle_timeout_s=1.0, connections_max=3)
    silent = RawClient(daemon.server.port, hello=False)  # connects, says nothing
    half = RawClient(daemon.server.port)
    half.sock.sendall(messages.encode_message(messages.Ping(1))[:6])  # half a frame, then silence
    assert silent.closed_within(3) and half.closed_within(4)
    reasons = [r.fields["reason"] for r in events(caplog, "connection_closed")]
    assert any("no HELLO" in reason for reason in reasons)
    assert any("idle timeout" in reason for reason in reasons)
    # a client that keeps pinging outlives the idle timeout; its slot was never lost
    with daemon.connect() as log:
        log.create_stream("h")
        time.sleep(1.5)
        assert log.append_sync("h", b"alive").offset == 0


def test_peer_vanishing_mid_tail_releases_its_reader(daemon):
    with daemon.connect() as log:
        log.create_stream("t")
        log.append_batch_sync("t", [b"x"] * 10)
    raw = RawClient(daemon.server.port)
    raw.send(messages.Read(5, "t", 0, messages.Start.OFFSET, 0, messages.Stop.NONE, 0,
                           READ_ALL_FLAGS, 1 << 20))
    assert isinstance(raw.receive(), messages.ReadOpened)
    assert isinstance(raw.receive(), messages.Batch)
    wait_until(lambda: daemon.metric("streamlog_tailers") == 1, what="tailer")
    raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    raw.close()  # a reset, no goodbye
    wait_until(lambda: daemon.metric("streamlog_tailers") == 0, what="tailer gone")
    partition = daemon.log._partition("t", 0)
    wait_until(lambda: partition.min_hold() is None, what="hold released")


def test_connection_limit(daemon_factory):
    daemon = daemon_factory(connections_max=2)
    first, second = daemon.connect(), daemon.connect()
    with pytest.raises(codes.DaemonUnavailable):
        daemon.connect()
    first.close()
    wait_until(lambda: len(daemon.server.sessions) == 1, what="slot freed")
    third = daemon.connect()
    third.create_stream("ok")
    second.close()
    third.close()


# -- back-pressure ---------------------------------------------------------------------

def test_slow_tailer_gets_no_more_than_its_credit(daemon):
    with daemon.connect() as log:
        log.create_stream("slow")
        for _ in range(20):  # ~2 MB in 20 batches of 100 KB
            log.append_batch_sync("slow", [b"s" * 1000] * 100)
    raw = RawClient(daemon.server.port)
    credit = 150_000
    raw.send(messages.Read(9, "slow", 0, messages.Start.LOG_START, 0, messages.Stop.NONE, 0,
                           READ_ALL_FLAGS, credit))
    received, batches = 0, []
    while True:
        try:
            message = raw.receive(timeout=1.0)
        except socket.timeout:
            break
        if isinstance(message, messages.Batch):
            batches.append(message)
            received += len(message.payload)
    assert isinstance(batches[0], messages.Batch) and received < credit + 110_000
    assert daemon.metric("streamlog_tail_lag_records") > 1000  # the rest waits on disk
    raw.send(messages.Credit(9, 10_000_000))  # a top-up lets the rest flow
    total = sum(b.record_count for b in batches)
    while total < 2000:
        message = raw.receive()
        if isinstance(message, messages.Batch):
            total += message.record_count
    assert total == 2000
    raw.send(messages.Cancel(9))
    assert isinstance(raw.receive(), messages.ReadEnd)
    raw.close()


def test_fast_producer_is_slowed_not_dropped(daemon_factory):
    window = 256 * 1024
    daemon = daemon_factory(inflight_bytes_max=window, requests_inflight_max=8)
    with daemon.connect() as log:
        log.create_stream("fast")
    raw = RawClient(daemon.server.port)
    template = raw.conn.send(append_message(1, "fast", [b"f" * 1000] * 200))  # ~200 KB
    frames = [template[:5] + struct.pack(">I", rid) + template[9:] for rid in range(1, 121)]
    peak = {"bytes": 0, "requests": 0}
    sampling = threading.Event()

    def sample() -> None:  # what the daemon holds for this producer, every millisecond
        while not sampling.is_set():
            for session in list(daemon.server.sessions):
                peak["bytes"] = max(peak["bytes"], session.inflight_bytes)
                peak["requests"] = max(peak["requests"], len(session.tasks))
            time.sleep(0.001)

    sampler = threading.Thread(target=sample)
    sampler.start()
    raw.sock.setblocking(False)
    pushed_back = 0
    data = memoryview(b"".join(frames))  # 24 MB offered, no reply read meanwhile
    deadline = time.monotonic() + 60
    while data and time.monotonic() < deadline:
        try:
            data = data[raw.sock.send(data):]
        except BlockingIOError:
            pushed_back += 1
            time.sleep(0.002)
    sampling.set()
    sampler.join()
    assert not data, "the daemon stopped reading for good"
    assert pushed_back > 0  # TCP slowed the producer down ...
    # ... while the daemon held at most its window, plus what one socket read completes
    assert 0 < peak["bytes"] <= window + len(template) + READ_CHUNK_BYTES
    assert peak["requests"] <= 8
    raw.sock.setblocking(True)
    replies = [raw.receive(timeout=30) for _ in frames]  # and nothing was dropped
    assert all(isinstance(reply, messages.Appended) for reply in replies)
    assert sorted(reply.request_id for reply in replies) == list(range(1, 121))
    raw.close()
    with daemon.connect() as log:
        assert log.end_offset("fast", 0) == 120 * 200


# -- TLS, metrics ----------------------------------------------------------------------

def test_tls(daemon_factory, certificate):
    cert, key = certificate
    daemon = daemon_factory(tls_cert=cert, tls_key=key)
    tls_url = daemon.url.replace("streamlog://", "streamlog+tls://")
    with open_remote(tls_url, TOKEN, tls_ca=cert) as log:
        log.create_stream("secure")
        log.append_batch_sync("secure", [b"a", b"b"])
        assert [r.value for r in log.reader("secure", 0)] == [b"a", b"b"]
    with pytest.raises(codes.DaemonError):  # an unverified certificate is refused
        open_remote(tls_url, TOKEN)
    with pytest.raises(streamlog.StreamLogError):  # plain text to a TLS port
        open_remote(daemon.url, TOKEN, connect_timeout_s=3)


def test_healthz_and_metrics(daemon):
    status, body = daemon.http("/healthz")
    assert status == 200 and json.loads(body)["status"] == "ok"
    with daemon.connect() as log:
        log.create_stream("m")
        for _ in range(5):
            log.append_batch_sync("m", [b"v" * 10] * 100)
        list(log.reader("m", 0))
    assert daemon.metric("streamlog_append_records_total") == 500
    assert daemon.metric("streamlog_append_requests_total") == 5
    assert daemon.metric("streamlog_read_records_total") == 500
    assert daemon.metric("streamlog_fsync_seconds_count") >= 5  # one or more per append
    assert daemon.metric("streamlog_append_ack_seconds_count") == 5
    text = daemon.http("/metrics")[1]
    for name in ("streamlog_appends_per_second", "streamlog_tailers",
                 "streamlog_tail_lag_records", "streamlog_fsync_seconds_bucket"):
        assert f"# TYPE {name.removesuffix('_bucket')}" in text
    assert daemon.http("/nope")[0] == 404


def test_url_parsing():
    assert parse_url("streamlog://127.0.0.1:9000").port == 9000
    assert parse_url("streamlog://localhost").port == 7541
    assert parse_url("streamlog://[::1]:7000/").host == "::1"
    assert parse_url("streamlog+tls://h:1").tls
    for bad in ("http://h:1", "streamlog://", "streamlog://h:99999", "streamlog://h:1/x"):
        with pytest.raises(streamlog.InvalidArgument):
            parse_url(bad)
    with pytest.raises(codes.DaemonUnavailable):  # nothing listens there
        open_remote(f"streamlog://127.0.0.1:{_free_port()}", TOKEN, connect_timeout_s=2)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- the daemon as a process -----------------------------------------------------------

class DaemonProcess(ServeProcess):
    """`streamlog serve` in a child process (streamlog.testing.serve), with the token."""

    def __init__(self, path: str, *extra: str) -> None:
        super().__init__(path, *extra, token=TOKEN)


def _producers(url: str, stream: str, count: int, stop: threading.Event):
    """Threads appending unique values in batches; returns (threads, acked, failures).
    acked[(partition, first)] = the values the daemon acknowledged at first.."""
    acked: dict[tuple[int, int], list[bytes]] = {}
    failures: list[BaseException] = []

    def work(number: int) -> None:
        sequence = 0
        try:
            with open_remote(url, TOKEN) as log:
                while not stop.is_set():
                    values = [f"{number}:{sequence}:{i}".encode() * 3 for i in range(25)]
                    result = log.append_batch_sync(stream, values, partition=number % 2)
                    (partition, (first, last)), = result.ranges.items()
                    assert last - first + 1 == len(values)
                    acked[(partition, first)] = values
                    sequence += 1
        except streamlog.StreamLogError as error:  # the daemon went away mid-append
            failures.append(error)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    return threads, acked, failures


def _check_acked(log, stream: str, acked: dict) -> int:
    stored = {n: [r.value for r in log.reader(stream, n)] for n in range(2)}
    for (partition, first), values in acked.items():
        assert stored[partition][first:first + len(values)] == values
    everything = [v for values in stored.values() for v in values]
    assert len(everything) == len(set(everything))  # nothing twice
    return len(everything)


def test_sigkill_under_load_loses_no_acknowledged_record(tmp_path):
    path = str(tmp_path / "killed")  # does not exist: the daemon creates it
    daemon = DaemonProcess(path)
    try:
        with open_remote(daemon.url, TOKEN) as admin:
            admin.create_stream("load", partitions=2)
        stop = threading.Event()
        threads, acked, _ = _producers(daemon.url, "load", 4, stop)
        wait_until(lambda: len(acked) >= 40, timeout=30, what="appends under load")
        time.sleep(0.3)
        daemon.proc.send_signal(signal.SIGKILL)
        daemon.proc.wait(10)
        stop.set()
        for thread in threads:
            thread.join(30)
        assert len(acked) >= 40
    finally:
        daemon.kill()
    restarted = DaemonProcess(path)  # recovery runs on open; then serve again
    try:
        with open_remote(restarted.url, TOKEN) as log:
            total = _check_acked(log, "load", acked)
            assert total >= sum(map(len, acked.values()))
            log.append_sync("load", b"after the crash", partition=0)  # writable again
    finally:
        restarted.proc.send_signal(signal.SIGTERM)
        assert restarted.proc.wait(30) == 0
        restarted.kill()


def test_sigterm_drains_and_exits_zero(tmp_path):
    path = str(tmp_path / "drained")
    daemon = DaemonProcess(path)
    try:
        with open_remote(daemon.url, TOKEN) as admin:
            admin.create_stream("load", partitions=2)
            admin.append_sync("load", b"first", partition=1)
        follower = open_remote(daemon.url, TOKEN)
        reader = follower.reader("load", 1, follow=True)
        first = next(iter(reader))
        assert first.value == b"first"
        stop = threading.Event()
        threads, acked, failures = _producers(daemon.url, "load", 3, stop)
        wait_until(lambda: len(acked) >= 20, timeout=30, what="appends under load")
        daemon.proc.send_signal(signal.SIGTERM)
        assert daemon.proc.wait(30) == 0
        stop.set()
        for thread in threads:
            thread.join(30)
        with pytest.raises(codes.DaemonError):  # the tail ends with an error, not a hang
            for _ in reader:
                pass
        follower.close()
        events_seen = daemon.events()
        assert "draining" in events_seen and "stopped" in events_seen
        assert all(isinstance(f, codes.DaemonError) for f in failures)
    finally:
        daemon.kill()
    with streamlog.open_log(path) as log:  # the lock was released; nothing acked is lost
        _check_acked(log, "load", acked)


def test_serve_refuses_to_start_without_a_token(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "STREAMLOG_TOKEN"}
    done = subprocess.run([sys.executable, "-c", SERVE, str(tmp_path / "x"), "--port", "0"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "STREAMLOG_TOKEN" in done.stderr
    assert not os.path.exists(tmp_path / "x")


# -- the sans-I/O protocol -------------------------------------------------------------

def _sample_messages() -> list[messages.Message]:
    payload, flags = columns.encode_records([1, 2], [b"k", None], [b"v", b""], [0, 1],
                                            [(), (("h", b"x"),)])
    m = messages
    return [
        m.Ping(1), request("create_stream")(2, "s", 4),
        m.Append(3, "s", -1, 9, 1, 2, flags, payload),
        m.Read(4, "s", 1, m.Start.TIMESTAMP, -5, m.Stop.OFFSET, 10, m.READ_FOLLOW, 1 << 20),
        m.Credit(4, 100), m.Cancel(4), request("commit_txn")(5, "s", 0, 1 << 63, "tag", b"m"),
    ]


def test_protocol_feeds_whole_byte_by_byte_and_with_trailing_bytes():
    samples = _sample_messages()
    stream = b"".join(messages.encode_message(m) for m in samples)
    for chunk in (len(stream), 1, 7):
        server = connection.Connection(messages.Role.SERVER)
        server.receive_data(messages.encode_message(messages.Hello(0, 1, b"t")))
        assert isinstance(server.next_event(), messages.Hello)
        server.send(messages.HelloOk(0, 1, messages.FRAME_BYTES_MAX, 1000))
        got = []
        for start in range(0, len(stream), chunk):
            server.receive_data(stream[start:start + chunk])
            while (event := server.next_event()) is not connection.NEED_DATA:
                got.append(event)
        assert got == samples
    server.receive_data(messages.encode_message(messages.Ping(9)) + b"\x00\x00")
    assert server.next_event() == messages.Ping(9)
    assert server.next_event() is connection.NEED_DATA  # trailing bytes stay buffered
    assert server.buffered_bytes == 2
    server.receive_data(b"")
    with pytest.raises(codes.RemoteProtocolError):  # EOF inside a frame
        server.next_event()


def test_protocol_garbage_raises_only_remote_protocol_errors():
    rng = random.Random(5)
    valid = [messages.encode_message(m) for m in _sample_messages()]
    for _ in range(1500):
        server = connection.Connection(messages.Role.SERVER)
        server.receive_data(messages.encode_message(messages.Hello(0, 1, b"t")))
        server.next_event()
        server.send(messages.HelloOk(0, 1, 1 << 20, 1000))
        data = bytearray(rng.choice(valid))
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        server.receive_data(bytes(data) + bytes(rng.randrange(256) for _ in range(5)))
        try:
            for _ in range(5):
                if server.next_event() is connection.NEED_DATA:
                    break
        except codes.RemoteProtocolError:
            with pytest.raises(codes.RemoteProtocolError):  # sticky
                server.next_event()


def test_protocol_state_rules():
    client = connection.Connection(messages.Role.CLIENT)
    with pytest.raises(codes.LocalProtocolError):
        client.send(messages.Ping(1))  # nothing before HELLO
    with pytest.raises(TypeError):
        codes.ProtocolError("abstract")
    assert isinstance(codes.RemoteProtocolError("x"), streamlog.StreamLogError)
    assert codes.error_code_for(streamlog.UnknownStream("s")) is codes.ErrorCode.UNKNOWN_STREAM
    assert isinstance(codes.exception_for(codes.ErrorCode.OFFSET_OUT_OF_RANGE, "m"),
                      streamlog.OffsetOutOfRange)
    assert isinstance(codes.exception_for(999, "future code"), codes.RemoteError)
    # codes are stable: renumbering one breaks every deployed client
    assert [(c.name, c.value) for c in codes.ErrorCode][:4] == [
        ("INTERNAL", 1), ("PROTOCOL_ERROR", 2), ("FRAME_TOO_LARGE", 3), ("UNAUTHENTICATED", 4)]


def test_encode_slice_matches_the_rows():
    values = [bytes([i]) * i for i in range(1, 30)]
    keys = [None if i % 4 == 0 else b"k%d" % i for i in range(29)]
    headers = [(("n", b"%d" % i),) if i % 3 == 0 else () for i in range(29)]
    payload, flags = columns.encode_records(list(range(29)), keys, values,
                                            [i % 2 for i in range(29)], headers)
    decoded = columns.decode_records(payload, flags, 29)
    for lo, hi in ((0, 29), (3, 4), (5, 17), (28, 29)):
        part, part_flags = columns.encode_slice(decoded, lo, hi)
        got = columns.columns_to_lists(columns.decode_records(part, part_flags, hi - lo))
        assert got == (list(range(lo, hi)), keys[lo:hi], values[lo:hi],
                       [i % 2 for i in range(lo, hi)], headers[lo:hi])


def test_a_transaction_left_open_is_aborted_after_the_timeout(tmp_path):
    """A client that appended under a transaction and died must not stall
    read_committed readers until the daemon restarts (Kafka's transaction.timeout.ms)."""
    log = streamlog.open_log(tmp_path / "log")
    try:
        log.create_stream("s")
        server = LogServer(log, ServerConfig(token=b"t", txn_timeout_s=60.0))
        log.append_batch_sync("s", [b"before"])
        orphan, live = log.new_txn_id(), log.new_txn_id()
        log.append_batch_sync("s", [b"orphan"], txn_id=orphan)
        log.append_batch_sync("s", [b"after"])
        assert server.abort_stale_txns(now=1000.0) == []  # first seen now
        log.append_batch_sync("s", [b"live"], txn_id=live)
        assert [r.value for r in log.reader("s")] == [b"before"]  # stalled behind it
        assert server.abort_stale_txns(now=1059.0) == []  # not yet 60 s
        assert server.abort_stale_txns(now=1061.0) == [("s", 0, orphan)]
        assert log.txn_state("s", 0, orphan) is streamlog.txn.TxnState.ABORTED
        assert log.txn_state("s", 0, live) is streamlog.txn.TxnState.OPEN  # seen later
        assert [r.value for r in log.reader("s")] == [b"before", b"after"]
        assert server.metrics.counters["txn_timeouts"] == 1
        server._executor.shutdown()
    finally:
        log.close()


def test_append_columns_over_the_wire_lands_as_locally(remote, daemon):
    """Arrow columns go out encoded as they are, and the daemon hands them to its
    writer as they arrived; the log then holds what a local append_columns writes."""
    import pyarrow as pa
    remote.create_stream("cols", partitions=1)
    remote.create_stream("keyed", partitions=3)
    values = [b"v%d" % i for i in range(5000)]
    keys = [b"k%d" % (i % 11) if i % 4 else None for i in range(5000)]
    stamps = [1_700_000_000_000_000 + i for i in range(5000)]
    table = pa.table({"value": pa.array(values, pa.binary()), "key": pa.array(keys, pa.binary()),
                      "timestamp": pa.array(stamps, pa.int64())})
    result = remote.append_columns_sync("cols", table)
    assert result.records == 5000 and result.ranges == {0: (0, 4999)}
    got = [(r.key, r.value, r.timestamp_us) for r in remote.reader("cols", 0)]
    assert got == list(zip(keys, values, stamps))
    # Keys over several partitions: the daemon's log picks them by the same stable hash.
    remote.append_columns_sync("keyed", table.slice(0, 100).drop_columns(["timestamp"]))
    landed = {r.value: r for n in range(3) for r in remote.reader("keyed", n)}
    assert set(landed) == set(values[:100])
    for value, key in zip(values[:100], keys[:100]):
        if key is not None:
            assert landed[value].partition == streamlog.partition_for_key(key, 3)
        assert landed[value].timestamp_us > stamps[-1]  # the daemon's append time
    with pytest.raises(streamlog.InvalidAppend, match="value"):
        remote.append_columns_sync("cols", {"key": pa.array([b"k"])})

    async def columns_async():
        return await remote.append_columns("cols", {"value": pa.array([b"a", b"b"])},
                                           partition=0)
    assert asyncio.run(columns_async()).ranges == {0: (5000, 5001)}


def test_tombstones_through_serve_both_ways(tmp_path):
    """None values and None header values through `streamlog serve` and its client:
    single and batched appends (the daemon's direct path and, with the partition
    left to the log, append_batch's), Arrow columns and a Producer; read back as
    records, Arrow, a slice from mid-batch and a follower, then from the files."""
    import pyarrow as pa
    path = str(tmp_path / "tombstones")
    daemon = DaemonProcess(path)
    expected = [None, b"", None, b"v", None, b"", b"c", None, None]
    try:
        with open_remote(daemon.url, TOKEN) as log:
            log.create_stream("t", partitions=1)
            log.create_stream("routed", partitions=2)
            follower = iter(log.reader("t", 0, follow=True))
            log.append_sync("t", None, headers={"h": None, "g": b""})
            log.append_batch_sync("t", [b"", None, b"v"], keys=[None, b"k", None])
            log.append_columns_sync("t", {"value": pa.array([None, b"", b"c"])})
            with log.producer("t", linger_ms=0) as producer:
                handles = [producer.send(None), producer.send(None, headers={"x": None})]
                producer.flush(timeout=30)
            assert [h.result(0) for h in handles] == [(0, 7), (0, 8)]
            log.append_batch_sync("routed", [None, b"", None, b""],
                                  headers=[None, [("a", None)], None, None])
            records = list(log.reader("t", 0))
            assert [r.value for r in records] == expected
            assert [r.headers for r in records][0] == (("h", None), ("g", b""))
            assert records[8].headers == (("x", None),)
            assert [next(follower).value for _ in expected] == expected
            batches = list(log.reader("t", 0).arrow(include_headers=True))
            table = pa.Table.from_batches(batches)
            assert table.column("value").to_pylist() == expected
            assert table.column("headers").to_pylist()[0] == [
                {"key": "h", "value": None}, {"key": "g", "value": b""}]
            assert [r.value for r in log.reader("t", 0, from_offset=2, to_offset=6)] == \
                expected[2:6]
            routed = [r for n in range(2) for r in log.reader("routed", n)]
            assert sorted((r.value is None, r.headers) for r in routed) == [
                (False, ()), (False, (("a", None),)), (True, ()), (True, ())]
    finally:
        daemon.proc.send_signal(signal.SIGTERM)
        daemon.proc.wait(30)
        daemon.kill()
    with streamlog.open_log(path, readonly=True) as local:
        assert [r.value for r in local.reader("t", 0)] == expected
