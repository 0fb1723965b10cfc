"""Test doubles that ship with streamlog, so its own tests and its users' tests can
drive the log through faults: `memfs.MemoryFileIO` is the file system in memory (the
whole FileIO protocol, flocks and shared mappings included, no disk); `faultfs.FaultFileIO`
simulates power loss (unsynced writes dropped, torn or replaced by garbage), flipped
bits and I/O errors over real files or over a MemoryFileIO; `memindex` is an in-memory
twin of the index's LMDB environment that a power loss rolls back;
`clock.ManualClock` moves only when told; `serve` runs the daemon as a child process.
streamlog's own harnesses (the damage sweep, the partition simulator) live in its
tests, not here."""

from .faultfs import CrashMode, FaultFileIO, flip_bit
from .memfs import MemoryFileIO
from .memstore import MemoryBucket, MemoryStore

__all__ = ["CrashMode", "FaultFileIO", "MemoryBucket", "MemoryFileIO", "MemoryStore",
           "flip_bit"]
