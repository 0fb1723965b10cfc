"""Operators recovered on another machine, against a real store, crashing for real
(DESIGN 7, 8, 11): the windowed aggregate job (operators/cec.py) runs in a process
that is SIGKILLed at random moments; every time its machine is gone with it (its
directory is deleted) and the next run starts in a NEW directory, from the store
alone: the input read straight from the store, the output log restored from the
store (tiered, durability "remote"), CRB's checkpoints in the store
(ObjectCheckpointStore), CEC's footprints in the output. Once a run is let finish, the
results in the store's output (data records: the R's) must be exactly those of a
failure-free run: none missing, none duplicated, same values, same order.

A quarter of the kills land at a random moment of the job's start (opening the input
in the store, restoring the output, recovering), the others after a random number of
its chunks (replayed ones included) plus a random part of the next one, so kills fall
during a restore, a recovery's truncate, a checkpoint's PUT and a chunk's group commit
alike; the test prints how many landed where, and how each run recovered. The input has skewed keys (a few hot keys, a long tail of cold,
slow windows), runs of equal timestamps and late records.

`STREAMLOG_KILL_TRIALS=N` kills each operator N times (default 10: CRB and CEC, 20
kills in all); `STREAMLOG_KILL_SEED` picks another seed (printed with every failure).
"""

from __future__ import annotations

import collections
import os
import random
import shutil
import struct
import time

import pytest

import streamlog
from streamlog.operators import ObjectCheckpointStore
from streamlog.operators.aggregate import AggregateOperator, WindowSpec
from streamlog.operators.runtime import OperatorRuntime
from streamlog.records import RecordKind
from tests.sim.operator_runs import run_child  # the job as cec_child.py runs it

TRIALS = int(os.environ.get("STREAMLOG_KILL_TRIALS", 10))  # kills per operator
SEED = int(os.environ.get("STREAMLOG_KILL_SEED", "20241126"))
INPUT_RECORDS = 4000
CHUNK_RECORDS = 20
WINDOW = {"kind": "count", "size": 9}
CEC = {"q_target": 60, "u_target": 100, "ci_ms": 2.0, "cp_ms": 4.0}
JITTER_S_MAX = 0.02  # after the chosen chunk: lands anywhere in the next one or two
STARTUP_SHARE = 0.25  # of the kills aimed at the start: the opens, the restore, recovery
STARTUP_S_MAX = 0.4  # ...at a random moment this long after it is up

@pytest.fixture(scope="module")
def input_url(s3_server, tmp_path_factory) -> str:
    """The input, in the store only: written by a tiered log whose directory is gone."""
    url = s3_server.url(s3_server.new_prefix())
    rng = random.Random(SEED)
    keys = [b"item-%d" % (int(rng.paretovariate(1.0)) % 60) for _ in range(INPUT_RECORDS)]
    values = [struct.pack("<q", rng.randint(1, 500)) + bytes(24) for _ in range(INPUT_RECORDS)]
    stamps = [5_000_000 + (i // 8) * 2000 - (rng.randint(1, 40_000) if rng.random() < 0.03
                                             else 0) for i in range(INPUT_RECORDS)]
    path = tmp_path_factory.mktemp("input-machine") / "in"
    with streamlog.open_log(path, remote=url, durability="remote", fsync="never",
                            storage_options=s3_server.storage_options) as log:
        log.create_stream("in")
        log.append_batch_sync("in", values, keys=keys, timestamps_us=stamps)
    shutil.rmtree(path)
    return url


def results(log) -> list[tuple]:
    return [(r.key, r.timestamp_us, r.value) for r in log.reader("out", 0)]


@pytest.fixture(scope="module")
def expected(input_url, s3_server, tmp_path_factory) -> list[tuple]:
    """The results of a failure-free run (a local output, no store, no checkpoints)."""
    path = tmp_path_factory.mktemp("reference") / "out"
    with streamlog.open_log(input_url, storage_options=s3_server.storage_options) as input_log, \
            streamlog.open_log(path, fsync="never") as output_log:
        runtime = OperatorRuntime(AggregateOperator(WindowSpec(**WINDOW)), input_log=input_log,
                                  input_stream="in", output_log=output_log, output_stream="out",
                                  chunk_records=CHUNK_RECORDS, progress=None)
        runtime.recover()
        runtime.run()
        found = results(output_log)
    assert len(found) > 300
    return found


def job_spec(mode: str, input_url: str, output_url: str, directory) -> dict:
    return {"input_remote": input_url, "input_stream": "in",
            "output_path": str(directory / "out"), "output_remote": output_url,
            "output_stream": "out", "store_remote": output_url, "mode": mode,
            "window": WINDOW, "cec": CEC, "checkpoint_interval_s": 0.05,
            "chunk_records": CHUNK_RECORDS, "fsync": "never",
            "output_options": {"segment_bytes_max": 32 * 1024, "remote_commit_ms": 2}}


def kill_point(rng: random.Random, budget: int) -> tuple[int, float]:
    """(chunks, then seconds) after which a run is killed: a share of the kills at a
    random moment of its start (0 chunks), the others after 1..`budget` chunks plus a
    random part of the next."""
    if rng.random() < STARTUP_SHARE:
        return 0, rng.uniform(0, STARTUP_S_MAX)
    return rng.randint(1, budget), rng.uniform(0, JITTER_S_MAX)


def kill_series(mode: str, input_url: str, s3_server, tmp_path, rng: random.Random,
                kills_max: int, budget: int) -> dict:
    """One output in the store, killed up to `kills_max` times (at `kill_point`s; each
    run in a new directory, the last one deleted), then run to the end in a new
    directory; a run that ends before its kill point ends the series. Returns what
    happened."""
    output_url = s3_server.url(s3_server.new_prefix())
    env = {**os.environ, **s3_server.env}
    ends, methods, early = [], [], 0
    for run in range(kills_max):
        machine = tmp_path / f"machine-{run}"
        decided = len(methods)
        outcome, summary = run_child(job_spec(mode, input_url, output_url, machine),
                                     *kill_point(rng, budget), env=env,
                                     on_method=methods.append)
        assert outcome != "refused", summary
        shutil.rmtree(machine, ignore_errors=True)  # the machine is gone, its disk with it
        if outcome == "completed":  # the kill point came after the input's end
            return {"url": output_url, "kills": len(ends), "ends": ends, "summary": summary,
                    "machine": None, "methods": methods, "early": early}
        early += len(methods) == decided  # killed before its recovery had decided
        with streamlog.open_log(output_url, storage_options=s3_server.storage_options) as view:
            ends.append(len(results(view)) if "out" in view.streams() else 0)
    machine = tmp_path / "machine-last"
    outcome, summary = run_child(job_spec(mode, input_url, output_url, machine), None,
                                 env=env, on_method=methods.append)
    assert outcome == "completed"
    return {"url": output_url, "kills": len(ends), "ends": ends, "summary": summary,
            "machine": machine, "methods": methods, "early": early}


@pytest.mark.xdist_group("s3")
@pytest.mark.parametrize("mode", ["crb", "cec"])
def test_an_operator_killed_again_and_again_recovers_elsewhere_from_the_store(
        mode, input_url, expected, s3_server, tmp_path):
    rng = random.Random(f"{SEED}-{mode}")
    # Kill points spread so that the kills of one series use up about half the input.
    budget = max(4, INPUT_RECORDS // CHUNK_RECORDS // max(1, TRIALS))
    started = time.monotonic()
    kills, series, mid_run_kills, early, recoveries = 0, 0, 0, 0, collections.Counter()
    while kills < TRIALS:
        found = kill_series(mode, input_url, s3_server, tmp_path / f"series-{series}", rng,
                            TRIALS - kills, budget)
        series += 1
        kills += found["kills"]
        mid_run_kills += sum(1 for end in found["ends"] if 0 < end < len(expected))
        recoveries.update(found["methods"])
        early += found["early"]
        where = (f"seed {SEED}, {mode}, series {series}: {found['kills']} kills, results in "
                 f"the store after each {found['ends']}, the last recovery "
                 f"{found['summary']['report']}")
        with streamlog.open_log(found["url"], storage_options=s3_server.storage_options) as view:
            got = results(view)
            kinds = {r.kind for r in view.reader("out", 0, data_only=False)}
        assert len(got) == len(expected), where
        assert got == expected, where
        if found["machine"] is not None:  # the last machine's directory agrees
            with streamlog.open_log(found["machine"] / "out", readonly=True) as local:
                assert results(local) == expected, where
        if mode == "cec":
            assert RecordKind.G_OPEN in kinds, where
        else:
            assert kinds == {RecordKind.DATA, RecordKind.CHECKPOINT}, where  # + notes
            ids = ObjectCheckpointStore(found["url"], storage_options=s3_server.storage_options
                                        ).sequence_ids()
            assert ids and len(ids) <= 3 + 1, f"{where}: checkpoints in the store: {ids}"
        assert series <= TRIALS, "the kills never land before the input's end"
    elapsed_s = time.monotonic() - started
    print(f"{mode}: {kills} kills in {series} series, {elapsed_s:.1f} s; each run in a new "
          f"directory, from the store alone; {early} before recovery had decided, "
          f"{mid_run_kills} after output was written; recoveries by method: "
          f"{dict(recoveries)}")
    assert mid_run_kills >= min(3, kills), f"seed {SEED}, {mode}: too few mid-run kills"
    assert recoveries[mode] >= min(3, kills), (  # it recovered from what it kept
        f"seed {SEED}, {mode}: recoveries by method {dict(recoveries)}")
