"""When an operator is checkpointed (DESIGN 7): the `CheckpointPolicy` (periodic,
operator-driven or disabled), and the `CheckpointRequest` handle of a checkpoint an
operator asks for.

Strategy: kdb+'s and SPL's knobs. A periodic policy takes a checkpoint every
`interval_s` seconds, at a chunk boundary; interval 0 disables it (kdb+
`KXI_SP_CHECKPOINT_FREQ=0`). An operator-driven checkpoint (SPL `createCheckpoint`)
is asked for by the operator (`out.request_checkpoint()` inside a chunk, or the
runtime's `request_checkpoint()` between chunks) and is never dropped; the request
returns at once with a `CheckpointRequest`, done once the checkpoint is durable in the
store, or has failed, or was not taken because checkpointing is disabled. The operator
waits on it only if it wants to. The operator can ask its policy and interval, as SPL's
`getCheckpointingInterval()` (`out.checkpoint_policy`, `out.checkpoint_interval_s`).

Thread-safety: a CheckpointPolicy is immutable. A CheckpointRequest is completed once,
by the checkpointer or the runtime, and may be waited on from any thread.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import threading

from ..errors import InvalidArgument, StreamLogError
from .checkpoint_value import Checkpoint

# Bounds: how long close() waits for an in-flight write (and a request's wait(), by
# default); how long CheckpointRequest.wait() may be asked to wait, at most.
CLOSE_WAIT_S_MAX = 60.0
REQUEST_WAIT_S_MAX = 3600.0


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

