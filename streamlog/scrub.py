"""Background re-verification of sealed segments at a bounded read rate.

Strategy: a `Scrubber` owns one daemon thread. Each pass asks the `segments()` callable
for `(partition_key, partition_dir, segment_path)` of every non-active segment, checks
each with `seal.check_sealed_segment` (size, then one xxh3 over the file), and paces
every read through a token bucket so the pass reads at most `bytes_per_s` (bursts of at
most one chunk). When a segment's size or whole-file checksum disagrees with its seal,
`locate_bad_frame` walks its frames with the one walker (walk.py) so the report names
the segment and the position of the first bad frame. A
damaged seal is reported as such, never as data corruption; a segment without a seal
is counted as unsealed; one that vanished during the pass (retention) is skipped.

Every result goes to the `streamlog.scrub` logger (error for corruption and read
errors, warning for a damaged seal, debug otherwise), to the optional `on_result`
callback (the daemon's metrics) and to the counters. When all of a partition's segments
are checked, `<partition_dir>/scrub.json` is replaced atomically with the summary:

    {"verified_at_us": int, "result": "ok" | "corrupt" | "read_error" | "seal_damaged",
     "segments": n, "bytes": n, "unsealed_segments": n,
     "findings": [{"segment": name, "position": int | null, "reason": str,
                   "outcome": SealOutcome value}]}

(`result` is the worst finding, in that order; `segments` counts the segments checked
apart from unsealed ones, `bytes` the bytes hashed.) `read_scrub_status(fileio,
partition_dir)` returns that dict, or None for a missing or unreadable file.

API: `Scrubber(fileio, segments, *, bytes_per_s, interval_s, chunk_bytes, on_result,
clock, sleep)`, `.start()`, `.stop()`, `.run_pass() -> list[ScrubResult]`, counters
`segments_checked`, `bytes_checked`, `problems`, `passes_completed`. Time is injected:
`clock()` (monotonic seconds) for the bucket, `sleep(seconds)` for every wait; the
default sleep waits on the stop Event, so `stop()` returns promptly even mid-pass.
Only the scrubber's thread (or the caller of `run_pass`) mutates the object; other
threads may read the counters.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from typing import Callable, Hashable, Iterable

from .errors import InvalidArgument
from .fileio import FileIO, read_file, write_file_atomic
from .layout import parse_segment_name
from .integrity import TailKind
from .seal import SealCheck, SealOutcome, check_sealed_segment
from .segment import Segment
from .walk import walk

logger = logging.getLogger("streamlog.scrub")

SCRUB_FILE = "scrub.json"
BYTES_PER_S_DEFAULT = 32 << 20
INTERVAL_S_DEFAULT = 3600.0
CHUNK_BYTES_DEFAULT = 1 << 20
FINDINGS_MAX = 100  # per partition in scrub.json; the log has every one
_RESULTS = ("ok", "seal_damaged", "read_error", "corrupt")  # worst last
_CORRUPT = frozenset({SealOutcome.SIZE_MISMATCH, SealOutcome.DIGEST_MISMATCH})
_OPTIONAL = ("by", "verdict")


@dataclasses.dataclass(frozen=True, slots=True)
class Finding:
    segment: str  # file name within the partition directory
    position: int | None  # of the first bad frame; None when no frame is bad
    reason: str
    outcome: str  # a SealOutcome value

    def as_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, slots=True)
class ScrubResult:
    partition_key: Hashable
    partition_dir: str
    check: SealCheck
    finding: Finding | None  # set for every problem outcome

    @property
    def outcome(self) -> SealOutcome:
        return self.check.outcome

    @property
    def segment_path(self) -> str:
        return self.check.segment_path


class _Stopped(Exception):
    """Raised by the pacing hook to abandon a pass when stop() was called."""


class TokenBucket:
    """Reads of at most `bytes_per_s` on average, bursts of at most `burst_bytes`.

    Starts empty, so n bytes taken from the start ask for n / bytes_per_s of sleep.
    """

    def __init__(self, bytes_per_s: float, burst_bytes: int,
                 clock: Callable[[], float], sleep: Callable[[float], None]) -> None:
        assert bytes_per_s > 0
        assert burst_bytes > 0
        self.bytes_per_s = bytes_per_s
        self.burst_bytes = burst_bytes
        self._clock = clock
        self._sleep = sleep
        self._tokens = 0.0
        self._last = clock()

    def take(self, size: int) -> None:
        assert size >= 0
        now = self._clock()
        elapsed = max(0.0, now - self._last)
        self._tokens = min(float(self.burst_bytes), self._tokens + elapsed * self.bytes_per_s)
        self._last = now
        self._tokens -= size
        if self._tokens < 0:
            self._sleep(-self._tokens / self.bytes_per_s)


class Scrubber:
    """Re-verifies sealed segments in the background; see the module docstring.

    Args:
        fileio: the FileIO the log uses.
        segments: returns (partition_key, partition_dir, segment_path) of every
            non-active segment, grouped by partition; called once per pass, from the
            scrubber thread. partition_key is opaque (reported back in results).
        bytes_per_s: read-rate limit; chunk_bytes: read size and largest burst.
        interval_s: wait between the end of a pass and the start of the next.
        on_result: called with each ScrubResult (exceptions are logged, not raised).
        clock / sleep: monotonic seconds and a sleep; the default sleep waits on the
            stop Event. An injected sleep should return promptly (tests).
    Raises:
        InvalidArgument for a non-positive rate or chunk, or a negative interval.
    """

    def __init__(self, fileio: FileIO,
                 segments: Callable[[], Iterable[tuple[Hashable, str, str]]], *,
                 bytes_per_s: float = BYTES_PER_S_DEFAULT,
                 interval_s: float = INTERVAL_S_DEFAULT,
                 chunk_bytes: int = CHUNK_BYTES_DEFAULT,
                 on_result: Callable[[ScrubResult], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] | None = None) -> None:
        if not bytes_per_s > 0:
            raise InvalidArgument(f"bytes_per_s must be > 0 (got {bytes_per_s!r})")
        if not interval_s >= 0:
            raise InvalidArgument(f"interval_s must be >= 0 (got {interval_s!r})")
        if not (isinstance(chunk_bytes, int) and chunk_bytes > 0):
            raise InvalidArgument(f"chunk_bytes must be a positive int (got {chunk_bytes!r})")
        self.fileio = fileio
        self.interval_s = interval_s
        self.chunk_bytes = chunk_bytes
        self._segments = segments
        self._on_result = on_result
        self._clock = clock
        self._stopping = threading.Event()
        self._sleep = sleep if sleep is not None else self._stopping.wait
        self._bucket = TokenBucket(bytes_per_s, chunk_bytes, clock, self._sleep)
        self._thread: threading.Thread | None = None
        self.segments_checked = 0
        self.bytes_checked = 0
        self.problems = 0
        self.passes_completed = 0

    def start(self) -> None:
        """Start the daemon thread (once)."""
        assert self._thread is None, "a Scrubber starts once"
        self._thread = threading.Thread(target=self._run, name="streamlog-scrub", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask the thread to stop at its next chunk or wait, and join it."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def run_pass(self) -> list[ScrubResult]:
        """Check every segment once and write each finished partition's scrub.json.

        Returns the results (fewer when stop() interrupted the pass; the interrupted
        partition's scrub.json is then left as it was).
        """
        results: list[ScrubResult] = []
        try:
            for (key, directory), paths in _by_partition(self._segments()).items():
                tally = [result for path in paths
                         if (result := self._check_one(key, directory, path)) is not None]
                results.extend(tally)
                self._write_status(directory, tally)
        except _Stopped:
            return results
        self.passes_completed += 1
        return results

    # -- the thread -------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.run_pass()
            except Exception:  # never let one bad pass end the scrubbing for good
                logger.exception("scrub pass failed; retrying after %s s", self.interval_s)
            if self._stopping.is_set():
                break
            self._sleep(self.interval_s)

    def _pace(self, size: int) -> None:
        if self._stopping.is_set():
            raise _Stopped
        self._bucket.take(size)
        if self._stopping.is_set():
            raise _Stopped

    # -- one segment ------------------------------------------------------------------

    def _check_one(self, key, directory: str, path: str) -> ScrubResult | None:
        check = check_sealed_segment(self.fileio, path, chunk_bytes=self.chunk_bytes,
                                     pace=self._pace, clock=self._clock)
        vanished = check.outcome is SealOutcome.MISSING or (
            check.outcome is SealOutcome.NO_SEAL and not self.fileio.exists(path))
        if vanished:
            logger.debug("scrub: %s vanished during the pass; skipped", path)
            return None
        result = ScrubResult(key, directory, check, self._finding(check))
        self.segments_checked += 1
        self.bytes_checked += check.bytes_hashed
        self.problems += check.is_problem
        _log(result)
        if self._on_result is not None:
            try:
                self._on_result(result)
            except Exception:
                logger.exception("scrub: on_result callback failed")
        return result

    def _finding(self, check: SealCheck) -> Finding | None:
        name = os.path.basename(check.segment_path)
        if not check.is_problem:
            return None
        if check.outcome not in _CORRUPT:
            return Finding(name, None, check.reason, check.outcome.value)
        try:
            located = locate_bad_frame(self.fileio, check.segment_path,
                                       chunk_bytes=self.chunk_bytes, pace=self._pace)
        except OSError as error:  # includes the file vanishing after the hash
            return Finding(name, None, f"{check.reason}; frames not scanned: {error}",
                           check.outcome.value)
        if located is None:
            return Finding(name, None, f"{check.reason}; every frame is valid",
                           check.outcome.value)
        position, reason = located
        return Finding(name, position, f"{reason} ({check.reason})", check.outcome.value)

    def _write_status(self, directory: str, results: list[ScrubResult]) -> None:
        if not results:
            return
        status = summarize(results, verified_at_us=time.time_ns() // 1000)
        try:
            write_file_atomic(self.fileio, os.path.join(directory, SCRUB_FILE),
                              encode_scrub_status(status))
        except OSError as error:  # the partition was deleted, or the disk is failing
            logger.warning("scrub: cannot write %s in %s: %s", SCRUB_FILE, directory, error)


def locate_bad_frame(fileio: FileIO, segment_path: str, *,
                     chunk_bytes: int = CHUNK_BYTES_DEFAULT,
                     pace: Callable[[int], None] | None = None) -> tuple[int, str] | None:
    """Position and reason of the first frame of a segment that is not valid, or None
    when the file is whole valid frames in sequence to its end.

    Uses the one walker (walk.py): the first frame must carry the base offset in the
    file name, each next one continue the last. Raises OSError (FileNotFoundError when
    the segment is gone).
    """
    directory, name = os.path.split(segment_path)
    base = parse_segment_name(name)
    segment = Segment(fileio, directory, base, writable=False)
    try:
        end = walk([_PacedSegment(segment, pace)], number=0, position=0, next_offset=base,
                   chunk_bytes=chunk_bytes)
    finally:
        segment.close()
    return None if end.kind is TailKind.END else (end.position, end.reason)


class _PacedSegment:
    """A segment whose reads first go through the scrubber's rate limit."""

    def __init__(self, segment: Segment, pace) -> None:
        self.segment, self.pace = segment, pace
        self.base_offset, self.path = segment.base_offset, segment.path
        self.size_bytes = segment.size_bytes

    def read(self, position: int, size: int) -> bytes:
        if self.pace is not None:
            self.pace(size)
        return self.segment.read(position, size)


# -- scrub.json ------------------------------------------------------------------------


def summarize(results: list[ScrubResult], *, verified_at_us: int) -> dict:
    """The scrub.json dict for one partition's results. Pure."""
    unsealed = sum(r.outcome is SealOutcome.NO_SEAL for r in results)
    findings = [r.finding for r in results if r.finding is not None]
    worst = max((_result_name(r.outcome) for r in results), key=_RESULTS.index,
                default="ok")
    return {"verified_at_us": verified_at_us, "result": worst,
            "segments": len(results) - unsealed,
            "bytes": sum(r.check.bytes_hashed for r in results),
            "unsealed_segments": unsealed,
            "findings": [f.as_json() for f in findings[:FINDINGS_MAX]]}


def encode_scrub_status(status: dict) -> bytes:
    assert decode_scrub_status(json.dumps(status).encode()) == status
    return (json.dumps(status, indent=1, sort_keys=True) + "\n").encode()


def decode_scrub_status(data: bytes) -> dict | None:
    """The scrub.json dict, or None when `data` is not one. Pure; never raises."""
    try:
        status = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(status, dict) or status.get("result") not in _RESULTS:
        return None
    counts = ("verified_at_us", "segments", "bytes", "unsealed_segments")
    if not all(_is_count(status.get(name)) for name in counts):
        return None
    findings = status.get("findings")
    if not (isinstance(findings, list) and all(map(_is_finding, findings))):
        return None
    out = {name: status[name] for name in (*counts, "result", "findings")}
    for name in _OPTIONAL:  # who verified ("verify" or the scrubber) and its verdict
        if isinstance(status.get(name), str):
            out[name] = status[name]
    return out


def read_scrub_status(fileio: FileIO, partition_dir: str) -> dict | None:
    """The last completed verification of a partition, or None (missing, unreadable
    or malformed scrub.json). Never raises."""
    try:
        data = read_file(fileio, os.path.join(partition_dir, SCRUB_FILE))
    except OSError:
        return None
    return decode_scrub_status(data)


# -- helpers ---------------------------------------------------------------------------


def _by_partition(entries) -> dict[tuple, list[str]]:
    groups: dict[tuple, list[str]] = {}
    for key, directory, path in entries:
        groups.setdefault((key, directory), []).append(path)
    return groups


def _result_name(outcome: SealOutcome) -> str:
    if outcome in _CORRUPT:
        return "corrupt"
    if outcome is SealOutcome.READ_ERROR:
        return "read_error"
    if outcome is SealOutcome.SEAL_DAMAGED:
        return "seal_damaged"
    return "ok"


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_finding(value) -> bool:
    return (isinstance(value, dict)
            and isinstance(value.get("segment"), str)
            and (value.get("position") is None or _is_count(value.get("position")))
            and isinstance(value.get("reason"), str)
            and isinstance(value.get("outcome", ""), str))


def _log(result: ScrubResult) -> None:
    check, finding = result.check, result.finding
    if check.outcome in _CORRUPT:
        logger.error("scrub: corruption in segment %s at position %s: %s",
                     check.segment_path, finding.position, finding.reason)
    elif check.outcome is SealOutcome.READ_ERROR:
        logger.error("scrub: cannot read segment %s: %s", check.segment_path, check.reason)
    elif check.outcome is SealOutcome.SEAL_DAMAGED:
        logger.warning("scrub: %s of %s; its data was not checked (not data corruption)",
                       check.reason, check.segment_path)
    else:
        logger.debug("scrub: %s %s (%d bytes in %.3f s)", check.segment_path,
                     check.outcome.value, check.bytes_hashed, check.seconds)
