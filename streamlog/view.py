"""Reading one partition as of a snapshot: locating frames, reading batches, seeking
by time, deriving transaction states.

Strategy: the partition's writer thread owns its state and publishes it as an immutable
value (state.py: offsets, high-water marks, segments) after every change; a `View` reads
with one such snapshot and the index, so a read never sees half of a change (a segment set
without the offsets that go with it). The index is a cache: every entry it gives is
checked against the frame it names, and when it cannot say (damaged, or it lacks the
entry) the segments are walked instead (walk.py), never trusted blindly.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from . import recovery as recovery_module
from . import walk as walk_module
from .errors import CorruptFrame, CorruptIndex, CorruptSegment, OffsetOutOfRange
from .frame import HEADER_BYTES, INCOMPLETE, decode_frame, decode_header
from .index import NO_HWM, Index, IndexEntry
from .integrity import TailKind
from .payload import (Columns, advance_hwm, columns_to_records, decode_columns, frame_time_us,
                      running_max)
from .records import RecordKind
from .segment import Segment
from .state import PartitionState
from .txn import TxnState, decode_begin, decode_commit, decode_epoch, producer_tag

log = logging.getLogger("streamlog.partition")


class View:
    """Reads of one partition as of `snapshot` (see the module docstring)."""

    def __init__(self, snapshot: PartitionState, index: Index, name: str, chunk_bytes: int) -> None:
        self.snapshot = snapshot
        self.index = index
        self.name = name
        self.chunk_bytes = chunk_bytes
        self.start_offset = snapshot.start_offset
        self.end_offset = snapshot.end_offset
        self.start_hwm_us = snapshot.start_hwm_us
        self.segments = snapshot.segments

    def open_txn_candidates(self) -> dict[int, int]:
        """{txn_id: first offset} of the transactions the index says are open (from the
        segments when it cannot say). Confirm each with derive_txn before acting."""
        try:
            return self.index.open_txns()
        except CorruptIndex as error:  # cannot list them: find them in the segments
            log.warning("%s: looking for open transactions in the segments", error)
            return self.open_txns_from_segments()

    def txn_state(self, txn_id: int, seen_at: int | None = None):
        """TxnState of a transaction, or None when it has no data here. `seen_at` is
        the offset of one of its data records when the caller saw one (a reader): a
        transaction the index does not know then cannot be unknown, and its state is
        derived from the markers in the segments. So it is when the index could not be
        verified at open (no seal): an unknown id then costs a walk of the partition."""
        try:
            found = self.index.txn_state(txn_id)
        except CorruptIndex as error:  # its cached state is damaged: walk the partition
            log.warning("%s: deriving transaction %#x from the segments", error, txn_id)
            found, seen_at = None, self.start_offset if seen_at is None else seen_at
        if found is None and seen_at is None and not self.index.verified:
            seen_at = self.start_offset  # a damaged page may have lost it: look
        if found is None and seen_at is not None:
            found = self.derive_txn(txn_id, seen_at)
        return None if found is None else TxnState(found[0])

    def txn_first_offset(self, txn_id: int) -> int:
        """Where a transaction's data starts, by the index (the partition's start when
        the index cannot say): where derive_txn must look from."""
        try:
            found = self.index.txn_state(txn_id)
        except CorruptIndex:
            found = None
        return max(found[1], self.start_offset) if found is not None else self.start_offset

    def derive_txn(self, txn_id: int, first: int) -> tuple[int, int, int] | None:
        """(state, first, marker offset) of a transaction from the segments: scan from
        `first` to the acknowledged end for its commit or abort marker. None when no
        record of it is found there."""
        seen = None
        for frame in self.disk_frames(first):
            if frame.txn_id != txn_id:
                continue
            if seen is None:
                seen = frame.base_offset
            if frame.has_control:
                for _, state, offset, _, _ in recovery_module.txn_events(frame)[1:]:
                    return (int(state), seen, offset)
        return None if seen is None else (int(TxnState.OPEN), seen, 0)

    def open_txns_from_segments(self) -> dict[int, int]:
        """{txn_id: first offset} of transactions with data and no marker, from a walk
        of every frame (only when the index cannot say)."""
        found: dict[int, int] = {}
        for frame in self.disk_frames(self.start_offset):
            if frame.txn_id == 0:
                continue
            for txn_id, state, offset, _, _ in recovery_module.txn_events(frame):
                if state == TxnState.OPEN:
                    found.setdefault(txn_id, offset)
                else:
                    found.pop(txn_id, None)
        return found

    def last_stable_offset(self) -> int:
        """First offset of the oldest open transaction, or the end."""
        try:
            firsts = self.index.open_txns().values()
        except CorruptIndex as error:
            log.warning("%s: looking for open transactions in the segments", error)
            firsts = self.open_txns_from_segments().values()
        return min(firsts, default=self.end_offset)

    def last_commit(self, tag: str) -> bytes | None:
        """Marker of the latest commit made with `tag`, or None. The index's claim is
        checked against the record it names (a COMMIT under `tag` at that offset, with
        that marker); one that does not check out (a truncate or a power loss removed
        the commit), or an index that cannot say, gives way to a walk of the partition."""
        try:
            claim = self.index.last_commit(tag)
        except CorruptIndex as error:
            log.warning("%s: looking for commits in the segments", error)
            claim = ()
        if claim is None and self.index.verified:
            return None
        if claim:
            offset, marker = claim
            if offset < self.start_offset:
                # retention removed the record, not the commit (a cut drops the claims
                # it passes: Index.drop_from)
                return marker
            if offset < self.end_offset and self._commit_at(offset) == (tag, marker):
                return marker
        found = self.scan_last_commit(tag)
        return None if found is None else found[1]

    def _commit_at(self, offset: int) -> tuple[str, bytes] | None:
        entry, columns = self.batch_holding(offset)
        (record,) = columns_to_records(columns, 0, offset - entry.base_offset,
                                       offset - entry.base_offset + 1, data_only=False)
        return decode_commit(record.value) if record.kind == RecordKind.COMMIT else None

    def producer_epoch(self, transactional_id: str) -> int | None:
        """The latest epoch of a transactional id (the offset of its latest fence), or
        None when no producer with the id started here (txn.py)."""
        return decode_epoch(self.last_commit(producer_tag(transactional_id)))

    def producer_of(self, txn_id: int) -> tuple[str, int] | None:
        """(transactional id, epoch) of the producer that began a transaction, read from
        its first record (a BEGIN); None for a transaction begun without one."""
        first = self.txn_first_offset(txn_id)
        if not self.start_offset <= first < self.end_offset:
            return None
        entry, columns = self.batch_holding(first)
        if columns.txn_id != txn_id or columns.kinds is None:
            return None
        (record,) = columns_to_records(columns, 0, first - entry.base_offset,
                                       first - entry.base_offset + 1, data_only=False)
        return decode_begin(record.value) if record.kind == RecordKind.BEGIN else None

    def scan_last_commit(self, tag: str) -> tuple[int, bytes] | None:
        """(offset, marker) of the latest commit under `tag` in the segments."""
        found = None
        for frame in self.disk_frames(self.start_offset):
            if frame.has_control:
                for _, state, at, event_tag, marker in recovery_module.txn_events(frame):
                    if event_tag and event_tag == tag and state == TxnState.COMMITTED:
                        found = (at, bytes(marker))
        return found

    def check_offset(self, offset: int) -> None:
        if offset < self.start_offset:
            raise OffsetOutOfRange(f"offset {offset} of {self.name} is no longer in the log "
                                   f"(retention or truncation); it starts at {self.start_offset}")
        if offset > self.end_offset:
            raise OffsetOutOfRange(f"offset {offset} of {self.name} is past its end "
                                   f"({self.end_offset})")

    def hwm_before(self, entry: IndexEntry) -> int | None:
        """Running max timestamp of the records before `entry`'s batch."""
        if entry.base_offset <= self.start_offset:
            return self.start_hwm_us
        previous = self.entry_for(entry.base_offset - 1)
        if previous is not None:
            return None if previous.hwm_after_us == NO_HWM else previous.hwm_after_us
        return self._scan_hwm(entry.base_offset)

    def hwm_before_offset(self, base_offset: int) -> int | None:
        """Running max timestamp of the records before the batch at `base_offset`."""
        entry = self.entry_for(base_offset)
        if entry is not None and entry.base_offset == base_offset:
            return self.hwm_before(entry)
        if base_offset <= self.start_offset:
            return self.start_hwm_us
        return self._scan_hwm(base_offset)

    def batch_holding(self, offset: int) -> tuple[IndexEntry, Columns]:
        """The batch that holds `offset` (an acknowledged one) and its columns: by the
        index when its entry checks out, else by walking the segment that holds it.
        Raises OffsetOutOfRange outside [start_offset, next_offset)."""
        if not self.start_offset <= offset < self.end_offset:
            raise OffsetOutOfRange(f"offset {offset} of {self.name} is not in "
                                   f"[{self.start_offset}, {self.end_offset})")
        entry = self.entry_for(offset)
        if entry is not None:
            return entry, self.read_batch(entry)
        for frame in self.disk_frames(offset):
            if frame.next_offset > offset:
                segment = self.segment_holding(frame.base_offset)
                entry = IndexEntry(frame.base_offset, segment.base_offset, frame.position,
                                   frame.record_count, frame.size, frame.min_timestamp_us,
                                   frame.max_timestamp_us, NO_HWM)
                return entry, decode_columns(frame)
        raise OffsetOutOfRange(f"offset {offset} of {self.name} is gone")

    def entry_for(self, offset: int) -> IndexEntry | None:
        """The index entry of the batch holding `offset`, when the index has it and it
        is sound; None otherwise (the caller falls back to the segments)."""
        try:
            entry = self.index.lookup_offset(offset)
        except CorruptIndex as error:
            log.warning("%s: using the segments instead", error)
            return None
        if entry is None or not entry.base_offset <= offset < entry.next_offset:
            return None
        return entry

    def _scan_hwm(self, offset: int) -> int | None:
        """Running max timestamp before `offset`, from the frame headers (only when the
        index cannot say: it reads the partition from its start)."""
        hwm = self.start_hwm_us
        for frame in self.disk_frames(self.start_offset):
            if frame.base_offset >= offset:
                break
            hwm = advance_hwm(hwm, frame_time_us(frame))
        return hwm

    def offset_for_timestamp(self, timestamp_us: int) -> int:
        """First offset whose high-water mark is >= timestamp_us; the end if none."""
        if self.start_hwm_us is not None and timestamp_us <= self.start_hwm_us:
            return self.start_offset  # retention removed the records that reached it
        entry = self._time_entry(timestamp_us)
        if entry is None:
            return self.end_offset
        columns = self.read_batch(entry)
        prior = self.hwm_before(entry)
        hwm = running_max(columns, prior)
        at = int(np.searchsorted(hwm, timestamp_us, side="left"))
        assert at < len(hwm)  # this batch reaches timestamp_us (checked by _time_entry)
        return max(entry.base_offset + at, self.start_offset)

    def _time_entry(self, timestamp_us: int) -> IndexEntry | None:
        """The first batch whose running max reaches `timestamp_us`, or None. The time
        index's answer is checked (it reaches it, the batch before does not); when it
        cannot be confirmed the frame headers are walked instead."""
        try:
            entry = self.index.lookup_time(timestamp_us)
        except CorruptIndex as error:
            log.warning("%s: using the segments instead", error)
            return self._scan_time_entry(timestamp_us)
        if entry is None or entry.base_offset >= self.end_offset:
            # No acknowledged batch reaches it: believed when the last one agrees.
            last = (self.entry_for(self.end_offset - 1)
                    if self.end_offset > self.start_offset else None)
            if last is not None and last.hwm_after_us < timestamp_us:
                return None
            return self._scan_time_entry(timestamp_us)
        if entry.base_offset < self.start_offset:  # its segment is gone: unconfirmable
            return self._scan_time_entry(timestamp_us)
        before = self.hwm_before(entry)
        if entry.hwm_after_us < timestamp_us or entry.next_offset > self.end_offset or (
                before is not None and before >= timestamp_us):
            return self._scan_time_entry(timestamp_us)
        return entry

    def _scan_time_entry(self, timestamp_us: int) -> IndexEntry | None:
        hwm = self.start_hwm_us
        for frame in self.disk_frames(self.start_offset):
            hwm = advance_hwm(hwm, frame_time_us(frame))
            if hwm is not None and hwm >= timestamp_us:
                segment = self.segment_holding(frame.base_offset)
                return IndexEntry(frame.base_offset, segment.base_offset, frame.position,
                                  frame.record_count, frame.size, frame.min_timestamp_us,
                                  frame.max_timestamp_us, hwm)
        return None

    def read_batch(self, entry: IndexEntry) -> Columns:
        """The columns of the batch an index entry names (checked against its frame)."""
        segment = self.segments.by_base(entry.segment_base)
        if segment is not None:  # the common case: one read of exactly the frame
            try:
                frame = decode_frame(segment.read(entry.position, entry.frame_bytes), 0)
            except CorruptFrame:
                frame = None
            if frame is not None and frame is not INCOMPLETE and (
                    frame.base_offset, frame.record_count) == (entry.base_offset,
                                                               entry.record_count):
                return decode_columns(dataclasses.replace(frame, position=entry.position))
        for frame in self.disk_frames(entry.base_offset):  # else walk to it (and judge)
            if frame.next_offset <= entry.base_offset:
                continue  # read from an earlier frame (the index could not place it)
            if frame.base_offset != entry.base_offset:
                break
            return decode_columns(frame)
        raise OffsetOutOfRange(f"batch at offset {entry.base_offset} is gone")

    def segment_holding(self, offset: int) -> Segment:
        """The segment whose records include `offset`, by the file names alone."""
        return self.segments.holding(offset)

    def locate(self, offset: int) -> tuple[Segment, int, int]:
        """(segment, position, base offset) of a frame at or before `offset` to read
        from. The index's entry is used only when the frame header at its position has
        the base offset it claims; otherwise the segment holding `offset` is read from
        its start (segments are named by their base offset)."""
        entry = self.entry_for(offset)
        if entry is not None:
            segment = self.segments.by_base(entry.segment_base)
            if segment is not None and _header_base(segment, entry.position) == (
                    entry.base_offset):
                return segment, entry.position, entry.base_offset
            log.warning("index entry for offset %d of %s does not match its segment: "
                        "reading the segment from its start", offset, self.name)
        segment = self.segment_holding(offset)
        return segment, 0, segment.base_offset

    def disk_frames(self, offset: int):
        """Frames from the one holding `offset` to the acknowledged end, read in large
        sequential chunks; each must continue the one before. Yields Frames whose
        payload views a chunk.
        Raises CorruptSegment, naming segment and position, at a bad frame before the
        acknowledged end. Segments are tracked by base offset, so retention removing
        older ones does not disturb it."""
        segment, position, expect = self.locate(offset)
        while expect < self.end_offset:
            if position >= segment.size_bytes:
                segment, position = self._next_segment(segment, expect)
                continue
            runs = walk_module.segment_frames(segment, position, expect,
                                              self.chunk_bytes)
            while True:  # the one walker's runs of frames, up to the acknowledged end
                try:
                    frames = next(runs)
                except StopIteration as stop:
                    end = stop.value
                    break
                for frame in frames:
                    if frame.base_offset >= self.end_offset:
                        return
                    expect = frame.next_offset
                    yield frame
                if expect >= self.end_offset:
                    return
            if end.kind is not TailKind.END:  # bad bytes before the acknowledged end
                raise _corrupt_read(segment, end.position, end.reason)
            position = end.position

    def _next_segment(self, segment: Segment, expect: int) -> tuple[Segment, int]:
        following = self.segments.after(segment)
        if following is None:
            raise _corrupt_read(segment, segment.size_bytes,
                                f"the segment ends before offset {expect}, which the "
                                f"log acknowledged")
        if following.base_offset != expect:
            raise _corrupt_read(following, 0, f"segment starts at offset "
                                f"{following.base_offset}, expected {expect}")
        return following, 0

    # -- holds (retention never removes an offset a reader holds) -------------------


def _header_base(segment, position: int) -> int | None:
    """Base offset in the (checksummed) frame header at `position`, or None."""
    try:
        header = decode_header(segment.read(position, HEADER_BYTES), 0)
    except CorruptFrame:
        return None
    return None if header is INCOMPLETE else header.base_offset


def _corrupt_read(segment, position: int, reason: str) -> CorruptSegment:
    return CorruptSegment(segment.path, position, reason)
