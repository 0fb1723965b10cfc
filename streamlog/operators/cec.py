"""The windowed aggregate operator and continuous eventual checkpointing (DESIGN 8).

Strategy: the CEC paper's case study. `AggregateOperator` groups input records by key
into tumbling windows, count-based (a window closes when it holds `size` records) or
time-based (windows [k*size, (k+1)*size) of event time, closed when the operator's
high-water mark, the running max input timestamp, reaches their end; a record whose
window has already closed is late and dropped, and counted). A key has at most one open
window. A closing window emits a result `R` (count, sum, min, max, average).

It runs three ways: plain (results only, nothing to recover from but a full replay),
CRB (`checkpoint`/`reset` serialize every open window; operator.py stores them), or CEC
(`cec=CECPolicy(...)`): every window that opens emits a `G_OPEN` footprint (but a count
window of one record, which opens and closes on the same input record, is never open at
a cut and writes only its R), and the
background path (`after_chunk`) emits `G_CHECK` footprints for the windows with the
oldest footprint while the extent `q` (output records since the oldest footprint) is over
`Q` or the replay `u` (input records since its input offset) is over `U`, and only
during the first `CI` ms of every `CP` ms period (the background path runs every
`background_every_records` input records and when the runtime's chunk ends). The
footprints are control records (RecordKind.G_OPEN / G_CHECK) interleaved in order with
the `R`s in the output partition, so a data reader never sees them.

Every output record (R or footprint) has the group key as its key, the timestamp of the
input record being processed (t_now) as its timestamp, and the value layout
`WINDOW_RECORD`: the input offset being processed, `N` (open windows after this record
was produced), the operator's high-water mark, and the window's state. Positions are
input offsets, never timestamps (DESIGN 5: equal timestamps are ambiguous).

Recovery (`recover_from_output`), reading the output backwards (`iter_batches_backwards`):

1. The last record names the input offset `x` being processed when the crash came. Its
   outputs may be partly persisted, so all records of `x` are forgotten
   (`truncate_after`) and `x` is replayed: the cut `c = x - 1` is an input offset whose
   outputs are all in the log. (If the last record is a G_CHECK, nothing is forgotten
   and `c = x`: G_CHECKs are written after all of their input offset's results.) The
   last kept record gives `N` (open windows at `c`).
2. Walking further back, the first record met for a key decides it: an `R` means that
   key's window is closed at `c` (older footprints of it belong to closed windows), a
   footprint is the newest state of an open window. The walk stops when `N` footprints
   are found; those records are the extent. It works on groups of batches with Arrow
   and NumPy, not record by record.
3. Load: the windows are rebuilt from their footprints; each remembers the input offset
   it has absorbed through.
4. Replay from the oldest footprint's input offset + 1: up to `c`, a record is applied
   only to an open window that has not absorbed it (offset > its footprint's), and no
   output is produced (it is in the log already); from `c + 1` on, processing is normal.

If the walk reaches the start of the output without `N` footprints (output retention
removed them), recovery falls back to a full replay from the input's start that
suppresses the output of records <= `c`. Both paths give exactly the failure-free `R`s.

Thread-safety: one thread drives an operator (see operator.py).

Why ~800 lines: the paper's algorithm is one state machine (windows, G_OPEN/G_CHECK
footprints, Q/U, CI/CP and the backwards rebuild of EC share its state); splitting it
would scatter one invariant over several files.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import dataclasses
import gc
import heapq
import json
import logging
import struct
import sys
import time
from typing import Callable, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import CorruptionError, DataLossError, InvalidArgument
from .recovery_report import LOAD, RECONSTRUCT, TRUNCATE, RecoveryReport, recovery_log
from ..records import RecordKind

# Value of every output record: in_offset, n_open, hwm_us, first_offset, last_offset,
# start_us, end_us, count, sum, min, max (int64) and avg (float64), little-endian.
WINDOW_RECORD = struct.Struct("<qqqqqqqqqqqd")
assert WINDOW_RECORD.size == 96
_STATE_HEADER = struct.Struct("<4sHqqI")  # magic, version, hwm_us, last_offset, windows
_STATE_WINDOW = struct.Struct("<Iqqqqqqqq")  # key length, first, last, start, end, count,
#                                              sum, min, max
_STATE_MAGIC = b"AGG1"
_NO_HWM = -(1 << 63)
operators_log = logging.getLogger("streamlog.operators")
_G_OPEN, _G_CHECK, _DATA = int(RecordKind.G_OPEN), int(RecordKind.G_CHECK), 0
# Bounds.
GCHECKS_PER_CHUNK_MAX = 1 << 20
CLOCK_CHECK_EVERY = 64  # G_CHECKs between clock reads in the CI budget loop


class WindowRecord(NamedTuple):
    in_offset: int
    n_open: int
    hwm_us: int
    first_offset: int
    last_offset: int
    start_us: int
    end_us: int
    count: int
    sum: int
    min: int
    max: int
    avg: float


def decode_window_record(value: bytes) -> WindowRecord:
    """Decode an output value. Raises CorruptionError for a value of the wrong size."""
    if len(value) != WINDOW_RECORD.size:
        raise CorruptionError(f"not an aggregate output record ({len(value)} bytes)")
    return WindowRecord(*WINDOW_RECORD.unpack(value))


class AggregateResult(NamedTuple):
    """One closed window's aggregate, as `read_aggregate_results` yields it. `start_us`
    and `end_us`: the window's bounds (time windows) or its first and last record's
    timestamps (count windows); `first_offset` / `last_offset`: the input offsets of its
    first and last record; `offset` / `timestamp_us`: the result's place in the output."""

    key: bytes | None
    start_us: int
    end_us: int
    count: int
    sum: int
    min: int
    max: int
    avg: float
    first_offset: int
    last_offset: int
    offset: int
    timestamp_us: int


def read_aggregate_results(log, stream: str, partition: int = 0, *, from_offset=None,
                           to_offset=None, follow: bool = False):
    """The results of an AggregateOperator's output, typed (footprints and position
    notes are control records and never appear). Raises CorruptionError for a record
    that is not an aggregate result."""
    reader = log.reader(stream, partition, from_offset=from_offset, to_offset=to_offset,
                        follow=follow)
    try:
        for record in reader:
            r = decode_window_record(record.value)
            yield AggregateResult(record.key, r.start_us, r.end_us, r.count, r.sum, r.min,
                                  r.max, r.avg, r.first_offset, r.last_offset, record.offset,
                                  record.timestamp_us)
    finally:
        reader.close()


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


@dataclasses.dataclass(frozen=True, slots=True)
class CECPolicy:
    """When to emit G_CHECKs. `q_target` (Q, output records in the extent) and
    `u_target` (U, input records to replay): None disables that target; with both None
    only G_OPENs are written. `ci_ms` of every `cp_ms` period may be spent on G_CHECKs;
    cp_ms None lifts the time budget."""

    q_target: int | None = None
    u_target: int | None = None
    ci_ms: float = 5.0
    cp_ms: float | None = 100.0
    gchecks_per_chunk_max: int = 65536
    background_every_records: int = 256  # the background path runs this often at least

    def __post_init__(self) -> None:
        for name in ("q_target", "u_target"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 0):
                raise InvalidArgument(f"{name} must be None or an int >= 0 (got {value!r})")
        if self.cp_ms is not None and not 0 < self.ci_ms <= self.cp_ms:
            raise InvalidArgument("need 0 < ci_ms <= cp_ms")
        if not 1 <= self.gchecks_per_chunk_max <= GCHECKS_PER_CHUNK_MAX:
            raise InvalidArgument(f"gchecks_per_chunk_max must be in 1..{GCHECKS_PER_CHUNK_MAX}")
        if isinstance(self.background_every_records, bool) or not isinstance(
                self.background_every_records, int) or self.background_every_records < 1:
            raise InvalidArgument("background_every_records must be a positive int")

    def budget(self, now_s: float) -> tuple[bool, float | None]:
        """(G_CHECKs may be written now, the clock reading they must stop at): only in
        the first CI ms of every CP ms period; without CP, always and without a limit."""
        if self.cp_ms is None:
            return True, None
        now_ms = now_s * 1000.0
        into_period = now_ms % self.cp_ms
        if into_period >= self.ci_ms:
            return False, None
        return True, (now_ms + self.ci_ms - into_period) / 1000.0


class Window:
    """One open window. fp_in / fp_out: input and output offsets of its newest
    footprint (CEC); start_us / end_us: first and last record time (count windows) or
    the window bounds (time windows)."""

    __slots__ = ("first_offset", "last_offset", "start_us", "end_us", "count", "total",
                 "low", "high", "fp_in", "fp_out")

    def __init__(self, first_offset, last_offset, start_us, end_us, count, total, low, high,
                 fp_in=-1, fp_out=-1) -> None:
        self.first_offset, self.last_offset = first_offset, last_offset
        self.start_us, self.end_us = start_us, end_us
        self.count, self.total, self.low, self.high = count, total, low, high
        self.fp_in, self.fp_out = fp_in, fp_out

    def record(self, in_offset: int, n_open: int, hwm_us: int) -> bytes:
        return WINDOW_RECORD.pack(in_offset, n_open, hwm_us, self.first_offset,
                                  self.last_offset, self.start_us, self.end_us, self.count,
                                  self.total, self.low, self.high, self.total / self.count)


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
        parts = [_STATE_HEADER.pack(_STATE_MAGIC, 1, self.hwm, self.last_offset,
                                    len(self.open))]
        pack = _STATE_WINDOW.pack
        for key, w in self.open.items():
            parts.append(pack(len(key), w.first_offset, w.last_offset, w.start_us, w.end_us,
                              w.count, w.total, w.low, w.high))
            parts.append(key)
        ckpt.state = b"".join(parts)

    def reset(self, ckpt) -> None:
        data = ckpt.state
        if len(data) < _STATE_HEADER.size:
            raise CorruptionError("aggregate checkpoint state too short")
        magic, version, hwm, last_offset, count = _STATE_HEADER.unpack_from(data, 0)
        if magic != _STATE_MAGIC or version != 1:
            raise CorruptionError("not an aggregate checkpoint state")
        self.reset_to_initial_state()
        self.hwm, self.last_offset = hwm, last_offset
        position = _STATE_HEADER.size
        try:
            for _ in range(count):
                key_bytes, *fields = _STATE_WINDOW.unpack_from(data, position)
                position += _STATE_WINDOW.size
                key = bytes(data[position:position + key_bytes])
                position += key_bytes
                self.open[key] = Window(*fields)
        except struct.error:
            raise CorruptionError("aggregate checkpoint state truncated") from None
        if position != len(data):
            raise CorruptionError("aggregate checkpoint state has trailing bytes")
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
        if self.cec is not None and (self.cec.q_target is not None or
                                     self.cec.u_target is not None):
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
        if policy.q_target is None and policy.u_target is None:
            return
        allowed, deadline = policy.budget(self.clock())
        if not allowed:
            return
        self._emit_gchecks(out, policy, deadline)
        self._out_next = out.next_offset

    def _emit_gchecks(self, out, policy: CECPolicy, deadline: float | None) -> None:
        order, q_target, u_target = self.order, policy.q_target, policy.u_target
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
        bound = min(len(order), policy.gchecks_per_chunk_max)
        for emitted in range(bound):
            key, w = next(iter(order.items()))
            q = out.next_offset - w.fp_out
            u = offset - w.fp_in
            if not ((q_target is not None and q > q_target) or (
                    u_target is not None and u > u_target)):
                return
            w.fp_in, w.fp_out = offset, out.next_offset
            out.emit(w.record(offset, len(self.open), hwm), key, t_now, _G_CHECK)
            order.move_to_end(key)
            self.stats.g_check += 1
            if deadline is not None and emitted % CLOCK_CHECK_EVERY == CLOCK_CHECK_EVERY - 1 and (
                    self.clock() >= deadline):
                return

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
        with _gc_paused(), report.phase(RECONSTRUCT):
            found = reconstruct(target.log, target.stream, target.partition, report)
        report.cut_input_offset = found.cut_input if found.last is not None else None
        if found.cut_output < end:
            report.output_records_truncated = end - found.cut_output
        if dry_run:
            start, lost = self._replay_start(found, input_start)
            report.input_offsets_lost = lost
            return start
        start, lost = self._replay_start(found, input_start)
        if lost is not None:  # decided before anything is truncated
            error = DataLossError(source, lost[0], lost[1], self._loss_reason(found, start))
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
        with _gc_paused(), report.phase(LOAD):
            return self._load(found, input_start, report)

    def _replay_start(self, found: EventualCheckpoint,
                      input_start: int) -> tuple[int, tuple[int, int] | None]:
        """The input offset an exact replay starts from, and the offsets (first, last)
        it needs that retention removed (None: none)."""
        if found.last is None:
            return input_start, None
        if not found.complete:
            # The footprints are gone (output retention): only a replay of all the input
            # from the operator's start is exact; offsets before the input's start are
            # gone, and the operator may have read some of them.
            return 0, ((0, input_start - 1) if input_start > 0 else None)
        start = int(found.records["in_offset"].min()) + 1 if len(found.records) else (
            found.last.in_offset + 1)
        return start, ((start, input_start - 1) if start < input_start else None)

    @staticmethod
    def _loss_reason(found: EventualCheckpoint, start: int) -> str:
        if not found.complete:
            return (f"the output no longer holds the footprints of the "
                    f"{found.last.n_open} open windows, and rebuilding them needs the input "
                    f"from the operator's start")
        return (f"the {found.last.n_open} windows open at the cut (input offset "
                f"{found.cut_input - 1}) need the input from offset {start}")

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
        records = found.records
        by_age = np.argsort(found.out_offsets, kind="stable")  # oldest footprint first
        keys = [found.keys[i] for i in by_age.tolist()]
        fields = [records[name][by_age].tolist() for name in (
            "first_offset", "last_offset", "start_us", "end_us", "count", "sum", "min", "max",
            "in_offset")]
        windows = map(Window, *fields, found.out_offsets[by_age].tolist())
        self.open = self.order = collections.OrderedDict(zip(keys, windows))
        assert len(self.open) == found.last.n_open == len(keys)
        self._rebuild_heap()
        if len(records):
            oldest = int(np.argmin(records["in_offset"]))
            anchor_in = int(records["in_offset"][oldest])
            anchor_hwm = int(records["hwm_us"][oldest])
        else:
            anchor_in, anchor_hwm = found.last.in_offset, found.last.hwm_us
        self.hwm = anchor_hwm
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
            scratch = _Scratch(out.base_offset)
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


@contextlib.contextmanager
def _gc_paused():
    """Recovery allocates many long-lived objects (a window per key) in a burst; the
    cyclic collector would re-scan them over and over while they pile up."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class _Scratch:
    """An output buffer whose records are dropped (full replay up to the cut)."""

    def __init__(self, base_offset: int) -> None:
        self.base_offset = base_offset
        self.values, self.keys, self.timestamps_us, self.kinds = [], [], [], []
        self.has_control = False

    @property
    def next_offset(self) -> int:
        return self.base_offset + len(self.values)

    def emit(self, value, key, timestamp_us, kind=0) -> None:
        self.values.append(value)


@dataclasses.dataclass
class EventualCheckpoint:
    """What the backward walk found. `cut_output`: output offsets >= it are forgotten
    (the records of the last input offset). `last`: the last kept record (None: none).
    `cut_input`: the first input offset not covered by the kept output. The footprints
    are columns: `keys[i]` has its newest footprint at output offset `out_offsets[i]`
    with fields `records[i]` (FOOTPRINT_DTYPE). `complete`: all N were found."""

    cut_output: int
    cut_input: int
    last: WindowRecord | None
    keys: list[bytes]
    out_offsets: np.ndarray
    records: np.ndarray
    complete: bool


# The value layout of WINDOW_RECORD as a NumPy record, to decode footprints in bulk.
FOOTPRINT_DTYPE = np.dtype([(name, "<f8" if name == "avg" else "<i8")
                            for name in WindowRecord._fields])
assert FOOTPRINT_DTYPE.itemsize == WINDOW_RECORD.size
# Records per group of batches that the backward walk processes with one set of
# vectorised calls (hash the keys, find each key's newest record): the first group, and
# the bound the size doubles up to.
GROUP_RECORDS_FIRST = 1 << 8
GROUP_RECORDS = 1 << 17


def iter_batches_backwards(log, stream: str, partition: int, *, end_offset: int | None = None):
    """Yield (frame_bytes, columns, count) for the batches of a partition from its end
    towards its start: rows [0, count) of `columns` are the batch's records below
    `end_offset` (default: the acknowledged end). One Log.batch_holding per batch."""
    start = log.start_offset(stream, partition)
    offset = (log.end_offset(stream, partition) if end_offset is None else end_offset) - 1
    for _ in range(max(0, offset - start + 1)):
        if offset < start:
            return
        base, frame_bytes, columns = log.batch_holding(stream, partition, offset)
        yield frame_bytes, columns, offset - base + 1
        offset = base - 1


def reconstruct(log, stream: str, partition: int, report: RecoveryReport) -> EventualCheckpoint:
    """Walk the output backwards: find the cut, then the newest footprint of each of
    the N windows open at the cut (module docstring, steps 1 and 2)."""
    end = log.end_offset(stream, partition)
    cut_output, cut_input, last = end, -1, None
    walk = None
    for frame_bytes, columns, count in iter_batches_backwards(log, stream, partition):
        report.output_batches_read += 1
        report.output_bytes_read += frame_bytes
        if last is None:  # step 1: skip the records of the last input offset
            cut_output, cut_input, last, keep = _find_cut(columns, count, cut_output,
                                                          cut_input)
            report.output_records_scanned += count - keep
            if last is None:
                continue
            walk = _Walk(last.n_open)
            count = keep
        if walk.add(columns, count, report):
            break
    else:
        if walk is not None:
            walk.finish(report)
    if last is None:
        return EventualCheckpoint(cut_output, cut_input, None, [], np.zeros(0, np.int64),
                                  np.zeros(0, FOOTPRINT_DTYPE), True)
    keys, out_offsets, records = walk.footprints()
    return EventualCheckpoint(cut_output, cut_input, last, keys, out_offsets, records,
                              walk.complete)


def _find_cut(columns, count: int, cut_output: int, cut_input: int):
    """Step 1 over one batch (newest first). Returns (cut_output, cut_input, last kept
    record or None, rows [0, keep) of the batch left for step 2)."""
    values = columns.values
    value_offsets = columns.value_offsets()
    kinds = columns.kinds
    for i in range(count - 1, -1, -1):
        rec = _decode_at(values, value_offsets, i, columns.base_offset)
        if cut_input < 0 and kinds is not None and kinds[i] == _G_CHECK:
            # G_CHECKs follow every result of their input offset: those results are
            # complete, and nothing needs forgetting.
            return cut_output, rec.in_offset + 1, rec, i + 1
        if cut_input < 0:
            cut_input = rec.in_offset
        if rec.in_offset != cut_input:
            return cut_output, cut_input, rec, i + 1
        cut_output = columns.base_offset + i
    return cut_output, cut_input, None, 0


class _Walk:
    """Step 2: collect batches (newest first) into groups; per group, find each key's
    newest record with Arrow's hash-based dictionary encoding; a key met first (newest)
    in an R is closed, one met in a footprint is open. Stops at the N-th footprint."""

    def __init__(self, wanted: int) -> None:
        assert wanted >= 0
        self.wanted = wanted
        self.complete = wanted == 0
        self.decided: list[pa.Array] = []  # distinct keys of the groups already walked
        self.found: list[tuple[pa.Array, np.ndarray, np.ndarray]] = []
        self.found_count = 0
        self.group: list[tuple] = []
        self.group_rows = 0
        # Walk small groups first and double: a small extent is found after reading
        # little more than itself, a large one with few vectorised passes.
        self.group_target = GROUP_RECORDS_FIRST

    def add(self, columns, count: int, report: RecoveryReport) -> bool:
        """Take rows [0, count) of a batch; True once all N footprints are found."""
        if self.complete:
            return True
        if count:
            self.group.append(_batch_columns(columns, count))
            self.group_rows += count
        if self.group_rows >= self.group_target:
            self.group_target = min(self.group_target * 2, GROUP_RECORDS)
            self._walk_group(report)
        return self.complete

    def finish(self, report: RecoveryReport) -> None:
        if self.group and not self.complete:
            self._walk_group(report)

    def _walk_group(self, report: RecoveryReport) -> None:
        group, self.group, self.group_rows = self.group[::-1], [], 0  # oldest first
        keys = pa.concat_arrays([g[0] for g in group])
        kinds = np.concatenate([g[1] for g in group])
        offsets = np.concatenate([g[2] for g in group])
        values = np.concatenate([g[3] for g in group])
        n = len(keys)
        encoded = pc.dictionary_encode(keys)
        distinct = encoded.dictionary
        codes = encoded.indices.to_numpy(zero_copy_only=False)
        _, newest_reversed = np.unique(codes[::-1], return_index=True)
        newest = n - 1 - newest_reversed  # per distinct key (in code order): its newest row
        fresh = np.ones(len(distinct), dtype=bool)
        if self.decided:
            fresh = ~pc.is_in(distinct, value_set=pa.chunked_array(self.decided)).to_numpy(
                zero_copy_only=False)
        self.decided.append(distinct)
        open_here = fresh & (kinds[newest] != 0)  # fresh keys whose newest is a footprint
        rows, codes_of_rows = newest[open_here], np.flatnonzero(open_here)
        order = np.argsort(-rows, kind="stable")  # newest first: the walk's order
        rows, codes_of_rows = rows[order], codes_of_rows[order]
        remaining = self.wanted - self.found_count
        assert remaining > 0
        take = min(len(rows), remaining)
        scanned = n
        if take == remaining:  # the N-th footprint is in this group: stop there
            self.complete = True
            scanned = n - int(rows[take - 1])
        rows, codes_of_rows = rows[:take], codes_of_rows[:take]
        self.found.append((distinct.take(pa.array(codes_of_rows)), offsets[rows],
                           values[rows].view(FOOTPRINT_DTYPE).ravel()))
        self.found_count += take
        report.output_records_scanned += scanned
        report.tick()

    def footprints(self) -> tuple[list[bytes], np.ndarray, np.ndarray]:
        if not self.found:
            return [], np.zeros(0, np.int64), np.zeros(0, FOOTPRINT_DTYPE)
        keys = [k for part in self.found for k in part[0].to_pylist()]
        return (keys, np.concatenate([part[1] for part in self.found]),
                np.concatenate([part[2] for part in self.found]))


def _batch_columns(columns, count: int) -> tuple:
    """Rows [0, count) of a batch: keys as an Arrow binary array, kinds, output offsets
    and the fixed-size values as a (count, 96) byte matrix."""
    value_lengths = columns.value_lengths[:count]
    if (value_lengths != WINDOW_RECORD.size).any():
        raise CorruptionError(f"output offsets {columns.base_offset}.."
                              f"{columns.base_offset + count - 1} hold records that are not "
                              f"aggregate output records")
    key_offsets = columns.key_offsets()[:count + 1].astype(np.int32)
    keys = pa.Array.from_buffers(pa.binary(), count, [None, pa.py_buffer(key_offsets),
                                                      pa.py_buffer(columns.keys)])
    kinds = (np.asarray(columns.kinds[:count], dtype=np.uint8) if columns.kinds is not None
             else np.zeros(count, dtype=np.uint8))
    offsets = np.arange(columns.base_offset, columns.base_offset + count, dtype=np.int64)
    values = np.frombuffer(columns.values, dtype=np.uint8,
                           count=count * WINDOW_RECORD.size).reshape(count, WINDOW_RECORD.size)
    return keys, kinds, offsets, values


def _decode_at(values, value_offsets, i: int, base: int) -> WindowRecord:
    lo, hi = int(value_offsets[i]), int(value_offsets[i + 1])
    if hi - lo != WINDOW_RECORD.size:
        raise CorruptionError(f"output offset {base + i} is not an aggregate output record")
    return WindowRecord(*WINDOW_RECORD.unpack_from(values, lo))


# -- a job: open the logs, recover, run to the end (used by crash tests and the bench) --

def build_operator(spec: dict) -> AggregateOperator:
    window = WindowSpec(spec["window"]["kind"], int(spec["window"]["size"]))
    cec = None
    if spec.get("mode") == "cec":
        cec = CECPolicy(**spec.get("cec", {}))
    return AggregateOperator(window, cec=cec)


def run_aggregate_job(spec: dict) -> dict:
    """Open the input (read-only) and output logs named in `spec`, recover, run to the
    input end, close. `spec`: input_path, input_stream, output_path, output_stream,
    mode ("none" | "crb" | "cec"), window {kind, size}, cec {CECPolicy fields},
    checkpoint_interval_s, store_path, chunk_records, fsync, output_options, progress,
    hold_input, fail_on_data_loss."""
    import streamlog
    from .checkpoint import CheckpointPolicy, CheckpointStore
    from .runtime import OperatorRuntime
    from .recovery_report import print_progress
    operator = build_operator(spec)
    store = None
    policy = None
    if spec.get("mode") == "crb":
        store = CheckpointStore(spec["store_path"])
        policy = CheckpointPolicy.periodic(float(spec.get("checkpoint_interval_s", 1.0)))
    input_log = streamlog.open_log(spec["input_path"], readonly=True)
    output_log = streamlog.open_log(spec["output_path"], fsync=spec.get("fsync", "always"),
                                    **spec.get("output_options", {}))
    try:
        runtime = OperatorRuntime(
            operator, input_log=input_log, input_stream=spec["input_stream"],
            output_log=output_log, output_stream=spec["output_stream"],
            checkpointing=policy, store=store, chunk_records=int(spec.get("chunk_records", 256)),
            progress=print_progress() if spec.get("progress") else None,
            hold_input=bool(spec.get("hold_input", True)),
            fail_on_data_loss=bool(spec.get("fail_on_data_loss", True)))
        report = runtime.recover()
        runtime.run()
        runtime.close()
        return {"report": report.as_dict(), "input_next": runtime.input_next,
                "output_next": runtime.output_next, "stats": dataclasses.asdict(operator.stats)}
    finally:
        output_log.close()
        input_log.close()
        if store is not None:
            store.close()


def job_main(argv: list[str] | None = None) -> None:
    """`python -c "from streamlog.operators.cec import job_main; job_main()" SPEC_JSON`: prints
    READY once imported, runs the job, prints its summary as one JSON line."""
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(argv[0])
    print("READY", flush=True)
    summary = run_aggregate_job(spec)
    print(json.dumps(summary, default=str), flush=True)
