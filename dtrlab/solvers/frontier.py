"""The feasibility frontier of one trace, bracketed from both sides.

* **Upper side (replayed):** the smallest budget at which some real run fits: a policy's
  passing run on a sweep grid (DTR, the zoo: simulator runs), DTR's run at a solved
  budget, or a stage-model or interval-model schedule that the simulator replays
  (:func:`.replay`). Nothing counts as feasible without a run in the simulator.
* **Lower side (proven):** the largest budget at which the relaxation (:mod:`.relax`),
  which every on-demand simulator run maps into, is infeasible: no such run fits there.
  Its optimum at sampled budgets bounds the compute of every run from below.

Every claim of the lower side is checked against every real run the frontier holds
(:func:`audit_rows`): a proof that a known run contradicts is a *solver fault* (column
``fault``, a :class:`SolverFaultWarning`), and the bracket ignores it; so is a solver
row whose reported recompute differs from its replay's.

What one frontier computes is a :class:`FrontierPlan`; :func:`compute_frontier` runs it
step by step (policy runs, stage model, interval model, relaxation). Each finished solve
can be handed to a :class:`SolveJournal` (one checksummed JSON file per solve, written
atomically), so an interrupted run resumes without repeating a finished solve. Results
are parquet files with their trace's content hash, :data:`FRONTIER_VERSION` and a
checksum of their content in the metadata, checked by :func:`read_frontier` before use.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..integrity import IntegrityError, atomic_write_bytes, quarantine, read_hashed, sha256_bytes, write_hashed
from ..runtime import DEFAULT_OVERHEAD_LIMIT, REFERENCE, Semantics, baseline, simulate
from ..suggest import did_you_mean
from ..sweep.execution import QUIET, Execution
from ..trace.model import Trace
from .problem import build_problem
from .relax import (RELAX_METHODS, RelaxationTooLarge, RelaxResult, check_size, refuting_run, relaxation_problem,
                    solve_relaxation)
from .replay import replay
from .solve import DEFAULT_TIME_LIMIT_S, solve_optimal

STAGE_SOLVERS = ("cpsat", "milp")
MODEL_OF = {"cpsat": "stage model", "milp": "stage model", "interval": "interval model"}

#: Bump when the formulation, the replay or the file layout changes what a file means.
FRONTIER_VERSION = 3
_METADATA_KEY = b"dtrlab.frontier"

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


# ------------------------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class FrontierPlan:
    """What one frontier computes. The defaults are ``dtrlab frontier``'s.

    Where to solve: ``ratios`` (fractions of the baseline peak) and ``budgets`` (bytes) are
    the sampled budgets; ``holes`` adds DTR's holes on ``policy_ratios`` (their lowest
    failing budgets).

    What to try (upper side): ``policies`` swept over ``policy_ratios`` (each one's lowest
    passing budget is a real run); the stage model optimized at the samples (``solver``,
    recompute chains up to ``chain``), then at most ``stage_probes`` feasibility probes
    bisecting below the best real run (``probe_solver``, then the other on "unknown"); the
    interval model at the samples with ``interval_samples`` and in at most
    ``interval_probes`` probes below the best real run (its "infeasible" is no proof).
    ``dtr`` also runs DTR at every solved budget (a real run too, when it passes).

    What to prove (lower side): the relaxation (``relax_method`` "lp" or "mip") at the
    samples, and its largest infeasible budget, found to ``resolution`` x peak by
    galloping up from the footprint bound and bisecting; then at most ``mip_probes`` probes
    of the 0/1 relaxation between that proof and the upper side. ``bisect=False`` solves
    the samples only.

    Limits: ``overhead_limit`` (the simulator's thrash limit, for every model and run),
    ``time_limit_s`` per stage-model solve, ``relax_time_limit_s`` per relaxation solve
    (None: 4x ``time_limit_s``), ``interval_time_limit_s`` per interval solve (None:
    ``time_limit_s``). A wall-clock limit decides only how far a solve gets, never what
    a finished solve proves.
    """

    ratios: tuple[float, ...] = (0.6, 0.8, 1.0)
    budgets: tuple[int, ...] = ()
    holes: bool = False
    policies: tuple[str, ...] = ("dtr",)
    policy_ratios: str | tuple[float, ...] = "0.05:1.0:0.005"
    solver: str = "milp"
    probe_solver: str = "cpsat"
    stage_probes: int = 3
    chain: int = 3
    interval_samples: bool = False
    interval_probes: int = 0
    dtr: bool = True
    relax_method: str = "lp"
    mip_probes: int = 0
    resolution: float = 0.01
    bisect: bool = True
    overhead_limit: float = DEFAULT_OVERHEAD_LIMIT
    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    relax_time_limit_s: float | None = None
    interval_time_limit_s: float | None = None

    def __post_init__(self):
        for name in ("ratios", "budgets", "policies"):
            value = getattr(self, name)
            if isinstance(value, (str, bytes)) and name != "policies":
                raise PlanError(name, f"must be a list, got {value!r}")
            object.__setattr__(self, name, tuple([value] if isinstance(value, str) else value))
        if not isinstance(self.policy_ratios, str):
            object.__setattr__(self, "policy_ratios", tuple(self.policy_ratios))
        for name in ("holes", "interval_samples", "dtr", "bisect"):
            if not isinstance(getattr(self, name), bool):
                raise PlanError(name, f"must be true or false, got {getattr(self, name)!r}")
        for name in ("stage_probes", "interval_probes", "mip_probes"):
            _require(name, getattr(self, name), int, lambda v: v >= 0, "a whole number >= 0")
        _require("chain", self.chain, int, lambda v: v >= 1,
                 "a whole number >= 1 (the longest recompute chain of the stage model)")
        for ratio in self.ratios:
            _require("ratios", ratio, float, lambda v: v > 0, "positive finite fractions of the peak")
        for budget in self.budgets:
            _require("budgets", budget, int, lambda v: v > 0, "positive whole numbers of bytes")
        self.policy_grid()  # checks policy_ratios
        _require("resolution", self.resolution, float, lambda v: 0 < v < 1,
                 "a fraction of the peak in (0, 1), e.g. 0.01")
        _require("overhead_limit", self.overhead_limit, float, lambda v: v >= 1,
                 "a finite number >= 1 (2.0 allows as much recompute as compute)")
        for name in ("time_limit_s", "relax_time_limit_s", "interval_time_limit_s"):
            if name == "time_limit_s" or getattr(self, name) is not None:
                _require(name, getattr(self, name), float, lambda v: v > 0, "a positive finite number of seconds")
        if self.relax_method not in RELAX_METHODS:
            raise PlanError("relax_method", f"must be one of {', '.join(RELAX_METHODS)}, got {self.relax_method!r}"
                            + did_you_mean(self.relax_method, RELAX_METHODS))
        for name in ("solver", "probe_solver"):
            if getattr(self, name) not in STAGE_SOLVERS:
                raise PlanError(name, f"must be a stage-model solver, one of {', '.join(STAGE_SOLVERS)}, got "
                                f"{getattr(self, name)!r} (the interval model runs with interval_samples and "
                                "interval_probes)"
                                f"{did_you_mean(getattr(self, name), STAGE_SOLVERS)}")

    def policy_grid(self) -> list[float]:
        """``policy_ratios`` as a list of ratios (it may be a range "START:STOP:STEP")."""
        from ..sweep.budget_sweep import parse_ratios

        try:
            grid = parse_ratios(self.policy_ratios)
        except (ValueError, OverflowError) as error:
            raise PlanError("policy_ratios", f"must be a list of ratios or START:STOP:STEP: {error}") from None
        if not all(math.isfinite(r) for r in grid):
            raise PlanError("policy_ratios", f"must be finite, got {self.policy_ratios!r}")
        return grid

    @property
    def relax_limit_s(self) -> float:
        return self.relax_time_limit_s or 4 * self.time_limit_s

    @property
    def interval_limit_s(self) -> float:
        return self.interval_time_limit_s or self.time_limit_s

    def to_dict(self) -> dict:
        """The plan as JSON-ready fields (what :meth:`from_dict` and ``--plan FILE`` read)."""
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
                for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, fields: dict, base: FrontierPlan | None = None) -> FrontierPlan:
        """``base`` (default: the defaults) with ``fields`` replaced; an unknown field is a
        :class:`PlanError` with a suggestion."""
        if not isinstance(fields, dict):
            raise PlanError(None, f"a plan is a JSON object of fields, got {type(fields).__name__}")
        known = [f.name for f in dataclasses.fields(cls)]
        for name in fields:
            if name not in known:
                raise PlanError(name, "is not a plan field" + (did_you_mean(name, known)
                                                               or f" (the fields: {', '.join(known)})"))
        return dataclasses.replace(base or cls(), **fields)


class PlanError(ValueError):
    """A plan field with a bad value; ``field`` names it (None: the plan as a whole)."""

    def __init__(self, field_name: str | None, problem: str):
        self.field, self.problem = field_name, problem
        super().__init__(problem if field_name is None else f"{field_name} {problem}")


def _require(name: str, value, kind: type, ok, what: str) -> None:
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not numeric or (kind is int and not float(value).is_integer()) or not math.isfinite(value) or not ok(value):
        raise PlanError(name, f"must be {what}, got {value!r}")


# ---------------------------------------------------------------------------------- the result
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


# ---------------------------------------------------------------------------- one frontier, step by step
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
    from ..sweep import sweep

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
    from ..analysis.holes import find_holes
    from ..sweep import sweep

    frame = sweep(trace, "dtr", ratios=list(ratios), semantics=semantics, execution=execution)
    return [int(b) for b in find_holes(frame).holes.fail_low_bytes]


# ------------------------------------------------------------------------------------- files
class StaleFrontier(ValueError):
    """A frontier file from another version, for another trace content, or damaged."""


def _content_sha256(meta: dict, records: list[dict]) -> str:
    """The checksum of what a file says: its metadata (less the checksum) and its rows as read."""
    meta = {k: v for k, v in meta.items() if k != "sha256"}
    return sha256_bytes(json.dumps({"meta": meta, "rows": records}, sort_keys=True, separators=(",", ":")).encode())


def write_frontier(frontier: Frontier, path: str | os.PathLike) -> Path:
    """Write ``frontier`` as parquet, atomically, with a checksum of its content in the metadata."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = frontier.metadata()
    meta["sha256"] = _content_sha256(meta, _records(frontier.rows))
    table = pa.Table.from_pandas(frontier.rows, preserve_index=False)
    table = table.replace_schema_metadata({_METADATA_KEY: json.dumps(meta).encode()})  # no pandas metadata: arrow types
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    atomic_write_bytes(path, buffer.getvalue())
    return path


def read_frontier(path: str | os.PathLike, trace: Trace | None = None) -> Frontier:
    """Read a frontier file, checking its version, its content's checksum and, with ``trace``,
    its content hash; the rows are audited again (:func:`audit_rows`) and the bracket is
    the one they support. A file that fails a check raises :class:`StaleFrontier`."""
    try:
        table = pq.read_table(path)
        raw = (table.schema.metadata or {}).get(_METADATA_KEY)
        meta = None if raw is None else json.loads(raw)
        rows = table.to_pandas()
    except FileNotFoundError:
        raise
    except Exception as error:  # noqa: BLE001  (whatever a damaged file makes the decoder raise)
        raise StaleFrontier(f"{path} is damaged (not a readable frontier file: {type(error).__name__}: "
                            f"{error})") from None
    if not isinstance(meta, dict):
        raise StaleFrontier(f"{path} is not a dtrlab frontier file (no {_METADATA_KEY.decode()} metadata)")
    if meta.get("version") != FRONTIER_VERSION:
        raise StaleFrontier(f"{path} has frontier version {meta.get('version')}, this dtrlab writes "
                            f"{FRONTIER_VERSION}; recompute it (dtrlab frontier)")
    if trace is not None and meta.get("trace_hash") != trace.content_hash:
        raise StaleFrontier(f"{path} was computed for other content of trace {meta.get('trace')!r}; recompute it")
    missing = [c for c in COLUMNS if c not in rows and c != "fault"]  # files before the audit have no fault column
    if missing:
        raise StaleFrontier(f"{path} lacks columns {missing}")
    records = _records(rows)
    if "sha256" in meta and _content_sha256(meta, records) != meta["sha256"]:
        raise StaleFrontier(f"{path} is damaged (its content does not match its checksum); recompute it")
    try:
        plan = FrontierPlan.from_dict(meta["plan"]) if "plan" in meta else _plan_of_v3(meta)
        return assemble(meta["trace"], meta["trace_hash"], plan, relax_status=meta["relax_status"],
                        peak_bytes=meta["peak_bytes"], base_compute=meta.get("base_compute") or _base_compute(records),
                        lower_bound_bytes=meta["lower_bound_bytes"],
                        resolution_bytes=meta["resolution_bytes"], rows=records)
    except (KeyError, TypeError, ValueError) as error:
        raise StaleFrontier(f"{path} has damaged metadata ({type(error).__name__}: {error})") from None


def _plan_of_v3(meta: dict) -> FrontierPlan:
    """The plan of a file written before plans were recorded: the settings it kept."""
    return FrontierPlan(solver=meta["solver"], probe_solver=meta["probe_solver"], relax_method=meta["relax_method"],
                        overhead_limit=meta["overhead_limit"], time_limit_s=meta["time_limit_s"], chain=meta["chain"],
                        mip_probes=meta.get("mip_probes", 0),
                        resolution=min(0.5, max(1e-9, meta["resolution_bytes"] / meta["peak_bytes"])))


def frontier_path(directory: str | os.PathLike, trace_name: str) -> Path:
    return Path(directory) / f"{trace_name}.parquet"


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
class SolveJournal:
    """Each finished solve of one frontier as its own JSON file in ``directory``, so an
    interrupted computation (Ctrl-C, SIGKILL) loses nothing that finished.

    An entry is written atomically under a name holding the sha256 of its bytes
    (:func:`dtrlab.integrity.write_hashed`) and verified when read; a damaged one is moved
    aside with a warning and its solve is done again. Each entry records the trace's
    content hash, :data:`FRONTIER_VERSION` and the limits a solve depends on
    (``overhead_limit``, ``time_limit_s``); :meth:`rows` refuses entries of others.
    """

    def __init__(self, directory: str | os.PathLike, trace: Trace, plan: FrontierPlan):
        self.directory = Path(directory)
        self.stamp = {"version": FRONTIER_VERSION, "trace_hash": trace.content_hash,
                      "overhead_limit": plan.overhead_limit, "time_limit_s": plan.time_limit_s}
        self._written: set[tuple] = set()

    def entries(self) -> list[Path]:
        return sorted(self.directory.glob("*.json")) if self.directory.is_dir() else []

    def add(self, row: dict) -> None:
        key = _key(row)
        if key in self._written:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        data = json.dumps({**self.stamp, "row": {c: _plain(row.get(c)) for c in COLUMNS}}, sort_keys=True)
        kind, solver, budget = key
        write_hashed(self.directory, f"{kind}-{solver}-{budget}", ".json", data.encode())
        self._written.add(key)

    def rows(self) -> list[dict]:
        """The verified rows of the entries (damaged ones quarantined); raises ``ValueError``
        if an entry was made for another trace content or with other limits."""
        rows = {}
        for path in self.entries():
            try:
                entry = json.loads(read_hashed(path))
                stamp = {k: entry[k] for k in self.stamp}
                row = {c: entry["row"].get(c) for c in COLUMNS}
            except FileNotFoundError:
                continue
            except (IntegrityError, ValueError, KeyError, TypeError, AttributeError) as error:
                quarantine(path, str(error))
                continue
            if stamp != self.stamp:
                raise ValueError(f"{path} was computed with {stamp}, not {self.stamp}; give the same limits, "
                                 f"or delete {self.directory}")
            rows[_key(row)] = row
            self._written.add(_key(row))
        return list(rows.values())

    def clear(self) -> None:
        """Remove the entries (after their frontier file is written) and the directory if empty."""
        for path in self.entries():
            path.unlink(missing_ok=True)
        try:
            self.directory.rmdir()
        except OSError:
            pass  # not empty (quarantined files) or gone
