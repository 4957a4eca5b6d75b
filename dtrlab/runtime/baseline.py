"""The unbounded baseline replay that fixes budgets and the thrash limit.

simrd measures the baseline with its V1 runtime at an infinite budget. There a
storage is freed ("banished") as soon as no external reference is left, *even if
it is pinned* (V1 unpins to banish), which the eager V2 runtime never does for
pinned storages. The peak of this replay is what budget ratios multiply.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..memory.replay import walk_unbounded
from ..trace.model import Operator, Trace
from . import compiled
from .per_trace import cache_per_trace


@dataclass(frozen=True)
class Baseline:
    peak_memory: int
    model_compute: int


def _replay(trace: Trace) -> Baseline:
    memory = peak = compute = 0

    def computed(op: Operator, allocated: list[tuple[int, int]]) -> None:
        nonlocal memory, peak, compute
        compute += op.cost
        memory += op.total_size
        peak = max(peak, memory)

    def banished(s: int, size: int) -> None:
        nonlocal memory
        memory -= size

    walk_unbounded(trace, computed, banished)
    return Baseline(peak_memory=peak, model_compute=compute)


@cache_per_trace
def baseline(trace: Trace) -> Baseline:
    """Peak memory and compute of an unbounded replay (cached per trace).

    The compiled core computes it when it can take the trace (the same rules in C,
    tests/test_compiled_core.py compares the two); :func:`_replay` is the reference.
    """
    values = compiled.baseline(trace)
    return _replay(trace) if values is None else Baseline(*values)
