"""The compiled replay core (``_core.c``): which runs it can take, and how to run one.

The core replays a whole trace in C for the policies that describe themselves to it
(:meth:`~dtrlab.policies.Policy.core_spec`, :mod:`dtrlab.policies.core_spec`) and the
memory models that do (:meth:`~dtrlab.memory.MemoryModel.core_args`: flat, aligned,
caching; both budget semantics), decision for decision like
:class:`~dtrlab.runtime.simulator.Simulator`
(the readable reference, which stays the only path for policies written in Python,
user-registered memory models, recorders and step-by-step analyses).
``tests/test_compiled_core.py``, ``tests/test_compiled_policies.py`` and
``tests/test_compiled_memory.py`` compare the two step by step on random traces.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass

from ..trace.model import Trace
from ..memory import MemoryStats
from ..policies.builtin import POLICY_CODES  # noqa: F401 (re-exported)
from ..policies.core_spec import policy_reason, policy_spec
from .per_trace import cache_per_trace
from .simulator import ALLOCATED, RESERVED, Failure, Intervention, remat_allowance

try:
    from . import _core
except ImportError:  # not built (e.g. running from a source tree without `pip install`)
    _core = None

ENGINES = ("auto", "compiled", "python")
_INT64_MAX = 2**63 - 1


def available() -> bool:
    """True when the core is built."""
    return _core is not None


def unsupported_reason(trace: Trace, policy, intervention: Intervention | None = None, recorder=None,
                       model=None) -> str | None:
    """Why the core cannot take this run (``model``: the run's memory model instance, None for simrd's
    byte counter), or None when it can."""
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
    if model is not None and model.core_args() is None:
        return f"the {model.name!r} memory model ({type(model).__name__}) is not one the compiled core models"
    if getattr(policy, "address_aware", False) and (model is None or not model.address_aware):
        return f"policy {policy.label!r} needs an address-aware memory model (the Python simulator says why)"
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
    # (clock, memory, evictions, remat_compute) after each step, and (allocated, reserved) under a model
    steps: list[tuple[int, ...]] | None
    # Under a memory model, what memory_metrics reads (Simulator's fields of the same names) and the
    # model's statistics at the end.
    fragmentation_evictions: int = 0
    peak_reserved: int = 0
    allocated_at_peak: int = 0
    memory_stats: MemoryStats | None = None
    # With record_steps and a policy that reads regions: (storage, forward, reverse region compute)
    # of every resident storage at each choice, as the policy saw them.
    region_reads: list[tuple[tuple[int, int, int], ...]] | None = None


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


_CAUSES = (None, "bytes", "fragmentation", "device")  # the core's cause codes


def run(trace: Trace, policy, budget_bytes: float, remat_limit: float = math.inf,
        intervention: Intervention | None = None, record_steps: bool = False, model=None,
        enforce: str = RESERVED) -> CoreRun:
    """One replay on the compiled core; the caller checked :func:`unsupported_reason`.

    ``model`` is the run's unused memory model instance (None: simrd's byte counter); the core
    builds its own copy from the instance's capacity and options and leaves the instance unused.
    """
    withhold = None
    if intervention is not None and intervention.withhold:
        flags = bytearray(trace.n_tensors)
        for s in intervention.withhold:
            if 0 <= s < trace.n_tensors:
                flags[s] = 1
        withhold = flags
    memory = None if model is None else model.core_args()
    (status, clock, model_compute, remat_compute, peak, remats, evicted, failure, steps, memory_result,
     region_reads) = _core.replay(
        core_trace(trace).flat, policy_spec(policy), _exceeded_at(budget_bytes), _exceeded_at(remat_limit),
        withhold, record_steps, memory, enforce == ALLOCATED, bool(getattr(policy, "address_aware", False)))
    if failure is not None:
        step, operator, tensor, requested, memory_in_use, candidates, cause, largest_free = failure
        failure = Failure(kind=_STATUS[status], step=step, operator=operator, tensor=tensor,
                          requested_bytes=requested, memory_in_use=memory_in_use, candidates=candidates,
                          cause=_CAUSES[cause], largest_free_block=largest_free)
    metrics = {}
    if memory_result is not None:
        fragmentation_evictions, peak_reserved, allocated_at_peak, stats = memory_result
        allocated, reserved, peak_allocated, peak_reserved_model, largest, segments = stats
        metrics = dict(fragmentation_evictions=fragmentation_evictions, peak_reserved=peak_reserved,
                       allocated_at_peak=allocated_at_peak,
                       memory_stats=MemoryStats(allocated_bytes=allocated, reserved_bytes=reserved,
                                                peak_allocated_bytes=peak_allocated,
                                                peak_reserved_bytes=peak_reserved_model, largest_free_block=largest,
                                                segments=segments))
    return CoreRun(status=_STATUS[status], clock=clock, model_compute=model_compute, remat_compute=remat_compute,
                   peak_memory=peak, remats=remats, evicted=evicted, failure=failure, steps=steps,
                   region_reads=region_reads, **metrics)
