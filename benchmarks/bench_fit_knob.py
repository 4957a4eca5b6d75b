"""What a first ``dtrlab.fit_knob`` pick costs against a full knob census, and whether they agree.

Two measurements:

* ``replay`` (default; no torch work, seconds): the pick's search
  (:func:`dtrlab.analysis.fit_knob.search_budget`) run on the knob -> peak curve of each shipped census
  (``results/shipped/knob/*/*.json``; every grid knob 0..1 every 0.01 is among its samples), at budgets
  spread between the model's smallest and largest peak. Per model: the evaluations the pick needs
  (each one is one torch partition plus replay, the unit of a census's cost) against the census's own,
  and whether the pick equals ``KnobCensus.knob_for_budget`` (what ``dtrlab knob --budget`` answers) on
  the grid: the largest grid knob that fits, when no grid knob above it fits again.
* ``--source SOURCE --budget 12GiB``: one real first pick (trace + evaluations), wall seconds, then the
  same call again (answered from the cache).

    python benchmarks/bench_fit_knob.py [--accounting allocated] [--budgets 9]
    python benchmarks/bench_fit_knob.py --source hf:gpt2 --batch 8 --seq 1024 --budget 12GiB
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from dtrlab.analysis.fit_knob import fit_knob, search_budget
from dtrlab.analysis.knob_census import KnobPlan, read_census
from dtrlab.memory.device import PEAK_ACCOUNTINGS

SHIPPED = Path(__file__).resolve().parents[1] / "results" / "shipped"


def replay(accounting: str, budgets: int, scan_step: float) -> None:
    grid = KnobPlan().grid()
    print(f"{'census':28} {'census evals':>12} {'pick evals (median, max)':>25} {'ratio':>6}  agrees on grid")
    for path in sorted((SHIPPED / "knob").glob("*/*.json")):
        census = read_census(path, manifest_dir=SHIPPED)
        knobs, peaks = census.curve(accounting)
        curve = dict(zip(knobs, peaks))
        low, high = min(peaks), max(peaks)
        counts, agree = [], 0
        for i in range(budgets):
            budget = low + (high - low) * i // (budgets - 1)
            calls = []
            found = search_budget(lambda k: calls.append(k) or {accounting: curve[k]}, budget, accounting, grid,
                                  scan_step)
            counts.append(len(calls))
            on_grid = [k for k in grid if curve[k] <= budget]
            agree += found.choice == (max(on_grid) if on_grid else None)
        print(f"{census.name:28} {len(knobs):12d} {statistics.median(counts):>14g}, {max(counts):<10d} "
              f"{statistics.median(counts) / len(knobs):6.3f}  {agree}/{budgets}")


def real_pick(args) -> None:
    options = {k: v for k, v in (("batch", args.batch), ("seq", args.seq), ("layers", args.layers)) if v}
    for attempt in ("first", "cached"):
        started = time.perf_counter()
        fit = fit_knob(args.source, options, budget=args.budget, accounting=args.accounting)
        print(f"{attempt}: {time.perf_counter() - started:.1f} s wall, {fit.evaluations} evaluations")
        print(fit.describe())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accounting", choices=tuple(PEAK_ACCOUNTINGS), default="allocated")
    parser.add_argument("--budgets", type=int, default=9, help="budgets per census in the replay (>= 2)")
    parser.add_argument("--scan-step", type=float, default=0.2,
                        help="search_budget's scan_step (default 0.2, fit_knob's SCAN_STEP)")
    parser.add_argument("--source", help="time one real pick on this model source instead")
    parser.add_argument("--budget", default="12GiB")
    parser.add_argument("--batch", type=int)
    parser.add_argument("--seq", type=int)
    parser.add_argument("--layers", type=int)
    args = parser.parse_args()
    if args.source:
        real_pick(args)
    else:
        replay(PEAK_ACCOUNTINGS[args.accounting], max(2, args.budgets), args.scan_step)


if __name__ == "__main__":
    main()
