"""Every option and every bound of the log, in one place.

Strategy: a frozen `LogConfig` is chosen when a log is opened and never changes while it
is open. Every queue, buffer and loop in the package takes its bound from here
("put a limit on everything"). `validate()` turns a wrong option into a clear
`InvalidArgument` before anything touches the disk.
"""

from __future__ import annotations

import dataclasses
import enum

from .errors import InvalidArgument


class FsyncPolicy(str, enum.Enum):
    """When appended bytes are forced to stable storage.

    ALWAYS: an append is acknowledged only after its batch is fsynced (group commit).
    INTERVAL: acknowledged once written; fsynced at most `fsync_interval_ms` later.
    NEVER: acknowledged once written; the operating system decides when it reaches disk.
    """

    ALWAYS = "always"
    INTERVAL = "interval"
    NEVER = "never"


class Compression(str, enum.Enum):
    AUTO = "auto"  # zstd when it pays, judged on a sample of batches
    ZSTD = "zstd"
    NONE = "none"


@dataclasses.dataclass(frozen=True, slots=True)
class LogConfig:
    fsync: FsyncPolicy = FsyncPolicy.ALWAYS
    fsync_interval_ms: int = 50
    compression: Compression = Compression.AUTO
    zstd_level: int = 1
    # Segments roll when they pass either bound.
    segment_bytes_max: int = 256 * 1024 * 1024
    segment_age_max_s: float = 7 * 24 * 3600.0
    # Retention deletes whole sealed segments; None disables the bound.
    retention_age_s: float | None = None
    retention_bytes: int | None = None
    # Records and frames.
    record_bytes_max: int = 8 * 1024 * 1024
    frame_bytes_max: int = 16 * 1024 * 1024
    batch_records_max: int = 65536
    # Group commit: appends waiting for the writer (back-pressure beyond this).
    inflight_appends_max: int = 8192
    inflight_bytes_max: int = 128 * 1024 * 1024
    # Live tail: the ring of recent acknowledged batches served from memory.
    tail_ring_batches_max: int = 4096
    tail_ring_bytes_max: int = 64 * 1024 * 1024
    # A follower at the end of a writable log looks this often for what writers in
    # other processes appended (its own process's appends wake it at once).
    follow_poll_s: float = 0.1
    # A follower of a read-only view looks this often at the partition's commit lock
    # (its change counter: a memory read) and refreshes the partition when a writer
    # has been there. The look costs no lock and no system call, so it is more
    # frequent; what an idle follower costs is its wake-ups (bench/follow.py).
    view_poll_s: float = 0.01
    # Readers read segments in chunks of this many bytes.
    read_chunk_bytes: int = 8 * 1024 * 1024
    partitions_max: int = 4096
    # LMDB address space per partition index (sparse; not allocated up front).
    index_map_bytes: int = 1 << 30
    # Background re-verification of sealed segments by a writable log (scrub.py): read
    # at most this many bytes per second; None: off (the daemon turns it on).
    scrub_bytes_per_s: int | None = None
    scrub_interval_s: float = 3600.0
    # A log tiered to a store (open_log(remote=...), durability "local"): a segment that
    # has taken appends is sealed once it is this old, appends or not, so the store lags
    # the log by at most about this long (remote/tiering.py).
    remote_max_lag_s: float = 60.0
    # A log read from a store (open_log("s3://...")): look for a newer manifest
    # generation this often (one GET when there is none; 0: never by itself, the view
    # stays at the generation it opened until refresh()), and keep up to this many
    # bytes of segment objects in memory (remote/storefs.py).
    remote_poll_ms: int = 1000
    remote_cache_bytes: int = 256 * 1024 * 1024
    # What an ack means for a log tiered to a store: "local" (the local fsync, as
    # without a store; the store lags by up to remote_max_lag_s) or "remote" (a
    # committed manifest generation holds the records: group commits every
    # remote_commit_ms, sooner once remote_commit_bytes wait; an ack the store has not
    # taken within remote_timeout_s fails with StoreTimeout). Tail objects no
    # generation names any more are deleted after remote_grace_s.
    durability: str = "local"
    # Durability "local": appends fail with StoreBacklogFull once a partition holds this
    # many bytes the store does not have yet (the store down or too slow); None: never.
    remote_max_backlog_bytes: int | None = 4 * 1024 * 1024 * 1024
    remote_commit_ms: int = 10
    remote_commit_bytes: int = 4 * 1024 * 1024
    remote_timeout_s: float = 30.0
    remote_grace_s: float = 900.0

    def validate(self) -> "LogConfig":
        """Return a copy with enums normalised, or raise InvalidArgument naming the option."""
        try:
            fsync = FsyncPolicy(self.fsync)
        except ValueError:
            raise InvalidArgument(
                f"fsync must be one of always, interval, never (got {self.fsync!r})") from None
        try:
            compression = Compression(self.compression)
        except ValueError:
            raise InvalidArgument(
                f"compression must be one of auto, zstd, none (got {self.compression!r})") from None
        positive_ints = ("fsync_interval_ms", "segment_bytes_max", "record_bytes_max",
                         "frame_bytes_max", "batch_records_max", "inflight_appends_max",
                         "inflight_bytes_max", "tail_ring_batches_max", "tail_ring_bytes_max",
                         "read_chunk_bytes", "partitions_max", "index_map_bytes",
                         "remote_cache_bytes", "remote_commit_ms",
                         "remote_commit_bytes")
        for name in positive_ints:
            value = getattr(self, name)
            if not _is_int(value) or value <= 0:
                raise InvalidArgument(f"{name} must be a positive integer (got {value!r})")
        if not _is_int(self.zstd_level) or not 1 <= self.zstd_level <= 22:
            raise InvalidArgument(f"zstd_level must be an int in 1..22 (got {self.zstd_level!r})")
        if not _is_number(self.segment_age_max_s) or self.segment_age_max_s <= 0:
            raise InvalidArgument(f"segment_age_max_s must be a positive number of seconds "
                                  f"(got {self.segment_age_max_s!r})")
        for name, check in (("retention_age_s", _is_number), ("retention_bytes", _is_int)):
            value = getattr(self, name)
            if value is not None and (not check(value) or value <= 0):
                raise InvalidArgument(f"{name} must be positive or None (got {value!r})")
        if self.scrub_bytes_per_s is not None and (
                not _is_int(self.scrub_bytes_per_s) or self.scrub_bytes_per_s <= 0):
            raise InvalidArgument(f"scrub_bytes_per_s must be a positive integer or None "
                                  f"(got {self.scrub_bytes_per_s!r})")
        for name in ("follow_poll_s", "view_poll_s"):
            value = getattr(self, name)
            if not _is_number(value) or not 0 < value <= 60:
                raise InvalidArgument(f"{name} must be a number of seconds in (0, 60] "
                                      f"(got {value!r})")
        if self.remote_max_backlog_bytes is not None and (
                not _is_int(self.remote_max_backlog_bytes)
                or self.remote_max_backlog_bytes <= 0):
            raise InvalidArgument(f"remote_max_backlog_bytes must be a positive integer or "
                                  f"None (got {self.remote_max_backlog_bytes!r})")
        if not _is_int(self.remote_poll_ms) or self.remote_poll_ms < 0:
            raise InvalidArgument(f"remote_poll_ms must be an integer >= 0 (0: no polling) "
                                  f"(got {self.remote_poll_ms!r})")
        if self.durability not in ("local", "remote"):
            raise InvalidArgument(f"durability must be local or remote (got "
                                  f"{self.durability!r})")
        for name in ("remote_timeout_s", "remote_grace_s"):
            if not _is_number(getattr(self, name)) or getattr(self, name) <= 0:
                raise InvalidArgument(f"{name} must be a positive number of seconds "
                                      f"(got {getattr(self, name)!r})")
        if not _is_number(self.remote_max_lag_s) or self.remote_max_lag_s <= 0:
            raise InvalidArgument(f"remote_max_lag_s must be a positive number of seconds "
                                  f"(got {self.remote_max_lag_s!r})")
        if not _is_number(self.scrub_interval_s) or self.scrub_interval_s < 0:
            raise InvalidArgument(f"scrub_interval_s must be a number of seconds >= 0 "
                                  f"(got {self.scrub_interval_s!r})")
        if self.record_bytes_max > self.frame_bytes_max // 2:
            raise InvalidArgument("record_bytes_max must be at most half of frame_bytes_max")
        if self.segment_bytes_max < 4096:
            raise InvalidArgument("segment_bytes_max must be at least 4096")
        return dataclasses.replace(self, fsync=fsync, compression=compression)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
