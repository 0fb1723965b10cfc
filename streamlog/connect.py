"""Opening a log: a local directory, or a daemon at a `streamlog://` URL.

Strategy: the one entry point (`streamlog.open_log`) checks the options against
LogConfig and opens the directory in this process (log.Log), or hands a URL to the
daemon's client (wire/client.py), which has the same API over the network
(api.LogAPI). The storage core never imports the daemon's client: only this module
does, when it is given a URL.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from .clock import SYSTEM_CLOCK
from .config import LogConfig
from .errors import InvalidArgument
from .fileio import OsFileIO
from .log import Log


_FSYNC_DEFAULT: Any = object()  # open_log's fsync when none is given (see there)


def open_log(path, *, fsync: str = _FSYNC_DEFAULT, readonly: bool = False, create: bool = True,
             config: LogConfig | None = None, fileio=None, progress=None, clock=None,
             index_storage=None, remote=None, storage_options=None, **options) -> "Log":
    """Open (and by default create) the log at directory `path`, connect to the
    daemon at a `streamlog://HOST:PORT` URL (token from STREAMLOG_TOKEN), or read the
    log in an object store at an `s3://BUCKET/PREFIX` URL (or an ObjectStore given as
    `path`): read-only, from any machine, with no local state (remote/view.py).

    Args:
        fsync: "always" | "interval" | "never" (see FsyncPolicy). Default: `config`'s,
            else "always"; "never" under durability="remote", whose acks wait for the
            store instead (an open that finds the store ahead of the local log, after a
            power loss, restores those partitions from it).
        readonly: a view: never modifies a file (several processes may write the
            log; a following reader of a view takes their appends in by itself, and
            refresh() takes everything in).
        create: create the directory when missing.
        config: a LogConfig; keyword `options` override its fields.
        progress: called with (partition name, bytes scanned) during recovery.
        clock: where time comes from (streamlog.clock.Clock; the machine's by default).
        index_storage: where the partitions' indexes live instead of LMDB files (tests:
            streamlog.testing.memindex.MemoryIndexStorage, which a simulated power loss
            rolls back with the files).
        remote: tier the log to an object store (DESIGN 11): an `s3://BUCKET/PREFIX`
            URL (endpoint and credentials from the AWS_* variables or
            `storage_options`), or an ObjectStore (streamlog.remote.store; tests:
            streamlog.testing.memstore.MemoryStore). Sealed segments go up in the
            background; the open takes the log over in the store (an older writer of
            it is fenced). Writable opens only.
        storage_options: options of the S3 client (endpoint, access_key_id, ...).
    Raises:
        InvalidArgument for a bad option, StreamLogError when the directory is not a
        log, LogLocked when this process has it open for writing already (share that
        Log: writer_in_this_process), CorruptionError when recovery finds mid-log
        corruption (writable opens). Other processes may have it open for writing.
    """
    from_store = isinstance(path, str) and path.startswith("s3://") or _is_store(path)
    if not isinstance(path, (str, os.PathLike)) and not from_store:
        raise InvalidArgument(f"path must be a str or os.PathLike (got {type(path).__name__})")
    if isinstance(path, str) and path.startswith(("streamlog://", "streamlog+tls://")):
        from .wire.client import open_remote  # the daemon: same API over the network
        return open_remote(path, readonly=readonly, **options)
    base = config or LogConfig()
    unknown = set(options) - set(LogConfig.__dataclass_fields__)
    if unknown:
        raise InvalidArgument(f"unknown option(s): {', '.join(sorted(unknown))}")
    if fsync is _FSYNC_DEFAULT:
        remote_acks = options.get("durability", getattr(base, "durability", None)) == "remote"
        fsync = getattr(base, "fsync", "always") if config is not None else (
            "never" if remote_acks else "always")
    try:
        merged = dataclasses.replace(base, fsync=fsync, **options)
    except TypeError as error:
        raise InvalidArgument(str(error)) from None
    if from_store:  # a log in an object store, read from here with no local state
        if remote is not None or fileio is not None or index_storage is not None:
            raise InvalidArgument("a log opened from its store URL takes no remote=, "
                                  "fileio= or index_storage=")
        from .remote.view import open_view
        return open_view(open_store(path, storage_options), merged.validate(),
                         clock=clock or SYSTEM_CLOCK)
    if merged.durability == "remote" and (remote is None or readonly):
        raise InvalidArgument("durability='remote' needs a store to be durable in: open "
                              "the log writable with remote=URL")
    store = None
    if remote is not None:
        if readonly:
            raise InvalidArgument("remote= tiers a writable open; a read-only open of a "
                                  "log in the store is not supported yet")
        store = open_store(remote, storage_options)
    return Log(os.fspath(path), merged.validate(), readonly=readonly, create=create,
               fileio=fileio or OsFileIO(), progress=progress, clock=clock or SYSTEM_CLOCK,
               index_storage=index_storage, remote=store)


def _is_store(value) -> bool:
    return all(callable(getattr(value, method, None))
               for method in ("put", "get", "get_range", "get_ranges", "list", "delete"))


def open_store(remote, storage_options=None):
    """The object store `remote` names: an `s3://BUCKET/PREFIX` URL (endpoint and
    credentials from `storage_options` or the AWS_* variables), behind retries with
    backoff (remote/store.py), or an ObjectStore given (tests: MemoryStore), as it is.
    Raises InvalidArgument for anything else. Loads the S3 client only for a URL."""
    if isinstance(remote, str):
        from .remote.s3 import S3Store
        from .remote.store import Retrying
        if not remote.startswith("s3://"):
            raise InvalidArgument(f"remote must be an s3://BUCKET/PREFIX URL or an object "
                                  f"store (got {remote!r})")
        return Retrying(S3Store.from_url(remote, storage_options))
    if storage_options is not None:
        raise InvalidArgument("storage_options go with a remote URL, not a store object")
    if not _is_store(remote) or not isinstance(getattr(remote, "url", None), str):
        raise InvalidArgument(f"remote must be an s3:// URL or an object store "
                              f"(got a {type(remote).__name__})")
    return remote
