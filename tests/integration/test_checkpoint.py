"""Checkpoints (DESIGN 7): the store, the checkpointer's policies, and CRB recovery of
the operator runtime on real files."""

from __future__ import annotations

import logging
import struct
import threading

import lmdb
import pytest

import streamlog
from streamlog.operators.checkpoint import Checkpointer, Outcome
from streamlog.operators.checkpoint_policy import CheckpointMode, CheckpointPolicy
from streamlog.operators.checkpoint_store import CheckpointStore
from streamlog.operators.checkpoint_value import Checkpoint
from streamlog.errors import CorruptionError, InvalidArgument, StreamLogError
from streamlog.operators.runtime import OperatorRuntime
from streamlog.operators.recovery_report import LOAD, LOCATE, REPLAY, TRUNCATE

_SUM = struct.Struct("<qq")


class RunningSum:
    """Emits, for each input record, the running sum and count of the int in its value.
    Its whole state is two ints, so a wrong reset shows in every later record."""

    def __init__(self, request_every: int | None = None) -> None:
        self.request_every = request_every
        self.resets: list[int | None] = []
        self.reset_to_initial_state()

    def reset_to_initial_state(self) -> None:
        self.total, self.count = 0, 0
        self.resets.append(None)

    def checkpoint(self, ckpt: Checkpoint) -> None:
        ckpt.state = _SUM.pack(self.total, self.count)

    def reset(self, ckpt: Checkpoint) -> None:
        self.total, self.count = _SUM.unpack(ckpt.state)
        self.resets.append(ckpt.sequence_id)

    def process_chunk(self, chunk, out) -> None:
        for offset, ts, value in zip(chunk.offsets, chunk.timestamps_us, chunk.values):
            self.total += int(value)
            self.count += 1
            out.emit(_SUM.pack(self.total, self.count), None, ts)
            if self.request_every and (offset + 1) % self.request_every == 0:
                out.request_checkpoint()


class ManualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _input(path, count: int) -> streamlog.Log:
    log = streamlog.open_log(path, fsync="never")
    log.create_stream("in")
    log.append_batch_sync("in", [str(i % 97).encode() for i in range(count)],
                          timestamps_us=[1000 + i // 3 for i in range(count)])
    return log


def _output_values(log) -> list[bytes]:
    return [r.value for r in log.reader("out", 0)]


def _runtime(operator, input_log, output_log, store=None, policy=None, **options):
    return OperatorRuntime(operator, input_log=input_log, input_stream="in",
                           output_log=output_log, output_stream="out", store=store,
                           checkpointing=policy, **options)


# -- the store -------------------------------------------------------------------------

def test_store_round_trip_keeps_the_newest(tmp_path):
    with CheckpointStore(tmp_path / "ckpt", keep=2) as store:
        assert store.latest() is None
        assert store.next_sequence_id() == 1
        for sequence_id in (1, 4, 9):
            store.put(Checkpoint(sequence_id, {"in/0": sequence_id * 10}, {"out/0": sequence_id},
                                 123, b"state-%d" % sequence_id))
        assert store.sequence_ids() == [4, 9]
        assert store.next_sequence_id() == 10
    with CheckpointStore(tmp_path / "ckpt", keep=2) as store:  # durable across reopen
        latest = store.latest()
        assert latest == Checkpoint(9, {"in/0": 90}, {"out/0": 9}, 123, b"state-9")
        assert store.latest(lambda c: c.output_offsets["out/0"] < 9).sequence_id == 4
        assert store.get(1) is None


def test_store_refuses_a_sequence_id_that_does_not_increase(tmp_path):
    with CheckpointStore(tmp_path / "ckpt") as store:
        store.put(Checkpoint(5, {}, {}, 0, b""))
        with pytest.raises(AssertionError):
            store.put(Checkpoint(5, {}, {}, 0, b""))


def test_store_passes_over_a_damaged_checkpoint(tmp_path):
    path = tmp_path / "ckpt"
    with CheckpointStore(path) as store:
        store.put(Checkpoint(1, {"in/0": 1}, {"out/0": 1}, 0, b"good"))
        store.put(Checkpoint(2, {"in/0": 2}, {"out/0": 2}, 0, b"will be damaged"))
    env = lmdb.open(str(path), max_dbs=1)
    db = env.open_db(b"checkpoints")
    with env.begin(write=True, db=db) as txn:
        value = bytearray(txn.get(struct.pack(">Q", 2)))
        value[-1] ^= 0xFF
        txn.put(struct.pack(">Q", 2), bytes(value))
    env.close()
    with CheckpointStore(path) as store:
        with pytest.raises(CorruptionError):
            store.get(2)
        assert store.latest().state == b"good"


def test_store_rejects_bad_options(tmp_path):
    with pytest.raises(InvalidArgument):
        CheckpointStore(tmp_path / "ckpt", keep=0)
    with pytest.raises(InvalidArgument):
        CheckpointPolicy.periodic(-1)


# -- the checkpointer ------------------------------------------------------------------

def test_interval_zero_disables_checkpointing(tmp_path):
    assert CheckpointPolicy.periodic(0).mode is CheckpointMode.DISABLED
    clock = ManualClock()
    with CheckpointStore(tmp_path / "ckpt") as store:
        checkpointer = Checkpointer(RunningSum(), store, CheckpointPolicy.periodic(0), clock=clock)
        for step in range(5):
            clock.now = step * 1000.0
            assert checkpointer.maybe_periodic({"in/0": step}, {"out/0": step}) is Outcome.DISABLED
        assert checkpointer.create_checkpoint({"in/0": 9}, {"out/0": 9}) is None
        assert store.sequence_ids() == []


def test_runtime_with_interval_zero_writes_no_checkpoint(tmp_path):
    input_log = _input(tmp_path / "in", 3000)
    output_log = streamlog.open_log(tmp_path / "out", fsync="never")
    store = CheckpointStore(tmp_path / "ckpt")
    operator = RunningSum(request_every=100)  # even requests are ignored when disabled
    runtime = _runtime(operator, input_log, output_log, store, CheckpointPolicy.periodic(0),
                       chunk_records=50, clock=lambda: 1e9)
    runtime.recover(replay=False)
    assert runtime.run() == 3000
    runtime.close()
    assert store.sequence_ids() == []
    assert runtime.checkpointer.stats.started == 0
    assert len(_output_values(output_log)) == 3000
    for closing in (store, output_log, input_log):
        closing.close()


def test_periodic_checkpoints_follow_the_interval(tmp_path):
    clock = ManualClock()
    with CheckpointStore(tmp_path / "ckpt") as store:
        checkpointer = Checkpointer(RunningSum(), store, CheckpointPolicy.periodic(10.0),
                                    clock=clock, background=False)
        outcomes = []
        for now in (5.0, 10.0, 12.0, 19.9, 20.0, 55.0, 59.0, 60.0):
            clock.now = now
            outcomes.append(checkpointer.maybe_periodic({"in/0": int(now)}, {"out/0": 0}))
        assert outcomes == [Outcome.NOT_DUE, Outcome.STARTED, Outcome.NOT_DUE, Outcome.NOT_DUE,
                            Outcome.STARTED, Outcome.STARTED, Outcome.NOT_DUE, Outcome.STARTED]
        ids = store.sequence_ids()
        assert ids == sorted(ids) and len(ids) == 3  # keep=3 of the 4 written
        assert store.latest().input_offsets == {"in/0": 60}


class BlockingStore:
    """A store whose put waits until released: a checkpoint write that takes long."""

    def __init__(self, inner: CheckpointStore) -> None:
        self.inner = inner
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)

    def next_sequence_id(self) -> int:
        return self.inner.next_sequence_id()

    def put(self, ckpt: Checkpoint) -> None:
        self.entered.release()
        assert self.release.wait(10)
        self.inner.put(ckpt)


def test_overlapping_periodic_checkpoints_are_dropped(tmp_path):
    clock = ManualClock()
    with CheckpointStore(tmp_path / "ckpt", keep=10) as inner:
        store = BlockingStore(inner)
        checkpointer = Checkpointer(RunningSum(), store, CheckpointPolicy.periodic(1.0),
                                    clock=clock)
        clock.now = 1.0
        assert checkpointer.maybe_periodic({"in/0": 1}, {"out/0": 1}) is Outcome.STARTED
        assert store.entered.acquire(timeout=10)
        assert checkpointer.in_flight
        for now in (2.0, 3.0, 4.5):  # due while the first is still being written
            clock.now = now
            assert checkpointer.maybe_periodic({"in/0": 2}, {"out/0": 2}) is Outcome.DROPPED
        assert checkpointer.stats.dropped == 3
        store.release.set()
        checkpointer.wait()
        assert not checkpointer.in_flight
        clock.now = 5.0
        assert checkpointer.maybe_periodic({"in/0": 5}, {"out/0": 5}) is Outcome.STARTED
        checkpointer.close()
        ids = inner.sequence_ids()
        assert len(ids) == 2 and ids[0] < ids[1]  # not queued: nothing for the dropped ticks
        assert [inner.get(i).input_offsets["in/0"] for i in ids] == [1, 5]
        assert checkpointer.stats.written == 2


def test_an_interval_shorter_than_a_checkpoint_is_warned_once(tmp_path, caplog):
    clock = ManualClock()
    with CheckpointStore(tmp_path / "ckpt", keep=10) as inner:
        store = BlockingStore(inner)
        checkpointer = Checkpointer(RunningSum(), store, CheckpointPolicy.periodic(0.02),
                                    clock=clock)
        clock.now = 1.0
        assert checkpointer.maybe_periodic({"in/0": 1}, {"out/0": 1}) is Outcome.STARTED
        assert store.entered.acquire(timeout=10)
        with caplog.at_level(logging.WARNING, logger="streamlog.checkpoint"):
            for tick in range(1, 12):  # every tick falls due while the write blocks
                clock.now = 1.0 + 0.05 * tick  # past the next tick each time
                assert checkpointer.maybe_periodic({"in/0": 2}, {"out/0": 2}) is (
                    Outcome.DROPPED)
        warnings = [r.getMessage() for r in caplog.records if "cannot be met" in
                    r.getMessage()]
        assert len(warnings) == 1 and "interval 0.020 s" in warnings[0]
        # Clock readings on multiples of the interval once made floating-point rounding
        # put the next tick on `now` and failed an assertion inside the operator.
        outcomes = set()
        for tick in range(12, 400):
            clock.now = 1.0 + 0.02 * tick
            outcomes.add(checkpointer.maybe_periodic({"in/0": 2}, {"out/0": 2}))
        assert outcomes <= {Outcome.DROPPED, Outcome.NOT_DUE} and Outcome.DROPPED in outcomes
        store.release.set()
        checkpointer.close()


def test_operator_driven_checkpoint_waits_for_the_one_in_flight(tmp_path):
    with CheckpointStore(tmp_path / "ckpt", keep=10) as inner:
        store = BlockingStore(inner)
        clock = ManualClock()
        checkpointer = Checkpointer(RunningSum(), store, CheckpointPolicy.periodic(1.0),
                                    clock=clock)
        clock.now = 1.0
        checkpointer.maybe_periodic({"in/0": 1}, {"out/0": 1})
        assert store.entered.acquire(timeout=10)
        done = []
        thread = threading.Thread(target=lambda: done.append(
            checkpointer.create_checkpoint({"in/0": 2}, {"out/0": 2})))
        thread.start()
        thread.join(0.2)
        assert thread.is_alive() and not done  # synchronous: blocked behind the first
        store.release.set()
        thread.join(10)
        assert done and done[0].sequence_id == 2
        assert [inner.get(i).input_offsets["in/0"] for i in inner.sequence_ids()] == [1, 2]


def test_a_failed_background_write_is_raised_and_sticks(tmp_path):
    class FailingStore:
        def next_sequence_id(self) -> int:
            return 1

        def put(self, ckpt) -> None:
            raise OSError("disk full")

    clock = ManualClock()
    checkpointer = Checkpointer(RunningSum(), FailingStore(), CheckpointPolicy.periodic(1.0),
                                clock=clock)
    clock.now = 1.0
    assert checkpointer.maybe_periodic({}, {}) is Outcome.STARTED
    for _ in range(2):
        with pytest.raises(StreamLogError, match="disk full"):
            checkpointer.wait()


# -- CRB recovery through the runtime --------------------------------------------------

def _failure_free(tmp_path, input_log) -> list[bytes]:
    output_log = streamlog.open_log(tmp_path / "reference", fsync="never")
    runtime = _runtime(RunningSum(), input_log, output_log, chunk_records=64)
    runtime.recover()
    runtime.run()
    values = _output_values(output_log)
    output_log.close()
    return values


@pytest.mark.parametrize("output_mode", ["truncate", "skip"])
def test_crb_recovery_forgets_output_after_the_checkpoint(tmp_path, output_mode):
    input_log = _input(tmp_path / "in", 5000)
    expected = _failure_free(tmp_path, input_log)
    store = CheckpointStore(tmp_path / "ckpt")
    output_log = streamlog.open_log(tmp_path / "out", fsync="always")
    first = _runtime(RunningSum(), input_log, output_log, store,
                     CheckpointPolicy.operator_driven(), chunk_records=100)
    first.recover()
    first.run(max_records=1800)
    ckpt = first.checkpoint_now()
    # 1,800 results and a position note after each chunk of 100.
    assert ckpt.input_offsets == {"in/0": 1800} and ckpt.output_offsets == {"out/0": 1818}
    first.run(max_records=1300)  # output written after the checkpoint, then a "crash"
    first.close()
    assert output_log.end_offset("out") == 3131
    operator = RunningSum()
    progress = []
    second = _runtime(operator, input_log, output_log, store, CheckpointPolicy.operator_driven(),
                      chunk_records=100, output_mode=output_mode,
                      progress=lambda r: progress.append((r.current_phase,
                                                          r.input_records_replayed)))
    report = second.recover()
    assert report.method == "crb"
    assert report.checkpoint_sequence_id == ckpt.sequence_id
    assert operator.resets[-1] == ckpt.sequence_id
    # Replay covers what the crashed run had read (to 3,100), not the whole input.
    assert report.replay_from_offset == 1800 and report.input_records_to_replay == 1300
    assert report.catch_up_records == 1900
    if output_mode == "truncate":
        assert report.output_records_truncated == 1313
    else:
        assert report.output_records_truncated == 0
        assert report.output_records_skipped == 1300
    second.run()
    assert _output_values(output_log) == expected
    assert [phase for phase, _ in progress[:2]] == [LOCATE, LOCATE]
    assert {LOCATE, LOAD, TRUNCATE, REPLAY, "done"} <= {phase for phase, _ in progress}
    assert set(report.phase_seconds) == {LOCATE, LOAD, TRUNCATE, REPLAY}
    assert "replay from offset 1,800" in report.summary()
    for closing in (store, output_log, input_log):
        closing.close()


def test_operator_driven_requests_checkpoint_at_the_chunk_end(tmp_path):
    input_log = _input(tmp_path / "in", 1000)
    output_log = streamlog.open_log(tmp_path / "out", fsync="never")
    store = CheckpointStore(tmp_path / "ckpt", keep=100)
    runtime = _runtime(RunningSum(request_every=250), input_log, output_log, store,
                       CheckpointPolicy.operator_driven(), chunk_records=100)
    runtime.recover()
    runtime.run()
    runtime.close()
    found = [store.get(i) for i in store.sequence_ids()]
    # Requested at offsets 249, 499, 749, 999: taken when their chunk of 100 ends.
    assert [c.input_offsets["in/0"] for c in found] == [300, 500, 800, 1000]
    # One result per input record, and a position note per chunk of 100.
    assert all(c.output_offsets["out/0"] == c.input_offsets["in/0"] * 101 // 100
               for c in found)
    assert [_SUM.unpack(c.state)[1] for c in found] == [300, 500, 800, 1000]
    for closing in (store, output_log, input_log):
        closing.close()


def test_a_checkpoint_past_the_output_end_is_not_used(tmp_path):
    input_log = _input(tmp_path / "in", 2000)
    expected = _failure_free(tmp_path, input_log)
    store = CheckpointStore(tmp_path / "ckpt", keep=10)
    output_log = streamlog.open_log(tmp_path / "out", fsync="always")
    runtime = _runtime(RunningSum(), input_log, output_log, store,
                       CheckpointPolicy.operator_driven(), chunk_records=100)
    runtime.recover()
    runtime.run(max_records=500)
    old = runtime.checkpoint_now()
    runtime.run(max_records=700)
    new = runtime.checkpoint_now()
    runtime.close()
    # The output lost its tail (e.g. written with a weaker fsync policy): the newer
    # checkpoint describes output that is gone, so recovery must use the older one.
    output_log.truncate_after("out", 0, 899)
    second = _runtime(RunningSum(), input_log, output_log, store,
                      CheckpointPolicy.operator_driven(), chunk_records=100)
    report = second.recover()
    assert new.output_offsets["out/0"] == 1212 and old.output_offsets["out/0"] == 505
    assert report.checkpoint_sequence_id == old.sequence_id
    assert report.output_records_truncated == 900 - 505
    second.run()
    assert _output_values(output_log) == expected
    for closing in (store, output_log, input_log):
        closing.close()


def test_without_a_checkpoint_recovery_replays_what_the_crashed_run_read(tmp_path):
    input_log = _input(tmp_path / "in", 1500)
    expected = _failure_free(tmp_path, input_log)
    store = CheckpointStore(tmp_path / "ckpt")
    output_log = streamlog.open_log(tmp_path / "out", fsync="always")
    first = _runtime(RunningSum(), input_log, output_log, store, CheckpointPolicy.periodic(0),
                     chunk_records=100)
    first.recover()
    first.run(max_records=700)
    operator = RunningSum()
    second = _runtime(operator, input_log, output_log, store, CheckpointPolicy.periodic(0),
                      chunk_records=100)
    report = second.recover(replay=False)
    assert report.method == "full_replay"
    # The state is rebuilt from the input the crashed run read; its output is kept
    # (published already) and the replay's copy of it is suppressed.
    assert report.replay_from_offset == 0 and report.input_records_to_replay == 700
    assert report.output_records_truncated == 0
    assert any("offsets 0..699 (700 records)" in n for n in report.notes)
    kept = output_log.end_offset("out")
    second.replay()
    assert report.input_records_replayed == 700
    assert report.output_records_skipped == 700
    assert output_log.end_offset("out") == kept  # nothing appended twice
    second.run()
    assert _output_values(output_log) == expected
    for closing in (store, output_log, input_log):
        closing.close()


def test_replay_progress_is_shown_while_it_runs(tmp_path):
    input_log = _input(tmp_path / "in", 2000)
    output_log = streamlog.open_log(tmp_path / "out", fsync="never")
    crashed = _runtime(RunningSum(), input_log, output_log, chunk_records=100)
    crashed.recover()
    crashed.run(max_records=500)
    seen = []
    runtime = _runtime(RunningSum(), input_log, output_log, chunk_records=100,
                       progress=lambda r: seen.append((r.current_phase, r.input_records_replayed)))
    runtime.recover(replay=False)
    runtime.report.interval_s = 0.0  # show every tick
    runtime.replay()
    replay_counts = [count for phase, count in seen if phase == REPLAY]
    assert replay_counts[0] == 0 and replay_counts[-1] == 500
    assert len(replay_counts) >= 5  # one per chunk of 100, while it ran
    assert replay_counts == sorted(replay_counts)
    assert seen[-1] == ("done", 500)
    output_log.close()
    input_log.close()


def test_runtime_refuses_bad_options(tmp_path):
    input_log = _input(tmp_path / "in", 10)
    output_log = streamlog.open_log(tmp_path / "out", fsync="never")
    with pytest.raises(InvalidArgument):
        _runtime(RunningSum(), input_log, output_log, chunk_records=0)
    with pytest.raises(InvalidArgument):
        _runtime(RunningSum(), input_log, output_log, output_mode="rewind")
    with pytest.raises(InvalidArgument):
        _runtime(RunningSum(), input_log, output_log, policy=CheckpointPolicy.periodic(1.0))
    output_log.close()
    input_log.close()
