"""A frontier's rows and what they support: the audit of every claim against every real run,
and the bracket (:class:`Frontier`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import pandas as pd

from ...trace.model import Trace
from ..relax import RelaxResult, refuting_run
from .plan import STAGE_SOLVERS, FrontierPlan

MODEL_OF = {"cpsat": "stage model", "milp": "stage model", "interval": "interval model"}

#: Bump when the formulation, the replay or the file layout changes what a file means.
FRONTIER_VERSION = 3

#: ``kind``: "sample" (optimized at a sampled budget), "bisect" (a feasibility probe below the
#: best real run), both by the stage model (``solver`` cpsat or milp) or the interval model
#: (``solver`` "interval"),
#: "relax" (the relaxation: ``status`` infeasible/bound/unknown, ``best_bound`` its bound on
#: total compute, ``overhead_bound`` the same as overhead) or "policy" (a policy's lowest
#: passing budget on the sweep grid: ``solver`` names the policy, ``overhead`` its overhead).
#: ``fault``: why a row's claim is not believed (a known run contradicts it), else "".
COLUMNS = ["trace", "kind", "solver", "ratio", "budget_bytes", "status", "objective", "best_bound", "gap", "remat_compute",
           "overhead", "overhead_bound", "solve_seconds", "build_seconds", "replay_passed", "replay_remat_compute",
           "replay_peak", "disagreement", "dtr_status", "dtr_clock", "dtr_overhead", "n_vars", "n_rows", "n_nonzeros",
           "message", "fault"]


class SolverFaultWarning(UserWarning):
    """A solver claimed what a real run contradicts; the frontier reports it and does not use the claim."""


@dataclass(frozen=True)
class Frontier:
    """The frontier bracket of one trace. ``rows`` has :data:`COLUMNS`.

    ``min_feasible_bytes``: the smallest budget with a real run (``min_feasible_source``:
    a policy name, "stage model" or "interval model"); ``max_infeasible_bytes``: the largest
    budget proven infeasible for every on-demand run (the relaxation, or the footprint lower
    bound); ``unresolved_bytes``: relaxation probes between them that ran out of time. The
    stage model's own (restricted) results are ``stage_min_feasible_bytes`` and
    ``stage_max_infeasible_bytes`` (infeasible *within that model* only). ``faults``: the
    claims a real run contradicts (also in the rows' ``fault`` column), which the bracket
    ignores. ``relax_status``: "solved", or why the relaxation was not solved.
    """

    trace: str
    trace_hash: str
    plan: FrontierPlan
    relax_status: str
    peak_bytes: int
    base_compute: int
    lower_bound_bytes: int
    resolution_bytes: int
    min_feasible_bytes: int | None
    min_feasible_source: str | None
    max_infeasible_bytes: int
    unresolved_bytes: tuple[int, ...]
    stage_min_feasible_bytes: int | None
    stage_max_infeasible_bytes: int | None
    faults: tuple[str, ...]
    rows: pd.DataFrame = field(repr=False)

    # The plan's settings that describe the file (read by reports and --resume).
    solver = property(lambda self: self.plan.solver)
    probe_solver = property(lambda self: self.plan.probe_solver)
    relax_method = property(lambda self: self.plan.relax_method)
    overhead_limit = property(lambda self: self.plan.overhead_limit)
    time_limit_s = property(lambda self: self.plan.time_limit_s)
    chain = property(lambda self: self.plan.chain)
    mip_probes = property(lambda self: self.plan.mip_probes)

    @property
    def gap_bytes(self) -> int | None:
        """Width of the bracket: how far the true minimal budget may lie above the proof."""
        return None if self.min_feasible_bytes is None else self.min_feasible_bytes - self.max_infeasible_bytes

    @property
    def proven(self) -> bool:
        """The minimal budget of any on-demand run is known to ``resolution``."""
        return self.gap_bytes is not None and self.gap_bytes <= self.resolution_bytes

    @property
    def min_feasible_ratio(self) -> float | None:
        return None if self.min_feasible_bytes is None else self.min_feasible_bytes / self.peak_bytes

    @property
    def max_infeasible_ratio(self) -> float:
        return self.max_infeasible_bytes / self.peak_bytes

    def real_runs(self) -> list[RealRun]:
        """Every real run in the rows (:func:`real_runs`)."""
        return real_runs(_records(self.rows), self.base_compute)

    def metadata(self) -> dict:
        return {
            "version": FRONTIER_VERSION, "trace": self.trace, "trace_hash": self.trace_hash,
            "plan": self.plan.to_dict(), "relax_status": self.relax_status, "peak_bytes": self.peak_bytes,
            "base_compute": self.base_compute, "lower_bound_bytes": self.lower_bound_bytes,
            "resolution_bytes": self.resolution_bytes,
            "min_feasible_bytes": self.min_feasible_bytes, "min_feasible_source": self.min_feasible_source,
            "max_infeasible_bytes": self.max_infeasible_bytes, "unresolved_bytes": list(self.unresolved_bytes),
            "stage_min_feasible_bytes": self.stage_min_feasible_bytes,
            "stage_max_infeasible_bytes": self.stage_max_infeasible_bytes, "faults": list(self.faults),
            # what files before the plan recorded, kept for readers of the metadata
            "solver": self.solver, "probe_solver": self.probe_solver, "relax_method": self.relax_method,
            "overhead_limit": self.overhead_limit, "time_limit_s": self.time_limit_s, "chain": self.chain,
            "mip_probes": self.mip_probes,
        }

    def summary(self) -> dict:
        peak = self.peak_bytes
        relax = self.rows[self.rows.kind == "relax"]
        return {
            "trace": self.trace, "lower_bound_ratio": self.lower_bound_bytes / peak,
            "max_infeasible_ratio": self.max_infeasible_ratio, "min_feasible_ratio": self.min_feasible_ratio,
            "min_feasible_source": self.min_feasible_source,
            "gap_ratio": None if self.gap_bytes is None else self.gap_bytes / peak, "proven": self.proven,
            "stage_min_feasible_ratio": None if self.stage_min_feasible_bytes is None
            else self.stage_min_feasible_bytes / peak,
            "relax": self.relax_status, "relax_vars": int(relax.n_vars.max()) if len(relax) else None,
            "relax_seconds": float(relax.solve_seconds.sum() + relax.build_seconds.sum()),
            "solves": len(self.rows[self.rows.kind != "policy"]), "solve_seconds": float(self.rows.solve_seconds.sum()),
            "replay_failures": int((self.rows.replay_passed == False).sum()),  # noqa: E712
            "solver_faults": len(self.faults),
        }


# ------------------------------------------------------------------------------------------ rows
def _blank(trace: Trace, kind: str, budget: int, ratio) -> dict:
    row = dict.fromkeys(COLUMNS)
    row.update(trace=trace.name, kind=kind, budget_bytes=int(budget), ratio=ratio, disagreement="", message="",
               fault="")
    return row


def _records(frame: pd.DataFrame) -> list[dict]:
    """Rows as plain dicts (missing values None), in :data:`COLUMNS` order."""
    frame = frame.reindex(columns=COLUMNS)
    records = [{c: _plain(v) for c, v in zip(COLUMNS, values)} for values in frame.itertuples(index=False)]
    for record in records:
        record["budget_bytes"] = int(record["budget_bytes"])
    return records


def _plain(value):
    """A cell as a JSON value: None for missing, bool, float for every number, str."""
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return None
    if isinstance(value, str):
        return value
    if hasattr(value, "item"):
        value = value.item()
    return value if isinstance(value, bool) else float(value) if isinstance(value, (int, float)) else str(value)


def _key(row: dict) -> tuple[str, str, int]:
    """What identifies a solve: its kind, solver (or relaxation method) and budget."""
    return row["kind"], row["solver"], int(row["budget_bytes"])


def _verdict(row: dict) -> str:
    """"feasible" (replayed), "infeasible" (proven, within the row's model) or "unknown"."""
    if row["status"] == "infeasible" and not row["fault"]:
        return "infeasible"
    if row["replay_passed"] is True:
        return "feasible"
    return "unknown"


class RealRun(NamedTuple):
    """A run that passed in the simulator: its budget, overhead, recompute and who made it."""

    budget: int
    overhead: float
    recompute: int
    source: str


def real_runs(rows: list[dict], base_compute: int) -> list[RealRun]:
    """Every real run the rows hold: each policy's lowest passing budget, each replayed solver
    schedule (as replayed, whatever the solver reported) and DTR's passing run at each solved
    budget. A run that fits a budget fits every larger one (replaying its decisions), so each
    refutes a proof at or above its budget. ``base_compute``: the trace's compute (a run's
    clock is 1 + its total compute; overhead is clock / base_compute)."""
    def overhead(recompute: int) -> float:
        return (1 + base_compute + recompute) / base_compute if base_compute else math.nan  # as RunResult

    runs = []
    for row in rows:
        budget = int(row["budget_bytes"])
        if row["kind"] == "policy":
            if _plain(row.get("remat_compute")) is not None:
                recompute = int(row["remat_compute"])
            else:  # files before policy rows kept their recompute: read it back from the overhead
                recompute = round(row["overhead"] * base_compute) - 1 - base_compute
            runs.append(RealRun(budget, row["overhead"], recompute, row["solver"]))
            continue
        if row["replay_passed"] is True:
            recompute = int(row["replay_remat_compute"])
            runs.append(RealRun(budget, overhead(recompute), recompute, MODEL_OF.get(row["solver"], row["solver"])))
        if row["dtr_status"] == "pass":
            runs.append(RealRun(budget, row["dtr_overhead"], int(row["dtr_clock"]) - 1 - base_compute, "dtr"))
    return runs


def audit_rows(rows: list[dict], base_compute: int, lower_bound_bytes: int | None = None) -> list[str]:
    """Check every claim of ``rows`` against every real run they hold; set each row's
    ``fault`` (why it is not believed, else "") and return the faults, one line each.

    * a relaxation's "infeasible" or bound at B, by a real run at a budget <= B
      (:func:`.relax.refuting_run`: it fits B too, so it refutes "infeasible", and a bound
      above its compute);
    * a solver's reported recompute, by its schedule's replay if that differs (a reported
      optimum must be its schedule's), and a reported optimum by a replay that fails;
    * any row whose solver found a fault in its own answer ("solver fault: ..." in its message);
    * the footprint bound, by any real run below it (a frontier-level fault).
    """
    runs = real_runs(rows, base_compute)
    evidence = [(f"{run.source}'s run", run.budget, run.recompute) for run in runs]
    faults = []
    for row in rows:
        problem = ""
        if str(row["message"] or "").startswith("solver fault:"):
            problem = row["message"][len("solver fault:"):].strip()
        elif row["kind"] == "relax" and row["status"] in ("infeasible", "bound"):
            problem = refuting_run(_relax_claim(row, base_compute), evidence) or ""
        elif row["kind"] in ("sample", "bisect") and row["replay_remat_compute"] is not None \
                and row["remat_compute"] is not None and row["remat_compute"] != row["replay_remat_compute"]:
            problem = (f"{row['solver']} reported recompute {row['remat_compute']:g} ({row['status']}), "
                       f"its schedule replays with {row['replay_remat_compute']:g}")
        elif row["kind"] in ("sample", "bisect") and row["status"] == "optimal" and row["replay_passed"] is False:
            problem = f"{row['solver']} reported an optimum whose schedule fails its replay"
        row["fault"] = problem
        if problem:
            faults.append(f"{row['kind']} {row['solver']} at {int(row['budget_bytes'])} bytes: {problem}")
    if lower_bound_bytes is not None:
        faults.extend(f"the footprint bound {lower_bound_bytes} bytes is contradicted: {run.source} runs at "
                      f"{run.budget}" for run in runs if run.budget < lower_bound_bytes)
    return faults


def _relax_claim(row: dict, base_compute: int) -> RelaxResult:
    """A relaxation row's claim, as the result :func:`.relax.refuting_run` checks."""
    return RelaxResult(trace=row["trace"], method=row["solver"], budget_bytes=int(row["budget_bytes"]),
                       overhead_limit=0.0, status=row["status"], bound=row["best_bound"], base_compute=base_compute,
                       build_seconds=0.0, solve_seconds=0.0, time_limit_s=0.0, n_vars=0, n_rows=0, n_nonzeros=0)


def _base_compute(rows: list[dict]) -> int:
    """The trace's compute, read off rows (files before it was recorded): a solve's objective
    less its recompute, else a relaxation bound over its overhead bound."""
    for row in rows:
        if row["objective"] is not None and row["remat_compute"] is not None:
            return int(round(row["objective"] - row["remat_compute"]))
    for row in rows:
        if row["best_bound"] is not None and row["overhead_bound"]:
            return int(round((1 + row["best_bound"]) / row["overhead_bound"]))
    raise KeyError("base_compute (no row to read it from)")


def _bracket(rows: list[dict], base_compute: int, lower: int) -> dict:
    """The bracket the (audited) rows support: the Frontier fields derived from rows."""
    runs = real_runs(rows, base_compute)
    footprint_holds = not any(run.budget < lower for run in runs)
    min_feasible, source = min(((run.budget, run.source) for run in runs), default=(None, None))
    proofs = [r["budget_bytes"] for r in rows if r["kind"] == "relax" and _verdict(r) == "infeasible"]
    max_infeasible = max(proofs + [lower - 1 if footprint_holds else 0])
    unresolved = tuple(sorted({r["budget_bytes"] for r in rows if r["kind"] == "relax" and r["status"] == "unknown"
                               and r["budget_bytes"] > max_infeasible
                               and (min_feasible is None or r["budget_bytes"] < min_feasible)}))
    stage = [r for r in rows if r["kind"] in ("sample", "bisect") and r["solver"] in STAGE_SOLVERS]
    stage_min = min((r["budget_bytes"] for r in stage if _verdict(r) == "feasible"), default=None)
    stage_infeasible = [r["budget_bytes"] for r in stage if _verdict(r) == "infeasible"
                        and (stage_min is None or r["budget_bytes"] < stage_min)]
    return dict(min_feasible_bytes=min_feasible, min_feasible_source=source, max_infeasible_bytes=max_infeasible,
                unresolved_bytes=unresolved, stage_min_feasible_bytes=stage_min,
                stage_max_infeasible_bytes=max(stage_infeasible, default=None))


def assemble(trace_name: str, trace_hash: str, plan: FrontierPlan, *, relax_status: str, peak_bytes: int,
             base_compute: int, lower_bound_bytes: int, resolution_bytes: int, rows: list[dict]) -> Frontier:
    """The :class:`Frontier` of ``rows``: audited (:func:`audit_rows`), and the bracket derived from them."""
    rows = [dict(r) for r in rows]
    faults = audit_rows(rows, base_compute, lower_bound_bytes)
    frame = pd.DataFrame(rows, columns=COLUMNS).sort_values(["budget_bytes", "kind"], kind="stable")
    return Frontier(trace=trace_name, trace_hash=trace_hash, plan=plan, relax_status=relax_status,
                    peak_bytes=int(peak_bytes), base_compute=int(base_compute),
                    lower_bound_bytes=int(lower_bound_bytes), resolution_bytes=int(resolution_bytes),
                    faults=tuple(faults), rows=frame.reset_index(drop=True),
                    **_bracket(rows, base_compute, lower_bound_bytes))
