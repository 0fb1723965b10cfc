"""Tiering a writable log to the store: sealed segments go up in the background.

Strategy (DESIGN 11, durability "local"): an ack still means the local fsync; a
background thread, one per Log, uploads every sealed segment the store does not have
yet, partition by partition in offset order, with its index object (segment_object.py),
and commits one manifest generation per round naming all of them (manifest.py). A
sealed segment never changes, so it is read from its local file without the writer's
lock. Opening takes the log over in the store (`take_over`: a new epoch, the newest open
wins); a round whose commit meets a newer epoch, or that finds a newer epoch's generation when
it starts, is `Fenced`: the job stops for good and says so (`error`), and the log
refuses appends from then on (Log.submit): an older writer learns of a take-over within
one interval, or at its next upload's commit. Local retention never removes a segment the store lacks: the job
holds each partition's remote committed end as a reader would (Partition.hold).
A segment that has taken appends is sealed once it is `lag_max_s` old, appends or not
(Partition.roll_if_older, config.remote_max_lag_s), so the store lags the log by at
most about that even when the log goes quiet.

The store down or slow: a round's error is kept (`error`), logged once per kind, and the
next round tries again after `retry_s` (the store port's Retrying handles the backoff
within a round); nothing local is touched, so nothing is lost, and the backlog drains
when the store returns.
"""

from __future__ import annotations

import dataclasses
import logging
import threading

from ..errors import Fenced, LogClosed, PartitionFailed, ReadOnlyLog, StoreError
from . import manifest as manifests
from .manifest import Manifest, PartitionManifest
from .segment_object import upload

log = logging.getLogger("streamlog.remote")


class Tiering:
    """Uploads the sealed segments of `partitions()` (the log's writable partitions,
    asked again each round: streams come and go) to `store`."""

    def __init__(self, store, partitions, *, writer: str, interval_s: float = 1.0,
                 retry_s: float = 5.0, lag_max_s: float | None = None,
                 manifest: Manifest | None = None) -> None:
        self.store = store
        self._partitions = partitions
        self.interval_s = interval_s
        self.lag_max_s = lag_max_s  # seal an active segment older than this (None: never)
        self.retry_s = retry_s
        # the generation this writer committed when it took the log over (fencing the
        # older writer): taken here unless the open did (a restore takes over first)
        self.manifest: Manifest = manifest or manifests.take_over(store, writer)
        self.error: BaseException | None = None
        self.fenced = False
        self.stats = {"rounds": 0, "segments": 0, "bytes": 0, "commits": 0, "errors": 0}
        self._token = id(self)  # the hold this job keeps in each partition
        self._wake = threading.Event()
        self._stopping = False
        self._round_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    # -- the log's side --------------------------------------------------------------

    def start(self) -> "Tiering":
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="streamlog-tiering")
        self._thread.start()
        return self

    def wake(self) -> None:
        """Run a round now (a segment was sealed)."""
        self._wake.set()

    def close(self) -> None:
        """Stop after the round under way (nothing is lost: the next open goes on)."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()

    def keep(self, part) -> None:
        """Hold in `part` what the store does not have yet, against local retention
        (called before each retention, and after each round)."""
        part.hold(self._token, self.committed_end(part.name))

    def committed_end(self, partition: str) -> int:
        """The partition's remote committed end (exclusive, like end_offset)."""
        return self.manifest.partitions.get(partition, PartitionManifest()).committed_end

    # -- a round -----------------------------------------------------------------------

    def run_once(self) -> int:
        """Upload every sealed segment the store lacks and commit one generation naming
        them; returns how many went up. Raises Fenced, StoreError."""
        with self._round_lock:
            if self.fenced:
                raise Fenced("a newer writer took this log over in the store")
            self._check_not_taken_over()
            current = self.manifest
            proposed, uploaded, parts = current, 0, list(self._partitions())
            streams = dict(current.streams)
            if self.lag_max_s is not None:
                for part in parts:  # an idle segment seals too, so the store keeps up
                    active = part.state.segments.active if part.state.segments else None
                    if active is None or active.size_bytes == 0 or (
                            part.clock.monotonic_s() - active.created_monotonic
                            <= self.lag_max_s):
                        continue  # (no job on the writer thread for a young or empty one)
                    try:
                        part.roll_if_older(self.lag_max_s)
                    except (LogClosed, PartitionFailed, ReadOnlyLog):
                        pass  # nothing more is written there: what is sealed goes up
            for part in parts:
                stream, _, number = part.name.rpartition("/")
                streams[stream] = max(streams.get(stream, 0), int(number) + 1)
                proposed, count, nbytes = self._upload_partition(proposed, part)
                uploaded += count
                self.stats["bytes"] += nbytes
            if uploaded or streams != current.streams:
                proposed = dataclasses.replace(proposed, streams=streams, partitions={
                    **proposed.partitions, **{
                        part.name: dataclasses.replace(
                            proposed.partitions.get(part.name, PartitionManifest()),
                            local_end=part.end_offset) for part in parts}})
                try:
                    self.manifest = manifests.commit(self.store, proposed.successor())
                except Fenced:
                    self.fenced = True
                    raise
                self.stats["commits"] += 1
            self.stats["segments"] += uploaded
            self.stats["rounds"] += 1
            for part in parts:  # local retention keeps what the store does not have
                self.keep(part)
            return uploaded

    def _check_not_taken_over(self) -> None:
        """Fenced (for good) when a newer writer has committed a generation with a
        higher epoch: each round looks, so an older writer learns of a take-over within
        one interval even when it has nothing to upload (one LIST and one GET)."""
        newest = manifests.latest(self.store)
        if newest is not None and newest.epoch > self.manifest.epoch:
            self.fenced = True
            raise Fenced(f"the log was taken over by a newer writer (epoch {newest.epoch}, "
                         f"{newest.writer}); this writer (epoch {self.manifest.epoch}) "
                         f"stops")

    def _upload_partition(self, proposed: Manifest, part) -> tuple[Manifest, int, int]:
        state = part.state
        remote = proposed.partitions.get(part.name, PartitionManifest())
        count = nbytes = 0
        for segment in state.segments[:-1]:  # the sealed ones
            end = remote.committed_end if remote.segments else None
            if end is not None and segment.base_offset < end:
                continue  # the store has it
            if end is not None and segment.base_offset != end:
                raise StoreError(f"{part.name}: the store ends at {end} but the next local "
                                 f"segment starts at {segment.base_offset}: a gap the "
                                 f"store cannot be given", key=None)
            hwm_before = remote.segments[-1].hwm_us if remote.segments else (
                state.start_hwm_us)
            data = segment.read(0, segment.size_bytes)
            proposed = upload(self.store, proposed, part.name, data,
                              base_offset=segment.base_offset, hwm_before=hwm_before)
            if not remote.segments:  # the first: where the store's copy starts
                first = proposed.partitions[part.name]
                proposed = dataclasses.replace(proposed, partitions={
                    **proposed.partitions,
                    part.name: dataclasses.replace(first, start_hwm_us=hwm_before)})
            remote = proposed.partitions[part.name]
            count += 1
            nbytes += len(data)
        return proposed, count, nbytes

    def _run(self) -> None:
        reported: type | None = None
        while not self._stopping:
            try:
                self.run_once()
                self.error, reported = None, None
                wait = self.interval_s
            except Fenced as error:
                self.error = error
                log.error("tiering stopped: %s", error)
                return
            except (StoreError, OSError) as error:
                self.error = error
                self.stats["errors"] += 1
                if type(error) is not reported:  # once per kind, not every round
                    log.warning("tiering to %s: %s (retrying every %.0f s)",
                                getattr(self.store, "url", "the store"), error, self.retry_s)
                    reported = type(error)
                wait = self.retry_s
            self._wake.wait(wait)
            self._wake.clear()
