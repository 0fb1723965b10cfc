"""Tumbling, hopping and sliding windows (Azure Stream Analytics' three), by count and by
event time, for user-written window functions, with continuous eventual checkpointing
(DESIGN 8) or checkpoint roll-back (DESIGN 7).

Strategy: the user writes what a window computes, a `WindowFunction` (`open(key,
window) -> state`, `absorb(state, record) -> state`, `close(state, key, window) ->
result`), with state made of plain values that a codec serialises (MessagePack by
default, `codec=` replaces it); the operator decides which windows a record belongs to,
when they close, and how they are saved and recovered. Records are grouped by key (a
record without a key is under b"").

The windows themselves (which records a Tumbling, Hopping or Sliding window holds, and
when the high-water mark, the running max input timestamp, closes it or makes a record
late) are defined in window_functions.py's docstring, beside the assigners.

Results: one DATA record per window emitted: key = group key, timestamp = the timestamp
of the input record being processed, value = the window_cec.py header + the result
(`read_window_results` there decodes them, nobody needs to). A count window's bounds are
input offsets: [first record's offset, last record's offset + 1). Windows still open
when the input ends have written nothing (a time window waits for the high-water mark,
a count window for its last record). The records of one input record come in a fixed
order: what the high-water mark closes first (time windows in (end, key, start) order,
sliding change points in (point, key) order), then for its own key the G_OPENs of what
it opens, then the R's of what it fills; so the output is a function of the input.

Checkpointing: the state is split into *units*, one per open (key, window) for tumbling
and hopping, one per key for sliding; this operator's base, `WindowState`
(window_state.py), holds them and saves them. With CEC (`cec=CECPolicy(...)`) a unit
writes `G_OPEN` when it opens and `G_CHECK` when it has the oldest footprint while the
extent q > Q or the replay u > U, within the CI/CP budget (cec_policy.py), each with its
encoded state, the input offset, N and the high-water mark; a unit closes with a FINAL R
(tumbling, hopping) or a FINAL G_CHECK with no state (a sliding unit's tombstone). A sliding unit by count never closes: N counts every key seen.
`recover_from_output` rebuilds the eventual checkpoint backwards (window_cec.py), loads
it and replays the input from the oldest footprint's input offset + 1; up to the cut a
record is absorbed only by loaded units that have not absorbed it, nothing opens, and no
output is written: it is in the log already. Without CEC, `checkpoint`/`reset` save
every unit for CRB, and plain mode replays everything. Either way the results equal
those of a run without the crash.

Operator contract: the window function must be deterministic and its state must not
depend on anything but the records absorbed (the runtime's contract, runtime.py).

Thread-safety: one thread drives an operator (runtime.py).
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import heapq
import time
from typing import Any, Callable

from ..errors import InvalidArgument
from .cec_policy import CECPolicy, units_due_for_gcheck
from .codec import DEFAULT_CODEC, StateCodec
from .recovery_report import LOAD, RECONSTRUCT, TRUNCATE, RecoveryReport
from .window_cec import (DATA, FLAG_FINAL, FLAG_RAW, G_CHECK, G_OPEN, EventualCheckpoint,
                         OutputHeader, RecoveryPlan, WindowResult, accept_data_loss,
                         encode_output, plan_recovery, read_window_results, reconstruct,
                         report_plan)
from .window_functions import (SLIDING_EVENTS_MAX, SLIDING_RECORDS_MAX,
                               WINDOWS_PER_RECORD_MAX, CollectOffsets, CountRecords, Hopping,
                               Sliding, SumInt64, TopN, Tumbling, Window, WindowFunction,
                               WindowInput)
from .window_state import Buffer, Unit, WindowState

__all__ = ["CollectOffsets", "CountRecords", "Hopping", "SLIDING_EVENTS_MAX",
           "SLIDING_RECORDS_MAX", "Sliding", "SumInt64", "TopN", "Tumbling",
           "WINDOWS_PER_RECORD_MAX", "Window", "WindowFunction", "WindowInput", "WindowResult",
           "WindowStats", "WindowedOperator", "read_window_results"]


@dataclasses.dataclass
class WindowStats:
    results: int = 0
    g_open: int = 0
    g_check: int = 0
    tombstones: int = 0  # sliding units closed (CEC only)
    late_records: int = 0  # dropped: every window they belong to had closed
    late_window_drops: int = 0  # (record, time window) pairs dropped: that window had closed


class _Discard:
    """An output buffer whose records are dropped (a full replay up to the cut)."""

    next_offset = 0

    def emit(self, value, key, timestamp_us, kind=0) -> None:
        pass


class WindowedOperator(WindowState):
    """A window function over tumbling, hopping or sliding windows, for OperatorRuntime.

    Args:
        assigner: Tumbling, Hopping or Sliding.
        function: a WindowFunction (CountRecords, SumInt64, TopN, CollectOffsets or yours).
        cec: a CECPolicy to recover from the output (continuous eventual checkpointing);
            None for CRB (with a CheckpointStore) or plain operation.
        codec: serialises the function's state (footprints, checkpoints) and results that
            are not bytes; default MessagePack (codec.py).
        clock: seconds, monotonic; only the CI/CP budget reads it.

    Raises:
        InvalidArgument: an argument of the wrong kind.
    """

    def __init__(self, assigner, function: WindowFunction, *, cec: CECPolicy | None = None,
                 codec: StateCodec = DEFAULT_CODEC,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not isinstance(assigner, (Tumbling, Hopping, Sliding)):
            raise InvalidArgument(f"assigner must be Tumbling, Hopping or Sliding (got "
                                  f"{type(assigner).__name__})")
        for name in ("open", "absorb", "close"):
            if not callable(getattr(function, name, None)):
                raise InvalidArgument(f"function needs a callable {name}() (WindowFunction)")
        for name in ("encode", "decode"):
            if not callable(getattr(codec, name, None)):
                raise InvalidArgument(f"codec needs a callable {name}() (StateCodec)")
        if cec is not None and not isinstance(cec, CECPolicy):
            raise InvalidArgument(f"cec must be a CECPolicy or None (got {cec!r})")
        self.cec, self.clock = cec, clock
        self.input_source: str | None = None  # "stream/partition", for DataLossError
        self.stats = WindowStats()
        super().__init__(assigner, function, codec)
        self._absorb, self._expire = {
            (False, False): (self._absorb_count, None),
            (False, True): (self._absorb_time, self._expire_windows),
            (True, False): (self._absorb_sliding_count, None),
            (True, True): (self._absorb_sliding_time, self._expire_changes),
        }[(self.sliding, self.by_time)]

    @property
    def recovers_from_output(self) -> bool:
        return self.cec is not None

    def reset_to_initial_state(self) -> None:
        super().reset_to_initial_state()
        self._quiet_through: int | None = None  # records <= it: output is in the log
        self._full_replay = False  # the quiet replay runs without an eventual checkpoint
        self._anchor_due = False  # after a full replay: G_CHECK every unit first
        self._out_next = 0  # the output end at the last background pass

    def extent_records(self) -> int:
        """CEC: output records from the oldest footprint to the output end (q), as of
        the last background pass."""
        return self._out_next - next(iter(self.units.values())).fp_out if self.units else 0

    def replay_records(self) -> int:
        """CEC: input records from the oldest footprint to the last one processed (u)."""
        return self.last_offset - next(iter(self.units.values())).fp_in if self.units else 0

    def required_positions(self) -> tuple[int, int | None]:
        """(oldest input offset, oldest output offset) a recovery from here would read;
        the runtime holds them against retention."""
        if not self.units:
            return self.last_offset + 1, None
        oldest = next(iter(self.units.values()))
        return oldest.fp_in + 1, max(oldest.fp_out, 0)

    # -- the foreground path ---------------------------------------------------------------

    def process_chunk(self, chunk, out) -> None:
        offsets, stamps, values = chunk.offsets, chunk.timestamps_us, chunk.values
        keys = [b"" if key is None else key for key in chunk.keys]
        split = 0
        if self._quiet_through is not None:  # replaying records up to the cut
            split = bisect.bisect_right(offsets, self._quiet_through)
            if split:
                self._replay_quietly(offsets[:split], stamps[:split], keys[:split],
                                     values[:split])
            if split == len(offsets):
                return
            self._end_quiet_replay()
        if self._anchor_due:
            self._emit_anchor(out)
        step = len(offsets)
        if self._checks_enabled():
            step = self.cec.background_every_records  # G_CHECKs may be due in between
        for lo in range(split, len(offsets), step):
            hi = min(len(offsets), lo + step)
            for i in range(lo, hi):
                self._process_record(WindowInput(offsets[i], stamps[i], keys[i], values[i]),
                                     out, False)
            if hi < len(offsets):  # the runtime calls after_chunk after the last slice
                self.after_chunk(out)

    def _process_record(self, record: WindowInput, out, quiet: bool) -> None:
        if record.timestamp_us > self.hwm:
            self.hwm = record.timestamp_us
            if self._expire is not None:
                self._expire(record, out, quiet)
        self._absorb(record, out, quiet)
        self.last_offset, self.last_ts = record.offset, record.timestamp_us

    def _absorb_count(self, record: WindowInput, out, quiet: bool) -> None:
        """Tumbling and hopping by count: every open window of the key absorbs the
        record; a new one opens at every hop-th record of the key."""
        mine = self.by_key.get(record.key)
        if quiet:
            for unit in (mine or {}).values():
                if record.offset > unit.fp_in:
                    self._absorb_into(unit, record)
                    assert unit.count < self.size, "a window open at the cut closes after it"
            return
        newest = next(reversed(mine.values())) if mine else None
        opened = None
        # The key's newest window opened at one of its records j*hop, so its count says
        # where the key is within the hop (hop <= size: a key has a window unless it
        # sits exactly between two tumbling windows).
        if newest is None or newest.count % self.hop == 0:
            state = self.function.open(record.key, Window(record.offset, None))
            opened = self._register(record.key, record.offset, record.offset, record.offset,
                                    state)
            mine = self.by_key[record.key]
        units = list(mine.values())
        for unit in units:
            self._absorb_into(unit, record)
        # Each record's N is the units open right after it: the new window's G_OPEN
        # comes while the full ones are still open, their R's after.
        if opened is not None and opened.count < self.size and self.cec is not None:
            self._footprint(out, G_OPEN, opened, record)
        for unit in units:
            if unit.count >= self.size:
                assert unit.count == self.size
                self._close(unit, record, out)

    def _absorb_time(self, record: WindowInput, out, quiet: bool) -> None:
        """Tumbling and hopping by time: the record's windows [k*hop, k*hop + size) that
        have not closed absorb it; those not open yet open."""
        ts, size, hop = record.timestamp_us, self.size, self.hop
        last_start = ts - ts % hop
        first_start = last_start - ((size - 1 - ts % hop) // hop) * hop
        mine = self.by_key.get(record.key)
        if quiet and not mine:
            return
        absorbed = 0
        for start in range(first_start, last_start + 1, hop):
            if start + size <= self.hwm:
                if not quiet:
                    self.stats.late_window_drops += 1
                continue
            unit = mine.get(start) if mine else None
            if quiet and (unit is None or record.offset <= unit.fp_in):
                continue  # closed by the cut, or absorbed before its footprint
            opened = unit is None
            if opened:
                state = self.function.open(record.key, Window(start, start + size))
                unit = self._register(record.key, start, start, start + size, state)
                heapq.heappush(self.heap, (start + size, record.key, start))
                mine = self.by_key[record.key]
            self._absorb_into(unit, record)
            absorbed += 1
            if opened and self.cec is not None:  # its state after the opening record
                self._footprint(out, G_OPEN, unit, record)
        if not quiet and not absorbed:
            self.stats.late_records += 1

    def _expire_windows(self, record: WindowInput, out, quiet: bool) -> None:
        """Close every time window whose end the high-water mark reached, in (end, key,
        start) order."""
        heap = self.heap
        for _ in range(len(heap)):
            if not heap or heap[0][0] > self.hwm:
                return
            assert not quiet, "a window open at the cut cannot close before it"
            _, key, unit_id = heapq.heappop(heap)
            self._close(self.units[(key, unit_id)], record, out)

    def _absorb_sliding_count(self, record: WindowInput, out, quiet: bool) -> None:
        """Sliding by count: the key's buffer keeps its last `size` records; each record
        emits the window of the buffer."""
        mine = self.by_key.get(record.key)
        unit = next(iter(mine.values())) if mine else None
        if quiet and (unit is None or record.offset <= unit.fp_in):
            return
        opened = unit is None
        if opened:
            events = collections.deque(maxlen=self.size)
            unit = self._register(record.key, record.offset, record.offset, record.offset,
                                  Buffer(events, set()))
        events = unit.state.events
        events.append((record.offset, record.timestamp_us, record.value))
        unit.start, unit.end, unit.count = events[0][0], record.offset + 1, len(events)
        if quiet:
            return
        if opened and self.cec is not None:
            self._footprint(out, G_OPEN, unit, record)
        window = Window(unit.start, unit.end)
        self._emit_result(out, unit, window, self._fold(record.key, window, events),
                          len(events), record, final=False)

    def _absorb_sliding_time(self, record: WindowInput, out, quiet: bool) -> None:
        """Sliding by time: buffer the event, add its change points that are still open
        (its entry t if t >= the high-water mark, its exit t + size)."""
        ts, size = record.timestamp_us, self.size
        if ts + size <= self.hwm:
            if not quiet:
                self.stats.late_records += 1
            return
        mine = self.by_key.get(record.key)
        unit = next(iter(mine.values())) if mine else None
        if quiet and (unit is None or record.offset <= unit.fp_in):
            return
        opened = unit is None
        if opened:
            unit = self._register(record.key, record.offset, record.offset, record.offset,
                                  Buffer([], set()))
        buffer = unit.state
        if len(buffer.events) >= SLIDING_EVENTS_MAX:
            raise InvalidArgument(f"input offset {record.offset}: the sliding window of key "
                                  f"{record.key!r} would hold more than {SLIDING_EVENTS_MAX} "
                                  f"events; use a smaller size")
        buffer.events.append((record.offset, ts, record.value))
        unit.end, unit.count = record.offset + 1, len(buffer.events)
        for change in (ts, ts + size):
            if change >= self.hwm and change not in buffer.pending:
                buffer.pending.add(change)
                heapq.heappush(self.heap, (change, record.key, unit.unit_id))
        if opened and self.cec is not None:
            self._footprint(out, G_OPEN, unit, record)

    def _expire_changes(self, record: WindowInput, out, quiet: bool) -> None:
        """Sliding by time: emit every change point the high-water mark passed, in
        (point, key) order; forget events no later window can hold; close empty units."""
        heap, size = self.heap, self.size
        for _ in range(len(heap)):
            if not heap or heap[0][0] >= self.hwm:
                return
            change, key, unit_id = heapq.heappop(heap)
            unit = self.units[(key, unit_id)]
            buffer = unit.state
            assert change in buffer.pending
            buffer.pending.discard(change)
            if not quiet:
                inside = [e for e in buffer.events if change - size < e[1] <= change]
                if inside:
                    window = Window(change - size + 1, change + 1)
                    self._emit_result(out, unit, window, self._fold(key, window, inside),
                                      len(inside), record, final=False)
            # Later change points are > change: events at or before change - size are
            # in none of them (new ones come at or after the high-water mark).
            buffer.events = [e for e in buffer.events if e[1] > change - size]
            unit.count = len(buffer.events)
            if not buffer.pending:
                assert not buffer.events, "each event's exit point is pending until emitted"
                assert not quiet, "a unit open at the cut stays open until it"
                self._unregister(unit)
                if self.cec is not None:
                    self._emit(out, G_CHECK, FLAG_FINAL, unit, record, b"")
                    self.stats.tombstones += 1

    # -- units, results and footprints -----------------------------------------------------

    def _close(self, unit: Unit, record: WindowInput, out) -> None:
        """Tumbling and hopping: the window is done; its R closes the unit."""
        self._unregister(unit)
        window = Window(unit.start, unit.end)
        self._emit_result(out, unit, window, self.function.close(unit.state, unit.key, window),
                          unit.count, record, final=True)

    def _fold(self, key: bytes, window: Window, events) -> Any:
        """A sliding window's result: the function over the events it holds."""
        state = self.function.open(key, window)
        for offset, ts, value in events:
            state = self.function.absorb(state, WindowInput(offset, ts, key, value))
        return self.function.close(state, key, window)

    def _emit_result(self, out, unit: Unit, window: Window, value, count: int,
                     record: WindowInput, *, final: bool) -> None:
        flags = FLAG_FINAL if final else 0
        if isinstance(value, (bytes, bytearray, memoryview)):
            payload, flags = bytes(value), flags | FLAG_RAW
        else:
            payload = self._encode(value, f"the result of window {window} of key {unit.key!r}")
        header = OutputHeader(flags, record.offset, len(self.units), self.hwm, unit.unit_id,
                              window.start, window.end, count)
        out.emit(encode_output(header, payload), unit.key, record.timestamp_us, DATA)
        self.stats.results += 1

    def _footprint(self, out, kind: int, unit: Unit, record: WindowInput) -> None:
        """G_OPEN or G_CHECK: the unit's state after `record` (DESIGN 8)."""
        self._emit(out, kind, 0, unit, record, self._encode_unit(unit))
        unit.fp_in, unit.fp_out = record.offset, out.next_offset - 1
        if kind == G_OPEN:
            self.stats.g_open += 1
        else:
            self.stats.g_check += 1

    def _emit(self, out, kind: int, flags: int, unit: Unit, record: WindowInput,
              payload: bytes) -> None:
        header = OutputHeader(flags, record.offset, len(self.units), self.hwm, unit.unit_id,
                              unit.start, unit.end, unit.count)
        out.emit(encode_output(header, payload), unit.key, record.timestamp_us, kind)

    # -- the background path: G_CHECK ------------------------------------------------------

    def _checks_enabled(self) -> bool:
        return self.cec is not None and self.cec.writes_gchecks

    def after_chunk(self, out) -> None:
        self._out_next = out.next_offset
        if not self._checks_enabled() or not self.units or self._quiet_through is not None:
            return
        allowed, deadline = self.cec.budget(self.clock())
        if not allowed:
            return
        self._emit_gchecks(out, deadline)
        self._out_next = out.next_offset

    def _emit_gchecks(self, out, deadline: float | None) -> None:
        """G_CHECK the units with the oldest footprint while q > Q or u > U."""
        now = WindowInput(self.last_offset, self.last_ts, b"", b"")
        for identity, unit in units_due_for_gcheck(
                self.cec, self.units, out, last_offset=self.last_offset,
                q_target=self.cec.q_target, clock=self.clock, deadline=deadline):
            self._footprint(out, G_CHECK, unit, now)
            self.units.move_to_end(identity)

    def _emit_anchor(self, out) -> None:
        """After a full replay the units' footprints are unknown: G_CHECK them all, so
        the next recovery finds an eventual checkpoint again."""
        self._anchor_due = False
        now = WindowInput(self.last_offset, self.last_ts, b"", b"")
        for identity, unit in list(self.units.items()):
            self._footprint(out, G_CHECK, unit, now)
            self.units.move_to_end(identity)

    # -- CEC recovery: rebuild the eventual checkpoint from the output ---------------------

    def recover_from_output(self, target, input_start: int, report: RecoveryReport, *,
                            fail_on_data_loss: bool = True, source: str | None = None,
                            dry_run: bool = False) -> int:
        """CEC recovery (module docstring, window_cec.py). Returns the input offset to
        replay from.

        Raises:
            DataLossError: exactness needs input offsets below `input_start` (removed by
                retention), unless fail_on_data_loss is False: then recovery continues
                from input_start, logs a warning naming the offsets lost and notes them
                in the report.
            CorruptionError: the output holds records this operator did not write.
        """
        if self.cec is None:
            raise InvalidArgument("recover_from_output needs CEC: pass cec=CECPolicy(...)")
        source = source or self.input_source or "input"
        self.reset_to_initial_state()
        with report.phase(RECONSTRUCT):
            found = reconstruct(target.log, target.stream, target.partition, report)
        plan = plan_recovery(found, input_start, f"{target.stream}/{target.partition}")
        report_plan(found, plan, report)
        if dry_run:  # report what would happen, change nothing
            if plan.lost is not None:
                report.input_offsets_lost = plan.lost
                report.note(f"would need input {source} offsets {plan.lost[0]}.."
                            f"{plan.lost[1]}, which are gone: {plan.why}")
            return plan.start
        if plan.lost is not None:  # decided before anything is truncated
            accept_data_loss(plan, source, fail_on_data_loss, report)
        with report.phase(TRUNCATE):
            if found.cut_output < found.end_offset:
                target.log.truncate_after(target.stream, target.partition, found.cut_output - 1)
        with report.phase(LOAD):
            self._load(found, plan, report)
        return plan.start

    def _load(self, found: EventualCheckpoint, plan: RecoveryPlan,
              report: RecoveryReport) -> None:
        if plan.loads:
            self._load_footprints(found.footprints, report)
            assert len(self.units) == found.last.n_open
        self.hwm = plan.hwm_us
        self.last_offset = plan.start - 1
        if found.cut is not None and found.cut >= plan.start:
            self._quiet_through = found.cut
            self._full_replay = plan.full_replay

    def _replay_quietly(self, offsets, stamps, keys, values) -> None:
        """Records <= the cut: their output is in the log already. With an eventual
        checkpoint a record goes only to loaded units that have not absorbed it (their
        footprint's input offset); a full replay processes normally into the void."""
        records = map(WindowInput, offsets, stamps, keys, values)
        if not self._full_replay:
            for record in records:
                self._process_record(record, None, True)
            return
        stats, self.stats = self.stats, WindowStats()  # the crashed run counted these
        try:
            scratch = _Discard()
            for record in records:
                self._process_record(record, scratch, False)
        finally:
            self.stats = stats

    def _end_quiet_replay(self) -> None:
        if self._full_replay:
            for unit in self.units.values():  # footprints unknown: hold all input
                unit.fp_in, unit.fp_out = -1, 0
            self._anchor_due = bool(self.units)
        self._quiet_through = None
        self._full_replay = False
