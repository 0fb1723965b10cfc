"""What a process loads and keeps: the command line's imports, the idle daemon's, and the
memory a flood of connections leaves behind.

`streamlog read` imports neither the daemon, nor the Kafka listener, nor the other
commands, nor pyarrow (a child process prints its sys.modules after main() returned).
An idle `streamlog serve` child has not imported pyarrow or the Kafka listener (it
writes its sys.modules on SIGUSR1), and still serves an Arrow replay and a /metrics
scrape afterwards. A LogServer whose connections have ended releases what they
held (its "memory_released" event). bench/footprint.py measures the figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

import streamlog
from streamlog.wire.client import open_remote
from streamlog.wire.server import RELEASE_AFTER_ENDED, LogServer, ServerConfig

TOKEN = "footprint-test-token"
# Loaded by the daemon's Kafka listener, Arrow conversions and progress bars: none of
# them is needed by a read, nor by an idle daemon without --kafka-port.
HEAVY = ("pyarrow", "kio", "tqdm")
NOT_FOR_A_READ = ("streamlog.wire.serve_cli", "streamlog.wire.server",
                  "streamlog.wire.session", "streamlog.wire.metrics",
                  "streamlog.cli.append", "streamlog.cli.dump", "streamlog.cli.verify",
                  "streamlog.cli.repair", "streamlog.cli.info", "prometheus_client",
                  *HEAVY)
# A daemon child that writes its sys.modules, one line, to MODULES_OUT on SIGUSR1.
SERVE_DUMPING_MODULES = """\
import os, signal, sys
def dump(*_):
    with open(os.environ["MODULES_OUT"], "a") as out:
        out.write(" ".join(sorted(sys.modules)) + "\\n")
signal.signal(signal.SIGUSR1, dump)
from streamlog.wire.serve_cli import main
main()
"""


def make_log(path, values: list[bytes]) -> None:
    with streamlog.open_log(str(path)) as log:
        log.create_stream("s", partitions=1)
        log.append_batch_sync("s", values)


def loaded(names: set[str], wanted: tuple[str, ...]) -> list[str]:
    """The modules of `wanted` (or below them) among `names`."""
    return sorted(name for name in names
                  if any(name == top or name.startswith(top + ".") for top in wanted))


def test_read_imports_only_the_read_command(tmp_path):
    make_log(tmp_path / "log", [b"a", b"b", b"c"])
    program = ("import sys\nfrom streamlog.cli import main\n"
               "code = main(sys.argv[1:])\n"
               "sys.stderr.write(' '.join(sorted(sys.modules)))\nsys.exit(code)\n")
    done = subprocess.run([sys.executable, "-c", program, "read", str(tmp_path / "log"),
                           "--stream", "s"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    values = [json.loads(line)["value"] for line in done.stdout.splitlines()]
    assert values == ["a", "b", "c"]
    modules = set(done.stderr.split())
    assert "streamlog.cli.read" in modules
    assert loaded(modules, NOT_FOR_A_READ + ("streamlog.kafka",)) == []


def test_help_still_lists_every_command_and_serve_help_is_whole(capsys):
    from streamlog.cli import COMMANDS, main
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    listed = capsys.readouterr().out
    assert all(f"    {command}" in listed for command in COMMANDS)
    with pytest.raises(SystemExit) as done:
        main(["serve", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: streamlog serve")
    assert "--kafka-port" in text and "examples:" in text and "kill -TERM" in text


class ModuleDumpingDaemon:
    """`streamlog serve` (serve_cli.main) as a child whose sys.modules can be asked for."""

    def __init__(self, tmp_path) -> None:
        self.out = tmp_path / "modules.txt"
        env = dict(os.environ, STREAMLOG_TOKEN=TOKEN, MODULES_OUT=str(self.out))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVE_DUMPING_MODULES, str(tmp_path / "log"),
             "--port", "0", "--metrics-port", "0"], env=env, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True)
        for line in self.proc.stderr:
            fields = json.loads(line)
            if fields["event"] == "listening":
                self.port, self.metrics_port = fields["port"], fields["metrics_port"]
                break
        else:
            raise AssertionError(f"the daemon did not start: exit {self.proc.wait()}")
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()

    def modules(self) -> set[str]:
        lines = self.out.read_text().splitlines() if self.out.exists() else []
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.out.exists() and len(self.out.read_text().splitlines()) > len(lines):
                return set(self.out.read_text().splitlines()[-1].split())
            time.sleep(0.02)
        raise AssertionError("the daemon did not write its modules")

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)


def test_an_idle_daemon_loads_no_arrow_or_kafka_and_still_serves_them(tmp_path):
    daemon = ModuleDumpingDaemon(tmp_path)
    try:
        idle = daemon.modules()
        assert "streamlog.wire.server" in idle
        assert loaded(idle, HEAVY + ("streamlog.kafka",)) == []
        with open_remote(f"streamlog://127.0.0.1:{daemon.port}", TOKEN) as log:
            log.create_stream("s")
            log.append_batch_sync("s", [b"x", b"y"])
            batches = list(log.reader("s", 0).arrow())
        assert [value for batch in batches for value in batch.column("value").to_pylist()] \
            == [b"x", b"y"]
        url = f"http://127.0.0.1:{daemon.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = response.read().decode()
        assert "streamlog_append_records_total 2.0" in body.splitlines()
        modules = daemon.modules()
        assert "pyarrow" not in modules  # the client makes the replay's Arrow batches
    finally:
        assert daemon.stop() == 0


def test_ended_connections_have_their_memory_released(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("streamlog"), "propagate", True)  # to caplog
    caplog.set_level(logging.INFO, logger="streamlog")
    with server_in_thread(tmp_path) as server:
        sockets = [socket.create_connection(("127.0.0.1", server.port))
                   for _ in range(RELEASE_AFTER_ENDED + 8)]
        for sock in sockets[::2]:
            sock.sendall(b"GET / HTTP/1.1\r\n\r\n")  # garbage: the daemon ends it
        for sock in sockets:
            sock.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not released(caplog):
            time.sleep(0.05)
        fields = released(caplog)
        assert fields and fields["connections_ended"] >= RELEASE_AFTER_ENDED, fields
        assert fields["connections"] == 0


def released(caplog) -> dict | None:
    found = [record.fields for record in caplog.records
             if record.getMessage() == "memory_released"]
    return found[0] if found else None


@pytest.mark.parametrize("garbage", [b"GET / HTTP/1.1\r\n\r\n", b""], ids=["refused", "silent"])
def test_an_ended_session_is_freed_without_the_cycle_collector(tmp_path, garbage):
    import gc
    import weakref
    with server_in_thread(tmp_path) as server:
        gc.collect()
        gc.disable()
        try:
            sock = socket.create_connection(("127.0.0.1", server.port))
            deadline = time.monotonic() + 10
            while not server.sessions and time.monotonic() < deadline:
                time.sleep(0.01)
            (session,) = list(server.sessions)
            ended = weakref.ref(session)
            del session
            if garbage:
                sock.sendall(garbage)  # a protocol error ends it
            sock.close()
            while (server.sessions or ended() is not None) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert ended() is None  # freed by its reference count alone
        finally:
            gc.enable()


@contextlib.contextmanager
def server_in_thread(tmp_path):
    """A LogServer on a log of its own, its event loop on a thread; drained at the end."""
    log = streamlog.open_log(str(tmp_path / "log"))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = LogServer(log, ServerConfig(token=TOKEN.encode(), port=0, metrics_port=None))
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
    try:
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(server.drain(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        log.close()
