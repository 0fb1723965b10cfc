"""Executor side: one OffsetRange -> Arrow record batches.

Strategy: open the log read-only (no lock; a writer in another process may be
appending; a log in an object store: this worker's view of it, refreshed, _store.py),
check that the planned range is still in the log (retention may have
removed its start, a truncation its end, since the driver planned it), and stream
`Reader.arrow()` batches through `to_spark_batch`. No Python work per record.
"""

from __future__ import annotations

import contextlib

import pyarrow as pa

from ._plan import OffsetRange, data_loss, open_readonly
from ._schema import to_spark_batch
from ._store import executor_view, is_store_url


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
            for batch in reader.arrow(include_headers=split.include_headers):
                yield to_spark_batch(batch, stream, target)


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
