"""``run_step``: one real training step under a memory budget, decided by dtrlab's simulator.

The step is captured first (:func:`capture_step`: dtrlab capture's recorder, on the meta
device for CPU execution), then built again with real tensors from the same seed and run
under :class:`~dtrlab.execute.runtime.Executor`, which checks every log line against the
capture and carries out the simulator's evictions and rematerializations on real storages.
The result is the simulator's :class:`~dtrlab.runtime.RunResult` of that lockstep replay,
plus what only a real run has: wall time, wall time per recomputation, the loss and the
gradients.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch.utils._python_dispatch import _disable_current_modes

from ..policies import Policy, get_policy
from ..runtime import REFERENCE, RESERVED, RunResult, Semantics, baseline, budget_for, check_semantics, refuse_loose
from ..runtime.run import memory_metrics, memory_model
from ..runtime.simulator import OutOfMemory, Thrash
from ..trace.capture import record
from ..trace.costs import check_cost_model
from ..trace.model import COMPUTE, Trace
from ..trace.models import build, meta_patches
from ..trace.simrd_log import parse_lines
from . import cuda
from .runtime import ExecutionError, Executor, LockstepSimulator, Recomputation, storage_roots


#: The optimizer steps a training step can end with (``optimizer=``), built on the module's parameters.
OPTIMIZERS = {
    "sgd": lambda parameters: torch.optim.SGD(parameters, lr=0.01, momentum=0.9),
    "adam": lambda parameters: torch.optim.Adam(parameters, lr=1e-3),
}


class BudgetBelowMinimum(ValueError):
    """The budget cannot hold what one operator of the step needs at once."""


@dataclass(frozen=True)
class CapturedStep:
    """A model's training step as ``dtrlab capture`` records it: the log lines and the trace."""

    source: str
    cost: str
    device: str  # the device the step executes on
    optimizer: str | None  # a name of OPTIMIZERS: the step ends with its update
    build_options: dict
    lines: list[dict] = field(repr=False)
    trace: Trace = field(repr=False)


@dataclass(frozen=True)
class MinimumBudget:
    """A lower bound on any budget the simulator can pass: at ``operator``, the constants made so far,
    the distinct storages the operator reads and its outputs must all be resident at once."""

    bytes: int
    operator: int
    name: str


@dataclass(frozen=True)
class ExecuteResult:
    """One real step: the simulator's record of it and what the real execution measured."""

    run: RunResult
    device: str
    wall_seconds: float  # the real step (forward, backward, final rematerializations), this process's clock
    recomputations: tuple[Recomputation, ...] = field(repr=False)
    loss: torch.Tensor | None = field(default=None, repr=False)
    gradients: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    parameters: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)  # after the step
    allocator: dict | None = None  # CUDA only: the real caching allocator's peaks (cuda.allocator_scope)
    #: After each operator's computation: the simulator's accounted bytes and the bytes of the real storages
    #: the runtime keeps resident (at most the former: see docs/execute.md).
    memory_timeline: tuple[tuple[int, int], ...] = field(default=(), repr=False)

    @property
    def status(self) -> str:
        return self.run.status

    @property
    def passed(self) -> bool:
        return self.run.passed

    @property
    def evicted_storages(self) -> tuple[str, ...]:
        return self.run.evicted_storages

    @property
    def recompute_wall_ns(self) -> int:
        return sum(r.wall_ns for r in self.recomputations)

    def to_dict(self, evicted: bool = False) -> dict:
        record = self.run.to_dict(evicted)
        record.update(device=self.device, wall_seconds=self.wall_seconds,
                      real_recomputations=len(self.recomputations), recompute_wall_ns=self.recompute_wall_ns)
        if self.loss is not None:
            record["loss"] = float(self.loss)
        if self.allocator is not None:
            record["allocator"] = self.allocator
        return record


def capture_step(source: str, *, cost: str = "flops", device: str = "cpu", real: bool = False,
                 optimizer: str | None = None, **build_options) -> CapturedStep:
    """Record ``source``'s training step as ``dtrlab capture`` does (the model sources of capture).

    For CPU execution the step is recorded on the meta device, exactly as ``dtrlab capture``
    writes it, or with real CPU tensors (``real``, ``dtrlab capture --real``) where the meta trace
    differs from the real one. CUDA runs other kernels than the CPU (e.g. cuDNN's batch norm), so
    for CUDA the step is recorded with real tensors on the GPU, by the same recorder.
    ``optimizer`` (a name of :data:`OPTIMIZERS`) ends the step with that optimizer's update, as
    ``record(..., optimizer=)`` does.
    """
    from ..trace.capture import capture

    check_cost_model(cost)
    if cost == "time":
        raise ValueError("execute needs a deterministic cost model (flops or roofline:GPU): measured times differ "
                         "between runs, so the simulator's clock would not be the capture's")
    if optimizer is not None and optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; choose one of {', '.join(OPTIMIZERS)}")
    if device != "cpu" and not device.startswith("cuda"):
        raise ValueError(f"device must be cpu or cuda, got {device!r}")
    if device == "cpu" and optimizer is None:
        recording = capture(source, cost=cost, real=real, **build_options)
    else:  # the same recorder, with the optimizer (capture() records none) or on the GPU
        where = device if device != "cpu" else ("cpu" if real else "meta")
        workload = build(source, device=where, **build_options)
        with torch.device(where), meta_patches():
            recording = record(workload.module, workload.inputs, loss_fn=workload.loss_fn, cost=cost,
                               optimizer=_optimizer(optimizer, workload.module))
    trace = parse_lines((_line_text(line) for line in recording.lines), source=source, name=source)
    return CapturedStep(source, cost, device, optimizer, dict(build_options), recording.lines, trace)


def _line_text(line: dict) -> str:
    return json.dumps(line, sort_keys=True, separators=(",", ":"))  # as Recording.to_jsonl writes it


def minimum_budget(trace: Trace) -> MinimumBudget:
    """The largest need of one operator (see :class:`MinimumBudget`); a smaller budget always fails."""
    roots = storage_roots(trace)
    constants, best = 0, MinimumBudget(0, -1, "")
    for kind, operand in trace.schedule:
        if kind != COMPUTE:
            continue
        op = trace.operators[operand]
        if op.is_constant:
            constants += op.total_size
            need, name = constants, "constants"
        else:
            read = {roots[a] for a in op.args if not trace.operators[trace.tensor_op[roots[a]]].is_constant}
            need = constants + op.total_size + sum(_storage_size(trace, s) for s in read)
            name = op.name
        if need > best.bytes:
            best = MinimumBudget(need, operand, name)
    return best


def run_step(step: str | CapturedStep, *, ratio: float | None = None, budget_bytes: int | None = None,
             policy: str | Policy = "dtr", semantics: Semantics = REFERENCE, cap_allocator: bool = False,
             **capture_options) -> ExecuteResult:
    """Execute one training step of ``step`` (a model source or a :class:`CapturedStep`) under a budget.

    Give exactly one of ``ratio`` (of the captured trace's unbounded peak, ``int(peak * ratio)`` as
    in simulate) or ``budget_bytes``; ``budget_bytes=None`` with ``ratio=None`` is an error, use
    ``ratio=1.0`` for an unbudgeted step. Evictions are decided by ``policy`` under ``semantics``
    (the simulator's memory model, runtime semantics and overhead limit, as in
    :func:`dtrlab.simulate`; flat memory counts storage bytes as simrd does). A model source is
    captured with ``capture_options`` (those of :func:`capture_step`: ``cost``, ``device``, ``real``
    for real CPU tensors instead of meta ones, ``optimizer`` to end the step with an optimizer's
    update, and the model's build options; a captured step brings its own). On CUDA,
    ``cap_allocator`` also caps the real caching allocator at the budget
    (``set_per_process_memory_fraction``); its peaks are reported either way.

    Raises :class:`BudgetBelowMinimum` for a budget no run can pass, :class:`ExecutionError`
    (:class:`~dtrlab.execute.runtime.Divergence`, :class:`~dtrlab.execute.runtime.UnsupportedOperator`)
    when the real step cannot follow the simulator.
    """
    refuse_loose(capture_options)
    if isinstance(step, CapturedStep):
        if capture_options:
            raise TypeError(f"{', '.join(capture_options)}: capture options go with a model source, not a CapturedStep")
        captured = step
    else:
        captured = capture_step(step, **capture_options)
    trace = captured.trace
    if (ratio is None) == (budget_bytes is None):
        raise ValueError("give exactly one of ratio= (e.g. 0.5) or budget_bytes= (e.g. 2_000_000_000)")
    budget = budget_for(trace, ratio) if budget_bytes is None else int(budget_bytes)
    minimum = minimum_budget(trace)
    if budget < minimum.bytes:
        raise BudgetBelowMinimum(
            f"{captured.source}: budget {budget} B is below the step's minimum of {minimum.bytes} B (operator "
            f"{minimum.operator}, {minimum.name}: the constants so far, its arguments and its outputs at once)")
    policy = get_policy(policy)
    enforce, overhead_limit = semantics.enforce, semantics.overhead_limit
    device_spec = check_semantics(enforce, semantics.device_capacity, policy)
    model = memory_model(semantics, budget, device_spec)
    base = baseline(trace)
    remat_limit = base.model_compute * (overhead_limit - 1)

    def make_simulator(executor: Executor) -> LockstepSimulator:
        return LockstepSimulator(trace, policy, budget, remat_limit, memory_model=model, enforce=enforce,
                                 executor=executor)

    executors: list[Executor] = []

    def make_executor(cost_model: str, repeats: int) -> Executor:
        executors.append(Executor(cost_model, repeats, trace=trace, expected_lines=captured.lines,
                                  make_simulator=make_simulator))
        return executors[0]

    workload = build(captured.source, device=captured.device, **captured.build_options)
    kept: list[torch.Tensor] = []

    def loss_fn(output):
        loss = workload.loss_fn(output) if workload.loss_fn is not None else _sum_outputs(output)
        with _disable_current_modes():  # a copy of the value, outside the recorded step
            kept.append(loss.detach().clone())
        return loss

    device_scope = cuda.allocator_scope(captured.device, budget, cap_allocator) \
        if captured.device.startswith("cuda") else contextlib.nullcontext({})
    start = time.perf_counter()
    with device_scope as allocator:
        try:
            with torch.device(captured.device), meta_patches():
                record(workload.module, workload.inputs, loss_fn=loss_fn, cost=captured.cost,
                       optimizer=_optimizer(captured.optimizer, workload.module), recorder_class=make_executor)
            executors[0].finish()
        except (OutOfMemory, Thrash, RuntimeError) as exc:
            if executors:
                executors[0].abandon()  # tensors that die from now on are not part of the step
            if not executors or executors[0].sim.failure is None or isinstance(exc, ExecutionError):
                raise
            # Otherwise the step stopped where the simulator failed (autograd may have wrapped its exception).
    wall = time.perf_counter() - start
    executor = executors[0]
    sim = executor.sim
    status = "pass" if sim.failure is None else sim.failure.kind
    metrics = {} if model is None else memory_metrics(sim, sim.memory_model)
    run = RunResult(
        trace=trace.name, policy=policy.label, status=status, budget_bytes=budget, ratio=ratio, clock=sim.clock,
        model_compute=sim.model_compute, remat_compute=sim.remat_compute, peak_memory=sim.peak_memory,
        evictions=len(sim.evicted), remats=sim.remats,
        evicted_storages=tuple(trace.tensor_names[s] for s in sim.evicted), baseline_memory=base.peak_memory,
        baseline_compute=base.model_compute, overhead_limit=overhead_limit, failure=sim.failure, **metrics,
        **({} if enforce == RESERVED else {"enforce": enforce, "device_capacity": device_spec.label}))
    gradients, parameters = {}, {}
    if status == "pass":
        gradients = {name: p.grad for name, p in workload.module.named_parameters() if p.grad is not None}
        parameters = dict(workload.module.named_parameters())
        for name, tensor in [*gradients.items(), *parameters.items()]:
            if tensor.untyped_storage().nbytes() == 0 and tensor.numel():
                raise ExecutionError(f"{name} (or its gradient) is evicted after the step (the trace does not pin it)")
    return ExecuteResult(run=run, device=captured.device, wall_seconds=wall,
                         recomputations=tuple(executor.recomputations), loss=kept[0] if kept else None,
                         gradients=gradients, parameters=parameters,
                         allocator=dict(allocator) if allocator else None,
                         memory_timeline=tuple(executor.memory_timeline))


class StepValues(NamedTuple):
    """What a plain step computes: the loss, the gradients and the parameters after it."""

    loss: torch.Tensor
    gradients: dict[str, torch.Tensor]
    parameters: dict[str, torch.Tensor]


def reference_step(source: str, *, device: str = "cpu", optimizer: str | None = None,
                   **build_options) -> StepValues:
    """The plain eager step (no recorder, no budget), to compare values with."""
    workload = build(source, device=device, **build_options)
    workload.module.zero_grad(set_to_none=True)
    step = _optimizer(optimizer, workload.module)
    with torch.device(device), meta_patches():
        output = workload.module(*workload.inputs)
        loss = workload.loss_fn(output) if workload.loss_fn is not None else _sum_outputs(output)
        loss.backward()
        if step is not None:
            step.step()
    return StepValues(loss.detach(), {name: p.grad for name, p in workload.module.named_parameters()
                                      if p.grad is not None}, dict(workload.module.named_parameters()))


def _optimizer(name: str | None, module: torch.nn.Module) -> torch.optim.Optimizer | None:
    return None if name is None else OPTIMIZERS[name](module.parameters())


def _sum_outputs(output) -> torch.Tensor:
    from ..trace.capture import default_loss
    return default_loss(output)


def _storage_size(trace: Trace, s: int) -> int:
    return trace.operators[trace.tensor_op[s]].sizes[trace.tensor_index[s]]
