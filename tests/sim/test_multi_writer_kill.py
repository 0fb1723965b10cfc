"""Several writer processes on one local log (DESIGN 9), killed for real.

Four processes append to the same three partitions while a fifth, a read-only view,
follows every partition; one writer also follows partition 0 through its writable log
(it sees the others' appends by polling). At random moments any of the five is SIGKILLed
(mid-commit, mid-roll, mid-refresh) and a new one takes its place. Afterwards:

* every acknowledged record is in the log, at the offset its writer was told, with its
  value; offsets are dense; no value appears twice (nothing written twice, nothing
  torn delivered);
* the read-only follower saw every record of every partition exactly once, in order,
  as the log holds it (its restarts resume from its last line);
* each in-process follower saw a dense prefix of partition 0, as the log holds it;
* `streamlog verify` finds the log sound.

The run is seeded (SEED below, in every failure message); process scheduling is not,
so a failure names the seed and the kill schedule it followed.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import streamlog

from multi_writer_child import PARTITIONS, STREAM

_CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multi_writer_child.py")
SEED = 20261124
WRITERS = 4
RUN_S = 12.0


class Child:
    def __init__(self, argv: list[str], stderr_path: str) -> None:
        self.stderr = open(stderr_path, "ab")
        self.process = subprocess.Popen([sys.executable, _CHILD, *argv],
                                        stdout=subprocess.DEVNULL, stderr=self.stderr)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)
        self.stderr.close()

    def check_alive(self, what: str, context: str) -> None:
        assert self.process.poll() is None, \
            f"{context}: {what} exited by itself ({self.process.returncode})"


def _lines(path: str) -> list[list[str]]:
    """The complete lines of a child's output (a kill may cut the last one)."""
    if not os.path.exists(path):
        return []
    with open(path, "rb") as handle:
        data = handle.read()
    return [raw.decode().split(" ") for raw in data.split(b"\n")[:-1] if raw != b"READY"]


def test_four_writer_processes_and_followers_killed_at_random(tmp_path):
    rng = random.Random(SEED)
    path = str(tmp_path / "log")
    out = tmp_path / "out"
    out.mkdir()
    stderr_path = str(out / "stderr.txt")
    incarnations = {}
    acks, own_follows = [], []

    def start_writer(slot: int) -> Child:
        incarnation = incarnations[slot] = incarnations.get(slot, -1) + 1
        name = f"w{slot}.{incarnation}"
        ack = str(out / f"{name}.acks")
        acks.append(ack)
        argv = ["write", path, name, str(rng.randrange(1 << 30)), ack]
        if slot == 0:
            own_follows.append(str(out / f"{name}.follow"))
            argv += ["--follow", own_follows[-1]]
        return Child(argv, stderr_path)

    follow_out = str(out / "view.follow")
    children = {slot: start_writer(slot) for slot in range(WRITERS)}
    children["view"] = Child(["follow", path, follow_out], stderr_path)
    schedule = []
    started = time.monotonic()
    try:
        while time.monotonic() - started < RUN_S:
            time.sleep(rng.uniform(0.2, 1.0))
            victim = rng.choice(list(children))
            for name, child in children.items():
                child.check_alive(f"{name}", f"seed={SEED} after kills {schedule}")
            children[victim].kill()
            schedule.append((round(time.monotonic() - started, 2), victim))
            children[victim] = (Child(["follow", path, follow_out], stderr_path)
                                if victim == "view" else start_writer(victim))
        for slot in range(WRITERS):  # the writers stop; the view must catch up
            children.pop(slot).kill()
        context = f"seed={SEED} kills={schedule}"
        with streamlog.open_log(path, readonly=True) as log:
            ends = [log.end_offset(STREAM, p) for p in range(PARTITIONS)]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            seen = [0] * PARTITIONS
            for _, partition, offset, _ in _lines(follow_out):
                seen[int(partition)] = max(seen[int(partition)], int(offset) + 1)
            if seen == ends:
                break
            children["view"].check_alive("the read-only follower", context)
            time.sleep(0.1)
    finally:
        for child in children.values():
            child.kill()

    with open(stderr_path, "rb") as handle:
        errors = handle.read().decode(errors="replace")
    assert "Traceback" not in errors, f"{context}: a child failed:\n{errors[-3000:]}"

    # The log after all that, opened for writing (recovery of the last kills).
    with streamlog.open_log(path) as log:
        held = [{r.offset: r.value for r in log.reader(STREAM, p)} for p in range(PARTITIONS)]
    for partition, records in enumerate(held):
        assert sorted(records) == list(range(len(records))), \
            f"{context}: partition {partition} offsets are not dense"
    values = [v for records in held for v in records.values()]
    assert len(values) == len(set(values)), f"{context}: a value was written twice"

    acknowledged = 0
    for ack in acks:
        for _, partition, offset, value in _lines(ack):
            acknowledged += 1
            got = held[int(partition)].get(int(offset))
            assert got is not None and got.startswith(value.encode()), \
                f"{context}: {ack}: acknowledged {value} at {partition}/{offset}, log has {got!r}"
    assert acknowledged > 1000, f"{context}: too few appends to mean anything"
    print(f"{context}: {acknowledged} acknowledged, log holds {[len(h) for h in held]}")
    assert len({name for name in acks}) == len(acks)

    followed = [[] for _ in range(PARTITIONS)]
    for _, partition, offset, value in _lines(follow_out):
        followed[int(partition)].append((int(offset), value))
    for partition, records in enumerate(held):
        assert [o for o, _ in followed[partition]] == list(range(len(records))), \
            f"{context}: the read-only follower did not see partition {partition} once each"
        for offset, value in followed[partition]:
            assert records[offset].startswith(value.encode()), \
                f"{context}: the follower saw {value} at {partition}/{offset}"

    in_process = 0
    for follow in own_follows:
        lines = _lines(follow)
        assert [int(o) for _, o, _ in lines] == list(range(len(lines))), \
            f"{context}: {follow}: not a dense prefix of partition 0"
        for _, offset, value in lines:
            assert held[0][int(offset)].startswith(value.encode()), f"{context}: {follow}"
        in_process += len(lines)
    assert in_process > 0, f"{context}: the in-process followers saw nothing"
    from_others = sum(1 for follow in own_follows for _, _, value in _lines(follow)
                      if not value.startswith(os.path.basename(follow)[:-len(".follow")]))
    assert from_others > 0, f"{context}: in-process followers never saw another process"

    verify = subprocess.run([sys.executable, "-m", "streamlog", "verify", path],
                            capture_output=True, text=True, timeout=300)
    assert verify.returncode == 0, f"{context}: {verify.stdout}{verify.stderr}"
