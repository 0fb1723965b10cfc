"""`streamlog serve LOG`: run the daemon that serves a log over TCP.

Strategy: `add_serve_parser(subparsers)` registers the verb on the main command line and
`run_serve(args) -> exit code` runs it, so streamlog/cli/__init__.py wires `serve` with two calls.
`main(argv)` runs the same thing standalone (`python -m streamlog.wire.serve_cli LOG`).

The token comes from STREAMLOG_TOKEN only (never a flag: argv is visible to every user
of the machine); without one the daemon refuses to start (exit 2, one line). The data
port and the metrics port (default: the data port + 1) are bound first, then the log is
opened (created when missing), so a port in use fails before anything is created. It
logs JSON lines on stderr (the first, "listening", names the ports) and on SIGTERM or
SIGINT drains both ports at once (server.py's and kafka/server.py's module docstrings),
closes the log and exits 0: within drain_timeout_s (30 s) and about a second, plus the
log's close, even with clients that never read their answers. The signal handlers are
installed before anything is bound, so a signal is never lost; one that comes during
the open drains as soon as the log is open.

Exit codes: 0 after a drain; 1 the log cannot be opened (corruption, a data error);
2 usage: no token, bad TLS files, a port that cannot be bound (in use, not allowed;
the message names the port and says "data", "metrics", "kafka" or "console"). The help's epilog
is the operator's documentation. With --kafka-port the Kafka listener (kafka/) is
bound with the others and serves the same log once it is open.
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
from .metrics import Metrics, TimedFileIO, count_scrub_result
from .server import (ListenError, Listeners, LogServer, ServerConfig,
                     configure_json_logging)

EXIT_OK, EXIT_DATA, EXIT_USAGE = 0, 1, 2
DEFAULT_PORT = 7541
NO_METRICS = "none"  # --metrics-port none: no HTTP port
_LOOPBACK = ("127.0.0.1", "localhost", "::1")

_SUMMARY = "serve a log to remote clients over TCP (token from STREAMLOG_TOKEN)"

_EPILOG = """\
Serves the log directory LOG (created if missing) to remote clients: the Python API
through streamlog.open_log("streamlog://HOST:PORT"), and every streamlog command except
dump, verify and repair given that URL in place of LOG.

token:
  The daemon reads its token from the environment variable STREAMLOG_TOKEN (never from
  a flag: the command line is visible to every user of the machine) and refuses to
  start without one (exit 2). Clients send the same token: the streamlog commands and
  open_log take it from STREAMLOG_TOKEN too.

ports:
  --port P (default 7541; 0: any free port) is the data port, streamlog's own protocol.
  --metrics-port M (default P+1, that is 7542; any free port when P is 0; 0: any free
  port; none: no HTTP port at all) serves plain HTTP without a token, on --host:
    GET /healthz  200 {"status": "ok", "connections": N}; 503 while starting or draining
    GET /metrics  Prometheus metrics, streamlog_* (the text format; OpenMetrics when the
                  scraper asks for it): appends, reads, connections, tailers and their
                  lag, fsync and append latency, scrubbing (each counter and
                  histogram also has a NAME_created series, the library's default;
                  PROMETHEUS_DISABLE_CREATED_SERIES=True in the environment drops them)
  The first log line ("listening") names both ports. A port in use is one line naming
  it (data or metrics port) and exit 2; nothing is created then.
  --console-port C (default P+2, that is 7543; any free port when P is 0; 0: any
  free port; none: no console) serves the web console (below).
  --host other than loopback exposes the daemon to the network: use TLS there.

TLS:
  --tls-cert FILE --tls-key FILE (PEM, both together) serve the data port over TLS;
  clients connect to streamlog+tls://HOST:PORT. The metrics port stays plain HTTP.

Kafka:
  --kafka-port K also speaks the Apache Kafka protocol on --host:K (0: any free port),
  so unmodified Kafka clients (librdkafka/kcat, confluent-kafka, kafka-python,
  aiokafka) produce and consume: a topic is a stream, partitions and offsets are the
  same, this daemon is the one broker. Clients authenticate with SASL/PLAIN, user
  "streamlog", the token as password (security.protocol SASL_PLAINTEXT, or SASL_SSL
  when the daemon serves TLS, which then covers this port too). --kafka-auth none
  (explicitly) lets any client in without SASL. A "kafka_listening" line, just before
  "listening", names kafka_port.

console:
  http://HOST:C/ in a browser: the streams and partitions (offsets, sizes, event
  times, append rates, verification, holds, open transactions, the store's lag), a
  message browser (seek by offset or by event time, page, filter by key or value text,
  follow the live tail), consumer groups with their lag, operator jobs and the log's
  recovery. Sign in as Kafka clients do: user "streamlog", the token as the password
  (scripts: HTTP Basic, e.g. curl -u streamlog:$STREAMLOG_TOKEN HOST:C/api/overview).
  Read-only unless --console-write: then produce a record, move a group's committed
  offsets (to the earliest, the latest or a time) and apply retention, each confirmed.
  Served over TLS (https://) when the daemon serves TLS. Five wrong passwords in a
  minute from one address are refused for the rest of that minute. The console runs in
  a worker process of its own (at a lower priority, over a read-only view of the log),
  so that pages never take the daemon's CPU from its appends; the daemon stops it when
  it drains.

object store:
  --remote s3://BUCKET/PREFIX tiers the log to an S3-compatible object store:
  sealed segments go up in the background with their index objects, and a segment that
  has taken appends seals once it is --remote-max-lag-s old (default 60), so the store
  lags by about that at most. The endpoint and credentials come from AWS_ENDPOINT_URL,
  AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_REGION (`./dev store` starts one on
  loopback and prints them). Starting takes the log over in the store: an older writer
  of it is fenced. --durability local (the default): an acknowledged append is durable
  on this machine's disk. --durability remote: an append is acknowledged once the store
  holds it (group commits every --remote-commit-ms, default 10: one object, a manifest
  generation carrying the new records of every partition); losing the machine loses
  nothing acknowledged, and an append the store does not take within
  --remote-timeout-s fails with a timeout. It needs no local fsync (--fsync defaults to
  never): a start that finds the store ahead of the local log (a power loss) restores
  those partitions from the store. An empty LOG directory continues from the
  store. `streamlog info streamlog://HOST:PORT --json` shows each partition's
  remote_committed_offset.

logs and stopping:
  JSON lines on stderr, one event each. SIGTERM (or Ctrl-C) drains: the ports close,
  appends already received finish (an acknowledged append is durable under --fsync),
  open reads end with an error, the log is closed; then exit 0.

exit codes:
  0  stopped by SIGTERM or SIGINT after a drain
  1  the log cannot be opened (damaged, or another data error)
  2  usage: no STREAMLOG_TOKEN, bad TLS files, a port that cannot be bound

examples:
  export STREAMLOG_TOKEN=$(cat /etc/streamlog/token)
  streamlog serve /var/lib/streamlog/log                    # 127.0.0.1:7541, metrics 7542
  streamlog serve data/log --port 9000                      # metrics on 9001
  streamlog serve data/log --port 9100 --metrics-port none  # no HTTP port
  streamlog serve data/log --host 0.0.0.0 --tls-cert cert.pem --tls-key key.pem
  streamlog serve data/log --kafka-port 9092                # and Kafka clients on 9092
  streamlog serve data/log --console-write                  # console on 7543, writable
  streamlog serve data/log --remote s3://streamlog/prod     # tiered to a store
  kcat -b 127.0.0.1:9092 -X security.protocol=SASL_PLAINTEXT -X sasl.mechanisms=PLAIN \
       -X sasl.username=streamlog -X sasl.password="$STREAMLOG_TOKEN" -C -t events -e
  curl -s http://127.0.0.1:7542/healthz
  curl -s http://127.0.0.1:7542/metrics | grep '^streamlog_append_records_total'
  streamlog read streamlog://127.0.0.1:7541 --stream events --follow
  kill -TERM $DAEMON_PID                                    # drains, then exit 0
"""


def add_serve_parser(subparsers) -> argparse.ArgumentParser:
    """Add the `serve` verb to an argparse subparsers object; returns its parser."""
    parser = subparsers.add_parser(
        "serve", help=_SUMMARY, description=_SUMMARY, epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("log", metavar="LOG", help="the log directory (created if missing)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: loopback only)")
    parser.add_argument("--port", type=_port, default=DEFAULT_PORT, metavar="P",
                        help=f"data port (default {DEFAULT_PORT}; 0: any free port)")
    parser.add_argument("--metrics-port", type=_metrics_port, metavar="M",
                        help="HTTP port for /healthz and /metrics (default P+1; 0: any "
                             "free port; none: no HTTP port)")
    parser.add_argument("--tls-cert", metavar="FILE", help="serve TLS with this certificate")
    parser.add_argument("--tls-key", metavar="FILE", help="the certificate's private key")
    parser.add_argument("--max-connections", type=_positive, default=256, metavar="N",
                        help="refuse connections beyond N (default 256)")
    parser.add_argument("--max-frame-bytes", type=_positive, default=messages.FRAME_BYTES_MAX,
                        metavar="B", help="largest frame a client may send (default "
                                          f"{messages.FRAME_BYTES_MAX})")
    parser.add_argument("--idle-timeout-s", type=float, default=120.0, metavar="S",
                        help="close a connection silent this long (clients ping; "
                             "default 120)")
    parser.add_argument("--txn-timeout-s", type=float, default=900.0, metavar="S",
                        help="abort a transaction left open this long (a client that "
                             "died before committing; default 900); 0: never")
    parser.add_argument("--fsync", choices=("always", "interval", "never"),
                        help="the log's fsync policy (default always: an acknowledged "
                             "append is on stable storage; never under --durability "
                             "remote, where the store is)")
    parser.add_argument("--fsync-interval-ms", type=_positive, default=50, metavar="MS",
                        help="with --fsync interval: at most this long between fsyncs "
                             "(default 50)")
    parser.add_argument("--scrub-mib-per-s", type=float, default=32.0, metavar="R",
                        help="re-verify sealed segments in the background at most this "
                             "fast (MiB/s; default 32; 0: off); results in the log, in "
                             "/metrics and in `streamlog info`")
    parser.add_argument("--scrub-interval-s", type=float, default=3600.0, metavar="S",
                        help="pause between two scrubbing passes (default 3600)")
    parser.add_argument("--kafka-port", type=_port, metavar="K",
                        help="also speak the Kafka protocol on this port (0: any free "
                             "port; default: off)")
    parser.add_argument("--kafka-auth", choices=("plain", "none"), default="plain",
                        help="Kafka clients' authentication: SASL/PLAIN with user "
                             "'streamlog' and the token (default), or none")
    parser.add_argument("--console-port", type=_metrics_port, metavar="C",
                        help="the web console's port (default P+2; 0: any free port; "
                             "none: no console)")
    parser.add_argument("--console-write", action="store_true",
                        help="let the console write: produce, move a group's offsets, "
                             "apply retention (default: read-only)")
    parser.add_argument("--remote", metavar="URL",
                        help="tier the log to an object store: s3://BUCKET/PREFIX "
                             "(endpoint and keys from the AWS_* variables)")
    parser.add_argument("--durability", choices=("local", "remote"), default="local",
                        help="what an acknowledgement means with --remote: local (the "
                             "local fsync; sealed segments go up in the background) or "
                             "remote (the store holds it)")
    parser.add_argument("--remote-commit-ms", type=int, default=10, metavar="MS",
                        help="with --durability remote: at most one group commit to the "
                             "store this often (default 10)")
    parser.add_argument("--remote-timeout-s", type=float, default=30.0, metavar="S",
                        help="with --durability remote: fail an append the store has not "
                             "taken after this long (default 30)")
    parser.add_argument("--remote-max-lag-s", type=float, default=60.0, metavar="S",
                        help="seal and upload a segment that has taken appends once it "
                             "is this old (default 60)")


def run_serve(args: argparse.Namespace) -> int:
    """Run the daemon until SIGTERM/SIGINT; return the exit code."""
    token = os.environ.get("STREAMLOG_TOKEN", "")
    if not token:
        _say("STREAMLOG_TOKEN is not set; refusing to start a daemon without a token")
        return EXIT_USAGE
    if bool(args.tls_cert) != bool(args.tls_key):
        _say("--tls-cert and --tls-key go together")
        return EXIT_USAGE
    if args.log.startswith(("streamlog://", "streamlog+tls://")):
        _say(f"LOG is the log directory to serve, not a daemon URL ({args.log})")
        return EXIT_USAGE
    if args.remote is not None and not args.remote.startswith("s3://"):
        _say(f"--remote takes an s3://BUCKET/PREFIX URL (got {args.remote})")
        return EXIT_USAGE
    if args.durability == "remote" and args.remote is None:
        _say("--durability remote needs --remote URL: the store is what makes it durable")
        return EXIT_USAGE
    try:
        metrics_port = metrics_port_for(args.port, args.metrics_port)
        args.console_port = console_port_for(args.port, args.console_port, metrics_port)
    except ValueError as error:
        _say(str(error))
        return EXIT_USAGE
    config = ServerConfig(
        token=token.encode(), host=args.host, port=args.port, metrics_port=metrics_port,
        tls_cert=args.tls_cert, tls_key=args.tls_key, connections_max=args.max_connections,
        frame_bytes_max=max(args.max_frame_bytes, messages.HELLO_BYTES_MAX),
        idle_timeout_s=args.idle_timeout_s, txn_timeout_s=args.txn_timeout_s)
    configure_json_logging(sys.stderr)
    if args.host not in _LOOPBACK:
        logging.getLogger("streamlog.wire.server").warning(
            "not_loopback", extra={"fields": {"host": args.host, "tls": bool(args.tls_cert)}})
    return asyncio.run(_serve(args, config))


def metrics_port_for(port: int, metrics_port: int | str | None) -> int | None:
    """The metrics port ServerConfig takes: None (not given) is the data port + 1 (any
    free port when the data port is 0), NO_METRICS is None (no HTTP port)."""
    if metrics_port == NO_METRICS:
        return None
    if metrics_port is None:
        if port == 65535:
            raise ValueError("--port 65535 leaves no port for metrics (P+1): give "
                             "--metrics-port M or --metrics-port none")
        return port + 1 if port else 0
    if metrics_port and metrics_port == port:
        raise ValueError(f"--metrics-port {metrics_port} is the data port too")
    return metrics_port


def console_port_for(port: int, console_port: int | str | None,
                     metrics_port: int | None) -> int | None:
    """The console's port: None (not given) is the data port + 2 (any free port when
    the data port is 0), NO_METRICS ("none") is None (no console)."""
    if console_port == NO_METRICS:
        return None
    if console_port is None:
        if port > 65533:
            raise ValueError(f"--port {port} leaves no port for the console (P+2): give "
                             "--console-port C or --console-port none")
        return port + 2 if port else 0
    if console_port and console_port in (port, metrics_port):
        raise ValueError(f"--console-port {console_port} is the "
                         f"{'data' if console_port == port else 'metrics'} port too")
    return console_port


async def _serve(args: argparse.Namespace, config: ServerConfig) -> int:
    """Bind both ports, then open (or create) the log, then serve until a signal (one
    during the open, which can be a long recovery, drains as soon as the log is open)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, stop.set)
    try:
        listeners = await Listeners.bind(config)
    except ListenError as error:
        _say(str(error))
        return EXIT_USAGE
    except (ssl.SSLError, OSError) as error:
        _say(f"TLS: cannot load {config.tls_cert} / {config.tls_key}: {error}")
        return EXIT_USAGE
    try:
        kafka = await _bind_kafka(args, config)
    except OSError as error:
        listeners.close()
        _say(str(ListenError("kafka", config.host, args.kafka_port, error)))
        return EXIT_USAGE
    try:
        console = _bind_console(args, config)
    except OSError as error:
        listeners.close()
        if kafka is not None:
            await kafka.close()
        _say(str(ListenError("console", config.host, args.console_port, error)))
        return EXIT_USAGE
    metrics = Metrics()
    try:
        log = await asyncio.to_thread(_open_log, args, metrics)
    except (StreamLogError, OSError) as error:
        listeners.close()
        if kafka is not None:
            await kafka.close()
        if console is not None:
            await console.close()
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        _say(f"cannot open {args.log}: {reason}")
        return EXIT_DATA
    server = LogServer(log, config, metrics)
    if kafka is not None:
        await kafka.start(log)
        logging.getLogger("streamlog.kafka").info("kafka_listening", extra={"fields": {
            "host": config.host, "kafka_port": kafka.port, "auth": args.kafka_auth,
            "tls": bool(config.tls_cert)}})
    if console is not None:
        from ..console.daemon import LocalDaemon
        await console.start(args.log, LocalDaemon(log, server.blocking, metrics, kafka),
                            config.token, write=args.console_write,
                            tls_cert=config.tls_cert, tls_key=config.tls_key)
        logging.getLogger("streamlog.console").info("console_listening", extra={"fields": {
            "host": config.host, "console_port": console.port, "write": args.console_write,
            "tls": bool(config.tls_cert)}})
    await server.start(listeners)
    await stop.wait()
    # Every port drains at once, and all before the log closes (server.drain).
    await server.drain(beside=[listener.close() for listener in (kafka, console)
                               if listener is not None])
    return EXIT_OK


def _bind_console(args: argparse.Namespace, config: ServerConfig):
    """The web console's port (console/worker.py) bound on --host:--console-port, or
    None; its worker process starts once the log is open."""
    if args.console_port is None:
        return None
    from ..console.worker import ConsoleProcess
    return ConsoleProcess.bind(config.host, args.console_port)


async def _bind_kafka(args: argparse.Namespace, config: ServerConfig):
    """The Kafka listener (kafka/server.py) bound on --host:--kafka-port, or None."""
    if args.kafka_port is None:
        return None
    from ..kafka.server import KafkaConfig, KafkaServer
    from .server import tls_context
    return await KafkaServer.bind(KafkaConfig(
        token=config.token, host=config.host, port=args.kafka_port, auth=args.kafka_auth,
        tls=tls_context(config), connections_max=config.connections_max,
        frame_bytes_max=config.frame_bytes_max, drain_timeout_s=config.drain_timeout_s))


def _open_log(args: argparse.Namespace, metrics: Metrics):
    from ..connect import open_log
    fsync = {"fsync": args.fsync} if args.fsync else {}  # (else open_log's default)
    log = open_log(args.log, **fsync, fsync_interval_ms=args.fsync_interval_ms,
                   fileio=TimedFileIO(metrics.fsync_seconds),
                   scrub_interval_s=args.scrub_interval_s, remote=args.remote,
                   remote_max_lag_s=args.remote_max_lag_s, durability=args.durability,
                   remote_commit_ms=args.remote_commit_ms,
                   remote_timeout_s=args.remote_timeout_s)
    if args.scrub_mib_per_s > 0:
        log.start_scrubber(bytes_per_s=max(int(args.scrub_mib_per_s * (1 << 20)), 1),
                           on_result=lambda result: count_scrub_result(metrics, result))
    return log


def _say(message: str) -> None:
    print(f"streamlog serve: {message}", file=sys.stderr, flush=True)


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a port (0 to 65535)")
    return value


def _metrics_port(text: str) -> int | str:
    return NO_METRICS if text.lower() in (NO_METRICS, "off") else _port(text)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be a positive integer")
    return value


def main(argv: list[str] | None = None) -> None:
    """Standalone entry point: the arguments of `streamlog serve`."""
    parser = argparse.ArgumentParser(prog="streamlog serve", description=_SUMMARY,
                                     epilog=_EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    sys.exit(run_serve(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
