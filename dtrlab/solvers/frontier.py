"""The feasibility frontier of one trace: optimal recompute at sampled budgets, and the
minimal budget any schedule of the stage model fits, bisected over solver feasibility.

Every schedule a solver returns is replayed in the simulator (:func:`.replay`); a
budget counts as feasible only when that replay passes. Results are parquet files
with their trace's content hash and :data:`FRONTIER_VERSION` in the metadata,
checked by :func:`read_frontier` before use.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..runtime import DEFAULT_OVERHEAD_LIMIT, baseline, simulate
from ..trace.model import Trace
from .problem import build_problem
from .replay import replay
from .solve import DEFAULT_TIME_LIMIT_S, SOLVERS, solve_optimal

#: Bump when the formulation, the replay or the file layout changes what a file means.
FRONTIER_VERSION = 2
_METADATA_KEY = b"dtrlab.frontier"

COLUMNS = ["trace", "kind", "solver", "ratio", "budget_bytes", "status", "objective", "best_bound", "gap", "remat_compute",
           "overhead", "solve_seconds", "replay_passed", "replay_remat_compute", "replay_peak", "disagreement",
           "dtr_status", "dtr_clock", "dtr_overhead", "n_vars", "n_rows", "message"]


@dataclass(frozen=True)
class Frontier:
    """The frontier of one trace. ``rows`` has :data:`COLUMNS`, one row per solve
    (``kind`` "sample" for an optimized budget, "bisect" for a feasibility probe).

    ``min_feasible_bytes``: the smallest budget with a replay-verified schedule;
    ``max_infeasible_bytes``: the largest budget shown infeasible (by the lower
    bound or a solver proof); ``unresolved_bytes``: budgets between them where the
    time limit ended with neither answer (the frontier is proven only when empty).
    """

    trace: str
    trace_hash: str
    solver: str
    probe_solver: str
    overhead_limit: float
    time_limit_s: float
    chain: int
    peak_bytes: int
    lower_bound_bytes: int
    min_feasible_bytes: int | None
    max_infeasible_bytes: int | None
    unresolved_bytes: tuple[int, ...]
    resolution_bytes: int
    rows: pd.DataFrame = field(repr=False)

    @property
    def proven(self) -> bool:
        return (self.min_feasible_bytes is not None and self.max_infeasible_bytes is not None
                and not self.unresolved_bytes and self.min_feasible_bytes - self.max_infeasible_bytes
                <= self.resolution_bytes)

    @property
    def min_feasible_ratio(self) -> float | None:
        return None if self.min_feasible_bytes is None else self.min_feasible_bytes / self.peak_bytes

    def metadata(self) -> dict:
        return {
            "version": FRONTIER_VERSION, "trace": self.trace, "trace_hash": self.trace_hash, "solver": self.solver,
            "probe_solver": self.probe_solver,
            "overhead_limit": self.overhead_limit, "time_limit_s": self.time_limit_s, "chain": self.chain,
            "peak_bytes": self.peak_bytes, "lower_bound_bytes": self.lower_bound_bytes,
            "min_feasible_bytes": self.min_feasible_bytes, "max_infeasible_bytes": self.max_infeasible_bytes,
            "unresolved_bytes": list(self.unresolved_bytes), "resolution_bytes": self.resolution_bytes,
        }

    def summary(self) -> dict:
        samples = self.rows[self.rows.kind == "sample"]
        return {
            "trace": self.trace, "lower_bound_ratio": self.lower_bound_bytes / self.peak_bytes,
            "max_infeasible_ratio": None if self.max_infeasible_bytes is None
            else self.max_infeasible_bytes / self.peak_bytes,
            "min_feasible_ratio": self.min_feasible_ratio, "proven": self.proven,
            "solves": len(self.rows), "solve_seconds": float(self.rows.solve_seconds.sum()),
            "max_gap": float(samples.gap.max()) if samples.gap.notna().any() else None,
            "max_recompute_gap": _recompute_gap(samples),
            "replay_failures": int((self.rows.replay_passed == False).sum()),  # noqa: E712
        }


def _recompute_gap(rows: pd.DataFrame) -> float | None:
    """The largest (objective - bound) / recompute over solved rows: the gap on what the solver minimizes."""
    bound = pd.to_numeric(rows.best_bound, errors="coerce")
    solved = rows[rows.objective.notna() & np.isfinite(bound) & (rows.remat_compute > 0)]
    if solved.empty:
        return None
    return float(((solved.objective - bound[solved.index]) / solved.remat_compute).clip(upper=1.0).max())


def _solve_row(problem, budget: int, kind: str, ratio: float | None, *, solver, overhead_limit, time_limit_s,
               dtr: bool) -> dict:
    trace = problem.trace
    result = solve_optimal(problem, budget, overhead_limit=overhead_limit, time_limit_s=time_limit_s,
                           solver=solver, feasibility_only=kind == "bisect")
    row = {"trace": trace.name, "kind": kind, "ratio": ratio, **{k: v for k, v in result.to_dict().items()
                                                                 if k in COLUMNS and k != "trace"}}
    row.update(replay_passed=None, replay_remat_compute=None, replay_peak=None, disagreement="")
    if result.schedule is not None:
        check = replay(problem, result)
        row.update(replay_passed=check.passed, replay_remat_compute=check.remat_compute,
                   replay_peak=check.peak_memory, disagreement="" if check.passed else check.summary())
    row.update(dtr_status=None, dtr_clock=None, dtr_overhead=None)
    if dtr:
        run = simulate(trace, "dtr", budget_bytes=budget, overhead_limit=overhead_limit)
        row.update(dtr_status=run.status, dtr_clock=run.clock, dtr_overhead=run.overhead)
    return row


def _verdict(row: dict) -> str:
    """"feasible" (replayed), "infeasible" (proven) or "unknown"."""
    if row["status"] == "infeasible":
        return "infeasible"
    if row["replay_passed"]:
        return "feasible"
    return "unknown"


def compute_frontier(trace: Trace, *, ratios=(), budgets=(), overhead_limit: float = DEFAULT_OVERHEAD_LIMIT,
                     time_limit_s: float = DEFAULT_TIME_LIMIT_S, solver: str = "milp", probe_solver: str = "cpsat",
                     chain: int = 3,
                     resolution: float = 0.01, bisect: bool = True, dtr: bool = True, progress=None) -> Frontier:
    """Optimal recompute at ``ratios`` (fractions of the baseline peak) and ``budgets``
    (bytes), then the minimal feasible budget by bisection to ``resolution`` x peak.

    Every solve gets ``time_limit_s``; samples are optimized with ``solver``, bisection
    probes only look for a schedule with ``probe_solver`` (CP-SAT finds feasible
    schedules faster, HiGHS proves optima faster in our runs); ``dtr`` also runs DTR
    at each budget for comparison. ``progress(row)`` is called after each solve.
    """
    if not 0 < resolution < 1:
        raise ValueError(f"resolution is a fraction of the peak in (0, 1), e.g. 0.01; got {resolution}")
    problem = build_problem(trace, chain=chain)
    peak = baseline(trace).peak_memory
    lower = problem.lower_bound()
    options = dict(overhead_limit=overhead_limit, time_limit_s=time_limit_s, dtr=dtr)
    rows = []

    def solve(budget: int, kind: str, ratio=None) -> str:
        first = solver if kind == "sample" else probe_solver
        verdict = "unknown"
        # A probe that ends unknown is retried once with the other solver: in our runs
        # each one settles budgets the other times out on.
        for name in (first, *(s for s in SOLVERS if s != first and kind == "bisect")):
            row = _solve_row(problem, budget, kind, ratio, solver=name, **options)
            rows.append(row)
            if progress is not None:
                progress(row)
            verdict = _verdict(row)
            if verdict != "unknown":
                break
        return verdict

    targets = sorted({(int(peak * r), r) for r in ratios} | {(int(b), int(b) / peak) for b in budgets})
    verdicts = {budget: solve(budget, "sample", ratio) for budget, ratio in targets}
    feasible = [b for b, v in verdicts.items() if v == "feasible"]
    infeasible = [b for b, v in verdicts.items() if v == "infeasible"] + [lower - 1]
    if bisect:
        step = max(1, int(resolution * peak))
        hi = min(feasible) if feasible else None
        for factor in (1.0, 1.5, 2.0):
            if hi is not None:
                break
            budget = int(peak * factor)
            if budget not in verdicts:
                verdicts[budget] = solve(budget, "bisect", factor)
            if verdicts[budget] == "feasible":
                hi = budget
        lo = max(b for b in infeasible if hi is None or b < hi)
        while hi is not None and hi - lo > step:
            mid = (lo + hi) // 2
            verdicts[mid] = solve(mid, "bisect", mid / peak)
            if verdicts[mid] == "feasible":
                hi = mid
            else:
                lo = mid  # an unknown is recorded below: the frontier is then not proven
    feasible = [b for b, v in verdicts.items() if v == "feasible"]
    min_feasible = min(feasible) if feasible else None
    proven_infeasible = [b for b, v in verdicts.items() if v == "infeasible" and (min_feasible is None or b < min_feasible)]
    max_infeasible = max(proven_infeasible + [lower - 1])
    unresolved = tuple(sorted(b for b, v in verdicts.items() if v == "unknown" and max_infeasible < b
                              and (min_feasible is None or b < min_feasible)))
    frame = pd.DataFrame(rows, columns=COLUMNS).sort_values(["budget_bytes", "kind"], kind="stable")
    return Frontier(
        trace=trace.name, trace_hash=trace.content_hash, solver=solver, probe_solver=probe_solver, overhead_limit=overhead_limit,
        time_limit_s=time_limit_s, chain=chain, peak_bytes=peak, lower_bound_bytes=lower,
        min_feasible_bytes=min_feasible, max_infeasible_bytes=max_infeasible, unresolved_bytes=unresolved,
        resolution_bytes=max(1, int(resolution * peak)), rows=frame.reset_index(drop=True),
    )


def write_frontier(frontier: Frontier, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pandas(frontier.rows, preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                           _METADATA_KEY: json.dumps(frontier.metadata()).encode()})
    pq.write_table(table, path)
    return path


class StaleFrontier(ValueError):
    """A frontier file from another version or for another trace content."""


def read_frontier(path: str | os.PathLike, trace: Trace | None = None) -> Frontier:
    """Read a frontier file, checking its version and, with ``trace``, its content hash."""
    table = pq.read_table(path)
    raw = (table.schema.metadata or {}).get(_METADATA_KEY)
    if raw is None:
        raise StaleFrontier(f"{path} is not a dtrlab frontier file (no {_METADATA_KEY.decode()} metadata)")
    meta = json.loads(raw)
    if meta.get("version") != FRONTIER_VERSION:
        raise StaleFrontier(f"{path} has frontier version {meta.get('version')}, this dtrlab writes "
                            f"{FRONTIER_VERSION}; recompute it (dtrlab frontier)")
    if trace is not None and meta["trace_hash"] != trace.content_hash:
        raise StaleFrontier(f"{path} was computed for other content of trace {meta['trace']!r}; recompute it")
    rows = table.to_pandas()
    missing = [c for c in COLUMNS if c not in rows]
    if missing:
        raise StaleFrontier(f"{path} lacks columns {missing}")
    meta.pop("version")
    meta["unresolved_bytes"] = tuple(meta["unresolved_bytes"])
    return Frontier(rows=rows, **meta)


def frontier_path(directory: str | os.PathLike, trace_name: str) -> Path:
    return Path(directory) / f"{trace_name}.parquet"


def load_frontiers(traces: dict[str, Trace], directory: str | os.PathLike | None, *, compute_missing: bool,
                   **options) -> tuple[dict[str, Frontier], dict[str, str]]:
    """Each trace's frontier from ``directory`` when a valid file is there, else computed
    with ``options`` (:func:`compute_frontier`) if ``compute_missing``, else left out.
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
            frontiers[name], origin[name] = compute_frontier(trace, **options), "computed"
        else:
            origin[name] = f"left out ({reason}; dtrlab frontier LOG --out DIR computes it)"
    return frontiers, origin


def hole_budgets(trace: Trace, ratios, *, overhead_limit: float = DEFAULT_OVERHEAD_LIMIT) -> list[int]:
    """The failing budgets of DTR's holes when sweeping ``ratios``: the lowest failing
    sample of each hole (the census of :func:`dtrlab.analysis.holes.find_holes`)."""
    from ..analysis.holes import find_holes
    from ..sweep import sweep

    frame = sweep(trace, "dtr", ratios=list(ratios), overhead_limit=overhead_limit, jobs=1, progress=False)
    return [int(b) for b in find_holes(frame).holes.fail_low_bytes]
