"""When a CEC operator writes G_CHECKs (DESIGN 8): the policy both CEC operators take
(aggregate.py, windows.py), and the selection of the units due for one.

Strategy: the CEC paper's background path. Every open unit (an aggregate window, or a
window operator's unit) has a newest footprint, a G_OPEN or a G_CHECK, at an input offset
`fp_in` and an output offset `fp_out`; the operator keeps its units in footprint order,
oldest first. A recovery reads the output back to the oldest footprint (the extent, `q`
output records) and replays the input from its input offset (`u` input records). While
`q` is over the target `Q` or `u` over `U`, the unit with the oldest footprint is due for
a G_CHECK, which writes its state again and so moves it to the end of the order. The
time spent on G_CHECKs is bounded: only the first `CI` ms of every `CP` ms period, and
at most `gchecks_per_chunk_max` per pass. The policy is a value; the selection
(`units_due_for_gcheck`) reads it and the units, and the operator writes the records.

Thread-safety: a CECPolicy is immutable; the selection runs on the operator's thread.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterator

from ..errors import InvalidArgument

# Bounds.
GCHECKS_PER_CHUNK_MAX = 1 << 20
CLOCK_CHECK_EVERY = 64  # G_CHECKs between clock reads in the CI budget loop


@dataclasses.dataclass(frozen=True, slots=True)
class CECPolicy:
    """When to emit G_CHECKs. `q_target` (Q, output records in the extent) and
    `u_target` (U, input records to replay): None disables that target; with both None
    only G_OPENs are written. `ci_ms` of every `cp_ms` period may be spent on G_CHECKs;
    cp_ms None lifts the time budget."""

    q_target: int | None = None
    u_target: int | None = None
    ci_ms: float = 5.0
    cp_ms: float | None = 100.0
    gchecks_per_chunk_max: int = 65536
    background_every_records: int = 256  # the background path runs this often at least

    def __post_init__(self) -> None:
        for name in ("q_target", "u_target"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 0):
                raise InvalidArgument(f"{name} must be None or an int >= 0 (got {value!r})")
        if self.cp_ms is not None and not 0 < self.ci_ms <= self.cp_ms:
            raise InvalidArgument("need 0 < ci_ms <= cp_ms")
        if not 1 <= self.gchecks_per_chunk_max <= GCHECKS_PER_CHUNK_MAX:
            raise InvalidArgument(f"gchecks_per_chunk_max must be in 1..{GCHECKS_PER_CHUNK_MAX}")
        if isinstance(self.background_every_records, bool) or not isinstance(
                self.background_every_records, int) or self.background_every_records < 1:
            raise InvalidArgument("background_every_records must be a positive int")

    @property
    def writes_gchecks(self) -> bool:
        """A target is set, so the background path may write G_CHECKs."""
        return self.q_target is not None or self.u_target is not None

    def budget(self, now_s: float) -> tuple[bool, float | None]:
        """(G_CHECKs may be written now, the clock reading they must stop at): only in
        the first CI ms of every CP ms period; without CP, always and without a limit."""
        if self.cp_ms is None:
            return True, None
        now_ms = now_s * 1000.0
        into_period = now_ms % self.cp_ms
        if into_period >= self.ci_ms:
            return False, None
        return True, (now_ms + self.ci_ms - into_period) / 1000.0


def units_due_for_gcheck(policy: CECPolicy, order, out, *, last_offset: int,
                         q_target: int | None, clock: Callable[[], float],
                         deadline: float | None) -> Iterator[tuple]:
    """Yield (identity, unit) for the unit with the oldest footprint while its extent q
    (output records since its footprint) is over `q_target` or its replay u (input
    records from its footprint to `last_offset`) is over the policy's U.

    Args:
        order: identity -> unit (with `fp_in`, `fp_out`), oldest footprint first. The
            caller G_CHECKs each unit yielded, which moves its footprint and the unit to
            the end of `order`, before it asks for the next.
        out: the output buffer; its `next_offset` is read for each unit.
        q_target: the Q to use (an operator may raise the policy's, aggregate.py).
        deadline: the clock reading to stop at (CI/CP budget), read every
            CLOCK_CHECK_EVERY G_CHECKs; None: no time limit.

    At most `policy.gchecks_per_chunk_max` units are yielded.
    """
    u_target = policy.u_target
    for emitted in range(min(len(order), policy.gchecks_per_chunk_max)):
        identity, unit = next(iter(order.items()))
        q = out.next_offset - unit.fp_out
        u = last_offset - unit.fp_in
        if not ((q_target is not None and q > q_target) or (
                u_target is not None and u > u_target)):
            return
        yield identity, unit
        if deadline is not None and emitted % CLOCK_CHECK_EVERY == CLOCK_CHECK_EVERY - 1 and (
                clock() >= deadline):
            return
