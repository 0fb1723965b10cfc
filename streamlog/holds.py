"""Durable retention holds: named positions that retention never deletes past.

Strategy: DESIGN 2 says retention never removes an offset a reader still holds. A
reader object holds its position while it is open, in its own process
(`Partition.hold`). A consumer that stops and starts again, like an operator between a
crash and its recovery, needs a hold that outlives the process and that a writer in
another process sees: that is a durable hold. Each is one small file,
`LOG/streams/STREAM/P/holds/NAME.json` = {"offset": N, "updated_us": T}, replaced
atomically (write, fsync, rename, fsync the directory), so any process may set one,
including one that opened the log read-only: it touches no segment, no index and no lock
the writer uses. Retention reads the folder each time it runs and keeps every offset
>= the lowest hold (it deletes only whole segments below it).

A hold file that cannot be read is not ignored: retention then holds everything and
logs which file is damaged (bad input loses nothing); `release` removes it.

Names are those of streams (letters, digits, '.', '_', '-').
"""

from __future__ import annotations

import json
import logging
import os

from . import fileio as fileio_module
from .errors import InvalidArgument
from .layout import valid_stream_name

log = logging.getLogger("streamlog.holds")
HOLDS_DIR = "holds"
SUFFIX = ".json"
HOLDS_MAX = 4096  # bound on the files a scan reads


def _path(directory: str, name: str) -> str:
    if not valid_stream_name(name):
        raise InvalidArgument(f"hold name {name!r} must be letters, digits, '.', '_' or '-'")
    return os.path.join(directory, HOLDS_DIR, name + SUFFIX)


def set_hold(fileio, directory: str, name: str, offset: int, now_us: int) -> None:
    """Hold `offset` (and everything after it) under `name`, durably."""
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise InvalidArgument(f"a hold's offset must be an int >= 0 (got {offset!r})")
    path = _path(directory, name)
    fileio.makedirs(os.path.dirname(path))
    fileio_module.write_file_atomic(
        fileio, path, json.dumps({"offset": offset, "updated_us": now_us}).encode())


def release(fileio, directory: str, name: str) -> bool:
    """Remove the hold `name`; False when there was none."""
    path = _path(directory, name)
    if not fileio.exists(path):
        return False
    fileio.unlink(path)
    fileio.fsync_dir(os.path.dirname(path))
    return True


def read_holds(fileio, directory: str) -> dict[str, dict]:
    """{name: {"offset", "updated_us"}}; a damaged file reads as {"offset": 0,
    "damaged": reason} (it holds everything)."""
    folder = os.path.join(directory, HOLDS_DIR)
    if not fileio.exists(folder):
        return {}
    out: dict[str, dict] = {}
    for entry in fileio.listdir(folder)[:HOLDS_MAX]:
        if not entry.endswith(SUFFIX):
            continue  # a temporary file of a write under way
        name = entry[:-len(SUFFIX)]
        try:
            value = json.loads(fileio_module.read_file(fileio, os.path.join(folder, entry)))
            offset, updated = value["offset"], value.get("updated_us", 0)
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise ValueError(f"offset {offset!r}")
            out[name] = {"offset": offset, "updated_us": updated}
        except FileNotFoundError:
            continue  # released while we listed
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as error:
            out[name] = {"offset": 0, "damaged": f"{type(error).__name__}: {error}"}
    return out


def lowest(fileio, directory: str) -> int | None:
    """The lowest offset any durable hold keeps (None: no hold)."""
    holds = read_holds(fileio, directory)
    for name, hold in holds.items():
        if "damaged" in hold:
            log.warning("retention holds everything in %s: hold %r is damaged (%s); "
                        "release it to let retention run", directory, name, hold["damaged"])
    return min((hold["offset"] for hold in holds.values()), default=None)
