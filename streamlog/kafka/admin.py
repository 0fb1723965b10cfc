"""The admin APIs Kafka tools call: groups listed, described and deleted, offsets
deleted, configs described, the cluster described, topics and records deleted,
partitions added. Answers as functions over the broker (its log and committed offsets)
and the group coordinator. No sockets.

Strategy: each `*_answer` function takes a parsed request and returns its response
entity. Those that change durable state (delete_groups' offsets, delete_topics,
delete_records, create_partitions) block on the log, so the shell (server.py) runs
their durable part on its thread pool; the group coordinator is touched only from the
event loop (the shell's `_on_*` handlers split the work that way).

Mapping:
  - A group is the coordinator's (members, in memory) or known from its committed
    offsets alone (offsets.py: after a restart, or a consumer that only commits): the
    latter is "Empty" with protocol type "", as Kafka shows a group that never joined.
  - Configs: a topic's are the log's settings (they are log-wide: every topic has the
    same, read-only, source DEFAULT_CONFIG); the broker's (resource "0") the daemon's.
  - DeleteTopics is Log.delete_stream, DeleteRecords Log.delete_records, CreatePartitions
    Log.add_partitions (a key's partition is its hash modulo the count, so keys move to
    other partitions when the count grows, as in Kafka). Internal streams ("__") are
    neither deleted nor changed: INVALID_TOPIC_EXCEPTION, as Kafka refuses writes to its
    own topics.
"""

from __future__ import annotations

import logging

from .. import errors as log_errors
from ..layout import is_internal
from .broker import CLUSTER_ID, NODE_ID
from .codec import build, response_schema
from .errors import ErrorCode
from .groups import GroupState

_LOG = logging.getLogger("streamlog.kafka")
RESOURCE_TOPIC, RESOURCE_BROKER = 2, 4
# Kafka's ConfigSource and ConfigType numbers (DescribeConfigsResponse)
_SOURCE_STATIC_BROKER, _SOURCE_DEFAULT = 4, 5
_BOOLEAN, _STRING, _INT, _LONG = 1, 2, 3, 5


# -- groups ---------------------------------------------------------------------------

def group_states(coordinator, offsets) -> dict[str, tuple[str, str]]:
    """{group: (state, protocol type)} of every group the daemon knows."""
    out = {group: (GroupState.EMPTY.value, "") for group in offsets.groups()}
    for group_id, group in coordinator.groups.items():
        if group.members:
            out[group_id] = (group.state.value, group.protocol_type or "")
        elif group_id not in out and group.protocol_type:
            out[group_id] = (GroupState.EMPTY.value, group.protocol_type)
    return out


def list_groups_answer(request, coordinator, offsets):
    body = request.body
    wanted = {s.lower() for s in (getattr(body, "states_filter", None) or ())}
    types = {t.lower() for t in (getattr(body, "types_filter", None) or ())}
    groups = [{"group_id": group, "protocol_type": protocol, "group_state": state,
               "group_type": "classic"}
              for group, (state, protocol) in sorted(group_states(coordinator,
                                                                  offsets).items())
              if (not wanted or state.lower() in wanted)
              and (not types or "classic" in types)]
    return build(response_schema(request), error_code=ErrorCode.none, groups=groups)


def describe_groups_answer(request, coordinator, offsets):
    known = group_states(coordinator, offsets)
    described = []
    for group_id in request.body.groups:
        group = coordinator.groups.get(group_id)
        state, protocol = known.get(group_id, ("Dead", ""))  # Kafka's answer: no such group
        members = []
        if group is not None and group.members:
            for member in group.members.values():
                members.append({
                    "member_id": member.member_id,
                    "group_instance_id": member.group_instance_id,
                    "client_id": member.client_id, "client_host": member.client_host,
                    "member_metadata": dict(member.protocols).get(group.protocol_name, b""),
                    "member_assignment": member.assignment})
        described.append({
            "error_code": ErrorCode.none, "group_id": group_id, "group_state": state,
            "protocol_type": protocol,
            "protocol_data": (group.protocol_name or "") if group and group.members else "",
            "members": members, "authorized_operations": -2147483648})
    return build(response_schema(request), groups=described)


def delete_groups_plan(request, coordinator, offsets) -> dict[str, ErrorCode]:
    """The event loop's part of DeleteGroups: {group: code}, with the groups that may
    go (no members) already dropped from the coordinator; none means delete its
    offsets next (delete_groups_finish, on the thread pool)."""
    known = group_states(coordinator, offsets)
    codes = {}
    for group_id in request.body.groups_names:
        if group_id not in known and group_id not in coordinator.groups:
            codes[group_id] = ErrorCode.group_id_not_found
        else:
            codes[group_id] = coordinator.forget(group_id)
    return codes


def delete_groups_finish(request, codes: dict[str, ErrorCode], offsets):
    for group_id, code in codes.items():
        if code == ErrorCode.none:
            codes[group_id] = _durably(lambda group=group_id: offsets.delete(group))
    return build(response_schema(request), results=[
        {"group_id": group_id, "error_code": code} for group_id, code in codes.items()])


def offset_delete_check(request, coordinator) -> ErrorCode | dict:
    """The event loop's part of OffsetDelete: the group's code, or per-partition codes
    for partitions of topics a member subscribes to (GROUP_SUBSCRIBED_TO_TOPIC)."""
    group = coordinator.groups.get(request.body.group_id)
    if group is None or not group.members:
        return {}
    subscribed = _subscribed_topics(group)
    return {(t.name, p.partition_index): ErrorCode.group_subscribed_to_topic
            for t in request.body.topics for p in t.partitions if t.name in subscribed}


def offset_delete_finish(request, refused: dict, offsets):
    body = request.body
    if body.group_id not in offsets.groups() and not refused:
        return build(response_schema(request), error_code=ErrorCode.group_id_not_found,
                     topics=[])
    places = [(t.name, p.partition_index) for t in body.topics for p in t.partitions
              if (t.name, p.partition_index) not in refused]
    code = _durably(lambda: offsets.delete(body.group_id, places))
    return build(response_schema(request), error_code=ErrorCode.none, topics=[
        {"name": t.name, "partitions": [
            {"partition_index": p.partition_index,
             "error_code": refused.get((t.name, p.partition_index), code)}
            for p in t.partitions]} for t in body.topics])


def _subscribed_topics(group) -> set[str]:
    """Topics the members' consumer-protocol subscriptions name (their metadata:
    version i16, then an array of topic names)."""
    topics = set()
    for member in group.members.values():
        metadata = dict(member.protocols).get(group.protocol_name, b"")
        try:
            count = int.from_bytes(metadata[2:6], "big", signed=True)
            at = 6
            for _ in range(max(count, 0)):
                size = int.from_bytes(metadata[at:at + 2], "big")
                topics.add(metadata[at + 2:at + 2 + size].decode())
                at += 2 + size
        except (UnicodeDecodeError, IndexError):
            continue
    return topics


# -- configs and the cluster ------------------------------------------------------------

def topic_configs(config) -> list[tuple[str, str, int]]:
    """(name, value, type) of a topic's configs, from the log's settings."""
    def ms(seconds):
        return str(int(seconds * 1000)) if seconds is not None else "-1"
    return [
        ("cleanup.policy", "delete", _STRING),
        ("retention.ms", ms(config.retention_age_s), _LONG),
        ("retention.bytes", str(config.retention_bytes or -1), _LONG),
        ("segment.bytes", str(config.segment_bytes_max), _INT),
        ("segment.ms", ms(config.segment_age_max_s), _LONG),
        ("message.timestamp.type", "CreateTime", _STRING),
        ("max.message.bytes", str(config.record_bytes_max), _INT),
        ("min.insync.replicas", "1", _INT),
        ("unclean.leader.election.enable", "false", _BOOLEAN),
    ]


def broker_configs(config, *, default_partitions: int, auto_create: bool,
                   transaction_timeout_max_ms: int) -> list[tuple[str, str, int]]:
    topic = dict((name, (value, kind)) for name, value, kind in topic_configs(config))
    return [
        ("broker.id", str(NODE_ID), _INT),
        ("num.partitions", str(default_partitions), _INT),
        ("auto.create.topics.enable", str(auto_create).lower(), _BOOLEAN),
        ("default.replication.factor", "1", _INT),
        ("offsets.topic.replication.factor", "1", _INT),
        ("transaction.state.log.replication.factor", "1", _INT),
        ("transaction.max.timeout.ms", str(transaction_timeout_max_ms), _INT),
        ("log.retention.ms", *topic["retention.ms"]),
        ("log.retention.bytes", *topic["retention.bytes"]),
        ("log.segment.bytes", *topic["segment.bytes"]),
        ("log.roll.ms", *topic["segment.ms"]),
        ("message.max.bytes", *topic["max.message.bytes"]),
        ("log.message.timestamp.type", "CreateTime", _STRING),
    ]


def describe_configs_answer(request, broker, **broker_settings):
    results = []
    for resource in request.body.resources:
        result = {"error_code": ErrorCode.none, "error_message": None,
                  "resource_type": resource.resource_type,
                  "resource_name": resource.resource_name, "configs": []}
        if resource.resource_type == RESOURCE_TOPIC:
            if broker.partition_count(resource.resource_name) is None:
                result.update(error_code=ErrorCode.unknown_topic_or_partition,
                              error_message=f"no topic {resource.resource_name!r}")
            else:
                result["configs"] = _configs(topic_configs(broker.log.config),
                                             resource.configuration_keys, _SOURCE_DEFAULT)
        elif resource.resource_type == RESOURCE_BROKER:
            if resource.resource_name not in ("", str(NODE_ID)):
                result.update(error_code=ErrorCode.invalid_request,
                              error_message=f"this cluster's one broker is {NODE_ID}")
            else:
                result["configs"] = _configs(
                    broker_configs(broker.log.config, **broker_settings),
                    resource.configuration_keys, _SOURCE_STATIC_BROKER)
        else:
            result.update(error_code=ErrorCode.invalid_request,
                          error_message=f"resource type {resource.resource_type} is not "
                                        f"described here (topics 2, the broker 4)")
        results.append(result)
    return build(response_schema(request), results=results)


def _configs(entries, keys, source: int) -> list[dict]:
    return [{"name": name, "value": value, "read_only": True, "is_default":
             source == _SOURCE_DEFAULT, "config_source": source, "is_sensitive": False,
             "synonyms": [], "config_type": kind, "documentation": None}
            for name, value, kind in entries if keys is None or name in keys]


def describe_cluster_answer(request, endpoint):
    return build(response_schema(request), error_code=ErrorCode.none, error_message=None,
                 endpoint_type=1, cluster_id=CLUSTER_ID, controller_id=NODE_ID,
                 brokers=[{"broker_id": NODE_ID, "host": endpoint.host,
                           "port": endpoint.port, "rack": None}],
                 cluster_authorized_operations=-2147483648)


# -- topics, records, partitions (blocking: the thread pool) --------------------------

def delete_topics_answer(request, broker):
    body = request.body
    if request.api_version >= 6:
        asked = [(t.name, t.topic_id) for t in body.topics]
    else:
        asked = [(name, None) for name in body.topic_names]
    results = []
    for name, topic_id in asked:
        result = {"name": name, "topic_id": topic_id, "error_code": ErrorCode.none,
                  "error_message": None}
        if name is None:
            result.update(error_code=ErrorCode.unknown_topic_id,
                          error_message="topics are named here, not given by id")
        elif is_internal(name):
            result.update(error_code=ErrorCode.invalid_topic_exception,
                          error_message=f"{name!r} is internal: it is not deleted")
        elif broker.partition_count(name) is None:
            result["error_code"] = ErrorCode.unknown_topic_or_partition
        else:
            result["error_code"] = _durably(lambda name=name: broker.log.delete_stream(name))
            if result["error_code"] == ErrorCode.none:
                _LOG.info("kafka_topic_deleted", extra={"fields": {"topic": name}})
        results.append(result)
    return build(response_schema(request), responses=results)


def delete_records_answer(request, broker):
    log = broker.log
    topics = []
    for topic in request.body.topics:
        count = broker.partition_count(topic.name)
        partitions = []
        for asked in topic.partitions:
            entry = {"partition_index": asked.partition_index, "low_watermark": -1,
                     "error_code": ErrorCode.none}
            number = asked.partition_index
            if count is None or not 0 <= number < count:
                entry["error_code"] = ErrorCode.unknown_topic_or_partition
            elif is_internal(topic.name):
                entry["error_code"] = ErrorCode.invalid_topic_exception
            else:
                end = log.end_offset(topic.name, number)
                offset = end if asked.offset == -1 else asked.offset
                if not 0 <= offset <= end:
                    entry["error_code"] = ErrorCode.offset_out_of_range
                else:
                    found = []
                    entry["error_code"] = _durably(lambda: found.append(
                        log.delete_records(topic.name, number, offset)))
                    if found:
                        entry["low_watermark"] = found[0]
            partitions.append(entry)
        topics.append({"name": topic.name, "partitions": partitions})
    return build(response_schema(request), topics=topics)


def create_partitions_answer(request, broker):
    results = []
    most = broker.log.config.partitions_max
    for topic in request.body.topics:
        result = {"name": topic.name, "error_code": ErrorCode.none, "error_message": None}
        count = broker.partition_count(topic.name)
        if count is None:
            result["error_code"] = ErrorCode.unknown_topic_or_partition
        elif is_internal(topic.name):
            result.update(error_code=ErrorCode.invalid_topic_exception,
                          error_message=f"{topic.name!r} is internal")
        elif not count < topic.count <= most:
            result.update(error_code=ErrorCode.invalid_partitions, error_message=(
                f"topic {topic.name!r} has {count} partitions: the new count must be "
                f"more, and at most {most}"))
        elif topic.assignments and any(set(a.broker_ids) - {NODE_ID}
                                       for a in topic.assignments):
            result.update(error_code=ErrorCode.invalid_replica_assignment,
                          error_message=f"this cluster's one broker is {NODE_ID}")
        elif not request.body.validate_only:
            result["error_code"] = _durably(
                lambda topic=topic: broker.log.add_partitions(topic.name, topic.count))
        results.append(result)
    return build(response_schema(request), results=results)


def _durably(change) -> ErrorCode:
    """Run a change of the log; its refusal or failure as Kafka's error code."""
    try:
        change()
    except log_errors.UnknownStream:
        return ErrorCode.unknown_topic_or_partition
    except log_errors.OffsetOutOfRange:
        return ErrorCode.offset_out_of_range
    except log_errors.InternalStream:
        return ErrorCode.invalid_topic_exception
    except log_errors.InvalidArgument as error:
        _LOG.warning("kafka_admin_refused", extra={"fields": {"error": str(error)}})
        return ErrorCode.invalid_request
    except log_errors.LogClosed:
        return ErrorCode.kafka_storage_error
    except log_errors.StreamLogError as error:
        _LOG.error("kafka_admin_failed", extra={"fields": {"error": str(error)}})
        return ErrorCode.kafka_storage_error
    return ErrorCode.none
