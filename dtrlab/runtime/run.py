"""``simulate``: one budgeted replay, returned as a :class:`RunResult` record."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

from ..policies import Policy, get_policy
from ..trace.model import Trace
from .baseline import baseline
from .simulator import Failure, Intervention, Simulator

DEFAULT_OVERHEAD_LIMIT = 2.0


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
        if self.failure is not None:
            record["failure"] = vars(self.failure)
        if evicted:
            record["evicted_storages"] = list(self.evicted_storages)
        return record


def budget_for(trace: Trace, ratio: float) -> int:
    """simrd's budget for a ratio: ``int(baseline peak * ratio)``."""
    if not ratio > 0:
        raise ValueError(f"budget ratio must be positive (a fraction of the baseline peak, e.g. 0.5), got {ratio}")
    return int(baseline(trace).peak_memory * ratio)


def simulate(trace: Trace, policy: str | Policy = "dtr", *, ratio: float | None = None,
             budget_bytes: int | None = None, overhead_limit: float = DEFAULT_OVERHEAD_LIMIT,
             intervention: Intervention | None = None, recorder=None, regions: str = "auto",
             **policy_params) -> RunResult:
    """Replay ``trace`` under a memory budget with an eviction policy.

    Give exactly one of ``ratio`` (a fraction of the unbounded peak; the budget is
    ``int(peak * ratio)`` as in simrd) or ``budget_bytes``. The run fails with
    ``thrash`` once rematerialization compute exceeds
    ``baseline compute x (overhead_limit - 1)``. ``regions`` picks the evicted-
    neighbourhood index: "c" (compiled), "python" (the readable reference) or "auto".
    """
    if (ratio is None) == (budget_bytes is None):
        raise ValueError("give exactly one of ratio= (e.g. 0.5) or budget_bytes= (e.g. 2_000_000_000)")
    if budget_bytes is None:
        budget_bytes = budget_for(trace, ratio)
    elif budget_bytes < 0:
        raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
    if not overhead_limit >= 1:
        raise ValueError(f"overhead_limit must be >= 1 (2.0 allows as much recompute as compute), got {overhead_limit}")
    policy = get_policy(policy, **policy_params)
    base = baseline(trace)
    remat_limit = base.model_compute * (overhead_limit - 1)
    sim = Simulator(trace, policy, budget_bytes, remat_limit, intervention=intervention, recorder=recorder,
                    regions=regions)
    status = sim.run()
    names = trace.tensor_names
    return RunResult(
        trace=trace.name, policy=policy.label, status=status, budget_bytes=budget_bytes, ratio=ratio,
        clock=sim.clock, model_compute=sim.model_compute, remat_compute=sim.remat_compute,
        peak_memory=sim.peak_memory, evictions=len(sim.evicted), remats=sim.remats,
        evicted_storages=tuple(names[s] for s in sim.evicted),
        baseline_memory=base.peak_memory, baseline_compute=base.model_compute,
        overhead_limit=overhead_limit, failure=sim.failure,
    )
