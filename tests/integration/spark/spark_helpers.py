"""Helpers of the Spark tests: the session builder, the environment a Spark driver
needs, and a way to fill a log. Imported by conftest.py, the tests and the query job."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import streamlog

ROOT = Path(__file__).resolve().parents[3]
EPOCH_US = 1_700_000_000_000_000  # 2023-11-14T22:13:20Z
# What the session fixture saw when it first used format("streamlog") with no register.
AUTO_REGISTRATION: dict = {}


def spark_environment() -> dict[str, str]:
    """Environment variables for a Spark driver (here or in a child process)."""
    path = os.environ.get("PYTHONPATH", "")
    return {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PYTHONPATH": f"{ROOT}{os.pathsep}{path}" if path else str(ROOT)}


def build_session(app_name: str):
    from pyspark.sql import SparkSession
    return (SparkSession.builder.master("local[2]").appName(app_name)
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.driver.memory", "1g")
            # Short jobs on small data: the JIT's first tier starts faster.
            .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
            .getOrCreate())


def write_log(path, stream: str, rows: dict[int, list[tuple]], **options) -> None:
    """Create `stream` in the log at `path` with rows {partition: [(key, value, ts_us)]}."""
    with streamlog.open_log(path, fsync="never", **options) as log:
        log.create_stream(stream, partitions=max(rows) + 1)
        for number, records in rows.items():
            if records:
                log.append_batch_sync(stream, [r[1] for r in records],
                                      keys=[r[0] for r in records],
                                      timestamps_us=[r[2] for r in records], partition=number)


def spark_error_text(excinfo) -> str:
    """The whole text of an error raised through Spark (Python, JVM and worker parts)."""
    return str(excinfo.value)
