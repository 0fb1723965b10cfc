"""Tiering a writable log (remote/tiering.py): sealed segments go up with their index
objects, one manifest generation per round; the store down loses nothing and the
backlog drains; local retention keeps what the store lacks; a newer open fences the
older writer's job. In memory: MemoryFileIO, MemoryIndexStorage, MemoryStore."""

from __future__ import annotations

import contextlib

import pytest

import streamlog
from streamlog.errors import Fenced, InvalidArgument, StoreUnavailable
from streamlog.remote import manifest as manifests
from streamlog.remote.segment_object import decode_index
from streamlog.testing import MemoryFileIO
from streamlog.testing.memindex import MemoryIndexStorage
from streamlog.testing.memstore import MemoryBucket, MemoryStore

SMALL = dict(segment_bytes_max=4096, compression="none", fsync="never")


@pytest.fixture
def disk():
    return {"fileio": MemoryFileIO(), "index_storage": MemoryIndexStorage()}


def fill(log, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        log.append_sync("s", b"%05d" % i + b"." * 200, timestamp_us=1000 + i)


def test_sealed_segments_go_up_and_info_shows_the_remote_end(disk):
    store = MemoryStore()
    with streamlog.open_log("/memory/log", remote=store, **disk, **SMALL) as log:
        log.create_stream("s", 2)
        fill(log, 100)
        log.tiering.close()  # rounds by hand from here on
        log.tiering.run_once()
        info = log.info()
        part = log._partition("s", 0)
        sealed = part.state.segments[:-1]
        remote = manifests.latest(store).partitions["s/0"]
        assert len(remote.segments) == len(sealed) >= 2
        assert remote.committed_end == part.state.segments[-1].base_offset
        assert info["streams"]["s"]["partitions"][0]["remote_committed_offset"] == (
            remote.committed_end)
        assert info["remote"]["epoch"] == 1 and info["remote"]["error"] is None
        for segment, local in zip(remote.segments, sealed):
            assert store.get(segment.key) == local.read(0, local.size_bytes)
            assert decode_index(store.get(segment.index_key), segment.index_key,
                                segment.base_offset)[0].base_offset == local.base_offset
        assert manifests.latest(store).streams == {"s": 2}
        before = manifests.latest(store).generation
        assert log.tiering.run_once() == 0  # nothing new: no new generation
        assert manifests.latest(store).generation == before


def test_the_store_down_loses_nothing_and_the_backlog_drains(disk):
    store = MemoryStore()
    with streamlog.open_log("/memory/log", remote=store, **disk, **SMALL) as log:
        log.create_stream("s")
        log.tiering.close()
        store.down()
        fill(log, 100)  # appends go on: durability "local" acks the local fsync
        with pytest.raises(StoreUnavailable):
            log.tiering.run_once()
        assert log.tiering.committed_end("s/0") == 0
        store.up()
        assert log.tiering.run_once() >= 2
        part = log._partition("s", 0)
        assert log.tiering.committed_end("s/0") == part.state.segments[-1].base_offset


def test_local_retention_keeps_what_the_store_lacks(disk):
    store = MemoryStore()
    with streamlog.open_log("/memory/log", remote=store, retention_bytes=1, **disk,
                            **SMALL) as log:
        log.create_stream("s")
        log.tiering.close()
        fill(log, 100)
        assert log.apply_retention() == []  # nothing is in the store yet
        log.tiering.run_once()
        end = log.tiering.committed_end("s/0")
        deleted = log.apply_retention()
        assert deleted and log.start_offset("s") == end  # only what the store has
        assert [r.offset for r in log.reader("s")][0] == end


@contextlib.contextmanager
def taken_over(disk, records: int):
    """(older, newer): a writer of stream "s" that appended `records` and ran one
    round, then a second writer of the same store (another machine's disk) that took
    the log over."""
    bucket = MemoryBucket()
    older = streamlog.open_log("/memory/a", remote=MemoryStore(bucket), **disk, **SMALL)
    try:
        older.create_stream("s")
        older.tiering.close()
        fill(older, records)
        older.tiering.run_once()
        other = {"fileio": MemoryFileIO(), "index_storage": MemoryIndexStorage()}
        with streamlog.open_log("/memory/b", remote=MemoryStore(bucket), **other,
                                **SMALL) as newer:
            yield older, newer
    finally:
        older.close()


def test_a_newer_open_fences_the_older_writers_tiering(disk):
    with taken_over(disk, 60) as (older, newer):
        assert newer.tiering.manifest.epoch == older.tiering.manifest.epoch + 1
        fill(older, 60, start=60)
        with pytest.raises(Fenced):
            older.tiering.run_once()
        assert older.info()["remote"]["fenced"] is True
        with pytest.raises(Fenced):  # and for good
            older.tiering.run_once()


def test_remote_must_be_an_s3_url_or_a_store(disk):
    with pytest.raises(InvalidArgument, match="s3://"):
        streamlog.open_log("/memory/log", remote="gs://bucket/x", **disk)
    with pytest.raises(InvalidArgument, match="object store"):
        streamlog.open_log("/memory/log", remote=42, **disk)
    with pytest.raises(InvalidArgument, match="read-only"):
        streamlog.open_log("/memory/log", remote=MemoryStore(), readonly=True, **disk)


def test_the_background_job_uploads_by_itself(disk):
    import time
    store = MemoryStore()
    with streamlog.open_log("/memory/log", remote=store, **disk, **SMALL) as log:
        log.create_stream("s")
        fill(log, 100)
        log.tiering.wake()
        deadline = time.monotonic() + 10
        while log.tiering.committed_end("s/0") == 0:
            assert time.monotonic() < deadline, "nothing went up within 10 s"
            time.sleep(0.02)
        assert manifests.latest(store).partitions["s/0"].committed_end > 0


def test_an_idle_segment_rolls_and_goes_up_after_the_lag_bound(disk):
    from streamlog.testing.clock import ManualClock
    clock = ManualClock()
    store = MemoryStore()
    with streamlog.open_log("/memory/log", remote=store, clock=clock, remote_max_lag_s=5,
                            **disk, **SMALL) as log:
        log.create_stream("s")
        log.tiering.close()
        fill(log, 3)  # far from a full segment
        assert log.tiering.run_once() == 0  # young: nothing sealed, nothing up
        clock.advance(6)
        assert log.tiering.run_once() == 1
        assert log.tiering.committed_end("s/0") == 3 == log.end_offset("s")
        clock.advance(6)
        assert log.tiering.run_once() == 0  # the new segment is empty: it never rolls
        assert len(log._partition("s", 0).state.segments) == 2


def test_an_older_writer_learns_of_a_take_over_and_appends_no_more(disk):
    # 5 records: nothing sealed yet, so the older one's round only looked
    with taken_over(disk, 5) as (older, _):
        fill(older, 1, start=5)  # not yet known: the older one still appends locally
        with pytest.raises(Fenced, match="epoch 2"):
            older.tiering.run_once()  # nothing to upload, and still it finds out
        with pytest.raises(Fenced, match="taken over"):
            older.append_sync("s", b"late")
        with pytest.raises(Fenced):
            older.append_batch_sync("s", [b"a", b"b"])
        assert older.end_offset("s") == 6  # nothing after the take-over was known


def test_the_store_down_past_the_backlog_bound_is_back_pressure(disk):
    """Durability local: with the store down, appends go on until a partition holds
    remote_max_backlog_bytes the store lacks, then fail with StoreBacklogFull (nothing
    written); once the store is back and a round drained it, appends go on."""
    store = MemoryStore()
    with streamlog.open_log("/memory/log", remote=store, **disk, **SMALL,
                            remote_max_backlog_bytes=20_000) as log:
        log.tiering.close()
        log.create_stream("s", 1)
        store.down()
        written = 0
        with pytest.raises(streamlog.StoreBacklogFull, match="20000"):
            for i in range(10_000):
                log.append_sync("s", b"%05d" % i + b"." * 200)
                written += 1
        assert written > 20
        assert log.end_offset("s", 0) == written  # the refused one was not written
        assert log.tiering.backlog_bytes(log._partition("s", 0)) >= 20_000
        with pytest.raises(StoreUnavailable):
            log.tiering.run_once()
        store.up()
        log.tiering.run_once()
        assert log.tiering.backlog_bytes(log._partition("s", 0)) < 4096  # the active one
        log.append_sync("s", b"again")
        status = log.tiering.status()
        assert status["backlog_bytes"]["s/0"] < 4096 and status["lag_records"]["s/0"] > 0


def test_metrics_show_the_store_lag_backlog_and_requests(disk):
    from streamlog.remote.store import Retrying
    from streamlog.wire.metrics import Metrics
    store = Retrying(MemoryStore())
    with streamlog.open_log("/memory/log", remote=store, **disk, **SMALL) as log:
        log.tiering.close()
        log.create_stream("s", 1)
        fill(log, 60)
        log.tiering.run_once()
        metrics = Metrics()
        metrics.watch(type("Server", (), {"log": log, "sessions": [], "draining": False})())
        text = metrics.exposition()[0].decode()
        part = log._partition("s", 0)
    assert f'streamlog_remote_backlog_bytes{{partition="s/0"}} {float(part.segments[-1].size_bytes)}' in text
    assert 'streamlog_remote_lag_records{partition="s/0"}' in text
    assert 'streamlog_store_requests_total{operation="put"}' in text
    assert "streamlog_remote_generation " in text
