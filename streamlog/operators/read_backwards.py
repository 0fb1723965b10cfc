"""Reading an operator's output partition from its end towards its start, batch by batch:
how both CEC recoveries find their eventual checkpoint (aggregate_recovery.py,
window_cec.py).

Strategy: a CEC recovery needs only the newest part of its output (the extent), so it
reads backwards and stops as soon as it has what it needs. It goes through the log's
public API: `Log.batch_holding(stream, partition, offset)` gives the batch that holds an
offset, with its base offset, so the walk steps one batch at a time without knowing
the segment layout. Each batch is decoded once, as columns (no per-record objects).

Thread-safety: reads a log the caller owns, on the caller's thread.
"""

from __future__ import annotations


def iter_batches_backwards(log, stream: str, partition: int, *, end_offset: int | None = None):
    """Yield (frame_bytes, columns, count) for the batches of a partition from its end
    towards its start: rows [0, count) of `columns` are the batch's records below
    `end_offset` (default: the acknowledged end). One Log.batch_holding per batch."""
    start = log.start_offset(stream, partition)
    offset = (log.end_offset(stream, partition) if end_offset is None else end_offset) - 1
    for _ in range(max(0, offset - start + 1)):
        if offset < start:
            return
        base, frame_bytes, columns = log.batch_holding(stream, partition, offset)
        yield frame_bytes, columns, offset - base + 1
        offset = base - 1
