"""A window operator's state (windows.py runs the operator): its open units, in footprint
order, and how a unit is saved and loaded, in a CEC footprint or a CRB checkpoint.

Strategy: the state is split into *units*, one per open (key, window) for tumbling and
hopping assigners (the user's window-function state), one per key for sliding ones (the
key's buffer of events not yet expired, since a sliding window's content is only known
when it is emitted; its result is the function folded over the buffer). A unit is named
by (key, unit_id) and that identity is never reused. `WindowState` keeps them three
ways: `units` in footprint order, oldest first (with CEC the G_CHECK candidates come
first, and the same dict serves the lookups), `by_key` (each key's units, oldest first)
and, by time, `heap` (the next window end or change point, to close or emit in order).

A unit's state goes through the operator's codec (MessagePack by default, codec.py) for
a footprint's payload; a sliding buffer is the operator's own structure and always goes
through the default codec. A CRB checkpoint is a magic followed by the high-water mark,
the last offset and time, and every open unit with its encoded state. Loading a unit
(from a checkpoint or a footprint) checks what the assigner promises: a time window is
`size` long, an open count window holds fewer than `size` records, no unit comes twice.

`WindowState` is the base of WindowedOperator: it holds and saves the state, and the
operator decides what happens to it.

Thread-safety: one thread drives an operator (runtime.py).
"""

from __future__ import annotations

import collections
import heapq
from typing import Any

from ..errors import CorruptionError, InvalidArgument, StreamLogError
from .codec import DEFAULT_CODEC, StateCodec
from .window_cec import NO_HWM
from .window_functions import Sliding, WindowFunction, WindowInput

_CHECKPOINT_MAGIC = b"SWC1"


class Unit:
    """One open unit (module docstring). start / end: the window's bounds (time), the
    first and last + 1 input offsets (count), the buffer's (sliding). fp_in / fp_out:
    input and output offsets of its newest footprint (CEC)."""

    __slots__ = ("key", "unit_id", "start", "end", "count", "state", "fp_in", "fp_out")

    def __init__(self, key: bytes, unit_id: int, start: int, end: int, state: Any) -> None:
        self.key, self.unit_id, self.start, self.end = key, unit_id, start, end
        self.count = 0
        self.state = state
        self.fp_in, self.fp_out = -1, -1


class Buffer:
    """A sliding unit's state: events (offset, timestamp_us, value) in input order, and
    by time the change points not emitted yet."""

    __slots__ = ("events", "pending")

    def __init__(self, events, pending: set[int]) -> None:
        self.events = events
        self.pending = pending


class WindowState:
    """The open units of a window operator and how they are saved (module docstring).

    Args:
        assigner: Tumbling, Hopping or Sliding.
        function: the WindowFunction the units' state belongs to.
        codec: serialises the function's state.
    """

    def __init__(self, assigner, function: WindowFunction, codec: StateCodec) -> None:
        self.assigner, self.function, self.codec = assigner, function, codec
        self.size, self.hop = assigner.size, assigner.hop
        self.by_time = assigner.by == "time"
        self.sliding = isinstance(assigner, Sliding)
        self.reset_to_initial_state()

    def reset_to_initial_state(self) -> None:
        # With CEC, `units` is kept in footprint order, oldest first: the G_CHECK
        # candidates come first, and the same dict serves the lookups.
        self.units: collections.OrderedDict[tuple[bytes, int], Unit] = (
            collections.OrderedDict())
        self.by_key: dict[bytes, dict[int, Unit]] = {}  # each key's units, oldest first
        # By time: (end, key, unit_id) of open windows, or (change point, key, unit_id).
        self.heap: list[tuple[int, bytes, int]] = []
        self.hwm = NO_HWM
        self.last_offset = -1  # the input offset processed last (t_now)
        self.last_ts = NO_HWM

    def open_units(self) -> int:
        return len(self.units)

    def _register(self, key: bytes, unit_id: int, start: int, end: int, state) -> Unit:
        unit = Unit(key, unit_id, start, end, state)
        assert (key, unit_id) not in self.units, "a unit identity is never reused"
        self.units[(key, unit_id)] = unit
        self.by_key.setdefault(key, {})[unit_id] = unit
        return unit

    def _unregister(self, unit: Unit) -> None:
        del self.units[(unit.key, unit.unit_id)]
        mine = self.by_key[unit.key]
        del mine[unit.unit_id]
        if not mine:
            del self.by_key[unit.key]

    def _absorb_into(self, unit: Unit, record: WindowInput) -> None:
        unit.state = self.function.absorb(unit.state, record)
        unit.count += 1
        if not self.by_time:
            unit.end = record.offset + 1

    def _encode(self, value, what: str) -> bytes:
        try:
            data = self.codec.encode(value)
        except StreamLogError:
            raise
        except Exception as error:  # a user's codec: say which value it refused
            raise InvalidArgument(f"the codec cannot encode {what}: {error}") from error
        if not isinstance(data, (bytes, bytearray)):
            raise InvalidArgument(f"codec.encode returned a {type(data).__name__}, not bytes")
        return bytes(data)

    def _encode_unit(self, unit: Unit) -> bytes:
        if self.sliding:  # the operator's own structure: always the default codec
            events = [[offset, ts, value] for offset, ts, value in unit.state.events]
            return DEFAULT_CODEC.encode([events, sorted(unit.state.pending)])
        return self._encode(unit.state, f"the state of window {unit.start} of key {unit.key!r}")

    def _decode_unit(self, payload: bytes, where: str):
        if not self.sliding:
            try:
                return self.codec.decode(payload)
            except StreamLogError:
                raise
            except Exception as error:
                raise CorruptionError(f"{where}: the codec cannot decode a window state: "
                                      f"{error}") from error
        body = DEFAULT_CODEC.decode(payload)
        try:
            events, pending = body
            events = [(int(o), int(t), bytes(v)) for o, t, v in events]
            pending = {int(change) for change in pending}
        except (TypeError, ValueError):
            raise CorruptionError(f"{where}: not a sliding window buffer") from None
        if not self.by_time:
            return Buffer(collections.deque(events, maxlen=self.size), set())
        return Buffer(events, pending)

    # -- CRB: checkpoint and reset ---------------------------------------------------------

    def checkpoint(self, ckpt) -> None:
        """Every open unit (its state through the codec), the high-water mark and the
        last offset."""
        units = [[u.key, u.unit_id, u.start, u.end, u.count, self._encode_unit(u)]
                 for u in self.units.values()]
        ckpt.state = _CHECKPOINT_MAGIC + DEFAULT_CODEC.encode(
            [self.hwm, self.last_offset, self.last_ts, units])

    def reset(self, ckpt) -> None:
        """Raises CorruptionError for a state this operator did not write."""
        data = bytes(ckpt.state)
        if not data.startswith(_CHECKPOINT_MAGIC):
            raise CorruptionError("not a window operator checkpoint")
        body = DEFAULT_CODEC.decode(data[len(_CHECKPOINT_MAGIC):])
        try:
            hwm, last_offset, last_ts, units = body
            rows = [(bytes(k), int(i), int(s), int(e), int(c), bytes(p))
                    for k, i, s, e, c, p in units]
        except (TypeError, ValueError):
            raise CorruptionError("window operator checkpoint has the wrong shape") from None
        self.reset_to_initial_state()
        self.hwm, self.last_offset, self.last_ts = int(hwm), int(last_offset), int(last_ts)
        for key, unit_id, start, end, count, payload in rows:
            self._load_unit(key, unit_id, start, end, count, payload, "checkpoint")
        heapq.heapify(self.heap)

    def _load_unit(self, key: bytes, unit_id: int, start: int, end: int, count: int,
                   payload: bytes, where: str) -> Unit:
        state = self._decode_unit(payload, where)
        if not self.sliding and self.by_time and end - start != self.size:
            raise CorruptionError(f"{where}: window [{start}, {end}) is not {self.size} long")
        if not self.sliding and not self.by_time and not 0 < count < self.size:
            raise CorruptionError(f"{where}: an open window of {count} records (size "
                                  f"{self.size})")
        if (key, unit_id) in self.units:
            raise CorruptionError(f"{where}: window {unit_id} of key {key!r} twice")
        unit = self._register(key, unit_id, start, end, state)
        unit.count = count
        if self.by_time and not self.sliding:
            self.heap.append((end, key, unit_id))
        elif self.by_time:
            self.heap.extend((change, key, unit_id) for change in state.pending)
        return unit

    def _load_footprints(self, footprints, report) -> None:
        """Load the units of an eventual checkpoint (window_cec.Footprint), oldest
        footprint first, each remembering its footprint's offsets; the state bytes
        loaded are counted in the report (a RecoveryReport)."""
        for footprint in sorted(footprints, key=lambda f: f.output_offset):
            h = footprint.header
            unit = self._load_unit(footprint.key, h.unit_id, h.window_start, h.window_end,
                                   h.count, footprint.payload,
                                   f"output offset {footprint.output_offset}")
            unit.fp_in, unit.fp_out = h.in_offset, footprint.output_offset
            report.state_bytes_loaded += len(footprint.payload)
        heapq.heapify(self.heap)
