"""What the `streamlog` commands share: exit codes, errors, text forms of timestamps and
bytes, argument types, opening a log, and the progress display.

Strategy: commands raise `UsageError` (exit 2) or `DataError` (exit 1) for what the user
gave or what the files hold; `streamlog.cli.main` turns every exception into one line on
stderr and an exit code. Nothing here writes to a log.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import os
import re
import sys
import time

from ..log import open_log

EXIT_OK, EXIT_DATA, EXIT_USAGE, EXIT_DAEMON = 0, 1, 2, 3
EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 130, 141
DAEMON_SCHEME = "streamlog://"
# Progress on a terminal: shown only for work that lasts, refreshed a few times a second.
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


# -- timestamps and bytes as text ------------------------------------------------------

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
    """out[name] = text when `data` is valid UTF-8, else out[name_b64] = base64."""
    if data is None:
        out[name] = None
        return
    try:
        out[name] = data.decode("utf-8")
    except UnicodeDecodeError:
        out[name + "_b64"] = base64.b64encode(data).decode("ascii")


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


def subparser(subparsers, name: str, summary: str, epilog: str) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(name, help=summary, description=summary, epilog=epilog,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", metavar="LOG",
                        help="the log directory, or a daemon URL streamlog://HOST:PORT "
                             "(token from STREAMLOG_TOKEN)")
    return parser


# -- shared by the commands ------------------------------------------------------------

def is_url(log: str) -> bool:
    return log.startswith((DAEMON_SCHEME, "streamlog+tls://"))


def local_path(log: str, command: str = "this command") -> str:
    if is_url(log):
        raise UsageError(f"{command} reads segment files directly: run it on the daemon's "
                         f"machine with the log directory")
    return log


def existing_log(log: str) -> str:
    if is_url(log):
        return log
    path = local_path(log)
    if not os.path.isdir(path):
        raise UsageError(f"no log at {path}")
    if not has_marker(path):
        raise UsageError(f"{path} is not a streamlog log (no streamlog.json)")
    return path


def has_marker(path: str) -> bool:
    return os.path.exists(os.path.join(path, "streamlog.json"))


def open_readonly(path: str):
    return open_log(path, readonly=True, create=False)


class Progress:
    """A one-line progress display on stderr, only when stderr is a terminal and only
    once the work has lasted PROGRESS_DELAY_S; erased by `finish`."""

    def __init__(self, label: str, total: int, unit: str) -> None:
        self.label, self.total, self.unit = label, total, unit
        self.enabled = sys.stderr.isatty()
        self.started = time.monotonic()
        self.shown_at = 0.0
        self.visible = False

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.started < PROGRESS_DELAY_S or now - self.shown_at < PROGRESS_EVERY_S:
            return
        share = f" ({100 * done // self.total}%)" if self.total > 0 else ""
        sys.stderr.write(f"\r{self.label}: {done:,} of {self.total:,} {self.unit}{share}\x1b[K")
        sys.stderr.flush()
        self.shown_at, self.visible = now, True

    def finish(self) -> None:
        if self.visible:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self.visible = False


