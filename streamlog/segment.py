"""One segment file: frames back to back, named by the base offset of its first record.

Strategy: a thin object over a FileIO handle that knows its size. Only the partition's
writer thread appends, truncates or fsyncs; readers call `read` from any thread
(pread needs no shared file position). This class is not otherwise thread-safe.
"""

from __future__ import annotations

import os
import time

from .fileio import FileIO
from .layout import segment_name


class Segment:
    def __init__(self, fileio: FileIO, directory: str, base_offset: int, *,
                 writable: bool, create: bool = False) -> None:
        self.fileio = fileio
        self.base_offset = base_offset
        self.path = os.path.join(directory, segment_name(base_offset))
        self.writable = writable
        self.handle = fileio.open(self.path, writable=writable, create=create)
        self.size_bytes = fileio.size(self.handle)
        # Age for rolling counts from creation, or from the open for a reopened segment.
        self.created_monotonic = time.monotonic()
        self.max_timestamp_us: int | None = None
        self.closed = False

    def append(self, data) -> int:
        """Write `data` at the end; returns the position it was written at."""
        assert self.writable
        position = self.size_bytes
        self.fileio.pwrite(self.handle, data, position)
        self.size_bytes = position + len(data)
        return position

    def read(self, position: int, size: int) -> bytes:
        assert position >= 0
        return self.fileio.pread(self.handle, size, position)

    def fsync(self) -> None:
        self.fileio.fsync(self.handle)

    def truncate_to(self, position: int) -> None:
        assert self.writable
        assert 0 <= position <= self.size_bytes
        self.fileio.truncate(self.handle, position)
        self.size_bytes = position

    def refresh_size(self) -> int:
        self.size_bytes = self.fileio.size(self.handle)
        return self.size_bytes

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.fileio.close(self.handle)
