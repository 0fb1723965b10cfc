"""Kafka requests built as a client sends them, for tests that drive the broker or the
Kafka listener without a Kafka client library.

Strategy: kio's schemas write the request header and body (`request_bytes`); a test that
calls the broker directly parses them back (`parsed`, the broker's own parser), a test
that talks to the listener sends them framed (`framed`). Produce requests for one
partition have their fields made once (`produce_fields`).

Imported as `harness.kafka_requests`, with tests/ on sys.path (see harness/__init__.py).
"""

from __future__ import annotations

import io
import struct

from kio.index import load_request_schema
from kio.serial import entity_writer

from streamlog.kafka import codec


def request_bytes(api_key: int, version: int, **fields) -> bytes:
    """A request's header (correlation id 1, client id "test") and body, unframed.

    Args:
        api_key, version: the request type and its version, as kio names its schemas.
        fields: the body's fields, as codec.build takes them.
    """
    schema = load_request_schema(api_key, version)
    out = io.BytesIO()
    header = schema.__header_schema__
    entity_writer(header)(out, header(request_api_key=api_key, request_api_version=version,
                                      correlation_id=1, client_id="test"))
    entity_writer(schema)(out, codec.build(schema, **fields))
    return out.getvalue()


def framed(body: bytes) -> bytes:
    """`body` behind its int32 length, as it goes over the socket."""
    return struct.pack(">i", len(body)) + body


def parsed(api_key: int, version: int, **fields) -> codec.Request:
    """The request as the broker's handlers take it."""
    return codec.parse_request(request_bytes(api_key, version, **fields))


def produce_fields(topic: str, partition: int, records: bytes, acks: int = -1) -> dict:
    """The fields of a Produce request of `records` (RecordBatch bytes) to one partition,
    with a one-second timeout."""
    return {"acks": acks, "timeout": 1000, "topic_data": [
        {"name": topic, "partition_data": [{"index": partition, "records": records}]}]}
