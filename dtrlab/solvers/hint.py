"""Starting points for the solvers: DTR's own run (or a zoo policy's), read as a schedule of the model.

A hint only guides the search (CP-SAT repairs or drops it, HiGHS uses it only if it
is feasible); it never changes what the solver proves or what the replay checks.
Where DTR passes a budget, its run is usually a feasible, or nearly feasible, schedule
of the stage model, so the solver starts no worse than DTR.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..policies import get_policy
from ..runtime import Simulator
from .model import LinearModel
from .problem import Problem


def keep_everything(model: LinearModel) -> list[int]:
    """Keep every storage until its last need, recompute nothing (fits when no recompute is needed)."""
    return [model.lower[var] if model.lower[var] == model.upper[var] else int(kind != "R")
            for var, (kind, _, _) in enumerate(model.names)]


class _StageRecorder:
    """A simulator recorder that knows which stage each schedule step belongs to."""

    def __init__(self, problem: Problem):
        self.stage_at_step = {step: t for t, step in enumerate(problem.stage_step)}
        self.final = problem.final_stage
        self.final_step = problem.stage_step[self.final] if self.final is not None else None

    def __getattr__(self, name):  # every other recorder callback: nothing to record
        return lambda *args, **kwargs: None

    def remat_stage(self, sim) -> int | None:
        """The stage in whose gap a recomputation at the current step happens (None: outside every stage)."""
        stage = self.stage_at_step.get(sim.step)
        if stage is None and self.final_step is not None and sim.step >= self.final_step:
            stage = self.final  # the end pins rematerialize
        return stage


class _Snapshots(_StageRecorder):
    """Records, per stage, what DTR holds while the stage's operator runs and what it recomputed."""

    def __init__(self, problem: Problem):
        super().__init__(problem)
        self.material: dict[int, bytes] = {}
        self.defined: dict[int, tuple[bool, ...]] = {}
        self.remats: set[tuple[int, int]] = set()

    def on_remat(self, sim, tensor: int) -> None:
        stage = self.remat_stage(sim)
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


class _Events(_StageRecorder):
    """Records a run as a sequence: ("compute" | "remat", stage, tensor) and ("evict", storage)."""

    def __init__(self, problem: Problem):
        super().__init__(problem)
        self.events: list[tuple] = []
        self.outside = False  # a recomputation outside every stage (the model has no slot for it)

    def on_compute(self, sim, tensor: int) -> None:
        stage = self.stage_at_step.get(sim.step)
        if stage is not None:
            self.events.append(("compute", stage, tensor))

    def on_remat(self, sim, tensor: int) -> None:
        stage = self.remat_stage(sim)
        if stage is None:
            self.outside = True
        self.events.append(("remat", stage, tensor))

    def on_choose(self, sim, candidates, chosen) -> None:
        self.events.extend(("evict", s) for s in chosen)

    def on_free(self, sim, s: int) -> None:
        self.events.append(("evict", s))


@dataclass(frozen=True)
class PolicyRun:
    """A policy's passing run at one budget, as events, and what the interval model needs to hold it."""

    policy: str
    remat_compute: int
    events: tuple[tuple, ...]
    copies: dict[int, int]  # operator -> times computed (first computation included)
    recomputations: dict[int, int]  # stage -> recomputations in its gap


def policy_run(problem: Problem, budget_bytes: int, remat_limit: float, policy: str = "dtr") -> PolicyRun | None:
    """``policy``'s run at this budget, or None if it fails (or recomputes outside a stage)."""
    record = _Events(problem)
    sim = Simulator(problem.trace, get_policy(policy), budget_bytes, remat_limit, recorder=record)
    if sim.run() != "pass" or record.outside:
        return None
    copies, recomputations = {}, {}
    for kind, *rest in record.events:
        if kind != "evict":
            op_index = sim.tensor_op[rest[1]]
            copies[op_index] = copies.get(op_index, 0) + 1
            if kind == "remat":
                recomputations[rest[0]] = recomputations.get(rest[0], 0) + 1
    return PolicyRun(policy=policy, remat_compute=sim.remat_compute, events=tuple(record.events), copies=copies,
                     recomputations=recomputations)


def best_run(problem: Problem, budget_bytes: int, remat_limit: float, policies=("dtr",)) -> PolicyRun | None:
    """The passing run with the least recompute among ``policies`` at this budget, or None."""
    runs = [run for run in (policy_run(problem, budget_bytes, remat_limit, p) for p in policies) if run is not None]
    return min(runs, key=lambda run: run.remat_compute, default=None)


def interval_hint(model, run: PolicyRun) -> list[tuple[object, int]] | None:
    """A run as (variable, value) hints for the interval model (:mod:`.interval`): each
    recomputation in the next slot of its gap, each storage copy retained up to the last
    event before its eviction. None if the run needs more copies or slots than the model has."""
    trace = model.problem.trace
    storage = model.problem.storage
    now = -1
    used_slots: dict[int, int] = {}
    starts: dict[int, list[int]] = {}  # operator -> each copy's start time
    ends: dict[tuple[int, int, int], int] = {}  # (operator, copy, output) -> end time
    open_copies: dict[int, list[tuple[int, int, int]]] = {}  # storage -> open copies of it and its views
    for kind, *rest in run.events:
        if kind == "evict":
            for key in open_copies.pop(rest[0], ()):
                ends[key] = now
            continue
        stage, tensor = rest
        op_index = trace.tensor_op[tensor]
        if kind == "compute":
            now = model.stage_time(stage)
        else:
            slot = used_slots.get(stage, 0)
            now = (model.stage_time(stage - 1) + 1 if stage else 0) + slot
            if now >= model.stage_time(stage):
                return None
            used_slots[stage] = slot + 1
        copies = starts.setdefault(op_index, [])
        k = len(copies)
        if k >= len(model.copies.get(op_index, ())):
            return None
        copies.append(now)
        for x in trace.operators[op_index].outputs:
            s = storage[x]
            if x == s and any(key[0] == op_index and key[2] == x for key in open_copies.get(s, ())):
                ends[op_index, k, x] = now  # a duplicate of a resident output, dropped at once
            else:
                open_copies.setdefault(s, []).append((op_index, k, x))
    hints = []
    for op_index, chain in model.copies.items():
        times = starts.get(op_index, [])
        for c in chain:
            if c.k:
                hints.append((c.present, int(c.k < len(times))))
                if c.k >= len(times):
                    continue
                hints.append((c.start, times[c.k]))
            for x, end in c.ends.items():
                hints.append((end, min(ends.get((op_index, c.k, x), c.latest_end[x]), c.latest_end[x])))
    return hints
