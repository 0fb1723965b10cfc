"""Operators and input retention: output lines up with input by recorded offsets, a
recovery that cannot be exact refuses and names the gap (or, opted in, continues and
says what it lost, keeping published output), retention keeps what an operator still
needs (durable holds), and the recovery report says what it did.

The regressions of the operator issue, each by number: (1) restart without a usable
checkpoint after input retention, (2) CEC with retention inside the replay range, (3)
reconstruction reading far more than the extent, (5) an unmeetable Q, (6) the report.
"""

from __future__ import annotations

import logging
import os
import struct

import pytest

import streamlog
from streamlog.errors import DataLossError, InvalidArgument, StreamLogError
from streamlog.operators.alignment import (Facts, PositionNote, plan_recovery)
from streamlog.operators.aggregate import AggregateOperator, WindowSpec
from streamlog.operators.cec_policy import CECPolicy
from streamlog.operators.checkpoint_policy import CheckpointPolicy
from streamlog.operators.checkpoint_store import CheckpointStore
from streamlog.operators.runtime import OperatorRuntime
from streamlog.records import RecordKind

_SUM = struct.Struct("<qq")
SMALL = {"segment_bytes_max": 4096, "compression": "none"}


class Echo:
    """Stateless: one output per input, its offset and value."""

    stateless = True

    def process_chunk(self, chunk, out) -> None:
        for offset, ts, value in zip(chunk.offsets, chunk.timestamps_us, chunk.values):
            out.emit(struct.pack("<q", offset) + value[:8], None, ts)

    def reset_to_initial_state(self) -> None:
        pass


class Sum:
    """Stateful: the running sum and count of the int64 at the start of each value."""

    def __init__(self) -> None:
        self.reset_to_initial_state()

    def reset_to_initial_state(self) -> None:
        self.total, self.count = 0, 0

    def checkpoint(self, ckpt) -> None:
        ckpt.state = _SUM.pack(self.total, self.count)

    def reset(self, ckpt) -> None:
        self.total, self.count = _SUM.unpack(ckpt.state)

    def process_chunk(self, chunk, out) -> None:
        for ts, value in zip(chunk.timestamps_us, chunk.values):
            self.total += struct.unpack_from("<q", value)[0]
            self.count += 1
            out.emit(_SUM.pack(self.total, self.count), None, ts)


def append_input(log, first: int, count: int) -> None:
    """Input records first..first+count-1: value = the int64 i, padded so that small
    segments hold a few dozen records each (appended 20 at a time: a batch is one
    frame, and a frame never spans segments)."""
    for lo in range(first, first + count, 20):
        rows = range(lo, min(first + count, lo + 20))
        log.append_batch_sync("in", [struct.pack("<q", i) + os.urandom(56) for i in rows],
                              keys=[b"k%d" % (i % 7) for i in rows],
                              timestamps_us=[1_000_000 + i * 1000 for i in rows])


@pytest.fixture
def logs(tmp_path):
    input_log = streamlog.open_log(tmp_path / "in", fsync="never", **SMALL)
    input_log.create_stream("in")
    output_log = streamlog.open_log(tmp_path / "out", fsync="never")
    yield input_log, output_log
    output_log.close()
    input_log.close()


def crash_after_checkpoint(input_log, output_log, store, at: int, then: int) -> None:
    """Run Sum to input `at`, checkpoint, run `then` more records, and stop (a crash)."""
    first = runtime(Sum(), input_log, output_log, store=store,
                    checkpointing=CheckpointPolicy.operator_driven())
    first.recover()
    first.run(max_records=at)
    first.checkpoint_now()
    first.run(max_records=then)
    first.close()


def crash_after(operator, input_log, output_log, records: int) -> OperatorRuntime:
    """Run to input `records` and stop there (a crash: nothing else happens)."""
    first = runtime(operator, input_log, output_log)
    first.recover()
    first.run(max_records=records)
    return first


def runtime(operator, input_log, output_log, **options) -> OperatorRuntime:
    return OperatorRuntime(operator, input_log=input_log, input_stream="in",
                           output_log=output_log, output_stream="out", chunk_records=100,
                           **options)


def data(output_log) -> list[bytes]:
    return [r.value for r in output_log.reader("out", 0)]


def cut_input(tmp_path, input_log, below: int):
    """Retention removes the input segments wholly below `below`, as if the operator
    had not held its input (its durable hold is released first). Returns the input
    log, reopened."""
    path = input_log.path
    for name in input_log.holds("in", 0):
        input_log.release_hold("in", 0, name)
    input_log.close()
    with streamlog.open_log(path, fsync="never", retention_bytes=1, **SMALL) as trimming:
        held = trimming.reader("in", 0, from_offset=below)
        trimming.apply_retention()
        held.close()
    return streamlog.open_log(path, fsync="never", **SMALL)


# -- (1) restart without a usable checkpoint after input retention -------------------

def test_stateless_operator_resumes_exactly_after_input_retention(tmp_path, logs):
    input_log, output_log = logs
    append_input(input_log, 0, 3000)
    crash_after(Echo(), input_log, output_log, 2000)
    published = data(output_log)
    input_log = cut_input(tmp_path, input_log, 1500)
    start = input_log.start_offset("in")
    assert 1000 < start <= 1500
    append_input(input_log, 3000, 500)
    second = runtime(Echo(), input_log, output_log)
    report = second.recover()
    second.run()
    got = data(output_log)
    assert report.method == "resume" and report.output_records_truncated == 0
    assert got[:2000] == published  # nothing published was deleted or rewritten
    assert [struct.unpack_from("<q", v)[0] for v in got] == list(range(3500))
    input_log.close()


def test_stateful_operator_without_a_checkpoint_refuses_and_names_the_gap(tmp_path, logs):
    input_log, output_log = logs
    append_input(input_log, 0, 3000)
    crash_after(Sum(), input_log, output_log, 2000)
    published = output_log.end_offset("out")
    input_log = cut_input(tmp_path, input_log, 1500)
    start = input_log.start_offset("in")
    with pytest.raises(DataLossError) as refused:
        runtime(Sum(), input_log, output_log).recover()
    assert (refused.value.first_lost, refused.value.last_lost) == (0, start - 1)
    assert f"offsets 0..{start - 1}" in str(refused.value) and "in/0" in str(refused.value)
    assert output_log.end_offset("out") == published  # refusing changed nothing
    input_log.close()


def test_opting_in_to_data_loss_continues_keeps_output_and_warns(tmp_path, logs, caplog):
    input_log, output_log = logs
    append_input(input_log, 0, 3000)
    crash_after(Sum(), input_log, output_log, 2000)
    published = [(r.offset, r.value) for r in output_log.reader("out", 0)]
    input_log = cut_input(tmp_path, input_log, 1500)
    start = input_log.start_offset("in")
    append_input(input_log, 3000, 500)
    second = runtime(Sum(), input_log, output_log, fail_on_data_loss=False)
    with caplog.at_level(logging.WARNING, logger="streamlog.recovery"):
        report = second.recover()
    second.run()
    assert report.method == "data_loss" and report.input_offsets_lost == (0, start - 1)
    assert any(f"offsets 0..{start - 1} are lost" in r.getMessage() for r in caplog.records)
    got = [(r.offset, r.value) for r in output_log.reader("out", 0)]
    assert got[:2000] == published  # published output is kept, offsets and bytes
    # From input 2000 on, the state is that of a fresh start at the input's start.
    expected_total = sum(range(start, 3500))
    assert _SUM.unpack(got[-1][1]) == (expected_total, 3500 - start)
    assert len(got) == 3500
    input_log.close()


def test_a_stale_checkpoint_is_named_in_the_refusal(tmp_path, logs):
    input_log, output_log = logs
    append_input(input_log, 0, 3000)
    with CheckpointStore(tmp_path / "ckpt") as store:
        crash_after_checkpoint(input_log, output_log, store, 600, 1400)
        input_log = cut_input(tmp_path, input_log, 1500)
        with pytest.raises(DataLossError, match=r"checkpoint \(1\) is at input offset 600"):
            runtime(Sum(), input_log, output_log, store=store,
                    checkpointing=CheckpointPolicy.operator_driven()).recover()
    input_log.close()


def test_the_operator_holds_the_input_it_needs_against_retention(tmp_path):
    """The default: the runtime holds its input durably; retention in another Log (as
    a writer process would) deletes only what no recovery needs."""
    path = tmp_path / "in"
    with streamlog.open_log(path, fsync="never", **SMALL) as writer:
        writer.create_stream("in")
        append_input(writer, 0, 3000)
    input_log = streamlog.open_log(path, readonly=True)
    with streamlog.open_log(tmp_path / "out", fsync="never") as output_log, \
            CheckpointStore(tmp_path / "ckpt") as store:
        first = runtime(Sum(), input_log, output_log, store=store,
                        checkpointing=CheckpointPolicy.operator_driven())
        first.recover()
        first.run(max_records=900)
        first.checkpoint_now()
        first.run(max_records=1100)
        assert input_log.holds("in", 0)[first.hold_name]["offset"] == 900
        with streamlog.open_log(path, fsync="never", retention_bytes=1, **SMALL) as writer:
            writer.apply_retention()
            assert 0 < writer.start_offset("in") <= 900  # stopped at the checkpoint
        input_log.refresh()
        second = runtime(Sum(), input_log, output_log, store=store,
                         checkpointing=CheckpointPolicy.operator_driven())
        report = second.recover()
        second.run()
        assert report.method == "crb" and report.replay_from_offset == 900
        values = data(output_log)
        assert _SUM.unpack(values[-1]) == (sum(range(3000)), 3000)
        assert [_SUM.unpack(v)[1] for v in values] == list(range(1, 3001))
        second.release_holds()
        assert input_log.holds("in", 0) == {}
    input_log.close()


# -- durable holds ---------------------------------------------------------------------

def test_durable_holds_outlive_the_process_and_a_damaged_one_holds_everything(tmp_path,
                                                                               caplog):
    path = tmp_path / "log"
    with streamlog.open_log(path, fsync="never", **SMALL) as log:
        log.create_stream("in")
        append_input(log, 0, 2000)
        with streamlog.open_log(path, readonly=True) as reader_process:
            reader_process.hold("in", 0, "consumer-a", 700)  # a read-only open may hold
        assert set(log.holds("in", 0)) == {"consumer-a"}
    with streamlog.open_log(path, fsync="never", retention_bytes=1, **SMALL) as log:
        log.apply_retention()
        start = log.start_offset("in")
        assert 0 < start <= 700
        holds_dir = os.path.join(path, "streams", "in", "0", "holds")
        with open(os.path.join(holds_dir, "broken.json"), "wb") as damaged:
            damaged.write(b"{not json")
        log.release_hold("in", 0, "consumer-a")
        with caplog.at_level(logging.WARNING, logger="streamlog.holds"):
            assert log.apply_retention() == []  # a damaged hold holds everything
        assert any("broken" in r.getMessage() and "damaged" in r.getMessage()
                   for r in caplog.records)
        assert log.holds("in", 0)["broken"]["offset"] == 0
        assert log.info()["streams"]["in"]["partitions"][0]["holds"]["broken"]["offset"] == 0
        assert log.release_hold("in", 0, "broken") and not log.release_hold("in", 0, "broken")
        assert log.apply_retention()
        assert log.start_offset("in") > start
        with pytest.raises(InvalidArgument):
            log.hold("in", 0, "../escape", 1)
        with pytest.raises(InvalidArgument):
            log.hold("in", 0, "ok", -1)


# -- (2) CEC with retention inside the replay range ------------------------------------

def _cec_run(input_log, output_log, *, to_offset=None, **options):
    operator = AggregateOperator(WindowSpec.time(400_000), cec=CECPolicy())  # G_OPEN only
    rt = OperatorRuntime(operator, input_log=input_log, input_stream="in",
                         output_log=output_log, output_stream="out", chunk_records=50,
                         **options)
    rt.recover()
    rt.run(to_offset=to_offset)
    return rt


def test_cec_refuses_when_a_windows_input_is_gone(tmp_path, logs):
    input_log, output_log = logs
    append_input(input_log, 0, 3000)
    _cec_run(input_log, output_log, to_offset=2000)  # windows of 400 records' time
    published = output_log.end_offset("out")
    input_log = cut_input(tmp_path, input_log, 1900)
    start = input_log.start_offset("in")
    assert start > 1600  # inside the open windows' range
    with pytest.raises(DataLossError) as refused:
        _cec_run(input_log, output_log)
    assert refused.value.last_lost == start - 1 and refused.value.first_lost < start
    assert "windows open at the cut" in str(refused.value)
    assert output_log.end_offset("out") == published
    input_log.close()


def test_cec_holds_its_oldest_footprint_so_retention_cannot_break_it(tmp_path):
    path = tmp_path / "in"
    with streamlog.open_log(path, fsync="never", **SMALL) as writer:
        writer.create_stream("in")
        append_input(writer, 0, 3000)
    with streamlog.open_log(tmp_path / "ref", fsync="never") as reference_log:
        with streamlog.open_log(path, readonly=True) as input_log:
            _cec_run(input_log, reference_log, hold_input=False)
        expected = data(reference_log)
    input_log = streamlog.open_log(path, readonly=True)
    with streamlog.open_log(tmp_path / "out", fsync="never") as output_log:
        rt = _cec_run(input_log, output_log, to_offset=2000)
        need_in, need_out = rt.required_positions()
        assert 1600 <= need_in <= 2000 and need_out is not None
        with streamlog.open_log(path, fsync="never", retention_bytes=1, **SMALL) as writer:
            writer.apply_retention()
            assert 1000 < writer.start_offset("in") <= need_in
        input_log.refresh()
        _cec_run(input_log, output_log)
        assert data(output_log) == expected
    input_log.close()


# -- (3) reconstruction reads only what the extent needs --------------------------------

def test_reconstruction_reads_about_the_extent_not_a_fixed_group(tmp_path):
    with streamlog.open_log(tmp_path / "in", fsync="never") as input_log:
        input_log.create_stream("in")
        count = 100_000
        input_log.append_batch_sync(
            "in", [struct.pack("<q", i % 100) for i in range(count)],
            keys=[b"k%d" % (i % 20) for i in range(count)],
            timestamps_us=[1_000_000 + i for i in range(count)])
        with streamlog.open_log(tmp_path / "out", fsync="never") as output_log:
            policy = CECPolicy(q_target=400, cp_ms=None)
            operator = AggregateOperator(WindowSpec.count(5), cec=policy)
            rt = OperatorRuntime(operator, input_log=input_log, input_stream="in",
                                 output_log=output_log, output_stream="out",
                                 chunk_records=500)
            rt.recover()
            rt.run()
            extent = operator.extent_records()
            end = output_log.end_offset("out")
            assert end > 30_000 and extent <= 600
            shown = []
            again = OperatorRuntime(AggregateOperator(WindowSpec.count(5), cec=policy),
                                    input_log=input_log, input_stream="in",
                                    output_log=output_log, output_stream="out",
                                    progress=lambda r: shown.append(r.summary()))
            report = again.recover()
            # The walk doubles its groups from 256 records: at most ~2x the extent plus
            # one batch is read, never a fixed 131k.
            assert report.output_records_scanned <= 4 * extent + 1000
            assert report.output_records_scanned >= extent - 30
            batches_bytes = report.output_bytes_read
            assert batches_bytes < output_log.info()["streams"]["out"]["partitions"][0][
                "bytes"] / 5
            assert any(f"extent read={report.output_records_scanned:,}" in line
                       for line in shown)


# -- (5) knob settings that cannot be met ---------------------------------------------

def test_a_q_below_the_open_windows_is_raised_and_warned(tmp_path, caplog):
    with streamlog.open_log(tmp_path / "in", fsync="never") as input_log, \
            streamlog.open_log(tmp_path / "out", fsync="never") as output_log:
        input_log.create_stream("in")
        count = 20_000
        input_log.append_batch_sync(
            "in", [struct.pack("<q", i) for i in range(count)],
            keys=[b"k%d" % (i % 500) for i in range(count)],
            timestamps_us=[1_000_000 + i for i in range(count)])
        operator = AggregateOperator(WindowSpec.count(1000),
                                     cec=CECPolicy(q_target=10, cp_ms=None))
        rt = OperatorRuntime(operator, input_log=input_log, input_stream="in",
                             output_log=output_log, output_stream="out", chunk_records=500)
        with caplog.at_level(logging.WARNING, logger="streamlog.operators"):
            rt.recover()
            rt.run()
        warnings = [r.getMessage() for r in caplog.records if "cannot be met" in r.getMessage()]
        assert len(warnings) == 1 and "Q=10 cannot be met" in warnings[0]  # once
        assert operator.stats.q_raised_to == 500
        # With Q=10 chased literally, every pass re-checked all 500 windows (over 14
        # G_CHECKs per input record); raised to N it is about one per output record.
        assert operator.stats.g_check < 2 * count


def test_a_u_below_the_background_period_is_warned(caplog):
    with caplog.at_level(logging.WARNING, logger="streamlog.operators"):
        AggregateOperator(WindowSpec.count(5), cec=CECPolicy(u_target=50))
        AggregateOperator(WindowSpec.count(5), cec=CECPolicy(u_target=50,
                                                             background_every_records=50))
    warnings = [r.getMessage() for r in caplog.records if "U=50 cannot be met" in
                r.getMessage()]
    assert len(warnings) == 1 and "background_every_records" in warnings[0]


# -- (6) the recovery report -----------------------------------------------------------

def test_dry_run_reports_and_changes_nothing(tmp_path, logs):
    input_log, output_log = logs
    append_input(input_log, 0, 3000)
    with CheckpointStore(tmp_path / "ckpt") as store:
        crash_after_checkpoint(input_log, output_log, store, 1000, 800)
        before = [(r.offset, r.kind, r.value) for r in
                  output_log.reader("out", 0, data_only=False)]
        dry = runtime(Sum(), input_log, output_log, store=store,
                      checkpointing=CheckpointPolicy.operator_driven()).recover(dry_run=True)
        assert [(r.offset, r.kind, r.value) for r in
                output_log.reader("out", 0, data_only=False)] == before
        assert dry.dry_run and dry.method == "crb" and dry.replay_from_offset == 1000
        assert dry.replay_to_offset == 1800 and dry.catch_up_records == 1200
        # Results and notes after it (a note per chunk; the input's batches hold 20).
        assert dry.output_records_truncated == 800 + 800 // 20
        assert "(dry run)" in dry.summary()
        real = runtime(Sum(), input_log, output_log, store=store,
                       checkpointing=CheckpointPolicy.operator_driven()).recover()
        assert (real.method, real.replay_from_offset, real.replay_to_offset,
                real.output_records_truncated) == (dry.method, dry.replay_from_offset,
                                                   dry.replay_to_offset,
                                                   dry.output_records_truncated)
        assert real.replay_rate() is not None or real.input_records_replayed < 1000


def test_a_cec_dry_run_reads_the_extent_and_truncates_nothing(tmp_path, logs):
    input_log, output_log = logs
    append_input(input_log, 0, 3000)
    _cec_run(input_log, output_log, to_offset=2000)
    before = [(r.offset, r.kind, r.value) for r in output_log.reader("out", 0, data_only=False)]
    operator = AggregateOperator(WindowSpec.time(400_000), cec=CECPolicy())
    dry = OperatorRuntime(operator, input_log=input_log, input_stream="in",
                          output_log=output_log, output_stream="out").recover(dry_run=True)
    after = [(r.offset, r.kind, r.value) for r in output_log.reader("out", 0, data_only=False)]
    assert after == before
    assert dry.dry_run and dry.method == "cec" and dry.output_records_scanned > 0
    assert dry.replay_from_offset < dry.replay_to_offset <= 2000
    assert dry.catch_up_records == 3000 - dry.replay_to_offset
    real = _cec_run(input_log, output_log).report
    assert (real.replay_from_offset, real.replay_to_offset) == (dry.replay_from_offset,
                                                                dry.replay_to_offset)


def test_the_report_goes_to_logging_and_to_a_terminal_by_default(tmp_path, logs, caplog,
                                                                  monkeypatch, capsys):
    input_log, output_log = logs
    append_input(input_log, 0, 3000)
    crash_after(Sum(), input_log, output_log, 2500)
    monkeypatch.setattr("sys.stderr.isatty", lambda: True, raising=False)
    with caplog.at_level(logging.INFO, logger="streamlog.recovery"):
        report = runtime(Sum(), input_log, output_log).recover()
    lines = [r.getMessage() for r in caplog.records if r.name == "streamlog.recovery"]
    assert any(line.startswith("recovery[full_replay]") and "phase=replay" in line
               for line in lines)
    assert report.input_records_replayed == 2500
    assert report.replay_rate() is not None and report.seconds_left() == 0
    assert report.as_dict()["catch_up_records"] == 500
    shown = capsys.readouterr().err
    assert "recovery[full_replay]" in shown and "then 500 new input records" in shown


def test_without_a_terminal_nothing_is_printed(tmp_path, logs, monkeypatch, capsys):
    input_log, output_log = logs
    append_input(input_log, 0, 500)
    monkeypatch.setattr("sys.stderr.isatty", lambda: False, raising=False)
    runtime(Sum(), input_log, output_log).recover()
    assert capsys.readouterr().err == ""


# -- the plan, without I/O ---------------------------------------------------------------

def _facts(**changes) -> Facts:
    base = dict(input_key="in/0", input_start=0, input_end=1000, output_start=0,
                output_end=520, note=PositionNote(519, "in/0", 500, 0), checkpoint=None,
                checkpoint_input=None, checkpoint_output=None, truncate_mode=True,
                stateless=False, fail_on_data_loss=True)
    base.update(changes)
    return Facts(**base)


def test_plan_cases():
    plan = plan_recovery(_facts())
    assert (plan.method, plan.replay_from, plan.replay_to, plan.quiet, plan.truncate_to) == (
        "full_replay", 0, 500, True, None)
    torn = plan_recovery(_facts(output_end=530))  # records after the last note
    assert torn.truncate_to == 520 and torn.output_next == 520
    with pytest.raises(DataLossError, match=r"offsets 0\.\.199"):
        plan_recovery(_facts(input_start=200))
    lossy = plan_recovery(_facts(input_start=200, fail_on_data_loss=False))
    assert lossy.lost == (0, 199) and lossy.replay_from == 200 and lossy.live_from == 500
    assert lossy.truncate_to is None and lossy.origin == 200
    gone = plan_recovery(_facts(input_start=700, stateless=True, fail_on_data_loss=False))
    assert gone.lost == (500, 699) and gone.live_from == 700 and gone.replay_from == 700
    with pytest.raises(StreamLogError, match="not 'other/0'|produced from input"):
        plan_recovery(_facts(input_key="other/0"))
    with pytest.raises(StreamLogError, match="no position note"):
        plan_recovery(_facts(note=None, output_start=100))
    first = plan_recovery(_facts(note=None, output_end=0, input_start=40))
    assert (first.method, first.live_from, first.origin) == ("none", 40, 40)


def test_notes_are_control_records_a_data_reader_never_sees(tmp_path, logs):
    input_log, output_log = logs
    append_input(input_log, 0, 450)
    rt = runtime(Echo(), input_log, output_log)
    rt.recover()
    rt.run()
    kinds = [r.kind for r in output_log.reader("out", 0, data_only=False)]
    # One per chunk: the input's batches hold 20 records, so 23 chunks.
    assert kinds.count(RecordKind.CHECKPOINT) == 23
    assert kinds[-1] == RecordKind.CHECKPOINT
    assert len(data(output_log)) == 450
    assert output_log.end_offset("out") == 473
