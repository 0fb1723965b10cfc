"""format("streamlog") on a Spark standalone cluster: a master and two workers on
127.0.0.1, each its own JVM started from pyspark's own classes, run two streaming
queries (streamlog -> streamlog, one into a log directory, one through a daemon); one
worker is SIGKILLed (with its executor) mid-query. Spark runs the lost tasks again on
the other worker, and every result must be in each output exactly once.

The query runs in a child process (spark_cluster_job.py) so that it is not the shared
local SparkSession of the other tests; every JVM is killed at the end, whatever
happened."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from spark_helpers import EPOCH_US, spark_environment, write_log

import pyspark
import streamlog
from streamlog.testing.serve import ServeProcess

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
TOKEN = "spark-cluster-test-token"
COUNT = 300  # per partition: 6 micro-batches of 100 offsets


class Cluster:
    """A standalone master and workers, each a JVM in its own process group."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.processes: list[subprocess.Popen] = []
        self.env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", SPARK_NO_DAEMONIZE="1",
                        SPARK_HOME=str(SPARK_CLASS.parent.parent),
                        **spark_environment())
        self.master = self._start("master", "org.apache.spark.deploy.master.Master",
                                  "--host", "127.0.0.1", "--port", "0", "--webui-port", "0")
        self.url = self._wait_for(self.master, "master",
                                  r"Starting Spark master at (spark://\S+)")

    def _start(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "wb")
        process = subprocess.Popen([str(SPARK_CLASS), *args], stdout=log,
                                   stderr=subprocess.STDOUT, env=self.env,
                                   start_new_session=True)
        log.close()
        self.processes.append(process)
        return process

    def _wait_for(self, process, name: str, pattern: str, timeout_s: float = 60) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = (self.workdir / f"{name}.log").read_text(errors="replace")
            found = re.search(pattern, text)
            if found:
                return found.group(1) if found.groups() else found.group(0)
            assert process.poll() is None, text[-3000:]
            time.sleep(0.2)
        raise AssertionError(f"{name} did not start: {text[-3000:]}")

    def start_worker(self, name: str) -> subprocess.Popen:
        work = self.workdir / name
        work.mkdir()
        process = self._start(name, "org.apache.spark.deploy.worker.Worker", self.url,
                              "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                              "--webui-port", "0", "--work-dir", str(work))
        self._wait_for(process, name, r"Successfully registered with master")
        return process

    def kill(self, process) -> None:
        """SIGKILL the process's whole group: a worker and the executor it started."""
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()

    def stop(self) -> None:
        for process in self.processes:
            self.kill(process)


def values(log, count: int) -> list[bytes]:
    return sorted(r.value for n in range(count) for r in log.reader("out", n))


def test_a_worker_killed_mid_query_loses_and_repeats_nothing(tmp_path, monkeypatch):
    source = tmp_path / "in"
    write_log(source, "in", {n: [(b"k%d" % (i % 7), b"v%d-%04d" % (n, i), EPOCH_US + i)
                                 for i in range(COUNT)] for n in (0, 1)})
    expected = sorted(b"out-v%d-%04d" % (n, i) for n in (0, 1) for i in range(COUNT))
    daemon = ServeProcess(tmp_path / "daemon-log", "--fsync", "never", token=TOKEN)
    cluster = job = None
    try:
        cluster = Cluster(tmp_path)
        doomed = cluster.start_worker("worker-1")
        cluster.start_worker("worker-2")
        env = dict(os.environ, STREAMLOG_TOKEN=TOKEN, **spark_environment())
        job = subprocess.Popen(
            [sys.executable, str(HERE / "spark_cluster_job.py"), cluster.url, str(source),
             str(tmp_path / "out"), daemon.url, str(tmp_path)],
            stdout=subprocess.PIPE, stderr=open(tmp_path / "job.log", "wb"), env=env,
            text=True, start_new_session=True)
        killed_at = None
        for line in job.stdout:
            words = line.split()
            if words[:1] == ["progress"] and killed_at is None and min(map(int, words[1:])) >= 2:
                cluster.kill(doomed)  # mid-query: both queries are a few batches in
                killed_at = words[1:]
            if words[:1] == ["done"]:
                break
        assert job.wait(timeout=120) == 0, (tmp_path / "job.log").read_text()[-5000:]
        assert killed_at is not None, "the queries ended before the worker could be killed"
    finally:
        if job is not None and job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        if cluster is not None:
            cluster.stop()
    with streamlog.open_log(tmp_path / "out", readonly=True) as log:
        assert values(log, 2) == expected
    monkeypatch.setenv("STREAMLOG_TOKEN", TOKEN)  # (not left behind for other tests)
    try:
        with streamlog.open_log(daemon.url) as log:
            assert values(log, 2) == expected
    finally:
        daemon.stop()
