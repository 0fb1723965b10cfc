"""Operator checkpoints (DESIGN 7): the state-handler protocol, a durable checkpoint
store, and periodic / operator-driven / disabled checkpointing.

Strategy: the SPL seed's split. An operator implements `StateHandler`
(`checkpoint(ckpt)`, `reset(ckpt)`, `reset_to_initial_state()`); the runtime decides when
to checkpoint and what to reset from. A `Checkpoint` carries an increasing sequence id,
the input offsets it corresponds to (the next offset to read, per input partition), the
output offsets (the output end, per output partition) and the operator's serialized
state as bytes.

Taking a checkpoint has two steps. The snapshot (`handler.checkpoint(ckpt)`) runs on the
operator's thread between records, so the state is consistent with the offsets without
any locking or copy-on-write. The durable write runs on a background thread, so tuple
processing goes on while the bytes reach the disk (kdb+ seed). A periodic checkpoint that
falls due while the previous write is still in flight is dropped, not queued: the next
one is taken at the next tick after the write finished (kdb+: "overlapping checkpoints
will be dropped"). Operator-driven checkpoints are synchronous (SPL `createCheckpoint`):
they wait for an in-flight write, then write their own before returning. Interval 0
disables periodic checkpointing (kdb+ `KXI_SP_CHECKPOINT_FREQ=0`).

The store: checkpoints are key-value pairs (key = sequence id, value = offsets + state)
in an LMDB environment of their own, opened with `sync=True, metasync=True`, so a put
returns only once its transaction is on stable storage, and a crash leaves either the
whole checkpoint or none of it (LMDB commits are atomic). LMDB rather than a streamlog
stream because a checkpoint is read by key ("the latest complete one", "the newest one
that the output still covers"), old ones are deleted, and the log's writer lock would tie
the store to the output log's process. Each value carries an xxh3 checksum so that a
damaged entry is reported (`CorruptionError`) instead of loaded. The store keeps the
newest `keep` checkpoints and deletes older ones in the same transaction.

Thread-safety: one operator thread calls the Checkpointer; its background thread only
calls `CheckpointStore.put`. Store reads may come from any thread.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import os
import struct
import threading
import time
from typing import Callable, Protocol

import lmdb
import xxhash

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


class StateHandler(Protocol):
    """What an operator implements to be checkpointed (SPL's StateHandler)."""

    def checkpoint(self, ckpt: "Checkpoint") -> None:
        """Serialize the operator's state into `ckpt.state` (bytes)."""

    def reset(self, ckpt: "Checkpoint") -> None:
        """Replace the operator's state with the one in `ckpt.state`."""

    def reset_to_initial_state(self) -> None:
        """Forget all state (no usable checkpoint: replay from the start)."""


@dataclasses.dataclass(slots=True)
class Checkpoint:
    """One checkpoint. `input_offsets` maps "stream/partition" to the next input offset
    to read; `output_offsets` maps "stream/partition" to the output end at the snapshot.
    The handler fills `state` in checkpoint() and reads it in reset()."""

    sequence_id: int
    input_offsets: dict[str, int]
    output_offsets: dict[str, int]
    created_us: int
    state: bytes = b""

    def encode(self) -> bytes:
        assert self.sequence_id > 0
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
    """When to checkpoint. `periodic(0)` is `disabled()` (kdb+: frequency 0 disables)."""

    mode: CheckpointMode
    interval_s: float = 0.0

    @classmethod
    def periodic(cls, interval_s: float) -> "CheckpointPolicy":
        if isinstance(interval_s, bool) or not isinstance(interval_s, (int, float)) or (
                interval_s < 0):
            raise InvalidArgument(f"interval_s must be a number >= 0 (got {interval_s!r})")
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
    started: int = 0
    written: int = 0
    dropped: int = 0
    last_sequence_id: int = 0
    state_bytes: int = 0
    snapshot_seconds: float = 0.0
    write_seconds: float = 0.0


class Checkpointer:
    """Takes checkpoints of one StateHandler into one store under a policy.

    `maybe_periodic(inputs, outputs)` is called by the runtime between records (cheap
    when not due); `create_checkpoint(inputs, outputs)` is the operator-driven request.
    Both run the snapshot on the caller's thread; periodic writes finish in the
    background. Errors of a background write are raised by the next call (sticky).
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
        self._in_flight: Checkpoint | None = None
        self._error: BaseException | None = None
        self._next_due = (clock() + policy.interval_s
                          if policy.mode is CheckpointMode.PERIODIC else None)

    @property
    def in_flight(self) -> bool:
        with self._cond:
            return self._in_flight is not None

    def maybe_periodic(self, input_offsets: dict[str, int],
                       output_offsets: dict[str, int]) -> Outcome:
        """Start a periodic checkpoint if one is due; drop it if the previous one is
        still being written."""
        if self._next_due is None:
            return Outcome.DISABLED
        now = self.clock()
        if now < self._next_due:
            return Outcome.NOT_DUE
        interval = self.policy.interval_s
        ticks = int((now - self._next_due) // interval) + 1
        self._next_due += ticks * interval  # the next tick after now; missed ticks are gone
        assert self._next_due > now
        self._raise_error()
        with self._cond:
            busy = self._in_flight is not None
        if busy:
            self.stats.dropped += 1
            log.info("periodic checkpoint dropped: the previous one is still being written")
            return Outcome.DROPPED
        ckpt = self._snapshot(input_offsets, output_offsets)
        if self.background:
            self._start_write(ckpt)
        else:
            self._write(ckpt)
        return Outcome.STARTED

    def create_checkpoint(self, input_offsets: dict[str, int],
                          output_offsets: dict[str, int]) -> Checkpoint | None:
        """Operator-driven checkpoint: synchronous; returns the stored checkpoint, or None
        when checkpointing is disabled. Waits for an in-flight periodic write first."""
        if self.policy.mode is CheckpointMode.DISABLED:
            return None
        self.wait()
        ckpt = self._snapshot(input_offsets, output_offsets)
        self._write(ckpt)
        return ckpt

    def wait(self, timeout_s: float = CLOSE_WAIT_S_MAX) -> None:
        """Block until no write is in flight; raise a background write's error."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._in_flight is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise StreamLogError("a checkpoint write did not finish in time")
                self._cond.wait(remaining)
        self._raise_error()

    def close(self) -> None:
        self.wait()

    # -- internals ------------------------------------------------------------------

    def _snapshot(self, input_offsets, output_offsets) -> Checkpoint:
        started = time.perf_counter()
        ckpt = Checkpoint(self._next_id, dict(input_offsets), dict(output_offsets),
                          time.time_ns() // 1000)
        self._next_id += 1
        self.handler.checkpoint(ckpt)
        if not isinstance(ckpt.state, (bytes, bytearray)):
            raise InvalidArgument("StateHandler.checkpoint must set ckpt.state to bytes")
        self.stats.started += 1
        self.stats.snapshot_seconds += time.perf_counter() - started
        return ckpt

    def _start_write(self, ckpt: Checkpoint) -> None:
        with self._cond:
            assert self._in_flight is None
            self._in_flight = ckpt
        threading.Thread(target=self._write_in_background, args=(ckpt,),
                         name=f"checkpoint-{ckpt.sequence_id}", daemon=True).start()

    def _write_in_background(self, ckpt: Checkpoint) -> None:
        try:
            self._write(ckpt)
        except BaseException as error:  # noqa: BLE001 (raised on the operator's thread)
            self._error = error
        finally:
            with self._cond:
                self._in_flight = None
                self._cond.notify_all()

    def _write(self, ckpt: Checkpoint) -> None:
        started = time.perf_counter()
        self.store.put(ckpt)
        self.stats.write_seconds += time.perf_counter() - started
        self.stats.written += 1
        self.stats.last_sequence_id = ckpt.sequence_id
        self.stats.state_bytes = len(ckpt.state)

    def _raise_error(self) -> None:
        if self._error is not None:  # sticky: the store may be unusable from now on
            raise StreamLogError(f"a checkpoint write failed: {self._error}") from self._error
