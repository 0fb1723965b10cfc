"""A sealed segment's object and index object (remote/segment_object.py): built from
segments a real partition wrote (in memory), checked before upload, and named by a
manifest generation."""

from __future__ import annotations

import pytest
import xxhash

from streamlog.config import LogConfig
from streamlog.encoder import Piece
from streamlog.errors import CorruptObject, Fenced
from streamlog.partition import Partition
from streamlog.records import RECORD_OVERHEAD_BYTES, RecordKind
from streamlog.remote import manifest as manifests
from streamlog.remote.segment_object import (decode_index, describe, encode_index,
                                             index_key, segment_key, upload)
from streamlog.testing import MemoryFileIO
from streamlog.testing.memindex import MemoryIndexStorage
from streamlog.testing.memstore import MemoryStore


def piece(values, timestamps, *, kinds=None) -> Piece:
    return Piece(list(timestamps), [None] * len(values), list(values), kinds, None,
                 sum(map(len, values)) + RECORD_OVERHEAD_BYTES * len(values), 0)


@pytest.fixture
def sealed():
    """A partition with several sealed segments: [(base, bytes)], and the partition."""
    part = Partition("/memory/log/streams/s/0", "s/0", 0,
                     LogConfig(segment_bytes_max=4096, compression="none").validate(),
                     MemoryFileIO(), readonly=False, index_storage=MemoryIndexStorage())
    for i in range(80):
        stamp = 1000 + 10 * i - (i % 3) * 25
        if i % 7:
            part.submit([piece([b"%03d" % i + b"." * 150], [stamp])])
        else:  # a control record, far in the future: it must not move the running max
            part.submit([piece([b"%03d" % i + b"." * 150, b"c"], [stamp, 99_999_999],
                               kinds=[int(RecordKind.DATA), int(RecordKind.CHECKPOINT)])])
    segments = [(s.base_offset, s.read(0, s.size_bytes)) for s in part.state.segments[:-1]]
    assert len(segments) >= 3
    yield segments, part
    part.close()


def test_the_index_object_says_what_the_local_index_says(sealed):
    segments, part = sealed
    hwm = None
    for base, data in segments:
        key = segment_key("s/0", base, 1)
        segment, index = describe(data, key=key, base_offset=base, hwm_before=hwm)
        entries = decode_index(index, index_key(key), base)
        assert entries == [part.index.lookup_offset(e.base_offset) for e in entries]
        assert (segment.base_offset, segment.end_offset) == (base, entries[-1].next_offset)
        assert segment.size == len(data)
        assert segment.checksum == xxhash.xxh3_128_hexdigest(data)
        # control records never move the running max (their stamps of 99_999_999)
        assert segment.hwm_us == entries[-1].hwm_after_us < 99_999_999
        hwm = segment.hwm_us
    assert encode_index(entries) == index


@pytest.mark.parametrize("damage, reason", [
    (lambda data: data[:-7], "ends inside a frame"),
    (lambda data: data[:100] + bytes([data[100] ^ 0x10]) + data[101:], "checksum"),
    (lambda data: b"", "empty segment"),
])
def test_a_damaged_or_torn_segment_is_never_described(sealed, damage, reason):
    (base, data), *_ = sealed[0]
    with pytest.raises(CorruptObject, match=reason) as caught:
        describe(damage(data), key="segments/s/0/x.log", base_offset=base, hwm_before=None)
    assert caught.value.key == "segments/s/0/x.log"


def test_a_segment_that_does_not_start_at_its_base_is_refused(sealed):
    segments, _ = sealed
    base, data = segments[1]
    with pytest.raises(CorruptObject, match="base offset"):
        describe(data, key="k.log", base_offset=base + 1, hwm_before=None)


def test_a_damaged_index_object_is_named(sealed):
    (base, data), *_ = sealed[0]
    _, index = describe(data, key="k.log", base_offset=base, hwm_before=None)
    flipped = index[:-3] + bytes([index[-3] ^ 1]) + index[-2:]
    with pytest.raises(CorruptObject, match="k.idx.*checksum mismatch"):
        decode_index(flipped, "k.idx", base)
    with pytest.raises(CorruptObject, match="not a segment index"):
        decode_index(b"streamlog-manifest 1 0\n", "k.idx", base)


def test_uploads_are_named_by_the_next_generation_and_a_fenced_writer_cannot_commit(sealed):
    segments, _ = sealed
    store = MemoryStore()
    current = manifests.take_over(store, "writer")
    hwm = None
    for base, data in segments[:2]:
        proposed = upload(store, current, "s/0", data, base_offset=base, hwm_before=hwm)
        assert proposed.generation == current.generation  # one commit per round
        current = manifests.commit(store, proposed.successor())
        hwm = current.partitions["s/0"].segments[-1].hwm_us
    part = manifests.latest(store).partitions["s/0"]
    assert part.committed_end == segments[2][0] and part.start_offset == 0
    for segment, (base, data) in zip(part.segments, segments):
        assert store.get(segment.key) == data
        assert decode_index(store.get(segment.index_key), segment.index_key, base)
    with pytest.raises(ValueError, match="does not continue"):
        upload(store, current, "s/0", segments[2][1], base_offset=segments[2][0] + 1,
               hwm_before=hwm)
    manifests.take_over(store, "newer")
    base, data = segments[2]
    stale = upload(store, current, "s/0", data, base_offset=base, hwm_before=hwm)
    with pytest.raises(Fenced):
        manifests.commit(store, stale.successor())
    # the fenced writer's object is under its own epoch's key: the newer writer's
    # generations never name it
    assert segment_key("s/0", base, current.epoch) != segment_key("s/0", base,
                                                                  current.epoch + 1)
    assert manifests.latest(store).partitions["s/0"].committed_end == base
