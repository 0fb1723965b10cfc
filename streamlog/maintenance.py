"""Changing a partition's past: truncate_after (through an intent file) and retention.

Strategy: these functions do the file work and return the new segment set (and what
else changed); the partition (partition.py), which owns its state, runs them on its
writer thread under the commit lock and takes in what they return. Nothing here holds
state of its own.

truncate_after is crash-safe through an intent file, written atomically before any
byte is cut: {"new_end", "segment_base", "position" (where the cut frame starts),
"drop_from" (its base offset), "prefix" (hex of a frame holding the records of the cut
frame that stay, or "")}. Applying it is idempotent: drop the later segments, cut the
segment at the position, write the prefix frame, reconcile the index, remove the
intent. An open that finds the file finishes the job (a writer) or shows the log as if
it were finished, without touching a file (a read-only view, `view_intent`, and the
checks in check.py).

Retention deletes whole segments from the oldest on, while the log is over its size
bound or a segment's records are all older than the age bound, never the active
segment and never one holding an offset a reader holds; and every whole segment below
the partition's start (delete_records moves the start, then removes them here).

What retention removes cannot be read again, yet a seek by time still needs its running
max (DESIGN 5: the high-water mark of a record counts every record before it). So before
a segment goes, retention makes the running max at the next segment's base durable in
`start.hwm` beside the segments: JSON {"marks": [[start offset, running max], ...]}
(NO_HWM: no data record before it), the last two starts. It is not in the index: the
index is a cache, rebuilt from segments that no longer hold those records.

A mark is also a durable start: the partition starts at its latest mark when that is
past its first segment's base (opening.load_start). So `delete_records` (Kafka's
DeleteRecords) moves the start, inside a segment too, by writing the mark of the new
start (`write_start`) before any segment goes; a crash after it leaves the start moved
and the segments below it, which the next writable open deletes
(opening.drop_below_start). A crash between a retention's mark and its delete leaves
the start at the mark likewise: those records were being removed.
"""

from __future__ import annotations

import dataclasses
import json
import os

from . import fileio as fileio_module
from . import recovery as recovery_module
from .frame import encode_frame
from .index import NO_HWM, Index, IndexEntry
from .payload import (Columns, advance_hwm, columns_to_records, encode_payload, frame_time_us,
                      running_max)
from .segments import Segments
from .walk import walk

INTENT_NAME = "truncate.intent"
START_MARKS_NAME = "start.hwm"
START_MARKS_KEPT = 2


# -- truncate_after ---------------------------------------------------------------------

def truncate_intent(entry: IndexEntry, new_end: int, columns: Columns) -> dict:
    """The intent of cutting the partition at `new_end`, inside the batch `entry` names
    (whose `columns` are given)."""
    assert entry.base_offset <= new_end < entry.next_offset
    keep = new_end - entry.base_offset
    prefix = _prefix_frame(entry, keep, columns) if keep else b""
    return {"new_end": new_end, "segment_base": entry.segment_base,
            "position": entry.position, "drop_from": entry.base_offset,
            "prefix": prefix.hex()}


def _prefix_frame(entry: IndexEntry, keep: int, columns: Columns) -> bytes:
    """A frame with the first `keep` records of a batch (the part a cut keeps)."""
    assert 0 < keep < len(columns)
    records = list(columns_to_records(columns, 0, 0, keep, data_only=False))
    timestamps = [r.timestamp_us for r in records]
    raw, flags = encode_payload(timestamps, [r.key for r in records],
                                [r.value for r in records], [int(r.kind) for r in records],
                                [r.headers for r in records])
    return encode_frame(base_offset=entry.base_offset, record_count=keep,
                        min_timestamp_us=min(timestamps), max_timestamp_us=max(timestamps),
                        txn_id=columns.txn_id, flags=flags, raw_bytes=len(raw), payload=raw)


def write_intent(fileio, directory: str, intent: dict) -> None:
    fileio_module.write_file_atomic(fileio, os.path.join(directory, INTENT_NAME),
                                    json.dumps(intent).encode())


def read_intent(fileio, directory: str) -> dict | None:
    """The intent of a truncate under way, or None. Raises ValueError when the file is
    damaged."""
    path = os.path.join(directory, INTENT_NAME)
    if not fileio.exists(path):
        return None
    intent = json.loads(fileio_module.read_file(fileio, path))
    if not isinstance(intent, dict) or not {"segment_base", "position", "drop_from",
                                            "prefix"} <= intent.keys():
        raise ValueError(f"{path} is not a truncate intent")
    return intent


@dataclasses.dataclass
class Cut:
    """What applying an intent left: the segments, and the end when the index reached
    the cut (None: the index was cleared and recovery must rebuild it)."""

    segments: Segments
    next_offset: int | None
    hwm_us: int | None


def apply_intent(fileio, directory: str, segments: Segments, index: Index, intent: dict,
                 chunk_bytes: int, start_hwm_us: int | None = None) -> Cut:
    """Carry out a truncate intent (idempotent; see the module docstring).
    `start_hwm_us`: the running max of the records retention removed, where the
    running max starts again when no batch before the cut is left."""
    segment_base, position = intent["segment_base"], intent["position"]
    prefix = bytes.fromhex(intent["prefix"])
    keep = segments.through(segment_base)
    for segment in reversed(segments[len(keep):]):
        segment.unseal()
        segment.close()
        fileio.unlink(segment.path)
    segment = keep.active
    assert segment.base_offset == segment_base
    segment.truncate_to(min(position, segment.size_bytes))
    if prefix:
        segment.append(prefix)
    segment.fsync()
    fileio.fsync_dir(directory)
    cut = Cut(keep, None, None)
    last = index.last_entry
    if last is None and intent["drop_from"] > keep[0].base_offset or (
            last is not None and last.next_offset < intent["drop_from"]):
        index.clear()  # it does not reach the cut: recovery rebuilds it
    else:
        index.drop_from(intent["drop_from"])
        previous = index.last_entry
        state, _ = recovery_module.index_from(
            keep, index, number=len(keep) - 1, position=position,
            next_offset=previous.next_offset if previous is not None else segment.base_offset,
            hwm_us=(previous.hwm_after_us if previous is not None
                    and previous.hwm_after_us != NO_HWM else start_hwm_us),
            chunk_bytes=chunk_bytes)
        cut.next_offset, cut.hwm_us = state.next_offset, state.hwm_us
    index.sync()  # before the intent goes: a surviving intent covers the index
    fileio.unlink(os.path.join(directory, INTENT_NAME))
    fileio.fsync_dir(directory)
    return cut


def view_intent(segments: Segments, intent: dict) -> Segments:
    """Read-only: the segments as they will be once the intent is carried out, without
    touching a file: later segments are left out (and closed), and the cut segment is
    seen through a patch that ends with the intent's prefix frame."""
    keep = segments.through(intent["segment_base"])
    if not keep:
        raise ValueError("the truncate intent names a segment that is not there")
    for segment in segments[len(keep):]:
        segment.close()
    return Segments((*keep[:-1], PatchedSegment(keep.active, intent["position"],
                                                bytes.fromhex(intent["prefix"]))))


class PatchedSegment:
    """A read-only view of a segment whose bytes from `position` on are `tail`."""

    def __init__(self, segment, position: int, tail: bytes) -> None:
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


# -- retention --------------------------------------------------------------------------

@dataclasses.dataclass
class Retained:
    """What retention left: the segments, the paths it deleted, and the running max
    timestamp of the records it removed (None when the index could not say)."""

    segments: Segments
    deleted: list[str]
    start_hwm_us: int | None


def read_start_marks(fileio, directory: str) -> dict[int, int]:
    """{start offset: running max timestamp of every record before it} that retention
    recorded; {} when there is none. Raises ValueError when the file is damaged."""
    path = os.path.join(directory, START_MARKS_NAME)
    if not fileio.exists(path):
        return {}
    found = json.loads(fileio_module.read_file(fileio, path))
    marks = found.get("marks") if isinstance(found, dict) else None
    if not isinstance(marks, list) or not all(
            isinstance(m, list) and len(m) == 2 and all(type(v) is int for v in m)
            for m in marks):
        raise ValueError(f"{path} is not a list of start marks")
    return {start: hwm for start, hwm in marks}


def latest_start(marks: dict[int, int]) -> tuple[int, int | None] | None:
    """(start offset, running max before it: None for no data record) of the latest
    start mark, or None when there is none."""
    if not marks:
        return None
    start = max(marks)
    return start, None if marks[start] == NO_HWM else marks[start]


def write_start(fileio, directory: str, start: int, hwm_us: int | None) -> None:
    """Make `start` the partition's start, durably (a start mark: see the module
    docstring); `hwm_us` is the running max of every record before it."""
    try:
        marks = read_start_marks(fileio, directory)
    except ValueError:
        marks = {}  # (the new mark replaces a damaged file)
    _write_start_mark(fileio, directory, marks, start, hwm_us)


def hwm_before(view, offset: int) -> int | None:
    """The running max timestamp of every record before `offset` (start < offset <=
    end) as `view` (view.View) reads the partition: of the batch holding it, the
    running max before the batch and of its records before `offset`."""
    if offset >= view.end_offset:
        return view.snapshot.hwm_us
    entry, columns = view.batch_holding(offset)
    before = view.hwm_before(entry)
    if offset == entry.base_offset:
        return before
    found = int(running_max(columns, before)[offset - entry.base_offset - 1])
    return None if found == NO_HWM else found


def _write_start_mark(fileio, directory: str, marks: dict[int, int], start: int,
                      hwm_us: int | None) -> dict[int, int]:
    hwm_us = NO_HWM if hwm_us is None else hwm_us
    marks = dict(sorted({**marks, start: hwm_us}.items())[-START_MARKS_KEPT:])
    fileio_module.write_file_atomic(fileio, os.path.join(directory, START_MARKS_NAME),
                                    json.dumps({"marks": [[s, h] for s, h in
                                                          marks.items()]}).encode())
    return marks


def _hwm_after(segment, index: Index, hwm_us: int | None, end_offset: int,
               chunk_bytes: int) -> int | None:
    """The running max after `segment` (which ends at `end_offset`), from the index
    when it covers the segment's last batch, else from the segment's own frames."""
    last = index.lookup_offset(end_offset - 1)
    if last is not None and last.next_offset == end_offset and (
            index.verified or last.base_offset >= segment.base_offset):
        return hwm_us if last.hwm_after_us == NO_HWM else advance_hwm(hwm_us,
                                                                      last.hwm_after_us)
    running = hwm_us

    def take(_, frames) -> None:
        nonlocal running
        for frame in frames:
            running = advance_hwm(running, frame_time_us(frame))

    walk([segment], number=0, position=0, next_offset=segment.base_offset,
         chunk_bytes=chunk_bytes, on_frames=take)
    return running


def apply_retention(fileio, directory: str, segments: Segments, index: Index, *,
                    retention_age_s: float | None, retention_bytes: int | None,
                    hold: int | None, now_us: int, start: int = 0,
                    start_hwm_us: int | None = None,
                    chunk_bytes: int = 1 << 20) -> Retained:
    """Delete segments from the oldest on while over a bound, or below `start` (the
    partition's start: see the module docstring). `hold`: the lowest offset a reader
    holds (None: no reader). `start_hwm_us`: the running max of the records before
    `start`."""
    result = Retained(segments, [], None)
    marks: dict[int, int] | None = None
    running = start_hwm_us
    total = segments.size_bytes()
    while len(result.segments) > 1:
        oldest, following = result.segments[0], result.segments[1]
        if hold is not None and following.base_offset > hold:
            break
        below = following.base_offset <= start
        last = index.lookup_offset(following.base_offset - 1)
        if last is not None and last.next_offset != following.base_offset:
            last = None  # the index does not cover it; judge by size only
        too_old = (retention_age_s is not None and last is not None and
                   last.hwm_after_us < now_us - retention_age_s * 1e6)
        too_big = retention_bytes is not None and total > retention_bytes
        if not (below or too_old or too_big):
            break
        if not below:  # (below the start: the start's mark says it all)
            running = _hwm_after(oldest, index, running, following.base_offset,
                                 chunk_bytes)
            if running is not None:  # made durable before the records go
                if marks is None:
                    try:
                        marks = read_start_marks(fileio, directory)
                    except ValueError:
                        marks = {}
                marks = _write_start_mark(fileio, directory, marks,
                                          following.base_offset, running)
                result.start_hwm_us = running
        doomed = oldest.path + ".deleted"
        oldest.unseal()
        fileio.rename(oldest.path, doomed)
        fileio.fsync_dir(directory)
        result.segments = result.segments[1:]
        index.drop_before(following.base_offset)
        oldest.close()
        fileio.unlink(doomed)
        total -= oldest.size_bytes
        result.deleted.append(oldest.path)
    if result.deleted:
        index.sync()
    return result
