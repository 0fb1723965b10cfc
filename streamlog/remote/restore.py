"""Restore: a writable open whose local directory is empty or missing continues from
the store.

Strategy (DESIGN 11): the open first takes the log over (a new epoch: an older writer
still alive is fenced, so the generation restored from is final), then writes the
directory that generation describes: the marker, each stream's `stream.json`, every
segment object as its file (checked against the manifest's whole-object checksum
before it is written: a damaged or missing object is `CorruptObject`, never a file),
its seal, and an empty active segment at the store's end, so appends go on after what
the store has and never into a segment it holds. Each partition's index is filled
from the index objects with its recovery point at the store's end, so the open that
follows reads no segment through (recovery checks one frame).

Crash safety: `restore.intent` is written first and removed last, after the marker;
an open that finds it (a restore killed half-way) restores again, over what is there.
Segment files are written atomically (temporary file, fsync, rename).

What is lost: under durability "local" the store lags the log, so the records the lost
machine had acknowledged after the store's end are gone. Each generation records the
writer's acknowledged end when it was committed (`local_end`); the restore reports
[store end, local_end) per partition as lost, at least (logged, and in `info()`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import os

import xxhash

from ..directory import FORMAT, MARKER_NAME, write_stream_meta
from ..errors import CorruptIndex, CorruptObject, ObjectNotFound
from ..fileio import write_file_atomic
from ..index import Index
from ..index_storage import wipe_index
from ..layout import partition_dir, segment_name
from ..maintenance import START_MARKS_NAME, write_start
from ..scan import StopReason, scan_buffer
from ..seal import write_seal
from .manifest import Manifest
from .segment_object import fill_index

log = logging.getLogger("streamlog.remote")

INTENT_NAME = "restore.intent"
DOWNLOADS = 4  # segment objects fetched at once


@dataclasses.dataclass
class RestoreReport:
    """What a restore took from the store, and what it could not."""

    generation: int
    segments: int = 0
    bytes: int = 0
    # "stream/n" -> (first lost offset, the end the lost writer had acknowledged, at
    # least): records [first, end) are gone (durability "local")
    lost: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"generation": self.generation, "segments": self.segments,
                "bytes": self.bytes, "lost": {name: list(span)
                                              for name, span in self.lost.items()}}


def needs_restore(fileio, path: str) -> bool:
    """True when the directory at `path` holds no log (missing, or empty but for its
    lock), or a restore was killed half-way there."""
    if not fileio.exists(path):
        return True
    names = set(fileio.listdir(path))
    return INTENT_NAME in names or not (names - {"LOCK"})


def restore(store, manifest: Manifest, path: str, *, fileio, index_storage=None,
            map_bytes: int = 1 << 30, clock=None, progress=None) -> RestoreReport:
    """Write the log `manifest` describes into the directory `path` (see the module
    docstring). `progress(partition, bytes)` is called as segments arrive. Raises
    CorruptObject for a segment object that is missing or fails its checksum,
    StoreError when the store cannot be read; a restore that raised is taken up again
    by the next open."""
    report = RestoreReport(manifest.generation)
    fileio.makedirs(path)
    write_file_atomic(fileio, os.path.join(path, INTENT_NAME),
                      json.dumps({"generation": manifest.generation}).encode())
    now_us = clock.wall_us() if clock is not None else 0
    with concurrent.futures.ThreadPoolExecutor(DOWNLOADS) as pool:
        for stream, count in sorted(manifest.streams.items()):
            write_stream_meta(fileio, path, stream, count)
            for number in range(count):
                name = f"{stream}/{number}"
                directory = partition_dir(path, stream, number)
                fileio.makedirs(directory)
                part = manifest.partitions.get(name)
                if part is None or not (part.segments or part.tail):
                    continue
                restore_partition(store, part, directory, fileio=fileio,
                                  index_storage=index_storage, map_bytes=map_bytes,
                                  now_us=now_us, pool=pool, report=report, name=name,
                                  progress=progress)
                if part.local_end > part.committed_end:
                    report.lost[name] = (part.committed_end, part.local_end)
    write_file_atomic(fileio, os.path.join(path, MARKER_NAME), json.dumps(FORMAT).encode())
    fileio.unlink(os.path.join(path, INTENT_NAME))
    fileio.fsync_dir(path)
    for name, (first, end) in sorted(report.lost.items()):
        log.warning("restored %s from the store (generation %d): offsets %d..%d, which "
                    "the lost writer had acknowledged, were not in the store and are "
                    "lost (durability local; perhaps more after them)", name,
                    manifest.generation, first, end - 1)
    return report


def restore_partition(store, part, directory: str, *, fileio, index_storage, map_bytes: int,
                      now_us: int, pool, report: RestoreReport, name: str,
                      progress=None) -> None:
    """Write the partition the store holds (`part`, a PartitionManifest) into
    `directory`, which holds no segment: its segment objects (checked) with their
    seals, the segments it holds as tail pieces, or an empty active segment at its
    end; its start marks; its index from the index objects. `pool` fetches."""
    fetched = pool.map(lambda segment: (segment, _fetch(store, segment)), part.segments)
    for segment, data in fetched:
        segment_path = os.path.join(directory, segment_name(segment.base_offset))
        write_file_atomic(fileio, segment_path, data)
        write_seal(fileio, segment_path, size_bytes=len(data),
                   digest=xxhash.xxh3_64_intdigest(data), sealed_at_us=now_us,
                   end_offset=segment.end_offset)
        report.segments += 1
        report.bytes += len(data)
        if progress is not None:
            progress(name, len(data))
    for base, data in _tail_segments(store, part.tail):
        # durability "remote": the segments the store has as pieces, the last of them
        # the active one
        write_file_atomic(fileio, os.path.join(directory, segment_name(base)), data)
        report.bytes += len(data)
    if not part.tail:
        _new_active_segment(fileio, directory, part.committed_end)
    if part.start_offset > 0:  # (inside a segment after delete_records)
        write_start(fileio, directory, part.start_offset, part.start_hwm_us)
    _fill_local_index(store, part.segments, os.path.join(directory, "index"),
                      index_storage, map_bytes)


def behind(manifest: Manifest, ends: dict[str, list[int]]) -> list[tuple[str, int]]:
    """The (stream, partition) the store holds more of than a directory whose
    partitions end at `ends` (stream -> end offsets): its committed end past the local
    end, or a stream or partition the directory lacks."""
    found = []
    for stream, count in sorted(manifest.streams.items()):
        local = ends.get(stream, [])
        for number in range(count):
            part = manifest.partitions.get(f"{stream}/{number}")
            if part is not None and (part.segments or part.tail) and (
                    number >= len(local) or local[number] < part.committed_end):
                found.append((stream, number))
    return found


def catch_up(store, manifest: Manifest, path: str, partitions: list[tuple[str, int]],
             ends: dict[str, list[int]], *, fileio, index_storage=None,
             map_bytes: int = 1 << 30, clock=None, progress=None) -> RestoreReport:
    """Restore `partitions` (`behind`'s, closed) of the log at `path` from `manifest`:
    each is cleared and written as the store holds it; a stream's `stream.json` grows
    to the partitions restored. Raises as `restore` does; an open that raised finds
    them behind again, and restores them again."""
    report = RestoreReport(manifest.generation)
    now_us = clock.wall_us() if clock is not None else 0
    counts = {stream: len(local) for stream, local in ends.items()}  # in stream.json
    with concurrent.futures.ThreadPoolExecutor(DOWNLOADS) as pool:
        for stream, number in partitions:
            name, part = f"{stream}/{number}", manifest.partitions[f"{stream}/{number}"]
            local = ends.get(stream, [])
            log.warning("%s: the local log ends at %s but the store holds offsets up to %d "
                        "(writes lost here, to a power loss perhaps): the partition is "
                        "restored from the store", name,
                        local[number] if number < len(local) else "nothing",
                        part.committed_end - 1)
            directory = partition_dir(path, stream, number)
            fileio.makedirs(directory)
            clear_partition(fileio, directory, index_storage)
            restore_partition(store, part, directory, fileio=fileio,
                              index_storage=index_storage, map_bytes=map_bytes,
                              now_us=now_us, pool=pool, report=report, name=name,
                              progress=progress)
            if number >= counts.get(stream, 0):  # the stream, or this partition, is new
                write_stream_meta(fileio, path, stream, number + 1)
                counts[stream] = number + 1
    return report


def clear_partition(fileio, directory: str, index_storage=None) -> None:
    """Remove the partition's segments, seals, start marks and index (before it is
    restored again from the store): the index first, then the segments from the
    oldest, so what a crash here leaves is a partition that starts later and ends
    where it did (the next open finds it behind the store again)."""
    wipe_index(os.path.join(directory, "index"), storage=index_storage)
    names = sorted(fileio.listdir(directory)) if fileio.exists(directory) else []
    for name in names:
        if name.endswith((".log", ".seal")) or name == START_MARKS_NAME:
            fileio.unlink(os.path.join(directory, name))
    fileio.fsync_dir(directory)


def _fetch(store, segment) -> bytes:
    try:
        data = store.get(segment.key)
    except ObjectNotFound:
        raise CorruptObject(segment.key, 0, "missing from the store, though a committed "
                            "manifest generation names it") from None
    if len(data) != segment.size or xxhash.xxh3_128_hexdigest(data) != segment.checksum:
        raise CorruptObject(segment.key, 0, f"does not match its manifest entry (size "
                            f"{len(data)}, expected {segment.size}, or checksum)")
    return data


def _tail_segments(store, pieces) -> list[tuple[int, bytes]]:
    """[(segment base, its bytes)] from tail pieces, each checked to be whole frames
    running from the piece's first offset to its end (CorruptObject names the tail
    object and the position in it otherwise: a restore never writes what a writer's
    recovery could take for a torn tail and cut)."""
    segments: dict[int, list[bytes]] = {}
    for piece in pieces:
        try:
            data = store.get_range(piece.key, piece.at, piece.at + piece.size)
        except ObjectNotFound:
            raise CorruptObject(piece.key, piece.at, "missing from the store, though a "
                                "committed manifest generation names it") from None
        scanned = scan_buffer(data, 0, expect_offset=piece.base_offset)
        if len(data) != piece.size or scanned.stop is not StopReason.END or (
                not scanned.frames or scanned.frames[-1].next_offset != piece.end_offset):
            where = piece.at + (scanned.end if len(data) == piece.size else len(data))
            raise CorruptObject(piece.key, where, f"the tail piece of offsets "
                                f"{piece.base_offset}..{piece.end_offset - 1} is not whole "
                                f"frames ({scanned.reason or scanned.stop.name.lower()})")
        chunks = segments.setdefault(piece.segment_base, [])
        if sum(map(len, chunks)) != piece.position:
            raise CorruptObject(piece.key, piece.at, f"the manifest places a tail piece at "
                                f"position {piece.position} of the segment at "
                                f"{piece.segment_base}, after a gap")
        chunks.append(data)
    return [(base, b"".join(chunks)) for base, chunks in segments.items()]


def _new_active_segment(fileio, directory: str, base_offset: int) -> None:
    """An empty segment at the store's end: the writer appends there."""
    handle = fileio.open(os.path.join(directory, segment_name(base_offset)), writable=True,
                         create=True)
    try:
        fileio.truncate(handle, 0)
        fileio.fsync(handle)
    finally:
        fileio.close(handle)
    fileio.fsync_dir(directory)


def _fill_local_index(store, segments, path: str, index_storage, map_bytes: int) -> None:
    """The partition's index from the index objects; a damaged one is left for
    recovery to rebuild from the segments (now local files)."""
    wipe_index(path, storage=index_storage)
    index = Index(path, readonly=False, map_bytes=map_bytes, storage=index_storage)
    try:
        fill_index(store, index, segments)
    except CorruptIndex as error:
        log.warning("%s: the partition's index is rebuilt from its segments", error)
        index.close()
        wipe_index(path, storage=index_storage)
        return
    index.sync()
    index.close()
