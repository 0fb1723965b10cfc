"""Consumer groups: Kafka's classic group protocol (JoinGroup, SyncGroup, Heartbeat,
LeaveGroup), with this daemon as every group's coordinator.

Strategy: a group is a small state machine, as in Kafka's GroupCoordinator:

    EMPTY --join--> PREPARING --every member joined, or the rebalance timeout-->
    COMPLETING --the leader's SyncGroup--> STABLE --join, leave, expiry--> PREPARING

A JoinGroup waits (an asyncio future) until the rebalance completes: when every known
member has (re)joined, or when the largest rebalance timeout has passed (members that
did not rejoin are dropped). The first member is the leader; it gets every member's
subscription and sends the assignment with its SyncGroup, which the other members wait
for. A member that sends no heartbeat for its session timeout is dropped and the group
rebalances; the others learn it from REBALANCE_IN_PROGRESS on their next heartbeat and
join again. Time comes from `clock` (seconds, monotonic) and `tick()` is called by the
shell every few hundred milliseconds to apply timeouts, so tests can drive it without
sleeping.

Membership is in memory (a daemon restart ends every generation; members rejoin, as
after a coordinator move in Kafka); committed offsets are durable (broker.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import time
import uuid

from .errors import ErrorCode


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING = "PreparingRebalance"
    COMPLETING = "CompletingRebalance"
    STABLE = "Stable"


@dataclasses.dataclass
class Member:
    member_id: str
    group_instance_id: str | None
    session_timeout_s: float
    rebalance_timeout_s: float
    protocols: list[tuple[str, bytes]]
    last_seen: float
    join: asyncio.Future | None = None
    sync: asyncio.Future | None = None
    assignment: bytes = b""
    client_id: str = ""
    client_host: str = ""


@dataclasses.dataclass
class JoinResult:
    error_code: ErrorCode
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = ""
    members: list[dict] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str | None = None
    members: dict[str, Member] = dataclasses.field(default_factory=dict)
    rebalance_deadline: float | None = None


class Coordinator:
    """Every consumer group of the daemon."""

    def __init__(self, clock=time.monotonic) -> None:
        self.clock = clock
        self.groups: dict[str, Group] = {}

    # -- JoinGroup -------------------------------------------------------------------

    async def join(self, group_id: str, member_id: str, *, group_instance_id: str | None,
                   client_id: str, session_timeout_s: float, rebalance_timeout_s: float,
                   protocol_type: str, protocols: list[tuple[str, bytes]],
                   client_host: str = "") -> JoinResult:
        if not group_id:
            return JoinResult(ErrorCode.invalid_group_id, member_id=member_id)
        if not 0.1 <= session_timeout_s <= 1800:
            return JoinResult(ErrorCode.invalid_session_timeout, member_id=member_id)
        group = self.groups.setdefault(group_id, Group(group_id))
        if group.members and (protocol_type != group.protocol_type or not _common(
                group, protocols)):
            return JoinResult(ErrorCode.inconsistent_group_protocol, member_id=member_id)
        if member_id and member_id not in group.members:
            return JoinResult(ErrorCode.unknown_member_id, member_id=member_id)
        if not member_id:
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
        member = group.members.get(member_id)
        now = self.clock()
        if member is None:
            member = group.members[member_id] = Member(
                member_id, group_instance_id, session_timeout_s, rebalance_timeout_s,
                list(protocols), now)
        member.protocols, member.last_seen = list(protocols), now
        member.client_id, member.client_host = client_id, client_host
        member.session_timeout_s, member.rebalance_timeout_s = (session_timeout_s,
                                                                rebalance_timeout_s)
        group.protocol_type = protocol_type
        if member.join is not None and not member.join.done():
            member.join.set_result(JoinResult(ErrorCode.unknown_member_id,
                                              member_id=member_id))
        member.join = asyncio.get_running_loop().create_future()
        waiter = member.join
        self._prepare_rebalance(group)
        self._maybe_complete_join(group)
        return await waiter

    def _prepare_rebalance(self, group: Group) -> None:
        if group.state is GroupState.PREPARING:
            return
        for member in group.members.values():  # a sync in progress is over
            _resolve(member.sync, (ErrorCode.rebalance_in_progress, b""))
            member.sync = None
        group.state = GroupState.PREPARING
        group.rebalance_deadline = self.clock() + max(
            (m.rebalance_timeout_s for m in group.members.values()), default=0)

    def _maybe_complete_join(self, group: Group, *, deadline_passed: bool = False) -> None:
        if group.state is not GroupState.PREPARING:
            return
        pending = [m for m in group.members.values() if m.join is not None
                   and not m.join.done()]
        if len(pending) < len(group.members) and not deadline_passed:
            return
        for member in [m for m in group.members.values() if m not in pending]:
            del group.members[member.member_id]  # did not rejoin in time
        group.generation += 1
        group.rebalance_deadline = None
        if not group.members:
            group.state, group.leader, group.protocol_name = GroupState.EMPTY, None, None
            return
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.protocol_name = _choose_protocol(group)
        group.state = GroupState.COMPLETING
        everyone = [{"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                     "metadata": dict(m.protocols).get(group.protocol_name, b"")}
                    for m in group.members.values()]
        for member in group.members.values():
            _resolve(member.join, JoinResult(
                ErrorCode.none, group.generation, group.protocol_type, group.protocol_name,
                group.leader, member.member_id,
                everyone if member.member_id == group.leader else []))
            member.join, member.last_seen = None, self.clock()

    # -- SyncGroup, Heartbeat, LeaveGroup --------------------------------------------

    async def sync(self, group_id: str, generation: int, member_id: str,
                   assignments: dict[str, bytes]) -> tuple[ErrorCode, bytes]:
        group, member, code = self._member(group_id, generation, member_id)
        if code != ErrorCode.none:
            return code, b""
        if group.state is GroupState.PREPARING:
            return ErrorCode.rebalance_in_progress, b""
        if group.state is GroupState.STABLE:
            return ErrorCode.none, member.assignment
        if member_id == group.leader:
            for other in group.members.values():
                other.assignment = assignments.get(other.member_id, b"")
                _resolve(other.sync, (ErrorCode.none, other.assignment))
                other.sync = None
            group.state = GroupState.STABLE
            return ErrorCode.none, member.assignment
        member.sync = asyncio.get_running_loop().create_future()
        return await member.sync

    def heartbeat(self, group_id: str, generation: int, member_id: str) -> ErrorCode:
        group, member, code = self._member(group_id, generation, member_id)
        if code != ErrorCode.none:
            return code
        if group.state is GroupState.PREPARING:
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def leave(self, group_id: str, member_ids: list[str]) -> dict[str, ErrorCode]:
        group = self.groups.get(group_id)
        out = {}
        for member_id in member_ids:
            member = group.members.pop(member_id, None) if group else None
            if member is None:
                out[member_id] = ErrorCode.unknown_member_id
                continue
            _resolve(member.join, JoinResult(ErrorCode.unknown_member_id,
                                             member_id=member_id))
            _resolve(member.sync, (ErrorCode.unknown_member_id, b""))
            out[member_id] = ErrorCode.none
        if group is not None and any(code == ErrorCode.none for code in out.values()):
            self._members_changed(group)
        return out

    def check_commit(self, group_id: str, generation: int, member_id: str) -> ErrorCode:
        """May this member commit offsets? (generation -1: a consumer outside the group
        protocol, such as one that assigned itself partitions, or an admin tool
        resetting a group's offsets: as Kafka, only while the group has no members.)"""
        if generation < 0 and not member_id:
            group = self.groups.get(group_id)
            return ErrorCode.unknown_member_id if group and group.members else ErrorCode.none
        group, _member, code = self._member(group_id, generation, member_id)
        if code == ErrorCode.none and group.state is GroupState.PREPARING:
            return ErrorCode.rebalance_in_progress
        return code

    def _member(self, group_id: str, generation: int, member_id: str):
        group = self.groups.get(group_id)
        member = group.members.get(member_id) if group else None
        if member is None:
            return group, None, ErrorCode.unknown_member_id
        member.last_seen = self.clock()
        if generation != group.generation:
            return group, member, ErrorCode.illegal_generation
        return group, member, ErrorCode.none

    def _members_changed(self, group: Group) -> None:
        if not group.members:
            group.state, group.leader, group.protocol_name = GroupState.EMPTY, None, None
            group.generation += 1
            return
        self._prepare_rebalance(group)
        self._maybe_complete_join(group)

    # -- admin ---------------------------------------------------------------------

    def forget(self, group_id: str) -> ErrorCode:
        """DeleteGroups' step here: drop a group without members (NON_EMPTY_GROUP while
        it has some)."""
        group = self.groups.get(group_id)
        if group is not None and group.members:
            return ErrorCode.non_empty_group
        self.groups.pop(group_id, None)
        return ErrorCode.none

    # -- time ------------------------------------------------------------------------

    def tick(self) -> None:
        """Apply session and rebalance timeouts (the shell calls this periodically)."""
        now = self.clock()
        for group in list(self.groups.values()):
            expired = [m.member_id for m in group.members.values()
                       if (m.join is None or m.join.done())
                       and now - m.last_seen > m.session_timeout_s]
            for member_id in expired:
                member = group.members.pop(member_id)
                _resolve(member.sync, (ErrorCode.unknown_member_id, b""))
            if expired:
                self._members_changed(group)
            if (group.state is GroupState.PREPARING and group.rebalance_deadline is not None
                    and now >= group.rebalance_deadline):
                self._maybe_complete_join(group, deadline_passed=True)


def _resolve(future: asyncio.Future | None, value) -> None:
    if future is not None and not future.done():
        future.set_result(value)


def _common(group: Group, protocols) -> bool:
    names = {name for name, _ in protocols}
    return all(names & {name for name, _ in m.protocols} for m in group.members.values())


def _choose_protocol(group: Group) -> str | None:
    """The first protocol of the leader's list that every member supports."""
    leader = group.members[group.leader]
    for name, _metadata in leader.protocols:
        if all(name in dict(m.protocols) for m in group.members.values()):
            return name
    return None
