"""The `streamlog` command line: append, read, info, dump, verify, repair (DESIGN 10).

Strategy: one `argparse` subcommand per verb; each command module has `add(subparsers)`,
which registers it with its `run(args) -> exit code`, and is named in `COMMANDS`. Only
the module of the command that runs is imported (all of them for the top-level help, or
for a word that is no command): a `read` loads neither the daemon nor the Kafka
listener, nor the other commands.
`main()` is the only place that turns exceptions into exit codes and one-line messages;
the table of exit codes is the top-level help's epilog (_MAIN_EPILOG), the one place
users and this code read it from.

One module per command (append.py, read.py, info.py, dump.py, verify.py, repair.py;
`serve` is streamlog/wire/serve_cli.py), what they share in common.py. `append` and
`read` go through the public API (`open_log`); `read` opens the log read-only, which
never modifies a file. `info`, `dump`, `verify` and `repair` judge the files with the
same walker and decision table as an open (check.py, integrity.py), so no two commands
disagree about the same bytes.

LOG may also be a log in an object store (s3://BUCKET/PREFIX): `read`, `info`, `dump`
and `verify` read it through its read-only view (store.py),
and the commands that write (`append`, `repair`, `serve`) refuse it with exit 2. A store
that cannot be reached, or refuses the credentials, is exit 3, as a daemon is.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from ..errors import (CorruptionError, InvalidArgument, LogLocked, ObjectNotFound,
                      OffsetOutOfRange, ReadOnlyLog, StoreError, StreamLogError,
                      UnknownStream)
from .common import (EXIT_BROKEN_PIPE, EXIT_DAEMON, EXIT_DATA, EXIT_INTERRUPTED, EXIT_USAGE,
                     CliError, DataError, Parser, UsageError, format_timestamp,
                     parse_timestamp, refuse_store)

# The commands in the order the help lists them; each is the module of this package of
# that name, but `serve`, which is the daemon's (_add_serve).
COMMANDS = ("append", "read", "info", "dump", "verify", "repair", "serve")


def _add_serve(subparsers) -> None:
    from ..wire.serve_cli import add_serve_parser, run_serve

    def run(args) -> int:
        refuse_store(args.log, "serve")  # it would take s3:/... for a directory
        return run_serve(args)

    add_serve_parser(subparsers).set_defaults(run=run)


def _commands(command: str | None = None):
    """The `add` functions of `command` alone when it is one of COMMANDS, else of all."""
    names = (command,) if command in COMMANDS else COMMANDS
    return [_add_serve if name == "serve" else _command_module(name).add for name in names]


def _command_module(name: str):
    return importlib.import_module(f".{name}", __package__)


def _command_in(argv: list[str]) -> str | None:
    """The command word of a command line: its first word, unless that is an option (the
    top level has only -h: `streamlog -h read` asks for the top-level help)."""
    return argv[0] if argv and not argv[0].startswith("-") else None


_MAIN_EPILOG = """\
exit codes (every command):
  0    success
  1    corruption found, or a data error (damaged files, a failed write)
  2    usage errors and malformed input: a bad option or stream name, a malformed
       input line, an unknown stream, a LOG that is a file, not a log, or missing
       (append creates it; read --follow waits for it), a log that another process
       has open for writing when repair needs it alone
  3    cannot reach or authenticate to a daemon (streamlog://HOST:PORT) or an
       object store (s3://BUCKET/PREFIX), after the store's retries
  130  interrupted (Ctrl-C);  141  stdout was closed by its reader (e.g. `| head`)
Errors are one line on stderr ("streamlog: error: ..."), never a traceback.

environment:
  STREAMLOG_TOKEN     the daemon's token, for a LOG that is streamlog://HOST:PORT
  AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION
                      the object store and its credentials, for a LOG that is
                      s3://BUCKET/PREFIX (a log tiered to the store, read from
                      anywhere: read, info, dump and verify take it; it is read-only)
  STREAMLOG_PROGRESS  progress bars go to stderr when it is a terminal; 0 turns them
                      off, 1 shows them anywhere
  STREAMLOG_DEBUG     1: an unexpected error (a bug) shows its traceback

examples:
  echo '{"value": "hello"}' | streamlog append data/log --stream events
  streamlog read data/log --stream events --from-end --follow
  streamlog verify data/log || streamlog repair data/log --dry-run
  streamlog read s3://my-bucket/logs/orders --stream events --from-offset 100
  STREAMLOG_TOKEN=secret streamlog serve data/log

Run 'streamlog COMMAND --help' for a command's options and examples.
"""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser: with `command` (one of COMMANDS), that command's only
    (what main builds to run it); else every command's."""
    parser = Parser(prog="streamlog", description="A durable stream log.",
                    epilog=_MAIN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in _commands(command):
        add(subparsers)
    return parser


# -- main ------------------------------------------------------------------------------

def _configure_logging(show_warnings: bool) -> None:
    """Recovery warnings (a torn tail truncated) as one line each when writing; read-only
    commands report what they find themselves."""
    logger = logging.getLogger("streamlog")
    logger.propagate = False
    logger.handlers[:] = []
    if not show_warnings:
        logger.addHandler(logging.NullHandler())
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("streamlog: warning: %(message)s"))
    handler.addFilter(lambda record: record.levelno == logging.WARNING)
    logger.addHandler(handler)


def _exit_code(error: BaseException) -> int:
    from ..wire.codes import DaemonError, ProtocolError
    if isinstance(error, CliError):
        return error.code
    if isinstance(error, (DaemonError, ProtocolError)):
        return EXIT_DAEMON
    if isinstance(error, StoreError) and not isinstance(error, ObjectNotFound):
        return EXIT_DAEMON  # the object store failed or refused (after its retries)
    if isinstance(error, CorruptionError):
        return EXIT_DATA
    if isinstance(error, (InvalidArgument, UnknownStream, OffsetOutOfRange, ReadOnlyLog,
                          LogLocked)):
        return EXIT_USAGE
    if isinstance(error, (StreamLogError, OSError)):
        return EXIT_DATA
    return EXIT_USAGE  # ValueError from what the user gave


def _quiet_stdout() -> None:
    """After a broken pipe, point stdout at /dev/null so the interpreter's final flush
    does not complain."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code (the console script exits with it)."""
    if argv is None:
        argv = sys.argv[1:]
    args = build_parser(_command_in(argv)).parse_args(argv)
    _configure_logging(getattr(args, "show_warnings", False))
    try:
        return args.run(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    except (StreamLogError, CliError, OSError, ValueError) as error:
        sys.stderr.write(f"streamlog: error: {_first_line(error)}\n")
        return _exit_code(error)
    except Exception as error:  # noqa: BLE001 - a bug: still one line, unless asked
        if os.environ.get("STREAMLOG_DEBUG", "").strip() == "1":
            raise
        sys.stderr.write(f"streamlog: error: unexpected {type(error).__name__}: "
                         f"{_first_line(error)} (a bug; STREAMLOG_DEBUG=1 shows where)\n")
        return EXIT_DATA


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def __getattr__(name: str):
    if name == "parse_append_line":  # the append command's, imported when asked for
        from .append import parse_append_line
        return parse_append_line
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["main", "build_parser", "parse_timestamp", "format_timestamp", "parse_append_line",
           "CliError", "UsageError", "DataError"]
