"""Writer options of format("streamlog").

    path            the log directory (required; created when missing), or a daemon's
                    URL streamlog://HOST:PORT (token from STREAMLOG_TOKEN; executors
                    append through the daemon, transactional mode only)
    stream          the stream to append to (required; created when missing)
    partitions      partition count of a stream this writer creates (default 1); an
                    existing stream with another count is an error
    mode            transactional (default) | truncate: how a streaming write stays
                    exactly-once (see spark_sink/_commit.py)
    fsync           always (default) | interval | never: the log's fsync policy while the
                    driver commits (a daemon keeps its own)
    lockTimeoutMs   accepted for jobs written for earlier versions, and checked, but
                    without effect: a commit no longer waits for other writers (several
                    processes may write one log; each commit holds a partition's lock
                    only while it writes)
    transactionalId the tag of a streaming query's commits (default: the query's id,
                    which is stable across restarts from the same checkpoint)
"""

from __future__ import annotations

import dataclasses

from spark_source._options import (SOURCE_OPTIONS, check_unknown, is_url, parse_path,
                                   parse_streams, positive_int)
from streamlog import InvalidArgument

SINK_OPTIONS = ("path", "stream", "partitions", "mode", "fsync", "lockTimeoutMs",
                "transactionalId", "checkpointLocation", "queryName")
TRANSACTIONAL = "transactional"
TRUNCATE = "truncate"


@dataclasses.dataclass(frozen=True)
class SinkOptions:
    path: str
    stream: str
    partitions: int | None  # None: not given (1 for a new stream, any for an existing one)
    mode: str
    fsync: str
    transactional_id: str | None


def parse_sink_options(options) -> SinkOptions:
    """Check and convert the writer options.

    Raises:
        InvalidArgument naming the option.
    """
    given = {str(k).lower(): "" if v is None else str(v) for k, v in dict(options or {}).items()}
    check_unknown(given, SINK_OPTIONS + SOURCE_OPTIONS)
    path = parse_path(given)
    streams = parse_streams(given)
    if len(streams) != 1:
        raise InvalidArgument(f"option 'stream' must name one stream to write to (got "
                              f"{', '.join(streams)})")
    partitions = None
    if "partitions" in given:
        partitions = positive_int(given, "partitions", 1)
    mode = given.get("mode", TRANSACTIONAL).strip().lower()
    if mode not in (TRANSACTIONAL, TRUNCATE):
        raise InvalidArgument(f"option 'mode' must be transactional or truncate (got "
                              f"{given['mode']!r}); to replace a stream's contents, write "
                              f"to a new stream: a log is append-only")
    if mode == TRUNCATE and is_url(path):
        raise InvalidArgument(f"option 'mode' truncate needs the log's directory: with a "
                              f"daemon URL ({path}) other clients may append to the stream, "
                              f"so only mode transactional (the default) is available")
    fsync = given.get("fsync", "always").strip().lower()
    if fsync not in ("always", "interval", "never"):
        raise InvalidArgument(f"option 'fsync' must be always, interval or never (got "
                              f"{given['fsync']!r})")
    tag = given.get("transactionalid", "").strip() or None
    positive_int(given, "lockTimeoutMs", 60000)  # checked; see the docstring
    return SinkOptions(path=path, stream=streams[0], partitions=partitions, mode=mode,
                       fsync=fsync, transactional_id=tag)
