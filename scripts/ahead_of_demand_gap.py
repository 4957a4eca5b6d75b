"""How much do schedules that recompute ahead of demand beat the on-demand optimum? (docs/solvers.md, "Scope")

    python scripts/ahead_of_demand_gap.py [--traces 200] [--seed 0] [--limits 2.0,1.5] [--out FILE.json]

Draws ``--traces`` tiny training steps (dtrlab.solvers.exhaustive's ``tiny_log`` with a seeded
``random.Random``), and at every budget from the footprint bound to the peak (one byte
apart) and every overhead limit computes, by exhaustive search, the least recompute of
an on-demand run (what the solvers and the relaxation model) and of a run that may also
recompute ahead of demand (any operator computed before, at any step: Checkmate's
schedules). It reports the rows and traces where ahead of demand is better (a smaller
recompute, or feasible where on demand is not) and by how much, and the rows where the
0/1 relaxation's bound is above the ahead-of-demand optimum or proves infeasible a budget
that an ahead-of-demand run fits: there its "proof" holds for on-demand runs only.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

from dtrlab.runtime import baseline
from dtrlab.solvers import build_problem
from dtrlab.solvers.exhaustive import least_recompute, tiny_log
from dtrlab.solvers.relax import solve_relaxation


def measure(traces: int, seed: int, limits: list[float]) -> dict:
    rng = random.Random(seed)
    rows = better_rows = feasible_only_ahead = relax_above = relax_false_infeasible = 0
    better_traces: set[int] = set()
    relax_traces: set[int] = set()
    gaps: list[int] = []  # on-demand minus ahead-of-demand recompute where both fit and differ
    relative: list[float] = []  # that gap over the on-demand recompute
    started = time.process_time()
    for index in range(traces):
        trace = tiny_log(rng.randint).trace(f"tiny{index}")
        lower, peak = build_problem(trace, chain=None).lower_bound(), baseline(trace).peak_memory
        base = baseline(trace).model_compute
        for limit in limits:
            for budget in range(lower, peak + 1):
                rows += 1
                on_demand = least_recompute(trace, budget, limit).recompute
                ahead = least_recompute(trace, budget, limit, ahead_of_demand=True).recompute
                if ahead is None:
                    continue
                if on_demand is None or ahead < on_demand:
                    better_rows += 1
                    better_traces.add(index)
                    if on_demand is None:
                        feasible_only_ahead += 1
                    else:
                        gaps.append(on_demand - ahead)
                        relative.append((on_demand - ahead) / on_demand)
                    bound = solve_relaxation(trace, budget, overhead_limit=limit, method="mip", time_limit_s=math.inf,
                                             workers=1, check_policies=())
                    if bound.status == "infeasible":
                        relax_false_infeasible += 1
                        relax_traces.add(index)
                    elif bound.status == "bound" and bound.bound > base + ahead + 1e-6 * max(1, base):
                        relax_above += 1
                        relax_traces.add(index)
    return {
        "traces": traces, "seed": seed, "limits": limits, "rows": rows,
        "rows_ahead_better": better_rows, "traces_ahead_better": len(better_traces),
        "rows_feasible_only_ahead": feasible_only_ahead,
        "recompute_gap": {"rows": len(gaps), "max": max(gaps, default=0),
                          "mean": sum(gaps) / len(gaps) if gaps else 0.0,
                          "max_relative": max(relative, default=0.0),
                          "mean_relative": sum(relative) / len(relative) if relative else 0.0},
        "relax_mip_bound_above_ahead_optimum_rows": relax_above,
        "relax_mip_infeasible_where_ahead_fits_rows": relax_false_infeasible,
        "relax_refuted_traces": len(relax_traces),
        "cpu_seconds": round(time.process_time() - started, 1),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limits", default="2.0,1.5", help="overhead limits, comma-separated (default 2.0,1.5)")
    parser.add_argument("--out", type=Path, help="also write the summary as JSON here")
    args = parser.parse_args(argv)
    try:
        limits = [float(x) for x in args.limits.split(",")]
    except ValueError:
        parser.error(f"--limits: expected numbers like 2.0,1.5, got {args.limits!r}")
    if args.traces < 1 or any(not limit >= 1 for limit in limits):
        parser.error("--traces must be >= 1 and every limit >= 1")
    summary = measure(args.traces, args.seed, limits)
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
