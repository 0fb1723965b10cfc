"""Durability "remote" against a real store, crashing for real (DESIGN 11): a writer
process appending from several threads is SIGKILLed at random moments, and every
third time its local directory is deleted as well (the machine is gone); the next
writer opens the same directory (restoring it from the store when it is gone) and goes
on. At the end every acknowledged record is in the store, exactly once, at the offset
its ack gave, whether read from the store or from the last writer's directory.

`STREAMLOG_KILL_TRIALS=N` runs N kills instead of the default (the closing figure
comes from a run with 200)."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

import streamlog

TRIALS = int(os.environ.get("STREAMLOG_KILL_TRIALS", 16))
PARTITIONS = 4

WRITER = r"""
import os, sys, threading, streamlog
path, url, trial = sys.argv[1], sys.argv[2], int(sys.argv[3])
log = streamlog.open_log(path, remote=url, durability="remote", fsync="never",
                         segment_bytes_max=16384, remote_commit_ms=5, remote_max_lag_s=2)
log.create_stream("s", %(partitions)d)
print("open", flush=True)
lock = threading.Lock()

def work(thread):
    for i in range(10**6):
        value = b"%%d-%%d-%%d" %% (trial, thread, i)
        partition = (thread + i) %% %(partitions)d
        offset = log.append_sync("s", value, partition=partition).offset
        with lock:
            sys.stdout.write("ack %%d %%d %%s\n" %% (partition, offset, value.decode()))
            sys.stdout.flush()

for t in range(4):
    threading.Thread(target=work, args=(t,), daemon=True).start()
threading.Event().wait()
""" % {"partitions": PARTITIONS}


def run_writer(path, url: str, trial: int, env: dict, rng: random.Random) -> list[tuple]:
    """Start a writer, let it append for a random while, SIGKILL it; its acks."""
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(path), url, str(trial)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                             text=True, start_new_session=True)
    try:
        first = child.stdout.readline()
        assert first == "open\n", child.stderr.read()[-3000:]
        time.sleep(rng.uniform(0.02, 0.6))
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        out, err = child.communicate(timeout=60)
    acks = []
    for line in out.splitlines():
        words = line.split()
        if len(words) == 4 and words[0] == "ack":  # (a line cut by the kill is no ack)
            acks.append((int(words[1]), int(words[2]), words[3].encode()))
    return acks


@pytest.mark.xdist_group("s3")
def test_every_acknowledged_record_survives_kills_and_lost_directories(tmp_path, s3_server):
    url = s3_server.url(s3_server.new_prefix())
    env = {**os.environ, **s3_server.env}
    rng = random.Random(int(os.environ.get("STREAMLOG_KILL_SEED", "23")))
    path = tmp_path / "log"
    acked: dict[tuple[int, int], bytes] = {}
    deleted = 0
    for trial in range(TRIALS):
        for partition, offset, value in run_writer(path, url, trial, env, rng):
            assert acked.setdefault((partition, offset), value) == value, (
                f"offset {offset} of partition {partition} was acknowledged twice")
        if trial % 3 == 2:
            shutil.rmtree(path)
            deleted += 1
    print(f"{TRIALS} kills ({deleted} with the directory deleted), {len(acked)} acks")
    assert len(acked) > TRIALS  # the writers got work done between kills
    assert deleted == TRIALS // 3
    with streamlog.open_log(url, storage_options=s3_server.storage_options) as store_view:
        found = {(n, r.offset): r.value for n in range(PARTITIONS)
                 for r in store_view.reader("s", n)}
    missing = {key: value for key, value in acked.items() if found.get(key) != value}
    assert not missing, f"{len(missing)} acknowledged records not in the store: " \
                        f"{sorted(missing.items())[:5]}"
    values = list(found.values())
    assert len(values) == len(set(values)), "a record is in the store twice"
    if path.exists():  # the last writer's directory agrees with the store
        with streamlog.open_log(path, readonly=True) as local:
            assert all(local_value == found.get(key) for key, local_value in (
                ((n, r.offset), r.value) for n in range(PARTITIONS)
                for r in local.reader("s", n)) if key in found)
