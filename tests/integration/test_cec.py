"""The windowed aggregate and continuous eventual checkpointing (DESIGN 8), in-process on
real files. Crashes here are simulated by giving recovery a prefix of a failure-free
output log (what a crash under fsync=always leaves); tests/sim/test_cec_crash.py kills
real processes."""

from __future__ import annotations

import random
import struct

import pytest

import streamlog
from streamlog.operators.aggregate import AggregateOperator, WindowSpec
from streamlog.operators.aggregate_records import decode_window_record
from streamlog.operators.cec_policy import CECPolicy
from streamlog.operators.checkpoint_policy import CheckpointPolicy
from streamlog.operators.checkpoint_store import CheckpointStore
from streamlog.operators.checkpoint_value import Checkpoint
from streamlog.operators.read_backwards import iter_batches_backwards
from streamlog.errors import CorruptionError, InvalidArgument
from streamlog.operators.runtime import OperatorRuntime
from streamlog.records import RecordKind

COUNT = WindowSpec.count(7)
TIME = WindowSpec.time(20_000)


def tight(window: WindowSpec, **budget) -> CECPolicy:
    """Targets low enough that G_CHECKs are written for this input: time windows close
    together at each window end, so their extent stays short without any G_CHECK."""
    if window.kind == "time":
        return CECPolicy(u_target=40, **budget)
    return CECPolicy(q_target=60, u_target=300, **budget)


def make_input(path, count: int, *, seed: int = 7, keys_max: int = 40) -> streamlog.Log:
    """Skewed keys (Pareto: a few hot keys, a long tail), runs of equal timestamps,
    some records out of order (late for time windows), negative and positive values."""
    rng = random.Random(seed)
    keys = [b"k%d" % (int(rng.paretovariate(1.1)) % keys_max) for _ in range(count)]
    values = [struct.pack("<q", rng.randint(-50, 1000)) + b"." * rng.randint(0, 40)
              for _ in range(count)]
    stamps = [1_000_000 + (i // 6) * 1500 - (rng.randint(0, 30_000) if rng.random() < 0.05 else 0)
              for i in range(count)]
    log = streamlog.open_log(path, fsync="never")
    log.create_stream("in")
    log.append_batch_sync("in", values, keys=keys, timestamps_us=stamps)
    return log


def reference(input_log, window: WindowSpec) -> list[tuple]:
    """The results, computed the slow and obvious way: (key, timestamp, fields...)."""
    out, open_, hwm = [], {}, None
    for r in input_log.reader("in", 0):
        value = struct.unpack_from("<q", r.value)[0]
        hwm = r.timestamp_us if hwm is None else max(hwm, r.timestamp_us)
        if window.kind == "time":
            for end, key in sorted((w["end"], k) for k, w in open_.items() if w["end"] <= hwm):
                w = open_.pop(key)
                out.append(_result(key, r, hwm, len(open_), w))
            start = r.timestamp_us - r.timestamp_us % window.size
            if start + window.size <= hwm:
                continue
            bounds = (start, start + window.size)
        else:
            bounds = None
        w = open_.setdefault(r.key, {"first": r.offset, "start": r.timestamp_us, "values": []})
        if bounds:
            w["start"], w["end"] = bounds
        else:
            w["end"] = r.timestamp_us
        w["values"].append(value)
        w["last"] = r.offset
        if window.kind == "count" and len(w["values"]) == window.size:
            del open_[r.key]
            out.append(_result(r.key, r, hwm, len(open_), w))
    return out


def _result(key, record, hwm, n_open, w) -> tuple:
    values = w["values"]
    return (key, record.timestamp_us, record.offset, n_open, hwm, w["first"], w["last"],
            w["start"], w["end"], len(values), sum(values), min(values), max(values),
            sum(values) / len(values))


def results(output_log) -> list[tuple]:
    return [(r.key, r.timestamp_us, *decode_window_record(r.value))
            for r in output_log.reader("out", 0)]


def run(input_log, output_path, window, *, mode="none", cec=None, chunk_records=64,
        store=None, to_offset=None, output_log=None, clock=None, **log_options):
    """Run (recovering first) to the input end or `to_offset`; returns (log, op, runtime)."""
    output_log = output_log or streamlog.open_log(output_path, fsync="never", **log_options)
    operator = AggregateOperator(window, cec=cec if mode == "cec" else None,
                                 **({"clock": clock} if clock else {}))
    runtime = OperatorRuntime(operator, input_log=input_log, input_stream="in",
                              output_log=output_log, output_stream="out", store=store,
                              checkpointing=CheckpointPolicy.operator_driven() if store else None,
                              chunk_records=chunk_records)
    runtime.recover()
    runtime.run(to_offset=to_offset)
    return output_log, operator, runtime


def all_records(output_log) -> list[tuple]:
    return [(r.offset, r.key, r.value, r.timestamp_us, r.kind)
            for r in output_log.reader("out", 0, data_only=False)]


# -- the aggregate --------------------------------------------------------------------

@pytest.mark.parametrize("window", [COUNT, TIME], ids=["count", "time"])
def test_aggregate_matches_the_reference(tmp_path, window):
    input_log = make_input(tmp_path / "in", 3000)
    output_log, operator, _ = run(input_log, tmp_path / "out", window)
    expected = reference(input_log, window)
    assert results(output_log) == expected
    assert operator.stats.results == len(expected) > 100
    if window.kind == "time":
        assert operator.stats.late_records > 0
    output_log.close()
    input_log.close()


@pytest.mark.parametrize("window", [COUNT, TIME], ids=["count", "time"])
def test_plain_crb_and_cec_give_the_same_results(tmp_path, window):
    input_log = make_input(tmp_path / "in", 3000)
    plain, _, _ = run(input_log, tmp_path / "plain", window)
    with CheckpointStore(tmp_path / "ckpt") as store:
        crb, _, _ = run(input_log, tmp_path / "crb", window, mode="crb", store=store)
    cec, operator, _ = run(input_log, tmp_path / "cec", window, mode="cec",
                           cec=tight(window, cp_ms=None))
    assert results(plain) == results(crb) == results(cec)
    assert operator.stats.g_open > 0 and operator.stats.g_check > 0
    for log in (plain, crb, cec, input_log):
        log.close()


def test_control_records_never_reach_a_data_reader(tmp_path):
    input_log = make_input(tmp_path / "in", 3000)
    output_log, operator, _ = run(input_log, tmp_path / "out", COUNT, mode="cec",
                                  cec=CECPolicy(q_target=20, cp_ms=None))
    stats = operator.stats
    data = list(output_log.reader("out", 0))
    assert len(data) == stats.results
    assert {r.kind for r in data} == {RecordKind.DATA}
    arrow_rows = sum(b.num_rows for b in output_log.reader("out", 0).arrow())
    assert arrow_rows == stats.results
    everything = list(output_log.reader("out", 0, data_only=False))
    kinds = [r.kind for r in everything]
    assert kinds.count(RecordKind.G_OPEN) == stats.g_open > 0
    assert kinds.count(RecordKind.G_CHECK) == stats.g_check > 0
    assert len(everything) == stats.results + stats.g_open + stats.g_check
    output_log.close()
    input_log.close()


async def test_control_records_never_reach_an_async_data_reader(tmp_path):
    input_log = make_input(tmp_path / "in", 1000)
    output_log, operator, _ = run(input_log, tmp_path / "out", COUNT, mode="cec",
                                  cec=CECPolicy(q_target=10, cp_ms=None))
    kinds = [r.kind async for r in output_log.reader("out", 0)]
    assert kinds == [RecordKind.DATA] * operator.stats.results
    output_log.close()
    input_log.close()


@pytest.mark.parametrize("window", [COUNT, TIME], ids=["count", "time"])
def test_footprints_carry_n_and_the_window_state(tmp_path, window):
    input_log = make_input(tmp_path / "in", 3000)
    output_log, operator, _ = run(input_log, tmp_path / "out", window, mode="cec",
                                  cec=tight(window, cp_ms=None))
    assert operator.stats.g_check > 0
    inputs = {r.offset: (r.key, struct.unpack_from("<q", r.value)[0])
              for r in input_log.reader("in", 0)}
    open_keys, last_in, checked = set(), -1, 0
    for r in output_log.reader("out", 0, data_only=False):
        rec = decode_window_record(r.value)
        assert rec.in_offset >= last_in  # in input order
        last_in = rec.in_offset
        if r.kind == RecordKind.G_OPEN:
            assert r.key not in open_keys and rec.count == 1
            assert rec.first_offset == rec.last_offset == rec.in_offset
            open_keys.add(r.key)
        elif r.kind == RecordKind.G_CHECK:
            assert r.key in open_keys
        else:
            open_keys.discard(r.key)
        assert rec.n_open == len(open_keys)
        assert abs(rec.avg - rec.sum / rec.count) < 1e-9
        if window.kind == "count":  # the state is exactly the key's records so far
            absorbed = [v for o, (k, v) in inputs.items()
                        if k == r.key and rec.first_offset <= o <= rec.last_offset]
            assert (rec.count, rec.sum, rec.min, rec.max) == (
                len(absorbed), sum(absorbed), min(absorbed), max(absorbed))
            checked += 1
    assert window.kind == "time" or checked > 1000
    output_log.close()
    input_log.close()


# -- the G_CHECK policy -----------------------------------------------------------------

class Probe(AggregateOperator):
    """Records q and u after every chunk's background path."""

    def after_chunk(self, out) -> None:
        super().after_chunk(out)
        self.seen = getattr(self, "seen", [])
        self.seen.append((self.extent_records(), self.replay_records(), len(self.open)))


def _probe_run(tmp_path, input_log, policy, name, clock=None):
    output_log = streamlog.open_log(tmp_path / name, fsync="never")
    operator = Probe(COUNT, cec=policy, **({"clock": clock} if clock else {}))
    runtime = OperatorRuntime(operator, input_log=input_log, input_stream="in",
                              output_log=output_log, output_stream="out", chunk_records=50)
    runtime.recover()
    runtime.run()
    output_log.close()
    return operator


def test_without_targets_only_g_open_is_written(tmp_path):
    input_log = make_input(tmp_path / "in", 3000)
    operator = _probe_run(tmp_path, input_log, CECPolicy(), "out")
    assert operator.stats.g_check == 0
    assert operator.stats.g_open == operator.stats.results + len(operator.open)
    input_log.close()


def test_q_and_u_targets_bound_the_extent_and_the_replay(tmp_path):
    input_log = make_input(tmp_path / "in", 4000)
    free = _probe_run(tmp_path, input_log, CECPolicy(), "free")
    q_bound = _probe_run(tmp_path, input_log, CECPolicy(q_target=60, cp_ms=None), "q")
    u_bound = _probe_run(tmp_path, input_log, CECPolicy(u_target=150, cp_ms=None), "u")
    assert max(q for q, _, _ in free.seen) > 200  # slow (cold) keys stretch the extent
    assert max(u for _, u, _ in free.seen) > 1000
    assert all(q <= 60 for q, _, n in q_bound.seen if n < 60)  # attainable: always met
    assert all(u <= 150 for _, u, _ in u_bound.seen)
    assert q_bound.stats.g_check > 0 and u_bound.stats.g_check > 0
    input_log.close()


def test_g_checks_only_inside_the_ci_part_of_each_cp_period(tmp_path):
    input_log = make_input(tmp_path / "in", 3000)

    class Clock:
        now = 0.0

        def __call__(self):
            return self.now

    outside = Clock()
    outside.now = 0.050  # 50 ms into a 100 ms period, past CI = 5 ms
    quiet = _probe_run(tmp_path, input_log, CECPolicy(q_target=10, ci_ms=5, cp_ms=100),
                       "outside", clock=outside)
    inside = Clock()
    inside.now = 1.001  # 1 ms into a period (and the clock never moves: budget left)
    busy = _probe_run(tmp_path, input_log, CECPolicy(q_target=10, ci_ms=5, cp_ms=100),
                      "inside", clock=inside)
    assert quiet.stats.g_check == 0
    assert busy.stats.g_check > 0
    input_log.close()


def test_policy_and_window_validation():
    with pytest.raises(InvalidArgument):
        WindowSpec("session", 5)
    with pytest.raises(InvalidArgument):
        WindowSpec.count(0)
    with pytest.raises(InvalidArgument):
        CECPolicy(q_target=-1)
    with pytest.raises(InvalidArgument):
        CECPolicy(ci_ms=20, cp_ms=10)


# -- recovery from the output ------------------------------------------------------------

def _prefix_log(path, records, length: int) -> streamlog.Log:
    """An output log holding the first `length` records of `records` at the same
    offsets: what a crash leaves behind under fsync=always."""
    log = streamlog.open_log(path, fsync="never")
    log.create_stream("out")
    for lo in range(0, length, 500):
        chunk = records[lo:min(length, lo + 500)]
        log.append_batch_sync("out", [r[2] for r in chunk], keys=[r[1] for r in chunk],
                              timestamps_us=[r[3] for r in chunk], kinds=[r[4] for r in chunk])
    assert log.end_offset("out") == length
    return log


@pytest.mark.parametrize("window", [COUNT, TIME], ids=["count", "time"])
def test_cec_recovers_exactly_from_any_crash_point(tmp_path, window):
    """With chunk_records=1 and no time budget, G_CHECK decisions are deterministic too:
    the recovered output must equal the failure-free one record for record, control
    records included (a strong check that the loaded eventual checkpoint, N and the
    footprint positions are exactly the pre-crash state). The one exception: a crash in
    the middle of a burst of G_CHECKs loses the rest of the burst, which the recovered
    operator writes after the next input record instead; there only results compare."""
    input_log = make_input(tmp_path / "in", 700)
    policy = tight(window, cp_ms=None)
    full_log, operator, _ = run(input_log, tmp_path / "full", window, mode="cec", cec=policy,
                                chunk_records=1)
    assert operator.stats.g_check > 0
    full = all_records(full_log)
    full_log.close()
    rng = random.Random(11)
    bursts = [n for n in range(len(full)) if _inside_a_g_check_burst(full, n)]
    others = sorted(set(range(len(full))) - set(bursts))
    chosen = rng.sample(others, 10) + rng.sample(bursts, min(4, len(bursts)))
    points = sorted(set(chosen) | {0, 1, len(full) - 1})
    exact = 0
    for trial, length in enumerate(points):
        output_log = _prefix_log(tmp_path / f"crash{trial}", full, length)
        output_log, operator, runtime = run(input_log, None, window, mode="cec", cec=policy,
                                            chunk_records=1, output_log=output_log)
        got = all_records(output_log)
        if _inside_a_g_check_burst(full, length):
            assert _data(got) == _data(full), f"crash after {length} output records"
        else:
            assert got == full, f"crash after {length} output records"
            exact += 1
        assert runtime.report.method == ("none" if length == 0 else "cec")
        output_log.close()
    assert exact >= 10
    input_log.close()


def _inside_a_g_check_burst(records, length: int) -> bool:
    if not 0 < length < len(records):
        return False
    before, after = records[length - 1], records[length]
    return (before[4] == after[4] == RecordKind.G_CHECK and
            decode_window_record(before[2]).in_offset == decode_window_record(after[2]).in_offset)


def _data(records) -> list[tuple]:
    return [r[1:4] for r in records if r[4] == RecordKind.DATA]


@pytest.mark.parametrize("window", [COUNT, TIME], ids=["count", "time"])
def test_cec_recovers_results_with_a_time_budget_and_big_chunks(tmp_path, window):
    input_log = make_input(tmp_path / "in", 2500, seed=3)
    expected = reference(input_log, window)
    policy = tight(window, ci_ms=2, cp_ms=4)
    full_log, operator, _ = run(input_log, tmp_path / "full", window, mode="cec", cec=policy,
                                chunk_records=37)
    assert operator.stats.g_check > 0
    full = all_records(full_log)
    full_log.close()
    rng = random.Random(5)
    for trial, length in enumerate(sorted(rng.sample(range(1, len(full)), 12))):
        output_log = _prefix_log(tmp_path / f"crash{trial}", full, length)
        output_log, _, runtime = run(input_log, None, window, mode="cec", cec=policy,
                                     chunk_records=53, output_log=output_log)
        assert results(output_log) == expected, f"crash after {length} output records"
        output_log.close()
    input_log.close()


@pytest.mark.parametrize("window", [COUNT, TIME], ids=["count", "time"])
def test_crb_recovers_exactly_from_any_crash_point(tmp_path, window):
    input_log = make_input(tmp_path / "in", 2000, seed=5)
    expected = reference(input_log, window)
    # The run that took the checkpoints: its output (results and one position note per
    # chunk) is what a crash cuts.
    checkpoints, full = _crb_checkpoints(tmp_path, input_log, window)
    first_at = checkpoints[0].output_offsets["out/0"]
    rng = random.Random(9)
    for trial, length in enumerate(sorted(rng.sample(range(1, len(full)), 12))):
        output_log = _prefix_log(tmp_path / f"crash{trial}", full, length)
        with CheckpointStore(tmp_path / f"ckpt{trial}", keep=1000) as store:
            for ckpt in checkpoints:  # those a crash at `length` may have left
                if ckpt.output_offsets["out/0"] <= length:
                    store.put(ckpt)
            output_log, _, runtime = run(input_log, None, window, mode="crb", store=store,
                                         output_log=output_log, chunk_records=61)
        assert results(output_log) == expected, f"crash after {length} output records"
        noted = any(r[4] == RecordKind.CHECKPOINT for r in full[:length])
        assert runtime.report.method == ("crb" if length >= first_at else
                                          "full_replay" if noted else "none")
        output_log.close()
    input_log.close()


def _crb_checkpoints(tmp_path, input_log, window) -> list[Checkpoint]:
    output_log = streamlog.open_log(tmp_path / "ckpt-run", fsync="never")
    with CheckpointStore(tmp_path / "ckpt-run.store", keep=1000) as store:
        operator = AggregateOperator(window)
        runtime = OperatorRuntime(operator, input_log=input_log, input_stream="in",
                                  output_log=output_log, output_stream="out", store=store,
                                  checkpointing=CheckpointPolicy.operator_driven(),
                                  chunk_records=40)
        runtime.recover()
        for _ in range(30):
            runtime.run(max_records=67)
            runtime.checkpoint_now()
        found = [store.get(i) for i in store.sequence_ids()]
    records = all_records(output_log)
    output_log.close()
    return found, records


def test_aggregate_state_round_trip_and_damage(tmp_path):
    input_log = make_input(tmp_path / "in", 500)
    _, operator, _ = run(input_log, tmp_path / "out", TIME)
    ckpt = Checkpoint(1, {}, {}, 0)
    operator.checkpoint(ckpt)
    copy = AggregateOperator(TIME)
    copy.reset(ckpt)
    assert copy.hwm == operator.hwm and copy.last_offset == operator.last_offset
    assert {k: vars_of(w) for k, w in copy.open.items()} == {
        k: vars_of(w) for k, w in operator.open.items()}
    assert sorted(copy.heap) == sorted(operator.heap)
    for damaged in (ckpt.state[:-3], ckpt.state + b"x", b"XXXX" + ckpt.state[4:], b""):
        with pytest.raises(CorruptionError):
            copy.reset(Checkpoint(2, {}, {}, 0, damaged))
    input_log.close()


def vars_of(window) -> tuple:
    return tuple(getattr(window, name) for name in window.__slots__[:8])


def test_reconstruction_reads_only_the_extent(tmp_path):
    """Recovery reads the output back to the oldest footprint and no further: the
    records scanned are the extent at the crash, however long the log is."""
    input_log = make_input(tmp_path / "in", 12000, keys_max=30)
    policy = CECPolicy(q_target=80, cp_ms=None)
    scanned = []
    for crash_at in (3000, 12000):
        output_log, operator, _ = run(input_log, tmp_path / f"out{crash_at}", COUNT,
                                      mode="cec", cec=policy, to_offset=crash_at)
        extent, replay = operator.extent_records(), operator.replay_records()
        end = output_log.end_offset("out")
        recovered = AggregateOperator(COUNT, cec=policy)
        runtime = OperatorRuntime(recovered, input_log=input_log, input_stream="in",
                                  output_log=output_log, output_stream="out")
        report = runtime.recover(replay=False)
        assert report.method == "cec"
        # Windows opened by the last input record are forgotten with its output.
        opened_last = report.output_records_truncated
        assert len(operator.open) - opened_last <= report.windows_loaded <= len(operator.open)
        assert report.windows_loaded > 0
        assert report.windows_loaded <= report.output_records_scanned <= extent
        assert report.output_records_scanned < end / 4
        assert crash_at - report.replay_from_offset <= replay
        scanned.append(report.output_records_scanned)
        output_log.close()
    assert scanned[1] < 3 * max(scanned[0], 80)  # 4x the log, not 4x the scan
    input_log.close()


def test_fallback_to_full_replay_when_footprints_are_gone(tmp_path):
    """Output retention removed footprints of windows still open: recovery cannot build
    the eventual checkpoint, replays all input and still adds exactly what is missing."""
    input_log = make_input(tmp_path / "in", 4000, keys_max=200)
    policy = CECPolicy()  # G_OPEN only: old windows' footprints sit far back
    options = {"segment_bytes_max": 4096, "retention_bytes": 8192, "compression": "none"}
    output_log, operator, first = run(input_log, tmp_path / "out", COUNT, mode="cec",
                                      cec=policy, chunk_records=1, **options)
    expected = all_records(output_log)
    output_log.truncate_after("out", 0, len(expected) - 40)
    output_log.apply_retention()
    assert output_log.start_offset("out") == 0  # the operator holds its extent
    assert output_log.release_hold("out", 0, first.hold_name)
    output_log.apply_retention()
    start = output_log.start_offset("out")
    assert start > 0
    output_log, _, runtime = run(input_log, None, COUNT, mode="cec", cec=policy,
                                 chunk_records=1, output_log=output_log)
    assert any("full replay" in note for note in runtime.report.notes)
    assert runtime.report.replay_from_offset == 0
    got = all_records(output_log)
    assert [r for r in got if r[4] == RecordKind.DATA] == [
        r for r in expected if r[0] >= start and r[4] == RecordKind.DATA]
    output_log.close()
    input_log.close()


def test_iter_batches_backwards_covers_every_offset_once(tmp_path):
    log = streamlog.open_log(tmp_path / "log", fsync="never", segment_bytes_max=4096)
    log.create_stream("out")
    sizes = [1, 5, 17, 3, 64, 2, 9]
    for i, size in enumerate(sizes):
        log.append_batch_sync("out", [b"%d" % i * 30] * size, kinds=[int(RecordKind.G_OPEN)] * size)
    seen = []
    for _, columns, count in iter_batches_backwards(log, "out", 0):
        seen.append(list(range(columns.base_offset, columns.base_offset + count)))
    assert [len(b) for b in seen] == list(reversed(sizes))
    flat = [o for batch in seen for o in batch]
    assert sorted(flat) == list(range(sum(sizes)))
    assert [b[0] for b in seen] == sorted((b[0] for b in seen), reverse=True)
    partial = list(iter_batches_backwards(log, "out", 0, end_offset=10))
    assert [(c.base_offset, n) for _, c, n in partial] == [(6, 4), (1, 5), (0, 1)]
    log.close()


def test_cec_recovery_report_is_shown_phase_by_phase(tmp_path):
    input_log = make_input(tmp_path / "in", 3000)
    policy = tight(COUNT, cp_ms=None)
    output_log, operator, _ = run(input_log, tmp_path / "out", COUNT, mode="cec", cec=policy,
                                  to_offset=2000)
    shown = []
    runtime = OperatorRuntime(AggregateOperator(COUNT, cec=policy), input_log=input_log,
                              input_stream="in", output_log=output_log, output_stream="out",
                              progress=lambda r: shown.append((r.current_phase, r.summary())))
    report = runtime.recover()
    phases = [phase for phase, _ in shown]
    distinct = [p for i, p in enumerate(phases) if i == 0 or p != phases[i - 1]]
    assert distinct == ["reconstruct", "truncate", "load", "replay", "done"]
    assert all(phases.count(p) >= 2 for p in distinct[:-1])  # shown at start and end
    assert report.method == "cec" and report.windows_loaded > 0
    # Replay covers the input whose output is in the log (up to the cut), not the
    # input the crashed run never read; that is the catch-up backlog.
    assert 1900 < report.replay_to_offset <= 2000
    assert report.input_records_replayed == report.replay_to_offset - report.replay_from_offset
    assert report.catch_up_records == 3000 - report.replay_to_offset
    assert "extent read=" in shown[1][1] and f"windows={report.windows_loaded:,}" in shown[-1][1]
    assert set(report.as_dict()["phase_seconds"]) == {"reconstruct", "truncate", "load",
                                                      "replay"}
    output_log.close()
    input_log.close()


def test_cec_refuses_skip_mode_instead_of_truncating_silently(tmp_path):
    """CEC's recovery cuts the output after its reconstruction point; 'skip' would be a
    promise it does not keep."""
    with streamlog.open_log(tmp_path / "in", fsync="never") as input_log, \
            streamlog.open_log(tmp_path / "out", fsync="never") as output_log:
        input_log.create_stream("in")
        output_log.create_stream("out")
        with pytest.raises(InvalidArgument, match="skip.*CEC"):
            OperatorRuntime(AggregateOperator(COUNT, cec=CECPolicy()), input_log=input_log,
                            input_stream="in", output_log=output_log, output_stream="out",
                            output_mode="skip")
        OperatorRuntime(AggregateOperator(COUNT), input_log=input_log, input_stream="in",
                        output_log=output_log, output_stream="out", output_mode="skip")


def test_windows_of_one_record_need_no_footprint_and_recover_exactly(tmp_path):
    """A count window of one record opens and closes on the same input record, so no cut
    can leave it open: CEC writes only its R (the paper's fast windows, without the
    G_OPEN that doubled their output), and every crash point still recovers exactly."""
    one = WindowSpec.count(1)
    input_log = make_input(tmp_path / "in", 600)
    plain, _, _ = run(input_log, tmp_path / "plain", one)
    full_log, operator, _ = run(input_log, tmp_path / "full", one, mode="cec",
                                cec=tight(one, cp_ms=None), chunk_records=5)
    full = all_records(full_log)
    assert operator.stats.g_open == operator.stats.g_check == 0
    assert {r[4] for r in full} == {RecordKind.DATA} and len(full) == 600
    assert results(full_log) == results(plain) == reference(input_log, one)
    for trial, length in enumerate((1, 17, 299, 599)):
        output_log = _prefix_log(tmp_path / f"crash{trial}", full, length)
        output_log, _, runtime = run(input_log, None, one, mode="cec",
                                     cec=tight(one, cp_ms=None), output_log=output_log)
        assert all_records(output_log) == full, f"crash after {length} output records"
        assert runtime.report.method == "cec"
        output_log.close()
    for log in (plain, full_log, input_log):
        log.close()
