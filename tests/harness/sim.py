"""A seeded simulation of one partition's whole life, replayed exactly from its seed.

Strategy (TigerBeetle's VOPR, `src/vopr.zig`): one `random.Random(seed)` decides
everything: the options of the log (swarm testing: per seed a fsync policy, segment
size, segment age, retention bounds, and a skewed operation mix with some operations
switched off), then each step's operation and its arguments. The log runs on real
files through `FaultFileIO` (power loss) with a `ManualClock` (time moves only when a
step moves it), and every append goes through the blocking API, one at a time, so the
writer thread never groups two appends: the same seed gives the same operations, the
same bytes and the same crashes.

Beside the log the simulator keeps a `Model`: the records the partition must hold
(offsets are list positions, retention's prefix is kept but marked gone), what is
durable, and the transaction states derived from the markers. Every answer the log
gives is checked against it:

  * appends, markers and truncate_after land at the offsets the model predicts;
  * readers from an offset or a timestamp, read_committed or not, data only or not,
    with an end bound or not, deliver exactly the records the model derives;
  * offset_for_timestamp follows the high-water mark rule of DESIGN 5 (the running
    max of the *data* timestamps: control records never move it);
  * retention deletes exactly the segments its bounds condemn, oldest first, never
    one a reader holds, and only a prefix;
  * after a power loss (between steps or in the middle of one), the reopened log holds
    every durable record byte for byte at its offset, then possibly more of what was
    in flight, then only the abort markers the open writes for transactions left open;
    `check_partition` never finds damage in what the crash left;
  * transaction states, last_stable_offset, last_commit, start and end offsets agree;
  * refused calls (ending a transaction that is not open, truncating before the start,
    reading outside the log) are refused;
  * at the end, after a clean close, `check_partition` gives a clean verdict.

A failure raises `SimulationFailure` with the seed, the step, the command that replays
it and the last operations of the trace. Some departures are recognised exactly: the
log's answer is the one a named wrong rule gives (VIOLATIONS). Those are collected, the
model follows the log where they change its state, the run goes on checking
everything else, and `verdict()` raises them together as `ContractViolations`.

The index: for most seeds (a draw of its own, so the other draws of a seed stay what
they were) it lives in `MemoryIndexStorage`, attached to the file system, so a power
loss rolls it back with the segments: every unsynced index transaction may be lost,
whole (LMDB runs without sync; the segments are the truth). Seeks by time are then
checked against the model after every crash and recovery, and again after a clean
reopen. The other seeds run the real LMDB, which a simulated power loss cannot roll
back.

What it leaves out: concurrent appenders (group commit), following readers, several
partitions, the daemon, I/O errors other than power loss, bit flips and damaged index
pages; the other tests in tests/sim cover those.

Not thread-safe: one simulator, one thread (the log's writer thread aside).

Why ~1,000 lines: the model, the operations and their checks are one simulator; the
model alone is small, the checks are most of it.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import random

import streamlog
from streamlog import layout
from streamlog.check import check_partition
from streamlog.integrity import Verdict
from streamlog.records import RecordKind
from streamlog.testing.clock import ManualClock
from streamlog.testing.faultfs import CrashMode, FaultFileIO
from streamlog.testing.memindex import MemoryIndexStorage
from streamlog.txn import TxnState, decode_commit, encode_commit

STREAM = "sim"
MEMORY_INDEX_SHARE = 0.75  # of the seeds whose index a power loss rolls back
SEEKS_AFTER_RECOVERY = 12  # seeks by time checked against the model after each open
TRACE_SHOWN = 30
DAY_US = 86_400 * 1_000_000
TAGS = ("sink-a", "sink-b")
FOOTPRINTS = (RecordKind.G_OPEN, RecordKind.G_CHECK, RecordKind.CHECKPOINT)
# Operation: (base weight, may the swarm switch it off). Reads and plain appends stay on.
OPERATIONS = {
    "append_one": (20, False), "append_batch": (12, False), "append_footprint": (3, True),
    "txn_append": (8, True), "txn_end": (5, True), "advance_clock": (6, True),
    "retention": (4, True), "truncate": (3, True), "hold_reader": (2, True),
    "release_reader": (2, True), "reopen": (2, True), "crash": (2, True),
    "crash_during": (3, True), "read_offset": (8, False), "read_timestamp": (6, True),
}
# What crash_during may interrupt: every operation that writes.
INTERRUPTIBLE = ("append_one", "append_batch", "append_footprint", "txn_append", "txn_end",
                 "truncate", "retention", "reopen")


class SimulationFailure(AssertionError):
    """The log broke a contract. `headline` says how; the message adds the seed, the
    command that replays it and the last operations."""

    def __init__(self, message: str, headline: str) -> None:
        super().__init__(message)
        self.headline = headline


class ContractViolations(SimulationFailure):
    """Departures from the contracts that the simulator recognised exactly (the log's
    answer is the one a named wrong rule gives), collected while the run went on
    checking everything else. `kinds` names them (keys of VIOLATIONS)."""

    def __init__(self, message: str, headline: str, kinds: frozenset) -> None:
        super().__init__(message, headline)
        self.kinds = kinds


# The departures recognised exactly, by kind: the wrong rule whose answer the log gave.
VIOLATIONS = {
    "high-water-mark": "a seek by timestamp counted control records (markers, footprints) "
                       "in the high-water mark; DESIGN 5 says they never move it",
    "last-commit": "last_commit(tag) named a commit that truncate_after or a power loss "
                   "removed from the partition (the segments no longer hold it)",
    "truncate-open-txn": "truncate_after cut the first frame of a transaction whose marker "
                         "it removed, and left the transaction open instead of aborting it",
    "stable-offset": "a read_committed reader delivered records at or past "
                     "last_stable_offset, which log.py says it never does while that "
                     "transaction is open (the reader stops only at the open transaction's "
                     "records it meets: not when it starts after them, nor when retention "
                     "removed them)",
}


@dataclasses.dataclass(frozen=True, slots=True)
class Rec:
    """A record as the model knows it (its offset is its place in the model's list)."""

    value: bytes
    key: bytes | None
    timestamp_us: int
    headers: tuple
    kind: int
    txn_id: int


def rec_of(record) -> Rec:
    return Rec(record.value, record.key, record.timestamp_us, record.headers,
               int(record.kind), record.txn_id)


# -- the model -------------------------------------------------------------------------


class Model:
    """What the partition must hold: `records[o]` is offset o; offsets below `start`
    were removed by retention (kept: they still count for the high-water mark and for
    transaction states); offsets below `durable_end` survive any power loss."""

    def __init__(self, records=(), batches=(), start: int = 0, durable_end: int = 0) -> None:
        self.records: list[Rec] = list(records)
        # The append call (one frame: the blocking API never groups two) of each record.
        self.batches: list[int] = list(batches)
        self.start = start
        self.durable_end = durable_end
        assert len(self.batches) == len(self.records)
        assert 0 <= start <= len(self.records)

    def copy(self) -> "Model":
        return Model(self.records, self.batches, self.start, self.durable_end)

    def add(self, recs: list[Rec], batch: int) -> None:
        self.records += recs
        self.batches += [batch] * len(recs)

    @property
    def end(self) -> int:
        return len(self.records)

    def cut(self, end: int) -> "Model":
        """The model with the records from `end` on gone (a truncate or a lost tail)."""
        assert self.start <= end <= self.end
        return Model(self.records[:end], self.batches[:end], self.start,
                     min(self.durable_end, end))

    # -- transactions (DESIGN 6: states come from the markers) ------------------------

    def txns(self) -> dict[int, tuple[TxnState, int]]:
        """{txn_id: (state, first data offset)} over every record, retention's too."""
        out: dict[int, tuple[TxnState, int]] = {}
        for offset, rec in enumerate(self.records):
            if rec.txn_id == 0:
                continue
            first = out[rec.txn_id][1] if rec.txn_id in out else offset
            if rec.kind == RecordKind.COMMIT:
                out[rec.txn_id] = (TxnState.COMMITTED, first)
            elif rec.kind == RecordKind.ABORT:
                out[rec.txn_id] = (TxnState.ABORTED, first)
            elif rec.txn_id not in out:
                out[rec.txn_id] = (TxnState.OPEN, offset)
        return out

    def open_txns(self) -> dict[int, int]:
        return {t: first for t, (state, first) in self.txns().items()
                if state is TxnState.OPEN}

    def txns_with_data_from(self, txn_ids, start: int) -> list[int]:
        """Those of `txn_ids` with data at or after `start`: the ones a writer can
        confirm open from the segments (it never acts on the index alone)."""
        found = {r.txn_id for r in self.records[start:]
                 if r.txn_id and r.kind == RecordKind.DATA}
        return sorted(t for t in txn_ids if t in found)

    def last_stable_offset(self) -> int:
        return min(self.open_txns().values(), default=self.end)

    def last_commit(self, tag: str) -> bytes | None:
        for rec in reversed(self.records):
            if rec.kind == RecordKind.COMMIT:
                found_tag, marker = decode_commit(rec.value)
                if found_tag == tag:
                    return marker
        return None

    # -- time ---------------------------------------------------------------------------

    def high_water_marks(self, *, markers_move: bool = False) -> list[int | None]:
        """Running max timestamp at each offset. DESIGN 5: of the data records only
        (None before the first); `markers_move` counts control records too."""
        out, running = [], None
        for rec in self.records:
            if markers_move or rec.kind == RecordKind.DATA:
                running = rec.timestamp_us if running is None else max(running,
                                                                       rec.timestamp_us)
            out.append(running)
        return out

    def offset_for_timestamp(self, timestamp_us: int, hwm) -> int:
        for offset in range(self.start, self.end):
            if hwm[offset] is not None and hwm[offset] >= timestamp_us:
                return offset
        return self.end

    def visible(self, start: int, *, stop: int | None, stop_timestamp_us: int | None,
                read_committed: bool, data_only: bool, hwm) -> list[int]:
        """Offsets a non-following reader from `start` delivers."""
        states = self.txns()
        out = []
        end = self.end if stop is None else min(stop, self.end)
        if read_committed:  # nothing at or after the last stable offset
            end = min(end, self.last_stable_offset())
        for offset in range(start, end):
            rec = self.records[offset]
            if stop_timestamp_us is not None and hwm[offset] is not None and (
                    hwm[offset] >= stop_timestamp_us):
                break
            if read_committed and rec.txn_id:
                state = states[rec.txn_id][0]
                if state is TxnState.OPEN:
                    break  # the last stable offset: wait for the transaction to end
                if state is TxnState.ABORTED:
                    continue
            if data_only and rec.kind != RecordKind.DATA:
                continue
            out.append(offset)
        return out


# -- the options of one seed -----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Setup:
    """Swarm testing: what one seed's log and operation mix look like."""

    fsync: str
    segment_bytes_max: int
    segment_age_max_s: float
    retention_bytes: int | None
    retention_age_s: float | None
    weights: dict

    @classmethod
    def draw(cls, rng: random.Random) -> "Setup":
        segment = rng.choice([4096, 8192, 16384])
        weights = {}
        for name, (weight, optional) in OPERATIONS.items():
            off = optional and rng.random() < 0.2
            weights[name] = 0 if off else weight * rng.choice([1, 1, 2, 4])
        return cls(fsync="always" if rng.random() < 0.75 else "never",
                   segment_bytes_max=segment,
                   segment_age_max_s=rng.choice([60.0, 600.0, 7 * 86_400.0]),
                   retention_bytes=rng.choice([None, 3 * segment, 8 * segment]),
                   retention_age_s=rng.choice([None, 300.0, 3600.0]), weights=weights)

    def options(self) -> dict:
        return dict(fsync=self.fsync, segment_bytes_max=self.segment_bytes_max,
                    segment_age_max_s=self.segment_age_max_s,
                    retention_bytes=self.retention_bytes,
                    retention_age_s=self.retention_age_s)

    def describe(self) -> str:
        off = sorted(n for n, w in self.weights.items() if w == 0)
        return (f"fsync={self.fsync} segment_bytes_max={self.segment_bytes_max} "
                f"segment_age_max_s={self.segment_age_max_s:g} "
                f"retention_bytes={self.retention_bytes} "
                f"retention_age_s={self.retention_age_s} off={','.join(off) or '-'}")


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One state the log may legitimately be in after a power loss: a prefix of
    `model`'s records from `model.start`, at least up to `floor`."""

    model: Model
    floor: int


_LOST = object()  # what an interrupted call returns


class Simulator:
    """Runs `steps` operations on a new log at `path`, chosen by `seed`.

    `replay` is the shell command that runs this seed alone (put in failure messages).
    """

    def __init__(self, seed: int, path, steps: int, *, replay: str = "") -> None:
        self.seed = seed
        self.path = str(path)
        self.steps = steps
        self.replay = replay
        self.rng = random.Random(seed)
        self.setup = Setup.draw(self.rng)
        self.directory = layout.partition_dir(self.path, STREAM, 0)
        self.clock = ManualClock()
        self.model = Model()
        self.trace: list[str] = []
        self.stats: collections.Counter = collections.Counter()
        self.violations: dict[str, list[str]] = collections.defaultdict(list)
        self.commits_written: dict[str, list[bytes]] = collections.defaultdict(list)
        self.step = 0
        self.serial = 0
        self.batch_serial = 0
        self.doomed = False  # a crash is scheduled inside the running operation
        self.held: list[tuple[object, int]] = []  # (reader, offset it holds)
        self.written_here: set[int] = set()  # transactions this log object wrote
        # (a generator of its own: the draws of `rng` stay those of earlier versions)
        self.index_storage = MemoryIndexStorage() if random.Random(
            seed ^ 0x1D3E).random() < MEMORY_INDEX_SHARE else None
        self.seek_rng = random.Random(seed ^ 0x5EE4)  # the seeks after each recovery
        self.fs = self._boot()
        self.log = self._open()
        self.log.create_stream(STREAM)
        self._note(f"open {self.setup.describe()}")

    # -- running ----------------------------------------------------------------------

    def run(self) -> None:
        """Every step, then a clean close and a full check. Raises SimulationFailure at
        the first broken contract; collected violations wait for `verdict`."""
        names = list(self.setup.weights)
        weights = [self.setup.weights[n] for n in names]
        for self.step in range(1, self.steps + 1):
            name = self.rng.choices(names, weights)[0]
            self.stats[name] += 1
            self._guarded(name, getattr(self, "op_" + name))
        self.step = self.steps + 1
        self._guarded("finish", self.finish)

    def verdict(self) -> None:
        """Raise the violations `run` collected, if any."""
        if not self.violations:
            return
        lines = [f"{kind} ({len(found)} times): {VIOLATIONS[kind]}; the first: {found[0]}"
                 for kind, found in sorted(self.violations.items())]
        headline = "\n  ".join(["contract violations:"] + lines)
        raise ContractViolations(self._context(headline), headline, frozenset(self.violations))

    def violation(self, kind: str, message: str) -> None:
        assert kind in VIOLATIONS, kind
        self.violations[kind].append(f"step {self.step}: {message}")
        self._note(f"VIOLATION {kind}: {message}")

    def close(self) -> None:
        """Let go of the log whatever state it is in (test teardown)."""
        try:
            self.log.close()
        except Exception:  # noqa: BLE001 - a failed run's log may be in any state
            pass

    def _guarded(self, name: str, action) -> None:
        try:
            action()
        except SimulationFailure:
            raise
        except Exception as error:  # noqa: BLE001 - any other exception is a finding
            raise self.failure(f"{name} raised {error!r}") from error

    def failure(self, message: str) -> SimulationFailure:
        return SimulationFailure(self._context(message), message)

    def check(self, condition: bool, message) -> None:
        if not condition:
            raise self.failure(message() if callable(message) else message)

    def _context(self, message: str) -> str:
        lines = [f"seed={self.seed} step={self.step}/{self.steps}: {message}",
                 f"setup: {self.setup.describe()}"]
        if self.replay:
            lines.append(f"replay: {self.replay}")
        lines.append(f"last {TRACE_SHOWN} operations:")
        lines += [f"  {line}" for line in self.trace[-TRACE_SHOWN:]]
        return "\n".join(lines)

    def _note(self, text: str) -> None:
        self.trace.append(f"{self.step:5d} {text}")

    def _call(self, action):
        """Run one call of the log; while a crash is scheduled, a failure that the
        crash explains is returned as _LOST instead of raised."""
        if not self.doomed:
            return action()
        try:
            return action()
        except (OSError, streamlog.PartitionFailed) as error:
            self.check(self.fs.crashed, f"a call failed with no crash: {error!r}")
            return _LOST

    # -- generating records -----------------------------------------------------------

    def _record(self, *, clock_stamped: bool, headers: bool, kind: int = RecordKind.DATA,
                txn_id: int = 0) -> Rec:
        rng = self.rng
        self.serial += 1
        size = rng.randint(0, 200) if rng.random() < 0.9 else rng.randint(500, 3000)
        body = rng.randbytes(size) if rng.random() < 0.6 else bytes([self.serial % 251]) * size
        key = None if rng.random() < 0.3 else rng.randbytes(rng.randint(0, 12))
        now = self.clock.wall_us()
        if clock_stamped:
            timestamp = now
        elif rng.random() < 0.1:
            timestamp = now - rng.randint(DAY_US, 365 * DAY_US)  # late data
        else:
            timestamp = now + rng.randint(-2_000_000, 2_000_000)
        extra = (("h", rng.randbytes(3)),) if headers and rng.random() < 0.7 else ()
        return Rec(b"%d:" % self.serial + body, key, timestamp, extra, int(kind), txn_id)

    def _records(self, count: int, *, kinds=None, txn_id: int = 0) -> tuple[list[Rec], bool]:
        """`count` new records, and whether the call leaves the stamping to the log."""
        clock_stamped = self.rng.random() < 0.4
        headers = self.rng.random() < 0.15
        recs = [self._record(clock_stamped=clock_stamped, headers=headers,
                             kind=kinds[i] if kinds else RecordKind.DATA, txn_id=txn_id)
                for i in range(count)]
        return recs, clock_stamped

    def _append(self, recs: list[Rec], clock_stamped: bool, *, single: bool,
                txn_id: int = 0):
        """Append through the blocking API; returns the first offset, or _LOST."""
        timestamps = None if clock_stamped else [r.timestamp_us for r in recs]
        headers = [r.headers for r in recs] if any(r.headers for r in recs) else None
        if single:
            rec = recs[0]
            position = self._call(lambda: self.log.append_sync(
                STREAM, rec.value, key=rec.key, timestamp_us=None if clock_stamped
                else rec.timestamp_us, headers=rec.headers or None,
                kind=RecordKind(rec.kind), txn_id=txn_id))
            return position if position is _LOST else position.offset
        kinds = [r.kind for r in recs] if any(r.kind for r in recs) else None
        result = self._call(lambda: self.log.append_batch_sync(
            STREAM, [r.value for r in recs], keys=[r.key for r in recs],
            timestamps_us=timestamps, headers=headers, kinds=kinds, txn_id=txn_id))
        if result is _LOST:
            return _LOST
        self.check(result.records == len(recs), f"append_batch reported {result}")
        first, last = result.ranges[0]
        self.check(last - first + 1 == len(recs), f"append_batch reported {result}")
        return first

    def _appended(self, name: str, recs: list[Rec], first) -> list[Candidate] | None:
        """After an append: check where it landed and adopt it (or, interrupted, say
        what the crash may have left)."""
        plan = self.model.copy()
        plan.add(recs, self._batch())
        if first is _LOST:
            self._note(f"{name} x{len(recs)} interrupted at {self.model.end}")
            return [Candidate(plan, self.model.durable_end)]
        self.check(first == self.model.end,
                   f"{name} of {len(recs)} landed at {first}, not at the end "
                   f"{self.model.end}")
        self._adopt(plan)
        self._note(f"{name} x{len(recs)} at {first}")
        return None

    def _adopt(self, plan: Model) -> None:
        """The log acknowledged `plan`: make it the model and move the durable end."""
        if self.setup.fsync == "always":
            plan.durable_end = plan.end
        else:  # a rolled segment is fsynced and sealed whatever the policy
            plan.durable_end = max(plan.durable_end, min(self._active_base(), plan.end))
        self.model = plan

    def _batch(self) -> int:
        self.batch_serial += 1
        return self.batch_serial

    def _active_base(self) -> int:
        bases = [layout.parse_segment_name(n) for n in os.listdir(self.directory)]
        return max(b for b in bases if b is not None)

    # -- operations that write ---------------------------------------------------------

    def op_append_one(self):
        recs, clock_stamped = self._records(1)
        return self._appended("append_one", recs,
                              self._append(recs, clock_stamped, single=True))

    def op_append_batch(self):
        recs, clock_stamped = self._records(self.rng.randint(1, 20))
        return self._appended("append_batch", recs,
                              self._append(recs, clock_stamped, single=False))

    def op_append_footprint(self):
        """Control records a caller writes itself (CEC footprints, checkpoint notes)."""
        count = self.rng.randint(1, 6)
        kinds = [int(self.rng.choice(FOOTPRINTS)) if self.rng.random() < 0.5
                 else int(RecordKind.DATA) for _ in range(count)]
        if not any(kinds):
            kinds[0] = int(RecordKind.G_CHECK)
        recs, clock_stamped = self._records(count, kinds=kinds)
        return self._appended("append_footprint", recs,
                              self._append(recs, clock_stamped, single=False))

    def op_txn_append(self):
        open_here = sorted(set(self.model.open_txns()) & self.written_here)
        if open_here and self.rng.random() < 0.6:
            txn_id = self.rng.choice(open_here)
        else:
            txn_id = self._new_txn_id()
        self.written_here.add(txn_id)
        recs, clock_stamped = self._records(self.rng.randint(1, 8), txn_id=txn_id)
        single = len(recs) == 1 and self.rng.random() < 0.5
        return self._appended(f"txn_append {txn_id:#x}", recs,
                              self._append(recs, clock_stamped, single=single,
                                           txn_id=txn_id))

    def _new_txn_id(self) -> int:
        used = self.model.txns()
        while True:
            txn_id = self.rng.getrandbits(64)
            if txn_id and txn_id not in used and txn_id not in self.written_here:
                return txn_id

    def op_txn_end(self):
        txns = self.model.txns()
        open_here = sorted(t for t in self.written_here
                           if t in txns and txns[t][0] is TxnState.OPEN)
        if not open_here or (not self.doomed and self.rng.random() < 0.1):
            return self._txn_end_refused(txns)
        txn_id = self.rng.choice(open_here)
        now = self.clock.wall_us()
        if self.rng.random() < 0.7:
            tag, marker = self.rng.choice(TAGS), self.rng.randbytes(self.rng.randint(1, 8))
            self.commits_written[tag].append(marker)
            offset = self._call(lambda: self.log.commit_txn(STREAM, 0, txn_id, tag=tag,
                                                            marker=marker))
            rec = Rec(encode_commit(tag, marker), None, now, (), int(RecordKind.COMMIT),
                      txn_id)
        else:
            offset = self._call(lambda: self.log.abort_txn(STREAM, 0, txn_id))
            rec = Rec(b"", None, now, (), int(RecordKind.ABORT), txn_id)
        return self._appended(f"{RecordKind(rec.kind).name.lower()} {txn_id:#x}", [rec],
                              offset)

    def _txn_end_refused(self, txns) -> None:
        """Ending a transaction that is not open (ended, or never seen) is refused."""
        ended = sorted(t for t, (state, _) in txns.items() if state is not TxnState.OPEN)
        txn_id = self.rng.choice(ended) if ended and self.rng.random() < 0.7 \
            else self._new_txn_id()
        if self.rng.random() < 0.5:
            self._refused(lambda: self.log.commit_txn(STREAM, 0, txn_id, tag="refused"),
                          streamlog.InvalidArgument, f"commit of {txn_id:#x} (not open)")
        else:
            self._refused(lambda: self.log.abort_txn(STREAM, 0, txn_id),
                          streamlog.InvalidArgument, f"abort of {txn_id:#x} (not open)")

    def op_truncate(self):
        model, rng = self.model, self.rng
        choice = rng.random()
        if choice < 0.1 and model.start >= 2:
            offset = model.start - 2 - rng.randint(0, model.start - 2)  # before the start
        elif choice < 0.2:
            offset = model.end - 1 + rng.randint(0, 2)  # at or past the end: nothing
        elif choice < 0.3:
            offset = model.start - 1  # everything
        else:
            offset = rng.randint(model.start - 1, max(model.end - 1, model.start - 1))
        new_end = offset + 1
        if new_end < model.start:
            if not self.doomed:
                self._refused(lambda: self.log.truncate_after(STREAM, 0, offset),
                              streamlog.OffsetOutOfRange,
                              f"truncate_after({offset}) before the start {model.start}")
            return None
        if new_end >= model.end:
            plan = left_open = model.copy()
        else:
            plan = self._truncated(model, new_end, leave_cut_frame_open=False)
            left_open = self._truncated(model, new_end, leave_cut_frame_open=True)
        result = self._call(lambda: self.log.truncate_after(STREAM, 0, offset))
        if result is _LOST:
            self._note(f"truncate_after {offset} interrupted")
            return [Candidate(model, model.durable_end),
                    Candidate(plan, min(new_end, plan.end)),
                    Candidate(left_open, min(new_end, left_open.end))]
        if result != plan.end and result == left_open.end:
            self.violation("truncate-open-txn", f"truncate_after({offset}) returned "
                           f"{result}, not {plan.end}: it aborted "
                           f"{left_open.end - new_end} transactions, not {plan.end - new_end}")
            plan = left_open
        self.check(result == plan.end, f"truncate_after({offset}) returned {result}, "
                   f"expected the new end {plan.end}")
        since = max(plan.start, min(new_end, model.end) - 3)
        got = [rec_of(r) for r in self._read_all(since)]
        self.check(got == plan.records[since:], lambda: (
            f"after truncate_after({offset}) the log holds "
            f"{[_short(r) for r in got]} from {since}, expected "
            f"{[_short(r) for r in plan.records[since:]]}"))
        self._adopt(plan)
        if new_end < model.end:
            self.model.durable_end = max(self.model.durable_end, new_end)  # it fsyncs
        self._note(f"truncate_after {offset} -> end {result}")
        return None

    def _truncated(self, model: Model, new_end: int, *, leave_cut_frame_open: bool) -> Model:
        """truncate_after(new_end - 1): the records from new_end on are gone, and a
        transaction whose marker was cut off (open again) is aborted, once confirmed
        from its data still in the segments. `leave_cut_frame_open`: the wrong rule
        under which one whose first frame is the cut one is left open."""
        plan = model.cut(new_end)
        before, after = model.txns(), plan.txns()
        reopened = [t for t, (state, first) in after.items() if state is TxnState.OPEN
                    and before[t][0] is not TxnState.OPEN and not (
                        leave_cut_frame_open
                        and model.batches[first] == model.batches[new_end])]
        now = self.clock.wall_us()
        for txn_id in plan.txns_with_data_from(reopened, plan.start):
            plan.add([Rec(b"", None, now, (), int(RecordKind.ABORT), txn_id)], self._batch())
        return plan

    def op_retention(self):
        segments = self._segments()
        now = self.clock.wall_us()
        hold = min((h for _, h in self.held), default=None)
        expected = {self._condemned(segments, now, hold, markers_move=m) for m in (False, True)}
        deleted = self._call(self.log.apply_retention)
        if deleted is _LOST:
            self._note("retention interrupted")
            return [Candidate(self._retained(base), self.model.durable_end)
                    for base in sorted({s[0] for s in segments[:max(expected) + 1]})]
        count = len(deleted)
        self.check([os.path.basename(p) for p in deleted] ==
                   [os.path.basename(s[2]) for s in segments[:count]],
                   f"retention deleted {deleted}, not the oldest segments of "
                   f"{[os.path.basename(s[2]) for s in segments]}")
        self.check(count in expected, lambda: (
            f"retention deleted {count} segments, expected {sorted(expected)} "
            f"(sizes {[s[1] for s in segments]}, hold {hold}, now {now})"))
        plan = self._retained(segments[count][0])
        self.check(self.log.start_offset(STREAM, 0) == plan.start,
                   f"start offset {self.log.start_offset(STREAM, 0)} after retention, "
                   f"expected {plan.start}")
        self.check(hold is None or plan.start <= hold,
                   f"retention removed offset {hold}, which a reader holds")
        self.model = plan
        self.stats["segments_deleted"] += count
        self._note(f"retention deleted {count} of {len(segments)} -> start {plan.start}")
        return None

    def _segments(self) -> list[tuple[int, int, str]]:
        """(base offset, size, path) of each segment, oldest first."""
        out = []
        for name in os.listdir(self.directory):
            base = layout.parse_segment_name(name)
            if base is not None:
                path = os.path.join(self.directory, name)
                out.append((base, os.path.getsize(path), path))
        return sorted(out)

    def _condemned(self, segments, now_us: int, hold, *, markers_move: bool) -> int:
        """How many of the oldest segments the retention bounds delete. A segment's age
        is the high-water mark after its last record; DESIGN does not say whether
        control records count there, so both readings are accepted."""
        setup, hwm = self.setup, self.model.high_water_marks(markers_move=markers_move)
        total = sum(size for _, size, _ in segments)
        count = 0
        while count + 1 < len(segments):
            following = segments[count + 1][0]
            if hold is not None and following > hold:
                break
            mark = hwm[following - 1] if following > 0 else None
            too_old = (setup.retention_age_s is not None and mark is not None
                       and mark < now_us - setup.retention_age_s * 1e6)
            too_big = setup.retention_bytes is not None and total > setup.retention_bytes
            if not (too_old or too_big):
                break
            total -= segments[count][1]
            count += 1
        return count

    def _retained(self, start: int) -> Model:
        plan = self.model.copy()
        plan.start = start
        return plan

    def op_reopen(self):
        """A clean close, then a writable open on the same file system."""
        self._drop_readers()
        try:
            self.log.close()
        except OSError:
            if not (self.doomed and self.fs.crashed):
                raise  # (a power loss may land in the close: the index's seal is written)
        if self.doomed:
            self._note("close (a crash is scheduled)")
            return None
        self._check_files(clean=True)
        self.log = self._open()
        self._reconcile([Candidate(self.model, self.model.end)], "clean reopen")
        self._check_seeks("after a clean reopen")
        return None

    # -- power loss --------------------------------------------------------------------

    def op_crash(self):
        mode = self.rng.choice(list(CrashMode))
        self.fs.crash(random.Random(self.rng.getrandbits(32)), mode)
        self._note(f"crash {mode.value}")
        self._after_crash([Candidate(self.model, self.model.durable_end)])

    def op_crash_during(self):
        """Schedule a power loss a few file-system steps ahead, then run an operation
        that writes: it is cut short wherever the crash lands (or, when it takes fewer
        steps, the crash follows it)."""
        name = self.rng.choice([n for n in INTERRUPTIBLE if self.setup.weights[n]]
                               or ["append_one"])
        mode = self.rng.choice(list(CrashMode))
        ahead = self.rng.randint(1, 12)
        self.fs.crash_at_step(self.fs.steps + ahead, mode,
                              random.Random(self.rng.getrandbits(32)))
        self._note(f"crash {mode.value} scheduled {ahead} steps ahead, during {name}")
        self.doomed = True
        try:
            candidates = getattr(self, "op_" + name)()
        finally:
            self.doomed = False
        if not self.fs.crashed:
            self.fs.crash(random.Random(self.rng.getrandbits(32)), mode)
            self._note("crash after it")
        self.stats["crash_during_" + name] += 1
        self._after_crash(candidates or [Candidate(self.model, self.model.durable_end)])

    def _after_crash(self, candidates: list[Candidate]) -> None:
        self.stats["crashes"] += 1
        self._drop_readers()
        self.fs.abandon(self.log)
        self._check_files(clean=False)
        if self.rng.random() < 0.5:  # the dead process's close sealed it: a real one cannot
            seal = os.path.join(self.directory, "index.seal")
            if os.path.exists(seal):
                os.unlink(seal)
        if self.rng.random() < 0.25:
            self._check_read_only(candidates)
        self.fs = self._boot()
        self.log = self._open()
        self._reconcile(candidates, "reopen after the crash")
        self._check_seeks("after the crash and recovery")

    def _check_files(self, *, clean: bool) -> None:
        """check_partition over the closed files: clean after a clean close; after a
        power loss at most a torn or stale tail, never damage."""
        result = check_partition(STREAM, 0, self.directory)
        if clean:
            self.check(result.verdict is Verdict.CLEAN and not result.payload_findings,
                       f"check_partition after a clean close: {result.as_dict()}")
            self.check(result.end_offset == self.model.end,
                       f"check_partition ends at {result.end_offset}, the log at "
                       f"{self.model.end}")
            self.check(result.records == self.model.end - self.model.start,
                       f"check_partition counted {result.records} records, the log has "
                       f"{self.model.end - self.model.start}")
        else:
            self.check(not result.damaged, f"check_partition after a crash: "
                       f"{result.as_dict()}")
        self.stats["checks"] += 1

    def _boot(self) -> FaultFileIO:
        """A file system for the next process (after a power loss: the machine is back),
        with the memory index, if this seed has one, losing power with it."""
        fs = FaultFileIO(self.rng.getrandbits(32))
        if self.index_storage is not None:
            self.index_storage.attach(fs)
        return fs

    def _open(self):
        return streamlog.open_log(self.path, fileio=self.fs, clock=self.clock,
                                  index_storage=self.index_storage, **self.setup.options())

    def _check_seeks(self, what: str, log=None) -> None:
        """Seeks by time against the model (DESIGN 5), as many as SEEKS_AFTER_RECOVERY:
        an index that outlived the bytes it described answers wrong here."""
        log = log or self.log
        hwm = self.model.high_water_marks()
        hwm_moved = self.model.high_water_marks(markers_move=True)
        for _ in range(SEEKS_AFTER_RECOVERY):
            timestamp = self._probe_timestamp(self.seek_rng)
            self._judge(f"offset_for_timestamp({timestamp}) {what}",
                        log.offset_for_timestamp(STREAM, 0, timestamp),
                        self.model.offset_for_timestamp(timestamp, hwm),
                        self.model.offset_for_timestamp(timestamp, hwm_moved))
        self.stats["seeks_after_recovery"] += SEEKS_AFTER_RECOVERY

    def _check_read_only(self, candidates: list[Candidate]) -> None:
        """A read-only open of the crashed files (it writes nothing, so no abort
        markers): a durable prefix of one candidate, however much more."""
        with streamlog.open_log(self.path, readonly=True,
                                index_storage=self.index_storage) as view:
            start = view.start_offset(STREAM, 0)
            got = [rec_of(r) for r in view.reader(STREAM, 0, read_committed=False,
                                                  data_only=False)]
        for candidate in candidates:
            model = candidate.model
            if start == model.start and candidate.floor <= start + len(got) <= model.end \
                    and got == model.records[start:start + len(got)]:
                self._note(f"read-only view: [{start}, {start + len(got)})")
                return
        raise self.failure(f"a read-only open after the crash shows [{start}, "
                           f"{start + len(got)}), which fits no state the crash could "
                           f"leave: {self._describe(candidates)}")

    def _reconcile(self, candidates: list[Candidate], what: str) -> None:
        """After a writable open: the log must hold a candidate's records from its
        start up to some end at or past its floor, then only the abort markers the
        open wrote for the transactions still open there. That becomes the model."""
        self.written_here = set()
        start, end = self.log.start_offset(STREAM, 0), self.log.end_offset(STREAM, 0)
        got = [rec_of(r) for r in self._read_all(start)]
        for candidate in candidates:
            cut = self._recovered_end(candidate, start, got)
            if cut is None:
                continue
            model = candidate.model
            plan = model.cut(cut)
            for abort in got[cut - start:]:
                plan.add([abort], self._batch())
            self._adopt(plan)
            if self.setup.fsync == "never":  # recovery found it on the disk; not the aborts
                self.model.durable_end = max(self.model.durable_end, cut)
            self.stats["records_lost"] += model.end - cut
            self._note(f"{what}: [{start}, {end}), kept {cut - start}, lost "
                       f"{model.end - cut}, aborted {end - cut}")
            return
        raise self.failure(f"{what}: the log holds [{start}, {end}), which fits no state "
                           f"the model allows: {self._describe(candidates)}; "
                           f"first difference: {self._first_difference(got, start, candidates)}")

    def _recovered_end(self, candidate: Candidate, start: int, got: list[Rec]) -> int | None:
        """The least end `cut` at which `got` (the log from `start`) is the candidate's
        records up to `cut`, then the aborts the open wrote; None when there is none.
        The least: an abort the open wrote may equal one the model had there."""
        model = candidate.model
        if model.start != start:
            return None
        now = self.clock.wall_us()
        matched = start
        while matched < model.end and matched - start < len(got) and (
                got[matched - start] == model.records[matched]):
            matched += 1
        for cut in range(max(candidate.floor, start), matched + 1):
            plan = model.cut(cut)
            # every open transaction: confirmed from its data, or with all its data
            # removed by retention (it would hold the last stable offset back for good)
            orphans = sorted(plan.open_txns())
            if got[cut - start:] == [Rec(b"", None, now, (), int(RecordKind.ABORT), t)
                                     for t in orphans]:
                return cut
        return None

    def _read_all(self, start: int) -> list:
        records = list(self.log.reader(STREAM, 0, from_offset=start, read_committed=False,
                                       data_only=False))
        offsets = [r.offset for r in records]
        self.check(offsets == list(range(start, start + len(records))),
                   f"offsets are not dense from {start}: {offsets[:5]}...")
        self.check(start + len(records) == self.log.end_offset(STREAM, 0),
                   f"a reader from {start} delivered {len(records)} records; the end "
                   f"offset is {self.log.end_offset(STREAM, 0)}")
        return records

    @staticmethod
    def _describe(candidates: list[Candidate]) -> str:
        return "; ".join(f"[{c.model.start}, {c.model.end}) durable to {c.floor}"
                         for c in candidates)

    @staticmethod
    def _first_difference(got: list[Rec], start: int, candidates) -> str:
        model = candidates[0].model
        for i, rec in enumerate(got):
            offset = start + i
            if offset >= model.end or model.records[offset] != rec:
                expected = model.records[offset] if offset < model.end else None
                return f"offset {offset}: got {_short(rec)}, expected {_short(expected)}"
        return f"the log ends at {start + len(got)}"

    def _drop_readers(self) -> None:
        for reader, _ in self.held:
            reader.close()
        self.held = []

    # -- operations that do not write --------------------------------------------------

    def op_advance_clock(self):
        choice = self.rng.random()
        if choice < 0.5:
            seconds = self.rng.randint(1, 2_000_000) / 1e6
        elif choice < 0.9:
            seconds = float(self.rng.randint(1, 120))
        else:
            seconds = float(self.rng.randint(600, 7200))
        self.clock.advance(seconds)
        self._note(f"advance_clock {seconds:g}s")

    def op_hold_reader(self):
        offset = self.rng.randint(self.model.start, self.model.end)
        self.held.append((self.log.reader(STREAM, 0, from_offset=offset), offset))
        self._note(f"hold_reader {offset}")

    def op_release_reader(self):
        if self.held:
            reader, offset = self.held.pop(self.rng.randrange(len(self.held)))
            reader.close()
            self._note(f"release_reader {offset}")

    def op_read_offset(self):
        model, rng = self.model, self.rng
        choice = rng.random()
        if choice < 0.1:
            start = model.start - 1 - rng.randint(0, 3) if model.start and rng.random() < 0.5 \
                else model.end + 1 + rng.randint(0, 3)
            self._refused(lambda: self.log.reader(STREAM, 0, from_offset=start),
                          streamlog.OffsetOutOfRange, f"a reader from offset {start} outside "
                          f"[{model.start}, {model.end}]")
            return
        start = model.start if choice < 0.2 else rng.randint(model.start, model.end)
        stop = rng.randint(start - 1, model.end + 2) if rng.random() < 0.3 else None
        read_committed, data_only = rng.random() < 0.5, rng.random() < 0.7
        hwm = model.high_water_marks()
        expected = model.visible(start, stop=stop, stop_timestamp_us=None,
                                 read_committed=read_committed, data_only=data_only, hwm=hwm)
        reader = self.log.reader(STREAM, 0, from_offset=start, to_offset=stop,
                                 read_committed=read_committed, data_only=data_only)
        what = (f"reader(from_offset={start}, to_offset={stop}, read_committed="
                f"{read_committed}, data_only={data_only})")
        if rng.random() < 0.2:
            got = [o for batch in reader.arrow() for o in batch.column("offset").to_pylist()]
            self.check(got == expected, lambda: f"{what}.arrow() offsets "
                       f"{_span(got)}, expected {_span(expected)}")
        else:
            self._check_records(what, list(reader), expected)
        if read_committed:
            self._check_stable(what, expected)
        self._check_positions()
        self._note(f"read_offset {start}..{stop} rc={int(read_committed)} "
                   f"data={int(data_only)} -> {len(expected)}")

    def _refused(self, action, error: type, what: str) -> None:
        """`action` must raise `error`: the log refuses `what`."""
        try:
            action()
        except error:
            self._note(f"{what}: refused")
            return
        raise self.failure(f"{what} was accepted")

    def _check_records(self, what: str, records, expected: list[int]) -> None:
        got = [r.offset for r in records]
        self.check(got == expected, lambda: f"{what} delivered offsets {_span(got)}, "
                   f"expected {_span(expected)}")
        for record in records:
            rec = self.model.records[record.offset]
            self.check(rec_of(record) == rec, lambda: f"{what}: offset {record.offset} "
                       f"holds {_short(rec_of(record))}, expected {_short(rec)}")

    def op_read_timestamp(self):
        model, rng = self.model, self.rng
        hwm = model.high_water_marks()
        hwm_moved = model.high_water_marks(markers_move=True)
        timestamp = self._probe_timestamp()
        design = model.offset_for_timestamp(timestamp, hwm)
        moved = model.offset_for_timestamp(timestamp, hwm_moved)
        found = self.log.offset_for_timestamp(STREAM, 0, timestamp)
        self._judge(f"offset_for_timestamp({timestamp})", found, design, moved)
        stop = self._probe_timestamp() if rng.random() < 0.3 else None
        read_committed, data_only = rng.random() < 0.5, rng.random() < 0.7
        expected = {rule: model.visible(start, stop=None, stop_timestamp_us=stop,
                                        read_committed=read_committed,
                                        data_only=data_only, hwm=marks)
                    for rule, start, marks in (("design", design, hwm),
                                               ("moved", moved, hwm_moved))}
        records = list(self.log.reader(STREAM, 0, from_timestamp_us=timestamp,
                                       to_timestamp_us=stop, read_committed=read_committed,
                                       data_only=data_only))
        what = (f"reader(from_timestamp_us={timestamp}, to_timestamp_us={stop}, "
                f"read_committed={read_committed}, data_only={data_only})")
        got = [r.offset for r in records]
        self._judge(what, _span(got), _span(expected["design"]), _span(expected["moved"]))
        self._check_records(what, records, got)  # each one's content, wherever it starts
        if read_committed:
            self._check_stable(what, got)
        self._check_positions()
        self._note(f"read_timestamp {timestamp}..{stop} rc={int(read_committed)} "
                   f"data={int(data_only)} -> offset {found}, {len(got)} records")

    def _check_stable(self, what: str, delivered: list[int]) -> None:
        """The promise of last_stable_offset: a read_committed reader delivers nothing
        at or past it (checked on the log's own answers; the model agrees on both)."""
        stable = self.log.last_stable_offset(STREAM, 0)
        if delivered and delivered[-1] >= stable:
            self.violation("stable-offset", f"{what} delivered offset {delivered[-1]}; "
                           f"last_stable_offset is {stable}")

    def _probe_timestamp(self, rng: random.Random | None = None) -> int:
        """A timestamp worth asking about: a record's (or one off), or beyond all."""
        model, rng = self.model, rng or self.rng
        stamps = [r.timestamp_us for r in model.records[model.start:]]
        choice = rng.random()
        if stamps and choice < 0.7:
            return rng.choice(stamps) + rng.choice([-1, 0, 0, 1])
        if stamps and choice < 0.85:
            return (min(stamps) - 1) if rng.random() < 0.5 else (max(stamps) + 1)
        return self.clock.wall_us() + rng.randint(-5_000_000, 5_000_000)

    def _judge(self, what: str, found, design, moved) -> None:
        """`found` must be the DESIGN 5 answer; the answer of the rule where control
        records move the high-water mark is collected as a violation, not raised."""
        if found == design:
            return
        self.check(found == moved, f"{what} gave {found}, expected {design}")
        self.violation("high-water-mark", f"{what} gave {found}, expected {design}")

    def _check_positions(self) -> None:
        model, log = self.model, self.log
        self.check(log.start_offset(STREAM, 0) == model.start,
                   f"start_offset {log.start_offset(STREAM, 0)}, expected {model.start}")
        self.check(log.end_offset(STREAM, 0) == model.end,
                   f"end_offset {log.end_offset(STREAM, 0)}, expected {model.end}")
        self.check(log.last_stable_offset(STREAM, 0) == model.last_stable_offset(),
                   f"last_stable_offset {log.last_stable_offset(STREAM, 0)}, expected "
                   f"{model.last_stable_offset()}")
        txns = model.txns()
        txn_id = self.rng.choice(sorted(txns)) if txns and self.rng.random() < 0.8 \
            else self._new_txn_id()
        state, expected = log.txn_state(STREAM, 0, txn_id), txns.get(txn_id, (None,))[0]
        # A transaction retention removed whole has no data in the partition: only a
        # cache can still say how it ended, and an index rebuilt from the segments
        # (after it was rolled back past a retention) cannot. None is then right too.
        gone = all(i < model.start for i, r in enumerate(model.records)
                   if r.txn_id == txn_id)
        self.check(state is expected or (state is None and gone),
                   f"txn_state({txn_id:#x}) is {state}, expected {expected}")
        tag = self.rng.choice(TAGS)
        found, expected = log.last_commit(STREAM, 0, tag), model.last_commit(tag)
        if found == expected:
            return
        what = f"last_commit({tag!r}) is {found!r}, expected {expected!r}"
        kept = [decode_commit(r.value) for r in model.records if r.kind == RecordKind.COMMIT]
        removed = set(self.commits_written[tag]) - {m for t, m in kept if t == tag}
        self.check(found in removed, what)
        self.violation("last-commit", what)

    # -- the end -----------------------------------------------------------------------

    def finish(self) -> None:
        """Close cleanly, require a clean full check, reopen read-only and compare."""
        self._drop_readers()
        self.log.close()
        self._check_files(clean=True)
        with streamlog.open_log(self.path, readonly=True,
                                index_storage=self.index_storage) as view:
            start = view.start_offset(STREAM, 0)
            got = [rec_of(r) for r in view.reader(STREAM, 0, read_committed=False,
                                                  data_only=False)]
            self._check_seeks("in a read-only open of the closed log", view)
        self.check(start == self.model.start and got == self.model.records[start:],
                   f"the closed log holds [{start}, {start + len(got)}), the model "
                   f"[{self.model.start}, {self.model.end})")
        self._note(f"finish: [{start}, {self.model.end}) clean")


def _span(offsets: list[int]) -> str:
    """A short, exact description of a list of offsets (runs joined)."""
    runs, first = [], None
    for i, offset in enumerate(offsets):
        if first is None:
            first = offset
        if i + 1 == len(offsets) or offsets[i + 1] != offset + 1:
            runs.append(f"{first}" if first == offset else f"{first}-{offset}")
            first = None
    return "[" + ",".join(runs) + "]"


def _short(rec: Rec | None) -> str:
    if rec is None:
        return "nothing"
    return (f"Rec(value={rec.value[:16]!r}{'...' if len(rec.value) > 16 else ''}, "
            f"key={rec.key!r}, timestamp_us={rec.timestamp_us}, headers={rec.headers}, "
            f"kind={RecordKind(rec.kind).name}, txn_id={rec.txn_id:#x})")
