"""Operator recovery under real crashes: the aggregate job killed with SIGKILL (DESIGN 7, 8).

Each trial runs `cec_child.py` (the windowed aggregate, fsync="always", small chunks so
there is an fsync every dozen input records) on a fresh output, kills it with SIGKILL at
a random point of its progress (after a random number of chunks, plus a random part of
the next one; 0 chunks: during start-up and recovery), so kills land during recovery, a
truncate, a checkpoint write or a chunk append alike, restarts it, and so on until a run
completes. Then the
results in the output (data records: the R's) must be exactly those of a failure-free
run: none missing, none duplicated, same values, same order. CRB recovers from its
LMDB checkpoint store, CEC from its own output log. The input has skewed keys (a few
hot keys, a long tail of cold, slow windows), runs of equal timestamps and late records.

The seed is printed with every failure; set CEC_CRASH_SEED to replay another one.
"""

from __future__ import annotations

import os
import random

import pytest

import streamlog
from streamlog.operators.aggregate import AggregateOperator, WindowSpec
from streamlog.operators.runtime import OperatorRuntime
from streamlog.records import RecordKind
import operator_runs
from operator_runs import skewed_input

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("CEC_CRASH_SEED", "20240612"))
INPUT_RECORDS = 5000
TRIALS = 3
KILLS_MAX = 4  # per trial; then the run is left to finish
JITTER_S_MAX = 0.01  # after the chosen chunk: lands anywhere in the next one
WINDOWS = {"count": {"kind": "count", "size": 9}, "time": {"kind": "time", "size": 25_000}}
CEC = {"count": {"q_target": 60, "u_target": 400, "ci_ms": 2.0, "cp_ms": 4.0},
       "time": {"u_target": 50, "ci_ms": 2.0, "cp_ms": 4.0}}


@pytest.fixture(scope="module")
def input_path(tmp_path_factory) -> str:
    return skewed_input(str(tmp_path_factory.mktemp("cec-input") / "in"), SEED,
                        INPUT_RECORDS, keys=80, value_bytes=100)


def failure_free(input_path: str, window: dict, tmp_path) -> list[tuple]:
    with streamlog.open_log(input_path, readonly=True) as input_log, \
            streamlog.open_log(tmp_path / "reference", fsync="never") as output_log:
        runtime = OperatorRuntime(AggregateOperator(WindowSpec(**window)), input_log=input_log,
                                  input_stream="in", output_log=output_log, output_stream="out")
        runtime.recover()
        runtime.run()
        return results(output_log)


def results(log) -> list[tuple]:
    return [(r.key, r.timestamp_us, r.value) for r in log.reader("out", 0)]


def crash_until_done(spec: dict, rng: random.Random) -> tuple[int, list[int], dict]:
    """operator_runs.crash_until_done for this test's job."""
    return operator_runs.crash_until_done(spec, rng,
                                          chunks=INPUT_RECORDS // spec["chunk_records"],
                                          kills_max=KILLS_MAX, jitter_s_max=JITTER_S_MAX,
                                          results=results)


def job_spec(input_path: str, tmp_path, name: str, mode: str, window: str) -> dict:
    return {"input_path": input_path, "input_stream": "in",
            "output_path": str(tmp_path / f"out-{name}"), "output_stream": "out",
            "store_path": str(tmp_path / f"ckpt-{name}"), "mode": mode,
            "window": WINDOWS[window], "cec": CEC[window], "checkpoint_interval_s": 0.03,
            "chunk_records": 12, "fsync": "always",
            "output_options": {"segment_bytes_max": 64 * 1024}}


@pytest.mark.parametrize("window", ["count", "time"])
@pytest.mark.parametrize("mode", ["crb", "cec"])
def test_sigkilled_operator_recovers_the_failure_free_output(input_path, tmp_path, mode, window):
    expected = failure_free(input_path, WINDOWS[window], tmp_path)
    assert len(expected) > 300
    rng = random.Random(f"{SEED}-{mode}-{window}")
    kills_total, mid_run_kills, recoveries = 0, 0, set()
    for trial in range(TRIALS):
        spec = job_spec(input_path, tmp_path, str(trial), mode, window)
        kills, ends, summary = crash_until_done(spec, rng)
        kills_total += kills
        mid_run_kills += sum(1 for end in ends if 0 < end < len(expected))
        recoveries.add(summary["report"]["method"])
        with streamlog.open_log(spec["output_path"], readonly=True) as log:
            got = results(log)
            kinds = {r.kind for r in log.reader("out", 0, data_only=False)}
        where = (f"seed {SEED}, {mode}/{window}, trial {trial}, kills {kills}, "
                 f"results after each kill {ends}")
        assert len(got) == len(expected), where
        assert got == expected, where
        if mode == "cec":
            assert RecordKind.G_OPEN in kinds, where
        else:
            assert kinds == {RecordKind.DATA, RecordKind.CHECKPOINT}, where  # + notes
    assert kills_total >= 1, f"seed {SEED}: no run was killed"
    assert mid_run_kills >= 1, f"seed {SEED}: no kill came after output was written"
    assert recoveries & {"crb", "cec"}, f"seed {SEED}: never recovered from a checkpoint"
