"""Two streaming queries on a Spark standalone cluster, for test_spark_cluster.py.

    python spark_cluster_job.py MASTER_URL INPUT_LOG LOCAL_OUT DAEMON_URL WORKDIR

Both read stream `in` of INPUT_LOG (a local directory every executor can read) from
the earliest offset, 100 offsets per micro-batch (Trigger.AvailableNow), and write key
and b"out-" + value to stream `out`: one into the log directory LOCAL_OUT, one through
the daemon at DAEMON_URL (token from STREAMLOG_TOKEN, passed to the executors with
spark.executorEnv). Prints `progress <local batch> <daemon batch>` as micro-batches
finish, so the test can kill a worker mid-query, and `done` when both have finished.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from spark_helpers import ROOT  # noqa: E402


def session(master: str):
    from pyspark.sql import SparkSession
    return (SparkSession.builder.master(master).appName("streamlog-cluster-test")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.executor.cores", "1")
            .config("spark.executor.memory", "512m")
            .config("spark.driver.memory", "512m")
            .config("spark.pyspark.python", sys.executable)
            .config("spark.executorEnv.PYTHONPATH", str(ROOT))
            .config("spark.executorEnv.STREAMLOG_TOKEN", os.environ["STREAMLOG_TOKEN"])
            .config("spark.executor.extraJavaOptions", "-XX:TieredStopAtLevel=1")
            .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
            .getOrCreate())


def main(master: str, input_log: str, local_out: str, daemon_url: str, workdir: str) -> None:
    from pyspark.sql import functions as F
    spark = session(master)
    spark.sparkContext.setLogLevel("ERROR")
    queries = []
    for name, target in (("local", local_out), ("daemon", daemon_url)):
        source = (spark.readStream.format("streamlog").option("path", input_log)
                  .option("stream", "in").option("startingOffsets", "earliest")
                  .option("maxOffsetsPerTrigger", "100").load())
        result = source.select("key", F.concat(F.lit(b"out-"), "value").alias("value"))
        queries.append(result.writeStream.format("streamlog").queryName(name)
                       .option("path", target).option("stream", "out")
                       .option("partitions", "2")
                       .option("checkpointLocation", os.path.join(workdir, f"ckpt-{name}"))
                       .trigger(availableNow=True).start())
    seen = None
    while any(q.isActive for q in queries):
        batches = tuple(q.lastProgress["batchId"] if q.lastProgress else -1 for q in queries)
        if batches != seen:
            seen = batches
            print("progress", *batches, flush=True)
        time.sleep(0.1)
    for query in queries:
        query.awaitTermination()
    print("done", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:6])
