"""What a log in the store no longer names, and when it goes.

Strategy (DESIGN 11: objects are deleted after a grace period longer than any pinned
reader): a generation that stops naming objects its predecessor named (segment and
index objects that retention or a cut dropped, generations whose tail pieces went up
whole) lists them in its garbage with the time after which they may be deleted
(`with_garbage`); a later round deletes those whose time has come (`sweep`), but for a
generation the current chain of deltas still passes through, which waits for the next
snapshot. Old generations and snapshots are pruned as whole objects (`prune`), so the
listing that opens and take-overs do stays bounded. Pure functions over manifests, and
the store's deletes.
"""

from __future__ import annotations

import dataclasses

from . import manifest as manifests
from .manifest import Manifest


def with_garbage(current: Manifest, proposed: Manifest, *, after_us: int) -> Manifest:
    """`proposed` with the objects `current` named and it no longer does on its
    garbage list, deletable after `after_us`."""
    gone = dropped(current, proposed)
    if not gone:
        return proposed
    return dataclasses.replace(proposed, garbage=(
        *proposed.garbage, *((key, after_us) for key in sorted(gone))))


def sweep(store, proposed: Manifest, *, now_us: int) -> tuple[Manifest, int]:
    """Delete the garbage whose time has come: (`proposed` without it, how many). A
    generation the chain of deltas passes through is kept until the chain starts after
    it (the next snapshot)."""
    keep_from = proposed.based_on if proposed.based_on is not None else -1
    due = [key for key, after in proposed.garbage if after <= now_us and (
        manifests.generation_of(key) is None or manifests.generation_of(key) < keep_from)]
    if not due:
        return proposed, 0
    for key in due:
        store.delete(key)
    gone = set(due)
    return dataclasses.replace(proposed, garbage=tuple(
        item for item in proposed.garbage if item[0] not in gone)), len(due)


def prune(store, manifest: Manifest, *, before_us: int, most: int) -> int:
    """Delete up to `most` manifest generations and snapshots last modified before
    `before_us`, from before the one `manifest`'s chain starts from, but for the
    generations whose payload a tail piece still names. Returns how many."""
    keep_from = manifest.based_on or manifest.generation
    keep, old = named(manifest), []
    for folder, generation_of in ((manifests.PREFIX, manifests.generation_of),
                                  (manifests.SNAPSHOTS, manifests.snapshot_generation_of)):
        for meta in store.list(folder.rstrip("/")):
            generation = generation_of(meta.key)
            if generation is not None and generation < keep_from and (
                    meta.last_modified_us < before_us) and meta.key not in keep:
                old.append(meta.key)
    for key in old[:most]:
        store.delete(key)
    return len(old[:most])


def dropped(current: Manifest, proposed: Manifest) -> set[str]:
    """The object keys `current` names and `proposed` does not: none from a partition
    whose segments are the same and whose tail only grew (a tail round's), so a round
    costs what it changes, not what the manifest names."""
    changed = []
    for name, part in current.partitions.items():
        new = proposed.partitions.get(name)
        if new is part or (new is not None and new.segments is part.segments
                           and manifests.extends(new.tail, part.tail)):
            continue
        changed.append(part)
    if not changed:
        return set()
    return _keys(changed) - named(proposed)  # (a generation holds many's pieces)


def named(manifest: Manifest) -> set[str]:
    """Every object key a generation names."""
    return _keys(manifest.partitions.values())


def _keys(parts) -> set[str]:
    keys = set()
    for part in parts:
        for segment in part.segments:
            keys.add(segment.key)
            if segment.index_key:
                keys.add(segment.index_key)
        keys.update(piece.key for piece in part.tail)
    return keys
