"""What the runtime (runtime.py) and an operator hand each other: the `Operator` protocol
the runtime calls, the `InputChunk` it passes in, the `OutputBuffer` the operator emits
into, and the `OutputTarget` a CEC operator recovers from.

Strategy: the runtime owns positions and durability, the operator owns state and output
records, and these values are the whole boundary between them. A chunk is a slice of
consecutive input records (an Arrow batch, with the columns an operator reads most as
Python lists); the output buffer collects what the operator emits for one chunk, control
kinds interleaved in order, and the runtime appends it in one `append_batch` when the
chunk ends. `next_offset` is the output offset the next emitted record will get, which
CEC's extent bookkeeping needs. An operator asks for a checkpoint through the buffer
(`request_checkpoint`), and the runtime takes it when the chunk ends.

Thread-safety: a chunk and an output buffer belong to the runtime's thread.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import pyarrow as pa

from ..records import RecordKind
from .checkpoint_policy import CheckpointPolicy, CheckpointRequest
from .checkpoint_value import Checkpoint


class InputChunk:
    """Consecutive data records of the input partition, as Python lists. `batch` is the
    Arrow slice (columns partition, offset, timestamp, key, value) for vectorised
    operators; `values` is only built if asked for."""

    __slots__ = ("offsets", "timestamps_us", "keys", "batch", "_values")

    def __init__(self, batch: pa.RecordBatch) -> None:
        self.batch = batch
        self.offsets: list[int] = batch.column(1).to_numpy().tolist()
        self.timestamps_us: list[int] = batch.column(2).view(pa.int64()).to_numpy().tolist()
        self.keys: list = batch.column(3).to_pylist()
        self._values: list | None = None

    @property
    def values(self) -> list[bytes]:
        if self._values is None:
            self._values = self.batch.column(4).to_pylist()
        return self._values

    def __len__(self) -> int:
        return len(self.offsets)


class OutputBuffer:
    """Output records of the current chunk, appended together when it ends.

    `next_offset` is the output offset the next emitted record will get (the operator
    needs it for CEC's extent bookkeeping)."""

    __slots__ = ("base_offset", "values", "keys", "timestamps_us", "kinds", "has_control",
                 "checkpoint_requested", "checkpoint_policy", "_checkpoint_request")

    def __init__(self, base_offset: int) -> None:
        self.base_offset = base_offset
        self.values: list[bytes] = []
        self.keys: list = []
        self.timestamps_us: list[int] = []
        self.kinds: list[int] = []
        self.has_control = False
        self.checkpoint_requested = False
        # Set by the runtime (SPL's getCheckpointingInterval); a lone buffer has none.
        self.checkpoint_policy = CheckpointPolicy.disabled()
        self._checkpoint_request: CheckpointRequest | None = None

    @property
    def next_offset(self) -> int:
        return self.base_offset + len(self.values)

    def emit(self, value: bytes, key: bytes | None, timestamp_us: int,
             kind: int = RecordKind.DATA) -> None:
        self.values.append(value)
        self.keys.append(key)
        self.timestamps_us.append(timestamp_us)
        self.kinds.append(kind)
        if kind:
            self.has_control = True

    def request_checkpoint(self) -> CheckpointRequest:
        """Operator-driven checkpoint, taken when the current chunk ends (with the offsets
        of that boundary); its serialisation and store write then run in the background.

        Returns:
            a handle, done once the checkpoint is durable (`done()`, `wait(timeout_s)`
            -> the Checkpoint, `sequence_id` once the chunk has ended). Requests in one
            chunk share one checkpoint and one handle. With checkpointing disabled it
            completes at the chunk end and wait() returns None. Do not wait on it inside
            this chunk: its snapshot is taken after process_chunk returns.
        """
        self.checkpoint_requested = True
        if self._checkpoint_request is None:
            self._checkpoint_request = CheckpointRequest()
        return self._checkpoint_request

    def take_checkpoint_request(self) -> CheckpointRequest | None:
        """The runtime's side: the request of the chunk that ended (None: none), cleared."""
        request = self._checkpoint_request
        if request is None and self.checkpoint_requested:  # the flag set directly
            request = CheckpointRequest()
        self._checkpoint_request = None
        self.checkpoint_requested = False
        return request

    @property
    def checkpoint_interval_s(self) -> float:
        """The periodic checkpoint interval in seconds; 0.0 unless the policy
        (`checkpoint_policy`, set by the runtime) is periodic."""
        return self.checkpoint_policy.interval_s

    def reset(self, base_offset: int) -> None:
        self.base_offset = base_offset
        self.values, self.keys, self.timestamps_us, self.kinds = [], [], [], []
        self.has_control = False


class Operator(Protocol):
    def process_chunk(self, chunk: InputChunk, out: OutputBuffer) -> None: ...

    def checkpoint(self, ckpt: Checkpoint) -> None: ...

    def reset(self, ckpt: Checkpoint) -> None: ...

    def reset_to_initial_state(self) -> None: ...


@dataclasses.dataclass(frozen=True, slots=True)
class OutputTarget:
    """The output partition, as handed to an operator that recovers from its output."""

    log: object
    stream: str
    partition: int

