"""A producer process and a Spark streaming query share one local log (DESIGN 9): the
producer appends to `events` and to a second stream without pause, while the query
reads `events` and writes through the streamlog sink into `out` of the same directory.
Each commit must land within seconds (no wait for the producer to close the log), and
every record of both writers must be there exactly once.

The producer's second stream is `side`, or `out` itself: then its appends and the
sink's commits share partitions, and a commit's rows and commit record may have the
producer's records between them."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from pyspark.sql import functions as F

import streamlog

pytestmark = pytest.mark.slow

# Appends one record to `events` and one to argv[3] (partition i % 2) until the file
# named by argv[2] exists, then prints how many of each it appended.
PRODUCER = """
import os, sys, time, streamlog
path, stop, second = sys.argv[1], sys.argv[2], sys.argv[3]
count = 0
with streamlog.open_log(path, fsync="always") as log:
    while not os.path.exists(stop) and count < 100000:
        log.append_sync("events", b"e%06d" % count, key=b"k%d" % (count % 5))
        log.append_sync(second, b"p%06d" % count, partition=count % 2)
        count += 1
        time.sleep(0.004)
print(count, flush=True)
"""


@pytest.mark.parametrize("second", ["side", "out"])
def test_producer_and_sink_write_one_log_exactly_once(spark, tmp_path, second):
    path, stop = tmp_path / "log", tmp_path / "stop"
    with streamlog.open_log(path) as log:
        log.create_stream("events", partitions=2)
        log.create_stream("out", partitions=2)
        log.create_stream("side", partitions=2)
    producer = subprocess.Popen([sys.executable, "-c", PRODUCER, str(path), str(stop),
                                 second],
                                stdout=subprocess.PIPE, text=True)
    query = None
    try:
        source = (spark.readStream.format("streamlog").option("path", str(path))
                  .option("stream", "events").option("startingOffsets", "earliest").load())
        query = (source.select("key", F.concat(F.lit(b"s-"), "value").alias("value"))
                 .writeStream.format("streamlog").option("path", str(path))
                 .option("stream", "out").option("checkpointLocation", str(tmp_path / "ck"))
                 .trigger(processingTime="500 milliseconds").start())
        deadline = time.monotonic() + 120  # a loaded machine starts Spark's workers slowly
        while len([p for p in query.recentProgress if p["numInputRows"]]) < 4:
            assert query.exception() is None and time.monotonic() < deadline
            time.sleep(0.2)
        assert producer.poll() is None  # it wrote the whole time, beside the sink
        stop.touch()
        produced = int(producer.communicate(timeout=60)[0])
        query.processAllAvailable()
        progress = [p for p in query.recentProgress if p["numInputRows"]]
    finally:
        stop.touch()
        if query is not None:
            query.stop()
        producer.kill()
        producer.wait()
    # every micro-batch committed in seconds: nothing waited for the producer's log (a
    # lock wait was 60 s, then a failure; the first batch also starts Python workers)
    assert max(p["durationMs"]["addBatch"] for p in progress) < 30_000, [
        p["durationMs"] for p in progress]
    assert produced > 20
    with streamlog.open_log(path, readonly=True) as log:
        events = sorted(r.value for n in (0, 1) for r in log.reader("events", n))
        out = sorted(r.value for n in (0, 1) for r in log.reader("out", n))
        side = sorted(r.value for n in (0, 1) for r in log.reader("side", n))
        ends = {n: log.end_offset("events", n) for n in (0, 1)}
    assert events == [b"e%06d" % i for i in range(produced)]
    assert json.loads(progress[-1]["sources"][0]["endOffset"]) == {
        "events": {str(n): end for n, end in ends.items()}}
    theirs = [b"p%06d" % i for i in range(produced)]
    ours = [b"s-e%06d" % i for i in range(produced)]
    assert (out, side) == ((sorted(ours), theirs) if second == "side"
                           else (sorted(ours + theirs), []))
