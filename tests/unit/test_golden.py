"""Golden bytes: the numbers and layouts that files on disk and peers on the wire rely on.

A change that breaks one of these breaks every log already written or every client
already deployed; it must come with a format version, not by accident. (Kafka's
`Errors` doc: names may change, codes never.)
"""

from streamlog import frame, payload, seal, txn
from streamlog.records import RecordKind
from streamlog.wire.codes import ERRORS, ErrorCode, MessageType
from streamlog.wire.messages import encode_message
from streamlog.wire.operations import OPERATIONS


def test_record_kinds():
    assert {k.name: k.value for k in RecordKind} == {
        "DATA": 0, "COMMIT": 1, "ABORT": 2, "G_OPEN": 3, "G_CHECK": 4, "CHECKPOINT": 5,
        "PRODUCER": 6, "BEGIN": 7}


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
    assert txn.encode_begin("q", 7) == bytes.fromhex("070000000000000071")
    assert txn.encode_epoch(7) == bytes.fromhex("0700000000000000")
    assert txn.producer_tag("q") == "streamlog.producer/q"


def test_wire_codes():
    assert {k.name: k.value for k in ErrorCode} == {
        "INTERNAL": 1, "PROTOCOL_ERROR": 2, "FRAME_TOO_LARGE": 3, "UNAUTHENTICATED": 4,
        "UNSUPPORTED_VERSION": 5, "TOO_MANY_CONNECTIONS": 6, "SHUTTING_DOWN": 7,
        "LIMIT_EXCEEDED": 8, "INVALID_ARGUMENT": 10, "INVALID_APPEND": 11,
        "UNKNOWN_STREAM": 12, "OFFSET_OUT_OF_RANGE": 13, "LOG_CLOSED": 14, "READ_ONLY": 15,
        "PARTITION_FAILED": 16, "CORRUPTION": 17, "STREAMLOG_ERROR": 18,
        "PRODUCER_FENCED": 19}
    assert {k.name: k.value for k in MessageType} == {
        "HELLO": 1, "PING": 2, "CREATE_STREAM": 3, "APPEND": 4, "READ": 5, "CREDIT": 6,
        "CANCEL": 7, "OFFSETS": 8, "OFFSET_FOR_TIMESTAMP": 9, "INFO": 10, "STREAMS": 11,
        "COMMIT_TXN": 12, "ABORT_TXN": 13, "LAST_COMMIT": 14, "TRUNCATE_AFTER": 15,
        "TXN_STATE": 16, "INIT_PRODUCER": 17, "BEGIN_TXN": 18, "OPEN_TRANSACTIONS": 19,
        "APPLY_RETENTION": 20, "HOLD": 21, "RELEASE_HOLD": 22, "HOLDS": 23,
        "HELLO_OK": 64, "PONG": 65, "ERROR": 66, "APPENDED": 67,
        "BATCH": 68, "READ_OPENED": 69, "READ_END": 70, "RESULT_INT": 71,
        "RESULT_OFFSETS": 72, "RESULT_JSON": 73, "RESULT_BYTES": 74}


def test_wire_error_map():
    """The exception a client raises for each code (codes.ERRORS)."""
    assert [(code.name, kind.__name__) for code, kind in ERRORS] == [
        ("INTERNAL", "RemoteError"), ("PROTOCOL_ERROR", "RemoteProtocolError"),
        ("FRAME_TOO_LARGE", "RemoteProtocolError"), ("UNAUTHENTICATED", "AuthenticationFailed"),
        ("UNSUPPORTED_VERSION", "RemoteProtocolError"),
        ("TOO_MANY_CONNECTIONS", "DaemonUnavailable"), ("SHUTTING_DOWN", "DaemonUnavailable"),
        ("INVALID_ARGUMENT", "InvalidArgument"), ("LIMIT_EXCEEDED", "InvalidArgument"),
        ("INVALID_APPEND", "InvalidAppend"), ("UNKNOWN_STREAM", "UnknownStream"),
        ("OFFSET_OUT_OF_RANGE", "OffsetOutOfRange"), ("LOG_CLOSED", "LogClosed"),
        ("READ_ONLY", "ReadOnlyLog"), ("PARTITION_FAILED", "PartitionFailed"),
        ("CORRUPTION", "CorruptionError"), ("PRODUCER_FENCED", "ProducerFenced"),
        ("STREAMLOG_ERROR", "StreamLogError")]


def test_wire_message_layouts():
    """Each message's field kinds in wire order (names are not on the wire), and the
    reply each request/reply operation is answered with."""
    layouts = {cls.TYPE.name: tuple(kind for _, kind in cls.FIELDS)
               for _, cls in sorted(OPERATIONS.messages.items())}
    assert layouts == {
        "HELLO": ("u16", "blob", "str"), "PING": (), "CREATE_STREAM": ("str", "u32"),
        "APPEND": ("str", "i32", "u64", "u8", "u32", "u8", "view"),
        "READ": ("str", "u32", "u8", "i64", "u8", "i64", "u8", "u32"), "CREDIT": ("u32",),
        "CANCEL": (), "OFFSETS": ("str", "u32"), "OFFSET_FOR_TIMESTAMP": ("str", "u32", "i64"),
        "INFO": (), "STREAMS": (), "COMMIT_TXN": ("str", "u32", "u64", "str", "blob"),
        "ABORT_TXN": ("str", "u32", "u64"), "LAST_COMMIT": ("str", "u32", "str"),
        "TRUNCATE_AFTER": ("str", "u32", "i64"), "TXN_STATE": ("str", "u32", "u64"),
        "INIT_PRODUCER": ("str", "u32", "str"), "BEGIN_TXN": ("str", "u32", "str", "i64"),
        "OPEN_TRANSACTIONS": ("str", "u32"), "APPLY_RETENTION": ("opt_i64",),
        "HOLD": ("str", "u32", "str", "i64"), "RELEASE_HOLD": ("str", "u32", "str"),
        "HOLDS": ("str", "u32"),
        "HELLO_OK": ("u16", "u32", "u32", "str"), "PONG": (), "ERROR": ("u16", "str"),
        "APPENDED": ("u32", "rest"), "BATCH": ("u32", "i64", "u64", "u32", "u8", "view"),
        "READ_OPENED": ("i64",), "READ_END": ("i64",), "RESULT_INT": ("i64",),
        "RESULT_OFFSETS": ("i64", "i64", "i64"), "RESULT_JSON": ("rest",),
        "RESULT_BYTES": ("u8", "rest")}
    assert {op.type.name: op.reply.message.TYPE.name for op in OPERATIONS
            if not op.streamed} == {
        "CREATE_STREAM": "RESULT_INT", "STREAMS": "RESULT_JSON", "OFFSETS": "RESULT_OFFSETS",
        "OFFSET_FOR_TIMESTAMP": "RESULT_INT", "INFO": "RESULT_JSON", "COMMIT_TXN": "RESULT_INT",
        "ABORT_TXN": "RESULT_INT", "TXN_STATE": "RESULT_INT", "LAST_COMMIT": "RESULT_BYTES",
        "TRUNCATE_AFTER": "RESULT_INT", "INIT_PRODUCER": "RESULT_INT",
        "BEGIN_TXN": "RESULT_INT", "OPEN_TRANSACTIONS": "RESULT_JSON",
        "APPLY_RETENTION": "RESULT_JSON", "HOLD": "RESULT_INT", "RELEASE_HOLD": "RESULT_INT",
        "HOLDS": "RESULT_JSON"}


def test_wire_request_bytes():
    """Requests built from the operation table, byte for byte as deployed clients send."""
    def request(name, request_id, *values):
        return encode_message(OPERATIONS[name].request(request_id, *values)).hex()

    assert request("commit_txn", 5, "s", 0, 1 << 63, "tag", b"m") == (
        "0000001e0c000000050001730000000080000000000000000003746167000000016d")
    assert request("create_stream", 2, "s", 4) == "0000000c030000000200017300000004"
    assert request("offsets", 3, "x", 1) == "0000000c080000000300017800000001"
    assert request("offset_for_timestamp", 4, "s", 2, -5) == (
        "00000014090000000400017300000002fffffffffffffffb")
    assert request("info", 5) == "000000050a00000005"
    assert request("streams", 6) == "000000050b00000006"
    assert request("abort_txn", 7, "s", 1, 9) == (
        "000000140d00000007000173000000010000000000000009")
    assert request("last_commit", 8, "s", 0, "t") == "0000000f0e0000000800017300000000000174"
    assert request("truncate_after", 9, "s", 0, 77) == (
        "000000140f0000000900017300000000000000000000004d")
    assert request("txn_state", 10, "s", 3, 99) == (
        "00000014100000000a000173000000030000000000000063")
