"""Every rematerialization system at the same byte budget: DTR, monotone(DTR), the knob, checkpointing plans,
and the exact solvers' bracket on the optimum (issue 44).

One unit: the flat peak in bytes of the step (the budget) and recompute in FLOPs from capture's
FLOP model, as overhead ``(compute + recompute) / compute`` with the plain step's compute. For a
trace (the plain step, ``dtrlab capture --cost flops``) and a budget grid, :func:`side_by_side`
returns one row per budget with

* ``dtr_*``, ``monotone_*``, ``knob_*``: :func:`dtrlab.analysis.knob_census.dtr_beside_knob`
  (DTR and monotone(DTR) simulated on the trace; the largest knob whose flat peak fits, from the
  knob census of the same step);
* ``ac_*``: the cheapest checkpointing plan whose recorded flat peak fits
  (:func:`dtrlab.analysis.checkpointing.cheapest_fitting` over :func:`~dtrlab.analysis.checkpointing.plan_table`);
* ``opt_lower`` / ``opt_upper``: the bracket on the least overhead any schedule of the trace can
  reach within the budget (:func:`bracket`), from a frontier (:func:`dtrlab.solvers.frontier.steps.compute_frontier`);
* ``best``: the system that fits with the least overhead (None when none fits), and each fitting
  system's ``*_above_lower``: its overhead minus ``opt_lower``, how far above the optimum it can be at most.

Limits: checkpointing plans and the knob's partitioned step are other schedules of the same
computation, recorded apart (their traces differ from the plain one by the recomputed operators
and, for the knob, aot_eager's graph); the bracket is on the plain trace. Their recompute is
counted in the same FLOP model, so overheads compare; a plan or the knob can land below
``opt_upper`` where the solvers found no schedule as good, never below ``opt_lower`` unless the
traces differ (then ``*_above_lower`` is negative and the table shows it).
"""

from __future__ import annotations

import math

import pandas as pd

from ..analysis.checkpointing import cheapest_fitting
from ..analysis.knob_census import KnobCensus, dtr_beside_knob
from ..trace.model import Trace
from .frontier.result import Frontier

#: The systems compared, in table order: the column prefix of each one's overhead and whether it fits.
SYSTEMS = ("dtr", "monotone", "knob", "ac")


def bracket(frontier: Frontier, budget: int) -> tuple[float, float]:
    """``(lower, upper)`` bounds on the least overhead of any schedule of the frontier's trace within ``budget``.

    Upper: the least overhead of a real run (a replayed solver schedule or a passing policy) whose budget
    is at most ``budget`` (a schedule that fits a smaller budget fits this one); inf when none.
    Lower: the largest proven bound at a budget at least ``budget`` (a larger budget can only be cheaper):
    a relaxation proved infeasible there gives inf, a relaxation bound its ``overhead_bound``; below the
    frontier's proven infeasible budget, inf; 1.0 (no recompute) when nothing is proven.
    """
    runs = [run.overhead for run in frontier.real_runs() if run.budget <= budget]
    upper = min(runs, default=math.inf)
    if budget <= frontier.max_infeasible_bytes:
        return math.inf, upper
    lower = 1.0
    relax = frontier.rows[(frontier.rows.kind == "relax") & (frontier.rows.budget_bytes >= budget)]
    for row in relax.itertuples():
        if row.status == "infeasible" and not row.fault:
            lower = math.inf
        elif row.status == "bound" and row.overhead_bound is not None and not math.isnan(row.overhead_bound):
            lower = max(lower, float(row.overhead_bound))
    return lower, upper


def side_by_side(trace: Trace, plans: pd.DataFrame, census: KnobCensus, frontier: Frontier, budgets,
                 execution=None) -> pd.DataFrame:
    """The comparison table (see the module docstring) at ``budgets`` (bytes) under the flat accounting."""
    table = dtr_beside_knob(census, trace, accounting="flat_peak", budgets=budgets, execution=execution)
    rows = []
    for row in table.to_dict("records"):
        budget = row["budget_bytes"]
        plan = cheapest_fitting(plans, budget)
        lower, upper = bracket(frontier, budget)
        row.update(ratio=budget / frontier.peak_bytes, ac_fits=plan is not None,
                   ac_plan=plan["plan"] if plan else None,
                   ac_recompute_flops=plan["recompute_flops"] if plan else math.nan,
                   ac_overhead=plan["overhead"] if plan else math.nan, opt_lower=lower, opt_upper=upper,
                   dtr_fits=row["dtr_status"] == "pass", monotone_fits=row["monotone_status"] == "pass")
        fitting = {name: row[f"{name}_overhead"] for name in SYSTEMS if row[f"{name}_fits"]}
        row["best"] = min(fitting, key=lambda name: (fitting[name], SYSTEMS.index(name))) if fitting else None
        for name in SYSTEMS:
            row[f"{name}_above_lower"] = row[f"{name}_overhead"] - lower if name in fitting and math.isfinite(lower) \
                else math.nan
        rows.append(row)
    return pd.DataFrame(rows)
