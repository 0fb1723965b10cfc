"""Console benchmark: the web console's page loads on a log of 100 partitions, and what
twenty browsers loading pages (and a flood of console requests) cost the producers of the
same daemon.

Command (from the repository root; `./dev bench console` runs the same):

    .venv/bin/python bench/console.py                 # about 2 minutes
    .venv/bin/python bench/console.py --quick         # a smoke run: 8 loads, 3 s phases
    .venv/bin/python bench/console.py --loads 50 --phase-s 15 --think-s 2 --workdir DIR

Writes bench/results/console.json (flat: named numbers, plus "command", "cpu_count",
"machine", "date" and a few strings), prints progress on stderr and tables with the
targets on stdout.

The log, written in this process before the daemon starts: a stream `events` of
--partitions partitions (100) with --records records each (1,000; keys "user-K" of 5,000
users spread over every partition, ~100-byte JSON values, event times over the last
hour); small streams `orders` (3 partitions), `audit` and `enriched` (1 each); `load` (8
partitions, empty: the producers' below); and an operator's holds
(operator.enriched.0.DIGEST) on every partition of `events`, so /operators lists a job.
Then one `streamlog serve LOG --kafka-port 0 --console-port 0` (fsync always) as a child
process, and a Kafka consumer group `bench-group` (confluent-kafka, SASL/PLAIN) that
commits an offset on every partition of `events`.

Page loads: one client in this process (aiohttp, HTTP Basic, one keep-alive connection);
a load is the time from the request to the last byte of the HTML (the page's CSS and
script are not counted: a browser has them cached). Each page kind in turn, one round of
warm-up, then --loads rounds:
  overview     /  (computed at most once a second however many ask: every load here is
               made over a second after the one before, so each computes it afresh)
  browse_time  /browse?stream=events&partition=P&start=time&time=T (P in turn, T the
               middle of the hour)
  browse_all   /browse?stream=events&partition=all (every partition's first records,
               merged by time)
  search       /browse?stream=events&partition=all&key=user-K&key_match=exact (K in
               turn: the whole stream is scanned for the key)
  groups       /groups
  group        /groups/bench-group (an offset and its lag per partition, the lag chart)
  operators    /operators
page_KIND_p50_ms, page_KIND_p95_ms, page_KIND_max_ms for each; page_p95_worst_ms is the
largest p95 and page_p95_worst_kind its kind. daemon_cores_pages and other_cores_pages:
the CPU of the daemon, and of processes not ours, while the pages loaded.

Under load, after a warm-up of the producers alone (--warmup-s, 3 s; not counted), five phases of
--phase-s seconds (8), in this order: baseline1, browsing, baseline2, flood, baseline3.
The baseline figure (append_baseline_rps) is the mean of the three baselines, so a drift
of the machine over the run (page cache, other work) falls on both loaded phases;
append_baseline_drift is the last over the first, append_baseline_spread the largest
over the smallest.
  producers   --producers (8) processes, each open_log(daemon URL) and a loop of
              `await append_batch` of 100 records (~100-byte values) into its own
              partition of `load`, one batch in flight, back to back: the same in every
              phase. append_PHASE_rps counts the records acknowledged inside the phase's
              window; append_PHASE_batch_p50_ms / _p99_ms the batches' latencies.
  browsing    --browsers (20) browsers in one separate process (so their CPU is not the
              daemon's), each an aiohttp session of its own (HTTP Basic, keep-alive)
              loading pages as a person does: overview, browse_time, browse_all,
              browse_live (/browse?stream=load&partition=all&start=end: the producers'
              records) and group in turn, each browser starting at a different page, with
              a pause (think time) between a page's last byte, its files included, and
              the next request: --think-s (1 s) times a factor drawn uniformly from
              0.5 - 1.5, and a first request at a time drawn from 0 - think-s into the
              window, from a generator seeded per browser with a fixed seed, so every run
              makes the same pauses. Each page's files (its <link rel="stylesheet" href>
              and <script src>, read from the HTML, versioned URLs or not) are fetched as a
              browser with a cache does: a URL is asked for once while its last response's
              Cache-Control grants a max-age (and no no-cache / no-store); without one, it
              is asked for again on every page that links it, conditionally
              (If-None-Match / If-Modified-Since) when the response gave an ETag or a
              Last-Modified, as a browser revalidates; in full otherwise. Every browser's
              cache is empty when the window opens, so the first visit's files are
              counted.
  flood       the same, with no pause and no stagger: 20 clients loading pages back to
              back (files cached as above), the most the console is asked for.
For each loaded phase L (browsing, flood): L_pages and L_pages_per_s count the pages
whose load (HTML and files) ended within the window; L_page_p50/p95/max_ms the pages'
latencies (request to the HTML's last byte), L_KIND_p95_ms per kind; L_static_per_s
the files' requests, L_static_full those answered in full (200), L_static_revalidated
those answered 304; L_errors the responses that were neither (a page: not 200);
L_think_s the mean pause asked for; append_L_vs_baseline = append_L_rps /
append_baseline_rps (targets: browsing >= 0.9, flood >= 0.8).
Every process starts and connects before the window opens (the children report ready;
the window starts at a time given to all of them).

CPU: the machine has few cores (cpu_count in the results) and the load generator runs
on them too, so it competes with the daemon and the producers: loadgen_cores_L is the CPU
the browsers' process used over the window of L (CPU seconds / window seconds),
daemon_cores_PHASE and producers_cores_PHASE the same for the daemon and the producers,
machine_busy_cores_PHASE the whole machine's (from /proc/stat), other_cores_PHASE the rest
of it (other processes, and the kernel's work for ours; above 0.25 core in any phase,
the output calls the run noisy). What the browsers cost the producers is then partly
the daemon serving pages and partly the load generator taking CPU a real browser would
take on another machine; the output says how much.

The machine is shared and noisy: read the ratios (same run), not absolute figures.
A measurement that fails prints its traceback on stderr and leaves its figures out; the
exit status is then 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root

from _common import (  # noqa: E402  (bench/ is on sys.path when run as a script)
    DEFAULT_WORKDIR, Row, Target, attempt, command_line, finish, fresh_dir, phase,
    print_table, print_targets, progress, remove, write_results)

TOKEN = "bench-console-token"
USER = "streamlog"
EVENTS = "events"
LOAD = "load"
GROUP = "bench-group"
OPERATOR_HOLD = "operator.enriched.0.5eedc0de"
PARTITIONS = 100
RECORDS = 1_000
USERS = 5_000
LOADS = 30
PRODUCERS = 8
BROWSERS = 20
PHASE_S = 8.0
THINK_S = 1.0  # a browser's pause between pages, before the jitter
THINK_JITTER = 0.5  # each pause is THINK_S times a factor drawn from 1 -/+ this
THINK_SEED = 1_000  # browser N's pauses come from random.Random(THINK_SEED + N)
QUICK_LOADS, QUICK_PHASE_S = 8, 3.0
BATCH = 100
VALUE_BYTES = 100
HOUR_US = 3_600_000_000
OVERVIEW_GAP_S = 1.05  # over the console's OVERVIEW_TTL_S (1 s): each overview computed
WARMUP_S = 3.0  # producers only, before the first baseline: not counted
PAGE_KINDS = ("overview", "browse_time", "browse_all", "search", "groups", "group",
              "operators")
LOADED_KINDS = ("overview", "browse_time", "browse_all", "browse_live", "group")
LOADED = ("browsing", "flood")  # the phases with console traffic
BASELINES = ("baseline1", "baseline2", "baseline3")
PHASES = ("baseline1", "browsing", "baseline2", "flood", "baseline3")
PAGE_P95_MS = 300.0
OTHER_CORES_NOISY = 0.25  # CPU not ours during a phase above which the run is called noisy
APPEND_RATIO = 0.9  # browsing
FLOOD_RATIO = 0.8

TARGETS = [
    Target(f"every page kind's p95 < {PAGE_P95_MS:.0f} ms on a log of 100 partitions",
           lambda f: None if "page_p95_worst_ms" not in f
           else f["page_p95_worst_ms"] < PAGE_P95_MS),
    Target("producers' append rate with 20 browsers >= 0.9x without console traffic",
           lambda f: None if "append_browsing_vs_baseline" not in f
           else f["append_browsing_vs_baseline"] >= APPEND_RATIO),
    Target("producers' append rate under a flood of console requests (20 clients, no "
           "pause) >= 0.8x without console traffic",
           lambda f: None if "append_flood_vs_baseline" not in f
           else f["append_flood_vs_baseline"] >= FLOOD_RATIO),
]


# ---------------------------------------------------------------- the log

def build_log(path: Path, partitions: int, records: int, seed: int = 0) -> dict:
    """The log of the module docstring, written in this process; returns what the
    page URLs need: the hour's start and end (us) and the users' keys."""
    import streamlog
    rng = random.Random(seed)
    remove(path)
    end_us = int(time.time() * 1_000_000)
    start_us = end_us - HOUR_US
    step = HOUR_US // max(records, 1)
    with streamlog.open_log(str(path)) as log:
        log.create_stream(EVENTS, partitions=partitions)
        for p in range(partitions):
            keys = [b"user-%d" % rng.randrange(USERS) for _ in range(records)]
            values = [json.dumps({"user": key.decode(), "action": rng.choice(
                ("view", "click", "buy", "share")), "amount": rng.randrange(10_000),
                "pad": "x" * rng.randrange(20, 40)}).encode() for key in keys]
            times = [start_us + i * step + rng.randrange(step) for i in range(records)]
            log.append_batch_sync(EVENTS, values, keys=keys, timestamps_us=times,
                                  partition=p)
        for name, count, size in (("orders", 3, 200), ("audit", 1, 50), ("enriched", 1, 100)):
            log.create_stream(name, partitions=count)
            for p in range(count):
                log.append_batch_sync(name, [b'{"n": %d}' % i for i in range(size)],
                                      keys=[b"k%d" % (i % 7) for i in range(size)],
                                      partition=p)
        log.create_stream(LOAD, partitions=PRODUCERS)
        for p in range(partitions):
            log.hold(EVENTS, p, OPERATOR_HOLD, records // 2)
    return {"start_us": start_us, "end_us": end_us}


def commit_group(kafka_port: int, partitions: int, records: int) -> None:
    """bench-group's committed offsets: each partition of `events` part-way through."""
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({
        "bootstrap.servers": f"127.0.0.1:{kafka_port}", "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "PLAIN", "sasl.username": USER, "sasl.password": TOKEN,
        "group.id": GROUP, "enable.auto.commit": False})
    try:
        offsets = [TopicPartition(EVENTS, p, records * (p % 10 + 1) // 10)
                   for p in range(partitions)]
        done = consumer.commit(offsets=offsets, asynchronous=False)
        failed = [tp for tp in done if tp.error is not None]
        if failed:
            raise RuntimeError(f"commit of {GROUP}: {failed[:3]}")
    finally:
        consumer.close()


@contextlib.contextmanager
def daemon_on(path: Path):
    """`streamlog serve` on the log with a Kafka listener and a console, both on free
    ports; SIGTERM at the end."""
    from streamlog.testing.serve import ServeProcess
    daemon = ServeProcess(path, token=TOKEN, kafka_port="0", console_port="0")
    try:
        yield daemon
    finally:
        code = daemon.stop()
        if code != 0:
            progress(f"the daemon exited with {code} after SIGTERM")


# ---------------------------------------------------------------- page URLs

def basic_auth() -> dict:
    """The Authorization header of a script: HTTP Basic, user "streamlog", the token."""
    import base64
    return {"Authorization": "Basic " + base64.b64encode(f"{USER}:{TOKEN}".encode()).decode()}


def iso_utc(time_us: int) -> str:
    moment = datetime.datetime.fromtimestamp(time_us / 1e6, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def page_path(kind: str, number: int, shape: dict) -> str:
    """The path of page `kind`, the number-th of its kind (partitions and keys vary)."""
    from urllib.parse import urlencode
    if kind == "overview":
        return "/"
    if kind == "browse_time":
        middle = (shape["start_us"] + shape["end_us"]) // 2
        return "/browse?" + urlencode({"stream": EVENTS, "partition": number % shape[
            "partitions"], "start": "time", "time": iso_utc(middle)})
    if kind == "browse_all":
        return f"/browse?stream={EVENTS}&partition=all&start=start"
    if kind == "browse_live":
        return f"/browse?stream={LOAD}&partition=all&start=end"
    if kind == "search":
        return "/browse?" + urlencode({"stream": EVENTS, "partition": "all",
                                       "key": f"user-{(number * 7919) % USERS}",
                                       "key_match": "exact"})
    if kind == "groups":
        return "/groups"
    if kind == "group":
        return f"/groups/{GROUP}"
    if kind == "operators":
        return "/operators"
    raise ValueError(kind)


def percentile(values: list[float], share: float) -> float:
    """The nearest-rank percentile (share 0.95: p95) of values."""
    ordered = sorted(values)
    rank = max(1, int(share * len(ordered) + 0.999999))
    return ordered[min(rank, len(ordered)) - 1]


def spread(prefix: str, values: list[float], figures: dict) -> None:
    figures[f"{prefix}_p50_ms"] = statistics.median(values)
    figures[f"{prefix}_p95_ms"] = percentile(values, 0.95)
    figures[f"{prefix}_max_ms"] = max(values)


# ---------------------------------------------------------------- page loads

async def fetch(session, url: str) -> tuple[float, int, int]:
    """(milliseconds to the last byte, status, body bytes) of one GET."""
    started = time.perf_counter()
    async with session.get(url, allow_redirects=False) as response:
        body = await response.read()
    return (time.perf_counter() - started) * 1000, response.status, len(body)


async def page_loads(console_url: str, shape: dict, loads: int) -> dict[str, list]:
    """kind -> [(ms, status, bytes)] of `loads` loads of each kind, in turn."""
    import aiohttp
    found: dict[str, list] = {kind: [] for kind in PAGE_KINDS}
    last_overview = 0.0
    async with aiohttp.ClientSession(headers=basic_auth()) as session:
        for round_number in range(loads + 1):  # the first round warms up
            for kind in PAGE_KINDS:
                if kind == "overview":
                    await asyncio.sleep(max(0.0, last_overview + OVERVIEW_GAP_S
                                            - time.monotonic()))
                    last_overview = time.monotonic()
                sample = await fetch(session, console_url + page_path(kind, round_number,
                                                                      shape))
                if sample[1] != 200:
                    raise RuntimeError(f"{kind}: HTTP {sample[1]}")
                if round_number:
                    found[kind].append(sample)
    return found


def measure_pages(console_url: str, daemon_pid: int, shape: dict, loads: int,
                  figures: dict) -> None:
    started, cpu0 = time.perf_counter(), time.process_time()
    daemon0, machine0 = cpu_ticks(daemon_pid), machine_ticks()
    found = asyncio.run(page_loads(console_url, shape, loads))
    seconds, tick = time.perf_counter() - started, os.sysconf("SC_CLK_TCK")
    daemon1, machine1 = cpu_ticks(daemon_pid), machine_ticks()
    busy, total = machine1[0] - machine0[0], machine1[1] - machine0[1]
    figures["daemon_cores_pages"] = (daemon1 - daemon0) / tick / seconds
    figures["client_cores_pages"] = (time.process_time() - cpu0) / seconds
    if total:
        figures["machine_busy_cores_pages"] = busy / total * os.cpu_count()
        figures["other_cores_pages"] = max(0.0, figures["machine_busy_cores_pages"]
                                           - figures["daemon_cores_pages"]
                                           - figures["client_cores_pages"])
    worst = None
    for kind, samples in found.items():
        spread(f"page_{kind}", [ms for ms, _, _ in samples], figures)
        figures[f"page_{kind}_kib"] = statistics.median(size for _, _, size in samples) / 1024
        p95 = figures[f"page_{kind}_p95_ms"]
        if worst is None or p95 > figures["page_p95_worst_ms"]:
            worst = kind
            figures["page_p95_worst_ms"] = p95
    figures["page_p95_worst_kind"] = worst
    figures["page_loads_per_kind"] = loads
    progress("  p95: " + ", ".join(f"{kind} {figures[f'page_{kind}_p95_ms']:.0f} ms"
                                   for kind in PAGE_KINDS))


# ---------------------------------------------------------------- children

def child(role: str, spec: dict) -> subprocess.Popen:
    """This file run as `--child ROLE`: it connects, says "ready", waits for the window's
    start (a wall-clock time on its stdin), works until its end, then prints a JSON line."""
    env = dict(os.environ, STREAMLOG_TOKEN=TOKEN)
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--child", role, json.dumps(spec)],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


async def await_go() -> tuple[float, float]:
    """Say ready, then wait for the window (start, end) in wall-clock seconds."""
    print("ready", flush=True)
    line = await asyncio.to_thread(sys.stdin.readline)
    start, end = map(float, line.split())
    await asyncio.sleep(max(0.0, start - time.time()))
    return start, end


async def producer_main(spec: dict) -> dict:
    """One producer: append_batch of BATCH records into its partition, one in flight."""
    import streamlog
    log = streamlog.open_log(spec["url"])
    values = [b"%06d-" % i + b"v" * (VALUE_BYTES - 7) for i in range(BATCH)]
    keys = [b"p%d-%d" % (spec["partition"], i % 10) for i in range(BATCH)]
    try:
        await log.append_batch(LOAD, values, keys=keys, partition=spec["partition"])
        _, end = await await_go()
        cpu0, acked, latencies = time.process_time(), 0, []
        while True:
            started = time.time()
            if started >= end:
                break
            await log.append_batch(LOAD, values, keys=keys, partition=spec["partition"])
            done = time.time()
            if done <= end:
                acked += BATCH
                latencies.append((done - started) * 1000)
        return {"records": acked, "cpu_s": time.process_time() - cpu0,
                "latencies_ms": latencies}
    finally:
        log.close()


ASSET_TAG = re.compile(rb"<(?:link|script)\b[^>]*>", re.IGNORECASE)


class _AssetTags(HTMLParser):
    """The URLs of the stylesheets (<link rel="stylesheet" href>) and scripts
    (<script src>) among the tags fed to it."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        named = {name.lower(): value or "" for name, value in attrs}
        if tag == "link" and "stylesheet" in named.get("rel", "").lower().split():
            url = named.get("href", "")
        elif tag == "script":
            url = named.get("src", "")
        else:
            return
        if url.strip():
            self.urls.append(url.strip())

    handle_startendtag = handle_starttag


def page_assets(html: bytes, page_url: str) -> list[str]:
    """The absolute URLs of the files a browser fetches for this page (its stylesheets
    and scripts), each once, in the page's order."""
    urls: list[str] = []
    for tag in ASSET_TAG.findall(html):  # only these tags: the pages are large
        parser = _AssetTags()  # one a tag: after <script> a parser reads script text
        parser.feed(tag.decode("utf-8", "replace"))
        parser.close()
        urls += parser.urls
    return list(dict.fromkeys(urljoin(page_url, url) for url in urls))


def fresh_for(cache_control: str) -> float | None:
    """The seconds a browser may reuse a response without asking again: its
    Cache-Control's max-age, unless no-cache or no-store; None when it must ask."""
    directives = {}
    for part in cache_control.split(","):
        name, _, value = part.partition("=")
        directives[name.strip().lower()] = value.strip().strip('"')
    if "no-cache" in directives or "no-store" in directives:
        return None
    try:
        seconds = int(directives["max-age"])
    except (KeyError, ValueError):
        return None
    return seconds if seconds > 0 else None


class BrowserCache:
    """One browser's HTTP cache of page files, as the module docstring says: a URL whose
    response granted a max-age is not asked for again until it expires; one without is
    revalidated (If-None-Match / If-Modified-Since) or, with no validator, fetched again."""

    def __init__(self) -> None:
        self.entries: dict[str, tuple[float | None, dict[str, str]]] = {}

    def fresh(self, url: str, now: float) -> bool:
        until, _ = self.entries.get(url, (None, {}))
        return until is not None and now < until

    def conditions(self, url: str) -> dict[str, str]:
        """The headers of a revalidation of url (none if nothing is cached)."""
        return dict(self.entries.get(url, (None, {}))[1])

    def store(self, url: str, status: int, headers, now: float) -> None:
        cache_control = headers.get("Cache-Control", "")
        if status not in (200, 304) or "no-store" in cache_control.lower():
            self.entries.pop(url, None)
            return
        _, conditions = self.entries.get(url, (None, {}))
        if status == 200:
            conditions = {}
            if headers.get("ETag"):
                conditions["If-None-Match"] = headers["ETag"]
            if headers.get("Last-Modified"):
                conditions["If-Modified-Since"] = headers["Last-Modified"]
        seconds = fresh_for(cache_control)
        self.entries[url] = (None if seconds is None else now + seconds, conditions)


async def load_asset(session, cache: BrowserCache, url: str) -> int:
    """One file of a page, through the browser's cache: its status (0: not asked for,
    the cached copy still fresh)."""
    if cache.fresh(url, time.monotonic()):
        return 0
    async with session.get(url, headers=cache.conditions(url),
                           allow_redirects=False) as response:
        await response.read()
        cache.store(url, response.status, response.headers, time.monotonic())
        return response.status


async def browsers_main(spec: dict) -> dict:
    """spec["browsers"] sessions loading pages until the window's end, with a pause of
    about spec["think_s"] between pages (none: back to back), their files cached."""
    import aiohttp
    base, shape, think_s = spec["console_url"], spec["shape"], spec["think_s"]
    pages: dict[str, list[float]] = {kind: [] for kind in LOADED_KINDS}
    counts = {"static": 0, "static_full": 0, "static_revalidated": 0, "errors": 0}
    pauses: list[float] = []
    sessions = [aiohttp.ClientSession(headers=basic_auth())
                for _ in range(spec["browsers"])]

    async def browse(number: int, session, end: float) -> None:
        rng, cache, turn = random.Random(THINK_SEED + number), BrowserCache(), number
        if think_s:  # people do not all click at once
            await asyncio.sleep(min(rng.uniform(0.0, think_s), max(0.0, end - time.time())))
        while time.time() < end:
            kind = LOADED_KINDS[turn % len(LOADED_KINDS)]
            url = base + page_path(kind, turn, shape)
            started = time.perf_counter()
            async with session.get(url, allow_redirects=False) as response:
                html, status = await response.read(), response.status
            ms = (time.perf_counter() - started) * 1000
            assets = page_assets(html, url) if status == 200 else []
            statics = [s for s in await asyncio.gather(*(load_asset(session, cache, asset)
                                                          for asset in assets)) if s]
            if time.time() > end:
                break
            pages[kind].append(ms)
            counts["static"] += len(statics)
            counts["static_full"] += statics.count(200)
            counts["static_revalidated"] += statics.count(304)
            counts["errors"] += (status != 200) + sum(s not in (200, 304) for s in statics)
            turn += 1
            if think_s:
                pause = think_s * rng.uniform(1 - THINK_JITTER, 1 + THINK_JITTER)
                pauses.append(pause)
                await asyncio.sleep(min(pause, max(0.0, end - time.time())))

    try:
        for session in sessions:  # connected and signed in before the window
            async with session.get(base + "/", allow_redirects=False) as response:
                await response.read()
        _, end = await await_go()
        cpu0 = time.process_time()
        await asyncio.gather(*(browse(number, session, end)
                               for number, session in enumerate(sessions)))
        return {"pages": pages, **counts, "cpu_s": time.process_time() - cpu0,
                "think_s": statistics.mean(pauses) if pauses else 0.0}
    finally:
        for session in sessions:
            await session.close()


def child_main(role: str, spec: dict) -> None:
    main_of = {"producer": producer_main, "browsers": browsers_main}[role]
    print(json.dumps(asyncio.run(main_of(spec))), flush=True)


# ---------------------------------------------------------------- under load

def cpu_ticks(pid: int) -> int:
    """utime + stime of process `pid`, in clock ticks."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def machine_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of every CPU since boot, from /proc/stat."""
    with open("/proc/stat") as stat:
        numbers = [int(n) for n in stat.readline().split()[1:]]
    idle = numbers[3] + (numbers[4] if len(numbers) > 4 else 0)  # idle + iowait
    return sum(numbers) - idle, sum(numbers)


def run_phase(name: str, seconds: float, url: str, console_url: str | None, shape: dict,
              args, figures: dict, think_s: float = 0.0) -> None:
    """One window of `seconds`: the producers, and the browsers (pausing about think_s
    between pages) when console_url is given."""
    procs = [child("producer", {"url": url, "partition": p}) for p in range(args.producers)]
    if console_url:
        procs.append(child("browsers", {"console_url": console_url, "shape": shape,
                                        "browsers": args.browsers, "think_s": think_s}))
    try:
        for proc in procs:
            line = proc.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"{name}: a child did not start (exit {proc.wait()})")
        start = time.time() + 0.5
        end = start + seconds
        for proc in procs:
            proc.stdin.write(f"{start!r} {end!r}\n")
            proc.stdin.flush()
        tick = os.sysconf("SC_CLK_TCK")
        time.sleep(max(0.0, start - time.time()))
        daemon0, machine0 = cpu_ticks(args.daemon_pid), machine_ticks()
        time.sleep(max(0.0, end - time.time()))
        daemon1, machine1 = cpu_ticks(args.daemon_pid), machine_ticks()
        results = []
        for proc in procs:
            line = proc.stdout.readline()
            if proc.wait(60) != 0 or not line:
                raise RuntimeError(f"{name}: a child failed (exit {proc.returncode})")
            results.append(json.loads(line))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    producers = results[:args.producers]
    latencies = [ms for result in producers for ms in result["latencies_ms"]]
    figures[f"append_{name}_rps"] = sum(r["records"] for r in producers) / seconds
    if latencies:
        figures[f"append_{name}_batch_p50_ms"] = statistics.median(latencies)
        figures[f"append_{name}_batch_p99_ms"] = percentile(latencies, 0.99)
    figures[f"producers_cores_{name}"] = sum(r["cpu_s"] for r in producers) / seconds
    figures[f"daemon_cores_{name}"] = (daemon1 - daemon0) / tick / seconds
    busy, total = machine1[0] - machine0[0], machine1[1] - machine0[1]
    figures[f"machine_busy_cores_{name}"] = (busy / total * os.cpu_count()) if total else None
    ours = figures[f"daemon_cores_{name}"] + figures[f"producers_cores_{name}"] + (
        results[-1]["cpu_s"] / seconds if console_url else 0.0)
    if total:  # other processes' CPU (and the kernel's work for ours, fsync's included)
        figures[f"other_cores_{name}"] = max(0.0, figures[f"machine_busy_cores_{name}"] - ours)
    said = (f"  {name}: {figures[f'append_{name}_rps']:,.0f} rec/s appended; cores used: "
            f"daemon {figures[f'daemon_cores_{name}']:.2f}, producers "
            f"{figures[f'producers_cores_{name}']:.2f}")
    if console_url:
        browsers = results[-1]
        every = [ms for values in browsers["pages"].values() for ms in values]
        figures[f"{name}_think_s"] = browsers["think_s"]
        figures[f"{name}_pages"] = len(every)
        figures[f"{name}_pages_per_s"] = len(every) / seconds
        figures[f"{name}_static_per_s"] = browsers["static"] / seconds
        figures[f"{name}_static_full"] = browsers["static_full"]
        figures[f"{name}_static_revalidated"] = browsers["static_revalidated"]
        figures[f"{name}_errors"] = browsers["errors"]
        figures[f"loadgen_cpu_s_{name}"] = browsers["cpu_s"]
        figures[f"loadgen_cores_{name}"] = browsers["cpu_s"] / seconds
        if every:
            spread(f"{name}_page", every, figures)
        for kind, values in browsers["pages"].items():
            if values:
                figures[f"{name}_{kind}_p95_ms"] = percentile(values, 0.95)
        said += (f", browsers {figures[f'loadgen_cores_{name}']:.2f}; "
                 f"{figures[f'{name}_pages_per_s']:.1f} pages/s, "
                 f"{figures[f'{name}_static_per_s']:.1f} files/s")
    progress(said + f"; machine {figures[f'machine_busy_cores_{name}']:.2f} of "
                    f"{os.cpu_count()} cores busy, {figures.get(f'other_cores_{name}', 0):.2f} "
                    "of them not ours")


def measure_load(url: str, console_url: str, shape: dict, args, figures: dict) -> None:
    with phase(f"warm-up: {args.producers} producers, {args.warmup_s:g} s (not counted)"):
        run_phase("warm-up", args.warmup_s, url, None, shape, args, {})
    what = {"browsing": f" and {args.browsers} browsers, about {args.think_s:g} s between "
                        "pages",
            "flood": f" and {args.browsers} browsers, no pause between pages"}
    for name in PHASES:
        think_s = args.think_s if name == "browsing" else 0.0
        with phase(f"{name}: {args.producers} producers"
                   + what.get(name, ", no console traffic") + f", {args.phase_s:g} s"):
            run_phase(name, args.phase_s, url, console_url if name in LOADED else None,
                      shape, args, figures, think_s)
    baselines = [figures.get(f"append_{name}_rps") for name in BASELINES]
    if all(baselines):
        figures["append_baseline_rps"] = statistics.mean(baselines)
        figures["append_baseline_drift"] = baselines[-1] / baselines[0]
        figures["append_baseline_spread"] = max(baselines) / min(baselines)
        for name in LOADED:
            if f"append_{name}_rps" in figures:
                figures[f"append_{name}_vs_baseline"] = (figures[f"append_{name}_rps"]
                                                         / figures["append_baseline_rps"])


# ---------------------------------------------------------------- the run

LOADED_TITLES = {"browsing": "20 browsers", "flood": "a flood"}

ROWS = [
    *(Row(f"{kind} p{which}", f"page_{kind}_p{which}_ms", "ms")
      for kind in PAGE_KINDS for which in ("50", "95")),
    Row("slowest kind's p95", "page_p95_worst_ms", "ms"),
    Row("append, baseline 1", "append_baseline1_rps", "rec/s",
        {"vs baseline": "append_baseline_rps"}),
    Row("append, 20 browsers", "append_browsing_rps", "rec/s",
        {"vs baseline": "append_baseline_rps"}),
    Row("append, baseline 2", "append_baseline2_rps", "rec/s",
        {"vs baseline": "append_baseline_rps"}),
    Row("append, flood (no pause)", "append_flood_rps", "rec/s",
        {"vs baseline": "append_baseline_rps"}),
    Row("append, baseline 3", "append_baseline3_rps", "rec/s",
        {"vs baseline": "append_baseline_rps"}),
    Row("append, baseline (mean)", "append_baseline_rps", "rec/s"),
    Row("append batch p99, baseline 1", "append_baseline1_batch_p99_ms", "ms"),
    *(Row(f"append batch p99, {LOADED_TITLES[name]}", f"append_{name}_batch_p99_ms", "ms",
          {"vs baseline": "append_baseline1_batch_p99_ms"}) for name in LOADED),
    *(row for name in LOADED for row in (
        Row(f"pages/s, {LOADED_TITLES[name]}", f"{name}_pages_per_s", "/s"),
        Row(f"file requests/s, {LOADED_TITLES[name]}", f"{name}_static_per_s", "/s"),
        Row(f"files in full (200), {LOADED_TITLES[name]}", f"{name}_static_full", ""),
        Row(f"files revalidated (304), {LOADED_TITLES[name]}", f"{name}_static_revalidated",
            ""),
        Row(f"page p50, {LOADED_TITLES[name]}", f"{name}_page_p50_ms", "ms"),
        Row(f"page p95, {LOADED_TITLES[name]}", f"{name}_page_p95_ms", "ms"),
        Row(f"page max, {LOADED_TITLES[name]}", f"{name}_page_max_ms", "ms"),
        *(Row(f"{kind} p95, {LOADED_TITLES[name]}", f"{name}_{kind}_p95_ms", "ms",
              {"vs baseline": f"page_{kind}_p95_ms"}) for kind in LOADED_KINDS),
        Row(f"non-200 responses, {LOADED_TITLES[name]}", f"{name}_errors", ""),
        Row(f"cores: load generator, {LOADED_TITLES[name]}", f"loadgen_cores_{name}",
            "cores"))),
    *(Row(f"cores: daemon, {name}", f"daemon_cores_{name}", "cores") for name in PHASES),
    *(Row(f"cores: producers, {name}", f"producers_cores_{name}", "cores")
      for name in PHASES),
    *(Row(f"cores: machine busy, {name}", f"machine_busy_cores_{name}", "cores")
      for name in PHASES),
    Row("cores: daemon, page loads", "daemon_cores_pages", "cores"),
    *(Row(f"cores: not ours, {name}", f"other_cores_{name}", "cores")
      for name in ("pages", *PHASES)),
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=PARTITIONS,
                        help=f"partitions of `events` (default {PARTITIONS})")
    parser.add_argument("--records", type=int, default=RECORDS,
                        help=f"records per partition of `events` (default {RECORDS:,})")
    parser.add_argument("--loads", type=int,
                        help=f"timed loads of each page kind (default {LOADS}; "
                             f"{QUICK_LOADS} with --quick)")
    parser.add_argument("--producers", type=int, default=PRODUCERS)
    parser.add_argument("--browsers", type=int, default=BROWSERS)
    parser.add_argument("--phase-s", type=float,
                        help=f"seconds of each load phase (default {PHASE_S:g}; "
                             f"{QUICK_PHASE_S:g} with --quick)")
    parser.add_argument("--warmup-s", type=float, default=WARMUP_S,
                        help=f"seconds of producers alone before the first baseline, not "
                             f"counted (default {WARMUP_S:g})")
    parser.add_argument("--think-s", type=float, default=THINK_S,
                        help=f"a browser's mean pause between pages in the browsing phase "
                             f"(default {THINK_S:g}; each pause drawn from "
                             f"{1 - THINK_JITTER:g}x - {1 + THINK_JITTER:g}x of it)")
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_LOADS} loads of each page, {QUICK_PHASE_S:g} s phases: "
                             "a smoke run")
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    parser.add_argument("--child", nargs=2, metavar=("ROLE", "SPEC"),
                        help=argparse.SUPPRESS)  # a producer or the browsers, run by run()
    args = parser.parse_args(argv)
    if args.loads is None:
        args.loads = QUICK_LOADS if args.quick else LOADS
    if args.phase_s is None:
        args.phase_s = QUICK_PHASE_S if args.quick else PHASE_S
    return args


def run(args: argparse.Namespace) -> tuple[dict, list[str]]:
    work = fresh_dir(args.workdir.resolve() / "console")
    figures: dict = {"partitions": args.partitions, "records_per_partition": args.records,
                     "producers": args.producers, "browsers": args.browsers,
                     "phase_s": args.phase_s, "think_s": args.think_s,
                     "think_jitter": THINK_JITTER, "think_seed": THINK_SEED,
                     "batch_records": BATCH,
                     "value_bytes": VALUE_BYTES, "daemon_fsync": "always",
                     "phase_order": ", ".join(PHASES),
                     "load_average_1min_at_start": os.getloadavg()[0]}
    failures: list[str] = []
    try:
        with phase(f"build the log: {args.partitions} partitions x {args.records:,} records"):
            shape = build_log(work / "log", args.partitions, args.records)
            shape["partitions"] = args.partitions
        with daemon_on(work / "log") as daemon:
            args.daemon_pid = daemon.proc.pid
            with phase(f"commit {GROUP}'s offsets through the Kafka listener"):
                commit_group(daemon.kafka_port, args.partitions, args.records)
            with phase(f"page loads: {args.loads} of each of {len(PAGE_KINDS)} kinds"):
                attempt("pages", lambda: measure_pages(daemon.console_url, daemon.proc.pid,
                                                       shape, args.loads, figures), failures)
            attempt("load", lambda: measure_load(daemon.url, daemon.console_url, shape, args,
                                                 figures), failures)
    finally:
        remove(work)
        if args.workdir.resolve() == DEFAULT_WORKDIR:
            with contextlib.suppress(OSError):
                DEFAULT_WORKDIR.rmdir()
    return figures, failures


def report_cpu(figures: dict) -> None:
    used = [(LOADED_TITLES[name], figures[f"loadgen_cores_{name}"]) for name in LOADED
            if f"loadgen_cores_{name}" in figures]
    if not used:
        return
    print("\nthe load generator used " + ", ".join(
        f"{cores:.2f} cores with {title}" for title, cores in used)
        + f" (of the machine's {os.cpu_count()}): on this machine it competes with the "
        "daemon and the producers, so the loaded phases' rates count that competition too.")
    if "browsing_think_s" in figures:
        print(f"the browsers paused {figures['browsing_think_s']:.2f} s between pages on "
              f"average (asked: {figures['think_s']:g} s, -/+{THINK_JITTER:.0%}); each "
              "page's files were fetched as a browser's cache allows (files/s above).")
    print(f"phases in the order {figures['phase_order']}; the baseline is the mean of the "
          f"three baselines (last/first: {figures.get('append_baseline_drift', 0):.2f}x, "
          f"largest/smallest: {figures.get('append_baseline_spread', 0):.2f}x).")
    others = [figures[f"other_cores_{name}"] for name in ("pages", *PHASES)
              if f"other_cores_{name}" in figures]
    if others and max(others) > OTHER_CORES_NOISY:
        print(f"the machine was not quiet: other processes (and the kernel) used up to "
              f"{max(others):.2f} cores during the measurements; the figures are noisy.")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        child_main(args.child[0], json.loads(args.child[1]))
        return
    figures, failures = run(args)
    figures["command"] = command_line()
    path = write_results("console", figures)
    print()
    print_table(figures, ROWS, ["vs baseline"])
    report_cpu(figures)
    print_targets(figures, TARGETS)
    finish(path, failures)


if __name__ == "__main__":
    main()
