"""config.py and open_log's option handling: every bad option is an InvalidArgument that
names the option, raised before anything touches the disk."""

from __future__ import annotations

import os

import pytest

import streamlog
from streamlog import Compression, FsyncPolicy, InvalidArgument, LogConfig

POSITIVE_INTS = ("fsync_interval_ms", "segment_bytes_max", "record_bytes_max",
                 "frame_bytes_max", "batch_records_max", "inflight_appends_max",
                 "inflight_bytes_max", "tail_ring_batches_max", "tail_ring_bytes_max",
                 "read_chunk_bytes", "partitions_max", "index_map_bytes")

BAD_OPTIONS = [
    ("fsync", "sometimes"),
    ("fsync", None),
    ("fsync", 1),
    ("compression", "lz4"),
    ("zstd_level", 0),
    ("zstd_level", 23),
    ("segment_age_max_s", 0),
    ("segment_age_max_s", -1.0),
    ("retention_age_s", 0),
    ("retention_age_s", -3600),
    ("retention_age_s", True),
    ("retention_bytes", 0),
    ("retention_bytes", -1),
    ("retention_bytes", True),
    ("segment_bytes_max", 4095),
    ("record_bytes_max", 9 * 1024 * 1024),  # more than half of frame_bytes_max
    # Wrong types must not slip past a comparison (TypeError) or pass as numbers.
    ("zstd_level", "3"),
    ("zstd_level", True),
    ("zstd_level", 2.0),
    ("segment_age_max_s", "1h"),
    ("remote_max_lag_s", 0),
    ("remote_max_lag_s", "60s"),
    ("segment_age_max_s", True),
    ("retention_age_s", "1d"),
    ("retention_bytes", "1GB"),
    ("retention_bytes", 1.5),
] + [(name, value) for name in POSITIVE_INTS for value in (-1, 0, True, False, "64", 2.5)]

def test_defaults_are_valid_and_normalised():
    config = LogConfig().validate()
    assert config.fsync is FsyncPolicy.ALWAYS
    assert config.compression is Compression.AUTO


@pytest.mark.parametrize("fsync", ["always", "interval", "never", FsyncPolicy.NEVER])
def test_fsync_policies_are_accepted_as_text_or_enum(fsync):
    config = LogConfig(fsync=fsync).validate()
    assert config.fsync is FsyncPolicy(fsync)
    assert isinstance(config.fsync, FsyncPolicy)


def test_validate_returns_a_copy():
    original = LogConfig(fsync="never", compression="none")
    validated = original.validate()
    assert original.fsync == "never"
    assert validated.fsync is FsyncPolicy.NEVER
    assert validated.compression is Compression.NONE


def test_smallest_allowed_values():
    config = LogConfig(segment_bytes_max=4096, record_bytes_max=1, frame_bytes_max=2,
                       zstd_level=22, retention_bytes=1, retention_age_s=0.001,
                       **{name: 1 for name in POSITIVE_INTS
                          if name not in ("segment_bytes_max", "record_bytes_max",
                                          "frame_bytes_max")})
    assert config.validate().segment_bytes_max == 4096


@pytest.mark.parametrize("name, value", BAD_OPTIONS)
def test_bad_option_in_config_names_the_option(name, value):
    with pytest.raises(InvalidArgument) as caught:
        LogConfig(**{name: value}).validate()
    assert name in str(caught.value)


@pytest.mark.parametrize("name, value", BAD_OPTIONS)
def test_bad_option_to_open_log_touches_nothing(log_dir, name, value):
    with pytest.raises(InvalidArgument) as caught:
        streamlog.open_log(log_dir, **{name: value})
    assert name in str(caught.value)
    assert isinstance(caught.value, ValueError)
    assert not os.path.exists(log_dir)


def test_unknown_keyword_names_it(log_dir):
    with pytest.raises(InvalidArgument, match="segment_size"):
        streamlog.open_log(log_dir, segment_size=4096)
    with pytest.raises(InvalidArgument, match="bogus"):
        streamlog.open_log(log_dir, fsync="never", bogus=1, read_chunk_bytes=4096)
    assert not os.path.exists(log_dir)


def test_unknown_keyword_is_not_taken_for_an_option_of_open_log(log_dir):
    # `config` fields are options; open_log's own keywords are not LogConfig fields.
    with pytest.raises(InvalidArgument, match="readonly_mode"):
        streamlog.open_log(log_dir, readonly_mode=True)


def test_path_must_be_a_path(log_dir):
    with pytest.raises(InvalidArgument, match="path"):
        streamlog.open_log(12)
    with pytest.raises(InvalidArgument, match="path"):
        streamlog.open_log(None)


def test_config_object_and_keyword_overrides(log_dir, open_logs):
    base = LogConfig(segment_bytes_max=8192, tail_ring_batches_max=3)
    log = open_logs(log_dir, fsync="never", config=base, tail_ring_batches_max=5)
    assert log.config.segment_bytes_max == 8192
    assert log.config.tail_ring_batches_max == 5
    assert log.config.fsync is FsyncPolicy.NEVER


def test_bad_config_object(log_dir):
    with pytest.raises(InvalidArgument):
        streamlog.open_log(log_dir, config={"fsync": "never"})
    with pytest.raises(InvalidArgument, match="segment_bytes_max"):
        streamlog.open_log(log_dir, config=LogConfig(segment_bytes_max=-1))
    assert not os.path.exists(log_dir)
