"""format("streamlog") for Spark: batch and streaming reads, and (through spark_sink)
batch and exactly-once streaming writes of a streamlog log.

    # no call needed once streamlog is installed (pyspark_streamlog.DefaultSource);
    # spark_source.register(spark) does the same explicitly.
    df = (spark.readStream.format("streamlog")
          .option("path", "/data/mylog").option("stream", "events")
          .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 100000)
          .load())

Strategy: the DataSource class only parses options and hands out readers and writers;
the modules behind it keep the Python Data Source API's process model in mind. The
driver plans (read-only opens of the log); executors read offset ranges read-only and
stage rows they are asked to write; only the driver-side commit opens the log for
writing (one writing process per log, an flock). With a daemon's URL as the path
(streamlog://HOST:PORT, token from STREAMLOG_TOKEN) every open is a client of the
daemon instead, and executors append through it (spark_sink/_remote.py). With a log
in an object store as the path (s3://BUCKET/PREFIX, read only) the driver and the
executors' Python workers read the store themselves, the S3 client configured by the
storage.* options or the AWS_* variables (spark_source/_store.py). Options are
named as those of Spark's Kafka source (spark_source/_options.py,
spark_sink/_options.py).
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource

__all__ = ["StreamlogDataSource", "register"]


class StreamlogDataSource(DataSource):
    """The `streamlog` data source. Rows: stream, partition, offset, timestamp,
    timestampType, key, value[, headers]; see spark_source/_schema.py.

    Options are checked as soon as Spark builds the source, which load() and save()
    do (as Kafka's source checks at load()): names, values and JSON, everything that
    does not depend on whether the query reads, streams or writes. What does (ending
    options on a stream, startingOffsets=latest for a batch read) and what needs the
    log (streams and partitions that exist) is checked when the query is planned.
    """

    def __init__(self, options) -> None:
        super().__init__(options)
        from ._options import parse_source_options
        # Empty options are a catalog table being read: its options come with the
        # schema (see _catalog.py); an option missing for a load() is reported by
        # schema(), which load() calls next.
        if dict(self.options):
            parse_source_options(self.options, streaming=None, required=False)

    @classmethod
    def name(cls) -> str:
        return "streamlog"

    def schema(self):
        from ._catalog import remember_options
        from ._options import parse_bool, parse_source_options
        from ._schema import spark_schema
        parse_source_options(self.options, streaming=None)
        given = {str(k).lower(): str(v) for k, v in dict(self.options).items()}
        return remember_options(spark_schema(parse_bool(given, "includeHeaders", False)),
                                self.options)

    def reader(self, schema):
        from ._batch import BatchReader
        from ._catalog import table_options
        from ._options import parse_source_options
        options = table_options(self.options, schema)
        return BatchReader(parse_source_options(options, streaming=False), schema)

    def streamReader(self, schema):
        from ._catalog import table_options
        from ._options import parse_source_options
        from ._stream import StreamReader
        options = table_options(self.options, schema)
        return StreamReader(parse_source_options(options, streaming=True), schema)

    def writer(self, schema, overwrite: bool):
        from spark_sink import BatchWriter
        return BatchWriter(self.options, schema, overwrite)

    def streamWriter(self, schema, overwrite: bool):
        from spark_sink import StreamWriter
        return StreamWriter(self.options, schema, overwrite)


def register(spark) -> None:
    """Register format("streamlog") in `spark` (needed only where the automatic
    registration cannot see the installed `pyspark_streamlog` module)."""
    spark.dataSource.register(StreamlogDataSource)
