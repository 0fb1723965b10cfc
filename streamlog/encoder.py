"""The commit encoder: a group of queued appends in, the frames to write out.

Strategy: a pure function of its inputs (the appends' pieces, the partition's end offset
and high-water mark, the config, and the compressor's memory of whether zstd has been
paying): it touches no file, no index and no partition, so the writer thread's loop
(appender.py) is the one place with effects, and the encoding can be tested on its own.
Consecutive pieces merge into as few frames as the bounds allow; each frame is an
`EncodedFrame`, a named value that knows its index entry and its live-tail batch once
its position in a segment is known.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
import zstandard

from .config import Compression, LogConfig
from .frame import (CODEC_ZSTD, FLAG_HAS_NULLS, FLAG_HAS_PRODUCER, Frame, ProducerStamp,
                    encode_frame, frame_buffers)
from .index import IndexEntry
from .payload import (NO_TIME, Columns, EncodedRows, advance_hwm, compress, data_timestamps,
                      decode_columns, encode_payload_columns, encoded_flags, encoded_parts)
from .txn import frame_events

# A columnar piece this large is a frame of its own, handed to the live tail as its own
# columns, not decoded again; smaller ones share frames as list pieces do (the daemon's
# APPENDs of a thousand records, say). Either way the frame is written from the pieces'
# buffers as they are (frame_buffers: no payload joined).
COLUMNS_ALONE_BYTES = 256 * 1024
# Below this payload size zstd is not tried: a frame header's worth of saving at most.
COMPRESS_MIN_BYTES = 512
# After a frame that zstd did not shrink enough, this many frames go uncompressed
# before it is tried again (Compression.AUTO).
ZSTD_SKIP_FRAMES = 32


@dataclasses.dataclass(slots=True)
class Piece:
    """Records of one append that fit one frame. `kinds`/`headers` None when unused."""

    timestamps_us: list
    keys: list
    values: list
    kinds: list | None
    headers: list | None
    nbytes: int
    txn_id: int = 0
    # A Kafka producer's batch (frame.py's stamp): always a frame of its own.
    producer: ProducerStamp | None = None

    @property
    def record_count(self) -> int:
        return len(self.values)


class EncodedFrame(NamedTuple):
    """One frame ready to write, and what the partition records about it."""

    buffers: list  # the whole frame, header and stored payload: these, concatenated
    nbytes: int  # the frame's size
    base_offset: int
    record_count: int
    hwm_before: int | None  # running max timestamp before this frame
    hwm_after: int | None
    min_timestamp_us: int
    max_timestamp_us: int
    raw: bytes | memoryview | None  # the uncompressed payload (None: buffers[1:])
    flags: int  # as a reader of the frame sees them (codec aside)
    txn_id: int
    events: list  # transaction events for the index (txn.frame_events)
    producer: ProducerStamp | None
    columns: Columns | None  # the records as the live tail takes them (None: decode)

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.record_count

    def index_entry(self, segment_base: int, position: int) -> IndexEntry:
        return IndexEntry(self.base_offset, segment_base, position, self.record_count,
                          self.nbytes, self.min_timestamp_us, self.max_timestamp_us,
                          NO_TIME if self.hwm_after is None else self.hwm_after)

    def as_read(self, position: int) -> Frame:
        """The frame as a reader of the segment would decode it."""
        raw = self.raw if self.raw is not None else b"".join(self.buffers[1:])
        return Frame(position, self.base_offset, self.record_count, self.min_timestamp_us,
                     self.max_timestamp_us, self.txn_id, self.flags, len(raw), raw,
                     self.producer)

    def tail_columns(self, position: int) -> Columns:
        """The records as a reader decodes them, for the live tail: the columns the
        encoding made when it has them (records as lists, a columnar piece alone in its
        frame), else decoded from the raw payload (small columnar pieces merged)."""
        if self.columns is not None:
            return self.columns
        return decode_columns(self.as_read(position))


class EncodedCommit(NamedTuple):
    frames: list[EncodedFrame]
    firsts: list[int]  # the first offset of each append, in order
    next_offset: int
    hwm_us: int | None

    @property
    def nbytes(self) -> int:
        return sum(frame.nbytes for frame in self.frames)

    @property
    def buffers(self) -> list:
        """The frames as buffers to write, in order, with one gathered write (none
        joined: a columnar piece's key and value bytes are written from the caller's
        Arrow buffers themselves)."""
        return [buffer for frame in self.frames for buffer in frame.buffers]


class Compressor:
    """zstd, and the memory of whether it has been paying (Compression.AUTO)."""

    def __init__(self, config: LogConfig) -> None:
        self.mode = config.compression
        self._zstd = zstandard.ZstdCompressor(level=config.zstd_level)
        self._skip = 0

    def maybe_compress(self, raw) -> bytes:
        """`raw` itself when it is not compressed, else the smaller stored payload."""
        return self.compressed(raw) if self.tries(len(raw)) else raw

    def tries(self, size: int) -> bool:
        """Is zstd to be tried on a payload of `size` bytes now? (Compression.AUTO
        counts this as one of the frames it skips after one that did not pay.)"""
        if self.mode is Compression.NONE or size < COMPRESS_MIN_BYTES:
            return False
        if self.mode is Compression.AUTO and self._skip > 0:
            self._skip -= 1
            return False
        return True

    def compressed(self, raw) -> bytes:
        """The stored payload zstd makes of `raw`, or `raw` when that does not pay."""
        packed = compress(raw, self._zstd)
        if packed is None:
            self._skip = ZSTD_SKIP_FRAMES  # it did not pay; try again a little later
            return raw
        return packed


def encode_commit(appends: list[list], end_offset: int, hwm_us: int | None,
                  config: LogConfig, compressor: Compressor) -> EncodedCommit:
    """Encode the pieces of each append (in order) as frames from `end_offset` on, the
    partition's end, whose running max timestamp is `hwm_us`."""
    frames: list[EncodedFrame] = []
    firsts: list[int] = []
    merged: list = []
    count = size = 0  # of the merged pieces: kept as they grow, not summed again
    offset, hwm, running = end_offset, hwm_us, end_offset
    records_max, bytes_max = config.batch_records_max, config.frame_bytes_max // 2
    for pieces in appends:
        firsts.append(running)
        for piece in pieces:
            records = piece.record_count
            running += records
            if merged and not (joins(merged[0], piece) and count + records <= records_max
                               and size + piece.nbytes <= bytes_max
                               and not (alone(merged[0]) or alone(piece))):
                frames.append(encode_one(merged, offset, hwm, compressor))
                offset, hwm, merged, count, size = (frames[-1].next_offset,
                                                    frames[-1].hwm_after, [], 0, 0)
            merged.append(piece)
            count += records
            size += piece.nbytes
    if merged:
        frames.append(encode_one(merged, offset, hwm, compressor))
        offset, hwm = frames[-1].next_offset, frames[-1].hwm_after
    assert offset == running
    return EncodedCommit(frames, firsts, offset, hwm)


def alone(piece) -> bool:
    """Is `piece` a frame of its own (a large columnar piece: COLUMNS_ALONE_BYTES)?"""
    return type(piece) is EncodedRows and piece.nbytes >= COLUMNS_ALONE_BYTES


def joins(first, piece) -> bool:
    """Can `piece` join a frame that starts with `first` (bounds aside)? Only a piece of
    the same kind (Piece, or columnar EncodedRows) under the same transaction, and
    neither stamped: a stamp describes its frame's records and no others."""
    return (piece.txn_id == first.txn_id and type(piece) is type(first)
            and piece.producer is None and first.producer is None)


def encode_one(pieces: list, offset: int, hwm: int | None,
               compressor: Compressor) -> EncodedFrame:
    """Encode pieces (that `joins` merged, within the bounds) as one frame at `offset`."""
    txn_id, producer = pieces[0].txn_id, pieces[0].producer
    assert producer is None or len(pieces) == 1
    if isinstance(pieces[0], EncodedRows):
        # Columns: the frame is the header and the pieces' own buffers, written as they
        # are, unless zstd is tried (then the payload is joined once, to compress).
        count, min_ts, max_ts = _encoded_bounds(pieces)
        flags = encoded_flags(pieces)
        parts = encoded_parts(pieces)
        tried = compressor.tries(sum(memoryview(part).nbytes for part in parts))
        raw = b"".join(parts) if tried else None
        data_max_ts, kinds, value_at = max_ts, None, None
        columns = _tail_columns(pieces[0], offset, flags) if len(pieces) == 1 else None
    else:
        raw, flags, columns, min_ts, max_ts, data_max_ts, kinds, value_at = (
            _list_payload(pieces, offset, txn_id, producer))
        count = len(columns)
        tried = compressor.tries(len(raw))
    stored = compressor.compressed(raw) if tried else raw
    if stored is None:
        buffers = frame_buffers(base_offset=offset, record_count=count,
                                min_timestamp_us=min_ts, max_timestamp_us=max_ts,
                                txn_id=txn_id, flags=flags, parts=parts, producer=producer)
    else:
        stored_flags = flags | CODEC_ZSTD if stored is not raw else flags
        buffers = [encode_frame(base_offset=offset, record_count=count,
                                min_timestamp_us=min_ts, max_timestamp_us=max_ts,
                                txn_id=txn_id, flags=stored_flags, raw_bytes=len(raw),
                                payload=stored, producer=producer)]
    if producer is not None:
        flags |= FLAG_HAS_PRODUCER  # as decode_frame gives it to readers of the tail
    # control records never move the high-water mark (payload.py)
    hwm_after = advance_hwm(hwm, data_max_ts)
    events = frame_events(txn_id, offset, kinds, value_at)
    nbytes = sum(memoryview(buffer).nbytes for buffer in buffers)
    return EncodedFrame(buffers, nbytes, offset, count, hwm, hwm_after, min_ts, max_ts, raw,
                        flags, txn_id, events, producer, columns)


def _tail_columns(piece: EncodedRows, offset: int, flags: int) -> Columns:
    """A columnar piece's records as the live tail takes them, without decoding its
    frame: the piece's own small columns (columnar.py made them, none is a caller's
    array, which the caller may reuse once the append returns) and views of the key and
    value bytes in its Arrow buffers (immutable)."""
    return Columns(offset, piece.timestamps_us, None, piece.key_lengths,
                   piece.value_lengths, None, memoryview(piece.keys).cast("B"),
                   memoryview(piece.values).cast("B"), None, piece.txn_id,
                   producer=piece.producer, nulls=bool(flags & FLAG_HAS_NULLS))


def _list_payload(pieces: list[Piece], offset: int, txn_id: int, producer):
    """(raw payload, flags, its Columns, min and max timestamp, largest data-record
    timestamp or None, kinds, value getter) of list pieces merged into one frame at
    `offset`."""
    if len(pieces) == 1:
        p = pieces[0]
        timestamps, keys, values, kinds, headers = (p.timestamps_us, p.keys, p.values,
                                                    p.kinds, p.headers)
    else:
        timestamps = [t for p in pieces for t in p.timestamps_us]
        keys = [k for p in pieces for k in p.keys]
        values = [v for p in pieces for v in p.values]
        kinds = _merge_optional(pieces, "kinds", 0)
        headers = _merge_optional(pieces, "headers", ())
    raw, flags, columns = encode_payload_columns(timestamps, keys, values, kinds, headers,
                                                 base_offset=offset, txn_id=txn_id,
                                                 producer=producer)
    ts = columns.timestamps_us
    min_ts, max_ts = int(ts.min()), int(ts.max())
    data_max_ts = max_ts
    if kinds is not None:
        latest = int(data_timestamps(ts, np.asarray(kinds, dtype=np.uint8)).max())
        data_max_ts = None if latest == NO_TIME else latest
    return raw, flags, columns, min_ts, max_ts, data_max_ts, kinds, values.__getitem__


def _encoded_bounds(pieces: list[EncodedRows]) -> tuple[int, int, int]:
    """(record count, min and max timestamp) of columnar pieces (all data records)."""
    count = sum(p.record_count for p in pieces)
    return (count, min(p.min_timestamp_us for p in pieces),
            max(p.max_timestamp_us for p in pieces))


def _merge_optional(pieces: list[Piece], name: str, default):
    if all(getattr(p, name) is None for p in pieces):
        return None
    out = []
    for p in pieces:
        column = getattr(p, name)
        out.extend(column if column is not None else [default] * len(p.values))
    return out
