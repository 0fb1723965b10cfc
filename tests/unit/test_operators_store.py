"""Operators that recover on another machine (DESIGN 7, 8, 11): checkpoints as objects
in a store (operators/checkpoint_objects.py), and the runtime's recovery from the store
alone, in a new directory on a new machine, for CRB (checkpoints) and CEC (footprints in
the output log). The output is tiered with durability "remote"; the input is read
straight from the store. In memory: a MemoryFileIO per machine, MemoryStore for the
store, real threads; a lost machine is one whose logs are left open, as a machine cut
off is. tests/integration/test_operators_store_kill.py kills real processes against a
real S3 server."""

from __future__ import annotations

import itertools
import logging
import random
import struct

import pytest

import streamlog
from streamlog.errors import (CorruptObject, Fenced, InvalidArgument, PreconditionFailed,
                              StoreUnavailable, StreamLogError)
from streamlog.operators import (AggregateOperator, CECPolicy, CheckpointPolicy,
                                 CheckpointStore, ObjectCheckpointStore, OperatorRuntime,
                                 Tumbling, WindowedOperator, WindowSpec, read_window_results)
from streamlog.operators.checkpoint import Checkpointer
from streamlog.operators.checkpoint_objects import decode_object, encode_object, object_key
from streamlog.operators.checkpoint_value import Checkpoint
from streamlog.operators.window_functions import SumInt64
from streamlog.remote.store import RetryPolicy, Retrying
from streamlog.testing import MemoryFileIO
from streamlog.testing.memindex import MemoryIndexStorage
from streamlog.testing.memstore import MemoryBucket, MemoryStore

INPUT_RECORDS = 3000
CHUNK = 40
WINDOW = WindowSpec.count(9)
MACHINES = itertools.count()
OUTPUT = dict(fsync="never", durability="remote", remote_commit_ms=1,
              segment_bytes_max=16 * 1024)


def ckpt(sequence_id: int, state: bytes = b"") -> Checkpoint:
    return Checkpoint(sequence_id, {"in/0": sequence_id * 10}, {"out/0": sequence_id}, 123,
                      state or b"state-%d" % sequence_id)


def retrying(store) -> Retrying:
    """`store` behind retries that do not wait."""
    return Retrying(store, RetryPolicy(attempts_max=5), sleep=lambda s: None)


def keys(bucket: MemoryBucket, prefix: str = "op") -> list[str]:
    return [meta.key for meta in MemoryStore(bucket, prefix=prefix).list("checkpoints")]


# -- the checkpoint store over an object store -----------------------------------------

def test_checkpoints_are_objects_that_another_machine_finds_by_listing():
    bucket = MemoryBucket()
    with ObjectCheckpointStore(MemoryStore(bucket, prefix="op"), keep=2) as store:
        assert store.latest() is None
        assert store.next_sequence_id() == 1
        for sequence_id in (1, 4, 9):
            store.put(ckpt(sequence_id))
        assert store.sequence_ids() == [4, 9]
        assert keys(bucket) == [object_key(4), object_key(9)]  # the oldest was pruned
        assert object_key(9) == "checkpoints/00000000000000000009"
    other = ObjectCheckpointStore(MemoryStore(bucket, prefix="op"), keep=2)  # elsewhere
    assert other.latest() == ckpt(9)
    assert other.latest(lambda c: c.output_offsets["out/0"] < 9).sequence_id == 4
    assert other.get(1) is None
    assert other.next_sequence_id() == 10
    assert other.url == "memory://memory/op/checkpoints"


def test_ids_only_increase_and_two_writers_cannot_both_write_one():
    bucket = MemoryBucket()
    first = ObjectCheckpointStore(MemoryStore(bucket, prefix="op"))
    second = ObjectCheckpointStore(MemoryStore(bucket, prefix="op"))
    first.put(ckpt(5))
    with pytest.raises(AssertionError):  # its own ids: our invariant
        first.put(ckpt(5))
    for sequence_id in (5, 3):  # another writer's: refused, naming the key
        with pytest.raises(PreconditionFailed) as refused:
            second.put(ckpt(sequence_id, b"the second writer's"))
        assert refused.value.key == object_key(sequence_id)
        assert "another writer" in str(refused.value)
    assert second.latest() == ckpt(5)
    second.put(ckpt(6))
    assert first.sequence_ids() == [5, 6]


class LaggingListing:
    """A store whose listing has not seen the newest objects yet (a writer listed, then
    another wrote): only the conditional create stands between two writers."""

    def __init__(self, store: MemoryStore) -> None:
        self.store, self.url = store, store.url
        self.hidden: set[str] = set()

    def __getattr__(self, name):
        return getattr(self.store, name)

    def list(self, prefix: str = ""):
        return [meta for meta in self.store.list(prefix) if meta.key not in self.hidden]


def test_a_race_on_one_id_is_lost_by_the_second_writer_whatever_it_listed():
    bucket = MemoryBucket()
    ObjectCheckpointStore(MemoryStore(bucket, prefix="op")).put(ckpt(7, b"first"))
    lagging = LaggingListing(MemoryStore(bucket, prefix="op"))
    lagging.hidden.add(object_key(7))
    late = ObjectCheckpointStore(lagging)
    assert late.next_sequence_id() == 1  # it cannot know
    with pytest.raises(PreconditionFailed) as refused:
        late.put(ckpt(7, b"second"))
    assert refused.value.key == object_key(7) and "written by another writer first" in str(
        refused.value)
    assert ObjectCheckpointStore(MemoryStore(bucket, prefix="op")).get(7).state == b"first"


@pytest.mark.parametrize("where", ["state", "metadata", "header id", "magic"])
def test_a_damaged_checkpoint_is_named_by_key_and_recovery_falls_back(caplog, where):
    bucket = MemoryBucket()
    raw = MemoryStore(bucket, prefix="op")
    store = ObjectCheckpointStore(raw)
    store.put(ckpt(1, b"good"))
    store.put(ckpt(2, b"will be damaged"))
    position = {"state": len(encode_object(ckpt(2, b"will be damaged"))) - 1,
                "metadata": 14 + 18 + 3, "header id": 13, "magic": 0}[where]
    raw.flip_bit(object_key(2), position)
    with pytest.raises(CorruptObject) as damaged:
        store.get(2)
    assert damaged.value.key == object_key(2)
    with caplog.at_level(logging.WARNING, "streamlog.checkpoint"):
        assert store.latest().state == b"good"
    assert object_key(2) in caplog.text
    assert store.next_sequence_id() == 3  # a damaged id is still taken


def test_an_object_under_another_ids_key_is_refused():
    data = encode_object(ckpt(2))
    assert decode_object(2, data, key=object_key(2)) == ckpt(2)
    with pytest.raises(CorruptObject, match="holds checkpoint 2, not 3"):
        decode_object(3, data, key=object_key(3))
    with pytest.raises(CorruptObject, match="shorter than its header"):
        decode_object(2, data[:10], key=object_key(2))


class ListsGhosts(LaggingListing):
    """A store whose listing names objects that are gone by the time they are read
    (deleted by another writer's pruning, or a lifecycle rule)."""

    def list(self, prefix: str = ""):
        found = self.store.list(prefix)
        for meta in found:
            if meta.key in self.hidden:
                self.store.remove(meta.key)
        return found


def test_a_listed_checkpoint_gone_when_read_is_passed_over(caplog):
    bucket = MemoryBucket()
    ObjectCheckpointStore(MemoryStore(bucket, prefix="op")).put(ckpt(1))
    ObjectCheckpointStore(MemoryStore(bucket, prefix="op")).put(ckpt(2))
    ghosts = ListsGhosts(MemoryStore(bucket, prefix="op"))
    ghosts.hidden.add(object_key(2))
    with caplog.at_level(logging.WARNING, "streamlog.checkpoint"):
        assert ObjectCheckpointStore(ghosts).latest() == ckpt(1)
    assert f"{object_key(2)}" in caplog.text and "gone when read" in caplog.text


def test_leftovers_of_a_writer_killed_before_pruning_go_at_the_next_put():
    bucket = MemoryBucket()
    raw = MemoryStore(bucket, prefix="op")
    for sequence_id in range(1, 6):  # puts whose pruning never ran
        raw.put(object_key(sequence_id), encode_object(ckpt(sequence_id)), if_absent=True)
    store = ObjectCheckpointStore(MemoryStore(bucket, prefix="op"), keep=2)
    assert store.next_sequence_id() == 6
    store.put(ckpt(6))
    assert store.sequence_ids() == [5, 6]


def test_a_failed_prune_is_logged_and_done_after_the_next_put(caplog):
    bucket = MemoryBucket()
    raw = MemoryStore(bucket, prefix="op")
    store = ObjectCheckpointStore(raw, keep=1)
    store.put(ckpt(1))
    raw.fail_next("delete", 1, StoreUnavailable)
    with caplog.at_level(logging.WARNING, "streamlog.checkpoint"):
        store.put(ckpt(2))  # durable: the failed delete is not the put's outcome
    assert object_key(1) in caplog.text
    assert store.sequence_ids() == [1, 2]
    store.put(ckpt(3))
    assert store.sequence_ids() == [3]


def test_an_unavailable_store_is_retried_and_a_lost_response_stays_idempotent():
    bucket = MemoryBucket()
    raw = MemoryStore(bucket, prefix="op")
    store = ObjectCheckpointStore(retrying(raw))
    raw.fail_next("list", 2)
    raw.fail_next("put", 3)
    store.put(ckpt(1))
    raw.lose_response_next("put")  # it took effect; the retry finds its own bytes
    store.put(ckpt(2))
    assert store.sequence_ids() == [1, 2]
    assert store.latest() == ckpt(2)
    assert raw.errors["list"] == 2 and raw.errors["put"] >= 4


def test_a_store_that_stays_down_fails_checkpointing_for_good():
    raw = MemoryStore(prefix="op")
    store = ObjectCheckpointStore(retrying(raw))
    checkpointer = Checkpointer(Constant(), store, CheckpointPolicy.operator_driven(),
                                background=False)
    assert checkpointer.create_checkpoint({"in/0": 1}, {"out/0": 1}).sequence_id == 1
    raw.down()
    with pytest.raises(StreamLogError, match="checkpoint 2 failed while writing it"):
        checkpointer.create_checkpoint({"in/0": 2}, {"out/0": 2})
    raw.up()
    with pytest.raises(StreamLogError, match="checkpointing stopped after a failure"):
        checkpointer.create_checkpoint({"in/0": 3}, {"out/0": 3})  # sticky, as on disk
    assert store.sequence_ids() == [1]


class Constant:
    def checkpoint(self, ckpt) -> None:
        ckpt.state = b"constant"

    def reset(self, ckpt) -> None:
        pass

    def reset_to_initial_state(self) -> None:
        pass


def test_bad_stores_and_options_are_refused():
    with pytest.raises(InvalidArgument, match="keep"):
        ObjectCheckpointStore(MemoryStore(), keep=0)
    with pytest.raises(InvalidArgument, match="storage_options"):
        ObjectCheckpointStore(MemoryStore(), storage_options={"region": "x"})
    with pytest.raises(InvalidArgument, match="s3://"):
        ObjectCheckpointStore("gs://bucket/prefix")
    with pytest.raises(InvalidArgument, match="object store"):
        ObjectCheckpointStore(object())
    with pytest.raises(InvalidArgument, match="ObjectCheckpointStore"):
        CheckpointStore("s3://bucket/checkpoints")  # not a directory named "s3:"
    store = ObjectCheckpointStore("s3://bucket/prefix",  # no request until used
                                  storage_options={"endpoint": "http://127.0.0.1:9"})
    assert store.url == "s3://bucket/prefix/checkpoints"


# -- an operator recovered on another machine from the store alone ----------------------

def machine() -> dict:
    """A new machine's disk: nothing on it."""
    return {"fileio": MemoryFileIO(), "index_storage": MemoryIndexStorage()}


@pytest.fixture(scope="module")
def bucket() -> MemoryBucket:
    """A bucket holding the input, written by a tiered log that is gone since: prefix
    "in", stream "in", skewed keys, runs of equal timestamps, some late records."""
    bucket = MemoryBucket()
    rng = random.Random(11)
    keys_ = [b"k%d" % (int(rng.paretovariate(1.0)) % 30) for _ in range(INPUT_RECORDS)]
    values = [struct.pack("<q", rng.randint(-50, 500)) for _ in range(INPUT_RECORDS)]
    stamps = [5_000_000 + (i // 6) * 1000 - (rng.randint(1, 9000) if rng.random() < 0.03
                                             else 0) for i in range(INPUT_RECORDS)]
    with streamlog.open_log("/in", remote=MemoryStore(bucket, prefix="in"),
                            **{**OUTPUT, "segment_bytes_max": 8192}, **machine()) as log:
        log.create_stream("in")
        log.append_batch_sync("in", values, keys=keys_, timestamps_us=stamps)
    return bucket


def make_operator(kind: str):
    if kind == "windows":
        return WindowedOperator(Tumbling(size=11, by="count"), SumInt64(),
                                cec=CECPolicy(q_target=60, u_target=300))
    cec = CECPolicy(q_target=60, u_target=400) if kind == "cec" else None
    return AggregateOperator(WINDOW, cec=cec)


def results(log, kind: str) -> list:
    if kind == "windows":  # (their output offsets depend on G_CHECKs, timed: left out)
        return [(r.input_offset, r.window_end, r.key, r.window_start, r.count, r.value,
                 r.timestamp_us) for r in read_window_results(log, "out")]
    return [(r.key, r.timestamp_us, r.value) for r in log.reader("out", 0)]


class Job:
    """One run of the operator on one machine: the input read from the store, the output
    tiered to it (durability "remote") in a directory of this machine, CRB's checkpoints
    in the store beside the output."""

    def __init__(self, bucket: MemoryBucket, kind: str, prefix: str, disk: dict) -> None:
        self.input_log = streamlog.open_log(MemoryStore(bucket, prefix="in"))
        self.directory = f"/machine-{next(MACHINES)}/out"  # each machine's own path
        self.output_log = streamlog.open_log(self.directory, remote=MemoryStore(
            bucket, prefix=prefix), **OUTPUT, **disk)
        self.store = (ObjectCheckpointStore(MemoryStore(bucket, prefix=prefix))
                      if kind == "crb" else None)
        self.runtime = OperatorRuntime(
            make_operator(kind), input_log=self.input_log, input_stream="in",
            output_log=self.output_log, output_stream="out", store=self.store,
            checkpointing=CheckpointPolicy.operator_driven() if self.store else None,
            chunk_records=CHUNK, progress=None)

    def lose(self) -> None:
        """The machine is gone: nothing is closed (its output writer is fenced by the
        next open; the test closes it at the end)."""

    def close(self) -> None:
        for closing in (self.output_log, self.input_log):
            try:
                closing.close()
            except StreamLogError:  # a fenced writer's last round
                pass


@pytest.fixture(scope="module")
def references(bucket) -> dict:
    """Each operator's results in a failure-free run, on one local output log."""
    found = {}
    for kind in ("crb", "cec", "windows"):
        with streamlog.open_log(MemoryStore(bucket, prefix="in")) as input_log, \
                streamlog.open_log("/ref", fsync="never", **machine()) as output_log:
            runtime = OperatorRuntime(make_operator(kind), input_log=input_log,
                                      input_stream="in", output_log=output_log,
                                      output_stream="out", chunk_records=CHUNK, progress=None)
            runtime.recover()
            runtime.run()
            found[kind] = results(output_log, kind)
    assert len(found["crb"]) == len(found["cec"]) > 300
    assert found["crb"] == found["cec"]
    return found


def finish_elsewhere(bucket, kind: str, prefix: str, jobs: list):
    """A new machine recovers the operator from the store and runs it to the input's
    end; returns (its results, the recovery report)."""
    job = Job(bucket, kind, prefix, machine())
    jobs.append(job)
    report = job.runtime.recover()
    job.runtime.run()
    job.runtime.close()
    return results(job.output_log, kind), report


@pytest.fixture
def jobs():
    started: list[Job] = []
    yield started
    for job in started:
        job.close()


# (input records processed, checkpoint after them or None) then more input, then lost
CRB_CRASHES = {
    "before any checkpoint": [(700, None)],
    "right after a checkpoint": [(1200, "checkpoint")],
    "output after the checkpoint": [(800, "checkpoint"), (900, None)],
    "several checkpoints": [(400, "checkpoint"), (400, "checkpoint"), (400, "checkpoint"),
                            (400, "checkpoint"), (333, None)],
}


@pytest.mark.parametrize("crash", list(CRB_CRASHES))
def test_crb_recovers_on_another_machine_from_the_store_alone(bucket, references, jobs, crash):
    prefix = "crb-" + crash.replace(" ", "-")
    lost = Job(bucket, "crb", prefix, machine())
    jobs.append(lost)
    lost.runtime.recover()
    checkpoints = []
    for records, then in CRB_CRASHES[crash]:
        lost.runtime.run(max_records=records)
        if then == "checkpoint":
            checkpoints.append(lost.runtime.checkpoint_now())
    lost_output = results(lost.output_log, "crb")
    lost.lose()
    got, report = finish_elsewhere(bucket, "crb", prefix, jobs)
    assert got == references["crb"]
    assert lost_output == references["crb"][:len(lost_output)]
    if checkpoints:
        assert report.method == "crb"
        assert report.checkpoint_sequence_id == checkpoints[-1].sequence_id
        assert report.replay_from_offset == checkpoints[-1].input_offsets["in/0"]
    else:
        assert report.replay_from_offset == 0 and report.checkpoint_sequence_id is None
    assert len(lost.store.sequence_ids()) == min(3, len(checkpoints))  # pruned as on disk
    with pytest.raises(Fenced):  # the lost machine, back: it writes nothing any more
        lost.runtime.run()


@pytest.mark.parametrize("damage", ["flip", "remove"])
def test_crb_falls_back_past_a_damaged_or_missing_checkpoint(bucket, references, jobs,
                                                            damage, caplog):
    prefix = f"crb-damage-{damage}"
    lost = Job(bucket, "crb", prefix, machine())
    jobs.append(lost)
    lost.runtime.recover()
    lost.runtime.run(max_records=900)
    older = lost.runtime.checkpoint_now()
    lost.runtime.run(max_records=900)
    newest = lost.runtime.checkpoint_now()
    lost.runtime.run(max_records=500)
    raw = MemoryStore(bucket, prefix=prefix)
    if damage == "flip":
        raw.flip_bit(object_key(newest.sequence_id), 40)
    else:
        raw.remove(object_key(newest.sequence_id))
    with caplog.at_level(logging.WARNING, "streamlog.checkpoint"):
        got, report = finish_elsewhere(bucket, "crb", prefix, jobs)
    assert got == references["crb"]
    assert report.checkpoint_sequence_id == older.sequence_id
    assert report.replay_from_offset == older.input_offsets["in/0"]
    if damage == "flip":
        assert object_key(newest.sequence_id) in caplog.text


@pytest.mark.parametrize("kind", ["cec", "windows"])
@pytest.mark.parametrize("records", [0, 17, 1234, 2999])
def test_cec_recovers_on_another_machine_from_its_output_in_the_store(bucket, references,
                                                                     jobs, kind, records):
    prefix = f"{kind}-{records}"
    lost = Job(bucket, kind, prefix, machine())
    jobs.append(lost)
    lost.runtime.recover()
    if records:
        lost.runtime.run(max_records=records)
    lost.lose()
    got, report = finish_elsewhere(bucket, kind, prefix, jobs)
    assert got == references[kind]
    if records > CHUNK:
        assert report.method == "cec"
        assert 0 < report.replay_from_offset <= records
    with pytest.raises(Fenced):  # the lost machine, back: it writes nothing any more
        lost.output_log.append_batch_sync("out", [b"late"], partition=0)


def test_several_machines_in_a_row_each_from_the_store(bucket, references, jobs):
    """Lost again and again, every time after some progress and for CRB a checkpoint at
    a different point, each machine resuming where the store says."""
    prefix = "crb-chain"
    for step in range(6):
        job = Job(bucket, "crb", prefix, machine())
        jobs.append(job)
        job.runtime.recover()
        job.runtime.run(max_records=230 + 37 * step)
        if step % 2 == 0:
            job.runtime.checkpoint_now()
        job.runtime.run(max_records=111)
        job.lose()
    got, report = finish_elsewhere(bucket, "crb", prefix, jobs)
    assert got == references["crb"]
    assert report.method == "crb"


def test_holds_follow_the_operator_across_machines(bucket, jobs):
    """A tiered output names the operator's holds by its store URL, not by its
    directory; an input read from the store keeps none (it has no directory)."""
    first = Job(bucket, "cec", "holds", machine())
    jobs.append(first)
    first.runtime.recover()
    first.runtime.run(max_records=500)
    first.lose()
    second = Job(bucket, "cec", "holds", machine())
    jobs.append(second)
    second.runtime.recover()
    assert second.directory != first.directory
    assert second.runtime.hold_name == first.runtime.hold_name
    assert not second.runtime.holds.input_holds
    assert list(second.output_log.holds("out", 0)) == [second.runtime.hold_name]
    local = streamlog.open_log("/elsewhere/out", **machine(), fsync="never")
    try:
        assert OperatorRuntime(make_operator("cec"), input_log=second.input_log,
                               input_stream="in", output_log=local,
                               output_stream="out").hold_name != first.runtime.hold_name
    finally:
        local.close()
