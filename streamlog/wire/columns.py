"""Records on the wire: the payload of an APPEND or a BATCH, as the log's own columns.

Strategy: records travel in payload.py's columnar layout (timestamps, key and value
lengths, then the blobs), so neither side loops over records to frame them: the daemon
checks an APPEND as NumPy columns and sends a reader's batches as the payloads it
read, small consecutive ones joined, or slices of the columns it decoded
(`pull_batches`); a client turns a BATCH into Arrow without a loop per record. No zstd
on the wire: loopback and LAN links are faster than decompression.

Pure functions, bytes in and values out; `decode_records` raises LocalProtocolError for
a payload that does not add up (the connection re-raises it as the peer's fault). The
client's side of an append (check the records as the local log does, cut a batch that
would pass the daemon's frame limit into pieces) is here too: `checked_columns`,
`pieces`, `take`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import validate
from ..errors import CorruptFrame, InvalidAppend
from ..frame import CODEC_NONE, Frame
from ..payload import PAYLOAD_FLAGS, Columns, decode_columns, decode_headers, encode_payload
from ..records import RecordKind
from .codes import LocalProtocolError

# A peer that does not know a flag refuses the payload (PROTOCOL_ERROR): an older daemon
# or client sent a None value or header value gets an error, never an empty value.
PAYLOAD_FLAGS_KNOWN = PAYLOAD_FLAGS
# An APPEND larger than the daemon's frame limit less this slack is sent in pieces.
FRAME_SLACK_BYTES = 64 * 1024
_KIND_MAX = max(RecordKind)


def encode_records(timestamps_us, keys, values, kinds=None, headers=None) -> tuple[bytes, int]:
    """The payload of an APPEND: the log's columnar layout (payload.encode_payload).
    The caller has checked types (bytes or None values and keys, int timestamps)."""
    return encode_payload(timestamps_us, keys, values, kinds, headers)


def decode_records(payload, payload_flags: int, record_count: int, *, base_offset: int = 0,
                   txn_id: int = 0) -> Columns:
    """Columns of an APPEND or BATCH payload, checked; LocalProtocolError if they do not
    add up."""
    if payload_flags & ~PAYLOAD_FLAGS_KNOWN:
        raise LocalProtocolError(f"unknown payload flags {payload_flags:#x}")
    if record_count < 1:
        raise LocalProtocolError("a record payload must hold at least one record")
    frame = Frame(0, base_offset, record_count, 0, 0, txn_id, payload_flags | CODEC_NONE,
                  len(payload), payload)
    try:
        columns = decode_columns(frame)
    except CorruptFrame as error:
        raise LocalProtocolError(f"bad record payload: {error.reason}") from None
    if columns.kinds is not None and int(columns.kinds.max()) > _KIND_MAX:
        raise LocalProtocolError("record payload has an unknown record kind")
    if columns.header_lengths is not None and int(columns.header_lengths.min()) < 0:
        raise LocalProtocolError("record payload has a negative header length")
    return columns


def check_headers(columns: Columns) -> None:
    """Raise LocalProtocolError unless every record's headers parse (a loop per record:
    worth it only for the rare payload with headers, to refuse garbage on arrival)."""
    if columns.header_lengths is None:
        return
    try:
        for blob in split_blobs(bytes(columns.headers), columns.header_lengths):
            decode_headers(blob, nulls=columns.nulls)
    except CorruptFrame as error:
        raise LocalProtocolError(f"bad record headers: {error.reason}") from None


# -- columns -> payload (the daemon's replies to a READ) -------------------------------

def encode_slice(columns: Columns, lo: int, hi: int) -> tuple[bytes, int]:
    """Payload of rows [lo, hi) of a decoded batch, with no loop per record."""
    assert 0 <= lo < hi <= len(columns)
    flags = columns.flags
    whole = lo == 0 and hi == len(columns)
    if whole and columns.raw is not None:
        return columns.raw, flags  # the stored payload's layout is the wire's: no copy
    parts = [columns.timestamps_us[lo:hi].tobytes(), columns.key_lengths[lo:hi].tobytes(),
             columns.value_lengths[lo:hi].tobytes()]
    if columns.header_lengths is not None:
        parts.append(columns.header_lengths[lo:hi].tobytes())
    if columns.kinds is not None:
        parts.append(columns.kinds[lo:hi].tobytes())
    if whole:
        parts += [columns.keys, columns.values]
        if columns.headers is not None:
            parts.append(columns.headers)
    else:
        parts.append(_blob_slice(np.maximum(columns.key_lengths, 0), columns.keys, lo, hi))
        parts.append(_blob_slice(columns.value_bytes(), columns.values, lo, hi))
        if columns.headers is not None:
            parts.append(_blob_slice(columns.header_lengths, columns.headers, lo, hi))
    return b"".join(parts), flags


def encode_slices(slices) -> tuple[bytes, int]:
    """One payload for several (columns, lo, hi) slices of consecutive offsets, so a
    replay sends few large BATCH messages; still no loop per record."""
    if len(slices) == 1:
        return encode_slice(*slices[0])
    headers = any(c.header_lengths is not None for c, _, _ in slices)
    control = any(c.kinds is not None for c, _, _ in slices)
    parts = [c.timestamps_us[lo:hi].tobytes() for c, lo, hi in slices]
    parts += [c.key_lengths[lo:hi].tobytes() for c, lo, hi in slices]
    parts += [c.value_lengths[lo:hi].tobytes() for c, lo, hi in slices]
    if headers:
        parts += [_or_zeros(c.header_lengths, lo, hi, "<i4") for c, lo, hi in slices]
    if control:
        parts += [_or_zeros(c.kinds, lo, hi, "u1") for c, lo, hi in slices]
    parts += [_blob_slice(np.maximum(c.key_lengths, 0), c.keys, lo, hi) for c, lo, hi in slices]
    parts += [_blob_slice(c.value_bytes(), c.values, lo, hi) for c, lo, hi in slices]
    if headers:
        parts += [_blob_slice(c.header_lengths, c.headers, lo, hi) for c, lo, hi in slices
                  if c.header_lengths is not None]
    flags = 0
    for c, _, _ in slices:  # a column any slice has, the joined payload has
        flags |= c.flags
    return b"".join(parts), flags


def _or_zeros(column: np.ndarray | None, lo: int, hi: int, dtype: str) -> bytes:
    return (column[lo:hi] if column is not None else np.zeros(hi - lo, dtype)).tobytes()


def _blob_slice(lengths: np.ndarray, blob, lo: int, hi: int):
    if lo == 0 and hi == len(lengths):
        return blob
    start = int(lengths[:lo].sum())
    return blob[start:start + int(lengths[lo:hi].sum())]


MORE, WAIT, END, FAILED = "more", "wait", "end", "failed"


def pull_batches(slices, bytes_budget: int,
                 take=None) -> tuple[list[tuple], str, Exception | None]:
    """(batches, status, error): advance a reader's slice generator (reader.slices();
    the daemon does it on its thread pool) until `bytes_budget` payload bytes are
    encoded (MORE), the reader must wait for appends (WAIT), it is done (END), or it
    raised (FAILED, with the error: a damaged frame, a truncation under it; the batches
    before it are returned too, to be sent first, as a local reader yields every record
    before the error). A batch is (base_offset, record_count, txn_id, payload_flags,
    payload): a whole stored batch its own, its payload as stored (a view, not a copy),
    or small ones joined (`_batches`); consecutive parts of batches of one transaction
    (0 for most) joined into one. `take(size)` gives the writable buffer a join is
    copied into (the daemon's: a BufferPool's, used again once sent); default a new one.
    """
    take = take or _new_buffer
    out, group, size, status, error = [], [], 0, END, None
    try:
        for item in slices:
            if not isinstance(item, tuple):  # the reader's wait sentinel: at the live end
                status = WAIT
                break
            columns, lo, hi = item
            if group and not _continues(group[-1], columns, lo):
                out += _batches(group, take)
                group = []
            group.append(item)
            size += _payload_bytes(columns, lo, hi)
            if size >= bytes_budget:
                status = MORE
                break
    except Exception as failure:  # noqa: BLE001 - the caller sends it after the batches
        status, error = FAILED, failure
    if group:
        out += _batches(group, take)
    assert (status is FAILED) == (error is not None)
    return out, status, error


def _payload_bytes(columns, lo: int, hi: int) -> int:
    """What rows [lo, hi) add to a BATCH: a whole stored payload's size, or an estimate
    (values and the fixed columns) for a part."""
    if columns.raw is not None and lo == 0 and hi == len(columns):
        return len(columns.raw)
    return int(columns.value_bytes()[lo:hi].sum()) + 16 * (hi - lo)


def _continues(previous, columns, lo: int) -> bool:
    last, _, hi = previous
    return (columns.txn_id == last.txn_id
            and columns.base_offset + lo == last.base_offset + hi)


# Consecutive stored batches smaller than this are joined into one BATCH up to this size
# (a frame of the local log's batched appends is about this size, and is sent as it is).
JOIN_BYTES = 1024 * 1024


def _new_buffer(size: int) -> memoryview:
    return memoryview(np.empty(size, dtype=np.uint8))  # every byte is written: see _join


def _batches(group, take) -> list[tuple]:
    """Whole stored batches go out as they are stored, one BATCH each (no copy), but
    for small ones: consecutive ones of one layout (flags) are joined into BATCHes of
    about JOIN_BYTES (one copy, `_join`), so the client makes one Arrow batch of them,
    and both ends handle a message, not one per stored batch (a batch written by one
    APPEND of a thousand records is about 100 KiB). Anything else goes as one BATCH of
    the slices joined (encode_slices)."""
    if not all(c.raw is not None and lo == 0 and hi == len(c) for c, lo, hi in group):
        return [_batch(group)]
    out, run, run_bytes = [], [], 0
    for columns, _, _ in group:
        size = len(columns.raw)
        if run and (run_bytes + size > JOIN_BYTES or columns.flags != run[0].flags):
            out.append(_join(run, take))
            run, run_bytes = [], 0
        run.append(columns)
        run_bytes += size
    out.append(_join(run, take))
    return out


def _join(run: list, take) -> tuple:
    """One BATCH of consecutive whole stored batches of one layout: each column of the
    payload layout is the batches' columns one after the other (one copy of each, into
    `take`'s buffer, written whole); a single batch is its payload as stored."""
    first = run[0]
    if len(run) == 1:
        return first.base_offset, len(first), first.txn_id, first.flags, first.raw
    regions = [_regions(columns) for columns in run]
    view, position = take(sum(len(columns.raw) for columns in run)), 0
    into = np.frombuffer(view, dtype=np.uint8)  # NumPy copies without holding the GIL
    for column in range(len(regions[0])):
        for parts in regions:
            part = parts[column]
            into[position:position + len(part)] = np.frombuffer(part, dtype=np.uint8)
            position += len(part)
    assert position == len(view)
    return first.base_offset, sum(map(len, run)), first.txn_id, first.flags, view


def _regions(columns: Columns) -> list:
    """The parts of a whole stored payload, in layout order (payload.py), as views."""
    n, raw = len(columns), columns.raw
    widths = [8, 4, 4]
    if columns.header_lengths is not None:
        widths.append(4)
    if columns.kinds is not None:
        widths.append(1)
    regions, position = [], 0
    for width in widths:
        regions.append(raw[position:position + width * n])
        position += width * n
    regions += [columns.keys, columns.values]
    if columns.headers is not None:
        regions.append(columns.headers)
    assert sum(map(len, regions)) == len(raw)
    return regions


def _batch(group) -> tuple:
    first, lo, _ = group[0]
    count = sum(hi - lo for _, lo, hi in group)
    payload, flags = encode_slices(group)
    return first.base_offset + lo, count, first.txn_id, flags, payload


# -- payload -> lists (the daemon's side of an APPEND) ---------------------------------

def columns_to_lists(columns: Columns, *, timestamps: bool = True):
    """(timestamps, keys, values, kinds, headers) lists of a decoded APPEND, for
    Log.append_batch. kinds / headers are None when the payload has none; timestamps
    None when not asked for. A missing key and a None value are None."""
    timestamps = columns.timestamps_us.tolist() if timestamps else None
    values = blobs_or_none(columns.values, columns.value_lengths)
    keys = blobs_or_none(columns.keys, columns.key_lengths)
    kinds = columns.kinds.tolist() if columns.kinds is not None else None
    headers = None
    if columns.header_lengths is not None:
        headers = [decode_headers(blob, nulls=columns.nulls) for blob in
                   split_blobs(bytes(columns.headers), columns.header_lengths)]
    return timestamps, keys, values, kinds, headers


def blobs_or_none(blob, lengths: np.ndarray) -> list:
    """The items of a keys or values blob: bytes, None where the length is -1."""
    if len(lengths) and int(lengths.min()) >= 0:
        return split_blobs(bytes(blob), lengths)
    if int(lengths.max()) < 0:
        return [None] * len(lengths)
    present = iter(split_blobs(bytes(blob), np.maximum(lengths, 0)))
    return [next(present) if length >= 0 else (next(present), None)[1]
            for length in lengths.tolist()]


def split_blobs(blob: bytes, lengths: np.ndarray) -> list[bytes]:
    ends = np.cumsum(lengths, dtype=np.int64).tolist()
    return [blob[start:end] for start, end in zip([0, *ends], ends)]  # faster than map()


# -- lists -> payloads (the client's side of an APPEND) --------------------------------

@dataclasses.dataclass(slots=True)
class ClientColumns:
    """An append's records, checked, as parallel lists."""

    values: list
    keys: list
    timestamps: list
    headers: list | None
    kinds: list | None


def checked_columns(values, keys, timestamps_us, headers, kinds) -> ClientColumns:
    """The log's checks (validate.records); the daemon bounds record sizes itself and
    stamps the append time when no timestamps are given (sent as zeros)."""
    values, keys, timestamps, headers, kinds = validate.records(values, keys, timestamps_us,
                                                                headers, kinds)
    if timestamps is None:
        timestamps = [0] * len(values)
    if headers is not None and not any(headers):
        headers = None
    if kinds is not None and not any(kinds):
        kinds = None
    return ClientColumns(values, keys, timestamps, headers, kinds)


def pieces(columns: ClientColumns, bytes_max: int) -> list[range]:
    """Row ranges whose encoded payload stays under bytes_max (one range, usually)."""
    n = len(columns.values)
    sizes = None
    keys = columns.keys
    # filter(None, ...) drops None (no key, a tombstone) and b"" (adds nothing)
    total = (sum(map(len, filter(None, columns.values)))
             + sum(map(len, filter(None, keys))) + 17 * n)
    if columns.headers is not None:
        sizes = [(len(v) if v else 0) + (len(k) if k else 0) + 21 + _headers_size(h)
                 for v, k, h in zip(columns.values, columns.keys, columns.headers)]
        total = sum(sizes)
    if total <= bytes_max:
        return [range(n)]
    if sizes is None:
        sizes = [(len(v) if v else 0) + (len(k) if k else 0) + 17 for v, k in
                 zip(columns.values, columns.keys)]
    out, start, size = [], 0, 0
    for row, record in enumerate(sizes):
        if record > bytes_max:
            raise InvalidAppend(f"record {row} is {record} bytes; the daemon takes frames of"
                                f" at most {bytes_max + FRAME_SLACK_BYTES}")
        if size + record > bytes_max:
            out.append(range(start, row))
            start, size = row, 0
        size += record
    out.append(range(start, n))
    return out


def take(columns: ClientColumns, rows: range):
    """(timestamps, keys, values, kinds, headers) of `rows`, for encode_records."""
    if len(rows) == len(columns.values):
        return (columns.timestamps, columns.keys, columns.values, columns.kinds,
                columns.headers)
    cut = slice(rows.start, rows.stop)
    return (columns.timestamps[cut], columns.keys[cut], columns.values[cut],
            columns.kinds[cut] if columns.kinds is not None else None,
            columns.headers[cut] if columns.headers is not None else None)


def _headers_size(headers) -> int:
    return 2 + sum(8 + len(name.encode()) + (len(value) if value else 0)
                   for name, value in headers)
