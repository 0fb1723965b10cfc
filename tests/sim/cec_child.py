"""The process that test_cec_crash.py and test_operator_retention_kill.py kill: one run
of the windowed aggregate job.

Usage: python cec_child.py SPEC_JSON

Prints READY once streamlog is imported, "R <method>" once its recovery has decided
(before the replay), then "C <input offset>" after each chunk the
operator processed (replayed ones included), so the parent can kill it at a chosen point
of its progress and see how far it read; opens the input read-only and the output with
the fsync policy of the spec, recovers (CRB from the checkpoint store or CEC from the
output), runs to the input end, and prints its summary (with the recovery report) as one
JSON line. A kill may come at any moment, including during recovery. When recovery
refuses because input it needs is gone (DataLossError), it prints
{"refused": message, "first_lost": a, "last_lost": b} and exits with status 3.
"""

import json
import sys

from streamlog.errors import DataLossError
from streamlog.operators import cec
from streamlog.operators.runtime import OperatorRuntime

REFUSED_EXIT = 3


def main() -> None:
    spec = json.loads(sys.argv[1])
    print("READY", flush=True)
    build, replay = cec.build_operator, OperatorRuntime.replay

    def reporting_replay(runtime):
        print(f"R {runtime.report.method}", flush=True)
        replay(runtime)

    OperatorRuntime.replay = reporting_replay

    def build_reporting(job_spec):
        operator = build(job_spec)
        after_chunk = operator.after_chunk

        def reporting_after_chunk(out):
            after_chunk(out)
            print(f"C {operator.last_offset}", flush=True)

        operator.after_chunk = reporting_after_chunk
        return operator

    cec.build_operator = build_reporting
    try:
        summary = cec.run_aggregate_job(spec)
    except DataLossError as error:
        print(json.dumps({"refused": str(error), "first_lost": error.first_lost,
                          "last_lost": error.last_lost}), flush=True)
        sys.exit(REFUSED_EXIT)
    print(json.dumps(summary, default=str), flush=True)


if __name__ == "__main__":
    main()
