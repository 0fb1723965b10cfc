"""A Log following its writers: a view's refresh, and waits at a partition's end.
Part of class Log (log.py).

Strategy: a read-only view takes in what writers in other processes did with
`refresh` (each partition's refresh.py), and opens again a partition that cannot be
followed in place (a truncate happened or is under way): followers move to the new one,
and the old one is closed once no reader holds it. A wait at a partition's end (the
Kafka listener's fetch) sleeps on the live tail and polls as a following Reader does
(waits.py).
"""

from __future__ import annotations

from . import waits
from .errors import LogClosed, UnknownStream


class FollowOperations:
    def refresh(self) -> None:
        """A read-only view follows the writer (in another process): new streams, and
        in every partition the frames and segments added and the segments retention
        removed since the open or the last refresh. A partition that was truncated
        meanwhile is reopened (a follower goes on in the new one, or gets
        OffsetOutOfRange when records it delivered were cut; other readers finish
        what they started). Streams deleted meanwhile are forgotten (their readers get
        UnknownStream at their end), partitions added are opened. Far cheaper than
        reopening the log. A following reader does this for its own partition
        without being asked (Reader.wait). A writable log takes in what writers in
        other processes appended, created, deleted and added (its own changes are
        always current)."""
        if not self.readonly:
            self._check_open()
            for partitions in list(self._streams.values()):
                for part in partitions:
                    part.poll()  # (finds a stream another process deleted: catchup.py)
            with self._lock:
                self._check_open()  # (forgets those)
                self._retired = [part for part in self._retired if not part.close_if_idle()]
                self._take_in_streams()
            return
        with self._lock:
            self._check_open()
            if self.remote_view is not None:
                self.remote_view.poll()  # a log read from a store: its newest generation
            names = set(self._stream_names())
            for name in [name for name, partitions in self._streams.items()
                         if name not in names or partitions[0].lock.gone()]:
                self._retire_stream(name)  # deleted (perhaps created again since)
            self._take_in_streams()
            for name, partitions in self._streams.items():
                for number, part in enumerate(partitions):
                    if not part.refresh():
                        self._reopened(name, number, part)

    def _take_in_streams(self) -> None:
        """Open the streams, and the partitions of known streams, that other processes
        created since this Log looked (create_stream, add_partitions)."""
        for name in self._stream_names():
            if self._find_stream(name):
                self._grown(name)

    def _reopened(self, stream: str, number: int, stale):
        """A view's partition `number` of `stream` as it is now: opened again when the
        one here is still `stale` (it could not follow the files in place), else the
        one here. The stale one is closed once no reader holds it. Any thread (a
        following Reader asks); LogClosed once the log is closed."""
        with self._lock:
            self._check_open()
            partitions = self._streams.get(stream)
            if partitions is None or (partitions[number] is stale and stale.lock.gone()):
                if partitions is not None:
                    self._retire_stream(stream)  # (its readers are told at their end)
                raise UnknownStream(f"stream {stream!r} was deleted")
            if partitions[number] is stale:
                partitions[number] = self._open_partition(stream, number)
                stale.retire()
                self._retired.append(stale)
            self._retired = [part for part in self._retired if not part.close_if_idle()]
            return partitions[number]

    def wait_for(self, stream: str, partition: int, offset: int, timeout_s: float) -> bool:
        """Block until the partition's acknowledged end is past `offset` (a record at
        `offset` can be read), or `timeout_s` has passed. Waits on the live tail as a
        following Reader does (Reader.wait): woken by this process's writer (or a
        view's refresh), and every poll interval (follow_poll_s; a view's
        view_poll_s) taking in what writers in other processes appended. A view's
        partition that cannot be followed in place is opened again, as for a
        follower. Local only (api.LOCAL_ONLY): a daemon's client follows with
        reader(..., follow=True). Any thread.

        Args:
            offset: an offset >= 0; the end is past it when end_offset() > offset.
            timeout_s: the longest wait, in seconds (a finite number >= 0).
        Returns:
            True once end_offset(stream, partition) > offset; False on timeout.
        Raises:
            UnknownStream, InvalidArgument (a bad partition, offset or timeout), and
            LogClosed when the log is closed, before or during the wait.
        """
        return waits.wait_for(lambda: self._waiting_on(stream, partition), offset, timeout_s)

    async def wait_for_async(self, stream: str, partition: int, offset: int,
                             timeout_s: float) -> bool:
        """`wait_for` for an event loop: the same answer, without blocking the loop. A
        task cancelled while waiting leaves nothing behind."""
        return await waits.wait_for_async(lambda: self._partition(stream, partition),
                                          lambda: self._waiting_on(stream, partition),
                                          offset, timeout_s)

    def _waiting_on(self, stream: str, partition: int):
        """The partition a wait watches now. A writable log's partitions close only
        with the log; a view's one that could not follow its files is replaced by the
        one opened again (`_reopened`, which raises LogClosed once the log is)."""
        part = self._partition(stream, partition)
        if not (part.closed or part.stale):
            return part
        if not self.readonly:
            raise LogClosed(f"the log at {self.path} was closed while waiting")
        return self._reopened(stream, partition, part)
