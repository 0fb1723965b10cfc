"""Test doubles that ship with streamlog, so its own tests and its users' tests can
drive the log through faults: `faultfs.FaultFileIO` simulates power loss (unsynced
writes dropped, torn or replaced by garbage), flipped bits and I/O errors over real
files."""

from .faultfs import CrashMode, FaultFileIO, flip_bit

__all__ = ["CrashMode", "FaultFileIO", "flip_bit"]
