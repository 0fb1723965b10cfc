"""The write side of format("streamlog"): batch appends and exactly-once streaming.

    (df.writeStream.format("streamlog")
       .option("path", "/data/out").option("stream", "results")
       .option("checkpointLocation", "/data/ckpt")
       .start())

Executors stage rows; the driver commits them, once per micro-batch and log partition,
under a transaction and a commit marker (DESIGN 6). With a daemon's URL as the path,
executors append their rows through the daemon under open transactions and the driver
commits those instead (_remote.py). See _commit.py for the two modes,
transactional (default) and truncate, and _columns.py for how DataFrame columns map to
records (a value column required, a null in it a tombstone; key, timestamp, partition,
headers optional).
"""

from ._writer import BatchWriter, Staged, StreamWriter

__all__ = ["BatchWriter", "StreamWriter", "Staged"]
