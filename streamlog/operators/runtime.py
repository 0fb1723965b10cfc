"""A small operator runtime: read one input log partition, keep state, write results to
one output log partition, and recover exactly after a crash.

Strategy: the runtime owns positions and durability; the operator owns state and
output records. The loop reads the input as Arrow batches, cuts them into chunks of at
most `chunk_records` records, and for each chunk calls `operator.process_chunk(chunk,
out)`, then `operator.after_chunk(out)` (the background path, where CEC emits
G_CHECKs), then appends everything the chunk produced to the output with one
`append_batch` (control kinds interleaved in order), then maybe takes a checkpoint. So a
checkpoint is always taken at a chunk boundary, with every output of the chunk already
acknowledged: its input offset (the next record to read) and output offset (the output
end) describe one consistent cut.

Recovery (`recover()`), by how the operator is checkpointed:

    operator.recovers_from_output       CEC: the operator rebuilds its eventual checkpoint
                                        from the output log, truncates what it must, and
                                        names the input offset to replay from
    a checkpoint store is given         CRB: the newest checkpoint whose output offset the
                                        output still holds; reset(); forget the output
                                        after it; replay the input from its offset
    neither, or no usable checkpoint    reset_to_initial_state(); forget all output;
                                        replay from the input's start (retention)

"Forget" is `truncate_after` (crash-safe) in the default "truncate" output mode, so
downstream never sees a duplicate offset; in "skip" mode the output is kept and the
regenerated records are counted off and not appended again (both exact, because the
operator is deterministic: same input, same records). After the reset, recovery replays
the input up to the input end it found (where the crashed run may have got to) and
reports its progress (`recovery_report.py`); `run()` then continues live.

Recovering on another machine (DESIGN 11): give the runtime logs and a store that live
in an object store, and nothing else changes. The output is a tiered log with
durability "remote", `open_log(DIR, remote=URL, durability="remote")`: each output
append returns only once a committed manifest generation holds it, so every position
note and footprint the runtime wrote, and every output offset a checkpoint names, is in
the store; an open of an empty or new DIR restores the log from the store (fencing the
lost writer) and recovery runs on it as on the old directory. The input is read from
the store (`open_log(URL)`, read-only; it keeps no holds: holds.py) or is a tiered log
of its own. CRB keeps its checkpoints in an `ObjectCheckpointStore(URL)`
(checkpoint_objects.py), which a checkpoint is written to only after the output it
covers is acknowledged, hence in the store. (With durability "local" the store may lag
the output; recovery is still exact, from an older checkpoint or a longer replay, or
raises DataLossError when the input that needs is gone.)

Operator contract: `process_chunk` must be a deterministic function of the state and
the chunk, and output timestamps must come from the input (never the clock): that is
what makes the recovered output identical to a failure-free run.

Where the parts are: the values the runtime and an operator hand each other
(operator_io.py: InputChunk, OutputBuffer, the Operator protocol); the position notes
and the recovery plan (alignment.py); the durable holds (holds.py); taking checkpoints
(checkpoint.py). This module is the loop and the order of things.

Thread-safety: a runtime and its operator are driven by one thread; the checkpointer
writes in the background (checkpoint.py).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import pyarrow as pa

from ..errors import DataLossError, InvalidArgument, OffsetOutOfRange, StreamLogError
from .alignment import (NOTE_KEY, NOTE_KIND, Facts, Plan, fitting_checkpoint, last_note,
                        note_value, plan_recovery, report_plan)
from .checkpoint import Checkpointer
from .checkpoint_policy import CheckpointMode, CheckpointPolicy, CheckpointRequest
from .checkpoint_objects import ObjectCheckpointStore
from .checkpoint_store import CheckpointStore
from .checkpoint_value import Checkpoint
from .holds import Holds, default_hold_name
from .operator_io import InputChunk, OutputBuffer, OutputTarget
from .recovery_report import (DEFAULT_PROGRESS, LOAD, LOCATE, REPLAY, TRUNCATE, RecoveryReport,
                              default_progress, recovery_log)

# Bounds (house style: a limit on everything).
CHUNK_RECORDS_MAX = 1 << 16
FOLLOW_IDLE_POLLS_MAX = 1 << 40  # effectively "until stopped", but still a bound
NOTE_IDLE_RECORDS = 1 << 16  # a note is written after this much input without output


@dataclasses.dataclass
class RunStats:
    input_records: int = 0
    output_records: int = 0
    control_records: int = 0
    chunks: int = 0
    checkpoints_requested: int = 0
    input_records_lost: int = 0  # skipped with fail_on_data_loss=False


class OperatorRuntime:
    """Drives one operator from `input_log` (stream, partition) to `output_log`.

    Args:
        checkpointing: a CheckpointPolicy for CRB (requires `store`); None for none.
        store: where CRB's checkpoints are kept: a CheckpointStore (LMDB files in a
            local directory) or an ObjectCheckpointStore (an object store, for an
            operator that recovers on another machine: module docstring).
        output_mode: "truncate" (forget output after the checkpoint and regenerate it) or
            "skip" (keep it; replay with the output suppressed).
        chunk_records: records per chunk (one output append per chunk).
        progress: recovery progress callback (see recovery_report.print_progress); the
            default shows progress on stderr when it is a terminal. Every phase is also
            sent to `logging` ("streamlog.recovery").
        fail_on_data_loss: when an exact recovery needs input that retention removed,
            raise DataLossError (True, the default) or continue from the earliest
            retained input with a fresh state, logging the offsets lost (False).
        hold_input: keep a durable hold on the input (Log.hold) at the oldest offset a
            recovery would need, so that retention never removes it (DESIGN 2); CEC
            operators also hold their output's extent. `hold_name` names it (by
            default after the output: its store URL when it is tiered, else its
            directory). An input read straight from an object store keeps no holds
            (holds.py): none is taken there.
        stateless: the operator keeps no state between records, so recovery resumes at
            the last position note without replaying (default: the operator's own
            `stateless` attribute, else False).
    """

    def __init__(self, operator, *, input_log, input_stream: str, output_log,
                 output_stream: str, input_partition: int = 0, output_partition: int = 0,
                 checkpointing: CheckpointPolicy | None = None,
                 store: CheckpointStore | ObjectCheckpointStore | None = None,
                 output_mode: str = "truncate",
                 chunk_records: int = 1024, progress: Callable | None = DEFAULT_PROGRESS,
                 fail_on_data_loss: bool = True, hold_input: bool = True,
                 hold_name: str | None = None, stateless: bool | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if output_mode not in ("truncate", "skip"):
            raise InvalidArgument(f"output_mode must be 'truncate' or 'skip' ({output_mode!r})")
        if output_mode == "skip" and getattr(operator, "recovers_from_output", False):
            raise InvalidArgument("output_mode='skip' cannot be used with CEC: its recovery "
                                  "rebuilds the windows from the output log and cuts the "
                                  "output after that point; use output_mode='truncate'")
        if isinstance(chunk_records, bool) or not isinstance(chunk_records, int) or not (
                1 <= chunk_records <= CHUNK_RECORDS_MAX):
            raise InvalidArgument(f"chunk_records must be an int in 1..{CHUNK_RECORDS_MAX}")
        if checkpointing is not None and checkpointing.mode is not CheckpointMode.DISABLED and (
                store is None):
            raise InvalidArgument("checkpointing needs a store: a CheckpointStore or an "
                                  "ObjectCheckpointStore")
        if not isinstance(fail_on_data_loss, bool):
            raise InvalidArgument(f"fail_on_data_loss must be True or False "
                                  f"(got {fail_on_data_loss!r})")
        self.operator = operator
        self.input_log, self.input_stream, self.input_partition = (
            input_log, input_stream, input_partition)
        self.output_log, self.output_stream, self.output_partition = (
            output_log, output_stream, output_partition)
        self.input_key = f"{input_stream}/{input_partition}"
        self.output_key = f"{output_stream}/{output_partition}"
        self.store = store
        self.checkpointer = None
        if store is not None:
            self.checkpointer = Checkpointer(operator, store,
                                             checkpointing or CheckpointPolicy.disabled(),
                                             clock=clock)
        self.output_mode = output_mode
        self.chunk_records = chunk_records
        self.progress = default_progress() if progress is DEFAULT_PROGRESS else progress
        self.fail_on_data_loss = fail_on_data_loss
        self.stateless = bool(getattr(operator, "stateless", False) if stateless is None
                              else stateless)
        self.from_output = bool(getattr(operator, "recovers_from_output", False))
        self.hold_name = hold_name or default_hold_name(output_log, output_stream,
                                                         output_partition)
        self.hold_input = hold_input
        self.holds = Holds(input_log=input_log, input_stream=input_stream,
                           input_partition=input_partition, output_log=output_log,
                           output_stream=output_stream, output_partition=output_partition,
                           name=self.hold_name, clock=clock)
        self.clock = clock
        self.stats = RunStats()
        self.report: RecoveryReport | None = None
        self.plan: Plan | None = None
        self.input_next = 0
        self.out = OutputBuffer(0)
        self.out.checkpoint_policy = self.checkpoint_policy  # readable in process_chunk
        self.origin = 0  # the input offset the operator's state has absorbed input since
        self._quiet = False  # replaying input whose output is published already
        self._replay_until: int | None = None
        self._recovered = False
        self._noted_input = 0  # input_next of the last position note written
        self._noted_once = False  # a note was written by this run or found by recovery
        self._last_input_us = 0

    # -- positions ------------------------------------------------------------------

    @property
    def output_next(self) -> int:
        """Offset of the next output record (the output's end between chunks)."""
        return self.out.next_offset

    def positions(self) -> tuple[dict[str, int], dict[str, int]]:
        assert not self.out.values, "positions are only consistent between chunks"
        return {self.input_key: self.input_next}, {self.output_key: self.out.base_offset}

    # -- recovery -------------------------------------------------------------------

    def recover(self, *, replay: bool = True, dry_run: bool = False) -> RecoveryReport:
        """Bring the operator back to where the output says it was; see the module
        docstring. With replay=True, also replay the input the crashed run had read.
        With dry_run=True, only work out and report what recovery would do: nothing is
        truncated, loaded or replayed (a CEC operator still reads its extent)."""
        assert not self._recovered, "recover() runs once, before run()"
        report = RecoveryReport(progress=self.progress)
        self.report = report
        if self.output_stream not in self.output_log.streams():
            if dry_run:
                report.method = "none"
                report.note(f"dry run: output stream {self.output_stream!r} does not exist")
                return report
            self.output_log.create_stream(self.output_stream, self.output_partition + 1)
        self._check_output_partition()
        report.input_end_offset = self._input_end()
        if self.from_output:
            self._recover_from_output(report, dry_run)
        else:
            self._recover_by_plan(report, dry_run)
        if dry_run:
            report.dry_run = True
            report.finish()
            return report
        self._recovered = True
        self._update_holds(force=True)
        if replay:
            self.replay()
        return report

    def replay(self) -> None:
        """Replay the input up to where the crashed run had read; report progress."""
        report = self.report
        assert report is not None and self._recovered
        with report.phase(REPLAY):
            self._replay_until = report.replay_to_offset
            self._process(to_offset=report.replay_to_offset, max_records=None)
            self._replay_until = None
        if self._quiet:
            self._end_quiet()
        report.finish()

    def _recover_from_output(self, report: RecoveryReport, dry_run: bool) -> None:
        """CEC: the operator rebuilds its state from the output (aggregate.py,
        windows.py)."""
        report.method = "cec"
        target = OutputTarget(self.output_log, self.output_stream, self.output_partition)
        options = {"fail_on_data_loss": self.fail_on_data_loss, "source": self.input_key}
        if dry_run:
            options["dry_run"] = True
        start = self.operator.recover_from_output(target, self._input_start(), report,
                                                  **options)
        self.input_next = start
        if report.output_records_truncated == 0 and self._output_range()[1] == 0:
            report.method = "none"
        report.replay_from_offset = start
        cut = getattr(report, "cut_input_offset", None)
        report.replay_to_offset = max(start, cut if cut is not None else start)
        self.out.reset(self.output_log.end_offset(self.output_stream, self.output_partition))

    def _recover_by_plan(self, report: RecoveryReport, dry_run: bool) -> None:
        """Checkpoint roll-back, full replay or resume, by the output's position notes
        (alignment.py)."""
        out_start, out_end = self._output_range()
        in_start = self._input_start()
        with report.phase(LOCATE):
            note = last_note(self.output_log, self.output_stream, self.output_partition)
            ckpt = fitting_checkpoint(self.store, note, self.input_key, self.output_key)
            facts = Facts(
                self.input_key, in_start, self._input_end(), out_start, out_end, note, ckpt,
                None if ckpt is None else ckpt.input_offsets[self.input_key],
                None if ckpt is None else ckpt.output_offsets[self.output_key],
                self.output_mode == "truncate", self.stateless, self.fail_on_data_loss)
            try:
                plan = plan_recovery(facts)
            except DataLossError as error:
                report.note(str(error))
                recovery_log.error("%s", error)
                raise
        self.plan = plan
        report_plan(plan, report, out_end)
        if dry_run:
            return
        with report.phase(TRUNCATE):
            if plan.truncate_to is not None:
                self.output_log.truncate_after(self.output_stream, self.output_partition,
                                               plan.truncate_to - 1)
        end = self._output_range()[1]
        if end != plan.output_next:
            raise StreamLogError(f"output {self.output_key} changed during recovery: it ends "
                                 f"at {end}, expected {plan.output_next}")
        with report.phase(LOAD):
            if plan.checkpoint is not None:
                self.operator.reset(plan.checkpoint)
            elif not self.stateless:
                self.operator.reset_to_initial_state()
        self.origin = plan.origin
        self.input_next = plan.replay_from
        self._noted_input = plan.read_by_crashed_run
        self._noted_once = plan.method != "none"
        self._quiet = plan.quiet and plan.replay_to > plan.replay_from
        self.out.reset(end)

    def _end_quiet(self) -> None:
        """The quiet replay reached the input the output covers: from here on, output
        is appended again, after the last note."""
        self._quiet = False
        self.input_next = max(self.input_next, self.plan.live_from)
        self.out.reset(self._output_range()[1])

    # -- durable holds: retention keeps what a recovery would need ---------------------

    def required_positions(self) -> tuple[int | None, int | None]:
        """(oldest input offset, oldest output offset) that a recovery from here would
        read (None: no need)."""
        if self.from_output:
            need = getattr(self.operator, "required_positions", None)
            return need() if need is not None else (self.input_next, None)
        if self.stateless:
            return self._noted_input, None
        written = None if self.checkpointer is None else self.checkpointer.last_written_inputs
        if written is not None and self.input_key in written:
            return written[self.input_key], None
        return self.origin, None

    def _update_holds(self, *, force: bool = False) -> None:
        if self.hold_input:
            self.holds.update(self.required_positions, force=force)

    def release_holds(self) -> None:
        """Drop this operator's durable holds (it is retired: nothing will recover it)."""
        self.holds.release()
        self.hold_input = False

    def _check_output_partition(self) -> None:
        count = self.output_log.partition_count(self.output_stream)
        if not 0 <= self.output_partition < count:
            raise InvalidArgument(f"output stream {self.output_stream!r} has {count} "
                                  f"partitions; no partition {self.output_partition}")

    def _input_start(self) -> int:
        return self.input_log.start_offset(self.input_stream, self.input_partition)

    def _input_end(self) -> int:
        return self.input_log.end_offset(self.input_stream, self.input_partition)

    def _output_range(self) -> tuple[int, int]:
        return (self.output_log.start_offset(self.output_stream, self.output_partition),
                self.output_log.end_offset(self.output_stream, self.output_partition))

    # -- the loop -------------------------------------------------------------------

    def run(self, *, to_offset: int | None = None, max_records: int | None = None,
            follow: bool = False, stop=None, poll_s: float = 0.05) -> int:
        """Process input from the current position. Without `follow`, stop at the input
        end (or `to_offset`, exclusive, or after `max_records`); with it, keep polling
        for new input until `stop` (a threading.Event) is set. Returns records read."""
        if not self._recovered:
            self.recover()
        total = 0
        for _ in range(FOLLOW_IDLE_POLLS_MAX):
            budget = None if max_records is None else max_records - total
            total += self._process(to_offset=to_offset, max_records=budget)
            done = (max_records is not None and total >= max_records) or (
                to_offset is not None and self.input_next >= to_offset)
            if done or not follow or (stop is not None and stop.is_set()):
                break
            self._update_holds()
            time.sleep(poll_s)
        if not self._quiet:
            self._update_holds(force=True)
        return total

    def _process(self, *, to_offset: int | None, max_records: int | None) -> int:
        total = 0
        if self._quiet:  # first the input whose output is published already
            replay_to = self.plan.replay_to
            total = self._read(to_offset=replay_to if to_offset is None else min(
                to_offset, replay_to), max_records=max_records)
            if self.input_next < replay_to:
                return total  # stopped by to_offset, max_records or the input's end
            self._end_quiet()
            if max_records is not None:
                max_records -= total
                if max_records <= 0:
                    return total
        return total + self._read(to_offset=to_offset, max_records=max_records)

    def _read(self, *, to_offset: int | None, max_records: int | None) -> int:
        if to_offset is not None and self.input_next >= to_offset:
            return 0
        if self.input_next >= self._input_end():
            return 0
        total = 0
        try:
            reader = self.input_log.reader(self.input_stream, self.input_partition,
                                           from_offset=self.input_next, to_offset=to_offset)
        except OffsetOutOfRange:
            if not self._skip_lost_input():
                return 0
            reader = self.input_log.reader(self.input_stream, self.input_partition,
                                           from_offset=self.input_next, to_offset=to_offset)
        try:
            for batch in reader.arrow():
                for lo in range(0, batch.num_rows, self.chunk_records):
                    size = self.chunk_records
                    if max_records is not None:
                        size = min(size, max_records - total)
                    total += self._run_chunk(batch.slice(lo, size))
                    if max_records is not None and total >= max_records:
                        return total
        finally:
            reader.close()
        return total

    def _skip_lost_input(self) -> bool:
        """Retention removed input this operator had not read yet (it was not held):
        raise DataLossError, or with fail_on_data_loss=False skip to the input's start
        and say what was lost. Returns True when there is input left to read."""
        start = self._input_start()
        if start <= self.input_next:
            return True
        error = DataLossError(self.input_key, self.input_next, start - 1,
                              "retention removed input the operator had not read yet")
        if self.fail_on_data_loss:
            raise error
        recovery_log.warning("data loss accepted (fail_on_data_loss=False): %s; skipping "
                             "input offsets %d..%d", error.why, self.input_next, start - 1)
        self.stats.input_records_lost += start - self.input_next
        self.input_next = start
        return True

    def _run_chunk(self, batch: pa.RecordBatch) -> int:
        chunk = InputChunk(batch)
        n = len(chunk)
        assert n >= 1
        assert chunk.offsets[0] >= self.input_next
        self.operator.process_chunk(chunk, self.out)
        self.input_next = chunk.offsets[-1] + 1
        self._last_input_us = chunk.timestamps_us[-1]
        after = getattr(self.operator, "after_chunk", None)
        if after is not None:
            after(self.out)
        self._flush()
        self.stats.input_records += n
        self.stats.chunks += 1
        if self.report is not None and self._replay_until is not None:
            self.report.input_records_replayed += n
            self.report.input_bytes_replayed += batch.column(4).nbytes
            self.report.tick()
        if not self._quiet:
            self._maybe_checkpoint()
            self._update_holds()
        return n

    def _flush(self) -> None:
        """Append the chunk's output, ended by a position note (alignment.py); in a
        quiet replay, drop it (it is in the log already)."""
        out = self.out
        count = len(out.values)
        if self._quiet:
            if self.report is not None:
                self.report.output_records_skipped += count
            requested = out.checkpoint_requested
            out.reset(out.base_offset)
            out.checkpoint_requested = requested
            return
        # A note ends every append; a chunk without output gets one only when it is the
        # first since recovery (so the output records the state's origin, and every
        # checkpoint is taken after a note) or after a long stretch without output.
        note = not self.from_output and (count > 0 or not self._noted_once or (
            self.input_next - self._noted_input >= NOTE_IDLE_RECORDS))
        if count == 0 and not note:
            return
        values, keys, stamps = out.values, out.keys, out.timestamps_us
        kinds = out.kinds if out.has_control else None
        if note:
            if kinds is None:
                kinds = [0] * count
            values.append(note_value(self.input_key, self.input_next, self.origin))
            keys.append(NOTE_KEY)
            stamps.append(stamps[-1] if stamps else self._note_time_us())
            kinds.append(NOTE_KIND)
        total = len(values)
        result = self.output_log.append_batch_sync(
            self.output_stream, values, keys=keys, timestamps_us=stamps,
            partition=self.output_partition, kinds=kinds)
        first, last = result.ranges[self.output_partition]
        if first != out.base_offset:
            raise StreamLogError(f"output {self.output_key} was appended to by someone "
                                 f"else: expected offset {out.base_offset}, got {first}")
        assert last == out.base_offset + total - 1
        self.stats.output_records += count
        if kinds is not None:
            self.stats.control_records += total - kinds.count(0)
        if note:
            self._noted_input = self.input_next
            self._noted_once = True
        requested = out.checkpoint_requested
        out.reset(out.base_offset + total)
        out.checkpoint_requested = requested

    def _note_time_us(self) -> int:
        """A note with no result beside it takes the time of the last input record
        processed, so notes never move the output's high-water mark past its input's
        (DESIGN 5: control records do not move it anyway)."""
        return self._last_input_us

    def _maybe_checkpoint(self) -> None:
        """At a chunk end: the operator's request, else maybe a periodic checkpoint. Only
        the snapshot runs here; serialisation and the store write run in the background."""
        assert self.out.checkpoint_policy == self.checkpoint_policy, (
            "the output buffer lost its checkpoint policy (OperatorRuntime.__init__ sets it)")
        request = self.out.take_checkpoint_request()
        if request is not None:
            self.stats.checkpoints_requested += 1
            self._start_checkpoint(request)
        elif self.checkpointer is not None:
            self.checkpointer.maybe_periodic(*self.positions())

    def _start_checkpoint(self, request: CheckpointRequest) -> CheckpointRequest:
        if self.checkpointer is None:
            request.set_result(None)
            return request
        return self.checkpointer.request_checkpoint(*self.positions(), request=request)

    @property
    def checkpoint_policy(self) -> CheckpointPolicy:
        """How this operator is checkpointed (disabled without a store); the operator
        sees the same as `out.checkpoint_policy` inside process_chunk."""
        if self.checkpointer is None:
            return CheckpointPolicy.disabled()
        return self.checkpointer.policy

    @property
    def checkpoint_interval_s(self) -> float:
        """The periodic interval in seconds; 0.0 unless the policy is periodic."""
        return self.checkpoint_policy.interval_s

    def request_checkpoint(self) -> CheckpointRequest:
        """Operator-driven checkpoint from outside the operator, between chunks: the
        snapshot is taken now, serialisation and the write finish in the background.
        Returns the handle (see OutputBuffer.request_checkpoint)."""
        return self._start_checkpoint(CheckpointRequest())

    def checkpoint_now(self) -> Checkpoint | None:
        """Operator-driven checkpoint from outside the operator (between chunks), blocking:
        returns the checkpoint once it is durable, or None when checkpointing is off.

        Raises:
            StreamLogError: it (or an earlier one) failed, or was not durable within
                checkpoint_policy.CLOSE_WAIT_S_MAX.
        """
        return self.request_checkpoint().wait()

    def close(self) -> None:
        """Wait (bounded) for the checkpoints in flight; raise a checkpoint failure. The
        logs belong to the caller."""
        if self.checkpointer is not None:
            self.checkpointer.close()

