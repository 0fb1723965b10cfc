"""The windowed aggregate operator, with continuous eventual checkpointing (DESIGN 8).

Strategy: the CEC paper's case study. `AggregateOperator` groups input records by key
into tumbling windows, count-based (a window closes when it holds `size` records) or
time-based (windows [k*size, (k+1)*size) of event time, closed when the operator's
high-water mark, the running max input timestamp, reaches their end; a record whose
window has already closed is late and dropped, and counted). A key has at most one open
window. A closing window emits a result `R` (count, sum, min, max, average).

It runs three ways: plain (results only, nothing to recover from but a full replay),
CRB (`checkpoint`/`reset` serialize every open window; the runtime stores them), or CEC
(`cec=CECPolicy(...)`): every window that opens emits a `G_OPEN` footprint (but a count
window of one record, which opens and closes on the same input record, is never open at
a cut and writes only its R), and the background path (`after_chunk`) emits `G_CHECK`
footprints for the windows with the oldest footprint while the extent or the replay is
over its target, within the CI/CP time budget (cec_policy.py; the background path runs
every `background_every_records` input records and when the runtime's chunk ends). The
footprints are control records (RecordKind.G_OPEN / G_CHECK) interleaved in order with
the `R`s in the output partition, so a data reader never sees them.

Every output record (R or footprint) has the group key as its key, the timestamp of the
input record being processed (t_now) as its timestamp, and the value layout
`WINDOW_RECORD` (aggregate_records.py). Positions are input offsets, never timestamps
(DESIGN 5: equal timestamps are ambiguous).

Recovery (`recover_from_output`) rebuilds the eventual checkpoint from the output
(aggregate_recovery.py: the walk, and where the replay starts), truncates the records of
the last input offset, loads the windows, then replays quietly up to the cut: a record
is applied only to an open window that has not absorbed it, and no output is produced.

The module is one class because the paper's algorithm is one state machine: the open
windows, their footprint order, Q/U and the quiet replay share its state. What is not
that state is elsewhere: the byte layouts, the backward walk, the G_CHECK policy, and
running it as a job (cec.py).

Thread-safety: one thread drives an operator (runtime.py).
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import heapq
import logging
import time
from typing import Callable

import numpy as np

from ..errors import DataLossError, InvalidArgument
from ..records import RecordKind
from .aggregate_records import (WINDOW_RECORD, Window, decode_state_header,
                                decode_state_windows, encode_state)
from .aggregate_recovery import (EventualCheckpoint, ScratchOutput, gc_paused, loss_reason,
                                 reconstruct, replay_start)
from .cec_policy import CECPolicy, units_due_for_gcheck
from .recovery_report import LOAD, RECONSTRUCT, TRUNCATE, RecoveryReport, recovery_log

_NO_HWM = -(1 << 63)
operators_log = logging.getLogger("streamlog.operators")
_G_OPEN, _G_CHECK, _DATA = int(RecordKind.G_OPEN), int(RecordKind.G_CHECK), 0


@dataclasses.dataclass(frozen=True, slots=True)
class WindowSpec:
    """`kind` "count" (size = records) or "time" (size = microseconds)."""

    kind: str
    size: int

    def __post_init__(self) -> None:
        if self.kind not in ("count", "time"):
            raise InvalidArgument(f"window kind must be 'count' or 'time' (got {self.kind!r})")
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise InvalidArgument(f"window size must be a positive int (got {self.size!r})")

    @classmethod
    def count(cls, records: int) -> "WindowSpec":
        return cls("count", records)

    @classmethod
    def time(cls, size_us: int) -> "WindowSpec":
        return cls("time", size_us)


@dataclasses.dataclass
class AggregateStats:
    results: int = 0
    g_open: int = 0
    g_check: int = 0
    late_records: int = 0
    q_raised_to: int = 0  # the Q actually used when the one asked for could not be met


class AggregateOperator:
    """count / sum / min / max / avg of a numeric field per key over tumbling windows.

    Args:
        window: a WindowSpec.
        cec: a CECPolicy to run with continuous eventual checkpointing; None for plain
            or CRB operation.
        value_of: bytes -> int for the aggregated field; the default reads the first 8
            bytes of the value as a little-endian int64 (vectorised). Sums must stay
            within int64.
        clock: seconds, monotonic; only the CI/CP budget reads it.
    """

    def __init__(self, window: WindowSpec, *, cec: CECPolicy | None = None,
                 value_of: Callable[[bytes], int] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self.cec = cec
        self.value_of = value_of
        self.clock = clock
        self.stats = AggregateStats()
        self._warned_q = False
        if cec is not None and cec.u_target is not None and (
                cec.u_target < cec.background_every_records):
            operators_log.warning(
                "CEC: U=%d cannot be met: G_CHECKs are decided every %d input records "
                "(background_every_records), so the replay grows past U between two "
                "decisions; set background_every_records <= U", cec.u_target,
                cec.background_every_records)
        self.reset_to_initial_state()

    @property
    def recovers_from_output(self) -> bool:
        return self.cec is not None

    # -- state --------------------------------------------------------------------

    def reset_to_initial_state(self) -> None:
        # CEC keeps the open windows ordered by their newest footprint, oldest first
        # (the G_CHECK candidates). The same mapping serves the lookups, so keeping the
        # order costs no second dict operation per record.
        self.open: dict[bytes, Window] = collections.OrderedDict() if self.cec else {}
        self.order = self.open
        self.heap: list[tuple[int, bytes]] = []  # (end_us, key) of open time windows
        self.hwm = _NO_HWM
        self.last_offset = -1  # input offset of the last record processed (t_now)
        self.last_ts = _NO_HWM
        self._recover_through = -1  # the cut c: records <= c are replayed silently
        self._full_replay = False  # replaying to the cut without an eventual checkpoint
        self._out_next = 0

    def _rebuild_heap(self) -> None:
        self.heap = []
        if self.window.kind == "time":
            self.heap = [(w.end_us, key) for key, w in self.open.items()]
            heapq.heapify(self.heap)

    def checkpoint(self, ckpt) -> None:
        """CRB: every open window, the high-water mark and the last offset."""
        ckpt.state = encode_state(self.open, hwm_us=self.hwm, last_offset=self.last_offset)

    def reset(self, ckpt) -> None:
        """Raises CorruptionError for a state this operator did not write."""
        data = ckpt.state
        hwm, last_offset, count = decode_state_header(data)
        self.reset_to_initial_state()
        self.hwm, self.last_offset = hwm, last_offset
        decode_state_windows(data, count, self.open)
        self._rebuild_heap()

    def open_windows(self) -> int:
        return len(self.open)

    def extent_records(self) -> int:
        """CEC: output records from the oldest footprint to the output end (q)."""
        if not self.cec or not self.order:
            return 0
        return self._out_next - next(iter(self.order.values())).fp_out

    def replay_records(self) -> int:
        """CEC: input records from the oldest footprint to the last one processed (u)."""
        if not self.cec or not self.order:
            return 0
        return self.last_offset - next(iter(self.order.values())).fp_in

    # -- the foreground path ---------------------------------------------------------

    def process_chunk(self, chunk, out) -> None:
        keys = chunk.keys
        if None in keys:
            keys = [b"" if k is None else k for k in keys]
        values = self._values(chunk)
        offsets, stamps = chunk.offsets, chunk.timestamps_us
        split = 0
        if self._recover_through >= 0:  # replaying records up to the cut
            split = bisect.bisect_right(offsets, self._recover_through)
            if split:
                self._replay_quietly(offsets[:split], stamps[:split], keys[:split],
                                     values[:split], out)
            if split == len(offsets):
                return
            self._end_quiet_replay()
        process = self._process_count if self.window.kind == "count" else self._process_time
        step = len(offsets)
        if self.cec is not None and self.cec.writes_gchecks:
            step = self.cec.background_every_records  # G_CHECKs may be due in between
        for lo in range(split, len(offsets), step):
            hi = min(len(offsets), lo + step)
            process(offsets[lo:hi], stamps[lo:hi], keys[lo:hi], values[lo:hi], out)
            if hi < len(offsets):  # the runtime calls after_chunk after the last slice
                self.after_chunk(out)

    def _values(self, chunk) -> list[int]:
        if self.value_of is not None:
            return [self.value_of(v) for v in chunk.values]
        column = chunk.batch.column(4)
        buffers = column.buffers()
        n = len(column)
        starts = np.frombuffer(buffers[1], dtype="<i4", count=n + 1, offset=4 * column.offset)
        if n and int(np.diff(starts).min()) < 8:
            raise InvalidArgument("input values must start with an 8-byte int64 "
                                  "(or give value_of)")
        data = np.frombuffer(buffers[2], dtype=np.uint8)
        gathered = data[starts[:-1, None] + np.arange(8)]
        return gathered.view("<i8").ravel().tolist()

    def _process_count(self, offsets, stamps, keys, values, out) -> None:
        open_, size, cec = self.open, self.window.size, self.cec is not None
        out_values, out_keys, out_stamps = out.values, out.keys, out.timestamps_us
        out_kinds = out.kinds
        base, pack, stats = out.base_offset, WINDOW_RECORD.pack, self.stats
        hwm = self.hwm
        for offset, ts, key, value in zip(offsets, stamps, keys, values):
            if ts > hwm:
                hwm = ts
            w = open_.get(key)
            if w is None and size == 1:
                # The window opens and closes on this record: it is never open at a cut
                # (a recovery keeps or forgets one input record's output whole), so it
                # needs no footprint and no Window object.
                out_values.append(pack(offset, len(open_), hwm, offset, offset, ts, ts, 1,
                                       value, value, value, float(value)))
                out_keys.append(key)
                out_stamps.append(ts)
                out_kinds.append(_DATA)
                stats.results += 1
                continue
            if w is None:
                w = Window(offset, offset, ts, ts, 1, value, value, value)
                open_[key] = w
                if cec:  # open_ is in footprint order: w, just inserted, is the newest
                    w.fp_in, w.fp_out = offset, base + len(out_values)
                    out_values.append(pack(offset, len(open_), hwm, offset, offset, ts, ts, 1,
                                           value, value, value, float(value)))
                    out_keys.append(key)
                    out_stamps.append(ts)
                    out_kinds.append(_G_OPEN)
                    stats.g_open += 1
            else:
                w.count += 1
                w.total += value
                if value < w.low:
                    w.low = value
                if value > w.high:
                    w.high = value
                w.last_offset, w.end_us = offset, ts
            if w.count >= size:
                del open_[key]
                out_values.append(pack(offset, len(open_), hwm, w.first_offset, offset,
                                       w.start_us, ts, w.count, w.total, w.low, w.high,
                                       w.total / w.count))
                out_keys.append(key)
                out_stamps.append(ts)
                out_kinds.append(_DATA)
                stats.results += 1
        if cec:
            out.has_control = True
        self.hwm = hwm
        self.last_offset, self.last_ts = offsets[-1], stamps[-1]

    def _process_time(self, offsets, stamps, keys, values, out) -> None:
        open_, size, cec = self.open, self.window.size, self.cec is not None
        heap, stats = self.heap, self.stats
        for offset, ts, key, value in zip(offsets, stamps, keys, values):
            if ts > self.hwm:
                self.hwm = ts
                if heap and heap[0][0] <= ts:
                    self._close_expired(offset, ts, out)
            start = ts - ts % size
            end = start + size
            if end <= self.hwm:
                stats.late_records += 1
                continue
            w = open_.get(key)
            if w is None:
                w = Window(offset, offset, start, end, 1, value, value, value)
                open_[key] = w
                heapq.heappush(heap, (end, key))
                if cec:
                    w.fp_in, w.fp_out = offset, out.next_offset
                    out.emit(w.record(offset, len(open_), self.hwm), key, ts, _G_OPEN)
                    stats.g_open += 1
                continue
            assert w.end_us == end, "one open window per key"
            w.count += 1
            w.total += value
            w.low = min(w.low, value)
            w.high = max(w.high, value)
            w.last_offset = offset
        self.last_offset, self.last_ts = offsets[-1], stamps[-1]

    def _close_expired(self, offset: int, ts: int, out) -> None:
        """Time windows: close every window whose end the high-water mark reached, in
        (end, key) order (deterministic)."""
        heap, open_ = self.heap, self.open
        for _ in range(len(heap)):
            if not heap or heap[0][0] > self.hwm:
                return
            end, key = heapq.heappop(heap)
            w = open_.pop(key)
            assert w.end_us == end
            out.emit(w.record(offset, len(open_), self.hwm), key, ts, _DATA)
            self.stats.results += 1

    # -- the background path: G_CHECK ---------------------------------------------------

    def after_chunk(self, out) -> None:
        self._out_next = out.next_offset
        policy = self.cec
        if policy is None or not self.order or self._recover_through >= 0:
            return
        if not policy.writes_gchecks:
            return
        allowed, deadline = policy.budget(self.clock())
        if not allowed:
            return
        self._emit_gchecks(out, policy, deadline)
        self._out_next = out.next_offset

    def _emit_gchecks(self, out, policy: CECPolicy, deadline: float | None) -> None:
        order, q_target = self.order, policy.q_target
        if q_target is not None and q_target < len(order):
            # The extent holds at least one footprint per open window: Q below N cannot
            # be met, and chasing it would write a G_CHECK per window per pass.
            if not self._warned_q:
                self._warned_q = True
                operators_log.warning(
                    "CEC: Q=%d cannot be met with %d windows open (the extent holds a "
                    "footprint of each); using Q=%d. Raise Q above the number of open "
                    "windows, or bound G_CHECK time with ci_ms/cp_ms", q_target, len(order),
                    len(order))
            self.stats.q_raised_to = len(order)
            q_target = len(order)
        t_now, offset, hwm = self.last_ts, self.last_offset, self.hwm
        for key, w in units_due_for_gcheck(policy, order, out, last_offset=offset,
                                           q_target=q_target, clock=self.clock,
                                           deadline=deadline):
            w.fp_in, w.fp_out = offset, out.next_offset
            out.emit(w.record(offset, len(self.open), hwm), key, t_now, _G_CHECK)
            order.move_to_end(key)
            self.stats.g_check += 1

    # -- recovery: rebuild the eventual checkpoint from the output --------------------------

    def recover_from_output(self, target, input_start: int, report: RecoveryReport, *,
                            fail_on_data_loss: bool = True, source: str = "input",
                            dry_run: bool = False) -> int:
        """CEC recovery (module docstring). Returns the input offset to replay from.
        Raises DataLossError when input the windows open at the cut still need is gone,
        unless fail_on_data_loss is False (then it replays from `input_start` and logs
        the offsets lost). A dry run reads the extent and reports, changing nothing."""
        assert self.cec is not None
        self.reset_to_initial_state()
        end = target.log.end_offset(target.stream, target.partition)
        with gc_paused(), report.phase(RECONSTRUCT):
            found = reconstruct(target.log, target.stream, target.partition, report)
        report.cut_input_offset = found.cut_input if found.last is not None else None
        if found.cut_output < end:
            report.output_records_truncated = end - found.cut_output
        start, lost = replay_start(found, input_start)
        if dry_run:
            report.input_offsets_lost = lost
            return start
        if lost is not None:  # decided before anything is truncated
            error = DataLossError(source, lost[0], lost[1], loss_reason(found, start))
            if fail_on_data_loss:
                report.note(str(error))
                raise error
            report.input_offsets_lost = lost
            text = (f"data loss accepted (fail_on_data_loss=False): {error.why}; input "
                    f"offsets {lost[0]}..{lost[1]} are lost; the windows open at the cut "
                    f"continue without them")
            report.note(text)
            recovery_log.warning("%s", text)
        with report.phase(TRUNCATE):
            if found.cut_output < end:
                target.log.truncate_after(target.stream, target.partition, found.cut_output - 1)
        with gc_paused(), report.phase(LOAD):
            return self._load(found, input_start, report)

    def required_positions(self) -> tuple[int, int | None]:
        """(input offset, output offset) a recovery from now would read back to: the
        oldest footprint's (retention must keep them, DESIGN 2)."""
        # One record earlier than the replay start: a recovery forgets the records of
        # the last input offset and replays it too.
        if not self.order:
            return max(0, self.last_offset), None
        oldest = next(iter(self.order.values()))
        return oldest.fp_in, oldest.fp_out

    def _load(self, found: EventualCheckpoint, input_start: int,
              report: RecoveryReport) -> int:
        if found.last is None:
            return input_start  # no output survived: nothing happened yet
        self._out_next = found.cut_output
        # Every output of the input offsets <= cut_input - 1 is in the log.
        self._recover_through = found.cut_input - 1
        if not found.complete:
            report.note(f"the output no longer holds the footprints of all {found.last.n_open}"
                        f" open windows: full replay from input offset {input_start}")
            self._full_replay = True
            return input_start
        self.open = self.order = found.windows_by_age()
        assert len(self.open) == found.last.n_open == len(found.keys)
        self._rebuild_heap()
        anchor_in, self.hwm = found.anchor()
        report.windows_loaded = len(self.open)
        start = anchor_in + 1
        if start < input_start:  # data loss accepted (recover_from_output)
            start = input_start
        return start

    def _replay_quietly(self, offsets, stamps, keys, values, out) -> None:
        """Records <= the cut: their output is in the log already. EC mode applies a
        record only to an open window that has not absorbed it; full mode processes
        normally into a buffer that is thrown away."""
        if self._full_replay:
            scratch = ScratchOutput(out.base_offset)
            process = self._process_count if self.window.kind == "count" else self._process_time
            process(offsets, stamps, keys, values, scratch)
            return
        # A window's footprint input offset (fp_in) is what it has absorbed through; no
        # G_CHECK moves it before the cut.
        open_, size = self.open, self.window.size
        time_windows = self.window.kind == "time"
        for offset, ts, key, value in zip(offsets, stamps, keys, values):
            if ts > self.hwm:
                self.hwm = ts
            w = open_.get(key)
            if w is None or offset <= w.fp_in:
                continue
            if time_windows:
                end = ts - ts % size + size
                if end <= self.hwm:
                    continue  # late in the original run too
                assert end == w.end_us, "a record of an open window's key is in that window"
            else:
                w.end_us = ts
            w.count += 1
            w.total += value
            w.low = min(w.low, value)
            w.high = max(w.high, value)
            w.last_offset = offset
            assert time_windows or w.count < size, "a window open at the cut cannot close"
        self.last_offset, self.last_ts = offsets[-1], stamps[-1]

    def _end_quiet_replay(self) -> None:
        if self._full_replay:  # footprint positions are unknown: count them all as old
            for w in self.open.values():
                w.fp_in, w.fp_out = self.last_offset, self._out_next
        self._recover_through = -1
        self._full_replay = False

