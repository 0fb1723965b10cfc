"""The process that test_cec_crash.py kills: one run of the windowed aggregate job.

Usage: python cec_child.py SPEC_JSON

Prints READY once streamlog is imported, then "C" after each chunk the operator
processed (replayed ones included), so the parent can kill it at a chosen point of its
progress; opens the input read-only and the output with the fsync policy of the spec,
recovers (CRB from the checkpoint store or CEC from the output), runs to the input end,
and prints its summary (with the recovery report) as one JSON line. A kill may come at
any moment, including during recovery.
"""

import json
import sys

from streamlog.operators import cec


def main() -> None:
    spec = json.loads(sys.argv[1])
    print("READY", flush=True)
    build = cec.build_operator

    def build_reporting(job_spec):
        operator = build(job_spec)
        after_chunk = operator.after_chunk

        def reporting_after_chunk(out):
            after_chunk(out)
            print("C", flush=True)

        operator.after_chunk = reporting_after_chunk
        return operator

    cec.build_operator = build_reporting
    print(json.dumps(cec.run_aggregate_job(spec), default=str), flush=True)


if __name__ == "__main__":
    main()
