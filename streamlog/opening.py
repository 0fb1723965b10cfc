"""Opening a partition: taking it in from its files, as functions over its state.

Strategy: an open (and a writer's `catchup.reload` after another process truncated)
runs, under the commit lock: remove what a crash left half-made (a writer only), show
or finish an interrupted truncate (maintenance.py's intent), open the segments, read the
start marks, then recovery (recovery.py), which walks from the index's recovery point,
cuts a torn tail (a writer) or records damage (a read-only open). The index is a cache:
one that cannot be read even while recovery rebuilds it is recreated empty and rebuilt
from the segments (`fresh_index`). The state is changed only through `part.publish`.
"""

from __future__ import annotations

import logging
import os

from . import holds, maintenance
from .errors import CorruptIndex
from .index import Index
from .index_storage import wipe_index
from .layout import DELETED_SUFFIX, SEGMENT_SUFFIX, parse_segment_name
from .recovery import recover
from .seal import SEAL_SUFFIX
from .segment import Segment
from .segments import Segments
from .state import recovery_point

log = logging.getLogger("streamlog.partition")


def load(part, progress=None) -> None:
    """Take the partition in from its files: finish (or, read-only, show as finished)
    an interrupted truncate, open the segments, recover; a writer then deletes what a
    crash left below the start."""
    if not part.readonly:
        clean_leftovers(part)
    try:  # the index was opened before the lock: a writer may have added to it since
        part.index.reload_last()
    except CorruptIndex:
        pass  # recovery finds out, and rebuilds it
    segments = open_segments(part)
    part.publish(segments=segments)
    load_start(part)
    if not part.readonly:
        finish_intent(part)
    else:
        view_intent(part)
    if part.state.segments:
        run_recovery(part, progress)
    if part.state.start_offset > part.state.end_offset:  # a mark past what is there
        log.warning("%s: its start mark %d is past its end %d (a repair cut it): it "
                    "starts at its end", part.name, part.state.start_offset,
                    part.state.end_offset)
        part.publish(start_offset=part.state.end_offset)
    if not part.readonly:
        drop_below_start(part)  # (after recovery: the index has their transactions)
        forget_removed(part)


def forget_removed(part) -> None:
    """Index entries of segments that are gone (a crash inside retention, after the
    delete reached the disk and before the index heard of it) are dropped; the running
    max of what was removed is in the start marks (maintenance.py), made durable before
    the delete."""
    start = part.state.segments.start_offset
    try:
        first = part.index.first_entry()
        if first is None or first.base_offset >= start:
            return
        part.index.drop_before(start)
    except CorruptIndex:
        pass  # recovery has judged the index; reads check every entry they use


def drop_below_start(part) -> None:
    """A writer: delete the whole segments below the start, which a crash left after
    the start mark that retention or delete_records writes before deleting them
    (maintenance.py); a durable hold keeps what it holds."""
    state = part.state
    if len(state.segments) < 2 or state.segments[1].base_offset > state.start_offset:
        return
    retained = maintenance.apply_retention(
        part.fileio, part.directory, state.segments, part.index, retention_age_s=None,
        retention_bytes=None, hold=holds.lowest(part.fileio, part.directory), now_us=0,
        start=state.start_offset, start_hwm_us=state.start_hwm_us,
        chunk_bytes=part.config.read_chunk_bytes)
    part.publish(segments=retained.segments)


def load_start(part) -> None:
    """The partition's start, from its segments and its start marks (maintenance.py):
    its first segment's base, or its latest mark when that is later (delete_records,
    or a retention a crash interrupted); and the running max of the records before it
    (None when there are none). A log retention trimmed before start marks existed
    has that only in its index."""
    start = part.state.segments.start_offset
    try:
        marks = maintenance.read_start_marks(part.fileio, part.directory)
    except ValueError as error:
        log.warning("%s: seeks by time before the start's first record may start late",
                    error)
        marks = {}
    latest = maintenance.latest_start(marks)
    if latest is not None and latest[0] > start:
        part.publish(start_offset=latest[0], start_hwm_us=latest[1])
        return
    part.publish(start_offset=start)
    if start == 0:
        part.publish(start_hwm_us=None)
        return
    found = marks.get(start)
    if found is not None:
        found = None if found == maintenance.NO_HWM else found
    else:
        try:
            stored = part.index.get_meta("start_hwm")
        except CorruptIndex:
            stored = None
        found = int(stored) if stored else None
    part.publish(start_hwm_us=found)


def run_recovery(part, progress) -> None:
    """Run recovery; an index that fails even while being rebuilt is recreated."""
    segments = list(part.state.segments)  # a writer's recovery may remove later ones
    writable = not part.readonly
    try:
        state, part.report = recover(segments, part.index, writable=writable,
                                     chunk_bytes=part.config.read_chunk_bytes,
                                     progress=progress)
    except CorruptIndex as error:
        part.index_problem = str(error)
        log.warning("%s: rebuilding it from the segments", error)
        part.index.close()
        part.index = fresh_index(part)
        state, part.report = recover(segments, part.index, writable=writable,
                                     chunk_bytes=part.config.read_chunk_bytes,
                                     progress=progress)
    if part.index_problem is not None:
        part.report.rebuilt_index = True
        part.report.index_problem = part.report.index_problem or part.index_problem
    part.publish(segments=Segments(segments), end_offset=state.next_offset,
                 hwm_us=state.hwm_us, active_position=state.end_position,
                 end_segment=state.end_segment, damage=state.damage)
    if writable:
        rederive_commits(part)


def clean_leftovers(part) -> None:
    """Remove what a crash left half-made: deleted and temporary files, and seals whose
    segment is gone."""
    names = part.fileio.listdir(part.directory)
    for name in names:
        segment = name[:-len(SEAL_SUFFIX)] + SEGMENT_SUFFIX
        orphan_seal = name.endswith(SEAL_SUFFIX) and parse_segment_name(segment) is not None \
            and segment not in names
        if name.endswith(DELETED_SUFFIX) or name.endswith(".tmp") or orphan_seal:
            part.fileio.unlink(os.path.join(part.directory, name))


def open_index(part) -> Index:
    try:
        return Index(os.path.join(part.directory, "index"), readonly=part.readonly,
                     map_bytes=part.config.index_map_bytes,
                     probe_unsealed=part.probe_unsealed, storage=part.index_storage)
    except CorruptIndex as error:
        part.index_problem = str(error)
        log.warning("%s: rebuilding it from the segments", error)
        return fresh_index(part)


def fresh_index(part) -> Index:
    """An empty index: in memory for a read-only open (no file is touched), else the
    damaged files removed (a cache: rebuilt from the segments) and recreated."""
    map_bytes = part.config.index_map_bytes
    if part.readonly:
        return Index(os.path.join(part.directory, "no-index"), readonly=True,
                     map_bytes=map_bytes, storage=part.index_storage)
    path = os.path.join(part.directory, "index")
    wipe_index(path, storage=part.index_storage)
    return Index(path, readonly=False, map_bytes=map_bytes, storage=part.index_storage)


def open_segments(part) -> Segments:
    fileio, directory = part.fileio, part.directory
    names = fileio.listdir(directory) if fileio.exists(directory) else []
    bases = sorted(b for b in map(parse_segment_name, names) if b is not None)
    segments = [Segment(fileio, directory, base, writable=not part.readonly,
                        clock=part.clock)
                for base in bases]
    if not segments and not part.readonly:
        segments = [Segment(fileio, directory, 0, writable=True, create=True,
                            clock=part.clock)]
        fileio.fsync_dir(directory)
    return Segments(segments)


def rederive_commits(part) -> None:
    """Tags whose latest commit a cut removed (Index.drop_from): their latest commit
    before the cut, from the segments."""
    tags, part.index.dropped_commits = part.index.dropped_commits, []
    for tag in dict.fromkeys(tags):
        found = part.view().scan_last_commit(tag)
        if found is not None:
            part.index.put_commit(tag, *found)


def apply_intent(part, intent: dict) -> None:
    """Carry out a truncate's intent (maintenance.apply_intent) and take in the cut."""
    state = part.state
    cut = maintenance.apply_intent(part.fileio, part.directory, state.segments, part.index,
                                   intent, part.config.read_chunk_bytes, state.start_hwm_us)
    part.publish(segments=cut.segments)
    if cut.next_offset is not None:  # else recovery rebuilds the index and the end
        part.publish(end_offset=cut.next_offset, hwm_us=cut.hwm_us,
                     active_position=cut.segments.active.size_bytes)
        part.index.set_recovery_point(recovery_point(part.state))
        rederive_commits(part)


def view_intent(part) -> None:
    """Read-only: show an unfinished truncate as finished (maintenance.view_intent)."""
    intent = maintenance.read_intent(part.fileio, part.directory)
    if intent is not None:
        part.publish(segments=maintenance.view_intent(part.state.segments, intent))
        part.index.drop_from(intent["drop_from"])


def finish_intent(part) -> None:
    intent = maintenance.read_intent(part.fileio, part.directory)
    if intent is not None:
        apply_intent(part, intent)

