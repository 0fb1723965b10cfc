"""Several writer processes on one local log (DESIGN 9), killed for real.

Four processes append to the same three partitions while a fifth, a read-only view,
follows every partition by refreshing (as `streamlog read --follow` does), and a sixth,
another read-only view, follows them with `reader(follow=True)` alone (four followers,
two of them on partition 0, each taking the appends in by itself); one writer also
follows partition 0 through its writable log (it sees the others' appends by polling).
At random moments any of the six is SIGKILLed (mid-commit, mid-roll, mid-refresh) and a
new one takes its place. Afterwards:

* every acknowledged record is in the log, at the offset its writer was told, with its
  value; offsets are dense; no value appears twice (nothing written twice, nothing
  torn delivered);
* each read-only follower saw every record of its partition exactly once, in order,
  as the log holds it (its restarts resume from its last line): what a view delivers
  is a prefix of the partition, and nothing it delivered was lost;
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

from multi_writer_child import PARTITIONS, STREAM, TAIL_FOLLOWERS

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


def _followed_to(follow_out: str, tail_out: str) -> dict[str, int]:
    """How far each read-only follower got: follower -> the offset after its last."""
    seen = {}
    for _, partition, offset, _ in _lines(follow_out):
        seen[f"view p{partition}"] = max(seen.get(f"view p{partition}", 0), int(offset) + 1)
    for _, name, _, offset, _ in _lines(tail_out):
        seen[f"tail {name}"] = max(seen.get(f"tail {name}", 0), int(offset) + 1)
    return seen


def _ends_of_followers(ends: list[int]) -> dict[str, int]:
    out = {f"view p{p}": end for p, end in enumerate(ends) if end}
    out.update({f"tail {name}": ends[p] for name, p in TAIL_FOLLOWERS.items() if ends[p]})
    return out


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
    tail_out = str(out / "view.tail")
    views = {"view": ["follow", path, follow_out], "tail": ["tail", path, tail_out]}
    children = {slot: start_writer(slot) for slot in range(WRITERS)}
    for name, argv in views.items():
        children[name] = Child(argv, stderr_path)
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
            children[victim] = (Child(views[victim], stderr_path)
                                if victim in views else start_writer(victim))
        for slot in range(WRITERS):  # the writers stop; the views must catch up
            children.pop(slot).kill()
        context = f"seed={SEED} kills={schedule}"
        with streamlog.open_log(path, readonly=True) as log:
            ends = [log.end_offset(STREAM, p) for p in range(PARTITIONS)]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if _followed_to(follow_out, tail_out) == _ends_of_followers(ends):
                break
            children["view"].check_alive("the refreshing read-only follower", context)
            children["tail"].check_alive("the following read-only view", context)
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

    followed = {f"view p{p}": (p, []) for p in range(PARTITIONS)}
    followed.update({f"tail {name}": (p, []) for name, p in TAIL_FOLLOWERS.items()})
    for _, partition, offset, value in _lines(follow_out):
        followed[f"view p{partition}"][1].append((int(offset), value))
    for _, name, partition, offset, value in _lines(tail_out):
        assert TAIL_FOLLOWERS[name] == int(partition), f"{context}: {name} read {partition}"
        followed[f"tail {name}"][1].append((int(offset), value))
    for follower, (partition, lines) in followed.items():
        records = held[partition]
        assert [o for o, _ in lines] == list(range(len(records))), \
            f"{context}: {follower} did not see partition {partition} once each, in order"
        for offset, value in lines:
            assert records[offset].startswith(value.encode()), \
                f"{context}: {follower} saw {value} at {partition}/{offset}"

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
