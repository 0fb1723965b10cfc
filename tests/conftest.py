"""Fixtures shared by every test tier. Keep this file small and generic."""

from __future__ import annotations

import pytest

import streamlog


@pytest.fixture
def log_dir(tmp_path) -> str:
    """A path for a log directory that does not exist yet."""
    return str(tmp_path / "log")


@pytest.fixture
def open_logs():
    """`open_logs(path, **options)` opens a log that is closed at teardown, so a failing
    test does not leave a writer thread or the writer lock behind."""
    opened: list[streamlog.Log] = []

    def open_one(path, **options) -> streamlog.Log:
        log = streamlog.open_log(path, **options)
        opened.append(log)
        return log

    yield open_one
    for log in reversed(opened):
        log.close()
