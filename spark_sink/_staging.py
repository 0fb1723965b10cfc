"""Staging: executors park the rows of a write in Arrow IPC files for the driver's commit.

Strategy: a log has one writing process at a time, and executors are other processes,
so a task never opens the log for writing. It writes its rows, already routed to log
partitions, to `LOG/staging/<scope>/<uuid>.arrow`, fsyncs the file and its directory,
and returns the path in its commit message. The driver's commit appends the staged rows
and deletes the files; `collect_garbage` removes what failed attempts left behind. A
staged file that is torn (a task died while writing it) never reaches a commit: only
successful tasks' messages do.

The driver's commit is the one step of a write that does not run in parallel, so the
tasks do what they can for it: a task gathers its rows per log partition and writes
each partition's rows as one batch whenever about FLUSH_BYTES have come in (and at the
end), so the commit finds a few large runs, each contiguous and of one partition, that
the log takes as they are (memory-mapped, no copy). While the task goes on receiving
rows, a thread of its own syncs what was written so far, so the fsync at the end has
little left to wait for.

    scope  <query id>/<batch id>   a streaming micro-batch
           write-<uuid>            one df.write job
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import uuid

import pyarrow as pa

STAGING_DIR = "staging"
# Rows a task gathers (Arrow bytes of the staged columns) before it writes them. Bounds
# a task's memory to about this much beside Spark's own batch.
FLUSH_BYTES = 16 << 20


def staging_root(log_path: str) -> str:
    return os.path.join(log_path, STAGING_DIR)


class Stager:
    """Writes one task's staged batches to one file, created at the first row: per log
    partition, its rows in the order they came, in batches of one partition each (see
    the module docstring). Used by one task's thread; its sync thread only syncs."""

    def __init__(self, directory: str, schema: pa.Schema) -> None:
        self.directory = directory
        self.schema = schema
        self.path: str | None = None
        self.rows: dict[int, int] = {}
        self._pending: dict[int, list[pa.RecordBatch]] = {}
        self._pending_bytes = 0
        self._file = None
        self._writer = None
        self._syncer: concurrent.futures.ThreadPoolExecutor | None = None
        self._synced: concurrent.futures.Future | None = None

    def write(self, batch: pa.RecordBatch) -> None:
        """Take `batch` (staged schema): its rows join their partitions' pending runs,
        written once FLUSH_BYTES are pending."""
        if batch.num_rows == 0:
            return
        for number, run in split_by_partition(batch):
            self._pending.setdefault(number, []).append(run)
            self.rows[number] = self.rows.get(number, 0) + run.num_rows
        self._pending_bytes += batch.nbytes
        if self._pending_bytes >= FLUSH_BYTES:
            self._flush()
            self._sync_behind()

    def finish(self) -> str | None:
        """Write what is pending, close and fsync the file (and its directory); returns
        its path, or None when nothing was written."""
        self._flush()
        if self._writer is None:
            return None
        self._writer.close()
        self._file.flush()
        if self._synced is not None:
            self._synced.result()  # an error of the sync thread is this task's
            self._syncer.shutdown()
        os.fsync(self._file.fileno())
        self._file.close()
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return self.path

    def _flush(self) -> None:
        """Write each partition's pending runs as one batch (in partition order: a
        partition's rows keep their order, which is all the commit needs)."""
        if not self._pending:
            return
        if self._writer is None:
            os.makedirs(self.directory, exist_ok=True)
            self.path = os.path.join(self.directory, f"{uuid.uuid4().hex}.arrow")
            self._file = open(self.path, "wb")
            self._writer = pa.ipc.new_file(self._file, self.schema)
        for number in sorted(self._pending):
            runs = self._pending[number]
            assert runs
            # One batch of the partition's runs (one copy, none for a single run).
            self._writer.write_table(pa.Table.from_batches(runs).combine_chunks())
        self._pending.clear()
        self._pending_bytes = 0

    def _sync_behind(self) -> None:
        """Start syncing what is written so far on the sync thread, after the previous
        sync (at most one in flight: a task that outruns the disk waits here)."""
        assert self._writer is not None
        self._file.flush()
        if self._synced is not None:
            self._synced.result()
        else:
            self._syncer = concurrent.futures.ThreadPoolExecutor(1, "streamlog-stage-sync")
        self._synced = self._syncer.submit(_datasync, self._file.fileno())


_datasync = getattr(os, "fdatasync", os.fsync)  # (macOS has no fdatasync)


def split_by_partition(batch: pa.RecordBatch):
    """Yield (partition, rows of that partition) keeping the input order within each."""
    import numpy as np
    partitions = batch.column(0).to_numpy()
    first = int(partitions[0])
    if (partitions == first).all():
        yield first, batch
        return
    order = np.argsort(partitions, kind="stable")
    ordered = partitions[order]
    cuts = np.flatnonzero(np.diff(ordered)) + 1
    for lo, hi in zip([0, *cuts], [*cuts, len(order)]):
        yield int(ordered[lo]), batch.take(pa.array(order[lo:hi]))


def load_runs(path: str):
    """Yield (partition, RecordBatch) from a staged file, in the order written. The
    batches are memory-mapped; they keep the mapping alive while referenced."""
    reader = pa.ipc.open_file(pa.memory_map(path, "r"))
    for i in range(reader.num_record_batches):
        batch = reader.get_batch(i)
        yield batch.column(0)[0].as_py(), batch


def remove_files(paths) -> None:
    for path in paths:
        if path:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def collect_garbage(log_path: str, scope: str, *, through_batch: int | None = None) -> None:
    """Remove a write's staging directory; for a streaming query (`scope` = query id and
    `through_batch` given), every micro-batch directory up to that batch, which only
    failed attempts can have left behind once it is committed."""
    root = staging_root(log_path)
    if through_batch is None:
        shutil.rmtree(os.path.join(root, scope), ignore_errors=True)
        return
    query_dir = os.path.join(root, scope)
    if not os.path.isdir(query_dir):
        return
    for name in os.listdir(query_dir):
        if name.isdigit() and int(name) <= through_batch:
            shutil.rmtree(os.path.join(query_dir, name), ignore_errors=True)
