"""`streamlog serve LOG`: run the daemon (DESIGN 9 and 10).

Strategy: `add_serve_parser(subparsers)` registers the verb on the main command line and
`run_serve(args) -> exit code` runs it, so streamlog/cli/__init__.py wires `serve` with two calls.
`main(argv)` runs the same thing standalone (`python -m streamlog.wire.serve_cli LOG`).

The token comes from STREAMLOG_TOKEN only (never a flag: argv is visible to every user
of the machine); without one the daemon refuses to start (exit 2, one line). It creates
a missing log, logs JSON lines on stderr (the first, "listening", names the ports), and
on SIGTERM or SIGINT drains (module docstring of server.py) and exits 0.

Exit codes: 0 after a drain; 1 the log cannot be opened (corruption, held by another
process) or a port cannot be bound; 2 usage (no token, bad TLS files).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import ssl
import sys

from ..errors import StreamLogError
from . import messages
from .server import (LogServer, Metrics, ServerConfig, TimedFileIO, configure_json_logging)

EXIT_OK, EXIT_DATA, EXIT_USAGE = 0, 1, 2
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def add_serve_parser(subparsers) -> argparse.ArgumentParser:
    """Add the `serve` verb to an argparse subparsers object; returns its parser."""
    parser = subparsers.add_parser(
        "serve", help="serve a log to remote clients (token from STREAMLOG_TOKEN)",
        description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("log", metavar="LOG", help="the log directory (created if missing)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: loopback only)")
    parser.add_argument("--port", type=_port, default=7541, help="default 7541; 0: any free")
    parser.add_argument("--metrics-port", type=_metrics_port, default=7542,
                        help="HTTP port for /healthz and /metrics (default 7542; 0: any "
                             "free; off: none)")
    parser.add_argument("--tls-cert", metavar="FILE", help="serve TLS with this certificate")
    parser.add_argument("--tls-key", metavar="FILE", help="the certificate's private key")
    parser.add_argument("--max-connections", type=_positive, default=256)
    parser.add_argument("--max-frame-bytes", type=_positive, default=messages.FRAME_BYTES_MAX)
    parser.add_argument("--idle-timeout-s", type=float, default=120.0,
                        help="close a connection silent this long (clients ping)")
    parser.add_argument("--txn-timeout-s", type=float, default=900.0,
                        help="abort a transaction left open this long (a client that "
                             "died before committing); 0: never")
    parser.add_argument("--fsync", choices=("always", "interval", "never"), default="always",
                        help="the log's fsync policy (default always: an acknowledged "
                             "append is on stable storage)")
    parser.add_argument("--fsync-interval-ms", type=_positive, default=50)
    parser.add_argument("--scrub-mib-per-s", type=float, default=32.0,
                        help="re-verify sealed segments in the background at most this "
                             "fast (MiB/s; default 32; 0: off); results in the log, in "
                             "/metrics and in `streamlog info`")
    parser.add_argument("--scrub-interval-s", type=float, default=3600.0,
                        help="pause between two scrubbing passes (default 3600)")


def run_serve(args: argparse.Namespace) -> int:
    """Run the daemon until SIGTERM/SIGINT; return the exit code."""
    token = os.environ.get("STREAMLOG_TOKEN", "")
    if not token:
        _say("STREAMLOG_TOKEN is not set; refusing to start a daemon without a token")
        return EXIT_USAGE
    if bool(args.tls_cert) != bool(args.tls_key):
        _say("--tls-cert and --tls-key go together")
        return EXIT_USAGE
    config = ServerConfig(
        token=token.encode(), host=args.host, port=args.port, metrics_port=args.metrics_port,
        tls_cert=args.tls_cert, tls_key=args.tls_key, connections_max=args.max_connections,
        frame_bytes_max=max(args.max_frame_bytes, messages.HELLO_BYTES_MAX),
        idle_timeout_s=args.idle_timeout_s, txn_timeout_s=args.txn_timeout_s)
    configure_json_logging(sys.stderr)
    if args.host not in _LOOPBACK:
        logging.getLogger("streamlog.wire.server").warning(
            "not_loopback", extra={"fields": {"host": args.host, "tls": bool(args.tls_cert)}})
    metrics = Metrics()
    from ..log import open_log
    try:
        log = open_log(args.log, fsync=args.fsync, fsync_interval_ms=args.fsync_interval_ms,
                       fileio=TimedFileIO(metrics.fsync_seconds),
                       scrub_interval_s=args.scrub_interval_s)
    except StreamLogError as error:
        _say(f"cannot open {args.log}: {error}")
        return EXIT_DATA
    except OSError as error:
        _say(f"cannot open {args.log}: {error.strerror or error}")
        return EXIT_DATA
    if args.scrub_mib_per_s > 0:
        from .server import count_scrub_result
        log.start_scrubber(bytes_per_s=max(int(args.scrub_mib_per_s * (1 << 20)), 1),
                           on_result=lambda result: count_scrub_result(metrics, result))
    return asyncio.run(_serve(log, config, metrics))


async def _serve(log, config: ServerConfig, metrics: Metrics) -> int:
    server = LogServer(log, config, metrics)
    try:
        await server.start()
    except (ssl.SSLError, FileNotFoundError, IsADirectoryError) as error:
        await asyncio.to_thread(log.close)
        _say(f"TLS: cannot load {config.tls_cert} / {config.tls_key}: {error}")
        return EXIT_USAGE
    except OSError as error:
        await asyncio.to_thread(log.close)
        _say(f"cannot listen on {config.host}:{config.port}: {error.strerror or error}")
        return EXIT_DATA
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, stop.set)
    await stop.wait()
    await server.drain()
    return EXIT_OK


def _say(message: str) -> None:
    print(f"streamlog serve: {message}", file=sys.stderr, flush=True)


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a port")
    return value


def _metrics_port(text: str) -> int | None:
    return None if text.lower() in ("off", "none") else _port(text)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be a positive integer")
    return value


def main(argv: list[str] | None = None) -> None:
    """Standalone entry point: the arguments of `streamlog serve`."""
    parser = argparse.ArgumentParser(prog="streamlog serve",
                                     description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    sys.exit(run_serve(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
