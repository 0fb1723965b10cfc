"""Window operators with CEC under real crashes: the job killed with SIGKILL (DESIGN 8).

Each trial runs `windows_child.py` (a hopping or sliding window operator, by count or by
time, with CEC, fsync="always", small chunks so there is an fsync every dozen input
records) on a fresh output, kills it with SIGKILL at a random point of its progress
(after a random number of chunks plus a random part of the next one; 0 chunks: during
start-up and recovery), so kills land during recovery, a truncate or a chunk append
alike, restarts it, and so on until a run completes. Then the results in the output
(its data records) must be exactly those of a failure-free run: none missing, none
duplicated, same values, same order. The input has skewed keys (a few hot keys, a long
tail of slow windows), runs of equal timestamps and late records.

The seed is printed with every failure; set WINDOWS_CRASH_SEED to replay another one.
"""

from __future__ import annotations

import os
import random

import pytest

import streamlog
from streamlog.operators.runtime import OperatorRuntime
from streamlog.operators.window_cec import read_window_results
from streamlog.operators.window_functions import CollectOffsets
from streamlog.operators.windows import WindowedOperator
from streamlog.records import RecordKind
import operator_runs
from operator_runs import skewed_input  # beside this file, on sys.path
from windows_child import build_assigner

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("WINDOWS_CRASH_SEED", "20240617"))
INPUT_RECORDS = 2000
CHUNK_RECORDS = 12
TRIALS = 2
KILLS_MAX = 4  # per trial; then the run is left to finish
JITTER_S_MAX = 0.01  # after the chosen chunk: lands anywhere in the next one
_CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "windows_child.py")
ASSIGNERS = {
    "hopping-count": {"type": "hopping", "size": 9, "hop": 4, "by": "count"},
    "hopping-time": {"type": "hopping", "size": 24_000, "hop": 8_000, "by": "time"},
    "sliding-count": {"type": "sliding", "size": 4, "by": "count"},
    "sliding-time": {"type": "sliding", "size": 15_000, "by": "time"},
}
CEC = {"q_target": 60, "u_target": 150, "ci_ms": 2.0, "cp_ms": 4.0}


@pytest.fixture(scope="module")
def input_path(tmp_path_factory) -> str:
    return skewed_input(str(tmp_path_factory.mktemp("windows-input") / "in"), SEED,
                        INPUT_RECORDS, keys=60, value_bytes=48)


def failure_free(input_path: str, assigner: dict, tmp_path) -> list[tuple]:
    with streamlog.open_log(input_path, readonly=True) as input_log, \
            streamlog.open_log(tmp_path / "reference", fsync="never") as output_log:
        operator = WindowedOperator(build_assigner(assigner), CollectOffsets())
        runtime = OperatorRuntime(operator, input_log=input_log, input_stream="in",
                                  output_log=output_log, output_stream="out", progress=None)
        runtime.recover()
        runtime.run()
        return results(output_log)


def results(log) -> list[tuple]:
    return [(r.key, r.window_start, r.window_end, r.count, r.value, r.timestamp_us,
             r.input_offset) for r in read_window_results(log, "out")]


def crash_until_done(spec: dict, rng: random.Random) -> tuple[int, list[int], dict]:
    """operator_runs.crash_until_done for this test's job."""
    return operator_runs.crash_until_done(spec, rng, chunks=INPUT_RECORDS // CHUNK_RECORDS,
                                          kills_max=KILLS_MAX, jitter_s_max=JITTER_S_MAX,
                                          results=results, child=_CHILD)


@pytest.mark.parametrize("name", list(ASSIGNERS))
def test_sigkilled_window_operator_recovers_the_failure_free_results(input_path, tmp_path,
                                                                     name):
    expected = failure_free(input_path, ASSIGNERS[name], tmp_path)
    assert len(expected) > 300
    rng = random.Random(f"{SEED}-{name}")
    kills_total, mid_run_kills, recoveries = 0, 0, set()
    for trial in range(TRIALS):
        spec = {"input_path": input_path, "input_stream": "in",
                "output_path": str(tmp_path / f"out-{trial}"), "output_stream": "out",
                "assigner": ASSIGNERS[name], "cec": CEC, "chunk_records": CHUNK_RECORDS,
                "fsync": "always", "output_options": {"segment_bytes_max": 64 * 1024}}
        kills, ends, summary = crash_until_done(spec, rng)
        kills_total += kills
        mid_run_kills += sum(1 for end in ends if 0 < end < len(expected))
        recoveries.add(summary["report"]["method"])
        with streamlog.open_log(spec["output_path"], readonly=True) as log:
            got = results(log)
            kinds = {r.kind for r in log.reader("out", 0, data_only=False)}
        where = (f"seed {SEED}, {name}, trial {trial}, kills {kills}, "
                 f"results after each kill {ends}")
        assert len(got) == len(expected), where
        assert got == expected, where
        assert RecordKind.G_OPEN in kinds and RecordKind.G_CHECK in kinds, where
    assert kills_total >= 1, f"seed {SEED}: no run was killed"
    assert mid_run_kills >= 1, f"seed {SEED}: no kill came after output was written"
    assert "cec" in recoveries, f"seed {SEED}: never recovered from the output"
