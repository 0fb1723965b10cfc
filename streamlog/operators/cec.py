"""The windowed aggregate operator with continuous eventual checkpointing (DESIGN 8), run
as a job: open the logs named in a spec, recover, run to the input's end, close.

Strategy: one entry point that a separate process can run and a test can kill at any
moment, so that a crash and its recovery are real (a killed process, reopened logs).
`job_main` takes the spec as one JSON argument, prints READY once imported, and prints
the summary (the recovery report, positions and the operator's counters) as one JSON
line. The spec picks the mode: "none" (plain: a full replay after a crash), "crb"
(periodic checkpoints in a CheckpointStore) or "cec" (the operator recovers from its
output). `build_operator` turns the spec into an operator; `run_aggregate_job` runs it.

Where the parts are: the operator (aggregate.py), its byte layouts
(aggregate_records.py), its recovery walk (aggregate_recovery.py), the G_CHECK policy
(cec_policy.py). The names a caller of this module needs to build a job of its own
(AggregateOperator, CECPolicy, WindowSpec) are importable from here too (`__all__`).

Thread-safety: a job runs on the thread that calls it.
"""

from __future__ import annotations

import dataclasses
import json
import sys

from .aggregate import AggregateOperator, WindowSpec
from .cec_policy import CECPolicy

__all__ = ["AggregateOperator", "CECPolicy", "WindowSpec", "build_operator",
           "job_main", "run_aggregate_job"]


def build_operator(spec: dict) -> AggregateOperator:
    window = WindowSpec(spec["window"]["kind"], int(spec["window"]["size"]))
    cec = None
    if spec.get("mode") == "cec":
        cec = CECPolicy(**spec.get("cec", {}))
    return AggregateOperator(window, cec=cec)


def run_aggregate_job(spec: dict) -> dict:
    """Open the input (read-only) and output logs named in `spec`, recover, run to the
    input end, close. `spec`: input_path, input_stream, output_path, output_stream,
    mode ("none" | "crb" | "cec"), window {kind, size}, cec {CECPolicy fields},
    checkpoint_interval_s, store_path, chunk_records, fsync, output_options, progress,
    hold_input, fail_on_data_loss.

    In an object store (DESIGN 11; endpoint and credentials from the AWS_* variables,
    or `storage_options`): `input_remote` reads the input from that s3:// URL instead
    of input_path; `output_remote` tiers the output in output_path to that URL with
    durability "remote" (an empty or new output_path is restored from the store);
    `store_remote` keeps CRB's checkpoints there instead of in store_path."""
    import streamlog
    from .checkpoint import CheckpointPolicy, CheckpointStore
    from .checkpoint_objects import ObjectCheckpointStore
    from .runtime import OperatorRuntime
    from .recovery_report import print_progress
    operator = build_operator(spec)
    store = None
    policy = None
    storage_options = spec.get("storage_options")
    if spec.get("mode") == "crb":
        store = (ObjectCheckpointStore(spec["store_remote"], storage_options=storage_options)
                 if spec.get("store_remote") else CheckpointStore(spec["store_path"]))
        policy = CheckpointPolicy.periodic(float(spec.get("checkpoint_interval_s", 1.0)))
    output_options = dict(spec.get("output_options", {}))
    if spec.get("output_remote"):
        output_options.update(remote=spec["output_remote"], storage_options=storage_options,
                              durability="remote")
    if spec.get("input_remote"):
        input_log = streamlog.open_log(spec["input_remote"], storage_options=storage_options)
    else:
        input_log = streamlog.open_log(spec["input_path"], readonly=True)
    try:
        output_log = streamlog.open_log(spec["output_path"], fsync=spec.get("fsync", "always"),
                                        **output_options)
    except BaseException:
        input_log.close()
        raise
    try:
        runtime = OperatorRuntime(
            operator, input_log=input_log, input_stream=spec["input_stream"],
            output_log=output_log, output_stream=spec["output_stream"],
            checkpointing=policy, store=store, chunk_records=int(spec.get("chunk_records", 256)),
            progress=print_progress() if spec.get("progress") else None,
            hold_input=bool(spec.get("hold_input", True)),
            fail_on_data_loss=bool(spec.get("fail_on_data_loss", True)))
        report = runtime.recover()
        runtime.run()
        runtime.close()
        return {"report": report.as_dict(), "input_next": runtime.input_next,
                "output_next": runtime.output_next, "stats": dataclasses.asdict(operator.stats)}
    finally:
        output_log.close()
        input_log.close()
        if store is not None:
            store.close()


def job_main(argv: list[str] | None = None) -> None:
    """`python -c "from streamlog.operators.cec import job_main; job_main()" SPEC_JSON`: prints
    READY once imported, runs the job, prints its summary as one JSON line."""
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(argv[0])
    print("READY", flush=True)
    summary = run_aggregate_job(spec)
    print(json.dumps(summary, default=str), flush=True)
