"""`streamlog serve` in a child process, for tests that need a real daemon.

Strategy: start the daemon on a free loopback port (`--port 0`), collect its stderr
(JSON lines, one event each) on a thread, and wait for its "listening" event, which
names the port. `stop()` sends SIGTERM (the graceful drain) and returns the exit code;
`kill()` is a crash. Used by the daemon, concurrency and Spark test tiers alike.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

SERVE = "from streamlog.wire.serve_cli import main; main()"


class ServeProcess:
    """`streamlog serve PATH --port 0 --metrics-port off [extra...]` with `token`.
    `port` / `metrics_port` (strings) replace those two options; None leaves one out (the
    daemon's default: 7541, metrics on the data port + 1). `metrics_port` is the one the
    daemon bound, None with no HTTP port. `kafka_port` (a string, "0": any free port)
    adds --kafka-port; `self.kafka_port` is then the port bound (else None).
    `console_port` likewise ("none", the default here, turns the console off; "0": any
    free port); `self.console_port` and `self.console_url` then name it."""

    def __init__(self, path, *extra: str, token: str, start_timeout_s: float = 30,
                 port: str | None = "0", metrics_port: str | None = "off",
                 kafka_port: str | None = None, console_port: str | None = "none") -> None:
        env = dict(os.environ, STREAMLOG_TOKEN=token)
        options = [*(("--port", port) if port is not None else ()),
                   *(("--metrics-port", metrics_port) if metrics_port is not None else ()),
                   *(("--kafka-port", kafka_port) if kafka_port is not None else ()),
                   *(("--console-port", console_port) if console_port is not None else ())]
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVE, str(path), *options, *extra],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[dict] = []
        self._started = threading.Event()  # "listening", or stderr ended (it failed)
        threading.Thread(target=self._collect, daemon=True).start()
        self._started.wait(start_timeout_s)
        listening = next((line for line in self.lines if line.get("event") == "listening"),
                         None)
        if listening is None:
            self.proc.kill()
            raise AssertionError(f"the daemon did not start: {self.lines}")
        self.port = listening["port"]
        self.metrics_port = listening.get("metrics_port")
        self.url = f"streamlog://127.0.0.1:{self.port}"
        kafka = next((line for line in self.lines if line.get("event") == "kafka_listening"),
                     None)
        self.kafka_port = kafka["kafka_port"] if kafka else None
        console = next((line for line in self.lines if line.get("event") ==
                        "console_listening"), None)
        self.console_port = console["console_port"] if console else None
        self.console_url = f"http://127.0.0.1:{self.console_port}" if console else None

    def _collect(self) -> None:
        for line in self.proc.stderr:
            try:
                self.lines.append(json.loads(line))
            except ValueError:
                self.lines.append({"event": "text", "text": line})
            if self.lines[-1].get("event") == "listening":
                self._started.set()
        self._started.set()

    def events(self) -> list[str]:
        return [line.get("event") for line in self.lines]

    def stop(self, timeout_s: float = 30) -> int:
        """SIGTERM (drain), then the exit code; killed if it does not exit in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
