"""``solve_optimal``: the least recompute that fits a budget, as a :class:`SolveResult` record."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import replace

from ..runtime import DEFAULT_OVERHEAD_LIMIT, remat_allowance
from ..trace.model import Trace
from .hint import best_run, dtr_hint, interval_hint, keep_everything
from .interval import (DEFAULT_COPIES, DEFAULT_SLOTS, IntervalModelTooLarge, build_interval_model,
                       check_interval_size, solve_interval)
from .model import LinearModel, build_model, violations
from .problem import Problem, Schedule, SolveResult, build_problem
from .replay import replay

SOLVERS = ("cpsat", "milp", "interval")
DEFAULT_TIME_LIMIT_S = 30.0


class SolverUnavailable(ImportError):
    """The optional solver packages are not installed."""


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

    Every answer with a schedule is checked before it is returned (:func:`checked`): the
    schedule replays in the simulator, its recompute is the reported objective and the
    bound is not above it. A solve that fails a check is returned as "unknown" with the
    solver fault in ``message``, never as "optimal" or "feasible". ``time_limit_s`` may be
    ``math.inf`` (the tests' tiny models: a verdict that does not depend on machine speed).
    If the time runs out before the solver reports a schedule, the start (DTR's run) or else
    keeping everything is returned as "feasible" when it is a point of the model.
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
    remat_limit = problem.base_compute * (overhead_limit - 1)  # the simulator's, for the policy runs of the hints
    allowance = remat_allowance(remat_limit)  # the models': the same thrash check, in integers
    if solver == "interval":
        return checked(problem, _solve_interval(problem, int(budget_bytes), remat_limit, workers, feasibility_only,
                                                copies, slots, hint, started, common))
    model = build_model(problem, int(budget_bytes), allowance)
    sizes = dict(n_vars=model.n_vars, n_rows=len(model.rows))
    if model.infeasible:
        return SolveResult(status="infeasible", objective=None, best_bound=None,
                           solve_seconds=time.perf_counter() - started, message=model.infeasible, **common, **sizes)
    if feasibility_only:
        model.cost = [0] * model.n_vars
    start = (dtr_hint(problem, model, int(budget_bytes), remat_limit) if hint else None) or keep_everything(model)
    backend = _solve_cpsat if solver == "cpsat" else _solve_highs
    status, values, objective, best = backend(model, start, time_limit_s, workers)
    fault = _point_fault(problem, model, values, objective, best, feasibility_only)
    note = ""
    if fault and solver == "milp":
        # HiGHS 1.16 given a start, with presolve, once returned the start as "optimal" with
        # objective and bound 0 (its recompute was 4, the model's optimum 2); without the
        # start it answers right. So HiGHS must agree with itself: solve again without it.
        note = f"HiGHS's answer from the start was inconsistent ({fault}); solved again without the start"
        status, values, objective, best = backend(model, None, time_limit_s, workers)
        fault = _point_fault(problem, model, values, objective, best, feasibility_only)
    if values is None and status == "unknown":
        # Out of time before the solver reported a schedule: a start that is a point of the
        # model (the replay checks it like any other) is the incumbent.
        point = next((p for p in (start, keep_everything(model)) if not violations(model, p)), None)
        if point is not None:
            status, values, best = "feasible", point, None
            objective = sum(c * v for c, v in zip(_recompute_costs(problem, model), point))
    if values is not None:
        objective = sum(c * v for c, v in zip(_recompute_costs(problem, model), values))
    if feasibility_only and values is not None:
        status, best = "feasible", None
    seconds = time.perf_counter() - started
    if fault:
        return SolveResult(status="unknown", objective=None, best_bound=None, solve_seconds=seconds,
                           message=f"solver fault: {fault}" + (f" ({note})" if note else ""), **common, **sizes)
    schedule = _schedule(problem, model, values) if values is not None else None
    if status == "optimal":
        best = objective
    elif best is not None and not math.isfinite(best):
        best = None  # HiGHS reports -inf when it has no bound yet
    return checked(problem, SolveResult(
        status=status,
        objective=None if objective is None else problem.base_compute + objective,
        best_bound=None if best is None else problem.base_compute + best,
        solve_seconds=seconds, schedule=schedule,
        message="the solver proved that no schedule of the stage model fits" if status == "infeasible" else note,
        **common, **sizes,
    ))


def _point_fault(problem: Problem, model: LinearModel, values, objective, best, feasibility_only: bool) -> str:
    """Why the solver's point contradicts what the solver said about it ("" if nothing): the
    recompute we report is the point's own, and the point must satisfy the model it came
    from (HiGHS once reported objective 0 and bound 0 with a point that recomputes 4)."""
    if values is None:
        return ""
    claimed = sum(c * v for c, v in zip(_recompute_costs(problem, model), values))
    broken = violations(model, values)
    if broken:
        return f"the solver's point breaks {len(broken)} rows of its own model ({broken[0]})"
    if not feasibility_only and abs(objective - claimed) > 1e-6 * max(1, claimed):
        return f"the solver reported recompute {objective:g} for a schedule that recomputes {claimed}"
    if not feasibility_only and best is not None and best > claimed + 1e-6 * max(1, claimed):
        return f"the solver's bound {best:g} is above its own schedule's recompute {claimed}"
    return ""


def _recompute_costs(problem: Problem, model: LinearModel) -> list[int]:
    """Each variable's recompute cost (the operator's cost for an ``R`` variable, else 0)."""
    ops = problem.trace.operators
    return [ops[item].cost if kind == "R" else 0 for kind, _, item in model.names]


def checked(problem: Problem, result: SolveResult) -> SolveResult:
    """``result`` if what it claims holds, else the same solve as "unknown" with the fault.

    A schedule must replay in the simulator (:func:`.replay.replay`) with exactly the
    reported recompute, and the bound must not be above the objective ("optimal": equal
    to it). Only the solver's own claims are checked here: an "optimal" of a restricted
    model is optimal within that model.
    """
    if result.schedule is None:
        if result.status in ("optimal", "feasible"):
            return replace(result, status="unknown", objective=None, best_bound=None,
                           message=f"solver fault: status {result.status!r} without a schedule")
        return result
    faults = []
    claimed = sum(problem.trace.operators[op].cost for gap in result.schedule.remat for op in gap)
    if claimed != result.remat_compute:
        faults.append(f"objective recompute {result.remat_compute} but the schedule recomputes {claimed}")
    check = replay(problem, result)
    if not check.passed:
        faults.append(f"the replay disagrees ({check.summary()})")
    if result.best_bound is not None and result.best_bound > result.objective + 1e-6 * max(1, result.objective):
        faults.append(f"bound {result.best_bound:g} above the objective {result.objective}")
    if result.status == "optimal" and result.best_bound != result.objective:
        faults.append(f"'optimal' with bound {result.best_bound} != objective {result.objective}")
    if not faults:
        return result
    return replace(result, status="unknown", objective=None, best_bound=None, schedule=None,
                   message="solver fault: " + "; ".join(faults))


def _solve_interval(problem: Problem, budget_bytes: int, remat_limit: float, workers: int, feasibility_only: bool,
                    copies: int, slots: int, hint, started: float, common: dict) -> SolveResult:
    """:func:`solve_optimal` with ``solver="interval"`` (``common``: the result's fields, with the time limit)."""
    allowance, time_limit_s = remat_allowance(remat_limit), common["time_limit_s"]
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
    model = build_interval_model(problem, budget_bytes, allowance, copies=copies, slots=slots,
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


_highs_threads: int | None = None  # the thread count HiGHS's global scheduler was started with


def load_highs(model: LinearModel, time_limit_s: float, integer_columns, needed_for: str, workers: int = 2):
    """``(highspy, Highs)`` holding ``model`` (bounds, costs, rows), quiet and time-limited,
    with ``workers`` threads; ``integer_columns`` lists the variables HiGHS must keep integral."""
    global _highs_threads
    try:
        import highspy
        import numpy as np
    except ImportError as error:
        raise SolverUnavailable(f"{needed_for} needs HiGHS: pip install 'dtrlab[solvers]'") from error
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit_s))
    # HiGHS starts one thread scheduler per process, at its first run; a run asking for
    # another thread count fails (it answered "unknown" to every later solve with other
    # workers), so the scheduler is restarted when the count changes.
    threads = max(1, int(workers))
    if _highs_threads is not None and threads != _highs_threads:
        highspy.Highs.resetGlobalScheduler(True)
    _highs_threads = threads
    h.setOptionValue("threads", threads)
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


def run_highs(highspy, h):
    """Run ``h`` and return its model status, believing HiGHS only where it agrees with itself.
    An "infeasible" found with presolve, or a solve error, is solved again without presolve:
    HiGHS 1.16's presolve has proved infeasible relaxations that hold a real run (issue 22, and
    a 0/1 relaxation the slow oracle test found at 12 bytes where DTR runs with no recompute),
    and failed with a solve error on other tiny models, where without presolve it answered.
    When the second solve fails too, the status is ``kUnknown``: nothing is proven. The second
    solve costs time only where the first ends infeasible or in error."""
    ran = h.run()
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kInfeasible or ran == highspy.HighsStatus.kError:
        h.setOptionValue("presolve", "off")
        h.clearSolver()
        ran = h.run()
        status = h.getModelStatus()
        if ran == highspy.HighsStatus.kError or status == highspy.HighsModelStatus.kSolveError:
            status = highspy.HighsModelStatus.kUnknown
    return status


def _solve_highs(model: LinearModel, start: list[int], time_limit_s: float, workers: int):
    highspy, h = load_highs(model, time_limit_s, range(model.n_vars), "solver='milp'", workers)
    h.setOptionValue("mip_rel_gap", 0.0)
    if start is not None:
        hint = highspy.HighsSolution()
        hint.col_value = [float(v) for v in start]
        hint.value_valid = True
        h.setSolution(hint)  # used only if it fits the budget
    status = run_highs(highspy, h)
    info = h.getInfo()
    if status == highspy.HighsModelStatus.kInfeasible:
        return "infeasible", None, None, None
    if status == highspy.HighsModelStatus.kUnknown:  # HiGHS disagreed with itself: nothing is proven
        return "unknown", None, None, None
    if info.primal_solution_status == 2:  # a feasible integer solution exists
        values = [int(round(v)) for v in h.getSolution().col_value]
        optimal = status == highspy.HighsModelStatus.kOptimal
        return "optimal" if optimal else "feasible", values, info.objective_function_value, info.mip_dual_bound
    return "unknown", None, None, None
