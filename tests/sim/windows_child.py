"""The process that test_windows_crash.py kills: one run of a windowed operator with CEC.

Usage: python windows_child.py SPEC_JSON

Prints READY once streamlog is imported, then "C <input offset>" after each chunk the operator
processed (replayed ones included), so the parent can kill it at a chosen point of its
progress; opens the input read-only and the output with the fsync policy of the spec,
recovers from the output (CEC), runs to the input end, and prints a summary (with the
recovery report) as one JSON line. A kill may come at any moment, including during
recovery.

Spec: input_path, input_stream, output_path, output_stream, assigner {type: tumbling |
hopping | sliding, size, hop, by}, function (collect | sum), cec {CECPolicy fields},
chunk_records, fsync, output_options.
"""

import dataclasses
import json
import sys

import streamlog
from streamlog.operators.cec_policy import CECPolicy
from streamlog.operators.runtime import OperatorRuntime
from streamlog.operators.window_functions import (CollectOffsets, Hopping, Sliding, SumInt64,
                                                  Tumbling)
from streamlog.operators.windows import WindowedOperator


class ReportingOperator(WindowedOperator):
    def after_chunk(self, out) -> None:
        super().after_chunk(out)
        print(f"C {self.last_offset}", flush=True)


def build_assigner(spec: dict):
    by, size = spec["by"], int(spec["size"])
    if spec["type"] == "hopping":
        return Hopping(size=size, hop=int(spec["hop"]), by=by)
    return {"tumbling": Tumbling, "sliding": Sliding}[spec["type"]](size, by=by)


def main() -> None:
    spec = json.loads(sys.argv[1])
    print("READY", flush=True)
    function = {"collect": CollectOffsets, "sum": SumInt64}[spec.get("function", "collect")]()
    operator = ReportingOperator(build_assigner(spec["assigner"]), function,
                                 cec=CECPolicy(**spec.get("cec", {})))
    input_log = streamlog.open_log(spec["input_path"], readonly=True)
    output_log = streamlog.open_log(spec["output_path"], fsync=spec.get("fsync", "always"),
                                    **spec.get("output_options", {}))
    try:
        runtime = OperatorRuntime(operator, input_log=input_log,
                                  input_stream=spec["input_stream"], output_log=output_log,
                                  output_stream=spec["output_stream"], progress=None,
                                  chunk_records=int(spec.get("chunk_records", 16)))
        report = runtime.recover()
        runtime.run()
        runtime.close()
        summary = {"report": report.as_dict(), "input_next": runtime.input_next,
                   "output_next": runtime.output_next,
                   "stats": dataclasses.asdict(operator.stats)}
    finally:
        output_log.close()
        input_log.close()
    print(json.dumps(summary, default=str), flush=True)


if __name__ == "__main__":
    main()
