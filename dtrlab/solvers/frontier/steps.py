"""One frontier, step by step: the policy runs, the stage model, the interval model and the
relaxation (:func:`compute_frontier`); :func:`load_frontiers` reads files or computes them."""

from __future__ import annotations

import os
import warnings

import pandas as pd

from ...runtime import REFERENCE, Semantics, baseline, simulate
from ...sweep.execution import QUIET, Execution
from ...trace.model import Trace
from ..problem import build_problem
from ..relax import RelaxationTooLarge, check_size, relaxation_problem, solve_relaxation
from ..replay import replay
from ..solve import solve_optimal
from .plan import STAGE_SOLVERS, FrontierPlan
from .result import (COLUMNS, Frontier, SolverFaultWarning, _blank, _key, _records, _verdict, assemble, audit_rows,
                     real_runs)
from .store import SolveJournal, StaleFrontier, frontier_path, read_frontier


class _Solving:
    """The state of one frontier computation: the trace, the plan, the rows so far, and the
    earlier solves to take instead of repeating them."""

    def __init__(self, trace: Trace, plan: FrontierPlan, *, cache, reuse, progress, journal):
        self.trace, self.plan, self.cache = trace, plan, cache
        self.problem = build_problem(trace, chain=plan.chain)
        self.unbounded = relaxation_problem(trace)  # the interval model's and the relaxation's need closure
        self.peak = baseline(trace).peak_memory
        self.lower = self.problem.lower_bound()
        self.step = max(1, int(plan.resolution * self.peak))
        self.rows: list[dict] = []
        self.earlier = {_key(r): r for r in (reuse or ())}
        self.progress, self.journal = progress, journal
        self.relax_status = "solved"

    def record(self, row: dict) -> dict:
        """Add a row, audited against the runs so far (a contradicted proof never steers a search)."""
        self.rows.append(row)
        audit_rows(self.rows, self.problem.base_compute)
        if self.journal is not None and row["kind"] != "policy":
            self.journal.add(row)
        if self.progress is not None:
            self.progress(row)
        return row

    def solve(self, budget: int, kind: str, ratio, solver: str) -> str:
        """One stage- or interval-model solve (or the earlier one); its verdict."""
        earlier = self.earlier.get((kind, solver, int(budget)))
        if earlier is not None:
            return _verdict(self.record(dict(earlier)))
        plan = self.plan
        interval = solver == "interval"
        result = solve_optimal(self.unbounded if interval else self.problem, budget, solver=solver,
                               overhead_limit=plan.overhead_limit, feasibility_only=kind == "bisect",
                               time_limit_s=plan.interval_limit_s if interval else plan.time_limit_s,
                               hint=(plan.policies or ("dtr",)) if interval else ("dtr",))
        row = _blank(self.trace, kind, budget, ratio)
        row.update({k: v for k, v in result.to_dict().items() if k in COLUMNS and k not in ("trace", "budget_bytes")})
        if result.schedule is not None:
            check = replay(self.unbounded if interval else self.problem, result)
            row.update(replay_passed=check.passed, replay_remat_compute=check.remat_compute,
                       replay_peak=check.peak_memory, disagreement="" if check.passed else check.summary())
        self._add_dtr(row)
        return _verdict(self.record(row))

    def relax(self, budget: int, ratio, method: str | None = None) -> str:
        """One relaxation solve (or the earlier one); its verdict ("infeasible" only if no known run contradicts it)."""
        method = method or self.plan.relax_method
        earlier = self.earlier.get(("relax", method, int(budget)))
        if earlier is not None:
            row = self.record(dict(earlier))
        else:
            result = solve_relaxation(self.unbounded, budget, overhead_limit=self.plan.overhead_limit, method=method,
                                      time_limit_s=self.plan.relax_limit_s)
            row = _blank(self.trace, "relax", budget, ratio)
            row.update(solver=method, status=result.status, best_bound=result.bound,
                       overhead_bound=result.overhead_bound, solve_seconds=result.solve_seconds,
                       build_seconds=result.build_seconds, n_vars=result.n_vars, n_rows=result.n_rows,
                       n_nonzeros=result.n_nonzeros, message=result.message)
            self._add_dtr(row)
            row = self.record(row)
        return "unknown" if row["fault"] else row["status"]

    def _add_dtr(self, row: dict) -> None:
        if self.plan.dtr:
            run = simulate(self.trace, "dtr", budget_bytes=row["budget_bytes"],
                           semantics=Semantics(overhead_limit=self.plan.overhead_limit))
            row.update(dtr_status=run.status, dtr_clock=run.clock, dtr_overhead=run.overhead)

    def best_real(self) -> int | None:
        """The smallest budget with a real run so far."""
        return min((run.budget for run in real_runs(self.rows, self.problem.base_compute)), default=None)


def compute_frontier(trace: Trace, plan: FrontierPlan | None = None, *, cache=True, reuse=None, progress=None,
                     journal: SolveJournal | None = None) -> Frontier:
    """The bracket of ``trace``'s minimal budget, and bounds on compute at sampled budgets,
    as ``plan`` says (:class:`FrontierPlan`; default: its defaults).

    ``cache``: the sweep cache of the policy runs (``True``: the default directory).
    ``reuse``: rows of an earlier frontier of the same trace computed with the same
    overhead and time limits (a DataFrame or dicts: :func:`read_frontier`, a
    :class:`SolveJournal`); a solve of the same kind, solver and budget is taken from it,
    not repeated. ``journal`` gets each finished solve as it finishes. ``progress(row)``
    is called after each row. A relaxation over :data:`~.relax.MAX_NEED_PAIRS` is skipped
    (said in ``relax_status``).
    """
    plan = plan or FrontierPlan()
    if reuse is not None:  # rows as plain values (a frame's NaN as None), whatever they came as
        reuse = _records(reuse if isinstance(reuse, pd.DataFrame) else pd.DataFrame(list(reuse), columns=COLUMNS))
    run = _Solving(trace, plan, cache=cache, reuse=reuse, progress=progress, journal=journal)
    run_policies(run)
    samples = sampled_budgets(run)
    probe_stage_model(run, samples)
    probe_interval_model(run, samples)
    prove_lower_side(run, samples)
    frontier = assemble(trace.name, trace.content_hash, plan, relax_status=run.relax_status, peak_bytes=run.peak,
                        base_compute=run.problem.base_compute, lower_bound_bytes=run.lower, resolution_bytes=run.step,
                        rows=run.rows)
    for fault in frontier.faults:
        warnings.warn(f"{trace.name}: solver fault, not used: {fault}", SolverFaultWarning, stacklevel=2)
    return frontier


def run_policies(run: _Solving) -> None:
    """Upper side, step 1: each policy's lowest passing budget on the plan's grid."""
    if run.plan.policies:
        for row in policy_rows(run.trace, run.plan.policies, run.plan.policy_grid(),
                               semantics=Semantics(overhead_limit=run.plan.overhead_limit),
                               execution=QUIET.with_(cache=run.cache)):
            run.record(row)


def sampled_budgets(run: _Solving) -> list[tuple[int, float]]:
    """The sampled budgets, (bytes, ratio) in increasing order: the plan's ratios and
    budgets, and DTR's holes on the policy grid with ``holes``."""
    plan, peak = run.plan, run.peak
    budgets = list(plan.budgets)
    if plan.holes:
        budgets += hole_budgets(run.trace, plan.policy_grid(), semantics=Semantics(overhead_limit=plan.overhead_limit),
                                execution=QUIET.with_(cache=run.cache))
    return sorted({(int(peak * r), r) for r in plan.ratios} | {(int(b), int(b) / peak) for b in budgets})


def probe_stage_model(run: _Solving, samples) -> None:
    """Upper side, step 2: the stage model optimized at the samples, then at most
    ``stage_probes`` feasibility probes bisecting below the best real run (the probe
    solver, then the other one where it ends "unknown")."""
    plan = run.plan
    verdicts: dict[int, str] = {}

    def probe(budget: int, ratio) -> str:
        verdict = "unknown"
        for name in (plan.probe_solver, *(s for s in STAGE_SOLVERS if s != plan.probe_solver)):
            verdict = run.solve(budget, "bisect", ratio, name)
            if verdict != "unknown":
                break
        return verdict

    for budget, ratio in samples:
        verdicts[budget] = run.solve(budget, "sample", ratio, plan.solver)
    if not plan.bisect:
        return
    hi = run.best_real()
    if hi is None:
        budget = int(run.peak * 1.5)
        verdicts[budget] = probe(budget, 1.5)
        hi = budget if verdicts[budget] == "feasible" else None
    lo = max([b for b, v in verdicts.items() if v == "infeasible" and (hi is None or b < hi)] + [run.lower - 1])
    for _ in range(plan.stage_probes):
        if hi is None or hi - lo <= run.step:
            break
        mid = (lo + hi) // 2
        verdicts[mid] = probe(mid, mid / run.peak)
        if verdicts[mid] == "feasible":
            hi = mid
        else:
            lo = mid  # infeasible within the stage model, or unknown: look no lower with it


def probe_interval_model(run: _Solving, samples) -> None:
    """Upper side, step 3 (after the stage model, whose probes stay where they were
    without it): the interval model at the samples with ``interval_samples``, then at most
    ``interval_probes`` probes bisecting below the best real run. Its "infeasible"
    bounds only its own search; a trace too large for it stops it (the row says so)."""
    plan = run.plan
    if plan.interval_samples:
        for budget, ratio in samples:
            run.solve(budget, "sample", ratio, "interval")
            if _not_built(run.rows[-1]):
                return
    if not plan.bisect:
        return
    hi, lo = run.best_real(), run.lower - 1
    for _ in range(plan.interval_probes):
        if hi is None or hi - lo <= run.step:
            break
        mid = (lo + hi) // 2
        verdict = run.solve(mid, "bisect", mid / run.peak, "interval")
        if _not_built(run.rows[-1]):
            return
        if verdict == "feasible":
            hi = mid
        else:
            lo = mid


def _not_built(row: dict) -> bool:
    """The interval model was not built (the trace is too large; the row's message says so)."""
    return row["status"] == "unknown" and not row["n_vars"]


def prove_lower_side(run: _Solving, samples) -> None:
    """Lower side: the relaxation's bound at each sample below the peak, then its largest
    infeasible budget below the best real run, galloping up from the footprint bound (one
    step, two, four, ...) and bisecting the last doubling; then the 0/1 relaxation's probes
    (stronger where the LP's bound is near the limit) between that proof and the best run.
    Feasibility of the relaxation is monotone in the budget, which the search relies on."""
    plan, peak = run.plan, run.peak
    try:
        check_size(run.unbounded)
    except RelaxationTooLarge as error:
        run.relax_status = f"not solved: {error}"
        return
    verdicts: dict[int, str] = {}
    for budget, ratio in samples:
        if budget < peak:  # at the peak nothing needs recomputing: the bound is the trace's compute
            verdicts[budget] = run.relax(budget, ratio)
    best = run.best_real()
    if not plan.bisect or best is None:
        return
    lo = max([b for b, v in verdicts.items() if v == "infeasible" and b < best] + [run.lower - 1])
    hi = min([b for b, v in verdicts.items() if v != "infeasible" and b > lo] + [best])
    stride = run.step
    while lo + stride < hi:
        probe = lo + stride
        verdicts[probe] = run.relax(probe, probe / peak)
        if verdicts[probe] != "infeasible":
            hi = probe
            break
        lo, stride = probe, 2 * stride
    while hi - lo > run.step:
        mid = (lo + hi) // 2
        verdicts[mid] = run.relax(mid, mid / peak)
        if verdicts[mid] == "infeasible":
            lo = mid
        else:
            hi = mid  # a bound, or unknown: either way nothing is proven above mid
    lo, hi = max([b for b, v in verdicts.items() if v == "infeasible"] + [run.lower - 1]), best
    for _ in range(plan.mip_probes if plan.relax_method == "lp" else 0):
        if hi - lo <= run.step:
            break
        mid = (lo + hi) // 2
        verdicts[mid] = run.relax(mid, mid / peak, method="mip")
        if verdicts[mid] == "infeasible":
            lo = mid
        else:
            hi = mid


def policy_rows(trace: Trace, policies, ratios, *, semantics: Semantics = REFERENCE,
                execution: Execution = QUIET) -> list[dict]:
    """Each policy's lowest passing budget on the ``ratios`` grid (a real run: the upper side)."""
    from ...sweep import sweep

    rows = []
    for policy in policies:
        frame = sweep(trace, policy, ratios=ratios, semantics=semantics, execution=execution)
        passed = frame[frame.status == "pass"].sort_values("budget_bytes")
        if passed.empty:
            continue
        best = passed.iloc[0]
        row = _blank(trace, "policy", int(best.budget_bytes), float(best.ratio))
        row.update(solver=policy, status="pass", overhead=float(best.overhead),
                   remat_compute=int(best.remat_compute), solve_seconds=0.0,
                   replay_passed=True, message=f"{policy}'s lowest passing budget on the sweep grid")
        rows.append(row)
    return rows


def hole_budgets(trace: Trace, ratios, *, semantics: Semantics = REFERENCE, execution: Execution = QUIET) -> list[int]:
    """The failing budgets of DTR's holes when sweeping ``ratios``: the lowest failing
    sample of each hole (the census of :func:`dtrlab.analysis.holes.find_holes`)."""
    from ...analysis.holes import find_holes
    from ...sweep import sweep

    frame = sweep(trace, "dtr", ratios=list(ratios), semantics=semantics, execution=execution)
    return [int(b) for b in find_holes(frame).holes.fail_low_bytes]


def load_frontiers(traces: dict[str, Trace], directory: str | os.PathLike | None, *, compute_missing: bool,
                   plan: FrontierPlan | None = None, cache=True) -> tuple[dict[str, Frontier], dict[str, str]]:
    """Each trace's frontier from ``directory`` when a valid file is there, else computed
    with ``plan`` (:func:`compute_frontier`) if ``compute_missing``, else left out.
    Also returns, per trace, where it came from: "shipped", "computed" or why it is missing."""
    frontiers, origin = {}, {}
    for name, trace in traces.items():
        reason = "no frontier directory"
        if directory is not None:
            path = frontier_path(directory, name)
            try:
                frontiers[name], origin[name] = read_frontier(path, trace), "shipped"
                continue
            except FileNotFoundError:
                reason = f"no {path}"
            except StaleFrontier as stale:
                reason = str(stale)
        if compute_missing:
            frontiers[name], origin[name] = compute_frontier(trace, plan, cache=cache), "computed"
        else:
            origin[name] = f"left out ({reason}; dtrlab frontier LOG --out DIR computes it)"
    return frontiers, origin


# ------------------------------------------------------------------------------ the solve journal
