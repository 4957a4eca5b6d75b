"""Starting points for the solvers: DTR's own run, read as a stage schedule.

A hint only guides the search (CP-SAT repairs or drops it, HiGHS uses it only if it
is feasible); it never changes what the solver proves or what the replay checks.
Where DTR passes a budget, its run is usually a feasible, or nearly feasible, schedule
of the stage model, so the solver starts no worse than DTR.
"""

from __future__ import annotations

from ..policies import get_policy
from ..runtime import Simulator
from .model import LinearModel
from .problem import Problem


def keep_everything(model: LinearModel) -> list[int]:
    """Keep every storage until its last need, recompute nothing (fits when no recompute is needed)."""
    return [model.lower[var] if model.lower[var] == model.upper[var] else int(kind != "R")
            for var, (kind, _, _) in enumerate(model.names)]


class _Snapshots:
    """Records, per stage, what DTR holds while the stage's operator runs and what it recomputed."""

    def __init__(self, problem: Problem):
        self.stage_at_step = {step: t for t, step in enumerate(problem.stage_step)}
        self.final = problem.final_stage
        self.final_step = problem.stage_step[self.final] if self.final is not None else None
        self.material: dict[int, bytes] = {}
        self.defined: dict[int, tuple[bool, ...]] = {}
        self.remats: set[tuple[int, int]] = set()

    def __getattr__(self, name):  # every other recorder callback: nothing to record
        return lambda *args, **kwargs: None

    def on_remat(self, sim, tensor: int) -> None:
        stage = self.stage_at_step.get(sim.step)
        if stage is None and self.final_step is not None and sim.step >= self.final_step:
            stage = self.final  # the end pins rematerialize
        if stage is not None:
            self.remats.add((stage, sim.tensor_op[tensor]))

    def on_compute(self, sim, tensor: int) -> None:
        stage = self.stage_at_step.get(sim.step)
        if stage is not None:
            self.material[stage] = bytes(sim.material)
            self.defined[stage] = tuple(sim.defined)


def dtr_hint(problem: Problem, model: LinearModel, budget_bytes: int, remat_limit: float) -> list[int] | None:
    """DTR's run at this budget as values of the model's variables, or None if DTR fails."""
    record = _Snapshots(problem)
    sim = Simulator(problem.trace, get_policy("dtr"), budget_bytes, remat_limit, recorder=record)
    if sim.run() != "pass":
        return None
    if problem.final_stage is not None:
        record.material[problem.final_stage] = bytes(sim.material)
        record.defined[problem.final_stage] = tuple(sim.defined)
    stretch: dict[int, list[int]] = {}  # keep variable -> the stages it covers
    for stages in model.cover.values():
        for t, var in stages.items():
            stretch.setdefault(var, []).append(t)
    values = []
    for var, (kind, stage, item) in enumerate(model.names):
        if model.lower[var] == model.upper[var]:
            values.append(model.lower[var])
        elif kind == "R":
            values.append(int((stage, item) in record.remats))
        elif kind == "D":
            values.append(int(record.defined.get(stage, ())[item:item + 1] == (True,)))
        else:  # A at its stage; K only if DTR held the storage through the whole stretch
            values.append(int(all(record.material.get(t, b"")[item:item + 1] == b"\x01"
                                  for t in (stretch[var] if kind == "K" else (stage,)))))
    return values
