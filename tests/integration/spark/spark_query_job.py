"""The stream->stream query that test_spark_exactly_once.py kills and restarts.

    python spark_query_job.py INPUT_LOG OUTPUT_LOG CHECKPOINT MODE [CRASH]

Reads stream `in` of INPUT_LOG from the earliest offset, 100 offsets per micro-batch
(Trigger.AvailableNow), writes key and b"out-" + value to stream `out` (2 partitions) of
OUTPUT_LOG with the sink mode MODE. Prints `progress <batch id>` after each finished
micro-batch and `done` at the end, so the test can time its kills.

CRASH = POINT:BATCH makes the driver-side commit of micro-batch BATCH SIGKILL this
job's processes (driver, JVM, Python workers) at POINT:
    before-marker       the first partition's rows are appended (in a transaction,
                        or as plain data in truncate mode), its commit marker is not
    between-partitions  the first partition is committed, the second is not touched
    after-commit        every partition is committed; Spark has not recorded it
    before-commit       the driver's commit has not begun: through a daemon, every
                        task's rows are appended in transactions left open
It does so through a subclass of the sink registered as format("streamlog_crashtest");
the sink itself has no such hook.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from spark_helpers import build_session, spark_environment  # noqa: E402


def crashing_source():
    import signal

    import spark_sink._commit as commit_module
    from spark_sink import StreamWriter
    from spark_source import StreamlogDataSource

    def die(driver_pid: int) -> None:
        # The driver's group (driver and JVM), then this worker's own: PySpark's worker
        # daemon puts its workers in a process group of their own.
        os.killpg(os.getpgid(driver_pid), signal.SIGKILL)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    class CrashingWriter(StreamWriter):
        def __init__(self, options, schema, overwrite, crash: str) -> None:
            super().__init__(options, schema, overwrite)
            point, batch, pid = crash.split(":")
            self.point, self.batch, self.driver_pid = point, int(batch), int(pid)

        def commit(self, messages, batchId: int) -> None:
            if batchId != self.batch:
                return super().commit(messages, batchId)
            if self.point == "before-commit":
                die(self.driver_pid)
            original, calls = commit_module._append_in_txn, []

            def append_in_txn(target, stream, number, runs, tag, batch, producer=None):
                calls.append(number)
                if self.point == "before-marker":  # as the commit begins it, then die
                    txn_id = target.new_txn_id() if producer is None else producer.begin()
                    commit_module._append_runs(target, stream, number, runs, txn_id=txn_id)
                    die(self.driver_pid)
                if self.point == "between-partitions" and len(calls) == 2:
                    die(self.driver_pid)
                return original(target, stream, number, runs, tag, batch, producer=producer)

            original_marker, markers = commit_module._marker, []

            def marker(target, stream, number, tag, batch_id):  # truncate mode's commits
                if batch_id == self.batch:
                    markers.append(number)
                    if self.point == "before-marker" or (
                            self.point == "between-partitions" and len(markers) == 2):
                        die(self.driver_pid)
                return original_marker(target, stream, number, tag, batch_id)

            commit_module._append_in_txn = append_in_txn
            commit_module._marker = marker
            super().commit(messages, batchId)
            die(self.driver_pid)  # after-commit, or a point that was never reached

    class CrashingSource(StreamlogDataSource):
        def __init__(self, options) -> None:
            # crashAt is this test's option, not the sink's (which refuses unknown names)
            options = dict(options)
            self.crash = options.pop("crashAt", None) or options.pop("crashat", "none:-1:0")
            super().__init__(options)

        @classmethod
        def name(cls) -> str:
            return "streamlog_crashtest"

        def streamWriter(self, schema, overwrite: bool):
            return CrashingWriter(self.options, schema, overwrite, self.crash)

    return CrashingSource


def main(input_log: str, output_log: str, checkpoint: str, mode: str,
         crash: str = "none:-1") -> None:
    os.environ.update(spark_environment())
    from pyspark.sql import functions as F
    spark = build_session("streamlog-crash-job")
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(crashing_source())
    source = (spark.readStream.format("streamlog").option("path", input_log)
              .option("stream", "in").option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", "100").load())
    result = source.select("key", F.concat(F.lit(b"out-"), "value").alias("value"),
                           "timestamp")
    query = (result.writeStream.format("streamlog_crashtest").option("path", output_log)
             .option("stream", "out").option("partitions", "2").option("mode", mode)
             .option("crashAt", f"{crash}:{os.getpid()}").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    seen = None
    while query.isActive:
        progress = query.lastProgress
        if progress is not None and progress["batchId"] != seen:
            seen = progress["batchId"]
            print(f"progress {seen}", flush=True)
        time.sleep(0.05)
    query.awaitTermination()
    progress = query.lastProgress  # a batch that ended between two looks above
    if progress is not None and progress["batchId"] != seen:
        print(f"progress {progress['batchId']}", flush=True)
    print("done", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:6])
