"""One segment file: frames back to back, named by the base offset of its first record.

Strategy: a thin object over a FileIO handle that knows its size. Only the partition's
writer thread appends, truncates or fsyncs; readers call `read` from any thread
(pread needs no shared file position). This class is not otherwise thread-safe.
"""

from __future__ import annotations

import os

from .clock import SYSTEM_CLOCK
from .fileio import FileIO
from .layout import segment_name
from .seal import SegmentDigest, hash_file, remove_seal, seal_path, write_seal


class Segment:
    def __init__(self, fileio: FileIO, directory: str, base_offset: int, *,
                 writable: bool, create: bool = False, clock=SYSTEM_CLOCK) -> None:
        self.fileio = fileio
        self.base_offset = base_offset
        self.path = os.path.join(directory, segment_name(base_offset))
        self.writable = writable
        self.handle = fileio.open(self.path, writable=writable, create=create)
        self.size_bytes = fileio.size(self.handle)
        # Age for rolling counts from creation, or from the open for a reopened segment.
        self.created_monotonic = clock.monotonic_s()
        # The running whole-file checksum, for the seal written when the segment rolls;
        # None when it is not known (a reopened segment: hashed from the file at roll).
        self.digest: SegmentDigest | None = SegmentDigest() if self.size_bytes == 0 else None
        self.closed = False

    def append(self, data) -> int:
        """Write `data` at the end, bytes-like or a list of buffers (written as their
        concatenation, with one gathered write); returns the position it was written
        at."""
        assert self.writable
        position = self.size_bytes
        buffers = data if isinstance(data, list) else [data]
        self.fileio.pwritev(self.handle, buffers, position)
        self.size_bytes = position + sum(memoryview(b).nbytes for b in buffers)
        if self.digest is not None:
            for buffer in buffers:
                self.digest.update(buffer)
        return position

    def adopt_size(self) -> None:
        """A writer in another process appended to this file: take its size. The
        running digest no longer covers the file (the seal then hashes it)."""
        size = self.fileio.size(self.handle)
        if size != self.size_bytes:
            self.size_bytes, self.digest = size, None

    def read(self, position: int, size: int) -> bytes:
        assert position >= 0
        return self.fileio.pread(self.handle, size, position)

    def fsync(self) -> None:
        self.fileio.fsync(self.handle)

    def truncate_to(self, position: int) -> None:
        assert self.writable
        assert 0 <= position <= self.size_bytes
        self.unseal()
        self.fileio.truncate(self.handle, position)
        self.size_bytes = position
        self.digest = SegmentDigest() if position == 0 else None

    def seal(self, sealed_at_us: int, end_offset: int) -> None:
        """Record the whole-file checksum of a segment that rolled (seal.py). The
        caller has fsynced it: a seal never describes bytes a crash could lose."""
        assert self.writable
        digest = self.digest.digest() if self.digest is not None else hash_file(
            self.fileio, self.handle, self.size_bytes)
        assert self.digest is None or self.digest.size_bytes == self.size_bytes
        write_seal(self.fileio, self.path, size_bytes=self.size_bytes, digest=digest,
                   sealed_at_us=sealed_at_us, end_offset=end_offset)

    def unseal(self) -> None:
        """Remove the seal before the file changes (truncate, delete)."""
        if self.fileio.exists(seal_path(self.path)):
            remove_seal(self.fileio, self.path)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.fileio.close(self.handle)
