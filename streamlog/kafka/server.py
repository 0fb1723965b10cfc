"""The Kafka listener of `streamlog serve --kafka-port`: the thin asyncio shell.

Strategy: one task per connection reads bytes into a `FrameReader` (codec.py), parses
each request, answers it and writes the response, one request at a time in the order
they came (Kafka requires responses in request order on a connection). The answers
come from `Broker` (broker.py, run on a thread pool: appends fsync, reads touch
segments; its transaction coordinator, transactions.py, too), from the group
`Coordinator` (groups.py, on the event loop: JoinGroup and SyncGroup wait for the other
members) and from admin.py (the admin APIs: what touches the group coordinator on the
event loop, what changes the log on the thread pool). The shell owns only what is about
sockets and time: authentication state, the long-poll wait of Fetch, the idle timeout,
the groups' timer and the transactions' timeouts.

Authentication (DESIGN 9): with auth "plain" a connection may send only ApiVersions,
SaslHandshake and SaslAuthenticate until it has authenticated with SASL/PLAIN as user
`streamlog` with the daemon's token as password (both SaslAuthenticate and the older
raw token after SaslHandshake v0 are understood). A wrong password gets
SASL_AUTHENTICATION_FAILED, then the connection ends. Frames are bounded: 64 KiB until
authenticated, then `frame_bytes_max`; a larger size field, garbage, or a request out
of turn ends the connection with a logged reason. A request for an API or version not
served gets UNSUPPORTED_VERSION where Kafka's schema allows an answer.

TLS: when the daemon serves TLS, so does this port (clients use SASL_SSL).

Shutdown (`close`, the daemon's drain): stop listening; a connection waiting for
something without effects (its next request, a Fetch's long poll, a group's rebalance)
is cancelled at once; one answering a request that has effects (a Produce appending, an
OffsetCommit) finishes it, writes the answer and ends before it reads or starts
another: a client is never left without the answer to an append that was made durable
(it would retry it, and only the producer sequence rules keep that from duplicating).
Requests already received but not started are dropped with the connection; their
clients send them again. Connections still there after `drain_timeout_s` (a peer that
does not read its answers) are cancelled. Then the broker writes its producer
snapshots. So close returns within drain_timeout_s, plus a second, plus the snapshots.

Cancellation is the whole mechanism, so nothing here may swallow one: reads are bounded
by `asyncio.timeout`, not `asyncio.wait_for`, which on Python 3.11 returns the result of
a read that completes as the cancel arrives and drops the cancel (CPython gh-86296): the
connection then went on serving its client while close waited for it forever.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import hmac
import logging
import ssl
import time

from . import admin, codec
from .broker import NODE_ID, Broker, Endpoint
from .codec import Request, build, encode_response, encode_response_parts, response_schema
from .errors import ErrorCode, KafkaProtocolError, UnsupportedRequest
from .groups import Coordinator
from .transactions import TxnError

_LOG = logging.getLogger("streamlog.kafka")
SASL_USER = "streamlog"
UNAUTHENTICATED_FRAME_BYTES_MAX = 64 * 1024
_READ_CHUNK_BYTES = 256 * 1024
_TICK_S = 0.2


@dataclasses.dataclass(frozen=True)
class KafkaConfig:
    token: bytes
    host: str = "127.0.0.1"
    port: int = 9092
    auth: str = "plain"  # or "none"
    tls: ssl.SSLContext | None = None
    frame_bytes_max: int = codec.FRAME_BYTES_MAX
    connections_max: int = 256
    idle_timeout_s: float = 600.0  # Kafka's connections.max.idle.ms
    threads_max: int = 32
    advertised_host: str | None = None  # what Metadata names; default: the address used
    drain_timeout_s: float = 30.0  # close() cuts connections still answering after it


class _Closing(Exception):
    """End this connection (the reason was logged)."""


@dataclasses.dataclass
class _Session:
    peer: str
    endpoint: Endpoint
    authenticated: bool
    raw_sasl_next: bool = False  # SaslHandshake v0: the next frame is a bare token
    # Awaiting only what close() may cancel (see the module docstring).
    interruptible: bool = False


class KafkaServer:
    """`await KafkaServer.bind(config)` listens; `start(log)` serves `log`;
    `await close()` stops listening, drains and ends every connection (see the module
    docstring). Event-loop thread only."""

    def __init__(self, config: KafkaConfig) -> None:
        if config.auth not in ("plain", "none"):
            raise ValueError(f"auth must be 'plain' or 'none' (got {config.auth!r})")
        self.config = config
        self.listener: asyncio.AbstractServer | None = None
        self.broker: Broker | None = None
        self.coordinator = Coordinator()
        self._ready = asyncio.Event()
        self._connections: dict[asyncio.Task, _Session] = {}
        self._stopping = False
        self._pool = concurrent.futures.ThreadPoolExecutor(
            config.threads_max, thread_name_prefix="streamlog-kafka")
        self._ticker: asyncio.Task | None = None

    @classmethod
    async def bind(cls, config: KafkaConfig) -> "KafkaServer":
        server = cls(config)
        server.listener = await asyncio.start_server(
            server._accept, config.host, config.port, ssl=config.tls,
            limit=_READ_CHUNK_BYTES)
        return server

    @property
    def port(self) -> int:
        return self.listener.sockets[0].getsockname()[1]

    async def start(self, log) -> None:
        """Serve `log` (reads the committed offsets first)."""
        self.broker = await self._run(Broker, log)
        self._ticker = asyncio.create_task(self._tick())
        self._ready.set()

    async def close(self) -> None:
        """Drain and stop (see the module docstring); bounded by drain_timeout_s + 1 s
        and the broker's snapshots. Once only."""
        if self._stopping:
            return
        self._stopping = True
        started = time.monotonic()
        if self.listener is not None:
            self.listener.close()
        for task, session in list(self._connections.items()):
            if session.interruptible:
                task.cancel()
        tasks = list(self._connections)
        _LOG.info("kafka_draining", extra={"fields": {"connections": len(tasks)}})
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=self.config.drain_timeout_s)
            if pending:
                _LOG.warning("kafka_drain_timed_out", extra={"fields": {
                    "connections": len(pending), "seconds": self.config.drain_timeout_s}})
                for task in pending:
                    task.cancel()
                await asyncio.wait(pending, timeout=1.0)
        if self._ticker is not None:
            self._ticker.cancel()
        if self.broker is not None:
            try:
                await self._run(self.broker.close)
            except Exception:  # noqa: BLE001 - the log closes anyway; a load reads more
                _LOG.exception("kafka_broker_close_failed")
        # Not waited for: after a timeout a thread may still be in an append, which
        # the log's close completes.
        self._pool.shutdown(wait=False, cancel_futures=True)
        _LOG.info("kafka_stopped", extra={"fields": {
            "seconds": round(time.monotonic() - started, 3)}})

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(_TICK_S)
            self.coordinator.tick()
            if self.broker is not None and len(self.broker.fetches):
                self.broker.fetches.expire()
            if self.broker is not None and self.broker.transactions.has_open():
                await self._run(self.broker.transactions.expire)

    def _run(self, function, *args):
        return asyncio.get_running_loop().run_in_executor(self._pool, function, *args)

    # -- a connection ----------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        task = asyncio.current_task()
        peer = writer.get_extra_info("peername")
        peer_text = f"{peer[0]}:{peer[1]}" if peer else "?"
        if self._stopping or len(self._connections) >= self.config.connections_max:
            _LOG.warning("kafka_connection_refused", extra={"fields": {
                "peer": peer_text, "reason": "shutting down" if self._stopping
                else "too many connections"}})
            writer.close()
            return
        local = writer.get_extra_info("sockname")
        endpoint = Endpoint(self.config.advertised_host or local[0], local[1])
        session = _Session(peer_text, endpoint, self.config.auth == "none")
        self._connections[task] = session
        try:
            with self._interruptible(session):
                await self._ready.wait()
            await self._serve(reader, writer, session)
        except (_Closing, ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        except asyncio.CancelledError:
            pass
        except Exception:
            _LOG.exception("kafka_connection_failed", extra={"fields": {"peer": peer_text}})
        finally:
            self._connections.pop(task, None)
            writer.close()

    @contextlib.contextmanager
    def _interruptible(self, session: _Session):
        """Around an await that close() may cancel: one with no effect a client is owed
        an answer for. Raises _Closing instead once close() has begun, so a connection
        that finished an answer ends there."""
        if self._stopping:
            raise _Closing("shutting down")
        session.interruptible = True
        try:
            yield
        finally:
            session.interruptible = False

    async def _serve(self, reader, writer, session: _Session) -> None:
        frames = codec.FrameReader(self.config.frame_bytes_max if session.authenticated
                                   else UNAUTHENTICATED_FRAME_BYTES_MAX)
        while True:
            with self._interruptible(session):
                data = await self._read(reader, session)
            if not data:
                return
            frames.receive(data)
            while True:
                try:
                    frame = frames.next_frame()
                except KafkaProtocolError as error:
                    self._closing(session, str(error))
                if frame is None:
                    break
                if self._stopping:  # received, not started: the client sends it again
                    raise _Closing("shutting down")
                try:
                    out = await self._answer(frame, session)
                except _AuthFailed as failed:
                    writer.write(failed.response)
                    await writer.drain()
                    self._closing(session, str(failed))
                if out:
                    for part in out:  # (a Fetch's records: as they are, uncopied)
                        writer.write(part)
                    await writer.drain()
                if session.authenticated:
                    frames.frame_bytes_max = self.config.frame_bytes_max

    async def _read(self, reader, session: _Session) -> bytes:
        """The next bytes from the peer (b"" at its end); silence for idle_timeout_s
        ends the connection. asyncio.timeout, not wait_for: see the module docstring."""
        try:
            async with asyncio.timeout(self.config.idle_timeout_s):
                return await reader.read(_READ_CHUNK_BYTES)
        except TimeoutError:
            self._closing(session, "idle")

    def _closing(self, session: _Session, reason: str):
        _LOG.warning("kafka_connection_closed", extra={"fields": {
            "peer": session.peer, "reason": reason}})
        raise _Closing(reason)

    async def _answer(self, frame: bytes, session: _Session) -> list | None:
        """The response's parts (codec.encode_response_parts), None for none."""
        if session.raw_sasl_next:
            session.raw_sasl_next = False
            code, message = self._check_plain(frame)
            if code != ErrorCode.none:
                self._closing(session, message)
            session.authenticated = True
            return [b"\0\0\0\0"]
        try:
            request = codec.parse_request(frame)
        except UnsupportedRequest as error:
            _LOG.warning("kafka_unsupported_request", extra={"fields": {
                "peer": session.peer, "api_key": error.api_key,
                "api_version": error.api_version, "reason": str(error)}})
            if error.response is None:
                self._closing(session, str(error))
            return [error.response]
        except KafkaProtocolError as error:
            self._closing(session, str(error))
        if not session.authenticated and request.api_key not in (
                codec.API_VERSIONS, codec.SASL_HANDSHAKE, codec.SASL_AUTHENTICATE):
            self._closing(session, f"{request.name} before SASL authentication")
        handler = getattr(self, "_on_" + request.name)
        response = await handler(request, session)
        return None if response is None else encode_response_parts(request, response)

    # -- handlers: connection-level --------------------------------------------------

    async def _on_ApiVersions(self, request: Request, session: _Session):
        return build(response_schema(request), error_code=ErrorCode.none,
                     api_keys=codec.api_versions_list())

    async def _on_SaslHandshake(self, request: Request, session: _Session):
        schema = response_schema(request)
        if self.config.auth == "none":
            return build(schema, error_code=ErrorCode.illegal_sasl_state, mechanisms=[])
        if request.body.mechanism != "PLAIN":
            return build(schema, error_code=ErrorCode.unsupported_sasl_mechanism,
                         mechanisms=["PLAIN"])
        session.raw_sasl_next = request.api_version == 0
        return build(schema, error_code=ErrorCode.none, mechanisms=["PLAIN"])

    async def _on_SaslAuthenticate(self, request: Request, session: _Session):
        schema = response_schema(request)
        if self.config.auth == "none" or session.authenticated:
            return build(schema, error_code=ErrorCode.illegal_sasl_state,
                         error_message="already authenticated" if session.authenticated
                         else "SASL is off on this listener", auth_bytes=b"")
        code, message = self._check_plain(request.body.auth_bytes)
        if code != ErrorCode.none:
            # answer, then end the connection (as Kafka does)
            raise _AuthFailed(encode_response(request, build(
                schema, error_code=code, error_message=message, auth_bytes=b"")))
        session.authenticated = True
        return build(schema, error_code=ErrorCode.none, error_message=None, auth_bytes=b"",
                     session_lifetime=0)

    def _check_plain(self, token: bytes) -> tuple[ErrorCode, str]:
        parts = bytes(token).split(b"\0")
        if len(parts) != 3:
            return ErrorCode.sasl_authentication_failed, "a malformed PLAIN token"
        authzid, user, password = parts
        good_user = user == SASL_USER.encode() and authzid in (b"", SASL_USER.encode())
        good_password = hmac.compare_digest(password, self.config.token)
        if not (good_user and good_password):
            _LOG.warning("kafka_auth_failed", extra={"fields": {"user": user.decode(
                errors="replace")}})
            return (ErrorCode.sasl_authentication_failed,
                    "Authentication failed: invalid username or password")
        return ErrorCode.none, ""

    async def _on_Metadata(self, request: Request, session: _Session):
        return await self._run(self.broker.handle_metadata, request, session.endpoint)

    async def _on_FindCoordinator(self, request: Request, session: _Session):
        return build(response_schema(request), error_code=ErrorCode.none, error_message=None,
                     node_id=NODE_ID, host=session.endpoint.host, port=session.endpoint.port)

    # -- handlers: data --------------------------------------------------------------

    async def _on_Produce(self, request: Request, session: _Session):
        return await self._run(self.broker.handle_produce, request)

    async def _on_InitProducerId(self, request: Request, session: _Session):
        return await self._run(self.broker.handle_init_producer_id, request)

    async def _on_CreateTopics(self, request: Request, session: _Session):
        return await self._run(self.broker.handle_create_topics, request)

    async def _on_ListOffsets(self, request: Request, session: _Session):
        return await self._run(self.broker.handle_list_offsets, request)

    async def _on_Fetch(self, request: Request, session: _Session):
        """Long poll: answer once min_bytes are there or max_wait has passed."""
        body = request.body
        deadline = time.monotonic() + max(body.max_wait.total_seconds(), 0)
        while True:
            response, size, waits = await self._run(self.broker.fetch_once, request)
            remaining = deadline - time.monotonic()
            if size >= max(body.min_bytes, 1) or remaining <= 0 or not waits:
                return response
            tasks = [asyncio.ensure_future(self.broker.log.wait_for_async(
                topic, partition, end, remaining)) for topic, partition, end in waits]
            try:
                with self._interruptible(session):
                    await asyncio.wait(tasks, timeout=remaining,
                                       return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    task.cancel()
                for task in tasks:  # (what a wait raised, the next pass answers)
                    if task.done() and not task.cancelled():
                        task.exception()

    # -- handlers: groups ------------------------------------------------------------

    async def _on_JoinGroup(self, request: Request, session: _Session):
        body = request.body
        session_s = body.session_timeout.total_seconds()
        rebalance = getattr(body, "rebalance_timeout", None)
        with self._interruptible(session):  # a rebalance wait: nothing durable
            result = await self.coordinator.join(
                body.group_id, body.member_id,
                group_instance_id=getattr(body, "group_instance_id", None),
                client_id=request.client_id or "", session_timeout_s=session_s,
                rebalance_timeout_s=rebalance.total_seconds() if rebalance else session_s,
                protocol_type=body.protocol_type,
                protocols=[(p.name, p.metadata) for p in body.protocols],
                client_host="/" + session.peer.rsplit(":", 1)[0])
        return build(response_schema(request), **dataclasses.asdict(result))

    async def _on_SyncGroup(self, request: Request, session: _Session):
        body = request.body
        with self._interruptible(session):  # waits for the leader: nothing durable
            code, assignment = await self.coordinator.sync(
                body.group_id, body.generation_id, body.member_id,
                {a.member_id: a.assignment for a in body.assignments})
        group = self.coordinator.groups.get(body.group_id)
        return build(response_schema(request), error_code=code, assignment=assignment,
                     protocol_type=group.protocol_type if group else None,
                     protocol_name=group.protocol_name if group else None)

    async def _on_Heartbeat(self, request: Request, session: _Session):
        body = request.body
        return build(response_schema(request), error_code=self.coordinator.heartbeat(
            body.group_id, body.generation_id, body.member_id))

    async def _on_LeaveGroup(self, request: Request, session: _Session):
        body = request.body
        if request.api_version < 3:
            codes = self.coordinator.leave(body.group_id, [body.member_id])
            return build(response_schema(request), error_code=codes[body.member_id])
        codes = self.coordinator.leave(body.group_id, [m.member_id for m in body.members])
        return build(response_schema(request), error_code=ErrorCode.none, members=[
            {"member_id": m.member_id, "group_instance_id": m.group_instance_id,
             "error_code": codes[m.member_id]} for m in body.members])

    async def _on_OffsetCommit(self, request: Request, session: _Session):
        body = request.body
        generation = getattr(body, "generation_id_or_member_epoch",
                             getattr(body, "generation_id", -1))
        code = self.coordinator.check_commit(body.group_id, generation, body.member_id)
        commits = [(t.name, p.partition_index, p.committed_offset, p.committed_metadata)
                   for t in body.topics for p in t.partitions]
        if code == ErrorCode.none:
            codes = await self._run(self.broker.commit_offsets, body.group_id, commits)
        else:
            codes = code
        return _commit_answer(request, codes)

    async def _on_OffsetFetch(self, request: Request, session: _Session):
        body = request.body
        stored = self.broker.committed(body.group_id)
        if body.topics is None:
            asked: dict[str, list[int]] = {}
            for topic, partition in sorted(stored):
                asked.setdefault(topic, []).append(partition)
        else:
            asked = {t.name: list(t.partition_indexes) for t in body.topics}
        topics = []
        for name, partitions in asked.items():
            entries = []
            for partition in partitions:
                offset, metadata = stored.get((name, partition), (-1, ""))
                entries.append({"partition_index": partition, "committed_offset": offset,
                                "committed_leader_epoch": -1, "metadata": metadata,
                                "error_code": ErrorCode.none})
            topics.append({"name": name, "partitions": entries})
        return build(response_schema(request), topics=topics, error_code=ErrorCode.none)


    # -- handlers: admin (admin.py) --------------------------------------------------

    async def _on_ListGroups(self, request: Request, session: _Session):
        return admin.list_groups_answer(request, self.coordinator, self.broker.offsets)

    async def _on_DescribeGroups(self, request: Request, session: _Session):
        return admin.describe_groups_answer(request, self.coordinator, self.broker.offsets)

    async def _on_DeleteGroups(self, request: Request, session: _Session):
        codes = admin.delete_groups_plan(request, self.coordinator, self.broker.offsets)
        return await self._run(admin.delete_groups_finish, request, codes,
                               self.broker.offsets)

    async def _on_OffsetDelete(self, request: Request, session: _Session):
        refused = admin.offset_delete_check(request, self.coordinator)
        return await self._run(admin.offset_delete_finish, request, refused,
                               self.broker.offsets)

    async def _on_DescribeConfigs(self, request: Request, session: _Session):
        broker = self.broker
        return admin.describe_configs_answer(
            request, broker, default_partitions=broker.default_partitions,
            auto_create=broker.auto_create_topics,
            transaction_timeout_max_ms=broker.transaction_timeout_max_ms)

    async def _on_DescribeCluster(self, request: Request, session: _Session):
        return admin.describe_cluster_answer(request, session.endpoint)

    async def _on_DeleteTopics(self, request: Request, session: _Session):
        return await self._run(admin.delete_topics_answer, request, self.broker)

    async def _on_DeleteRecords(self, request: Request, session: _Session):
        return await self._run(admin.delete_records_answer, request, self.broker)

    async def _on_CreatePartitions(self, request: Request, session: _Session):
        return await self._run(admin.create_partitions_answer, request, self.broker)


    # -- handlers: transactions (transactions.py) ------------------------------------

    async def _on_AddPartitionsToTxn(self, request: Request, session: _Session):
        body = request.body
        places = [(t.name, p) for t in body.v3_and_below_topics for p in t.partitions]
        codes = await self._run(_txn_call, self.broker.transactions.add_partitions,
                                body.v3_and_below_transactional_id,
                                body.v3_and_below_producer_id,
                                body.v3_and_below_producer_epoch, places,
                                self.broker.partition_count)
        if isinstance(codes, ErrorCode):
            codes = dict.fromkeys(places, codes)
        return build(response_schema(request), results_by_topic_v3_and_below=[
            {"name": t.name, "results_by_partition": [
                {"partition_index": p, "partition_error_code": codes[(t.name, p)]}
                for p in t.partitions]} for t in body.v3_and_below_topics])

    async def _on_AddOffsetsToTxn(self, request: Request, session: _Session):
        body = request.body
        code = await self._run(_txn_call, self.broker.transactions.add_offsets,
                               body.transactional_id, body.producer_id, body.producer_epoch,
                               body.group_id)
        return build(response_schema(request), error_code=code or ErrorCode.none)

    async def _on_TxnOffsetCommit(self, request: Request, session: _Session):
        body = request.body
        generation = getattr(body, "generation_id", -1)
        commits = [(t.name, p.partition_index, p.committed_offset, p.committed_metadata)
                   for t in body.topics for p in t.partitions]
        codes = ErrorCode.none
        if generation >= 0:  # a member of the group (KIP-447): its generation checked
            codes = self.coordinator.check_commit(body.group_id, generation,
                                                  getattr(body, "member_id", ""))
        if codes == ErrorCode.none:
            codes = await self._run(_txn_call, self.broker.transactions.commit_offsets,
                                    body.transactional_id, body.producer_id,
                                    body.producer_epoch, body.group_id, commits,
                                    self.broker.partition_count)
        return _commit_answer(request, codes)

    async def _on_EndTxn(self, request: Request, session: _Session):
        body = request.body
        code = await self._run(_txn_call, self.broker.transactions.end,
                               body.transactional_id, body.producer_id, body.producer_epoch,
                               body.committed)
        return build(response_schema(request), error_code=code or ErrorCode.none)


def _commit_answer(request: Request, codes):
    """OffsetCommit's and TxnOffsetCommit's answer: each asked partition with its code
    from `codes` ({(topic, partition): code}, or one code for all)."""
    def code_of(topic: str, partition: int):
        return codes if isinstance(codes, ErrorCode) else codes[(topic, partition)]
    return build(response_schema(request), topics=[
        {"name": t.name, "partitions": [
            {"partition_index": p.partition_index,
             "error_code": code_of(t.name, p.partition_index)} for p in t.partitions]}
        for t in request.body.topics])


def _txn_call(method, *args):
    """A coordinator call: its result, or its refusal's ErrorCode."""
    try:
        return method(*args)
    except TxnError as error:
        _LOG.warning("kafka_txn_refused", extra={"fields": {
            "call": method.__name__, "error": str(error)}})
        return error.code


class _AuthFailed(_Closing):
    """A failed SaslAuthenticate: send `response`, then end the connection."""

    def __init__(self, response: bytes) -> None:
        super().__init__("SASL authentication failed")
        self.response = response
