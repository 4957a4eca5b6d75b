"""The independent check: replay a solver's schedule inside dtrlab's simulator.

The simulator does all memory accounting, budget checks, releases and
rematerializations itself; the replay only tells it, in the gap before each stage,
which storages to evict (:meth:`Simulator.evict`; at the start of the gap for a
stage-model schedule, before each recomputation for an interval-model one) and which
operators to recompute (:meth:`Simulator.materialize`, which rematerializes as DTR does). The policy never
gets a choice: every storage is withheld from eviction, so an allocation that does
not fit is an out-of-memory failure rather than a policy eviction. A schedule
passes only if the replay finishes, every recomputation costs exactly its own
operator (no on-demand recomputation of something the schedule claimed resident),
the resident set after each gap is the one the schedule claims, and the total
recompute equals the solver's.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..policies import Policy
from ..runtime import DEFAULT_OVERHEAD_LIMIT, Intervention, Simulator, baseline
from ..runtime.simulator import Failure, OutOfMemory, Thrash
from .problem import Problem, Schedule, SolveResult, build_problem


class ScriptedPolicy(Policy):
    """Never chooses: the replay evicts by script and withholds every storage from the policy."""

    name = "scripted"
    description = "replay of a solver schedule (evictions are scripted, never chosen)"

    def choose(self, sim, candidates):
        raise RuntimeError("the scripted replay withholds every storage; the policy is never asked to choose")


@dataclass(frozen=True)
class ReplayResult:
    status: str  # the simulator's "pass", "oom" or "thrash"
    clock: int
    remat_compute: int
    claimed_remat_compute: int
    peak_memory: int
    budget_bytes: int
    disagreements: tuple[str, ...] = ()
    failure: Failure | None = None

    @property
    def passed(self) -> bool:
        """The simulator finished within budget, doing exactly what the schedule says."""
        return (self.status == "pass" and not self.disagreements
                and self.remat_compute == self.claimed_remat_compute)

    def summary(self) -> str:
        if self.passed:
            return f"pass: recompute {self.remat_compute}, peak {self.peak_memory} <= {self.budget_bytes}"
        problems = list(self.disagreements[:5])
        if self.status != "pass":
            problems.insert(0, f"simulator: {self.status} ({self.failure})")
        if self.remat_compute != self.claimed_remat_compute:
            problems.append(f"recompute {self.remat_compute} != claimed {self.claimed_remat_compute}")
        return "FAIL: " + "; ".join(problems)


def replay(trace_or_problem, schedule: Schedule | SolveResult, budget_bytes: int | None = None, *,
           overhead_limit: float = DEFAULT_OVERHEAD_LIMIT) -> ReplayResult:
    """Replay ``schedule`` (or a :class:`SolveResult`'s schedule at its budget) in the simulator."""
    problem = trace_or_problem if isinstance(trace_or_problem, Problem) else build_problem(trace_or_problem)
    if isinstance(schedule, SolveResult):
        if schedule.schedule is None:
            raise ValueError(f"the solve ended {schedule.status!r} without a schedule to replay")
        budget_bytes = schedule.budget_bytes if budget_bytes is None else budget_bytes
        overhead_limit = schedule.overhead_limit
        schedule = schedule.schedule
    if budget_bytes is None:
        raise ValueError("give budget_bytes= with a bare Schedule")
    trace = problem.trace
    ops = trace.operators
    remat_limit = baseline(trace).model_compute * (overhead_limit - 1)
    storages = list(problem.storage_window)
    sim = Simulator(trace, ScriptedPolicy(), budget_bytes, remat_limit,
                    intervention=Intervention(withhold=frozenset(range(trace.n_tensors))))
    claimed = sum(ops[op].cost for stage in schedule.remat for op in stage)
    disagreements: list[str] = []
    gap_before = {step: t for t, step in enumerate(problem.stage_step)}

    def evict(t: int, doomed) -> None:
        for s in doomed:
            if sim.material[s]:
                if sim.ref_int[s] or sim.pinned[s]:
                    disagreements.append(f"stage {t}: cannot evict {trace.tensor_names[s]} (locked or pinned)")
                else:
                    sim.evict(s)

    def run_gap(t: int) -> None:
        wanted = set(schedule.resident[t])
        if schedule.evictions is None:
            evict(t, [s for s in storages if s not in wanted])
        for j, op_index in enumerate(schedule.remat[t]):
            if schedule.evictions is not None:
                evict(t, schedule.evictions[t][j])
            op = ops[op_index]
            target = next((u for u in op.outputs if not sim.defined[u]), None)
            if target is None:  # harmless for a view; simrd's accounting would leak the output's bytes otherwise
                if op.total_size:
                    disagreements.append(f"stage {t}: recomputing {op.name} (operator {op_index}) whose outputs "
                                         "are all resident")
                target = op.outputs[0]
            before = sim.remat_compute
            sim.materialize(target, True)
            if sim.remat_compute - before != op.cost:
                disagreements.append(f"stage {t}: recomputing {op.name} (operator {op_index}) cost "
                                     f"{sim.remat_compute - before}, not {op.cost}: an argument was not resident")
        if schedule.evictions is not None:
            evict(t, schedule.evictions[t][-1])
        new = set(ops[problem.stage_op[t]].outputs) if problem.stage_op[t] != -1 else set()
        resident = {s for s in storages if sim.material[s]}
        if resident != wanted - new:
            extra, missing = sorted(resident - wanted), sorted(wanted - new - resident)
            disagreements.append(f"stage {t}: resident set differs from the schedule "
                                 f"(extra {[trace.tensor_names[s] for s in extra[:3]]}, "
                                 f"missing {[trace.tensor_names[s] for s in missing[:3]]})")

    status = "pass"
    try:
        if 0 in gap_before:
            run_gap(gap_before[0])
        for step in sim.steps():
            if step + 1 in gap_before:
                run_gap(gap_before[step + 1])
    except OutOfMemory:
        status = "oom"
    except Thrash:
        status = "thrash"
    return ReplayResult(status=status, clock=sim.clock, remat_compute=sim.remat_compute, claimed_remat_compute=claimed,
                        peak_memory=sim.peak_memory, budget_bytes=int(budget_bytes),
                        disagreements=tuple(disagreements), failure=sim.failure)
