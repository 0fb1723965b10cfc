"""Runs of `cec_child.py` for the operator crash tests: start the job, follow its
progress lines, SIGKILL it at a chosen point (test_cec_crash.py and
test_operator_retention_kill.py)."""

from __future__ import annotations

import json
import os
import random
import struct
import signal
import subprocess
import sys
import threading
import time
from typing import Callable

import streamlog

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cec_child.py")
RUN_S_MAX = 120.0
REFUSED_EXIT = 3  # cec_child.py: recovery refused (DataLossError)


def run_child(spec: dict, kill_after_chunks: int | None, jitter_s: float = 0.0, *,
              on_progress: Callable[[int], None] | None = None,
              on_method: Callable[[str], None] | None = None, env: dict | None = None,
              child: str = CHILD) -> tuple[str, dict | None]:
    """Start the job (in `env`, else this process's environment); SIGKILL it `jitter_s`
    after it reported `kill_after_chunks` chunks (0: during its start and recovery;
    None: let it finish). `on_progress(offset)` sees every chunk's last input offset,
    `on_method(method)` how its recovery decided. Returns ("killed" | "completed" |
    "refused", the job's last JSON line when it ended by itself)."""
    process = subprocess.Popen([sys.executable, child, json.dumps(spec)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env)
    lines: list[str] = []
    reached = threading.Event()

    def read() -> None:
        chunks = 0
        for line in process.stdout:
            if line.startswith("C "):
                chunks += 1
                if on_progress is not None:
                    on_progress(int(line.split()[1]))
            elif line.startswith("R "):
                if on_method is not None:
                    on_method(line.split()[1])
            else:
                lines.append(line)
            if kill_after_chunks is not None and line.startswith(("READY", "C ")) and (
                    chunks >= kill_after_chunks):
                reached.set()
        reached.set()

    errors: list[str] = []  # (read as it comes: a full pipe would stall the child)
    readers = [threading.Thread(target=read, daemon=True),
               threading.Thread(target=lambda: errors.append(process.stderr.read()),
                                daemon=True)]
    for reader in readers:
        reader.start()
    try:
        if kill_after_chunks is not None:
            assert reached.wait(RUN_S_MAX), "the job never reached the kill point"
            time.sleep(jitter_s)
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                process.wait(timeout=RUN_S_MAX)
                return "killed", None
        process.wait(timeout=RUN_S_MAX)
        for reader in readers:
            reader.join(timeout=RUN_S_MAX)
        if process.returncode == REFUSED_EXIT:
            return "refused", json.loads(lines[-1])
        assert process.returncode == 0, f"job failed ({process.returncode}): {errors}"
        return "completed", json.loads(lines[-1])
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for reader in readers:  # EOF follows the exit; then its pipes may close
            reader.join(timeout=RUN_S_MAX)
        process.stdout.close()
        process.stderr.close()


def skewed_input(path: str, seed: int, records: int, *, keys: int, value_bytes: int) -> str:
    """Input with skewed keys (a few hot, a long tail of slow windows), runs of equal
    timestamps (8 per 2 ms) and about 3% late records; returns `path`."""
    rng = random.Random(seed)
    keys_ = [b"item-%d" % (int(rng.paretovariate(1.0)) % keys) for _ in range(records)]
    values = [struct.pack("<q", rng.randint(1, 500)) + bytes(value_bytes - 8)
              for _ in range(records)]
    stamps = [5_000_000 + (i // 8) * 2000 - (rng.randint(1, 40_000) if rng.random() < 0.03
                                             else 0) for i in range(records)]
    with streamlog.open_log(path, fsync="always") as log:
        log.create_stream("in")
        log.append_batch_sync("in", values, keys=keys_, timestamps_us=stamps)
    return path


def crash_until_done(spec: dict, rng: random.Random, *, chunks: int, kills_max: int,
                     jitter_s_max: float, results, child: str = CHILD
                     ) -> tuple[int, list[int], dict]:
    """Kill the job at random points of its progress (after 0..`chunks` chunks) until a
    run completes, at most `kills_max` times, then let it finish. Returns (kills, the
    number of results(log) in the output after each kill, the completed run's summary)."""
    ends = []
    for _ in range(kills_max):
        outcome, summary = run_child(spec, rng.randint(0, chunks),
                                     rng.uniform(0, jitter_s_max), child=child)
        assert outcome != "refused", summary
        if outcome == "completed":
            return len(ends), ends, summary
        with streamlog.open_log(spec["output_path"], readonly=True) as log:
            ends.append(len(results(log)) if "out" in log.streams() else 0)
    outcome, summary = run_child(spec, None, child=child)
    assert outcome == "completed", summary
    return len(ends), ends, summary
