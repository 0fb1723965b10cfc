"""Driver-side commit: staged rows -> the log, once per micro-batch, per partition.

Strategy: `commit(messages, batchId)` runs in a process on the driver. It opens the log
for writing (other processes may be writing it too: each commit holds the partition's
lock only while it writes), and then, for each log partition the batch wrote to, asks `last_commit(stream, p, tag)`,
the marker of the latest commit made under this query's tag (its id, stable across
restarts). A marker is the ASCII text `"<batch id> <offset of the commit record>"`.

transactional (default)
    Batch already committed in p (marker batch >= batchId): skip p. Else append the rows
    under a transaction of the query's producer for p (transactional id "<tag>/<p>",
    DESIGN 6) and commit it with the marker. Readers in read_committed mode see the rows
    only with the commit record. A crash before it leaves an open transaction: the
    restarted query's producer aborts it at its first commit (even while other
    processes keep the log open), and fences the crashed attempt.
truncate
    Rows are appended as plain data (visible at once, to every reader), then a commit
    marker follows: one CHECKPOINT control record under a fresh transaction, committed
    with the marker. Before appending, output found after p's last marker (an attempt
    that died before its marker) is forgotten with `truncate_after(marker offset)`: the
    StreamInsight rule that output after the last checkpoint is retracted on restart.
    The first batch in a partition writes a start marker (batch -1) before its rows, so
    even the first attempt's leftovers can be cut. This mode requires the query to be the
    stream's only writer: whatever follows the last marker is taken as its leftovers.

The per-partition check makes a commit that dies between partitions safe: the replay
skips the partitions that made it and completes the others. It needs every row of a
replayed batch to land in the same partition as before (see _columns.py: routing is a
hash, never round robin). Since each partition's commit stands alone, the partitions
are committed side by side (`each_partition`): each has its own writer thread, files
and fsyncs, so one's disk waits overlap another's. The staged runs (large, of one
partition each: _staging.py) go in as Arrow columns, each run as it is in its
memory-mapped file, small ones grouped (`append_groups`); rows with headers are
converted to Python objects in chunks of at most CHUNK_ROWS, so memory stays bounded
for a large batch.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os

from streamlog import InvalidArgument, ProducerFenced, RecordKind, StreamLogError
from streamlog.records import RECORD_OVERHEAD_BYTES

from ._options import TRUNCATE, SinkOptions
from ._staging import load_runs

log = logging.getLogger("streamlog.spark")

CHUNK_ROWS = 65536
START_BATCH = -1
# Staged runs smaller than this are appended together (one durable append each group).
GROUP_BYTES = 8 << 20
# Partitions committed at once (threads of the committing process, mostly waiting on
# their partition's writer thread).
COMMIT_THREADS_MAX = 4


@contextlib.contextmanager
def open_writable(options: SinkOptions, *, create: bool = True):
    """The log opened for writing, beside any other writer process (DESIGN 9). When
    this process has it open for writing already (a driver that also appends), that
    Log is used and left open: one Log per log directory and process."""
    import streamlog
    shared = streamlog.writer_in_this_process(options.path)
    if shared is not None:
        yield shared
        return
    with streamlog.open_log(options.path, fsync=options.fsync, create=create) as log:
        yield log


def ensure_stream(options: SinkOptions) -> int:
    """Create the log and the stream when missing; return the stream's partition count.

    Raises:
        InvalidArgument when the stream exists with another partition count than the
        `partitions` option says.
    """
    import streamlog
    count = None
    if os.path.exists(os.path.join(options.path, "streamlog.json")):
        with streamlog.open_log(options.path, readonly=True, create=False) as reader:
            if options.stream in reader.streams():
                count = reader.partition_count(options.stream)
    if count is None:
        with open_writable(options) as writer:
            count = writer.create_stream(options.stream, options.partitions or 1)
    if options.partitions is not None and options.partitions != count:
        raise InvalidArgument(f"stream {options.stream!r} has {count} partitions, not "
                              f"{options.partitions} (option 'partitions')")
    return count


def parse_marker(marker: bytes | None) -> tuple[int, int] | None:
    """(batch id, offset of the commit record) from a marker, or None."""
    if marker is None:
        return None
    try:
        batch, offset = marker.decode("ascii").split()
        return int(batch), int(offset)
    except ValueError:
        raise StreamLogError(f"a commit marker of this query is not ours: {marker!r}; "
                             f"another writer uses the same transactionalId") from None


def gather_runs(paths: list[str]) -> dict[int, list]:
    """{partition: [staged RecordBatch, ...]} over staged files, in message order. The
    batches are memory-mapped: pages are read as the commit converts them."""
    runs: dict[int, list] = {}
    for path in paths:
        for number, batch in load_runs(path):
            runs.setdefault(number, []).append(batch)
    return runs


def commit_streaming(options: SinkOptions, paths: list[str], batch_id: int, tag: str) -> dict:
    """Append a micro-batch's staged rows exactly once. Returns {partition: outcome}
    with outcome "committed", "skipped" (already committed) or "empty"."""
    assert batch_id >= 0
    runs = gather_runs(paths)
    with open_writable(options) as target:
        count = target.partition_count(options.stream)
        return each_partition(range(count), lambda number: _commit_partition(
            target, options, number, runs.get(number), batch_id, tag))


def _commit_partition(target, options: SinkOptions, number: int, runs, batch_id: int,
                      tag: str) -> str:
    """commit_streaming in one partition; returns its outcome."""
    last = parse_marker(target.last_commit(options.stream, number, tag))
    if last is not None and last[0] >= batch_id:
        return "skipped"
    if options.mode == TRUNCATE:
        _forget_after(target, options.stream, number, last)
    if not runs:
        return "empty"
    if options.mode == TRUNCATE:
        if last is None:
            _marker(target, options.stream, number, tag, START_BATCH)
        _append_runs(target, options.stream, number, runs, txn_id=0)
        _marker(target, options.stream, number, tag, batch_id)
    else:
        _append_in_txn(target, options.stream, number, runs, tag, f"{batch_id}",
                       producer=_QueryProducer(target, options, number, tag))
    return "committed"


def commit_once(options: SinkOptions, paths: list[str], tag: str, note: str) -> None:
    """A batch df.write: each partition's rows under one transaction, then committed."""
    runs = gather_runs(paths)
    with open_writable(options) as target:
        each_partition(sorted(runs), lambda number: _append_in_txn(
            target, options.stream, number, runs[number], tag, note))


def each_partition(numbers, work) -> dict:
    """{number: work(number)} for each log partition in `numbers`, run side by side on
    up to COMMIT_THREADS_MAX threads. Every partition's work has ended when this
    returns or raises (the error of the first partition in `numbers` that failed)."""
    numbers = list(numbers)
    if len(numbers) <= 1:
        return {number: work(number) for number in numbers}
    threads = min(len(numbers), COMMIT_THREADS_MAX)
    with concurrent.futures.ThreadPoolExecutor(threads, "streamlog-sink-commit") as pool:
        futures = {number: pool.submit(work, number) for number in numbers}
    assert all(future.done() for future in futures.values())
    return {number: future.result() for number, future in futures.items()}


# {(log path, stream, partition, transactional id): epoch} of the producers this process
# started: one fence per partition and process, not one per micro-batch.
_EPOCHS: dict[tuple, int] = {}


class _QueryProducer:
    """The query's producer for partition `number`: (transactional id, epoch), started
    (its predecessors' open transactions aborted) on first use in this process.

    Spark may run successive commits of one query in different Python processes, each
    starting the producer and so fencing the others' cached epochs. That fence is not
    a zombie's: Spark runs one commit of a query at a time, and this one has checked
    the partition's marker already. So a begin refused with a cached epoch starts the
    producer again, once; an epoch this process has just started is never retried."""

    def __init__(self, target, options: SinkOptions, number: int, tag: str):
        self.target, self.stream, self.number = target, options.stream, number
        self.id = f"{tag}/{number}"
        self.key = (os.path.realpath(options.path), options.stream, number, self.id)

    def begin(self) -> int:
        cached = self.key in _EPOCHS
        if not cached:
            _EPOCHS[self.key] = self.target.init_producer(self.stream, self.number, self.id)
        try:
            return self.target.begin_txn(self.stream, self.number, self.id, _EPOCHS[self.key])
        except ProducerFenced:
            del _EPOCHS[self.key]
            if not cached:
                raise
            log.info("producer %s was started by another process since; starting it again",
                     self.id)
            return self.begin()


def _append_in_txn(target, stream: str, number: int, runs, tag: str, batch: str, *,
                   producer: _QueryProducer | None = None) -> None:
    """The rows in one transaction (begun by `producer` when given), committed with
    the marker "<batch> <end offset before the commit>". (The offset is for a reader's
    information: other processes may append between the rows and the commit.)"""
    txn_id = target.new_txn_id() if producer is None else producer.begin()
    try:
        _append_runs(target, stream, number, runs, txn_id=txn_id)
        offset = target.end_offset(stream, number)
        target.commit_txn(stream, number, txn_id, tag=tag,
                          marker=f"{batch} {offset}".encode())
    except BaseException:
        _abort_quietly(target, stream, number, txn_id)
        raise


def _marker(target, stream: str, number: int, tag: str, batch_id: int) -> None:
    """Truncate mode's commit marker: a CHECKPOINT note under a fresh transaction (a
    transaction needs a record before it can commit), then its COMMIT record."""
    txn_id = target.new_txn_id()
    note = f"spark batch {batch_id}".encode()
    try:
        result = target.append_batch_sync(stream, [note], partition=number, txn_id=txn_id,
                                          kinds=[RecordKind.CHECKPOINT])
        offset = result.ranges[number][1] + 1
        committed_at = target.commit_txn(stream, number, txn_id, tag=tag,
                                         marker=f"{batch_id} {offset}".encode())
    except BaseException:
        _abort_quietly(target, stream, number, txn_id)
        raise
    _check_marker_offset(committed_at, offset)


def _check_marker_offset(committed_at, predicted: int) -> None:
    # The marker names its own offset, which truncate mode cuts after; we hold the
    # writer lock, so nothing else can have been appended in between.
    if committed_at is not None and committed_at != predicted:
        raise StreamLogError(f"commit record landed at offset {committed_at}, not "
                             f"{predicted}: another append raced the sink's commit")


def _forget_after(target, stream: str, number: int, last) -> None:
    """Truncate mode: cut what an attempt that died before its marker left behind."""
    if last is None:
        return
    end = target.end_offset(stream, number)
    if end > last[1] + 1:
        log.warning("streamlog sink (truncate mode): forgetting %d record(s) of %s/%d written "
                    "after batch %d's commit by an attempt that did not finish",
                    end - last[1] - 1, stream, number, last[0])
        target.truncate_after(stream, number, last[1])


def _abort_quietly(target, stream: str, number: int, txn_id: int) -> None:
    try:
        if target.txn_state(stream, number, txn_id) is not None:
            target.abort_txn(stream, number, txn_id)
    except Exception:  # noqa: BLE001 - the original error matters; the next open aborts
        log.exception("could not abort transaction %#x in %s/%d", txn_id, stream, number)


def _append_runs(target, stream: str, number: int, runs, *, txn_id: int) -> None:
    """Append staged runs of one partition. Without headers, as Arrow columns
    (append_columns: the log cuts frames from the runs' buffers), a run or a group of
    small ones at a time. Otherwise converted to Python objects in chunks that each fit
    one frame of the log (so the log takes each chunk whole, without cutting it row by
    row), the conversion of the next chunk overlapping the write and fsync of the
    previous one on a second thread."""
    if _columnar(target, runs):  # Arrow in, no conversion to Python objects
        import pyarrow as pa
        for group in append_groups(runs, GROUP_BYTES):
            data = group[0] if len(group) == 1 else pa.Table.from_batches(group)
            target.append_columns_sync(stream, data.select(["value", "key", "timestamp"]),
                                       partition=number, txn_id=txn_id)
        return
    rows_max = _chunk_rows(target, runs)
    with concurrent.futures.ThreadPoolExecutor(1, "streamlog-sink-append") as pool:
        pending = None
        for chunk in chunks(runs, rows_max):
            columns = python_columns(chunk)
            if pending is not None:
                pending.result()
            pending = pool.submit(target.append_batch_sync, stream, columns[0],
                                  keys=columns[1], timestamps_us=columns[2], partition=number,
                                  headers=columns[3], txn_id=txn_id)
        if pending is not None:
            pending.result()


def _columnar(target, runs) -> bool:
    """The staged rows can go in as columns: a local log (append_columns), and no record
    carries headers (append_columns takes none)."""
    if not hasattr(target, "append_columns_sync"):
        return False
    for batch in runs:
        if "headers" in batch.schema.names and (
                batch.column("headers").null_count != batch.num_rows):
            return False
    return True


def _chunk_rows(target, runs) -> int:
    """Rows per chunk: at most a frame's record count, and about half a frame's bytes
    (the log's budget for one append piece), judged by the staged rows' average size."""
    config = target.config
    rows = sum(batch.num_rows for batch in runs)
    size = sum(batch.column("key").nbytes + batch.column("value").nbytes for batch in runs)
    per_row = size / max(rows, 1) + RECORD_OVERHEAD_BYTES + 8  # (8: slack)
    by_bytes = int(config.frame_bytes_max // 2 * 0.9 / per_row)
    return max(1, min(config.batch_records_max, CHUNK_ROWS, by_bytes))


def append_groups(runs, bytes_max: int):
    """Yield lists of consecutive runs, each list one append: runs join a group while
    it stays within `bytes_max`, so a run that large is alone (appended without a
    copy) and small ones share an append (one fsync under fsync=always)."""
    assert bytes_max > 0
    group, size = [], 0
    for run in runs:
        if group and size + run.nbytes > bytes_max:
            yield group
            group, size = [], 0
        group.append(run)
        size += run.nbytes
    if group:
        yield group


def chunks(runs, rows_max: int):
    """Yield lists of batch slices holding exactly rows_max rows (the last fewer)."""
    pending, rows = [], 0
    for batch in runs:
        at = 0
        while at < batch.num_rows:
            take = min(rows_max - rows, batch.num_rows - at)
            pending.append(batch.slice(at, take))
            rows += take
            at += take
            if rows == rows_max:
                yield pending
                pending, rows = [], 0
    if pending:
        yield pending


def python_columns(batches):
    """values, keys, timestamps and headers of staged slices as Python lists."""
    import pyarrow as pa
    table = pa.Table.from_batches(batches)
    headers = None
    if "headers" in table.column_names:
        headers = [None if h is None else [(pair["key"], pair["value"]) for pair in h]
                   for h in table.column("headers").to_pylist()]
    return (table.column("value").to_pylist(), table.column("key").to_pylist(),
            table.column("timestamp").to_pylist(), headers)
