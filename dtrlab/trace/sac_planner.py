"""PyTorch's activation-checkpointing planner (``torch.distributed._tools``) run on a CPU and checked.

The planner, ``sac_ilp.sac_milp(graph, memory_budget)``, picks which modules to checkpoint and what
fraction of each one's activation memory to discard, from a module graph that
``ilp_utils.aggregate_stats`` builds out of three estimators:

* ``MemTracker`` (mem_tracker.py): per-module memory, run here on **real CPU tensors** (its byte counts
  are the CPU storages' sizes);
* ``RuntimeEstimator`` and ``SACEstimator`` in ``"operator-level-cost-model"`` mode, under
  ``FakeTensorMode``: the **roofline** of a named GPU's datasheet (``gpu_type``, e.g. ``"NVIDIA H100"``:
  its FLOP/s and DRAM bandwidth, torch/utils/_runtime_estimation.py:89-95 and 173-176). These runtimes are
  estimates for that GPU, not measurements of anything.

The roofline refuses to run without an accelerator (runtime_estimator.py:246-249, ``if not
torch.accelerator.is_available(): raise AssertionError``) even when ``gpu_type`` pins every number it uses
to the datasheet. :func:`datasheet_accelerator` makes ``torch.accelerator.is_available`` answer True only
for the duration of the estimate and restores it; nothing else reads the device there.

A plan is applied (:func:`applied_plan`) the way torch's planner means it: each chosen module runs under
``torch.utils.checkpoint.checkpoint(use_reentrant=False)`` with a selective-checkpoint policy from
``sac_ilp.get_optimal_checkpointing_policy_per_module(stats, 1 - discard)`` (a 0/1 decision per operator of
the module's forward, in the order ``SACEstimator`` saw them, without the operators it skips,
sac_estimator.py:34 and 294). The policy counts the forward's and the recomputation's operators apart and
matches them by name and occurrence (:func:`operator_policy`).
"""

from __future__ import annotations

import contextlib
import functools
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from unittest import mock

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

GIB = 2**30


@contextlib.contextmanager
def datasheet_accelerator() -> Iterator[None]:
    """``torch.accelerator.is_available()`` is True inside, as it was outside afterwards (see the module doc)."""
    with mock.patch.object(torch.accelerator, "is_available", lambda: True):
        yield


@dataclass
class PlannerInputs:
    """What ``sac_milp`` and the per-module operator policy need, for one model."""

    module_info: dict  # ilp_utils.ModuleInfo
    sac_stats: dict  # module fqn -> SACStats
    gpu_type: str


def planner_inputs(module: nn.Module, inputs: tuple, loss_fn, gpu_type: str = "NVIDIA H100") -> PlannerInputs:
    """Run torch's three estimators on ``module``'s step (see the module doc) and aggregate their stats."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.ilp_utils import aggregate_stats
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed._tools.runtime_estimator import RuntimeEstimator
    from torch.distributed._tools.sac_estimator import SACEstimator

    from torch.utils._runtime_estimation import datasheet_dram_bw_gbs

    if datasheet_dram_bw_gbs(gpu_type) is None:
        raise ValueError(f"gpu_type {gpu_type!r}: not a GPU in torch's datasheet (e.g. 'NVIDIA H100')")
    memory = MemTracker()
    memory.track_external(module)
    with memory:
        loss_fn(module(*inputs)).backward()
    module.zero_grad(set_to_none=True)
    # A module whose outputs need no gradient (a Llama decoder's rotary embedding) has no backward, so no
    # pre-backward snapshot, which aggregate_stats indexes (ilp_utils.py:149, KeyError): it holds nothing for the
    # backward and has nothing to checkpoint, so it is left out of the planner's graph (and of the module orders,
    # which parse_module_info checks against the modules, ilp_utils.py:214).
    for tracked, stats in list(memory.memory_tracking.items()):
        if not any(state.name == "PRE_BW" for state in stats.snapshots):
            del memory.memory_tracking[tracked]
    runtime, sac = RuntimeEstimator(gpu_type=gpu_type), SACEstimator(gpu_type=gpu_type)
    with FakeTensorMode(allow_non_fake_inputs=True), datasheet_accelerator():
        with runtime("operator-level-cost-model"):
            loss_fn(module(*inputs)).backward()
        with sac("operator-level-cost-model"):
            loss = loss_fn(module(*inputs))
        loss.backward()
        info = aggregate_stats(module, memory, runtime, sac, torch.device("cpu"))
    kept = {stats["fqn"] for stats in info["mod_stats"]}
    info["mod_order"] = {key: [fqn for fqn in order if fqn in kept] for key, order in info["mod_order"].items()}
    module.zero_grad(set_to_none=True)
    return PlannerInputs(info, dict(sac.sac_mod_stats), gpu_type)


def operator_policy(stats, discard: float, unmatched: list[str]):
    """A ``policy_fn`` that saves the operators torch's per-module MILP keeps when ``discard`` of the
    module's activation memory is dropped. Operators are matched by name and occurrence (the k-th ``mm`` of the
    real forward takes the decision of the k-th ``mm`` the estimate saw): under ``FakeTensorMode`` a model may run
    a few different operators (GPT-2: ``scalar_tensor`` where the real step runs ``mul.Scalar``). An operator the
    estimate did not see is recomputed and its name appended to ``unmatched`` (forward only)."""
    from torch.distributed._tools.sac_estimator import OPS_TO_ALWAYS_SKIP
    from torch.distributed._tools.sac_ilp import get_optimal_checkpointing_policy_per_module

    try:
        decisions = get_optimal_checkpointing_policy_per_module(stats, min(1.0, max(0.0, 1.0 - discard)))
    except TypeError as error:  # sac_ilp.py:297 rounds a variable the solver left without a value (None)
        raise RuntimeError(f"torch's per-module checkpointing MILP raised at sac_ilp.py:297: {error}") from error
    if len(decisions) != len(stats.func_names):
        raise RuntimeError(f"torch's per-module checkpointing MILP (sac_ilp.py:292) found no operator policy at "
                           f"memory_budget {1.0 - discard:.4f}")
    occurrence: dict[str, int] = defaultdict(int)
    keyed = {}
    for name, decision in zip(stats.func_names, decisions):
        keyed[name, occurrence[name]] = decision
        occurrence[name] += 1
    seen: dict[tuple[bool, str], int] = defaultdict(int)  # the forward's and the recomputation's, counted apart

    def policy(ctx, func, *args, **kwargs):
        if func in OPS_TO_ALWAYS_SKIP:
            return CheckpointPolicy.PREFER_RECOMPUTE
        name = func._overloadpacket.__name__
        index = seen[ctx.is_recompute, name]
        seen[ctx.is_recompute, name] += 1
        if (name, index) not in keyed and not ctx.is_recompute:
            unmatched.append(name)
        return CheckpointPolicy.MUST_SAVE if keyed.get((name, index)) else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


@contextlib.contextmanager
def applied_plan(module: nn.Module, plan: dict[str, float], inputs: PlannerInputs,
                 unmatched: list[str]) -> Iterator[list[str]]:
    """Run the modules of ``plan`` (fqn -> discard ratio, as ``sac_milp`` returns it) under selective
    checkpointing for the duration (operators the estimate did not see go to ``unmatched``, see
    :func:`operator_policy`); yields the fqns checkpointed (a module inside another chosen one runs
    inside its checkpoint and is not wrapped again)."""
    root = type(module).__name__
    by_fqn = {root + ("." + name if name else ""): child for name, child in module.named_modules()}
    unknown = sorted(set(plan) - set(by_fqn))
    if unknown:
        raise ValueError(f"plan names modules the model does not have: {unknown}")
    chosen = [fqn for fqn in plan if not any(fqn.startswith(other + ".") for other in plan)]
    for fqn in chosen:
        context_fn = functools.partial(lambda fqn: create_selective_checkpoint_contexts(
            operator_policy(inputs.sac_stats[fqn], plan[fqn], unmatched)), fqn)
        by_fqn[fqn].forward = functools.partial(checkpoint, by_fqn[fqn].forward, use_reentrant=False,
                                                preserve_rng_state=False, context_fn=context_fn)
    try:
        yield chosen
    finally:
        for fqn in chosen:
            del by_fqn[fqn].forward  # the class's forward again


def solve(inputs: PlannerInputs, budget_bytes: int) -> tuple[dict[str, float], float, int]:
    """``sac_milp`` at ``budget_bytes``: (plan, its recompute time in ms of the roofline, its peak bound in
    bytes; -1 when it finds no plan)."""
    from torch.distributed._tools.ilp_utils import parse_module_info
    from torch.distributed._tools.sac_ilp import sac_milp

    return sac_milp(parse_module_info(inputs.module_info), memory_budget=budget_bytes / GIB)


def baseline(inputs: PlannerInputs) -> tuple[int, float]:
    """The planner's own peak and runtime (ms) of the step without checkpointing."""
    from torch.distributed._tools.ilp_utils import get_peak_memory_runtime_baseline, parse_module_info

    return get_peak_memory_runtime_baseline(parse_module_info(inputs.module_info))


def _constant_bytes(recording) -> int:
    from . import parse_lines

    return sum(op.total_size for op in parse_lines(recording.to_jsonl().splitlines()).operators if op.is_constant)


def check_budget(workload, inputs: PlannerInputs, budget_bytes: int) -> dict:
    """One row of the planner's check at ``budget_bytes``: the plan ``sac_milp`` picks, its own peak bound and
    recompute estimate, the recorded trace's predicted peak and the real CPU peak of the step under the plan
    (both above the bytes live before the step, which ``live_before`` gives: what the planner's peak counts)."""
    from .capture import default_loss, record
    from .profiled import cpu_peak_bytes

    plan, recompute_ms, planner_peak = solve(inputs, budget_bytes)
    module, loss_fn = workload.module, workload.loss_fn or default_loss
    row = {"budget": int(budget_bytes), "solved": planner_peak >= 0, "plan": dict(sorted(plan.items())),
           "planner_peak": int(planner_peak), "recompute_ms": float(recompute_ms)}
    if planner_peak < 0:
        return row
    unmatched: list[str] = []
    try:
        with torch.device("cpu"), applied_plan(module, plan, inputs, unmatched) as chosen:
            recording = record(module, workload.inputs, loss_fn=loss_fn, cost="flops")
            module.zero_grad(set_to_none=True)
            count = len(unmatched)  # the recording's step; the real step repeats it
            real = cpu_peak_bytes(lambda: loss_fn(module(*workload.inputs)).backward())
    except RuntimeError as error:  # torch's per-module MILP found no operator policy for a chosen module
        return {**row, "error": str(error)}
    finally:
        module.zero_grad(set_to_none=True)
    live_before = _constant_bytes(recording)
    return {**row, "checkpointed": chosen, "unmatched_ops": count, "unmatched": sorted(set(unmatched)),
            "live_before": live_before,
            "trace_peak": int(recording.peak_live_bytes - live_before), "real_peak": int(real),
            "flops": sum(int(line["TIME"]) for line in recording.lines if line["INSTRUCTION"] in ("CALL", "MUTATE"))}
