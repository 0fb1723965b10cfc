"""The writer's snapshots of its manifest, off the commit path.

Strategy (manifest.py, deltas and snapshots): every generation after the first is a
delta; every SNAPSHOT_EVERY generations the writer stores the manifest whole on a
thread of its own (`due`), one at a time, and once one is stored its next deltas start
from it (`rebased`). A snapshot that fails is logged once per kind and tried again at
the next due generation; meanwhile the chain grows (to DELTA_CHAIN_MAX at most, where a
generation is written whole on the commit path instead).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging

from ..errors import StoreError
from . import manifest as manifests
from .manifest import Manifest

log = logging.getLogger("streamlog.remote")


class Snapshots:
    def __init__(self, store, stats: dict) -> None:
        self.store = store
        self.stats = stats  # the tiering job's: "puts" counts the snapshots too
        self.at = -1  # the newest generation whose snapshot is stored
        self._pool = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="streamlog-snapshot")
        self._future: concurrent.futures.Future | None = None
        self._error: type | None = None
        self._closed = False

    def rebased(self, manifest: Manifest) -> Manifest:
        """`manifest` with its chain starting from the newest snapshot stored (the next
        delta says so), once one is stored after where it starts now."""
        if manifest.based_on is not None and manifest.based_on < self.at <= (
                manifest.generation):
            return dataclasses.replace(manifest, based_on=self.at)
        return manifest

    def due(self, manifest: Manifest) -> None:
        """After a commit: store `manifest` whole when SNAPSHOT_EVERY generations have
        passed since its chain's start or the last snapshot (one still under way is
        let be)."""
        if (manifest.based_on is None or self._closed
                or manifest.generation - max(manifest.based_on, self.at)
                < manifests.SNAPSHOT_EVERY
                or (self._future is not None and not self._future.done())):
            return
        self._future = self._pool.submit(self._write, manifest)

    def close(self) -> None:
        """Wait for the snapshot under way; no more after it."""
        self._closed = True
        self._pool.shutdown(wait=True)

    def _write(self, manifest: Manifest) -> None:
        try:
            manifests.write_snapshot(self.store, manifest)
        except (StoreError, OSError) as error:  # (the chain grows; the next one retries)
            if type(error) is not self._error:
                log.warning("storing the snapshot of generation %d: %s",
                            manifest.generation, error)
                self._error = type(error)
            return
        self._error = None
        self.stats["puts"] += 1
        self.at = max(self.at, manifest.generation)
