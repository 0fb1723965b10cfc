"""Golden bytes: the numbers and layouts that files on disk and peers on the wire rely on.

A change that breaks one of these breaks every log already written or every client
already deployed; it must come with a format version, not by accident. (Kafka's
`Errors` doc: names may change, codes never.)
"""

from streamlog import frame, payload, seal, txn
from streamlog.records import RecordKind
from streamlog.wire.protocol import ErrorCode, MessageType


def test_record_kinds():
    assert {k.name: k.value for k in RecordKind} == {
        "DATA": 0, "COMMIT": 1, "ABORT": 2, "G_OPEN": 3, "G_CHECK": 4, "CHECKPOINT": 5}


def test_frame_constants():
    assert (frame.MAGIC, frame.VERSION, frame.HEADER_BYTES) == (0x474F4C53, 1, 72)
    assert frame.MAGIC_BYTES == b"SLOG"
    assert (frame.CODEC_NONE, frame.CODEC_ZSTD, frame.CODEC_MASK) == (0, 1, 0b11)
    assert (frame.FLAG_HAS_CONTROL, frame.FLAG_HAS_HEADERS) == (0b100, 0b1000)


PAYLOAD = ("0100000000000000020000000000000001000000ffffffff02000000070000000a000000000000"
           "0000016b763176616c75652d3201000100680100000078")
FRAME_HEAD = ("534c4f47010c00000700000000000000010000000000000002000000000000000500000000"
              "000000020000003e0000003e00000000000000ce32dab20d02438eb3887637175c8be4")


def test_payload_and_frame_bytes():
    raw, flags = payload.encode_payload([1, 2], [b"k", None], [b"v1", b"value-2"], [0, 1],
                                        [[("h", b"x")], ()])
    assert flags == frame.FLAG_HAS_CONTROL | frame.FLAG_HAS_HEADERS
    assert raw.hex() == PAYLOAD
    data = frame.encode_frame(base_offset=7, record_count=2, min_timestamp_us=1,
                              max_timestamp_us=2, txn_id=5, flags=flags, raw_bytes=len(raw),
                              payload=raw)
    assert data.hex() == FRAME_HEAD + PAYLOAD
    decoded = frame.decode_frame(data, 0)
    assert (decoded.base_offset, decoded.record_count, decoded.txn_id) == (7, 2, 5)


def test_seal_and_commit_value_bytes():
    assert seal.encode_seal(size_bytes=1000, digest=0x1234, sealed_at_us=99,
                            end_offset=42).hex() == (
        "5345414c01000000e803000000000000341200000000000063000000000000002a00000000000000"
        "78339d4b402adc7e")
    assert txn.encode_commit("q", b"7") == bytes.fromhex("01007137")


def test_wire_codes():
    assert {k.name: k.value for k in ErrorCode} == {
        "INTERNAL": 1, "PROTOCOL_ERROR": 2, "FRAME_TOO_LARGE": 3, "UNAUTHENTICATED": 4,
        "UNSUPPORTED_VERSION": 5, "TOO_MANY_CONNECTIONS": 6, "SHUTTING_DOWN": 7,
        "LIMIT_EXCEEDED": 8, "INVALID_ARGUMENT": 10, "INVALID_APPEND": 11,
        "UNKNOWN_STREAM": 12, "OFFSET_OUT_OF_RANGE": 13, "LOG_CLOSED": 14, "READ_ONLY": 15,
        "PARTITION_FAILED": 16, "CORRUPTION": 17, "STREAMLOG_ERROR": 18}
    assert {k.name: k.value for k in MessageType} == {
        "HELLO": 1, "PING": 2, "CREATE_STREAM": 3, "APPEND": 4, "READ": 5, "CREDIT": 6,
        "CANCEL": 7, "OFFSETS": 8, "OFFSET_FOR_TIMESTAMP": 9, "INFO": 10, "STREAMS": 11,
        "COMMIT_TXN": 12, "ABORT_TXN": 13, "LAST_COMMIT": 14, "TRUNCATE_AFTER": 15,
        "TXN_STATE": 16, "HELLO_OK": 64, "PONG": 65, "ERROR": 66, "APPENDED": 67,
        "BATCH": 68, "READ_OPENED": 69, "READ_END": 70, "RESULT_INT": 71,
        "RESULT_OFFSETS": 72, "RESULT_JSON": 73, "RESULT_BYTES": 74}
