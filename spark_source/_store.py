"""A log in an object store (s3://BUCKET/PREFIX), read by Spark from the store itself.

Strategy: the Python workers open the URL with streamlog.open_log (remote/view.py), so
the JVM needs no s3a connector: the driver to plan, each executor to read its splits.
The endpoint and credentials come from the storage.<name> options (obstore's names:
storage.endpoint, storage.access_key_id, ...), which travel to the executors inside
every split as Kafka's source carries its kafka.* settings, and otherwise from the
AWS_* variables of each Python worker. Spark gives its Python workers the environment
of the JVM (on a cluster, each executor's), and, for a source registered with
`spark_source.register(spark)`, the session's spark.executorEnv.* settings too (a
source Spark registered by itself does not get those in local mode).

One generation per plan: a view shows one manifest generation at a time, and the
view is opened with no poller to move it on in the background (`open_store`:
remote_poll_ms=0), so everything the driver resolves for one plan (starts, ends, seeks by time, last stable
offsets) and the segment objects it cuts the ranges at (`segment_layout`) come from
the same generation; `refresh()` pins the newest (the streaming driver does at each
trigger). Each partition's range is cut where its segment objects begin, so a split
reads one object (maxRecordsPerPartition and minPartitions may cut further). A split
carries exact offsets and the generation it was planned from; the executor reads from
the newest generation, at least that one (else it says so), which holds the same
records at those offsets, so it returns exactly the planned rows. What retention or a
truncate removed meanwhile goes through failOnDataLoss, as for a local log.

Executors keep their views (`executor_view`): opening one reads the index objects of
every partition (a GET per segment object), which a plan of one split per segment
would pay once per split. A Python worker that Spark reuses for its next task keeps
the view of that URL and those options, and refreshes it before each split (one GET
when no generation is newer), so a worker opens the log once. At most VIEWS_MAX views
per worker, each with a small block cache (a split reads its object once, in order,
the cache fetching ahead of it on background threads while it decodes; not on into
the partition's next object, which another split reads, most likely elsewhere).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import re

from streamlog import InvalidArgument, LogNotFound, StoreError, StoreUnavailable, StreamLogError

STORE_SCHEMES = ("s3://",)
STORAGE_PREFIX = "storage."
# Hadoop's S3 settings, which Spark's file sources take as options.
HADOOP_S3_PREFIXES = ("fs.s3a.", "fs.s3.", "fs.s3n.", "spark.hadoop.fs.s3")
# s3://BUCKET[/PREFIX]: open_log checks it fully (remote/store.py); this only refuses
# at load() what cannot be one.
_STORE_URL = re.compile(r"s3://[A-Za-z0-9._-]+(/[^?#]*)?")
VIEWS_MAX = 4  # views an executor's Python worker keeps
EXECUTOR_CACHE_BYTES = 64 * 2**20  # the block cache of each (remote/storefs.py)
_WHERE_FROM = ("the endpoint and credentials come from options storage.endpoint, "
               "storage.access_key_id, storage.secret_access_key, storage.region, ... or "
               "else from the AWS_* variables (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, "
               "AWS_SECRET_ACCESS_KEY, AWS_REGION) of the driver's and every executor's "
               "Python")


def is_store_url(path: str) -> bool:
    """Whether `path` names a log in an object store (s3://BUCKET/PREFIX)."""
    return path.startswith(STORE_SCHEMES)


def check_store_url(path: str) -> None:
    """Raises InvalidArgument when `path` cannot be s3://BUCKET/PREFIX."""
    if not _STORE_URL.fullmatch(path):
        raise InvalidArgument(f"option 'path' {path!r} is not a log in an object store as "
                              f"streamlog names one: s3://BUCKET/PREFIX (a bucket name of "
                              f"letters, digits, '.', '-' and '_'; no query: the S3 "
                              f"client's options go in storage.* options)")


def storage_options(given: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The storage.<name> options of `given` (lower-case names), as (name, value)
    pairs sorted by name."""
    return tuple(sorted((key[len(STORAGE_PREFIX):], value) for key, value in given.items()
                        if key.startswith(STORAGE_PREFIX)))


def open_store(path: str, storage: tuple[tuple[str, str], ...] = (), **config):
    """The read-only view of the log in the store at `path`, showing the newest
    generation and held there (no polling; `refresh()` moves it on). `config`: LogConfig
    fields.

    Raises:
        LogNotFound when the store holds no log at `path`, StoreUnavailable when the
        store cannot be reached (after the store's retries), StoreError when it refuses
        (credentials, a missing bucket), InvalidArgument for a malformed URL or
        storage option. Each message names option 'path' and says where the endpoint
        and credentials come from.
    """
    import streamlog
    try:
        view = streamlog.open_log(path, storage_options=dict(storage) or None,
                                  **{"remote_poll_ms": 0, **config})  # held: refresh()
    except StoreUnavailable as error:
        raise StoreUnavailable(f"cannot reach the object store of {path} (option 'path'): "
                               f"{_first_line(error)}; {_WHERE_FROM}") from None
    except StoreError as error:
        raise StoreError(f"the object store of {path} (option 'path') refused: "
                         f"{_first_line(error)}; {_WHERE_FROM}") from None
    except InvalidArgument as error:
        if not storage:
            raise
        raise InvalidArgument(f"{_first_line(error)} (options storage.*)") from None
    except LogNotFound as error:
        raise LogNotFound(f"{_first_line(error)} (option 'path'): no log was tiered to "
                          f"this bucket and prefix (open_log(DIR, remote=URL) puts one "
                          f"there with its first sealed segment)") from None
    return view


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


@dataclasses.dataclass(frozen=True)
class SegmentLayout:
    """What a plan of a log in a store was made from: its manifest generation and,
    for each (stream, partition), the base offsets of its segment objects."""

    generation: int
    bases: dict


def segment_layout(view, keys) -> SegmentLayout | None:
    """The layout of the generation `view` shows, for the partitions `keys`; None for
    a log that is not in a store (a directory, a daemon)."""
    remote = getattr(view, "remote_view", None)
    if remote is None:
        return None
    manifest = remote.fs.manifest
    bases = {}
    for stream, number in keys:
        part = manifest.partitions.get(f"{stream}/{number}")
        bases[(stream, number)] = tuple(s.base_offset for s in part.segments) if part else ()
    return SegmentLayout(manifest.generation, bases)


def generation_of(view) -> int:
    """The manifest generation a view of a store shows now."""
    return view.remote_view.fs.manifest.generation


# This Python worker's views, least recently used first: {(url, storage): Log}.
_views: collections.OrderedDict = collections.OrderedDict()


@contextlib.contextmanager
def executor_view(path: str, storage: tuple[tuple[str, str], ...], generation: int):
    """A view of the log at `path` showing generation `generation` or a newer one: the
    one this worker kept, refreshed, or a new one. Kept again after a clean use; closed
    when the use raised (or stopped early).

    Raises:
        What `open_store` and `Log.refresh` raise; StreamLogError when the store's
        newest generation is older than `generation` (this executor does not see the
        store the driver planned from).
    """
    key = (path, storage)
    view = _views.pop(key, None)
    try:
        if view is None:
            view = open_store(path, storage, remote_cache_bytes=EXECUTOR_CACHE_BYTES)
            view.remote_view.fs.read_on = False  # a split ends where its object does
        else:
            view.refresh()
        shown = generation_of(view)
        if shown < generation:
            raise StreamLogError(
                f"{path}: the newest manifest generation this executor finds is {shown}, "
                f"older than generation {generation} that the driver planned this read "
                f"from; do the driver and the executors reach the same store? "
                f"({_WHERE_FROM})")
        yield view
    except BaseException:
        if view is not None:
            view.close()
        raise
    _views[key] = view
    while len(_views) > VIEWS_MAX:
        _, oldest = _views.popitem(last=False)
        oldest.close()
