"""Names of files and folders in a log directory. Pure: no I/O.

    LOG/streamlog.json                       format marker and version
    LOG/LOCK                                 held (flock) shared by every writing process
    LOG/streams/.lock                        held while a stream is created, deleted
                                             or given partitions; shared while opened
    LOG/streams/.deleted.UNIQUE.FOLDER/      a deleted stream's folder, being removed
    LOG/streams/STREAM/stream.json           {"partitions": P}   (a STREAM whose name
                                             starts with "." has the folder "%" + name)
    LOG/streams/STREAM/P/00000000000000000000.log   segments, named by base offset
    LOG/streams/STREAM/P/00000000000000000000.seal  whole-file checksum of a rolled segment
    LOG/streams/STREAM/P/index/              the LMDB index (a cache of the segments)
    LOG/streams/STREAM/P/index.seal          the index's checksum, written by a clean close
    LOG/streams/STREAM/P/scrub.json          the partition's last full verification
    LOG/streams/STREAM/P/truncate.intent     a truncate_after in progress
    LOG/streams/STREAM/P/start.hwm           start marks: retention's, delete_records'
    LOG/streams/STREAM/P/writer.lock         the commit lock and its change counter
    LOG/quarantine/STREAM/P/TIME/            bytes `streamlog repair` cut

A segment being deleted is first renamed to `.log.deleted`; recovery removes leftovers.
A stream being deleted is renamed to its `.deleted.` name in one step
(directory.set_aside); a writable open removes leftovers.
"""

from __future__ import annotations

import os
import re

SEGMENT_SUFFIX = ".log"
DELETED_SUFFIX = ".log.deleted"
_SEGMENT_NAME = re.compile(r"^(\d{20})\.log$")
# Kafka's topic rule (DESIGN 1): 1 to 249 of these characters, not "." or "..".
_STREAM_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
# A name starting with "." would be a hidden folder beside the log's own files in
# `streams/` (".lock"): its folder is "%" + name ("%" is in no stream name).
_HIDDEN_ESCAPE = "%"
INTERNAL_PREFIX = "__"  # streamlog's own streams: written by streamlog only


def segment_name(base_offset: int) -> str:
    assert base_offset >= 0
    return f"{base_offset:020d}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    match = _SEGMENT_NAME.match(name)
    return int(match.group(1)) if match else None


def valid_stream_name(name: str) -> bool:
    return isinstance(name, str) and bool(_STREAM_NAME.match(name)) and name not in (".", "..")


def is_internal(name: str) -> bool:
    """A stream of streamlog's own (committed offsets, producer and transaction state):
    readable by everyone, written only through the library's internal door."""
    return name.startswith(INTERNAL_PREFIX)


def stream_folder(name: str) -> str:
    """The name of stream `name`'s folder in `streams/`."""
    return _HIDDEN_ESCAPE + name if name.startswith(".") else name


def stream_of_folder(folder: str) -> str | None:
    """The stream whose folder in `streams/` is `folder`, or None for the log's own
    entries there (".lock") and anything that is not a stream's folder."""
    name = folder[1:] if folder.startswith(_HIDDEN_ESCAPE) else folder
    if name.startswith(".") != folder.startswith(_HIDDEN_ESCAPE):
        return None
    return name if valid_stream_name(name) else None


def streams_dir(log_dir: str) -> str:
    return os.path.join(log_dir, "streams")


def stream_dir(log_dir: str, stream: str) -> str:
    return os.path.join(log_dir, "streams", stream_folder(stream))


def partition_dir(log_dir: str, stream: str, partition: int) -> str:
    return os.path.join(log_dir, "streams", stream_folder(stream), str(partition))
