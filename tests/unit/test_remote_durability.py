"""Durability "remote" (remote/group_commit.py, tiering.py): an ack means a committed
manifest generation holds the record. A group commit is one PUT: the generation,
carrying the new records of every partition; sealed segments replace their pieces; a restore after
the machine is lost has every acknowledged record at its offset; the store down is a
StoreTimeout, never a crash or a loss; a newer writer fences the acks. In memory:
MemoryFileIO per machine, MemoryStore for the store; real threads."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest

import streamlog
from streamlog.errors import CorruptionError, CorruptObject, Fenced, StoreTimeout
from streamlog.remote import manifest as manifests
from streamlog.testing import MemoryFileIO
from streamlog.testing.memindex import MemoryIndexStorage
from streamlog.testing.memstore import MemoryBucket, MemoryStore

OPTIONS = dict(segment_bytes_max=8192, compression="none", fsync="never",
               durability="remote", remote_commit_ms=2)


def machine() -> dict:
    return {"fileio": MemoryFileIO(), "index_storage": MemoryIndexStorage()}


def open_remote(bucket, disk=None, **options):
    return streamlog.open_log("/data/log", remote=MemoryStore(bucket), **(disk or machine()),
                              **{**OPTIONS, **options})


def store_end(bucket, name: str) -> int:
    found = manifests.latest(MemoryStore(bucket)).partitions.get(name)
    return found.committed_end if found is not None else 0


def append_from_threads(log, threads: int, each: int) -> dict[int, list]:
    """Appends from real threads; {partition: [(offset, value)]} of the acks."""
    acked: dict[int, list] = {0: [], 1: [], 2: []}
    lock = threading.Lock()

    def work(t: int) -> None:
        for i in range(each):
            value = b"t%02d-%04d" % (t, i) + b"." * 40
            partition = (t + i) % 3
            offset = log.append_sync("s", value, partition=partition,
                                     timestamp_us=1_000_000 + i).offset
            with lock:
                acked[partition].append((offset, value))

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    return acked


def test_an_ack_means_a_committed_generation_holds_the_record():
    bucket = MemoryBucket()
    with open_remote(bucket) as log:
        log.create_stream("s", 3)
        for i in range(60):
            offset = log.append_sync("s", b"r%03d" % i, partition=i % 3).offset
            assert store_end(bucket, f"s/{i % 3}") > offset  # already, at the ack
        txn = log.new_txn_id()
        log.append_batch_sync("s", [b"in-txn"], partition=0, txn_id=txn)
        at = log.commit_txn("s", 0, txn, tag="q", marker=b"m1")
        assert store_end(bucket, "s/0") > at

        async def appended():
            return await log.append("s", b"awaited", partition=1)

        position = asyncio.run(appended())
        assert store_end(bucket, "s/1") > position.offset
        with streamlog.open_log(MemoryStore(bucket)) as view:
            assert [r.value for r in view.reader("s", 1)][-1] == b"awaited"
            assert view.last_commit("s", 0, "q") == b"m1"


class _CountingStore(MemoryStore):
    """The in-memory store, keeping the keys of the PUTs that reach it."""

    keys: list = []

    def put(self, key, data, **conditions):
        result = super().put(key, data, **conditions)
        type(self).keys.append(key)
        return result


def test_one_put_per_commit_for_every_partition_with_new_records():
    """A group commit is one object: the generation, carrying the records of every
    partition with new ones. The store sees one PUT per commit (and the take-over's)."""
    bucket = MemoryBucket()
    _CountingStore.keys = []
    log = streamlog.open_log("/data/log", remote=_CountingStore(bucket), **machine(),
                             **{**OPTIONS, "remote_commit_ms": 20})
    with log:
        log.create_stream("s", 3)
        append_from_threads(log, threads=9, each=30)
    stats = dict(log.tiering.stats)  # (closing may commit more)
    newest = manifests.latest(MemoryStore(bucket))
    assert stats["tail_commits"] < 9 * 30 / 2  # acks were grouped
    keys = {piece.key for part in newest.partitions.values() for piece in part.tail}
    assert keys and all(manifests.generation_of(key) is not None for key in keys)
    shared = [key for key in keys if sum(
        piece.key == key for part in newest.partitions.values() for piece in part.tail) >= 2]
    assert shared, "no generation held pieces of several partitions"
    # one PUT per commit, + the take-over's generation (and sealed segment objects,
    # each named by the last generation: the close names those put since the last
    # full round; no tail goes anywhere else)
    generations = [key for key in _CountingStore.keys if key.startswith("manifest/")]
    assert len(generations) == len(set(generations)) == stats["commits"] + 1
    others = {key for key in _CountingStore.keys if key not in generations}
    named = {key for part in newest.partitions.values() for segment in part.segments
             for key in (segment.key, segment.index_key)}
    assert others == named
    assert stats["tail_commits"] <= stats["commits"]


def test_a_restore_after_losing_the_machine_has_every_acknowledged_record():
    bucket = MemoryBucket()
    log = open_remote(bucket)
    log.create_stream("s", 3)
    acked = append_from_threads(log, threads=6, each=60)
    # the machine is gone: nothing closed, nothing flushed; a new one restores
    with open_remote(bucket) as restored:
        assert restored.info()["restored"]["lost"] == {}
        for partition, items in acked.items():
            got = {r.offset: r.value for r in restored.reader("s", partition)}
            assert all(got.get(offset) == value for offset, value in items)
            assert len(got) >= len(items)  # (a record written but not acked may be too)
            assert restored.append_sync("s", b"next", partition=partition).offset == (
                restored.end_offset("s", partition) - 1)
    log.tiering.close()


def test_sealed_segments_replace_their_pieces_and_unnamed_payloads_are_swept():
    bucket = MemoryBucket()
    store = MemoryStore(bucket)
    # The grace outlasts the checks below on a slow machine: a round of the tiering
    # thread may sweep the garbage as soon as its grace has passed.
    with open_remote(bucket, remote_grace_s=2.0) as log:
        log.create_stream("s", 1)
        for i in range(400):  # several segments roll
            log.append_sync("s", b"%05d" % i + b"-" * 60)
        log.tiering.run_once()  # a full round: the sealed segments go up whole
        newest = manifests.latest(store).partitions["s/0"]
        assert len(newest.segments) >= 2
        assert {p.segment_base for p in newest.tail} <= {
            log._partition("s", 0).state.segments[-1].base_offset}
        listed = manifests.latest(store).garbage
        garbage = [key for key, _ in listed]
        not_yet_due = [key for key, after_us in listed if after_us > time.time() * 1e6]
        assert not_yet_due and all(store.bucket.object(key) for key in not_yet_due)
        time.sleep(2.1)
        log.tiering.run_once()
        assert manifests.latest(store).garbage == ()
        assert garbage and all(manifests.generation_of(key) is not None
                               for key in garbage)  # the generations that held pieces
        assert not [meta for meta in store.list("manifest") if meta.key in garbage]
        with streamlog.open_log(MemoryStore(bucket)) as view:
            assert [r.value for r in view.reader("s", 0)] == [
                r.value for r in log.reader("s", 0)]


def test_the_store_down_is_a_timeout_then_the_backlog_drains():
    bucket = MemoryBucket()
    store = MemoryStore(bucket)
    log = streamlog.open_log("/data/log", remote=store, **machine(),
                             **{**OPTIONS, "remote_timeout_s": 0.3})
    with log:
        log.create_stream("s", 1)
        log.append_sync("s", b"before")
        store.down()
        started = time.monotonic()
        with pytest.raises(StoreTimeout):
            log.append_sync("s", b"while down")
        assert time.monotonic() - started < 5
        assert [r.value for r in log.reader("s", 0)] == [b"before", b"while down"]
        store.up()
        assert log.append_sync("s", b"after").offset == 2
        assert store_end(bucket, "s/0") == 3  # the timed-out record went up too
    with streamlog.open_log(MemoryStore(bucket)) as view:
        assert [r.value for r in view.reader("s", 0)] == [b"before", b"while down", b"after"]


def test_a_newer_writer_fences_the_older_writers_acks():
    bucket = MemoryBucket()
    older = open_remote(bucket)
    older.create_stream("s", 1)
    older.append_sync("s", b"mine")
    with open_remote(bucket) as newer:
        with pytest.raises(Fenced):
            for _ in range(100):  # its next commit meets the newer epoch
                older.append_sync("s", b"late")
        assert newer.append_sync("s", b"theirs").offset == 1
    with streamlog.open_log(MemoryStore(bucket)) as view:
        assert [r.value for r in view.reader("s", 0)] == [b"mine", b"theirs"]
    older.tiering.close()


def test_damage_in_a_tail_object_is_named_and_never_delivered():
    bucket = MemoryBucket()
    with open_remote(bucket) as log:
        log.create_stream("s", 1)
        for i in range(20):
            log.append_sync("s", b"%05d" % i + b"-" * 30)
        log.tiering.close()
    piece = manifests.latest(MemoryStore(bucket)).partitions["s/0"].tail[5]
    MemoryStore(bucket).flip_bit(piece.key, piece.at + piece.size - 3, 1)
    with streamlog.open_log(MemoryStore(bucket)) as view:
        got = []
        with pytest.raises(CorruptionError):
            for record in view.reader("s", 0):
                got.append(record.offset)
        assert got == list(range(piece.base_offset))
    with pytest.raises(CorruptObject, match=piece.key):
        open_remote(bucket)


def test_closing_commits_what_is_queued_and_fails_nothing_the_store_took():
    """Appends in flight when the log closes are written, go up in a last tail round
    and are acknowledged; none is left waiting."""
    bucket = MemoryBucket()
    log = open_remote(bucket, remote_commit_ms=200)
    log.create_stream("s", 1)
    results = []

    async def many():
        results.extend(await asyncio.gather(*(log.append("s", b"%03d" % i)
                                              for i in range(50))))

    thread = threading.Thread(target=asyncio.run, args=(many(),))
    thread.start()
    time.sleep(0.05)
    log.close()
    thread.join(30)
    assert not thread.is_alive() and len(results) == 50
    assert store_end(bucket, "s/0") == 50


def test_seeks_by_time_are_exact_across_segment_objects_and_tail_pieces():
    """The store holds the oldest segments whole and the rest as tail pieces: a view's
    seek by time (DESIGN 5, by the running max of timestamps that go back now and
    then) gives the local log's answer for every timestamp, on both sides of that
    boundary and across it."""
    bucket = MemoryBucket()
    with open_remote(bucket) as log:
        log.create_stream("s", 1)
        for i in range(500):
            log.append_sync("s", b"%05d" % i + b"-" * 40,
                            timestamp_us=1_000_000 + 10 * i - (45 if i % 7 == 3 else 0))
        log.tiering.run_once()  # sealed segments whole; the active one stays in pieces
        part = manifests.latest(MemoryStore(bucket)).partitions["s/0"]
        assert part.segments and part.tail
        boundary = part.sealed_end
        with streamlog.open_log(MemoryStore(bucket)) as view:
            assert view.end_offset("s", 0) == log.end_offset("s", 0)
            for t in range(1_000_000 - 60, 1_000_000 + 5_060, 3):
                assert view.offset_for_timestamp("s", 0, t) == log.offset_for_timestamp(
                    "s", 0, t), t
            first = next(iter(view.reader("s", 0, from_offset=boundary - 2)))
            assert first.offset == boundary - 2
            assert [r.offset for r in view.reader("s", 0, from_offset=boundary - 2)] == list(
                range(boundary - 2, 500))


@pytest.mark.parametrize("seed", range(8))
def test_a_power_loss_that_leaves_the_local_log_behind_the_store_is_caught_up(seed):
    """Durability "remote" acknowledges once the store holds a record, whatever the
    local fsync: here there is none (fsync "never"), and the power fails. The local
    log may then lack records the store acknowledged; the next open restores those
    partitions from the store, so every acknowledged record is there at its offset,
    the appends after it go on past them (never over them), and the store and the
    local log read the same."""
    from streamlog.testing import FaultFileIO
    rng = random.Random(seed)
    bucket, memory, storage = MemoryBucket(), MemoryFileIO(), MemoryIndexStorage()

    def boot():
        fs = FaultFileIO(seed, inner=memory)
        storage.reboot()
        storage.attach(fs)
        return {"fileio": fs, "index_storage": storage}

    options = {**OPTIONS, "fsync": "never",
               "segment_bytes_max": rng.choice([4096, 8192, 65536])}
    disk = boot()
    log = streamlog.open_log("/data/log", remote=MemoryStore(bucket), **disk, **options)
    log.create_stream("s", 3)
    if rng.random() < 0.5:  # some of it made durable locally before
        acked = append_from_threads(log, threads=2, each=10)
        log.close()
        disk = boot()
        log = streamlog.open_log("/data/log", remote=MemoryStore(bucket), **disk, **options)
    else:
        acked = {0: [], 1: [], 2: []}
    for partition, items in append_from_threads(log, threads=3, each=rng.randint(5, 40)).items():
        acked[partition] += items
    disk["fileio"].crash(random.Random(seed), rng.choice(["drop_unsynced", "torn"]))
    disk["fileio"].abandon(log)
    log.tiering.close()
    ends = {n: store_end(bucket, f"s/{n}") for n in range(3)}
    with streamlog.open_log("/data/log", remote=MemoryStore(bucket), **boot(),
                            **options) as log:
        for partition, items in acked.items():
            got = {r.offset: r.value for r in log.reader("s", partition)}
            assert all(got.get(offset) == value for offset, value in items), partition
            assert log.end_offset("s", partition) >= ends[partition]
            after = log.append_sync("s", b"after", partition=partition)
            assert after.offset == log.end_offset("s", partition) - 1 >= ends[partition]
        with streamlog.open_log(MemoryStore(bucket)) as view:
            for partition in range(3):
                assert [(r.offset, r.value) for r in view.reader("s", partition)] == [
                    (r.offset, r.value) for r in log.reader("s", partition)]


def test_a_commit_whose_answer_was_lost_is_gone_on_from_never_fought():
    """A group commit's PUT that took effect but whose answer was lost (the store
    failing mid-request) leaves the writer unsure; its next round, holding more
    records, finds that generation committed by itself, goes on from it, and commits
    the rest after it: no stall, no record twice, none lost, every ack given."""
    bucket = MemoryBucket()
    store = MemoryStore(bucket)
    with streamlog.open_log("/data/log", remote=store, **machine(), **OPTIONS) as log:
        log.create_stream("s", 3)
        acked = append_from_threads(log, threads=3, each=5)
        for _ in range(3):
            store.lose_response_next("put")
            for partition, items in append_from_threads(log, threads=3, each=5).items():
                acked[partition] += items
        assert log.tiering.error is None
        ends = {n: store_end(bucket, f"s/{n}") for n in range(3)}
    assert ends == {n: len(items) for n, items in acked.items()}
    with streamlog.open_log(MemoryStore(bucket)) as view:
        for partition, items in acked.items():
            assert [(r.offset, r.value) for r in view.reader("s", partition)] == sorted(items)


def test_snapshots_keep_every_chain_of_deltas_short():
    """Every commit after the first is a delta; the writer stores a snapshot of the
    manifest every SNAPSHOT_EVERY generations off its commit path, and its later
    deltas start from it: reading the newest generation fetches one snapshot and at
    most a couple of SNAPSHOT_EVERY deltas, however long the log has run."""
    bucket = MemoryBucket()
    store = MemoryStore(bucket)
    with open_remote(bucket, remote_commit_ms=1) as log:
        log.create_stream("s", 2)
        for i in range(400):  # one commit each: an ack waits for it
            log.append_sync("s", b"%05d" % i, partition=i % 2)
        newest = log.tiering.manifest
        assert newest.generation >= 300
        assert [meta.key for meta in store.list("snapshot")]
        assert newest.generation - newest.based_on <= 2 * manifests.SNAPSHOT_EVERY
        found = manifests.read(store, newest.generation)
        assert found == newest and found.based_on == newest.based_on
        whole = [g for g in range(newest.generation + 1) if isinstance(
            manifests.decode_object(store.get(manifests.key_of(g)), manifests.key_of(g)),
            manifests.Manifest)]
        assert whole == [0]  # no whole manifest on the commit path after the first
    with streamlog.open_log(MemoryStore(bucket)) as view:
        assert [r.value for r in view.reader("s", 1)] == [b"%05d" % i
                                                          for i in range(1, 400, 2)]


def test_a_segment_held_as_many_tail_pieces_is_sealed_and_goes_up_whole(monkeypatch):
    """Every group commit adds a tail piece per partition: once a partition's tail
    holds TAIL_PIECES_MAX of them, a full round seals its segment, which goes up
    whole, and the pieces leave the manifest (they would make every snapshot
    larger until the segment sealed by size or age)."""
    from streamlog.remote import tiering as tiering_module
    monkeypatch.setattr(tiering_module, "TAIL_PIECES_MAX", 20)
    bucket = MemoryBucket()
    with open_remote(bucket, remote_commit_ms=1, segment_bytes_max=1 << 20) as log:
        log.create_stream("s", 1)
        for i in range(60):  # a commit each: 60 pieces in one segment, unless sealed
            log.append_sync("s", b"%05d" % i)
            if i % 10 == 9:
                log.tiering.run_once()  # a full round
        log.tiering.run_once()
        part = manifests.latest(MemoryStore(bucket)).partitions["s/0"]
        assert part.segments and len(part.tail) < 60 - 20
    with streamlog.open_log(MemoryStore(bucket)) as view:
        assert [r.value for r in view.reader("s", 0)] == [b"%05d" % i for i in range(60)]
