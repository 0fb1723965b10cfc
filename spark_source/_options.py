"""Reader options of format("streamlog"), checked before anything touches the log.

Strategy: Spark hands a data source its options as a case-insensitive dict of strings.
`parse_source_options` turns them into one frozen `SourceOptions`, raising
`InvalidArgument` with a sentence that names the option, the value and what would be
accepted. The names and meanings follow Spark's Kafka source, so users know them:

    path                          the log directory, a daemon's URL
                                  streamlog://HOST:PORT (token from STREAMLOG_TOKEN, in
                                  the driver's and every executor's environment), or a
                                  log in an object store, s3://BUCKET/PREFIX (read
                                  only; see spark_source/_store.py) (required)
    storage.<name>                an option of the S3 client for an s3:// path:
                                  storage.endpoint, storage.access_key_id,
                                  storage.secret_access_key, storage.region,
                                  storage.allow_http, storage.timeout, ... (obstore's
                                  names); without them the AWS_* variables of the
                                  driver's and the executors' Python are used
    stream                        one stream, or several separated by commas; exactly one
                                  of stream, subscribe, subscribePattern, assign is needed
    subscribe                     the same as stream (Kafka's name)
    subscribePattern              a regular expression (Python's re, matched against the
                                  whole name) over stream names; a stream created later
                                  that matches is read by a running query from its start
    assign                        JSON of streams and partition numbers, {"s": [0, 2]}:
                                  only those partitions
    startingOffsets               earliest | latest (streaming only) | JSON per partition,
                                  {"s": {"0": 23, "1": -2}} with -2 earliest, -1 latest
    startingTimestamp             milliseconds since the epoch, for every partition
    startingOffsetsByTimestamp    JSON per partition of milliseconds
    startingOffsetsByTimestampStrategy  error (default) | latest: what to do when no
                                  record's high-water mark reaches the timestamp
    endingOffsets / endingTimestamp / endingOffsetsByTimestamp   batch queries only;
                                  latest or JSON (-1 latest; -2 is refused)
    maxOffsetsPerTrigger          offsets per micro-batch, shared across partitions
    minOffsetsPerTrigger          a micro-batch waits until at least this many offsets are
                                  available, or maxTriggerDelay has passed since the last
                                  one (as Kafka's source; not under Trigger.AvailableNow)
    maxTriggerDelay               how long minOffsetsPerTrigger may hold a batch back
                                  (default 15m; 500ms, 10s, 5m, 1h or milliseconds)
    isolationLevel                read_committed (default) | read_uncommitted: whether
                                  records of open and aborted transactions are read (also
                                  taken as kafka.isolation.level)
    failOnDataLoss                true (default): fail when retention or truncation removed
                                  offsets the query needs; false: skip them with a warning
    includeHeaders                false (default) | true: adds the headers column
    minPartitions                 split the read into at least this many Spark partitions
    maxRecordsPerPartition        split a log partition's range into pieces of at most this

An option name that is not one of these (nor the sink's, nor Spark's own) is an error;
the message suggests a known name only when the given one is a near miss of it (one or
two letters off), and says so when the name is a setting of Kafka's source or client
that has no meaning here.

Timestamps in options are milliseconds (as Kafka's source takes them); the log counts
microseconds, so they are multiplied by 1000 here and nowhere else. A timestamp bound is
resolved by the high-water-mark rule (DESIGN 5): the first offset whose running-max
timestamp is >= T. Precedence, as Kafka's: startingTimestamp, then
startingOffsetsByTimestamp, then startingOffsets (the same for the ending side).
"""

from __future__ import annotations

import dataclasses
import json
import re

from streamlog import InvalidArgument

from ._store import (HADOOP_S3_PREFIXES, STORAGE_PREFIX, check_store_url, is_store_url,
                     storage_options)

# Position kinds: where one side of a partition's range lies.
EARLIEST = "earliest"
LATEST = "latest"
OFFSET = "offset"
TIMESTAMP = "timestamp"

_INT64_MAX = (1 << 63) - 1
_MS_MAX = _INT64_MAX // 1000

SELECTORS = ("stream", "subscribe", "subscribePattern", "assign")
SOURCE_OPTIONS = (
    "path", *SELECTORS, "startingOffsets", "endingOffsets", "startingTimestamp",
    "endingTimestamp", "startingOffsetsByTimestamp", "endingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy", "maxOffsetsPerTrigger", "minOffsetsPerTrigger",
    "maxTriggerDelay", "isolationLevel", "kafka.isolation.level", "failOnDataLoss",
    "includeHeaders", "minPartitions", "maxRecordsPerPartition",
)
_ENDING_OPTIONS = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")
# Names Spark adds itself: a streaming query's, and a catalog table's properties
# (CREATE TABLE ... USING streamlog hands the source these beside the user's options).
_SPARK_NAMES = ("checkpointLocation", "queryName", "location", "owner", "provider",
                "comment", "external", "is_managed_location")
_CATALOG_PREFIX = "option."
# Settings of Kafka's source that have no meaning for a log read directly.
_KAFKA_ONLY = ("topic", "groupIdPrefix", "fetchOffset.numRetries",
               "fetchOffset.retryIntervalMs", "kafkaConsumer.pollTimeoutMs", "maxPartitions")
READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"
DEFAULT_TRIGGER_DELAY_MS = 15 * 60 * 1000  # Kafka's maxTriggerDelay default, 15m


@dataclasses.dataclass(frozen=True)
class Position:
    """One side of a partition's range before it is resolved against the log:
    kind EARLIEST / LATEST, or OFFSET / TIMESTAMP with `value` (offset, or microseconds)."""

    kind: str
    value: int = 0


@dataclasses.dataclass(frozen=True)
class Bound:
    """A side of the read for every partition: one Position for all (`every`), or one
    per (stream, partition) given as JSON (`per_partition`, which must then list every
    partition of every stream, as Kafka's source requires)."""

    option: str  # the option it came from, for error messages
    every: Position | None = None
    per_partition: tuple[tuple[tuple[str, int], Position], ...] = ()

    def position(self, stream: str, partition: int) -> Position | None:
        if self.every is not None:
            return self.every
        for key, position in self.per_partition:
            if key == (stream, partition):
                return position
        return None


@dataclasses.dataclass(frozen=True)
class SourceOptions:
    """What to read: `streams` (stream / subscribe), or every stream whose name matches
    `pattern` (subscribePattern), or exactly the partitions `assigned` (assign, whose
    streams are also in `streams`)."""

    path: str
    streams: tuple[str, ...]
    starting: Bound
    ending: Bound | None  # None for streaming queries
    strategy_latest: bool  # startingOffsetsByTimestampStrategy=latest
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    include_headers: bool
    min_partitions: int | None
    max_records_per_partition: int | None
    pattern: str | None = None
    assigned: tuple[tuple[str, int], ...] | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_TRIGGER_DELAY_MS
    read_committed: bool = True
    # storage.<name> options, for an s3:// path: (name, value) pairs, sorted. Secrets
    # may be among them: never shown (repr) nor put in a message.
    storage_options: tuple[tuple[str, str], ...] = dataclasses.field(default=(),
                                                                     repr=False)


def parse_source_options(options, *, streaming: bool | None,
                         required: bool = True) -> SourceOptions | None:
    """Check and convert the reader options (see the module docstring).

    `streaming` None checks what does not depend on the kind of query (the data
    source's load(), which cannot tell a read from a readStream or a write);
    `required` False lets path and the stream selection be absent (then None is
    returned after the checks).

    Raises:
        InvalidArgument naming the option for a missing or malformed value, an option
        that does not apply (ending options on a stream), or an unknown option name.
    """
    given = _lowered(options)
    check_unknown(given, SOURCE_OPTIONS + _SINK_NAMES)
    path = parse_path(given, store=True) if required or "path" in given else None
    streams, pattern, assigned = parse_selection(given, required=required)
    if streaming:
        for name in _ENDING_OPTIONS:
            if name.lower() in given:
                raise InvalidArgument(f"option {name!r} is for batch queries only; a streaming "
                                      f"query reads until it is stopped")
    known = streams if pattern is None else None
    starting = _parse_starting(given, known, streaming)
    ending = None if streaming else _parse_ending(given, known)
    strategy = given.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise InvalidArgument(f"option 'startingOffsetsByTimestampStrategy' must be error or "
                              f"latest (got {strategy!r})")
    most = _positive_int(given, "maxOffsetsPerTrigger")
    least = _positive_int(given, "minOffsetsPerTrigger")
    if least is not None and most is not None and least > most:
        raise InvalidArgument(f"option 'minOffsetsPerTrigger' ({least}) is more than "
                              f"'maxOffsetsPerTrigger' ({most})")
    delay_ms = DEFAULT_TRIGGER_DELAY_MS
    if "maxtriggerdelay" in given:
        delay_ms = parse_duration_ms(given["maxtriggerdelay"], "maxTriggerDelay")
    read_committed = parse_isolation(given)
    fail_on_data_loss = parse_bool(given, "failOnDataLoss", True)
    include_headers = parse_bool(given, "includeHeaders", False)
    min_partitions = _positive_int(given, "minPartitions")
    max_records_per_partition = _positive_int(given, "maxRecordsPerPartition")
    if path is None or (not streams and pattern is None):
        return None
    return SourceOptions(
        path=path, streams=streams, starting=starting, ending=ending,
        strategy_latest=strategy == "latest", max_offsets_per_trigger=most,
        fail_on_data_loss=fail_on_data_loss, include_headers=include_headers,
        min_partitions=min_partitions, max_records_per_partition=max_records_per_partition,
        pattern=pattern, assigned=assigned, min_offsets_per_trigger=least,
        max_trigger_delay_ms=delay_ms, read_committed=read_committed,
        storage_options=storage_options(given))


# Names the sink takes: accepted here too, since one DataSource serves both sides.
_SINK_NAMES = ("mode", "partitions", "fsync", "lockTimeoutMs", "checkpointLocation",
               "queryName", "transactionalId")


def _lowered(options) -> dict[str, str]:
    out = {}
    for key, value in dict(options or {}).items():
        out[str(key).lower()] = "" if value is None else str(value)
    return out


def check_unknown(given: dict[str, str], known: tuple[str, ...]) -> None:
    """Refuse an option name that is neither `known` nor one Spark adds itself (a typo
    would otherwise be ignored silently). The message suggests a known name only for a
    near miss (see `near_miss`), and says when the name is one of Kafka's.

    Raises:
        InvalidArgument naming the option.
    """
    lowered = {name.lower(): name for name in known + _SPARK_NAMES}
    for key in given:
        if key in lowered or key.startswith(_CATALOG_PREFIX):
            continue
        if key.startswith(STORAGE_PREFIX) and len(key) > len(STORAGE_PREFIX):
            continue  # an S3 client option: checked by the client when the log opens
        if key.startswith(HADOOP_S3_PREFIXES):
            raise InvalidArgument(f"option {key!r} is a setting of Hadoop's S3 file system, "
                                  f"which format('streamlog') does not use: it reads "
                                  f"s3://BUCKET/PREFIX itself; give the S3 client's options "
                                  f"as storage.endpoint, storage.access_key_id, ... or in "
                                  f"the AWS_* variables")
        if key.startswith("kafka.") or key in {name.lower() for name in _KAFKA_ONLY}:
            raise InvalidArgument(f"option {key!r} is a setting of Kafka's source or client, "
                                  f"which format('streamlog') does not use: it reads the log "
                                  f"at option 'path' (a directory, streamlog://HOST:PORT or "
                                  f"s3://BUCKET/PREFIX)")
        close = near_miss(key, list(lowered))
        if close is not None:
            raise InvalidArgument(f"unknown option {key!r}; did you mean {lowered[close]!r}?")
        names = ", ".join(sorted({*known, STORAGE_PREFIX + "<name>"}, key=str.lower))
        raise InvalidArgument(f"unknown option {key!r} for format('streamlog'); its options "
                              f"are: {names}")


def near_miss(word: str, candidates: list[str]) -> str | None:
    """The one candidate within a small edit distance of `word` (one edit for short
    names, two from 8 letters on), or None when there is none or more than one."""
    allowed = 1 if len(word) < 8 else 2
    close = [c for c in candidates if _edit_distance(word, c, allowed) <= allowed]
    return close[0] if len(close) == 1 else None


def _edit_distance(a: str, b: str, bound: int) -> int:
    """Levenshtein distance of a and b (with a swap of neighbours as one edit), or
    bound + 1 as soon as it is sure to exceed bound."""
    if abs(len(a) - len(b)) > bound:
        return bound + 1
    previous2, previous = None, list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            row[j] = min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + cost)
            if (previous2 is not None and i > 1 and j > 1 and a[i - 1] == b[j - 2]
                    and a[i - 2] == b[j - 1]):
                row[j] = min(row[j], previous2[j - 2] + 1)
        if min(row) > bound:
            return bound + 1
        previous2, previous = previous, row
    return previous[-1]


def parse_path(given: dict[str, str], *, store: bool = False) -> str:
    """The log option 'path' names: a directory, a daemon's URL, or (`store`: the
    reader's side) a log in an object store.

    Raises:
        InvalidArgument for a missing path, a malformed URL, a URL of a scheme streamlog
        does not read, an s3:// path where `store` is False (a writer's), and storage.*
        options beside a path that is not s3://.
    """
    path = given.get("path", "").strip()
    if not path:
        raise InvalidArgument("option 'path' is required: the streamlog log directory "
                              "(.option('path', DIR) or .load(DIR) / .save(DIR))")
    storage = sorted(key for key in given if key.startswith(STORAGE_PREFIX))
    if storage and not is_store_url(path):
        raise InvalidArgument(f"option {storage[0]!r}: options storage.* configure the "
                              f"object store client, for a path s3://BUCKET/PREFIX; option "
                              f"'path' is {path!r}")
    if is_store_url(path):
        if not store:
            raise InvalidArgument(f"option 'path' {path!r} is a log in an object store, "
                                  f"which format('streamlog') reads but does not write: "
                                  f"write to the log directory tiered to it (or its "
                                  f"daemon's URL)")
        check_store_url(path)
        return path
    if is_url(path):
        from streamlog.wire.client import parse_url
        parse_url(path)  # InvalidArgument naming the URL when malformed
        return path
    if path.startswith("file://"):
        path = path[len("file://"):]
    elif path.startswith("file:/"):  # a catalog table's location: file:/abs/path
        path = path[len("file:"):]
    elif _SCHEME.match(path):
        raise InvalidArgument(f"option 'path' {path!r}: format('streamlog') reads a log "
                              f"directory, a daemon's URL streamlog://HOST:PORT or a log in "
                              f"an object store s3://BUCKET/PREFIX (Hadoop's file systems, "
                              f"s3a:// and others, are not used)")
    return path


DAEMON_SCHEMES = ("streamlog://", "streamlog+tls://")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(path: str) -> bool:
    """Whether `path` names a daemon (streamlog://HOST:PORT) rather than a directory."""
    return path.startswith(DAEMON_SCHEMES)


def parse_streams(given: dict[str, str], name: str = "stream") -> tuple[str, ...]:
    raw = given.get(name.lower(), "")
    streams = tuple(s.strip() for s in raw.split(",") if s.strip())
    if not streams:
        raise InvalidArgument(f"option {name!r} is required: the name of the stream "
                              f"(or several, separated by commas)")
    if len(set(streams)) != len(streams):
        raise InvalidArgument(f"option {name!r} names a stream twice: {raw!r}")
    return streams


def parse_selection(given: dict[str, str], *, required: bool = True):
    """(streams, pattern, assigned) from exactly one of stream, subscribe,
    subscribePattern and assign (as Kafka's source wants one of its three)."""
    named = [name for name in SELECTORS if name.lower() in given]
    if len(named) > 1:
        raise InvalidArgument(f"options {' and '.join(repr(n) for n in named)} each choose "
                              f"what to read; give only one of stream (or subscribe), "
                              f"subscribePattern, assign")
    if not named:
        if required:
            raise InvalidArgument("option 'stream' is required: the name of the stream (or "
                                  "several, separated by commas), or use subscribe, "
                                  "subscribePattern or assign")
        return (), None, None
    name = named[0]
    if name in ("stream", "subscribe"):
        return parse_streams(given, name), None, None
    if name == "subscribePattern":
        raw = given["subscribepattern"]
        if not raw.strip():
            raise InvalidArgument("option 'subscribePattern' must be a regular expression "
                                  "over stream names (got an empty value)")
        try:
            re.compile(raw)
        except re.error as error:
            raise InvalidArgument(f"option 'subscribePattern' is not a regular expression: "
                                  f"{error} (got {raw!r})") from None
        return (), raw, None
    assigned = _parse_assign(given["assign"])
    streams = tuple(dict.fromkeys(stream for stream, _ in assigned))
    return streams, None, assigned


def _parse_assign(raw: str) -> tuple[tuple[str, int], ...]:
    example = '{"clicks": [0, 2]}'
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if (not isinstance(value, dict) or not value
            or not all(isinstance(v, list) and v for v in value.values())):
        raise InvalidArgument(f"option 'assign' must be a JSON object of streams, each a "
                              f"list of partition numbers, like {example} (got {raw!r})")
    keys = []
    for stream, numbers in value.items():
        for number in numbers:
            if isinstance(number, bool) or not isinstance(number, int) or number < 0:
                raise InvalidArgument(f"option 'assign': {number!r} in stream {stream!r} is "
                                      f"not a partition number")
            keys.append((stream, number))
    if len(set(keys)) != len(keys):
        raise InvalidArgument(f"option 'assign' names a partition twice: {raw!r}")
    return tuple(sorted(keys))


def parse_isolation(given: dict[str, str]) -> bool:
    """Whether reads are read_committed (isolationLevel, or Kafka's client name)."""
    values = {name: given[name.lower()].strip().lower()
              for name in ("isolationLevel", "kafka.isolation.level") if name.lower() in given}
    if len(set(values.values())) > 1:
        raise InvalidArgument("options 'isolationLevel' and 'kafka.isolation.level' disagree; "
                              "give one")
    for name, value in values.items():
        if value not in (READ_COMMITTED, READ_UNCOMMITTED):
            raise InvalidArgument(f"option {name!r} must be read_committed or "
                                  f"read_uncommitted (got {given[name.lower()]!r})")
        return value == READ_COMMITTED
    return True


_DURATION = re.compile(r"(\d+)\s*(us|ms|s|m|min|h|d)?")
_DURATION_MS = {"us": 0.001, "ms": 1, None: 1, "s": 1000, "m": 60_000, "min": 60_000,
                "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(raw: str, name: str) -> int:
    """A duration as Spark writes them (500ms, 10s, 5m, 1h, 2d; a bare number is ms)."""
    match = _DURATION.fullmatch(raw.strip().lower())
    if match is None:
        raise InvalidArgument(f"option {name!r} must be a duration such as 500ms, 10s, 5m or "
                              f"1h (got {raw!r})")
    return int(int(match.group(1)) * _DURATION_MS[match.group(2)])


def parse_bool(given: dict[str, str], name: str, default: bool) -> bool:
    raw = given.get(name.lower())
    if raw is None:
        return default
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise InvalidArgument(f"option {name!r} must be true or false (got {raw!r})")
    return value == "true"


def _positive_int(given: dict[str, str], name: str) -> int | None:
    raw = given.get(name.lower())
    if raw is None:
        return None
    value = _int(raw, name)
    if value <= 0:
        raise InvalidArgument(f"option {name!r} must be a positive integer (got {raw!r})")
    return value


def positive_int(given: dict[str, str], name: str, default: int) -> int:
    value = _positive_int(given, name)
    return default if value is None else value


def _int(raw: str, name: str) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        raise InvalidArgument(f"option {name!r} must be an integer (got {raw!r})") from None
    if abs(value) > _INT64_MAX:
        raise InvalidArgument(f"option {name!r} is out of range (got {raw!r})")
    return value


def _timestamp_us(raw, name: str) -> int:
    value = _int(str(raw), name) if not isinstance(raw, int) else raw
    if isinstance(raw, bool) or abs(value) > _MS_MAX:
        raise InvalidArgument(f"option {name!r}: {raw!r} is not a timestamp in milliseconds "
                              f"since the epoch")
    return value * 1000


# -- the starting and ending sides ----------------------------------------------------

def _parse_starting(given: dict[str, str], streams, streaming: bool) -> Bound:
    if "startingtimestamp" in given:
        micros = _timestamp_us(given["startingtimestamp"], "startingTimestamp")
        return Bound("startingTimestamp", every=Position(TIMESTAMP, micros))
    if "startingoffsetsbytimestamp" in given:
        return _timestamps_json(given["startingoffsetsbytimestamp"],
                                "startingOffsetsByTimestamp", streams)
    raw = given.get("startingoffsets")
    if raw is None:
        return Bound("startingOffsets", every=Position(LATEST if streaming else EARLIEST))
    word = raw.strip().lower()
    if word == "earliest":
        return Bound("startingOffsets", every=Position(EARLIEST))
    if word == "latest":
        if streaming is False:
            raise InvalidArgument("option 'startingOffsets' cannot be latest for a batch "
                                  "query (it would read nothing); use earliest or JSON")
        return Bound("startingOffsets", every=Position(LATEST))
    return _offsets_json(raw, "startingOffsets", streams, ending=False)


def _parse_ending(given: dict[str, str], streams) -> Bound:
    if "endingtimestamp" in given:
        micros = _timestamp_us(given["endingtimestamp"], "endingTimestamp")
        return Bound("endingTimestamp", every=Position(TIMESTAMP, micros))
    if "endingoffsetsbytimestamp" in given:
        return _timestamps_json(given["endingoffsetsbytimestamp"],
                                "endingOffsetsByTimestamp", streams)
    raw = given.get("endingoffsets")
    if raw is None or raw.strip().lower() == "latest":
        return Bound("endingOffsets", every=Position(LATEST))
    if raw.strip().lower() == "earliest":
        raise InvalidArgument("option 'endingOffsets' cannot be earliest; use latest or JSON")
    return _offsets_json(raw, "endingOffsets", streams, ending=True)


def _load_json(raw: str, name: str, streams) -> dict:
    """The JSON object of option `name`; `streams` None (a pattern) or empty (not given
    yet) lets it name any stream."""
    example = '{"%s": {"0": 0}}' % (streams[0] if streams else "clicks")
    try:
        value = json.loads(raw)
    except ValueError:
        raise InvalidArgument(f"option {name!r} must be earliest, latest or JSON like "
                              f"{example} (got {raw!r})") from None
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise InvalidArgument(f"option {name!r} must be a JSON object of streams, each an "
                              f"object of partitions, like {example} (got {raw!r})")
    for stream in value:
        if streams and stream not in streams:
            raise InvalidArgument(f"option {name!r} names stream {stream!r}, which is not in "
                                  f"option 'stream' ({', '.join(streams)})")
    return value


def _partition_number(key: str, name: str, stream: str) -> int:
    if not (isinstance(key, str) and key.isdigit()):
        raise InvalidArgument(f"option {name!r}: partition {key!r} of stream {stream!r} is "
                              f"not a partition number")
    return int(key)


def _offsets_json(raw: str, name: str, streams, *, ending: bool) -> Bound:
    value = _load_json(raw, name, streams)
    entries = []
    for stream in sorted(value):
        for key, offset in value[stream].items():
            partition = _partition_number(key, name, stream)
            if isinstance(offset, bool) or not isinstance(offset, int):
                raise InvalidArgument(f"option {name!r}: offset of {stream}/{key} must be an "
                                      f"integer (got {offset!r})")
            if offset == -1:
                position = Position(LATEST)
            elif offset == -2 and not ending:
                position = Position(EARLIEST)
            elif offset >= 0:
                position = Position(OFFSET, offset)
            else:
                allowed = "-1 (latest)" if ending else "-2 (earliest), -1 (latest)"
                raise InvalidArgument(f"option {name!r}: offset {offset} of {stream}/{key} "
                                      f"is not valid; use an offset >= 0 or {allowed}")
            entries.append(((stream, partition), position))
    return Bound(name, per_partition=tuple(entries))


def _timestamps_json(raw: str, name: str, streams) -> Bound:
    value = _load_json(raw, name, streams)
    entries = []
    for stream in sorted(value):
        for key, millis in value[stream].items():
            partition = _partition_number(key, name, stream)
            if isinstance(millis, bool) or not isinstance(millis, int):
                raise InvalidArgument(f"option {name!r}: the timestamp of {stream}/{key} must "
                                      f"be an integer of milliseconds (got {millis!r})")
            entries.append(((stream, partition), Position(TIMESTAMP,
                                                          _timestamp_us(millis, name))))
    return Bound(name, per_partition=tuple(entries))
