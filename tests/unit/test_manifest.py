"""The manifest (remote/manifest.py): its encoding and checks, finding the newest
generation, committing with conditional creates, and fencing by epoch, over the
in-memory store (testing/memstore.py) with real threads where openers race."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from streamlog.errors import CorruptObject, Fenced, PreconditionFailed, StoreUnavailable
from streamlog.remote.manifest import (Manifest, PartitionManifest, SegmentObject, commit,
                                       decode, encode, generation_of, key_of, latest,
                                       take_over)
from streamlog.testing.memstore import MemoryStore


def sample(generation: int = 7, epoch: int = 3) -> Manifest:
    segment = SegmentObject(0, 120, "segments/s/0/00000000000000000000-3.log", 4096,
                            "ab" * 16, "segments/s/0/00000000000000000000-3.idx",
                            -5, 900, 900)
    return Manifest(generation, epoch, "host:123", {"s": 2},
                    {"s/0": PartitionManifest(0, 130, None, (segment,)),
                     "s/1": PartitionManifest(40, 40, 77, ())},
                    (("segments/s/1/old.log", 1_700_000_000_000_000),))


def test_a_manifest_round_trips_and_names_its_generation():
    manifest = sample()
    data = encode(manifest)
    assert data.startswith(b"streamlog-manifest 2 ")
    assert decode(data, key_of(7)) == manifest
    assert manifest.key == key_of(7) == "manifest/00000000000000000007"
    assert generation_of(manifest.key) == 7
    assert generation_of("manifest/latest") is None and generation_of("segments/x") is None


@pytest.mark.parametrize("damage, reason", [
    (lambda data: b"x" + data[1:], "not a manifest"),
    (lambda data: data.replace(b"streamlog-manifest 2", b"streamlog-manifest 9", 1),
     "format 9"),
    (lambda data: b"streamlog-manifest 1 " + data.split(b" ", 3)[2] + b"\n"
     + data.partition(b"\n")[2], "format 1, this version reads 2"),
    (lambda data: data.partition(b"\n")[0].rsplit(b" ", 1)[0] + b"\n"
     + data.partition(b"\n")[2], "manifest header"),
    (lambda data: data[:-5], "cut short"),
    (lambda data: data[:-2] + bytes([data[-2] ^ 1]) + data[-1:], "checksum mismatch"),
    (lambda data: data.partition(b"\n")[0], "not a manifest"),
])
def test_a_damaged_manifest_is_named_never_read(damage, reason):
    key = key_of(7)
    with pytest.raises(CorruptObject, match=reason) as caught:
        decode(damage(encode(sample())), key)
    assert key in str(caught.value)


def test_a_manifest_stored_under_another_generation_is_refused():
    with pytest.raises(CorruptObject, match="generation 7 stored at"):
        decode(encode(sample(7)), key_of(8))


def test_latest_is_the_newest_generation_and_ignores_other_objects():
    store = MemoryStore()
    assert latest(store) is None
    store.put("segments/s/0/a.log", b"bytes")
    store.put("manifest/notes", b"not a generation")
    for generation in (0, 1, 2):
        commit(store, sample(generation, epoch=1))
    assert latest(store).generation == 2


def test_the_newest_open_takes_over_and_fences_the_older_writer():
    store = MemoryStore()
    first = take_over(store, "first")
    assert (first.generation, first.epoch) == (0, 1)
    committed = commit(store, first.successor(streams={"s": 1}))
    assert committed.generation == 1
    second = take_over(store, "second")
    assert (second.generation, second.epoch) == (2, 2)
    assert second.streams == {"s": 1}  # it continues from what the first committed
    with pytest.raises(Fenced, match="epoch 2"):
        commit(store, committed.successor())  # generation 2: already the second's
    # and fenced for good: its next generations are the newer writer's to commit
    later = commit(store, second.successor())
    with pytest.raises(Fenced):
        commit(store, committed.successor().successor())
    assert latest(store) == later


def test_a_commit_lost_to_an_equal_epoch_is_a_race_not_a_fence():
    store = MemoryStore()
    base = take_over(store, "a")
    commit(store, base.successor(writer="other"))
    with pytest.raises(PreconditionFailed):
        commit(store, base.successor(writer="mine"))


def test_openers_racing_on_threads_each_get_their_own_epoch_in_order():
    store = MemoryStore()
    take_over(store, "origin")
    start = threading.Barrier(6)
    won: list[Manifest] = []
    lock = threading.Lock()

    def open_one(name: str) -> None:
        start.wait()
        manifest = take_over(store, name)
        with lock:
            won.append(manifest)

    threads = [threading.Thread(target=open_one, args=(f"w{i}",)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(won) == 6
    history = [decode(store.get(key_of(g)), key_of(g)) for g in range(7)]
    assert [m.generation for m in history] == list(range(7))
    epochs = [m.epoch for m in history]
    assert epochs == sorted(epochs) and len(set(epochs)) == 7  # strictly rising
    for manifest in won:  # what each opener was told it committed is what the store has
        assert history[manifest.generation] == manifest
    assert latest(store).epoch == max(epochs)


def test_a_store_that_is_down_fails_the_commit_with_its_own_error():
    store = MemoryStore()
    manifest = take_over(store, "a")
    store.down()
    with pytest.raises(StoreUnavailable):
        commit(store, manifest.successor())
    store.up()
    assert commit(store, manifest.successor()).generation == 1


def _with_piece(manifest: Manifest, name: str, n: int) -> Manifest:
    """`manifest`'s successor with one more tail piece in partition `name`."""
    from streamlog.remote.manifest import TailPiece
    import dataclasses
    part = manifest.partitions[name]
    end = part.committed_end
    piece = TailPiece(key_of(n - 1), 100, 10 * n % 100, 10, 120, 10 * n, end, end + 2)
    return manifest.successor(partitions={**manifest.partitions, name: dataclasses.replace(
        part, tail=part.tail + (piece,), committed_end=end + 2, local_end=end + 2)})


def test_group_commits_are_small_deltas_that_read_back_whole():
    """Generations after the first are stored as deltas of their predecessor (a PUT as
    small as what the commit adds); latest(), read() and newer() give back the same
    whole manifests the writer had. A snapshot stored for a generation lets the
    writer's later deltas start from it; read() then fetches no delta before it."""
    from streamlog.remote.manifest import decode_object, newer, read, write_snapshot
    store = MemoryStore()
    current = commit(store, sample(0))
    history = [current]
    for n in range(1, 150):
        if n == 100:
            write_snapshot(store, current)  # generation 99, whole
            current = dataclasses.replace(current, based_on=99)
        current = commit(store, _with_piece(current, f"s/{n % 2}", n), current)
        history.append(current)
    objects = [decode_object(store.get(key_of(g)), key_of(g)) for g in range(150)]
    assert [g for g, found in enumerate(objects) if isinstance(found, Manifest)] == [0]
    assert {found.full for found in objects[1:100]} == {0}
    assert {found.full for found in objects[100:]} == {99}
    sizes = [len(store.get(key_of(g))) for g in range(1, 150)]
    assert max(sizes) < 600
    assert latest(store) == history[-1]
    for g in (0, 1, 63, 64, 65, 99, 100, 149):
        assert read(store, g) == history[g]
        assert newer(store, history[g]) == history[-1]
    counting = _Counting(store)
    read(counting, 120)
    assert sorted(key for _, key, _ in counting.fetched) == sorted(
        ["snapshot/00000000000000000099"] + [key_of(g) for g in range(100, 121)])


def test_a_chain_that_reaches_its_bound_is_cut_by_a_whole_generation(monkeypatch):
    from streamlog.remote import manifest as module
    monkeypatch.setattr(module, "DELTA_CHAIN_MAX", 5)
    store = MemoryStore()
    current = commit(store, sample(0))
    for n in range(1, 12):
        current = commit(store, _with_piece(current, "s/0", n), current)
    found = [module.decode_object(store.get(key_of(g)), key_of(g)) for g in range(12)]
    assert [g for g, f in enumerate(found) if isinstance(f, Manifest)] == [0, 5, 10]
    assert latest(store) == current


def test_a_damaged_delta_in_the_chain_is_named():
    store = MemoryStore()
    current = commit(store, sample(0))
    for n in range(1, 6):
        current = commit(store, _with_piece(current, "s/0", n), current)
    store.flip_bit(key_of(3), 40, 2)
    with pytest.raises(CorruptObject, match=key_of(3)):
        latest(store)


def test_a_generation_that_changes_more_than_the_tail_is_a_delta_of_what_it_changes():
    """A segment named (its pieces gone), retention, streams, garbage and a partition
    removed: each a delta of only the partitions it changed; each reads back whole."""
    from streamlog.remote.manifest import decode_object, read
    store = MemoryStore()
    current = commit(store, sample(0))
    history = [current]
    current = commit(store, _with_piece(current, "s/0", 1), current)
    history.append(current)
    part = current.partitions["s/0"]
    segment = SegmentObject(130, 132, "segments/s/0/b.log", 99, "cd" * 16, None, 1, 2, 2)
    changes = [
        {"partitions": {**current.partitions, "s/0": dataclasses.replace(
            part, segments=part.segments + (segment,), tail=())}},
        {"streams": {"s": 2, "t": 1}},
        {"garbage": (("manifest/00000000000000000001", 5),)},
        {"partitions": {"s/0": current.partitions["s/0"]}},  # s/1 removed
    ]
    for change in changes:
        current = commit(store, current.successor(**change), current)
        history.append(current)
        stored = decode_object(store.get(current.key), current.key)
        assert not isinstance(stored, Manifest)
        assert b'"start_hwm_us":77' not in store.get(current.key)  # s/1's entry: never
    for g, expected in enumerate(history):
        assert read(store, g) == expected
    assert latest(store) == current and set(current.partitions) == {"s/0"}


def _with_own_piece(manifest: Manifest, name: str, data: bytes, **changes) -> Manifest:
    """`manifest`'s successor with one more tail piece in partition `name`, in the
    successor's own payload (`data`, at 0), as the tiering job proposes one."""
    import dataclasses
    from streamlog.remote.manifest import TailPiece
    part = manifest.partitions[name]
    end, position = part.committed_end, sum(p.size for p in part.tail)
    piece = TailPiece(key_of(manifest.generation + 1), 0, 0, len(data), 120, position,
                      end, end + 1)
    return manifest.successor(partitions={**manifest.partitions, name: dataclasses.replace(
        part, tail=part.tail + (piece,), committed_end=end + 1, local_end=end + 1)},
        **changes)


def test_a_generation_carries_its_tail_bytes_and_readers_find_them_in_its_object():
    """A group commit is one object: the generation and the tail bytes it names. Its
    pieces come back keyed by the generation, at their place in its object, whether
    it was stored as a delta or whole, for the writer and for every reader alike."""
    from streamlog.remote.manifest import decode_object, newer, read
    store = MemoryStore()
    current = commit(store, sample(0))
    history, payloads = [current], {}
    for n in range(1, 6):
        data = b"%d" % n * (100 + n)
        proposed = _with_own_piece(current, f"s/{n % 2}", data)
        current = commit(store, proposed, None if n == 3 else current, data)  # 3: whole
        history.append(current)
        payloads[key_of(n)] = data
    assert isinstance(decode_object(store.get(key_of(3)), key_of(3)), Manifest)
    assert not isinstance(decode_object(store.get(key_of(4)), key_of(4)), Manifest)
    pieces = [p for part in current.partitions.values() for p in part.tail]
    assert sorted(p.key for p in pieces) == sorted(payloads)
    for piece in pieces:
        whole = store.get(piece.key)
        assert piece.object_size == len(whole)
        assert whole[piece.at:piece.at + piece.size] == payloads[piece.key]
    assert latest(store) == current
    assert [read(store, g) for g in range(6)] == history
    assert newer(store, history[1]) == current


class _Counting:
    """A store that records what each read fetched."""

    def __init__(self, store) -> None:
        self.store, self.fetched = store, []

    def get(self, key):
        data = self.store.get(key)
        self.fetched.append(("get", key, len(data)))
        return data

    def get_range(self, key, start, end):
        data = self.store.get_range(key, start, end)
        self.fetched.append(("get_range", key, len(data)))
        return data

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_reading_a_generation_fetches_its_manifest_not_its_payload():
    """Opening and polling read the manifest part only: a generation carrying 1 MiB of
    tail costs one ranged GET of its first bytes; a whole manifest longer than that
    costs one more for the rest of its body."""
    from streamlog.remote.manifest import HEAD_BYTES, fetch, read
    store = MemoryStore()
    current = commit(store, sample(0))
    big = b"x" * 2**20
    current = commit(store, _with_own_piece(current, "s/0", big), current, big)
    counting = _Counting(store)
    assert read(counting, 1) == current
    assert [what for what, _, _ in counting.fetched] == ["get_range", "get_range"]
    assert sum(n for _, _, n in counting.fetched) <= 2 * HEAD_BYTES
    many = tuple(SegmentObject(120 * i, 120 * (i + 1), f"segments/s/0/{i:020d}.log", 4096,
                               "ab" * 16, None, 0, 1, 1) for i in range(2000))
    import dataclasses
    wide = current.successor(partitions={**current.partitions, "s/1": dataclasses.replace(
        current.partitions["s/1"], segments=many)})
    wide = commit(store, wide)  # (whole)
    assert len(store.get(key_of(2))) > HEAD_BYTES
    counting.fetched.clear()
    assert fetch(counting, 2) == wide
    assert [what for what, _, _ in counting.fetched] == ["get_range", "get_range"]


def test_a_commit_that_finds_its_own_earlier_attempt_is_told_so_with_it():
    """An attempt whose answer was lost may have taken effect: the writer's next
    commit of that generation, holding more, gets CommittedBefore with the generation
    as committed (not a race lost to another writer, not a fence)."""
    from streamlog.remote.manifest import CommittedBefore
    store = MemoryStore()
    base = commit(store, sample(0))
    landed = commit(store, _with_own_piece(base, "s/0", b"first"), base, b"first")
    more = b"first, and more"
    retry = _with_own_piece(base, "s/0", more)  # the same generation, holding more
    with pytest.raises(CommittedBefore) as caught:
        commit(store, retry, base, more)
    assert caught.value.manifest == latest(store) == landed
    with pytest.raises(PreconditionFailed) as other:  # another writer of that epoch
        commit(store, dataclasses.replace(retry, writer="someone else"), base, more)
    assert not isinstance(other.value, CommittedBefore)
