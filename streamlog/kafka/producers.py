"""Idempotent producers' sequence rules, as Kafka's broker applies them. Pure: no I/O.

Strategy: in each partition, a producer id has an entry: the epoch it last wrote with
and what its last five batches were (first and last sequence number, base offset),
oldest first. Five because a Kafka producer has at most five requests in flight per
partition, so a retry is always of one of them. Three functions cover everything:

  - `decide(entry, batch)` is the verdict on a batch a client sent: APPEND it, answer it
    as a DUPLICATE of a batch already appended (Kafka answers success with the base
    offset the batch got the first time, and appends nothing), or refuse it, with
    OUT_OF_ORDER_SEQUENCE_NUMBER (a gap, or a retry older than the last five) or
    INVALID_PRODUCER_EPOCH (a producer fenced by a later epoch of the same id).
  - `appended(entry, batch, base_offset)` is the entry once an APPEND is durable.
  - `replayed(entry, batch, base_offset)` is the entry after a stamped batch read back
    from the partition (a rebuild, producer_state.py): what the partition holds was
    appended, so there is no verdict, only the rule of which batches are remembered.

The rules (Kafka's ProducerStateManager and ProducerAppendInfo, for producers without a
transactional id), in the order they are applied:

  1. No entry: the producer has written nothing here that the partition still holds
     (new, or its batches were removed by retention). Any sequence is taken.
  2. An epoch below the entry's: INVALID_PRODUCER_EPOCH.
  3. The same epoch and exactly the first and last sequence of a remembered batch:
     DUPLICATE, answered with that batch's base offset.
  4. A later epoch: the producer starts over, so its first sequence must be 0, else
     OUT_OF_ORDER_SEQUENCE_NUMBER.
  5. The same epoch: the first sequence must follow the last one remembered (after
     2**31 - 1 comes 0), else OUT_OF_ORDER_SEQUENCE_NUMBER.

`trimmed(entries, limit)` keeps a partition's table bounded (the producers whose last
batch is the oldest go first, as Kafka's producer expiry would take them), and the
snapshot codec (`encode_snapshot`, `decode_snapshot`) writes a table as JSON with the
point of the partition it describes.
"""

from __future__ import annotations

import dataclasses
import enum
import json

from ..frame import SEQUENCE_MAX

BATCHES_KEPT = 5  # Kafka's max.in.flight.requests.per.connection bound for idempotence
PRODUCERS_MAX = 4096  # per partition; beyond it the least recently active are dropped
SNAPSHOT_FORMAT = 1


class SequenceVerdict(enum.Enum):
    """What `decide` makes of a batch's producer epoch and sequence numbers."""

    APPEND = "append"
    DUPLICATE = "duplicate"
    OUT_OF_ORDER = "out_of_order"
    FENCED = "fenced"


@dataclasses.dataclass(frozen=True, slots=True)
class BatchMeta:
    """A batch a producer appended: its sequence numbers and where it landed."""

    first_sequence: int
    last_sequence: int
    base_offset: int


@dataclasses.dataclass(frozen=True, slots=True)
class ProducerEntry:
    """One producer in one partition: its epoch and its last batches, oldest first
    (never empty, at most BATCHES_KEPT)."""

    epoch: int
    batches: tuple[BatchMeta, ...]

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence

    @property
    def last_offset(self) -> int:
        return self.batches[-1].base_offset


@dataclasses.dataclass(frozen=True, slots=True)
class Batch:
    """What a rule needs of a batch: who sent it and which sequence numbers it holds."""

    epoch: int
    first_sequence: int
    record_count: int

    @property
    def last_sequence(self) -> int:
        return (self.first_sequence + self.record_count - 1) % (SEQUENCE_MAX + 1)


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    verdict: SequenceVerdict
    base_offset: int = -1  # DUPLICATE: the offset the batch got the first time
    reason: str = ""  # OUT_OF_ORDER and FENCED: a sentence for the log


def decide(entry: ProducerEntry | None, batch: Batch) -> Decision:
    """The verdict on `batch`, sent by the producer whose entry in the partition is
    `entry` (None: it has none). See the module docstring for the rules."""
    _check(batch)
    if entry is None:
        return Decision(SequenceVerdict.APPEND)
    assert entry.batches
    if batch.epoch < entry.epoch:
        return Decision(SequenceVerdict.FENCED, reason=(
            f"epoch {batch.epoch} is older than the producer's epoch {entry.epoch}"))
    if batch.epoch == entry.epoch:
        for seen in entry.batches:
            if (seen.first_sequence, seen.last_sequence) == (batch.first_sequence,
                                                              batch.last_sequence):
                return Decision(SequenceVerdict.DUPLICATE, base_offset=seen.base_offset)
        expected = _next_sequence(entry.last_sequence)
        if batch.first_sequence != expected:
            return Decision(SequenceVerdict.OUT_OF_ORDER, reason=(
                f"sequence {batch.first_sequence}, expected {expected}"))
        return Decision(SequenceVerdict.APPEND)
    if batch.first_sequence != 0:
        return Decision(SequenceVerdict.OUT_OF_ORDER, reason=(
            f"sequence {batch.first_sequence} starts the new epoch {batch.epoch}, "
            f"expected 0"))
    return Decision(SequenceVerdict.APPEND)


def appended(entry: ProducerEntry | None, batch: Batch, base_offset: int) -> ProducerEntry:
    """The entry once `batch` (which `decide` let through) is appended at
    `base_offset`."""
    _check(batch)
    assert base_offset >= 0
    meta = BatchMeta(batch.first_sequence, batch.last_sequence, base_offset)
    if entry is None or batch.epoch > entry.epoch:
        return ProducerEntry(batch.epoch, (meta,))
    assert batch.epoch == entry.epoch, "a fenced batch is never appended"
    return ProducerEntry(entry.epoch, (entry.batches + (meta,))[-BATCHES_KEPT:])


def replayed(entry: ProducerEntry | None, batch: Batch, base_offset: int) -> ProducerEntry:
    """The entry after a batch read back from the partition, in offset order. A batch
    of an older epoch than the entry's cannot be there after a later one (the broker
    refuses it); should one be, the later epoch stands."""
    if entry is not None and batch.epoch < entry.epoch:
        return entry
    return appended(entry, batch, base_offset)


def trimmed(entries: dict[int, ProducerEntry], limit: int = PRODUCERS_MAX
            ) -> dict[int, ProducerEntry]:
    """`entries` ({producer id: entry}) without the producers whose last batch is the
    oldest, so that at most `limit` are left."""
    assert limit >= 1
    if len(entries) <= limit:
        return entries
    kept = sorted(entries.items(), key=lambda item: item[1].last_offset)[-limit:]
    return dict(kept)


def _next_sequence(sequence: int) -> int:
    return 0 if sequence == SEQUENCE_MAX else sequence + 1


def _check(batch: Batch) -> None:
    assert 0 <= batch.epoch <= 0x7FFF
    assert 0 <= batch.first_sequence <= SEQUENCE_MAX
    assert batch.record_count >= 1


# -- snapshots ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class Anchor:
    """The last record before a snapshot's offset, to check the snapshot against the
    partition: its offset, its batch's base offset, its timestamp, a digest of its key
    and value, and its batch's stamp as (producer id, epoch, base sequence) or None."""

    offset: int
    base_offset: int
    timestamp_us: int
    digest: int
    stamp: tuple[int, int, int] | None


@dataclasses.dataclass(frozen=True, slots=True)
class Snapshot:
    """A partition's producers as of `offset` (the end of the partition when it was
    taken): every stamped batch below it is in `entries`, none at or after it."""

    stream: str
    partition: int
    offset: int
    anchor: Anchor | None  # None: the partition held nothing before `offset`
    entries: dict[int, ProducerEntry]


def encode_snapshot(snapshot: Snapshot) -> bytes:
    assert snapshot.offset >= 0
    assert (snapshot.anchor is None) == (snapshot.offset == 0)
    anchor = None if snapshot.anchor is None else dataclasses.asdict(snapshot.anchor)
    producers = {str(producer_id): {"epoch": entry.epoch, "batches": [
        [b.first_sequence, b.last_sequence, b.base_offset] for b in entry.batches]}
        for producer_id, entry in snapshot.entries.items()}
    return json.dumps({"format": SNAPSHOT_FORMAT, "stream": snapshot.stream,
                       "partition": snapshot.partition, "offset": snapshot.offset,
                       "anchor": anchor, "producers": producers},
                      separators=(",", ":")).encode()


def decode_snapshot(data: bytes) -> Snapshot:
    """The snapshot in `data`. Raises ValueError for anything encode_snapshot does not
    write (a damaged file is then not used: the partition is read instead)."""
    try:
        found = json.loads(data)
        if found["format"] != SNAPSHOT_FORMAT:
            raise ValueError(f"unknown snapshot format {found['format']!r}")
        anchor = found["anchor"]
        if anchor is not None:
            stamp = anchor["stamp"]
            anchor = Anchor(int(anchor["offset"]), int(anchor["base_offset"]),
                            int(anchor["timestamp_us"]), int(anchor["digest"]),
                            None if stamp is None else tuple(int(v) for v in stamp))
        entries = {}
        for producer_id, entry in found["producers"].items():
            batches = tuple(BatchMeta(int(first), int(last), int(base))
                            for first, last, base in entry["batches"])
            entries[int(producer_id)] = ProducerEntry(int(entry["epoch"]), batches)
        snapshot = Snapshot(str(found["stream"]), int(found["partition"]),
                            int(found["offset"]), anchor, entries)
    except (KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"not a producer snapshot: {error!r}") from None
    _check_snapshot(snapshot)
    return snapshot


def _check_snapshot(snapshot: Snapshot) -> None:
    """Raise ValueError for values no writer writes (bytes from disk: raise, not
    assert)."""
    if snapshot.offset < 0 or (snapshot.anchor is None) != (snapshot.offset == 0):
        raise ValueError("snapshot offset and anchor disagree")
    anchor = snapshot.anchor
    if anchor is not None and not (
            anchor.base_offset <= anchor.offset == snapshot.offset - 1
            and (anchor.stamp is None or len(anchor.stamp) == 3)):
        raise ValueError("snapshot anchor is not the record before its offset")
    for producer_id, entry in snapshot.entries.items():
        if producer_id < 0 or not 0 <= entry.epoch <= 0x7FFF or not (
                1 <= len(entry.batches) <= BATCHES_KEPT):
            raise ValueError(f"impossible snapshot entry for producer {producer_id}")
        for meta in entry.batches:
            if not (0 <= meta.first_sequence <= SEQUENCE_MAX
                    and 0 <= meta.last_sequence <= SEQUENCE_MAX
                    and 0 <= meta.base_offset < snapshot.offset):
                raise ValueError(f"impossible batch in the snapshot for producer "
                                 f"{producer_id}")
