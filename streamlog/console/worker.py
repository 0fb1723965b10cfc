"""The console's process: `streamlog serve` starts it beside the daemon, so that pages
are rendered outside the daemon's interpreter (its lock, its event loop) and a console
that is busy, or broken, never slows the daemon's appends.

Strategy: the daemon binds the console's port itself (before it opens the log, so that a
port in use fails first), opens the log, and then starts this process with the
listening socket and one end of a socket pair as inherited file descriptors, and the
token in STREAMLOG_TOKEN. The worker lowers its priority (nice NICE) so that the
daemon's threads get the CPU first on a busy machine, opens the log directory as a
read-only view (open_log(readonly=True): never modifies a file), and serves the console
(app.py) on the socket, asking the daemon over the pair for what only the daemon has
(daemon.LinkedDaemon). It logs JSON lines on stderr (the daemon's). It stops on SIGTERM
(the daemon's drain) or when the daemon's end of the pair closes (a daemon that died).

Usage (by the daemon only): python -m streamlog.console.worker LOG --listen-fd N
--link-fd M [--write] [--tls-cert FILE --tls-key FILE] [--host HOST]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import functools
import logging
import os
import signal
import socket
import ssl
import sys

NICE = 10
THREADS = 4
_LOG = logging.getLogger("streamlog.console")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streamlog.console.worker")
    parser.add_argument("log")
    parser.add_argument("--listen-fd", type=int, required=True)
    parser.add_argument("--link-fd", type=int, required=True)
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--tls-cert")
    parser.add_argument("--tls-key")
    args = parser.parse_args(argv)
    from ..wire.server import configure_json_logging
    configure_json_logging(sys.stderr)
    for name in ("aiohttp", "asyncio"):  # their errors as JSON lines too
        logging.getLogger(name).handlers[:] = logging.getLogger("streamlog").handlers
    try:
        os.nice(NICE)
    except OSError:
        pass  # (not allowed: serve at the daemon's priority)
    return asyncio.run(_run(args))


async def _run(args) -> int:
    from ..connect import open_log
    from .app import Console, ConsoleOptions
    from .daemon import LinkedDaemon
    token = os.environ.get("STREAMLOG_TOKEN", "").encode()
    tls = None
    if args.tls_cert:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(args.tls_cert, args.tls_key)
    listening = socket.socket(fileno=args.listen_fd)
    link = socket.socket(fileno=args.link_fd)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, stop.set)
    pool = concurrent.futures.ThreadPoolExecutor(THREADS, thread_name_prefix="console")

    async def blocking(fn, *fn_args):
        return await loop.run_in_executor(pool, functools.partial(fn, *fn_args))

    log = await blocking(functools.partial(open_log, args.log, readonly=True))
    reader, writer = await asyncio.open_connection(sock=link, limit=1 << 24)
    console = await Console.serve_socket(listening, ConsoleOptions(
        token=token, tls=tls, write=args.write, share=1.0))
    console.attach(log, blocking, LinkedDaemon(reader, writer))
    gone = loop.create_task(_daemon_gone(reader))
    waiting = loop.create_task(stop.wait())
    await asyncio.wait([gone, waiting], return_when=asyncio.FIRST_COMPLETED)
    for task in (gone, waiting):
        task.cancel()
    await console.close()
    writer.close()
    await blocking(log.close)
    pool.shutdown(wait=False, cancel_futures=True)
    return 0


async def _daemon_gone(reader: asyncio.StreamReader) -> None:
    """Returns when the daemon's end of the link is closed (it stopped or died)."""
    while not reader.at_eof():
        await asyncio.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main())


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (0: any free port); OSError when it cannot
    be bound."""
    return socket.create_server((host, port), family=socket.AF_INET6 if ":" in host
                                else socket.AF_INET)


class ConsoleProcess:
    """The daemon's handle on its console worker. `ConsoleProcess.bind(host, port)`
    binds the port (OSError); `await start(...)` starts the worker on it once the log
    is open; `await close()` stops it (SIGTERM, then SIGKILL after STOP_TIMEOUT_S)."""

    STOP_TIMEOUT_S = 5.0

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.port = sock.getsockname()[1]
        self.proc = None
        self._tasks: list[asyncio.Task] = []
        self._closing = False

    @classmethod
    def bind(cls, host: str, port: int) -> "ConsoleProcess":
        return cls(listen(host, port))

    async def start(self, log_path: str, daemon, token: bytes, *, write: bool = False,
                    tls_cert: str | None = None, tls_key: str | None = None) -> None:
        """Start the worker on the bound port, serving `daemon` (a LocalDaemon) to it."""
        import subprocess
        from .daemon import serve_link
        parent, child = socket.socketpair()
        command = [sys.executable, "-m", "streamlog.console.worker", log_path,
                   "--listen-fd", str(self.sock.fileno()), "--link-fd", str(child.fileno()),
                   *(["--write"] if write else []),
                   *(["--tls-cert", tls_cert, "--tls-key", tls_key] if tls_cert else [])]
        try:
            self.proc = subprocess.Popen(
                command, pass_fds=(self.sock.fileno(), child.fileno()),
                stdin=subprocess.DEVNULL, env=dict(os.environ, STREAMLOG_TOKEN=token.decode(
                    "utf-8", "surrogateescape")))
        finally:
            child.close()
            self.sock.close()  # the worker's now
        reader, writer = await asyncio.open_connection(sock=parent, limit=1 << 24)
        self._tasks = [asyncio.create_task(serve_link(daemon, reader, writer)),
                       asyncio.create_task(self._watch())]

    async def _watch(self) -> None:
        code = await asyncio.to_thread(self.proc.wait)
        if not self._closing:
            _LOG.error("console_exited", extra={"fields": {"code": code}})

    async def close(self) -> None:
        self._closing = True
        if self.proc is None:
            self.sock.close()
            return
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            await asyncio.wait_for(asyncio.to_thread(self.proc.wait), self.STOP_TIMEOUT_S)
        except asyncio.TimeoutError:
            self.proc.kill()
            await asyncio.to_thread(self.proc.wait)
        for task in self._tasks:
            task.cancel()
