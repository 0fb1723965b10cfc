"""A read-only view follows a writer in another process with refresh(): new frames,
rolled segments, retention, and a truncate (which reopens the partition)."""

import subprocess
import sys

import pytest

import streamlog

WRITER = """
import sys, streamlog
path, command = sys.argv[1], sys.argv[2]
with streamlog.open_log(path, segment_bytes_max=4096, compression="none",
                        retention_bytes=int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3] else None) as log:
    log.create_stream("s")
    if command == "append":
        for n in range(int(sys.argv[4]) if len(sys.argv) > 4 else 10):
            log.append_batch_sync("s", [b"%d" % n * 40] * 5)
    elif command == "retention":
        log.apply_retention()
    elif command == "truncate":
        log.truncate_after("s", 0, int(sys.argv[4]))
"""


def writer(path, *args) -> None:
    subprocess.run([sys.executable, "-c", WRITER, str(path), *map(str, args)], check=True)


def values(log):
    return [r.value for r in log.reader("s", 0)]


def test_a_read_only_view_follows_appends_rolls_retention_and_truncate(tmp_path):
    path = tmp_path / "log"
    writer(path, "append", "", 10)
    with streamlog.open_log(path, readonly=True) as view:
        assert view.end_offset("s", 0) == 50
        segments_before = view.info()["streams"]["s"]["partitions"][0]["segments"]
        writer(path, "append", "", 30)  # more frames, more segments
        assert view.end_offset("s", 0) == 50  # a view does not move by itself
        view.refresh()
        assert view.end_offset("s", 0) == 200
        assert view.info()["streams"]["s"]["partitions"][0]["segments"] > segments_before
        assert len(values(view)) == 200
        assert view.offset_for_timestamp("s", 0, 0) == 0
        writer(path, "retention", 6000)  # the oldest segments go
        view.refresh()
        start = view.start_offset("s", 0)
        assert start > 0 and len(values(view)) == 200 - start
        cut = start + 4
        writer(path, "truncate", "", cut)  # the partition is reopened under the view
        view.refresh()
        assert view.end_offset("s", 0) == cut + 1
        assert len(values(view)) == cut + 1 - start
        writer(path, "append", "", 2)
        view.refresh()
        assert view.end_offset("s", 0) == cut + 11


def test_refresh_of_a_writable_log_or_a_closed_view(tmp_path):
    with streamlog.open_log(tmp_path / "log") as log:
        log.create_stream("s")
        log.refresh()  # always current: nothing to do
    view = streamlog.open_log(tmp_path / "log", readonly=True)
    view.close()
    with pytest.raises(streamlog.LogClosed):
        view.refresh()
