"""``simulate``: one budgeted replay, returned as a :class:`RunResult` record."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

from ..memory import MEMORY_MODELS, MemoryModel, get_memory_model
from ..memory.device import DeviceCapacity
from ..policies import Policy, get_policy
from ..trace.model import Trace
from . import compiled
from .baseline import baseline
from .semantics import (DEFAULT_OVERHEAD_LIMIT, FLAT, REFERENCE, Semantics, check_semantics, refuse_loose,
                        semantics_options)
from .simulator import ALLOCATED, RESERVED, Failure, Intervention, Simulator


@dataclass(frozen=True)
class RunResult:
    """Everything one simulation decided, for printing, plotting and testing."""

    trace: str
    policy: str
    status: str  # "pass", "oom" or "thrash"
    budget_bytes: int
    ratio: float | None
    clock: int
    model_compute: int
    remat_compute: int
    peak_memory: int
    evictions: int
    remats: int
    evicted_storages: tuple[str, ...] = field(repr=False)
    baseline_memory: int = 0
    baseline_compute: int = 0
    overhead_limit: float = DEFAULT_OVERHEAD_LIMIT
    failure: Failure | None = None
    # The memory model and, for every model but flat, its metrics (None under flat):
    # peaks of reserved and allocated bytes, 1 - allocated/reserved at the reserved
    # peak (with the most bytes allocated while reserved was at that peak), and the
    # largest free block and segment count when the run ended (or failed).
    memory: str = FLAT
    memory_options: tuple[tuple[str, object], ...] = ()
    fragmentation_evictions: int = 0
    peak_reserved_bytes: int | None = None
    peak_allocated_bytes: int | None = None
    fragmentation_at_peak: float | None = None
    largest_free_block: int | None = None
    segments: int | None = None
    # The runtime semantics (docs/memory.md) and, under "allocated", the device capacity's label.
    enforce: str = RESERVED
    device_capacity: str | None = None

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    @property
    def overhead(self) -> float:
        """Clock over the baseline compute (simrd's overhead measure)."""
        return self.clock / self.baseline_compute if self.baseline_compute else math.nan

    @property
    def eviction_sha256(self) -> str:
        """sha256 of the newline-joined evicted root tensor names (the reference's hash)."""
        return hashlib.sha256("\n".join(self.evicted_storages).encode()).hexdigest()

    def to_dict(self, evicted: bool = False) -> dict:
        record = {
            "trace": self.trace, "policy": self.policy, "status": self.status,
            "budget_bytes": self.budget_bytes, "ratio": self.ratio, "clock": self.clock,
            "overhead": self.overhead, "model_compute": self.model_compute,
            "remat_compute": self.remat_compute, "peak_memory": self.peak_memory,
            "evictions": self.evictions, "remats": self.remats,
            "eviction_sha256": self.eviction_sha256,
            "baseline_memory": self.baseline_memory, "baseline_compute": self.baseline_compute,
            "overhead_limit": self.overhead_limit,
        }
        if self.memory != FLAT or self.enforce != RESERVED:
            record.update(memory=self.memory, memory_options=dict(self.memory_options),
                          fragmentation_evictions=self.fragmentation_evictions,
                          peak_reserved_bytes=self.peak_reserved_bytes,
                          peak_allocated_bytes=self.peak_allocated_bytes,
                          fragmentation_at_peak=self.fragmentation_at_peak,
                          largest_free_block=self.largest_free_block, segments=self.segments)
        if self.enforce != RESERVED:
            record.update(enforce=self.enforce, device_capacity=self.device_capacity)
        if self.failure is not None:
            record["failure"] = vars(self.failure)
        if evicted:
            record["evicted_storages"] = list(self.evicted_storages)
        return record


def budget_for(trace: Trace, ratio: float) -> int:
    """simrd's budget for a ratio: ``int(baseline peak * ratio)``."""
    if not (ratio > 0 and math.isfinite(ratio)):
        raise ValueError(f"budget ratio must be finite and positive (a fraction of the baseline peak, e.g. 0.5), "
                         f"got {ratio}")
    return int(baseline(trace).peak_memory * ratio)


def simulate(trace: Trace, policy: str | Policy = "dtr", *, ratio: float | None = None,
             budget_bytes: int | None = None, semantics: Semantics = REFERENCE,
             intervention: Intervention | None = None, recorder=None, regions: str = "auto", engine: str = "auto",
             **policy_params) -> RunResult:
    """Replay ``trace`` under a memory budget with an eviction policy.

    Give exactly one of ``ratio`` (a fraction of the unbounded peak; the budget is
    ``int(peak * ratio)`` as in simrd) or ``budget_bytes``. The run fails with
    ``thrash`` once rematerialization compute exceeds
    ``baseline compute x (overhead_limit - 1)``. ``regions`` picks the evicted-
    neighbourhood index: "c" (compiled), "python" (the readable reference) or "auto".

    ``memory`` is the memory model: ``"flat"`` (simrd's byte counter, the default),
    another registered name (``"aligned"``, ``"caching"``; built with the budget as
    its capacity and ``memory_options``) or an unused :class:`~dtrlab.memory.MemoryModel`
    instance of that capacity. See docs/memory.md.

    ``semantics.enforce`` is the runtime semantics under a memory model: ``"reserved"`` (the
    default; the model's capacity is the budget and an allocation evicts until it is
    placed) or ``"allocated"`` (the DTR prototype: the budget limits allocated block
    bytes after each operator, the model's capacity is ``device_capacity``: bytes,
    ``"1.25x"`` the budget, ``"80GiB"``, a GPU preset such as ``"A100-80GB"``, or None
    for an unlimited device; a failed allocation is an OOM with cause ``"device"``).

    ``engine`` picks the replay: "compiled" (the C core, for the flat model, the
    built-in score policies and no recorder, timed pin or forced eviction), "python"
    (the readable reference :class:`Simulator`) or "auto" (compiled when it can).
    Both decide identically.
    """
    if (ratio is None) == (budget_bytes is None):
        raise ValueError("give exactly one of ratio= (e.g. 0.5) or budget_bytes= (e.g. 2_000_000_000)")
    if budget_bytes is None:
        budget_bytes = budget_for(trace, ratio)
    elif budget_bytes < 0:
        raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
    refuse_loose(policy_params)
    if not isinstance(semantics, Semantics):
        raise TypeError(f"semantics must be a dtrlab.Semantics (e.g. Semantics(memory='caching')), got {semantics!r}")
    enforce, overhead_limit = semantics.enforce, semantics.overhead_limit
    policy = get_policy(policy, **policy_params)
    device = check_semantics(enforce, semantics.device_capacity, policy)
    model = memory_model(semantics, budget_bytes, device)
    base = baseline(trace)
    remat_limit = base.model_compute * (overhead_limit - 1)
    if _use_compiled(engine, trace, policy, intervention, recorder, regions, model,
                     isinstance(semantics.memory, MemoryModel)):
        sim = compiled.run(trace, policy, budget_bytes, remat_limit, intervention, model=model, enforce=enforce)
        status = sim.status
        metrics = {} if model is None else memory_metrics(sim, model, sim.memory_stats)
    else:
        sim = Simulator(trace, policy, budget_bytes, remat_limit, intervention=intervention, recorder=recorder,
                        regions=regions, memory_model=model, enforce=enforce)
        status = sim.run()
        metrics = {} if model is None else memory_metrics(sim, model)
    names = trace.tensor_names
    return RunResult(
        trace=trace.name, policy=policy.label, status=status, budget_bytes=budget_bytes, ratio=ratio,
        clock=sim.clock, model_compute=sim.model_compute, remat_compute=sim.remat_compute,
        peak_memory=sim.peak_memory, evictions=len(sim.evicted), remats=sim.remats,
        evicted_storages=tuple(names[s] for s in sim.evicted),
        baseline_memory=base.peak_memory, baseline_compute=base.model_compute,
        overhead_limit=overhead_limit, failure=sim.failure, **metrics,
        **({} if enforce == RESERVED else {"enforce": enforce, "device_capacity": device.label}),
    )


def _use_compiled(engine: str, trace: Trace, policy: Policy, intervention, recorder, regions: str, model,
                  model_given: bool = False) -> bool:
    """Whether this run goes to the compiled core (see ``engine`` in :func:`simulate`); ``model_given``: the
    caller passed the model instance, whose final state is then the run's (the core keeps its own copy)."""
    if engine not in compiled.ENGINES:
        raise ValueError(f"engine must be one of {', '.join(compiled.ENGINES)}, got {engine!r}")
    if engine == "python":
        return False
    reason = compiled.unsupported_reason(trace, policy, intervention, recorder, model)
    if reason is None and regions == "python":
        reason = "regions='python' asks for the reference region index of the Python simulator"
    if reason is None and model_given:
        reason = ("a memory model instance given to simulate() is left holding the run's final state, which only "
                  "the Python simulator does; give the model's name and options to run compiled")
    if reason is not None and engine == "compiled":
        raise ValueError(f"engine='compiled' cannot take this run: {reason}; use engine='auto' or 'python'")
    return reason is None


def memory_label(name: str, options: dict | None = None) -> str:
    """``caching`` or ``caching(expandable_segments=True)``: the name and the options that differ from
    the model's defaults, for tables and plots."""
    specs = MEMORY_MODELS[name].option_specs if name in MEMORY_MODELS else {}
    changed = {k: v for k, v in sorted((options or {}).items()) if k not in specs or specs[k][0] != v}
    return name + ("(" + ", ".join(f"{k}={v!r}" for k, v in changed.items()) + ")" if changed else "")


def memory_model(semantics: Semantics, budget_bytes: int, device: DeviceCapacity | None = None) -> MemoryModel | None:
    """The model a run under ``semantics`` uses: None for ``"flat"`` without options under ``"reserved"``
    (the byte counter needs none). Its capacity is the budget under ``"reserved"``, the device
    capacity (``device``: :func:`check_semantics`' result) under ``"allocated"``.

    A model instance is taken as is, but it must be unused, since a run leaves its
    blocks in it.
    """
    memory, options, enforce = semantics.memory, semantics.options, semantics.enforce
    if memory == FLAT and not options and enforce == RESERVED:
        return None
    if enforce == ALLOCATED:
        capacity = (device or DeviceCapacity()).bytes_for(budget_bytes)
        if isinstance(memory, MemoryModel):
            model = get_memory_model(memory, capacity)
        else:
            model = get_memory_model(memory, capacity, **semantics_options(memory, options, enforce))
    else:
        model = get_memory_model(memory, budget_bytes, **(options or {}))
    stats = model.stats()
    if stats.allocated_bytes or stats.reserved_bytes:
        raise ValueError(f"the {model.name!r} model instance already holds blocks ({stats.allocated_bytes} bytes "
                         "allocated); give every run a new instance, or the model's name and options")
    return model


def memory_metrics(sim, model: MemoryModel, stats=None) -> dict:
    """RunResult fields of a run under a memory model (see :class:`RunResult`): ``sim`` is the
    :class:`Simulator` or the compiled core's :class:`~dtrlab.runtime.compiled.CoreRun`; ``stats`` the
    model's :class:`~dtrlab.memory.MemoryStats` at the end (read from ``model`` when not given)."""
    stats = model.stats() if stats is None else stats
    return dict(
        memory=model.name, memory_options=tuple(sorted(model.options().items())),
        fragmentation_evictions=sim.fragmentation_evictions, peak_reserved_bytes=stats.peak_reserved_bytes,
        peak_allocated_bytes=stats.peak_allocated_bytes,
        fragmentation_at_peak=1 - sim.allocated_at_peak / sim.peak_reserved if sim.peak_reserved else 0.0,
        largest_free_block=stats.largest_free_block, segments=stats.segments,
    )
