"""Every code block in README.md runs as printed and prints what it promises.

Each block is run the way a reader would run it after the README's set-up (`./dev demo`
creates .venv and installs the project): Python blocks with this interpreter, shell blocks
with bash and the installed `streamlog` on PATH, each in a temporary working directory
(so `./data/...` in a block is the temporary directory's), with a timeout. The promises
are the blocks' own comments (`# {"stream": ...}` under a command, `# RecordPosition(...)`
beside a print), so a change of output fails here rather than misleading a reader.

`test_every_block_is_run_by_a_test` claims each block for one test (or a stated reason
not to run it), so a block added to the README without a test fails the suite. The
operator examples are run by test_readme_operators.py.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BIN = Path(sys.executable).parent
# A fresh shell's environment: nothing that would make a block work by accident.
ENV = {k: v for k, v in os.environ.items()
       if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON",
                    "STREAMLOG_TOKEN", "VIRTUAL_ENV")}


@dataclass(frozen=True)
class Block:
    section: str  # the "## " heading above it ("" before the first)
    index: int    # its number within the section
    lang: str
    text: str
    line: int     # where it starts in README.md

    def __str__(self) -> str:
        return f"README.md:{self.line} ({self.section or 'top'} #{self.index}, {self.lang or 'plain'})"


def readme_blocks() -> list[Block]:
    blocks, section, counts = [], "", {}
    lines = README.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = line[3:].strip()
        elif line.startswith("```"):
            start, body = i, []
            i += 1
            while not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            index = counts[section] = counts.get(section, -1) + 1
            blocks.append(Block(section, index, line[3:].strip(), "\n".join(body) + "\n",
                                start + 1))
        i += 1
    return blocks


def section_blocks(section: str) -> list[Block]:
    return [b for b in readme_blocks() if b.section == section]


def section_text(section: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("\n## " + section + "\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else len(text)]


# -- which test runs which block -----------------------------------------------------------

# Section -> the test that runs its blocks (or why they are not run).
CLAIMS = {
    "": "test_dev_demo_runs_the_main_job; `./dev test` is not run: it is the whole suite, "
        "this test among them",
    "Quick start": "test_quick_start",
    "Using the log": "test_using_the_log",
    "Command line": "test_the_command_line_synopsis_names_real_options",
    "Spark": "test_the_spark_example",
    "Spark on a cluster": "not run: needs a standalone cluster and a job.py; tests/"
                          "integration/spark/test_spark_cluster.py runs such a cluster",
    # A benchmark runs for minutes; test_every_dev_command_in_the_readme_exists checks
    # that each `./dev bench NAME` names one.
    "Benchmarks": "not run: benchmarks take minutes",
    "Kafka clients": "test_kafka_clients",
    "Past one machine: the log in an object store": "test_past_one_machine",
    "The console": "test_the_console",
}


def claim(block: Block) -> str:
    if block.section.startswith("Operators"):
        return "test_readme_operators.py"
    return CLAIMS.get(block.section, "")


def test_every_block_is_run_by_a_test():
    blocks = readme_blocks()
    assert len(blocks) >= 10
    unclaimed = [str(b) for b in blocks if not claim(b)]
    assert not unclaimed, f"README blocks that no test runs (add them here): {unclaimed}"
    # The claims match the README's shape: a moved or new block must be looked at.
    shape = {(b.section, b.index) for b in blocks}
    assert {("", 0), ("Quick start", 3), ("Using the log", 0), ("Command line", 0),
            ("Spark", 0), ("Spark on a cluster", 0)} <= shape
    assert ("Using the log", 1) not in shape and ("Spark", 1) not in shape
    assert ("Quick start", 4) not in shape and ("", 1) not in shape
    # test_readme_operators.py runs the three of "## Operators: ...".
    assert len([b for b in blocks if b.section.startswith("Operators")]) == 3


# -- helpers ---------------------------------------------------------------------------------

def promises(block: Block) -> list[str]:
    """The output a shell block promises: its comment lines that stand alone."""
    return [line[2:] for line in block.text.splitlines() if line.startswith("# ")]


def matches(promise: str, line: str) -> bool:
    """`...` in a promise stands for anything."""
    pattern = re.escape(promise).replace(re.escape("..."), ".*")
    return re.fullmatch(pattern, line) is not None


def shell_env(**extra) -> dict[str, str]:
    """An activated venv's shell: the installed `streamlog` first on PATH."""
    return {**ENV, "PATH": f"{BIN}{os.pathsep}{ENV.get('PATH', '')}", **extra}


def give_venv(directory: Path) -> None:
    """`source .venv/bin/activate` in `directory` activates this interpreter's venv, as it
    would in the clone the README speaks of."""
    if (Path(sys.prefix) / "bin" / "activate").exists():
        (directory / ".venv").symlink_to(sys.prefix)
    else:  # not a venv: an activate that does what matters here
        (directory / ".venv" / "bin").mkdir(parents=True)
        (directory / ".venv" / "bin" / "activate").write_text(f'PATH="{BIN}:$PATH"\n')


def run_python(code: str, cwd: Path, timeout: float, env: dict | None = None) -> str:
    script = cwd / "readme_example.py"
    script.write_text(code, encoding="utf-8")
    done = subprocess.run([sys.executable, script.name], cwd=cwd, env=env or ENV,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


class Lines:
    """The stdout lines of a running process, with a timeout per line."""

    def __init__(self, process: subprocess.Popen):
        self.queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, args=(process.stdout,), daemon=True).start()

    def _pump(self, stream) -> None:
        for line in stream:
            self.queue.put(line.rstrip("\n"))
        self.queue.put(None)

    def next(self, timeout: float = 30) -> str | None:
        return self.queue.get(timeout=timeout)


def free_port_pair() -> int:
    """A port P with P + 1 and P + 2 free as well (the daemon's default metrics and
    console ports)."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            try:
                for neighbour in (port + 1, port + 2):
                    with socket.socket() as b:
                        b.bind(("127.0.0.1", neighbour))
            except OSError:
                continue
        return port
    raise RuntimeError("no three adjacent free ports")


def wait_for_port(port: int, process: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"the daemon did not listen on {port} within {timeout} s")


def stop(process: subprocess.Popen, sig=signal.SIGTERM) -> int:
    """Signal the process group the test started (start_new_session) and reap it."""
    if process.poll() is None:
        os.killpg(process.pid, sig)
    try:
        return process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return process.wait()


# -- the blocks ------------------------------------------------------------------------------

@pytest.mark.slow
def test_quick_start(tmp_path):
    """Append and read with the CLI, follow, then a daemon used from Python and the CLI,
    in one working directory, in the README's order (each step sees the earlier ones' log)."""
    assert (BIN / "streamlog").exists(), "the project is not installed: run ./dev once"
    append_read, follow, serve, client = section_blocks("Quick start")
    give_venv(tmp_path)

    # 1. Append two JSON lines, read them back: exactly the promised lines.
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", append_read.text],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out, expected = done.stdout.splitlines(), promises(append_read)
    assert len(expected) == 3 and len(out) == len(expected), (out, expected)
    for promise, line in zip(expected, out):
        assert matches(promise, line), (promise, line)

    # 2. --follow prints what is there, then what another process appends, until Ctrl-C.
    # It runs on a copy of the log, so that the next steps see the log as a reader who
    # only watched would leave it.
    elsewhere = tmp_path / "follow"
    shutil.copytree(tmp_path / "data", elsewhere / "data")
    assert follow.text.strip() == "streamlog read ./data/mylog --stream clicks --follow"
    process = subprocess.Popen(["bash", "-c", follow.text], cwd=elsewhere, env=shell_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        lines = Lines(process)
        first = [lines.next(), lines.next()]
        assert all(matches(p, l) for p, l in zip(expected[1:], first)), first
        subprocess.run(["bash", "-c", "echo '{\"key\": \"user-3\", \"value\": \"/help\"}' "
                        "| streamlog append ./data/mylog --stream clicks"],
                       cwd=elsewhere, env=shell_env(), check=True, capture_output=True,
                       timeout=60)
        followed = lines.next()
        assert followed is not None and matches(
            '{"stream": "clicks", "partition": 0, "offset": 2, "timestamp": 17..., '
            '"key": "user-3", "value": "/help"}', followed), followed
    finally:
        code = stop(process, signal.SIGINT)
    assert code == 130, (code, process.stderr.read())  # "interrupted" (streamlog --help)

    # 3. The daemon, on a free port rather than 7541 (a daemon of a benchmark or another
    # test may hold that one): `--port P` here, `127.0.0.1:P` in the URLs.
    port = free_port_pair()
    assert "streamlog serve ./data/mylog\n" in serve.text
    token = re.search(r"export STREAMLOG_TOKEN=(\S+)", serve.text).group(1)
    daemon = subprocess.Popen(
        ["bash", "-c", serve.text.replace("streamlog serve ./data/mylog",
                                          f"streamlog serve ./data/mylog --port {port}")],
        cwd=tmp_path, env=shell_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, start_new_session=True)
    try:
        wait_for_port(port, daemon)
        # 4. From Python, in another shell with the same token.
        assert "streamlog://127.0.0.1:7541" in client.text
        out = run_python(client.text.replace("127.0.0.1:7541", f"127.0.0.1:{port}"),
                         tmp_path, 60, env={**ENV, "STREAMLOG_TOKEN": token}).splitlines()
        assert out[0] == "RecordPosition(partition=0, offset=2)"
        assert "# RecordPosition(partition=0, offset=2)" in client.text  # as promised
        assert out[1:] == ["0 b'user-1' b'/home'", "1 b'user-2' b'/cart'",
                           "2 b'user-1' b'/pay'"]
        assert "# 0 b'user-1' b'/home' ..." in client.text
        # The CLI with the URL, as the text before the block says.
        command = " ".join(re.search(r"`(streamlog read\s+streamlog://127\.0\.0\.1:7541"
                                     r"\s+--stream clicks)`", section_text("Quick start"))
                           .group(1).split())
        done = subprocess.run(["bash", "-c", command.replace("7541", str(port))],
                              cwd=tmp_path, env=shell_env(STREAMLOG_TOKEN=token),
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert [line.split('"value": ')[1] for line in done.stdout.splitlines()] == [
            '"/home"}', '"/cart"}', '"/pay"}']
    finally:
        stop(daemon)


def test_using_the_log(tmp_path):
    (block,) = section_blocks("Using the log")
    out = run_python(block.text, tmp_path, timeout=60).splitlines()
    # Three records, all keys hashing to partition 1 of 4 on a fresh log.
    assert out[0] == "RecordPosition(partition=1, offset=0)"
    assert "# RecordPosition(partition=1, offset=0)" in block.text
    # Replay from 2026-01-01 in every partition: the two event-time records, after the
    # first (its append time is later than that, so its high-water mark reaches it too,
    # as it does for every record after 2026-01-01).
    replay = out[1:-2]
    assert replay[-2:] == ["1 1 1767225600000000 b'k1' b'a'",
                           "1 2 1767225600000000 b'k2' b'b'"]
    assert all(line.startswith("1 0 ") and line.endswith(" b'user-1' b'{\"page\": \"/\"}'")
               for line in replay[:-2]) and len(replay) <= 3
    # The bounded live tail: the two records appended after it started, then the end.
    assert out[-2:] == ["followed 3 b'c'", "followed 4 b'd'"]
    assert "# followed 3 b'c', then followed 4 b'd'" in block.text


def test_the_command_line_synopsis_names_real_options():
    (block,) = section_blocks("Command line")
    commands: dict[str, set[str]] = {}
    for name, rest in re.findall(r"streamlog (\w+)((?:(?!streamlog ).)*)", block.text):
        commands.setdefault(name, set()).update(re.findall(r"--[a-z]+(?:-[a-z]+)*", rest))
    assert set(commands) == {"append", "read", "info", "dump", "verify", "repair", "serve"}
    for name, options in commands.items():
        done = subprocess.run([sys.executable, "-m", "streamlog.cli", name, "--help"],
                              env=ENV, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        missing = [o for o in options if o not in done.stdout]
        assert not missing, f"streamlog {name} has no {missing}"


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.xdist_group("spark")  # one JVM at a time, beside the Spark tests' own
def test_the_spark_example(tmp_path):
    """As printed, in a plain `python` of the installed project: no PYSPARK_PYTHON and no
    PYTHONPATH (the example's first line sets the one, and format("streamlog") is found
    through the installed pyspark_streamlog module, with no register call)."""
    pytest.importorskip("pyspark")
    (block,) = section_blocks("Spark")
    assert "register(" not in block.text
    out = run_python(block.text, tmp_path, timeout=540)
    rows = [[cell.strip() for cell in line.strip("|").split("|")]
            for line in out.splitlines() if line.startswith("|")]
    assert rows[0] == ["partition", "offset", "timestamp", "key", "value"]
    records = sorted((r[3], r[4]) for r in rows[1:4])
    assert records == [("u1", "/home"), ("u1", "/pay"), ("u2", "/cart")]
    assert rows[4:] == [["value"], ["/CART"], ["/HOME"], ["/PAY"]]
    assert "# /CART, /HOME, /PAY" in block.text


@pytest.mark.slow
def test_dev_demo_runs_the_main_job(tmp_path):
    """`./dev demo` as printed, with its log in a temporary directory (--log) instead of
    the repository's data/demo, which a developer's own demo may be using."""
    (block,) = [b for b in readme_blocks() if b.section == ""]
    assert [line.split("#")[0].strip() for line in block.text.splitlines()] == [
        "./dev demo", "./dev test"]
    stamp = subprocess.run("cksum < pyproject.toml", shell=True, cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()[0]
    if not (ROOT / ".venv" / f".installed-{stamp}").exists():
        pytest.skip("pyproject.toml changed since .venv was set up: ./dev would reinstall "
                    "the project under the running tests")
    done = subprocess.run([str(ROOT / "dev"), "demo", "--log", str(tmp_path / "demo"),
                           "--records", "20000"], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    # What the README says it does: appends, replays from a time, follows, reopens.
    for fragment in ("appended 20,000 records", "replayed from high-water mark",
                     "followed the live tail", "reopened in"):
        assert fragment in done.stdout, done.stdout
    assert "usage" in subprocess.run([str(ROOT / "dev"), "demo", "--help"], env=ENV,
                                     capture_output=True, text=True, timeout=60).stdout


# -- ./dev itself ----------------------------------------------------------------------------

def dev(*args: str) -> subprocess.CompletedProcess:
    # None of these set anything up: usage and listings come before the venv.
    return subprocess.run([str(ROOT / "dev"), *args], env=ENV, capture_output=True,
                          text=True, timeout=60)


def test_dev_without_a_command_prints_its_usage_and_exits_2():
    for args in ((), ("no-such-command",)):
        done = dev(*args)
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.count("usage: ./dev COMMAND") == 1
        for command in ("demo", "test", "bench", "streamlog", "python", "help"):
            assert f"\n  {command} " in done.stderr
        assert "examples:" in done.stderr and "set -euo" not in done.stderr
    assert "unknown command 'no-such-command'" in dev("no-such-command").stderr
    helped = dev("help")
    assert helped.returncode == 0 and helped.stderr == ""
    assert helped.stdout.startswith("usage: ./dev COMMAND")


def benchmarks() -> list[str]:
    return sorted(p.stem for p in (ROOT / "bench").glob("*.py") if not p.stem.startswith("_"))


def test_dev_bench_lists_the_benchmarks():
    for args, first in ((("bench",), "usage: ./dev bench NAME"),
                        (("bench", "nosuch"), "./dev bench: no benchmark named 'nosuch'"),
                        (("bench", "_common"), "./dev bench: no benchmark named '_common'")):
        done = dev(*args)
        assert done.returncode == 2 and done.stdout == ""
        lines = done.stderr.splitlines()
        assert lines[0].startswith(first)
        listed = [line.split()[0] for line in lines[2:]]
        assert listed == benchmarks() and "core" in listed
        core = next(line for line in lines if line.split()[0] == "core")
        docstring = (ROOT / "bench" / "core.py").read_text().split('"""')[1].splitlines()[0]
        assert core.split(None, 1)[1] == docstring.strip()


def test_every_dev_command_in_the_readme_exists():
    text = README.read_text(encoding="utf-8")
    usage = dev("help").stdout
    for command in set(re.findall(r"\./dev (\w+)", text)):
        assert f"\n  {command} " in usage, f"./dev {command}"
    for name in set(re.findall(r"\./dev bench (\w+)", text)):
        assert name in benchmarks(), f"./dev bench {name}: no bench/{name}.py"


@pytest.mark.slow
def test_kafka_clients(tmp_path, kcat):
    """The Kafka section as printed, on free ports: kcat produces through the daemon's
    Kafka listener, our CLI reads what it wrote, and confluent-kafka consumes it."""
    produce, consume = section_blocks("Kafka clients")
    port, kafka_port = free_port_pair(), free_port_pair()
    script = (produce.text.replace("--port 7551", f"--port {port}")
              .replace("9092", str(kafka_port)))
    assert script != produce.text and "&\n" in script
    serve_line, rest = script.split("&\n", 1)
    env = shell_env()
    daemon = subprocess.Popen(["bash", "-c", serve_line], cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        wait_for_port(kafka_port, daemon)
        done = subprocess.run(["bash", "-c", rest.replace("kcat ", f"{kcat} ")], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        promised = [line[2:] for line in rest.splitlines() if line.startswith("# {")]
        got = done.stdout.splitlines()
        assert len(got) == len(promised) == 2
        assert all(matches(p, g) for p, g in zip(promised, got)), got
        out = run_python(consume.text.replace("9092", str(kafka_port)), tmp_path, 60)
        assert out.splitlines() == ["0 b'user-1' b'/home'", "1 b'user-2' b'/cart'"]
        assert "# 0 b'user-1' b'/home' ..." in consume.text
    finally:
        stop(daemon)


def test_the_console(tmp_path):
    """The console section as printed, on free ports: the daemon with its console, then
    the script's read of the overview through HTTP Basic."""
    (block,) = section_blocks("The console")
    port = free_port_pair()
    script = block.text.replace("7541", str(port)).replace("7543", str(port + 2))
    assert script != block.text and "&\n" in script
    serve_line, rest = script.split("&\n", 1)
    export = serve_line.splitlines()[0]
    assert export.startswith("export STREAMLOG_TOKEN=")  # the shell's, for both halves
    env = shell_env()
    daemon = subprocess.Popen(["bash", "-c", serve_line], cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        wait_for_port(port + 2, daemon)
        done = subprocess.run(["bash", "-c", f"{export}\n{rest}"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        promised = [line[2:] for line in rest.splitlines() if line.startswith("# ")]
        got = done.stdout.splitlines()
        assert len(got) == len(promised) >= 2
        assert all(matches(p, g) for p, g in zip(promised, got)), got
    finally:
        stop(daemon)


@pytest.mark.xdist_group("s3")
def test_past_one_machine(tmp_path, s3_server):
    """The store from the suite's server (what `./dev store` starts, with the variables
    it prints), then the block as printed: a tiered log under durability remote, read,
    info and verify from the store with no local state, the directory deleted and the
    script run again (restored first, then two more records)."""
    (block,) = section_blocks("Past one machine: the log in an object store")
    first, rest = block.text.split("\n", 1)
    assert first.startswith("./dev store") and "export AWS_ENDPOINT_URL" in first
    give_venv(tmp_path)
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", rest], cwd=tmp_path,
                          env={**ENV, **s3_server.env}, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    records = [line for line in out if line.startswith('{"stream": "clicks"')]
    assert sorted(line.split('"value": ')[1] for line in records) == ['"/cart"}', '"/home"}']
    assert any(line.startswith("store s3://streamlog/demo: manifest generation")
               for line in out), out
    assert any(line.startswith("verified 2 partitions") and line.endswith(": ok")
               for line in out), out
    import streamlog
    with streamlog.open_log("s3://streamlog/demo",
                            storage_options=s3_server.storage_options) as log:
        values = sorted(r.value for n in range(2) for r in log.reader("clicks", n))
    assert values == [b"/cart", b"/cart", b"/home", b"/home"]
