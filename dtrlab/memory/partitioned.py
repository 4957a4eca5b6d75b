"""The peak a torch.compile user sees per ``activation_memory_budget`` knob value, under dtrlab's memory models.

:func:`knob_peaks` partitions a traced joint graph at one knob value with torch's own
partitioner (:func:`dtrlab.trace.torch_compile.partition.partition`) and replays the partitioned step's
allocation sequence (:func:`dtrlab.memory.replay.unbounded_events`: outputs allocated when
an operator runs, storages freed once nothing references them) through two memory models:

* ``flat``: bytes of live storages (``flat_peak``); equals the peak the recorder measured
  from storage lifetimes while it ran the graphs (``recorded_peak``; checked);
* ``caching``: PyTorch's CUDA caching allocator model (:mod:`dtrlab.memory.caching`,
  default options, no capacity limit): ``allocated_peak`` (requests rounded to 512 B, as
  ``torch.cuda.max_memory_allocated``) and ``reserved_peak`` (segments, as
  ``torch.cuda.max_memory_reserved``).

Accounting: parameters, buffers, inputs (and the tensors dynamo lifted into the graph) and
the loss's tangent are live for the whole step; the forward's intermediates die after their
last forward use unless saved; saved tensors live until their last use in the backward
(aot_eager's boxed backward drops them there); recomputed tensors live from their recompute
to their last backward use; gradients live from their computation to the end of the step
(autograd hands them to ``.grad``). No optimizer state, no previous gradients (a first
step after ``zero_grad(set_to_none=True)``).

Two accountings (``backend``): ``"aot_eager"``: the graphs torch's partitioner returns, in
the order it returns them, run as aot_eager runs them; ``"inductor"``: Inductor's lowering
of the same partition (its joint-graph passes, fusion, buffer reuse, in-place buffers and
memory-aware reordering), the allocations its generated wrapper makes
(:mod:`dtrlab.trace.torch_compile.inductor`; tests/test_inductor.py compares it with real CPU Inductor
steps). Kernels' internal temporaries: on a CPU target (the default) each call of an operator that allocates
inside (convolutions, batch norm's backward) gets its temporaries, measured once per call on the CPU
(:mod:`dtrlab.trace.op_temporaries`, ``temporaries=``); others' are not modelled (CPU ``native_dropout`` allocates a
float noise tensor besides its outputs), which can only raise the real peak. tests/test_partition.py compares
with aot_eager on the CPU (equal at knob 1, above by at most one tensor below it);
scripts/validate_allocator_cuda.py's ``knob`` section with CUDA.

Why the peak moves: :func:`peak_composition` splits the bytes live at the peak into
constants, saved forward tensors, recomputed tensors and backward tensors;
:func:`interventions` forces one node saved or recomputed at a time and reports the peak's
change.
"""

from __future__ import annotations

import contextlib
import tempfile

from ..trace.torch_compile.inductor import partition_lowered
from ..trace.torch_compile.joint import JointGraph, check_backend
from ..trace.torch_compile.partition import PartitionedStep, partition
from .peaks import trace_peaks
from .replay import unbounded_events


def step_peaks(step: PartitionedStep) -> dict:
    """Flat, allocated and reserved peaks of a partitioned step (see the module docstring)."""
    return trace_peaks(step.trace)


def knob_peaks(joint: JointGraph, knob: float, *, solver: str | None = None,
               force: dict[str, str] | None = None, backend: str | None = None, cache=True,
               temporaries: bool | None = None) -> dict:
    """One knob value: torch's partition of ``joint``, its peaks and the partitioner's proxy objective.

    Keys: ``knob, flat_peak, allocated_peak, reserved_peak, recorded_peak, proxy_saved_bytes,
    proxy_recompute_runtime, saved_count, recomputed_count, recompute_flops, forward_ops,
    backward_ops, torch_version, solver, runtime_estimator, source, backend``. Bytes are ints.
    ``solver`` and ``force`` are :func:`~dtrlab.trace.torch_compile.partition.partition`'s.
    ``backend``: whose step is accounted (None: the one ``joint`` was traced for):
    ``"inductor"`` (Inductor's lowering of the partition, :mod:`dtrlab.trace.torch_compile.inductor`;
    needs a joint traced with ``backend="inductor"``) or ``"aot_eager"`` (the partitioned
    graphs run node by node, on either joint). ``cache``: where Inductor's lowered steps are kept across runs
    (:func:`~dtrlab.trace.torch_compile.inductor.partition_lowered`'s: True for ``$DTRLAB_CACHE``, a directory, or
    False).
    ``temporaries``: operators' measured temporaries in the step (:mod:`dtrlab.trace.op_temporaries`; None: on for
    a CPU target, off for a GPU's).
    """
    backend = joint.backend if backend is None else check_backend(backend)
    if backend == "inductor":
        step = partition_lowered(joint, knob, solver=solver, force=force, cache=cache, temporaries=temporaries)
    else:
        step = partition(joint, knob, solver=solver, force=force, temporaries=temporaries)
    return step_record(step)


def step_record(step: PartitionedStep) -> dict:
    """:func:`knob_peaks`'s row for an already partitioned step (``recompute_flops``: None for an Inductor
    step, whose trace holds the wrapper's allocations, not a compute model; ``forward_ops`` and
    ``backward_ops`` then count the wrapper's recorded operators)."""
    operators = sum(1 for op in step.trace.operators if not op.is_constant)
    return {"knob": step.knob, **step_peaks(step), "recorded_peak": step.recorded_peak_bytes,
            "proxy_saved_bytes": step.proxy_saved_bytes, "proxy_recompute_runtime": step.proxy_recompute_runtime,
            "saved_count": step.saved_count, "recomputed_count": step.recomputed_count,
            "recompute_flops": step.recompute_flops if step.backend == "aot_eager" else None,
            "forward_ops": step.forward_ops, "backward_ops": operators - step.forward_ops,
            "torch_version": step.torch_version, "solver": step.solver, "runtime_estimator": step.runtime_estimator,
            "source": step.source, "backend": step.backend}


def interventions(joint: JointGraph, knob: float, nodes: list[str] | None = None, *,
                  solver: str | None = None) -> list[dict]:
    """Why the peak moves: force one node at a time and re-partition at ``knob``.

    Each recomputed forward node is forced saved, each saved one forced recomputed
    (``nodes`` limits the candidates to those names), through the partitioner's own hooks
    (:func:`~dtrlab.trace.torch_compile.partition.partition`'s ``force``). One row per (node, forcing):
    ``node, forced, partitioned, flat_peak, peak_delta`` (against the unforced partition's
    flat peak), ``saved_count, recomputed_count, proxy_saved_bytes``. A negative
    ``peak_delta`` names a decision of the partitioner that raises the peak the user sees.
    A forcing torch's min-cut cannot honour (a value the backward needs that may then be
    neither saved nor recomputed) is a row with ``partitioned=False`` and no peak.
    """
    base = partition(joint, knob, solver=solver)
    base_peak = step_peaks(base)["flat_peak"]
    saved = {s.name for s in base.saved} & joint.forward_nodes
    candidates = [(name, "save") for name in dict.fromkeys(base.recomputed)]
    candidates += [(name, "recompute") for name in sorted(saved)]
    if nodes is not None:
        wanted = set(nodes)
        candidates = [(name, how) for name, how in candidates if name in wanted]
    return [_forced_row(joint, knob, solver, name, how, base_peak) for name, how in candidates]


def _forced_row(joint: JointGraph, knob: float, solver: str | None, name: str, how: str, base_peak: int) -> dict:
    row = {"node": name, "forced": how, "partitioned": True}
    try:
        # torch dumps a failed min-cut's graph into the working directory: keep it out of the user's.
        with tempfile.TemporaryDirectory() as scratch, contextlib.chdir(scratch):
            step = partition(joint, knob, solver=solver, force={name: how})
    except RuntimeError as error:
        if "failed to partition" not in str(error):
            raise
        return {**row, "partitioned": False, "flat_peak": None, "peak_delta": None, "saved_count": None,
                "recomputed_count": None, "proxy_saved_bytes": None}
    peak = step_peaks(step)["flat_peak"]
    return {**row, "flat_peak": peak, "peak_delta": peak - base_peak, "saved_count": step.saved_count,
            "recomputed_count": step.recomputed_count, "proxy_saved_bytes": step.proxy_saved_bytes}


def peak_composition(step: PartitionedStep) -> dict:
    """What is live at the step's flat peak, in bytes by kind, and where the peak falls.

    Kinds: ``constants`` (parameters, inputs, the tangent), ``forward`` (forward-graph
    outputs still live: the saved tensors, and the loss), ``recomputed`` (tensors the
    backward computed again from the forward's operators), ``backward`` (gradients and
    the backward's other tensors). ``at``: the node whose output made the peak and
    whether it ran in the forward or the backward; ``recomputed_nodes``: the recomputed
    tensors live at the peak by node name (several transformer blocks' worth of them is
    the mechanism of pytorch#193193: recomputation brought forward, all live at once).
    """
    trace = step.trace
    names = trace.meta["node_names"]
    recomputed = set(step.recomputed)
    live: dict[int, int] = {}
    best, best_live, best_event = -1, {}, None
    for event in unbounded_events(trace):
        if event.kind == "alloc":
            live[event.block_id] = event.size
            total = sum(live.values())
            if total > best:
                best, best_live, best_event = total, dict(live), event
        else:
            live.pop(event.block_id, None)
    kinds = {"constants": 0, "forward": 0, "recomputed": 0, "backward": 0}
    recomputed_live = {}
    for block, size in best_live.items():
        op_index = trace.tensor_op[block]
        op, name = trace.operators[op_index], names[op_index]
        kind = ("constants" if op.is_constant else "recomputed" if op.backward and name in recomputed
                else "backward" if op.backward else "forward")
        kinds[kind] += size
        if kind == "recomputed":
            recomputed_live[name] = recomputed_live.get(name, 0) + size
    at_op = trace.tensor_op[best_event.block_id] if best_event is not None else 0
    return {"flat_peak": best, **kinds, "at": names[at_op],
            "phase": "backward" if trace.operators[at_op].backward else "forward",
            "recomputed_nodes": recomputed_live}
