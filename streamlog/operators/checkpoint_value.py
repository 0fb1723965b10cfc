"""A checkpoint as an operator sees it (DESIGN 7): the `StateHandler` protocol an operator
implements, and the `Checkpoint` value it fills, with the bytes a store keeps of it.

Strategy: the SPL seed's split. An operator implements `StateHandler`
(`checkpoint(ckpt)`, `reset(ckpt)`, `reset_to_initial_state()`); the runtime decides when
to checkpoint and what to reset from (checkpoint.py, runtime.py). A `Checkpoint` carries
an increasing sequence id, the input offsets it corresponds to (the next offset to read,
per input partition), the output offsets (the output end, per output partition) and the
operator's serialized state as bytes.

In `checkpoint()` the handler either sets `ckpt.state` to bytes (it serialises inline),
or calls `ckpt.hand_over(snapshot, serialize)` with a value it will not mutate again (a
shallow copy, an immutable value) and the function that turns it into bytes (None: the
default codec, MessagePack, which `ckpt.value()` decodes in reset()). The checkpointer's
worker thread then calls `serialize_snapshot()`, off the operator's thread.

Stored form (`encode` / `decode`): a little-endian header (magic b"SLCK", format
version, metadata length, xxh3_64 of metadata + state), the metadata as JSON (input and
output offsets, creation time), then the state. The checksum covers everything after
the header, so a damaged entry is reported (`CorruptionError`) instead of loaded.

Thread-safety: a Checkpoint is filled on the operator's thread, serialised on the
checkpointer's worker thread after it is handed over, and read-only after that.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from typing import Any, Callable, Protocol

import xxhash

from ..errors import CorruptionError, InvalidArgument
from .codec import DEFAULT_CODEC

# Value header: magic, format version, meta length, xxh3_64 of (meta + state).
_HEADER = struct.Struct("<4sHIQ")
_MAGIC = b"SLCK"
_VERSION = 1
assert _HEADER.size == 18


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

    def serialize_snapshot(self) -> None:
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

