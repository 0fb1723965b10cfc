"""Operator checkpoints in an object store (DESIGN 7 and 11): the CheckpointStore's
interface over S3 (or any `remote.store.ObjectStore`), so that an operator whose machine
is gone recovers on another machine from the store alone.

Strategy: one immutable object per checkpoint, in the folder `checkpoints/` under the
store's prefix, named by its sequence id in 20 digits (`checkpoints/00000000000000000042`)
so that a listing, sorted by key, is sorted by id: `latest` and `next_sequence_id` are
found by listing. An object is written once, with `if_absent` (S3's If-None-Match: *),
so two writers can never both write one id; and each put first lists the folder and
refuses an id that is not above every id there, so ids only increase in the store. The
object is the checkpoint's stored form (checkpoint_value.py: offsets, state, an xxh3
checksum over both) behind a small header naming its sequence id, so a damaged object
and an object under another id's key are both refused (`CorruptObject`, naming the key)
instead of loaded. The folder may share its prefix with the operator's output log (the
log's objects are under `manifest/`, `segments/` and `tail/`).

What the LMDB store (checkpoint_store.py) guarantees, and how each holds here:

    LMDB store                           object store
    put returns after an fsync'd commit  a PUT is answered once the store has the object
    a commit is atomic                   an object is written whole, in one PUT, or not
    puts in id order (one worker)        the same worker; each put returns before the
                                         next starts, so no id appears before a lower one
    keeps the newest `keep`, deleting    deletes all but the newest `keep` listed ids
    the rest in the same transaction     right after the put; a crash in between leaves
                                         a few older objects, which the next put deletes
                                         (a checkpoint goes only once a newer one is
                                         durable, as in LMDB)
    a damaged entry: get() raises        get() raises CorruptObject naming the key
    CorruptionError, latest() logs it    latest() logs it and passes over it, so
    and passes over it                   recovery falls back to the previous good one;
                                         an object listed but gone when read (deleted
                                         behind our back) is passed over the same way

Store errors: a store given as an `s3://` URL is wrapped in `Retrying` (as open_log
does), so StoreUnavailable is retried with backoff and a put whose response was lost
stays idempotent (it reads its own bytes back); what still fails is raised, and the
Checkpointer makes a failed put sticky (checkpoint.py). A store object passed in is used
as it is (wrap it in Retrying yourself). Pruning is not part of a put's outcome: a
delete that fails is logged and tried again after the next put.

Thread-safety: puts are serialised by a lock (the checkpointer's worker thread writes);
reads may come from any thread (object stores are thread-safe).
"""

from __future__ import annotations

import logging
import re
import struct
import threading
from typing import Callable

from ..errors import (CorruptionError, CorruptObject, InvalidArgument, ObjectNotFound,
                      PreconditionFailed, StoreError)
from .checkpoint_store import STORE_KEEP_MAX
from .checkpoint_value import Checkpoint

log = logging.getLogger("streamlog.checkpoint")

FOLDER = "checkpoints"
_ID_DIGITS = 20  # 2**64 - 1 has 20 digits: every sequence id fits, byte order = numeric
_NAME = re.compile(r"[0-9]{%d}\Z" % _ID_DIGITS)
# Object header: magic, format version, the sequence id its key names (big-endian).
_HEADER = struct.Struct(">4sHQ")
_MAGIC = b"SLCO"
_VERSION = 1
assert _HEADER.size == 14


class ObjectCheckpointStore:
    """Checkpoints as immutable objects in an object store (module docstring); the same
    interface as CheckpointStore, so OperatorRuntime(store=...) takes either.

    Args:
        remote: an `s3://BUCKET/PREFIX` URL (endpoint and credentials from the AWS_*
            variables or `storage_options`, as open_log's `remote=`), or an object
            store (streamlog.remote.store.ObjectStore; tests:
            streamlog.testing.memstore.MemoryStore). The checkpoints are the objects
            under PREFIX/checkpoints/.
        storage_options: options of the S3 client; only with a URL.
        keep: how many checkpoints are kept (the newest), 1..STORE_KEEP_MAX.

    Raises:
        InvalidArgument for a bad URL, store or option. No request is made here.
    """

    def __init__(self, remote, *, storage_options=None, keep: int = 3) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or not 1 <= keep <= STORE_KEEP_MAX:
            raise InvalidArgument(f"keep must be an int in 1..{STORE_KEEP_MAX} (got {keep!r})")
        self.store = _store_of(remote, storage_options)
        self.url = f"{self.store.url}/{FOLDER}"
        self.path = self.url  # where the checkpoints are, as CheckpointStore.path says
        self.keep = keep
        self._lock = threading.Lock()
        self._last_put = 0  # the newest id this store wrote: puts must go above it

    # -- writing ----------------------------------------------------------------------

    def put(self, ckpt: Checkpoint) -> None:
        """Store `ckpt` durably (returns once the store has the object) and delete all
        but the newest `keep` checkpoints. Sequence ids must increase.

        Raises:
            PreconditionFailed: the store holds this id or a newer one already: another
                writer (two operators on one checkpoint store); naming the key.
            StoreError: the store failed the request (StoreUnavailable when it could not
                answer, after the retries of a URL's store).
        """
        key = object_key(ckpt.sequence_id)
        data = encode_object(ckpt)
        with self._lock:
            assert ckpt.sequence_id > self._last_put, "checkpoint sequence ids must increase"
            ids = self.sequence_ids()
            if ids and ids[-1] >= ckpt.sequence_id:
                raise PreconditionFailed(
                    f"checkpoint {ckpt.sequence_id} ({key} in {self.store.url}): the store "
                    f"holds checkpoint {ids[-1]} already; ids only increase, so another "
                    f"writer is using this checkpoint store", key=key)
            try:
                self.store.put(key, data, if_absent=True)
            except PreconditionFailed as error:
                raise PreconditionFailed(
                    f"checkpoint {ckpt.sequence_id} ({key} in {self.store.url}) was written "
                    f"by another writer first: {error}", key=key) from error
            self._last_put = ckpt.sequence_id
            self._prune([*ids, ckpt.sequence_id])

    def _prune(self, ids: list[int]) -> None:
        """Delete all but the newest `keep` of `ids` (sorted); failures are logged, and
        the next put's listing finds what is left."""
        assert ids == sorted(ids)
        for sequence_id in ids[:-self.keep]:
            key = object_key(sequence_id)
            try:
                self.store.delete(key)
            except StoreError as error:
                log.warning("could not delete old checkpoint %s in %s (tried again after "
                            "the next checkpoint): %s", key, self.store.url, error)
                return

    # -- reading ----------------------------------------------------------------------

    def sequence_ids(self) -> list[int]:
        """The ids of the checkpoint objects in the store, sorted (one listing)."""
        ids = []
        for meta in self.store.list(FOLDER):
            name = meta.key[len(FOLDER) + 1:]
            if meta.key.startswith(FOLDER + "/") and _NAME.match(name):
                ids.append(int(name))
            else:
                log.warning("ignoring %s in %s: not a checkpoint object's name", meta.key,
                            self.store.url)
        assert ids == sorted(ids), "a listing is sorted by key, and keys are fixed-width"
        return ids

    def get(self, sequence_id: int) -> Checkpoint | None:
        """The checkpoint `sequence_id`, or None when the store has no such object.

        Raises:
            CorruptObject: the object is not a checkpoint this code wrote under this key
                (damaged, or another id's), naming the key.
            StoreError: the store failed the request.
        """
        key = object_key(sequence_id)
        try:
            data = self.store.get(key)
        except ObjectNotFound:
            return None
        return decode_object(sequence_id, data, key=key)

    def latest(self, usable: Callable[[Checkpoint], bool] | None = None) -> Checkpoint | None:
        """The newest checkpoint for which `usable(ckpt)` holds (all when None). A damaged
        object, or one listed but gone when read, is logged with its key and passed
        over, so recovery falls back to an older checkpoint."""
        for sequence_id in reversed(self.sequence_ids()):
            try:
                ckpt = self.get(sequence_id)
            except CorruptionError as error:
                log.warning("skipping damaged checkpoint in %s: %s", self.store.url, error)
                continue
            if ckpt is None:
                log.warning("skipping checkpoint %s in %s: listed, but gone when read",
                            object_key(sequence_id), self.store.url)
                continue
            if usable is None or usable(ckpt):
                return ckpt
        return None

    def next_sequence_id(self) -> int:
        ids = self.sequence_ids()
        return max(ids[-1] if ids else 0, self._last_put) + 1

    def close(self) -> None:
        """Nothing to release (the store's client closes with it); for `with`."""

    def __enter__(self) -> "ObjectCheckpointStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -- the objects, pure -------------------------------------------------------------------

def object_key(sequence_id: int) -> str:
    """The key of checkpoint `sequence_id`, relative to the store's prefix."""
    assert 0 < sequence_id < 10 ** _ID_DIGITS, sequence_id
    return f"{FOLDER}/{sequence_id:0{_ID_DIGITS}d}"


def encode_object(ckpt: Checkpoint) -> bytes:
    """The object's bytes: the header naming the id, then the checkpoint's stored form."""
    return _HEADER.pack(_MAGIC, _VERSION, ckpt.sequence_id) + ckpt.encode()


def decode_object(sequence_id: int, data: bytes, *, key: str) -> Checkpoint:
    """Raises CorruptObject (naming `key`) for bytes that are not checkpoint
    `sequence_id` as encode_object wrote it."""
    if len(data) < _HEADER.size:
        raise CorruptObject(key, 0, f"checkpoint {sequence_id}: {len(data)} bytes, shorter "
                                    f"than its header")
    magic, version, stored_id = _HEADER.unpack_from(data, 0)
    if magic != _MAGIC or version != _VERSION:
        raise CorruptObject(key, 0, f"checkpoint {sequence_id}: bad magic or version")
    if stored_id != sequence_id:
        raise CorruptObject(key, 6, f"the object holds checkpoint {stored_id}, not "
                                    f"{sequence_id} as its key says")
    try:
        return Checkpoint.decode(sequence_id, data[_HEADER.size:])
    except CorruptionError as error:
        raise CorruptObject(key, _HEADER.size, str(error)) from None


def _store_of(remote, storage_options):
    """The object store `remote` names (connect.open_store: an s3:// URL behind
    retries, or a store given)."""
    from ..connect import open_store
    return open_store(remote, storage_options)