"""What the console asks of the daemon: the consumer groups of its Kafka listener, its
append counter, and the writes (produce, move a group's offsets, apply retention).

Strategy: the console runs in a process of its own (worker.py), reading the log through a
read-only view, so that rendering pages never takes the daemon's interpreter lock from
its appends. What only the daemon's process has goes through `Daemon`'s few calls:
`LocalDaemon` answers them in the daemon's process (and in tests, in one process with
the console); `serve_link` serves a LocalDaemon to the worker over a socket pair, one JSON
object a line each way ({"id", "op", "args"} -> {"id", "ok"} or {"id", "error":
[status, text]}), and `LinkedDaemon` is the worker's end, with the same calls. A call the
daemon refuses raises `Refused(status, text)`, which the web layer answers with that
HTTP status. Bounds: LINE_BYTES_MAX per line; one call at a time per link.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging

from ..errors import StreamLogError

LINE_BYTES_MAX = 16 << 20
_LOG = logging.getLogger("streamlog.console")


class Refused(Exception):
    """The daemon refused a call: `status` is the HTTP status to answer with."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status, self.text = status, text


def decode_assignment(data: bytes) -> list[tuple[str, list[int]]] | None:
    """A Kafka consumer's assignment (ConsumerProtocolAssignment: version, then topics
    with their partitions, then user data), or None when it is not one."""
    import struct
    try:
        at = 2
        (count,) = struct.unpack_from(">i", data, at)
        at += 4
        out = []
        for _ in range(max(count, 0)):
            (size,) = struct.unpack_from(">h", data, at)
            at += 2
            topic = data[at:at + size].decode()
            at += size
            (n,) = struct.unpack_from(">i", data, at)
            at += 4
            partitions = list(struct.unpack_from(f">{max(n, 0)}i", data, at))
            at += 4 * max(n, 0)
            out.append((topic, partitions))
        return out
    except (struct.error, UnicodeDecodeError):
        return None


def group_snapshot(kafka) -> dict[str, dict]:
    """Every consumer group the Kafka listener knows, as plain values: {name: {"state",
    "members": [{member_id, client_id, host, instance, assignment}], "offsets":
    [[topic, partition, offset, metadata]]}}. On the daemon's event loop (the
    coordinator's thread)."""
    offsets, coordinator = kafka.broker.offsets, kafka.coordinator
    out = {}
    for name in sorted(set(offsets.groups()) | set(coordinator.groups)):
        group = coordinator.groups.get(name)
        members = list(group.members.values()) if group is not None else []
        out[name] = {
            "state": group.state.value if members else "Empty",
            "members": [{"member_id": m.member_id, "client_id": m.client_id,
                         "host": m.client_host, "instance": m.group_instance_id or "",
                         "assignment": decode_assignment(m.assignment) if m.assignment
                         else []} for m in members],
            "offsets": [[topic, partition, offset, metadata] for (topic, partition),
                        (offset, metadata) in sorted(offsets.of(name).items())]}
    return out


class LocalDaemon:
    """The daemon's side, in its own process: `log` (writable), `blocking(fn, *args)`
    awaiting fn on its thread pool, its Metrics (or None) and Kafka listener (or None)."""

    def __init__(self, log, blocking, metrics=None, kafka=None) -> None:
        self.log, self.blocking, self.metrics, self.kafka = log, blocking, metrics, kafka

    async def groups(self) -> dict[str, dict] | None:
        """group_snapshot, or None without a Kafka listener."""
        if self.kafka is None or self.kafka.broker is None:
            return None
        return group_snapshot(self.kafka)

    async def appends_per_second(self) -> float | None:
        return self.metrics.appends_per_second() if self.metrics is not None else None

    async def produce(self, stream: str, value: bytes, key: bytes | None,
                      partition: int | None, headers, timestamp_us: int | None):
        if stream not in self.log.streams():
            raise Refused(400, f"no stream {stream!r}")
        try:
            position = await self.log.append(
                stream, value, key=key, partition=partition,
                headers=[(name, v) for name, v in headers] or None, timestamp_us=timestamp_us)
        except StreamLogError as error:
            raise Refused(400, str(error)) from None
        return [position.partition, position.offset]

    async def apply_retention(self) -> list[str]:
        return await self.blocking(self.log.apply_retention)

    async def reset_group(self, group: str, topic: str, to: str,
                          time_us: int | None) -> list[list]:
        """Move the group's committed offsets (of `topic`, or all) to the earliest, the
        latest or the time's offset; refused while the group has members (as Kafka's
        kafka-consumer-groups --reset-offsets is). Returns [[topic, partition,
        offset]]."""
        if self.kafka is None or self.kafka.broker is None:
            raise Refused(409, "no Kafka listener: start serve with --kafka-port")
        found = self.kafka.coordinator.groups.get(group)
        if found is not None and found.members:
            raise Refused(409, f"group {group!r} has {len(found.members)} active members: "
                               "stop its consumers first (as Kafka's kafka-consumer-groups "
                               "--reset-offsets asks)")
        if to not in ("earliest", "latest", "time") or (to == "time" and time_us is None):
            raise Refused(400, "to is earliest, latest or time (with a time)")
        commits = await self.blocking(self._commits, group, topic, to, time_us)
        if not commits:
            raise Refused(400, "the group has no committed offsets to move (of that topic)")
        await self.blocking(self.kafka.broker.commit_offsets, group, commits)
        return [[t, p, o] for t, p, o, _ in commits]

    def _commits(self, group: str, topic: str, to: str, time_us: int | None):
        log, commits = self.log, []
        for (name, partition) in sorted(self.kafka.broker.offsets.of(group)):
            if topic and name != topic:
                continue
            if to == "earliest":
                offset = log.start_offset(name, partition)
            elif to == "latest":
                offset = log.end_offset(name, partition)
            else:
                offset = log.offset_for_timestamp(name, partition, time_us)
            commits.append((name, partition, offset, None))
        return commits


_CALLS = ("groups", "appends_per_second", "produce", "apply_retention", "reset_group")


async def serve_link(daemon: LocalDaemon, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
    """Answer the worker's calls until it hangs up."""
    try:
        while True:
            line = await reader.readline()
            if not line:
                return
            answer = {}
            try:
                call = json.loads(line)
                answer["id"] = call["id"]
                if call["op"] not in _CALLS:
                    raise Refused(400, f"no call {call['op']!r}")
                args = _decode_args(call["op"], call.get("args", {}))
                answer["ok"] = await getattr(daemon, call["op"])(**args)
            except Refused as refused:
                answer["error"] = [refused.status, refused.text]
            except (ValueError, KeyError, TypeError) as error:
                answer["error"] = [400, f"a malformed call: {error}"]
            except Exception as error:  # noqa: BLE001 - the worker is told; the daemon goes on
                _LOG.warning("console_call_failed", extra={"fields": {"reason": repr(error)}})
                answer["error"] = [500, f"the daemon failed: {error}"]
            writer.write(json.dumps(answer).encode() + b"\n")
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        return
    finally:
        writer.close()


def _decode_args(op: str, args: dict) -> dict:
    if op == "produce":  # bytes travel as latin-1 text (every byte one character)
        args = dict(args)
        args["value"] = args["value"].encode("latin-1")
        args["key"] = None if args["key"] is None else args["key"].encode("latin-1")
        args["headers"] = [(name, None if v is None else v.encode("latin-1"))
                           for name, v in args["headers"]]
    return args


class LinkedDaemon:
    """The worker's end of the link: LocalDaemon's calls, answered by the daemon."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._ids = itertools.count(1)
        self._turn = asyncio.Lock()

    async def _call(self, op: str, **args):
        async with self._turn:
            number = next(self._ids)
            try:
                self._writer.write(json.dumps({"id": number, "op": op, "args": args})
                                   .encode() + b"\n")
                await self._writer.drain()
                line = await self._reader.readline()
            except (ConnectionError, asyncio.IncompleteReadError):
                line = b""
        if not line:
            raise Refused(503, "the daemon is gone (stopping)")
        answer = json.loads(line)
        if answer.get("id") != number:
            raise Refused(502, "the daemon's answer is out of order")
        if "error" in answer:
            raise Refused(*answer["error"])
        return answer["ok"]

    async def groups(self):
        return await self._call("groups")

    async def appends_per_second(self):
        return await self._call("appends_per_second")

    async def produce(self, stream, value, key, partition, headers, timestamp_us):
        return await self._call(
            "produce", stream=stream, value=value.decode("latin-1"),
            key=None if key is None else key.decode("latin-1"), partition=partition,
            headers=[(n, None if v is None else v.decode("latin-1")) for n, v in headers],
            timestamp_us=timestamp_us)

    async def apply_retention(self):
        return await self._call("apply_retention")

    async def reset_group(self, group, topic, to, time_us):
        return await self._call("reset_group", group=group, topic=topic, to=to,
                                time_us=time_us)
