"""A relaxation of rematerialization that every simulator run maps into: the lower side.

The stage model (:mod:`.model`) is a *restriction*: its schedules are real, its
"infeasible" is not. This module builds the opposite, a *relaxation*: a linear model
whose feasible set contains the image of every run the simulator can make (DTR's,
the zoo's, a replayed solver schedule), so that

* relaxation infeasible at a budget  =>  no run of the simulator fits that budget
  (within the overhead limit), and
* the relaxation's optimum (or a MIP's dual bound) <= the compute of every run that fits.

It is Checkmate's formulation (Jain et al., MLSys 2020) weakened until the image of a
simulator run provably satisfies it (docs/solvers.md gives the argument, and
``tests/test_solvers_relax.py`` checks it row by row on DTR's and the zoo's runs).
Stages and the unbounded need closure come from :func:`.problem.build_problem` with
``chain=None``. Variables, with what they mean for a run:

* ``A[t, s]``: storage ``s`` is resident when stage ``t``'s operator allocates (after its
  evictions; its own outputs count as resident);
* ``K[t, s]``: ``s`` is resident at every stage of the stretch (between two need stages)
  starting at ``t``;
* ``R[t, op]``: ``op`` is recomputed *at least once* in the gap before stage ``t`` (any
  number of times, in any order, with evictions between: only the indicator is kept);
* ``H[t, s]`` (continuous): ``s`` is resident throughout the gap before ``t``;
* ``P[t]`` (continuous): the bytes, beyond the held ones, of the largest recomputation in
  the gap before ``t`` (its outputs plus its arguments that were not held).

Rows: a stage's arguments (and the end pins) are resident; a storage is resident only
if it was before and no release freed it, or its operator was recomputed in the gap; a
recomputation needs each argument resident at the start of the gap or recomputed in
it; the memory at each stage's allocation, and at every recomputation (held bytes +
``P[t]``), fits the budget; the recompute indicators' cost fits the overhead limit.
Views are read as their storages and their (cheap) recomputation is not counted, which
only weakens the bound.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from ..runtime import DEFAULT_OVERHEAD_LIMIT, Simulator, baseline, recompute_allowance
from ..trace.model import Trace
from .model import LinearModel, storage_stretches, violations
from .problem import Problem, build_problem
from .solve import load_highs, run_highs

RELAX_METHODS = ("lp", "mip")
#: Traces with more (operator, need stage) pairs than this are not relaxed: the unbounded
#: closure is O(n^2) and the model has 2-4 variables per pair (sizes in docs/solvers.md).
MAX_NEED_PAIRS = 150_000


class RelaxationTooLarge(ValueError):
    """The relaxation of this trace would exceed :data:`MAX_NEED_PAIRS`."""


@dataclass(frozen=True)
class RelaxResult:
    """One relaxation solve. ``status``: "infeasible" (no simulator run fits the budget),
    "bound" (``bound`` is a valid lower bound on total compute) or "unknown" (time limit)."""

    trace: str
    method: str  # "lp" or "mip" (the 0/1 relaxation; its dual bound is a bound too)
    budget_bytes: int
    overhead_limit: float
    status: str
    bound: float | None  # total compute: the trace's own compute plus the least recompute
    base_compute: int
    build_seconds: float
    solve_seconds: float
    time_limit_s: float
    n_vars: int
    n_rows: int
    n_nonzeros: int
    message: str = ""

    @property
    def overhead_bound(self) -> float | None:
        """A lower bound on the simulator's overhead (1 + compute) / trace compute."""
        if self.bound is None:
            return None
        return (1 + self.bound) / self.base_compute if self.base_compute else math.nan  # as RunResult

    def to_dict(self) -> dict:
        return {"trace": self.trace, "method": self.method, "budget_bytes": self.budget_bytes,
                "overhead_limit": self.overhead_limit, "status": self.status, "bound": self.bound,
                "overhead_bound": self.overhead_bound, "base_compute": self.base_compute,
                "build_seconds": self.build_seconds, "solve_seconds": self.solve_seconds,
                "time_limit_s": self.time_limit_s, "n_vars": self.n_vars, "n_rows": self.n_rows,
                "n_nonzeros": self.n_nonzeros, "message": self.message}


def relaxation_problem(trace: Trace | Problem) -> Problem:
    """The problem with the unbounded need closure the relaxation needs."""
    if isinstance(trace, Problem):
        if trace.chain is not None:
            raise ValueError("the relaxation needs the unbounded closure: build_problem(trace, chain=None)")
        return trace
    return build_problem(trace, chain=None)


def need_pairs(problem: Problem) -> int:
    """(operator, need stage) pairs: what the relaxation's size grows with (2-4 variables each)."""
    return sum(len(stages) for stages in problem.need.values())


def check_size(problem: Problem) -> None:
    """Raise :class:`RelaxationTooLarge` above :data:`MAX_NEED_PAIRS`."""
    pairs = need_pairs(problem)
    if pairs > MAX_NEED_PAIRS:
        raise RelaxationTooLarge(f"the relaxation of {problem.trace.name} has {pairs:,} (operator, need stage) pairs "
                                 f"(limit {MAX_NEED_PAIRS:,}, 2-4 variables each): the unbounded closure is O(n^2)")


def build_relaxation(problem: Problem, budget_bytes: int, allowance: int | None) -> LinearModel:
    """The relaxation of ``problem`` (unbounded closure) at one budget; see the module docstring.
    ``allowance``: the largest recompute (:func:`~dtrlab.runtime.recompute_allowance`; None: no limit).

    Memory rows are divided by the room they bound (bytes ~1e9 beside 0/1 variables
    would strain the LP tolerances); ``P`` is measured in units of the budget.
    """
    problem = relaxation_problem(problem)
    m = LinearModel()
    trace, ops, storage = problem.trace, problem.trace.operators, problem.storage
    pinned, op_stage, need = problem.pinned_storages, problem.op_stage, problem.need
    n = problem.n_stages
    room = [budget_bytes - problem.constant_bytes[t] for t in range(n)]
    if min(room, default=0) < 0:
        m.infeasible = "the pinned constants exceed the budget"
        return m
    # Memory rows are measured in a power of two near their room: dividing integers by a
    # power of two is exact in floating point, so HiGHS gets the exact rows.
    unit = [2.0 ** round(math.log2(max(r, 1))) for r in room]
    fresh = {op: [x for x, alias in zip(ops[op].outputs, ops[op].aliases) if alias == -1] for op in op_stage}
    R = {(t, op): m.var("R", t, op, ops[op].cost) for op in op_stage if fresh[op] for t in need[op]}
    memory = [dict() for _ in range(n)]  # stage t's allocation: resident storages
    held = [dict() for _ in range(n)]  # the gap before t: storages resident throughout it
    at: dict[int, dict[int, int]] = {}  # storage -> {need stage: A}
    start: dict[tuple[int, int], int | None] = {}  # (stage, storage) -> "resident at the start of the gap"
    H: dict[tuple[int, int], int] = {}
    cover: dict[int, dict[int, int]] = {}
    for s in problem.storage_window:
        producer = trace.tensor_op[s]
        size = ops[producer].sizes[trace.tensor_index[s]]
        at[s], cover[s] = {}, {}
        for stretch in storage_stretches(m, problem, s, memory, at[s], cover[s], -math.inf):
            t, prev = stretch.stage, stretch.prev
            for u in stretch.kept_stages:  # K = 1: resident at every stage of the stretch, hence throughout its gaps
                held[u][stretch.kept] = size
            remat = R[t, producer]
            start[t, s] = prev
            m.row({stretch.resident: 1, remat: -1, **({prev: -1} if prev is not None else {})}, -math.inf, 0)
            if prev is None:
                continue
            h = H[t, s] = m.var("H", t, s, continuous=True)
            m.row({h: 1, stretch.resident: -1}, -math.inf, 0)
            m.row({h: 1, stretch.resident: -1, remat: 1}, 0, math.inf)  # resident at t and not recomputed => held
            m.row({h: 1, prev: -1}, -math.inf, 0)
            if len(fresh[producer]) == 1:  # the simulator recomputes only undefined tensors
                m.row({h: 1, remat: 1}, -math.inf, 1)
            held[t][h] = size
    # Each stage's operator (and the end pins) needs its arguments resident.
    for t, op_index in enumerate(problem.stage_op):
        needed = ops[op_index].args if op_index != -1 else sorted(problem.end_pinned)
        for a in needed:
            if storage[a] in pinned:
                continue
            m.fix(at.get(storage[a], {}).get(t), 1,
                  f"stage {t} needs {trace.tensor_names[a]}, which the closure says cannot be resident")
    P = _recomputation_rows(m, problem, R, fresh, start, H, room, unit)
    for t in range(n):
        if memory[t]:
            m.row({var: size / unit[t] for var, size in memory[t].items()}, -math.inf, room[t] / unit[t])
        if t in P:
            m.row({**{var: size / unit[t] for var, size in held[t].items()}, P[t]: 1}, -math.inf, room[t] / unit[t])
    if R and allowance is not None:
        m.row({var: ops[op_index].cost for (_, op_index), var in R.items()}, -math.inf, allowance)
    m.cover = cover
    return m


def _recomputation_rows(m: LinearModel, problem: Problem, R: dict[tuple[int, int], int], fresh: dict[int, list[int]],
                        start: dict[tuple[int, int], int | None], H: dict[tuple[int, int], int], room: list[int],
                        unit: list[float]) -> dict[int, int]:
    """A recomputation needs its arguments resident: held from before the gap or recomputed in it;
    at its allocation the held storages, its non-held arguments and all its outputs fit (in ``P``,
    returned by stage)."""
    trace, ops, storage, pinned = problem.trace, problem.trace.operators, problem.storage, problem.pinned_storages
    P: dict[int, int] = {}
    for (t, op_index), remat in R.items():
        op = ops[op_index]
        outputs = set(fresh[op_index])
        arguments = {storage[a] for a in op.args if storage[a] not in pinned} - outputs
        if t not in P:
            # P <= room is implied by the gap's memory row; stated as a bound, because with P
            # unbounded HiGHS's presolve proved the 0/1 relaxation infeasible where DTR's run
            # satisfies every row (and HiGHS without presolve finds it feasible).
            P[t] = m.var("P", t, -1, continuous=True, upper=room[t] / unit[t])
        footprint = {P[t]: 1}
        footprint[remat] = -(op.total_size + sum(_size(trace, s) for s in arguments)) / unit[t]
        for s in arguments:
            producer_remat = R.get((t, trace.tensor_op[s]))
            terms = {remat: 1, **({producer_remat: -1} if producer_remat is not None else {})}
            prev = start.get((t, s))
            if prev is not None:
                terms[prev] = -1
            m.row(terms, -math.inf, 0)
            if (t, s) in H:
                footprint[H[t, s]] = _size(trace, s) / unit[t]
        m.row(footprint, 0, math.inf)
    return P


def _size(trace: Trace, s: int) -> int:
    return trace.operators[trace.tensor_op[s]].sizes[trace.tensor_index[s]]


def solve_relaxation(trace: Trace | Problem, budget_bytes: int, *, overhead_limit: float = DEFAULT_OVERHEAD_LIMIT,
                     method: str = "lp", time_limit_s: float = 60.0, workers: int = 2,
                     check_policies: Sequence[str] = ("dtr",)) -> RelaxResult:
    """Solve the relaxation at ``budget_bytes`` with HiGHS: "lp" (the linear relaxation) or
    "mip" (A, K, R binary; stronger, and its dual bound is valid when the time runs out).

    Every claim is checked against the runs of ``check_policies`` at this budget before it
    is returned: a passing run must satisfy every row (:func:`run_point`), and no such run
    may refute the claim (be "infeasible" or below the bound). A refuted claim comes back
    as "unknown" with the fault in ``message``, never as a proof. :func:`checked_relaxation`
    does the same against any other real runs (e.g. the frontier's).
    """
    if method not in RELAX_METHODS:
        raise ValueError(f"unknown relaxation method {method!r}; choose one of {', '.join(RELAX_METHODS)}")
    if not overhead_limit >= 1:
        raise ValueError(f"overhead_limit must be >= 1 (2.0 allows as much recompute as compute), got {overhead_limit}")
    if not time_limit_s > 0:
        raise ValueError(f"time_limit_s must be positive, got {time_limit_s}")
    started = time.perf_counter()
    problem = relaxation_problem(trace)
    check_size(problem)
    base = problem.base_compute
    common = dict(trace=problem.trace.name, method=method, budget_bytes=int(budget_bytes),
                  overhead_limit=overhead_limit, base_compute=base, time_limit_s=time_limit_s)
    bound = problem.lower_bound()
    if budget_bytes < bound:
        return RelaxResult(status="infeasible", bound=None, build_seconds=time.perf_counter() - started,
                           solve_seconds=0.0, n_vars=0, n_rows=0, n_nonzeros=0,
                           message=f"budget {budget_bytes} is below the lower bound {bound} bytes (the largest "
                                   "stage footprint: arguments, outputs and pinned bytes); no schedule fits", **common)
    model = build_relaxation(problem, int(budget_bytes), recompute_allowance(base, overhead_limit))
    built = time.perf_counter()
    sizes = dict(n_vars=model.n_vars, n_rows=len(model.rows), n_nonzeros=sum(len(terms) for terms, _, _ in model.rows))
    if model.infeasible:
        status, objective = "infeasible", None
        message = model.infeasible
    else:
        status, objective = _solve(model, method == "mip", time_limit_s, workers)
        message = {"infeasible": "HiGHS proved the relaxation infeasible: no simulator run fits this budget",
                   "unknown": "the time limit ran out without a bound",
                   "unconfirmed": "HiGHS failed on the relaxation (a solve error, or an infeasibility found with "
                                  "presolve that it could not confirm without): not a proof"}.get(status, "")
        status = "unknown" if status == "unconfirmed" else status
    solved = time.perf_counter()
    result = RelaxResult(status=status, bound=None if objective is None else base + max(0.0, objective),
                         build_seconds=built - started, solve_seconds=solved - built,
                         message=message, **common, **sizes)
    runs = []
    for policy in check_policies:
        passed, recompute, values = run_point(problem, model, policy, int(budget_bytes), overhead_limit)
        if passed != "pass":
            continue
        broken = violations(model, values, tolerance=1e-7)
        if broken:  # the model does not hold a real run: nothing it says is a proof
            return replace(result, status="unknown", bound=None,
                           message=f"model fault: {policy}'s passing run (recompute {recompute}) breaks "
                                   f"{len(broken)} rows of the relaxation ({broken[0]})")
        runs.append((policy, int(budget_bytes), recompute))
    return checked_relaxation(result, runs)


def checked_relaxation(result: RelaxResult, runs: Iterable[tuple[str, int, int]]) -> RelaxResult:
    """``result``, or the same solve as "unknown" if a real run refutes its claim.

    ``runs``: ``(what, budget_bytes, recompute)`` of runs that passed in the simulator
    (policy runs, replayed schedules) at ``result``'s overhead limit or a smaller one. A run
    at a budget no larger than ``result.budget_bytes`` fits that budget too, so it refutes
    "infeasible", and a bound above its compute. A refuted claim is a solver fault.
    """
    reason = refuting_run(result, runs)
    if reason is None:
        return result
    return replace(result, status="unknown", bound=None, message=f"solver fault: {reason}")


def refuting_run(result: RelaxResult, runs: Iterable[tuple[str, int, int]]) -> str | None:
    """Why one of ``runs`` (see :func:`checked_relaxation`) refutes ``result``'s claim, or None."""
    for what, budget, recompute in runs:
        if budget > result.budget_bytes:
            continue
        if result.status == "infeasible":
            return (f"the relaxation was claimed infeasible at {result.budget_bytes} bytes, but {what} passes "
                    f"{budget} bytes with recompute {recompute}")
        if result.status == "bound" and result.bound > result.base_compute + recompute + 1e-6 * max(1, result.bound):
            return (f"the relaxation's bound {result.bound:g} at {result.budget_bytes} bytes is above the compute "
                    f"{result.base_compute + recompute} of {what}'s run at {budget} bytes")
    return None


def _solve(model: LinearModel, integer: bool, time_limit_s: float, workers: int):
    """("infeasible" | "bound" | "unknown" | "unconfirmed", a lower bound on the objective or None)."""
    integer_columns = [var for var in range(model.n_vars) if not model.continuous[var]] if integer else []
    highspy, h = load_highs(model, time_limit_s, integer_columns, "the relaxation", workers)
    inf = highspy.kHighsInf
    status = run_highs(highspy, h)
    info = h.getInfo()
    if status == highspy.HighsModelStatus.kInfeasible:
        return "infeasible", None
    if status == highspy.HighsModelStatus.kUnknown:  # HiGHS disagreed with itself or failed (run_highs)
        return "unconfirmed", None
    if status == highspy.HighsModelStatus.kModelEmpty:  # no recompute decision at all (nothing is ever reused)
        return "bound", 0.0
    if status == highspy.HighsModelStatus.kOptimal:
        return "bound", (info.mip_dual_bound if integer else info.objective_function_value)
    if integer and math.isfinite(info.mip_dual_bound) and info.mip_dual_bound > -inf:
        return "bound", info.mip_dual_bound  # the time ran out; the dual bound still holds
    return "unknown", None


class _RunRecorder:
    """What a simulator run did, per stage: residency at each stage's allocation, the
    recomputations and evictions of each gap (for :func:`run_point`)."""

    def __init__(self, problem: Problem):
        self.problem = problem
        self.steps = list(problem.stage_step)
        self.stage_at_step = {step: t for t, step in enumerate(problem.stage_step)}
        self.material: dict[int, bytes] = {}
        self.remats: set[tuple[int, int]] = set()
        self.evicted: set[tuple[int, int]] = set()  # (gap, storage)

    def __getattr__(self, name):  # every other recorder callback: nothing to record
        return lambda *args, **kwargs: None

    def gap(self, sim) -> int:
        return min(bisect.bisect_left(self.steps, sim.step), len(self.steps) - 1)

    def on_remat(self, sim, tensor: int) -> None:
        self.remats.add((self.gap(sim), sim.tensor_op[tensor]))

    def on_compute(self, sim, tensor: int) -> None:
        stage = self.stage_at_step.get(sim.step)
        if stage is not None:
            self.material[stage] = bytes(sim.material)

    def on_choose(self, sim, candidates, chosen) -> None:
        gap = self.gap(sim)
        self.evicted.update((gap, s) for s in chosen)

    def on_free(self, sim, s: int) -> None:
        self.evicted.add((self.gap(sim), s))


def run_point(problem: Problem, model: LinearModel, policy: str, budget_bytes: int,
              overhead_limit: float = DEFAULT_OVERHEAD_LIMIT) -> tuple[str, int, list[float]]:
    """Run ``policy`` in the simulator and map the run into ``model``'s variables (the map of
    docs/solvers.md): returns (status, recompute, values). Values are meaningful when it passed."""
    from ..policies import get_policy

    record = _RunRecorder(problem)
    remat_limit = baseline(problem.trace).model_compute * (overhead_limit - 1)
    sim = Simulator(problem.trace, get_policy(policy), budget_bytes, remat_limit, recorder=record)
    status = sim.run()
    if problem.final_stage is not None:
        record.material[problem.final_stage] = bytes(sim.material)
    resident = lambda t, s: record.material.get(t, b"")[s:s + 1] == b"\x01"  # noqa: E731
    stretch: dict[int, list[int]] = {}
    for stages in model.cover.values():
        for t, var in stages.items():
            stretch.setdefault(var, []).append(t)
    values = [0.0] * model.n_vars
    footprints: dict[int, float] = {}
    for var, (kind, t, item) in enumerate(model.names):
        if kind == "R":
            values[var] = float((t, item) in record.remats)
        elif kind == "A":
            values[var] = float(resident(t, item))
        elif kind == "K":
            values[var] = float(all(resident(u, item) for u in stretch[var]))
        elif kind == "H":  # resident when the gap starts (end of stage t-1), never evicted in it, resident at t
            values[var] = float(resident(t - 1, item) and (t, item) not in record.evicted and resident(t, item))
    # P[t]: the largest recomputation footprint beyond held bytes, read off the rows that define it.
    for terms, lo, _ in model.rows:
        p = next((var for var in terms if model.names[var][0] == "P"), None)
        if p is not None and lo == 0:  # a recomputation's footprint row
            need = -sum(c * values[v] for v, c in terms.items() if v != p)
            if need > footprints.get(p, 0.0):
                footprints[p] = need
    for p, value in footprints.items():
        values[p] = value
    return status, sim.remat_compute, values
