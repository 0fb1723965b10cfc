"""The operator layer, above the storage core: state checkpoints and their store
(checkpoint.py, DESIGN 7), an operator runtime that recovers by checkpoint roll-back
(runtime.py), windowed aggregates with continuous eventual checkpointing (cec.py,
DESIGN 8) and the live report of a recovery's phases (recovery_report.py). These use the
log only through its public API (open_log, readers, appends, truncate_after)."""
