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


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3 endpoint (`streamlog.testing.s3server.S3Server`: radosgw on loopback,
    bucket "streamlog"), one for the whole run, shared by the pytest-xdist workers; tests
    keep apart with `s3_server.new_prefix()`. Skipped when Ceph is missing and cannot be
    installed (not root, or apt-get failed).

    Sharing: the server lives in `s3/` beside the workers' temp dirs (in the run's own
    temp dir without xdist), with two flocks beside it. `s3.lock`, exclusive and held
    briefly, makes install, start, attach and stop one at a time. Each worker using the
    server holds `s3.users` shared until its session ends. The worker that started it
    (its pid in `s3.owner`) drops its shared lock at teardown, then polls, under
    `s3.lock`, for `s3.users` exclusive: it gets it once every other user has finished
    (or died: the kernel drops a dead process's flocks), so the server stops after its
    last user, whichever worker that is. A worker that comes after the stop starts a new
    one and owns it; one that finds the owner dead adopts the running server. The owner
    never holds `s3.lock` between polls, so a late worker can still join."""
    import fcntl
    import os
    from streamlog.testing.s3server import S3Server, S3ServerError, ensure_installed
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    owner_path = shared / "s3.owner"
    with _lock_file(shared / "s3.lock", fcntl.LOCK_EX, timeout_s=900):
        try:
            ensure_installed()
        except S3ServerError as error:
            pytest.skip(str(error))
        users = _lock_file(shared / "s3.users", fcntl.LOCK_SH, timeout_s=10)
        server = S3Server.attach(shared / "s3")
        owned = server is None or not _process_exists(owner_path)
        try:
            server = server or S3Server(shared / "s3").start()
        except BaseException:
            users.close()
            raise
        if owned:
            owner_path.write_text(str(os.getpid()))
    try:
        yield server
    finally:
        users.close()
        if owned:
            _stop_after_last_user(server, shared, owner_path)


def _stop_after_last_user(server, shared, owner_path, *, timeout_s: float = 7200) -> None:
    """Stop `server` once no other worker holds `s3.users` (see `s3_server`), or after
    `timeout_s` regardless."""
    import fcntl
    import time
    deadline = time.monotonic() + timeout_s
    while True:
        with _lock_file(shared / "s3.lock", fcntl.LOCK_EX, timeout_s=900):
            try:
                _lock_file(shared / "s3.users", fcntl.LOCK_EX, timeout_s=0).close()
                in_use = False
            except TimeoutError:
                in_use = True
            # Holding s3.lock: no worker can join between that check and the stop.
            if not in_use or time.monotonic() > deadline:
                server.stop()
                owner_path.unlink(missing_ok=True)
                return
        time.sleep(0.2)


def _lock_file(path, mode: int, *, timeout_s: float):
    """`path` (created if missing) opened and flocked with `mode` (`fcntl.LOCK_EX` or
    `LOCK_SH`), polling for up to `timeout_s`; closing the file releases the lock.
    Raises TimeoutError."""
    import fcntl
    import time
    file = open(path, "a")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(file, mode | fcntl.LOCK_NB)
            return file
        except BlockingIOError:
            if time.monotonic() >= deadline:
                file.close()
                raise TimeoutError(f"no lock on {path} within {timeout_s} s") from None
            time.sleep(0.05)


def _process_exists(pid_path) -> bool:
    """True if the pid written in `pid_path` names a live process."""
    import os
    try:
        os.kill(int(pid_path.read_text()), 0)
    except (OSError, ValueError):
        return False
    return True
