"""One local SparkSession for every Spark test (starting one costs seconds).

The session's Python workers must run this interpreter (the venv with pyarrow and
streamlog), and must see the project root on their path, as an installed streamlog
would put `pyspark_streamlog` there: Spark registers format("streamlog") from it with
no call. The fixture checks that before any test can register the source explicitly,
and keeps the outcome in spark_helpers.AUTO_REGISTRATION for test_spark_read.py.
"""

from __future__ import annotations

import os

import pytest
from spark_helpers import (AUTO_REGISTRATION, EPOCH_US, build_session, spark_environment,
                           write_log)


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    os.environ.update(spark_environment())
    session = build_session("streamlog-tests")
    session.sparkContext.setLogLevel("ERROR")
    probe = tmp_path_factory.mktemp("probe") / "log"
    write_log(probe, "probe", {0: [(None, b"x", EPOCH_US)]})
    try:
        rows = (session.read.format("streamlog").option("path", str(probe))
                .option("stream", "probe").load().collect())
        AUTO_REGISTRATION["rows"] = [(r.stream, r.offset, r.value) for r in rows]
    except Exception as error:  # noqa: BLE001 - asserted by a test, not here
        AUTO_REGISTRATION["error"] = repr(error)
    yield session
    session.stop()
