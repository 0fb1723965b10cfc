"""The command line on a log in an object store (`streamlog COMMAND s3://BUCKET/PREFIX`),
run as a subprocess against the real S3 endpoint the suite starts (the `s3_server`
fixture of tests/conftest.py: Ceph's RADOS Gateway on loopback).

A log is tiered to the store in this process (its sealed segments uploaded by hand,
`log.tiering.run_once()`); the commands see it as another machine would, with only the
URL and the AWS_* variables: `read` gives what the local log gives up to the store's
committed end, by offset and by time, and follows new generations; `info` shows the
manifest generation and the remote committed offsets; `verify` and `dump` walk every
frame of every segment object and judge damage as they judge the same bytes locally.
Commands that write refuse the URL; a store that cannot be reached, or refuses the
credentials, is one line and exit 3.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
import time

import pytest

import streamlog
from streamlog.remote import manifest
from streamlog.remote.s3 import S3Store
from streamlog.scan import scan_buffer

pytestmark = pytest.mark.xdist_group("s3")

RECORDS = 300
PARTITIONS = 2


@dataclasses.dataclass
class Tiered:
    """A local log tiered to the store at `url`: `ends[n]` is what the store holds of
    partition n (exclusive), `local_ends[n]` what the local log holds."""

    path: str
    url: str
    ends: list[int]
    local_ends: list[int]


def timestamp_of(i: int) -> int:
    """Mostly increasing, with a late record now and then (the high-water-mark rule)."""
    return 1_000_000 + 2 * i - (30 if i % 7 == 3 else 0)


def append_records(log, first: int, count: int) -> None:
    for i in range(first, first + count):
        log.append_sync("s", b"%05d" % i + b"." * 100, partition=i % PARTITIONS,
                        key=None if i % 5 == 0 else b"k%d" % (i % 11),
                        headers=[("h", b"\xff\x00")] if i % 13 == 0 else None,
                        timestamp_us=timestamp_of(i))


def make_tiered(path, s3_server) -> Tiered:
    url = s3_server.url(s3_server.new_prefix())
    with streamlog.open_log(path, remote=url, storage_options=s3_server.storage_options,
                            segment_bytes_max=4096, fsync="never") as log:
        log.tiering.close()  # uploads by hand, so the test knows what the store holds
        log.create_stream("s", PARTITIONS)
        append_records(log, 0, RECORDS)
        log.tiering.run_once()
        parts = log.info()["streams"]["s"]["partitions"]
    ends = [part["remote_committed_offset"] for part in parts]
    local_ends = [part["end_offset"] for part in parts]
    # Something is in the store, and something is not yet: reads must stop at the store.
    assert all(0 < end < local for end, local in zip(ends, local_ends)), (ends, local_ends)
    return Tiered(str(path), url, ends, local_ends)


@pytest.fixture(scope="module")
def tiered(s3_server, tmp_path_factory) -> Tiered:
    """One tiered log the read-only tests share (none of them changes it)."""
    return make_tiered(tmp_path_factory.mktemp("cli-store") / "log", s3_server)


def cli(*args, env, stdin: bytes = b"", cwd=None, timeout: float = 120):
    return subprocess.run([sys.executable, "-m", "streamlog", *map(str, args)],
                          input=stdin, capture_output=True, env=env, cwd=cwd,
                          timeout=timeout)


def store_env(s3_server, **changes) -> dict:
    return {**os.environ, **s3_server.env, "STREAMLOG_PROGRESS": "0", **changes}


def local_env() -> dict:
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("AWS_")}
    return {**env, "STREAMLOG_PROGRESS": "0"}


def assert_one_line_error(done, code: int, *fragments: str) -> str:
    err = done.stderr.decode()
    assert done.returncode == code, (done.returncode, err)
    assert err.startswith("streamlog: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    assert done.stdout == b""
    return err


def lines_of(out: bytes) -> list[dict]:
    return [json.loads(line) for line in out.splitlines()]


def store_of(s3_server, url: str) -> S3Store:
    return S3Store.from_url(url, s3_server.storage_options, environ={})


# -- read ----------------------------------------------------------------------------------

def test_read_gives_what_the_local_log_gives_up_to_the_stores_committed_end(tiered,
                                                                           s3_server):
    env = store_env(s3_server)
    for number in range(PARTITIONS):
        remote = cli("read", tiered.url, "--stream", "s", "--partition", number, env=env)
        local = cli("read", tiered.path, "--stream", "s", "--partition", number,
                    "--to-offset", tiered.ends[number], env=local_env())
        assert remote.returncode == 0 and local.returncode == 0, remote.stderr
        assert remote.stderr == b""
        assert remote.stdout == local.stdout
        records = lines_of(remote.stdout)
        assert [r["offset"] for r in records] == list(range(tiered.ends[number]))
        assert any("headers_b64" in r for r in records) and any(r["key"] is None
                                                                 for r in records)
    # Every partition, one after another, as a local log is read.
    both = cli("read", tiered.url, "--stream", "s", env=env)
    assert both.returncode == 0
    assert len(lines_of(both.stdout)) == sum(tiered.ends)


def test_read_by_time_follows_the_high_water_mark_as_locally(tiered, s3_server):
    env = store_env(s3_server)
    with streamlog.open_log(tiered.path, readonly=True) as log:
        end = tiered.ends[0]
        inside = [t for t in range(timestamp_of(0), timestamp_of(RECORDS), 7)
                  if log.offset_for_timestamp("s", 0, t) < end - 3]
    start, stop = inside[len(inside) // 4], inside[-1]
    compared = 0
    for bounds in (["--from-timestamp", start, "--to-timestamp", stop],
                   ["--from-timestamp", start]):
        remote = cli("read", tiered.url, "--stream", "s", "--partition", 0, *bounds,
                     env=env)
        # Locally, the records past the store's end are there too: stop at that end.
        tail = [] if "--to-timestamp" in bounds else ["--to-offset", end]
        local = cli("read", tiered.path, "--stream", "s", "--partition", 0, *bounds,
                    *tail, env=local_env())
        assert remote.returncode == local.returncode == 0, remote.stderr
        assert remote.stdout == local.stdout and remote.stdout
        compared += len(lines_of(remote.stdout))
    assert compared > 0
    # A late record (its timestamp below the high-water mark) is kept in order.
    records = lines_of(cli("read", tiered.url, "--stream", "s", "--partition", 0,
                           "--from-timestamp", start, env=env).stdout)
    assert [r["offset"] for r in records] == list(range(records[0]["offset"], end))
    assert any(b["timestamp"] < a["timestamp"] for a, b in zip(records, records[1:]))


def append_batches(log, first: int, count: int) -> None:
    """`count` records of 200 random bytes (nothing for zstd to save), 5 to a frame, so
    that segments of 4 KiB roll, seal and go up."""
    for start in range(first, first + count, 5):
        log.append_batch_sync("s", [random.Random(i).randbytes(200)
                                    for i in range(start, start + 5)])


def test_read_follow_waits_for_the_log_and_takes_in_new_generations(tmp_path, s3_server):
    """`read --follow` on a URL where no log is yet waits for it, then reads each new
    manifest generation as the writer's uploads commit it, up to --to-offset."""
    url = s3_server.url(s3_server.new_prefix())
    stop = 60
    follower = subprocess.Popen(
        [sys.executable, "-m", "streamlog", "read", url, "--stream", "s", "--follow",
         "--to-offset", str(stop)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=store_env(s3_server))
    try:
        time.sleep(1.5)  # it is waiting for the log
        assert follower.poll() is None
        with streamlog.open_log(tmp_path / "log", remote=url,
                                storage_options=s3_server.storage_options,
                                segment_bytes_max=4096, fsync="never") as log:
            log.tiering.close()
            log.create_stream("s", 1)
            append_batches(log, 0, 40)
            log.tiering.run_once()
            first_end = log.info()["streams"]["s"]["partitions"][0][
                "remote_committed_offset"]
            assert 0 < first_end < stop
            time.sleep(2.5)  # it reads what that generation holds, and polls on
            assert follower.poll() is None
            append_batches(log, 40, 40)
            log.tiering.run_once()
            assert log.info()["streams"]["s"]["partitions"][0][
                "remote_committed_offset"] >= stop
        out, err = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate()
    assert follower.returncode == 0, err
    said = err.decode().splitlines()
    assert said[0] == f"streamlog: waiting for the log {url} to be created (--follow)"
    # The writer makes the log before its stream: a poll in between sees the one without
    # the other, and says so once.
    assert said[1:] in ([], ["streamlog: waiting for the stream 's' to be created (--follow)"])
    assert [r["offset"] for r in lines_of(out)] == list(range(stop))


# -- info ----------------------------------------------------------------------------------

def test_info_json_shows_the_generation_and_the_remote_committed_offsets(tiered,
                                                                        s3_server):
    done = cli("info", tiered.url, "--json", env=store_env(s3_server))
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    latest = manifest.latest(store_of(s3_server, tiered.url))
    assert shown["path"] == tiered.url
    assert shown["remote"]["url"] == tiered.url
    assert shown["remote"]["generation"] == latest.generation > 0
    assert shown["remote"]["epoch"] == latest.epoch and shown["remote"]["error"] is None
    parts = shown["streams"]["s"]["partitions"]
    assert [p["remote_committed_offset"] for p in parts] == tiered.ends
    assert [p["end_offset"] for p in parts] == tiered.ends  # the store's end, not local
    assert [p["remote_lag_records"] for p in parts] == [0] * PARTITIONS
    assert [p["segments"] for p in parts] == [
        len(latest.partitions[f"s/{n}"].segments) for n in range(PARTITIONS)]
    assert [p["tail"] for p in parts] == ["clean"] * PARTITIONS


def test_info_table_has_the_remote_columns_and_the_generation(tiered, s3_server):
    done = cli("info", tiered.url, env=store_env(s3_server))
    assert done.returncode == 0, done.stderr
    text = done.stdout.decode()
    generation = manifest.latest(store_of(s3_server, tiered.url)).generation
    head, store_line, titles, *rows = text.splitlines()
    assert head == f"log {tiered.url}: 1 stream"
    assert store_line.startswith(f"store {tiered.url}: manifest generation {generation}, "
                                 f"epoch ")
    columns = titles.split("  ")
    for title in ("REMOTE END", "LAG", "LAG BYTES", "GEN"):
        assert title in columns, titles
    for number, row in enumerate(rows[:PARTITIONS]):
        cells = row.split()
        # STREAM PART START END REMOTE-END LAG LAG-BYTES GEN ...
        assert cells[:8] == ["s", str(number), "0", str(tiered.ends[number]),
                             str(tiered.ends[number]), "0", "0", str(generation)], row
    # A local log without a store has none of it.
    local = cli("info", tiered.path, env=local_env()).stdout.decode()
    assert "REMOTE END" not in local and "manifest generation" not in local


# -- verify and dump -----------------------------------------------------------------------

def test_verify_passes_on_a_clean_store(tiered, s3_server):
    env = store_env(s3_server)
    done = cli("verify", tiered.url, "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""
    summary = json.loads(done.stdout)
    latest = manifest.latest(store_of(s3_server, tiered.url))
    segments = [s for n in range(PARTITIONS) for s in latest.partitions[f"s/{n}"].segments]
    assert summary["result"] == "ok" and summary["findings"] == []
    assert summary["partitions"] == PARTITIONS and summary["segments"] == len(segments)
    assert summary["records"] == sum(tiered.ends)
    # Every frame of every object was walked (no seal stands in for them in the store).
    assert summary["bytes"] == summary["bytes_walked"] == sum(s.size for s in segments)
    assert summary["bytes_sealed"] == 0 and summary["frames"] > len(segments)
    assert [d["index"] for d in summary["details"]] == ["confirmed"] * PARTITIONS
    text = cli("verify", tiered.url, "--strict", env=env)
    assert text.returncode == 0 and text.stdout.decode().endswith(": ok\n")


def flip_bit(data: bytes, position: int) -> bytes:
    return data[:position] + bytes([data[position] ^ 0x10]) + data[position + 1:]


def frame_holding(data: bytes, base_offset: int, position: int):
    (frame,) = [f for f in scan_buffer(data, 0, expect_offset=base_offset).frames
                if f.position <= position < f.end_position]
    return frame


def verify_findings(log, env) -> tuple[int, list[dict], str]:
    done = cli("verify", log, "--json", env=env)
    assert "Traceback" not in done.stderr.decode()
    return done.returncode, json.loads(done.stdout)["findings"], done.stderr.decode()


def test_verify_finds_a_flipped_bit_in_a_segment_object_as_locally(tmp_path, s3_server):
    """A bit flipped in the middle segment object of partition 0: verify names the
    object and the frame's position and offset, exit 1; the same bit flipped in the
    local segment file gives the same finding."""
    log = make_tiered(tmp_path / "log", s3_server)
    store = store_of(s3_server, log.url)
    segments = manifest.latest(store).partitions["s/0"].segments
    assert len(segments) >= 3
    segment = segments[len(segments) // 2]
    original = store.get(segment.key)
    position = len(original) // 2
    frame = frame_holding(original, segment.base_offset, position)
    store.put(segment.key, flip_bit(original, position))  # damage, as a disk might
    local_path = os.path.join(log.path, "streams", "s", "0", f"{segment.base_offset:020d}.log")
    with open(local_path, "rb") as file:
        assert file.read() == original  # the object is the local file, byte for byte
    with open(local_path, "r+b") as file:
        file.seek(position)
        file.write(bytes([original[position] ^ 0x10]))

    code, findings, err = verify_findings(log.url, store_env(s3_server))
    object_url = f"{log.url}/{segment.key}"
    assert code == 1, err
    assert [(f["kind"], f["path"], f["position"], f["offset"]) for f in findings] == [
        ("corrupt", object_url, frame.position, frame.base_offset)]
    assert (f"error: mid-log corruption in segment {object_url} at position "
            f"{frame.position} (offset {frame.base_offset})") in err
    local_code, local_findings, _ = verify_findings(log.path, local_env())
    assert local_code == 1
    assert [(f["kind"], f["position"], f["offset"], f["reason"]) for f in local_findings] \
        == [(f["kind"], f["position"], f["offset"], f["reason"]) for f in findings]
    # The text form says the same on stderr, and the summary on stdout.
    text = cli("verify", log.url, env=store_env(s3_server))
    assert text.returncode == 1
    assert text.stdout.decode().endswith(": 1 corrupt, 0 torn: corrupt\n")
    assert f"segment {object_url} at position {frame.position}" in text.stderr.decode()


def test_verify_judges_damage_in_the_last_object_durable_not_a_torn_tail(tmp_path,
                                                                        s3_server):
    """The store holds only committed data: a flipped bit in the very last frame of
    the last segment object is damage (exit 1), never a torn tail a writer would cut."""
    log = make_tiered(tmp_path / "log", s3_server)
    store = store_of(s3_server, log.url)
    last = manifest.latest(store).partitions["s/1"].segments[-1]
    original = store.get(last.key)
    frames = scan_buffer(original, 0, expect_offset=last.base_offset).frames
    position = frames[-1].end_position - 3  # in the last frame's payload
    store.put(last.key, flip_bit(original, position))
    code, findings, err = verify_findings(log.url, store_env(s3_server))
    assert code == 1, err
    assert [(f["kind"], f["path"], f["position"], f["offset"]) for f in findings] == [
        ("damaged", f"{log.url}/{last.key}", frames[-1].position, frames[-1].base_offset)]
    # A read-only open serves the partition up to the damaged durable frame, as it
    # does a local log's (and says so in info's TAIL): `read` gives what is before it.
    env = store_env(s3_server)
    done = cli("read", log.url, "--stream", "s", "--partition", 1, env=env)
    assert done.returncode == 0, done.stderr
    assert [r["offset"] for r in lines_of(done.stdout)] == list(
        range(frames[-1].base_offset))
    (part,) = [p for p in json.loads(cli("info", log.url, "--json", env=env).stdout)[
        "streams"]["s"]["partitions"] if p["partition"] == 1]
    assert part["tail"] == "damaged" and part["end_offset"] == frames[-1].base_offset
    assert f"at position {frames[-1].position}" in part["corruption"]


def test_dump_names_the_segment_objects(tiered, s3_server):
    done = cli("dump", tiered.url, "--stream", "s", "--partition", 1, "--json",
               env=store_env(s3_server))
    assert done.returncode == 0, done.stderr
    items = lines_of(done.stdout)
    frames, verdict = items[:-1], items[-1]
    segments = manifest.latest(store_of(s3_server, tiered.url)).partitions["s/1"].segments
    assert sorted({f["segment"] for f in frames}) == [f"{tiered.url}/{s.key}"
                                                     for s in segments]
    assert all(f["checksum_ok"] for f in frames)
    assert sum(f["count"] for f in frames) == tiered.ends[1]
    assert verdict == {"kind": "verdict", "stream": "s", "partition": 1,
                       "verdict": "clean", "index": "confirmed"}


# -- what a URL cannot do, and a store that does not answer -------------------------------

@pytest.mark.parametrize("argv", [
    ["append", "{url}", "--stream", "s"],
    ["repair", "{url}"],
    ["repair", "{url}", "--dry-run"],
    ["serve", "{url}"],
    ["verify", "{url}", "--record"],
])
def test_commands_that_write_refuse_a_store_url(argv, tiered, s3_server, tmp_path):
    env = store_env(s3_server, STREAMLOG_TOKEN="t")
    generation = manifest.latest(store_of(s3_server, tiered.url)).generation
    done = cli(*[a.format(url=tiered.url) for a in argv], env=env, cwd=tmp_path,
               stdin=b'{"value": "x"}\n', timeout=60)
    err = assert_one_line_error(done, 2, tiered.url)
    assert "read-only here" in err
    assert os.listdir(tmp_path) == []  # no "s3:" directory was made for it
    assert manifest.latest(store_of(s3_server, tiered.url)).generation == generation


def test_a_store_url_with_no_log_is_a_usage_error(s3_server, tmp_path):
    url = s3_server.url(s3_server.new_prefix())
    for argv in (["info", url], ["read", url, "--stream", "s"], ["verify", url],
                 ["dump", url]):
        done = cli(*argv, env=store_env(s3_server), cwd=tmp_path)
        assert_one_line_error(done, 2, f"no log at {url}")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("command", ["info", "verify"])  # (the store retries ~10 s)
def test_an_unreachable_store_is_one_line_and_exit_3(command, s3_server, tmp_path):
    url = s3_server.url(s3_server.new_prefix())
    env = store_env(s3_server, AWS_ENDPOINT_URL="http://127.0.0.1:1")
    started = time.monotonic()
    done = cli(command, url, env=env, cwd=tmp_path, timeout=180)
    assert_one_line_error(done, 3, f"cannot reach the object store of {url}")
    assert time.monotonic() - started < 120  # the store's retries end
    assert os.listdir(tmp_path) == []


def test_a_store_that_refuses_the_credentials_is_exit_3(tiered, s3_server):
    env = store_env(s3_server, AWS_SECRET_ACCESS_KEY="not-the-secret")
    done = cli("info", tiered.url, env=env)
    assert_one_line_error(done, 3, f"the object store of {tiered.url} refused the request",
                          "403")
