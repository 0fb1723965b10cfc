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

from .clock import SYSTEM_CLOCK
from .config import LogConfig
from .errors import InvalidArgument
from .fileio import OsFileIO
from .log import Log


def open_log(path, *, fsync: str = "always", readonly: bool = False, create: bool = True,
             config: LogConfig | None = None, fileio=None, progress=None, clock=None,
             index_storage=None, **options) -> "Log":
    """Open (and by default create) the log at directory `path`, or connect to the
    daemon at a `streamlog://HOST:PORT` URL (token from STREAMLOG_TOKEN).

    Args:
        fsync: "always" | "interval" | "never" (see FsyncPolicy).
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
    Raises:
        InvalidArgument for a bad option, StreamLogError when the directory is not a
        log, LogLocked when this process has it open for writing already (share that
        Log: writer_in_this_process), CorruptionError when recovery finds mid-log
        corruption (writable opens). Other processes may have it open for writing.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgument(f"path must be a str or os.PathLike (got {type(path).__name__})")
    if isinstance(path, str) and path.startswith(("streamlog://", "streamlog+tls://")):
        from .wire.client import open_remote  # the daemon: same API over the network
        return open_remote(path, readonly=readonly, **options)
    base = config or LogConfig()
    unknown = set(options) - set(LogConfig.__dataclass_fields__)
    if unknown:
        raise InvalidArgument(f"unknown option(s): {', '.join(sorted(unknown))}")
    try:
        merged = dataclasses.replace(base, fsync=fsync, **options)
    except TypeError as error:
        raise InvalidArgument(str(error)) from None
    return Log(os.fspath(path), merged.validate(), readonly=readonly, create=create,
               fileio=fileio or OsFileIO(), progress=progress, clock=clock or SYSTEM_CLOCK,
               index_storage=index_storage)
