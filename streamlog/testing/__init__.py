"""Test doubles that ship with streamlog, so its own tests and its users' tests can
drive the log through faults: `faultfs.FaultFileIO` simulates power loss (unsynced
writes dropped, torn or replaced by garbage), flipped bits and I/O errors over real
files; `memindex` is an in-memory twin of the index's LMDB environment that a power loss
rolls back; `clock.ManualClock` moves only when told; `serve` runs the daemon as a
child process. streamlog's own harnesses (the damage sweep, the partition simulator)
live in its tests, not here."""

from .faultfs import CrashMode, FaultFileIO, flip_bit

__all__ = ["CrashMode", "FaultFileIO", "flip_bit"]
