"""The Kafka codec without sockets: frames, requests, responses, RecordBatch v2, the
group state machine and the broker's answers over a local log."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import gzip
import io
import random
import struct
import uuid

import crc32c
import pytest
from kio.index import KioIndexError, load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer
from kio.serial._introspect import classify_field, get_field_tag, is_optional

import streamlog
from streamlog.kafka import codec, record_decoding, record_encoding, records
from streamlog.kafka.batches import read as read_batches
from streamlog.kafka.broker import Broker
from streamlog.kafka.errors import ErrorCode, FrameTooLarge, KafkaProtocolError, \
    UnsupportedRequest
from streamlog.kafka.groups import Coordinator, GroupState


def request_bytes(api_key: int, version: int, correlation_id: int = 7, **fields) -> bytes:
    schema = load_request_schema(api_key, version)
    out = io.BytesIO()
    header = schema.__header_schema__
    entity_writer(header)(out, header(request_api_key=api_key, request_api_version=version,
                                      correlation_id=correlation_id, client_id="test"))
    entity_writer(schema)(out, codec.build(schema, **fields))
    return out.getvalue()


def framed(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


# -- frames ------------------------------------------------------------------------------

def test_frames_whole_byte_by_byte_and_with_trailing_bytes():
    data = framed(b"one") + framed(b"") + framed(b"three")
    whole = codec.FrameReader()
    whole.receive(data + b"\0\0")
    assert [whole.next_frame() for _ in range(3)] == [b"one", b"", b"three"]
    assert whole.next_frame() is None and whole.buffered == 2
    trickle = codec.FrameReader()
    got = []
    for byte in data:
        trickle.receive(bytes([byte]))
        while (frame := trickle.next_frame()) is not None:
            got.append(frame)
    assert got == [b"one", b"", b"three"]


@pytest.mark.parametrize("size", [1025, -1, 0x7FFFFFFF])
def test_oversized_or_negative_frame_is_refused_before_its_body(size):
    reader = codec.FrameReader(frame_bytes_max=1024)
    reader.receive(struct.pack(">i", size))
    with pytest.raises(FrameTooLarge):
        reader.next_frame()


# -- requests and responses ----------------------------------------------------------------

def test_request_round_trip_flexible_and_not():
    request = codec.parse_request(request_bytes(18, 3, client_software_name="kcat",
                                                client_software_version="1.7"))
    assert (request.api_key, request.api_version, request.correlation_id) == (18, 3, 7)
    assert request.body.client_software_name == "kcat"
    request = codec.parse_request(request_bytes(3, 1, topics=[{"name": "events"}]))
    assert request.name == "Metadata" and request.body.topics[0].name == "events"


def test_api_versions_response_has_header_v0_even_when_flexible():
    request = codec.parse_request(request_bytes(18, 3, correlation_id=99))
    schema = load_response_schema(18, 3)
    out = codec.encode_response(request, codec.build(schema, api_keys=codec.api_versions_list()))
    assert struct.unpack_from(">ii", out) == (len(out) - 4, 99)
    body, _size = entity_reader(schema)(out, 8)  # no tagged-field byte after the id
    assert {k.api_key for k in body.api_keys} == set(codec.SERVED)


def test_garbage_is_a_protocol_error():
    for frame in (b"", b"\x00\x12", b"\x00\x03\x00\x01\x00\x00\x00\x01\xff\xff\xff"):
        with pytest.raises(KafkaProtocolError):
            codec.parse_request(frame)


# Requests as Kafka's broker parses them: unknown tagged fields skipped (KIP-482), bytes
# after a whole request ignored. The bytes are spelled out, as a client sends them.

def uvarint(number: int) -> bytes:
    out = bytearray()
    while number >= 0x80:
        out.append(number & 0x7F | 0x80)
        number >>= 7
    return bytes(out) + bytes([number])


def compact_string(text: str) -> bytes:
    data = text.encode()
    return uvarint(len(data) + 1) + data


def tags(*fields: tuple[int, bytes]) -> bytes:
    """A tagged-field section: the count, then tag, size and value of each."""
    return uvarint(len(fields)) + b"".join(uvarint(tag) + uvarint(len(value)) + value
                                           for tag, value in fields)


def header_v2(api_key: int, version: int, correlation_id: int, client_id: str,
              *fields: tuple[int, bytes]) -> bytes:
    return (struct.pack(">hhih", api_key, version, correlation_id, len(client_id))
            + client_id.encode() + tags(*fields))


# librdkafka 2.16's Metadata v9 requests, as sent by confluent-kafka. For all topics the
# topic array's null (varint 0) fills one byte of a four-byte slot and the other three
# stay zero, so the booleans and the tagged-field count are read from the wrong bytes.
RDKAFKA_ALL_TOPICS_ADMIN = bytes.fromhex(  # AdminClient.list_topics()
    "0003000900000003000772646b61666b6100" "00000000" "010000" "00")
RDKAFKA_ALL_TOPICS_CONSUMER = bytes.fromhex(  # a regex subscription's refresh
    "0003000900000004000772646b61666b6100" "00000000" "000000" "00")
RDKAFKA_BROKERS_ONLY = bytes.fromhex(  # the first request on a connection: no topics
    "0003000900000002000772646b61666b6100" "01" "000000" "00")


def test_librdkafka_metadata_v9_for_all_topics_parses_as_kafka_parses_it():
    # admin: the count byte is 01 (allow_auto_topic_creation), read as one tagged field
    # of tag 0 and size 0 (skipped), then one byte is left over (ignored)
    request = codec.parse_request(RDKAFKA_ALL_TOPICS_ADMIN)
    assert (request.name, request.api_version, request.correlation_id,
            request.client_id) == ("Metadata", 9, 3, "rdkafka")
    assert request.body.topics is None  # all topics
    assert not request.body.allow_auto_topic_creation
    # consumer: no tagged field, three bytes left over (ignored)
    request = codec.parse_request(RDKAFKA_ALL_TOPICS_CONSUMER)
    assert request.correlation_id == 4 and request.body.topics is None
    request = codec.parse_request(RDKAFKA_BROKERS_ONLY)
    assert request.correlation_id == 2 and request.body.topics == ()


def fetch_v12(header_tags=(), top_tags=(), topic_tags=(), partition_tags=()) -> bytes:
    """Fetch v12 for partition 2 of "clicks" from offset 40, the tagged-field sections
    as given."""
    partition = struct.pack(">iiqiqi", 2, -1, 40, -1, -1, 1 << 20) + tags(*partition_tags)
    topic = compact_string("clicks") + uvarint(2) + partition + tags(*topic_tags)
    return (header_v2(1, 12, 11, "probe", *header_tags)
            + struct.pack(">iiiibii", -1, 500, 1, 1 << 20, 0, 0, -1)
            + uvarint(2) + topic  # topics
            + uvarint(1)  # forgotten_topics_data: empty
            + compact_string("rack-a")
            + tags(*top_tags))


def test_unknown_tagged_fields_are_skipped_in_the_header_at_top_level_and_nested():
    plain = codec.parse_request(fetch_v12())
    assert plain.body.cluster_id is None
    request = codec.parse_request(fetch_v12(
        header_tags=[(3, b"\x01\x02")],
        top_tags=[(0, compact_string("our-cluster")), (9, b"unknown"), (300, b"")],
        topic_tags=[(1, b"\xff" * 200)],  # a size of two varint bytes
        partition_tags=[(5, b"xyz"), (6, uvarint(1 << 20))]))
    assert (request.name, request.correlation_id, request.client_id) == ("Fetch", 11, "probe")
    assert request.body.cluster_id == "our-cluster"  # the one tag Fetch v12 knows: kept
    assert dataclasses.replace(request.body, cluster_id=None) == plain.body
    [topic] = request.body.topics
    [partition] = topic.partitions
    assert (topic.topic, partition.partition, partition.fetch_offset,
            request.body.rack_id) == ("clicks", 2, 40, "rack-a")
    # Metadata v9 naming a topic, an unknown tag on the topic and on the request
    frame = (header_v2(3, 9, 12, "probe") + uvarint(2) + compact_string("views")
             + tags((0, b"\x00")) + b"\x01\x00\x01" + tags((4, b"abcd")))
    request = codec.parse_request(frame)
    assert [t.name for t in request.body.topics] == ["views"]
    assert request.body.allow_auto_topic_creation
    assert request.body.include_topic_authorized_operations


def test_bytes_after_a_whole_request_are_ignored():
    for frame in (request_bytes(18, 0), request_bytes(18, 3, client_software_name="x"),
                  request_bytes(3, 1, topics=[{"name": "events"}]),
                  request_bytes(3, 9, topics=[{"name": "events"}]), fetch_v12()):
        assert codec.parse_request(frame + b"\x00\x07stray") == codec.parse_request(frame)


def test_an_unknown_tagged_field_past_the_end_is_a_protocol_error():
    with pytest.raises(KafkaProtocolError, match="past the request's end"):
        codec.parse_request(fetch_v12(top_tags=[(9, b"abc")])[:-2])
    with pytest.raises(KafkaProtocolError, match="does not parse"):  # cut in a partition
        codec.parse_request(fetch_v12(partition_tags=[(5, b"xyz")])[:70])


def _sample(cls, variant: int):
    """An entity of `cls` with every field set, tagged ones included, to a value other
    than its default; in variant 1 every nullable field is null instead."""
    scalars = {"bool": True, "bytes": b"\x01\x02", "records": b"rec", "float64": 1.5,
               "int8": 3, "int16": 300, "int32": 70000, "int64": 1 << 40, "uint16": 65000,
               "string": "name", "uuid": uuid.UUID(int=12345),
               "timedelta_i32": datetime.timedelta(milliseconds=250),
               "timedelta_i64": datetime.timedelta(milliseconds=1 << 33)}
    values = {}
    for field in dataclasses.fields(cls):
        kind = classify_field(field)
        if variant == 1 and is_optional(field):
            values[field.name] = None
            continue
        if dataclasses.is_dataclass(kind.type_):
            one = _sample(kind.type_, variant)
        else:
            one = scalars[field.metadata["kafka_type"]]
        values[field.name] = (one, one) if kind.is_array else one
    return cls(**values)


def _request_schemas():
    for api_key in range(100):
        for version in range(30):
            try:
                yield load_request_schema(api_key, version)
            except KioIndexError:  # no such key or version
                continue


def test_lenient_reader_reads_every_request_schema_as_kio_does():
    schemas = list(_request_schemas())
    assert len(schemas) > 250
    tagged = nested_nullable = 0
    for schema in schemas:
        for variant in (0, 1):
            for cls, entity in ((schema.__header_schema__, _sample(
                    schema.__header_schema__, variant)), (schema, _sample(schema, variant))):
                out = io.BytesIO()
                entity_writer(cls)(out, entity)
                data = b"\x00" + out.getvalue()  # not at offset 0
                expected = entity_reader(cls)(data, 1)
                assert expected[0] == entity
                assert codec._lenient_reader(cls)(data, 1) == expected, (cls, variant)
        fields = [(s, f) for s in _entity_classes(schema) for f in dataclasses.fields(s)]
        tagged += any(get_field_tag(f) is not None for _s, f in fields)
        nested_nullable += any(dataclasses.is_dataclass(classify_field(f).type_)
                               and is_optional(f) for _s, f in fields)
    assert tagged and nested_nullable  # both were exercised


def _entity_classes(cls):
    yield cls
    for field in dataclasses.fields(cls):
        kind = classify_field(field)
        if dataclasses.is_dataclass(kind.type_):
            yield from _entity_classes(kind.type_)


def test_unsupported_version_answers_unsupported_version():
    with pytest.raises(UnsupportedRequest) as caught:  # ApiVersions: v0 with our ranges
        codec.parse_request(struct.pack(">hhi", 18, 99, 5) + b"\0\0")
    out = caught.value.response
    body, _ = entity_reader(load_response_schema(18, 0))(out, 8)
    assert body.error_code == ErrorCode.unsupported_version and body.api_keys
    with pytest.raises(UnsupportedRequest) as caught:  # Fetch 13 needs topic ids
        codec.parse_request(struct.pack(">hhi", 1, 13, 5))
    assert caught.value.response is not None
    with pytest.raises(UnsupportedRequest) as caught:  # no such API: nothing to answer
        codec.parse_request(struct.pack(">hhi", 999, 0, 5))
    assert caught.value.response is None


def test_every_served_version_has_schemas_and_zero_responses_encode():
    for key, (_name, low, high) in codec.SERVED.items():
        for version in range(low, high + 1):
            load_request_schema(key, version)
            codec.zero(load_response_schema(key, version), ErrorCode.unsupported_version)


# -- RecordBatch v2 --------------------------------------------------------------------------

RECORDS = [records.KafkaRecord(0, 1_700_000_000_000, b"k", b"v", (("h", b"1"),)),
           records.KafkaRecord(1, 1_700_000_000_005, None, b"x" * 300, ()),
           records.KafkaRecord(2, 1_699_999_999_990, b"", None, (("a", None), ("b", b"")))]


def test_batch_round_trip():
    data = record_encoding.encode_batch(42, RECORDS, producer_id=7, producer_epoch=1,
                                base_sequence=3)
    (batch,) = record_decoding.decode_batches(data)
    assert batch.base_offset == 42 and batch.records == tuple(
        records.KafkaRecord(r.offset_delta, r.timestamp_ms, r.key, r.value, r.headers)
        for r in RECORDS)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (7, 1, 3)
    assert batch.max_timestamp_ms == 1_700_000_000_005
    two = record_decoding.decode_batches(data + record_encoding.encode_batch(45, RECORDS[:1]))
    assert [b.base_offset for b in two] == [42, 45]


def test_bad_crc_is_corrupt_message():
    data = bytearray(record_encoding.encode_batch(0, RECORDS))
    data[-1] ^= 0xFF
    with pytest.raises(records.BatchError) as caught:
        record_decoding.decode_batches(bytes(data))
    assert caught.value.code == ErrorCode.corrupt_message


@pytest.mark.parametrize("cut", [1, 30, 70])
def test_short_batch_is_corrupt_message(cut):
    data = record_encoding.encode_batch(0, RECORDS)
    with pytest.raises(records.BatchError) as caught:
        record_decoding.decode_batches(data[:-cut])
    assert caught.value.code == ErrorCode.corrupt_message


def _recompress(data: bytes, codec_number: int, body: bytes) -> bytes:
    """`data` (an uncompressed batch) with its records replaced by `body` under the
    codec, the CRC recomputed."""
    head = bytearray(data[:records.HEADER_BYTES])
    attributes = struct.unpack_from(">h", head, 21)[0] | codec_number
    struct.pack_into(">h", head, 21, attributes)
    struct.pack_into(">i", head, 8, len(head) + len(body) - 12)
    crc = crc32c.crc32c(bytes(head[21:]) + body)
    struct.pack_into(">I", head, 17, crc)
    return bytes(head) + body


def _codecs():
    import cramjam
    import zstandard
    xerial = (b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1))
    return {
        "gzip": (records.GZIP, gzip.compress),
        "snappy": (records.SNAPPY, lambda b: bytes(cramjam.snappy.compress_raw(b))),
        "snappy-xerial": (records.SNAPPY, lambda b: xerial + _xerial_block(cramjam, b)),
        "lz4": (records.LZ4, lambda b: bytes(cramjam.lz4.compress(b))),
        "zstd": (records.ZSTD, lambda b: zstandard.ZstdCompressor().compress(b)),
    }


def _xerial_block(cramjam, body: bytes) -> bytes:
    block = bytes(cramjam.snappy.compress_raw(body))
    return struct.pack(">i", len(block)) + block


@pytest.mark.parametrize("name", ["gzip", "snappy", "snappy-xerial", "lz4", "zstd"])
def test_compressed_batches_decode(name):
    number, compress = _codecs()[name]
    plain = record_encoding.encode_batch(0, RECORDS)
    data = _recompress(plain, number, compress(plain[records.HEADER_BYTES:]))
    (batch,) = record_decoding.decode_batches(data)
    assert batch.compression == number
    assert [r.value for r in batch.records] == [r.value for r in RECORDS]


def test_unknown_codec_and_old_magic_are_refused():
    plain = record_encoding.encode_batch(0, RECORDS)
    with pytest.raises(records.BatchError) as caught:
        record_decoding.decode_batches(_recompress(plain, 5, plain[records.HEADER_BYTES:]))
    assert caught.value.code == ErrorCode.unsupported_compression_type
    old = bytearray(plain)
    old[16] = 1
    with pytest.raises(records.BatchError) as caught:
        record_decoding.decode_batches(bytes(old))
    assert caught.value.code == ErrorCode.unsupported_for_message_format


def test_garbage_compressed_body_is_corrupt_message():
    plain = record_encoding.encode_batch(0, RECORDS)
    with pytest.raises(records.BatchError) as caught:
        record_decoding.decode_batches(_recompress(plain, records.ZSTD, b"not zstd at all"))
    assert caught.value.code == ErrorCode.corrupt_message


def test_array_encoder_matches_the_record_encoder_byte_for_byte():
    rng = random.Random(7)
    for trial in range(200):
        count = rng.randint(1, 120)
        stamps = [rng.randint(-10 ** rng.randint(0, 12), 10 ** rng.randint(0, 13))
                  for _ in range(count)]
        keys = [None if rng.random() < 0.3 else rng.randbytes(rng.choice([0, 1, 5, 200]))
                for _ in range(count)]
        values = [rng.randbytes(rng.choice([0, 1, 63, 64, 100, 9000]))
                  for _ in range(count)]
        expected = record_encoding.encode_columns(trial, list(range(count)), stamps, keys, values)
        got = record_encoding.encode_arrays(
            trial, stamps, [-1 if k is None else len(k) for k in keys],
            b"".join(k for k in keys if k), [len(v) for v in values], b"".join(values))
        assert got == expected


def test_array_decoder_matches_the_list_decoder():
    rng = random.Random(11)
    took_arrays = 0
    for trial in range(200):
        count = rng.randint(1, 80)
        with_headers, with_null_value = trial % 7 == 0, trial % 11 == 0
        rows = [records.KafkaRecord(
            i, rng.randint(-10 ** rng.randint(0, 12), 10 ** rng.randint(0, 13)),
            None if rng.random() < 0.3 else rng.randbytes(rng.choice([0, 1, 200])),
            None if with_null_value and i == count - 1 else rng.randbytes(
                rng.choice([0, 1, 63, 64, 100, 9000])),
            (("h", b"v"),) if with_headers and i == 0 else ()) for i in range(count)]
        data = record_encoding.encode_batch(trial, rows)
        (plain,) = record_decoding.decode_batches(data)
        (fast,) = record_decoding.decode_batches(data, as_arrays=True)
        assert fast.records == plain.records == tuple(rows)
        assert (fast.arrays is None) == with_headers  # nulls come as Arrow nulls
        took_arrays += fast.arrays is not None
    assert took_arrays > 100
    broken = bytearray(record_encoding.encode_batch(0, rows))
    broken[records.HEADER_BYTES] = 0x7E  # a record longer than the batch
    struct.pack_into(">I", broken, 17, crc32c.crc32c(bytes(broken[21:])))
    with pytest.raises(records.BatchError):
        record_decoding.decode_batches(bytes(broken), as_arrays=True)


def test_fetch_of_a_large_batch_is_cut_into_kafka_batches(tmp_path):
    with streamlog.open_log(tmp_path / "log") as log:
        log.create_stream("t", 1)
        values = [b"%d" % i * (i % 50) for i in range(10_000)]
        log.append_batch_sync("t", values, keys=[None if i % 3 else b"k" for i in
                                                 range(10_000)], partition=0)
        chunks = read_batches(log, "t", 0, 5, 1 << 30, False, at_least_one=True)
        batches = [b for chunk in chunks for b in record_decoding.decode_batches(chunk)]
        assert len(batches) > 1
        got = [(b.base_offset + r.offset_delta, r.key, r.value)
               for b in batches for r in b.records]
        assert got == [(i, None if i % 3 else b"k", values[i]) for i in range(5, 10_000)]
        few = read_batches(log, "t", 0, 0, 1000, False, at_least_one=True)
        assert len(few) == 1  # over the budget after the first batch


# -- groups ------------------------------------------------------------------------------------

class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_group_rebalances_when_a_member_joins_and_when_one_expires():
    clock = FakeClock()
    groups = Coordinator(clock)
    join = dict(group_instance_id=None, client_id="c", session_timeout_s=10,
                rebalance_timeout_s=30, protocol_type="consumer",
                protocols=[("range", b"meta")])
    first = await groups.join("g", "", **join)
    assert first.error_code == ErrorCode.none and first.leader == first.member_id
    assert first.generation_id == 1 and len(first.members) == 1
    assert await groups.sync("g", 1, first.member_id, {first.member_id: b"all"}) == (
        ErrorCode.none, b"all")
    second_join = asyncio.ensure_future(groups.join("g", "", **join))
    await asyncio.sleep(0)
    assert groups.heartbeat("g", 1, first.member_id) == ErrorCode.rebalance_in_progress
    again = await groups.join("g", first.member_id, **join)
    second = await second_join
    assert again.generation_id == second.generation_id == 2
    assert again.leader == first.member_id and len(again.members) == 2
    assert second.members == []
    follower_sync = asyncio.ensure_future(groups.sync("g", 2, second.member_id, {}))
    await asyncio.sleep(0)
    assert await groups.sync("g", 2, first.member_id, {first.member_id: b"a",
                                                       second.member_id: b"b"}) == (
        ErrorCode.none, b"a")
    assert await follower_sync == (ErrorCode.none, b"b")
    assert groups.groups["g"].state is GroupState.STABLE
    assert groups.check_commit("g", 1, first.member_id) == ErrorCode.illegal_generation
    clock.now = 5
    assert groups.heartbeat("g", 2, first.member_id) == ErrorCode.none
    clock.now = 12  # the second member's session (10 s) has run out
    groups.tick()
    assert second.member_id not in groups.groups["g"].members
    assert groups.heartbeat("g", 2, first.member_id) == ErrorCode.rebalance_in_progress
    assert groups.leave("g", [first.member_id]) == {first.member_id: ErrorCode.none}
    assert groups.groups["g"].state is GroupState.EMPTY


# -- the broker over a local log ---------------------------------------------------------------

def produce_request(topic: str, partition: int, batch: bytes, acks: int = -1):
    return codec.parse_request(request_bytes(0, 9, acks=acks, timeout=1000, topic_data=[
        {"name": topic, "partition_data": [{"index": partition, "records": batch}]}]))


def produced(broker, request):
    response = broker.handle_produce(request)
    (partition,) = response.responses[0].partition_responses
    return partition.error_code, partition.base_offset


def test_idempotent_retry_is_not_appended_twice(tmp_path):
    with streamlog.open_log(tmp_path / "log") as log:
        log.create_stream("t", 2)
        broker = Broker(log)
        pid = broker.handle_init_producer_id(codec.parse_request(request_bytes(
            22, 4, transactional_id=None, transaction_timeout=60000))).producer_id
        batch = record_encoding.encode_batch(0, RECORDS, producer_id=pid, producer_epoch=0,
                                     base_sequence=0)
        assert produced(broker, produce_request("t", 1, batch)) == (ErrorCode.none, 0)
        assert produced(broker, produce_request("t", 1, batch)) == (ErrorCode.none, 0)
        later = record_encoding.encode_batch(0, RECORDS[:1], producer_id=pid, producer_epoch=0,
                                     base_sequence=3)
        gap = record_encoding.encode_batch(0, RECORDS[:1], producer_id=pid, producer_epoch=0,
                                   base_sequence=9)
        assert produced(broker, produce_request("t", 1, gap))[0] == \
            ErrorCode.out_of_order_sequence_number
        assert produced(broker, produce_request("t", 1, later)) == (ErrorCode.none, 3)
        assert log.end_offset("t", 1) == 4
        rows = list(log.reader("t", 1).records())
        assert [(r.key, r.value, r.headers, r.timestamp_us) for r in rows[:3]] == [
            (b"k", b"v", (("h", b"1"),), 1_700_000_000_000_000),
            (None, b"x" * 300, (), 1_700_000_000_005_000),
            (b"", None, (("a", None), ("b", b"")), 1_699_999_999_990_000)]  # nulls kept
        bad = bytearray(batch)
        bad[-1] ^= 1
        assert produced(broker, produce_request("t", 0, bytes(bad)))[0] == \
            ErrorCode.corrupt_message
        assert produced(broker, produce_request("nope", 0, batch))[0] == \
            ErrorCode.unknown_topic_or_partition
        assert broker.handle_produce(produce_request("t", 0, record_encoding.encode_batch(
            0, RECORDS), acks=0)) is None
        transactional = broker.handle_init_producer_id(codec.parse_request(request_bytes(
            22, 4, transactional_id="tx", transaction_timeout=60000)))
        assert transactional.error_code == ErrorCode.none  # transactions.py's now
        assert transactional.producer_id > 0 and transactional.producer_epoch == 0


def test_fetch_serves_markers_as_control_batches_and_read_committed_skips_aborts(tmp_path):
    with streamlog.open_log(tmp_path / "log") as log:
        log.create_stream("t", 1)
        log.append_sync("t", b"a", timestamp_us=1_000)
        aborted = log.new_txn_id()
        log.append_batch_sync("t", [b"gone"], partition=0, txn_id=aborted, timestamps_us=[2_000])
        log.abort_txn("t", 0, aborted)
        kept = log.new_txn_id()
        log.append_batch_sync("t", [b"kept"], partition=0, txn_id=kept, timestamps_us=[3_000])
        log.commit_txn("t", 0, kept)
        log.append_sync("t", b"z", timestamp_us=9_000)

        def fetched(committed):
            out = []
            for chunk in read_batches(log, "t", 0, 0, 1 << 20, committed, at_least_one=True):
                for batch in record_decoding.decode_batches(chunk):
                    out += [("control" if batch.is_control else "data",
                             batch.base_offset + r.offset_delta, r.value)
                            for r in batch.records]
            return out

        uncommitted = fetched(False)
        assert [(kind, offset) for kind, offset, _v in uncommitted] == [
            ("data", 0), ("data", 1), ("control", 2), ("data", 3), ("control", 4),
            ("data", 5)]
        committed = fetched(True)
        assert [(kind, offset) for kind, offset, _v in committed] == [
            ("data", 0), ("data", 3), ("control", 4), ("data", 5)]  # 1-2 aborted: a gap
        assert [v for kind, _o, v in committed if kind == "data"] == [b"a", b"kept", b"z"]
        last = log.new_txn_id()
        log.append_batch_sync("t", [b"gone too"], partition=0, txn_id=last,
                              timestamps_us=[9_500])
        log.abort_txn("t", 0, last)
        tail = fetched(True)[-1]  # an aborted transaction at the end: a control batch
        assert tail[:2] == ("control", 7)  # on its marker moves the consumer past it
        broker = Broker(log)
        found = broker._list_offset("t", 0, 5, committed=False)  # 5 ms: record "z"
        assert found == {"offset": 5, "timestamp": 9}
        assert broker._list_offset("t", 0, 10, committed=False)["offset"] == -1
        assert broker._list_offset("t", 0, -2, committed=False) == {"offset": 0}
        assert broker._list_offset("t", 0, -1, committed=False) == {"offset": 8}


def test_committed_offsets_survive_a_reopen(tmp_path):
    with streamlog.open_log(tmp_path / "log") as log:
        log.create_stream("t", 2)
        broker = Broker(log)
        codes = broker.commit_offsets("g", [("t", 0, 5, "m"), ("t", 1, 7, None),
                                            ("missing", 0, 1, None)])
        assert codes[("t", 0)] == ErrorCode.none
        assert codes[("missing", 0)] == ErrorCode.unknown_topic_or_partition
        broker.commit_offsets("g", [("t", 0, 6, "n")])
    with streamlog.open_log(tmp_path / "log") as log:
        assert Broker(log).committed("g") == {("t", 0): (6, "n"), ("t", 1): (7, None)}
