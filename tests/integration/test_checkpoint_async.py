"""Checkpoints off the operator's hot path (checkpoint.py, DESIGN 7): a handed-over
snapshot is serialised and written on the checkpointer's worker thread, periodic ones that
overlap are dropped, operator-driven ones return a handle, failures surface. Real threads
and real files; timing assertions compare with wide margins (a shared 2-core machine)."""

from __future__ import annotations

import collections
import copy
import threading
import time

import pytest

import streamlog
from streamlog.errors import CorruptionError, InvalidArgument, StreamLogError
from streamlog.operators.checkpoint import PENDING_MAX, Checkpointer, Outcome
from streamlog.operators.checkpoint_policy import (CheckpointMode, CheckpointPolicy,
                                                   CheckpointRequest)
from streamlog.operators.checkpoint_store import CheckpointStore
from streamlog.operators.checkpoint_value import Checkpoint
from streamlog.operators.codec import DEFAULT_CODEC
from streamlog.operators.operator_io import OutputBuffer
from streamlog.operators.runtime import OperatorRuntime
from test_checkpoint import ManualClock  # the same manual clock

SERIALIZE_S = 0.05  # the slow serialiser
INTERVAL_S = 0.02  # the periodic interval it must not stall
KEYS = 50


class KeyCounter:
    """Counts records per key. checkpoint() hands over a shallow copy (the default), or
    serialises inline into ckpt.state (`hand_over=False`, the synchronous path)."""

    def __init__(self, *, serialize=None, hand_over: bool = True, request_at=(),
                 prefill: int = 0) -> None:
        self.serialize = serialize
        self.use_hand_over = hand_over
        self.request_at = set(request_at)
        self.handles: list[tuple[int, CheckpointRequest]] = []
        self.policies: list[tuple[CheckpointPolicy, float]] = []
        self.resets: list[int | None] = []
        self.prefill = prefill
        self.reset_to_initial_state()

    def reset_to_initial_state(self) -> None:
        self.counts = {b"pre-%d" % i: 0 for i in range(self.prefill)}
        self.records = 0
        self.resets.append(None)

    def state(self) -> dict:
        return {"counts": dict(self.counts), "records": self.records}

    def checkpoint(self, ckpt: Checkpoint) -> None:
        if self.use_hand_over:
            ckpt.hand_over(self.state(), self.serialize)  # a copy: we go on mutating ours
        else:
            encode = self.serialize or DEFAULT_CODEC.encode
            ckpt.state = encode(self.state())

    def reset(self, ckpt: Checkpoint) -> None:
        value = ckpt.value()
        self.counts, self.records = value["counts"], value["records"]
        self.resets.append(ckpt.sequence_id)

    def absorb(self, key: bytes) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1
        self.records += 1

    def process_chunk(self, chunk, out) -> None:
        self.policies.append((out.checkpoint_policy, out.checkpoint_interval_s))
        for offset, key, ts in zip(chunk.offsets, chunk.keys, chunk.timestamps_us):
            self.absorb(key)
            if offset in self.request_at:
                self.handles.append((offset, out.request_checkpoint()))
        out.emit(b"%d" % self.records, None, chunk.timestamps_us[-1])


def _input(path, count: int) -> streamlog.Log:
    log = streamlog.open_log(path, fsync="never")
    log.create_stream("in")
    log.append_batch_sync("in", [b"v"] * count, keys=[b"k%d" % (i % KEYS) for i in range(count)],
                          timestamps_us=[1000 + i for i in range(count)])
    return log


def _expected_counts(count: int) -> dict[bytes, int]:
    expected = collections.Counter(b"k%d" % (i % KEYS) for i in range(count))
    return dict(expected)


def _runtime(operator, input_log, output_log, store, policy, **options) -> OperatorRuntime:
    return OperatorRuntime(operator, input_log=input_log, input_stream="in",
                           output_log=output_log, output_stream="out", store=store,
                           checkpointing=policy, progress=None, **options)


def _gated_serializer():
    """A serialiser that blocks until `release` is set; `entered` counts its calls."""
    release = threading.Event()
    entered = threading.Semaphore(0)

    def serialize(snapshot) -> bytes:
        entered.release()
        assert release.wait(10)
        return DEFAULT_CODEC.encode(snapshot)

    return serialize, release, entered


# -- the hot path ----------------------------------------------------------------------

def test_a_slow_serialiser_does_not_stall_the_operator_thread(tmp_path):
    operator_thread = threading.get_ident()
    serializer_threads: set[int] = set()

    def slow_serialize(snapshot) -> bytes:
        serializer_threads.add(threading.get_ident())
        time.sleep(SERIALIZE_S)
        return DEFAULT_CODEC.encode(snapshot)

    handler = KeyCounter(serialize=slow_serialize, prefill=1000)
    outcomes: collections.Counter = collections.Counter()
    started_call_s: list[float] = []
    with CheckpointStore(tmp_path / "ckpt", keep=1000) as store:
        checkpointer = Checkpointer(handler, store, CheckpointPolicy.periodic(INTERVAL_S))
        deadline = time.monotonic() + 1.0
        for step in range(100_000):  # the operator: a little work, then the chunk end
            if time.monotonic() >= deadline:
                break
            for i in range(20):
                handler.absorb(b"k%d" % ((step + i) % KEYS))
            before = time.perf_counter()
            outcome = checkpointer.maybe_periodic({"in/0": handler.records}, {"out/0": step})
            if outcome is Outcome.STARTED:
                started_call_s.append(time.perf_counter() - before)
            outcomes[outcome] += 1
            time.sleep(0.002)
        checkpointer.close()
        stats = checkpointer.stats
        stored = [store.get(i) for i in store.sequence_ids()]
    assert serializer_threads and operator_thread not in serializer_threads
    assert outcomes[Outcome.STARTED] >= 3
    assert stats.serialized == stats.written == outcomes[Outcome.STARTED]
    assert stats.serialize_seconds / stats.serialized >= SERIALIZE_S * 0.9
    # The operator pays the snapshot (a dict copy) and the hand-off, not the 50 ms.
    mean_call_s = sum(started_call_s) / len(started_call_s)
    assert mean_call_s < 0.010, f"mean time in a starting maybe_periodic: {mean_call_s:.4f} s"
    assert sum(started_call_s) < 0.25 * stats.serialize_seconds
    assert stats.snapshot_seconds < 0.25 * stats.serialize_seconds
    # Each checkpoint is in flight >= 50 ms, over two 20 ms ticks: those are dropped.
    assert outcomes[Outcome.DROPPED] >= 1
    assert stats.dropped == outcomes[Outcome.DROPPED]
    assert len(stored) == outcomes[Outcome.STARTED]  # dropped ones were not queued
    for ckpt in stored:  # each snapshot matches its own offsets, not a later state
        assert ckpt.value()["records"] == ckpt.input_offsets["in/0"]


def test_the_inline_path_still_waits_for_its_serialiser(tmp_path):
    """The contrast that shows the measurement above can fail: a handler that sets
    ckpt.state itself keeps its serialiser on the operator's thread (as before)."""
    def slow_encode(state) -> bytes:
        time.sleep(SERIALIZE_S)
        return DEFAULT_CODEC.encode(state)

    clock = ManualClock()
    handler = KeyCounter(serialize=slow_encode, hand_over=False)
    with CheckpointStore(tmp_path / "ckpt") as store:
        checkpointer = Checkpointer(handler, store, CheckpointPolicy.periodic(1.0), clock=clock)
        for now in (1.0, 2.0):
            clock.now = now
            checkpointer.wait()
            before = time.perf_counter()
            assert checkpointer.maybe_periodic({"in/0": 0}, {"out/0": 0}) is Outcome.STARTED
            assert time.perf_counter() - before >= SERIALIZE_S * 0.9
        checkpointer.close()
        assert checkpointer.stats.serialized == 0 and checkpointer.stats.written == 2
        assert store.latest().value() == handler.state()


def test_a_periodic_checkpoint_due_while_one_is_serialising_is_dropped(tmp_path):
    serialize, release, entered = _gated_serializer()
    clock = ManualClock()
    handler = KeyCounter(serialize=serialize)
    with CheckpointStore(tmp_path / "ckpt", keep=10) as store:
        checkpointer = Checkpointer(handler, store, CheckpointPolicy.periodic(1.0), clock=clock)
        clock.now = 1.0
        handler.absorb(b"a")
        assert checkpointer.maybe_periodic({"in/0": 1}, {"out/0": 1}) is Outcome.STARTED
        assert entered.acquire(timeout=10)  # serialising now; nothing written yet
        for now in (2.0, 3.5):
            clock.now = now
            handler.absorb(b"b")  # the operator goes on mutating its own state
            assert checkpointer.maybe_periodic({"in/0": 9}, {"out/0": 9}) is Outcome.DROPPED
        assert store.sequence_ids() == [] and checkpointer.in_flight
        assert checkpointer.stats.dropped == 2
        release.set()
        checkpointer.wait()
        clock.now = 4.0
        assert checkpointer.maybe_periodic({"in/0": 3}, {"out/0": 3}) is Outcome.STARTED
        checkpointer.close()
        first, second = (store.get(i) for i in store.sequence_ids())
        # The first snapshot is the state at its own checkpoint, not the one mutated later.
        assert first.value() == {"counts": {b"a": 1}, "records": 1}
        assert second.value() == {"counts": {b"a": 1, b"b": 2}, "records": 3}
        assert checkpointer.stats.written == 2 and checkpointer.stats.serialized == 2


# -- operator-driven: the handle -------------------------------------------------------

def test_request_checkpoint_returns_a_handle_and_does_not_block(tmp_path):
    serialize, release, entered = _gated_serializer()
    input_log = _input(tmp_path / "in", 1000)
    output_log = streamlog.open_log(tmp_path / "out", fsync="never")
    store = CheckpointStore(tmp_path / "ckpt", keep=10)
    operator = KeyCounter(serialize=serialize, request_at=(249, 251))
    runtime = _runtime(operator, input_log, output_log, store,
                       CheckpointPolicy.operator_driven(), chunk_records=100)
    runtime.recover()
    assert runtime.run() == 1000  # the serialiser is blocked, the operator is not
    (at_249, handle), (at_251, again) = operator.handles
    assert handle is again  # two requests in one chunk: one checkpoint at its end
    assert isinstance(handle, CheckpointRequest)
    assert entered.acquire(timeout=10)
    assert not handle.done() and handle.sequence_id is not None
    with pytest.raises(StreamLogError, match="not durable after"):
        handle.wait(timeout_s=0.05)  # bounded
    release.set()
    ckpt = handle.wait(timeout_s=10)
    assert handle.done() and ckpt.sequence_id == handle.sequence_id
    assert ckpt.input_offsets == {"in/0": 300}  # the end of the chunk that asked
    stored = store.get(handle.sequence_id)
    assert stored == ckpt  # durable, and what wait() returned
    assert stored.value()["records"] == 300
    assert stored.value()["counts"] == _expected_counts(300)
    assert runtime.stats.checkpoints_requested == 1
    runtime.close()
    for closing in (store, output_log, input_log):
        closing.close()


def test_waiting_inside_the_chunk_that_asked_is_refused(tmp_path):
    class Impatient(KeyCounter):
        def process_chunk(self, chunk, out) -> None:
            super().process_chunk(chunk, out)
            with pytest.raises(StreamLogError, match="snapshot is taken when the current "
                                                     "chunk ends"):
                out.request_checkpoint().wait(timeout_s=5)
            self.refused = True

    input_log = _input(tmp_path / "in", 10)
    output_log = streamlog.open_log(tmp_path / "out", fsync="never")
    store = CheckpointStore(tmp_path / "ckpt")
    operator = Impatient()
    runtime = _runtime(operator, input_log, output_log, store,
                       CheckpointPolicy.operator_driven(), chunk_records=10)
    runtime.recover()
    before = time.monotonic()
    runtime.run()
    assert time.monotonic() - before < 4  # refused at once, not after the timeout
    assert operator.refused
    runtime.close()
    assert len(store.sequence_ids()) == 1  # the request itself still went through
    for closing in (store, output_log, input_log):
        closing.close()


def test_runtime_request_checkpoint_and_checkpoint_now(tmp_path):
    input_log = _input(tmp_path / "in", 600)
    output_log = streamlog.open_log(tmp_path / "out", fsync="never")
    store = CheckpointStore(tmp_path / "ckpt", keep=10)
    operator = KeyCounter()
    runtime = _runtime(operator, input_log, output_log, store,
                       CheckpointPolicy.operator_driven(), chunk_records=100)
    runtime.recover()
    runtime.run(max_records=200)
    handle = runtime.request_checkpoint()  # between chunks: the snapshot is taken now
    assert handle.sequence_id is not None
    runtime.run(max_records=200)
    ckpt = runtime.checkpoint_now()  # the blocking form: durable on return
    assert ckpt.input_offsets == {"in/0": 400}
    assert store.get(ckpt.sequence_id) == ckpt
    assert handle.wait(timeout_s=10).input_offsets == {"in/0": 200}
    assert handle.sequence_id < ckpt.sequence_id
    runtime.close()
    for closing in (store, output_log, input_log):
        closing.close()


def test_requests_queue_in_order_with_back_pressure(tmp_path):
    serialize, release, entered = _gated_serializer()
    handler = KeyCounter(serialize=serialize)
    handles: list[CheckpointRequest] = []
    with CheckpointStore(tmp_path / "ckpt", keep=100) as store:
        checkpointer = Checkpointer(handler, store, CheckpointPolicy.operator_driven())

        def operator() -> None:
            for i in range(PENDING_MAX + 2):
                handler.absorb(b"k")
                handles.append(checkpointer.request_checkpoint({"in/0": i + 1}, {"out/0": 0}))

        thread = threading.Thread(target=operator)
        thread.start()
        assert entered.acquire(timeout=10)  # the first is being serialised
        for _ in range(200):  # until the queue is full and the operator waits for room
            if len(handles) == PENDING_MAX + 1:
                break
            time.sleep(0.01)
        time.sleep(0.1)
        assert len(handles) == PENDING_MAX + 1 and thread.is_alive()
        release.set()
        thread.join(10)
        assert not thread.is_alive()
        found = [handle.wait(timeout_s=10) for handle in handles]
        assert [c.input_offsets["in/0"] for c in found] == list(range(1, PENDING_MAX + 3))
        assert [c.value()["records"] for c in found] == list(range(1, PENDING_MAX + 3))
        assert store.sequence_ids() == [c.sequence_id for c in found]
        assert not checkpointer.in_flight


# -- the policy, as the operator sees it -----------------------------------------------

def test_the_operator_can_ask_its_policy_and_interval(tmp_path):
    input_log = _input(tmp_path / "in", 300)
    output_log = streamlog.open_log(tmp_path / "out", fsync="never")
    store = CheckpointStore(tmp_path / "ckpt")
    operator = KeyCounter(request_at=(50,))
    policy = CheckpointPolicy.periodic(INTERVAL_S)
    runtime = _runtime(operator, input_log, output_log, store, policy, chunk_records=100)
    assert runtime.checkpoint_policy == policy and runtime.checkpoint_interval_s == INTERVAL_S
    runtime.recover()
    runtime.run()
    runtime.close()
    assert operator.policies == [(policy, INTERVAL_S)] * 3
    assert operator.handles[0][1].wait(timeout_s=10).input_offsets == {"in/0": 100}

    disabled = KeyCounter(request_at=(50,))
    other = streamlog.open_log(tmp_path / "out2", fsync="never")
    runtime = OperatorRuntime(disabled, input_log=input_log, input_stream="in",
                              output_log=other, output_stream="out", progress=None,
                              chunk_records=100)
    assert runtime.checkpoint_policy.mode is CheckpointMode.DISABLED
    runtime.recover()
    runtime.run()
    assert disabled.policies[0] == (CheckpointPolicy.disabled(), 0.0)
    handle = disabled.handles[0][1]
    assert handle.done() and handle.wait() is None  # no store: nothing taken
    assert runtime.checkpoint_now() is None
    assert OutputBuffer(0).checkpoint_policy.mode is CheckpointMode.DISABLED
    for closing in (store, output_log, other, input_log):
        closing.close()


# -- failures ------------------------------------------------------------------------

def _raising_serializer(snapshot) -> bytes:
    raise ValueError("no room in the codec")


@pytest.mark.parametrize("serialize, message", [
    (_raising_serializer,
     "failed while serialising the handed-over state: ValueError: no room in the codec"),
    (lambda snapshot: {"not": "bytes"}, "serialize returned a dict, not bytes"),
])
def test_a_failing_serialiser_surfaces_and_sticks(tmp_path, serialize, message):
    clock = ManualClock()
    with CheckpointStore(tmp_path / "ckpt") as store:
        checkpointer = Checkpointer(KeyCounter(serialize=serialize), store,
                                    CheckpointPolicy.periodic(1.0), clock=clock)
        handle = checkpointer.request_checkpoint({"in/0": 1}, {"out/0": 1})
        with pytest.raises(StreamLogError, match=message):
            handle.wait(timeout_s=10)
        with pytest.raises(StreamLogError, match=message):  # a fresh raise, same message
            handle.wait(timeout_s=10)
        clock.now = 1.0
        with pytest.raises(StreamLogError, match="checkpointing stopped after a failure"):
            checkpointer.maybe_periodic({"in/0": 2}, {"out/0": 2})
        with pytest.raises(StreamLogError, match=message):
            checkpointer.request_checkpoint({"in/0": 3}, {"out/0": 3})
        with pytest.raises(StreamLogError, match=message):
            checkpointer.close()
        assert store.sequence_ids() == []
        assert checkpointer.stats.failed == 1 and checkpointer.stats.written == 0


def test_a_failed_store_write_fails_the_handle_and_those_queued_behind_it(tmp_path):
    serialize, release, entered = _gated_serializer()

    class FailingStore:
        def next_sequence_id(self) -> int:
            return 1

        def put(self, ckpt) -> None:
            raise OSError("disk full")

    checkpointer = Checkpointer(KeyCounter(serialize=serialize), FailingStore(),
                                CheckpointPolicy.operator_driven())
    first = checkpointer.request_checkpoint({"in/0": 1}, {"out/0": 1})
    assert entered.acquire(timeout=10)
    second = checkpointer.request_checkpoint({"in/0": 2}, {"out/0": 2})
    release.set()
    for handle in (first, second):
        with pytest.raises(StreamLogError, match="disk full") as raised:
            handle.wait(timeout_s=10)
        assert isinstance(raised.value.__cause__, OSError)
    assert "checkpoint 1 failed while writing it to the store" in str(raised.value)
    assert checkpointer.stats.serialized == 1  # the second was not even serialised
    with pytest.raises(StreamLogError, match="disk full"):
        checkpointer.create_checkpoint({"in/0": 3}, {"out/0": 3})


def test_hand_over_misuse_is_refused(tmp_path):
    ckpt = Checkpoint(1, {}, {}, 0)
    ckpt.hand_over({"a": 1})
    with pytest.raises(InvalidArgument, match="already called"):
        ckpt.hand_over({"a": 2})
    with pytest.raises(InvalidArgument, match="not both"):
        Checkpoint(1, {}, {}, 0, b"set").hand_over({})
    with pytest.raises(InvalidArgument, match="callable"):
        Checkpoint(1, {}, {}, 0).hand_over({}, serialize="msgpack")

    class Both(KeyCounter):
        def checkpoint(self, ckpt) -> None:
            ckpt.hand_over({})
            ckpt.state = b"too"

    with CheckpointStore(tmp_path / "ckpt") as store:
        checkpointer = Checkpointer(Both(), store, CheckpointPolicy.operator_driven())
        with pytest.raises(InvalidArgument, match="do one of the two"):
            checkpointer.create_checkpoint({}, {})
        with pytest.raises(InvalidArgument, match="timeout_s"):
            CheckpointRequest().wait(timeout_s=float("inf"))


# -- state round trips and recovery ----------------------------------------------------

def test_default_codec_round_trip_through_the_store(tmp_path):
    state = {"counts": {b"k1": 3, "name": 2}, "window": (1, 2, (b"x", None)),
             "floats": [0.5, -1.25], "nested": {"deep": [{"t": (7,)}]}}
    handler = KeyCounter()
    handler.checkpoint = lambda ckpt: ckpt.hand_over(copy.deepcopy(state))
    with CheckpointStore(tmp_path / "ckpt") as store:
        checkpointer = Checkpointer(handler, store, CheckpointPolicy.operator_driven())
        ckpt = checkpointer.create_checkpoint({"in/0": 5}, {"out/0": 7})
        assert not ckpt.handed_over and ckpt.state == DEFAULT_CODEC.encode(state)
        assert checkpointer.stats.state_bytes == len(ckpt.state)
    with CheckpointStore(tmp_path / "ckpt") as store:
        loaded = store.latest()
    assert loaded.value() == state  # tuples come back as tuples
    assert loaded.input_offsets == {"in/0": 5} and loaded.output_offsets == {"out/0": 7}
    assert loaded.value(deserialize=len) == len(ckpt.state)
    with pytest.raises(CorruptionError):
        Checkpoint(1, {}, {}, 0, b"\xc1").value()


def test_custom_serialiser_round_trip(tmp_path):
    handler = KeyCounter(serialize=lambda snapshot: repr(sorted(snapshot.items())).encode())
    handler.absorb(b"q")
    with CheckpointStore(tmp_path / "ckpt") as store:
        checkpointer = Checkpointer(handler, store, CheckpointPolicy.operator_driven())
        ckpt = checkpointer.create_checkpoint({"in/0": 1}, {"out/0": 1})
        assert store.get(ckpt.sequence_id).state == b"[('counts', {b'q': 1}), ('records', 1)]"


def test_recovery_from_a_handed_over_snapshot(tmp_path):
    total = 3000
    input_log = _input(tmp_path / "in", total)
    output_log = streamlog.open_log(tmp_path / "out", fsync="always")
    store = CheckpointStore(tmp_path / "ckpt")
    first = KeyCounter()
    runtime = _runtime(first, input_log, output_log, store, CheckpointPolicy.operator_driven(),
                       chunk_records=100)
    runtime.recover()
    runtime.run(max_records=1200)
    ckpt = runtime.checkpoint_now()
    at_checkpoint = copy.deepcopy(first.state())
    assert ckpt.input_offsets == {"in/0": 1200}
    runtime.run(max_records=700)  # state and output past the checkpoint, then a "crash"
    runtime.close()

    second = KeyCounter()
    recovered = _runtime(second, input_log, output_log, store,
                         CheckpointPolicy.operator_driven(), chunk_records=100)
    report = recovered.recover(replay=False)
    assert report.checkpoint_sequence_id == ckpt.sequence_id
    assert second.resets[-1] == ckpt.sequence_id
    assert second.state() == at_checkpoint  # decoded with ckpt.value()
    assert second.counts == _expected_counts(1200)
    recovered.run()
    assert second.records == total
    assert second.counts == _expected_counts(total)
    recovered.close()
    for closing in (store, output_log, input_log):
        closing.close()


def test_periodic_checkpoints_through_the_runtime_match_their_offsets(tmp_path):
    """Real clock, 20 ms interval, 50 ms serialiser: every stored snapshot is the state
    at the chunk boundary whose input offset it carries."""
    def slow_serialize(snapshot) -> bytes:
        time.sleep(SERIALIZE_S)
        return DEFAULT_CODEC.encode(snapshot)

    class SlowChunks(KeyCounter):
        def process_chunk(self, chunk, out) -> None:
            super().process_chunk(chunk, out)
            time.sleep(0.004)  # a chunk takes a while, so the run spans many ticks

    input_log = _input(tmp_path / "in", 8000)
    output_log = streamlog.open_log(tmp_path / "out", fsync="never")
    store = CheckpointStore(tmp_path / "ckpt", keep=1000)
    operator = SlowChunks(serialize=slow_serialize)
    runtime = _runtime(operator, input_log, output_log, store,
                       CheckpointPolicy.periodic(INTERVAL_S), chunk_records=50)
    runtime.recover()
    runtime.run()
    runtime.close()
    stats = runtime.checkpointer.stats
    stored = [store.get(i) for i in store.sequence_ids()]
    assert stats.started >= 3 and stats.dropped >= 1
    assert len(stored) == stats.written == stats.started
    for ckpt in stored:
        offset = ckpt.input_offsets["in/0"]
        assert offset % 50 == 0  # a chunk boundary
        assert ckpt.value() == {"counts": _expected_counts(offset), "records": offset}
    assert stats.snapshot_seconds < 0.25 * stats.serialize_seconds
    for closing in (store, output_log, input_log):
        closing.close()
