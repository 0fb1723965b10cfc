"""The aggregate operator's eventual checkpoint (DESIGN 8): rebuilt from its output by a
backward walk, and the decision of where the replay starts (aggregate.py carries it out).

Strategy: the CEC paper's recovery, reading the output backwards
(`iter_batches_backwards`):

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
3. Load: the windows are rebuilt from their footprints (`EventualCheckpoint.windows_by_age`);
   each remembers the input offset it has absorbed through.
4. Replay from the oldest footprint's input offset + 1 (`replay_start`): up to `c`, a
   record is applied only to an open window that has not absorbed it (offset > its
   footprint's), and no output is produced (it is in the log already); from `c + 1` on,
   processing is normal.

If the walk reaches the start of the output without `N` footprints (output retention
removed them), recovery falls back to a full replay from the input's start that
suppresses the output of records <= `c` into a `ScratchOutput`. Both paths give exactly
the failure-free `R`s.

Thread-safety: pure functions over a log the caller owns, on the operator's thread.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import gc

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import CorruptionError
from ..records import RecordKind
from .aggregate_records import FOOTPRINT_DTYPE, WINDOW_RECORD, Window, WindowRecord
from .read_backwards import iter_batches_backwards
from .recovery_report import RecoveryReport

_G_CHECK = int(RecordKind.G_CHECK)
# Records per group of batches that the backward walk processes with one set of
# vectorised calls (hash the keys, find each key's newest record): the first group, and
# the bound the size doubles up to.
GROUP_RECORDS_FIRST = 1 << 8
GROUP_RECORDS = 1 << 17


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

    def windows_by_age(self) -> collections.OrderedDict[bytes, Window]:
        """The footprints as open windows, oldest footprint first (the G_CHECK order);
        each window's fp_in / fp_out is its footprint's input and output offset."""
        records = self.records
        by_age = np.argsort(self.out_offsets, kind="stable")  # oldest footprint first
        keys = [self.keys[i] for i in by_age.tolist()]
        fields = [records[name][by_age].tolist() for name in (
            "first_offset", "last_offset", "start_us", "end_us", "count", "sum", "min", "max",
            "in_offset")]
        windows = map(Window, *fields, self.out_offsets[by_age].tolist())
        return collections.OrderedDict(zip(keys, windows))

    def anchor(self) -> tuple[int, int]:
        """(input offset, high-water mark) of the oldest footprint; without footprints,
        of the last kept record. The replay starts after its input offset."""
        assert self.last is not None
        records = self.records
        if len(records):
            oldest = int(np.argmin(records["in_offset"]))
            return int(records["in_offset"][oldest]), int(records["hwm_us"][oldest])
        return self.last.in_offset, self.last.hwm_us


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


def replay_start(found: EventualCheckpoint,
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
    start = found.anchor()[0] + 1
    return start, ((start, input_start - 1) if start < input_start else None)


def loss_reason(found: EventualCheckpoint, start: int) -> str:
    """Why the input offsets `replay_start` found gone are needed (DataLossError.why)."""
    if not found.complete:
        return (f"the output no longer holds the footprints of the "
                f"{found.last.n_open} open windows, and rebuilding them needs the input "
                f"from the operator's start")
    return (f"the {found.last.n_open} windows open at the cut (input offset "
            f"{found.cut_input - 1}) need the input from offset {start}")


@contextlib.contextmanager
def gc_paused():
    """Recovery allocates many long-lived objects (a window per key) in a burst; the
    cyclic collector would re-scan them over and over while they pile up."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class ScratchOutput:
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


# -- the walk ---------------------------------------------------------------------------

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
