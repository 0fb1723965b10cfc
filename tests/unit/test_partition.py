"""A Partition, its View and its Index with no disk: an in-memory file system
(testing/memfs.py), under the fault layer where a test crashes it, and the in-memory
index (testing/memindex.py), which loses its unsynced transactions with the files.

What each test shows is the partition's own logic (the writer's state, recovery, a
truncate's generation, seeks by time after a crash); tests/integration runs the same
over real files."""

from __future__ import annotations

import random

import pytest

from streamlog.config import LogConfig
from streamlog.encoder import Piece
from streamlog.errors import OffsetOutOfRange, PartitionFailed
from streamlog.index import Index
from streamlog.partition import Partition
from streamlog.records import RECORD_OVERHEAD_BYTES, RecordKind
from streamlog.state import CUTS_MAX, PartitionState, after_cut, lowest_cut_since
from streamlog.segments import Segments
from streamlog.testing import MemoryFileIO
from streamlog.testing.clock import ManualClock
from streamlog.testing.faultfs import FaultFileIO
from streamlog.testing.memindex import MemoryIndexStorage

DIRECTORY = "/memory/log/streams/s/0"


def config(**options) -> LogConfig:
    return LogConfig(**{"segment_bytes_max": 4096, "compression": "none", **options}
                     ).validate()


def piece(values, timestamps, *, kinds=None, txn_id=0) -> Piece:
    return Piece(list(timestamps), [None] * len(values), list(values), kinds, None,
                 sum(map(len, values)) + RECORD_OVERHEAD_BYTES * len(values), txn_id)


class Disk:
    """An in-memory disk: the file system and the index storage, surviving the
    Partition objects opened on it (and, under `faults`, a power loss)."""

    def __init__(self, *, faults: bool = False, seed: int = 0) -> None:
        self.memory = MemoryFileIO()
        self.index_storage = MemoryIndexStorage()
        self.seed = seed
        self.fileio = self._fileio(faults)
        self.clock = ManualClock()

    def _fileio(self, faults: bool):
        if not faults:
            return self.memory
        fileio = FaultFileIO(self.seed, inner=self.memory)
        self.index_storage.attach(fileio)
        return fileio

    def open(self, *, readonly: bool = False, **options) -> Partition:
        return Partition(DIRECTORY, "s/0", 0, config(**options), self.fileio,
                         readonly=readonly, clock=self.clock,
                         index_storage=self.index_storage)

    def reboot(self) -> None:
        """After a power loss: a new file system layer over what reached the disk."""
        self.fileio = self._fileio(True)


@pytest.fixture
def opened():
    made: list[Partition] = []

    def keep(part: Partition) -> Partition:
        made.append(part)
        return part

    yield keep
    for part in made:
        try:
            part.close()
        except (OSError, PartitionFailed):
            pass  # a crashed file system refuses the close


def test_appends_move_the_state_and_a_view_reads_them(opened):
    part = opened(Disk().open())
    assert (part.state.start_offset, part.state.end_offset, part.state.hwm_us) == (0, 0, None)
    assert part.submit([piece([b"a", b"b"], [10, 30])]) == 0
    assert part.submit([piece([b"c"], [20])]) == 2
    state = part.state
    assert (state.end_offset, state.hwm_us) == (3, 30)
    assert state.active_position == state.segments.active.size_bytes
    view = part.view()
    entry, columns = view.batch_holding(2)
    assert (entry.base_offset, bytes(columns.values)) == (2, b"c")
    # the running max: a seek by time starts where the high-water mark reached it
    assert [view.offset_for_timestamp(t) for t in (5, 10, 20, 30, 31)] == [0, 0, 1, 1, 3]
    # the live tail got the same batches the segment holds
    assert [base for base, _, _ in [part.ring.find(0), part.ring.find(2)]] == [0, 2]


def test_the_state_is_replaced_never_changed(opened):
    part = opened(Disk().open())
    before = part.state
    part.submit([piece([b"a"], [1])])
    assert before.end_offset == 0 and part.state is not before


def test_rolls_keep_the_end_in_the_active_segment_and_reopen_finds_it(opened):
    disk = Disk()
    part = disk.open()
    values = [b"%04d" % i + b"." * 200 for i in range(60)]
    for i, value in enumerate(values):
        part.submit([piece([value], [1000 + i])])
    state = part.state
    assert len(state.segments) > 2
    assert state.active_position == state.segments.active.size_bytes
    seeks = [part.view().offset_for_timestamp(t) for t in range(995, 1065, 7)]
    part.close()
    again = opened(disk.open())
    assert again.state.end_offset == 60 and again.state.hwm_us == 1059
    assert len(again.state.segments) == len(state.segments)
    assert [again.view().offset_for_timestamp(t) for t in range(995, 1065, 7)] == seeks
    _, columns = again.view().batch_holding(37)
    assert bytes(columns.values) == values[37]


def test_a_truncate_is_a_new_generation_a_reader_can_ask_about(opened):
    part = opened(Disk().open())
    for i in range(10):
        part.submit([piece([b"%d" % i], [i])])
    generation = part.state.generation
    assert part.truncate_after(5) == 6
    assert part.state.generation == generation + 1
    assert lowest_cut_since(part.state, generation) == 6
    assert lowest_cut_since(part.state, part.state.generation) is None
    assert part.submit([piece([b"new"], [100])]) == 6
    part.truncate_after(6)  # (a no-op: nothing after 6)
    assert part.state.generation == generation + 1
    with pytest.raises(OffsetOutOfRange):
        part.truncate_after(-2)


def test_the_cut_stack_answers_the_lowest_cut_since_any_generation():
    state = PartitionState(0, 100, None, None, Segments())
    ends = [50, 70, 60, 90, 95, 40, 80]
    history = []
    for end in ends:
        state = state._replace(**after_cut(state, end))
        history.append((state.generation, end))
    for seen in range(len(ends) + 1):
        later = [end for made_at, end in history if made_at > seen]
        assert lowest_cut_since(state, seen) == (min(later) if later else None)
    # rising cuts past the bound merge the oldest entries: never a later answer
    for i in range(CUTS_MAX + 10):
        state = state._replace(**after_cut(state, 100 + i))
        history.append((state.generation, 100 + i))
    assert len(state.cuts) <= CUTS_MAX
    for seen in range(state.generation + 1):
        later = [end for made_at, end in history if made_at > seen]
        found = lowest_cut_since(state, seen)
        assert (found is None) == (not later)
        assert found is None or found <= min(later)


@pytest.mark.parametrize("fsync", ["always", "never"])
@pytest.mark.parametrize("seed", range(6))
def test_a_power_loss_keeps_what_was_synced_and_seeks_stay_exact(opened, seed, fsync):
    """fsync="always" appends are acknowledged durable; "never" ones may be lost, all
    after some point (a sealed segment is always durable). After the power loss (the
    files and the index lose what was not synced, each by its own rules, torn or with
    garbage), the reopened partition holds a prefix of what was appended, every
    acknowledged-durable record in it, each record whole, and answers seeks by time as
    a clean log of that prefix would."""
    rng = random.Random(seed)
    disk = Disk(faults=True, seed=seed)
    part = disk.open(fsync=fsync)
    appended = []
    for i in range(rng.randint(20, 60)):
        timestamp = 1000 + 10 * i + rng.randint(-25, 25)
        part.submit([piece([b"%d" % i + b"." * 100], [timestamp])])
        appended.append(timestamp)
    disk.fileio.crash(random.Random(seed), mode=rng.choice(["drop_unsynced", "torn",
                                                            "garbage"]))
    part.close(seal=False)  # (refused by the dead file system: nothing more is written)
    disk.reboot()
    again = opened(disk.open(fsync=fsync))
    kept = again.state.end_offset
    assert kept == len(appended) if fsync == "always" else kept <= len(appended)
    view = again.view()
    for i in range(kept):
        _, columns = view.batch_holding(i)
        assert bytes(columns.values) == b"%d" % i + b"." * 100
    running = []  # the high-water mark after each record kept
    for timestamp in appended[:kept]:
        running.append(max(timestamp, running[-1]) if running else timestamp)
    for probe in range(min(appended) - 5, max(appended) + 5):
        expected = next((offset for offset, mark in enumerate(running) if mark >= probe),
                        kept)  # the first record the mark reached it at
        assert view.offset_for_timestamp(probe) == expected, probe
    assert again.submit([piece([b"after"], [5000])]) == kept


def test_a_read_only_view_changes_nothing_and_sees_the_writers_end(opened):
    disk = Disk()
    writer = opened(disk.open())
    writer.submit([piece([b"a", b"b"], [1, 2])])
    steps = disk.memory.listdir(DIRECTORY)
    view = opened(disk.open(readonly=True))
    assert view.state.end_offset == 2
    writer.submit([piece([b"c"], [3])])
    assert view.state.end_offset == 2 and view.refresh()
    assert view.state.end_offset == 3
    assert disk.memory.listdir(DIRECTORY) == steps


def test_transactions_are_decided_on_the_writer_thread(opened):
    part = opened(Disk().open())
    epoch = part.init_producer("tx")
    txn_id = part.begin_txn("tx", epoch)
    part.submit([piece([b"in"], [5], txn_id=txn_id)])
    assert part.view().last_stable_offset() < part.state.end_offset
    part.end_txn(txn_id, RecordKind.COMMIT)
    view = part.view()
    assert view.last_stable_offset() == part.state.end_offset
    assert view.txn_state(txn_id).name == "COMMITTED"


def test_an_index_in_memory_finds_entries_and_times(opened):
    part = opened(Disk().open())
    for i in range(5):
        part.submit([piece([b"x" * 10, b"y" * 10], [100 * i, 100 * i + 50])])
    index: Index = part.index
    entry = index.lookup_offset(7)
    assert (entry.base_offset, entry.record_count) == (6, 2)
    assert entry.segment_base == 0 and entry.hwm_after_us == 350
    assert index.first_entry().base_offset == 0
    assert part.view().offset_for_timestamp(250) == 5
