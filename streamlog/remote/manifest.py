"""The manifest: the remote truth of a log in an object store, in numbered generations.

Strategy (DESIGN 11): objects are immutable, written once. What a reader may see is
named by a manifest, and manifests are committed in generations: generation g is the
object `manifest/<g, 20 digits>`, created with a conditional create (If-None-Match),
so of two writers committing the same generation exactly one wins. Every manifest
carries the writer's `epoch`; a writable open takes the log over by committing the
next generation with an epoch above every earlier one (`take_over`: the newest open
wins at once, no lease expiry to wait for). A writer whose commit loses to a manifest
with a higher epoch has been fenced (`Fenced`) and stops writing; one that loses to a
lower or equal epoch lost a race with another opener and tries the next generation. So
two writers never interleave: each generation names its predecessor's objects plus
what one writer, the newest, added.

Format: one line `streamlog-manifest 2 <xxh3-64 of the body, hex> <body bytes>`, then
the body as JSON (sorted keys), then the generation's payload: under durability
"remote", the tail bytes its new TailPieces name (group_commit.py), so a group commit is
one PUT, the tail and the generation naming it created together. Its own pieces are
written with an empty key and a position in the payload; reading resolves them to the
generation's key and a position in the object. The payload is not covered by the
header's checksum: it is whole record frames, which every reader checks before it
delivers a record. A reader that wants only the manifest fetches the object's first
HEAD_BYTES (`fetch`), and the rest of the body when it is longer, never the payload.
A manifest that fails its check is damage, named by its key (CorruptObject); a
generation is never skipped over to an older one silently.

Deltas and snapshots: generation 0 is written whole; every later one is a Delta of its
predecessor (what it changes, partition by partition), so a commit costs what it
changes, never what the log holds. A chain of deltas starts from a whole manifest:
the writer stores one now and then off its commit path (`write_snapshot`, every
SNAPSHOT_EVERY generations: the tiering job's background thread), and its later deltas
start from the newest it has stored; a chain that reaches DELTA_CHAIN_MAX (snapshots
failing) is cut by writing a generation whole. Reading generation g (`read`) is its
object, the snapshot its chain starts from and the deltas between, fetched together.

The functions take an `ObjectStore` (store.py); the values are pure.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import operator
from typing import Any

import xxhash

from ..errors import CorruptObject, Fenced, ObjectNotFound, PreconditionFailed

MAGIC = b"streamlog-manifest"
VERSION = 2
HEAD_BYTES = 64 * 2**10  # what a read of a generation fetches first (`fetch`)
PREFIX = "manifest/"
SNAPSHOTS = "snapshot/"
TAKE_OVER_ATTEMPTS = 20  # commits lost to racing openers before take_over gives up
SNAPSHOT_EVERY = 64  # generations between the writer's snapshots
DELTA_CHAIN_MAX = 512  # a generation is written whole when its chain is this long
NEWER_BATCH = 16  # generations a poll that found some fetches at once


class CommittedBefore(PreconditionFailed):
    """A commit found its generation already committed by this same writer (its epoch
    and name): an earlier attempt whose answer was lost (the store failing mid-request)
    took effect, with what that attempt held. `manifest` is that generation, whole:
    the writer goes on from it."""

    def __init__(self, message: str, manifest: "Manifest") -> None:
        super().__init__(message, key=manifest.key)
        self.manifest = manifest


@dataclasses.dataclass(frozen=True)
class SegmentObject:
    """A sealed segment in the store: byte-identical to the local file, with its index
    object beside it."""

    base_offset: int
    end_offset: int  # exclusive: the offset after its last record
    key: str
    size: int
    checksum: str  # xxh3-128 of the object's bytes, hex
    index_key: str | None = None
    min_timestamp_us: int | None = None
    max_timestamp_us: int | None = None
    hwm_us: int | None = None  # the running max timestamp after its last record


@dataclasses.dataclass(frozen=True)
class TailPiece:
    """Durability "remote": bytes of a segment not yet in the store whole, in the
    payload of the generation that committed them (one object per group commit, pieces
    of every partition with new data). A partition's pieces for one segment start at
    its position 0 and follow each other without a gap, so together they are the
    segment's first bytes."""

    key: str  # the object holding the bytes: the committing generation's
    object_size: int  # that whole object's size
    at: int  # where the piece starts in the object
    size: int
    segment_base: int  # the local segment the bytes are from, and where in it
    position: int
    base_offset: int  # the first record's offset in the piece
    end_offset: int  # exclusive


@dataclasses.dataclass(frozen=True)
class PartitionManifest:
    """One partition as a generation names it."""

    start_offset: int = 0
    committed_end: int = 0  # exclusive, like end_offset: what the store holds
    start_hwm_us: int | None = None  # running max of the records retention removed
    segments: tuple[SegmentObject, ...] = ()
    # The writer's acknowledged end when it committed this generation (durability
    # "local": what a restore after losing the machine reports as lost, at least).
    local_end: int = 0
    tail: tuple[TailPiece, ...] = ()  # after the segment objects, in offset order

    @property
    def sealed_end(self) -> int:
        """The end of what the segment objects hold: with none, where the segment of
        the first tail piece starts (the start itself, but after delete_records,
        which may move the start inside that segment), else the start."""
        if self.segments:
            return self.segments[-1].end_offset
        return self.tail[0].segment_base if self.tail else self.start_offset


@dataclasses.dataclass(frozen=True)
class Manifest:
    generation: int
    epoch: int
    writer: str  # who committed it: host, process, open time (for people, not logic)
    streams: dict = dataclasses.field(default_factory=dict)  # name -> partition count
    partitions: dict = dataclasses.field(default_factory=dict)  # "s/0" -> PartitionManifest
    # Objects no longer named, with the time (us) after which they may be deleted: the
    # grace period outlives any reader pinned to an older generation.
    garbage: tuple[tuple[str, int], ...] = ()
    # The generation of the whole manifest object this generation's chain of deltas
    # starts from (itself when it was written whole; None: not committed). Not stored.
    based_on: int | None = dataclasses.field(default=None, compare=False)

    @property
    def key(self) -> str:
        return key_of(self.generation)

    def successor(self, **changes) -> "Manifest":
        """The next generation, with `changes`."""
        return dataclasses.replace(self, generation=self.generation + 1, **changes)


def key_of(generation: int) -> str:
    return f"{PREFIX}{generation:020d}"


def snapshot_key(generation: int) -> str:
    """Where the whole manifest of a generation stored as a delta is kept, once the
    writer has written it (`write_snapshot`), so chains of deltas can start there."""
    return f"{SNAPSHOTS}{generation:020d}"


def snapshot_generation_of(key: str) -> int | None:
    name = key[len(SNAPSHOTS):] if key.startswith(SNAPSHOTS) else ""
    return int(name) if len(name) == 20 and name.isdigit() else None


def generation_of(key: str) -> int | None:
    """The generation a key under PREFIX names, or None for any other object."""
    name = key[len(PREFIX):] if key.startswith(PREFIX) else ""
    return int(name) if len(name) == 20 and name.isdigit() else None


# -- encoding ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Delta:
    """A generation stored as what it changes in the one before (`prior`): per
    partition, the tail pieces it adds with the new committed and acknowledged ends
    (`tails`), or the partition's new entry whole when more changed (`replaced`: a
    segment named, retention, a cut); the streams and the garbage list when they
    changed; the partitions it removes. So a commit's PUT is as large as what it
    changes, whatever the log holds. `full` is the generation the chain starts from,
    whose whole manifest is its own object or its snapshot (`snapshot_key`)."""

    generation: int
    epoch: int
    writer: str
    prior: int
    full: int
    tails: dict  # name -> (new tail pieces, committed_end, local_end)
    replaced: dict = dataclasses.field(default_factory=dict)  # name -> PartitionManifest
    streams: dict | None = None
    garbage: tuple | None = None
    removed: tuple = ()


def _frame(body: dict, payload: bytes = b"") -> bytes:
    body = {**body, "payload": len(payload)}
    data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return b"%s %d %016x %d\n%s%s" % (MAGIC, VERSION, xxhash.xxh3_64_intdigest(data),
                                       len(data), data, payload)


def _piece_out(piece: TailPiece, own_key: str | None) -> list:
    """A piece as stored, a list of its fields in order: one in the generation's own
    payload without its key, at its place in the payload (where a proposed
    generation's pieces are: `commit`), else as it is."""
    own = piece.key == own_key
    return ["" if own else piece.key, 0 if own else piece.object_size, piece.at, piece.size,
            piece.segment_base, piece.position, piece.base_offset, piece.end_offset]


def _piece_in(found: list, own_key: str, payload_at: int, size: int) -> TailPiece:
    """A stored piece; one of the generation's own (no key) at its place in the
    object."""
    piece = TailPiece(*found)
    if not piece.key:
        piece = dataclasses.replace(piece, key=own_key, at=payload_at + piece.at,
                                    object_size=size)
    if not 0 <= piece.at <= piece.at + piece.size <= piece.object_size or (
            piece.base_offset >= piece.end_offset):
        raise ValueError(f"a tail piece of offsets {piece.base_offset}..{piece.end_offset}"
                         f" at {piece.at}+{piece.size} of the {piece.object_size} bytes of "
                         f"{piece.key}")
    return piece


def _part_out(part: PartitionManifest, own_key: str | None) -> dict:
    return {"start_offset": part.start_offset, "committed_end": part.committed_end,
            "start_hwm_us": part.start_hwm_us, "local_end": part.local_end,
            "segments": [_segment_out(segment) for segment in part.segments],
            "tail": [_piece_out(piece, own_key) for piece in part.tail]}


def _segment_out(segment: SegmentObject) -> dict:
    return {name: getattr(segment, name) for name in _SEGMENT_FIELDS}


_SEGMENT_FIELDS = tuple(field.name for field in dataclasses.fields(SegmentObject))


def _part_in(found: dict, piece) -> PartitionManifest:
    return PartitionManifest(
        int(found["start_offset"]), int(found["committed_end"]), found["start_hwm_us"],
        tuple(SegmentObject(**segment) for segment in found["segments"]),
        int(found["local_end"]), tuple(map(piece, found["tail"])))


def encode(manifest: Manifest, payload: bytes = b"", *, snapshot: bool = False) -> bytes:
    """The whole manifest's object, with `payload` (the bytes of its own pieces); or,
    `snapshot`, its snapshot's (no payload: its pieces are all in other objects)."""
    own = None if snapshot else manifest.key
    body = {"generation": manifest.generation, "epoch": manifest.epoch,
            "writer": manifest.writer, "streams": manifest.streams,
            "garbage": [list(item) for item in manifest.garbage],
            "partitions": {name: _part_out(part, own)
                           for name, part in manifest.partitions.items()}}
    return _frame(body, payload)


def encode_delta(manifest: Manifest, prior: Manifest, payload: bytes = b"") -> bytes | None:
    """`manifest` as a Delta of `prior` (its predecessor, whose chain starts from a
    whole manifest), or None when the chain is DELTA_CHAIN_MAX long already."""
    if (manifest.generation != prior.generation + 1 or prior.based_on is None
            or manifest.generation - prior.based_on >= DELTA_CHAIN_MAX):
        return None
    tails, replaced = {}, {}
    for name, part in manifest.partitions.items():
        old = prior.partitions.get(name)
        if part == old:
            continue
        if old is not None and (
                part.segments == old.segments and part.start_offset == old.start_offset
                and part.start_hwm_us == old.start_hwm_us and extends(part.tail, old.tail)):
            tails[name] = [[_piece_out(p, manifest.key) for p in part.tail[len(old.tail):]],
                           part.committed_end, part.local_end]
        else:
            replaced[name] = _part_out(part, manifest.key)
    delta = {"prior": prior.generation, "full": prior.based_on, "tails": tails,
             "replaced": replaced,
             "removed": sorted(set(prior.partitions) - set(manifest.partitions))}
    if manifest.streams != prior.streams:
        delta["streams"] = manifest.streams
    if manifest.garbage != prior.garbage:
        delta["garbage"] = [list(item) for item in manifest.garbage]
    return _frame({"generation": manifest.generation, "epoch": manifest.epoch,
                   "writer": manifest.writer, "delta": delta}, payload)


def _own_from(tail: tuple, own: str) -> int:
    """Where the pieces keyed by the generation itself (`own`) start in a tail: they
    are new ones, so the last of it."""
    n = len(tail)
    while n and tail[n - 1].key == own:
        n -= 1
    return n


def extends(tail: tuple, old: tuple) -> bool:
    """Does `tail` begin with `old`? (Pieces are shared when a tail only grew, so
    mostly by identity, at C speed.)"""
    return len(tail) >= len(old) and (all(map(operator.is_, tail, old))
                                      or tail[:len(old)] == old)


def _resolved(manifest: Manifest, payload_at: int, size: int) -> Manifest:
    """`manifest` (as proposed) with its own pieces at their place in its object, as a
    reader reads them back. Own pieces are new ones: the last of each tail."""
    own, partitions = manifest.key, None
    for name, part in manifest.partitions.items():
        start = _own_from(part.tail, own)
        if start == len(part.tail):
            continue
        tail = part.tail[:start] + tuple(
            dataclasses.replace(piece, at=payload_at + piece.at, object_size=size)
            for piece in part.tail[start:])
        partitions = partitions if partitions is not None else dict(manifest.partitions)
        partitions[name] = dataclasses.replace(part, tail=tail)
    if partitions is None:
        return manifest
    return dataclasses.replace(manifest, partitions=partitions)


def decode(data: bytes, key: str) -> Manifest:
    """The whole manifest in `data`, read from `key`. CorruptObject (naming the key)
    when it fails its checks, or is a Delta (read() resolves those)."""
    found = decode_object(data, key)
    if isinstance(found, Delta):
        raise CorruptObject(key, 0, "a delta generation, not a whole manifest")
    return found


def decode_object(data: bytes, key: str) -> Manifest | Delta:
    """The generation stored in `data` (read from `key`: the whole object, or at least
    its header and body): a whole Manifest or a Delta. CorruptObject (naming the key)
    when it fails its checks."""
    head, newline, rest = bytes(data).partition(b"\n")
    fields = head.split(b" ")
    if not newline or fields[0] != MAGIC or len(fields) < 2:
        raise CorruptObject(key, 0, "not a manifest (no header line)")
    if fields[1] != b"%d" % VERSION:
        raise CorruptObject(key, 0, f"manifest format {fields[1].decode(errors='replace')}"
                                    f", this version reads {VERSION}")
    try:
        if len(fields) != 4:
            raise ValueError
        expected, body_bytes = int(fields[2], 16), int(fields[3])
    except ValueError:
        raise CorruptObject(key, 0, "manifest header: not 'streamlog-manifest <format> "
                                    "<checksum, hex> <body bytes>'") from None
    at = len(head) + 1
    body = rest[:body_bytes]
    if len(body) != body_bytes:
        raise CorruptObject(key, at + len(body), f"manifest cut short: {len(body)} of "
                                                 f"{body_bytes} body bytes")
    if xxhash.xxh3_64_intdigest(body) != expected:
        raise CorruptObject(key, at, "manifest checksum mismatch")
    try:
        found = json.loads(body)
        payload = int(found["payload"])
        if payload < 0:
            raise ValueError(f"a payload of {payload} bytes")

        def piece(stored: dict) -> TailPiece:
            return _piece_in(stored, key, at + body_bytes, at + body_bytes + payload)

        if "delta" in found:
            delta = found["delta"]
            result = Delta(
                int(found["generation"]), int(found["epoch"]), str(found["writer"]),
                int(delta["prior"]), int(delta["full"]),
                {str(name): (tuple(map(piece, pieces)), int(committed_end), int(local_end))
                 for name, (pieces, committed_end, local_end) in delta["tails"].items()},
                {str(name): _part_in(part, piece)
                 for name, part in delta["replaced"].items()},
                ({str(k): int(v) for k, v in delta["streams"].items()}
                 if "streams" in delta else None),
                (tuple((str(k), int(after)) for k, after in delta["garbage"])
                 if "garbage" in delta else None),
                tuple(str(name) for name in delta["removed"]))
        else:
            result = dataclasses.replace(_manifest(found, piece),
                                         based_on=int(found["generation"]))
    except (ValueError, KeyError, TypeError) as error:
        raise CorruptObject(key, at, f"manifest body: {error}") from None
    if key not in (key_of(result.generation), snapshot_key(result.generation)) or (
            isinstance(result, Delta) and (result.prior != result.generation - 1
                                           or key != key_of(result.generation))):
        raise CorruptObject(key, at,
                            f"manifest of generation {result.generation} stored at {key}")
    return result


def fetch(store, generation: int) -> Manifest | Delta:
    """Generation `generation` as stored (a whole Manifest or a Delta), without its
    payload: the object's first HEAD_BYTES, and the rest of the body when it is longer.
    Raises ObjectNotFound, CorruptObject."""
    key = key_of(generation)
    data = store.get_range(key, 0, HEAD_BYTES)
    head, newline, _ = bytes(data[:256]).partition(b"\n")
    fields = head.split(b" ")
    if newline and len(fields) == 4 and fields[3].isdigit():
        wanted = len(head) + 1 + int(fields[3])
        if len(data) < wanted:
            data = bytes(data) + store.get_range(key, len(data), wanted)
    return decode_object(data, key)


def apply(prior: Manifest, delta: Delta) -> Manifest:
    """The generation `delta` makes of `prior` (its predecessor)."""
    if delta.prior != prior.generation:
        raise CorruptObject(key_of(delta.generation), 0, f"a delta of generation "
                            f"{delta.prior} applied to generation {prior.generation}")
    partitions = dict(prior.partitions)
    for name in delta.removed:
        partitions.pop(name, None)
    partitions.update(delta.replaced)
    for name, (pieces, committed_end, local_end) in delta.tails.items():
        part = partitions.get(name, PartitionManifest())
        partitions[name] = dataclasses.replace(part, tail=part.tail + pieces,
                                               committed_end=committed_end,
                                               local_end=local_end)
    return Manifest(delta.generation, delta.epoch, delta.writer,
                    prior.streams if delta.streams is None else delta.streams, partitions,
                    prior.garbage if delta.garbage is None else delta.garbage,
                    based_on=prior.based_on)


def _manifest(found: dict[str, Any], piece) -> Manifest:
    return Manifest(int(found["generation"]), int(found["epoch"]), str(found["writer"]),
                    {str(k): int(v) for k, v in found["streams"].items()},
                    {str(name): _part_in(part, piece)
                     for name, part in found["partitions"].items()},
                    tuple((str(key), int(after)) for key, after in found["garbage"]))


# -- reading and committing --------------------------------------------------------------

def latest(store) -> Manifest | None:
    """The newest committed generation (None: no log here yet)."""
    found = store.list(PREFIX.rstrip("/"))  # (a listing names whole folders)
    generations = sorted(g for g in (generation_of(meta.key) for meta in found)
                         if g is not None)
    if not generations:
        return None
    return read(store, generations[-1])


def read(store, generation: int) -> Manifest:
    """Generation `generation`, whole: its object, or the whole manifest its chain of
    deltas starts from (`whole`) and the deltas after it (fetched together)."""
    key = key_of(generation)
    found = fetch(store, generation)
    if isinstance(found, Manifest):
        return found
    if found.full >= generation:
        raise CorruptObject(key, 0, f"its chain starts from generation {found.full}")
    base = whole(store, found.full)
    wanted = range(found.full + 1, generation)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        deltas = list(pool.map(lambda g: fetch(store, g), wanted))
    current = base
    for delta in [*deltas, found]:
        current = apply(current, delta) if isinstance(delta, Delta) else delta
    return current


def whole(store, generation: int) -> Manifest:
    """The whole manifest of `generation`, which a chain of deltas starts from: its
    snapshot, or its own object when it was written whole. CorruptObject when the
    store has neither (a committed generation's chain names it)."""
    key = snapshot_key(generation)
    try:
        found = decode_object(store.get(key), key)
    except ObjectNotFound:
        found = fetch(store, generation)
        key = key_of(generation)
    if not isinstance(found, Manifest) or found.generation != generation:
        raise CorruptObject(key, 0, f"a chain of deltas starts from generation "
                            f"{generation}, whose whole manifest is not stored")
    return dataclasses.replace(found, based_on=generation)


def write_snapshot(store, manifest: Manifest) -> None:
    """Store `manifest` (a committed generation) whole as its snapshot: chains of
    deltas after it may start from it (the writer's next deltas say so once this has
    returned). The same generation always has the same snapshot, so a write whose
    answer was lost is simply written again."""
    store.put(snapshot_key(manifest.generation), encode(manifest, snapshot=True))


def newer(store, manifest: Manifest) -> Manifest:
    """The newest generation after `manifest` (itself when there is none): one GET of
    the next generation's key when nothing changed (no listing of every generation);
    when something did, the following ones are fetched NEWER_BATCH at a time."""
    current = manifest
    found = _get_generation(store, current.generation + 1)
    if found is None:
        return current
    current = _step(current, found)
    with concurrent.futures.ThreadPoolExecutor(NEWER_BATCH) as pool:
        while True:
            wanted = range(current.generation + 1, current.generation + 1 + NEWER_BATCH)
            for found in pool.map(lambda g: _get_generation(store, g), wanted):
                if found is None:
                    return current
                current = _step(current, found)


def _get_generation(store, generation: int) -> Manifest | Delta | None:
    try:
        return fetch(store, generation)
    except ObjectNotFound:
        return None


def _step(current: Manifest, found: Manifest | Delta) -> Manifest:
    return apply(current, found) if isinstance(found, Delta) else found


def commit(store, manifest: Manifest, prior: Manifest | None = None,
           payload: bytes = b"") -> Manifest:
    """Commit `manifest` as its generation: as a Delta of `prior` (its predecessor, as
    this writer committed or read it) when it can be one, else whole; its object
    carries `payload`, the bytes its pieces keyed by its own key name (each piece's `at`
    is where it starts in `payload`). Returns it as committed, as a reader reads it
    (its own pieces at their place in the object). Raises Fenced when a writer with a
    higher epoch committed that generation first; CommittedBefore when this writer
    did, in an attempt whose answer was lost (a request that failed may have taken
    effect); PreconditionFailed when another writer with the same or a lower epoch did
    (a race between openers: take_over tries the next generation)."""
    own = [piece for part in manifest.partitions.values()
           for piece in part.tail[_own_from(part.tail, manifest.key):]]
    if any(p.at + p.size > len(payload) for p in own) or (bool(own) != bool(payload)):
        raise ValueError(f"generation {manifest.generation}: its pieces do not match the "
                         f"{len(payload)} bytes of its payload")
    delta = encode_delta(manifest, prior, payload) if prior is not None else None
    data = delta or encode(manifest, payload)
    try:
        store.put(manifest.key, data, if_absent=True)
        committed = _resolved(manifest, len(data) - len(payload), len(data))
        return dataclasses.replace(committed, based_on=prior.based_on if delta else
                                   manifest.generation)
    except PreconditionFailed:
        winner = fetch(store, manifest.generation)
    if winner.epoch > manifest.epoch:
        raise Fenced(f"the log was taken over by a newer writer (epoch {winner.epoch}, "
                     f"{winner.writer}); this writer (epoch {manifest.epoch}) stops")
    if (winner.epoch, winner.writer) == (manifest.epoch, manifest.writer):
        raise CommittedBefore(f"generation {manifest.generation} holds an earlier "
                              f"attempt of this writer's, whose answer was lost",
                              read(store, manifest.generation))
    raise PreconditionFailed(f"generation {manifest.generation} was committed by epoch "
                             f"{winner.epoch} first")


def take_over(store, writer: str, *, attempts: int = TAKE_OVER_ATTEMPTS) -> Manifest:
    """Become the log's writer: commit the next generation with an epoch above every
    earlier one (the first generation, epoch 1, when the store has no log yet). The
    newest open wins: an older writer's next commit raises Fenced."""
    for _ in range(attempts):
        current = latest(store)
        if current is None:
            proposed = Manifest(generation=0, epoch=1, writer=writer)
        else:
            proposed = current.successor(epoch=current.epoch + 1, writer=writer)
        try:
            return commit(store, proposed)
        except (PreconditionFailed, Fenced):
            continue  # another opener committed that generation: go above it
    raise PreconditionFailed(f"could not take the log over: {attempts} generations in a "
                             f"row were committed by other openers first")
