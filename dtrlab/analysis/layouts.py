"""Memory layouts over time: every block of an address-aware run, step by step.

:func:`record_layouts` replays a trace under a memory model and keeps the model's
layout (``Simulator.memory_model.layout()``) after each schedule step in a window,
and at the failure if the run fails there: one row per block and step, the data of
an address x time image (:func:`dtrlab.plots.memory.plot_layout`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ..policies import get_policy
from ..runtime import Failure, OutOfMemory, Semantics, Simulator, Thrash, baseline, budget_for, check_semantics
from ..runtime.run import memory_model
from ..trace.model import Trace
from .address_sensitivity import CACHING

#: Columns of :attr:`MemoryLayouts.blocks`.
BLOCK_COLUMNS = ["step", "segment", "pool", "address", "size", "requested", "block_id", "storage", "state"]


@dataclass(frozen=True)
class MemoryLayouts:
    """The recorded layouts of one run: ``blocks`` has :data:`BLOCK_COLUMNS`.

    ``status`` is the run's ("pass", "oom", "thrash"), or "stopped" when the window
    ended first.
    ``state`` is ``"allocated"`` or ``"free"``; ``storage`` names the block's storage
    (its root tensor) or is empty. The failure's layout (if the run failed inside the
    window) is recorded with the failing step's index.
    """

    trace: str
    policy: str
    memory: str
    budget_bytes: int
    status: str
    failure: Failure | None
    blocks: pd.DataFrame


def record_layouts(trace: Trace, policy="dtr", *, ratio: float | None = None, budget_bytes: int | None = None,
                   semantics: Semantics = CACHING, start: int = 0, stop: int | None = None, every: int = 1,
                   **policy_params) -> MemoryLayouts:
    """Replay ``trace`` and record the memory layout after every ``every``-th step of ``[start, stop)``.

    Budget, policy and ``semantics`` arguments are those of :func:`~dtrlab.runtime.simulate`
    (the memory model must not be ``flat`` without options: flat keeps no blocks).
    """
    if (ratio is None) == (budget_bytes is None):
        raise ValueError("give exactly one of ratio= (e.g. 0.5) or budget_bytes= (e.g. 2_000_000_000)")
    if every < 1 or start < 0:
        raise ValueError(f"every must be >= 1 and start >= 0, got every={every}, start={start}")
    budget = budget_for(trace, ratio) if budget_bytes is None else budget_bytes
    policy = get_policy(policy, **policy_params)
    model = memory_model(semantics, budget, check_semantics(semantics.enforce, semantics.device_capacity, policy))
    if model is None:
        raise ValueError("the flat byte counter keeps no blocks; record layouts under Semantics(memory='caching') (or "
                         "'aligned', or a FlatModel instance)")
    sim = Simulator(trace, policy, budget, baseline(trace).model_compute * (semantics.overhead_limit - 1),
                    memory_model=model, enforce=semantics.enforce)
    stop = len(trace.schedule) if stop is None else stop
    rows: list[tuple] = []
    names = trace.tensor_names

    def snapshot(step: int) -> None:
        for index, segment in enumerate(model.layout()):
            for block in segment.blocks:
                owner = block.block_id
                storage = "" if owner is None else names[owner]
                rows.append((step, index, segment.pool, block.address, block.size, block.requested, owner, storage,
                             "free" if owner is None else "allocated"))

    status = "pass"
    try:
        for step in sim.steps():
            if step >= stop:
                status = "stopped"  # the window ended before the run did
                break
            if step >= start and (step - start) % every == 0:
                snapshot(step)
    except (OutOfMemory, Thrash) as failure:
        status = "oom" if isinstance(failure, OutOfMemory) else "thrash"
        if start <= sim.step < stop:
            snapshot(sim.step)
    frame = pd.DataFrame(rows, columns=BLOCK_COLUMNS).astype({"block_id": "Int64"})
    return MemoryLayouts(trace.name, policy.label, model.name, budget, status, sim.failure, frame)
