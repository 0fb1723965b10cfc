"""Footprint benchmark: the command line's start-up, and the daemon's memory when idle and
after a flood of hostile connections.

Command (from the repository root):

    .venv/bin/python bench/footprint.py                   # about 2 minutes
    .venv/bin/python bench/footprint.py --quick           # a smoke run: fewer, shorter
    .venv/bin/python bench/footprint.py --compare HEAD    # and commit REV's code, same run

Writes bench/results/footprint.json (flat: named numbers, plus "command", "cpu_count",
"machine", "date"), prints progress on stderr and a table with ratios and targets on
stdout.

Figures (each process is a child of this one; memory is VmRSS from /proc/PID/status):
  read_startup_ms       `streamlog read LOG --stream s` of a 10-record log, start to exit
                        (the console script, output thrown away): the median of --runs,
                        each run beside one of `python -c pass` (python_startup_ms), in
                        turn, so both see the same machine; read_vs_python is the ratio.
                        read_cpu_ms and read_peak_rss_mib from the child's rusage.
                        Bytecode caches on, as a pip installation has them (the
                        children's environment drops PYTHONDONTWRITEBYTECODE; the
                        warm-up runs write the caches).
  idle_rss_mib          `streamlog serve LOG` (no --kafka-port; metrics on, never
                        scraped) IDLE_SETTLE_S after its "listening" line, no client ever
                        connected; the web console is on (its default, P+2: a
                        worker process of its own, whose RSS is
                        idle_console_worker_rss_mib) but never loaded;
                        idle_rss_mib_kafka the same with --kafka-port 0,
                        idle_rss_mib_no_console with --console-port none.
  flood_peak_rss_mib    the most seen while --flood-connections hostile connections are
                        made over --flood-s (evenly spaced, each kept open until the flood
                        ends unless the daemon closes it): silent ones, half a HELLO, HTTP
                        garbage, a wrong token, an oversize frame (what
                        tests/integration/test_daemon.py's RawClient sends on purpose),
                        against the default --max-connections 256, so the last ones are
                        refused; then every socket is closed.
  after_flood_rss_mib   1 s after the last socket closed; after_flood_60s_rss_mib 60 s
                        after (--after-s), and after_flood_60s_vs_idle its ratio to the
                        same daemon's RSS before the flood (flood_idle_rss_mib, read as
                        idle_rss_mib is).

With --compare REV the same is measured for the code of commit REV (`git archive` into a
temporary folder, put first on the children's PYTHONPATH), each start-up run in turn with
this code's, and the figures get a before_ prefix. The machine is shared and noisy:
compare the ratios (same run), not absolute figures.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root

from _common import (  # noqa: E402  (bench/ is on sys.path when run as a script)
    DEFAULT_WORKDIR, Row, Target, add_ratios, attempt, export, fresh_dir, median, phase,
    progress, publish, remove, short_rev)

STREAMLOG = Path(sys.executable).parent / "streamlog"  # the console script
STREAM = "s"
RECORDS = 10
TOKEN = "bench-footprint-token"
STARTUP_RUNS = 15
WARMUP_RUNS = 2
IDLE_SETTLE_S = 3.0
FLOOD_CONNECTIONS = 527
FLOOD_S = 20.0
AFTER_S = 60.0
DAEMON_START_S = 60.0
# The hostile connections in turn: silent ones and half a HELLO stay until the daemon's
# handshake timeout (10 s) ends them, so the flood reaches the connection limit.
KINDS = ("silent", "half_hello", "garbage", "silent", "wrong_token", "half_hello",
         "oversize", "silent")

TARGETS = [
    Target("read start-up < 150 ms", lambda f: f["read_startup_ms"] < 150),
    Target("daemon idle RSS <= 80 MiB (no --kafka-port)",
           lambda f: f["idle_rss_mib"] <= 80),
    Target("RSS 60 s after a hostile flood within 1.2x of idle",
           lambda f: f["after_flood_60s_vs_idle"] <= 1.2),
]


# ---------------------------------------------------------------- processes

def environment(code: str | None) -> dict:
    """The children's environment: commit REV's code first on the path when given, and
    Python's bytecode caches written and read as on a user's machine (an environment
    with PYTHONDONTWRITEBYTECODE set would compile every module from source at every
    start: the warm-up runs write the caches)."""
    env = dict(os.environ, STREAMLOG_TOKEN=TOKEN)
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if code:
        env["PYTHONPATH"] = code
    return env


def timed_run(argv: list[str], env: dict, cwd: Path) -> tuple[float, float, float]:
    """(wall s, cpu s, peak RSS MiB) of one child run to its exit; raises if it fails."""
    with tempfile.TemporaryFile() as stderr_file:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                                stderr=stderr_file)
        _, status, usage = os.wait4(proc.pid, 0)  # (its rusage: cpu and peak memory)
        wall_s = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            stderr_file.seek(0)
            raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: "
                               f"{stderr_file.read().decode(errors='replace').strip()}")
    return wall_s, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


class Daemon:
    """`streamlog serve PATH --port 0` as a child; its JSON log lines are read on a
    thread (only the event names are kept: a flood logs thousands)."""

    def __init__(self, path: Path, env: dict, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [str(STREAMLOG), "serve", str(path), "--port", "0", *extra], env=env,
            cwd=path.parent, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.port: int | None = None
        self.events: collections.Counter[str] = collections.Counter()
        self._listening = threading.Event()
        threading.Thread(target=self._read_log, daemon=True).start()
        if not self._listening.wait(DAEMON_START_S) or self.port is None:
            self.proc.kill()
            raise RuntimeError(f"the daemon did not start: {dict(self.events)}")

    def _read_log(self) -> None:
        for line in self.proc.stderr:
            try:
                fields = json.loads(line)
            except ValueError:
                fields = {"event": "text"}
            self.events[fields.get("event", "?")] += 1
            if fields.get("event") == "listening":
                self.port = fields["port"]
                self._listening.set()
        self._listening.set()  # it ended: a failed start

    def rss(self) -> float:
        return rss_mib(self.proc.pid)

    def children_rss(self) -> float:
        """The RSS of the daemon's child processes (its console worker), summed."""
        try:
            with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as found:
                children = [int(pid) for pid in found.read().split()]
        except OSError:
            return 0.0
        return sum(rss_mib(pid) for pid in children)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ---------------------------------------------------------------- measurements

def make_log(path: Path) -> None:
    import streamlog
    remove(path)
    with streamlog.open_log(str(path)) as log:
        log.create_stream(STREAM, partitions=1)
        log.append_batch_sync(STREAM, [b"value %d" % i for i in range(RECORDS)])


def measure_startup(work: Path, log_path: Path, versions: list[tuple[str, str | None]],
                    runs: int, figures: dict) -> None:
    """Each read in turn with `python -c pass` (and with the other version's read)."""
    commands = [("python_", [sys.executable, "-c", "pass"], environment(None))]
    for prefix, code in versions:
        read = [str(STREAMLOG), "read", str(log_path), "--stream", STREAM]
        commands.append((f"{prefix}read_", read, environment(code)))
    samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name, *_ in commands}
    for number in range(WARMUP_RUNS + runs):
        for name, argv, env in commands:
            sample = timed_run(argv, env, work)
            if number >= WARMUP_RUNS:
                samples[name].append(sample)
    for name, runs_of in samples.items():
        figures[f"{name}startup_ms"] = median([wall for wall, _, _ in runs_of]) * 1000
        figures[f"{name}cpu_ms"] = median([cpu for _, cpu, _ in runs_of]) * 1000
        figures[f"{name}peak_rss_mib"] = max(peak for _, _, peak in runs_of)
    progress("  start-up medians: " + ", ".join(
        f"{name}{figures[f'{name}startup_ms']:.0f} ms" for name in samples))


def measure_idle(work: Path, code: str | None, prefix: str, figures: dict) -> None:
    for suffix, extra in (("", ()), ("_kafka", ("--kafka-port", "0")),
                          ("_no_console", ("--console-port", "none"))):
        if suffix == "_no_console" and code:
            continue  # (a commit before the console has no --console-port)
        path = fresh_dir(work / f"{prefix}idle{suffix}") / "log"
        daemon = Daemon(path, environment(code), *extra)
        try:
            time.sleep(IDLE_SETTLE_S)
            figures[f"{prefix}idle_rss_mib{suffix}"] = daemon.rss()
            if suffix == "" and not code:
                figures["idle_console_worker_rss_mib"] = daemon.children_rss()
        finally:
            daemon.stop()
        progress(f"  idle{suffix or ' (no --kafka-port, the console on)'}: "
                 f"{figures[f'{prefix}idle_rss_mib{suffix}']:.1f} MiB")


def hostile(kind: str, port: int) -> socket.socket:
    """One connection that misbehaves as `kind` says (it stays open: the caller closes)."""
    from streamlog.wire import messages
    from streamlog.wire.codes import MessageType
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    if kind == "half_hello":  # a HELLO of 60,000 bytes announced, half of it sent
        sock.sendall(struct.pack(">IBI", 60_000, MessageType.HELLO, 0) + b"x" * 30_000)
    elif kind == "garbage":
        sock.sendall(b"GET / HTTP/1.1\r\nHost: streamlog\r\n\r\n")
    elif kind == "wrong_token":
        sock.sendall(messages.encode_message(
            messages.Hello(0, messages.WIRE_VERSION, b"not-the-token", "hostile")))
    elif kind == "oversize":
        sock.sendall(struct.pack(">IBI", 50 << 20, MessageType.APPEND, 1))
    else:
        assert kind == "silent", kind
    return sock


def flood(daemon: Daemon, connections: int, seconds: float) -> tuple[float, int]:
    """(peak RSS MiB, connections that failed to open) of one flood; every socket is
    closed when it returns."""
    opened, failed, peak = [], 0, daemon.rss()
    started = time.monotonic()
    try:
        for number in range(connections):
            pause = started + number * seconds / connections - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            try:
                opened.append(hostile(KINDS[number % len(KINDS)], daemon.port))
            except OSError:  # refused, or reset while sending: still a connection made
                failed += 1
            if number % 16 == 0:
                peak = max(peak, daemon.rss())
        peak = max(peak, daemon.rss())
    finally:
        for sock in opened:
            sock.close()
    return peak, failed


def measure_flood(work: Path, code: str | None, prefix: str, args: argparse.Namespace,
                  figures: dict) -> None:
    path = fresh_dir(work / f"{prefix}flood") / "log"
    daemon = Daemon(path, environment(code))
    try:
        time.sleep(IDLE_SETTLE_S)
        idle = figures[f"{prefix}flood_idle_rss_mib"] = daemon.rss()
        peak, failed = flood(daemon, args.flood_connections, args.flood_s)
        ended = time.monotonic()
        figures[f"{prefix}flood_peak_rss_mib"] = peak
        figures[f"{prefix}flood_failed_connects"] = failed
        time.sleep(1.0)
        figures[f"{prefix}after_flood_rss_mib"] = daemon.rss()
        time.sleep(max(args.after_s - (time.monotonic() - ended), 0.0))
        after = figures[f"{prefix}after_flood_60s_rss_mib"] = daemon.rss()
        figures[f"{prefix}after_flood_60s_vs_idle"] = after / idle
        figures[f"{prefix}memory_releases"] = daemon.events["memory_released"]
        figures[f"{prefix}connections_refused"] = daemon.events["connection_refused"]
    finally:
        daemon.stop()
    progress(f"  flood: idle {idle:.1f} MiB, peak {peak:.1f} MiB, after 1 s "
             f"{figures[f'{prefix}after_flood_rss_mib']:.1f} MiB, after {args.after_s:g} s "
             f"{after:.1f} MiB ({after / idle:.2f}x idle)")


# ---------------------------------------------------------------- the run

ROWS = [
    Row("read start-up, median", "read_startup_ms", "ms",
        {"vs python": "python_startup_ms", "vs before": "before_read_startup_ms"}),
    Row("read cpu, median", "read_cpu_ms", "ms", {"vs before": "before_read_cpu_ms"}),
    Row("read peak RSS", "read_peak_rss_mib", "MiB",
        {"vs before": "before_read_peak_rss_mib"}),
    Row("python -c pass, median", "python_startup_ms", "ms"),
    Row("daemon idle RSS", "idle_rss_mib", "MiB", {"vs before": "before_idle_rss_mib"}),
    Row("daemon idle RSS, --kafka-port", "idle_rss_mib_kafka", "MiB",
        {"vs before": "before_idle_rss_mib_kafka"}),
    Row("daemon idle RSS, --console-port none", "idle_rss_mib_no_console", "MiB",
        {"vs before": "before_idle_rss_mib_no_console"}),
    Row("its console worker process, idle RSS", "idle_console_worker_rss_mib", "MiB"),
    Row("flood: idle before it", "flood_idle_rss_mib", "MiB",
        {"vs before": "before_flood_idle_rss_mib"}),
    Row("flood: peak RSS", "flood_peak_rss_mib", "MiB",
        {"vs idle": "flood_idle_rss_mib", "vs before": "before_flood_peak_rss_mib"}),
    Row("flood: RSS 1 s after", "after_flood_rss_mib", "MiB",
        {"vs idle": "flood_idle_rss_mib", "vs before": "before_after_flood_rss_mib"}),
    Row("flood: RSS 60 s after", "after_flood_60s_rss_mib", "MiB",
        {"vs idle": "flood_idle_rss_mib", "vs before": "before_after_flood_60s_rss_mib"}),
    Row("commit REV: read start-up, median", "before_read_startup_ms", "ms",
        {"vs python": "python_startup_ms"}),
    Row("commit REV: daemon idle RSS", "before_idle_rss_mib", "MiB"),
    Row("commit REV: flood, RSS 60 s after", "before_after_flood_60s_rss_mib", "MiB",
        {"vs idle": "before_flood_idle_rss_mib"}),
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=STARTUP_RUNS,
                        help=f"start-up runs of each command (default {STARTUP_RUNS})")
    parser.add_argument("--flood-connections", type=int, default=FLOOD_CONNECTIONS)
    parser.add_argument("--flood-s", type=float, default=FLOOD_S)
    parser.add_argument("--after-s", type=float, default=AFTER_S,
                        help=f"seconds from the flood's end to the last RSS read "
                             f"(default {AFTER_S:g})")
    parser.add_argument("--quick", action="store_true",
                        help="5 runs, 100 connections over 5 s, 10 s after: a smoke run")
    parser.add_argument("--compare", metavar="REV", help="also measure commit REV's code")
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.flood_connections, args.flood_s, args.after_s = 5, 100, 5.0, 10.0
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    work = fresh_dir(args.workdir.resolve() / "footprint")
    figures: dict = {"startup_runs": args.runs, "flood_connections": args.flood_connections,
                     "flood_s": args.flood_s, "after_s": args.after_s}
    failures: list[str] = []
    with tempfile.TemporaryDirectory() as old_code:
        versions: list[tuple[str, str | None]] = [("", None)]
        if args.compare:
            versions.append(("before_", export(args.compare, Path(old_code))))
            figures["before_commit"] = short_rev(args.compare)
        log_path = work / "short-log"
        make_log(log_path)
        with phase(f"start-up: {args.runs} runs of each, in turn"):
            attempt("startup", lambda: measure_startup(work, log_path, versions, args.runs,
                                                       figures), failures)
        for prefix, code in versions:
            label = f"commit {args.compare}" if prefix else "this code"
            with phase(f"{label}: daemon idle"):
                attempt(f"{prefix}idle", lambda: measure_idle(work, code, prefix, figures),
                        failures)
            with phase(f"{label}: flood of {args.flood_connections} hostile connections "
                       f"over {args.flood_s:g} s, then {args.after_s:g} s"):
                attempt(f"{prefix}flood", lambda: measure_flood(work, code, prefix, args,
                                                                figures), failures)
    add_ratios(figures, {"read_vs_python": ("read_startup_ms", "python_startup_ms"),
                         "read_vs_before": ("read_startup_ms", "before_read_startup_ms"),
                         "idle_rss_vs_before": ("idle_rss_mib", "before_idle_rss_mib")})
    remove(work)
    publish("footprint", figures, failures, ROWS, ["vs python", "vs idle", "vs before"],
            TARGETS)


if __name__ == "__main__":
    main()
