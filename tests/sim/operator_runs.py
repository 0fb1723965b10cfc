"""Runs of `cec_child.py` for the operator crash tests: start the job, follow its
progress lines, SIGKILL it at a chosen point (test_cec_crash.py and
test_operator_retention_kill.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Callable

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cec_child.py")
RUN_S_MAX = 120.0
REFUSED_EXIT = 3  # cec_child.py: recovery refused (DataLossError)


def run_child(spec: dict, kill_after_chunks: int | None, jitter_s: float = 0.0, *,
              on_progress: Callable[[int], None] | None = None) -> tuple[str, dict | None]:
    """Start the job; SIGKILL it `jitter_s` after it reported `kill_after_chunks` chunks
    (0: during its start and recovery; None: let it finish). `on_progress(offset)` sees
    every chunk's last input offset. Returns ("killed" | "completed" | "refused", the
    job's last JSON line when it ended by itself)."""
    process = subprocess.Popen([sys.executable, CHILD, json.dumps(spec)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reached = threading.Event()

    def read() -> None:
        chunks = 0
        for line in process.stdout:
            if line.startswith("C "):
                chunks += 1
                if on_progress is not None:
                    on_progress(int(line.split()[1]))
            else:
                lines.append(line)
            if kill_after_chunks is not None and line.startswith(("READY", "C ")) and (
                    chunks >= kill_after_chunks):
                reached.set()
        reached.set()

    reader = threading.Thread(target=read, daemon=True)
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
        reader.join(timeout=RUN_S_MAX)
        stderr = process.stderr.read()
        if process.returncode == REFUSED_EXIT:
            return "refused", json.loads(lines[-1])
        assert process.returncode == 0, f"job failed ({process.returncode}): {stderr}"
        return "completed", json.loads(lines[-1])
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()
        process.stderr.close()
