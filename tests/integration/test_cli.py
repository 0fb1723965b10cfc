"""The `streamlog` command line, run as a subprocess on real directories (DESIGN 10).

Each test drives `python -m streamlog.cli` the way a user or a script would and checks
stdout, stderr (one line, no traceback) and the exit code. Logs that a test only needs
as input are built with the library in-process and closed before the CLI runs.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import queue
import subprocess
import sys
import threading

import pytest

import streamlog
from streamlog.check import segment_events
from streamlog.cli import parse_append_line, parse_timestamp
from streamlog.fileio import OsFileIO
from streamlog.segment import Segment

pytestmark = pytest.mark.slow

REPO = pathlib.Path(__file__).resolve().parents[2]
ENV = {**{k: v for k, v in os.environ.items() if k != "STREAMLOG_TOKEN"},
       "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
US_2024 = 1704067200000000  # 2024-01-01T00:00:00Z in microseconds


def cli(*args, stdin: str | bytes | None = None, timeout: float = 60):
    """Run the CLI; returns CompletedProcess with text stdout and stderr."""
    data = stdin.encode() if isinstance(stdin, str) else stdin
    done = subprocess.run([sys.executable, "-m", "streamlog.cli", *map(str, args)],
                          input=data, capture_output=True, timeout=timeout, env=ENV)
    done.stdout, done.stderr = done.stdout.decode(), done.stderr.decode()
    return done


def jsonl(items) -> str:
    return "".join(json.dumps(item) + "\n" for item in items)


def lines_of(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def assert_one_line_error(done, code: int, *fragments: str) -> None:
    assert done.returncode == code, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("streamlog: error: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def read_all(log_dir, *extra) -> list[dict]:
    done = cli("read", log_dir, "--stream", "s", *extra)
    assert done.returncode == 0, done.stderr
    return lines_of(done.stdout)


def build_log(log_dir, batches, *, partitions=1, stream="s", **options) -> None:
    """Each item of `batches` is (values, timestamps) appended as one batch to p0."""
    with streamlog.open_log(log_dir, fsync="never", **options) as log:
        log.create_stream(stream, partitions)
        for values, timestamps in batches:
            log.append_batch_sync(stream, values, timestamps_us=timestamps, partition=0)


def segment_path(log_dir, stream="s", partition=0, base=0) -> pathlib.Path:
    return pathlib.Path(log_dir, "streams", stream, str(partition), f"{base:020d}.log")


# -- append and read ---------------------------------------------------------------------

def test_append_then_read_round_trip(log_dir):
    records = [
        {"value": "plain", "timestamp": 5},
        {"value": "with key", "key": "user-1", "timestamp": "2024-01-01T00:00:00"},
        {"value_b64": base64.b64encode(b"\xff\x00bin").decode(), "key_b64":
            base64.b64encode(b"\x80k").decode(), "timestamp": "2024-01-01T01:00:00+01:00"},
        {"value": "zulu", "timestamp": "2024-01-01T00:00:00.000250Z", "partition": 0},
        {"value": "caf\u00e9 \u2603", "key": None, "timestamp": 7},
    ]
    done = cli("append", log_dir, "--stream", "s", stdin=jsonl(records))
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert json.loads(done.stdout) == {"stream": "s", "records": 5, "partitions": {"0": [0, 4]}}
    out = read_all(log_dir)
    assert [r["offset"] for r in out] == [0, 1, 2, 3, 4]
    assert all(r["stream"] == "s" and r["partition"] == 0 for r in out)
    assert [r["timestamp"] for r in out] == [5, US_2024, US_2024, US_2024 + 250, 7]
    assert out[0] == {"stream": "s", "partition": 0, "offset": 0, "timestamp": 5,
                      "key": None, "value": "plain"}
    assert out[1]["key"] == "user-1" and out[1]["value"] == "with key"
    # Bytes that are not UTF-8 come back as base64, in place of the text field.
    assert "value" not in out[2] and "key" not in out[2]
    assert base64.b64decode(out[2]["value_b64"]) == b"\xff\x00bin"
    assert base64.b64decode(out[2]["key_b64"]) == b"\x80k"
    assert out[4]["value"] == "caf\u00e9 \u2603" and out[4]["key"] is None
    # A second append continues the offsets and the reported range says so.
    done = cli("append", log_dir, "--stream", "s", stdin=jsonl([{"value": "more"}]))
    assert json.loads(done.stdout)["partitions"] == {"0": [5, 5]}


def test_append_routes_by_partition_key_and_round_robin(log_dir):
    keys = [f"key-{i}" for i in range(12)]
    records = [{"value": f"k{i}", "key": key} for i, key in enumerate(keys)]
    records += [{"value": f"r{i}"} for i in range(6)]
    records += [{"value": "pinned", "key": keys[0], "partition": 2}]
    done = cli("append", log_dir, "--stream", "s", "--partitions", "3", stdin=jsonl(records))
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["records"] == len(records)
    out = read_all(log_dir)
    where = {r["value"]: r["partition"] for r in out}
    for i, key in enumerate(keys):
        assert where[f"k{i}"] == streamlog.partition_for_key(key.encode(), 3)
    assert [where[f"r{i}"] for i in range(6)] == [0, 1, 2, 0, 1, 2]
    assert where["pinned"] == 2
    # Without --partition: every partition, each in offset order, partitions in order.
    assert [r["partition"] for r in out] == sorted(r["partition"] for r in out)
    for p in range(3):
        offsets = [r["offset"] for r in out if r["partition"] == p]
        assert offsets == list(range(len(offsets)))
        assert summary["partitions"][str(p)] == [0, len(offsets) - 1]
    assert {r["value"] for r in read_all(log_dir, "--partition", "1")} == {
        v for v, p in where.items() if p == 1}


def test_malformed_line_stops_append_after_the_lines_before_it(log_dir):
    text = jsonl([{"value": "one"}, {"value": "two"}]) + '{"value": "three"\n' + jsonl(
        [{"value": "four"}])
    done = cli("append", log_dir, "--stream", "s", stdin=text)
    assert_one_line_error(done, 2, "line 3", "JSON")
    assert json.loads(done.stdout) == {"stream": "s", "records": 2, "partitions": {"0": [0, 1]}}
    assert [r["value"] for r in read_all(log_dir)] == ["one", "two"]


def test_malformed_line_number_counts_blank_lines_and_later_chunks(log_dir):
    # 5000 good lines (more than one chunk), a blank line, then a bad one at line 5002.
    text = jsonl({"value": str(i)} for i in range(5000)) + "\n" + '{"value_b64": "@@"}\n'
    text += jsonl([{"value": "after"}])
    done = cli("append", log_dir, "--stream", "s", "--partitions", "2", stdin=text)
    assert_one_line_error(done, 2, "line 5002", "base64")
    assert json.loads(done.stdout)["records"] == 5000
    values = [r["value"] for r in read_all(log_dir)]
    assert sorted(values, key=int) == [str(i) for i in range(5000)]


@pytest.mark.parametrize("line, fragment", [
    (b'[1, 2]', "JSON object"),
    (b'{"key": "k"}', "no value"),
    (b'{"value": "a", "value_b64": "YQ=="}', "not both"),
    (b'{"value": 5}', "value must be a string"),
    (b'{"value": "a", "timestamp": 1.5}', "timestamp"),
    (b'{"value": "a", "timestamp": "yesterday"}', "ISO-8601"),
    (b'{"value": "a", "partition": 3}', "partition 3"),
    (b'{"value": "a", "partition": true}', "partition"),
    (b'{"value": "a", "colour": "red"}', "unknown field"),
    (b'{"value": "\xff"}', "UTF-8"),
    (b'{"value": "a", "key_b64": "not base64!"}', "key_b64"),
])
def test_parse_append_line_rejects_malformed_records(line, fragment):
    with pytest.raises(ValueError, match=fragment):
        parse_append_line(line, 3, 1024)


def test_parse_append_line_accepts_read_output_and_checks_size():
    line = b'{"stream": "x", "partition": 1, "offset": 9, "timestamp": 3, "key": null, "value": "v"}'
    assert parse_append_line(line, 2, 1024) == (b"v", None, 3, 1)
    with pytest.raises(ValueError, match="limit is 4"):
        parse_append_line(b'{"value": "12345"}', 1, 4)


def test_parse_timestamp_forms():
    assert parse_timestamp("123") == 123
    assert parse_timestamp("-5") == -5
    assert parse_timestamp("2024-01-01T00:00:00") == US_2024
    assert parse_timestamp("2024-01-01T00:00:00Z") == US_2024
    assert parse_timestamp("2024-01-01T02:00:00.5+02:00") == US_2024 + 500000
    with pytest.raises(ValueError):
        parse_timestamp("99999999999999999999")


def test_partitions_mismatch_is_a_usage_error(log_dir):
    assert cli("append", log_dir, "--stream", "s", "--partitions", "2",
               stdin=jsonl([{"value": "a"}])).returncode == 0
    done = cli("append", log_dir, "--stream", "s", "--partitions", "3",
               stdin=jsonl([{"value": "b"}]))
    assert_one_line_error(done, 2, "2 partitions", "--partitions 3")
    assert [r["value"] for r in read_all(log_dir)] == ["a"]
    # Leaving --partitions out uses the stream's count.
    done = cli("append", log_dir, "--stream", "s", stdin=jsonl([{"value": "c", "partition": 1}]))
    assert done.returncode == 0 and json.loads(done.stdout)["partitions"] == {"1": [0, 0]}


def test_read_timestamp_bounds_follow_the_high_water_mark(log_dir):
    # Timestamps out of order, over two batches: running max 10 30 30 | 40 40 50.
    build_log(log_dir, [([b"a", b"b", b"c"], [10, 30, 20]), ([b"d", b"e", b"f"], [40, 25, 50])])

    def offsets(*bounds):
        return [r["offset"] for r in read_all(log_dir, *bounds)]

    assert offsets() == [0, 1, 2, 3, 4, 5]
    assert offsets("--from-timestamp", "25") == [1, 2, 3, 4, 5]  # keeps late 20 and 25
    assert offsets("--from-timestamp", "30") == [1, 2, 3, 4, 5]
    assert offsets("--from-timestamp", "31") == [3, 4, 5]
    assert offsets("--from-timestamp", "50") == [5]
    assert offsets("--from-timestamp", "51") == []
    assert offsets("--to-timestamp", "40") == [0, 1, 2]  # exclusive, by high-water mark
    assert offsets("--to-timestamp", "41") == [0, 1, 2, 3, 4]
    assert offsets("--to-timestamp", "10") == []
    assert offsets("--from-timestamp", "25", "--to-timestamp", "50") == [1, 2, 3, 4]
    assert offsets("--from-timestamp", "1970-01-01T00:00:00.000031Z") == [3, 4, 5]
    assert offsets("--from-timestamp", "1970-01-01T00:00:00.000031") == [3, 4, 5]
    assert offsets("--from-offset", "2", "--to-offset", "4") == [2, 3]
    assert offsets("--from-offset", "4", "--to-timestamp", "50") == [4]


def test_read_usage_errors(log_dir, tmp_path):
    build_log(log_dir, [([b"a"], [1])])
    missing = cli("read", tmp_path / "nothing-here", "--stream", "s")
    assert missing.returncode in (1, 2) and missing.stdout == ""
    assert_one_line_error(missing, missing.returncode, "nothing-here")
    assert_one_line_error(cli("read", log_dir, "--stream", "nope"), 2, "nope")
    assert_one_line_error(cli("read", log_dir, "--stream", "s", "--partition", "1"), 2,
                          "partitions 0..0")
    assert_one_line_error(cli("read", log_dir, "--stream", "s", "--from-offset", "1",
                              "--from-timestamp", "1"), 2, "--from-timestamp")
    assert_one_line_error(cli("read", log_dir, "--stream", "s", "--to-timestamp", "soon"),
                          2, "soon")
    # Past the end: nothing to print, as without --partition (and as Kafka does).
    past = cli("read", log_dir, "--stream", "s", "--partition", "0", "--from-offset", "5")
    assert (past.returncode, past.stdout, past.stderr) == (0, "", "")
    # A daemon URL without a token: refused before connecting, exit 3, nothing on stdout.
    daemon = cli("read", "streamlog://127.0.0.1:7541", "--stream", "s")
    assert_one_line_error(daemon, 3, "STREAMLOG_TOKEN")
    assert daemon.stdout == ""
    assert_one_line_error(cli("verify", "streamlog://127.0.0.1:7541"), 2,
                          "segment files directly")
    assert_one_line_error(cli("info", tmp_path), 2, "not a streamlog log")


def test_read_stops_quietly_when_stdout_closes(log_dir):
    build_log(log_dir, [([b"x" * 100] * 50000, [1] * 50000)])
    with subprocess.Popen([sys.executable, "-m", "streamlog.cli", "read", log_dir, "--stream",
                           "s"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env=ENV) as proc:
        first = proc.stdout.readline()
        proc.stdout.close()  # like `| head -1`
        stderr = proc.stderr.read().decode()
        code = proc.wait(timeout=30)
    assert json.loads(first)["offset"] == 0
    assert stderr == ""
    assert code == 141


# -- read --follow -----------------------------------------------------------------------

def _line_reader(stream) -> queue.Queue:
    lines: queue.Queue = queue.Queue()

    def pump():
        for line in iter(stream.readline, b""):
            lines.put(json.loads(line))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def test_read_follow_sees_records_appended_by_another_process(log_dir):
    assert cli("append", log_dir, "--stream", "s", stdin=jsonl([{"value": "old"}])).returncode == 0
    proc = subprocess.Popen([sys.executable, "-m", "streamlog.cli", "read", log_dir,
                             "--stream", "s", "--follow"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=ENV)
    try:
        lines = _line_reader(proc.stdout)
        assert lines.get(timeout=20)["value"] == "old"
        for batch in (["new-1", "new-2"], ["new-3"]):
            done = cli("append", log_dir, "--stream", "s",
                       stdin=jsonl({"value": v} for v in batch))
            assert done.returncode == 0, done.stderr
        seen = [lines.get(timeout=20) for _ in range(3)]
        assert [(r["offset"], r["value"]) for r in seen] == [
            (1, "new-1"), (2, "new-2"), (3, "new-3")]
        assert proc.poll() is None  # still following
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        proc.stdout.close()
        proc.stderr.close()


def test_read_follow_waits_for_the_from_timestamp_and_ends_at_the_to_bound(log_dir):
    assert cli("append", log_dir, "--stream", "s",
               stdin=jsonl([{"value": "early", "timestamp": 10}])).returncode == 0
    proc = subprocess.Popen([sys.executable, "-m", "streamlog.cli", "read", log_dir,
                             "--stream", "s", "--follow", "--from-timestamp", "100",
                             "--to-offset", "4"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=ENV)
    try:
        late = [{"value": "before", "timestamp": 50}, {"value": "reaches", "timestamp": 120},
                {"value": "late", "timestamp": 60}, {"value": "beyond", "timestamp": 130}]
        assert cli("append", log_dir, "--stream", "s", stdin=jsonl(late)).returncode == 0
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    # The start is the first record whose high-water mark reaches 100 (offset 2); the
    # late record after it is kept; --to-offset 4 ends the follow by itself.
    assert [(r["offset"], r["value"]) for r in lines_of(stdout.decode())] == [
        (2, "reaches"), (3, "late")]


def test_read_while_another_process_keeps_the_log_open_for_writing(log_dir):
    assert cli("append", log_dir, "--stream", "s", stdin=jsonl([{"value": "v0"}])).returncode == 0
    script = ("import sys, streamlog\n"
              "log = streamlog.open_log(sys.argv[1], fsync='never')\n"
              "for i in range(1, 4):\n"
              "    log.append_batch_sync('s', [b'v%d' % i])\n"
              "print('ready', flush=True)\n"
              "sys.stdin.readline()\n"
              "log.close()\n")
    writer = subprocess.Popen([sys.executable, "-c", script, log_dir], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env=ENV)
    try:
        assert writer.stdout.readline() == b"ready\n"
        done = cli("read", log_dir, "--stream", "s")
    finally:
        writer.communicate(b"\n", timeout=30)
    assert done.returncode == 0, done.stderr
    assert [r["value"] for r in lines_of(done.stdout)] == ["v0", "v1", "v2", "v3"]


# -- info and dump -----------------------------------------------------------------------

def test_info_table_and_json(log_dir):
    build_log(log_dir, [([b"a", b"b"], [US_2024 + 5, US_2024 + 3]), ([b"c"], [US_2024 + 9])],
              partitions=2)
    with streamlog.open_log(log_dir, fsync="never") as log:
        log.create_stream("other", 1)
    done = cli("info", log_dir, "--json")
    assert done.returncode == 0, done.stderr
    described = json.loads(done.stdout)
    parts = described["streams"]["s"]["partitions"]
    assert [p["partition"] for p in parts] == [0, 1]
    assert (parts[0]["start_offset"], parts[0]["end_offset"]) == (0, 3)
    assert (parts[1]["start_offset"], parts[1]["end_offset"]) == (0, 0)
    assert parts[0]["max_timestamp_us"] == US_2024 + 9
    assert parts[0]["max_time"] == "2024-01-01T00:00:00.000009Z"
    assert parts[0]["min_timestamp_us"] == US_2024 + 3
    assert parts[0]["segments"] == 1 and parts[0]["bytes"] == segment_path(log_dir).stat().st_size
    assert parts[0]["tail"] == "clean"
    assert parts[1]["min_timestamp_us"] is None
    assert described["streams"]["other"]["partitions"][0]["end_offset"] == 0
    table = cli("info", log_dir)
    assert table.returncode == 0
    rows = table.stdout.splitlines()
    assert "2 streams" in rows[0]
    assert rows[1].split()[:4] == ["STREAM", "PART", "START", "END"]
    assert rows[2].split()[:4] == ["other", "0", "0", "0"]
    assert rows[3].split()[:7] == ["s", "0", "0", "3", "1", str(parts[0]["bytes"]), "clean"]
    assert "2024-01-01T00:00:00.000009Z" in rows[3] and str(US_2024 + 9) in rows[3]


def test_dump_lists_every_frame_and_record(log_dir):
    build_log(log_dir, [([b"a", b"b"], [5, 3]), ([b"\xff"], [9]), ([b"d"] * 3, [1, 2, 3])])
    done = cli("dump", log_dir, "--json", "--records")
    verdicts = [line for line in lines_of(done.stdout) if line.get("kind") == "verdict"]
    assert [v["verdict"] for v in verdicts] == ["clean"] * len(verdicts) and verdicts
    assert done.returncode == 0, done.stderr
    frames = [line for line in lines_of(done.stdout) if line.get("kind") != "verdict"]
    assert [(f["base_offset"], f["last_offset"], f["count"]) for f in frames] == [
        (0, 1, 2), (2, 2, 1), (3, 5, 3)]
    assert all(f["checksum_ok"] and f["codec"] in ("none", "zstd") for f in frames)
    assert frames[0]["position"] == 0
    assert frames[0]["segment"] == str(segment_path(log_dir))
    assert (frames[0]["min_timestamp_us"], frames[0]["max_timestamp_us"]) == (3, 5)
    assert [r["value"] for r in frames[0]["records"]] == ["a", "b"]
    assert base64.b64decode(frames[1]["records"][0]["value_b64"]) == b"\xff"
    # Positions are consecutive: each frame is header + payload.
    for before, after in zip(frames, frames[1:]):
        assert after["position"] > before["position"] + before["payload_bytes"]
    text = cli("dump", log_dir, "--stream", "s", "--partition", "0", "--records")
    assert text.returncode == 0
    assert text.stdout.splitlines()[0].startswith(f"segment {segment_path(log_dir)}")
    assert text.stdout.count("checksum_ok: true") == 3
    assert 'value: "a"' in text.stdout and "offset: 5" in text.stdout
    assert_one_line_error(cli("dump", log_dir, "--stream", "zz"), 2, "zz")


def test_dump_verify_and_read_work_on_a_log_whose_writer_was_killed(log_dir):
    # A writer process appends, then dies without closing; a torn half frame follows.
    script = (
        "import os, sys, streamlog\n"
        "log = streamlog.open_log(sys.argv[1], fsync='never')\n"
        "log.create_stream('s', 1)\n"
        "for i in range(5):\n"
        "    log.append_batch_sync('s', [b'v%d' % i] * 10, timestamps_us=[i] * 10)\n"
        "os.kill(os.getpid(), 9)\n")
    killed = subprocess.run([sys.executable, "-c", script, log_dir], env=ENV, timeout=60)
    assert killed.returncode == -9
    segment = segment_path(log_dir)
    data = segment.read_bytes()
    with open(segment, "ab") as handle:
        handle.write(data[:len(data) // 5 // 2])  # half of a frame, as a torn write leaves
    before = {p.name: p.stat().st_mtime_ns for p in segment.parent.rglob("*")}
    dumped = cli("dump", log_dir, "--json")
    assert dumped.returncode == 0, dumped.stderr
    frames = [line for line in lines_of(dumped.stdout) if line.get("kind") != "verdict"]
    assert sum(f.get("count", 0) for f in frames if f["checksum_ok"]) == 50
    assert frames[-1]["checksum_ok"] is False and frames[-1]["position"] == len(data)
    verified = cli("verify", log_dir)
    assert verified.returncode == 0, verified.stderr
    assert "torn" in verified.stderr and f"position {len(data)}" in verified.stderr
    assert [r["offset"] for r in read_all(log_dir)] == list(range(50))
    assert cli("info", log_dir).returncode == 0
    after = {p.name: p.stat().st_mtime_ns for p in segment.parent.rglob("*")}
    assert after == before  # read-only commands never touch a file
    assert segment.stat().st_size == len(data) + len(data) // 5 // 2


# -- verify ------------------------------------------------------------------------------

def _frames(log_dir) -> list[dict]:
    done = cli("dump", log_dir, "--json")
    assert done.returncode == 0, done.stderr
    return [line for line in lines_of(done.stdout) if line.get("kind") != "verdict"]


def test_verify_clean_log(log_dir):
    build_log(log_dir, [([b"v%d" % i] * 20, list(range(20))) for i in range(6)],
              partitions=2, segment_bytes_max=4096)
    with streamlog.open_log(log_dir, fsync="never", segment_bytes_max=4096) as log:
        for i in range(60):
            log.append_batch_sync("s", [os.urandom(100)], partition=0)
    done = cli("verify", log_dir)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    summary = done.stdout.strip().splitlines()
    assert len(summary) == 1
    assert "2 partitions" in summary[0] and "180 records" in summary[0]
    assert summary[0].endswith(": ok")
    segments = len(list(pathlib.Path(log_dir, "streams", "s").glob("*/*.log")))
    assert segments > 3  # partition 0 rolled: continuity across segments was checked
    assert f"{segments} segments" in summary[0]
    report = json.loads(cli("verify", log_dir, "--json", "--strict").stdout)
    assert (report["result"], report["records"], report["corrupt"]) == ("ok", 180, 0)


def test_verify_finds_a_flipped_byte_in_the_middle_of_a_segment(log_dir):
    build_log(log_dir, [([b"value-%d" % i] * 50, list(range(50))) for i in range(9)],
              compression="none")
    segment = segment_path(log_dir)
    frames = _frames(log_dir)
    middle = segment.stat().st_size // 2
    hit = [f for f in frames if f["position"] <= middle][-1]
    assert hit is not frames[-1]  # valid frames follow the damage
    data = bytearray(segment.read_bytes())
    data[middle] ^= 0x5A
    segment.write_bytes(bytes(data))
    done = cli("verify", log_dir)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert f"corruption in segment {segment} at position {hit['position']}" in done.stderr
    assert done.stdout.strip().endswith("corrupt")
    assert cli("verify", log_dir, "--json").returncode == 1
    # dump shows the damaged frame and goes on with the ones after it.
    after = _frames(log_dir)
    assert [f["checksum_ok"] for f in after].count(False) == 1
    assert after[-1]["base_offset"] == frames[-1]["base_offset"]


def test_verify_reports_an_offset_gap_between_segments(log_dir):
    build_log(log_dir, [([b"x" * 200] * 10, [1] * 10) for _ in range(8)],
              segment_bytes_max=4096, compression="none")
    segments = sorted(segment_path(log_dir).parent.glob("*.log"))
    assert len(segments) >= 3
    segments[1].unlink()  # a whole segment lost from the middle
    done = cli("verify", log_dir)
    assert done.returncode == 1
    assert f"corruption in segment {segments[2]} at position 0" in done.stderr


def test_verify_torn_tail_is_a_warning_unless_strict(log_dir):
    build_log(log_dir, [([b"value-%d" % i] * 50, list(range(50))) for i in range(4)])
    segment = segment_path(log_dir)
    last = _frames(log_dir)[-1]
    size = segment.stat().st_size
    data = segment.read_bytes()
    with open(segment, "ab") as handle:  # a writer killed inside its next frame
        handle.write(data[last["position"]:last["position"] + 40])
    done = cli("verify", log_dir)
    assert done.returncode == 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("streamlog: warning: torn tail")
    assert f"{segment} at position {size}" in lines[0]
    assert "200 records" in done.stdout  # the four whole frames
    strict = cli("verify", log_dir, "--strict")
    assert strict.returncode == 1 and "torn tail" in strict.stderr


def test_segment_events_give_the_same_answer_for_any_chunk_size(log_dir):
    # Frames larger than a chunk, and a resync that must cross chunk boundaries.
    build_log(log_dir, [([os.urandom(300)] * 4, [i] * 4) for i in range(6)],
              compression="none")
    segment = segment_path(log_dir)
    frames = _frames(log_dir)
    data = bytearray(segment.read_bytes())
    data[frames[2]["position"] + 100] ^= 1  # payload of the third frame
    segment.write_bytes(bytes(data))

    def walk(chunk_bytes):
        opened = Segment(OsFileIO(), str(segment.parent), 0, writable=False)
        try:
            return [(type(e).__name__, e.position, getattr(e, "base_offset", None))
                    for e in segment_events(opened, chunk_bytes)]
        finally:
            opened.close()

    expected = [("Frame", f["position"], f["base_offset"]) for f in frames]
    expected[2] = ("BadSpot", frames[2]["position"], None)
    for chunk_bytes in (80, 257, 1000, 1 << 20):
        assert walk(chunk_bytes) == expected, chunk_bytes


def test_append_refuses_a_directory_that_is_not_a_log(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    done = cli("append", tmp_path, "--stream", "s", stdin=jsonl([{"value": "a"}]))
    assert_one_line_error(done, 2, "not a streamlog log")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


# -- help and entry points ---------------------------------------------------------------

@pytest.mark.parametrize("command", ["append", "read", "info", "dump", "verify"])
def test_help_for_each_subcommand(command):
    done = cli(command, "--help")
    assert done.returncode == 0
    assert done.stdout.startswith(f"usage: streamlog {command}")
    assert "examples:" in done.stdout and f"streamlog {command} " in done.stdout


def test_top_level_help_and_package_entry_point():
    done = subprocess.run([sys.executable, "-m", "streamlog", "--help"], capture_output=True,
                          env=ENV, timeout=60)
    assert done.returncode == 0
    text = done.stdout.decode()
    for command in ("append", "read", "info", "dump", "verify"):
        assert command in text
    assert_one_line_error(cli(), 2, "COMMAND")
    assert_one_line_error(cli("frobnicate"), 2, "frobnicate")


def test_progress_is_shown_only_on_a_terminal(log_dir):
    pty = pytest.importorskip("pty")
    build_log(log_dir, [([b"x"] * 5000, [1] * 5000)])
    code = ("import sys, streamlog.cli as cli, streamlog.cli.common as common\n"
            "common.PROGRESS_DELAY_S = common.PROGRESS_EVERY_S = 0\n"
            "sys.exit(cli.main(sys.argv[1:]))\n")
    master, slave = pty.openpty()
    try:
        done = subprocess.run([sys.executable, "-c", code, "read", log_dir, "--stream", "s"],
                              stdout=subprocess.DEVNULL, stderr=slave, env=ENV, timeout=60)
        os.set_blocking(master, False)
        shown = os.read(master, 1 << 20)
    finally:
        os.close(master)
        os.close(slave)
    assert done.returncode == 0
    assert b"read s:" in shown and b"/5.00k" in shown and b"records/s" in shown  # tqdm
    piped = subprocess.run([sys.executable, "-c", code, "read", log_dir, "--stream", "s"],
                           capture_output=True, env=ENV, timeout=60)
    assert piped.returncode == 0 and piped.stderr == b""


def test_info_lists_the_durable_holds(tmp_path):
    path = tmp_path / "log"
    with streamlog.open_log(path) as log:
        log.create_stream("events")
        log.append_sync("events", b"x")
        log.hold("events", 0, "operator.counts.0", 0)
    done = cli("info", path)
    assert done.returncode == 0
    assert ("events/0: hold operator.counts.0 at offset 0: retention keeps it and what "
            "follows") in done.stdout
    row = json.loads(cli("info", path, "--json").stdout)["streams"]["events"]["partitions"][0]
    assert row["holds"]["operator.counts.0"]["offset"] == 0


# -- tombstones --------------------------------------------------------------------------

def test_tombstones_append_read_dump_and_verify(log_dir, tmp_path):
    """"value": null is a None value, apart from "value": ""; a null header value is
    None; read and dump print them as null, and the lines read prints append again."""
    records = [{"value": None, "key": "k"}, {"value": ""}, {"value_b64": None},
               {"value": "v", "headers": {"h": None, "g": ""}},
               {"value": None, "headers_b64": {"b": None, "c": "/w=="}}]
    done = cli("append", log_dir, "--stream", "s", stdin=jsonl(records))
    assert done.returncode == 0, done.stderr
    out = read_all(log_dir)
    assert [r["value"] for r in out] == [None, "", None, "v", None]
    assert all("value_b64" not in r for r in out)
    assert out[3]["headers"] == {"h": None, "g": ""}
    assert out[4]["headers_b64"] == {"b": None, "c": "/w=="}
    with streamlog.open_log(log_dir, readonly=True) as log:
        got = [(r.value, r.headers) for r in log.reader("s", 0)]
    assert got == [(None, ()), (b"", ()), (None, ()), (b"v", (("h", None), ("g", b""))),
                   (None, (("b", None), ("c", b"\xff")))]
    copy = str(tmp_path / "copy")
    again = cli("append", copy, "--stream", "s", stdin="".join(
        json.dumps(r) + "\n" for r in out))
    assert again.returncode == 0, again.stderr
    assert read_all(copy) == out
    assert_one_line_error(cli("append", log_dir, "--stream", "s", stdin='{"key": "k"}\n'),
                          2, "line 1: no value")
    dumped = cli("dump", log_dir, "--records", "--json")
    assert dumped.returncode == 0, dumped.stderr
    assert '"value": null' in dumped.stdout
    verified = cli("verify", log_dir)
    assert verified.returncode == 0 and verified.stderr == "", verified.stderr


def test_verify_names_a_none_value_without_its_flag_corrupt(log_dir):
    from streamlog.frame import FLAG_HAS_NULLS, decode_frame, encode_frame
    build_log(log_dir, [([None, b""], [1, 2])])
    frame = decode_frame(segment_path(log_dir).read_bytes())
    assert frame.flags & FLAG_HAS_NULLS
    forged = encode_frame(base_offset=2, record_count=2, min_timestamp_us=1,
                          max_timestamp_us=2, txn_id=0, flags=frame.flags & ~FLAG_HAS_NULLS,
                          raw_bytes=len(frame.payload), payload=bytes(frame.payload))
    with open(segment_path(log_dir), "ab") as handle:
        handle.write(forged)  # checksums hold: only the payload's lengths are wrong
    done = cli("verify", log_dir)
    assert done.returncode == 1
    assert "negative length in payload" in done.stderr and "Traceback" not in done.stderr
    read = cli("read", log_dir, "--stream", "s")
    assert read.returncode != 0 and "negative length" in read.stderr
    assert [r["value"] for r in lines_of(read.stdout)] == [None, ""]
