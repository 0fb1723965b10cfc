"""A clock that moves only when told to (streamlog.clock.Clock), for tests."""

from __future__ import annotations

import threading


class ManualClock:
    def __init__(self, wall_us: int = 1_767_225_600_000_000, monotonic_s: float = 1000.0):
        self._lock = threading.Lock()
        self._wall_us, self._monotonic_s = wall_us, monotonic_s

    def wall_us(self) -> int:
        with self._lock:
            return self._wall_us

    def monotonic_s(self) -> float:
        with self._lock:
            return self._monotonic_s

    def advance(self, seconds: float) -> None:
        assert seconds >= 0
        with self._lock:
            self._wall_us += int(seconds * 1_000_000)
            self._monotonic_s += seconds
