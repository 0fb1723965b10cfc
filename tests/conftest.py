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


def pytest_collection_modifyitems(config, items) -> None:
    """`./dev test` runs two pytest-xdist workers (`--dist loadgroup`): the Spark tests
    stay together on one (one SparkSession, one JVM at a time), the rest share the other
    and whatever the Spark worker leaves. Spark's tests mostly wait (JVM start-ups,
    triggers), so the two halves overlap well on two cores."""
    for item in items:
        if "integration/spark/" in item.nodeid.replace("\\", "/"):
            item.add_marker(pytest.mark.xdist_group("spark"))


@pytest.fixture
def certificate(tmp_path):
    """(cert, key): a self-signed PEM pair for localhost / 127.0.0.1, made by openssl."""
    import shutil
    import subprocess
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                    "-out", cert, "-days", "1", "-subj", "/CN=localhost", "-addext",
                    "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


@pytest.fixture(scope="session")
def kcat():
    """The kcat binary (Debian's package), installed with apt-get when missing."""
    import os
    import shutil
    import subprocess
    found = shutil.which("kcat")
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("kcat is not installed and apt-get cannot run here")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True)
    done = subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends",
                           "kcat"], env=env, capture_output=True, text=True)
    found = shutil.which("kcat")
    if not found:
        pytest.skip(f"apt-get install kcat failed: {done.stderr.strip()[-300:]}")
    return found
