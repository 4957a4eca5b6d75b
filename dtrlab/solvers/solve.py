"""``solve_optimal``: the least recompute that fits a budget, as a :class:`SolveResult` record."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..runtime import DEFAULT_OVERHEAD_LIMIT
from ..trace.model import Trace
from .hint import best_run, dtr_hint, interval_hint, keep_everything
from .interval import (DEFAULT_COPIES, DEFAULT_SLOTS, IntervalModelTooLarge, build_interval_model,
                       check_interval_size, solve_interval)
from .model import LinearModel, build_model
from .problem import Problem, Schedule, build_problem

SOLVERS = ("cpsat", "milp", "interval")
DEFAULT_TIME_LIMIT_S = 30.0


class SolverUnavailable(ImportError):
    """The optional solver packages are not installed."""


@dataclass(frozen=True)
class SolveResult:
    """One solve. Compute is in the trace's cost units; ``objective`` and ``best_bound``
    are total compute (the trace's own compute plus recompute)."""

    trace: str
    solver: str
    budget_bytes: int
    overhead_limit: float
    status: str  # "optimal", "feasible", "infeasible" or "unknown"
    objective: int | None
    best_bound: float | None
    base_compute: int
    solve_seconds: float
    time_limit_s: float
    n_vars: int = 0
    n_rows: int = 0
    message: str = ""
    schedule: Schedule | None = field(default=None, repr=False)

    @property
    def remat_compute(self) -> int | None:
        return None if self.objective is None else self.objective - self.base_compute

    @property
    def gap(self) -> float | None:
        """(objective - best bound) / objective; 0 when optimal, None without a solution."""
        if self.objective is None or self.best_bound is None:
            return None
        return max(0.0, (self.objective - self.best_bound) / self.objective) if self.objective else 0.0

    @property
    def overhead(self) -> float | None:
        """The simulator's overhead measure for this schedule: (1 + total compute) / trace compute."""
        return None if self.objective is None else (1 + self.objective) / self.base_compute

    @property
    def has_schedule(self) -> bool:
        return self.schedule is not None

    def to_dict(self) -> dict:
        return {
            "trace": self.trace, "solver": self.solver, "budget_bytes": self.budget_bytes,
            "overhead_limit": self.overhead_limit, "status": self.status, "objective": self.objective,
            "best_bound": self.best_bound, "gap": self.gap, "remat_compute": self.remat_compute,
            "overhead": self.overhead, "base_compute": self.base_compute, "solve_seconds": self.solve_seconds,
            "time_limit_s": self.time_limit_s, "n_vars": self.n_vars, "n_rows": self.n_rows,
            "message": self.message,
        }


def solve_optimal(trace: Trace | Problem, budget_bytes: int, *, overhead_limit: float = DEFAULT_OVERHEAD_LIMIT,
                  time_limit_s: float = DEFAULT_TIME_LIMIT_S, solver: str = "cpsat", workers: int = 2,
                  feasibility_only: bool = False, hint: bool | Sequence[str] = True, copies: int = DEFAULT_COPIES,
                  slots: int = DEFAULT_SLOTS) -> SolveResult:
    """The schedule with the least recompute that keeps ``trace`` within ``budget_bytes``.

    ``solver``: "cpsat" (OR-Tools CP-SAT) or "milp" (HiGHS) solve the stage formulation
    of :mod:`dtrlab.solvers.model`; "interval" solves the Moccasin-style interval
    formulation of :mod:`dtrlab.solvers.interval` with CP-SAT (evictions between
    recomputations, at most ``copies`` computations per operator and ``slots``
    recomputations per gap; those two apply to it only). "optimal" and "infeasible"
    are proofs within the formulation solved, "feasible" is a schedule without an
    optimality proof (see ``gap``), "unknown" means the time limit ran out with neither.
    A budget below :meth:`Problem.lower_bound` is answered "infeasible" without a solve.
    ``feasibility_only`` stops at the first schedule that fits (status "feasible",
    no bound): what a bisection for the minimal budget needs. With ``hint`` the
    solvers start from DTR's run at this budget (:mod:`.hint`), else from keeping
    everything; a hint guides the search only. The interval model also takes a list of
    policy names for ``hint``: it starts from the passing run with the least recompute
    among them, and raises its bounds so that it holds that run.
    """
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; choose one of {', '.join(SOLVERS)}")
    if not overhead_limit >= 1:
        raise ValueError(f"overhead_limit must be >= 1 (2.0 allows as much recompute as compute), got {overhead_limit}")
    if not time_limit_s > 0:
        raise ValueError(f"time_limit_s must be positive, got {time_limit_s}")
    if solver == "interval":  # it needs the unbounded need closure
        trace = trace.trace if isinstance(trace, Problem) and trace.chain is not None else trace
        problem = trace if isinstance(trace, Problem) else build_problem(trace, chain=None)
    else:
        problem = trace if isinstance(trace, Problem) else build_problem(trace)
    started = time.perf_counter()
    common = dict(trace=problem.trace.name, solver=solver, budget_bytes=int(budget_bytes),
                  overhead_limit=overhead_limit, base_compute=problem.base_compute, time_limit_s=time_limit_s)
    bound = problem.lower_bound()
    if budget_bytes < bound:
        return SolveResult(status="infeasible", objective=None, best_bound=None,
                           solve_seconds=time.perf_counter() - started,
                           message=f"budget {budget_bytes} is below the lower bound {bound} bytes (the largest "
                                   "stage footprint: arguments, outputs and pinned bytes); no schedule fits",
                           **common)
    remat_limit = problem.base_compute * (overhead_limit - 1)
    if solver == "interval":
        return _solve_interval(problem, int(budget_bytes), remat_limit, time_limit_s, workers, feasibility_only,
                               copies, slots, hint, started, common)
    model = build_model(problem, int(budget_bytes), remat_limit)
    sizes = dict(n_vars=model.n_vars, n_rows=len(model.rows))
    if model.infeasible:
        return SolveResult(status="infeasible", objective=None, best_bound=None,
                           solve_seconds=time.perf_counter() - started, message=model.infeasible, **common, **sizes)
    if feasibility_only:
        model.cost = [0] * model.n_vars
    start = (dtr_hint(problem, model, int(budget_bytes), remat_limit) if hint else None) or keep_everything(model)
    backend = _solve_cpsat if solver == "cpsat" else _solve_highs
    status, values, objective, best = backend(model, start, time_limit_s, workers)
    if feasibility_only and values is not None:
        claimed = sum(problem.trace.operators[item].cost for (kind, _, item), value in zip(model.names, values)
                      if value and kind == "R")
        status, objective, best = "feasible", claimed, None
    seconds = time.perf_counter() - started
    schedule = _schedule(problem, model, values) if values is not None else None
    if status == "optimal":
        best = objective
    elif best is not None and not math.isfinite(best):
        best = None  # HiGHS reports -inf when it has no bound yet
    return SolveResult(
        status=status,
        objective=None if objective is None else problem.base_compute + int(round(objective)),
        best_bound=None if best is None else problem.base_compute + best,
        solve_seconds=seconds, schedule=schedule,
        message="" if status != "infeasible" else "the solver proved that no schedule of the stage model fits",
        **common, **sizes,
    )


def _solve_interval(problem: Problem, budget_bytes: int, remat_limit: float, time_limit_s: float, workers: int,
                    feasibility_only: bool, copies: int, slots: int, hint, started: float,
                    common: dict) -> SolveResult:
    try:
        import ortools  # noqa: F401
    except ImportError as error:
        raise SolverUnavailable("solver='interval' needs OR-Tools: pip install 'dtrlab[solvers]'") from error
    try:
        check_interval_size(problem)
    except IntervalModelTooLarge as error:
        return SolveResult(status="unknown", objective=None, best_bound=None,
                           solve_seconds=time.perf_counter() - started, message=str(error), **common)
    policies = ("dtr",) if hint is True else tuple(hint or ())
    run = best_run(problem, budget_bytes, remat_limit, policies)
    model = build_interval_model(problem, budget_bytes, remat_limit, copies=copies, slots=slots,
                                 min_copies=run and run.copies, min_slots=run and run.recomputations)
    sizes = dict(n_vars=len(model.cp.Proto().variables), n_rows=len(model.cp.Proto().constraints))
    if model.infeasible:
        return SolveResult(status="infeasible", objective=None, best_bound=None,
                           solve_seconds=time.perf_counter() - started, message=model.infeasible, **common, **sizes)
    hints = interval_hint(model, run) if run else None
    status, schedule, recompute, bound = solve_interval(model, time_limit_s, workers, feasibility_only, hints,
                                                        complete_hint=hints is not None)
    return SolveResult(
        status=status, objective=None if recompute is None else problem.base_compute + recompute,
        best_bound=None if bound is None else problem.base_compute + bound,
        solve_seconds=time.perf_counter() - started, schedule=schedule,
        message="" if status != "infeasible" else (f"the solver proved that no schedule of the interval model fits "
                                                   f"(at most {copies} computations per operator, {slots} "
                                                   "recomputations per gap)"),
        **common, **sizes,
    )


def _schedule(problem: Problem, model: LinearModel, values: list[int]) -> Schedule:
    resident = [[] for _ in range(problem.n_stages)]
    remat = [[] for _ in range(problem.n_stages)]
    for s, stages in model.cover.items():
        for t, var in stages.items():
            if values[var]:
                resident[t].append(s)
    for (kind, t, item), value in zip(model.names, values):
        if value and kind == "R":
            remat[t].append(item)
    return Schedule(resident=tuple(tuple(sorted(r)) for r in resident),
                    remat=tuple(tuple(sorted(r)) for r in remat))


def _solve_cpsat(model: LinearModel, start: list[int], time_limit_s: float, workers: int):
    try:
        from ortools.sat.python import cp_model
    except ImportError as error:
        raise SolverUnavailable("solver='cpsat' needs OR-Tools: pip install 'dtrlab[solvers]'") from error
    cp = cp_model.CpModel()
    x = [cp.NewBoolVar("") for _ in range(model.n_vars)]
    for var, (lo, hi) in enumerate(zip(model.lower, model.upper)):
        if lo == hi:
            cp.Add(x[var] == lo)
    for terms, lo, hi in model.rows:
        expr = cp_model.LinearExpr.WeightedSum([x[var] for var in terms], list(terms.values()))
        if math.isfinite(hi):
            cp.Add(expr <= int(math.floor(hi)))
        if math.isfinite(lo) and lo > -sum(abs(c) for c in terms.values()):
            cp.Add(expr >= int(math.ceil(lo)))
    for var, value in enumerate(start):
        cp.AddHint(x[var], value)
    costly = [var for var, c in enumerate(model.cost) if c]
    cp.Minimize(cp_model.LinearExpr.WeightedSum([x[var] for var in costly], [model.cost[var] for var in costly]))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit_s)
    solver.parameters.num_workers = max(1, int(workers))
    code = solver.Solve(cp)
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        values = [int(solver.Value(v)) for v in x]
        return ("optimal" if code == cp_model.OPTIMAL else "feasible", values, solver.ObjectiveValue(),
                solver.BestObjectiveBound())
    if code == cp_model.INFEASIBLE:
        return "infeasible", None, None, None
    return "unknown", None, None, None


def load_highs(model: LinearModel, time_limit_s: float, integer_columns, needed_for: str):
    """``(highspy, Highs)`` holding ``model`` (bounds, costs, rows), quiet and time-limited;
    ``integer_columns`` lists the variables HiGHS must keep integral."""
    try:
        import highspy
        import numpy as np
    except ImportError as error:
        raise SolverUnavailable(f"{needed_for} needs HiGHS: pip install 'dtrlab[solvers]'") from error
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit_s))
    n = model.n_vars
    inf = highspy.kHighsInf
    upper_bounds = np.array([inf if math.isinf(u) else u for u in model.upper], dtype=float)
    h.addVars(n, np.array(model.lower, dtype=float), upper_bounds)
    integer_columns = np.array(integer_columns, dtype=np.int32)
    if len(integer_columns):
        h.changeColsIntegrality(len(integer_columns), integer_columns,
                                np.full(len(integer_columns), highspy.HighsVarType.kInteger))
    h.changeColsCost(n, np.arange(n, dtype=np.int32), np.array(model.cost, dtype=float))
    starts, indices, coefs, lower, upper = [], [], [], [], []
    for terms, lo, hi in model.rows:
        starts.append(len(indices))
        indices.extend(terms)
        coefs.extend(terms.values())
        lower.append(lo if math.isfinite(lo) else -inf)
        upper.append(hi if math.isfinite(hi) else inf)
    h.addRows(len(model.rows), np.array(lower, dtype=float), np.array(upper, dtype=float), len(indices),
              np.array(starts, dtype=np.int32), np.array(indices, dtype=np.int32), np.array(coefs, dtype=float))
    return highspy, h


def _solve_highs(model: LinearModel, start: list[int], time_limit_s: float, workers: int):
    highspy, h = load_highs(model, time_limit_s, range(model.n_vars), "solver='milp'")
    h.setOptionValue("mip_rel_gap", 0.0)
    h.setOptionValue("threads", max(1, int(workers)))
    hint = highspy.HighsSolution()
    hint.col_value = [float(v) for v in start]
    hint.value_valid = True
    h.setSolution(hint)  # used only if it fits the budget
    h.run()
    status = h.getModelStatus()
    info = h.getInfo()
    if status == highspy.HighsModelStatus.kInfeasible:
        return "infeasible", None, None, None
    if info.primal_solution_status == 2:  # a feasible integer solution exists
        values = [int(round(v)) for v in h.getSolution().col_value]
        optimal = status == highspy.HighsModelStatus.kOptimal
        return "optimal" if optimal else "feasible", values, info.objective_function_value, info.mip_dual_bound
    return "unknown", None, None, None
