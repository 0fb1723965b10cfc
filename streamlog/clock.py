"""Time, injected: the one place the storage core reads the clock.

Strategy: a `Clock` gives wall time in microseconds since the epoch (append time for
records without an event time, marker times, seals, retention's "now") and a monotonic
time in seconds (segment age, fsync intervals). `open_log(..., clock=...)` hands one to
the log, its partitions, segments and writer threads; tests pass a manual clock
(streamlog/testing/clock.py) to roll segments by age or expire retention without
waiting. Kafka's storage classes take a `Time` the same way.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def wall_us(self) -> int:
        """Microseconds since the Unix epoch."""

    def monotonic_s(self) -> float:
        """Seconds on a clock that never goes back (only differences mean anything)."""


class SystemClock:
    """The machine's clocks."""

    def wall_us(self) -> int:
        return time.time_ns() // 1000

    def monotonic_s(self) -> float:
        return time.monotonic()


SYSTEM_CLOCK = SystemClock()
