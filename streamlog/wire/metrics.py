"""The daemon's Prometheus metrics: counters, gauges and histograms of one LogServer.

Strategy: `Metrics` owns a `prometheus_client.CollectorRegistry` of its own (never the
library's process-global REGISTRY), so several daemons in one process (tests, an
application embedding LogServer) keep separate figures and never collide on a name. The
exposition (`exposition(accept)`: the Prometheus text format, or OpenMetrics when the
scraper asks for it) is prometheus_client's; server.py serves it on the metrics port
beside /healthz.

  - counters: prometheus_client Counters behind `metrics.counters`, which keeps the
    `metrics.counters[name] += n` interface of the call sites (server.py, session.py,
    the scrubber's `count_scrub_result`). Each name is written from one thread (the
    loop, the scrubber's thread, or the pool thread that aborts stale transactions), as
    with the collections.Counter this replaces.
  - gauges of the live state (open connections, tailers, their lag, draining) are read
    when /metrics is scraped, from the LogServer given to `watch()`; the scrape runs on
    the daemon's event loop, the only thread that changes that state.
  - histograms: the latency of each segment fsync (`TimedFileIO`, handed to open_log
    before the server exists) and of each APPEND from receipt to acknowledgement.

prometheus_client adds a `NAME_created` series to each counter and histogram (the time
it was created); `PROMETHEUS_DISABLE_CREATED_SERIES=True` in the environment drops them.
"""

from __future__ import annotations

import collections
import threading
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder

from ..fileio import OsFileIO

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
RATE_WINDOW_S = 10

# (key at the call sites, exposed name, help). The connections counter was
# streamlog_connections_total before prometheus_client: a counter's family name is its
# name without _total, and streamlog_connections is the gauge of open connections.
COUNTERS = (
    ("append_requests", "streamlog_append_requests_total", "APPEND requests acknowledged"),
    ("append_records", "streamlog_append_records_total", "records appended and acknowledged"),
    ("append_bytes", "streamlog_append_bytes_total", "payload bytes of acknowledged appends"),
    ("read_records", "streamlog_read_records_total", "records sent to readers and tailers"),
    ("read_bytes", "streamlog_read_bytes_total", "payload bytes sent to readers and tailers"),
    ("connections", "streamlog_connections_accepted_total", "connections accepted"),
    ("auth_failures", "streamlog_auth_failures_total", "HELLOs refused for a wrong token"),
    ("protocol_errors", "streamlog_protocol_errors_total", "connections ended for garbage"),
    ("refused", "streamlog_connections_refused_total", "connections over connections_max"),
    ("request_errors", "streamlog_request_errors_total", "requests answered with ERROR"),
    ("scrub_segments", "streamlog_scrub_segments_total",
     "sealed segments re-verified by the background scrubber"),
    ("scrub_bytes", "streamlog_scrub_bytes_total", "bytes re-verified by the scrubber"),
    ("scrub_problems", "streamlog_scrub_problems_total",
     "scrubbed segments that failed their whole-file checksum (or could not be read)"),
    ("txn_timeouts", "streamlog_txn_timeouts_total",
     "transactions aborted for being open longer than txn_timeout_s"),
)


class _StoreCollector:
    """A log tiered to an object store: its upload lag and backlog by partition, its
    manifest generation, and the store's requests and failures by operation, read from
    the tiering job at each scrape (none when the log is not tiered)."""

    def __init__(self, metrics: "Metrics") -> None:
        self.metrics = metrics

    def describe(self):
        return []  # (names known only at a scrape: collect() is not run at register)

    def collect(self):
        server = self.metrics._server
        tiering = getattr(getattr(server, "log", None), "tiering", None)
        if tiering is None:
            return
        status = tiering.status()
        for name, help_text, values in (
                ("streamlog_remote_lag_records", "records acknowledged here that the "
                 "object store does not hold yet", status["lag_records"]),
                ("streamlog_remote_backlog_bytes", "bytes the object store does not hold "
                 "yet (back-pressure past remote_max_backlog_bytes)",
                 status["backlog_bytes"])):
            family = GaugeMetricFamily(name, help_text, labels=["partition"])
            for partition, value in sorted(values.items()):
                family.add_metric([partition], value)
            yield family
        yield GaugeMetricFamily("streamlog_remote_generation",
                                "the newest manifest generation this writer committed",
                                value=status["generation"])
        yield GaugeMetricFamily("streamlog_remote_fenced", "1 once a newer writer took the "
                                "log over in the store", value=int(status["fenced"]))
        yield CounterMetricFamily("streamlog_remote_commits", "manifest generations "
                                  "committed", value=status["commits"])
        yield CounterMetricFamily("streamlog_remote_round_errors", "tiering rounds that "
                                  "failed (the store down or refusing)",
                                  value=status["errors"])
        for name, help_text, values in (
                ("streamlog_store_requests", "requests to the object store by operation "
                 "(each attempt)", status["requests"]),
                ("streamlog_store_failures", "requests to the object store that failed "
                 "and were retried or given up (5xx, throttling, timeouts)",
                 status["failures"])):
            family = CounterMetricFamily(name, help_text, labels=["operation"])
            for operation, value in sorted(values.items()):
                family.add_metric([operation], value)
            yield family


class Counters:
    """`counters[key] += n` onto the Prometheus counters of COUNTERS. Reading gives the
    count as an int; a key not in COUNTERS is a KeyError (a typo is not a new metric).
    One writer thread per key: `+=` reads, then writes (as a dict's would)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._counters = {key: Counter(name, help_text, registry=registry)
                          for key, name, help_text in COUNTERS}
        self._values = dict.fromkeys(self._counters, 0)
        self._lock = threading.Lock()

    def __getitem__(self, key: str) -> int:
        return self._values[key]

    def __setitem__(self, key: str, value: int) -> None:
        counter = self._counters[key]
        with self._lock:
            delta = value - self._values[key]
            if delta < 0:
                raise ValueError(f"counter {key} cannot go down ({self._values[key]} to "
                                 f"{value})")
            self._values[key] = value
        counter.inc(delta)


class Metrics:
    """The metrics of one daemon, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.counters = Counters(self.registry)
        self.fsync_seconds = Histogram(
            "streamlog_fsync_seconds", "duration of each segment fsync",
            buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.append_seconds = Histogram(
            "streamlog_append_ack_seconds", "APPEND received to acknowledged (write + fsync)",
            buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self._server = None
        self._samples: collections.deque[tuple[float, int]] = collections.deque(
            maxlen=RATE_WINDOW_S + 1)
        for name, help_text, read in (
                ("streamlog_appends_per_second", "records appended per second, last 10 s",
                 lambda: round(self.appends_per_second(), 3)),
                ("streamlog_connections", "open connections",
                 lambda: len(self._server.sessions) if self._server else 0),
                ("streamlog_tailers", "follow reads open (READ with the follow flag: "
                 "records pushed as they are appended)", lambda: len(self._tailers())),
                ("streamlog_tail_lag_records", "records acknowledged but not yet sent, "
                 "summed over tailers", lambda: sum(t.lag() for t in self._tailers())),
                ("streamlog_tail_lag_records_max", "largest lag of one tailer",
                 lambda: max((t.lag() for t in self._tailers()), default=0)),
                ("streamlog_draining", "1 while shutting down",
                 lambda: int(bool(self._server and self._server.draining)))):
            Gauge(name, help_text, registry=self.registry).set_function(read)
        self.registry.register(_StoreCollector(self))

    def watch(self, server) -> None:
        """Read the live gauges from `server` (a LogServer) from now on."""
        self._server = server

    def _tailers(self) -> list:
        server = self._server
        if server is None:
            return []
        return [subscription for session in server.sessions
                for subscription in session.subscriptions.values() if subscription.follow]

    def sample(self) -> None:
        """Once a second (the server's ticker): feeds appends_per_second."""
        self._samples.append((time.monotonic(), self.counters["append_records"]))

    def appends_per_second(self) -> float:
        if len(self._samples) < 2:
            return 0.0
        (t0, n0), (t1, n1) = self._samples[0], self._samples[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0

    def exposition(self, accept: str | None = None) -> tuple[bytes, str]:
        """(body, content type) for /metrics: the Prometheus text format, or OpenMetrics
        when `accept` (the scraper's Accept header) asks for it."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type


class TimedFileIO(OsFileIO):
    """OsFileIO that times every fsync of a segment (the latency an append waits for)."""

    def __init__(self, histogram: Histogram) -> None:
        super().__init__()
        self.histogram = histogram

    def fsync(self, handle: int) -> None:
        start = time.perf_counter()
        super().fsync(handle)
        self.histogram.observe(time.perf_counter() - start)


def count_scrub_result(metrics: Metrics, result) -> None:
    """The scrubber's on_result callback (its thread): feed the scrub counters."""
    metrics.counters["scrub_segments"] += 1
    metrics.counters["scrub_bytes"] += result.check.bytes_hashed
    metrics.counters["scrub_problems"] += int(result.check.is_problem)
