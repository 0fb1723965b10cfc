"""Kafka's wire protocol in front of a streamlog log (`streamlog serve --kafka-port`).

Modules: errors.py (Kafka's error codes), records.py (RecordBatch v2: its layout and
values), record_decoding.py and record_encoding.py (to and from it), codec.py (frames,
headers, request and response schemas through kio), broker.py (the answers, as
functions over a Log), producers.py (idempotent producers' sequence rules),
producer_state.py (their state, rebuilt from stamped frames and snapshots),
groups.py (consumer-group membership), server.py (the asyncio listener). See DESIGN
section 9.
"""

from .broker import Broker
from .offsets import OFFSETS_STREAM
from .server import KafkaConfig, KafkaServer

__all__ = ["Broker", "KafkaConfig", "KafkaServer", "OFFSETS_STREAM"]
