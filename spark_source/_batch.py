"""spark.read.format("streamlog"): a batch read of offset ranges.

Strategy: `partitions()` runs on the driver, resolves startingOffsets/endingOffsets (or
their timestamp forms) per partition against a read-only open of the log, and cuts the
ranges into OffsetRanges (one per log partition, more for a large one, so a large
replay uses every core; for a log in an object store, one per segment object at least,
all planned from one manifest generation: _store.py). `read()` runs in executors (see
_read.py).
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSourceReader
from streamlog import InvalidArgument

from ._options import OFFSET, SourceOptions
from ._plan import (OffsetRange, check_bound_covers, cut_at, open_readonly, resolve_end,
                    resolve_start, selected_keys, split_ranges)
from ._read import read_range
from ._schema import target_arrow_schema
from ._ship import ShipsToExecutors
from ._store import SegmentLayout, segment_layout


class BatchReader(ShipsToExecutors, DataSourceReader):
    def __init__(self, options: SourceOptions, schema) -> None:
        assert options.ending is not None  # a batch read always has an end
        self.options = options
        self.target = target_arrow_schema(schema, options.include_headers)

    def partitions(self) -> list[OffsetRange]:
        options = self.options
        log = open_readonly(options.path, options.storage_options)
        try:
            keys = selected_keys(log, options)
            check_bound_covers(options.starting, keys)
            check_bound_covers(options.ending, keys)
            ranges = []
            for key in keys:
                starting = options.starting.position(*key)
                ending = options.ending.position(*key)
                start = resolve_start(log, key, starting, options)
                end = resolve_end(log, key, ending, options.ending, options.read_committed)
                if end < start and starting.kind == OFFSET and ending.kind == OFFSET:
                    raise InvalidArgument(f"{key[0]}/{key[1]}: endingOffsets {end} is before "
                                          f"startingOffsets {start}")
                ranges.append((key, start, max(start, end)))
            layout = segment_layout(log, keys)
        finally:
            log.close()
        return make_splits(options, ranges, layout)

    def read(self, partition: OffsetRange):
        # With no range planned (nothing to read), Spark still runs one task, with its
        # placeholder InputPartition(None).
        if not isinstance(partition, OffsetRange):
            return iter(())
        return read_range(partition, self.target)


def make_splits(options: SourceOptions, ranges,
                layout: SegmentLayout | None = None) -> list[OffsetRange]:
    """OffsetRanges for (key, start, end) `ranges`: cut where the segment objects of
    `layout` begin (a log in a store), then as split_ranges says."""
    import os
    if layout is not None:
        ranges = cut_at(ranges, layout.bases)
    pieces = split_ranges(ranges, min_partitions=options.min_partitions,
                          max_records=options.max_records_per_partition,
                          cores=os.cpu_count() or 1)
    generation = layout.generation if layout is not None else 0
    return [OffsetRange(options.path, stream, number, start, end, options.include_headers,
                        options.fail_on_data_loss, options.read_committed,
                        options.storage_options, generation)
            for (stream, number), start, end in pieces]
