"""The storage core's admin operations the Kafka listener calls (DeleteTopics,
DeleteRecords, CreatePartitions): Log.delete_stream, Log.delete_records and
Log.add_partitions. Each one's happy path and refusals, a reopen after each, and a
power loss at every step of each (FaultFileIO over memory, with the in-memory index
losing power with it): the change is there whole or not at all. In memory, no disk."""

from __future__ import annotations

import itertools
import random
import threading

import pytest

import streamlog
from streamlog import maintenance
from streamlog.append import partition_for_key
from streamlog.errors import (InternalStream, InvalidArgument, InvalidStreamName, LogClosed,
                              OffsetOutOfRange, ReadOnlyLog, UnknownStream)
from streamlog.testing import CrashMode, FaultFileIO, MemoryFileIO
from streamlog.testing.memindex import MemoryIndexStorage

PATH = "/data/log"
SMALL = dict(segment_bytes_max=4096, compression="none")
T0 = 5_000_000


class Machine:
    """A disk and an index in memory that outlive a power loss (the next FaultFileIO
    over them is the rebooted machine)."""

    def __init__(self) -> None:
        self.disk = MemoryFileIO()
        self.index = MemoryIndexStorage()

    def open(self, fileio=None, **options) -> streamlog.Log:
        return streamlog.open_log(PATH, fileio=fileio or self.disk, index_storage=self.index,
                                  **{**SMALL, **options})

    def faulty(self, seed: int = 0) -> FaultFileIO:
        self.index.reboot()
        fs = FaultFileIO(seed, inner=self.disk)
        self.index.attach(fs)
        return fs

    def streams_folder(self) -> list[str]:
        return self.disk.listdir(f"{PATH}/streams")


def stamp(i: int) -> int:
    """Timestamps out of order now and then, so the running max matters."""
    return T0 + 10 * i - (35 if i % 7 == 3 else 0)


def fill(log, stream: str, count: int, *, partition: int = 0, start: int = 0) -> None:
    for i in range(start, start + count):
        log.append_sync(stream, b"%s:%05d" % (stream.encode(), i) + b"~" * 40,
                        timestamp_us=stamp(i), partition=partition)


def values(log, stream: str, partition: int = 0, **options) -> list[bytes]:
    return [r.value for r in log.reader(stream, partition, **options)]


def expected_seek(count: int, start: int, timestamp_us: int) -> int:
    """DESIGN 5 by brute force: the first offset >= start whose running max (over every
    record from offset 0, the deleted ones too) reaches the time; else the end."""
    hwm = None
    for i in range(count):
        hwm = stamp(i) if hwm is None else max(hwm, stamp(i))
        if i >= start and hwm >= timestamp_us:
            return i
    return count


def check_seeks(log, count: int, start: int, stream: str = "s") -> None:
    for t in range(T0 - 60, stamp(count) + 20, 7):
        want = expected_seek(count, start, t)
        assert log.offset_for_timestamp(stream, 0, t) == want, t
        first = next(iter(log.reader(stream, 0, from_timestamp_us=t)), None)
        assert (first.offset if first is not None else count) == want, t


def follow_until_told(reader) -> tuple[threading.Thread, list]:
    """A thread following `reader` until it raises UnknownStream (kept in the list)."""
    heard = []

    def follow() -> None:
        try:
            for _ in reader:
                pass
        except UnknownStream as error:
            heard.append(error)

    thread = threading.Thread(target=follow)
    thread.start()
    return thread, heard


def crash_steps(build, operation, check, *, modes=(CrashMode.DROP_UNSYNCED, CrashMode.TORN)):
    """Run `operation(log)` once to count its steps, then again with the power lost at
    each step in each mode, and once just after it returned; after each loss
    `check(machine, log, done)` sees the rebooted log (`done`: the operation returned
    before the loss). Returns the count."""
    machine = Machine()
    build(machine)
    fs = machine.faulty()
    log = machine.open(fs)
    before = fs.steps
    operation(log)
    total = fs.steps - before
    log.close()
    assert total > 3
    for number, mode in itertools.product(range(1, total + 2), modes):
        machine = Machine()
        build(machine)
        fs = machine.faulty(number)
        log = machine.open(fs)
        fs.crash_at_step(fs.steps + number, mode, random.Random(number))
        done = False
        try:
            operation(log)
            done = True
        except Exception:  # noqa: BLE001 - the power went at some step, anywhere
            assert fs.crashed
        fs.abandon(log)
        with machine.open(machine.faulty(1000 + number)) as rebooted:
            check(machine, rebooted, done)
    return total


# -- delete_stream ----------------------------------------------------------------------

def test_a_deleted_stream_is_gone_whole_and_its_name_starts_again_at_zero():
    machine = Machine()
    with machine.open() as log:
        log.create_stream("s", 2)
        log.create_stream("t", 1)
        fill(log, "s", 120)
        fill(log, "s", 5, partition=1)
        fill(log, "t", 10)
        log.hold("s", 0, "consumer", 3)
        assert log.delete_stream("s") is None
        assert log.streams() == ["t"]
        assert machine.streams_folder() == [".lock", "t"]
        for call in (lambda: log.append_sync("s", b"x"), lambda: log.reader("s", 0),
                     lambda: log.end_offset("s", 0), lambda: log.holds("s", 0),
                     lambda: log.partition_count("s"), lambda: log.delete_stream("s")):
            with pytest.raises(UnknownStream):
                call()
        assert log.create_stream("s", 1) == 1
        assert (log.end_offset("s", 0), log.holds("s", 0)) == (0, {})
        assert log.append_sync("s", b"again").offset == 0
        assert len(values(log, "t")) == 10
    with machine.open() as log:
        assert log.streams() == ["s", "t"]
        assert values(log, "s") == [b"again"] and log.partition_count("s") == 1
        assert len(values(log, "t")) == 10


def test_deleting_is_refused_for_internal_and_unknown_streams_and_read_only_logs():
    machine = Machine()
    with machine.open() as log:
        log.create_internal_stream("__state", 1)
        log.create_stream("s", 1)
        with pytest.raises(InternalStream):
            log.delete_stream("__state")
        with pytest.raises(UnknownStream):
            log.delete_stream("nope")
        with pytest.raises(InvalidStreamName):
            log.delete_stream("a/b")
        assert log.streams() == ["__state", "s"]
        with machine.open(readonly=True) as view:
            with pytest.raises(ReadOnlyLog):
                view.delete_stream("s")
    with pytest.raises(LogClosed):
        log.delete_stream("s")


def test_a_reader_in_this_process_finishes_what_it_reads_then_hears_of_the_delete():
    machine = Machine()
    with machine.open() as log:
        log.create_stream("s", 1)
        fill(log, "s", 200)  # several segments
        reader = iter(log.reader("s", 0))
        assert next(reader).offset == 0
        thread, heard = follow_until_told(log.reader("s", 0, from_offset=200, follow=True))
        log.delete_stream("s")
        thread.join(10)
        assert not thread.is_alive() and heard  # the follower was told
        offsets = []
        with pytest.raises(UnknownStream, match="deleted"):
            for record in reader:
                offsets.append(record.offset)
        assert offsets == list(range(1, 200))  # what it was reading, then the news
        with pytest.raises(UnknownStream):
            log.wait_for("s", 0, 0, 1.0)


def test_a_view_sees_the_stream_gone_at_its_refresh_and_its_follower_is_told():
    machine = Machine()
    with machine.open() as log:
        log.create_stream("s", 1)
        log.create_stream("t", 1)
        fill(log, "s", 30)
        with machine.open(readonly=True, view_poll_s=0.01) as view:
            assert view.streams() == ["s", "t"]
            thread, heard = follow_until_told(view.reader("s", 0, from_offset=30, follow=True))
            log.delete_stream("s")
            log.create_stream("s", 1)  # (the name again: another stream)
            log.create_stream("u", 1)
            thread.join(10)
            assert not thread.is_alive() and heard
            view.refresh()
            assert view.streams() == ["s", "t", "u"]
            assert values(view, "s") == []
            log.delete_stream("s")
            view.refresh()
            assert view.streams() == ["t", "u"]
            with pytest.raises(UnknownStream):
                view.reader("s", 0)


def test_a_failed_partition_is_deleted_all_the_same():
    machine = Machine()
    fs = machine.faulty()
    with machine.open(fs) as log:
        log.create_stream("s", 2)
        fill(log, "s", 5, partition=1)
        fs.inject_eio("pwrite")
        with pytest.raises(streamlog.errors.PartitionFailed):
            log.append_sync("s", b"x", partition=0)
        assert log._partition("s", 0).status == "failed"  # (its writer takes no job)
        log.delete_stream("s")
        assert log.streams() == [] and machine.streams_folder() == [".lock"]
        log.create_stream("s", 1)
        assert log.append_sync("s", b"new").offset == 0


def test_a_power_loss_at_any_step_leaves_the_stream_whole_or_gone():
    def build(machine):
        with machine.open() as log:
            log.create_stream("s", 2)
            log.create_stream("t", 1)
            fill(log, "s", 60)
            fill(log, "s", 7, partition=1)
            fill(log, "t", 5)
            log.hold("s", 1, "h", 2)

    outcomes = set()

    def check(machine, log, done):
        folders = machine.streams_folder()
        assert folders in ([".lock", "s", "t"], [".lock", "t"]), folders  # no leftovers
        if "s" in log.streams():
            assert not done
            outcomes.add("whole")
            assert log.partition_count("s") == 2
            assert len(values(log, "s", 0)) == 60 and len(values(log, "s", 1)) == 7
            assert log.holds("s", 1)["h"]["offset"] == 2
        else:
            outcomes.add("gone")
            log.create_stream("s", 3)
            assert [log.end_offset("s", n) for n in range(3)] == [0, 0, 0]
            assert log.holds("s", 1) == {}
        assert len(values(log, "t")) == 5

    crash_steps(build, lambda log: log.delete_stream("s"), check)
    assert outcomes == {"whole", "gone"}


# -- delete_records ---------------------------------------------------------------------

def test_delete_records_moves_the_start_inside_a_segment_durably_and_seeks_stay_exact():
    machine = Machine()
    with machine.open() as log:
        log.create_stream("s", 2)
        fill(log, "s", 300)
        fill(log, "s", 9, partition=1)
        segments = log.info()["streams"]["s"]["partitions"][0]["segments"]
        assert log.delete_records("s", 0, 137) == 137
        assert log.start_offset("s", 0) == 137
        assert log.info()["streams"]["s"]["partitions"][0]["segments"] < segments
        assert [r.offset for r in log.reader("s", 0)][:2] == [137, 138]
        assert values(log, "s")[0].startswith(b"s:00137")
        with pytest.raises(OffsetOutOfRange):
            log.reader("s", 0, from_offset=136)
        check_seeks(log, 300, 137)
        assert log.start_offset("s", 1) == 0 and len(values(log, "s", 1)) == 9
    for readonly in (False, True):
        with machine.open(readonly=readonly) as log:
            assert log.start_offset("s", 0) == 137
            assert values(log, "s")[0].startswith(b"s:00137")
            check_seeks(log, 300, 137)


def test_delete_records_never_goes_back_and_refuses_what_kafka_refuses():
    machine = Machine()
    with machine.open() as log:
        log.create_stream("s", 1)
        log.create_internal_stream("__state", 1)
        fill(log, "s", 50)
        assert log.delete_records("s", 0, 20) == 20
        assert log.delete_records("s", 0, 10) == 20  # below the start: nothing moves
        assert log.delete_records("s", 0, 20) == 20
        with pytest.raises(OffsetOutOfRange):
            log.delete_records("s", 0, 51)
        for bad in (-1, "5", True, 2.0):
            with pytest.raises(InvalidArgument):
                log.delete_records("s", 0, bad)
        with pytest.raises(InvalidArgument):
            log.delete_records("s", 1, 30)
        with pytest.raises(UnknownStream):
            log.delete_records("nope", 0, 1)
        with pytest.raises(InternalStream):
            log.delete_records("__state", 0, 0)
        assert log.delete_records("s", 0, 50) == 50  # up to the end: the log is empty
        assert values(log, "s") == [] and log.end_offset("s", 0) == 50
        assert log.append_sync("s", b"next").offset == 50
        assert values(log, "s") == [b"next"]
        with machine.open(readonly=True) as view:
            with pytest.raises(ReadOnlyLog):
                view.delete_records("s", 0, 50)
    with machine.open() as log:
        assert (log.start_offset("s", 0), values(log, "s")) == (50, [b"next"])


def test_a_durable_hold_below_the_offset_refuses_it_and_a_readers_files_stay():
    machine = Machine()
    with machine.open() as log:
        log.create_stream("s", 1)
        fill(log, "s", 200)
        log.hold("s", 0, "operator", 40)
        with pytest.raises(InvalidArgument, match="operator"):
            log.delete_records("s", 0, 41)
        assert log.start_offset("s", 0) == 0
        assert log.delete_records("s", 0, 40) == 40  # at the hold: allowed
        log.hold("s", 0, "late", 30)  # below the start already
        assert log.delete_records("s", 0, 35) == 40  # a no-op: nothing to refuse
        log.release_hold("s", 0, "late")
        log.release_hold("s", 0, "operator")
        reader = log.reader("s", 0, from_offset=45)  # holds its position's files
        before = log.info()["streams"]["s"]["partitions"][0]["segments"]
        assert log.delete_records("s", 0, 180) == 180
        assert log.info()["streams"]["s"]["partitions"][0]["segments"] == before
        assert next(iter(reader)).offset == 45  # it reads on what it was reading
        reader.close()
        log.apply_retention()  # no bounds set: only what is below the start goes
        assert log.info()["streams"]["s"]["partitions"][0]["segments"] < before
        assert values(log, "s")[0].startswith(b"s:00180")


def test_a_crash_between_the_mark_and_the_deletes_leaves_the_start_moved():
    """What delete_records leaves when it dies after its start mark: the start is
    moved (a read-only open shows it, changing no file), and the next writable open
    deletes the segments below it, as the delete would have."""
    machine = Machine()
    with machine.open() as log:
        log.create_stream("s", 1)
        fill(log, "s", 250)
        directory = log._partition("s", 0).directory
        segments = log.info()["streams"]["s"]["partitions"][0]["segments"]
        hwm = max(stamp(i) for i in range(170))
    maintenance.write_start(machine.disk, directory, 170, hwm)
    for readonly in (True, False):
        with machine.open(readonly=readonly) as log:
            assert log.start_offset("s", 0) == 170
            check_seeks(log, 250, 170)
            left = log.info()["streams"]["s"]["partitions"][0]["segments"]
            assert left == segments if readonly else left < segments
            assert values(log, "s")[0].startswith(b"s:00170")


def test_retention_after_delete_records_moves_on_from_the_new_start():
    machine = Machine()
    with machine.open(retention_bytes=12_000) as log:
        log.create_stream("s", 1)
        fill(log, "s", 100)
        log.delete_records("s", 0, 33)
        log.apply_retention()
        assert log.start_offset("s", 0) == 33  # under the bound already
        fill(log, "s", 200, start=100)
        log.apply_retention()
        start = log.start_offset("s", 0)
        assert start > 33
        assert values(log, "s")[0].startswith(b"s:%05d" % start)
        check_seeks(log, 300, start)
        assert log.delete_records("s", 0, start - 1) == start


def test_a_power_loss_at_any_step_of_delete_records_leaves_the_old_start_or_the_new():
    def build(machine):
        with machine.open() as log:
            log.create_stream("s", 1)
            fill(log, "s", 150)

    starts = set()

    def check(machine, log, done):
        start = log.start_offset("s", 0)
        assert start in ((98,) if done else (0, 98))
        starts.add(start)
        assert values(log, "s") == [b"s:%05d" % i + b"~" * 40 for i in range(start, 150)]
        check_seeks(log, 150, start)
        names = machine.disk.listdir(f"{PATH}/streams/s/0")
        assert not [n for n in names if n.endswith((".deleted", ".tmp"))], names
        assert log.delete_records("s", 0, 98) == 98  # and it can be done (again)

    crash_steps(build, lambda log: log.delete_records("s", 0, 98), check)
    assert starts == {0, 98}


# -- add_partitions ---------------------------------------------------------------------

def test_add_partitions_raises_the_count_and_keys_route_by_the_new_one():
    machine = Machine()
    with machine.open() as log:
        log.create_stream("s", 2)
        fill(log, "s", 4)
        with machine.open(readonly=True) as view:
            assert log.add_partitions("s", 5) == 5
            assert log.partition_count("s") == 5
            keys = [b"key-%d" % n for n in range(40)]
            moved = [k for k in keys if partition_for_key(k, 2) != partition_for_key(k, 5)]
            assert moved  # as in Kafka: some keys now go elsewhere
            for key in keys:
                assert log.append_sync("s", b"v", key=key).partition == partition_for_key(
                    key, 5)
            assert log.append_sync("s", b"four", partition=4).offset >= 0
            view.refresh()
            assert view.partition_count("s") == 5
            assert values(view, "s", 4)[-1] == b"four"
    with machine.open() as log:
        assert log.partition_count("s") == 5 and values(log, "s", 4)[-1] == b"four"
        assert len(values(log, "s", 0)) >= 4


def test_add_partitions_refuses_what_would_not_add_any():
    machine = Machine()
    with machine.open(partitions_max=8) as log:
        log.create_stream("s", 3)
        log.create_internal_stream("__state", 1)
        for count in (3, 2, 9, 0, "4", True):
            with pytest.raises(InvalidArgument):
                log.add_partitions("s", count)
        with pytest.raises(UnknownStream):
            log.add_partitions("nope", 4)
        with pytest.raises(InternalStream):
            log.add_partitions("__state", 2)
        assert log.partition_count("s") == 3
        with machine.open(readonly=True) as view:
            with pytest.raises(ReadOnlyLog):
                view.add_partitions("s", 4)


def test_a_power_loss_at_any_step_of_add_partitions_leaves_the_old_count_or_the_new():
    def build(machine):
        with machine.open() as log:
            log.create_stream("s", 2)
            fill(log, "s", 20)

    counts = set()

    def check(machine, log, done):
        count = log.partition_count("s")
        assert count in ((4,) if done else (2, 4))
        counts.add(count)
        assert len(values(log, "s", 0)) == 20
        for number in range(1, count):
            assert values(log, "s", number) == []
            assert log.append_sync("s", b"x", partition=number).offset == 0
        if count == 2:
            assert log.add_partitions("s", 4) == 4  # the leftover folders are taken
            assert [log.end_offset("s", n) for n in range(2, 4)] == [0, 0]
        with machine.open(readonly=True) as view:
            assert view.partition_count("s") == 4

    crash_steps(build, lambda log: log.add_partitions("s", 4), check)
    assert counts == {2, 4}
