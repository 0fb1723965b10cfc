"""format("streamlog") with no register call.

Spark (4.0 and later) imports, on the first lookup of a Python data source, every
top-level module whose name starts with `pyspark_` and registers its `DefaultSource`
under `DefaultSource.name()`. Installing streamlog puts this module on the path, so
`spark.read.format("streamlog")` works at once; `spark_source.register(spark)` remains
for sessions that looked data sources up before streamlog was installed.
"""

from spark_source import StreamlogDataSource as DefaultSource

__all__ = ["DefaultSource"]
