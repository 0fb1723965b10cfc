"""What the `streamlog` commands share: exit codes, errors, text forms of timestamps,
bytes and headers, argument types, checking and opening a log, and progress bars.

Strategy: commands raise `UsageError` (exit 2) or `DataError` (exit 1) for what the user
gave or what the files hold; `streamlog.cli.main` turns every exception into one line on
stderr and an exit code. What the user gave is checked before anything is created or
opened (a bad stream name never leaves an empty log behind). Nothing here writes to a
log.

LOG is a local directory, a daemon URL (streamlog://HOST:PORT) or a log in an object
store (s3://BUCKET/PREFIX); opening a log to read it (any of the three) is store.py's.
Commands that write refuse a store URL before anything is opened.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import datetime
import json
import os
import re
import sys

from .. import layout, validate
from ..config import LogConfig
from ..errors import InvalidArgument

EXIT_OK, EXIT_DATA, EXIT_USAGE, EXIT_DAEMON = 0, 1, 2, 3
EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 130, 141
DAEMON_SCHEMES = ("streamlog://", "streamlog+tls://")
STORE_SCHEMES = ("s3://",)
# Progress bars (tqdm) on stderr: only when it is a terminal, only for work that lasts
# PROGRESS_DELAY_S, refreshed every PROGRESS_EVERY_S. STREAMLOG_PROGRESS=0 turns them
# off, =1 shows them whatever stderr is (and at once).
PROGRESS_ENV = "STREAMLOG_PROGRESS"
PROGRESS_DELAY_S = 1.0
PROGRESS_EVERY_S = 0.25
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
_INTEGER = re.compile(r"^[+-]?\d+$")


class CliError(Exception):
    """An error the command reports in one line and turns into its exit code."""

    code = EXIT_DATA


class UsageError(CliError):
    code = EXIT_USAGE


class DataError(CliError):
    code = EXIT_DATA



# -- timestamps, bytes and headers as text ---------------------------------------------

def parse_timestamp(text: str) -> int:
    """Integer microseconds since the epoch, or ISO-8601 (UTC when no zone is given).

    A string of digits (optionally signed) is microseconds, never a basic-format date.
    Raises ValueError with a sentence for anything else.
    """
    text = text.strip()
    if _INTEGER.match(text):
        value = int(text)
    else:
        try:
            moment = datetime.datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(f"timestamp {text!r} is neither integer microseconds "
                             f"nor ISO-8601") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=datetime.timezone.utc)
        value = (moment - _EPOCH) // datetime.timedelta(microseconds=1)
    if not _INT64_MIN < value <= _INT64_MAX:
        raise ValueError(f"timestamp {text!r} is out of the int64 microseconds range")
    return value


def format_timestamp(timestamp_us: int | None) -> str | None:
    """ISO-8601 in UTC with microseconds and a Z, or None when out of datetime's range."""
    if timestamp_us is None:
        return None
    try:
        moment = _EPOCH + datetime.timedelta(microseconds=timestamp_us)
    except OverflowError:
        return None
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def put_bytes(out: dict, name: str, data: bytes | None) -> None:
    """out[name] = text when `data` is valid UTF-8, else out[name_b64] = base64;
    out[name] = null when `data` is None (no key, a tombstone's value)."""
    if data is None:
        out[name] = None
        return
    try:
        out[name] = data.decode("utf-8")
    except UnicodeDecodeError:
        out[name + "_b64"] = base64.b64encode(data).decode("ascii")


def put_headers(out: dict, headers) -> None:
    """A record's headers ((name, bytes or None) pairs) as the `_b64` rule of values has
    it, for the whole object: out["headers"] = {name: text} when every value is valid
    UTF-8, else out["headers_b64"] = {name: base64} with every value in base64; a None
    value is null in either. Nothing when there are none. A name that occurs twice is
    kept twice (see _Pairs)."""
    if not headers:
        return
    try:
        out["headers"] = _Pairs((name, _or_null(value, _utf8)) for name, value in headers)
    except UnicodeDecodeError:
        out["headers_b64"] = _Pairs((name, _or_null(value, _base64))
                                    for name, value in headers)


def _or_null(value: bytes | None, convert):
    return None if value is None else convert(value)


def _utf8(value: bytes) -> str:
    return value.decode("utf-8")


def _base64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


class _Pairs(dict):
    """Header (name, text) pairs as a JSON object: json.dumps writes a dict subclass
    from its items(), so the names keep their order and a repeated name is kept."""

    def __init__(self, pairs) -> None:
        self._pairs = list(pairs)
        super().__init__(self._pairs)

    def items(self):
        return list(self._pairs)


class ObjectPairs(dict):
    """json.loads(..., object_pairs_hook=ObjectPairs): a dict that also keeps every
    (name, value) pair in order, a repeated name included (for headers)."""

    def __init__(self, pairs) -> None:
        super().__init__(pairs)
        self.pairs = pairs


def parse_headers(item: dict) -> list[tuple[str, bytes | None]] | None:
    """The headers of an input line: `headers` {name: text} or `headers_b64`
    {name: base64} (the forms `read` writes), as (name, bytes) pairs, a null value as
    None; None when absent or null. A name given twice is kept twice when the line was
    parsed with object_pairs_hook=ObjectPairs. Raises ValueError with a sentence."""
    text, encoded = item.get("headers"), item.get("headers_b64")
    if text is not None and encoded is not None:
        raise ValueError("give headers or headers_b64, not both")
    name, found = ("headers_b64", encoded) if encoded is not None else ("headers", text)
    if found is None:
        return None
    if not isinstance(found, dict):
        raise ValueError(f"{name} must be a JSON object of strings")
    out = []
    for key, value in getattr(found, "pairs", None) or found.items():
        try:
            too_long = len(key.encode("utf-8")) >= 1 << 16
        except UnicodeEncodeError:
            raise ValueError(f"header name {key!r} is not valid Unicode") from None
        if too_long:
            raise ValueError(f"header name {key[:40]!r}... is 64 KiB or longer")
        if value is None:
            out.append((key, None))
            continue
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a JSON object of strings "
                             f"(header {key!r} is not)")
        if encoded is None:
            try:
                out.append((key, value.encode("utf-8")))
            except UnicodeEncodeError:
                raise ValueError(f"header {key!r} is not valid Unicode") from None
            continue
        try:
            out.append((key, base64.b64decode(value, validate=True)))
        except binascii.Error:
            raise ValueError(f"header {key!r} of headers_b64 is not valid base64") from None
    if len(out) >= 1 << 16:
        raise ValueError(f"{len(out)} headers; at most 65535")
    return out


def json_line(item: dict) -> bytes:
    return json.dumps(item, ensure_ascii=False).encode("utf-8") + b"\n"


# -- the parser ------------------------------------------------------------------------

class Parser(argparse.ArgumentParser):
    """Usage errors are one line on stderr and exit 2, like every other error."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"streamlog: error: {message} (see '{self.prog} --help')\n")


def positive_int(text: str) -> int:
    value = nonnegative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def nonnegative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value


def timestamp_arg(text: str) -> int:
    try:
        return parse_timestamp(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def stream_arg(text: str) -> str:
    """--stream: checked before the log is opened (or created)."""
    try:
        return validate.stream_name(text)
    except InvalidArgument as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def partitions_arg(text: str) -> int:
    value = positive_int(text)
    limit = LogConfig().partitions_max
    if value > limit:
        raise argparse.ArgumentTypeError(f"at most {limit} partitions, got {text!r}")
    return value


LOG_HELP_ANY = ("the log directory, a daemon URL streamlog://HOST:PORT (token from "
                "STREAMLOG_TOKEN), or a log in an object store s3://BUCKET/PREFIX, read "
                "from here (endpoint and credentials from AWS_ENDPOINT_URL, "
                "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION)")
LOG_HELP_WRITE = ("the log directory, or a daemon URL streamlog://HOST:PORT (token from "
                  "STREAMLOG_TOKEN); not an s3:// URL: a log in an object store is "
                  "read-only here")
LOG_HELP_FILES = ("the log directory, or a log in an object store s3://BUCKET/PREFIX "
                  "(endpoint and credentials from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, "
                  "AWS_SECRET_ACCESS_KEY, AWS_REGION): this command reads the segment "
                  "files (objects) directly, so it does not take a daemon URL")
LOG_HELP_LOCAL = ("the log directory (a local path: this command reads the segment files "
                  "directly, so it does not take a daemon URL, and changes them, so it "
                  "does not take an s3:// URL either)")


def subparser(subparsers, name: str, summary: str, epilog: str, *,
              url: bool = True, store: bool = True) -> argparse.ArgumentParser:
    """A subcommand whose first argument is LOG; `url`: may LOG be a daemon URL?
    `store`: may it be a log in an object store (s3://)?"""
    parser = subparsers.add_parser(name, help=summary, description=summary, epilog=epilog,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    text = {(True, True): LOG_HELP_ANY, (True, False): LOG_HELP_WRITE,
            (False, True): LOG_HELP_FILES, (False, False): LOG_HELP_LOCAL}[(url, store)]
    parser.add_argument("log", metavar="LOG", help=text)
    return parser


# -- checking and opening a log --------------------------------------------------------

def is_url(log: str) -> bool:
    """Is LOG a daemon URL?"""
    return log.startswith(DAEMON_SCHEMES)


def is_store_url(log: str) -> bool:
    """Is LOG a log in an object store (s3://BUCKET/PREFIX)?"""
    return log.startswith(STORE_SCHEMES)


def files_path(log: str, command: str) -> str:
    """LOG of a command that reads the files itself (a directory, or the objects of a
    log in a store): a daemon URL is a usage error."""
    if is_url(log):
        raise UsageError(f"{command} reads the segment files directly, so it needs a local "
                         f"log directory, not a daemon URL: run it on the daemon's machine")
    return log


def local_path(log: str, command: str) -> str:
    """LOG of a command that changes the files: a URL of either kind is a usage error."""
    refuse_store(log, command)
    return files_path(log, command)


def refuse_store(log: str, command: str) -> None:
    """UsageError when LOG is a log in an object store: `command` writes, and such a
    log is only read from here (its writer is the local log tiered to it)."""
    if is_store_url(log):
        raise UsageError(f"{command} writes to the log, and {log} is a log in an object "
                         f"store, which is read-only here: run {command} on the local log "
                         f"directory tiered to it")


def refuse_non_directory(path: str) -> None:
    """UsageError when `path` (or the nearest part of it that exists) is a file, so it
    cannot be a log directory; nothing when it is a directory or could become one."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            return
        probe = parent
    if os.path.isdir(probe):
        return
    if probe == os.path.abspath(path):
        raise UsageError(f"{path} is a file, not a log directory")
    raise UsageError(f"{path} cannot be a log directory: {probe} is a file")


def foreign_directory(path: str) -> bool:
    """Is `path` a directory that holds files but no log (never written into)?"""
    return os.path.isdir(path) and not has_marker(path) and any(
        name not in ("LOCK", "streamlog.json.tmp") for name in os.listdir(path))


def existing_log(log: str) -> str:
    """LOG of a command that needs the log to be there (a URL passes as it is: opening
    it says whether there is a log)."""
    if is_url(log) or is_store_url(log):
        return log
    refuse_non_directory(log)
    if not os.path.isdir(log):
        raise UsageError(f"no log at {log}")
    if not has_marker(log):
        raise UsageError(f"{log} is not a streamlog log (no streamlog.json)")
    return log


def writable_log(log: str) -> str:
    """LOG of `append`: a log, a missing directory (created), or an empty one; a
    daemon URL; never a log in an object store."""
    refuse_store(log, "append")
    if not is_url(log):
        refuse_non_directory(log)
        if foreign_directory(log):
            raise UsageError(f"{log} is not empty and not a streamlog log; refusing to "
                             f"write into it")
    return log


def has_marker(path: str) -> bool:
    return os.path.exists(os.path.join(path, "streamlog.json"))


# -- progress --------------------------------------------------------------------------

def progress_wanted(*, writes_stdout: bool = False) -> bool:
    """Show a progress bar? When stderr is a terminal (and, for a command whose output
    goes to stdout, that output is not on a terminal too, where the bar would mix with
    it); STREAMLOG_PROGRESS=0 or 1 decides instead."""
    forced = os.environ.get(PROGRESS_ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    try:
        if not sys.stderr.isatty():
            return False
        return not (writes_stdout and sys.stdout.isatty())
    except (AttributeError, ValueError):  # closed or replaced streams
        return False


def progress_bar(label: str, total: int | None = None, *, unit: str = "records",
                 in_bytes: bool = False, writes_stdout: bool = False, enabled: bool = True):
    """A tqdm bar on stderr, disabled unless `enabled` and progress_wanted(); erased
    when closed. Use as a context manager or close() it; `update(n)` adds n. `in_bytes`:
    the unit is bytes, shown as KiB, MiB, ..."""
    if not (enabled and progress_wanted(writes_stdout=writes_stdout)):
        return _NoBar()  # (tqdm is not imported: a command that shows none starts sooner)
    from tqdm import tqdm
    forced = os.environ.get(PROGRESS_ENV, "").strip() == "1"
    try:
        size = os.get_terminal_size(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):
        size = None
    # A terminal that reports no size (a bare pty) would make tqdm print nothing.
    fixed = {} if size and size.columns and size.lines else {"ncols": 80, "nrows": 24}
    return tqdm(total=total, desc=label, unit="B" if in_bytes else " " + unit,
                unit_scale=True, unit_divisor=1024 if in_bytes else 1000,
                file=sys.stderr, leave=False, dynamic_ncols=not fixed,
                delay=0 if forced else PROGRESS_DELAY_S,
                mininterval=0 if forced else PROGRESS_EVERY_S, **fixed)


class _NoBar:
    """The bar not shown: what a disabled tqdm bar does (nothing; its `n` stays 0)."""

    n = 0

    def update(self, count: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> "_NoBar":
        return self

    def __exit__(self, *exc_info) -> None:
        pass


def segment_bytes(directory: str, fileio=None) -> int:
    """The bytes of a partition directory's segment files (a progress bar's total),
    through `fileio` when given (a log in a store: the sizes its manifest gives)."""
    if fileio is None:
        if not os.path.isdir(directory):
            return 0
        return sum(os.path.getsize(os.path.join(directory, name))
                   for name in os.listdir(directory)
                   if layout.parse_segment_name(name) is not None)
    if not fileio.exists(directory):
        return 0
    total = 0
    for name in fileio.listdir(directory):
        if layout.parse_segment_name(name) is not None:
            handle = fileio.open(os.path.join(directory, name), writable=False)
            try:
                total += fileio.size(handle)
            finally:
                fileio.close(handle)
    return total


def plural(count: int, noun: str) -> str:
    """The count and the noun: 1 partition, 2 partitions."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def advance_to(bar, done: int) -> None:
    """Move a bar to `done` (for callbacks that report a running total)."""
    if done > bar.n:
        bar.update(done - bar.n)
