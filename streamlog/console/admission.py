"""The console's share of the machine: how much of the process's time its requests take.

Strategy: `Admission` works requests one at a time and draws each one's time from a
budget that refills at `share` seconds a second (up to BURST_S). Where the console runs
in the daemon's process (tests, an embedding), a share below 1 keeps a flood of page
loads from taking the interpreter's lock from the daemon's appends; in its own worker
process (worker.py, niced) the share is 1: one request at a time, the operating system
gives the daemon the CPU first.
"""

from __future__ import annotations

import asyncio
import time


class Admission:
    """The console's share of the daemon: its requests are worked on one at a time, and
    their time is drawn from a budget that refills at SHARE seconds a second (up to
    BURST_S), so a flood of console requests waits its turn instead of taking the CPU
    (and the interpreter's lock) from the daemon's appends. A request's time is its
    wall time while admitted: what it waited for the lock counts too, so the share is
    conservative. `async with admission:` around each piece of console work."""

    SHARE = 0.2
    BURST_S = 0.5

    def __init__(self, clock=time.monotonic, sleep=asyncio.sleep, *,
                 share: float = SHARE) -> None:
        self._clock, self._sleep = clock, sleep
        self.share = share
        self._turn = asyncio.Lock()
        self._tokens = self.BURST_S
        self._at = clock()
        self._started = 0.0
        self.waited_s = 0.0  # time requests spent waiting for the budget, in all

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.BURST_S, self._tokens + (now - self._at) * self.share)
        self._at = now

    async def __aenter__(self) -> None:
        await self._turn.acquire()
        self._refill()
        if self._tokens < 0:
            wait = -self._tokens / self.share
            self.waited_s += wait
            await self._sleep(wait)
            self._refill()
        self._started = self._clock()

    async def __aexit__(self, *exc) -> None:
        self._refill()
        self._tokens -= self._clock() - self._started
        self._turn.release()
