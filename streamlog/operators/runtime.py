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
    a CheckpointStore is given          CRB: the newest checkpoint whose output offset the
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

Operator contract: `process_chunk` must be a deterministic function of the state and
the chunk, and output timestamps must come from the input (never the clock): that is
what makes the recovered output identical to a failure-free run.

Thread-safety: a runtime and its operator are driven by one thread; the checkpointer
writes in the background (checkpoint.py).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Protocol

import pyarrow as pa

from .checkpoint import Checkpoint, CheckpointMode, CheckpointPolicy, Checkpointer, CheckpointStore
from ..errors import InvalidArgument, StreamLogError
from .recovery_report import LOAD, LOCATE, REPLAY, TRUNCATE, RecoveryReport
from ..records import RecordKind

# Bounds (house style: a limit on everything).
CHUNK_RECORDS_MAX = 1 << 16
FOLLOW_IDLE_POLLS_MAX = 1 << 40  # effectively "until stopped", but still a bound


class InputChunk:
    """Consecutive data records of the input partition, as Python lists. `batch` is the
    Arrow slice (columns partition, offset, timestamp, key, value) for vectorised
    operators; `values` is only built if asked for."""

    __slots__ = ("offsets", "timestamps_us", "keys", "batch", "_values")

    def __init__(self, batch: pa.RecordBatch) -> None:
        self.batch = batch
        self.offsets: list[int] = batch.column(1).to_numpy().tolist()
        self.timestamps_us: list[int] = batch.column(2).view(pa.int64()).to_numpy().tolist()
        self.keys: list = batch.column(3).to_pylist()
        self._values: list | None = None

    @property
    def values(self) -> list[bytes]:
        if self._values is None:
            self._values = self.batch.column(4).to_pylist()
        return self._values

    def __len__(self) -> int:
        return len(self.offsets)


class OutputBuffer:
    """Output records of the current chunk, appended together when it ends.

    `next_offset` is the output offset the next emitted record will get (the operator
    needs it for CEC's extent bookkeeping)."""

    __slots__ = ("base_offset", "values", "keys", "timestamps_us", "kinds", "has_control",
                 "checkpoint_requested")

    def __init__(self, base_offset: int) -> None:
        self.base_offset = base_offset
        self.values: list[bytes] = []
        self.keys: list = []
        self.timestamps_us: list[int] = []
        self.kinds: list[int] = []
        self.has_control = False
        self.checkpoint_requested = False

    @property
    def next_offset(self) -> int:
        return self.base_offset + len(self.values)

    def emit(self, value: bytes, key: bytes | None, timestamp_us: int,
             kind: int = RecordKind.DATA) -> None:
        self.values.append(value)
        self.keys.append(key)
        self.timestamps_us.append(timestamp_us)
        self.kinds.append(kind)
        if kind:
            self.has_control = True

    def request_checkpoint(self) -> None:
        """Operator-driven checkpoint: taken when the current chunk ends."""
        self.checkpoint_requested = True

    def reset(self, base_offset: int) -> None:
        self.base_offset = base_offset
        self.values, self.keys, self.timestamps_us, self.kinds = [], [], [], []
        self.has_control = False


class Operator(Protocol):
    def process_chunk(self, chunk: InputChunk, out: OutputBuffer) -> None: ...

    def checkpoint(self, ckpt: Checkpoint) -> None: ...

    def reset(self, ckpt: Checkpoint) -> None: ...

    def reset_to_initial_state(self) -> None: ...


@dataclasses.dataclass(frozen=True, slots=True)
class OutputTarget:
    """The output partition, as handed to an operator that recovers from its output."""

    log: object
    stream: str
    partition: int


@dataclasses.dataclass
class RunStats:
    input_records: int = 0
    output_records: int = 0
    control_records: int = 0
    chunks: int = 0
    checkpoints_requested: int = 0


class OperatorRuntime:
    """Drives one operator from `input_log` (stream, partition) to `output_log`.

    Args:
        checkpointing: a CheckpointPolicy for CRB (requires `store`); None for none.
        output_mode: "truncate" (forget output after the checkpoint) or "skip".
        chunk_records: records per chunk (one output append per chunk).
        progress: recovery progress callback (see recovery_report.print_progress).
    """

    def __init__(self, operator, *, input_log, input_stream: str, output_log,
                 output_stream: str, input_partition: int = 0, output_partition: int = 0,
                 checkpointing: CheckpointPolicy | None = None,
                 store: CheckpointStore | None = None, output_mode: str = "truncate",
                 chunk_records: int = 1024, progress: Callable | None = None,
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
            raise InvalidArgument("checkpointing needs a CheckpointStore")
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
        self.progress = progress
        self.stats = RunStats()
        self.report: RecoveryReport | None = None
        self.input_next = 0
        self.out = OutputBuffer(0)
        self._skip_remaining = 0
        self._replay_until: int | None = None
        self._recovered = False

    # -- positions ------------------------------------------------------------------

    @property
    def output_next(self) -> int:
        """Offset of the next output record in the deterministic output sequence (the
        log end, except while "skip" mode is still counting off regenerated records)."""
        return self.out.next_offset

    def positions(self) -> tuple[dict[str, int], dict[str, int]]:
        assert not self.out.values, "positions are only consistent between chunks"
        return {self.input_key: self.input_next}, {self.output_key: self.out.base_offset}

    # -- recovery -------------------------------------------------------------------

    def recover(self, *, replay: bool = True) -> RecoveryReport:
        """Bring the operator back to where the output says it was; see the module
        docstring. With replay=True, also replay the input to its current end."""
        assert not self._recovered, "recover() runs once, before run()"
        report = RecoveryReport(progress=self.progress)
        self.report = report
        if self.output_stream not in self.output_log.streams():
            self.output_log.create_stream(self.output_stream, self.output_partition + 1)
        self._check_output_partition()
        if getattr(self.operator, "recovers_from_output", False):
            report.method = "cec"
            target = OutputTarget(self.output_log, self.output_stream, self.output_partition)
            start = self.operator.recover_from_output(target, self._input_start(), report)
            self.input_next = start
            if report.output_records_truncated == 0 and self._output_range()[1] == 0:
                report.method = "none"
            self.out.reset(self.output_log.end_offset(self.output_stream,
                                                      self.output_partition))
        else:
            self._recover_from_store(report)
        report.replay_from_offset = self.input_next
        report.replay_to_offset = self._input_end()
        if report.method == "none":  # a first start: nothing to catch up with
            report.replay_to_offset = self.input_next
        self._recovered = True
        if replay:
            self.replay()
        return report

    def replay(self) -> None:
        """Replay the input up to the end recovery found; report progress."""
        report = self.report
        assert report is not None and self._recovered
        with report.phase(REPLAY):
            self._replay_until = report.replay_to_offset
            self._process(to_offset=report.replay_to_offset, max_records=None)
            self._replay_until = None
        report.finish()

    def _recover_from_store(self, report: RecoveryReport) -> None:
        out_start, out_end = self._output_range()
        in_start = self._input_start()
        ckpt = None
        with report.phase(LOCATE):
            if self.store is not None:
                ckpt = self.store.latest(lambda c: in_start <= c.input_offsets.get(
                    self.input_key, -1) and out_start <= c.output_offsets.get(
                    self.output_key, -1) <= out_end)
        with report.phase(LOAD):
            if ckpt is not None:
                report.method = "crb"
                report.checkpoint_sequence_id = ckpt.sequence_id
                report.state_bytes_loaded = len(ckpt.state)
                self.operator.reset(ckpt)
                self.input_next = ckpt.input_offsets[self.input_key]
                keep_to = ckpt.output_offsets[self.output_key]
            else:
                report.method = "full_replay" if out_end > out_start else "none"
                self.operator.reset_to_initial_state()
                self.input_next = in_start
                keep_to = out_start
                if report.method == "full_replay":
                    report.note(f"no usable checkpoint: replaying "
                                f"{self._input_end() - in_start:,} input records from the "
                                f"start of retention (offset {in_start})")
        self._forget_output(keep_to, out_end, report)

    def _forget_output(self, keep_to: int, out_end: int, report: RecoveryReport) -> None:
        """Make output offsets >= keep_to be regenerated: truncate, or skip them."""
        assert keep_to <= out_end
        with report.phase(TRUNCATE):
            if self.output_mode == "truncate":
                if out_end > keep_to:
                    self.output_log.truncate_after(self.output_stream, self.output_partition,
                                                   keep_to - 1)
                    report.output_records_truncated = out_end - keep_to
                assert self._output_range()[1] == keep_to
                self._skip_remaining = 0
            else:
                self._skip_remaining = out_end - keep_to
                report.output_records_skipped = self._skip_remaining
        self.out.reset(keep_to)

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
            time.sleep(poll_s)
        return total

    def _process(self, *, to_offset: int | None, max_records: int | None) -> int:
        if to_offset is not None and self.input_next >= to_offset:
            return 0
        if self.input_next >= self._input_end():
            return 0
        total = 0
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

    def _run_chunk(self, batch: pa.RecordBatch) -> int:
        chunk = InputChunk(batch)
        n = len(chunk)
        assert n >= 1
        assert chunk.offsets[0] >= self.input_next
        self.operator.process_chunk(chunk, self.out)
        self.input_next = chunk.offsets[-1] + 1
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
        self._maybe_checkpoint()
        return n

    def _flush(self) -> None:
        out = self.out
        count = len(out.values)
        if count == 0:
            return
        skip = min(self._skip_remaining, count)
        self._skip_remaining -= skip
        if skip < count:
            kinds = out.kinds[skip:] if out.has_control else None
            result = self.output_log.append_batch_sync(
                self.output_stream, out.values[skip:], keys=out.keys[skip:],
                timestamps_us=out.timestamps_us[skip:], partition=self.output_partition,
                kinds=kinds)
            first, last = result.ranges[self.output_partition]
            if first != out.base_offset + skip:
                raise StreamLogError(f"output {self.output_key} was appended to by someone "
                                     f"else: expected offset {out.base_offset + skip}, "
                                     f"got {first}")
            assert last == out.base_offset + count - 1
            self.stats.output_records += count - skip
            if out.has_control:
                self.stats.control_records += len(kinds) - kinds.count(0)
        requested = out.checkpoint_requested
        out.reset(out.base_offset + count)
        out.checkpoint_requested = requested

    def _maybe_checkpoint(self) -> None:
        if self.checkpointer is None:
            return
        if self.out.checkpoint_requested:
            self.out.checkpoint_requested = False
            self.stats.checkpoints_requested += 1
            self.checkpointer.create_checkpoint(*self.positions())
        else:
            self.checkpointer.maybe_periodic(*self.positions())

    def checkpoint_now(self) -> Checkpoint | None:
        """Operator-driven checkpoint from outside the operator (between chunks)."""
        if self.checkpointer is None:
            return None
        return self.checkpointer.create_checkpoint(*self.positions())

    def close(self) -> None:
        """Wait for an in-flight checkpoint write. The logs belong to the caller."""
        if self.checkpointer is not None:
            self.checkpointer.close()

