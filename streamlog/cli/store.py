"""The command line's side of a log in an object store (LOG = s3://BUCKET/PREFIX).

Strategy: `open_readonly` opens any LOG to read it. A store URL is read through the
read-only view `open_log` gives for it (remote/view.py: the newest manifest generation
as a directory, the segment objects read by ranges, the indexes built from the index
objects), so `read` and `info` use it as they use a local view, and `verify` and
`dump` hand its file layer and index storage to check.py as they hand it a directory
(`log_files`). This module imports none of the store's modules (obstore): open_log
loads them only for a store URL, so the command line starts as fast as before.

Errors: a store that cannot be reached (after the store's own retries) or refuses the
request is `UnreachableError`, exit 3 as for a daemon; a prefix with no log is a usage
error, exit 2, as a missing directory is.
"""

from __future__ import annotations

import dataclasses

from ..connect import open_log
from ..errors import LogNotFound, ObjectNotFound, StoreError, StoreUnavailable
from .common import EXIT_DAEMON, CliError, UsageError, existing_log, files_path, is_store_url


class UnreachableError(CliError):
    """An object store that cannot be reached, or that refuses the request."""

    code = EXIT_DAEMON


def open_readonly(path: str):
    """A read-only Log of LOG: a directory, a daemon's log, or a log in a store."""
    if is_store_url(path):
        return open_store(path)
    return open_log(path, readonly=True, create=False)


def open_store(url: str, **config):
    """The read-only view of the log in the object store at `url` (its newest manifest
    generation, followed unless `remote_poll_ms=0`; `config`: LogConfig fields).
    Raises UsageError when there is no log there,
    UnreachableError when the store cannot be reached or refuses the request (after
    the store's retries), InvalidArgument for a malformed URL."""
    try:
        return open_log(url, readonly=True, create=False, **config)
    except ObjectNotFound:
        raise
    except StoreUnavailable as error:
        raise UnreachableError(f"cannot reach the object store of {url}: "
                               f"{_first_line(error)}") from None
    except StoreError as error:
        raise UnreachableError(f"the object store of {url} refused the request: "
                               f"{_first_line(error)}") from None
    except LogNotFound as error:
        raise UsageError(_first_line(error)) from None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


@dataclasses.dataclass
class LogFiles:
    """Where `verify` and `dump` read a log's files (check.py): a local directory
    (`fileio` and `index_storage` None: the file system and the LMDB index files), or
    the log in an object store, through its read-only view's file layer, held at one
    manifest generation while the command runs (`view`: that view, closed by close)."""

    path: str
    fileio: object = None
    index_storage: object = None
    view: object = None

    def name_of(self, segment_path: str) -> str:
        """How to name a segment in messages: its path, or the URL of its object."""
        found = getattr(self.fileio, "segment_object", None)
        segment = found(segment_path) if found is not None else None
        return segment_path if segment is None else f"{self.path}/{segment.key}"

    def close(self) -> None:
        if self.view is not None:
            self.view.close()

    def __enter__(self) -> "LogFiles":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def log_files(log: str, command: str) -> LogFiles:
    """The files of LOG for `command` (verify, dump): a local log directory, checked,
    or a log in an object store. A daemon URL is a usage error."""
    path = existing_log(files_path(log, command))
    if not is_store_url(path):
        return LogFiles(path)
    view = open_store(path, remote_poll_ms=0)  # one generation for the whole command
    return LogFiles(view.path, view.fileio, view.index_storage, view)
