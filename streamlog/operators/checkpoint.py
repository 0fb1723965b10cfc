"""Taking operator checkpoints (DESIGN 7): the `Checkpointer`, which snapshots one
StateHandler under a CheckpointPolicy and makes the checkpoints durable in a
CheckpointStore, off the operator's thread.

Where the parts are: what an operator implements and fills, and the stored form
(checkpoint_value.py: StateHandler, Checkpoint); when checkpoints are taken and the
handle of a requested one (checkpoint_policy.py: CheckpointPolicy, CheckpointRequest);
the LMDB store (checkpoint_store.py: CheckpointStore) or its twin in an object store
(checkpoint_objects.py: ObjectCheckpointStore). Those public names are
importable from here too (`__all__`).

Strategy: taking a checkpoint has three steps; only the first runs on the operator's
thread:

    1. snapshot     handler.checkpoint(ckpt), between chunks     operator's thread
    2. serialise    serialize(snapshot) -> bytes                  worker thread
    3. store write  CheckpointStore.put (fsynced LMDB commit)     worker thread

The snapshot runs between records, so the state is consistent with the offsets without
any locking or copy-on-write. A handler that sets `ckpt.state` itself serialises inline
(the operator waits for its own serialiser); one that hands a snapshot over
(`ckpt.hand_over`) pays for the copy only, and serialisation runs elsewhere, as SPL and
kdb+ do. One worker thread runs steps 2 and 3 for a bounded FIFO queue of checkpoints,
in sequence-id order (the store refuses ids that do not increase); it exits when the
queue is empty and the next checkpoint starts a new one, so an idle checkpointer holds no
thread. A checkpoint is "in flight" from its snapshot until its write has finished.

Periodic checkpoints: one that falls due while any checkpoint is in flight (queued,
being serialised or being written) is dropped, not queued, and counted; the next one is
taken at the next tick after that (kdb+: "overlapping checkpoints will be dropped"). So a
50 ms serialiser under a 20 ms interval costs the operator one snapshot every ~60 ms,
not a 50 ms stall every 20 ms.

Operator-driven checkpoints are never dropped: the snapshot is taken at once (the
runtime: at the end of the chunk that asked), queued behind those in flight, and the
returned `CheckpointRequest` completes when the checkpoint is durable;
`create_checkpoint()` is the blocking form. The queue bound (PENDING_MAX) is the
back-pressure: a request beyond it waits, bounded, for room.

Failures are sticky. A serialiser that raises or returns something other than bytes, or
a store write that fails, fails that checkpoint's handle and every one queued behind it,
and is raised (StreamLogError, the cause chained) on the operator's thread by the next
checkpoint call: the serialiser or the store may be unusable from then on. An exception
of the handler's own checkpoint() is raised at once, on the operator's thread.

Thread-safety: one operator thread calls the Checkpointer (maybe_periodic,
request_checkpoint, create_checkpoint); its worker thread serialises handed-over
snapshots and calls `CheckpointStore.put`; a CheckpointRequest may be waited on from any
thread; store reads may come from any thread. Each CheckpointStats counter is written by
one of the two threads only. The GIL still applies: a serialiser that holds it (pure
Python, msgpack over a large dict) slows the operator thread while it runs, though the
operator no longer waits for it; one that releases it (I/O, zlib, a sleep) costs nothing.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import logging
import threading
import time
from typing import Callable

from ..errors import InvalidArgument, StreamLogError
from .checkpoint_policy import (CLOSE_WAIT_S_MAX, CheckpointMode, CheckpointPolicy,
                                CheckpointRequest)
from .checkpoint_store import CheckpointStore
from .checkpoint_value import Checkpoint, StateHandler

__all__ = ["Checkpoint", "CheckpointMode", "CheckpointPolicy", "CheckpointRequest",
           "CheckpointStats", "CheckpointStore", "Checkpointer", "Outcome", "PENDING_MAX",
           "StateHandler"]

log = logging.getLogger("streamlog.checkpoint")

# Checkpoints queued for the worker; each holds a snapshot in memory until written.
PENDING_MAX = 4
# Dropped periodic checkpoints (more than written) before the interval is called unmeetable.
DROPS_BEFORE_WARNING = 8
# Checkpoints one worker thread runs before it hands the queue to a fresh thread.
WORKER_JOBS_MAX = 1 << 16


class Outcome(str, enum.Enum):
    """What `Checkpointer.maybe_periodic` did."""

    NOT_DUE = "not_due"
    STARTED = "started"
    DROPPED = "dropped"
    DISABLED = "disabled"


@dataclasses.dataclass
class CheckpointStats:
    """Counters. Operator's thread: started, dropped, snapshot_seconds (time inside
    handler.checkpoint() and the hand-off to the worker). Worker thread: the rest."""

    started: int = 0
    written: int = 0
    dropped: int = 0
    failed: int = 0
    serialized: int = 0
    last_sequence_id: int = 0
    state_bytes: int = 0
    snapshot_seconds: float = 0.0
    serialize_seconds: float = 0.0
    write_seconds: float = 0.0


class Checkpointer:
    """Takes checkpoints of one StateHandler into one store under a policy.

    `maybe_periodic(inputs, outputs)` is called by the runtime between records (cheap
    when not due); `request_checkpoint(inputs, outputs)` is the operator-driven request
    (returns a CheckpointRequest at once), `create_checkpoint` its blocking form. The
    snapshot runs on the caller's thread; serialisation of a handed-over snapshot and the
    store write run on the worker thread (module docstring). With `background=False`
    they run on the caller's thread too (tests, tools). Failures are sticky.
    """

    def __init__(self, handler: StateHandler, store: CheckpointStore,
                 policy: CheckpointPolicy, *, clock: Callable[[], float] = time.monotonic,
                 background: bool = True) -> None:
        self.handler = handler
        self.store = store
        self.policy = policy
        self.clock = clock
        self.background = background
        self.stats = CheckpointStats()
        self._next_id = store.next_sequence_id()
        self._cond = threading.Condition()
        self._queue: collections.deque[tuple[Checkpoint, CheckpointRequest | None]] = (
            collections.deque())
        self._unfinished = 0  # checkpoints snapshotted whose write has not finished
        self._worker: threading.Thread | None = None
        self._failure: StreamLogError | None = None
        # Input offsets of the newest checkpoint this checkpointer made durable (None:
        # none yet): what the runtime's retention hold follows, without reading the store.
        self.last_written_inputs: dict[str, int] | None = None
        self._next_due = (clock() + policy.interval_s
                          if policy.mode is CheckpointMode.PERIODIC else None)

    @property
    def interval_s(self) -> float:
        """The periodic interval in seconds (0.0 unless the policy is periodic)."""
        return self.policy.interval_s

    @property
    def in_flight(self) -> bool:
        """A checkpoint is queued, being serialised or being written."""
        with self._cond:
            return self._unfinished > 0

    def maybe_periodic(self, input_offsets: dict[str, int],
                       output_offsets: dict[str, int]) -> Outcome:
        """Start a periodic checkpoint if one is due; drop it if one is still in flight.

        Raises:
            StreamLogError: an earlier checkpoint failed (sticky).
        """
        if self._next_due is None:
            return Outcome.DISABLED
        self._raise_failure()
        now = self.clock()
        if now < self._next_due:
            return Outcome.NOT_DUE
        interval = self.policy.interval_s
        ticks = int((now - self._next_due) // interval) + 1
        self._next_due += ticks * interval  # the next tick after now; missed ticks are gone
        if self._next_due <= now:  # floating-point rounding put it on `now` exactly
            self._next_due += interval
        assert self._next_due > now
        with self._cond:
            busy = self._unfinished > 0
        if busy:
            self.stats.dropped += 1
            log.info("periodic checkpoint dropped: the previous one is still in flight")
            if self.stats.dropped == DROPS_BEFORE_WARNING and (
                    self.stats.dropped > self.stats.written):
                spent = (self.stats.serialize_seconds + self.stats.write_seconds) / max(
                    1, self.stats.written)
                log.warning("checkpoint interval %.3f s cannot be met: a checkpoint takes "
                            "%.3f s to serialise and write, so %d of %d periodic "
                            "checkpoints were dropped; raise the interval, or make the "
                            "state cheaper to serialise", self.policy.interval_s, spent,
                            self.stats.dropped, self.stats.dropped + self.stats.started)
            return Outcome.DROPPED
        self._submit(self._snapshot(input_offsets, output_offsets), None)
        return Outcome.STARTED

    def request_checkpoint(self, input_offsets: dict[str, int], output_offsets: dict[str, int],
                           *, request: CheckpointRequest | None = None) -> CheckpointRequest:
        """Operator-driven checkpoint: take the snapshot now, serialise and write it in
        the background; never dropped.

        Args:
            request: the handle to complete (the runtime's, handed out earlier by
                `out.request_checkpoint()`); a new one when None.

        Returns:
            the handle: done when durable; wait() returns None if checkpointing is
            disabled.

        Raises:
            StreamLogError: an earlier checkpoint failed (sticky), or the queue stayed
                full for CLOSE_WAIT_S_MAX; the handler's own exception as it is. The
                handle is failed too, so no one waits on it in vain.
        """
        request = CheckpointRequest() if request is None else request
        assert not request.done()
        if self.policy.mode is CheckpointMode.DISABLED:
            request.set_result(None)
            return request
        try:
            self._raise_failure()
            ckpt = self._snapshot(input_offsets, output_offsets)
            request.sequence_id = ckpt.sequence_id
            self._submit(ckpt, request)
        except BaseException as error:
            if not request.done():
                which = "" if request.sequence_id is None else f" {request.sequence_id}"
                request.set_failure(_describe_failure(f"checkpoint{which} was not taken",
                                                      error))
            raise
        return request

    def create_checkpoint(self, input_offsets: dict[str, int],
                          output_offsets: dict[str, int]) -> Checkpoint | None:
        """Operator-driven checkpoint, blocking: returns the stored checkpoint once it is
        durable, or None when checkpointing is disabled. Queued behind those in flight."""
        return self.request_checkpoint(input_offsets, output_offsets).wait()

    def wait(self, timeout_s: float = CLOSE_WAIT_S_MAX) -> None:
        """Block until no checkpoint is in flight; raise a failure (sticky)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._unfinished > 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise StreamLogError(f"a checkpoint write did not finish in "
                                         f"{timeout_s:g} s")
                self._cond.wait(remaining)
        self._raise_failure()

    def close(self) -> None:
        self.wait()

    # -- internals: the operator's thread -------------------------------------------

    def _snapshot(self, input_offsets, output_offsets) -> Checkpoint:
        started = time.perf_counter()
        ckpt = Checkpoint(self._next_id, dict(input_offsets), dict(output_offsets),
                          time.time_ns() // 1000)
        self._next_id += 1
        self.handler.checkpoint(ckpt)
        if ckpt.handed_over:
            if ckpt.state:
                raise InvalidArgument("StateHandler.checkpoint both called hand_over() and "
                                      "set ckpt.state; do one of the two")
        elif not isinstance(ckpt.state, (bytes, bytearray)):
            raise InvalidArgument("StateHandler.checkpoint must set ckpt.state to bytes or "
                                  "call ckpt.hand_over(snapshot, serialize)")
        self.stats.started += 1
        self.stats.snapshot_seconds += time.perf_counter() - started
        return ckpt

    def _submit(self, ckpt: Checkpoint, request: CheckpointRequest | None) -> None:
        """Queue `ckpt` for the worker (waiting, bounded, for room); or, without a
        background thread, serialise and write it here."""
        started = time.perf_counter()
        if not self.background:
            with self._cond:
                self._unfinished += 1
            self._run_job(ckpt, request)
            self._raise_failure()
            return
        deadline = time.monotonic() + CLOSE_WAIT_S_MAX
        with self._cond:
            while len(self._queue) >= PENDING_MAX:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise StreamLogError(f"checkpoint {ckpt.sequence_id}: {PENDING_MAX} "
                                         f"checkpoints stayed queued for "
                                         f"{CLOSE_WAIT_S_MAX:g} s")
                self._cond.wait(remaining)
            assert len(self._queue) < PENDING_MAX
            self._queue.append((ckpt, request))
            self._unfinished += 1
            if self._worker is None:
                self._start_worker_locked()
        self.stats.snapshot_seconds += time.perf_counter() - started

    def _raise_failure(self) -> None:
        failure = self._failure
        if failure is not None:  # sticky: the serialiser or the store may be unusable
            raise StreamLogError(f"checkpointing stopped after a failure: {failure}") from (
                failure.__cause__)

    # -- internals: the worker thread -----------------------------------------------

    def _start_worker_locked(self) -> None:
        assert self._worker is None
        assert self._queue
        self._worker = threading.Thread(target=self._work, name="checkpoint-worker",
                                        daemon=True)
        self._worker.start()

    def _work(self) -> None:
        """Run queued checkpoints in order until the queue is empty, then exit."""
        for _ in range(WORKER_JOBS_MAX):
            with self._cond:
                if not self._queue:
                    self._worker = None
                    return
                ckpt, request = self._queue.popleft()
                self._cond.notify_all()  # room in the queue
            self._run_job(ckpt, request)
        with self._cond:  # the bound: hand what is left to a fresh thread
            self._worker = None
            if self._queue:
                self._start_worker_locked()

    def _run_job(self, ckpt: Checkpoint, request: CheckpointRequest | None) -> None:
        """Serialise (if handed over) and write one checkpoint; complete its handle."""
        failure = self._failure
        if failure is None:
            step = "serialising the handed-over state"
            try:
                if ckpt.handed_over:
                    self._serialize(ckpt)
                step = "writing it to the store"
                self._write(ckpt)
            except BaseException as error:  # noqa: BLE001 (raised on the operator's thread)
                failure = _describe_failure(f"checkpoint {ckpt.sequence_id} failed while {step}",
                                             error)
                self._failure = failure
                log.error("%s", failure)
        if failure is not None:
            self.stats.failed += 1
        with self._cond:
            self._unfinished -= 1
            assert self._unfinished >= 0
            self._cond.notify_all()
        if request is not None:  # after the count: in_flight is false once wait() returns
            if failure is None:
                request.set_result(ckpt)
            else:
                request.set_failure(failure)

    def _serialize(self, ckpt: Checkpoint) -> None:
        started = time.perf_counter()
        ckpt.serialize_snapshot()
        self.stats.serialize_seconds += time.perf_counter() - started
        self.stats.serialized += 1

    def _write(self, ckpt: Checkpoint) -> None:
        started = time.perf_counter()
        self.store.put(ckpt)
        self.stats.write_seconds += time.perf_counter() - started
        self.stats.written += 1
        self.stats.last_sequence_id = ckpt.sequence_id
        self.stats.state_bytes = len(ckpt.state)
        self.last_written_inputs = ckpt.input_offsets  # one assignment: read by any thread


def _describe_failure(message: str, error: BaseException) -> StreamLogError:
    """A StreamLogError naming `error`, with `error` as its cause."""
    if isinstance(error, StreamLogError) and error.__cause__ is not None:
        cause = error.__cause__
    else:
        cause = error
    failure = StreamLogError(f"{message}: {type(error).__name__}: {error}")
    failure.__cause__ = cause
    return failure
