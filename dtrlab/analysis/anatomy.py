"""The outcome at any overhead limit from one run without a limit, and the anatomy of holes.

**Why one run suffices.** The overhead limit enters a run only through the thrash
check: after every (re)materialization the simulator stops with ``thrash`` once the
integer recompute exceeds ``recompute_allowance(baseline compute, limit)``. Recompute
only grows, and a policy that does not read the limit decides the same at every
step whatever the limit, so a direct run at limit ``L`` is the run without a limit
cut at the first check where recompute exceeds ``L``'s allowance ``A``. Hence, for a
run without a limit that needed recompute ``r`` (to finish, or up to its OOM):

* it passed: the run at ``L`` passes (same clock, recompute, evictions) when ``r <= A``,
  else it thrashes;
* it ran out of memory: the run at ``L`` thrashes when ``r > A``, else it runs out of
  memory at the same step. Exact because every increment of recompute is checked
  before the next allocation: the OOM happens while freeing room for an operator
  *before* it is computed, so the unlimited run's ``r`` is the value of its last
  check (``A = r`` is an OOM, ``A = r - 1`` a thrash). Under ``enforce="allocated"``
  the eviction after an operator can OOM after its recompute was counted but before
  it was checked, so those OOMs are refused (:func:`outcome_at`).

A run at a finite limit ``L0`` is as good for every limit whose allowance is at least
``L0``'s when it passed or ran out of memory, and for every smaller allowance when
it thrashed.

Policies that read the limit decide differently under another limit and are refused:
:data:`LIMIT_READERS` (``monotone`` calibrates its envelope by simulating at the run's
limit). tests/test_anatomy.py checks the list against the source of every registered
policy and the equivalence against direct runs of every other policy.

**Anatomy of a hole** (:func:`hole_anatomy`), from the runs without a limit at a
hole's failing samples: ``oom`` when one of them runs out of memory (the hole stays
at every limit), else ``near-miss`` when the most recompute any of them needs is
within :data:`NEAR_MISS_MARGIN` of the census limit's allowance, else ``cliff`` when
it is at least :data:`CLIFF_MARGIN` above both passing neighbours' recompute, else
``limit``: the limit cuts through a gradual rise in recompute (the neighbours already
need most of the allowance). ``closes_at`` is the smallest limit at which every
failing sample passes (:func:`needed_limit`; infinite for ``oom``).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from ..policies import get_policy
from ..runtime import ALLOCATED, Intervention, Semantics, recompute_allowance
from ..sweep import SERIAL, Execution, sweep
from ..sweep.budget_sweep import resolve_trace
from .holes import Census, HoleCensus, with_memory_columns

#: Registered policies whose decisions read the overhead limit: ``monotone`` calibrates
#: with runs at the simulator's ``remat_limit`` (dtrlab/calibrated/monotone.py).
LIMIT_READERS = frozenset({"monotone"})

#: A hole is a ``near-miss`` when its failing samples need at most 10 % more recompute
#: than the limit allows: the mirror image of refine_holes' near miss (90 % of it).
NEAR_MISS_MARGIN = 0.10

#: A hole is a ``cliff`` when its failing samples need at least 1.5 times the recompute
#: of both passing neighbours: more memory should never cost more recompute, and a
#: jump of half again is far beyond the 2 % overhead spikes refine_holes already probes.
CLIFF_MARGIN = 0.5

#: Columns :func:`hole_anatomy` adds to a hole table.
ANATOMY_COLUMNS = ["anatomy", "needed_remat", "neighbour_remat", "needed_limit", "neighbour_limit", "closes_at"]

#: Columns of :func:`unlimited_runs`.
UNLIMITED_COLUMNS = ["budget_bytes", "status", "remat_compute", "clock", "overhead", "baseline_compute",
                     "overhead_limit"]

#: Columns of a sweep row that describe the run itself; :func:`outcomes_at` keeps them
#: only where the direct run at the derived limit is the same run.
RUN_COLUMNS = ["overhead", "clock", "evictions", "remats", "peak_memory", "remat_compute", "model_compute",
               "eviction_sha256", "wall_seconds", "fragmentation_evictions", "peak_reserved_bytes",
               "peak_allocated_bytes", "fragmentation_at_peak", "largest_free_block", "segments"]


def check_limit_blind(policy_name: str) -> None:
    """Refuse a policy whose decisions read the overhead limit (:data:`LIMIT_READERS`)."""
    if policy_name in LIMIT_READERS:
        raise ValueError(f"policy {policy_name!r} reads the overhead limit to decide, so a run at one limit says "
                         "nothing about another; simulate it at each limit (sweep(..., overhead_limit=L))")


def needed_limit(base_compute: int, remat: int) -> float:
    """The smallest overhead limit (a float) whose thrash allowance admits ``remat``:
    about ``1 + remat / base_compute``, nudged by ulps so that the simulator's own
    ``recompute_allowance`` (a floor of a float product) accepts it and the next
    smaller float does not. Infinite when only no limit does (zero baseline compute)."""
    if remat <= 0:
        return 1.0
    if base_compute <= 0:
        return math.inf
    limit = 1 + remat / base_compute
    while recompute_allowance(base_compute, limit) < remat:
        limit = math.nextafter(limit, math.inf)
    while limit > 1 and recompute_allowance(base_compute, below := math.nextafter(limit, -math.inf)) >= remat:
        limit = below
    return limit


def outcome_at(result, overhead_limit: float) -> str:
    """The status (``pass``, ``oom``, ``thrash``) a direct run at ``overhead_limit`` has,
    derived from ``result``: a :class:`~dtrlab.runtime.RunResult` or a sweep row, best
    simulated without a limit (``overhead_limit=math.inf``). See the module docstring
    for why it is exact; refuses policies that read the limit, OOMs under
    ``enforce="allocated"``, and limits the run cannot speak for."""
    record = _record(result)
    check_limit_blind(record["policy_name"])
    base, remat, status = record["baseline_compute"], record["remat_compute"], record["status"]
    allowance = recompute_allowance(base, overhead_limit)
    own = recompute_allowance(base, record["overhead_limit"])
    if status == "thrash":
        if allowance is not None and own is not None and allowance <= own:
            return "thrash"
        raise ValueError(f"a run that thrashed at overhead limit {record['overhead_limit']} cannot tell the outcome at "
                         f"{overhead_limit} (a larger allowance); simulate with overhead_limit=math.inf")
    if status == "oom" and record["enforce"] == ALLOCATED:
        raise ValueError("under enforce='allocated' an OOM can follow an operator's recompute before its thrash check, "
                         "so the recompute an OOM run records may never have been checked; simulate at each limit")
    if allowance is not None and remat > allowance:
        return "thrash"
    return status


def outcomes_at(frame: pd.DataFrame, limits) -> pd.DataFrame:
    """A sweep frame's rows at every limit of ``limits``: one copy of ``frame`` per limit
    with ``overhead_limit`` set and ``status`` derived by :func:`outcome_at`, plus
    ``needed_limit`` (:func:`needed_limit` of each run; infinite for an OOM). The
    columns of :data:`RUN_COLUMNS` are kept where the direct run is the same run (its
    status is the frame's and, for a thrash, at the same allowance) and blanked where
    it stops earlier. :func:`~dtrlab.analysis.holes.census_table` of the result is the
    census at every limit."""
    frame = with_memory_columns(frame)
    records = frame.to_dict("records")
    needed = [math.inf if r["status"] != "pass" else needed_limit(int(r["baseline_compute"]), int(r["remat_compute"]))
              for r in records]
    parts = []
    for limit in limits:
        statuses = [outcome_at(r, limit) for r in records]
        same = np.array([s == r["status"] and (s != "thrash" or recompute_allowance(int(r["baseline_compute"]), limit)
                                               == recompute_allowance(int(r["baseline_compute"]), r["overhead_limit"]))
                         for s, r in zip(statuses, records)], dtype=bool)
        part = frame.assign(overhead_limit=float(limit), status=statuses, needed_limit=needed)
        for column in RUN_COLUMNS:
            if column in part:
                part[column] = part[column].astype(object).where(same, None)
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def failing_budgets(census: HoleCensus) -> list[int]:
    """The budgets of every failing sample inside a hole of ``census``."""
    budgets = census.samples["budget_bytes"]
    inside = np.zeros(len(budgets), dtype=bool)
    for low, high in zip(census.holes["fail_low_bytes"], census.holes["fail_high_bytes"]):
        inside |= ((budgets >= low) & (budgets <= high)).to_numpy()
    return sorted(int(b) for b in budgets[inside])


def unlimited_runs(trace, census: HoleCensus, *, execution: Execution = SERIAL) -> pd.DataFrame:
    """The runs without a limit at the holes' failing samples only (a few budgets, not a
    census), under the census's policy (rebuilt from its ``policy_name`` and
    ``policy_params``), memory model, semantics and intervention: a frame with
    ``budget_bytes``, ``status``, ``remat_compute``, ``clock``, ``overhead``,
    ``baseline_compute`` and ``overhead_limit`` (inf). They go through
    :func:`~dtrlab.sweep.sweep` with ``overhead_limit=math.inf``, ``execution`` and its cache (such a
    run can recompute a hundred times the step's compute: an interrupted one resumes)."""
    first = census.samples.iloc[0]
    check_limit_blind(str(first["policy_name"]))
    policy = get_policy(str(first["policy_name"]), **json.loads(first["policy_params"] or "{}"))
    if policy.label != census.policy:
        raise ValueError(f"the census's policy {census.policy!r} is not rebuilt by its policy_params ({policy.label!r})")
    withhold = json.loads(first["withhold"]) if first["withhold"] else []
    semantics = Semantics.from_row(first).with_(overhead_limit=math.inf)
    budgets = failing_budgets(census)
    if not budgets:
        return pd.DataFrame(columns=UNLIMITED_COLUMNS)
    frame = sweep(resolve_trace(trace), policy, budgets=budgets, semantics=semantics,
                  intervention=Intervention(frozenset(withhold)) if withhold else None, execution=execution)
    return frame[UNLIMITED_COLUMNS].reset_index(drop=True)


def hole_anatomy(census: HoleCensus, unlimited: pd.DataFrame) -> pd.DataFrame:
    """``census.holes`` with :data:`ANATOMY_COLUMNS`, from ``unlimited``: runs without a
    limit at (at least) the holes' failing samples (:func:`unlimited_runs`).

    Per hole, ``needed_remat`` is the most recompute a failing sample needs without a
    limit (None when one runs out of memory), ``neighbour_remat`` the more of the two
    passing neighbours' recompute (they pass at the census limit, so it is their
    recompute at every limit); ``needed_limit``/``neighbour_limit`` are those as
    overhead limits (:func:`needed_limit`) and ``closes_at`` the smallest limit at which
    every failing sample passes (``needed_limit``; infinite for ``oom``). ``anatomy``:

    * ``oom``: some failing sample runs out of memory without a limit: it fails at any limit;
    * ``near-miss``: ``needed_remat <= (1 + NEAR_MISS_MARGIN) x`` the census limit's allowance;
    * ``cliff``: otherwise, ``needed_remat >= (1 + CLIFF_MARGIN) x neighbour_remat``;
    * ``limit``: otherwise (the neighbours already need most of the allowance).
    """
    samples = census.samples
    if samples.empty:
        return census.holes.assign(**{c: [] for c in ANATOMY_COLUMNS})
    first = samples.iloc[0]
    check_limit_blind(str(first.get("policy_name", census.policy.split("(")[0])))
    limit = float(first["overhead_limit"])
    base = int(first["baseline_compute"])
    allowance = recompute_allowance(base, limit)
    if not unlimited.empty and not np.isinf(unlimited["overhead_limit"].astype(float)).all():
        raise ValueError("hole_anatomy needs runs without a limit (overhead_limit=math.inf); see unlimited_runs")
    runs = unlimited.drop_duplicates("budget_bytes").set_index("budget_bytes") if not unlimited.empty else None
    by_budget = samples.set_index("budget_bytes")
    rows = []
    for hole in census.holes.itertuples(index=False):
        budgets = [int(b) for b in samples["budget_bytes"] if hole.fail_low_bytes <= b <= hole.fail_high_bytes]
        missing = [b for b in budgets if runs is None or b not in runs.index]
        if missing:
            raise ValueError(f"no run without a limit at the failing budgets {missing[:5]} (of {len(missing)}); "
                             "simulate them with unlimited_runs(trace, census)")
        failing = runs.loc[budgets]
        neighbour = int(max(by_budget.loc[hole.pass_below_bytes, "remat_compute"],
                            by_budget.loc[hole.pass_above_bytes, "remat_compute"]))
        row = {"needed_remat": None, "neighbour_remat": neighbour, "needed_limit": math.inf,
               "neighbour_limit": needed_limit(base, neighbour), "closes_at": math.inf}
        if (failing["status"] == "oom").any():
            row["anatomy"] = "oom"
        else:
            needed = int(failing["remat_compute"].max())
            row.update(needed_remat=needed, needed_limit=needed_limit(base, needed),
                       closes_at=needed_limit(base, needed))
            if allowance is not None and needed <= (1 + NEAR_MISS_MARGIN) * allowance:
                row["anatomy"] = "near-miss"
            elif needed >= (1 + CLIFF_MARGIN) * neighbour:
                row["anatomy"] = "cliff"
            else:
                row["anatomy"] = "limit"
        rows.append(row)
    return pd.concat([census.holes.reset_index(drop=True), pd.DataFrame(rows, columns=ANATOMY_COLUMNS)], axis=1)


def _record(result) -> dict:
    """The fields :func:`outcome_at` reads, from a RunResult or a sweep row (Series or dict)."""
    get = (lambda k, d=None: getattr(result, k, d)) if hasattr(result, "status") and not hasattr(result, "get") \
        else result.get
    label = str(get("policy"))
    name = get("policy_name") or label.split("(")[0]
    return {"status": get("status"), "remat_compute": int(get("remat_compute")),
            "baseline_compute": int(get("baseline_compute")), "overhead_limit": float(get("overhead_limit")),
            "policy_name": str(name), "enforce": get("enforce") or "reserved"}


def census_anatomy(census: Census, traces: dict, *, execution: Execution = SERIAL) -> pd.DataFrame:
    """``census.holes`` (a refined :func:`~dtrlab.analysis.holes.run_census`) with the anatomy of every hole
    (:data:`ANATOMY_COLUMNS`), from runs without a limit at its failing samples (:func:`unlimited_runs`, which
    refuses a policy that reads the limit). ``traces``: the census's traces by name."""
    if not census.refinements and len(census.holes):
        raise ValueError("the anatomy needs a refined census (run_census(..., refine=True))")
    tables = []
    for name, refinement in census.refinements.items():
        refined = refinement.refined
        if len(refined.holes):
            unlimited = unlimited_runs(traces[name], refined, execution=execution)
            tables.append(hole_anatomy(refined, unlimited)[["fail_low_bytes", *ANATOMY_COLUMNS]].assign(trace=name))
    if not tables:  # no refined trace has a hole, so neither has the census (its holes are the refined ones)
        return census.holes.assign(**{c: [] for c in ANATOMY_COLUMNS})
    return census.holes.merge(pd.concat(tables, ignore_index=True), on=["trace", "fail_low_bytes"], how="left")
