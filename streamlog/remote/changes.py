"""The tiered writer's changes to what the store already holds: a partition's start
moved (retention, delete_records), a cut (truncate_after), a stream deleted. Part of
class Tiering (tiering.py).

Strategy (DESIGN 11: retention, truncate_after and holds work the same with a store,
each change a new manifest generation): each of these runs with no round under way
(the round lock) and commits a generation of its own, so the store's manifest agrees
with the local log as soon as the call returns; the objects the generation stops naming
go on its garbage list and are deleted after the grace period, so a reader pinned to an
older generation finishes.

A partition's start: the store's entry starts where the local partition starts
(`trimmed`): the segment objects wholly before it leave, and the tail pieces of the
segments wholly before it (a segment's pieces stay together, from its position 0, as
tail pieces must); its start and the running max before it are the local ones, inside
a segment too (delete_records). Every round trims too, so a partition first put in the
store, or one whose start moved while the store was down, never shows more than the
local log.

A deleted stream (`drop_stream`) leaves the manifest before its local folder goes: a
crash in between leaves the stream whole locally, and the next rounds put it back in
the store (not deleted: the call did not return). The generation that drops it also
moves this writer to a new epoch, so the objects of a stream created again under the
same name never take the keys of the deleted one's (they carry the epoch, and those
are on the garbage list until the grace period ends).
"""

from __future__ import annotations

import dataclasses

from ..errors import Fenced, PreconditionFailed, StoreUnavailable, UnknownStream
from . import manifest as manifests
from .manifest import Manifest, PartitionManifest


class ChangeOperations:
    # -- the start: retention and delete_records -----------------------------------------

    def retain(self, part) -> None:
        """After the partition's start moved (local retention, delete_records): the
        store's copy starts there too, in a new generation (`trimmed`)."""
        with self._round_lock:
            self._check_not_fenced()
            current = self._rebased()
            found = current.partitions.get(part.name)
            if found is None:
                return
            updated = trimmed(found, part.state)
            if updated is not found:
                self._commit_partition(current, part.name, updated)

    def _trim_all(self, proposed: Manifest, parts) -> tuple[Manifest, bool]:
        """A round's `proposed` with every partition's entry trimmed to its local start;
        (it, whether any changed)."""
        partitions, changed = dict(proposed.partitions), False
        for part in parts:
            found = partitions.get(part.name)
            if found is not None:
                updated = trimmed(found, part.state)
                if updated is not found:
                    partitions[part.name], changed = updated, True
        if not changed:
            return proposed, False
        return dataclasses.replace(proposed, partitions=partitions), True

    # -- truncate_after --------------------------------------------------------------------

    def truncate(self, part, truncate) -> int:
        """Run `truncate()` (the local truncate_after, returning the new end) with no
        round under way, then cut the store's copy at the new end in a new generation:
        segment objects and tail pieces past it leave (the cut segment goes up again
        once it seals, or as tail pieces under durability "remote"). Acks still held
        for records past it fail."""
        with self._round_lock, self._upload_lock:
            self._check_not_fenced()
            end = truncate()
            with self._ready_lock:  # segments put but not named that the cut changed
                self._ready[part.name] = [item for item in self._ready.get(part.name, [])
                                          if item[0].end_offset <= end]
            current = self._rebased()
            found = current.partitions.get(part.name)
            if self.gate is not None:
                self.gate.cut(part.name, end)
            if found is None or found.committed_end <= end:
                return end
            segments = tuple(s for s in found.segments if s.end_offset <= end)
            # where the pieces kept must start: after the last segment kept, else at
            # the start (or the start's own segment, when it begins inside one)
            sealed_end = segments[-1].end_offset if segments else min(
                found.start_offset, found.tail[0].segment_base if found.tail
                else found.start_offset)
            tail = []
            for piece in found.tail:  # pieces of the segments kept whole, up to the end
                if piece.end_offset > end or piece.segment_base < sealed_end:
                    break
                tail.append(piece)
            committed = tail[-1].end_offset if tail else max(sealed_end, found.start_offset)
            updated = dataclasses.replace(found, segments=segments, tail=tuple(tail),
                                          committed_end=committed,
                                          local_end=min(found.local_end, end))
            payload = b""
            if self.gate is not None and committed < end:
                # durability remote: what the cut kept of a segment the store had whole
                # goes up as tail pieces in the same generation, so the store never
                # lacks an acknowledged record below the cut
                with_tail, payload = self._add_tail(dataclasses.replace(
                    current, partitions={**current.partitions, part.name: updated}), [part])
                updated = with_tail.partitions[part.name]
                updated = dataclasses.replace(updated, local_end=updated.committed_end)
            self._commit_partition(current, part.name, updated, payload)
            return end

    # -- streams: deleted, and given more partitions -------------------------------------

    def drop_stream(self, stream: str, delete_here) -> None:
        """Delete `stream` here and in the store, with no round or upload under way:
        `delete_here(tell_store)` deletes it locally and calls `tell_store()` once
        nothing more is written to it and before its folder goes, which commits the
        generation without it (see the module docstring). Its acks still held fail,
        and its sealed segments put but not named become garbage. Raises Fenced, and
        the store's errors (then nothing is deleted)."""
        with self._round_lock, self._upload_lock:
            self._check_not_fenced()
            dropped = []

            def tell_store() -> None:
                self._drop(stream)
                dropped.append(stream)

            delete_here(tell_store)
            if self.gate is not None and dropped:
                self.gate.forget(stream, UnknownStream(
                    f"stream {stream!r} was deleted before the store took these records"))

    def let_go(self, part) -> None:
        """A partition of a deleted stream: this job holds nothing in it any more."""
        part.release(self._token)

    def _drop(self, stream: str) -> None:
        """Commit the generation without `stream` (a new epoch: see the module
        docstring)."""
        current = self._rebased()
        prefix = stream + "/"
        with self._ready_lock:
            unnamed = [item[0] for name in list(self._ready) if name.startswith(prefix)
                       for item in self._ready.pop(name)]
        proposed = self._with_garbage(current, dataclasses.replace(
            current, streams={name: count for name, count in current.streams.items()
                              if name != stream},
            partitions={name: part for name, part in current.partitions.items()
                        if not name.startswith(prefix)}))
        if unnamed:  # put, never named: garbage too
            after = self.clock.wall_us() + int(self.grace_s * 1e6)
            proposed = dataclasses.replace(proposed, garbage=(*proposed.garbage, *(
                (key, after) for segment in unnamed
                for key in (segment.key, segment.index_key) if key)))
        self._commit(current, proposed.successor(epoch=current.epoch + 1), new_epoch=True)

    # -- committing one change -----------------------------------------------------------

    def _commit_partition(self, current: Manifest, name: str,
                          updated: PartitionManifest, payload: bytes = b"") -> None:
        proposed = self._with_garbage(current, dataclasses.replace(
            current, partitions={**current.partitions, name: updated}))
        self._commit(current, proposed.successor(), payload)

    def _commit(self, current: Manifest, proposed: Manifest, payload: bytes = b"", *,
                new_epoch: bool = False) -> None:
        """Commit `proposed` (the generation after `current`; `new_epoch`: with this
        writer's epoch moved up). Raises Fenced (for good) when a newer writer
        committed first, StoreUnavailable when an earlier attempt of this change whose
        answer was lost landed (this one was not made)."""
        try:
            self.manifest = manifests.commit(self.store, proposed, current, payload)
        except manifests.CommittedBefore as landed:
            self._adopt(landed.manifest)
            raise StoreUnavailable(f"{landed}: this change was not made; try it again",
                                   key=landed.key) from None
        except (Fenced, PreconditionFailed) as error:
            if not (new_epoch or isinstance(error, Fenced)):
                raise
            # (moving to a new epoch, it loses to a newer writer that took that epoch
            # with PreconditionFailed: it is fenced all the same)
            fenced = error if isinstance(error, Fenced) else Fenced(
                f"the log was taken over by a newer writer: {error}")
            self.fenced = True
            if self.gate is not None:
                self.gate.fail(fenced)
            raise fenced from None
        self.snapshots.due(self.manifest)
        self.stats["commits"] += 1
        self.stats["puts"] += 1

    def _check_not_fenced(self) -> None:
        if self.fenced:
            raise Fenced("a newer writer took this log over in the store")


def trimmed(found: PartitionManifest, state) -> PartitionManifest:
    """The store's entry `found` of a partition, starting where the partition's
    published `state` (state.PartitionState) starts (see the module docstring); `found`
    itself when it starts there already, or later."""
    start, start_hwm_us = state.start_offset, state.start_hwm_us
    if start < found.start_offset or (start == found.start_offset and (
            start_hwm_us is None or start_hwm_us == found.start_hwm_us)):
        return found
    ends: dict[int, int] = {}  # a segment's pieces go together
    for piece in found.tail:
        ends[piece.segment_base] = max(ends.get(piece.segment_base, 0), piece.end_offset)
    return dataclasses.replace(
        found, start_offset=start, start_hwm_us=start_hwm_us,
        segments=tuple(s for s in found.segments if s.end_offset > start),
        tail=tuple(p for p in found.tail if ends[p.segment_base] > start))
