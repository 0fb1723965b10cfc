"""The command line as Kafka console-tool users and scripts use it (DESIGN 10).

`read --from-end`, `--max-messages`, headers on `append` and `read`, `--follow` that
waits for a log or stream and, on a daemon URL, takes what the daemon pushes; one exit
code and one line on stderr for each kind of bad input of each command; progress bars
only where asked; `repair` cutting at the first bad frame. The table of bad inputs runs
`main()` in-process (fast, and main() is where every exception becomes a code); the
rest runs the CLI as a subprocess, as a user would.
"""

from __future__ import annotations

import base64
import io
import json
import pathlib
import socket
import subprocess
import sys
import time

import pytest

import streamlog
from streamlog.cli import main as cli_main
from streamlog.cli.append import parse_append_record
from streamlog.frame import HEADER_BYTES, decode_frame, encode_frame
from streamlog.testing.serve import ServeProcess
from test_cli import (ENV, _line_reader, assert_one_line_error, build_log, cli, jsonl,
                      lines_of, segment_path)

pytestmark = pytest.mark.slow

TOKEN = "habits-token"


def cli_with(*args, stdin: str | bytes | None = None, token: str | None = None,
             extra_env: dict | None = None, timeout: float = 60):
    """cli() with STREAMLOG_TOKEN (and more) in the environment."""
    env = dict(ENV, **(extra_env or {}))
    if token is not None:
        env["STREAMLOG_TOKEN"] = token
    data = stdin.encode() if isinstance(stdin, str) else stdin
    done = subprocess.run([sys.executable, "-m", "streamlog.cli", *map(str, args)],
                          input=data, capture_output=True, timeout=timeout, env=env)
    done.stdout, done.stderr = done.stdout.decode(), done.stderr.decode()
    return done


def popen(*args, token: str | None = None, code: str | None = None) -> subprocess.Popen:
    """The CLI as a long-running process (`code` runs first, e.g. to patch a module)."""
    env = dict(ENV)
    if token is not None:
        env["STREAMLOG_TOKEN"] = token
    program = (code or "") + "import sys\nfrom streamlog.cli import main\nsys.exit(main())\n"
    return subprocess.Popen([sys.executable, "-c", program, *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def finish(proc: subprocess.Popen, timeout: float = 30) -> tuple[int, str]:
    """Wait for a process whose stdout a _line_reader drains; (exit code, stderr)."""
    try:
        proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    return proc.returncode, proc.stderr.read().decode()


def outcome(proc: subprocess.Popen, timeout: float = 30) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of a process that is expected to end by itself."""
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, stdout.decode(), stderr.decode()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    served = ServeProcess(tmp_path_factory.mktemp("daemon") / "log", token=TOKEN)
    yield served
    assert served.stop() == 0


# -- every command, every kind of bad input ----------------------------------------------

def run_main(argv: list[str], capsys, monkeypatch, stdin: bytes = b"") -> tuple[int, str, str]:
    """main() in-process: (exit code, stdout, stderr); argparse's exit is a code too."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    try:
        code = cli_main(argv)
    except SystemExit as exiting:
        code = exiting.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def places(tmp_path):
    """{log}: a log with stream s (1 partition); {file}: a regular file; {missing}: a
    path that does not exist; {notlog}: a directory with a file in it; {down}: a daemon
    URL where nothing listens."""
    log = tmp_path / "log"
    build_log(log, [([b"a"], [1])])
    (tmp_path / "file").write_text("not a log")
    (tmp_path / "notlog").mkdir()
    (tmp_path / "notlog" / "mine.txt").write_text("mine")
    return {"log": str(log), "file": str(tmp_path / "file"),
            "missing": str(tmp_path / "missing"), "notlog": str(tmp_path / "notlog"),
            "down": f"streamlog://127.0.0.1:{free_port()}"}


def _tree(root: pathlib.Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


BAD = "bad/name"
GOOD_LINE = b'{"value": "x"}\n'
BAD_INPUTS = [
    # (command line, stdin, exit code, a fragment of the one-line message)
    ("append {missing} --stream " + BAD, GOOD_LINE, 2, "invalid stream name"),
    ("append {log} --stream " + BAD, GOOD_LINE, 2, "invalid stream name"),
    ("append {file} --stream s", GOOD_LINE, 2, "is a file, not a log directory"),
    ("append {file}/sub --stream s", GOOD_LINE, 2, "is a file"),
    ("append {notlog} --stream s", GOOD_LINE, 2, "not a streamlog log"),
    ("append {log} --stream s --partitions 0", GOOD_LINE, 2, "positive integer"),
    ("append {missing} --stream s --partitions 100000", GOOD_LINE, 2, "at most 4096"),
    ("append {log} --stream s --fsync sometimes", GOOD_LINE, 2, "invalid choice"),
    ("append {log} --stream s --fsync-interval-ms x", GOOD_LINE, 2, "integer"),
    ("append {log} --stream s", b'{"value": "x"}\n{"value": 1}\n', 2, "line 2: value must"),
    ("append {log} --stream s", b'{"value": "a", "headers": ["x"]}', 2,
     "line 1: headers must be a JSON object of strings"),
    ("append {log} --stream s", b'{"value": "a", "headers": {"x": 1}}', 2,
     "line 1: headers must be a JSON object of strings (header 'x' is not)"),
    ("append {log} --stream s", b'{"value": "a", "headers": {"x": "1"}, "headers_b64": {}}',
     2, "line 1: give headers or headers_b64, not both"),
    ("append {log} --stream s", b'{"value": "a", "headers_b64": {"x": "@@"}}', 2,
     "line 1: header 'x' of headers_b64 is not valid base64"),
    ("append {log}", GOOD_LINE, 2, "--stream"),
    ("append {down} --stream s", GOOD_LINE, 3, "STREAMLOG_TOKEN"),
    ("read {missing} --stream s", b"", 2, "no log at"),
    ("read {file} --stream s", b"", 2, "is a file, not a log directory"),
    ("read {file} --stream s --follow", b"", 2, "is a file"),
    ("read {notlog} --stream s", b"", 2, "not a streamlog log"),
    ("read {notlog} --stream s --follow", b"", 2, "not a streamlog log"),
    ("read {log} --stream " + BAD, b"", 2, "invalid stream name"),
    ("read {log} --stream " + BAD + " --follow", b"", 2, "invalid stream name"),
    ("read {log} --stream nope", b"", 2, "no stream named 'nope'"),
    ("read {log} --stream s --partition -1", b"", 2, "non-negative"),
    ("read {log} --stream s --partition 1", b"", 2, "partitions 0..0"),
    ("read {log} --stream s --max-messages 0", b"", 2, "positive integer"),
    ("read {log} --stream s --from-offset x", b"", 2, "integer"),
    ("read {log} --stream s --to-timestamp soon", b"", 2, "ISO-8601"),
    ("read {log} --stream s --from-end --from-offset 1", b"", 2, "not allowed with"),
    ("read {down} --stream s", b"", 3, "STREAMLOG_TOKEN"),
    ("info {missing}", b"", 2, "no log at"),
    ("info {file}", b"", 2, "is a file"),
    ("info {notlog}", b"", 2, "not a streamlog log"),
    ("info {log} --tables", b"", 2, "unrecognized arguments"),
    ("info {down}", b"", 3, "STREAMLOG_TOKEN"),
    ("dump {missing}", b"", 2, "no log at"),
    ("dump {file}", b"", 2, "is a file"),
    ("dump {down}", b"", 2, "needs a local log directory"),
    ("dump {log} --stream nope", b"", 2, "no stream named 'nope'"),
    ("dump {log} --stream " + BAD, b"", 2, "invalid stream name"),
    ("dump {log} --partition x", b"", 2, "integer"),
    ("dump {log} --stream s --partition 3", b"", 2, "no partition 3"),
    ("verify {missing}", b"", 2, "no log at"),
    ("verify {file}", b"", 2, "is a file"),
    ("verify {down}", b"", 2, "needs a local log directory"),
    ("repair {missing}", b"", 2, "no log at"),
    ("repair {file}", b"", 2, "is a file"),
    ("repair {notlog}", b"", 2, "not a streamlog log"),
    ("repair {down} --dry-run", b"", 2, "needs a local log directory"),
    ("frobnicate {log}", b"", 2, "invalid choice"),
]


@pytest.mark.parametrize("line, stdin, code, fragment", BAD_INPUTS,
                         ids=[f"{case[0]}|{case[3]}" for case in BAD_INPUTS])
def test_each_command_on_each_kind_of_bad_input(line, stdin, code, fragment, places,
                                                tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("STREAMLOG_TOKEN", raising=False)
    before = _tree(tmp_path)
    argv = [word.format(**places) for word in line.split()]
    got, out, err = run_main(argv, capsys, monkeypatch, stdin)
    assert got == code, (got, err)
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("streamlog: error: "), err
    assert fragment in lines[0], lines[0]
    if not fragment.startswith("line "):  # a malformed line: the ones before it are appended
        assert out == ""  # a refused command writes nothing on stdout
        assert _tree(tmp_path) == before  # and creates nothing (no log, no directory)


def test_a_refused_command_in_a_real_process_is_one_line_and_its_code(places):
    for args, code in (("append {file} --stream s", 2), ("read {down} --stream s", 3)):
        done = cli_with(*[word.format(**places) for word in args.split()], stdin="",
                        token=TOKEN)
        assert_one_line_error(done, code)
        assert done.stdout == ""


def test_daemon_wrong_token_and_unreachable_are_exit_3_with_nothing_on_stdout(
        daemon, places, capsys, monkeypatch):
    for args in (["append", daemon.url, "--stream", "s"], ["read", daemon.url, "--stream", "s"],
                 ["info", daemon.url]):
        monkeypatch.setenv("STREAMLOG_TOKEN", "wrong")
        code, out, err = run_main(args, capsys, monkeypatch, GOOD_LINE)
        assert (code, out) == (3, "") and err.startswith("streamlog: error: ")
        assert "token" in err and err.count("\n") == 1
        monkeypatch.setenv("STREAMLOG_TOKEN", TOKEN)
        code, out, err = run_main([args[0], places["down"], *args[2:]], capsys, monkeypatch,
                                  GOOD_LINE)
        assert (code, out) == (3, "") and "cannot reach" in err and err.count("\n") == 1
    for command in ("dump", "verify", "repair"):
        code, out, err = run_main([command, daemon.url], capsys, monkeypatch)
        assert (code, out) == (2, "") and "needs a local log directory" in err


def test_malformed_json_names_the_column_of_the_line(log_dir, capsys, monkeypatch):
    for text, where in ((b'{"value": "three"\n', "column 18"), (b'{"value": tru}\n', "column 11"),
                        (b'  {"value" "x"}\r\n', "column 12")):
        with pytest.raises(ValueError, match=where):
            parse_append_record(text, 1, 1024)
    with pytest.raises(ValueError, match=r"UTF-8 \(byte 12\)"):
        parse_append_record(b'{"value": "\xff"}\n', 1, 1024)
    code, out, err = run_main(["append", log_dir, "--stream", "s"], capsys, monkeypatch,
                              b'{"value": "one"}\n\n{"value": "three"\n')
    assert code == 2 and json.loads(out)["records"] == 1
    assert err == ("streamlog: error: line 3: not valid JSON: Expecting ',' delimiter at "
                   "column 18\n")


def test_messages_count_partitions_in_the_singular_too(log_dir, capsys, monkeypatch):
    assert run_main(["append", log_dir, "--stream", "s"], capsys, monkeypatch, GOOD_LINE)[0] == 0
    code, _, err = run_main(["append", log_dir, "--stream", "s", "--partitions", "2"], capsys,
                            monkeypatch, GOOD_LINE)
    assert code == 2 and "has 1 partition;" in err
    code, out, _ = run_main(["verify", log_dir], capsys, monkeypatch)
    assert code == 0 and out.startswith("verified 1 partition, 1 segment, 1 record (")


def test_append_to_a_daemon_takes_no_fsync_option(daemon):
    done = cli_with("append", daemon.url, "--stream", "s", "--fsync", "never",
                    stdin=jsonl([{"value": "a"}]), token=TOKEN)
    assert_one_line_error(done, 2, "--fsync")
    assert done.stdout == ""


# -- offsets past the end, --from-end, --max-messages --------------------------------------

def test_from_offset_past_the_end_prints_nothing_with_or_without_partition(
        log_dir, capsys, monkeypatch):
    build_log(log_dir, [([b"a", b"b"], [1, 2])], partitions=2)
    for extra in ([], ["--partition", "0"], ["--partition", "1"]):
        got = run_main(["read", log_dir, "--stream", "s", "--from-offset", "5", *extra],
                       capsys, monkeypatch)
        assert got == (0, "", "")
    code, out, _ = run_main(["read", log_dir, "--stream", "s", "--from-offset", "1",
                             "--partition", "0"], capsys, monkeypatch)
    assert [r["value"] for r in lines_of(out)] == ["b"]


def test_max_messages_stops_after_n_records_across_partitions(log_dir, capsys, monkeypatch):
    build_log(log_dir, [([b"a", b"b", b"c"], [1, 2, 3])], partitions=2)
    with streamlog.open_log(log_dir) as log:
        log.append_batch_sync("s", [b"d", b"e"], partition=1)
    code, out, _ = run_main(["read", log_dir, "--stream", "s", "--max-messages", "4"], capsys,
                            monkeypatch)
    assert code == 0
    assert [(r["partition"], r["value"]) for r in lines_of(out)] == [
        (0, "a"), (0, "b"), (0, "c"), (1, "d")]
    code, out, _ = run_main(["read", log_dir, "--stream", "s", "--max-messages", "10"],
                            capsys, monkeypatch)
    assert len(lines_of(out)) == 5


def _appended_until_seen(proc, append, limit_s: float = 30) -> dict:
    """Append one record at a time (`append(i)`) until the follower prints a line;
    every record appended this way comes after the follower started."""
    lines = _line_reader(proc.stdout)
    deadline = time.monotonic() + limit_s
    i = 0
    while time.monotonic() < deadline:
        append(i)
        i += 1
        try:
            return lines.get(timeout=1.0)
        except Exception:  # noqa: BLE001 - queue.Empty: not yet
            continue
    raise AssertionError("the follower printed nothing")


def test_from_end_reads_only_what_is_appended_from_now_on(log_dir):
    build_log(log_dir, [([b"old-1", b"old-2"], [1, 2])])
    assert cli("read", log_dir, "--stream", "s", "--from-end").stdout == ""
    proc = popen("read", log_dir, "--stream", "s", "--from-end", "--follow",
                 "--max-messages", "1")
    with streamlog.open_log(log_dir) as log:
        first = _appended_until_seen(proc, lambda i: log.append_sync("s", b"new-%d" % i))
    assert first["value"].startswith("new-") and first["offset"] >= 2
    assert finish(proc) == (0, "")


def test_follow_waits_for_a_log_and_a_stream_that_do_not_exist_yet(tmp_path):
    path = tmp_path / "later" / "log"
    proc = popen("read", path, "--stream", "s", "--follow", "--from-end", "--max-messages", "2")
    # It says what it waits for, once, on stderr (however slowly it started).
    notice = proc.stderr.readline().decode()
    assert notice == f"streamlog: waiting for the log {path} to be created (--follow)\n"
    waiting = proc.poll() is None  # not exit 2
    with streamlog.open_log(path) as log:
        log.create_stream("other")
        notice = proc.stderr.readline().decode()
        assert notice == "streamlog: waiting for the stream 's' to be created (--follow)\n"
        still = proc.poll() is None  # still waiting for its stream
        log.create_stream("s")
        log.append_batch_sync("s", [b"first", b"second", b"third"])
    code, stdout, stderr = outcome(proc)
    assert waiting and still and code == 0, stderr
    # A stream created after the command started: --from-end reads it from its start.
    assert [r["value"] for r in lines_of(stdout)] == ["first", "second"]


# -- headers --------------------------------------------------------------------------------

HEADER_LINES = [
    {"value": "plain"},
    {"value": "text headers", "headers": {"trace": "t-1", "user": "caf\u00e9"}},
    {"value": "binary", "headers_b64": {"sig": base64.b64encode(b"\xff\x00").decode(),
                                        "kind": base64.b64encode(b"ok").decode()}},
]


def test_headers_round_trip_through_append_and_read(tmp_path, capsys, monkeypatch):
    first, second = str(tmp_path / "one"), str(tmp_path / "two")

    def main(*argv, stdin: bytes = b"") -> str:
        code, out, err = run_main(list(argv), capsys, monkeypatch, stdin)
        assert code == 0, err
        return out

    text = jsonl(HEADER_LINES) + '{"value": "twice", "headers": {"h": "1", "h": "2"}}\n'
    main("append", first, "--stream", "s", stdin=text.encode())
    read_text = main("read", first, "--stream", "s")
    out = lines_of(read_text)
    assert "headers" not in out[0] and "headers_b64" not in out[0]
    assert out[1]["headers"] == {"trace": "t-1", "user": "caf\u00e9"}
    assert "headers" not in out[2]  # one value is not UTF-8: all of them in base64
    assert {k: base64.b64decode(v) for k, v in out[2]["headers_b64"].items()} == {
        "sig": b"\xff\x00", "kind": b"ok"}
    with streamlog.open_log(first, readonly=True) as log:
        records = list(log.reader("s", 0))
    assert records[3].headers == (("h", b"1"), ("h", b"2"))  # a repeated name is kept
    assert '"headers": {"h": "1", "h": "2"}' in read_text
    # The output of read is input for append: the same records again.
    main("append", second, "--stream", "s", stdin=read_text.encode())
    assert main("read", second, "--stream", "s") == read_text
    assert '"headers": {"h": "1", "h": "2"}' in main("dump", first, "--json", "--records")


def test_headers_through_a_daemon(daemon):
    done = cli_with("append", daemon.url, "--stream", "hdr", stdin=jsonl(HEADER_LINES),
                    token=TOKEN)
    assert done.returncode == 0, done.stderr
    out = lines_of(cli_with("read", daemon.url, "--stream", "hdr", token=TOKEN).stdout)
    assert out[1]["headers"] == {"trace": "t-1", "user": "caf\u00e9"}
    assert set(out[2]["headers_b64"]) == {"sig", "kind"}


# -- read --follow on a daemon: the pushed tail --------------------------------------------

# A follower that polled would wait an hour between looks: only a pushed tail delivers.
NO_POLLING = "import streamlog.cli.read as read\nread.FOLLOW_INTERVAL_S = 3600\n"


def test_follow_on_a_daemon_url_gets_what_the_daemon_pushes(daemon):
    with streamlog.open_log(daemon.url, token=TOKEN) as log:
        log.create_stream("pushed", 2)
        log.append_sync("pushed", b"before", partition=0)
        proc = popen("read", daemon.url, "--stream", "pushed", "--follow", "--max-messages",
                     "4", token=TOKEN, code=NO_POLLING)
        lines = _line_reader(proc.stdout)
        assert lines.get(timeout=30)["value"] == "before"  # every reader is open now
        log.append_sync("pushed", b"p1", partition=1)
        log.append_batch_sync("pushed", [b"p0-a", b"p0-b"], partition=0)
        seen = [lines.get(timeout=30) for _ in range(3)]
    assert sorted((r["partition"], r["value"]) for r in seen) == [
        (0, "p0-a"), (0, "p0-b"), (1, "p1")]
    assert finish(proc) == (0, "")  # --max-messages 4 ends it


def test_follow_on_a_daemon_from_end_and_to_offset(daemon):
    with streamlog.open_log(daemon.url, token=TOKEN) as log:
        log.create_stream("ended", 1)
        log.append_batch_sync("ended", [b"old"] * 3)
        proc = popen("read", daemon.url, "--stream", "ended", "--follow", "--from-end",
                     "--max-messages", "1", token=TOKEN, code=NO_POLLING)
        first = _appended_until_seen(proc, lambda i: log.append_sync("ended", b"new-%d" % i))
        assert first["value"].startswith("new-") and first["offset"] >= 3
        assert finish(proc) == (0, "")
        end = log.end_offset("ended", 0)
        # --to-offset ends a follow by itself; --from-offset past the end waits for it.
        proc = popen("read", daemon.url, "--stream", "ended", "--follow", "--from-offset",
                     str(end + 1), "--to-offset", str(end + 2), token=TOKEN, code=NO_POLLING)
        time.sleep(0.5)
        log.append_batch_sync("ended", [b"skipped", b"wanted", b"after"])
        code, stdout, _ = outcome(proc)
    assert code == 0
    assert [(r["offset"], r["value"]) for r in lines_of(stdout)] == [
        (end + 1, "wanted")]


def test_follow_on_a_daemon_waits_for_the_stream(daemon):
    proc = popen("read", daemon.url, "--stream", "not-yet", "--follow", "--max-messages", "1",
                 token=TOKEN, code=NO_POLLING)
    time.sleep(1.0)
    waiting = proc.poll() is None  # not exit 2
    with streamlog.open_log(daemon.url, token=TOKEN) as log:
        log.create_stream("not-yet", 1)
        log.append_sync("not-yet", b"here")
    code, stdout, stderr = outcome(proc)
    assert waiting and code == 0, stderr
    assert [r["value"] for r in lines_of(stdout)] == ["here"]


# -- several writers, and repair ------------------------------------------------------------

def test_a_second_local_writer_appends_and_repair_says_what_to_do(log_dir):
    build_log(log_dir, [([b"a"], [1])])
    with streamlog.open_log(log_dir) as log:  # another writer holds the log open
        done = cli("append", log_dir, "--stream", "s", stdin=jsonl([{"value": "b"}]))
        assert done.returncode == 0, done.stderr  # several writers may append (DESIGN 9)
        assert json.loads(done.stdout)["partitions"] == {"0": [1, 1]}
        log.refresh()
        assert log.end_offset("s", 0) == 2
        refused = cli("repair", log_dir)
        assert_one_line_error(refused, 2, "open for writing by another process",
                              "stop it", "streamlog serve")
        assert refused.stdout == ""


def _rewrite_frame(segment: pathlib.Path, number: int) -> dict:
    """Re-encode frame `number` with a min timestamp one below its payload's: its
    checksums hold and it continues the log, but its payload disagrees with its
    header (verify: "the payload does not decode")."""
    data = bytearray(segment.read_bytes())
    position, frames = 0, []
    while position < len(data):
        frame = decode_frame(bytes(data), position)
        frames.append(frame)
        position += HEADER_BYTES + len(frame.payload)
    frame = frames[number]
    rewritten = encode_frame(base_offset=frame.base_offset, record_count=frame.record_count,
                             min_timestamp_us=frame.min_timestamp_us - 1,
                             max_timestamp_us=frame.max_timestamp_us, txn_id=frame.txn_id,
                             flags=frame.flags, raw_bytes=frame.raw_bytes,
                             payload=bytes(frame.payload))
    data[frame.position:frame.position + len(rewritten)] = rewritten
    segment.write_bytes(bytes(data))
    return {"position": frame.position, "base_offset": frame.base_offset,
            "last_offset": frames[-1].next_offset - 1}


def test_repair_cuts_at_the_first_bad_frame_even_one_whose_payload_is_wrong(
        log_dir, capsys, monkeypatch):
    build_log(log_dir, [([b"v%d" % i] * 4, [10 * i + j for j in range(4)]) for i in range(6)],
              compression="none")
    segment = segment_path(log_dir)
    bad = _rewrite_frame(segment, 2)

    def main(*argv):
        return run_main(list(argv), capsys, monkeypatch)

    assert main("verify", log_dir)[0] == 1
    size = segment.stat().st_size
    code, planned, _ = main("repair", log_dir, "--dry-run")
    assert code == 1 and segment.stat().st_size == size
    code, out, err = main("repair", log_dir)
    assert code == 0, err
    (cut,) = lines_of(out)  # one JSON line per cut, nothing else
    (plan,) = lines_of(planned)
    assert (cut["stream"], cut["partition"], cut["segment"], cut["position"]) == (
        "s", 0, str(segment), bad["position"])
    assert cut["offsets_removed"] == [bad["base_offset"], bad["last_offset"]]
    assert plan["offsets_removed"] == cut["offsets_removed"]
    assert (plan["dry_run"], cut["dry_run"]) == (True, False)
    quarantined = pathlib.Path(cut["quarantine"])
    assert quarantined.is_relative_to(pathlib.Path(log_dir, "quarantine"))
    assert sum(p.stat().st_size for p in quarantined.iterdir()) == cut["bytes_cut"] == (
        size - bad["position"])
    assert segment.stat().st_size == bad["position"]
    assert main("verify", log_dir)[0] == 0
    code, out, _ = main("read", log_dir, "--stream", "s")
    assert [r["offset"] for r in lines_of(out)] == list(range(bad["base_offset"]))
    assert main("repair", log_dir)[:2] == (0, "")  # sound: nothing to cut, exit 0


# -- progress and help ----------------------------------------------------------------------

def test_progress_bars_only_when_asked_or_on_a_terminal(tmp_path, capsys, monkeypatch):
    path = str(tmp_path / "log")
    lines = jsonl({"value": f"v{i}"} for i in range(3000)).encode()
    monkeypatch.setenv("STREAMLOG_PROGRESS", "1")  # as if stderr were a terminal
    code, out, err = run_main(["append", path, "--stream", "s"], capsys, monkeypatch, lines)
    assert code == 0 and "append s" in err and "B/s" in err
    assert json.loads(out)["records"] == 3000  # stdout keeps its one line
    commands = ((["read", path, "--stream", "s"], "read s"), (["verify", path], "verify"),
                (["dump", path], "dump"), (["repair", path], "repair: checking"))
    for argv, label in commands:
        code, _, err = run_main(argv, capsys, monkeypatch)
        assert code == 0 and label in err, (argv, err)
    for setting in ("", "0"):  # stderr is not a terminal here; 0 turns bars off anywhere
        monkeypatch.setenv("STREAMLOG_PROGRESS", setting)
        assert run_main(["append", path, "--stream", "s"], capsys, monkeypatch, lines)[2] == ""
        for argv, _ in commands:
            code, _, err = run_main(argv, capsys, monkeypatch)
            assert (code, err) == (0, ""), argv


@pytest.mark.parametrize("command", ["append", "read", "info", "dump", "verify", "repair"])
def test_every_help_has_examples_and_says_what_log_may_be(command, capsys, monkeypatch):
    code, text, _ = run_main([command, "--help"], capsys, monkeypatch)
    assert code == 0 and text.startswith(f"usage: streamlog {command}")
    examples = text.split("examples:\n", 1)[1].splitlines()
    assert examples and all(line.lstrip().startswith(("streamlog ", "echo ", "STREAMLOG_TOKEN",
                                                      "export ")) for line in examples if line)
    flat = " ".join(text.split())
    if command in ("dump", "verify", "repair"):
        assert "does not take a daemon URL" in flat
    else:
        assert "daemon URL streamlog://HOST:PORT" in flat
    if command == "read":
        for option in ("--from-end", "--max-messages", "--follow", "headers_b64"):
            assert option in flat


def test_top_level_help_has_the_table_of_exit_codes(capsys, monkeypatch):
    code, text, _ = run_main(["--help"], capsys, monkeypatch)
    assert code == 0
    table = text.split("exit codes (every command):\n", 1)[1]
    for code in ("0    success", "1    corruption", "2    usage", "3    cannot reach"):
        assert code in table
    assert "STREAMLOG_PROGRESS" in text and "STREAMLOG_TOKEN" in text


def test_an_unexpected_error_is_one_line_too(log_dir, capsys, monkeypatch):
    build_log(log_dir, [([b"a"], [1])])

    def broken(*args, **kwargs):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr("streamlog.cli.info.open_readonly", broken)
    code, out, err = run_main(["info", log_dir], capsys, monkeypatch)
    assert (code, out) == (1, "")
    assert err.startswith("streamlog: error: unexpected RuntimeError: boom") and err.count(
        "\n") == 1
