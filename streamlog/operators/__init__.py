"""The operator layer, above the storage core: state checkpoints and their store
(checkpoint.py, DESIGN 7), an operator runtime that lines output up with input by
position notes and recovers by checkpoint roll-back, replay or resume (runtime.py,
alignment.py), windowed aggregates with continuous eventual checkpointing (cec.py,
DESIGN 8), tumbling, hopping and sliding windows for user-written window functions with
CEC (windows.py, window_cec.py, window_functions.py), the state codec (codec.py) and the live report of a recovery's phases
(recovery_report.py). These use the log only through its public API (open_log, readers,
appends, truncate_after, holds).

The names a user needs are exported here (and from `streamlog`)."""

from .cec import (AggregateOperator, AggregateResult, CECPolicy, WindowSpec,
                  read_aggregate_results)
from .checkpoint import (Checkpoint, CheckpointPolicy, CheckpointRequest, CheckpointStore,
                         StateHandler)
from .codec import DEFAULT_CODEC, MsgpackCodec, StateCodec
from .recovery_report import RecoveryReport, print_progress
from .runtime import InputChunk, OperatorRuntime, OutputBuffer
from .windows import (CollectOffsets, CountRecords, Hopping, Sliding, SumInt64, TopN, Tumbling,
                      Window, WindowedOperator, WindowFunction, WindowInput, WindowResult,
                      read_window_results)

__all__ = [
    "OperatorRuntime", "InputChunk", "OutputBuffer", "RecoveryReport", "print_progress",
    "Checkpoint", "CheckpointPolicy", "CheckpointRequest", "CheckpointStore", "StateHandler",
    "StateCodec", "MsgpackCodec", "DEFAULT_CODEC",
    "AggregateOperator", "AggregateResult", "CECPolicy", "WindowSpec",
    "read_aggregate_results",
    "WindowedOperator", "WindowFunction", "Window", "WindowInput", "WindowResult",
    "Tumbling", "Hopping", "Sliding", "CountRecords", "SumInt64", "TopN", "CollectOffsets",
    "read_window_results",
]
