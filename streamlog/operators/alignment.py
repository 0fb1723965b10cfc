"""How an operator's output lines up with its input, and the recovery plan built on it.

Strategy: output offsets and input offsets are different sequences (an operator may
emit zero, one or many records per input record), so recovery must never line them up by
counting or by assuming that output offset 0 belongs to the first retained input. The
runtime records the alignment in the output itself: every chunk's output append ends
with a position note, a control record (RecordKind.CHECKPOINT, invisible to data
readers) that says "the output before me is everything the operator produced for input
offsets < input_next, and its state has absorbed the input since `origin`". The note is
in the same append as the chunk's results, and an append is acknowledged only whole, so
every acknowledged output ends with a note; records after the last note (a torn
multi-frame append) were never acknowledged.

`plan_recovery` is pure (no I/O): from the input's retained range, the last note, the
newest checkpoint and the user's choices it decides where the state comes from, which
input is replayed with its output suppressed (already published) or regenerated, what is
forgotten, and whether input that exactness needs is gone. When it is, the plan refuses
(DataLossError naming the offsets) unless the user opted in to data loss, in which case
it continues from the earliest retained input with a fresh state and never deletes
published output. `fitting_checkpoint` finds the newest checkpoint that fits the last
note, and `report_plan` says what the plan does in the recovery report; the runtime
(runtime.py) carries the plan out.
"""

from __future__ import annotations

import dataclasses
import struct

import numpy as np

from ..errors import CorruptionError, DataLossError, StreamLogError
from ..records import RecordKind
from .recovery_report import recovery_log

# A note's value: magic, version, input_next, origin (little-endian), then the input's
# "stream/partition" in UTF-8.
_NOTE = struct.Struct("<4sBqq")
_NOTE_MAGIC = b"SLPN"
_NOTE_VERSION = 1
NOTE_KEY = b"streamlog.position"
NOTE_KIND = int(RecordKind.CHECKPOINT)
# Bound on the batches read backwards to find the last note.
NOTE_SEARCH_BATCHES_MAX = 1 << 20


@dataclasses.dataclass(frozen=True, slots=True)
class PositionNote:
    """A note at output offset `output_offset` (see the module docstring)."""

    output_offset: int
    input_key: str
    input_next: int
    origin: int

    def encode(self) -> bytes:
        return _NOTE.pack(_NOTE_MAGIC, _NOTE_VERSION, self.input_next,
                          self.origin) + self.input_key.encode()

    @classmethod
    def decode(cls, value: bytes, output_offset: int) -> "PositionNote":
        if len(value) < _NOTE.size:
            raise CorruptionError(f"output offset {output_offset}: position note too short")
        magic, version, input_next, origin = _NOTE.unpack_from(value, 0)
        if magic != _NOTE_MAGIC or version != _NOTE_VERSION or not 0 <= origin <= input_next:
            raise CorruptionError(f"output offset {output_offset}: not a position note")
        try:
            key = bytes(value[_NOTE.size:]).decode()
        except UnicodeDecodeError:
            raise CorruptionError(f"output offset {output_offset}: bad position note") from None
        return cls(output_offset, key, input_next, origin)


def note_value(input_key: str, input_next: int, origin: int) -> bytes:
    return PositionNote(-1, input_key, input_next, origin).encode()


def last_note(log, stream: str, partition: int) -> PositionNote | None:
    """The newest position note of an output partition (None: none retained). Reads
    batches backwards from the end, one at a time; a note ends every acknowledged
    append, so this reads one batch unless a torn append left records after it."""
    start, end = log.start_offset(stream, partition), log.end_offset(stream, partition)
    offset = end - 1
    for _ in range(NOTE_SEARCH_BATCHES_MAX):
        if offset < start:
            return None
        base, _, columns = log.batch_holding(stream, partition, offset)
        count = offset - base + 1
        if columns.kinds is not None:
            hits = np.flatnonzero(np.asarray(columns.kinds[:count]) == NOTE_KIND)
            if len(hits):
                row = int(hits[-1])
                starts = columns.value_offsets()
                value = bytes(columns.values[int(starts[row]):int(starts[row + 1])])
                return PositionNote.decode(value, base + row)
        offset = base - 1
    raise StreamLogError(f"no position note within {NOTE_SEARCH_BATCHES_MAX} batches")


def fitting_checkpoint(store, note: PositionNote | None, input_key: str, output_key: str):
    """The newest checkpoint in `store` (a CheckpointStore) that fits the output up to
    the last note (None: no store, no note, or none fits)."""
    if store is None or note is None:
        return None
    read_to, aligned = note.input_next, note.output_offset + 1
    return store.latest(lambda c: _consistent(
        c.input_offsets.get(input_key), c.output_offsets.get(output_key), read_to, aligned))


def _consistent(ckpt_input: int | None, ckpt_output: int | None, read_to: int,
                aligned: int) -> bool:
    """A checkpoint fits the output when its offsets are not past the last note; one
    taken after the note with no output since (a stretch of input that produced none)
    fits too."""
    if ckpt_input is None or ckpt_output is None:
        return False
    return ckpt_output <= aligned and (ckpt_input <= read_to or ckpt_output == aligned)


@dataclasses.dataclass(frozen=True, slots=True)
class Facts:
    """What recovery finds. `checkpoint`: the newest stored checkpoint consistent with
    the output (its offsets are not past the last note), or None; it may be stale (its
    input offset below the retention start)."""

    input_key: str
    input_start: int
    input_end: int
    output_start: int
    output_end: int
    note: PositionNote | None
    checkpoint: object | None  # a checkpoint.Checkpoint
    checkpoint_input: int | None
    checkpoint_output: int | None
    truncate_mode: bool
    stateless: bool
    fail_on_data_loss: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """What recovery does, in order: reset the state (from `checkpoint`, or the initial
    state), forget output offsets >= `truncate_to` (None: nothing), replay input
    [replay_from, replay_to) with its output suppressed when `quiet`, then process
    input live from `live_from` with output from `output_next`. `lost`: input offsets
    (first, last) whose effect is gone (only with fail_on_data_loss=False)."""

    method: str  # "none", "crb", "full_replay", "resume" or "data_loss"
    checkpoint: object | None
    truncate_to: int | None
    replay_from: int
    replay_to: int
    quiet: bool
    live_from: int
    output_next: int
    origin: int
    read_by_crashed_run: int  # input_next of the last note: what the crashed run had read
    lost: tuple[int, int] | None = None
    notes: tuple[str, ...] = ()


def plan_recovery(facts: Facts) -> Plan:
    """Decide the recovery (module docstring). Raises DataLossError when input that an
    exact recovery needs is gone and the user did not opt in to losing it."""
    f = facts
    note = f.note
    if note is None:
        if f.output_start > 0:
            raise StreamLogError(
                f"the output starts at offset {f.output_start} and holds no position note "
                f"in offsets {f.output_start}..{f.output_end - 1}: retention removed them "
                f"(or it was not written by this runtime); start a new output stream")
        # Nothing acknowledged yet: records without a note are a torn first append.
        notes = ((f"forgetting output offsets 0..{f.output_end - 1}: a first append that "
                  f"was never acknowledged (no position note after it)",)
                 if f.output_end else ())
        return Plan("none", None, 0 if f.output_end else None, f.input_start, f.input_start,
                    False, f.input_start, 0, f.input_start, f.input_start, notes=notes)
    if note.input_key != f.input_key:
        raise StreamLogError(f"the output was produced from input {note.input_key!r}, not "
                             f"{f.input_key!r}")
    read_to, aligned_out = note.input_next, note.output_offset + 1
    tail = aligned_out if f.output_end > aligned_out else None  # never acknowledged
    ckpt = f.checkpoint
    if ckpt is not None and f.checkpoint_input > read_to:
        # Taken after the note, with no output since: that input produced none.
        assert f.checkpoint_output == aligned_out
        read_to = f.checkpoint_input
    if ckpt is not None and f.checkpoint_input >= f.input_start:
        if f.truncate_mode and f.checkpoint_output >= f.output_start:
            return Plan("crb", ckpt, f.checkpoint_output if f.checkpoint_output < f.output_end
                        else None, f.checkpoint_input, read_to, False, read_to,
                        f.checkpoint_output, note.origin, read_to)
        return Plan("crb", ckpt, tail, f.checkpoint_input, read_to, True, read_to, aligned_out,
                    note.origin, read_to)
    if f.stateless:
        if read_to >= f.input_start:
            return Plan("resume", None, tail, read_to, read_to, True, read_to, aligned_out,
                        read_to, read_to)
        lost = (read_to, f.input_start - 1)
        why = (f"the operator had read input up to offset {read_to - 1} and the input now "
               f"starts at {f.input_start}")
    elif note.origin >= f.input_start:
        return Plan("full_replay", None, tail, note.origin, read_to, True, read_to, aligned_out,
                    note.origin, read_to,
                    notes=(f"no usable checkpoint: replaying input offsets {note.origin}.."
                           f"{read_to - 1} ({read_to - note.origin:,} records) with their "
                           f"output suppressed (it is published already)",))
    else:
        lost = (note.origin, f.input_start - 1)
        if ckpt is not None:
            why = (f"the newest checkpoint ({getattr(ckpt, 'sequence_id', '?')}) is at input "
                   f"offset {f.checkpoint_input}, before the input's start {f.input_start}, "
                   f"and rebuilding the state without it needs the input since offset "
                   f"{note.origin}")
        else:
            why = (f"there is no checkpoint, and rebuilding the operator's state needs the "
                   f"input since offset {note.origin}")
    if f.fail_on_data_loss:
        raise DataLossError(f.input_key, lost[0], lost[1], why)
    live_from = max(read_to, f.input_start)
    text = (f"data loss accepted (fail_on_data_loss=False): {why}; input offsets "
            f"{lost[0]}..{lost[1]} are lost; continuing from input offset {live_from} with "
            f"a fresh state; the published output is kept")
    replay_from = live_from if f.stateless else f.input_start
    return Plan("data_loss", None, tail, replay_from, live_from, True, live_from, aligned_out,
                replay_from, read_to, lost, (text,))


def report_plan(plan: Plan, report, output_end: int) -> None:
    """Put the plan into the report (a RecoveryReport) before anything is changed, so a
    dry run reports it too; a plan that accepts data loss is also logged as a warning.
    `output_end`: the output's end when recovery started."""
    report.method = plan.method
    report.replay_from_offset = plan.replay_from
    report.replay_to_offset = plan.replay_to
    report.read_by_crashed_run = plan.read_by_crashed_run
    for text in plan.notes:
        report.note(text)
    if plan.lost is not None:
        report.input_offsets_lost = plan.lost
        recovery_log.warning("%s", plan.notes[-1])
    if plan.checkpoint is not None:
        report.checkpoint_sequence_id = plan.checkpoint.sequence_id
        report.state_bytes_loaded = len(plan.checkpoint.state)
    if plan.truncate_to is not None:
        report.output_records_truncated = output_end - plan.truncate_to
