"""A sealed segment in the store: its object, its index object, and naming them.

Strategy (DESIGN 11): a sealed segment's object is byte-identical to the local file,
so the store holds exactly what the disk held and every frame keeps its checksums. The
bytes are scanned and verified before they go up (`describe`): a damaged or torn file is
never uploaded as a segment, and what is uploaded is known to be a whole, continuous
run of frames from the segment's base offset. Beside it goes a small index object, one
entry per frame (offset -> position, and the running max timestamp after it), so a
reader anywhere, and a restore, find a record by offset or by time (DESIGN 5) without
reading every segment.

Keys carry the writer's epoch: a fenced writer's late upload lands under a key no
manifest of the newer writer names, never over the newer writer's object; the sweep
removes it after the grace period. Pure but for `upload`, which puts the two objects
(the caller commits the manifest generation that names them).

Index object: one line `streamlog-segment-index 1 <xxh3-64 of the body, hex>`, then
the body: n (u64), seven little-endian columns of n values each: base offsets,
positions (i64), record counts, frame sizes (i32), min and max timestamps, running max
after the frame (i64); then the segment's transaction events (what recovery derives
from its frames: opens, commits with their tags and markers, aborts) as one JSON list
of [txn id, state, offset, tag or null, marker as hex or null]. With them a reader
knows every transaction's outcome (read_committed, last_commit) from the index objects
alone.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import xxhash

from ..errors import CorruptIndex, CorruptObject, ObjectNotFound
from ..index_format import NO_HWM, IndexEntry, RecoveryPoint
from ..payload import NO_TIME, advance_hwm, frame_time_us
from ..recovery import txn_events
from ..scan import StopReason, scan_buffer
from .manifest import Manifest, PartitionManifest, SegmentObject

INDEX_MAGIC = b"streamlog-segment-index"
INDEX_VERSION = 1
_COLUMNS = (("base_offset", "<i8"), ("position", "<i8"), ("record_count", "<i4"),
            ("frame_bytes", "<i4"), ("min_timestamp_us", "<i8"), ("max_timestamp_us", "<i8"),
            ("hwm_after_us", "<i8"))


def segment_key(partition: str, base_offset: int, epoch: int) -> str:
    """`segments/<stream>/<partition>/<base, 20 digits>-<epoch>.log`."""
    return f"segments/{partition}/{base_offset:020d}-{epoch}.log"


def index_key(key: str) -> str:
    return key[:-len(".log")] + ".idx" if key.endswith(".log") else key + ".idx"


def describe(data, *, key: str, base_offset: int,
             hwm_before: int | None) -> tuple[SegmentObject, bytes]:
    """The SegmentObject of a sealed segment's bytes (to be stored at `key`) and its
    index object's bytes. Raises CorruptObject (naming the key and the position) unless
    `data` is a whole run of valid frames continuing from `base_offset`."""
    scanned = scan_buffer(data, 0, expect_offset=base_offset)
    if scanned.stop is not StopReason.END:
        what = "ends inside a frame" if scanned.stop is StopReason.INCOMPLETE else (
            scanned.reason)
        raise CorruptObject(key, scanned.end, f"not a whole sealed segment: {what}")
    if not scanned.frames:
        raise CorruptObject(key, 0, "an empty segment is never uploaded")
    entries, events, hwm = [], [], hwm_before
    for frame in scanned.frames:
        hwm = advance_hwm(hwm, frame_time_us(frame))
        events += txn_events(frame)
        entries.append(IndexEntry(frame.base_offset, base_offset, frame.position,
                                  frame.record_count, frame.end_position - frame.position,
                                  frame.min_timestamp_us, frame.max_timestamp_us,
                                  NO_TIME if hwm is None else hwm))
    segment = SegmentObject(
        base_offset, scanned.frames[-1].next_offset, key, len(data),
        xxhash.xxh3_128_hexdigest(data), index_key(key),
        min(frame.min_timestamp_us for frame in scanned.frames),
        max(frame.max_timestamp_us for frame in scanned.frames), hwm)
    return segment, encode_index(entries, events)


def encode_index(entries: list[IndexEntry], events=()) -> bytes:
    body = b"".join(np.asarray([getattr(e, name) for e in entries], dtype=dtype).tobytes()
                    for name, dtype in _COLUMNS)
    plain = [[txn_id, int(state), offset, tag, None if marker is None else bytes(marker).hex()]
             for txn_id, state, offset, tag, marker in events]
    body = (len(entries).to_bytes(8, "little") + body
            + json.dumps(plain, separators=(",", ":")).encode())
    return b"%s %d %016x\n%s" % (INDEX_MAGIC, INDEX_VERSION, xxhash.xxh3_64_intdigest(body),
                                 body)


def decode_index(data, key: str, segment_base: int) -> list[IndexEntry]:
    """The entries of an index object read from `key`. CorruptObject when it fails its
    checks."""
    return read_index(data, key, segment_base)[0]


def read_index(data, key: str, segment_base: int) -> tuple[list[IndexEntry], list[tuple]]:
    """(entries, transaction events) of an index object read from `key`; the events
    as recovery gives them (txn.frame_events). CorruptObject when it fails its checks."""
    head, newline, body = bytes(data).partition(b"\n")
    fields = head.split(b" ")
    if not newline or len(fields) != 3 or fields[0] != INDEX_MAGIC or (
            fields[1] != b"%d" % INDEX_VERSION):
        raise CorruptObject(key, 0, "not a segment index object of this version")
    try:
        expected = int(fields[2], 16)
    except ValueError:
        raise CorruptObject(key, 0, "index header checksum is not hex") from None
    if xxhash.xxh3_64_intdigest(body) != expected:
        raise CorruptObject(key, len(head) + 1, "index checksum mismatch")
    count = int.from_bytes(body[:8], "little")
    widths = [np.dtype(dtype).itemsize for _, dtype in _COLUMNS]
    columns_end = 8 + count * sum(widths)
    if columns_end > len(body):
        raise CorruptObject(key, len(head) + 1, "index length disagrees with its count")
    columns, position = [], 8
    for (_, dtype), width in zip(_COLUMNS, widths):
        columns.append(np.frombuffer(body, dtype, count, position).tolist())
        position += count * width
    entries = [IndexEntry(base, segment_base, at, records, size, low, high, hwm)
               for base, at, records, size, low, high, hwm in zip(*columns)]
    try:
        events = [(int(txn_id), int(state), int(offset), tag,
                   None if marker is None else bytes.fromhex(marker))
                  for txn_id, state, offset, tag, marker in json.loads(body[columns_end:])]
    except (ValueError, TypeError) as error:
        raise CorruptObject(key, len(head) + 1 + columns_end,
                            f"index events are not a list of transaction events: "
                            f"{error}") from None
    return entries, events


def fill_index(store, index, segments) -> None:
    """Put into `index` (an empty, writable index.Index) the entries and transaction
    events of `segments` (SegmentObjects, in offset order) from their index objects,
    and set its recovery point at the end of the last one. Raises CorruptIndex naming
    the key of an index object that is missing, damaged or describes other offsets (the
    caller rebuilds from the segments), StoreError."""
    for segment in segments:
        key = segment.index_key
        try:
            entries, events = read_index(store.get(key), key, segment.base_offset)
        except ObjectNotFound:
            raise CorruptIndex(f"index object {key} is missing from the store") from None
        except CorruptObject as error:
            raise CorruptIndex(str(error)) from None
        if not entries or entries[0].base_offset != segment.base_offset or (
                entries[-1].next_offset != segment.end_offset):
            raise CorruptIndex(f"index object {key} does not describe offsets "
                               f"{segment.base_offset}..{segment.end_offset - 1}")
        index.put(entries, None, events)
    if segments:
        last = segments[-1]
        index.set_recovery_point(RecoveryPoint(
            last.base_offset, last.size, last.end_offset,
            NO_HWM if last.hwm_us is None else last.hwm_us))


def upload(store, manifest: Manifest, partition: str, data, *, base_offset: int,
           hwm_before: int | None) -> Manifest:
    """Put a sealed segment (`data`, the local file's bytes) and its index object, and
    return `manifest` with the segment added to the partition (the same generation:
    commit its `successor()`, after any other uploads of the round). The segment must
    continue the store's segment objects."""
    check_continues(manifest, partition, base_offset)  # before anything is put
    return name_segment(manifest, partition, put_segment(
        store, partition, data, base_offset=base_offset, hwm_before=hwm_before,
        epoch=manifest.epoch))


def put_segment(store, partition: str, data, *, base_offset: int, hwm_before: int | None,
                epoch: int) -> SegmentObject:
    """Put a sealed segment and its index object; its SegmentObject, which no
    generation names yet (name_segment)."""
    key = segment_key(partition, base_offset, epoch)
    segment, index = describe(data, key=key, base_offset=base_offset, hwm_before=hwm_before)
    store.put(key, bytes(data))
    store.put(segment.index_key, index)
    return segment


def check_continues(manifest: Manifest, partition: str, base_offset: int) -> None:
    """ValueError unless a segment at `base_offset` continues the store's segment
    objects of the partition (any base does when it holds none)."""
    current = manifest.partitions.get(partition, PartitionManifest())
    if (current.segments or current.tail) and base_offset != current.sealed_end:
        raise ValueError(f"segment {base_offset} of {partition} does not continue the "
                         f"store's segment objects, which end at {current.sealed_end}")


def name_segment(manifest: Manifest, partition: str, segment: SegmentObject) -> Manifest:
    """`manifest` with the uploaded `segment` added to the partition, replacing its
    tail pieces (durability remote: the object holds their bytes)."""
    check_continues(manifest, partition, segment.base_offset)
    current = manifest.partitions.get(partition, PartitionManifest())
    held = bool(current.segments or current.tail)
    updated = dataclasses.replace(
        current, start_offset=current.start_offset if held else segment.base_offset,
        committed_end=max(current.committed_end, segment.end_offset),
        segments=(*current.segments, segment),
        tail=tuple(piece for piece in current.tail
                   if piece.segment_base != segment.base_offset))
    return dataclasses.replace(manifest, partitions={**manifest.partitions,
                                                     partition: updated})
