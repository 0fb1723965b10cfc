"""Tumbling, hopping and sliding windows by count and by time, for user-written window
functions, with CEC (DESIGN 8) and CRB (DESIGN 7), in-process on real files.

Every result is compared with a brute-force reference computed here from the input and
the definitions in window_functions.py's docstring, written the slow and obvious way.
Crashes are simulated by giving recovery a prefix of a failure-free output (what a crash
under fsync=always leaves); tests/sim/test_windows_crash.py kills real processes.
"""

from __future__ import annotations

import collections
import json
import logging
import random
import struct

import pytest

import streamlog
from streamlog.errors import CorruptionError, DataLossError, InvalidArgument
from streamlog.operators.cec_policy import CECPolicy
from streamlog.operators.checkpoint_policy import CheckpointPolicy
from streamlog.operators.checkpoint_store import CheckpointStore
from streamlog.operators.checkpoint_value import Checkpoint
from streamlog.operators.operator_io import OutputTarget
from streamlog.operators.recovery_report import RecoveryReport
from streamlog.operators.runtime import OperatorRuntime
from streamlog.operators.window_cec import FLAG_FINAL, decode_output, read_window_results
from streamlog.operators.window_functions import (CollectOffsets, CountRecords, Hopping, Sliding,
                                                  SumInt64, TopN, Tumbling, Window)
from streamlog.operators.windows import WindowedOperator
from streamlog.records import RecordKind

ASSIGNERS = {
    "tumbling-count": Tumbling(7, by="count"),
    "hopping-count": Hopping(size=8, hop=3, by="count"),
    "sliding-count": Sliding(5, by="count"),
    "tumbling-time": Tumbling(20_000, by="time"),
    "hopping-time": Hopping(size=30_000, hop=10_000, by="time"),
    "sliding-time": Sliding(12_000, by="time"),
}
NAMES = list(ASSIGNERS)
Input = collections.namedtuple("Input", "offset ts key value")


def make_input(path, count: int, *, seed: int = 7, keys_max: int = 25,
               **log_options) -> streamlog.Log:
    """Skewed keys (a few hot, a long tail of slow ones), runs of equal timestamps, some
    records out of order (late for time windows), a record without a key; appended in
    batches of 100."""
    rng = random.Random(seed)
    keys = [b"k%d" % (int(rng.paretovariate(1.1)) % keys_max) for _ in range(count)]
    keys[count // 2] = None
    values = [struct.pack("<q", rng.randint(-50, 1000)) + b"." * rng.randint(0, 20)
              for _ in range(count)]
    stamps = [1_000_000 + (i // 5) * 1500 - (rng.randint(0, 40_000) if rng.random() < 0.06 else 0)
              for i in range(count)]
    log = streamlog.open_log(path, fsync="never", **log_options)
    log.create_stream("in")
    for lo in range(0, count, 100):
        log.append_batch_sync("in", values[lo:lo + 100], keys=keys[lo:lo + 100],
                              timestamps_us=stamps[lo:lo + 100])
    return log


def inputs(input_log) -> list[Input]:
    return [Input(r.offset, r.timestamp_us, r.key or b"", r.value)
            for r in input_log.reader("in", 0)]


# -- the brute-force reference ------------------------------------------------------------------

def reference(records: list[Input], assigner) -> tuple[list[tuple], int]:
    """(results as (input_offset, window_end, key, window_start, count, offsets), late
    records), in the order the operator writes them."""
    hwm, running = [], None
    for r in records:
        running = r.ts if running is None else max(running, r.ts)
        hwm.append(running)
    if assigner.by == "count":
        results, late = _reference_count(records, assigner), 0
    elif isinstance(assigner, Sliding):
        results, late = _reference_sliding_time(records, hwm, assigner.size)
    else:
        results, late = _reference_time(records, hwm, assigner.size, assigner.hop)
    return sorted(results), late


def _reference_count(records, assigner) -> list[tuple]:
    by_key = collections.defaultdict(list)
    for r in records:
        by_key[r.key].append(r)
    out = []
    for key, rs in by_key.items():
        if isinstance(assigner, Sliding):  # the key's last `size` records, every record
            windows = [rs[max(0, n - assigner.size + 1):n + 1] for n in range(len(rs))]
        else:  # records j*hop .. j*hop + size - 1, whole windows only
            windows = [rs[j:j + assigner.size] for j in range(0, len(rs), assigner.hop)]
            windows = [w for w in windows if len(w) == assigner.size]
        out += [(w[-1].offset, w[-1].offset + 1, key, w[0].offset, len(w), [r.offset for r in w])
                for w in windows]
    return out


def _closing_index(hwm, reached) -> int | None:
    """The first input index whose high-water mark satisfies `reached`."""
    return next((j for j, h in enumerate(hwm) if reached(h)), None)


def _reference_time(records, hwm, size, hop) -> tuple[list[tuple], int]:
    contents, late = collections.defaultdict(list), 0
    for i, r in enumerate(records):
        starts = [s for s in range(r.ts - r.ts % hop - size, r.ts + 1, hop) if s <= r.ts < s + size]
        open_ = [s for s in starts if s + size > hwm[i]]
        late += not open_
        for s in open_:
            contents[(r.key, s)].append(r.offset)
    out = []
    for (key, start), offsets in contents.items():
        j = _closing_index(hwm, lambda h: h >= start + size)
        if j is not None:
            out.append((records[j].offset, start + size, key, start, len(offsets), offsets))
    return out, late


def _reference_sliding_time(records, hwm, size) -> tuple[list[tuple], int]:
    accepted, changes, late = collections.defaultdict(list), collections.defaultdict(set), 0
    for i, r in enumerate(records):
        if r.ts + size <= hwm[i]:
            late += 1
            continue
        accepted[r.key].append(i)
        changes[r.key].add(r.ts + size)  # it leaves
        if r.ts >= hwm[i]:
            changes[r.key].add(r.ts)  # it enters (unless that moment has passed)
    out = []
    for key, points in changes.items():
        for point in points:
            j = _closing_index(hwm, lambda h: h > point)
            if j is None:
                continue
            inside = [records[i].offset for i in accepted[key]
                      if i < j and point - size < records[i].ts <= point]
            if inside:
                out.append((records[j].offset, point + 1, key, point - size + 1, len(inside),
                            inside))
    return out, late


# -- running ------------------------------------------------------------------------------

def tight(assigner) -> CECPolicy:
    """Targets low enough that G_CHECKs are written for this input."""
    return CECPolicy(q_target=40, u_target=60, cp_ms=None)


def run(input_log, output_path, assigner, *, function=None, cec=None, chunk_records=64,
        to_offset=None, output_log=None, store=None, codec=None, **runtime_options):
    """Recover, then run to the input end (or `to_offset`). Returns (log, op, runtime)."""
    output_log = output_log or streamlog.open_log(output_path, fsync="never")
    options = {"codec": codec} if codec is not None else {}
    operator = WindowedOperator(assigner, function or CollectOffsets(), cec=cec, **options)
    runtime = OperatorRuntime(operator, input_log=input_log, input_stream="in",
                              output_log=output_log, output_stream="out", store=store,
                              checkpointing=CheckpointPolicy.operator_driven() if store else None,
                              chunk_records=chunk_records, progress=None, **runtime_options)
    runtime.recover()
    runtime.run(to_offset=to_offset)
    return output_log, operator, runtime


def results(output_log, codec=None) -> list[tuple]:
    options = {"codec": codec} if codec is not None else {}
    return [(r.input_offset, r.window_end, r.key, r.window_start, r.count, r.value)
            for r in read_window_results(output_log, "out", **options)]


def all_records(output_log) -> list[tuple]:
    return [(r.offset, r.key, r.value, r.timestamp_us, r.kind)
            for r in output_log.reader("out", 0, data_only=False)]


@pytest.fixture(scope="module")
def shared_input(tmp_path_factory):
    log = make_input(tmp_path_factory.mktemp("windows") / "in", 1500)
    yield log
    log.close()


# -- results ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_results_match_the_reference(shared_input, tmp_path, name):
    assigner = ASSIGNERS[name]
    expected, late = reference(inputs(shared_input), assigner)
    assert len(expected) > 100
    plain, operator, _ = run(shared_input, tmp_path / "plain", assigner)
    assert results(plain) == expected
    assert operator.stats.results == len(expected)
    assert operator.stats.late_records == late
    if assigner.by == "time":
        assert late > 0  # the input has records too old for any open window
    cec, cec_operator, _ = run(shared_input, tmp_path / "cec", assigner, cec=tight(assigner))
    assert results(cec) == expected
    assert cec_operator.stats.g_open > 0 and cec_operator.stats.g_check > 0
    plain.close()
    cec.close()


@pytest.mark.parametrize("name", ["hopping-count", "tumbling-time", "sliding-time"])
def test_sum_and_top_n_match_the_reference(shared_input, tmp_path, name):
    assigner = ASSIGNERS[name]
    records = {r.offset: struct.unpack_from("<q", r.value)[0] for r in inputs(shared_input)}
    expected, _ = reference(inputs(shared_input), assigner)
    sums, _, _ = run(shared_input, tmp_path / "sum", assigner, function=SumInt64())
    assert [r[-1] for r in results(sums)] == [sum(records[o] for o in r[-1]) for r in expected]
    tops, _, _ = run(shared_input, tmp_path / "top", assigner, function=TopN(3),
                     cec=tight(assigner))
    assert [r[-1] for r in results(tops)] == [
        [[records[o], o] for o in sorted(r[-1], key=lambda o: (-records[o], o))[:3]]
        for r in expected]
    sums.close()
    tops.close()


def test_results_that_are_bytes_are_written_as_they_are(shared_input, tmp_path):
    class Joined(CollectOffsets):
        def close(self, state, key, window):
            return b",".join(b"%d" % o for o in state)

    assigner = ASSIGNERS["tumbling-count"]
    expected, _ = reference(inputs(shared_input), assigner)
    log, _, _ = run(shared_input, tmp_path / "out", assigner, function=Joined())
    got = results(log)
    assert [r[-1] for r in got] == [b",".join(b"%d" % o for o in r[-1]) for r in expected]
    assert all(isinstance(r[-1], bytes) for r in got)
    log.close()


# -- footprints ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_footprints_carry_n_the_input_offset_and_the_state(shared_input, tmp_path, name):
    """Replaying the output forward: a unit opens with G_OPEN, closes with a FINAL
    record; every record's N is the number of open units; a footprint of a tumbling or
    hopping window holds exactly the offsets it has absorbed so far."""
    assigner = ASSIGNERS[name]
    log, operator, _ = run(shared_input, tmp_path / "out", assigner, cec=tight(assigner))
    final = {(key, start): offsets for _, _, key, start, _, offsets in results(log)}
    open_units, last_in, kinds = {}, -1, collections.Counter()
    for r in log.reader("out", 0, data_only=False):
        header, payload = decode_output(r.value, r.offset)
        assert header.in_offset >= last_in
        last_in = header.in_offset
        unit = (r.key, header.unit_id)
        kinds[r.kind] += 1
        if r.kind == RecordKind.G_OPEN:
            assert unit not in open_units
            open_units[unit] = header
        elif r.kind == RecordKind.G_CHECK and not header.flags & FLAG_FINAL:
            assert unit in open_units
        if header.flags & FLAG_FINAL:
            assert open_units.pop(unit, None) is not None
        assert header.n_open == len(open_units), f"output offset {r.offset}"
        if r.kind != RecordKind.DATA and not isinstance(assigner, Sliding) and (
                (r.key, header.window_start) in final):
            state = operator.codec.decode(payload)
            window = final[(r.key, header.window_start)]
            assert state == window[:len(state)] and state[-1] <= header.in_offset
    assert kinds[RecordKind.G_OPEN] == operator.stats.g_open > 0
    assert kinds[RecordKind.G_CHECK] == operator.stats.g_check + operator.stats.tombstones
    assert operator.stats.g_check > 0
    assert len(open_units) == operator.open_units()
    log.close()


def test_without_targets_only_g_open_is_written_and_q_u_bound_the_extent(shared_input, tmp_path):
    assigner = ASSIGNERS["tumbling-count"]
    free, free_op, _ = run(shared_input, tmp_path / "free", assigner, cec=CECPolicy())
    assert free_op.stats.g_check == 0
    assert free_op.stats.g_open == free_op.stats.results + free_op.open_units()

    class Probe(WindowedOperator):
        def after_chunk(self, out):
            super().after_chunk(out)
            self.seen = getattr(self, "seen", []) + [(self.extent_records(),
                                                      self.replay_records())]

    seen = {}
    for name, policy in (("free", CECPolicy()), ("q", CECPolicy(q_target=30, cp_ms=None)),
                         ("u", CECPolicy(u_target=100, cp_ms=None))):
        output_log = streamlog.open_log(tmp_path / f"probe-{name}", fsync="never")
        operator = Probe(assigner, CountRecords(), cec=policy)
        runtime = OperatorRuntime(operator, input_log=shared_input, input_stream="in",
                                  output_log=output_log, output_stream="out",
                                  chunk_records=20, progress=None)
        runtime.recover()
        runtime.run()
        seen[name] = operator.seen
        output_log.close()
    assert max(q for q, _ in seen["free"]) > 100 and max(u for _, u in seen["free"]) > 300
    assert all(q <= 30 for q, _ in seen["q"])
    assert all(u <= 100 for _, u in seen["u"])
    free.close()


# -- user state and codecs -------------------------------------------------------------------------

class Histogram:
    """A user-written function with a dict state: values per bucket, plus the newest
    offsets (a list); the result is the dict."""

    def open(self, key, window):
        return {"buckets": {}, "newest": [], "key": key}

    def absorb(self, state, record):
        bucket = struct.unpack_from("<q", record.value)[0] // 100
        state["buckets"][bucket] = state["buckets"].get(bucket, 0) + 1
        state["newest"] = (state["newest"] + [record.offset])[-3:]
        return state

    def close(self, state, key, window):
        assert state["key"] == key
        return {"buckets": state["buckets"], "newest": state["newest"],
                "span": [window.start, window.end]}


class JsonCodec:
    """A user's codec: JSON text (dict keys become strings, bytes become hex)."""

    def __init__(self) -> None:
        self.encoded = self.decoded = 0

    def encode(self, state) -> bytes:
        self.encoded += 1
        return json.dumps(state, default=lambda b: {"hex": b.hex()}, sort_keys=True).encode()

    def decode(self, data: bytes):
        self.decoded += 1
        state = json.loads(data)
        if isinstance(state, dict) and "buckets" in state:
            state["buckets"] = {int(k): v for k, v in state["buckets"].items()}
            if isinstance(state.get("key"), dict):
                state["key"] = bytes.fromhex(state["key"]["hex"])
        return state


@pytest.mark.parametrize("codec", ["default", "json"])
def test_user_state_round_trips_through_footprints(shared_input, tmp_path, codec):
    assigner = ASSIGNERS["hopping-time"]
    policy = tight(assigner)
    options = {"codec": JsonCodec()} if codec == "json" else {}
    full, operator, _ = run(shared_input, tmp_path / "full", assigner, function=Histogram(),
                            cec=policy, **options)
    expected = results(full, **options)
    assert len(expected) > 50 and expected[0][-1]["buckets"]
    footprints = [(r, decode_output(r.value, r.offset)) for r in
                  full.reader("out", 0, data_only=False) if r.kind != RecordKind.DATA]
    state = operator.codec.decode(footprints[-1][1][1])
    assert set(state) == {"buckets", "newest", "key"} and state["key"] == footprints[-1][0].key
    records = all_records(full)
    full.close()
    rng = random.Random(3)
    for trial, length in enumerate(sorted(rng.sample(range(1, len(records)), 6))):
        crashed = _prefix_log(tmp_path / f"crash{trial}", records, length)
        codec_used = JsonCodec() if codec == "json" else None
        log, recovered, runtime = run(shared_input, None, assigner, function=Histogram(),
                                      cec=policy, output_log=crashed, codec=codec_used)
        assert results(log, **options) == expected, f"crash after {length} output records"
        assert runtime.report.windows_loaded > 0 or recovered.stats.results == 0
        if codec_used is not None:
            assert codec_used.decoded >= runtime.report.windows_loaded > 0
        log.close()


def test_state_the_codec_cannot_serialise_is_refused(shared_input, tmp_path):
    class SetState(CountRecords):
        def open(self, key, window):
            return set()

        def absorb(self, state, record):
            state.add(record.offset)
            return state

    with pytest.raises(InvalidArgument, match="set"):
        run(shared_input, tmp_path / "out", ASSIGNERS["tumbling-count"], function=SetState(),
            cec=CECPolicy())


# -- recovery from the output ---------------------------------------------------------------------

def _prefix_log(path, records, length: int) -> streamlog.Log:
    """An output log holding the first `length` records of `records` at the same
    offsets: what a crash leaves behind under fsync=always."""
    log = streamlog.open_log(path, fsync="never")
    log.create_stream("out")
    for lo in range(0, length, 300):
        chunk = records[lo:min(length, lo + 300)]
        log.append_batch_sync("out", [r[2] for r in chunk], keys=[r[1] for r in chunk],
                              timestamps_us=[r[3] for r in chunk], kinds=[r[4] for r in chunk])
    assert log.end_offset("out") == length
    return log


def _inside_a_g_check_burst(records, length: int) -> bool:
    if not 0 < length < len(records):
        return False
    before, after = records[length - 1], records[length]
    return (before[4] == after[4] == RecordKind.G_CHECK and
            decode_output(before[2], 0)[0].in_offset == decode_output(after[2], 0)[0].in_offset)


@pytest.fixture(scope="module")
def small_input(tmp_path_factory):
    log = make_input(tmp_path_factory.mktemp("windows-small") / "in", 400, seed=11,
                     keys_max=12)
    yield log
    log.close()


@pytest.mark.parametrize("name", NAMES)
def test_cec_recovers_exactly_from_any_crash_point(small_input, tmp_path, name):
    """With chunk_records=1 and no time budget the G_CHECK decisions are deterministic
    too, so the recovered output must equal the failure-free one record for record,
    footprints included; a crash inside a burst of G_CHECKs loses the rest of the burst,
    which the recovered operator writes after the next record: there only results
    compare."""
    assigner = ASSIGNERS[name]
    policy = CECPolicy(q_target=15, u_target=25, cp_ms=None)
    full_log, operator, _ = run(small_input, tmp_path / "full", assigner, cec=policy,
                                chunk_records=1)
    assert operator.stats.g_check > 0
    full = all_records(full_log)
    expected = results(full_log)
    full_log.close()
    rng = random.Random(name)
    bursts = [n for n in range(len(full)) if _inside_a_g_check_burst(full, n)]
    others = sorted(set(range(len(full))) - set(bursts))
    points = sorted(set(rng.sample(others, 7) + rng.sample(bursts, min(2, len(bursts))) +
                        [0, 1, len(full) - 1]))
    exact = 0
    for trial, length in enumerate(points):
        crashed = _prefix_log(tmp_path / f"crash{trial}", full, length)
        log, _, runtime = run(small_input, None, assigner, cec=policy, chunk_records=1,
                              output_log=crashed)
        if _inside_a_g_check_burst(full, length):
            assert results(log) == expected, f"crash after {length} output records"
        else:
            assert all_records(log) == full, f"crash after {length} output records"
            exact += 1
        assert runtime.report.method == ("none" if length == 0 else "cec")
        log.close()
    assert exact >= 8


@pytest.mark.parametrize("name", NAMES)
def test_cec_recovers_the_results_with_a_time_budget_and_big_chunks(shared_input, tmp_path,
                                                                    name):
    """A crash after the run reached a random input offset, then cuts of its output at
    random points, each recovered by a fresh operator with other chunk sizes; twice in a
    row for one of them (a crash during the recovered run)."""
    assigner = ASSIGNERS[name]
    expected, _ = reference(inputs(shared_input), assigner)
    policy = CECPolicy(q_target=40, u_target=80, ci_ms=2, cp_ms=4)
    rng = random.Random(f"big-{name}")
    crash_at = rng.randrange(600, 1400)
    partial, _, _ = run(shared_input, tmp_path / "partial", assigner, cec=policy,
                        chunk_records=37, to_offset=crash_at)
    records = all_records(partial)
    partial.close()
    for trial, length in enumerate(sorted(rng.sample(range(1, len(records) + 1), 5))):
        crashed = _prefix_log(tmp_path / f"crash{trial}", records, length)
        if trial == 0:  # crash again part way through the recovered run
            crashed, _, _ = run(shared_input, None, assigner, cec=policy, chunk_records=11,
                                output_log=crashed, to_offset=crash_at + 100)
            again = all_records(crashed)
            crashed.close()
            crashed = _prefix_log(tmp_path / "again", again, rng.randrange(length, len(again)))
        log, _, _ = run(shared_input, None, assigner, cec=policy, chunk_records=53,
                        output_log=crashed)
        assert results(log) == expected, (
            f"crash at input {crash_at}, after {length} output records")
        log.close()


def test_recovery_reads_only_the_extent_and_reports_it(tmp_path):
    input_log = make_input(tmp_path / "in", 6000, keys_max=20)
    assigner = Hopping(size=12, hop=4, by="count")
    policy = CECPolicy(q_target=50, cp_ms=None)
    log, operator, _ = run(input_log, tmp_path / "out", assigner, cec=policy, to_offset=5000)
    end = log.end_offset("out")
    runtime = OperatorRuntime(WindowedOperator(assigner, CollectOffsets(), cec=policy),
                              input_log=input_log, input_stream="in", output_log=log,
                              output_stream="out", progress=None)
    report = runtime.recover()
    assert report.method == "cec"
    assert 0 < report.windows_loaded <= operator.open_units()
    assert report.windows_loaded <= report.output_records_scanned < end / 10
    assert report.replay_from_offset >= 5000 - operator.replay_records() - 1
    assert report.input_records_replayed == 5000 - report.replay_from_offset
    assert report.state_bytes_loaded > 0
    runtime.run()
    expected, _ = reference(inputs(input_log), assigner)
    assert results(log) == expected
    log.close()
    input_log.close()


def test_full_replay_when_output_retention_removed_footprints(tmp_path):
    """Footprints of windows still open are gone: recovery cannot build the eventual
    checkpoint, replays all input, still adds exactly what is missing, and writes
    G_CHECKs for every open window so that the next recovery has them."""
    input_log = make_input(tmp_path / "in", 3000, keys_max=150)
    assigner = Tumbling(40, by="count")
    options = {"segment_bytes_max": 4096, "retention_bytes": 8192, "compression": "none"}
    output_log = streamlog.open_log(tmp_path / "out", fsync="never", **options)
    output_log, _, _ = run(input_log, None, assigner, cec=CECPolicy(), output_log=output_log,
                           chunk_records=5, to_offset=2000, hold_input=False)
    output_log.apply_retention()
    start = output_log.start_offset("out")
    assert start > 0
    before = {r.offset for r in read_window_results(output_log, "out")}
    output_log, operator, runtime = run(input_log, None, assigner, cec=CECPolicy(),
                                        output_log=output_log, hold_input=False)
    assert any("full replay" in note for note in runtime.report.notes)
    assert runtime.report.replay_from_offset == 0
    expected, _ = reference(inputs(input_log), assigner)
    got = list(read_window_results(output_log, "out"))
    assert {r.offset for r in got} >= before
    assert [(r.input_offset, r.window_end, r.key, r.window_start, r.count, r.value)
            for r in got] == [e for e in expected if e[0] >= got[0].input_offset]
    # No Q/U targets: every G_CHECK is one of those written after the full replay.
    anchors = [decode_output(r.value, 0)[0] for r in output_log.reader("out", 0, data_only=False)
               if r.kind == RecordKind.G_CHECK]
    assert len(anchors) == operator.stats.g_check > 10
    assert len({h.in_offset for h in anchors}) == 1 and anchors[0].in_offset < 2000
    output_log.close()
    input_log.close()


def test_recovery_refuses_when_the_input_it_needs_is_gone(shared_input, tmp_path, caplog):
    assigner = ASSIGNERS["hopping-time"]
    log, _, _ = run(shared_input, tmp_path / "out", assigner, cec=CECPolicy(), to_offset=900)
    target = OutputTarget(log, "out", 0)
    dry = RecoveryReport()
    needed = WindowedOperator(assigner, CollectOffsets(), cec=CECPolicy()).recover_from_output(
        target, 0, dry, dry_run=True)
    assert 0 < needed < 900
    end = log.end_offset("out")
    with pytest.raises(DataLossError) as caught:
        WindowedOperator(assigner, CollectOffsets(), cec=CECPolicy()).recover_from_output(
            target, needed + 5, RecoveryReport(), source="in/0")
    assert (caught.value.source, caught.value.first_lost, caught.value.last_lost) == (
        "in/0", needed, needed + 4)
    assert log.end_offset("out") == end  # nothing was cut before refusing
    report = RecoveryReport()
    with caplog.at_level(logging.WARNING, logger="streamlog.operators"):
        start = WindowedOperator(assigner, CollectOffsets(), cec=CECPolicy()).recover_from_output(
            target, needed + 5, report, fail_on_data_loss=False)
    assert start == needed + 5
    assert report.input_offsets_lost == (needed, needed + 4)
    assert any(f"{needed}..{needed + 4}" in note for note in report.notes)
    assert f"{needed}..{needed + 4}" in caplog.text
    log.close()


# -- CRB ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["hopping-count", "sliding-count", "hopping-time",
                                  "sliding-time"])
def test_crb_checkpoint_round_trip_and_recovery(shared_input, tmp_path, name):
    assigner = ASSIGNERS[name]
    expected, _ = reference(inputs(shared_input), assigner)
    with CheckpointStore(tmp_path / "ckpt") as store:
        log = streamlog.open_log(tmp_path / "out", fsync="never")
        operator = WindowedOperator(assigner, CollectOffsets())
        runtime = OperatorRuntime(operator, input_log=shared_input, input_stream="in",
                                  output_log=log, output_stream="out", store=store,
                                  checkpointing=CheckpointPolicy.operator_driven(),
                                  chunk_records=30, progress=None)
        runtime.recover()
        runtime.run(max_records=700)
        runtime.checkpoint_now()
        saved = _summary(operator)
        runtime.run(max_records=222)  # then "crash": the output runs past the checkpoint
        runtime.close()
        ckpt = store.latest()
        copy = WindowedOperator(assigner, CollectOffsets())
        copy.reset(ckpt)
        assert _summary(copy) == saved and saved[0] == 699 and saved[2]
        log, _, recovered = run(shared_input, None, assigner, output_log=log, store=store)
        assert recovered.report.method == "crb"
        assert results(log) == expected
        log.close()
    for damaged in (ckpt.state[:-3], b"XXXX" + ckpt.state[4:], b""):
        with pytest.raises(CorruptionError):
            copy.reset(Checkpoint(2, {}, {}, 0, damaged))


def _summary(operator) -> tuple:
    units = sorted((k, u.start, u.end, u.count, operator._encode_unit(u))
                   for k, u in operator.units.items())
    return operator.last_offset, operator.hwm, units, sorted(operator.heap)


# -- arguments ------------------------------------------------------------------------------------

def test_bad_arguments_are_refused_with_clear_errors():
    cases = [
        (lambda: Tumbling(0, by="count"), "size"),
        (lambda: Tumbling(5, by="days"), "by must be"),
        (lambda: Tumbling(True, by="count"), "size"),
        (lambda: Hopping(size=10, hop=11, by="time"), "hop"),
        (lambda: Hopping(size=10, hop=0, by="count"), "hop"),
        (lambda: Hopping(size=1 << 20, hop=1, by="time"), "more than"),
        (lambda: Sliding(1 << 20, by="count"), "size"),
        (lambda: Sliding(-5, by="time"), "size"),
        (lambda: WindowedOperator("tumbling", CountRecords()), "assigner"),
        (lambda: WindowedOperator(Sliding(3, by="count"), object()), "open"),
        (lambda: WindowedOperator(Sliding(3, by="count"), CountRecords(), codec=object()),
         "codec"),
        (lambda: WindowedOperator(Sliding(3, by="count"), CountRecords(), cec={"q": 1}), "cec"),
        (lambda: TopN(0), "n must"),
        (lambda: SumInt64(-1), "field_offset"),
        (lambda: CollectOffsets(0), "records_max"),
    ]
    for build, message in cases:
        with pytest.raises(InvalidArgument, match=message):
            build()
    with pytest.raises(TypeError):
        Hopping(10, 5, by="time")  # two ints: keyword-only, so they cannot be swapped
    assert Window(3, None).end is None


def test_values_without_the_field_are_refused(tmp_path):
    with streamlog.open_log(tmp_path / "in", fsync="never") as input_log:
        input_log.create_stream("in")
        input_log.append_batch_sync("in", [b"short"], keys=[b"k"], timestamps_us=[1])
        with streamlog.open_log(tmp_path / "out", fsync="never") as output_log:
            with pytest.raises(InvalidArgument, match="int64 at byte 0"):
                run(input_log, None, Tumbling(2, by="count"), function=SumInt64(),
                    output_log=output_log)


def test_runtime_refuses_when_input_retention_removed_what_the_windows_need(tmp_path):
    """Through the runtime: input retention removed offsets that the windows open at the
    cut still need; recovery refuses (DataLossError naming the input and the offsets)
    and changes nothing, unless fail_on_data_loss=False."""
    input_log = make_input(tmp_path / "in", 2000, keys_max=40, segment_bytes_max=4096,
                           retention_bytes=16384, compression="none")
    assigner = Tumbling(60, by="count")  # slow windows: their G_OPENs sit far back
    log, operator, _ = run(input_log, tmp_path / "out", assigner, cec=CECPolicy(),
                           hold_input=False)
    needed = operator.required_positions()[0]
    input_log.apply_retention()
    assert input_log.start_offset("in") > needed
    end = log.end_offset("out")
    with pytest.raises(DataLossError) as caught:
        run(input_log, None, assigner, cec=CECPolicy(), output_log=log, hold_input=False)
    assert caught.value.source == "in/0" and caught.value.first_lost <= needed
    assert caught.value.last_lost == input_log.start_offset("in") - 1
    assert log.end_offset("out") == end
    log, _, runtime = run(input_log, None, assigner, cec=CECPolicy(), output_log=log,
                          hold_input=False, fail_on_data_loss=False)
    assert runtime.report.input_offsets_lost == (caught.value.first_lost,
                                                 caught.value.last_lost)
    log.close()
    input_log.close()
