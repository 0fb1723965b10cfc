"""Names of files and folders in a log directory. Pure: no I/O.

    LOG/streamlog.json                       format marker and version
    LOG/LOCK                                 held (flock) shared by every writing process
    LOG/streams/.lock                        held while a stream is created
    LOG/streams/STREAM/stream.json           {"partitions": P}
    LOG/streams/STREAM/P/00000000000000000000.log   segments, named by base offset
    LOG/streams/STREAM/P/00000000000000000000.seal  whole-file checksum of a rolled segment
    LOG/streams/STREAM/P/index/              the LMDB index (a cache of the segments)
    LOG/streams/STREAM/P/index.seal          the index's checksum, written by a clean close
    LOG/streams/STREAM/P/scrub.json          the partition's last full verification
    LOG/streams/STREAM/P/truncate.intent     a truncate_after in progress
    LOG/streams/STREAM/P/writer.lock         the commit lock and its change counter
    LOG/quarantine/STREAM/P/TIME/            bytes `streamlog repair` cut

A segment being deleted is first renamed to `.log.deleted`; recovery removes leftovers.
"""

from __future__ import annotations

import os
import re

SEGMENT_SUFFIX = ".log"
DELETED_SUFFIX = ".log.deleted"
_SEGMENT_NAME = re.compile(r"^(\d{20})\.log$")
_STREAM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


def segment_name(base_offset: int) -> str:
    assert base_offset >= 0
    return f"{base_offset:020d}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    match = _SEGMENT_NAME.match(name)
    return int(match.group(1)) if match else None


def valid_stream_name(name: str) -> bool:
    return isinstance(name, str) and bool(_STREAM_NAME.match(name)) and name not in (".", "..")


def streams_dir(log_dir: str) -> str:
    return os.path.join(log_dir, "streams")


def stream_dir(log_dir: str, stream: str) -> str:
    return os.path.join(log_dir, "streams", stream)


def partition_dir(log_dir: str, stream: str, partition: int) -> str:
    return os.path.join(log_dir, "streams", stream, str(partition))
