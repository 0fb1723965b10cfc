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

Durability "remote" (group_commit.py): the same job also commits the tail. Between the
full rounds (every `interval_s`: the take-over check, idle rolls, sealed segments) it
runs tail rounds whenever acks wait, at most one per `commit_interval_s` (sooner when
`commit_bytes` wait): one generation whose object carries the new records of every
partition as its payload (one PUT), after which the gate releases the acks the store
holds. Generations whose payload no piece names any more go on the manifest's garbage
list (and objects of any kind no generation names), and are deleted after `grace_s`
(longer than any reader keeps a generation pinned).

The store down or slow: a round's error is kept (`error`), logged once per kind, and the
next round tries again after `retry_s` (the store port's Retrying handles the backoff
within a round); nothing local is touched, so nothing is lost, and the backlog drains
when the store returns.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

from ..clock import SYSTEM_CLOCK
from ..errors import (Fenced, LogClosed, ObjectNotFound, PartitionFailed, ReadOnlyLog,
                      StoreError)
from . import garbage, manifest as manifests
from .changes import ChangeOperations
from .group_commit import AckGate, tail_runs
from .manifest import Manifest, PartitionManifest, TailPiece
from .segment_object import name_segment, put_segment
from .snapshots import Snapshots

log = logging.getLogger("streamlog.remote")

PRUNE_EVERY_S = 60.0  # how often a writer looks for manifest generations to delete
PRUNE_MAX = 1000  # generations deleted per look
TAIL_PIECES_MAX = 1024  # a partition's tail pieces before its segment is sealed


class Tiering(ChangeOperations):
    """Uploads the sealed segments of `partitions()` (the log's writable partitions,
    asked again each round: streams come and go) to `store`. Its changes to what the
    store holds (retention, delete_records, truncate_after, deleted streams) are in
    changes.py."""

    def __init__(self, store, partitions, *, writer: str, interval_s: float = 1.0,
                 retry_s: float = 5.0, lag_max_s: float | None = None,
                 manifest: Manifest | None = None, durability: str = "local",
                 commit_interval_s: float = 0.01, commit_bytes: int = 4 * 2**20,
                 ack_timeout_s: float = 30.0, grace_s: float = 900.0,
                 clock=SYSTEM_CLOCK) -> None:
        self.store = store
        self.clock = clock
        self.commit_interval_s = commit_interval_s
        self.grace_s = grace_s
        # durability "remote": acks wait here for the store (None under "local")
        self.gate = AckGate(self.committed_end, self._want_commit, timeout_s=ack_timeout_s,
                            clock=clock, wake_bytes=commit_bytes) \
            if durability == "remote" else None
        self._urgent = False
        self._full_due = 0.0  # monotonic time of the next full round
        self._prune_due = 0.0  # monotonic time of the next look for old generations
        # sealed segments put but not yet named: partition -> [(SegmentObject, hwm
        # before it)], in offset order
        self._ready: dict[str, list] = {}
        self._ready_lock = threading.Lock()
        self._upload_lock = threading.Lock()
        self._upload_wake = threading.Event()
        self._uploader: threading.Thread | None = None
        self._partitions = partitions
        self.interval_s = interval_s
        self.lag_max_s = lag_max_s  # seal an active segment older than this (None: never)
        self.retry_s = retry_s
        # the generation this writer committed when it took the log over (fencing the
        # older writer): taken here unless the open did (a restore takes over first)
        self.manifest: Manifest = manifest or manifests.take_over(store, writer)
        self.error: BaseException | None = None
        self.fenced = False
        self.stats = {"rounds": 0, "segments": 0, "bytes": 0, "commits": 0, "errors": 0,
                      "tail_commits": 0, "tail_bytes": 0, "puts": 0, "deleted": 0}
        self._token = id(self)  # the hold this job keeps in each partition
        self._wake = threading.Event()
        self._stopping = False
        self._round_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.snapshots = Snapshots(store, self.stats)  # off the commit path

    # -- the log's side --------------------------------------------------------------

    def start(self) -> "Tiering":
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="streamlog-tiering")
        self._thread.start()
        if self.gate is not None:  # acks time out even while a round is stuck
            threading.Thread(target=self._expire_acks, daemon=True,
                             name="streamlog-ack-timeouts").start()
            self._uploader = threading.Thread(target=self._upload_loop, daemon=True,
                                              name="streamlog-uploader")
            self._uploader.start()
        return self

    def _expire_acks(self) -> None:
        tick = min(0.1, self.gate.timeout_s / 4)
        while not self._stopping:
            time.sleep(tick)
            self.gate.expire()

    def wake(self) -> None:
        """Run a round now (a segment was sealed)."""
        self._upload_wake.set()
        self._wake.set()

    def close(self) -> None:
        """Stop after the round under way (nothing is lost: the next open goes on).
        Under durability "remote", a last round commits the tail of acks still held
        (which fail with LogClosed when even that does not take them) and names the
        sealed segments the uploader has put (else the next open would put them
        again, and these would be objects no generation names)."""
        self._stopping = True
        self._wake.set()
        self._upload_wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._uploader is not None:
            self._uploader.join()
            self._uploader = None
        self.snapshots.close()
        gate = self.gate
        if gate is None:
            return
        if not self.fenced:
            try:
                self.run_once(full=True, inline=False)
            except (Fenced, StoreError, OSError) as error:
                log.warning("closing: the last round failed: %s", error)
        gate.fail(LogClosed("the log was closed before the store took these records (they "
                            "are in the local log, and go up when it is opened again)"))

    def _want_commit(self, urgent: bool = False) -> None:
        """The gate holds acks: a tail round soon (now when `urgent`)."""
        self._urgent = self._urgent or urgent
        self._wake.set()

    def keep(self, part) -> None:
        """Hold in `part` what the store does not have yet as whole segments, against
        local retention (called before each retention, and after each round); never
        what is before the partition's start, which no reader needs."""
        found = self.manifest.partitions.get(part.name)
        part.hold(self._token, max(found.sealed_end if found is not None else 0,
                                   part.state.start_offset))

    def backlog_bytes(self, part) -> int:
        """Bytes of the partition the store does not hold yet: under durability
        "local" its local segments past the store's segment objects, under "remote"
        what the next tail round would put."""
        found = self.manifest.partitions.get(part.name, PartitionManifest())
        state = part.state
        if self.gate is not None:
            try:
                return sum(run.size for run in tail_runs(state, found))
            except StoreError:
                return 0
        end = found.sealed_end if (found.segments or found.tail) else -1
        if not state.segments:
            return 0
        active = state.segments.active
        return sum(state.active_position if segment is active else segment.size_bytes
                   for segment in state.segments if segment.base_offset >= end)

    def status(self) -> dict:
        """What /metrics shows: per partition the records and bytes the store lacks,
        the manifest's generation, the store's request counts (when it counts)."""
        parts = list(self._partitions())
        manifest = self.manifest
        return {"generation": manifest.generation, "epoch": manifest.epoch,
                "fenced": self.fenced, "errors": self.stats["errors"],
                "commits": self.stats["commits"],
                "lag_records": {part.name: max(0, part.end_offset - self.committed_end(
                    part.name)) for part in parts},
                "backlog_bytes": {part.name: self.backlog_bytes(part) for part in parts},
                "requests": dict(getattr(self.store, "requests", {})),
                "failures": dict(getattr(self.store, "failures", {}))}

    def committed_end(self, partition: str) -> int:
        """The partition's remote committed end (exclusive, like end_offset)."""
        return self.manifest.partitions.get(partition, PartitionManifest()).committed_end

    # -- a round -----------------------------------------------------------------------

    def run_once(self, *, full: bool = True, inline: bool = True) -> int:
        """A round: when `full`, look for a take-over, seal idle segments and name the
        sealed segments the store has got (putting, when `inline`, those it lacks:
        under durability "remote" the background job leaves that to its uploader
        thread, so a large segment never holds up a tail commit); under "remote",
        commit the tail too. One generation names all of it. Returns how many segments
        it named. Raises Fenced, StoreError."""
        with self._round_lock:
            self._check_not_fenced()
            try:
                return self._round(full, inline)
            except Fenced as error:
                self.fenced = True
                if self.gate is not None:
                    self.gate.fail(error)
                raise
            finally:
                if self.gate is not None:
                    self.gate.committed()  # releases what the store has, expires the rest

    def _round(self, full: bool, inline: bool = True) -> int:
        if full:
            self._check_not_taken_over()
        current = self._rebased()
        proposed, uploaded, parts = current, 0, list(self._partitions())
        streams = dict(current.streams)
        if full:
            self._roll_due(parts, current)
        for part in parts:
            stream, _, number = part.name.rpartition("/")
            streams[stream] = max(streams.get(stream, 0), int(number) + 1)
            if full:
                if inline:
                    self._put_sealed(part, current)
                proposed, count, nbytes = self._name_ready(proposed, part)
                uploaded += count
                self.stats["bytes"] += nbytes
        tail = self._add_tail(proposed, parts) if self.gate is not None else None
        payload = b""
        if tail is not None:
            proposed, payload = tail
        proposed, trimmed = self._trim_all(proposed, parts)  # (changes.py)
        if full:
            proposed = self._sweep(proposed)
            self._prune_manifests()
        if uploaded or tail is not None or trimmed or streams != current.streams or (
                proposed.garbage != current.garbage):
            proposed = self._with_garbage(current, dataclasses.replace(
                proposed, streams=streams, partitions={
                    **proposed.partitions, **{
                        part.name: self._with_local_end(proposed, part) for part in parts}}))
            try:
                self.manifest = manifests.commit(self.store, proposed.successor(),
                                                 current, payload)
            except manifests.CommittedBefore as landed:
                self._adopt(landed.manifest)  # (what this round had goes in the next)
                return 0
            self._forget_named()
            self.snapshots.due(self.manifest)
            self.stats["commits"] += 1
            self.stats["puts"] += 1
            if tail is not None:
                self.stats["tail_commits"] += 1
                self.stats["tail_bytes"] += len(payload)
        self.stats["segments"] += uploaded
        self.stats["rounds"] += 1
        for part in parts:  # local retention keeps what the store does not have
            self.keep(part)
        return uploaded

    def _with_local_end(self, proposed: Manifest, part) -> PartitionManifest:
        """The partition's entry with the end this writer has acknowledged: its local
        end under durability "local" (a restore reports what lies past the store's end
        as lost), the store's own end under "remote" (nothing past it was acked). The
        same entry when that is unchanged: a round then compares it by identity."""
        found = proposed.partitions.get(part.name, PartitionManifest())
        end = part.end_offset if self.gate is None else found.committed_end
        return found if found.local_end == end else dataclasses.replace(found, local_end=end)

    def _roll_due(self, parts, current: Manifest) -> None:
        """Seal an active segment older than `lag_max_s`, appends or not (so the store
        keeps up) and, under durability "remote", one the store holds as
        TAIL_PIECES_MAX tail pieces or more (so it goes up whole, and its pieces leave
        the manifest, whose snapshots grow with them)."""
        for part in parts:
            active = part.state.segments.active if part.state.segments else None
            if active is None or active.size_bytes == 0:
                continue
            found = current.partitions.get(part.name)
            pieced = self.gate is not None and found is not None and (
                len(found.tail) >= TAIL_PIECES_MAX)
            if not pieced and (self.lag_max_s is None or part.clock.monotonic_s()
                               - active.created_monotonic <= self.lag_max_s):
                continue  # (no job on the writer thread for a young one)
            try:
                part.roll_if_older(0.0 if pieced else self.lag_max_s)
            except (LogClosed, PartitionFailed, ReadOnlyLog):
                pass  # nothing more is written there: what is sealed goes up

    def _add_tail(self, proposed: Manifest, parts):
        """(proposed with the new tail pieces, the payload holding them), or None when
        no partition has records the store lacks. The pieces are keyed by the
        generation about to be committed, at their place in its payload."""
        runs = {}
        for part in parts:
            found = tail_runs(part.state, proposed.partitions.get(part.name,
                                                                  PartitionManifest()))
            if found:
                runs[part.name] = found
        if not runs:
            return None
        key = manifests.key_of(proposed.generation + 1)
        chunks, placed, at = [], [], 0
        for name, found in runs.items():
            for run in found:
                data = run.segment.read(run.position, run.size)
                if len(data) != run.size:
                    raise StoreError(f"{name}: {run.size} bytes at {run.position} of the "
                                     f"segment at {run.segment.base_offset} could not be "
                                     f"read ({len(data)} were)", key=key)
                chunks.append(data)
                placed.append((name, run, at))
                at += run.size
        partitions = dict(proposed.partitions)
        for name, run, offset in placed:
            part = partitions.get(name, PartitionManifest())
            piece = TailPiece(key, 0, offset, run.size, run.segment.base_offset,
                              run.position, run.base_offset, run.end_offset)
            first = not part.segments and not part.tail
            partitions[name] = dataclasses.replace(
                part, tail=(*part.tail, piece),
                start_offset=max(run.base_offset, part.start_offset) if first
                else part.start_offset,  # (a start inside the piece's segment stays)
                committed_end=max(part.committed_end, run.end_offset))
        return dataclasses.replace(proposed, partitions=partitions), b"".join(chunks)

    # -- snapshots: whole manifests that chains of deltas start from ---------------------

    def _rebased(self) -> Manifest:
        """The writer's manifest, its chain starting from the newest snapshot stored."""
        self.manifest = self.snapshots.rebased(self.manifest)
        return self.manifest

    def _with_garbage(self, current: Manifest, proposed: Manifest) -> Manifest:
        return garbage.with_garbage(current, proposed, after_us=self.clock.wall_us()
                                    + int(self.grace_s * 1e6))

    def _prune_manifests(self) -> None:
        """garbage.prune, one LIST of each folder at most every PRUNE_EVERY_S."""
        now = self.clock.monotonic_s()
        if now < self._prune_due:
            return
        self._prune_due = now + PRUNE_EVERY_S
        self.stats["deleted"] += garbage.prune(
            self.store, self.manifest, before_us=self.clock.wall_us()
            - int(self.grace_s * 1e6), most=PRUNE_MAX)

    def _sweep(self, proposed: Manifest) -> Manifest:
        swept, deleted = garbage.sweep(self.store, proposed, now_us=self.clock.wall_us())
        self.stats["deleted"] += deleted
        return swept

    def _check_not_taken_over(self) -> None:
        """Fenced (for good) when a newer writer has committed a generation after this
        writer's latest: each full round looks (one GET of the next generation's key),
        so an older writer learns of a take-over within one interval even when it has
        nothing to upload."""
        key = manifests.key_of(self.manifest.generation + 1)
        try:
            found = manifests.fetch(self.store, self.manifest.generation + 1)
        except ObjectNotFound:
            return
        if (found.epoch, found.writer) == (self.manifest.epoch, self.manifest.writer):
            # this writer's own commit, whose answer was lost: go on from it
            self._adopt(manifests.read(self.store, found.generation))
            return self._check_not_taken_over()
        if found.epoch > self.manifest.epoch:
            self.fenced = True
            raise Fenced(f"the log was taken over by a newer writer (epoch {found.epoch}, "
                         f"{found.writer}); this writer (epoch {self.manifest.epoch}) "
                         f"stops")
        raise StoreError(f"generation {found.generation} was committed by another writer "
                         f"of epoch {found.epoch} (this one's is {self.manifest.epoch})",
                         key=key)

    def _adopt(self, manifest: Manifest) -> None:
        """Go on from `manifest`, a generation this writer committed in an attempt
        whose answer was lost (manifests.CommittedBefore): it holds what that attempt
        did (segments named, tail pieces), and the gate releases what it holds."""
        log.info("generation %d was committed by this writer in an attempt whose answer "
                 "was lost: going on from it", manifest.generation)
        self.manifest = manifest
        self._forget_named()
        self.stats["commits"] += 1

    # -- sealed segments: put (inline, or by the uploader thread), then named ------------

    def _put_sealed(self, part, manifest: Manifest) -> int:
        """Put the partition's sealed segments that neither the store (as `manifest`
        says) nor the ready list has, in offset order, onto the ready list. Returns how
        many. Raises StoreError (a gap the store cannot be given, or the store)."""
        count = 0
        with self._upload_lock:  # (a truncate waits: no segment changes while it goes up)
            remote = manifest.partitions.get(part.name, PartitionManifest())
            held = bool(remote.segments or remote.tail)
            state = part.state
            for number, segment in enumerate(state.segments[:-1]):  # the sealed ones
                if state.segments[number + 1].base_offset <= state.start_offset:
                    continue  # wholly before the start: no reader needs it
                with self._ready_lock:
                    ready = self._ready.setdefault(part.name, [])
                    last = ready[-1][0] if ready else None
                end = last.end_offset if last else (remote.sealed_end if held else None)
                if end is not None and segment.base_offset < end:
                    continue  # the store has it, or it is ready
                if end is not None and segment.base_offset != end:
                    raise StoreError(f"{part.name}: the store's segments end at {end} but "
                                     f"the next local segment starts at "
                                     f"{segment.base_offset}: a gap the store cannot be "
                                     f"given", key=None)
                hwm_before = last.hwm_us if last else (
                    remote.segments[-1].hwm_us if remote.segments else state.start_hwm_us)
                data = segment.read(0, segment.size_bytes)
                uploaded = put_segment(self.store, part.name, data,
                                       base_offset=segment.base_offset,
                                       hwm_before=hwm_before, epoch=manifest.epoch)
                self.stats["puts"] += 2
                with self._ready_lock:
                    self._ready[part.name].append((uploaded, hwm_before))
                count += 1
        return count

    def _name_ready(self, proposed: Manifest, part) -> tuple[Manifest, int, int]:
        """`proposed` naming the ready segments that continue the store's segment
        objects, in order; (it, how many, their bytes)."""
        with self._ready_lock:
            ready = list(self._ready.get(part.name, ()))
        count = nbytes = 0
        for uploaded, hwm_before in ready:
            remote = proposed.partitions.get(part.name, PartitionManifest())
            held = bool(remote.segments or remote.tail)
            if held and uploaded.base_offset != remote.sealed_end:
                if uploaded.base_offset < remote.sealed_end:
                    continue  # named already
                break
            proposed = name_segment(proposed, part.name, uploaded)
            if not remote.segments:  # the first: where the store's copy starts
                first = proposed.partitions[part.name]
                proposed = dataclasses.replace(proposed, partitions={
                    **proposed.partitions,
                    part.name: dataclasses.replace(first, start_hwm_us=hwm_before)})
            count += 1
            nbytes += uploaded.size
        return proposed, count, nbytes

    def _forget_named(self) -> None:
        """After a commit: the ready segments it named leave the ready list."""
        with self._ready_lock:
            for name, ready in self._ready.items():
                found = self.manifest.partitions.get(name)
                end = found.sealed_end if found is not None and found.segments else -1
                ready[:] = [item for item in ready if item[0].end_offset > end]

    def _upload_loop(self) -> None:
        """Durability "remote": put sealed segments off the committing thread."""
        reported = None
        while not self._stopping:
            self._upload_wake.wait(self.interval_s)
            self._upload_wake.clear()
            try:
                put = sum(self._put_sealed(part, self.manifest)
                          for part in list(self._partitions()))
                reported = None
            except (StoreError, OSError) as error:
                if type(error) is not reported:
                    log.warning("uploading sealed segments to %s: %s", getattr(
                        self.store, "url", "the store"), error)
                    reported = type(error)
                self._upload_wake.wait(self.retry_s)
                continue
            if put:
                self._full_due = 0.0  # name them in the next round
                self._wake.set()

    def _run(self) -> None:
        reported: type | None = None
        while not self._stopping:
            started = self.clock.monotonic_s()
            full = self.gate is None or started >= self._full_due
            wait = self.interval_s
            try:
                self.run_once(full=full, inline=self._uploader is None)
                if full:
                    self._full_due = started + self.interval_s
                self.error, reported = None, None
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
                wait = self.retry_s if self.gate is None else min(self.retry_s, 1.0)
            if self.gate is not None:
                if self.gate.waiting() and self.error is None:
                    wait = 0.0  # acks arrived during the round: the next one is due
                wait = min(wait, max(0.0, self._full_due - self.clock.monotonic_s()))
            self._wake.wait(wait)
            self._wake.clear()
            if self.gate is not None and not self._urgent and not self._stopping:
                # one tail round per commit interval: what arrives meanwhile goes too
                spare = started + self.commit_interval_s - self.clock.monotonic_s()
                if spare > 0:
                    time.sleep(spare)
            self._urgent = False
