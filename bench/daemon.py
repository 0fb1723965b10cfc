"""Daemon benchmark: durable appends and replay through `streamlog serve`, beside the local
log and two servers that do the same job, all measured in the same run.

Command (from the repository root; `./dev bench daemon` runs the same):

    .venv/bin/python bench/daemon.py                  # 1,000,000 records
    .venv/bin/python bench/daemon.py --quick          # 100,000 records, a smoke run
    .venv/bin/python bench/daemon.py --records N --workdir DIR --no-peers

Writes bench/results/daemon.json (flat: named numbers, plus "command", "cpu_count" and a
few strings saying which durability each contender gave and why a peer is missing),
prints progress on stderr and a table with ratios and targets on stdout.

Data: bench/core.py's records (16-byte random key, 100-byte random value, timestamps
rising 10 us per record with jitter), appended in batches of 1,000 records with up to
--window batches in flight at once (pipelined), by one client, over loopback.

Contenders (each appends all N records, then reads all N back):
  local    streamlog.open_log(fsync="always") in this process: append_batch (async),
           --window batches in flight; replay with reader.arrow() (Arrow batches,
           no loop per record; the median of 3 replays, and the first one alone) and
           reader.records() (a Record object per record, once).
  daemon   `streamlog serve` (fsync="always") as a child process, client open_remote()
           in this process: the same calls as local, so the same work, through TCP.
           Durability: an append is acknowledged after its batch is fsynced.
  redis    redis-server from the system's packages, `appendonly yes`, `appendfsync
           always` (the AOF is written and fsynced before the replies of an event-loop
           round go out: durable acknowledgements), RDB snapshots off. Append: one XADD
           per record (fields k, v, t), 1,000 per pipeline, --window pipelines in flight
           (redis.asyncio). Replay: XRANGE pages of 10,000 into Python objects.
  nats     nats-server from the system's packages with JetStream, file storage. Append:
           js.publish_async per record (payload = key + value, timestamp in the header
           Nats-Msg-Time is the server's), up to the client's 4,000 pending acks; replay:
           an ordered push consumer from the first record's publish time (deliver by
           start time), counting messages. Durability: the packaged server (2.9) writes
           the block file and acknowledges without fsync (it syncs on a timer): a
           power loss can lose acknowledged messages. Redis and streamlog fsync first.

Appends start on an empty log. Replays run on the log opened again (the local log
reopened; a daemon started afresh on it): they read segments from the page cache, not
the in-memory tail ring that serves live followers, for both.

Peers are installed with apt-get (redis-server, nats-server) and pip (redis, nats-py) by
this script when missing, listen on 127.0.0.1 on free ports, and are stopped at the end.
A peer that cannot be had is recorded as unavailable, with the reason, in the JSON and
the table; the others still run. A measurement that fails prints its traceback on
stderr and leaves its figures out; the exit status is then 1. The machine is shared and
noisy: compare the ratios (same run), not absolute figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root

from _common import (  # noqa: E402  (bench/ is on sys.path when run as a script)
    DEFAULT_WORKDIR, finish, Row, Stopwatch, Target, add_ratios, attempt, fresh_dir, median,
    phase, print_table, print_targets, progress, rate, remove, write_results)
from core import BATCH, KEY_BYTES, VALUE_BYTES, Dataset, batches, make_dataset  # noqa: E402

STREAM = "events"
WINDOW = 8
TOKEN = "bench-daemon-token"
REDIS_PAGE = 10_000
ARROW_REPLAYS = 3  # the median is reported (and the first, on its own)
NATS_SUBJECT = "events.all"
PEER_START_S = 30.0
DURABILITY = {
    "local": "fsync before acknowledgement (fsync=always, group commit)",
    "daemon": "fsync before acknowledgement (streamlog serve, fsync=always, group commit)",
    "redis": "fsync before reply (appendonly yes, appendfsync always)",
    "nats": "no fsync before acknowledgement (JetStream file store syncs on a timer)",
}


# ---------------------------------------------------------------- streamlog

async def append_windowed(log, data: Dataset, window: int) -> int:
    """append_batch of BATCH records, up to `window` in flight; returns records acked."""
    slots = asyncio.Semaphore(window)
    acked = 0

    async def one(start: int, stop: int) -> None:
        nonlocal acked
        async with slots:
            result = await log.append_batch(
                STREAM, data.values[start:stop], keys=data.keys[start:stop],
                timestamps_us=data.timestamps_us[start:stop], partition=0)
            acked += result.records

    await asyncio.gather(*(one(start, stop) for start, stop in batches(len(data), BATCH)))
    return acked


def replay_arrow(log, expected: int) -> None:
    rows = 0
    reader = log.reader(STREAM, 0)
    try:
        for batch in reader.arrow():
            rows += batch.num_rows
    finally:
        reader.close()
    check("arrow replay", rows, expected)


def replay_records(log, expected: int) -> None:
    count = value_bytes = 0
    reader = log.reader(STREAM, 0)
    try:
        for record in reader.records():
            count += 1
            value_bytes += len(record.value)
    finally:
        reader.close()
    check("records replay", count, expected, value_bytes)


def check(label: str, count: int, expected: int, value_bytes: int | None = None) -> None:
    if count != expected:
        raise RuntimeError(f"{label}: {count:,} records read back, expected {expected:,}")
    if value_bytes is not None and value_bytes != expected * VALUE_BYTES:
        raise RuntimeError(f"{label}: {value_bytes:,} value bytes, expected "
                           f"{expected * VALUE_BYTES:,}")


def measure_append(prefix: str, log, data: Dataset, window: int, figures: dict) -> None:
    n = len(data)
    log.create_stream(STREAM, partitions=1)
    with phase(f"{prefix}: append {n:,} records, batches of {BATCH:,}, {window} in flight"):
        watch = Stopwatch()
        acked = asyncio.run(append_windowed(log, data, window))
        seconds = watch.elapsed
    if acked != n:
        raise RuntimeError(f"{prefix}: {acked:,} of {n:,} records acknowledged")
    figures[f"{prefix}_append_rps"] = rate(n, seconds)


def measure_replay(prefix: str, log, n: int, figures: dict) -> None:
    """On a log opened afresh (no tail ring): the segments, from the page cache."""
    with phase(f"{prefix}: replay as Arrow batches, {ARROW_REPLAYS} times"):
        seconds = []
        for _ in range(ARROW_REPLAYS):
            watch = Stopwatch()
            replay_arrow(log, n)
            seconds.append(watch.elapsed)
        figures[f"{prefix}_replay_rps"] = rate(n, median(seconds))
        figures[f"{prefix}_replay_first_rps"] = rate(n, seconds[0])
    with phase(f"{prefix}: replay as Record objects"):
        watch = Stopwatch()
        replay_records(log, n)
        figures[f"{prefix}_replay_records_rps"] = rate(n, watch.elapsed)
    progress(f"{prefix}: append {figures[f'{prefix}_append_rps']:,.0f} rec/s, replay "
             f"{figures[f'{prefix}_replay_rps']:,.0f} rec/s (Arrow), "
             f"{figures[f'{prefix}_replay_records_rps']:,.0f} rec/s (records)")


def measure_local(work: Path, data: Dataset, window: int, figures: dict) -> None:
    import streamlog
    path = work / "local"
    remove(path)
    try:
        with streamlog.open_log(str(path), fsync="always") as log:
            measure_append("local", log, data, window, figures)
        with streamlog.open_log(str(path), fsync="always") as log:
            measure_replay("local", log, len(data), figures)
    finally:
        remove(path)


def measure_daemon(work: Path, data: Dataset, window: int, figures: dict) -> None:
    path = work / "daemon"
    remove(path)
    try:
        with serving(path, figures) as log:
            measure_append("daemon", log, data, window, figures)
        with serving(path, figures) as log:  # a daemon started afresh on the same log
            measure_replay("daemon", log, len(data), figures)
    finally:
        remove(path)


@contextlib.contextmanager
def serving(path: Path, figures: dict):
    """A daemon on `path` and a client of it; SIGTERM at the end, which must exit 0."""
    from streamlog.wire.client import open_remote
    daemon = ServeProcess(path)
    try:
        with open_remote(f"streamlog://127.0.0.1:{daemon.port}", TOKEN) as log:
            yield log
        with phase("daemon: SIGTERM drain"):
            code = daemon.stop()
        figures["daemon_sigterm_exit"] = code
        if code != 0:
            raise RuntimeError(f"the daemon exited with {code} after SIGTERM")
    finally:
        daemon.kill()


class ServeProcess:
    """`streamlog serve` as a child; the port comes from its first JSON log line."""

    def __init__(self, path: Path) -> None:
        env = dict(os.environ, STREAMLOG_TOKEN=TOKEN)
        code = "from streamlog.wire.serve_cli import main; main()"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, str(path), "--port", "0", "--metrics-port", "off"],
            env=env, stderr=subprocess.PIPE, text=True)
        self.port = None
        for line in self.proc.stderr:
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if event.get("event") == "listening":
                    self.port = event["port"]
                    break
        if self.port is None:
            raise RuntimeError(f"streamlog serve did not start (exit {self.proc.wait()})")
        # keep draining stderr (a line per connection) so the daemon never blocks on it
        threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# ---------------------------------------------------------------- peers: set-up

class Unavailable(Exception):
    """A peer that cannot be installed or started here; the reason goes in the results."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ensure_binary(name: str, package: str) -> str:
    """Path of `name`, installing Debian's `package` when it is missing."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise Unavailable(f"{name} is not installed and apt-get cannot run here")
    with phase(f"apt-get install {package}"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        for command in (["apt-get", "update", "-qq"],
                        ["apt-get", "install", "-y", "-qq", "--no-install-recommends",
                         package]):
            done = subprocess.run(command, env=env, capture_output=True, text=True)
            if done.returncode != 0 and command[1] == "install":
                raise Unavailable(f"apt-get install {package} failed: "
                                  f"{done.stderr.strip().splitlines()[-1:]}")
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")
    if not found:
        raise Unavailable(f"{package} installed no {name}")
    return found


def ensure_module(module: str, requirement: str) -> None:
    """Import `module`, pip-installing `requirement` into this interpreter if needed."""
    try:
        __import__(module)
        return
    except ImportError:
        pass
    with phase(f"pip install {requirement}"):
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", requirement],
                              capture_output=True, text=True)
    if done.returncode != 0:
        raise Unavailable(f"pip install {requirement} failed: "
                          f"{done.stderr.strip().splitlines()[-1:]}")
    __import__(module)


def wait_for_port(port: int, proc: subprocess.Popen, name: str) -> None:
    deadline = time.monotonic() + PEER_START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise Unavailable(f"{name} exited with {proc.returncode} at start-up")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise Unavailable(f"{name} did not listen within {PEER_START_S:.0f} s")


@contextlib.contextmanager
def peer_process(command: list[str], port: int, name: str, log_path: Path):
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
        try:
            wait_for_port(port, proc, name)
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


# ---------------------------------------------------------------- peers: redis

def measure_redis(work: Path, data: Dataset, window: int, figures: dict) -> None:
    binary = ensure_binary("redis-server", "redis-server")
    ensure_module("redis", "redis")
    directory = fresh_dir(work / "redis")
    port = free_port()
    command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory),
               "--appendonly", "yes", "--appendfsync", "always", "--save", "",
               "--protected-mode", "yes", "--daemonize", "no"]
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    figures["redis_version"] = version.split("v=")[1].split()[0] if "v=" in version else "?"
    with peer_process(command, port, "redis-server", work / "redis.log"):
        n = len(data)
        with phase(f"redis: XADD {n:,} records, pipelines of {BATCH:,}, {window} in flight"):
            seconds = asyncio.run(redis_append(port, data, window))
        figures["redis_append_rps"] = rate(n, seconds)
        with phase(f"redis: XRANGE pages of {REDIS_PAGE:,}"):
            watch = Stopwatch()
            count, value_bytes = redis_replay(port)
            figures["redis_replay_rps"] = rate(n, watch.elapsed)
        check("redis replay", count, n, value_bytes)
        progress(f"redis: append {figures['redis_append_rps']:,.0f} rec/s, replay "
                 f"{figures['redis_replay_rps']:,.0f} rec/s")
    remove(directory)


async def redis_append(port: int, data: Dataset, window: int) -> float:
    import redis.asyncio as aioredis
    client = aioredis.Redis(host="127.0.0.1", port=port, max_connections=window + 2)
    slots = asyncio.Semaphore(window)

    async def one(start: int, stop: int) -> None:
        async with slots:
            pipe = client.pipeline(transaction=False)
            for i in range(start, stop):
                pipe.xadd(STREAM, {b"k": data.keys[i], b"v": data.values[i],
                                   b"t": data.timestamps_us[i]})
            await pipe.execute()

    try:
        watch = Stopwatch()
        tasks = []
        for start, stop in batches(len(data), BATCH):
            tasks.append(asyncio.create_task(one(start, stop)))
            if len(tasks) >= 4 * window:
                await asyncio.gather(*tasks)
                tasks = []
        await asyncio.gather(*tasks)
        return watch.elapsed
    finally:
        await client.aclose()


def redis_replay(port: int) -> tuple[int, int]:
    import redis
    client = redis.Redis(host="127.0.0.1", port=port)
    count = value_bytes = 0
    start = "-"
    try:
        while True:
            page = client.xrange(STREAM, min=start, max="+", count=REDIS_PAGE)
            for _entry_id, fields in page:
                count += 1
                value_bytes += len(fields[b"v"])
            if len(page) < REDIS_PAGE:
                return count, value_bytes
            start = "(" + page[-1][0].decode()
    finally:
        client.close()


# ---------------------------------------------------------------- peers: nats

def measure_nats(work: Path, data: Dataset, figures: dict) -> None:
    binary = ensure_binary("nats-server", "nats-server")
    ensure_module("nats", "nats-py")
    directory = fresh_dir(work / "nats")
    port = free_port()
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    figures["nats_version"] = version.strip().split()[-1] if version else "?"
    command = [binary, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(directory),
               "-m", "0"]
    with peer_process(command, port, "nats-server", work / "nats.log"):
        n = len(data)
        with phase(f"nats: publish_async {n:,} records to a JetStream file stream"):
            seconds, start_time = asyncio.run(nats_append(port, data))
        figures["nats_append_rps"] = rate(n, seconds)
        with phase("nats: ordered consumer from the first record's time"):
            count, value_bytes, seconds = asyncio.run(nats_replay(port, n, start_time))
            figures["nats_replay_rps"] = rate(n, seconds)
        check("nats replay", count, n)
        if value_bytes != n * VALUE_BYTES:
            raise RuntimeError(f"nats replay: {value_bytes:,} value bytes")
        progress(f"nats: append {figures['nats_append_rps']:,.0f} rec/s, replay "
                 f"{figures['nats_replay_rps']:,.0f} rec/s")
    remove(directory)


async def nats_append(port: int, data: Dataset) -> tuple[float, str]:
    import datetime
    import nats
    from nats.js.api import StorageType, StreamConfig
    connection = await nats.connect(f"nats://127.0.0.1:{port}")
    try:
        js = connection.jetstream()
        await js.add_stream(StreamConfig(name="EVENTS", subjects=[NATS_SUBJECT],
                                         storage=StorageType.FILE))
        start_time = datetime.datetime.now(datetime.timezone.utc)
        start_time -= datetime.timedelta(seconds=1)
        watch = Stopwatch()
        keys, values = data.keys, data.values
        for i in range(len(data)):
            await js.publish_async(NATS_SUBJECT, keys[i] + values[i])
        await js.publish_async_completed()
        seconds = watch.elapsed
        info = await js.stream_info("EVENTS")
        if info.state.messages != len(data):
            raise RuntimeError(f"nats: the stream holds {info.state.messages:,} messages")
        return seconds, start_time.isoformat().replace("+00:00", "Z")
    finally:
        await connection.close()


async def nats_replay(port: int, expected: int, start_time: str) -> tuple[int, int, float]:
    import nats
    from nats.js.api import ConsumerConfig, DeliverPolicy
    connection = await nats.connect(f"nats://127.0.0.1:{port}")
    count = value_bytes = 0
    try:
        js = connection.jetstream()
        watch = Stopwatch()
        subscription = await js.subscribe(
            NATS_SUBJECT, ordered_consumer=True,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME,
                                  opt_start_time=start_time))
        while count < expected:
            message = await subscription.next_msg(timeout=30)
            count += 1
            value_bytes += len(message.data) - KEY_BYTES
        seconds = watch.elapsed
        await subscription.unsubscribe()
        return count, value_bytes, seconds
    finally:
        await connection.close()


def measure_peer(name: str, measure, figures: dict) -> None:
    """Run a peer's measurement; an Unavailable peer is recorded, not a failure."""
    try:
        measure()
        figures[f"{name}_available"] = 1
        figures[f"{name}_durability"] = DURABILITY[name]
    except Unavailable as why:
        figures[f"{name}_available"] = 0
        figures[f"{name}_unavailable_reason"] = str(why)
        progress(f"{name}: unavailable: {why}")


# ---------------------------------------------------------------- report

RATIOS = {
    "daemon_vs_local_append": ("daemon_append_rps", "local_append_rps"),
    "daemon_vs_local_replay": ("daemon_replay_rps", "local_replay_rps"),
    "daemon_vs_local_replay_records": ("daemon_replay_records_rps", "local_replay_records_rps"),
    "daemon_vs_redis_append": ("daemon_append_rps", "redis_append_rps"),
    "daemon_vs_redis_replay": ("daemon_replay_rps", "redis_replay_rps"),
    "daemon_vs_nats_append": ("daemon_append_rps", "nats_append_rps"),
    "daemon_vs_nats_replay": ("daemon_replay_rps", "nats_replay_rps"),
}

APPEND = {"vs local": "local_append_rps", "vs redis": "redis_append_rps",
          "vs nats": "nats_append_rps"}
REPLAY = {"vs local": "local_replay_rps", "vs redis": "redis_replay_rps",
          "vs nats": "nats_replay_rps"}

ROWS = [
    Row("local append (fsync always)", "local_append_rps", "rec/s", APPEND),
    Row("daemon append (fsync always)", "daemon_append_rps", "rec/s", APPEND),
    Row("redis XADD (appendfsync always)", "redis_append_rps", "rec/s", APPEND),
    Row("nats publish (no fsync)", "nats_append_rps", "rec/s", APPEND),
    Row("local replay, arrow", "local_replay_rps", "rec/s", REPLAY),
    Row("daemon replay, arrow", "daemon_replay_rps", "rec/s", REPLAY),
    Row("local replay, arrow, first of 3", "local_replay_first_rps", "rec/s", REPLAY),
    Row("daemon replay, arrow, first of 3", "daemon_replay_first_rps", "rec/s", REPLAY),
    Row("local replay, records", "local_replay_records_rps", "rec/s", REPLAY),
    Row("daemon replay, records", "daemon_replay_records_rps", "rec/s", REPLAY),
    Row("redis XRANGE", "redis_replay_rps", "rec/s", REPLAY),
    Row("nats ordered consumer", "nats_replay_rps", "rec/s", REPLAY),
]


def at_least(figures: dict, name: str, bound: float):
    value = figures.get(name)
    return None if value is None else value >= bound


TARGETS = [
    Target("daemon append >= 10x redis (appendfsync always)",
           lambda f: at_least(f, "daemon_vs_redis_append", 10)),
    Target("daemon replay >= 10x redis", lambda f: at_least(f, "daemon_vs_redis_replay", 10)),
    Target("daemon append >= 10x nats", lambda f: at_least(f, "daemon_vs_nats_append", 10)),
    Target("daemon replay >= 10x nats", lambda f: at_least(f, "daemon_vs_nats_replay", 10)),
    Target("daemon append >= 0.8x local",
           lambda f: at_least(f, "daemon_vs_local_append", 0.8)),
    Target("daemon replay (arrow) within 2x of local",
           lambda f: at_least(f, "daemon_vs_local_replay", 0.5)),
]


def report(figures: dict) -> None:
    print()
    print_table(figures, ROWS, ["vs local", "vs redis", "vs nats"])
    print()
    print("durability")
    for name in ("local", "daemon", "redis", "nats"):
        if figures.get(f"{name}_available", 1) == 0:
            print(f"  {name:7} unavailable: {figures[f'{name}_unavailable_reason']}")
        else:
            print(f"  {name:7} {DURABILITY[name]}")
    print_targets(figures, TARGETS)


# ---------------------------------------------------------------- main

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, help="records per contender (default "
                        "1,000,000; 100,000 with --quick)")
    parser.add_argument("--window", type=int, default=WINDOW,
                        help=f"batches in flight per client (default {WINDOW})")
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    parser.add_argument("--no-peers", action="store_true", help="skip redis and nats")
    parser.add_argument("--keep", action="store_true", help="leave the work directory")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.records is None:
        args.records = 100_000 if args.quick else 1_000_000
    return args


def run(args: argparse.Namespace) -> tuple[dict, list[str]]:
    work = fresh_dir(args.workdir.resolve() / "daemon")
    figures: dict = {"records": args.records, "key_bytes": KEY_BYTES,
                     "value_bytes": VALUE_BYTES, "batch_records": BATCH,
                     "window_batches": args.window,
                     "local_durability": DURABILITY["local"],
                     "daemon_durability": DURABILITY["daemon"]}
    failures: list[str] = []
    try:
        with phase(f"generate {args.records:,} records"):
            data = make_dataset(args.records, args.seed)
            import pyarrow  # noqa: F401  (imported here, not inside the first replay)
        steps = [("local", lambda: measure_local(work, data, args.window, figures)),
                 ("daemon", lambda: measure_daemon(work, data, args.window, figures))]
        if not args.no_peers:
            steps += [
                ("redis", lambda: measure_peer("redis", lambda: measure_redis(
                    work, data, args.window, figures), figures)),
                ("nats", lambda: measure_peer("nats", lambda: measure_nats(
                    work, data, figures), figures)),
            ]
        for name, step in steps:
            attempt(name, step, failures)
    finally:
        if not args.keep:
            remove(work)
            if args.workdir.resolve() == DEFAULT_WORKDIR:
                with contextlib.suppress(OSError):
                    DEFAULT_WORKDIR.rmdir()
    add_ratios(figures, RATIOS)
    return figures, failures


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    figures, failures = run(args)
    path = write_results("daemon", figures)
    report(figures)
    finish(path, failures)


if __name__ == "__main__":
    main()
