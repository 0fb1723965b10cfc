"""`streamlog serve` as an operator runs it: ports, errors, help, /healthz and /metrics.

Covered: two daemons on different ports in one test (metrics on P+1 each, or any free
port); a data or metrics port in use (one line naming the port and the listener, exit 2,
no log directory left behind); the help (what it does, the token, TLS, the endpoints,
SIGTERM, examples); /metrics parsed with prometheus_client's parser, its counters moving
with traffic and its tailer gauge following a pushed tail; /healthz; several Metrics in
one process. The token refusal and SIGTERM's drain (exit 0) are in test_daemon.py
(test_serve_refuses_to_start_without_a_token, test_sigterm_drains_and_exits_zero).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import prometheus_client
import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families)
from prometheus_client.parser import text_string_to_metric_families

from streamlog.testing.serve import SERVE, ServeProcess
from streamlog.wire import serve_cli
from streamlog.wire.client import open_remote
from streamlog.wire.metrics import Metrics, count_scrub_result

pytestmark = pytest.mark.slow

TOKEN = "serve-cli-test-token"


# -- helpers -----------------------------------------------------------------------------

def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _free_pair() -> int:
    """A port P such that P, P + 1 and P + 2 (the metrics and console defaults) are all
    free now."""
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port < 65533 and all(_bindable(port + i) for i in range(3)):
            return port
    raise AssertionError("no three free neighbouring ports")


@contextlib.contextmanager
def _occupied(port: int = 0):
    """A listening socket on `port` (0: any); yields its port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        yield sock.getsockname()[1]


def _http(port: int, path: str, *, method: str = "GET",
          headers: dict | None = None) -> tuple[int, str, str]:
    """(status, content type, body)."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                     headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return (response.status, response.headers["Content-Type"],
                    response.read().decode())
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read().decode()


def _samples(port: int) -> dict[str, float]:
    """/metrics parsed by prometheus_client: {sample name: value} (no labelled samples)."""
    status, kind, body = _http(port, "/metrics")
    assert status == 200 and kind.startswith("text/plain; version=0.0.4")
    return {sample.name: sample.value for family in text_string_to_metric_families(body)
            for sample in family.samples if not sample.labels}


def _wait_for(port: int, name: str, value: float, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while (seen := _samples(port).get(name)) != value:
        assert time.monotonic() < deadline, f"{name} is {seen}, not {value}"
        time.sleep(0.05)


def _serve(*args: str, token: str | None = TOKEN) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "STREAMLOG_TOKEN"}
    if token is not None:
        env["STREAMLOG_TOKEN"] = token
    return subprocess.run([sys.executable, "-c", SERVE, *args], env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.fixture
def daemons():
    started: list[ServeProcess] = []

    def start(path, *extra: str, **options) -> ServeProcess:
        daemon = ServeProcess(path, *extra, "--scrub-mib-per-s", "0", token=TOKEN, **options)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        assert daemon.stop() == 0


# -- ports -------------------------------------------------------------------------------

def test_two_daemons_on_different_ports_both_start(tmp_path, daemons):
    first_port = _free_pair()
    first = daemons(tmp_path / "one", port=str(first_port), metrics_port=None)
    second_port = _free_pair()
    second = daemons(tmp_path / "two", port=str(second_port), metrics_port=None)
    third = daemons(tmp_path / "three", port="0", metrics_port=None)  # both any free port
    assert (first.port, first.metrics_port) == (first_port, first_port + 1)
    assert (second.port, second.metrics_port) == (second_port, second_port + 1)
    assert third.metrics_port not in (None, 1, first.metrics_port, second.metrics_port)
    for daemon in (first, second, third):
        status, _, body = _http(daemon.metrics_port, "/healthz")
        assert status == 200 and json.loads(body)["status"] == "ok"
        with open_remote(daemon.url, TOKEN) as log:
            log.create_stream("s")
            log.append_sync("s", daemon.url.encode())
    for daemon in (first, second, third):  # each serves its own log and its own figures
        assert _samples(daemon.metrics_port)["streamlog_append_records_total"] == 1


def test_metrics_port_none_serves_no_http(tmp_path, daemons):
    port = _free_pair()
    daemon = daemons(tmp_path / "log", port=str(port), metrics_port="none")
    assert daemon.metrics_port is None
    assert _bindable(port + 1)  # nothing took P+1


@pytest.mark.parametrize("which", ["data", "metrics", "metrics default P+1", "console",
                                   "console default P+2"])
def test_a_port_in_use_is_one_line_naming_it_exit_2_and_nothing_created(tmp_path, which):
    path = tmp_path / "parent" / "log"
    if which == "data":
        with _occupied() as busy:
            done = _serve(str(path), "--port", str(busy), "--metrics-port", "0")
    elif which == "metrics":
        with _occupied() as busy:
            done = _serve(str(path), "--port", "0", "--metrics-port", str(busy))
    elif which == "console":
        with _occupied() as busy:
            done = _serve(str(path), "--port", "0", "--console-port", str(busy))
    elif which == "console default P+2":
        port = _free_pair()
        with _occupied(port + 2) as busy:
            done = _serve(str(path), "--port", str(port))
    else:  # the complaint: a second daemon on another port, its P+1 taken
        port = _free_pair()
        with _occupied(port + 1) as busy:
            done = _serve(str(path), "--port", str(port))
    listener = which.split()[0]
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"127.0.0.1:{busy} ({listener} port)" in lines[0], lines[0]
    assert "in use" in lines[0].lower()
    assert not os.path.exists(tmp_path / "parent")


def test_an_existing_log_is_left_as_it_was_when_a_port_is_in_use(tmp_path, daemons):
    path = tmp_path / "log"
    daemon = daemons(path, port="0", metrics_port="0")
    with open_remote(daemon.url, TOKEN) as log:
        log.create_stream("kept")
        log.append_sync("kept", b"x")
    before = sorted(p.relative_to(path) for p in path.rglob("*"))
    other = _serve(str(tmp_path / "other"), "--port", str(daemon.port))
    assert other.returncode == 2 and f"({'data'} port)" in other.stderr
    assert sorted(p.relative_to(path) for p in path.rglob("*")) == before
    assert not os.path.exists(tmp_path / "other")


def test_unreadable_tls_files_exit_2_and_create_nothing(tmp_path):
    done = _serve(str(tmp_path / "log"), "--port", "0", "--tls-cert", str(tmp_path / "no.pem"),
                  "--tls-key", str(tmp_path / "no.key"))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "TLS" in done.stderr and not os.path.exists(tmp_path / "log")


def test_usage_errors_of_the_port_options():
    assert serve_cli.metrics_port_for(7541, None) == 7542
    assert serve_cli.metrics_port_for(9000, None) == 9001
    assert serve_cli.metrics_port_for(0, None) == 0
    assert serve_cli.metrics_port_for(9000, "none") is None
    assert serve_cli.metrics_port_for(9000, 0) == 0
    for port, metrics_port in ((65535, None), (9000, 9000)):
        with pytest.raises(ValueError):
            serve_cli.metrics_port_for(port, metrics_port)
    done = _serve("unused", "--port", "9000", "--metrics-port", "9000")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert serve_cli.console_port_for(7541, None, 7542) == 7543
    assert serve_cli.console_port_for(0, None, 0) == 0
    assert serve_cli.console_port_for(9000, "none", 9001) is None
    assert serve_cli.console_port_for(9000, 8080, None) == 8080
    for port, console_port, metrics_port in ((65534, None, None), (9000, 9000, 9001),
                                             (9000, 9001, 9001)):
        with pytest.raises(ValueError):
            serve_cli.console_port_for(port, console_port, metrics_port)
    done = _serve("unused", "--port", "9000", "--console-port", "9001")
    assert done.returncode == 2
    assert done.stderr.strip() == ("streamlog serve: --console-port 9001 is the metrics "
                                   "port too")


# -- help --------------------------------------------------------------------------------

def test_help_says_what_it_does_with_examples(capsys):
    with pytest.raises(SystemExit) as exit_info:
        serve_cli.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for needed in ("STREAMLOG_TOKEN", "--metrics-port", "P+1", "none", "/healthz", "/metrics",
                   "--tls-cert", "streamlog+tls://", "SIGTERM", "exit codes:", "examples:",
                   "streamlog serve data/log --port 9000", "--console-port", "P+2",
                   "--console-write", "curl -u streamlog:"):
        assert needed in text, needed
    assert "DESIGN" not in text  # the help stands on its own


# -- /healthz and /metrics ---------------------------------------------------------------

def test_metrics_parse_and_follow_traffic_and_tailers(tmp_path, daemons):
    daemon = daemons(tmp_path / "log", metrics_port="0")
    port = daemon.metrics_port
    before = _samples(port)
    assert before["streamlog_append_records_total"] == 0
    assert before["streamlog_connections_accepted_total"] == 0
    assert before["streamlog_tailers"] == 0 and before["streamlog_connections"] == 0
    with open_remote(daemon.url, TOKEN) as log:
        log.create_stream("m")
        for _ in range(3):
            log.append_batch_sync("m", [b"v" * 10] * 100)
        assert [r.value for r in log.reader("m", 0, to_offset=5)] == [b"v" * 10] * 5
        after = _samples(port)
        assert after["streamlog_append_records_total"] == 300
        assert after["streamlog_append_requests_total"] == 3
        assert after["streamlog_append_bytes_total"] > 3000
        assert after["streamlog_read_records_total"] == 5
        assert after["streamlog_connections_accepted_total"] == 1
        assert after["streamlog_connections"] == 1
        assert after["streamlog_append_ack_seconds_count"] == 3
        assert after["streamlog_fsync_seconds_count"] >= 3
        assert after["streamlog_tailers"] == 0  # a bounded read is not a tail
        follower = log.reader("m", 0, from_offset=300, follow=True)  # a pushed tail
        log.append_sync("m", b"live")
        assert next(iter(follower)).value == b"live"
        tailing = _samples(port)
        assert tailing["streamlog_tailers"] == 1
        assert tailing["streamlog_tail_lag_records"] == 0
        follower.close()
        _wait_for(port, "streamlog_tailers", 0)
    _wait_for(port, "streamlog_connections", 0)
    status, kind, body = _http(port, "/metrics", headers={
        "Accept": "application/openmetrics-text; version=1.0.0"})
    assert status == 200 and kind.startswith("application/openmetrics-text")
    names = {family.name for family in openmetrics_families(body)}
    assert {"streamlog_append_records", "streamlog_tailers",
            "streamlog_fsync_seconds"} <= names


def test_healthz_and_other_paths(tmp_path, daemons):
    daemon = daemons(tmp_path / "log", metrics_port="0")
    status, kind, body = _http(daemon.metrics_port, "/healthz")
    assert (status, kind) == (200, "application/json")
    assert json.loads(body) == {"status": "ok", "connections": 0}
    assert _http(daemon.metrics_port, "/healthz", method="HEAD")[:2] == (200, "application/json")
    assert _http(daemon.metrics_port, "/nope")[0] == 404
    assert _http(daemon.metrics_port, "/metrics", method="POST")[0] == 405


def test_each_metrics_has_a_registry_of_its_own():
    one, two = Metrics(), Metrics()
    one.counters["append_records"] += 5
    one.fsync_seconds.observe(0.001)
    assert one.counters["append_records"] == 5 and two.counters["append_records"] == 0
    assert one.registry.get_sample_value("streamlog_append_records_total") == 5
    assert two.registry.get_sample_value("streamlog_append_records_total") == 0
    assert two.registry.get_sample_value("streamlog_fsync_seconds_count") == 0
    assert prometheus_client.REGISTRY.get_sample_value("streamlog_append_records_total") is None
    with pytest.raises(KeyError):  # a typo is not a new metric
        one.counters["apend_records"] += 1
    with pytest.raises(ValueError):
        one.counters["append_records"] = 1
    count_scrub_result(two, SimpleNamespace(check=SimpleNamespace(bytes_hashed=4096,
                                                                  is_problem=True)))
    assert two.registry.get_sample_value("streamlog_scrub_segments_total") == 1
    assert two.registry.get_sample_value("streamlog_scrub_bytes_total") == 4096
    assert two.registry.get_sample_value("streamlog_scrub_problems_total") == 1
    body, kind = two.exposition()
    assert kind.startswith("text/plain") and b"streamlog_tailers 0.0" in body
