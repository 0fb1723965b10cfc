"""The durable checkpoint store (DESIGN 7): checkpoints as key-value pairs in an LMDB
environment of their own.

Strategy: key = sequence id (8 bytes, big-endian, so byte order is numeric order), value
= the checkpoint's stored form (checkpoint_value.py: offsets, state and an xxh3
checksum). The environment is opened with `sync=True, metasync=True`, so a put returns
only once its transaction is on stable storage, and a crash leaves either the whole
checkpoint or none of it (LMDB commits are atomic). LMDB rather than a streamlog stream
because a checkpoint is read by key ("the latest complete one", "the newest one that the
output still covers"), old ones are deleted, and the log's writer lock would tie the
store to the output log's process (checkpoint_objects.py keeps them in an object store
instead, with the same interface). A damaged entry is reported (`CorruptionError`)
instead of loaded, and `latest` passes over it. The store keeps the newest `keep`
checkpoints and deletes older ones in the same transaction.

Thread-safety: puts are serialised by a lock (the checkpointer's worker thread writes);
reads may come from any thread.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
from typing import Callable

import lmdb

from ..errors import CorruptionError, InvalidArgument, StreamLogError
from .checkpoint_value import Checkpoint

log = logging.getLogger("streamlog.checkpoint")

_KEY = struct.Struct(">Q")
# Bound: how many checkpoints a store keeps (and a scan visits), at most.
STORE_KEEP_MAX = 1024


class CheckpointStore:
    """Checkpoints as key-value pairs in an LMDB environment at directory `path`."""

    def __init__(self, path, *, keep: int = 3, map_bytes: int = 1 << 30,
                 readonly: bool = False) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or not 1 <= keep <= STORE_KEEP_MAX:
            raise InvalidArgument(f"keep must be an int in 1..{STORE_KEEP_MAX} (got {keep!r})")
        self.path = os.fspath(path)
        if isinstance(self.path, str) and self.path.startswith(("s3://", "memory://")):
            raise InvalidArgument(f"{self.path!r} is an object store URL, not a directory: "
                                  f"keep checkpoints there with ObjectCheckpointStore")
        self.keep = keep
        if not readonly:
            os.makedirs(self.path, exist_ok=True)
        try:
            self._env = lmdb.open(self.path, map_size=map_bytes, max_dbs=1, subdir=True,
                                  readonly=readonly, lock=not readonly, sync=True,
                                  metasync=True, readahead=False, create=not readonly)
            self._db = self._env.open_db(b"checkpoints", create=not readonly)
        except lmdb.Error as error:
            raise StreamLogError(f"cannot open checkpoint store {self.path}: {error}") from None
        self._lock = threading.Lock()

    def put(self, ckpt: Checkpoint) -> None:
        """Store `ckpt` durably (returns after the commit is fsynced) and delete all but
        the newest `keep` checkpoints. Sequence ids must increase."""
        value = ckpt.encode()
        with self._lock, self._env.begin(write=True, db=self._db) as txn:
            cursor = txn.cursor()
            if cursor.last():
                newest = _KEY.unpack(cursor.key())[0]
                assert ckpt.sequence_id > newest, "checkpoint sequence ids must increase"
            txn.put(_KEY.pack(ckpt.sequence_id), value)
            keys = [key for key, _ in txn.cursor()]
            for key in keys[:-self.keep]:
                txn.delete(key)

    def sequence_ids(self) -> list[int]:
        with self._env.begin(db=self._db) as txn:
            return [_KEY.unpack(key)[0] for key, _ in txn.cursor()]

    def get(self, sequence_id: int) -> Checkpoint | None:
        with self._env.begin(db=self._db) as txn:
            value = txn.get(_KEY.pack(sequence_id))
        return None if value is None else Checkpoint.decode(sequence_id, value)

    def latest(self, usable: Callable[[Checkpoint], bool] | None = None) -> Checkpoint | None:
        """The newest checkpoint for which `usable(ckpt)` holds (all when None). A damaged
        entry is logged and passed over, so recovery falls back to an older one."""
        for sequence_id in reversed(self.sequence_ids()):
            try:
                ckpt = self.get(sequence_id)
            except CorruptionError as error:
                log.warning("skipping damaged checkpoint: %s", error)
                continue
            if ckpt is not None and (usable is None or usable(ckpt)):
                return ckpt
        return None

    def next_sequence_id(self) -> int:
        ids = self.sequence_ids()
        return ids[-1] + 1 if ids else 1

    def close(self) -> None:
        self._env.close()

    def __enter__(self) -> "CheckpointStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

