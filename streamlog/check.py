"""Judge a partition's files from its first byte: the shared path of verify, dump, repair.

Strategy: an open judges only the tail (after the index's recovery point), so its time
stays bounded; `check_partition` judges everything, the same way. It takes the index's
claim with recovery's own `claim_index`, walks every segment with the one walker
(walk.py), passing over a sealed segment whose whole-file checksum still matches (disk
speed, no frame decoding), and asks the one decision table (integrity.py) for the
verdict. So `verify`, `info`, `dump`, `repair` and `open` cannot disagree about the
same bytes: where an open and `verify` both look, they run the same code.

`repair_partition` carries out `streamlog repair`: it cuts a damaged partition at its
first bad frame, moving every cut byte under `LOG/quarantine/` first (nothing is
deleted), and drops the index, which the next open rebuilds from what is left.

Nothing here writes, except `repair_partition` (with the log's writer lock held
exclusively by the caller: no writer process may be alive) and `record_verification`
(scrub.json, the partition's last verification). Every file is read and changed
through a FileIO (`fileio=None`: the real file system), as the partition does, so a
tool and an open look at the same bytes the same way; the index is opened and wiped
through its storage (index_storage.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

from . import layout, maintenance
from .config import LogConfig
from .errors import CorruptFrame, CorruptIndex, CorruptionError, InvalidArgument
from .fileio import OsFileIO, read_file, write_file_atomic
from .frame import HEADER_BYTES, INCOMPLETE, Frame, decode_header
from .index import Index
from .index_storage import LmdbIndexStorage, wipe_index
from .integrity import IndexClaim, TailKind, Verdict, decide
from .payload import columns_to_records, decode_columns
from .records import RecordKind
from .recovery import Claim, claim_index
from .scan import resync, scan_buffer
from .scrub import SCRUB_FILE, encode_scrub_status
from .seal import SealOutcome, check_sealed_segment, remove_seal
from .segment import Segment
from .segments import Segments
from .walk import WalkEnd, continues_after, observe, segment_frames, walk

CHUNK_BYTES = 8 * 1024 * 1024
QUARANTINE_DIR = "quarantine"


@dataclasses.dataclass(slots=True)
class Finding:
    verdict: Verdict
    path: str
    position: int
    offset: int  # the offset the bad spot should have held
    reason: str

    def message(self) -> str:
        where = f"segment {self.path} at position {self.position} (offset {self.offset})"
        if self.verdict.is_tail_garbage:
            return (f"warning: {self.verdict.description} in {where}: {self.reason} "
                    f"(a writer truncates it on its next open)")
        return f"error: {self.verdict.description} in {where}: {self.reason}"


@dataclasses.dataclass(slots=True)
class PartitionCheck:
    stream: str
    partition: int
    directory: str
    verdict: Verdict = Verdict.CLEAN
    finding: Finding | None = None
    index: IndexClaim = IndexClaim.ABSENT
    index_problem: str = ""
    notes: list[str] = dataclasses.field(default_factory=list)
    payload_findings: list[Finding] = dataclasses.field(default_factory=list)
    segments: int = 0
    frames: int = 0  # frames decoded one by one (not those of sealed segments)
    records: int = 0  # records checked, sealed segments' included
    bytes_walked: int = 0
    bytes_sealed: int = 0
    end_offset: int = 0  # where the valid, continuing frames end
    seconds: float = 0.0

    @property
    def damaged(self) -> bool:
        return self.verdict.is_damage or bool(self.payload_findings)

    def as_dict(self) -> dict:
        out = {"stream": self.stream, "partition": self.partition,
               "verdict": self.verdict.value, "index": self.index.value,
               "index_problem": self.index_problem or None, "notes": self.notes,
               "segments": self.segments, "frames": self.frames, "records": self.records,
               "bytes_walked": self.bytes_walked, "bytes_sealed": self.bytes_sealed,
               "end_offset": self.end_offset}
        findings = ([self.finding] if self.finding else []) + self.payload_findings
        out["findings"] = [{"kind": f.verdict.value, "path": f.path, "position": f.position,
                            "offset": f.offset, "reason": f.reason} for f in findings]
        return out


def open_segments(directory: str, fileio=None) -> list[Segment]:
    """Read-only Segment objects for a partition directory, in offset order."""
    fileio = fileio or OsFileIO()
    names = _names_in(fileio, directory)
    bases = sorted(b for b in map(layout.parse_segment_name, names) if b is not None)
    return [Segment(fileio, directory, base, writable=False) for base in bases]


def partition_dirs(path: str, stream: str | None = None, partition: int | None = None, *,
                   fileio=None):
    """(stream, number, directory) of every partition, from the files alone.

    Raises:
        InvalidArgument for a `stream` the log does not have; CorruptionError when a
        stream.json does not say how many partitions its stream has.
    """
    fileio = fileio or OsFileIO()
    root = layout.streams_dir(path)
    names = sorted(n for n in filter(None, map(layout.stream_of_folder,
                                                 _names_in(fileio, root)))
                   if fileio.exists(os.path.join(layout.stream_dir(path, n), "stream.json")))
    if stream is not None:
        if stream not in names:
            raise InvalidArgument(f"no stream named {stream!r} in {path}")
        names = [stream]
    for name in names:
        meta = os.path.join(layout.stream_dir(path, name), "stream.json")
        try:
            count = int(json.loads(read_file(fileio, meta))["partitions"])
        except (ValueError, KeyError, TypeError):
            raise CorruptionError(f"{meta} is damaged") from None
        for number in range(count):
            if partition is None or partition == number:
                yield name, number, layout.partition_dir(path, name, number)


def _names_in(fileio, directory: str) -> list[str]:
    """The entries of `directory`; none when there is no such directory."""
    try:
        return fileio.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _view_intent(directory: str, segments: list, fileio) -> tuple[list, str | None]:
    """An unfinished truncate is seen as finished, as a read-only open sees it."""
    try:
        intent = maintenance.read_intent(fileio, directory)
        if intent is None:
            return segments, None
        keep = list(maintenance.view_intent(Segments(segments), intent))
    except (ValueError, KeyError, TypeError):
        return segments, "a truncate intent file is damaged; the next writer removes it"
    return keep, "a truncate is in progress; the next writer finishes it"


def check_partition(stream: str, number: int, directory: str, *, fileio=None,
                    chunk_bytes: int = CHUNK_BYTES, use_seals: bool = True,
                    check_payloads: bool = True, progress=None,
                    index_storage=None) -> PartitionCheck:
    """Judge one partition's files from the first byte (see the module docstring).
    `progress(bytes)` is called as bytes are checked. `index_storage`: where the
    partition's index lives (None: its LMDB files, through `fileio`; a log in an
    object store: the view's, built from the index objects, whose recovery point is
    the end of the last segment object)."""
    started = time.monotonic()
    fileio = fileio or OsFileIO()
    result = PartitionCheck(stream, number, directory)
    segments, note = _view_intent(directory, open_segments(directory, fileio), fileio)
    if note:
        result.notes.append(note)
    try:
        result.segments = len(segments)
        if segments:
            _check_segments(result, segments, fileio, chunk_bytes, use_seals,
                            check_payloads, progress, truncating=note is not None,
                            index_storage=index_storage)
    finally:
        for segment in segments:
            segment.close()
    result.seconds = time.monotonic() - started
    return result


def _check_segments(result: PartitionCheck, segments, fileio, chunk_bytes: int,
                    use_seals: bool, check_payloads: bool, progress, *,
                    truncating: bool = False, index_storage=None) -> None:
    # During a truncate the index still describes the partition before the cut (the
    # writer that finishes the intent reconciles it): its claim says nothing here.
    claim = Claim(IndexClaim.ABSENT) if truncating else _claim(result, segments, fileio,
                                                               index_storage)
    def sealed(n: int) -> int | None:
        end_offset = _seal_matches(result, segments[n], fileio, progress)
        if end_offset is not None:
            result.records += end_offset - segments[n].base_offset
        return end_offset


    def on_frames(segment_number: int, frames: list[Frame]) -> None:
        result.frames += len(frames)
        result.records += sum(f.record_count for f in frames)
        result.bytes_walked += sum(f.size for f in frames)
        if check_payloads:
            path = segments[segment_number].path
            for frame in frames:
                problem = payload_problem(frame)
                if problem is not None:
                    result.payload_findings.append(Finding(
                        Verdict.CORRUPT, path, frame.position, frame.base_offset,
                        f"the payload does not decode: {problem}"))
        if progress is not None:
            progress(result.bytes_walked + result.bytes_sealed)

    end = walk(segments, number=0, position=0, next_offset=segments[0].base_offset,
               chunk_bytes=chunk_bytes, on_frames=on_frames,
               sealed=sealed if use_seals else None)
    continues = continues_after(segments, end, chunk_bytes)
    durable = (claim.point.segment_base, claim.point.position) if claim.point else None
    result.verdict = decide(observe(claim.kind, end, continues=continues,
                                    durable_until=durable, segments=segments))
    result.end_offset = end.next_offset
    if result.verdict is not Verdict.CLEAN:
        _record_finding(result, segments, end)


def _claim(result: PartitionCheck, segments, fileio, index_storage=None) -> Claim:
    """The index's claim, read without changing a file. An index the table says to
    rebuild is reported, and the segments are judged as if there were none."""
    path = os.path.join(result.directory, "index")
    index = None
    try:
        index = Index(path, readonly=True, map_bytes=LogConfig().index_map_bytes,
                      storage=index_storage or LmdbIndexStorage(fileio))
        claim = claim_index(segments, index)
    except CorruptIndex as error:
        claim = Claim(IndexClaim.UNREADABLE, problem=str(error))
    finally:
        if index is not None:
            index.close()
    result.index = claim.kind
    if claim.kind in (IndexClaim.UNREADABLE, IndexClaim.DISAGREES):
        result.index_problem = claim.problem or "the index disagrees with the segments"
        return Claim(IndexClaim.ABSENT)
    return dataclasses.replace(claim, damaged=None)


def _seal_matches(result: PartitionCheck, segment, fileio, progress) -> int | None:
    """The end offset a sealed segment's seal records when the file still matches it;
    None (the frames are then walked one by one) otherwise."""
    check = check_sealed_segment(fileio, segment.path)
    if check.outcome is SealOutcome.OK and check.seal.end_offset > segment.base_offset:
        result.bytes_sealed += check.bytes_hashed
        if progress is not None:
            progress(result.bytes_walked + result.bytes_sealed)
        return check.seal.end_offset
    if check.outcome not in (SealOutcome.NO_SEAL, SealOutcome.OK):
        result.notes.append(f"{segment.path}: {check.reason}; its frames are checked one "
                            f"by one")
    return None


def _record_finding(result: PartitionCheck, segments, end: WalkEnd) -> None:
    segment = segments[end.number]
    result.finding = Finding(result.verdict, segment.path, end.position, end.next_offset,
                             end.reason)


# -- dump: every frame and bad spot of a segment ------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class BadSpot:
    """Bytes at `position` of a segment that are not a whole valid frame. `header`
    holds the decoded header fields when only the payload is wrong."""

    position: int
    reason: str
    header: dict | None = None


def segment_events(segment, chunk_bytes: int = CHUNK_BYTES):
    """Yield every valid Frame (file positions) and BadSpot of one segment, in file
    order, with the one walker; after a bad spot, go on at the next valid frame."""
    position = 0
    while position < segment.size_bytes:
        runs = segment_frames(segment, position, None, chunk_bytes)
        while True:
            try:
                yield from next(runs)
            except StopIteration as stop:
                end = stop.value
                break
        if end.kind is TailKind.END:
            return
        yield BadSpot(end.position, end.reason, _header_fields(segment, end.position))
        rest = segment.read(end.position, segment.size_bytes - end.position)
        found = resync(rest, 0)
        if found is None:
            return
        position = end.position + found


def _header_fields(segment, position: int) -> dict | None:
    try:
        header = decode_header(segment.read(position, HEADER_BYTES), 0)
    except CorruptFrame:
        return None
    if header is INCOMPLETE:
        return None
    return {"base_offset": header.base_offset,
            "last_offset": header.base_offset + header.record_count - 1,
            "count": header.record_count, "min_timestamp_us": header.min_timestamp_us,
            "max_timestamp_us": header.max_timestamp_us, "txn_id": header.txn_id,
            "flags": header.flags, "payload_bytes": header.payload_bytes}


def payload_problem(frame: Frame) -> str | None:
    """Why the payload of a checksummed frame does not decode, or None when it does."""
    try:
        columns = decode_columns(frame)
    except CorruptFrame as error:
        return error.reason
    timestamps = columns.timestamps_us
    if int(timestamps.min()) != frame.min_timestamp_us or (
            int(timestamps.max()) != frame.max_timestamp_us):
        return "timestamps disagree with the header's min and max"
    if columns.kinds is not None and int(columns.kinds.max()) > max(RecordKind):
        return "unknown record kind"
    if columns.header_lengths is not None:
        try:
            for _ in columns_to_records(columns, 0, data_only=False):
                pass
        except CorruptFrame as error:
            return error.reason
    return None


def record_verification(fileio, result: PartitionCheck) -> None:
    """Write the partition's last verification (scrub.json, as the scrubber does), so
    `info` can say when it was verified and with what result. Best effort: a read-only
    file system just means nothing is recorded."""
    findings = ([result.finding] if result.finding else []) + result.payload_findings
    status = {"verified_at_us": time.time_ns() // 1000, "by": "verify",
              "result": "corrupt" if result.damaged else "ok",
              "verdict": result.verdict.value,
              "segments": result.segments, "bytes": result.bytes_walked + result.bytes_sealed,
              "unsealed_segments": 0,
              "findings": [{"segment": os.path.basename(f.path), "position": f.position,
                            "reason": f.reason, "outcome": f.verdict.value}
                           for f in findings]}
    try:
        write_file_atomic(fileio, os.path.join(result.directory, SCRUB_FILE),
                          encode_scrub_status(status))
    except OSError:
        pass


# -- repair -------------------------------------------------------------------------------

def repair_partition(log_dir: str, result: PartitionCheck, *, dry_run: bool,
                     fileio=None, chunk_bytes: int = CHUNK_BYTES) -> list[dict]:
    """Cut a partition at its first bad frame (see the module docstring). Returns one
    JSON-ready dict per cut, and one for an index dropped because it disagreed.
    The caller holds the log's writer lock."""
    fileio = fileio or OsFileIO()
    out = []
    if result.finding is not None and result.verdict is not Verdict.CLEAN:
        out.append(_cut(log_dir, result, dry_run, fileio, chunk_bytes))
    if result.index_problem or out:
        out.append({"stream": result.stream, "partition": result.partition,
                    "index": "dropped; the next open rebuilds it from the segments",
                    "reason": result.index_problem or "segments were cut",
                    "dry_run": dry_run})
        if not dry_run:
            wipe_index(os.path.join(result.directory, "index"), fileio=fileio)
    return out


def _cut(log_dir: str, result: PartitionCheck, dry_run: bool, fileio, chunk_bytes) -> dict:
    finding = result.finding
    segments = open_segments(result.directory, fileio)
    try:
        number = next(n for n, s in enumerate(segments) if s.path == finding.path)
        cut_bytes = segments[number].size_bytes - finding.position + sum(
            s.size_bytes for s in segments[number + 1:])
        last = _last_offset_after(segments, number, finding.position, finding.offset)
        line = {"stream": result.stream, "partition": result.partition,
                "segment": finding.path, "position": finding.position,
                "verdict": result.verdict.value, "reason": finding.reason,
                "bytes_cut": cut_bytes,
                "offsets_removed": [finding.offset, last] if last is not None else None,
                "dry_run": dry_run}
        if not dry_run:
            line["quarantine"] = _quarantine(log_dir, result, segments, number,
                                             finding.position, fileio)
        return line
    finally:
        for segment in segments:
            segment.close()


def _last_offset_after(segments, number: int, position: int, first: int) -> int | None:
    """The highest offset held by a valid frame after the cut (records it removes),
    or None when no whole record of the partition is there (only garbage)."""
    last = None
    for at, segment in enumerate(segments[number:], number):
        data = segment.read(0 if at > number else position,
                            segment.size_bytes - (0 if at > number else position))
        found = resync(data, -1, min_base=first)
        while found is not None:
            scanned = scan_buffer(data, found)
            for frame in scanned.frames:
                last = frame.next_offset - 1 if last is None else max(last,
                                                                       frame.next_offset - 1)
            found = resync(data, max(scanned.end, found), min_base=first)
    return last


def _quarantine(log_dir: str, result: PartitionCheck, segments, number: int,
                position: int, fileio) -> str:
    """Move the bytes after the cut under LOG/quarantine/, then cut. Order: the copy is
    durable before anything is removed, so a crash leaves both or the original."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = os.path.join(log_dir, QUARANTINE_DIR, result.stream, str(result.partition), stamp)
    fileio.makedirs(target)
    segment = segments[number]
    # (the segments are open and no writer may be alive: their size is the file's)
    tail = segment.read(position, segment.size_bytes - position)
    name = f"{os.path.basename(segment.path)}.from-{position}"
    write_file_atomic(fileio, os.path.join(target, name), tail)
    for later in segments[number + 1:]:
        remove_seal(fileio, later.path)
        fileio.rename(later.path, os.path.join(target, os.path.basename(later.path)))
    fileio.fsync_dir(target)
    remove_seal(fileio, segment.path)
    if position == 0 and number > 0:
        fileio.rename(segment.path, os.path.join(target, os.path.basename(segment.path)))
    else:
        handle = fileio.open(segment.path, writable=True)
        try:
            fileio.truncate(handle, position)
            fileio.fsync(handle)
        finally:
            fileio.close(handle)
    fileio.fsync_dir(result.directory)
    return target
