"""spark.readStream.format("streamlog"): micro-batches of per-partition log offsets.

Strategy: an offset is `{"<stream>": {"<partition>": next offset to read}}`, streams
sorted by name and partitions by number, so that the same positions always give the
same JSON text (Spark compares offsets as JSON strings). Spark keeps this stream reader
in one long-lived process on the driver and writes each batch's end offsets to its
checkpoint before the batch runs, so a restarted query replays exactly the logged
ranges and then resumes; nothing here has to be durable.

Admission control: `getDefaultReadLimit` turns maxOffsetsPerTrigger into ReadMaxRows,
and `latestOffset(start, limit)` shares that budget across partitions in proportion to
their backlog (`rate_limit`). minOffsetsPerTrigger has no ReadLimit that crosses from
Python to the JVM (ReadMinRows carries no delay, and there is no composite limit), so
`latestOffset` applies it itself, as Kafka's source does: while fewer offsets than that
are available and maxTriggerDelay has not passed since the last batch, it returns
`start`, and Spark runs no batch for that trigger. For Trigger.AvailableNow,
`prepareForTriggerAvailableNow` pins the end at the offsets available then; the query
then runs rate-limited batches up to it (minOffsetsPerTrigger aside) and stops.

Which partitions: the streams named, the partitions assigned, or (subscribePattern)
every stream whose name matches at each trigger; a stream that appears later is read
from its first offset, as Kafka's source reads a new topic.

Progress: `reportLatestOffset` gives the offsets available at the last trigger, which
Spark shows as `latestOffset` in each progress report beside `endOffset`: their
difference per partition is how far behind the query is. (pyspark 4.3's Python stream
reader has no hook for custom source metrics such as Kafka's offsetsBehindLatest.)

Ends are last stable offsets (see _plan.py): a batch never claims records of a
transaction that is still open.

A log in an object store (s3://BUCKET/PREFIX, _store.py): the driver's view shows one
manifest generation from one trigger to the next, and each trigger's refresh() pins
the newest, so the offsets available come from the newest generation and each plan
from one; a micro-batch's ranges are cut where segment objects begin.
"""

from __future__ import annotations

import time

from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadMaxRows,
                                              SupportsTriggerAvailableNow)
from streamlog import InvalidArgument

from ._batch import make_splits
from ._options import SourceOptions
from ._plan import (OffsetRange, check_bound_covers, data_loss, open_readonly, rate_limit,
                    resolve_start, selected_keys, stable_end)
from ._read import read_range
from ._schema import target_arrow_schema
from ._ship import ShipsToExecutors
from ._store import is_store_url, segment_layout


class StreamReader(ShipsToExecutors, DataSourceStreamReader,
                   SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions, schema) -> None:
        assert options.ending is None
        self.options = options
        self.target = target_arrow_schema(schema, options.include_headers)
        self._initial: dict | None = None
        self._pinned: dict | None = None  # Trigger.AvailableNow: never read past this
        self._available: dict | None = None
        self._view = None  # the driver's read-only view, refreshed at each trigger
        self._first: dict = {}  # first offsets of the partitions at the last trigger
        self._last_batch_s = time.monotonic()  # minOffsetsPerTrigger's delay counts from it

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_view"] = None  # an open log stays on the driver
        return state

    def initialOffset(self) -> dict:
        """Where a new query starts (startingOffsets and friends). Asked more than once
        by Spark, so resolved once: "latest" must not move between the calls."""
        if self._initial is None:
            options = self.options
            log = open_readonly(options.path, options.storage_options)
            try:
                keys = sorted(selected_keys(log, options))
                check_bound_covers(options.starting, keys)
                self._initial = to_json({key: resolve_start(
                    log, key, options.starting.position(*key), options) for key in keys})
            finally:
                log.close()
        return self._initial

    def getDefaultReadLimit(self):
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._pinned = to_json(self._stable_ends())

    def latestOffset(self, start: dict, limit) -> dict:
        starts = self._positions(start)
        available = self._stable_ends()
        if self._pinned is not None:
            pinned = from_json(self._pinned)
            available = {key: min(end, pinned.get(key, end)) for key, end in available.items()}
        self._available = to_json(available)
        for key in available.keys() - starts.keys():  # a new stream (subscribePattern)
            starts[key] = self._first[key]
        keys = sorted(starts)
        ends = []
        for key in keys:
            end = available.get(key, starts[key])
            if end < starts[key]:
                data_loss(f"{key[0]}/{key[1]}: the log now ends at offset {end}, before offset "
                          f"{starts[key]} that this query already read up to (it was "
                          f"truncated)", self.options.fail_on_data_loss)
                end = starts[key]
            ends.append(end)
        if self._holds_back(sum(e - starts[k] for k, e in zip(keys, ends))):
            return start
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        limited = rate_limit([starts[k] for k in keys], ends, budget)
        return to_json(dict(zip(keys, limited)))

    def _holds_back(self, backlog: int) -> bool:
        """minOffsetsPerTrigger: whether to run no batch now, with `backlog` offsets
        available. Not under Trigger.AvailableNow, whose last batch may be small."""
        least = self.options.min_offsets_per_trigger
        now = time.monotonic()
        if least is not None and self._pinned is None and backlog < least:
            waited_ms = (now - self._last_batch_s) * 1000
            if waited_ms < self.options.max_trigger_delay_ms:
                return True
        if backlog > 0:
            self._last_batch_s = now
        return False

    def reportLatestOffset(self) -> dict | None:
        return self._available

    def partitions(self, start: dict, end: dict):
        starts, ends = self._positions(start), self._positions(end)
        for key in ends.keys() - starts.keys():  # a new stream (subscribePattern)
            starts[key] = self._first_offset(key)
        ranges = [(key, starts[key], ends[key]) for key in sorted(ends)
                  if ends[key] > starts[key]]
        layout = None
        if ranges and is_store_url(self.options.path):
            # The generation the driver's view shows now: the one latestOffset took
            # these ends from, or a newer one (after a restart, the newest).
            layout = segment_layout(self._driver_view(), [key for key, _, _ in ranges])
        return make_splits(self.options, ranges, layout)

    def read(self, partition):
        if not isinstance(partition, OffsetRange):  # nothing planned: Spark's placeholder
            return iter(())
        return read_range(partition, self.target)

    def commit(self, end: dict) -> None:
        """Nothing to release: the log keeps no per-query state."""

    # -- helpers ------------------------------------------------------------------------

    def _driver_view(self):
        """The driver's view of the log, opened when there is none."""
        if self._view is None:
            self._view = open_readonly(self.options.path, self.options.storage_options)
        return self._view

    def _stable_ends(self) -> dict:
        """The last stable offsets now: the driver's view, refreshed (not reopened) at
        each trigger; a view that fails is dropped and opened again at the next one."""
        if self._view is None:
            self._driver_view()
        else:
            self._view.refresh()
        try:
            keys = sorted(selected_keys(self._view, self.options))
            self._first = {key: self._view.start_offset(*key) for key in keys}
            return {key: stable_end(self._view, *key, self.options.read_committed)
                    for key in keys}
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Spark stops the query: close the driver's view."""
        view, self._view = self._view, None
        if view is not None:
            view.close()

    def _first_offset(self, key) -> int:
        """The first offset of a partition that was not in the previous batch."""
        if key not in self._first:
            self._stable_ends()
        return self._first.get(key, 0)

    def _positions(self, offsets: dict) -> dict:
        """Parse offsets from Spark, checking they cover exactly the streams (or the
        partitions) read now; a pattern's streams may grow."""
        positions = from_json(offsets)
        if self.options.pattern is not None:
            return positions
        assigned = self.options.assigned
        if assigned is not None and sorted(positions) != sorted(assigned):
            raise InvalidArgument(f"this query's checkpoint holds offsets of partitions "
                                  f"{', '.join(f'{s}/{p}' for s, p in sorted(positions))} but "
                                  f"option 'assign' names "
                                  f"{', '.join(f'{s}/{p}' for s, p in assigned)}; use a new "
                                  f"checkpointLocation to read other partitions")
        streams = sorted({key[0] for key in positions})
        if streams != sorted(self.options.streams):
            raise InvalidArgument(f"this query's checkpoint holds offsets of streams "
                                  f"{', '.join(streams)} but option 'stream' names "
                                  f"{', '.join(sorted(self.options.streams))}; use a new "
                                  f"checkpointLocation to read other streams")
        return positions


def to_json(positions: dict) -> dict:
    """{(stream, partition): offset} -> the offset dict Spark stores (stable order)."""
    out: dict = {}
    for (stream, number), offset in sorted(positions.items()):
        out.setdefault(stream, {})[str(number)] = int(offset)
    return out


def from_json(offsets: dict) -> dict:
    """The offset dict Spark hands back -> {(stream, partition): offset}."""
    if not isinstance(offsets, dict):
        raise InvalidArgument(f"not a streamlog offset: {offsets!r}")
    out = {}
    for stream, partitions in offsets.items():
        if not isinstance(partitions, dict):
            raise InvalidArgument(f"not a streamlog offset: {offsets!r}")
        for number, offset in partitions.items():
            out[(stream, int(number))] = int(offset)
    return out
