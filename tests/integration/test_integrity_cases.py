"""The integrity cases, one regression test each (DESIGN section 4).

1. a flipped bit in the last acknowledged frame of a cleanly closed partition: open,
   verify and info all call it a damaged durable frame;
2. a flipped bit in a cached transaction record: no ABORT after a COMMIT, ever;
3. a flipped bit in a cached transaction key: readers still see every committed record,
   and the last stable offset agrees with them;
4. damaged index pages: rebuilt from the segments with a warning, never a raw error;
5. a torn frame then a stale copy of an earlier frame after the last acknowledged one:
   tail garbage a writer cuts, not corruption;
6. a flipped bit deep in the log with the index intact: an open (bounded by the tail)
   succeeds, info does not call unverified bytes clean, verify finds it;
7. `read` ranges before the damage succeed (tests/integration/test_cli_read_damage.py);
8. readers in many threads share no codec (tests/integration/test_concurrent_reads.py).
"""

from __future__ import annotations

import glob
import json
import os

import lmdb
import pytest

import streamlog
from streamlog.cli import main as cli_main
from streamlog.frame import HEADER_BYTES
from streamlog.records import RecordKind
from streamlog.scan import StopReason, scan_buffer

STREAM = "events"


def partition_dir(path) -> str:
    return os.path.join(str(path), "streams", STREAM, "0")


def segment_paths(path) -> list[str]:
    return sorted(glob.glob(os.path.join(partition_dir(path), "*.log")))


def frames_of(segment: str):
    with open(segment, "rb") as handle:
        result = scan_buffer(handle.read())
    assert result.stop is StopReason.END
    return result.frames


def flip(path: str, position: int, bit: int = 3) -> None:
    with open(path, "r+b") as handle:
        handle.seek(position)
        byte = handle.read(1)[0]
        handle.seek(position)
        handle.write(bytes([byte ^ (1 << bit)]))


def all_records(log, **options):
    return [(r.offset, r.value, r.kind) for r in log.reader(STREAM, 0, **options)]


def verify_json(path, capsys) -> tuple[int, dict]:
    code = cli_main(["verify", str(path), "--json"])
    return code, json.loads(capsys.readouterr().out)


def info_json(path, capsys) -> dict:
    assert cli_main(["info", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)["streams"][STREAM]["partitions"][0]


def build_plain(path, batches: int = 12, **options) -> list[bytes]:
    values = []
    with streamlog.open_log(path, **options) as log:
        log.create_stream(STREAM)
        for number in range(batches):
            batch = [b"value-%d-%d" % (number, i) for i in range(5)]
            log.append_batch_sync(STREAM, batch)
            values += batch
    return values


def build_transactions(path) -> None:
    """Data, a committed transaction, more data, an aborted one, more data."""
    with streamlog.open_log(path) as log:
        log.create_stream(STREAM)
        log.append_batch_sync(STREAM, [b"before"] * 3)
        committed = log.new_txn_id()
        log.append_batch_sync(STREAM, [b"committed"] * 4, txn_id=committed, partition=0)
        log.commit_txn(STREAM, 0, committed, tag="q", marker=b"1")
        log.append_batch_sync(STREAM, [b"middle"] * 2)
        aborted = log.new_txn_id()
        log.append_batch_sync(STREAM, [b"aborted"] * 2, txn_id=aborted, partition=0)
        log.abort_txn(STREAM, 0, aborted)
        log.append_batch_sync(STREAM, [b"after"] * 3)


def committed_view(path, **options):
    with streamlog.open_log(path, readonly=True) as log:
        return ([r.value for r in log.reader(STREAM, 0)], log.last_stable_offset(STREAM, 0),
                log.end_offset(STREAM, 0))


def rewrite_index(path, change) -> None:
    """Apply `change(txn, dbs)` to the partition's LMDB index and drop its seal: the
    damage a flipped bit leaves in an index whose writer did not close cleanly."""
    index = os.path.join(partition_dir(path), "index")
    os.unlink(index + ".seal")
    env = lmdb.open(index, max_dbs=6, subdir=True)
    dbs = {name: env.open_db(name.encode()) for name in ("offsets", "times", "meta", "txns",
                                                         "open")}
    with env.begin(write=True) as txn:
        change(txn, dbs)
    env.close()


def flipped(value: bytes, at: int, bit: int = 0) -> bytes:
    data = bytearray(value)
    data[at] ^= 1 << bit
    return bytes(data)


# -- 1 ------------------------------------------------------------------------------------

def test_1_flip_in_the_last_durable_frame_is_damage_to_every_tool(tmp_path, capsys):
    path = tmp_path / "log"
    build_plain(path)
    (segment,) = segment_paths(path)
    last = frames_of(segment)[-1]
    flip(segment, last.position + HEADER_BYTES + 3)
    with pytest.raises(streamlog.CorruptSegment) as raised:
        streamlog.open_log(path)
    assert (raised.value.path, raised.value.position) == (segment, last.position)
    code, report = verify_json(path, capsys)
    assert code == 1 and report["result"] == "corrupt"
    (finding,) = report["findings"]
    assert (finding["kind"], finding["path"], finding["position"]) == (
        "damaged", segment, last.position)
    info = info_json(path, capsys)
    assert info["tail"] == "damaged" and str(last.position) in info["corruption"]
    with streamlog.open_log(path, readonly=True) as log:
        reader = log.reader(STREAM, 0)
        with pytest.raises(streamlog.CorruptSegment) as raised:
            list(reader)
        assert raised.value.position == last.position


# -- 2 ------------------------------------------------------------------------------------

def _txn_items(txn, dbs):
    return list(txn.cursor(dbs["txns"]))


@pytest.mark.parametrize("byte", [0, 1, 9, 17, 20])
def test_2_flip_in_a_cached_transaction_record_never_aborts_a_commit(tmp_path, byte):
    path = tmp_path / "log"
    build_transactions(path)
    expected = committed_view(path)

    def damage(txn, dbs):
        for key, value in _txn_items(txn, dbs):
            txn.put(key, flipped(value, byte), db=dbs["txns"])

    rewrite_index(path, damage)
    with streamlog.open_log(path) as log:  # writable: must not write markers from it
        kinds = [r.kind for r in log.reader(STREAM, 0, data_only=False,
                                            read_committed=False)]
        assert kinds.count(RecordKind.ABORT) == 1 and kinds.count(RecordKind.COMMIT) == 1
    assert committed_view(path) == expected
    with streamlog.open_log(path) as log:  # and again, after the repaired index
        assert log.end_offset(STREAM, 0) == expected[2]
    assert committed_view(path) == expected


# -- 3 ------------------------------------------------------------------------------------

@pytest.mark.parametrize("db", ["txns", "open"])
def test_3_flip_in_a_cached_transaction_key_hides_nothing(tmp_path, db):
    path = tmp_path / "log"
    build_transactions(path)
    expected = committed_view(path)

    def damage(txn, dbs):
        for key, value in list(txn.cursor(dbs[db])):
            txn.delete(key, db=dbs[db])
            txn.put(flipped(key, 7, 5), value, db=dbs[db])

    rewrite_index(path, damage)
    assert committed_view(path) == expected  # read-only: derived from the segments
    with streamlog.open_log(path) as log:
        assert [r.value for r in log.reader(STREAM, 0)] == expected[0]
        assert log.last_stable_offset(STREAM, 0) == expected[1] == expected[2]
    assert committed_view(path) == expected


# -- 4 ------------------------------------------------------------------------------------

@pytest.mark.parametrize("sealed", [True, False])
@pytest.mark.parametrize("where", ["meta pages", "data pages", "everything"])
def test_4_damaged_index_pages_are_rebuilt_never_a_raw_error(tmp_path, caplog, sealed,
                                                            where):
    path = tmp_path / "log"
    values = build_plain(path, batches=40)
    index = os.path.join(partition_dir(path), "index")
    data_path = os.path.join(index, "data.mdb")
    size = os.path.getsize(data_path)
    spans = {"meta pages": (0, 8192), "data pages": (8192, size), "everything": (0, size)}
    start, end = spans[where]
    with open(data_path, "r+b") as handle:
        handle.seek(start)
        handle.write(b"\xa5" * (end - start))  # garbage LMDB cannot make sense of
    if not sealed:
        os.unlink(index + ".seal")
    with streamlog.open_log(path, readonly=True) as log:
        assert [r.value for r in log.reader(STREAM, 0)] == values
        assert log.offset_for_timestamp(STREAM, 0, 0) == 0
    with streamlog.open_log(path) as log:
        assert [r.value for r in log.reader(STREAM, 0)] == values
        assert log.info()["streams"][STREAM]["partitions"][0]["recovery"]["rebuilt_index"]
    assert any("rebuild" in record.getMessage() for record in caplog.records)
    with streamlog.open_log(path) as log:
        assert [r.value for r in log.reader(STREAM, 0)] == values


# -- 5 ------------------------------------------------------------------------------------

@pytest.mark.parametrize("torn_first", [True, False])
def test_5_stale_copy_after_the_end_is_tail_garbage(tmp_path, capsys, torn_first):
    path = tmp_path / "log"
    values = build_plain(path)
    (segment,) = segment_paths(path)
    frames = frames_of(segment)
    with open(segment, "rb") as handle:
        data = handle.read()
    stale = data[frames[2].position:frames[2].end_position]
    with open(segment, "ab") as handle:
        if torn_first:  # a frame the killed writer did not finish
            handle.write(data[frames[-1].position:frames[-1].position + 50])
        handle.write(stale)
    code, report = verify_json(path, capsys)
    assert code == 0 and report["torn"] == 1
    assert report["findings"][0]["kind"] == ("torn" if torn_first else "stale")
    with streamlog.open_log(path) as log:  # a writer cuts it and goes on
        assert [r.value for r in log.reader(STREAM, 0)] == values
        log.append_sync(STREAM, b"next")
    code, report = verify_json(path, capsys)
    assert code == 0 and report["result"] == "ok"


# -- 6 ------------------------------------------------------------------------------------

def test_6_damage_deep_in_the_log_is_found_by_verify_and_reported_by_info(tmp_path,
                                                                          capsys):
    path = tmp_path / "log"
    build_plain(path, batches=60, segment_bytes_max=4096)
    segments = segment_paths(path)
    assert len(segments) >= 3
    frame = frames_of(segments[0])[1]
    flip(segments[0], frame.position + HEADER_BYTES + 1)
    with streamlog.open_log(path) as log:  # bounded by the tail: not seen, rightly
        log.append_sync(STREAM, b"more")
    info = info_json(path, capsys)
    assert info["tail"] == "clean" and info["verified"] is None  # never verified
    assert cli_main(["info", str(path)]) == 0
    assert "never" in capsys.readouterr().out
    code, report = verify_json(path, capsys)
    assert code == 1
    assert report["findings"][0]["path"] == segments[0]
    assert report["findings"][0]["position"] == frame.position
    assert cli_main(["verify", str(path), "--record"]) == 1
    capsys.readouterr()
    info = info_json(path, capsys)
    assert info["verified"]["result"] == "corrupt"
    assert info["verified"]["findings"][0]["position"] == frame.position


def test_6_repair_moves_the_damage_aside_and_says_what_it_cut(tmp_path, capsys):
    path = tmp_path / "log"
    values = build_plain(path, batches=30, segment_bytes_max=4096)
    segments = segment_paths(path)
    frame = frames_of(segments[1])[2]
    flip(segments[1], frame.position + 10)
    before = {p: os.path.getsize(p) for p in segments}
    assert cli_main(["repair", str(path), "--dry-run"]) == 1
    (planned,) = [line for line in map(json.loads, capsys.readouterr().out.splitlines())
                  if "segment" in line]
    assert segment_paths(path) == segments  # a dry run changes nothing
    assert {p: os.path.getsize(p) for p in segments} == before
    assert cli_main(["repair", str(path)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    (cut,) = [line for line in lines if "segment" in line]
    assert (cut["segment"], cut["position"]) == (segments[1], frame.position)
    assert cut["offsets_removed"] == [frame.base_offset, len(values) - 1]
    assert planned["offsets_removed"] == cut["offsets_removed"]
    quarantined = sorted(os.listdir(cut["quarantine"]))
    cut_bytes = sum(os.path.getsize(os.path.join(cut["quarantine"], n)) for n in quarantined)
    assert cut_bytes == cut["bytes_cut"] == sum(before.values()) - sum(
        os.path.getsize(p) for p in segment_paths(path))
    with streamlog.open_log(path) as log:
        assert [r.value for r in log.reader(STREAM, 0)] == values[:frame.base_offset]
    assert cli_main(["verify", str(path)]) == 0


def test_writer_alive_follows_the_writer_lock(tmp_path):
    """Readers probe an unsealed index only when no writer is alive: the lock is read
    from /proc/locks, never taken."""
    from streamlog.directory import writer_alive
    path = str(tmp_path / "log")
    assert not writer_alive(path)  # no log, no LOCK file
    log = streamlog.open_log(path)
    try:
        assert writer_alive(path) == os.path.exists("/proc/locks")
    finally:
        log.close()
    assert not writer_alive(path)
