"""df.write and df.writeStream to format("streamlog").

Strategy: the writer objects are built on the driver (options and the DataFrame's
columns checked there, the stream created if missing), pickled to executors for
`write()`, which only stages rows (see _staging.py), and used again on the driver for
`commit()`, the one place the log is opened for writing (see _commit.py); with a
daemon's URL, `write()` appends through the daemon under open transactions and
`commit()` commits them (see _remote.py). Spark builds
the streaming writer anew for each micro-batch, in more than one process, so nothing
may live in the object but what its constructor derived from the options.

A streaming task learns its query id and batch id from the task's local properties
(`sql.streaming.queryId`, `streaming.sql.batchId`): Spark's Python `write()` gets no
batch id, and this is how the engine tags a micro-batch's jobs. The query id, stable
across restarts from one checkpoint, is the tag of the query's commits unless the
option transactionalId names one.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import uuid

from pyspark.sql.datasource import (DataSourceArrowWriter, DataSourceStreamArrowWriter,
                                    WriterCommitMessage)
from spark_source._options import is_url
from spark_source._ship import ShipsToExecutors
from streamlog import InvalidArgument, StreamLogError

from . import _remote
from ._columns import ColumnMap, staged_schema
from ._commit import commit_once, commit_streaming, ensure_stream
from ._options import TRANSACTIONAL, parse_sink_options
from ._staging import Stager, collect_garbage, remove_files, staging_root

log = logging.getLogger("streamlog.spark")
BATCH_WRITE_TAG = "spark-write"


@dataclasses.dataclass
class Staged(WriterCommitMessage):
    """What one task staged: the file (None when it had no rows), rows per partition,
    and for a streaming task the commit tag and micro-batch id it saw. With a daemon's
    URL nothing is staged: `txns` names the transactions the task left open there."""

    path: str | None
    rows: dict
    tag: str | None = None
    batch_id: int | None = None
    txns: dict | None = None  # a daemon's log: {partition: [open txn id, rows, task]}


def _refuse_overwrite(overwrite: bool, what: str) -> None:
    if overwrite:
        raise InvalidArgument(f"format('streamlog') cannot {what}: a log is append-only. "
                              f"Use .mode('append') (batch) or outputMode('append') "
                              f"(streaming), or write to a new stream")


class _Common(ShipsToExecutors):
    def _setup(self, options, schema) -> None:
        self.options = parse_sink_options(options)
        self.remote = is_url(self.options.path)
        count = (_remote.ensure_stream_remote(self.options) if self.remote
                 else ensure_stream(self.options))
        self.columns = ColumnMap.from_schema(schema, count)

    def _stage(self, iterator, directory: str, *, tag: str | None = None,
               task: int | None = None) -> Staged:
        if self.remote:  # a streaming task writes as its producers (_remote.py)
            txns = _remote.append_task(self.options, self.columns, iterator, tag=tag,
                                       task=task)
            return Staged(None, {p: entry[1] for p, entry in txns.items()}, txns=txns)
        stager = Stager(directory, staged_schema(self.columns.headers is not None))
        for batch in iterator:
            stager.write(self.columns.stage(batch))
        return Staged(stager.finish(), stager.rows)


class BatchWriter(_Common, DataSourceArrowWriter):
    """df.write.format("streamlog").mode("append"): each log partition's rows are
    appended under one transaction and committed when every task has staged."""

    def __init__(self, options, schema, overwrite: bool) -> None:
        _refuse_overwrite(overwrite, "overwrite (save mode 'overwrite')")
        self._setup(options, schema)
        self.scope = f"write-{uuid.uuid4().hex}"

    def write(self, iterator) -> Staged:
        if self.remote:
            return self._stage(iterator, "")
        return self._stage(iterator, os.path.join(staging_root(self.options.path),
                                                  self.scope))

    def commit(self, messages) -> None:
        if self.remote:
            _remote.commit_once(self.options, _txns(messages), BATCH_WRITE_TAG, self.scope)
            return
        paths = _paths(messages)
        try:
            if paths:
                commit_once(self.options, paths, BATCH_WRITE_TAG, self.scope)
        finally:
            remove_files(paths)
            collect_garbage(self.options.path, self.scope)

    def abort(self, messages) -> None:
        if self.remote:
            _remote.abort(self.options, _txns(messages))
            return
        remove_files(_paths(messages))
        collect_garbage(self.options.path, self.scope)


class StreamWriter(_Common, DataSourceStreamArrowWriter):
    """df.writeStream.format("streamlog"): exactly once per micro-batch and partition."""

    def __init__(self, options, schema, overwrite: bool) -> None:
        _refuse_overwrite(overwrite, "run in complete output mode (it rewrites the output)")
        self._setup(options, schema)

    def write(self, iterator) -> Staged:
        from pyspark import TaskContext
        context = TaskContext.get()
        query = context.getLocalProperty("sql.streaming.queryId") if context else None
        batch = context.getLocalProperty("streaming.sql.batchId") if context else None
        tag = self.options.transactional_id or query
        if self.remote:
            staged = self._stage(iterator, "", tag=tag,
                                 task=context.partitionId() if context else None)
            staged.tag = tag
            staged.batch_id = int(batch) if batch and batch.isdigit() else None
            return staged
        scope = os.path.join(staging_root(self.options.path), _dir_name(tag or "unknown"),
                             batch if batch and batch.isdigit() else "unknown")
        staged = self._stage(iterator, scope)
        staged.tag = tag
        staged.batch_id = int(batch) if batch and batch.isdigit() else None
        return staged

    def commit(self, messages, batchId: int) -> None:
        staged = [m for m in messages if m is not None]
        if self.remote:
            self._commit_remote(staged, batchId)
            return
        paths = _paths(staged)
        tags = {m.tag for m in staged}
        try:
            if not staged or (not paths and self.options.mode == TRANSACTIONAL):
                return  # nothing to append, and nothing to clean up in this mode
            if len(tags) != 1 or None in tags:
                raise StreamLogError(
                    f"streamlog sink: cannot tell which query wrote micro-batch {batchId} "
                    f"(tags {sorted(map(str, tags))}); set the option transactionalId to a "
                    f"name that is stable across restarts of this query")
            tag = tags.pop()
            outcomes = commit_streaming(self.options, paths, batchId, tag)
            log.info("streamlog sink: batch %d of %s: %s", batchId, tag, outcomes)
        finally:
            remove_files(paths)
            for tag in {m.tag for m in staged if m.tag}:
                collect_garbage(self.options.path, _dir_name(tag), through_batch=batchId)

    def _commit_remote(self, staged: list, batch_id: int) -> None:
        with_rows = [m for m in staged if m.txns]
        if not with_rows:
            return
        tags = {m.tag for m in with_rows}
        if len(tags) != 1 or None in tags:
            _remote.abort(self.options, _txns(with_rows))
            raise StreamLogError(
                f"streamlog sink: cannot tell which query wrote micro-batch {batch_id} "
                f"(tags {sorted(map(str, tags))}); set the option transactionalId to a "
                f"name that is stable across restarts of this query")
        tag = tags.pop()
        outcomes = _remote.commit_streaming(self.options, _txns(with_rows), batch_id, tag)
        log.info("streamlog sink: batch %d of %s: %s", batch_id, tag, outcomes)

    def abort(self, messages, batchId: int) -> None:
        if self.remote:
            _remote.abort(self.options, _txns(messages))
            return
        remove_files(_paths(m for m in messages if m is not None))


def _paths(messages) -> list[str]:
    return [m.path for m in messages if m is not None and m.path]


def _txns(messages) -> list[dict]:
    return [m.txns for m in messages if m is not None and m.txns]


def _dir_name(tag: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", tag)
