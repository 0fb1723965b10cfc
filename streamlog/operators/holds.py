"""An operator's durable holds (DESIGN 2): retention never removes the input, or the
output, that a recovery of the operator would read.

Strategy: the log's public `hold(stream, partition, name, offset)` keeps a partition's
records from `offset` on until the hold moves or is released, across restarts. The
runtime (runtime.py) knows the oldest input and output offsets a recovery from its
current position would need (`OperatorRuntime.required_positions`); `Holds` moves the
holds forward to them, at most every HOLD_INTERVAL_S seconds (each move is two fsyncs),
and only when they changed. A hold is named by the operator's output (one writer per
output partition) and the output log's location, so two jobs that write streams of the
same name in different logs keep holds of their own (`default_hold_name`). A tiered
output (DESIGN 11: `open_log(dir, remote=URL)`) is named by its store URL, not by its
directory, so an operator recovered on another machine, in another directory, moves the
same holds instead of leaving one behind for every directory it ever ran in.

An input read straight from an object store (`open_log("s3://...")`) keeps no holds: a
hold is a file in a partition directory, which a reader of the store does not have
(the input's retention is its writer's). No input hold is taken there (`can_hold`): an
exact recovery then needs the input to still be in the store, and `DataLossError` says
when it is not.

Thread-safety: the runtime's thread moves and releases the holds.
"""

from __future__ import annotations

import os
from typing import Callable

import xxhash

HOLD_INTERVAL_S = 1.0  # how often the durable holds move forward (each is two fsyncs)
STORE_SCHEMES = ("s3://", "memory://")  # a log read from a store has its URL as its path


def default_hold_name(output_log, stream: str, partition: int) -> str:
    """operator.STREAM.P.DIGEST: the output names the operator (one writer per output
    partition); the digest of the output log's location keeps two jobs that write
    streams of the same name in different logs apart."""
    where = getattr(output_log, "url", None) or store_url(output_log) or os.path.abspath(
        str(output_log.path))
    return f"operator.{stream}.{partition}.{xxhash.xxh32_hexdigest(where.encode())}"


def store_url(log_) -> str | None:
    """The object store URL a local log is tiered to (or read from), else None."""
    info = getattr(log_, "info", None)
    if info is None:
        return None
    remote = info().get("remote")
    return None if remote is None else remote.get("url")


def can_hold(log_) -> bool:
    """False for a log read straight from an object store (its `path` is the store's
    URL): it has no partition directory to keep a hold file in."""
    path = getattr(log_, "path", None)
    return not (isinstance(path, str) and path.startswith(STORE_SCHEMES))


class Holds:
    """The holds named `name` on one input and one output partition (module docstring).

    Args:
        clock: seconds, monotonic; paces the moves (HOLD_INTERVAL_S).
    """

    def __init__(self, *, input_log, input_stream: str, input_partition: int, output_log,
                 output_stream: str, output_partition: int, name: str,
                 clock: Callable[[], float]) -> None:
        self.input_log, self.input_stream, self.input_partition = (
            input_log, input_stream, input_partition)
        self.output_log, self.output_stream, self.output_partition = (
            output_log, output_stream, output_partition)
        self.name = name
        self.clock = clock
        self.held: tuple[int | None, int | None] = (None, None)
        self._due = 0.0
        self.input_holds = can_hold(input_log)  # (module docstring: a store's readers)

    def update(self, required: Callable[[], tuple[int | None, int | None]], *,
               force: bool = False) -> None:
        """Move the holds to `required()` (input offset, output offset; None: no hold
        needed) when HOLD_INTERVAL_S has passed since the last move, or when `force`."""
        now = self.clock()
        if not force and now < self._due:
            return
        self._due = now + HOLD_INTERVAL_S
        need_in, need_out = required()
        held_in, held_out = self.held
        # (a log through a daemon holds too: hold is part of the API, api.LogAPI)
        if not self.input_holds:
            need_in = None
        if need_in is not None and need_in != held_in:
            self.input_log.hold(self.input_stream, self.input_partition, self.name, need_in)
        if need_out is not None and need_out != held_out:
            self.output_log.hold(self.output_stream, self.output_partition, self.name,
                                 need_out)
        self.held = (need_in, need_out)

    def release(self) -> None:
        """Drop both holds (the operator is retired: nothing will recover it)."""
        places = [(self.output_log, self.output_stream, self.output_partition)]
        if self.input_holds:
            places.insert(0, (self.input_log, self.input_stream, self.input_partition))
        for log_, stream, partition in places:
            log_.release_hold(stream, partition, self.name)
        self.held = (None, None)
