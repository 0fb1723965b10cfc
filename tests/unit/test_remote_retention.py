"""Retention and truncate_after on a log tiered to a store (remote/tiering.py): each is
a new manifest generation; the objects it drops are deleted only after the grace
period, so a reader pinned to an older generation finishes; the store's copy and the
local log stay the same sequence, under both durabilities. In memory."""

from __future__ import annotations

import time

import pytest

import streamlog
from streamlog.remote import manifest as manifests
from streamlog.testing import MemoryFileIO
from streamlog.testing.memindex import MemoryIndexStorage
from streamlog.testing.memstore import MemoryBucket, MemoryStore

SMALL = dict(segment_bytes_max=4096, compression="none", fsync="never", remote_commit_ms=2)
T0 = 9_000_000


def machine() -> dict:
    return {"fileio": MemoryFileIO(), "index_storage": MemoryIndexStorage()}


def open_tiered(bucket, durability: str, **options):
    log = streamlog.open_log("/data/log", remote=MemoryStore(bucket), **machine(),
                             **{**SMALL, "durability": durability, **options})
    return log


def by_hand(log) -> None:
    """Full rounds by hand from here on (under durability "remote" the job keeps
    committing the tail: the acks need it)."""
    if log.tiering.gate is None:
        log.tiering.close()
    else:
        log.tiering.interval_s = 3600.0
        log.tiering._full_due = float("inf")


def fill(log, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        log.append_sync("s", b"%05d" % i + b"~" * 80,
                        timestamp_us=T0 + 10 * i - (25 if i % 6 == 1 else 0))


def newest(bucket):
    return manifests.latest(MemoryStore(bucket))


def same_as_local(log, bucket) -> None:
    """The store's copy reads as the local log does, offsets and seeks alike."""
    with streamlog.open_log(MemoryStore(bucket)) as view:
        end = view.end_offset("s", 0)
        assert view.start_offset("s", 0) == log.start_offset("s", 0)
        assert [(r.offset, r.value) for r in view.reader("s", 0)] == [
            (r.offset, r.value) for r in log.reader("s", 0, to_offset=end)]
        for t in range(T0 - 100, T0 + 10 * 700, 11):
            assert view.offset_for_timestamp("s", 0, t) == min(
                log.offset_for_timestamp("s", 0, t), end), t


@pytest.mark.parametrize("durability", ["local", "remote"])
def test_retention_moves_the_stores_start_and_sweeps_after_the_grace_period(durability):
    bucket = MemoryBucket()
    store = MemoryStore(bucket)
    with open_tiered(bucket, durability, retention_bytes=12_000, remote_grace_s=0.2) as log:
        by_hand(log)
        log.create_stream("s", 1)
        fill(log, 600)
        log.tiering.run_once()
        before = newest(bucket).partitions["s/0"]
        pinned = streamlog.open_log(MemoryStore(bucket))  # a reader of that generation
        expected = [r.value for r in pinned.reader("s", 0)]
        deleted = log.apply_retention()
        assert deleted
        after = newest(bucket).partitions["s/0"]
        assert after.start_offset == log.start_offset("s", 0) > before.start_offset
        assert after.start_hwm_us == log._partition("s", 0).state.start_hwm_us
        dropped = [s for s in before.segments if s.end_offset <= after.start_offset]
        assert dropped and all(store.head(s.key) for s in dropped)  # not yet deleted
        assert [r.value for r in pinned.reader("s", 0)] == expected  # still readable
        pinned.close()
        same_as_local(log, bucket)
        time.sleep(0.25)
        log.tiering.run_once()
        base = log.tiering.manifest.based_on  # (generations its chain passes through
        assert all(manifests.generation_of(key) >= base  # stay until a snapshot is past)
                   for key, _ in newest(bucket).garbage)
        gone = {meta.key for meta in store.list("segments")}
        assert not {s.key for s in dropped} & gone
        assert not {s.index_key for s in dropped} & gone
        same_as_local(log, bucket)


@pytest.mark.parametrize("durability", ["local", "remote"])
def test_truncate_after_cuts_the_stores_copy_and_it_follows_the_log_again(durability):
    bucket = MemoryBucket()
    with open_tiered(bucket, durability) as log:
        by_hand(log)
        log.create_stream("s", 1)
        fill(log, 500)
        log.tiering.run_once()
        cut = newest(bucket).partitions["s/0"].segments[2].base_offset + 3
        assert log.truncate_after("s", 0, cut) == cut + 1
        assert newest(bucket).partitions["s/0"].committed_end <= cut + 1
        same_as_local(log, bucket)
        fill(log, 200, 500)  # other records at the offsets the cut freed
        log.tiering.run_once()
        same_as_local(log, bucket)
        with streamlog.open_log(MemoryStore(bucket)) as view:
            assert next(iter(view.reader("s", 0, from_offset=cut + 1))).value[:5] == b"00500"


def test_truncate_under_remote_durability_restores_as_the_log_was_cut():
    bucket = MemoryBucket()
    log = open_tiered(bucket, "remote")
    log.create_stream("s", 1)
    fill(log, 300)
    log.truncate_after("s", 0, 149)
    fill(log, 20, 300)
    expected = [(r.offset, r.value) for r in log.reader("s", 0)]
    with open_tiered(bucket, "remote") as restored:  # the first machine is gone
        assert [(r.offset, r.value) for r in restored.reader("s", 0)] == expected
    log.tiering.close()


def test_a_cut_into_a_segment_the_store_has_whole_keeps_every_record_below_it():
    """Durability remote: the part of a stored segment the cut keeps goes up in the
    same generation as the cut, so a machine lost right after it restores the log
    exactly as cut, and reports nothing lost."""
    bucket = MemoryBucket()
    log = open_tiered(bucket, "remote")
    by_hand(log)
    log.create_stream("s", 1)
    fill(log, 300)
    log.tiering.run_once()  # the sealed segments go up whole
    part = newest(bucket).partitions["s/0"]
    cut = part.segments[2].base_offset + 5
    log.truncate_after("s", 0, cut)
    assert newest(bucket).partitions["s/0"].committed_end == cut + 1
    expected = [(r.offset, r.value) for r in log.reader("s", 0)]
    with open_tiered(bucket, "remote") as restored:  # lost right after the cut
        assert [(r.offset, r.value) for r in restored.reader("s", 0)] == expected
        assert restored.info()["restored"]["lost"] == {}
    log.tiering.close()


def test_old_manifest_generations_are_pruned_after_the_grace_period():
    """Generations older than the grace period, before the one the current chain
    starts from, are deleted (but for those whose payload holds tail pieces the
    newest names), so listing them (an open, a take-over) stays bounded; the newest
    generation still reads whole, from a view and from a restore."""
    from streamlog.remote import tiering as tiering_module
    bucket = MemoryBucket()
    store = MemoryStore(bucket)
    log = open_tiered(bucket, "remote", remote_grace_s=0.05)
    by_hand(log)
    log.create_stream("s", 1)
    fill(log, 300)
    log.tiering.run_once()  # (a whole generation: the chain starts there)
    fill(log, 50, 300)
    before = [meta.key for meta in store.list("manifest")]
    time.sleep(0.1)
    log.tiering._prune_due = 0.0
    base = log.tiering.manifest.based_on  # where the chain started when it pruned
    named = {piece.key for piece in log.tiering.manifest.partitions["s/0"].tail}
    log.tiering.run_once()
    after = [meta.key for meta in store.list("manifest")]
    assert len(after) < len(before) / 2
    assert named and named <= set(after)  # the generations holding the tail's bytes
    assert all(manifests.generation_of(key) >= base or key in named for key in after), (
        base, after)
    assert manifests.latest(store) == log.tiering.manifest
    expected = [(r.offset, r.value) for r in log.reader("s", 0)]
    same_as_local(log, bucket)
    with open_tiered(bucket, "remote") as restored:
        assert [(r.offset, r.value) for r in restored.reader("s", 0)] == expected
    log.tiering.close()
    assert tiering_module.PRUNE_MAX >= 100
