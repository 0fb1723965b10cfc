"""What an operator's recovery did, shown while it runs.

Strategy: the Azure seed observes that a recovering job "does not show a report when
this kind of recovery process is taking place". A `RecoveryReport` is filled in by the
recovery code phase by phase (locate the checkpoint, forget output after it, rebuild
the state, load it, replay the input), and calls a `progress` callback when a phase
starts or ends and, from the long loops, at most every `interval_s` seconds. The
numbers answer the questions an operator of the system asks: how much was read to
rebuild the state, how much input must be replayed and how far along it is, and how
long each phase took. `print_progress()` gives a callback that writes one line per call
to stderr; any callable taking the report works (tests collect snapshots).

A report is filled by one thread (the operator's); the callback runs on that thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from typing import Callable, Iterator

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
    replay_to_offset: int | None = None  # input end when recovery started
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
        if self.progress is not None and time.perf_counter() - self._last_shown >= (
                self.interval_s):
            self._show()

    def note(self, text: str) -> None:
        self.notes.append(text)

    def finish(self) -> None:
        self.current_phase = DONE
        self._show()
        self.current_phase = None

    def _show(self) -> None:
        if self.progress is not None:
            self._last_shown = time.perf_counter()
            self.progress(self)

    def as_dict(self) -> dict:
        out = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)
               if field.compare and field.name not in ("current_phase",)}
        out["phase_seconds"] = {k: round(v, 6) for k, v in self.phase_seconds.items()}
        out["input_records_to_replay"] = self.input_records_to_replay
        out["total_seconds"] = round(self.total_seconds, 6)
        return out

    def summary(self) -> str:
        """One line: the method, what was read and replayed, time per phase."""
        parts = [f"recovery[{self.method}]"]
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
        if self.phase_seconds:
            parts.append(" ".join(f"{name}={seconds:.3f}s"
                                  for name, seconds in self.phase_seconds.items()))
        return "  ".join(parts)


def print_progress(stream=None) -> Callable[[RecoveryReport], None]:
    """A progress callback writing `report.summary()` as one line per call."""
    def show(report: RecoveryReport) -> None:
        print(report.summary(), file=stream or sys.stderr, flush=True)
    return show
