"""Waiting at a partition's end for appends: a long poll (the Kafka listener's fetch,
Log.wait_for) and a following Reader.

Strategy: a wait sleeps on the partition's live tail (tail.py), which this process's
writer (or a view's refresh) wakes; every poll interval it also asks the partition to
take in what writers in other processes appended (`Partition.poll`), but only when the
commit lock's counter says one may have been there (locks.PartitionLock.moved: a memory
read, never a false no), so a long poll on many quiet partitions costs no job per
interval. Real time, not the log's clock: the waits under it are a Condition's and an
event loop's.
"""

from __future__ import annotations

import asyncio
import math
import numbers
import time

from .errors import InvalidArgument


def poll_interval(part) -> float:
    """How long a wait at the end goes before it asks for other processes' appends: a
    view's look is cheap (config.view_poll_s)."""
    config = part.config
    return config.view_poll_s if part.readonly else config.follow_poll_s


def others_were_here(part) -> bool:
    """May another process have changed the partition since this one took it in?"""
    return part.lock.moved() or part.lock.handle is None


def deadline(offset, timeout_s) -> float:
    """A wait's arguments checked; its deadline on the monotonic clock."""
    if isinstance(offset, bool) or not isinstance(offset, numbers.Integral) or offset < 0:
        raise InvalidArgument(f"offset must be an int >= 0 (got {offset!r})")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real) or not (
            math.isfinite(timeout_s) and timeout_s >= 0):
        raise InvalidArgument(f"timeout_s must be a finite number of seconds >= 0 "
                              f"(got {timeout_s!r})")
    return time.monotonic() + timeout_s


def wait_for(waiting_on, offset: int, timeout_s: float) -> bool:
    """Block until the end of the partition `waiting_on()` gives (asked again each round:
    a view's partition may be opened again) is past `offset`; False on timeout."""
    until = deadline(offset, timeout_s)
    while True:
        part = waiting_on()
        if part.end_offset > offset:
            return True
        remaining = until - time.monotonic()
        if remaining <= 0:
            return False
        if part.ring.wait(offset, min(remaining, poll_interval(part))):
            return True
        if others_were_here(part):
            part.poll()


async def wait_for_async(current, waiting_on, offset: int, timeout_s: float) -> bool:
    """wait_for for an event loop: `current()` is the partition as it is (no file read),
    `waiting_on` (run on a thread) opens a view's partition again when it must."""
    until = deadline(offset, timeout_s)
    while True:
        part = current()
        if part.closed or part.stale:  # (opening a view's partition again reads files)
            part = await asyncio.to_thread(waiting_on)
        if part.end_offset > offset:
            return True
        remaining = until - time.monotonic()
        if remaining <= 0:
            return False
        if await part.ring.wait_async(offset, min(remaining, poll_interval(part))):
            return True
        if others_were_here(part):
            await asyncio.to_thread(part.poll)
