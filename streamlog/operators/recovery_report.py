"""What an operator's recovery did, shown while it runs.

Strategy: the Azure seed observes that a recovering job "does not show a report when
this kind of recovery process is taking place". A `RecoveryReport` is filled in by the
recovery code phase by phase (locate the checkpoint, forget output after it, rebuild
the state, load it, replay the input), and calls a `progress` callback when a phase
starts or ends and, from the long loops, at most every `interval_s` seconds. The
numbers answer the questions an operator of the system asks: how much was read to
rebuild the state, how much input must be replayed and how far along it is, and how
long each phase took, and how long the rest will take: once replay has run for a moment,
the measured replay rate gives the time left, and the time to catch up with the input
that arrived since the crash (the Azure seed's estimate, input backlog over the
processing rate). `print_progress()` gives a callback that writes one line per call to
stderr; any callable taking the report works (tests collect snapshots). The runtime shows
progress by default when stderr is a terminal (`default_progress`), and every phase start
and end goes to the `streamlog.recovery` logger (INFO; progress ticks at DEBUG), so a
service's logs say what its recovery did.

"To replay" counts only input the crashed run had read (up to its last position note or
CEC cut); input that arrived after it is new work, counted as the catch-up backlog.

A report is filled by one thread (the operator's); the callback runs on that thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
import time
from typing import Callable, Iterator

recovery_log = logging.getLogger("streamlog.recovery")

# Phase names, in the order a recovery runs them.
LOCATE = "locate"  # find the checkpoint (CRB) or the cut in the output (CEC)
TRUNCATE = "truncate"  # forget output written after the checkpoint
RECONSTRUCT = "reconstruct"  # CEC: read the output backwards for the N open windows
LOAD = "load"  # reset the operator from the checkpoint / eventual checkpoint
REPLAY = "replay"  # replay input up to where the crashed run had read
DONE = "done"
PHASES = (LOCATE, TRUNCATE, RECONSTRUCT, LOAD, REPLAY)


@dataclasses.dataclass
class RecoveryReport:
    method: str = "none"  # "crb", "cec", "full_replay" or "none" (nothing to recover)
    checkpoint_sequence_id: int | None = None
    state_bytes_loaded: int = 0
    output_records_truncated: int = 0
    output_records_skipped: int = 0  # "skip" mode: regenerated output not appended again
    output_records_scanned: int = 0  # CEC: the extent read backwards
    output_batches_read: int = 0
    output_bytes_read: int = 0
    windows_loaded: int = 0
    replay_from_offset: int | None = None
    replay_to_offset: int | None = None  # where the crashed run had read to
    read_by_crashed_run: int | None = None  # its last position note's input offset
    input_end_offset: int | None = None  # the input's end when recovery started
    input_offsets_lost: tuple[int, int] | None = None  # fail_on_data_loss=False only
    dry_run: bool = False
    input_records_replayed: int = 0
    input_bytes_replayed: int = 0
    phase_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    current_phase: str | None = None
    notes: list[str] = dataclasses.field(default_factory=list)
    progress: Callable[["RecoveryReport"], None] | None = dataclasses.field(
        default=None, repr=False, compare=False)
    interval_s: float = dataclasses.field(default=0.5, repr=False, compare=False)
    _last_shown: float = dataclasses.field(default=0.0, repr=False, compare=False)
    _phase_started: float = dataclasses.field(default=0.0, repr=False, compare=False)

    @property
    def input_records_to_replay(self) -> int:
        if self.replay_from_offset is None or self.replay_to_offset is None:
            return 0
        return max(0, self.replay_to_offset - self.replay_from_offset)

    @property
    def catch_up_records(self) -> int:
        """Input that arrived after the crashed run's position: new work after replay."""
        if self.input_end_offset is None or self.replay_to_offset is None:
            return 0
        return max(0, self.input_end_offset - self.replay_to_offset)

    def replay_rate(self) -> float | None:
        """Input records per second replayed so far (None before a measurable amount)."""
        seconds = self.phase_seconds.get(REPLAY, 0.0)
        if self.current_phase == REPLAY:
            seconds += self.elapsed_in_phase()
        if self.input_records_replayed < RATE_MIN_RECORDS or seconds <= 0:
            return None
        return self.input_records_replayed / seconds

    def seconds_left(self) -> float | None:
        """Estimated time to finish the replay, from the measured rate."""
        rate = self.replay_rate()
        if rate is None:
            return None
        return max(0, self.input_records_to_replay - self.input_records_replayed) / rate

    def catch_up_seconds(self) -> float | None:
        """Estimated time to process the input that arrived since the crash."""
        rate = self.replay_rate()
        return None if rate is None else self.catch_up_records / rate

    @property
    def total_seconds(self) -> float:
        return sum(self.phase_seconds.values())

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator["RecoveryReport"]:
        """Time a phase (seconds add up if a phase runs twice) and show its start/end."""
        assert name in PHASES, name
        assert self.current_phase is None, f"phase {name} inside {self.current_phase}"
        self.current_phase = name
        self._phase_started = time.perf_counter()
        self._show()
        try:
            yield self
        finally:
            elapsed = time.perf_counter() - self._phase_started
            self.phase_seconds[name] = self.phase_seconds.get(name, 0.0) + elapsed
            self._show()
            self.current_phase = None

    def elapsed_in_phase(self) -> float:
        return time.perf_counter() - self._phase_started if self.current_phase else 0.0

    def tick(self) -> None:
        """Called from long loops: show progress if `interval_s` has passed."""
        if time.perf_counter() - self._last_shown >= self.interval_s:
            self._last_shown = time.perf_counter()
            self._show(tick=True)

    def note(self, text: str) -> None:
        self.notes.append(text)
        recovery_log.info("recovery: %s", text)

    def finish(self) -> None:
        self.current_phase = DONE
        self._show()
        self.current_phase = None

    def _show(self, tick: bool = False) -> None:
        level = logging.DEBUG if tick else logging.INFO
        if recovery_log.isEnabledFor(level):
            recovery_log.log(level, "%s", self.summary())
        if self.progress is not None:
            self._last_shown = time.perf_counter()
            self.progress(self)

    def as_dict(self) -> dict:
        out = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)
               if field.compare and field.name not in ("current_phase",)}
        out["phase_seconds"] = {k: round(v, 6) for k, v in self.phase_seconds.items()}
        out["input_records_to_replay"] = self.input_records_to_replay
        out["catch_up_records"] = self.catch_up_records
        rate = self.replay_rate()
        out["replay_records_per_s"] = None if rate is None else round(rate, 1)
        out["total_seconds"] = round(self.total_seconds, 6)
        return out

    def summary(self) -> str:
        """One line: the method, what was read and replayed, time per phase."""
        parts = [f"recovery[{self.method}]" + (" (dry run)" if self.dry_run else "")]
        if self.current_phase:
            parts.append(f"phase={self.current_phase}")
        if self.checkpoint_sequence_id is not None:
            parts.append(f"checkpoint={self.checkpoint_sequence_id} "
                         f"({self.state_bytes_loaded:,} state bytes)")
        if self.output_records_truncated:
            parts.append(f"output forgotten={self.output_records_truncated:,}")
        if self.method == "cec":
            parts.append(f"extent read={self.output_records_scanned:,} records "
                         f"in {self.output_batches_read:,} batches "
                         f"({self.output_bytes_read:,} bytes), "
                         f"windows={self.windows_loaded:,}")
        total = self.input_records_to_replay
        if self.replay_from_offset is not None:
            percent = 100.0 * self.input_records_replayed / total if total else 100.0
            parts.append(f"replay from offset {self.replay_from_offset:,}: "
                         f"{self.input_records_replayed:,}/{total:,} input records "
                         f"({percent:.0f}%)")
            left, catch_up = self.seconds_left(), self.catch_up_seconds()
            if left is not None and self.current_phase == REPLAY:
                parts.append(f"~{left:.1f}s left")
            if self.catch_up_records:
                parts.append(f"then {self.catch_up_records:,} new input records" + (
                    f" (~{catch_up:.1f}s)" if catch_up is not None else ""))
        if self.input_offsets_lost is not None:
            first, last = self.input_offsets_lost
            parts.append(f"DATA LOST: input offsets {first:,}..{last:,}")
        if self.phase_seconds:
            parts.append(" ".join(f"{name}={seconds:.3f}s"
                                  for name, seconds in self.phase_seconds.items()))
        return "  ".join(parts)


# Bound: replay records measured before a rate (and so a time estimate) is given.
RATE_MIN_RECORDS = 1000
DEFAULT_PROGRESS = object()  # the runtime's default: show progress on a terminal


def default_progress() -> Callable[[RecoveryReport], None] | None:
    """print_progress() when stderr is a terminal, else None (logging still gets it)."""
    isatty = getattr(sys.stderr, "isatty", None)
    return print_progress() if isatty is not None and isatty() else None


def print_progress(stream=None) -> Callable[[RecoveryReport], None]:
    """A progress callback writing `report.summary()` as one line per call."""
    def show(report: RecoveryReport) -> None:
        print(report.summary(), file=stream or sys.stderr, flush=True)
    return show
