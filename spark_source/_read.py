"""Executor side: one OffsetRange -> Arrow record batches.

Strategy: open the log read-only (no lock; a writer in another process may be
appending; a log in an object store: this worker's view of it, refreshed, _store.py),
check that the planned range is still in the log (retention may have
removed its start, a truncation its end, since the driver planned it), and stream
`Reader.arrow()` batches through `to_spark_batch`. No Python work per record.

`Reader.arrow()` gives a batch per frame of the log, as large as the appends that
wrote it were gathered: tens of thousands of records from batched appends, a few from
single ones. Spark's cost for each Arrow batch it takes from a Python worker hardly
depends on the batch's size below tens of thousands of rows (measured: 1,000,000 rows
in batches of 512 took twice as long as in batches of 65,536), so frames below
BATCH_ROWS_MIN are joined into batches of about that many rows (one copy of those
small frames; a large frame goes as it is).
"""

from __future__ import annotations

import contextlib

import pyarrow as pa

from ._plan import OffsetRange, data_loss, open_readonly
from ._schema import to_spark_batch
from ._store import executor_view, is_store_url

BATCH_ROWS_MIN = 32768
BATCH_BYTES_MAX = 16 << 20  # small frames are joined until they hold this much


def read_range(split: OffsetRange, target: pa.Schema):
    """Yield Arrow batches of `target` for the data records in [split.start, split.end).

    Raises:
        OffsetOutOfRange when part of the range left the log since it was planned and
        failOnDataLoss is true (else those offsets are skipped with a warning).
    """
    if split.end <= split.start:
        return
    with _opened(split) as log:
        stream, number = split.stream, split.partition
        first, end = log.start_offset(stream, number), log.end_offset(stream, number)
        start, stop = split.start, split.end
        where = f"{stream}/{number}"
        if start < first:
            data_loss(f"{where}: offsets {start}..{min(first, stop) - 1} were removed by "
                      f"retention before this micro-batch read them", split.fail_on_data_loss)
            start = min(first, stop)
        if stop > end:
            data_loss(f"{where}: offsets {max(end, start)}..{stop - 1} are no longer in the log "
                      f"(it was truncated to {end}) though they were planned",
                      split.fail_on_data_loss)
            stop = max(end, start)
        if stop <= start:
            return
        with log.reader(stream, number, from_offset=start, to_offset=stop,
                        read_committed=split.read_committed) as reader:
            batches = (to_spark_batch(batch, stream, target)
                       for batch in reader.arrow(include_headers=split.include_headers))
            yield from coalesced(batches, BATCH_ROWS_MIN, BATCH_BYTES_MAX)


def coalesced(batches, rows_min: int, bytes_max: int):
    """`batches` in order, those smaller than `rows_min` rows joined with the ones
    after them until `rows_min` rows or `bytes_max` bytes are gathered."""
    assert rows_min > 0
    assert bytes_max > 0
    pending, rows, size = [], 0, 0
    for batch in batches:
        if not pending and (batch.num_rows >= rows_min or batch.nbytes >= bytes_max):
            yield batch
            continue
        pending.append(batch)
        rows += batch.num_rows
        size += batch.nbytes
        if rows >= rows_min or size >= bytes_max:
            yield joined(pending)
            pending, rows, size = [], 0, 0
    if pending:
        yield joined(pending)


def joined(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    """One batch of `batches` (of one schema), their rows in order: the batch itself
    when there is one, else one copy."""
    assert batches
    if len(batches) == 1:
        return batches[0]
    (batch,) = pa.Table.from_batches(batches).combine_chunks().to_batches()
    assert batch.num_rows == sum(part.num_rows for part in batches)
    return batch


@contextlib.contextmanager
def _opened(split: OffsetRange):
    """The log to read `split` from: opened here and closed after, or (a log in a
    store) this worker's view of it, kept for its next split."""
    if is_store_url(split.path):
        with executor_view(split.path, split.storage_options, split.generation) as view:
            yield view
        return
    log = open_readonly(split.path)
    try:
        yield log
    finally:
        log.close()
