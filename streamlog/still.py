"""Holding every partition of a stream still at once, as a delete of the stream needs.

Strategy: each partition's writer thread runs a job that enters the commit lock
(catchup.Exclusive: a commit of another process finishes first, what it wrote is taken
in, and the lock's counter is bumped, so the next holder in any process looks before
it writes) and parks there until the holder lets go. So while `Still` is held, nothing
is written to any of the partitions, by this process or another, and this process's
appends wait in their queues. A partition whose writer takes no job (a failed one, which
writes nothing more) has its commit lock taken from the holder's thread instead.

Before letting go the holder may decide that the stream is gone (`deleted`): each
partition is then marked (Partition.mark_deleted) under its lock, so the appends
queued behind the job get UnknownStream, as every later one does.
"""

from __future__ import annotations

import functools
import threading

from .errors import PartitionFailed

PARK_CHECK_S = 0.05  # how often the holder looks whether a parking job failed


class Still:
    """A context: on entering, every partition's commit lock is held (see the module
    docstring); `deleted = True` before leaving marks the partitions deleted. Raises
    what a job raised before parking (UnknownStream: another process deleted the
    stream), with every lock let go."""

    def __init__(self, partitions) -> None:
        self.partitions = list(partitions)
        self.deleted = False
        self._leave = threading.Event()
        self._jobs: list = []  # the parked jobs' Waiters
        self._direct: list = []  # partitions whose lock this thread holds

    def __enter__(self) -> "Still":
        try:
            for part in self.partitions:
                self._park(part)
        except BaseException:
            self._let_go()  # (what the jobs raised then follows from the first)
            raise
        return self

    def __exit__(self, kind, error, traceback) -> None:
        errors = self._let_go()
        if errors and kind is None:
            raise errors[0]

    def _park(self, part) -> None:
        parked = threading.Event()
        try:
            waiter = part.start_job(functools.partial(self._parked, part, parked))
        except PartitionFailed:  # it writes nothing more: its lock, from here
            part.lock.acquire()
            self._direct.append(part)
            part.lock.bump()
            return
        self._jobs.append(waiter)
        while not parked.wait(PARK_CHECK_S):
            if waiter.event.is_set():  # the job ended before it parked: it raised
                waiter.wait()  # (raises it)
                assert False, "a parking job returned before it parked"  # pragma: no cover

    def _parked(self, part, parked: threading.Event) -> None:
        """The job, on the partition's writer thread."""
        with part.exclusive:
            parked.set()
            self._leave.wait()
            if self.deleted:
                part.mark_deleted()

    def _let_go(self) -> list:
        """Let every partition go (each job returns); returns what the jobs raised."""
        self._leave.set()
        errors = []
        for waiter in self._jobs:
            try:
                waiter.wait()
            except Exception as error:  # noqa: BLE001 - the caller decides
                errors.append(error)
        for part in self._direct:
            if self.deleted:
                part.mark_deleted()
            part.lock.release()
        self._jobs, self._direct = [], []
        return errors
