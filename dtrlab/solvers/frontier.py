"""The feasibility frontier of one trace, bracketed from both sides.

* **Upper side (replayed):** the smallest budget at which some real run fits: a policy's
  passing run on a sweep grid (DTR, the zoo: simulator runs), or a stage-model schedule
  (:mod:`.model`) that the simulator replays (:func:`.replay`). Nothing counts as
  feasible without a run in the simulator.
* **Lower side (proven):** the largest budget at which the relaxation (:mod:`.relax`),
  which every simulator run maps into, is infeasible: no run fits there. Its optimum
  at sampled budgets bounds the compute of every run from below.

Results are parquet files with their trace's content hash and :data:`FRONTIER_VERSION`
in the metadata, checked by :func:`read_frontier` before use.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..runtime import DEFAULT_OVERHEAD_LIMIT, baseline, simulate
from ..trace.model import Trace
from .problem import build_problem
from .relax import RELAX_METHODS, RelaxationTooLarge, check_size, relaxation_problem, solve_relaxation
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
COLUMNS = ["trace", "kind", "solver", "ratio", "budget_bytes", "status", "objective", "best_bound", "gap", "remat_compute",
           "overhead", "overhead_bound", "solve_seconds", "build_seconds", "replay_passed", "replay_remat_compute",
           "replay_peak", "disagreement", "dtr_status", "dtr_clock", "dtr_overhead", "n_vars", "n_rows", "n_nonzeros",
           "message"]


@dataclass(frozen=True)
class Frontier:
    """The frontier bracket of one trace. ``rows`` has :data:`COLUMNS`.

    ``min_feasible_bytes``: the smallest budget with a real run (``min_feasible_source``:
    a policy name, "stage model" or "interval model"); ``max_infeasible_bytes``: the largest budget proven
    infeasible for every run (the relaxation, or the footprint lower bound);
    ``unresolved_bytes``: relaxation probes between them that ran out of time. The
    stage model's own (restricted) results are ``stage_min_feasible_bytes`` and
    ``stage_max_infeasible_bytes`` (infeasible *within that model* only).
    ``relax_status``: "solved", or why the relaxation was not solved (e.g. too large).
    """

    trace: str
    trace_hash: str
    solver: str
    probe_solver: str
    relax_method: str
    relax_status: str
    overhead_limit: float
    time_limit_s: float
    chain: int
    peak_bytes: int
    lower_bound_bytes: int
    min_feasible_bytes: int | None
    min_feasible_source: str | None
    max_infeasible_bytes: int
    unresolved_bytes: tuple[int, ...]
    stage_min_feasible_bytes: int | None
    stage_max_infeasible_bytes: int | None
    resolution_bytes: int
    rows: pd.DataFrame = field(repr=False)
    mip_probes: int = 0

    @property
    def gap_bytes(self) -> int | None:
        """Width of the bracket: how far the true minimal budget may lie above the proof."""
        return None if self.min_feasible_bytes is None else self.min_feasible_bytes - self.max_infeasible_bytes

    @property
    def proven(self) -> bool:
        """The minimal budget of any run is known to ``resolution``."""
        return self.gap_bytes is not None and self.gap_bytes <= self.resolution_bytes

    @property
    def min_feasible_ratio(self) -> float | None:
        return None if self.min_feasible_bytes is None else self.min_feasible_bytes / self.peak_bytes

    @property
    def max_infeasible_ratio(self) -> float:
        return self.max_infeasible_bytes / self.peak_bytes

    def metadata(self) -> dict:
        return {
            "version": FRONTIER_VERSION, "trace": self.trace, "trace_hash": self.trace_hash, "solver": self.solver,
            "probe_solver": self.probe_solver, "relax_method": self.relax_method, "relax_status": self.relax_status,
            "overhead_limit": self.overhead_limit, "time_limit_s": self.time_limit_s, "chain": self.chain,
            "peak_bytes": self.peak_bytes, "lower_bound_bytes": self.lower_bound_bytes,
            "min_feasible_bytes": self.min_feasible_bytes, "min_feasible_source": self.min_feasible_source,
            "max_infeasible_bytes": self.max_infeasible_bytes, "unresolved_bytes": list(self.unresolved_bytes),
            "stage_min_feasible_bytes": self.stage_min_feasible_bytes,
            "stage_max_infeasible_bytes": self.stage_max_infeasible_bytes, "resolution_bytes": self.resolution_bytes,
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
        }


def _blank(trace: Trace, kind: str, budget: int, ratio) -> dict:
    row = dict.fromkeys(COLUMNS)
    row.update(trace=trace.name, kind=kind, budget_bytes=int(budget), ratio=ratio, disagreement="", message="")
    return row


def _solve_row(problem, budget: int, kind: str, ratio: float | None, *, solver, overhead_limit, time_limit_s,
               dtr: bool, reuse: dict | None = None, hint_policies=("dtr",)) -> dict:
    trace = problem.trace
    earlier = (reuse or {}).get((kind, solver, int(budget)))
    if earlier is not None:
        return dict(earlier)
    result = solve_optimal(problem, budget, overhead_limit=overhead_limit, time_limit_s=time_limit_s,
                           solver=solver, feasibility_only=kind == "bisect", hint=hint_policies)
    row = _blank(trace, kind, budget, ratio)
    row.update({k: v for k, v in result.to_dict().items() if k in COLUMNS and k not in ("trace", "budget_bytes")})
    if result.schedule is not None:
        check = replay(problem, result)
        row.update(replay_passed=check.passed, replay_remat_compute=check.remat_compute,
                   replay_peak=check.peak_memory, disagreement="" if check.passed else check.summary())
    if dtr:
        _add_dtr(row, trace, budget, overhead_limit)
    return row


def _relax_row(problem, budget: int, ratio, *, method, overhead_limit, time_limit_s, dtr: bool,
               reuse: dict | None = None) -> dict:
    earlier = (reuse or {}).get(("relax", method, int(budget)))
    if earlier is not None:
        return dict(earlier)
    result = solve_relaxation(problem, budget, overhead_limit=overhead_limit, method=method, time_limit_s=time_limit_s)
    row = _blank(problem.trace, "relax", budget, ratio)
    row.update(solver=method, status=result.status, best_bound=result.bound, overhead_bound=result.overhead_bound,
               solve_seconds=result.solve_seconds, build_seconds=result.build_seconds, n_vars=result.n_vars,
               n_rows=result.n_rows, n_nonzeros=result.n_nonzeros, message=result.message,
               overhead_limit=overhead_limit)
    if dtr:
        _add_dtr(row, problem.trace, budget, overhead_limit)
    return row


def _add_dtr(row: dict, trace: Trace, budget: int, overhead_limit: float) -> None:
    run = simulate(trace, "dtr", budget_bytes=budget, overhead_limit=overhead_limit)
    row.update(dtr_status=run.status, dtr_clock=run.clock, dtr_overhead=run.overhead)


def _verdict(row: dict) -> str:
    """"feasible" (replayed), "infeasible" (proven) or "unknown"."""
    if row["status"] == "infeasible":
        return "infeasible"
    if row["replay_passed"]:
        return "feasible"
    return "unknown"


def policy_rows(trace: Trace, policies, ratios, *, overhead_limit: float = DEFAULT_OVERHEAD_LIMIT,
                cache=True, jobs: int = 1) -> list[dict]:
    """Each policy's lowest passing budget on the ``ratios`` grid (a real run: the upper side)."""
    from ..sweep import sweep

    rows = []
    for policy in policies:
        frame = sweep(trace, policy, ratios=ratios, overhead_limit=overhead_limit, cache=cache, jobs=jobs,
                      progress=False)
        passed = frame[frame.status == "pass"].sort_values("budget_bytes")
        if passed.empty:
            continue
        best = passed.iloc[0]
        row = _blank(trace, "policy", int(best.budget_bytes), float(best.ratio))
        row.update(solver=policy, status="pass", overhead=float(best.overhead), solve_seconds=0.0,
                   replay_passed=True, message=f"{policy}'s lowest passing budget on the sweep grid")
        rows.append(row)
    return rows


def compute_frontier(trace: Trace, *, ratios=(), budgets=(), overhead_limit: float = DEFAULT_OVERHEAD_LIMIT,
                     time_limit_s: float = DEFAULT_TIME_LIMIT_S, solver: str = "milp", probe_solver: str = "cpsat",
                     chain: int = 3, resolution: float = 0.01, bisect: bool = True, dtr: bool = True,
                     relax_method: str = "lp", relax_time_limit_s: float | None = None, policies=(),
                     policy_ratios=None, cache=True, stage_probes: int = 3, mip_probes: int = 0,
                     interval_probes: int = 0, interval_samples: bool = False,
                     interval_time_limit_s: float | None = None, reuse: pd.DataFrame | None = None,
                     progress=None) -> Frontier:
    """The bracket of ``trace``'s minimal budget, and bounds on compute at sampled budgets.

    Sampled budgets are ``ratios`` (fractions of the baseline peak) and ``budgets``
    (bytes): the stage model is optimized there (``solver``) and the relaxation solved
    (``relax_method`` "lp" or "mip", ``relax_time_limit_s``, default 4x ``time_limit_s``).
    Upper side: ``policies`` swept over ``policy_ratios`` (their lowest passing budgets)
    and the replayed stage-model samples, then at most ``stage_probes`` stage-model
    probes (``probe_solver``, then the other on "unknown") bisecting below the best.
    Lower side: the relaxation's largest infeasible budget, found to ``resolution`` x peak
    by galloping up from the footprint bound and bisecting (below the upper side), then
    at most ``mip_probes`` probes of the 0/1 relaxation (stronger, slower) bisecting
    between that proof and the upper side. The interval model (:mod:`.interval`) is
    optimized at the samples too with ``interval_samples``, and makes at most
    ``interval_probes`` probes below the best real run after the stage model's (its
    "infeasible" is no proof either), each within ``interval_time_limit_s`` (default
    ``time_limit_s``). ``dtr`` also runs DTR at each solved budget.
    ``reuse``: the rows of an earlier frontier of the same trace, computed with the same
    overhead and time limits (:func:`read_frontier`; the CLI's ``--resume`` checks); a solve
    of the same kind, solver and budget is taken from it, not repeated.
    A relaxation over :data:`~.relax.MAX_NEED_PAIRS` is skipped (said in ``relax_status``). ``progress(row)`` is called after each solve.
    """
    if not 0 < resolution < 1:
        raise ValueError(f"resolution is a fraction of the peak in (0, 1), e.g. 0.01; got {resolution}")
    if relax_method not in RELAX_METHODS:
        raise ValueError(f"unknown relaxation method {relax_method!r}; choose one of {', '.join(RELAX_METHODS)}")
    for name in (solver, probe_solver):
        if name not in STAGE_SOLVERS:
            raise ValueError(f"unknown stage-model solver {name!r}; choose one of {', '.join(STAGE_SOLVERS)} "
                             "(the interval model runs with interval_samples= and interval_probes=)")
    problem = build_problem(trace, chain=chain)
    peak = baseline(trace).peak_memory
    lower = problem.lower_bound()
    step = max(1, int(resolution * peak))
    relax_limit = relax_time_limit_s or 4 * time_limit_s
    rows: list[dict] = []
    reused = {} if reuse is None else {(r["kind"], r["solver"], int(r["budget_bytes"])): r
                                       for r in reuse.astype(object).where(reuse.notna(), None).to_dict("records")}

    def record(row: dict) -> dict:
        rows.append(row)
        if progress is not None:
            progress(row)
        return row

    for row in (policy_rows(trace, policies, policy_ratios, overhead_limit=overhead_limit, cache=cache)
                if policies and policy_ratios is not None else ()):
        record(row)

    # The stage model: optimized samples, then a few probes below the best real run.
    stage: dict[int, str] = {}

    def stage_solve(budget: int, kind: str, ratio=None) -> str:
        first = solver if kind == "sample" else probe_solver
        verdict = "unknown"
        for name in (first, *(s for s in STAGE_SOLVERS if s != first and kind == "bisect")):
            verdict = _verdict(record(_solve_row(problem, budget, kind, ratio, solver=name, reuse=reused,
                                                 overhead_limit=overhead_limit, time_limit_s=time_limit_s, dtr=dtr)))
            if verdict != "unknown":
                break
        return verdict

    targets = sorted({(int(peak * r), r) for r in ratios} | {(int(b), int(b) / peak) for b in budgets})
    for budget, ratio in targets:
        stage[budget] = stage_solve(budget, "sample", ratio)

    def best_real() -> tuple[int | None, str | None]:
        real = [(r["budget_bytes"], r["solver"] if r["kind"] == "policy" else MODEL_OF[r["solver"]])
                for r in rows if r["replay_passed"] is True]
        return min(real) if real else (None, None)

    if bisect:
        hi, _ = best_real()
        if hi is None:
            budget = int(peak * 1.5)
            stage[budget] = stage_solve(budget, "bisect", 1.5)
            hi = budget if stage[budget] == "feasible" else None
        stage_lo = max([b for b, v in stage.items() if v == "infeasible" and (hi is None or b < hi)] + [lower - 1])
        for _ in range(stage_probes):
            if hi is None or hi - stage_lo <= step:
                break
            mid = (stage_lo + hi) // 2
            stage[mid] = stage_solve(mid, "bisect", mid / peak)
            if stage[mid] == "feasible":
                hi = mid
            else:
                stage_lo = mid  # infeasible within the stage model, or unknown: look no lower with it
    # The interval model after the stage model (whose probes stay where they were without it):
    # optimized at the samples, then probes below the best real run. It and the relaxation
    # share the unbounded need closure, built once here.
    unbounded = relaxation_problem(trace)

    def interval_solve(budget: int, kind: str, ratio=None) -> str:
        return _verdict(record(_solve_row(unbounded, budget, kind, ratio, solver="interval", reuse=reused,
                                          overhead_limit=overhead_limit, dtr=dtr, hint_policies=policies or ("dtr",),
                                          time_limit_s=interval_time_limit_s or time_limit_s)))

    if interval_samples:
        for budget, ratio in targets:
            interval_solve(budget, "sample", ratio)
            if not rows[-1]["n_vars"]:
                break  # not built (too large); the row's message says so
    if bisect:
        # Its "infeasible" bounds only its own search.
        hi, _ = best_real()
        interval_lo = lower - 1
        for _ in range(interval_probes):
            if hi is None or hi - interval_lo <= step:
                break
            mid = (interval_lo + hi) // 2
            verdict = interval_solve(mid, "bisect", mid / peak)
            if not rows[-1]["n_vars"]:
                break  # not built (too large), as above
            if verdict == "feasible":
                hi = mid
            else:
                interval_lo = mid
    stage_feasible = [b for b, v in stage.items() if v == "feasible"]
    stage_min = min(stage_feasible) if stage_feasible else None
    stage_infeasible = [b for b, v in stage.items() if v == "infeasible" and (stage_min is None or b < stage_min)]
    min_feasible, source = best_real()

    # The relaxation: bounds at the samples, and the proven side of the bracket.
    relax: dict[int, str] = {}
    relax_status = "solved"
    relaxed = unbounded
    try:
        check_size(relaxed)
    except RelaxationTooLarge as error:
        relax_status = f"not solved: {error}"
        relaxed = None
    if relaxed is not None:
        def relax_solve(budget: int, ratio=None, method=relax_method) -> str:
            row = record(_relax_row(relaxed, budget, ratio, method=method, overhead_limit=overhead_limit,
                                    time_limit_s=relax_limit, dtr=dtr, reuse=reused))
            return row["status"]

        for budget, ratio in targets:
            if budget < peak:  # at the peak nothing needs recomputing: the bound is the trace's compute
                relax[budget] = relax_solve(budget, ratio)
        if bisect and min_feasible is not None:
            # The relaxation's proof usually ends near the footprint bound: gallop up from
            # it (step, 2 steps, 4, ...), then bisect the last doubling.
            lo = max([b for b, v in relax.items() if v == "infeasible" and b < min_feasible] + [lower - 1])
            hi = min([b for b, v in relax.items() if v != "infeasible" and b > lo] + [min_feasible])
            stride = step
            while lo + stride < hi:
                probe = lo + stride
                relax[probe] = relax_solve(probe, probe / peak)
                if relax[probe] != "infeasible":
                    hi = probe
                    break
                lo, stride = probe, 2 * stride
            while hi - lo > step:
                mid = (lo + hi) // 2
                relax[mid] = relax_solve(mid, mid / peak)
                if relax[mid] == "infeasible":
                    lo = mid
                else:
                    hi = mid  # a bound, or unknown: either way nothing is proven above mid
            # The 0/1 relaxation proves more than the LP where the LP's bound is near the limit.
            lo, hi = max([b for b, v in relax.items() if v == "infeasible"] + [lower - 1]), min_feasible
            for _ in range(mip_probes if relax_method == "lp" else 0):
                if hi - lo <= step:
                    break
                mid = (lo + hi) // 2
                relax[mid] = relax_solve(mid, mid / peak, method="mip")
                if relax[mid] == "infeasible":
                    lo = mid
                else:
                    hi = mid
    max_infeasible = max([b for b, v in relax.items() if v == "infeasible"] + [lower - 1])
    unresolved = tuple(sorted(b for b, v in relax.items() if v == "unknown" and b > max_infeasible
                              and (min_feasible is None or b < min_feasible)))
    frame = pd.DataFrame(rows, columns=COLUMNS).sort_values(["budget_bytes", "kind"], kind="stable")
    return Frontier(
        trace=trace.name, trace_hash=trace.content_hash, solver=solver, probe_solver=probe_solver,
        relax_method=relax_method, relax_status=relax_status, overhead_limit=overhead_limit,
        time_limit_s=time_limit_s, chain=chain, peak_bytes=peak, lower_bound_bytes=lower,
        min_feasible_bytes=min_feasible, min_feasible_source=source, max_infeasible_bytes=max_infeasible,
        unresolved_bytes=unresolved, stage_min_feasible_bytes=stage_min,
        stage_max_infeasible_bytes=max(stage_infeasible) if stage_infeasible else None,
        resolution_bytes=step, rows=frame.reset_index(drop=True), mip_probes=mip_probes,
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


def hole_budgets(trace: Trace, ratios, *, overhead_limit: float = DEFAULT_OVERHEAD_LIMIT, cache=True) -> list[int]:
    """The failing budgets of DTR's holes when sweeping ``ratios``: the lowest failing
    sample of each hole (the census of :func:`dtrlab.analysis.holes.find_holes`)."""
    from ..analysis.holes import find_holes
    from ..sweep import sweep

    frame = sweep(trace, "dtr", ratios=list(ratios), overhead_limit=overhead_limit, jobs=1, progress=False, cache=cache)
    return [int(b) for b in find_holes(frame).holes.fail_low_bytes]
