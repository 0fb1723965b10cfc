"""Durability "remote": acks wait for the store, and the tail goes up in group commits.

Strategy (DESIGN 11): an append under durability "remote" is written locally as ever,
but its ack (every door: Log.submit, submit_async, submit_then, and the transaction
jobs) is held (`AckGate`) until a committed manifest generation holds its records.
The tiering job commits the tail: every `remote_commit_ms` while acks wait (sooner once
`remote_commit_bytes` wait), it reads, for every partition with new records, the bytes
from where the store's copy ends to the partition's published end (`tail_runs`: whole
frames, from the local segment files), and commits one generation whose object carries
them all as its payload, naming each partition's pieces of it (manifest.TailPiece). So
a commit is one PUT, whatever the partition count: the PUT rate is set by the commit
interval, not by the partitions. When a segment seals it goes up whole (tiering.py) and
its pieces leave the manifest; the generations whose payload no piece names any more
become garbage.

The gate resolves held acks in offset order when the committed end passes them, with
`StoreTimeout` when the store has not taken them within `remote_timeout_s` (the
records stay in the local log and may still reach the store: as with any timeout, the
outcome is unknown), and with `Fenced` when a newer writer took the log over.
"""

from __future__ import annotations

import collections
import threading
from typing import NamedTuple

from ..appender import resolve_waiters
from ..errors import StoreError, StoreTimeout, StreamLogError
from .manifest import PartitionManifest


class Run(NamedTuple):
    """Bytes [position, position + size) of a local segment: whole frames holding
    offsets [base_offset, end_offset)."""

    segment: object  # segment.Segment
    position: int
    size: int
    base_offset: int
    end_offset: int


def tail_runs(state, remote: PartitionManifest) -> list[Run]:
    """The runs of the partition's published `state` (state.PartitionState) that the
    store lacks: from the end of its last tail piece (or from position 0 of the segment
    after its segment objects) to the published end. Raises StoreError when the local
    segments do not continue the store's copy (a gap the store cannot be given)."""
    end = state.end_offset
    if remote.tail:
        last = remote.tail[-1]
        base, position, offset = last.segment_base, last.position + last.size, last.end_offset
    else:
        base, position, offset = remote.sealed_end, 0, remote.sealed_end
        if not remote.segments:  # from position 0 of the segment holding the store's
            # start, which may be inside it (delete_records), or the first one
            holding = [s.base_offset for s in state.segments if s.base_offset <= base]
            base = offset = holding[-1] if holding else (
                state.segments[0].base_offset if state.segments else base)
    if end <= offset:
        return []
    segments = list(state.segments)
    numbers = [n for n, segment in enumerate(segments) if segment.base_offset == base]
    if not numbers:
        raise StoreError(f"the store's copy ends at offset {offset} (in the segment at "
                         f"{base}), which no local segment continues", key=None)
    runs = []
    for number in range(numbers[0], len(segments)):
        segment = segments[number]
        active = number == len(segments) - 1
        stop = state.active_position if active else segment.size_bytes
        start = position if number == numbers[0] else 0
        upto = end if active else segments[number + 1].base_offset
        if stop > start:
            runs.append(Run(segment, start, stop - start, offset, upto))
        offset = upto
    return runs


class AckGate:
    """Acks held until the store holds their records (see the module docstring)."""

    def __init__(self, committed_end, wake, *, timeout_s: float, clock,
                 wake_bytes: int) -> None:
        self._committed_end = committed_end  # partition name -> the store's end
        self._wake = wake  # asks the tiering job for a commit
        self.timeout_s = timeout_s
        self.clock = clock
        self.wake_bytes = wake_bytes
        self._lock = threading.Lock()
        # partition name -> deque of (end offset, deadline, results), ends rising
        self._held: dict[str, collections.deque] = collections.defaultdict(collections.deque)
        self._error: BaseException | None = None
        self.held_bytes = 0  # written since the last commit, waiting (a hint)

    def hold(self, name: str, end_offset: int, results: list, nbytes: int = 0) -> None:
        """From a writer thread: resolve `results` [(waiter, result, error)] once the
        store holds the partition up to `end_offset` (exclusive)."""
        with self._lock:
            error = self._error
            if error is None and self._committed_end(name) < end_offset:
                self._held[name].append((end_offset,
                                         self.clock.monotonic_s() + self.timeout_s, results))
                self.held_bytes += nbytes
                wake = self.held_bytes >= self.wake_bytes
                results = None
        if results is None:
            self._wake(urgent=wake)
            return
        resolve_waiters(results if error is None else _failed(results, error))

    def waiting(self) -> bool:
        with self._lock:
            return any(self._held.values())

    def committed(self) -> None:
        """After a round: release every ack the store now holds, and fail those past
        their deadline with StoreTimeout."""
        done = []
        with self._lock:
            self.held_bytes = 0
            for name, held in self._held.items():
                end = self._committed_end(name)
                while held and held[0][0] <= end:
                    done += held.popleft()[2]
        resolve_waiters(done)
        self.expire()

    def expire(self) -> None:
        """Fail the acks past their deadline with StoreTimeout: called after each round
        and, while a round is stuck on a store that does not answer, by a timer."""
        done = []
        now = self.clock.monotonic_s()
        with self._lock:
            for name, held in self._held.items():
                while held and held[0][1] <= now:  # (deadlines rise as the ends do)
                    end, _, results = held.popleft()
                    done += _failed(results, _timeout(name, end, self.timeout_s))
        resolve_waiters(done)

    def cut(self, name: str, end: int) -> None:
        """The partition was truncated at `end`: acks held for records past it fail
        (those records are gone)."""
        with self._lock:
            held = self._held.get(name)
            cut = [entry for entry in held if entry[0] > end] if held else []
            for entry in cut:
                held.remove(entry)
        resolve_waiters([item for entry in cut for item in _failed(entry[2], StreamLogError(
            f"{name} was truncated at offset {end} before the store took these records"))])

    def forget(self, stream: str, error: BaseException) -> None:
        """The stream was deleted: every ack held for its partitions fails with
        `error`."""
        with self._lock:
            names = [name for name in self._held if name.rpartition("/")[0] == stream]
            held = [entry for name in names for entry in self._held.pop(name)]
        resolve_waiters([item for entry in held for item in _failed(entry[2], error)])

    def fail(self, error: BaseException) -> None:
        """Fail every held ack, and every later one, with `error` (Fenced)."""
        with self._lock:
            self._error = error
            held, self._held = self._held, collections.defaultdict(collections.deque)
        resolve_waiters([item for entries in held.values() for entry in entries
                         for item in _failed(entry[2], error)])


def _failed(results: list, error: BaseException) -> list:
    return [(waiter, None, error) for waiter, _, _ in results]


def _timeout(name: str, end: int, timeout_s: float) -> StoreTimeout:
    return StoreTimeout(f"{name}: the store did not take the records before offset {end} "
                        f"within {timeout_s:g} s (they are in the local log and may still "
                        f"reach it)")
