"""Fetch reads that go on where the last one stopped. No sockets.

Strategy: a Fetch answers with a partition's Kafka batches from the asked offset up to
its byte budget (batches.chunks over a Reader). The consumer then asks for the offset
after the last batch it got. When the reader that made those batches is kept, the next
read goes on with it: no new seek through the index, no second read of the segment
chunk the reader holds (read_chunk_bytes: several MiB, for answers of about one) and no
second check of its frames' checksums; and the batch that did not fit the budget (its
size planned, not yet encoded) is the first of the next answer. A reader is kept under
(topic, partition, read_committed, the offset it goes on from): two consumers at
different offsets have one each; of two at the same offset, one takes it and the other
starts a new one.

What the consumer sees is what a new reader from the asked offset would give (the
batches may be cut at other records; the records, offsets and markers are the same):
the rows a kept reader gave out are sent later only when `Reader.check_position` says
the partition was neither truncated below them, nor deleted, nor closed since;
otherwise the kept reader closes and a new one starts at the asked offset.

Bounds: at most `cursors_max` readers are kept (the one unused longest closes first),
each for at most `idle_s` without a Fetch (`expire`, which the server calls on its
tick): a kept reader holds retention back at its position and its read chunk in memory.

Thread-safety: `read` runs on the broker's threads, several at once; a kept reader is
out of the map while one read uses it. `expire` and `close` may run on any thread.
"""

from __future__ import annotations

import collections
import threading
import time

from .. import errors as log_errors
from . import batches

CURSORS_MAX = 32
IDLE_S = 30.0


class FetchCursors:
    """The readers kept between Fetches (see the module docstring)."""

    def __init__(self, *, cursors_max: int = CURSORS_MAX, idle_s: float = IDLE_S,
                 clock=time.monotonic) -> None:
        assert cursors_max >= 0
        self.cursors_max = cursors_max
        self.idle_s = idle_s
        self._clock = clock
        self._kept: collections.OrderedDict[tuple, _Cursor] = collections.OrderedDict()
        self._lock = threading.Lock()

    def read(self, log, topic: str, partition: int, offset: int, max_bytes: int,
             committed: bool, *, at_least_one: bool) -> list:
        """Kafka batches (bytes-like) of the partition from `offset`, up to `max_bytes`
        in all, except that the first is sent whatever its size when `at_least_one` (a
        consumer must make progress).

        Raises:
            OffsetOutOfRange: `offset` is not in the partition (retention, a truncate).
            CorruptionError: a frame on the way does not check out.
        """
        cursor = self._take((topic, partition, committed, offset))
        if cursor is None:
            reader = log.reader(topic, partition, from_offset=offset, data_only=False,
                                read_committed=committed)
            cursor = _Cursor(reader, batches.chunks(reader, partition))
        try:
            assert cursor.next_offset == offset, "a reader goes on where it stopped"
            out, cursor.pending, cursor.next_offset = batches.fill(
                cursor.next_batch, max_bytes, at_least_one=at_least_one,
                after=cursor.next_offset)
            assert out or not at_least_one or cursor.pending is None, "progress"
            if cursor.pending is not None:
                self._keep((topic, partition, committed, cursor.next_offset), cursor)
                cursor = None
        finally:
            if cursor is not None:  # at the partition's end, or failed
                cursor.close()
        return out

    def expire(self) -> int:
        """Close the readers no Fetch used for idle_s; returns how many."""
        deadline = self._clock() - self.idle_s
        with self._lock:
            old = [key for key, cursor in self._kept.items() if cursor.used < deadline]
            closing = [self._kept.pop(key) for key in old]
        for cursor in closing:
            cursor.close()
        return len(closing)

    def close(self) -> None:
        """Close every kept reader (before the log closes)."""
        with self._lock:
            closing, self._kept = list(self._kept.values()), collections.OrderedDict()
        for cursor in closing:
            cursor.close()

    def __len__(self) -> int:
        return len(self._kept)

    def _take(self, key: tuple) -> _Cursor | None:
        with self._lock:
            cursor = self._kept.pop(key, None)
        if cursor is None:
            return None
        try:
            cursor.reader.check_position()
        except log_errors.StreamLogError:
            cursor.close()  # truncated below what it holds, or gone: start anew
            return None
        return cursor

    def _keep(self, key: tuple, cursor: _Cursor) -> None:
        assert cursor.pending is not None, "a kept reader has a batch to send next"
        assert key[-1] == cursor.next_offset
        cursor.used = self._clock()
        with self._lock:
            closing = [self._kept.pop(key)] if key in self._kept else []
            self._kept[key] = cursor
            while len(self._kept) > self.cursors_max:
                closing.append(self._kept.popitem(last=False)[1])
        for old in closing:
            old.close()


class _Cursor:
    """A kept reader: its batches generator (batches.chunks), the batch that did not
    fit the last answer, and the offset the next answer starts at."""

    __slots__ = ("reader", "_batches", "pending", "next_offset", "used")

    def __init__(self, reader, chunks) -> None:
        self.reader = reader
        self._batches = chunks
        self.pending = None
        self.next_offset = reader.next_offset
        self.used = 0.0

    def next_batch(self):
        """(size, last offset, encode) of the next batch, or None at the end."""
        if self.pending is not None:
            batch, self.pending = self.pending, None
            return batch
        return next(self._batches, None)

    def close(self) -> None:
        self._batches.close()
        self.reader.close()
