"""Reader options of format("streamlog"), checked before anything touches the log.

Strategy: Spark hands a data source its options as a case-insensitive dict of strings.
`parse_source_options` turns them into one frozen `SourceOptions`, raising
`InvalidArgument` with a sentence that names the option, the value and what would be
accepted. The names and meanings follow Spark's Kafka source, so users know them:

    path                          the log directory, or a daemon's URL
                                  streamlog://HOST:PORT (token from STREAMLOG_TOKEN, in
                                  the driver's and every executor's environment)
                                  (required)
    stream                        one stream, or several separated by commas (required)
    startingOffsets               earliest | latest (streaming only) | JSON per partition,
                                  {"s": {"0": 23, "1": -2}} with -2 earliest, -1 latest
    startingTimestamp             milliseconds since the epoch, for every partition
    startingOffsetsByTimestamp    JSON per partition of milliseconds
    startingOffsetsByTimestampStrategy  error (default) | latest: what to do when no
                                  record's high-water mark reaches the timestamp
    endingOffsets / endingTimestamp / endingOffsetsByTimestamp   batch queries only;
                                  latest or JSON (-1 latest; -2 is refused)
    maxOffsetsPerTrigger          offsets per micro-batch, shared across partitions
    failOnDataLoss                true (default): fail when retention or truncation removed
                                  offsets the query needs; false: skip them with a warning
    includeHeaders                false (default) | true: adds the headers column
    minPartitions                 split the read into at least this many Spark partitions
    maxRecordsPerPartition        split a log partition's range into pieces of at most this

Timestamps in options are milliseconds (as Kafka's source takes them); the log counts
microseconds, so they are multiplied by 1000 here and nowhere else. A timestamp bound is
resolved by the high-water-mark rule (DESIGN 5): the first offset whose running-max
timestamp is >= T. Precedence, as Kafka's: startingTimestamp, then
startingOffsetsByTimestamp, then startingOffsets (the same for the ending side).
"""

from __future__ import annotations

import dataclasses
import difflib
import json

from streamlog import InvalidArgument

# Position kinds: where one side of a partition's range lies.
EARLIEST = "earliest"
LATEST = "latest"
OFFSET = "offset"
TIMESTAMP = "timestamp"

_INT64_MAX = (1 << 63) - 1
_MS_MAX = _INT64_MAX // 1000

SOURCE_OPTIONS = (
    "path", "stream", "startingOffsets", "endingOffsets", "startingTimestamp",
    "endingTimestamp", "startingOffsetsByTimestamp", "endingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy", "maxOffsetsPerTrigger", "failOnDataLoss",
    "includeHeaders", "minPartitions", "maxRecordsPerPartition",
)
_ENDING_OPTIONS = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")


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


def parse_source_options(options, *, streaming: bool) -> SourceOptions:
    """Check and convert the reader options (see the module docstring).

    Raises:
        InvalidArgument naming the option for a missing or malformed value, an option
        that does not apply (ending options on a stream), or a near-miss option name.
    """
    given = _lowered(options)
    check_unknown(given, SOURCE_OPTIONS + _SINK_NAMES)
    path = parse_path(given)
    streams = parse_streams(given)
    if streaming:
        for name in _ENDING_OPTIONS:
            if name.lower() in given:
                raise InvalidArgument(f"option {name!r} is for batch queries only; a streaming "
                                      f"query reads until it is stopped")
    starting = _parse_starting(given, streams, streaming)
    ending = None if streaming else _parse_ending(given, streams)
    strategy = given.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise InvalidArgument(f"option 'startingOffsetsByTimestampStrategy' must be error or "
                              f"latest (got {strategy!r})")
    return SourceOptions(
        path=path, streams=streams, starting=starting, ending=ending,
        strategy_latest=strategy == "latest",
        max_offsets_per_trigger=_positive_int(given, "maxOffsetsPerTrigger"),
        fail_on_data_loss=parse_bool(given, "failOnDataLoss", True),
        include_headers=parse_bool(given, "includeHeaders", False),
        min_partitions=_positive_int(given, "minPartitions"),
        max_records_per_partition=_positive_int(given, "maxRecordsPerPartition"))


# Names the sink takes: accepted here too, since one DataSource serves both sides.
_SINK_NAMES = ("mode", "partitions", "fsync", "lockTimeoutMs", "checkpointLocation",
               "queryName", "transactionalId")


def _lowered(options) -> dict[str, str]:
    out = {}
    for key, value in dict(options or {}).items():
        out[str(key).lower()] = "" if value is None else str(value)
    return out


def check_unknown(given: dict[str, str], known: tuple[str, ...]) -> None:
    """Refuse an option name that is a near miss of a known one (a typo would otherwise
    be ignored silently); other unknown names are left alone, as Spark passes its own."""
    lowered = {name.lower(): name for name in known}
    for key in given:
        if key in lowered:
            continue
        close = difflib.get_close_matches(key, list(lowered), n=1, cutoff=0.85)
        if close:
            raise InvalidArgument(f"unknown option {key!r}; did you mean "
                                  f"{lowered[close[0]]!r}?")


def parse_path(given: dict[str, str]) -> str:
    path = given.get("path", "").strip()
    if not path:
        raise InvalidArgument("option 'path' is required: the streamlog log directory "
                              "(.option('path', DIR) or .load(DIR) / .save(DIR))")
    if is_url(path):
        from streamlog.wire.client import parse_url
        parse_url(path)  # InvalidArgument naming the URL when malformed
        return path
    if path.startswith("file://"):
        path = path[len("file://"):]
    return path


DAEMON_SCHEMES = ("streamlog://", "streamlog+tls://")


def is_url(path: str) -> bool:
    """Whether `path` names a daemon (streamlog://HOST:PORT) rather than a directory."""
    return path.startswith(DAEMON_SCHEMES)


def parse_streams(given: dict[str, str]) -> tuple[str, ...]:
    raw = given.get("stream", "")
    streams = tuple(s.strip() for s in raw.split(",") if s.strip())
    if not streams:
        raise InvalidArgument("option 'stream' is required: the name of the stream "
                              "(or several, separated by commas)")
    if len(set(streams)) != len(streams):
        raise InvalidArgument(f"option 'stream' names a stream twice: {raw!r}")
    return streams


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
        if not streaming:
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
    example = '{"%s": {"0": 0}}' % streams[0]
    try:
        value = json.loads(raw)
    except ValueError:
        raise InvalidArgument(f"option {name!r} must be earliest, latest or JSON like "
                              f"{example} (got {raw!r})") from None
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise InvalidArgument(f"option {name!r} must be a JSON object of streams, each an "
                              f"object of partitions, like {example} (got {raw!r})")
    for stream in value:
        if stream not in streams:
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
