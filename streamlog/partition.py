"""One partition: segments + index + writer thread + live-tail ring.

Strategy: opening runs recovery (recovery.py) and then starts the writer thread
(appender.py) when writable. Offsets and sizes that readers look at (`next_offset`,
`segments`) are replaced, never mutated in place, by the writer thread, so a reader that
took a reference keeps a consistent view without a lock. Operations that rewrite files
(`truncate_after`, retention) run as jobs on the writer thread, between groups of
appends, so they never race an append.

States: OPEN, FAILED (a write or fsync failed; appends refused until reopened), CLOSED.
"""

from __future__ import annotations

import json
import os
import threading

import numpy as np

from . import fileio as fileio_module
from .appender import Appender, Pending, Piece, Waiter
from .records import RecordKind
from .txn import TxnState
from .config import LogConfig
from .errors import (CorruptIndex, InvalidArgument, LogClosed, OffsetOutOfRange, ReadOnlyLog)
from .frame import INCOMPLETE, Frame, decode_frame, encode_frame
from .index import NO_HWM, Index, IndexEntry, RecoveryPoint
from .layout import DELETED_SUFFIX, SEGMENT_SUFFIX, parse_segment_name
from .payload import Columns, decode_columns, encode_payload, running_max
from .recovery import RecoveryReport, recover
from .scan import StopReason, scan_buffer
from .segment import Segment
from .tail import TailRing

INTENT_NAME = "truncate.intent"


class Partition:
    def __init__(self, directory: str, name: str, number: int, config: LogConfig,
                 fileio, *, readonly: bool, progress=None) -> None:
        self.directory = directory
        self.name = name
        self.number = number
        self.config = config
        self.fileio = fileio
        self.readonly = readonly
        self.closed = False
        self._holds: dict[int, int] = {}
        self.truncations: list[int] = []  # new end offsets, one per truncate_after
        self._holds_lock = threading.Lock()
        if not readonly:
            fileio.makedirs(directory)
            self._clean_leftovers()
        self.index = self._open_index()
        self.segments: list[Segment] = self._open_segments()
        self.report = RecoveryReport()
        self.next_offset, self.hwm_us, self.active_position = 0, None, 0
        try:
            if not readonly:
                self._finish_intent()
            else:
                self._view_intent()
            if self.segments:
                state, self.report = recover(self.segments, self.index, writable=not readonly,
                                             chunk_bytes=config.read_chunk_bytes,
                                             progress=progress)
                self.next_offset, self.hwm_us = state.next_offset, state.hwm_us
                self.active_position = state.end_position
        except BaseException:
            self._close_files()
            raise
        self.start_offset = self.segments[0].base_offset if self.segments else 0
        # Running max of the records retention removed (None when none were removed).
        stored = self.index.get_meta("start_hwm")
        self.start_hwm_us = int(stored) if stored and self.start_offset > 0 else None
        self.ring = TailRing(batches_max=config.tail_ring_batches_max,
                             bytes_max=config.tail_ring_bytes_max)
        self.ring.end_offset = self.next_offset
        self.appender = None if readonly else Appender(self, config)
        if not readonly:
            self._abort_orphans()

    def _abort_orphans(self) -> None:
        """Abort transactions that a crashed writer left open (DESIGN 6)."""
        for txn_id in sorted(self.index.open_txns()):
            self.append_marker(txn_id, RecordKind.ABORT, b"")

    def append_marker(self, txn_id: int, kind, value: bytes) -> int:
        return self.submit([self._marker_piece(txn_id, kind, value)])

    def _marker_piece(self, txn_id: int, kind, value: bytes) -> Piece:
        import time
        return Piece([time.time_ns() // 1000], [None], [value], [int(kind)], None,
                     len(value) + 24, txn_id)

    def txn_state(self, txn_id: int):
        found = self.index.txn_state(txn_id)
        return None if found is None else TxnState(found[0])

    # -- opening --------------------------------------------------------------------

    def _clean_leftovers(self) -> None:
        for name in self.fileio.listdir(self.directory):
            if name.endswith(DELETED_SUFFIX) or name.endswith(".tmp"):
                self.fileio.unlink(os.path.join(self.directory, name))

    def _open_index(self) -> Index:
        path = os.path.join(self.directory, "index")
        try:
            return Index(path, readonly=self.readonly, map_bytes=self.config.index_map_bytes)
        except CorruptIndex:
            if self.readonly:
                return Index(os.path.join(self.directory, "no-index"), readonly=True,
                             map_bytes=self.config.index_map_bytes)
            for name in os.listdir(path):  # a cache: drop it and rebuild from segments
                os.unlink(os.path.join(path, name))
            return Index(path, readonly=False, map_bytes=self.config.index_map_bytes)

    def _open_segments(self) -> list[Segment]:
        names = self.fileio.listdir(self.directory) if self.fileio.exists(self.directory) else []
        bases = sorted(b for b in map(parse_segment_name, names) if b is not None)
        segments = [Segment(self.fileio, self.directory, base, writable=not self.readonly)
                    for base in bases]
        if not segments and not self.readonly:
            segments = [Segment(self.fileio, self.directory, 0, writable=True, create=True)]
            self.fileio.fsync_dir(self.directory)
        return segments

    # -- writer-thread callbacks ----------------------------------------------------

    @property
    def active_segment(self) -> Segment:
        return self.segments[-1]

    def maybe_roll(self, incoming_bytes: int) -> None:
        import time
        segment = self.active_segment
        if segment.size_bytes == 0:
            return
        too_big = segment.size_bytes + incoming_bytes > self.config.segment_bytes_max
        too_old = time.monotonic() - segment.created_monotonic > self.config.segment_age_max_s
        if not (too_big or too_old):
            return
        segment.fsync()  # a sealed segment is always durable, whatever the policy
        new = Segment(self.fileio, self.directory, self.next_offset, writable=True, create=True)
        self.fileio.fsync_dir(self.directory)
        self.segments = self.segments + [new]
        self.active_position = 0
        self.index.set_recovery_point(self._point())

    def _point(self) -> RecoveryPoint:
        return RecoveryPoint(self.active_segment.base_offset, self.active_position,
                             self.next_offset, NO_HWM if self.hwm_us is None else self.hwm_us)

    def advance(self, next_offset: int, hwm_us: int, position: int, published) -> None:
        """Writer thread, after a group is durable under the policy: make it visible."""
        assert next_offset > self.next_offset
        batches = [(frame.base_offset, decode_columns(frame), hwm_before)
                   for frame, hwm_before in published]
        self.hwm_us, self.active_position = hwm_us, position
        self.next_offset = next_offset
        self.ring.publish(batches, next_offset)

    def sync_active(self) -> None:
        self.active_segment.fsync()
        self.index.set_recovery_point(self._point())

    def writer_close(self) -> None:
        if self.segments:
            self.sync_active()
        self.index.sync()

    # -- appends --------------------------------------------------------------------

    def _check_writable(self) -> None:
        if self.closed:
            raise LogClosed(f"partition {self.name} is closed")
        if self.appender is None:
            raise ReadOnlyLog("the log was opened read-only")

    def submit(self, pieces) -> int:
        self._check_writable()
        waiter = Waiter()
        self.appender.submit(Pending(pieces, waiter, sum(p.nbytes for p in pieces)))
        return waiter.wait()

    async def submit_async(self, pieces) -> int:
        import asyncio
        self._check_writable()
        waiter = Waiter(asyncio.get_running_loop())
        await self.appender.submit_async(Pending(pieces, waiter,
                                                 sum(p.nbytes for p in pieces)))
        return await waiter.future

    def run_job(self, job):
        """Run `job()` on the writer thread between appends; return its result."""
        self._check_writable()
        waiter = Waiter()
        self.appender.submit(Pending([], waiter, 0, job))
        return waiter.wait()

    # -- reads ----------------------------------------------------------------------

    def check_offset(self, offset: int) -> None:
        if offset < self.start_offset:
            raise OffsetOutOfRange(f"offset {offset} of {self.name} is no longer in the log "
                                   f"(retention or truncation); it starts at {self.start_offset}")
        if offset > self.next_offset:
            raise OffsetOutOfRange(f"offset {offset} of {self.name} is past its end "
                                   f"({self.next_offset})")

    def hwm_before(self, entry: IndexEntry) -> int | None:
        if entry.base_offset <= self.start_offset:
            return self.start_hwm_us
        previous = self.index.lookup_offset(entry.base_offset - 1)
        return previous.hwm_after_us if previous is not None else None

    def offset_for_timestamp(self, timestamp_us: int) -> int:
        """First offset whose high-water mark is >= timestamp_us; the end if none."""
        if self.start_hwm_us is not None and timestamp_us <= self.start_hwm_us:
            return self.start_offset  # retention removed the records that reached it
        entry = self.index.lookup_time(timestamp_us)
        if entry is None or entry.base_offset >= self.next_offset:
            return self.next_offset
        columns = self.read_batch(entry)
        prior = self.hwm_before(entry)
        hwm = running_max(columns.timestamps_us, NO_HWM if prior is None else prior)
        at = int(np.searchsorted(hwm, timestamp_us, side="left"))
        assert at < len(hwm)  # the index said this batch reaches timestamp_us
        return max(entry.base_offset + at, self.start_offset)

    def read_batch(self, entry: IndexEntry) -> Columns:
        segment = self._segment_for(entry.segment_base)
        data = segment.read(entry.position, entry.frame_bytes)
        frame = decode_frame(data, 0)
        if frame is INCOMPLETE:
            raise OffsetOutOfRange(f"batch at offset {entry.base_offset} is gone")
        return decode_columns(frame)

    def _segment_for(self, base_offset: int) -> Segment:
        for segment in self.segments:
            if segment.base_offset == base_offset:
                return segment
        raise OffsetOutOfRange(f"segment {base_offset} of {self.name} is gone")

    def disk_frames(self, offset: int):
        """Frames from the one holding `offset` to the acknowledged end, read in large
        sequential chunks. Yields Frames whose payload views a chunk. Segments are
        tracked by base offset, so retention removing older ones does not disturb it."""
        entry = self.index.lookup_offset(offset)
        if entry is None:
            segment, position = self.segments[0], 0
        else:
            segment, position = self._segment_for(entry.segment_base), entry.position
        chunk = self.config.read_chunk_bytes
        while True:
            end = self.next_offset
            data = segment.read(position, chunk)
            result = scan_buffer(data, 0)
            if not result.frames and result.stop is StopReason.INCOMPLETE and data:
                data = segment.read(position, max(_frame_bytes(data), chunk))
                result = scan_buffer(data, 0)
            reached = None
            for frame in result.frames:
                if frame.base_offset >= end:
                    return
                reached = frame.next_offset
                yield Frame(position + frame.position, frame.base_offset,
                            frame.record_count, frame.min_timestamp_us,
                            frame.max_timestamp_us, frame.txn_id, frame.flags,
                            frame.raw_bytes, frame.payload)
            position += result.end
            if reached is not None and reached >= end:
                return  # whatever follows is past the acknowledged end (or a torn tail)
            if result.stop is StopReason.BAD:
                raise _corrupt_read(segment, position, result.reason)
            if result.frames and result.stop is StopReason.INCOMPLETE or (
                    result.frames and len(data) == chunk):
                continue
            following = [s for s in self.segments if s.base_offset > segment.base_offset]
            if not following or position < segment.size_bytes and result.frames:
                return
            segment, position = following[0], 0

    def _segment_number(self, base_offset: int) -> int:
        for number, segment in enumerate(self.segments):
            if segment.base_offset == base_offset:
                return number
        raise OffsetOutOfRange(f"segment {base_offset} of {self.name} is gone")

    # -- holds (retention never removes an offset a reader holds) -------------------

    def hold(self, token: int, offset: int) -> None:
        with self._holds_lock:
            self._holds[token] = offset

    def release(self, token: int) -> None:
        with self._holds_lock:
            self._holds.pop(token, None)

    def min_hold(self) -> int | None:
        with self._holds_lock:
            return min(self._holds.values(), default=None)

    # -- truncate and retention (run on the writer thread) ---------------------------

    def truncate_after(self, offset: int) -> int:
        """Forget every record after `offset` (keep offsets <= offset). Crash-safe:
        an intent file holding the new tail frame is made durable first, and recovery
        finishes the job if a crash interrupts it. Returns the new end offset."""
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise InvalidArgument("offset must be an int")
        return self.run_job(lambda: self._truncate_job(offset + 1))

    def _truncate_job(self, new_end: int) -> int:
        if new_end >= self.next_offset:
            return self.next_offset
        if new_end < self.start_offset:
            raise OffsetOutOfRange(f"cannot truncate {self.name} before its start "
                                   f"offset {self.start_offset}")
        self.active_segment.fsync()
        entry = self.index.lookup_offset(new_end)
        assert entry is not None
        assert entry.base_offset <= new_end < entry.next_offset
        keep = new_end - entry.base_offset
        prefix = self._prefix_frame(entry, keep) if keep else b""
        intent = {"new_end": new_end, "segment_base": entry.segment_base,
                  "position": entry.position, "drop_from": entry.base_offset,
                  "prefix": prefix.hex()}
        fileio_module.write_file_atomic(self.fileio, os.path.join(self.directory, INTENT_NAME),
                                        json.dumps(intent).encode())
        self._apply_intent(intent)
        self.truncations.append(self.next_offset)
        self.ring.reset(self.next_offset)
        # A transaction whose commit marker was cut off is not committed any more.
        for txn_id in self.index.reopened_txns:
            self.appender.write_from_job([self._marker_piece(txn_id, RecordKind.ABORT, b"")])
        self.index.reopened_txns = []
        self.index.sync()  # the index runs without sync; make this change stick
        return self.next_offset

    def _prefix_frame(self, entry: IndexEntry, keep: int) -> bytes:
        columns = self.read_batch(entry)
        assert 0 < keep < len(columns)
        from .payload import columns_to_records
        records = list(columns_to_records(columns, self.number, 0, keep, data_only=False))
        timestamps = [r.timestamp_us for r in records]
        raw, flags = encode_payload(timestamps, [r.key for r in records],
                                    [r.value for r in records], [int(r.kind) for r in records],
                                    [r.headers for r in records])
        return encode_frame(base_offset=entry.base_offset, record_count=keep,
                            min_timestamp_us=min(timestamps), max_timestamp_us=max(timestamps),
                            txn_id=columns.txn_id, flags=flags, raw_bytes=len(raw), payload=raw)

    def _apply_intent(self, intent: dict) -> None:
        """Idempotent: drop later segments, cut at the intent's position, write its
        prefix frame, reconcile the index, then remove the intent file."""
        segment_base, position = intent["segment_base"], intent["position"]
        prefix = bytes.fromhex(intent["prefix"])
        keep = [s for s in self.segments if s.base_offset <= segment_base]
        for segment in reversed([s for s in self.segments if s.base_offset > segment_base]):
            segment.close()
            self.fileio.unlink(segment.path)
        segment = keep[-1]
        assert segment.base_offset == segment_base
        segment.truncate_to(min(position, segment.size_bytes))
        if prefix:
            segment.append(prefix)
        segment.fsync()
        self.fileio.fsync_dir(self.directory)
        self.segments = keep
        last = self.index.last_entry
        if last is None and intent["drop_from"] > keep[0].base_offset or (
                last is not None and last.next_offset < intent["drop_from"]):
            self.index.clear()  # it does not reach the cut: recovery rebuilds it
        else:
            self.index.drop_from(intent["drop_from"])
            self._reindex_tail(segment, position)
        self.index.sync()  # before the intent goes: a surviving intent covers the index
        self.fileio.unlink(os.path.join(self.directory, INTENT_NAME))
        self.fileio.fsync_dir(self.directory)

    def _reindex_tail(self, segment: Segment, position: int) -> None:
        data = segment.read(position, segment.size_bytes - position)
        result = scan_buffer(data, 0)
        previous = self.index.last_entry
        hwm = previous.hwm_after_us if previous is not None else None
        entries = []
        for frame in result.frames:
            hwm = frame.max_timestamp_us if hwm is None else max(hwm, frame.max_timestamp_us)
            entries.append(IndexEntry(frame.base_offset, segment.base_offset,
                                      position + frame.position, frame.record_count,
                                      frame.size, frame.min_timestamp_us,
                                      frame.max_timestamp_us, hwm))
        self.index.put(entries)
        last = self.index.last_entry
        self.next_offset = last.next_offset if last is not None else segment.base_offset
        self.hwm_us = last.hwm_after_us if last is not None else None
        self.active_position = segment.size_bytes
        self.index.set_recovery_point(self._point())

    def _view_intent(self) -> None:
        """Read-only: show an unfinished truncate as finished, without touching a file:
        later segments are left out, and the cut segment is seen through a patch that
        ends with the intent's prefix frame."""
        path = os.path.join(self.directory, INTENT_NAME)
        if not self.fileio.exists(path):
            return
        intent = json.loads(fileio_module.read_file(self.fileio, path))
        keep = [s for s in self.segments if s.base_offset <= intent["segment_base"]]
        for segment in self.segments[len(keep):]:
            segment.close()
        keep[-1] = PatchedSegment(keep[-1], intent["position"],
                                  bytes.fromhex(intent["prefix"]))
        self.segments = keep
        self.index.drop_from(intent["drop_from"])

    def _finish_intent(self) -> None:
        path = os.path.join(self.directory, INTENT_NAME)
        if self.fileio.exists(path):
            intent = json.loads(fileio_module.read_file(self.fileio, path))
            self._apply_intent(intent)

    def apply_retention(self, now_us: int) -> list[str]:
        """Delete whole sealed segments past the age or size bound; never one holding an
        offset a reader holds. Returns the deleted paths."""
        return self.run_job(lambda: self._retention_job(now_us))

    def _retention_job(self, now_us: int) -> list[str]:
        config, deleted = self.config, []
        hold = self.min_hold()
        total = sum(s.size_bytes for s in self.segments)
        while len(self.segments) > 1:
            oldest, following = self.segments[0], self.segments[1]
            if hold is not None and following.base_offset > hold:
                break
            last = self.index.lookup_offset(following.base_offset - 1)
            if last is not None and last.next_offset != following.base_offset:
                last = None  # the index does not cover it; judge by size only
            too_old = (config.retention_age_s is not None and last is not None and
                       last.hwm_after_us < now_us - config.retention_age_s * 1e6)
            too_big = config.retention_bytes is not None and total > config.retention_bytes
            if not (too_old or too_big):
                break
            doomed = oldest.path + ".deleted"
            self.fileio.rename(oldest.path, doomed)
            self.fileio.fsync_dir(self.directory)
            self.segments = self.segments[1:]
            self.start_offset = following.base_offset
            if last is not None:
                self.start_hwm_us = last.hwm_after_us
                self.index.set_meta("start_hwm", str(last.hwm_after_us).encode())
            self.index.drop_before(following.base_offset)
            oldest.close()
            self.fileio.unlink(doomed)
            total -= oldest.size_bytes
            deleted.append(oldest.path)
        if deleted:
            self.index.sync()
        return deleted

    # -- closing --------------------------------------------------------------------

    def close(self) -> None:
        if self.closed:
            return
        if self.appender is not None:
            self.appender.close()
        self.closed = True
        self.ring.close()
        self._close_files()

    def _close_files(self) -> None:
        for segment in self.segments:
            segment.close()
        self.index.close()

    def size_bytes(self) -> int:
        return sum(s.size_bytes for s in self.segments)


class PatchedSegment:
    """A read-only view of a segment whose bytes from `position` on are `tail`."""

    def __init__(self, segment: Segment, position: int, tail: bytes) -> None:
        self.segment = segment
        self.base_offset = segment.base_offset
        self.path = segment.path
        self.position = min(position, segment.size_bytes)
        self.tail = tail
        self.size_bytes = self.position + len(tail)
        self.created_monotonic = segment.created_monotonic
        self.closed = False

    def read(self, position: int, size: int) -> bytes:
        head = b""
        if position < self.position:
            head = self.segment.read(position, min(size, self.position - position))
        start = max(position - self.position, 0)
        return head + self.tail[start:start + size - len(head)]

    def close(self) -> None:
        self.closed = True
        self.segment.close()


def _frame_bytes(data: bytes) -> int:
    from .frame import frame_size_hint
    return frame_size_hint(data, 0) or len(data)


def _corrupt_read(segment: Segment, position: int, reason: str):
    from .errors import CorruptSegment
    return CorruptSegment(segment.path, position, reason)
