"""The S3 adapter (streamlog/remote/s3.py) through obstore's real HTTP client.

Two parts:

  * against a loopback stand-in that answers each request as the test scripts it (no
    S3 semantics, just statuses, headers and delays): the requests obstore sends
    (path-style, plain http, the conditional headers, one attempt per call) and the
    port's error for each answer, from obstore's real messages. Always runs.
  * against a real S3-compatible server (Ceph RGW on loopback), through the
    `s3_server` fixture of tests/conftest.py (streamlog/testing/s3server.py): each
    test works under a prefix of its own, `s3_server.url(s3_server.new_prefix())`.
    The manifest's commit and fencing run there too: its conditional creates are the
    server's, not a twin's.
"""

from __future__ import annotations

import http.server
import os
import socket
import threading
import time
import uuid
from typing import NamedTuple

import pytest

from streamlog.errors import (ObjectNotFound, PreconditionFailed, StoreError,
                              StoreUnavailable)
from streamlog.errors import Fenced
from streamlog.encoder import Piece
from streamlog.remote import manifest
from streamlog.remote.s3 import S3Store
from streamlog.remote.store import RetryPolicy, Retrying

pytestmark = pytest.mark.slow


# -- a loopback stand-in ---------------------------------------------------------------


class Answer(NamedTuple):
    status: int
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    delay_s: float = 0.0


class Request(NamedTuple):
    method: str
    path: str
    headers: dict[str, str]


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        stub: StandIn = self.server.stub  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        answer = stub.next_answer(Request(self.command, self.path,
                                             {k.lower(): v for k, v in self.headers.items()}))
        time.sleep(answer.delay_s)
        body = b"" if self.command == "HEAD" else answer.body
        self.send_response(answer.status)
        for name, value in answer.headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _answer

    def log_message(self, *args) -> None:
        pass


class StandIn:
    """An HTTP server on 127.0.0.1 that gives the scripted answers in turn (the last
    one again when they run out) and records each request."""

    def __init__(self) -> None:
        self.answers: list[Answer] = []
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.stub = self  # type: ignore[attr-defined]
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def next_answer(self, request: Request) -> Answer:
        with self._lock:
            self.requests.append(request)
            return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    def store(self, **options) -> S3Store:
        return S3Store.from_url("s3://bucket/logs/one", {
            "endpoint": self.endpoint, "access_key_id": "id", "secret_access_key": "secret",
            "region": "us-east-1", **options}, environ={})

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def stand_in():
    server = StandIn()
    yield server
    server.close()


_ETAG = (("ETag", '"0cc175b9c0f1b6a831c399e269772661"'),)
_SLOW_DOWN = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"


def test_requests_go_path_style_over_plain_http_once_each(stand_in):
    stand_in.answers = [Answer(200, headers=_ETAG)]
    etag = stand_in.store().put("segments/0.log", b"a")
    assert etag == '"0cc175b9c0f1b6a831c399e269772661"'
    (request,) = stand_in.requests
    assert (request.method, request.path) == ("PUT", "/bucket/logs/one/segments/0.log")
    assert "if-none-match" not in request.headers and "if-match" not in request.headers


def test_a_conditional_create_sends_if_none_match_and_a_412_is_precondition_failed(stand_in):
    stand_in.answers = [Answer(412)]
    with pytest.raises(PreconditionFailed) as raised:
        stand_in.store().put("manifest/1", b"a", if_absent=True)
    assert raised.value.key == "manifest/1"
    (request,) = stand_in.requests
    assert request.headers["if-none-match"] == "*"


def test_a_conditional_overwrite_sends_a_bare_if_match_and_412_is_precondition_failed(
        stand_in):
    stand_in.answers = [Answer(412)]
    with pytest.raises(PreconditionFailed):
        stand_in.store().put("lease", b"a", if_match='"abc"')
    (request,) = stand_in.requests
    assert request.headers["if-match"] == "abc"  # RGW compares it as sent, unquoted


@pytest.mark.parametrize("answer, expected", [
    (Answer(503, _SLOW_DOWN), StoreUnavailable),
    (Answer(500), StoreUnavailable),
    (Answer(502), StoreUnavailable),
    (Answer(429), StoreUnavailable),
    (Answer(409, b"<Error><Code>ConditionalRequestConflict</Code></Error>"), StoreUnavailable),
    (Answer(404, b"<Error><Code>NoSuchKey</Code></Error>"), ObjectNotFound),
    (Answer(403, b"<Error><Code>AccessDenied</Code></Error>"), StoreError),
    (Answer(400, b"<Error><Code>InvalidRequest</Code></Error>"), StoreError),
], ids=["503-slowdown", "500", "502", "429", "409", "404", "403", "400"])
def test_each_answer_becomes_the_ports_error_after_one_request(stand_in, answer, expected):
    stand_in.answers = [answer]
    with pytest.raises(StoreError) as raised:
        stand_in.store().get("segments/0.log")
    assert type(raised.value) is expected
    assert str(raised.value).startswith("get 'segments/0.log' in s3://bucket/logs/one: ")
    assert len(stand_in.requests) == 1  # obstore's own retries are off


def test_a_put_that_finds_no_bucket_is_a_store_error_not_a_missing_object(stand_in):
    stand_in.answers = [Answer(404, b"<Error><Code>NoSuchBucket</Code></Error>")]
    with pytest.raises(StoreError) as raised:
        stand_in.store().put("k", b"a")
    assert type(raised.value) is StoreError and "NoSuchBucket" in str(raised.value)


def test_a_range_that_starts_past_the_end_is_empty(stand_in):
    stand_in.answers = [Answer(416, b"<Error><Code>InvalidRange</Code></Error>")]
    assert stand_in.store().get_range("segments/0.log", 100, 200) == b""
    assert stand_in.requests[0].headers["range"] == "bytes=100-199"


def test_a_refused_connection_is_unavailable():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = S3Store.from_url("s3://bucket/p", {"endpoint": f"http://127.0.0.1:{port}",
                                               "access_key_id": "id",
                                               "secret_access_key": "secret"}, environ={})
    with pytest.raises(StoreUnavailable, match="error sending request"):
        store.head("k")


def test_a_timeout_from_storage_options_is_unavailable(stand_in):
    stand_in.answers = [Answer(200, b"late", _ETAG, delay_s=2.0)]
    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        stand_in.store(timeout="200ms").get("k")
    assert time.monotonic() - started < 1.5


def test_retrying_rides_out_throttling_over_real_http(stand_in):
    stand_in.answers = [Answer(503, _SLOW_DOWN), Answer(503, _SLOW_DOWN),
                        Answer(200, headers=_ETAG)]
    waits: list[float] = []
    store = Retrying(stand_in.store(), RetryPolicy(delay_base_s=0.01), sleep=waits.append)
    assert store.put("k", b"a") == '"0cc175b9c0f1b6a831c399e269772661"'
    assert len(stand_in.requests) == 3 and len(waits) == 2


# -- against a real S3-compatible server -----------------------------------------------


@pytest.fixture
def remote(s3_server):
    """An S3Store on a fresh prefix of the server's bucket; emptied afterwards."""
    store = S3Store.from_url(s3_server.url(s3_server.new_prefix()),
                             s3_server.storage_options, environ={})
    yield store
    for meta in store.list():
        store.delete(meta.key)


@pytest.mark.xdist_group("s3")
class TestAgainstARealServer:

    def test_objects_round_trip_with_etags(self, remote):
        etag = remote.put("segments/00000000000000000000.log", b"frame bytes")
        assert remote.get("segments/00000000000000000000.log") == b"frame bytes"
        meta = remote.head("segments/00000000000000000000.log")
        assert (meta.size, meta.etag) == (11, etag)
        assert abs(meta.last_modified_us / 1e6 - time.time()) < 600

    def test_a_conditional_create_writes_once(self, remote):
        remote.put("manifest/00000001", b"generation 1", if_absent=True)
        with pytest.raises(PreconditionFailed):
            remote.put("manifest/00000001", b"generation 1 again", if_absent=True)
        assert remote.get("manifest/00000001") == b"generation 1"

    def test_racing_conditional_creates_have_one_winner(self, remote):
        outcomes: list[str] = []
        barrier = threading.Barrier(6)

        def race(number: int) -> None:
            barrier.wait()
            try:
                remote.put("manifest/00000002", f"writer {number}".encode(), if_absent=True)
                outcomes.append("won")
            except PreconditionFailed:
                outcomes.append("lost")
            except StoreUnavailable:  # 409: a conflicting create was in flight
                outcomes.append("conflict")
        threads = [threading.Thread(target=race, args=(n,)) for n in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert outcomes.count("won") == 1 and len(outcomes) == 6

    def test_a_conditional_overwrite_needs_the_current_etag(self, remote):
        first = remote.put("lease", b"epoch 1", if_absent=True)
        second = remote.put("lease", b"epoch 2", if_match=first)
        with pytest.raises(PreconditionFailed):
            remote.put("lease", b"epoch 3", if_match=first)
        with pytest.raises(PreconditionFailed):
            remote.put("no-lease", b"epoch 1", if_match=second)
        assert remote.get("lease") == b"epoch 2" and remote.head("lease").etag == second

    def test_ranges_read_like_slices(self, remote):
        remote.put("segment", bytes(range(256)))
        data = bytes(range(256))
        assert remote.get_range("segment", 10, 20) == data[10:20]
        assert remote.get_range("segment", 250, 300) == data[250:]
        assert remote.get_range("segment", 256, 300) == b""
        ranges = [(200, 210), (0, 4), (5, 5), (250, 400), (300, 310)]
        assert remote.get_ranges("segment", ranges) == [data[s:e] for s, e in ranges]

    def test_missing_objects_are_object_not_found(self, remote):
        for read in (lambda: remote.get("missing"), lambda: remote.head("missing"),
                     lambda: remote.get_range("missing", 0, 1),
                     lambda: remote.get_ranges("missing", [(0, 1)])):
            with pytest.raises(ObjectNotFound):
                read()
        remote.delete("missing")  # no error

    def test_list_is_sorted_relative_and_matches_whole_folders(self, remote):
        for key in ("segments/b", "seg/1", "segments/a/x", "manifest/2", "segments/a"):
            remote.put(key, b"x")
        assert [meta.key for meta in remote.list()] == [
            "manifest/2", "seg/1", "segments/a", "segments/a/x", "segments/b"]
        assert [meta.key for meta in remote.list("seg")] == ["seg/1"]
        remote.delete("seg/1")
        assert [meta.key for meta in remote.list("seg")] == []

    def test_after_a_lost_response_retrying_reads_back_what_it_wrote(self, remote):
        class FirstPutUnanswered:
            """The first put fails with StoreUnavailable: after reaching RGW (its
            response lost) when `reaches`, else before (a refused connection)."""

            url = remote.url

            def __init__(self, reaches: bool) -> None:
                self.reaches, self.failed = reaches, False

            def put(self, key, data, **conditions):
                if not self.failed:
                    self.failed = True
                    if self.reaches:
                        remote.put(key, data, **conditions)
                    raise StoreUnavailable("no answer", key=key)
                return remote.put(key, data, **conditions)

            def __getattr__(self, name):
                return getattr(remote, name)

        def retrying(reaches: bool) -> Retrying:
            return Retrying(FirstPutUnanswered(reaches), sleep=lambda seconds: None)
        etag = retrying(True).put("manifest/1", b"epoch 1, generation 1", if_absent=True)
        assert etag == remote.head("manifest/1").etag
        with pytest.raises(PreconditionFailed):  # read back: the bytes there are not ours
            retrying(False).put("manifest/1", b"epoch 2, generation 1", if_absent=True)
        lease = remote.put("lease", b"epoch 1, renewal 1")
        renewed = retrying(True).put("lease", b"epoch 1, renewal 2", if_match=lease)
        assert renewed == remote.head("lease").etag != lease

    def test_a_missing_bucket_is_a_store_error_no_retry_cures(self, s3_server):
        missing = S3Store.from_url(f"s3://streamlog-missing-{uuid.uuid4().hex[:12]}/p",
                                   s3_server.storage_options, environ={})
        with pytest.raises(StoreError) as raised:
            missing.put("k", b"v")
        assert not isinstance(raised.value, StoreUnavailable)

    def test_the_manifest_fences_an_older_writer_on_the_real_store(self, remote):
        first = manifest.take_over(remote, "first")
        committed = manifest.commit(remote, first.successor(streams={"s": 1}))
        second = manifest.take_over(remote, "second")
        assert (second.generation, second.epoch, second.streams) == (2, 2, {"s": 1})
        with pytest.raises(Fenced):
            manifest.commit(remote, committed.successor())
        assert manifest.latest(remote) == second

    def test_a_sealed_segment_goes_up_whole_with_its_index(self, remote):
        from streamlog.config import LogConfig
        from streamlog.partition import Partition
        from streamlog.remote.segment_object import decode_index, upload
        from streamlog.testing import MemoryFileIO
        from streamlog.testing.memindex import MemoryIndexStorage
        part = Partition("/memory/s/0", "s/0", 0,
                         LogConfig(segment_bytes_max=4096).validate(), MemoryFileIO(),
                         readonly=False, index_storage=MemoryIndexStorage())
        try:
            for i in range(120):
                part.submit([Piece([1000 + i], [None], [b"%d" % i * 40], None, None, 200)])
            assert len(part.state.segments) > 1  # the first one is sealed
            first = part.state.segments[0]
            data = first.read(0, first.size_bytes)
        finally:
            part.close()
        writer = manifest.take_over(remote, "writer")
        committed = manifest.commit(remote, upload(remote, writer, "s/0", data,
                                                   base_offset=0,
                                                   hwm_before=None).successor())
        (segment,) = manifest.latest(remote).partitions["s/0"].segments
        assert segment == committed.partitions["s/0"].segments[0]
        assert remote.get(segment.key) == data
        entries = decode_index(remote.get(segment.index_key), segment.index_key, 0)
        assert entries[-1].next_offset == segment.end_offset
        assert remote.get_range(segment.key, entries[1].position,
                                entries[1].position + entries[1].frame_bytes) == data[
            entries[1].position:entries[1].position + entries[1].frame_bytes]


@pytest.mark.xdist_group("s3")
def test_a_log_tiered_to_the_real_store(tmp_path, s3_server):
    import streamlog
    url = s3_server.url(s3_server.new_prefix())
    with streamlog.open_log(tmp_path / "log", remote=url,
                            storage_options=s3_server.storage_options,
                            segment_bytes_max=4096, fsync="never") as log:
        log.create_stream("s")
        for i in range(100):
            log.append_sync("s", b"%05d" % i + b"." * 200, timestamp_us=1000 + i)
        log.tiering.close()
        log.tiering.run_once()
        end = log.info()["streams"]["s"]["partitions"][0]["remote_committed_offset"]
        assert end == log._partition("s", 0).state.segments[-1].base_offset > 0
    store = S3Store.from_url(url, s3_server.storage_options, environ={})
    latest = manifest.latest(store)
    assert latest.partitions["s/0"].committed_end == end
    first = latest.partitions["s/0"].segments[0]
    with streamlog.open_log(tmp_path / "log", readonly=True) as log:
        local = log._partition("s", 0).state.segments[0]
        assert store.get(first.key) == local.read(0, local.size_bytes)


@pytest.mark.xdist_group("s3")
def test_a_daemon_serves_a_tiered_log(tmp_path, s3_server, monkeypatch):
    import json
    import subprocess
    import sys
    import streamlog
    from streamlog.testing.serve import ServeProcess
    for name, value in s3_server.env.items():  # the daemon finds the store as a user's
        monkeypatch.setenv(name, value)
    url = s3_server.url(s3_server.new_prefix())
    daemon = ServeProcess(tmp_path / "log", "--remote", url, "--remote-max-lag-s", "1",
                          token="t")
    try:
        with streamlog.open_log(daemon.url, token="t") as log:
            log.create_stream("s")
            log.append_batch_sync("s", [b"%d" % i for i in range(10)])
        store = S3Store.from_url(url, s3_server.storage_options, environ={})
        deadline = time.monotonic() + 30
        while True:  # the idle segment seals after 1 s and goes up
            latest = manifest.latest(store)
            if latest is not None and latest.partitions.get("s/0") and (
                    latest.partitions["s/0"].committed_end == 10):
                break
            assert time.monotonic() < deadline, f"not in the store: {latest}"
            time.sleep(0.2)
        shown = subprocess.run([sys.executable, "-m", "streamlog", "info", daemon.url,
                                "--json"], capture_output=True, text=True,
                               env={**os.environ, "STREAMLOG_TOKEN": "t"}, check=True)
        (part,) = json.loads(shown.stdout)["streams"]["s"]["partitions"]
        assert part["remote_committed_offset"] == 10
    finally:
        daemon.stop()


READ_ELSEWHERE = """
import json, os, sys, streamlog
os.chdir(sys.argv[2])  # an empty directory: nothing local to lean on
with streamlog.open_log(sys.argv[1]) as log:
    out = {"records": [[r.offset, r.timestamp_us, r.value.hex()]
                       for n in range(2) for r in log.reader("s", n)],
           "seeks": [log.offset_for_timestamp("s", n, t)
                     for n in range(2) for t in range(900, 1700, 3)],
           "committed": [r.value.hex() for r in log.reader("s", 0, read_committed=True)],
           "marker": log.last_commit("s", 0, "q").hex(),
           "info": log.info()["remote"]["generation"]}
print(json.dumps(out))
"""


@pytest.mark.xdist_group("s3")
def test_another_process_with_no_local_state_reads_the_log_from_the_real_store(
        tmp_path, s3_server):
    """DESIGN 11: readers anywhere. A second process, in an empty directory, with only
    the URL and the AWS variables, reads what the store has exactly as the writer's
    local log does: records, seeks by time (timestamps going back now and then),
    read_committed and the commit marker."""
    import json
    import subprocess
    import sys
    import streamlog
    url = s3_server.url(s3_server.new_prefix())
    with streamlog.open_log(tmp_path / "log", remote=url,
                            storage_options=s3_server.storage_options,
                            segment_bytes_max=4096, fsync="never") as log:
        log.tiering.close()
        log.create_stream("s", 2)
        txn = log.new_txn_id()
        log.append_batch_sync("s", [b"t1", b"t2"], partition=0, txn_id=txn)
        log.commit_txn("s", 0, txn, tag="q", marker=b"batch 3")
        for i in range(300):
            log.append_sync("s", b"%05d" % i + b"." * 100, partition=i % 2,
                            timestamp_us=1000 + 2 * i - (30 if i % 7 == 3 else 0))
        log.tiering.run_once()
        ends = [log.info()["streams"]["s"]["partitions"][n]["remote_committed_offset"]
                for n in range(2)]
        expected = {
            "records": [[r.offset, r.timestamp_us, r.value.hex()] for n in range(2)
                        for r in log.reader("s", n, to_offset=ends[n])],
            "seeks": [min(log.offset_for_timestamp("s", n, t), ends[n])
                      for n in range(2) for t in range(900, 1700, 3)],
            "committed": [r.value.hex() for r in log.reader("s", 0, to_offset=ends[0])],
            "marker": b"batch 3".hex(), "info": log.info()["remote"]["generation"]}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run([sys.executable, "-c", READ_ELSEWHERE, url, str(elsewhere)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **s3_server.env})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == expected
    assert all(end > 0 for end in ends) and os.listdir(elsewhere) == []


@pytest.mark.xdist_group("s3")
def test_a_deleted_directory_is_restored_from_the_real_store(tmp_path, s3_server):
    """The machine's disk is gone (its directory deleted): a writable open continues
    from the store with every record the store had, at its offset, and reports the
    tail the store lacked; appends go on from the store's end."""
    import shutil
    import streamlog
    url = s3_server.url(s3_server.new_prefix())
    options = dict(remote=url, storage_options=s3_server.storage_options,
                   segment_bytes_max=4096, fsync="never")
    with streamlog.open_log(tmp_path / "log", **options) as log:
        log.tiering.close()
        log.create_stream("s", 2)
        for i in range(400):
            log.append_sync("s", b"%05d" % i + b"." * 100, partition=i % 2,
                            timestamp_us=1000 + i)
        log.tiering.run_once()
        ends = [log.info()["streams"]["s"]["partitions"][n]["remote_committed_offset"]
                for n in range(2)]
        had = [[(r.offset, r.timestamp_us, r.value) for r in log.reader("s", n, to_offset=ends[n])]
               for n in range(2)]
        local_ends = [log.end_offset("s", n) for n in range(2)]
    shutil.rmtree(tmp_path / "log")
    with streamlog.open_log(tmp_path / "log", **options) as log:
        assert [[(r.offset, r.timestamp_us, r.value) for r in log.reader("s", n)]
                for n in range(2)] == had
        assert log.info()["restored"]["lost"] == {
            f"s/{n}": [ends[n], local_ends[n]] for n in range(2) if local_ends[n] > ends[n]}
        assert log.append_sync("s", b"after", partition=0).offset == ends[0]


@pytest.mark.xdist_group("s3")
def test_retention_and_truncate_through_generations_on_the_real_store(tmp_path, s3_server):
    """Retention moves the store's start and truncate_after cuts its copy, each in a new
    generation; a reader of the store then reads what the local log reads, and the
    dropped objects are deleted after the grace period."""
    import streamlog
    url = s3_server.url(s3_server.new_prefix())
    with streamlog.open_log(tmp_path / "log", remote=url, durability="remote",
                            storage_options=s3_server.storage_options, fsync="never",
                            segment_bytes_max=4096, retention_bytes=10_000,
                            remote_grace_s=0.5) as log:
        log.create_stream("s")
        for i in range(400):
            log.append_sync("s", b"%05d" % i + b"." * 60, timestamp_us=1000 + i)
        log.tiering.run_once()
        assert log.apply_retention()
        log.truncate_after("s", 0, 350)
        expected = [(r.offset, r.value) for r in log.reader("s", 0)]
        start = log.start_offset("s", 0)
        with streamlog.open_log(url, storage_options=s3_server.storage_options) as view:
            assert view.start_offset("s", 0) == start > 0
            assert [(r.offset, r.value) for r in view.reader("s", 0)] == expected
            assert view.offset_for_timestamp("s", 0, 1000) == start
        store = S3Store.from_url(url, s3_server.storage_options, environ={})
        dropped = [key for key, _ in manifest.latest(store).garbage]
        assert dropped
        time.sleep(0.6)
        log.tiering.run_once()
        remaining = {meta.key for meta in store.list()}
        base = log.tiering.manifest.based_on  # generations the current chain passes
        in_chain = {key for key in dropped  # through stay until a snapshot is past them
                    if (manifest.generation_of(key) or -1) >= base}
        assert set(dropped) - in_chain and not (set(dropped) - in_chain) & remaining
