"""The compiled replay core (``_core.c``): which runs it can take, and how to run one.

The core replays a whole trace in C for the flat memory model and the policies that
:mod:`~dtrlab.runtime.compiled_policies` encodes, decision for decision like
:class:`~dtrlab.runtime.simulator.Simulator` (the readable reference, which stays
the only path for policies written in Python, other memory models, recorders and
step-by-step analyses). ``tests/test_compiled_core.py`` compares the two step by
step on random traces.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass

from ..trace.model import Trace
from .compiled_policies import POLICY_CODES, policy_reason, policy_spec  # noqa: F401 (POLICY_CODES: re-exported)
from .per_trace import cache_per_trace
from .simulator import Failure, Intervention, remat_allowance

try:
    from . import _core
except ImportError:  # not built (e.g. running from a source tree without `pip install`)
    _core = None

ENGINES = ("auto", "compiled", "python")
_INT64_MAX = 2**63 - 1


def available() -> bool:
    """True when the core is built."""
    return _core is not None


def unsupported_reason(trace: Trace, policy, intervention: Intervention | None = None, recorder=None) -> str | None:
    """Why the core cannot take this run, or None when it can."""
    if _core is None:
        return "the compiled core is not built (reinstall dtrlab with `pip install -e .`)"
    if not core_trace(trace).fits:
        return ("the trace's compute or bytes are too large for the core's 64-bit counters, or it has an index "
                "out of range")
    reason = policy_reason(policy)
    if reason is not None:
        return reason
    if recorder is not None:
        return "a recorder needs the step-by-step Python simulator"
    if intervention is not None and (intervention.pin or intervention.force_evict):
        return "timed pins and forced evictions run on the Python simulator"
    return None


@dataclass(frozen=True)
class CoreRun:
    """What one compiled replay decided (the fields :func:`~dtrlab.runtime.simulate` reports)."""

    status: str
    clock: int
    model_compute: int
    remat_compute: int
    peak_memory: int
    remats: int
    evicted: list[int]
    failure: Failure | None
    steps: list[tuple[int, int, int, int]] | None  # (clock, memory, evictions, remat_compute) after each step


_STATUS = ("pass", "oom", "thrash")
#: Bound on a trace's total compute and total output bytes: every sum the core keeps
#: (region computes, scores' numerators, memory) then stays far inside int64; the
#: clock and recompute, unbounded without a thrash limit, are checked as they grow.
_MAX_TOTAL = 2**56


@dataclass(frozen=True)
class CoreTrace:
    flat: object  # the _core.CoreTrace
    fits: bool  # totals below _MAX_TOTAL and every index in range


@cache_per_trace
def core_trace(trace: Trace) -> CoreTrace:
    """The trace flattened into the core's arrays, built once per Trace object."""
    op_cost, arg_off, args, out_off, outs, sizes, aliases = (
        array("q"), array("i", [0]), array("i"), array("i", [0]), array("i"), array("q"), array("i"))
    for op in trace.operators:
        op_cost.append(op.cost)
        args.extend(op.args)
        arg_off.append(len(args))
        outs.extend(op.outputs)
        sizes.extend(op.sizes)
        aliases.extend(op.aliases)
        out_off.append(len(outs))
    kinds = array("i", [kind for kind, _ in trace.schedule])
    operands = array("i", [operand for _, operand in trace.schedule])
    flat = _core.CoreTrace(tuple(trace.tensor_names), op_cost, arg_off, args, out_off, outs, sizes, aliases,
                           array("i", trace.tensor_op), array("i", trace.tensor_index), kinds, operands)
    fits = flat.well_formed and sum(op_cost) < _MAX_TOTAL and sum(sizes) < _MAX_TOTAL
    return CoreTrace(flat, fits)


def baseline(trace: Trace) -> tuple[int, int] | None:
    """The unbounded baseline's (peak, compute) from the core, or None when it cannot take the trace."""
    if _core is None:
        return None
    flat = core_trace(trace)
    return _core.baseline(flat.flat) if flat.fits else None


def _exceeded_at(limit: float) -> int:
    """The largest integer not above ``limit`` (an int exceeds ``limit`` exactly when it exceeds this).

    NaN (e.g. an infinite overhead limit times a trace's zero compute) is never exceeded
    by the reference, whose ``>`` against NaN is always false: no limit, like infinity
    (:func:`~dtrlab.runtime.simulator.remat_allowance`, shared with the solvers).
    """
    allowance = remat_allowance(limit)
    return _INT64_MAX if allowance is None else min(allowance, _INT64_MAX)


def run(trace: Trace, policy, budget_bytes: float, remat_limit: float = math.inf,
        intervention: Intervention | None = None, record_steps: bool = False) -> CoreRun:
    """One replay on the compiled core; the caller checked :func:`unsupported_reason`."""
    withhold = None
    if intervention is not None and intervention.withhold:
        flags = bytearray(trace.n_tensors)
        for s in intervention.withhold:
            if 0 <= s < trace.n_tensors:
                flags[s] = 1
        withhold = flags
    status, clock, model_compute, remat_compute, peak, remats, evicted, failure, steps = _core.replay(
        core_trace(trace).flat, policy_spec(policy), _exceeded_at(budget_bytes), _exceeded_at(remat_limit),
        withhold, record_steps)
    if failure is not None:
        step, operator, tensor, requested, memory, candidates = failure
        failure = Failure(kind=_STATUS[status], step=step, operator=operator, tensor=tensor,
                          requested_bytes=requested, memory_in_use=memory, candidates=candidates,
                          cause="bytes" if status == 1 else None)
    return CoreRun(status=_STATUS[status], clock=clock, model_compute=model_compute, remat_compute=remat_compute,
                   peak_memory=peak, remats=remats, evicted=evicted, failure=failure, steps=steps)
