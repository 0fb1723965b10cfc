"""The loopback S3 server (`streamlog.testing.s3server`) against obstore, the client the
object-store tier uses: the operations and conditional writes that tier relies on, the
server's own restart, and its environment for child processes. Each test writes under
its own prefix of the shared server's bucket."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

obstore = pytest.importorskip("obstore")
from obstore.exceptions import AlreadyExistsError, PreconditionError  # noqa: E402
from obstore.store import S3Store  # noqa: E402

from streamlog.testing.s3server import S3Server  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("s3")]


@pytest.fixture
def store(s3_server) -> S3Store:
    """The shared server's bucket, seen under a prefix no other test uses."""
    return S3Store(s3_server.bucket, prefix=s3_server.new_prefix(), **s3_server.storage_options)


def test_put_then_get_returns_the_bytes(store):
    data = os.urandom(100_000)
    obstore.put(store, "segment/00000000000000000000.log", data)
    assert bytes(obstore.get(store, "segment/00000000000000000000.log").bytes()) == data


def test_ranged_get_returns_the_slice(store):
    data = bytes(range(256)) * 40
    obstore.put(store, "blob", data)
    assert bytes(obstore.get_range(store, "blob", start=1000, end=1100)) == data[1000:1100]
    assert bytes(obstore.get_range(store, "blob", start=10_000, length=240)) == data[10_000:]


def test_list_sees_only_the_prefix(store):
    for path in ("a/1", "a/2", "b/1"):
        obstore.put(store, path, b"x")
    listed = sorted(meta["path"] for meta in obstore.list(store, "a").collect())
    assert listed == ["a/1", "a/2"]
    assert [meta["size"] for meta in obstore.list(store, "b").collect()] == [1]


def test_delete_removes_the_object(store):
    obstore.put(store, "gone", b"x")
    obstore.delete(store, "gone")
    with pytest.raises(FileNotFoundError):  # obstore raises the builtin for a 404.
        obstore.get(store, "gone")
    assert obstore.list(store).collect() == []


def test_create_mode_refuses_an_existing_object(store):
    """`If-None-Match: *` answers 412; obstore reports it as AlreadyExistsError (its
    PreconditionError is for `If-Match`)."""
    obstore.put(store, "marker", b"first", mode="create")
    with pytest.raises(AlreadyExistsError):
        obstore.put(store, "marker", b"second", mode="create")
    assert bytes(obstore.get(store, "marker").bytes()) == b"first"


def test_update_mode_needs_the_current_etag(store):
    first = obstore.put(store, "manifest", b"v1")
    with pytest.raises(PreconditionError):
        obstore.put(store, "manifest", b"v2", mode={"e_tag": '"0123456789abcdef"'})
    assert bytes(obstore.get(store, "manifest").bytes()) == b"v1"
    second = obstore.put(store, "manifest", b"v2", mode={"e_tag": _unquoted(first["e_tag"])})
    assert second["e_tag"] != first["e_tag"]
    assert bytes(obstore.get(store, "manifest").bytes()) == b"v2"
    with pytest.raises(PreconditionError):  # The first version is no longer current.
        obstore.put(store, "manifest", b"v3", mode={"e_tag": _unquoted(first["e_tag"])})


def test_update_mode_with_a_quoted_etag_fails_on_this_radosgw(store):
    """radosgw 16.2 compares `If-Match` with the stored ETag as sent, quotes included, so
    the ETag as S3 returns it ("...") never matches: callers must strip the quotes.
    If this starts passing, the server learnt to unquote and the workaround can go."""
    first = obstore.put(store, "manifest", b"v1")
    assert first["e_tag"].startswith('"')
    with pytest.raises(PreconditionError):
        obstore.put(store, "manifest", b"v2", mode={"e_tag": first["e_tag"]})


def test_env_points_a_child_process_at_the_server(s3_server):
    prefix = s3_server.new_prefix()
    child = ("import sys, obstore; from obstore.store import from_url\n"
             "store = from_url(sys.argv[1])\n"
             "obstore.put(store, 'from-child', b'hello')\n")
    env = dict(os.environ, **s3_server.env)
    subprocess.run([sys.executable, "-c", child, s3_server.url(prefix)], env=env,
                   check=True, timeout=60)
    store = S3Store(s3_server.bucket, prefix=prefix, **s3_server.storage_options)
    assert bytes(obstore.get(store, "from-child").bytes()) == b"hello"


def test_objects_survive_a_stop_and_start(tmp_path, s3_server):
    """A server of its own (stopping the shared one would pull it from under other
    tests); `s3_server` only makes sure Ceph is installed, or skips."""
    data = os.urandom(300_000)
    server = S3Server(tmp_path / "s3", bucket="restart")
    with server:
        store = S3Store(server.bucket, **server.storage_options)
        obstore.put(store, "kept", data)
        pids = server.pids
    assert not server.running
    assert not any(os.path.exists(f"/proc/{pid}") for pid in pids.values())
    with server:
        store = S3Store(server.bucket, **server.storage_options)
        assert bytes(obstore.get(store, "kept").bytes()) == data
        obstore.put(store, "after-restart", b"x", mode="create")


def _unquoted(e_tag: str) -> str:
    return e_tag.strip('"')
