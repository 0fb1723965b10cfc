"""What the console's pages show, gathered from the daemon's log: plain functions that
take the log (and the Kafka listener) and return values for the templates. Each may
block on the log (reads, index look-ups, small files), so the web layer runs them on the
daemon's thread pool, never on its event loop.

Strategy: the message browser never reads a whole partition. A page is at most
PAGE_RECORDS_MAX records; a filter (key exact or substring, a text in the value) scans
forward from the start position until the page is full, SCAN_RECORDS_MAX records or
SCAN_SECONDS_MAX seconds have been looked at, or the partition's end, and the page says
how far it looked (the "next" link continues from there). A position is a cursor,
"P:OFFSET,P:OFFSET", one per partition shown; with all partitions, each partition's
matches are merged by timestamp (then partition, then offset), each partition's
records kept in offset order. Records are read as a
read_uncommitted reader sees them, each marked with its transaction's state (open,
aborted) when it has one; the transactions' markers are not shown.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import heapq
import itertools
import threading
import time

import numpy as np

from ..errors import StreamLogError
from ..payload import columns_to_records
from ..reader import WAIT
from ..txn import TxnState
from . import render

PAGE_RECORDS = 50
PAGE_RECORDS_MAX = 500
SCAN_RECORDS_MAX = 2_000_000
SCAN_SECONDS_MAX = 2.0
TAIL_RECORDS_MAX = 500  # records one live-tail event carries at most
SAMPLE_S = 2.0  # the sampler's period: append rates and group lag
HISTORY_SAMPLES = 150  # five minutes of samples
RATE_WINDOW_S = 10.0


class BadQuery(ValueError):
    """A browser query the console cannot answer: its message says why (shown as is)."""


# -- the message browser ---------------------------------------------------------------

@dataclasses.dataclass
class Query:
    stream: str
    partition: int | None = None  # None: all partitions
    start: str = "start"  # "start", "offset", "time", "end", "cursor"
    offset: int = 0
    time_us: int = 0
    cursor: str = ""
    limit: int = PAGE_RECORDS
    key: str = ""
    key_match: str = "exact"  # or "substring"
    value_text: str = ""

    def filtered(self) -> bool:
        return bool(self.key or self.value_text)


@dataclasses.dataclass
class Page:
    stream: str
    partitions: list[int]
    positions: dict[int, int]  # where this page started, per partition
    rows: list[dict]
    next_positions: dict[int, int]  # where the next page starts
    ends: dict[int, int]  # each partition's end when read
    starts: dict[int, int]  # each partition's start when read
    scanned: int
    stopped_early: bool  # a scan bound ended the filter's search before the end
    seconds: float

    @property
    def at_end(self) -> bool:
        return all(self.next_positions[p] >= self.ends[p] for p in self.partitions)

    def cursor(self, positions: dict[int, int]) -> str:
        return encode_cursor(positions)


def encode_cursor(positions: dict[int, int]) -> str:
    return ",".join(f"{p}:{o}" for p, o in sorted(positions.items()))


def decode_cursor(text: str) -> dict[int, int]:
    out = {}
    for part in text.split(","):
        number, sep, offset = part.partition(":")
        if not sep:
            raise BadQuery(f"{text!r} is not a position (P:OFFSET,...)")
        try:
            out[int(number)] = int(offset)
        except ValueError:
            raise BadQuery(f"{text!r} is not a position (P:OFFSET,...)") from None
    return out


def browse(log, query: Query) -> Page:
    """A page of records of the query's stream (see the module docstring)."""
    started = time.monotonic()
    if query.stream not in log.streams():
        raise BadQuery(f"no stream {query.stream!r}")
    count = log.partition_count(query.stream)
    if query.partition is not None and not 0 <= query.partition < count:
        raise BadQuery(f"stream {query.stream!r} has partitions 0 to {count - 1}")
    if not 1 <= query.limit <= PAGE_RECORDS_MAX:
        raise BadQuery(f"a page holds 1 to {PAGE_RECORDS_MAX} records")
    numbers = list(range(count)) if query.partition is None else [query.partition]
    starts = {p: log.start_offset(query.stream, p) for p in numbers}
    ends = {p: log.end_offset(query.stream, p) for p in numbers}
    positions = _positions(log, query, numbers, starts, ends)
    if len(numbers) > 1 and not query.filtered():
        taken, next_positions = _merged_page(log, query, numbers, positions, ends)
        states = _txn_states(log, query.stream, taken)
        return Page(query.stream, numbers, positions,
                    [record_row(record, states) for record in taken], next_positions,
                    ends, starts, len(taken), False, time.monotonic() - started)
    found: dict[int, list] = {}
    scan_ends: dict[int, int] = {}
    scanned, stopped = 0, False
    deadline = started + SCAN_SECONDS_MAX
    for p in numbers:
        budget = SCAN_RECORDS_MAX - scanned
        records, scan_end, looked, early = _scan(log, query, p, positions[p], ends[p],
                                                 query.limit, budget, deadline)
        found[p], scan_ends[p] = records, scan_end
        scanned += looked
        stopped = stopped or early
    # heapq.merge takes the smallest head each time and keeps each partition's records
    # in offset order (timestamps may be out of order within one): what a page takes
    # of a partition is always a prefix of what was found there, so the next page of
    # each partition starts at its first record left out.
    merged = heapq.merge(*found.values(),
                         key=lambda r: (r.timestamp_us, r.partition, r.offset))
    taken = list(merged)[: query.limit] if len(numbers) > 1 else found[numbers[0]]
    next_positions = dict(scan_ends)
    taken_offsets = collections.defaultdict(set)
    for record in taken:
        taken_offsets[record.partition].add(record.offset)
    for p in numbers:  # a partition's first match left out of the page starts the next
        left = [r.offset for r in found[p] if r.offset not in taken_offsets[p]]
        if left:
            next_positions[p] = left[0]
    states = _txn_states(log, query.stream, taken)
    rows = [record_row(record, states) for record in taken]
    return Page(query.stream, numbers, positions, rows, next_positions, ends, starts,
                scanned, stopped, time.monotonic() - started)


def _merged_page(log, query: Query, numbers, positions, ends):
    """A page of several partitions without a filter: each partition's records pulled
    one at a time into heapq.merge, so that a page of 50 over 100 partitions makes about
    150 records, not 5,000. Returns (records, where each partition's next page starts)."""
    pulled: dict[int, list[int]] = {p: [] for p in numbers}
    finished: set[int] = set()
    tos = {p: min(ends[p], positions[p] + query.limit) for p in numbers}

    def each(p, reader):
        for record in reader.records():
            pulled[p].append(record.offset)
            yield record
        finished.add(p)

    with contextlib.ExitStack() as readers:
        heads = [each(p, readers.enter_context(log.reader(
            query.stream, p, from_offset=positions[p], to_offset=tos[p],
            read_committed=False))) for p in numbers if positions[p] < tos[p]]
        finished.update(p for p in numbers if positions[p] >= tos[p])
        taken = list(itertools.islice(heapq.merge(
            *heads, key=lambda r: (r.timestamp_us, r.partition, r.offset)), query.limit))
    next_positions = {}
    for p in numbers:
        mine = [r.offset for r in taken if r.partition == p]
        left = pulled[p][len(mine):]  # what the page took of p is a prefix of its pulls
        if left:
            next_positions[p] = left[0]
        elif p in finished:
            next_positions[p] = tos[p]
        else:  # the page's last record was p's: its next was never pulled
            next_positions[p] = mine[-1] + 1 if mine else positions[p]
    return taken, next_positions


def previous_positions(page: Page, limit: int) -> dict[int, int] | None:
    """Where the page before this one starts: `limit` records back in a partition shown
    alone without a filter; None when that is not known (the link then goes back one
    step in the browser's history)."""
    if len(page.partitions) != 1:
        return None
    p = page.partitions[0]
    return {p: max(page.starts[p], page.positions[p] - limit)}


def _positions(log, query: Query, numbers, starts, ends) -> dict[int, int]:
    if query.start == "cursor":
        given = decode_cursor(query.cursor)
        unknown = set(given) - set(numbers)
        if unknown:
            raise BadQuery(f"partition {min(unknown)} is not shown here")
        return {p: min(max(given.get(p, starts[p]), starts[p]), ends[p]) for p in numbers}
    if query.start == "offset":
        return {p: min(max(query.offset, starts[p]), ends[p]) for p in numbers}
    if query.start == "time":
        return {p: log.offset_for_timestamp(query.stream, p, query.time_us) for p in numbers}
    if query.start == "end":
        share = query.limit if len(numbers) == 1 else max(1, query.limit // len(numbers))
        return {p: max(starts[p], ends[p] - share) for p in numbers}
    return dict(starts)


def _scan(log, query: Query, partition: int, position: int, end: int, limit: int,
          budget: int, deadline: float):
    """(records matching, offset after the last looked at, records looked at, whether a
    bound stopped the scan before `end`). Without a filter it reads exactly the page;
    with one, each stored batch is searched whole (`matching_rows`, no Python step per
    record) and only the records found are made."""
    if position >= end:
        return [], position, 0, False
    with log.reader(query.stream, partition, from_offset=position,
                    to_offset=end if query.filtered() else min(end, position + limit),
                    read_committed=False) as reader:
        if not query.filtered():
            out = list(reader.records())  # (transaction markers in the range are not)
            return out, min(end, position + limit), len(out), False
        out, looked = [], 0
        for item in reader.slices():
            if item is WAIT:  # (a reader that does not follow never waits)
                break
            columns, lo, hi = item
            hi = min(hi, lo + budget - looked)
            for row in matching_rows(columns, lo, hi, query):
                out.extend(columns_to_records(columns, partition, row, row + 1))
                if len(out) >= limit:
                    return out, columns.base_offset + row + 1, looked + row + 1 - lo, False
            looked += hi - lo
            after = columns.base_offset + hi
            if after < end and (looked >= budget or time.monotonic() > deadline):
                return out, after, looked, True
    return out, end, looked, False


def matching_rows(columns, lo: int, hi: int, query: Query) -> list[int]:
    """The rows in [lo, hi) of a stored batch that are data records and pass the
    query's filters, found with bytes.find over the batch's keys and values."""
    keep = np.zeros(len(columns), dtype=bool)
    keep[lo:hi] = True
    if columns.kinds is not None:
        keep &= np.asarray(columns.kinds) == 0
    if query.key:
        keep &= _found(columns.keys, columns.key_offsets(), columns.key_lengths,
                       query.key.encode(), exact=query.key_match == "exact")
    if query.value_text:
        keep &= _found(columns.values, columns.value_offsets(), columns.value_lengths,
                       query.value_text.encode(), exact=False)
    return np.flatnonzero(keep).tolist()


def _found(blob, offsets: np.ndarray, lengths: np.ndarray, needle: bytes, *,
           exact: bool) -> np.ndarray:
    """Which rows' bytes (blob[offsets[i]:offsets[i + 1]]) hold `needle` (are it, when
    `exact`); a row of length -1 (None) holds nothing."""
    rows = np.zeros(len(lengths), dtype=bool)
    data = bytes(blob)
    hits, at = [], data.find(needle)
    while at >= 0:
        hits.append(at)
        at = data.find(needle, at + 1)
    if not hits:
        return rows
    starts = np.asarray(hits)
    row = np.searchsorted(offsets, starts, side="right") - 1
    inside = (starts + len(needle) <= offsets[row + 1]) & (lengths[row] >= 0)
    if exact:
        inside &= (starts == offsets[row]) & (lengths[row] == len(needle))
    rows[row[inside]] = True
    return rows


def _txn_states(log, stream: str, records) -> dict[tuple[int, int], TxnState | None]:
    states = {}
    for record in records:
        place = (record.partition, record.txn_id)
        if record.txn_id and place not in states:
            try:
                states[place] = log.txn_state(stream, record.partition, record.txn_id)
            except StreamLogError:
                states[place] = None
    return states


def record_row(record, states=None) -> dict:
    value = render.show(record.value)
    state = (states or {}).get((record.partition, record.txn_id)) if record.txn_id else None
    txn = ""
    if record.txn_id:
        txn = {TxnState.OPEN: "open", TxnState.ABORTED: "aborted",
               TxnState.COMMITTED: "committed"}.get(state, "unknown")
    return {"partition": record.partition, "offset": record.offset,
            "timestamp_us": record.timestamp_us, "utc": render.utc_text(record.timestamp_us),
            "key": render.key_text(record.key), "key_null": record.key is None,
            "value": value.text, "value_form": value.form, "value_cut": value.cut,
            "headers": [(name, render.key_text(v) if v is not None else "(null)")
                        for name, v in record.headers],
            "txn": txn}


def tail(log, stream: str, positions: dict[int, int], query: Query | None = None):
    """New records since `positions`, and the positions after them: the live tail's
    step. Each partition gives at most its share of TAIL_RECORDS_MAX (the rest waits
    for the next step), read as a page of the browser is, its filters included."""
    query = query or Query(stream)
    share = max(1, TAIL_RECORDS_MAX // max(1, len(positions)))
    deadline = time.monotonic() + SCAN_SECONDS_MAX
    rows, after = [], dict(positions)
    for p, position in positions.items():
        end = log.end_offset(stream, p)
        if end <= position:
            continue
        start = max(position, log.start_offset(stream, p))
        batch, after[p], _, _ = _scan(log, query, p, start, end, share, SCAN_RECORDS_MAX,
                                      deadline)
        states = _txn_states(log, stream, batch)
        rows += [record_row(r, states) for r in batch]
    rows.sort(key=lambda row: (row["timestamp_us"], row["partition"], row["offset"]))
    return rows, after


# -- the overview ----------------------------------------------------------------------

def overview(log, sampler: "Sampler") -> dict:
    info = log.info()
    rates = sampler.rates()
    streams = []
    for name, stream in sorted(info["streams"].items(),
                               key=lambda item: (item[0].startswith("__"), item[0])):
        rows = []
        for part in stream["partitions"]:
            number = part["partition"]
            verified = part.get("verified") or {}
            try:
                open_txns = len(log.open_transactions(name, number))
            except StreamLogError:
                open_txns = None
            rows.append({
                **part, "records": part["end_offset"] - part["start_offset"],
                "rate": rates.get((name, number)), "open_txns": open_txns,
                "min_time": render.utc_text(part["min_timestamp_us"]),
                "max_time": render.utc_text(part["max_timestamp_us"]),
                "verified_result": verified.get("result"),
                "verified_at": render.utc_text(verified.get("verified_at_us")),
                "verified_findings": len(verified.get("findings") or ()),
                "size": render.size_text(part["bytes"]),
                "holds_shown": sorted((part.get("holds") or {}).items())})
        streams.append({
            "name": name, "internal": name.startswith("__"), "partitions": rows,
            "records": sum(r["records"] for r in rows),
            "bytes": sum(r["bytes"] for r in rows),
            "size": render.size_text(sum(r["bytes"] for r in rows)),
            "segments": sum(r["segments"] for r in rows),
            "rate": sum(r["rate"] or 0 for r in rows),
            "open_txns": sum(r["open_txns"] or 0 for r in rows)})
    return {"log_path": info["path"], "remote": info.get("remote"),
            "restored": info.get("restored"), "streams": streams}


# -- consumer groups -------------------------------------------------------------------

def groups(snapshot: dict | None, log) -> list[dict]:
    """The groups of a daemon.group_snapshot (None: no Kafka listener), each with its
    member count and total lag."""
    out = []
    for name, group in sorted((snapshot or {}).items()):
        rows = group_offsets(log, group["offsets"])
        out.append({"name": name, "state": group["state"], "members": len(group["members"]),
                    "lag": sum(r["lag"] for r in rows if r["lag"] is not None),
                    "partitions": len(rows)})
    return out


def group_offsets(log, committed) -> list[dict]:
    """[[topic, partition, offset, metadata]] with each partition's end and lag."""
    rows = []
    for topic, partition, offset, metadata in committed:
        try:
            end = log.end_offset(topic, partition)
        except StreamLogError:
            end = None
        rows.append({"topic": topic, "partition": partition, "committed": offset,
                     "metadata": metadata or "", "end": end,
                     "lag": None if end is None or offset < 0 else max(0, end - offset)})
    return rows


def group(snapshot: dict | None, log, sampler: "Sampler", name: str) -> dict | None:
    found = (snapshot or {}).get(name)
    if found is None:
        return None
    rows = group_offsets(log, found["offsets"])
    history = sampler.lag_history(name)
    return {"name": name, "state": found["state"], "members": found["members"],
            "offsets": rows, "lag": sum(r["lag"] for r in rows if r["lag"] is not None),
            "history": history, "line": render.sparkline(history),
            "history_max": max((v for _, v in history), default=0)}


# -- operators -------------------------------------------------------------------------

def operators(log) -> dict:
    """Operator jobs found through their durable holds (operators/holds.py names them
    operator.STREAM.P.DIGEST after their output partition), each with the last position
    note of its output (its eventual checkpoint: the input it has covered); and the
    log's own recovery report of its last open, per partition."""
    from ..operators.alignment import last_note
    info = log.info()
    jobs, recovery = {}, []
    for name, stream in sorted(info["streams"].items()):
        for part in stream["partitions"]:
            for hold, held in sorted((part.get("holds") or {}).items()):
                if hold.startswith("operator."):
                    jobs.setdefault(hold, []).append(
                        {"stream": name, "partition": part["partition"],
                         "offset": held.get("offset") if isinstance(held, dict) else held})
            report = dict(part.get("recovery") or {})
            report.update(stream=name, partition=part["partition"])
            recovery.append(report)
    shown = []
    for hold, places in sorted(jobs.items()):
        _, _, rest = hold.partition(".")
        out_stream, _, rest = rest.rpartition(".")
        out_stream, _, out_partition = out_stream.rpartition(".")
        note = None
        try:
            if out_stream in info["streams"]:
                note = last_note(log, out_stream, int(out_partition))
        except (StreamLogError, ValueError):
            note = None
        shown.append({"name": hold, "output": f"{out_stream}/{out_partition}",
                      "holds": places,
                      "note": None if note is None else {
                          "output_offset": note.output_offset, "input": note.input_key,
                          "input_next": note.input_next, "origin": note.origin}})
    return {"jobs": shown, "recovery": recovery, "restored": info.get("restored")}


# -- the sampler: append rates and group lag over time ---------------------------------

class Sampler:
    """Every SAMPLE_S seconds (its owner calls `sample` on the thread pool): each
    partition's end offset, for append rates, and each group's total lag, for its chart.
    Keeps HISTORY_SAMPLES samples; readers on any thread."""

    def __init__(self, clock=time.monotonic, wall=time.time) -> None:
        self._clock, self._wall = clock, wall
        self._ends: collections.deque = collections.deque(maxlen=HISTORY_SAMPLES)
        self._lags: dict[str, collections.deque] = {}
        self._lock = threading.Lock()

    def sample(self, log, snapshot: dict | None = None) -> None:
        """Take a sample: `snapshot` is daemon.group_snapshot's (None: no groups)."""
        now = self._clock()
        ends = {}
        for stream in log.streams():
            try:
                for p in range(log.partition_count(stream)):
                    ends[(stream, p)] = log.end_offset(stream, p)
            except StreamLogError:
                continue  # deleted meanwhile
        lags = {}
        for name, group in (snapshot or {}).items():
            total = 0
            for topic, p, offset, _ in group["offsets"]:
                end = ends.get((topic, p))
                if end is not None and offset >= 0:
                    total += max(0, end - offset)
            lags[name] = total
        with self._lock:
            self._ends.append((now, ends))
            wall = self._wall()
            for name, total in lags.items():
                self._lags.setdefault(name, collections.deque(maxlen=HISTORY_SAMPLES)).append(
                    (wall, total))
            for name in list(self._lags):
                if name not in lags:
                    del self._lags[name]

    def rates(self) -> dict[tuple[str, int], float]:
        """Records per second appended to each partition over the last RATE_WINDOW_S
        (the two samples furthest apart within it)."""
        with self._lock:
            if len(self._ends) < 2:
                return {}
            t1, last = self._ends[-1]
            first = next(((t, ends) for t, ends in self._ends if t1 - t <= RATE_WINDOW_S
                          and t < t1), None)
        if first is None:
            return {}
        t0, ends0 = first
        # A partition made since that sample started at offset 0 (a new stream's, or one
        # that widened): all it holds came within the window.
        return {place: max(0, end - ends0.get(place, 0)) / (t1 - t0)
                for place, end in last.items()}

    def lag_history(self, name: str) -> list[tuple[float, int]]:
        with self._lock:
            return list(self._lags.get(name, ()))
