"""The unbounded baseline replay that fixes budgets and the thrash limit.

simrd measures the baseline with its V1 runtime at an infinite budget. There a
storage is freed ("banished") as soon as no external reference is left, *even if
it is pinned* (V1 unpins to banish), which the eager V2 runtime never does for
pinned storages. The peak of this replay is what budget ratios multiply.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..trace.model import COMPUTE, GET, PIN, RELEASE, Trace
from . import compiled
from .per_trace import cache_per_trace


@dataclass(frozen=True)
class Baseline:
    peak_memory: int
    model_compute: int


def _replay(trace: Trace) -> Baseline:
    operators = trace.operators
    storage = [-1] * trace.n_tensors
    size = [0] * trace.n_tensors
    ref_ext = [0] * trace.n_tensors
    resident = [False] * trace.n_tensors
    memory = peak = compute = 0

    def banish_if_unreferenced(s: int) -> None:
        nonlocal memory
        if ref_ext[s] == 0 and resident[s]:
            resident[s] = False
            memory -= size[s]

    for kind, operand in trace.schedule:
        if kind == COMPUTE:
            op = operators[operand]
            for index, t in enumerate(op.outputs):
                alias = op.aliases[index]
                s = t if alias == -1 else storage[op.args[alias]]
                storage[t] = s
                if alias == -1:
                    size[s] = op.sizes[index]
                    resident[s] = True
                ref_ext[s] += 1
            compute += op.cost
            memory += op.total_size
            peak = max(peak, memory)
            for p in op.args:
                banish_if_unreferenced(storage[p])
        elif kind == GET:
            ref_ext[storage[operand]] += 1
        elif kind == RELEASE:
            s = storage[operand]
            ref_ext[s] -= 1
            banish_if_unreferenced(s)
        # PIN: at an infinite budget every pinned tensor is already resident.
    return Baseline(peak_memory=peak, model_compute=compute)


@cache_per_trace
def baseline(trace: Trace) -> Baseline:
    """Peak memory and compute of an unbounded replay (cached per trace).

    The compiled core computes it when it can take the trace (the same rules in C,
    tests/test_compiled_core.py compares the two); :func:`_replay` is the reference.
    """
    values = compiled.baseline(trace)
    return _replay(trace) if values is None else Baseline(*values)
