"""Committed consumer-group offsets, kept in the internal stream `__consumer_offsets`.

Strategy: every commit is a record of the one-partition stream `__consumer_offsets`
(Kafka's own name for it), key "group\\0topic\\0partition", value JSON
{"offset", "metadata"}; a deleted offset (DeleteGroups, OffsetDelete) is a tombstone (a
record whose value is None), as Kafka writes it. A commit is appended and
acknowledged under the log's fsync policy before OffsetCommit answers; the table in
memory is rebuilt from the stream when the listener starts (the last record of a key
wins). Offsets a transactional producer commits (TxnOffsetCommit) are appended under
the transaction (transactions.py) and count once it commits: the stream is read
read_committed. The stream is internal (a name starting with "__", DESIGN 1): clients read it,
only this module writes it (Log.append_internal_sync), so no client can forge a commit.

A log written before the stream was internal kept its commits in the client-writable
stream `kafka.consumer_offsets`: the first start copies them over and then appends a
record with the key CARRIED_OVER; a start that finds the copy without that record (a
crash in the middle) copies them again, which leaves the same table (the last record of
each key wins). The old stream stays, a plain stream: nothing reads it any more.
"""

from __future__ import annotations

import json
import logging
import threading

from .errors import ErrorCode

OFFSETS_STREAM = "__consumer_offsets"
OLD_OFFSETS_STREAM = "kafka.consumer_offsets"
CARRIED_OVER = b"\0carried-over:" + OLD_OFFSETS_STREAM.encode()
METADATA_BYTES_MAX = 4096  # Kafka's offset.metadata.max.bytes default
_LOG = logging.getLogger("streamlog.kafka")

Key = tuple[str, int]  # (topic, partition)


class CommittedOffsets:
    """Every group's committed offsets: {group: {(topic, partition): (offset, metadata)}}."""

    def __init__(self, log) -> None:
        self.log = log
        self._table: dict[str, dict[Key, tuple[int, str | None]]] = {}
        self._lock = threading.Lock()
        log.create_internal_stream(OFFSETS_STREAM, 1)
        carried = self._load()
        if not carried and OLD_OFFSETS_STREAM in log.streams():
            self._carry_over()

    def _load(self) -> bool:
        """Read the stream into the table; True when it holds the carry-over record."""
        carried = False
        with self.log.reader(OFFSETS_STREAM, 0, read_committed=True) as reader:
            for record in reader.records():
                if record.key == CARRIED_OVER:
                    carried = True
                elif not self._apply(record.key, record.value):
                    _LOG.warning("kafka_offsets_record_skipped",
                                 extra={"fields": {"offset": record.offset}})
        return carried

    def _apply(self, key, value) -> bool:
        try:
            group, topic, partition = key.decode().split("\0")
            place = (topic, int(partition))
            if not value:  # a tombstone: deleted
                self._table.get(group, {}).pop(place, None)
                return True
            found = json.loads(value)
            self._table.setdefault(group, {})[place] = (int(found["offset"]),
                                                       found.get("metadata"))
            return True
        except (AttributeError, ValueError, KeyError, TypeError):
            return False

    def _carry_over(self) -> None:
        keys, values = [], []
        with self.log.reader(OLD_OFFSETS_STREAM, 0) as reader:
            for record in reader.records():
                if record.key is not None and self._apply(record.key, record.value):
                    keys.append(record.key)
                    values.append(record.value)
        self.log.append_internal_sync(OFFSETS_STREAM, [*values, b""],
                                      keys=[*keys, CARRIED_OVER])
        _LOG.info("kafka_offsets_carried_over", extra={"fields": {
            "from": OLD_OFFSETS_STREAM, "to": OFFSETS_STREAM, "records": len(keys)}})

    # -- changes ---------------------------------------------------------------------

    def commit(self, group: str, commits, partition_count) -> dict[Key, ErrorCode]:
        """Append (topic, partition, offset, metadata) commits durably, then remember
        them; `partition_count(topic)` is None for an unknown topic. Returns
        {(topic, partition): ErrorCode}."""
        codes, kept = self.commit_in_txn(group, commits, partition_count, 0)
        self.remember(group, kept)
        return codes

    def commit_in_txn(self, group: str, commits, partition_count, txn_id: int):
        """Append commits under the log transaction `txn_id` (0: none): they count once
        it commits (remember them then). Returns ({(topic, partition): ErrorCode}, the
        commits appended)."""
        codes, keys, values, kept = {}, [], [], []
        for topic, partition, offset, metadata in commits:
            count = partition_count(topic)
            if count is None or not 0 <= partition < count:
                codes[(topic, partition)] = ErrorCode.unknown_topic_or_partition
                continue
            if metadata is not None and len(metadata) > METADATA_BYTES_MAX:
                codes[(topic, partition)] = ErrorCode.offset_metadata_too_large
                continue
            keys.append(_key(group, topic, partition))
            values.append(json.dumps({"offset": offset, "metadata": metadata}).encode())
            kept.append((topic, partition, offset, metadata))
            codes[(topic, partition)] = ErrorCode.none
        if kept:
            self.log.append_internal_sync(OFFSETS_STREAM, values, keys=keys, txn_id=txn_id)
        return codes, kept

    def remember(self, group: str, kept) -> None:
        """Take in commits that are durable and visible."""
        if not kept:
            return
        with self._lock:
            stored = self._table.setdefault(group, {})
            for topic, partition, offset, metadata in kept:
                stored[(topic, partition)] = (offset, metadata)

    def delete(self, group: str, places: list[Key] | None = None) -> int:
        """Forget the group's offsets of `places` (None: all of them), durably.
        Returns how many were forgotten."""
        with self._lock:
            stored = self._table.get(group, {})
            gone = [p for p in (list(stored) if places is None else places) if p in stored]
        if gone:
            self.log.append_internal_sync(OFFSETS_STREAM, [None] * len(gone),
                                          keys=[_key(group, *place) for place in gone])
            with self._lock:
                for place in gone:
                    stored.pop(place, None)
                if not stored:
                    self._table.pop(group, None)
        return len(gone)

    # -- reads -----------------------------------------------------------------------

    def of(self, group: str) -> dict[Key, tuple[int, str | None]]:
        with self._lock:
            return dict(self._table.get(group, {}))

    def groups(self) -> list[str]:
        with self._lock:
            return sorted(group for group, stored in self._table.items() if stored)


def _key(group: str, topic: str, partition: int) -> bytes:
    return f"{group}\0{topic}\0{partition}".encode()
