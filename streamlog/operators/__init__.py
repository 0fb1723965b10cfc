"""The operator layer, above the storage core. These use the log only through its public
API (open_log, readers, appends, truncate_after, holds). The modules, by concern:

- running an operator: runtime.py (OperatorRuntime: the loop, recovery, checkpoint
  triggers), operator_io.py (what runtime and operator hand each other: InputChunk,
  OutputBuffer, OutputTarget), alignment.py (position notes that line output up with
  input, and the recovery plan built on them), holds.py (durable holds against
  retention), recovery_report.py (the live report of a recovery's phases);
- checkpoints (DESIGN 7): checkpoint.py (the Checkpointer, off the operator's thread),
  checkpoint_value.py (StateHandler, Checkpoint and its stored form),
  checkpoint_policy.py (CheckpointPolicy, CheckpointRequest), checkpoint_store.py (the
  LMDB store), checkpoint_objects.py (the same in an object store, for recovery on
  another machine), codec.py (the state codec);
- continuous eventual checkpointing (DESIGN 8): cec_policy.py (CECPolicy: when G_CHECKs
  are written), read_backwards.py (reading an output from its end);
- the windowed aggregate with CEC: aggregate.py (AggregateOperator), aggregate_records.py
  (its byte layouts, read_aggregate_results), aggregate_recovery.py (rebuilding its
  eventual checkpoint), cec.py (running it as a job);
- tumbling, hopping and sliding windows for user-written window functions with CEC:
  windows.py (WindowedOperator), window_state.py (its units and how they are saved),
  window_functions.py (assigners and window functions), window_cec.py (its output
  records, read_window_results, and rebuilding its eventual checkpoint).

The names a user needs are exported here (and from `streamlog`)."""

from .aggregate import AggregateOperator, WindowSpec
from .aggregate_records import AggregateResult, read_aggregate_results
from .cec_policy import CECPolicy
from .checkpoint_policy import CheckpointPolicy, CheckpointRequest
from .checkpoint_objects import ObjectCheckpointStore
from .checkpoint_store import CheckpointStore
from .checkpoint_value import Checkpoint, StateHandler
from .codec import DEFAULT_CODEC, MsgpackCodec, StateCodec
from .operator_io import InputChunk, OutputBuffer
from .recovery_report import RecoveryReport, print_progress
from .runtime import OperatorRuntime
from .window_cec import WindowResult, read_window_results
from .window_functions import (CollectOffsets, CountRecords, Hopping, Sliding, SumInt64, TopN,
                               Tumbling, Window, WindowFunction, WindowInput)
from .windows import WindowedOperator

__all__ = [
    "OperatorRuntime", "InputChunk", "OutputBuffer", "RecoveryReport", "print_progress",
    "Checkpoint", "CheckpointPolicy", "CheckpointRequest", "CheckpointStore",
    "ObjectCheckpointStore", "StateHandler",
    "StateCodec", "MsgpackCodec", "DEFAULT_CODEC",
    "AggregateOperator", "AggregateResult", "CECPolicy", "WindowSpec",
    "read_aggregate_results",
    "WindowedOperator", "WindowFunction", "Window", "WindowInput", "WindowResult",
    "Tumbling", "Hopping", "Sliding", "CountRecords", "SumInt64", "TopN", "CollectOffsets",
    "read_window_results",
]
