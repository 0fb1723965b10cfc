"""Operator checkpoints (DESIGN 7): the state-handler protocol, a durable checkpoint
store, and periodic / operator-driven / disabled checkpointing.

Strategy: the SPL seed's split. An operator implements `StateHandler`
(`checkpoint(ckpt)`, `reset(ckpt)`, `reset_to_initial_state()`); the runtime decides when
to checkpoint and what to reset from. A `Checkpoint` carries an increasing sequence id,
the input offsets it corresponds to (the next offset to read, per input partition), the
output offsets (the output end, per output partition) and the operator's serialized
state as bytes.

Taking a checkpoint has three steps; only the first runs on the operator's thread:

    1. snapshot     handler.checkpoint(ckpt), between chunks     operator's thread
    2. serialise    serialize(snapshot) -> bytes                  worker thread
    3. store write  CheckpointStore.put (fsynced LMDB commit)     worker thread

The snapshot runs between records, so the state is consistent with the offsets without
any locking or copy-on-write. In it the handler either sets `ckpt.state` to bytes (it
serialises inline: the operator waits for its own serialiser, as before), or calls
`ckpt.hand_over(snapshot, serialize)` with a value it will not mutate again (a shallow
copy, an immutable value) and the function that turns it into bytes (None: the default
codec, MessagePack, which `ckpt.value()` decodes in reset()). Handing over is the cheap
path: the operator pays for the copy only, and serialisation runs elsewhere, as SPL and
kdb+ do. One worker thread runs steps 2 and 3 for a bounded FIFO queue of checkpoints,
in sequence-id order (the store refuses ids that do not increase); it exits when the
queue is empty and the next checkpoint starts a new one, so an idle checkpointer holds no
thread. A checkpoint is "in flight" from its snapshot until its write has finished.

Periodic checkpoints: one that falls due while any checkpoint is in flight (queued,
being serialised or being written) is dropped, not queued, and counted; the next one is
taken at the next tick after that (kdb+: "overlapping checkpoints will be dropped"). So a
50 ms serialiser under a 20 ms interval costs the operator one snapshot every ~60 ms,
not a 50 ms stall every 20 ms. Interval 0 disables them (kdb+ `KXI_SP_CHECKPOINT_FREQ=0`).

Operator-driven checkpoints (SPL `createCheckpoint`) are never dropped: the snapshot is
taken at once (the runtime: at the end of the chunk that asked), queued behind those in
flight, and the returned `CheckpointRequest` completes when the checkpoint is durable.
The operator waits on it only if it wants to; `create_checkpoint()` is the blocking form.
The queue bound (PENDING_MAX) is the back-pressure: a request beyond it waits, bounded,
for room. The operator can ask its policy and interval (`Checkpointer.policy`,
`OperatorRuntime.checkpoint_policy`, and inside process_chunk `out.checkpoint_policy` /
`out.checkpoint_interval_s`), as SPL's `getCheckpointingInterval()`.

Failures are sticky. A serialiser that raises or returns something other than bytes, or
a store write that fails, fails that checkpoint's handle and every one queued behind it,
and is raised (StreamLogError, the cause chained) on the operator's thread by the next
checkpoint call: the serialiser or the store may be unusable from then on. An exception
of the handler's own checkpoint() is raised at once, on the operator's thread.

The store: checkpoints are key-value pairs (key = sequence id, value = offsets + state)
in an LMDB environment of their own, opened with `sync=True, metasync=True`, so a put
returns only once its transaction is on stable storage, and a crash leaves either the
whole checkpoint or none of it (LMDB commits are atomic). LMDB rather than a streamlog
stream because a checkpoint is read by key ("the latest complete one", "the newest one
that the output still covers"), old ones are deleted, and the log's writer lock would tie
the store to the output log's process. Each value carries an xxh3 checksum so that a
damaged entry is reported (`CorruptionError`) instead of loaded. The store keeps the
newest `keep` checkpoints and deletes older ones in the same transaction.

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
import json
import logging
import math
import os
import struct
import threading
import time
from typing import Any, Callable, Protocol

import lmdb
import xxhash

from .codec import DEFAULT_CODEC
from ..errors import CorruptionError, InvalidArgument, StreamLogError

log = logging.getLogger("streamlog.checkpoint")

_KEY = struct.Struct(">Q")
# Value header: magic, format version, meta length, xxh3_64 of (meta + state).
_HEADER = struct.Struct("<4sHIQ")
_MAGIC = b"SLCK"
_VERSION = 1
assert _HEADER.size == 18
# Bounds: how long close() waits for an in-flight write, how many entries a scan visits.
CLOSE_WAIT_S_MAX = 60.0
STORE_KEEP_MAX = 1024
# How long CheckpointRequest.wait() may be asked to wait, at most.
REQUEST_WAIT_S_MAX = 3600.0
# Checkpoints queued for the worker; each holds a snapshot in memory until written.
PENDING_MAX = 4
# Dropped periodic checkpoints (more than written) before the interval is called unmeetable.
DROPS_BEFORE_WARNING = 8
# Checkpoints one worker thread runs before it hands the queue to a fresh thread.
WORKER_JOBS_MAX = 1 << 16


class StateHandler(Protocol):
    """What an operator implements to be checkpointed (SPL's StateHandler)."""

    def checkpoint(self, ckpt: "Checkpoint") -> None:
        """Set `ckpt.state` to bytes, or call `ckpt.hand_over(snapshot, serialize)` to
        have the snapshot serialised off the operator's thread."""

    def reset(self, ckpt: "Checkpoint") -> None:
        """Replace the operator's state with the one in `ckpt.state` (`ckpt.value()`
        decodes a state handed over with the default codec)."""

    def reset_to_initial_state(self) -> None:
        """Forget all state (no usable checkpoint: replay from the start)."""


@dataclasses.dataclass(slots=True)
class Checkpoint:
    """One checkpoint. `input_offsets` maps "stream/partition" to the next input offset
    to read; `output_offsets` maps "stream/partition" to the output end at the snapshot.
    The handler fills `state` (or calls hand_over()) in checkpoint() and reads it in
    reset(). The snapshot fields are not stored, compared or shown."""

    sequence_id: int
    input_offsets: dict[str, int]
    output_offsets: dict[str, int]
    created_us: int
    state: bytes = b""
    _snapshot: Any = dataclasses.field(default=None, init=False, repr=False, compare=False)
    _serialize: Callable[[Any], bytes] | None = dataclasses.field(
        default=None, init=False, repr=False, compare=False)

    def hand_over(self, snapshot: Any, serialize: Callable[[Any], bytes] | None = None) -> None:
        """Hand the state over, to be serialised on the checkpointer's worker thread.

        Args:
            snapshot: the state as of this checkpoint, which the operator will not
                mutate from now on (a copy, or an immutable value): the worker reads it
                later, while the operator goes on processing.
            serialize: `serialize(snapshot) -> bytes`, run on the worker thread; its
                result is the stored state. None: the default codec
                (`codec.DEFAULT_CODEC.encode`), which `value()` decodes.

        Raises:
            InvalidArgument: called twice, after `state` was set, or `serialize` is not
                callable.
        """
        if self._serialize is not None:
            raise InvalidArgument(f"checkpoint {self.sequence_id}: hand_over() was already "
                                  f"called; hand over one snapshot per checkpoint")
        if self.state:
            raise InvalidArgument(f"checkpoint {self.sequence_id}: ckpt.state is already "
                                  f"set; set the state or call hand_over(), not both")
        if serialize is not None and not callable(serialize):
            raise InvalidArgument(f"serialize must be callable (got {serialize!r})")
        self._snapshot = snapshot
        self._serialize = DEFAULT_CODEC.encode if serialize is None else serialize

    @property
    def handed_over(self) -> bool:
        """True between hand_over() and the serialisation of the snapshot."""
        return self._serialize is not None

    def value(self, deserialize: Callable[[bytes], Any] | None = None) -> Any:
        """The state decoded: `deserialize(state)`, by default the default codec's decode
        (the inverse of `hand_over(snapshot)` without a serializer). For reset().

        Raises:
            CorruptionError: (default codec) the state is not MessagePack it wrote.
        """
        decode = DEFAULT_CODEC.decode if deserialize is None else deserialize
        return decode(self.state)

    def _serialize_snapshot(self) -> None:
        """Worker thread: turn the handed-over snapshot into `state`, drop the snapshot."""
        assert self._serialize is not None
        assert not self.state
        data = self._serialize(self._snapshot)
        if isinstance(data, bytearray):
            data = bytes(data)
        if not isinstance(data, bytes):
            raise InvalidArgument(f"serialize returned a {type(data).__name__}, not bytes")
        self.state = data
        self._snapshot, self._serialize = None, None

    def encode(self) -> bytes:
        assert self.sequence_id > 0
        assert self._serialize is None, "a handed-over snapshot must be serialised first"
        assert isinstance(self.state, (bytes, bytearray)), "checkpoint state must be bytes"
        meta = json.dumps({"inputs": self.input_offsets, "outputs": self.output_offsets,
                           "created_us": self.created_us}, sort_keys=True).encode()
        digest = xxhash.xxh3_64_intdigest(meta + self.state)
        return _HEADER.pack(_MAGIC, _VERSION, len(meta), digest) + meta + bytes(self.state)

    @classmethod
    def decode(cls, sequence_id: int, value: bytes) -> "Checkpoint":
        """Raises CorruptionError for a value that is not a checkpoint this code wrote."""
        if len(value) < _HEADER.size:
            raise CorruptionError(f"checkpoint {sequence_id}: value too short")
        magic, version, meta_bytes, digest = _HEADER.unpack_from(value, 0)
        if magic != _MAGIC or version != _VERSION:
            raise CorruptionError(f"checkpoint {sequence_id}: bad magic or version")
        body = value[_HEADER.size:]
        if meta_bytes > len(body) or xxhash.xxh3_64_intdigest(body) != digest:
            raise CorruptionError(f"checkpoint {sequence_id}: checksum mismatch")
        try:
            meta = json.loads(body[:meta_bytes])
            inputs = {str(k): int(v) for k, v in meta["inputs"].items()}
            outputs = {str(k): int(v) for k, v in meta["outputs"].items()}
            created_us = int(meta["created_us"])
        except (ValueError, KeyError, TypeError, AttributeError):
            raise CorruptionError(f"checkpoint {sequence_id}: bad metadata") from None
        return cls(sequence_id, inputs, outputs, created_us, bytes(body[meta_bytes:]))


class CheckpointRequest:
    """A handle on one operator-driven checkpoint; done once the checkpoint is durable in
    the store, or has failed, or was not taken because checkpointing is disabled.

    `sequence_id` is None until the snapshot is taken (for `out.request_checkpoint()`: when
    the chunk that asked ends), then the checkpoint's id. Completed once, by the
    checkpointer or the runtime (`set_result` / `set_failure`); any thread may wait.
    """

    __slots__ = ("sequence_id", "_requester", "_event", "_checkpoint", "_failure")

    def __init__(self) -> None:
        self.sequence_id: int | None = None
        self._requester = threading.get_ident()
        self._event = threading.Event()
        self._checkpoint: Checkpoint | None = None
        self._failure: StreamLogError | None = None

    def done(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout_s: float = CLOSE_WAIT_S_MAX) -> Checkpoint | None:
        """Block until done.

        Returns:
            the stored Checkpoint (its `state` the stored bytes), or None when
            checkpointing is disabled.

        Raises:
            StreamLogError: the checkpoint failed (the cause chained); it is not done
                after `timeout_s`; or the waiting thread is the one that requested it
                and its snapshot is not taken yet (waiting inside process_chunk would
                never finish: the snapshot is taken after the chunk).
            InvalidArgument: timeout_s outside 0..REQUEST_WAIT_S_MAX.
        """
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not (
                0 <= timeout_s <= REQUEST_WAIT_S_MAX):
            raise InvalidArgument(f"timeout_s must be a number in 0..{REQUEST_WAIT_S_MAX:g} "
                                  f"(got {timeout_s!r})")
        if (not self._event.is_set() and self.sequence_id is None
                and threading.get_ident() == self._requester):
            raise StreamLogError("wait() on a checkpoint request before its snapshot was "
                                 "taken, on the thread that requested it: the snapshot is "
                                 "taken when the current chunk ends, so this would never "
                                 "finish; keep the handle and wait after the chunk")
        if not self._event.wait(timeout_s):
            raise StreamLogError(f"checkpoint {self.sequence_id} was not durable after "
                                 f"{timeout_s:g} s")
        if self._failure is not None:
            raise StreamLogError(str(self._failure)) from self._failure.__cause__
        return self._checkpoint

    def set_result(self, ckpt: Checkpoint | None) -> None:
        """Complete: `ckpt` is durable (None: checkpointing is disabled)."""
        assert not self._event.is_set(), "a checkpoint request completes once"
        assert ckpt is None or ckpt.sequence_id == self.sequence_id
        self._checkpoint = ckpt
        self._event.set()

    def set_failure(self, failure: StreamLogError) -> None:
        """Complete with a failure (raised by wait(), a new exception each time)."""
        assert not self._event.is_set(), "a checkpoint request completes once"
        assert isinstance(failure, StreamLogError)
        self._failure = failure
        self._event.set()

    def __repr__(self) -> str:
        state = ("failed" if self._failure is not None else "done") if self.done() else (
            "pending")
        return f"<CheckpointRequest sequence_id={self.sequence_id} {state}>"


class CheckpointStore:
    """Checkpoints as key-value pairs in an LMDB environment at directory `path`."""

    def __init__(self, path, *, keep: int = 3, map_bytes: int = 1 << 30,
                 readonly: bool = False) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or not 1 <= keep <= STORE_KEEP_MAX:
            raise InvalidArgument(f"keep must be an int in 1..{STORE_KEEP_MAX} (got {keep!r})")
        self.path = os.fspath(path)
        self.keep = keep
        if not readonly:
            os.makedirs(self.path, exist_ok=True)
        try:
            self._env = lmdb.open(self.path, map_size=map_bytes, max_dbs=1, subdir=True,
                                  readonly=readonly, lock=not readonly, sync=True,
                                  metasync=True, readahead=False, create=not readonly)
            self._db = self._env.open_db(b"checkpoints", create=not readonly)
        except lmdb.Error as error:
            raise StreamLogError(f"cannot open checkpoint store {self.path}: {error}") from None
        self._lock = threading.Lock()

    def put(self, ckpt: Checkpoint) -> None:
        """Store `ckpt` durably (returns after the commit is fsynced) and delete all but
        the newest `keep` checkpoints. Sequence ids must increase."""
        value = ckpt.encode()
        with self._lock, self._env.begin(write=True, db=self._db) as txn:
            cursor = txn.cursor()
            if cursor.last():
                newest = _KEY.unpack(cursor.key())[0]
                assert ckpt.sequence_id > newest, "checkpoint sequence ids must increase"
            txn.put(_KEY.pack(ckpt.sequence_id), value)
            keys = [key for key, _ in txn.cursor()]
            for key in keys[:-self.keep]:
                txn.delete(key)

    def sequence_ids(self) -> list[int]:
        with self._env.begin(db=self._db) as txn:
            return [_KEY.unpack(key)[0] for key, _ in txn.cursor()]

    def get(self, sequence_id: int) -> Checkpoint | None:
        with self._env.begin(db=self._db) as txn:
            value = txn.get(_KEY.pack(sequence_id))
        return None if value is None else Checkpoint.decode(sequence_id, value)

    def latest(self, usable: Callable[[Checkpoint], bool] | None = None) -> Checkpoint | None:
        """The newest checkpoint for which `usable(ckpt)` holds (all when None). A damaged
        entry is logged and passed over, so recovery falls back to an older one."""
        for sequence_id in reversed(self.sequence_ids()):
            try:
                ckpt = self.get(sequence_id)
            except CorruptionError as error:
                log.warning("skipping damaged checkpoint: %s", error)
                continue
            if ckpt is not None and (usable is None or usable(ckpt)):
                return ckpt
        return None

    def next_sequence_id(self) -> int:
        ids = self.sequence_ids()
        return ids[-1] + 1 if ids else 1

    def close(self) -> None:
        self._env.close()

    def __enter__(self) -> "CheckpointStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class CheckpointMode(str, enum.Enum):
    DISABLED = "disabled"
    PERIODIC = "periodic"
    OPERATOR_DRIVEN = "operator_driven"


@dataclasses.dataclass(frozen=True, slots=True)
class CheckpointPolicy:
    """When to checkpoint. `periodic(0)` is `disabled()` (kdb+: frequency 0 disables).
    `interval_s` is 0.0 unless the mode is PERIODIC."""

    mode: CheckpointMode
    interval_s: float = 0.0

    @classmethod
    def periodic(cls, interval_s: float) -> "CheckpointPolicy":
        if isinstance(interval_s, bool) or not isinstance(interval_s, (int, float)) or (
                not interval_s >= 0) or not math.isfinite(interval_s):
            raise InvalidArgument(f"interval_s must be a finite number >= 0 "
                                  f"(got {interval_s!r})")
        if interval_s == 0:
            return cls.disabled()
        return cls(CheckpointMode.PERIODIC, float(interval_s))

    @classmethod
    def operator_driven(cls) -> "CheckpointPolicy":
        return cls(CheckpointMode.OPERATOR_DRIVEN)

    @classmethod
    def disabled(cls) -> "CheckpointPolicy":
        return cls(CheckpointMode.DISABLED)


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
        ckpt._serialize_snapshot()
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
