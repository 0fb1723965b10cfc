"""The window operator's output records, the typed reader of its results, and the
backward walk that rebuilds its eventual checkpoint from them, with the recovery plan
built on it (DESIGN 8; windows.py runs the operator and carries the plan out).

Strategy: every record the window operator writes, a result `R` (DATA) or a footprint
(`G_OPEN`, `G_CHECK`, control kinds that data readers never see), starts with one fixed
header, so a single decoder serves the typed result reader, the recovery walk and the
tests. A *unit* is what a footprint saves: one (key, window) of a tumbling or hopping
assigner, or one key's buffer of a sliding assigner. `unit_id` names the unit within its
key; (key, unit_id) is never reused by a later unit of the same operator.

Layout of every output value, little-endian (pinned by the assert below):

    offset  size  type   field
         0     2  bytes  magic b"SW"
         2     1  u8     version, 1
         3     1  u8     flags: FLAG_FINAL (1) the unit is closed after this record (an R
                         of a tumbling or hopping window, or a sliding unit's tombstone, a
                         G_CHECK with no state); FLAG_RAW (2) the payload of an R is the
                         bytes the window function returned, not codec-encoded
         4     8  i64    in_offset: the input offset being processed when it was written
        12     8  i64    n_open: open units right after this record (CEC's N)
        20     8  i64    hwm_us: the operator's high-water mark (running max input time)
        28     8  i64    unit_id
        36     8  i64    window_start  \\  the result's window (R), or the unit's bounds
        44     8  i64    window_end    /  so far (footprint); see windows.Window
        52     8  i64    count: records in the window (R) or absorbed so far (footprint)
        60     -  bytes  payload: the result (R) or the unit's encoded state (footprint)

The walk (`reconstruct`), reading the output backwards batch by batch:

1. The cut. The newest record names the input offset `x` being processed at the crash;
   x's records may be partly persisted, so they are all forgotten and `x` is replayed:
   the cut `c = x - 1` is the last input offset whose records are all in the log. If the
   newest record is a background G_CHECK (not FINAL), nothing is forgotten and `c = x`:
   those are written after every foreground record of their input offset. The last kept
   record's `n_open` is `N`, the units open at the cut.
2. The footprints. Going further back, the first record met for a unit decides it: a
   FINAL record means the unit was closed at the cut (its older footprints belong to a
   closed unit); a footprint is the newest state of an open unit. A non-FINAL R (a
   sliding unit's result) decides nothing: the unit is open and its state is further
   back. The walk stops at the N-th footprint.

`plan_recovery` then decides, without I/O, where the replay starts: after the oldest
footprint (a complete eventual checkpoint), after the cut (nothing open), at the
forgotten offset x (the output held only x's records: x was the first record the
operator processed, since every first record writes a G_OPEN or an R), or at input
offset 0 with the units rebuilt by a full replay (output retention removed footprints).
Input that this needs below the input's start (removed by retention) is `lost`;
`accept_data_loss` refuses it (DataLossError) or, when the user opted in, says what is
lost and goes on.

Thread-safety: functions over a log and a report the caller owns, on its thread.
"""

from __future__ import annotations

import dataclasses
import logging
import struct
from typing import Any, Iterator, NamedTuple

from ..errors import CorruptionError, DataLossError, StreamLogError
from ..records import RecordKind
from .codec import DEFAULT_CODEC, StateCodec
from .read_backwards import iter_batches_backwards
from .recovery_report import RecoveryReport

HEADER = struct.Struct("<2sBBqqqqqqq")
assert HEADER.size == 60
MAGIC = b"SW"
VERSION = 1
FLAG_FINAL = 1
FLAG_RAW = 2
_FLAGS_KNOWN = FLAG_FINAL | FLAG_RAW
NO_HWM = -(1 << 63)
DATA, G_OPEN, G_CHECK = int(RecordKind.DATA), int(RecordKind.G_OPEN), int(RecordKind.G_CHECK)
UNIT_KINDS = frozenset((DATA, G_OPEN, G_CHECK))
operators_log = logging.getLogger("streamlog.operators")


class OutputHeader(NamedTuple):
    """The header fields of an output record (module docstring)."""

    flags: int
    in_offset: int
    n_open: int
    hwm_us: int
    unit_id: int
    window_start: int
    window_end: int
    count: int


def encode_output(header: OutputHeader, payload: bytes) -> bytes:
    assert header.flags & ~_FLAGS_KNOWN == 0
    assert header.n_open >= 0
    return HEADER.pack(MAGIC, VERSION, *header) + payload


def decode_output(value: bytes, offset: int) -> tuple[OutputHeader, bytes]:
    """Split an output value into its header and payload.

    Raises:
        CorruptionError: the value is not a window operator record (`offset` names it).
    """
    if len(value) < HEADER.size:
        raise CorruptionError(f"output offset {offset}: {len(value)} bytes is too short for "
                              f"a window record")
    magic, version, *fields = HEADER.unpack_from(value, 0)
    if magic != MAGIC or version != VERSION:
        raise CorruptionError(f"output offset {offset}: not a window record (magic "
                              f"{magic!r}, version {version})")
    header = OutputHeader(*fields)
    if header.flags & ~_FLAGS_KNOWN or header.n_open < 0 or header.count < 0:
        raise CorruptionError(f"output offset {offset}: impossible window record header "
                              f"{header}")
    return header, bytes(value[HEADER.size:])


class WindowResult(NamedTuple):
    """One result (`read_window_results`). `value`: what `close` returned (bytes as
    they were, anything else decoded by the codec); `count`: records in the window;
    `offset`, `timestamp_us`: the output record's; `input_offset`: the input record
    whose processing closed the window."""

    key: bytes
    window_start: int
    window_end: int
    count: int
    value: Any
    offset: int
    timestamp_us: int
    input_offset: int


def read_window_results(log, stream: str, partition: int = 0, *,
                        from_offset: int | None = None, to_offset: int | None = None,
                        codec: StateCodec = DEFAULT_CODEC) -> Iterator[WindowResult]:
    """The results a WindowedOperator wrote to (stream, partition), in order; footprints
    and other control records are skipped.

    Raises:
        CorruptionError: a data record that is not a window result.
    """
    reader = log.reader(stream, partition, from_offset=from_offset, to_offset=to_offset)
    try:
        for record in reader:
            header, payload = decode_output(record.value, record.offset)
            value = payload if header.flags & FLAG_RAW else codec.decode(payload)
            yield WindowResult(b"" if record.key is None else record.key, header.window_start,
                               header.window_end, header.count, value, record.offset,
                               record.timestamp_us, header.in_offset)
    finally:
        reader.close()


@dataclasses.dataclass(frozen=True, slots=True)
class Footprint:
    """The newest footprint of a unit open at the cut."""

    output_offset: int
    kind: int
    key: bytes
    header: OutputHeader
    payload: bytes


@dataclasses.dataclass
class EventualCheckpoint:
    """What the walk found.

    `cut_output`: output offsets >= it are forgotten. `cut`: the last input offset whose
    records are all kept (None: the kept output names none). `forgotten`: the input
    offset whose records were forgotten, if any. `last`: the last kept record's header.
    `footprints`: newest first. `complete`: all `last.n_open` footprints were found.
    `start_offset`: the output's first retained offset."""

    end_offset: int
    start_offset: int
    cut_output: int
    cut: int | None
    forgotten: int | None
    last: OutputHeader | None
    footprints: list[Footprint]
    complete: bool


def reconstruct(log, stream: str, partition: int, report: RecoveryReport) -> EventualCheckpoint:
    """Walk the output backwards: the cut, then the newest footprint of each of the N
    units open at the cut (module docstring). Reads only as far back as it must."""
    walk = _Walk(log.end_offset(stream, partition))
    for frame_bytes, columns, count in iter_batches_backwards(log, stream, partition):
        report.output_batches_read += 1
        report.output_bytes_read += frame_bytes
        if walk.add_batch(columns, count, report):
            break
        report.tick()
    return walk.result(log.start_offset(stream, partition))


class _Walk:
    """Steps 1 and 2 over records fed newest first."""

    def __init__(self, end_offset: int) -> None:
        self.end_offset = end_offset
        self.cut_output = end_offset
        self.forgotten: int | None = None
        self.cut: int | None = None
        self.last: OutputHeader | None = None
        self.decided: set[tuple[bytes, int]] = set()
        self.found: list[Footprint] = []
        self.complete = False
        self.newer_in_offset: int | None = None

    def add_batch(self, columns, count: int, report: RecoveryReport) -> bool:
        """Rows [0, count) of a batch; True once the walk is complete."""
        for offset, kind, key, value in reversed(_rows(columns, count)):
            report.output_records_scanned += 1
            if kind not in UNIT_KINDS:
                continue  # not ours (a marker or a note): it says nothing about units
            header, payload = decode_output(value, offset)
            self._check_order(header, offset)
            if self.last is None and not self._find_cut(offset, kind, header):
                continue
            if self.last.n_open == 0 or self._decide(offset, kind, key, header, payload):
                self.complete = True
                return True
        return False

    def _check_order(self, header: OutputHeader, offset: int) -> None:
        # Records are written in input order; going backwards their input offsets fall.
        if self.newer_in_offset is not None and header.in_offset > self.newer_in_offset:
            raise CorruptionError(f"output offset {offset}: input offset {header.in_offset} "
                                  f"after a record of input offset {self.newer_in_offset}")
        self.newer_in_offset = header.in_offset

    def _find_cut(self, offset: int, kind: int, header: OutputHeader) -> bool:
        """Step 1. True when this record is the last one kept."""
        if self.forgotten is None and kind == G_CHECK and not header.flags & FLAG_FINAL:
            self.cut, self.last = header.in_offset, header
            return True
        if self.forgotten is None:
            self.forgotten = header.in_offset
        if header.in_offset == self.forgotten:
            self.cut_output = offset
            return False
        assert header.in_offset < self.forgotten
        self.cut, self.last = self.forgotten - 1, header
        return True

    def _decide(self, offset: int, kind: int, key: bytes, header: OutputHeader,
                payload: bytes) -> bool:
        """Step 2 for one record. True at the N-th footprint."""
        unit = (key, header.unit_id)
        if unit in self.decided:
            return False
        final = header.flags & FLAG_FINAL
        if kind == DATA and not final:
            return False  # a sliding unit's result: it is open, its state is older
        self.decided.add(unit)
        if final:
            return False  # closed before the cut
        self.found.append(Footprint(offset, kind, key, header, payload))
        assert len(self.found) <= self.last.n_open
        return len(self.found) == self.last.n_open

    def result(self, start_offset: int) -> EventualCheckpoint:
        cut = self.cut
        if self.last is None and self.forgotten is not None:
            cut = self.forgotten - 1
        return EventualCheckpoint(self.end_offset, start_offset, self.cut_output, cut,
                                  self.forgotten, self.last, self.found, self.complete)


def _rows(columns, count: int) -> list[tuple[int, int, bytes, bytes]]:
    """(offset, kind, key, value) of rows [0, count) of a batch, oldest first. A record
    without a key is under b"" (the operator's group key for it)."""
    value_offsets = columns.value_offsets().tolist()
    key_offsets = columns.key_offsets().tolist()
    key_lengths = columns.key_lengths.tolist()
    kinds = columns.kinds.tolist() if columns.kinds is not None else None
    keys, values, base = bytes(columns.keys), bytes(columns.values), columns.base_offset
    rows = []
    for i in range(count):
        key = keys[key_offsets[i]:key_offsets[i + 1]] if key_lengths[i] >= 0 else b""
        rows.append((base + i, kinds[i] if kinds is not None else DATA, key,
                     values[value_offsets[i]:value_offsets[i + 1]]))
    return rows


@dataclasses.dataclass
class RecoveryPlan:
    """How to recover from what the walk found. `start`: the input offset to replay
    from; `loads`: load the footprints; `full_replay`: rebuild by replaying everything
    (quietly up to the cut); `hwm_us`: the high-water mark before `start`; `lost`: input
    offsets exactness needs that are below the input's start, with `why`."""

    start: int
    loads: bool
    full_replay: bool
    hwm_us: int
    lost: tuple[int, int] | None = None
    why: str = ""
    notes: list[str] = dataclasses.field(default_factory=list)


def plan_recovery(found: EventualCheckpoint, input_start: int, output: str) -> RecoveryPlan:
    """The recovery decision (pure). Cases: no output (a first start); only records of
    the forgotten input offset x (x was the first record processed: every first record
    writes a G_OPEN or an R); a complete eventual checkpoint; an incomplete one (output
    retention removed footprints): a full replay from input offset 0."""
    if found.last is None and found.forgotten is None:
        if found.end_offset > 0:
            raise StreamLogError(f"output {output} ends at offset {found.end_offset} but "
                                 f"holds no window operator record: cannot tell how far the "
                                 f"crashed run got")
        return RecoveryPlan(input_start, False, False, NO_HWM)
    if found.last is None and found.start_offset == 0:
        plan = RecoveryPlan(found.forgotten, False, False, NO_HWM)
        needed, why = found.forgotten, "the crashed run's first input record is gone"
    elif found.complete:
        anchor = min(found.footprints, key=lambda f: f.header.in_offset, default=None)
        if anchor is None:  # nothing open at the cut: go on after it
            plan = RecoveryPlan(found.cut + 1, False, False, found.last.hwm_us)
        else:
            plan = RecoveryPlan(anchor.header.in_offset + 1, True, False, anchor.header.hwm_us)
        needed, why = plan.start, "the windows open at the cut need it"
    else:
        n_open = "all" if found.last is None else f"all {found.last.n_open}"
        plan = RecoveryPlan(input_start, False, True, NO_HWM, notes=[
            f"the output no longer holds the footprints of {n_open} open windows: full "
            f"replay from input offset {input_start}"])
        needed, why = 0, "a full replay needs the input from its first record"
    if needed < input_start:
        plan.lost, plan.why = (needed, input_start - 1), why
        plan.start = input_start
    return plan


def report_plan(found: EventualCheckpoint, plan: RecoveryPlan, report: RecoveryReport) -> None:
    """Put what the walk found and what the plan does into the report (before anything
    is changed, so a dry run reports it too)."""
    report.windows_loaded = len(found.footprints) if plan.loads else 0
    # The first input offset whose output is not in the log (runtime: replay to it).
    report.cut_input_offset = None if found.cut is None else found.cut + 1
    report.output_records_truncated = found.end_offset - found.cut_output
    for text in plan.notes:
        report.note(text)


def accept_data_loss(plan: RecoveryPlan, source: str, fail: bool,
                     report: RecoveryReport) -> None:
    """The plan needs input offsets that are gone (`plan.lost`): raise DataLossError
    (`fail`, the default of recover_from_output), or log and note what is lost.

    Raises:
        DataLossError: `fail` is True.
    """
    first, last = plan.lost
    error = DataLossError(source, first, last, plan.why)
    if fail:
        report.note(str(error))
        raise error
    text = (f"data loss accepted (fail_on_data_loss=False): {plan.why}; input {source} "
            f"offsets {first}..{last} are gone: continuing from {plan.start}")
    operators_log.warning("%s", text)
    report.note(text)
    report.input_offsets_lost = (first, last)
