"""Planning reads on the driver: positions -> offsets, ranges -> Spark partitions.

Strategy: the driver opens the log read-only (never the writer lock, never a change to
a file), resolves each side of each partition's range to an offset, and cuts the ranges
into `OffsetRange`s, the InputPartitions that executors read. Everything an executor
needs travels inside the OffsetRange, since `read()` runs on a different, pickled
reader instance in another process.

Offsets here are log offsets, which count control records (commit and abort markers)
too, as Kafka's offsets do: a range [start, end) may hold fewer data rows than
end - start. The readable end of a partition is its last stable offset: the first
offset of a transaction that is still open, or the end of the log when none is. A
read_committed reader stops there, so a plan must never reach past it, or a micro-batch
would claim offsets whose records it could not show yet (and never would, later).

The functions below the classes are pure: they take numbers and return numbers, so the
rules (proportional rate limit, splitting) are tested without Spark.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re

from pyspark.sql.datasource import InputPartition
from streamlog import InvalidArgument, OffsetOutOfRange

from ._options import (EARLIEST, LATEST, OFFSET, TIMESTAMP, Bound, Position, SourceOptions,
                       is_url)
from ._ship import ShipsToExecutors
from ._store import is_store_url, open_store

log = logging.getLogger("streamlog.spark")

# A range is split only into pieces of at least this many offsets (unless the user asked
# for more partitions with minPartitions): a smaller Spark task costs more than it reads.
SPLIT_OFFSETS_MIN = 65536


@dataclasses.dataclass
class OffsetRange(ShipsToExecutors, InputPartition):
    """Offsets [start, end) of one log partition, read by one Spark task. For a log in
    an object store, also the S3 client's options (storage.*, which may hold secrets:
    not in the repr) and the manifest generation the range was planned from."""

    path: str
    stream: str
    partition: int
    start: int
    end: int
    include_headers: bool
    fail_on_data_loss: bool
    read_committed: bool = True
    storage_options: tuple[tuple[str, str], ...] = dataclasses.field(default=(),
                                                                     repr=False)
    generation: int = 0

    def __post_init__(self) -> None:
        assert 0 <= self.start <= self.end
        InputPartition.__init__(self, None)


PartitionKey = tuple[str, int]  # (stream, partition number)


def open_readonly(path: str, storage_options: tuple[tuple[str, str], ...] = ()):
    """The log at `path` (a directory, a daemon's URL, or a log in an object store with
    the S3 client's `storage_options`), opened read-only; a clear error when there is
    none. A store's view stays at the generation it shows until refresh() (_store.py)."""
    import streamlog
    if is_store_url(path):
        return open_store(path, storage_options)
    if is_url(path):
        return streamlog.open_log(path, readonly=True)
    if not os.path.isdir(path):
        raise InvalidArgument(f"no streamlog log at {path!r} (option 'path')")
    return streamlog.open_log(path, readonly=True, create=False)


def partition_keys(log, streams) -> list[PartitionKey]:
    """Every (stream, partition) to read, streams in the order given, then by number."""
    keys = []
    for stream in streams:
        keys += [(stream, number) for number in range(log.partition_count(stream))]
    return keys


def selected_keys(log, options: SourceOptions) -> list[PartitionKey]:
    """The (stream, partition)s the options choose: the streams named (stream,
    subscribe), those matching subscribePattern now, or the partitions assigned.

    Raises:
        InvalidArgument for a stream or an assigned partition that does not exist.
    """
    if options.pattern is not None:
        matcher = re.compile(options.pattern)
        streams = sorted(name for name in log.streams() if matcher.fullmatch(name))
        return partition_keys(log, streams)
    keys = partition_keys(log, options.streams)
    if options.assigned is None:
        return keys
    missing = [f"{s}/{p}" for s, p in options.assigned if (s, p) not in set(keys)]
    if missing:
        raise InvalidArgument(f"option 'assign' names partitions that do not exist: "
                              f"{', '.join(missing)}")
    return list(options.assigned)


def stable_end(log, stream: str, partition: int, read_committed: bool = True) -> int:
    """The last stable offset: where a read_committed reader has to stop for now (a local
    log and a daemon's client both say, streamlog.api.LogAPI); the end of the log for a
    read_uncommitted one."""
    if not read_committed:
        return log.end_offset(stream, partition)
    return log.last_stable_offset(stream, partition)


def check_bound_covers(bound: Bound, keys: list[PartitionKey]) -> None:
    """A per-partition JSON bound must name every partition, and only real ones."""
    if bound.every is not None:
        return
    named = {key for key, _ in bound.per_partition}
    missing = [f"{s}/{p}" for s, p in keys if (s, p) not in named]
    extra = sorted(f"{s}/{p}" for s, p in named - set(keys))
    if extra:
        raise InvalidArgument(f"option {bound.option!r} names partitions that do not exist: "
                              f"{', '.join(extra)}")
    if missing:
        raise InvalidArgument(f"option {bound.option!r} must give every partition (as "
                              f"Kafka's source requires); missing: {', '.join(missing)}")


def resolve_start(log, key: PartitionKey, position: Position, options: SourceOptions) -> int:
    """Offset where a read of one partition starts.

    Raises:
        OffsetOutOfRange when an explicit offset was removed by retention (unless
        failOnDataLoss=false) or lies past the end; InvalidArgument when no record
        reaches a starting timestamp and the strategy is `error`.
    """
    stream, number = key
    first = log.start_offset(stream, number)
    end = stable_end(log, stream, number, options.read_committed)
    if position.kind == EARLIEST:
        return first
    if position.kind == LATEST:
        return end
    if position.kind == TIMESTAMP:
        found = log.offset_for_timestamp(stream, number, position.value)
        if found >= end and not options.strategy_latest:
            raise InvalidArgument(
                f"no record of {stream}/{number} has a timestamp at or after "
                f"{position.value // 1000} ms (option {options.starting.option!r}); set "
                f"startingOffsetsByTimestampStrategy=latest to start at the end instead")
        return min(max(found, first), end)
    assert position.kind == OFFSET
    if position.value < first:
        data_loss(f"{stream}/{number}: offsets {position.value}..{first - 1} asked by option "
                  f"{options.starting.option!r} were removed by retention",
                  options.fail_on_data_loss)
        return first
    if position.value > end:
        raise OffsetOutOfRange(f"option {options.starting.option!r} starts {stream}/{number} "
                               f"at offset {position.value}, past its end ({end})")
    return position.value


def resolve_end(log, key: PartitionKey, position: Position, bound: Bound,
                read_committed: bool = True) -> int:
    """Offset (exclusive) where a batch read of one partition ends."""
    stream, number = key
    first = log.start_offset(stream, number)
    end = stable_end(log, stream, number, read_committed)
    if position.kind == LATEST:
        return end
    if position.kind == TIMESTAMP:
        return min(max(log.offset_for_timestamp(stream, number, position.value), first), end)
    assert position.kind == OFFSET
    if position.value > end:
        raise OffsetOutOfRange(f"option {bound.option!r} ends {stream}/{number} at offset "
                               f"{position.value}, past its end ({end})")
    return position.value


def data_loss(message: str, fail: bool) -> bool:
    """Fail with `message`, or log it and go on (failOnDataLoss=false). Returns True."""
    if fail:
        raise OffsetOutOfRange(f"{message}. Set failOnDataLoss=false to skip lost offsets "
                               f"instead of failing.")
    log.warning("%s; skipping them (failOnDataLoss=false)", message)
    return True


# -- pure rules -----------------------------------------------------------------------

def cut_at(ranges: list[tuple[PartitionKey, int, int]],
           bases: dict[PartitionKey, tuple[int, ...]]) -> list[tuple[PartitionKey, int, int]]:
    """Cut (key, start, end) ranges at the offsets `bases` gives for their key (where a
    store's segment objects begin), so that no piece crosses one. The pieces cover each
    range exactly, in order; an empty range stays one empty piece."""
    out = []
    for key, start, end in ranges:
        inner = sorted(b for b in set(bases.get(key, ())) if start < b < end)
        points = [start, *inner, end]
        out += [(key, a, b) for a, b in zip(points, points[1:])]
    assert len(out) >= len(ranges)
    return out


def split_ranges(ranges: list[tuple[PartitionKey, int, int]], *, min_partitions: int | None,
                 max_records: int | None, cores: int) -> list[tuple[PartitionKey, int, int]]:
    """Cut (key, start, end) ranges into Spark partitions.

    Each range is cut into pieces of at most `max_records` offsets when given. Then, while
    there are fewer pieces than the target (`min_partitions`, else `cores`), the largest
    ranges are cut so that the pieces have about equal size; without minPartitions no
    piece is cut below SPLIT_OFFSETS_MIN offsets. Empty ranges are dropped.
    """
    ranges = [(key, start, end) for key, start, end in ranges if end > start]
    target = min_partitions if min_partitions is not None else cores
    floor = 1 if min_partitions is not None else SPLIT_OFFSETS_MIN
    total = sum(end - start for _, start, end in ranges)
    out = []
    for key, start, end in ranges:
        size = end - start
        pieces = 1
        if max_records is not None:
            pieces = math.ceil(size / max_records)
        if target > len(ranges) and total:
            share = math.ceil(target * size / total)
            pieces = max(pieces, min(share, max(1, size // floor)))
        out += [(key, a, b) for a, b in _even_cuts(start, end, pieces)]
    return out


def _even_cuts(start: int, end: int, pieces: int) -> list[tuple[int, int]]:
    assert pieces >= 1
    size = end - start
    bounds = [start + size * i // pieces for i in range(pieces + 1)]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def rate_limit(starts: list[int], ends: list[int], budget: int | None) -> list[int]:
    """Ends of a micro-batch that reads at most `budget` offsets in total.

    The budget is shared in proportion to each partition's backlog (as Kafka's source
    does); rounding leftovers go to the largest remainders, so the batch holds exactly
    min(budget, backlog) offsets and every partition with a backlog gets its share.
    """
    assert len(starts) == len(ends)
    lags = [max(end - start, 0) for start, end in zip(starts, ends)]
    total = sum(lags)
    if budget is None or total <= budget:
        return list(ends)
    shares = [lag * budget // total for lag in lags]
    remainders = sorted(range(len(lags)), key=lambda i: (-(lags[i] * budget % total), i))
    left = budget - sum(shares)
    for i in remainders:
        if left == 0:
            break
        if shares[i] < lags[i]:
            shares[i] += 1
            left -= 1
    assert sum(shares) == budget
    return [start + share for start, share in zip(starts, shares)]
