"""Allocator-census wall time: issue 10's census on the 8 DTR logs, every simulation timed.

    python benchmarks/bench_allocator_census.py [--logs ../shared/dtr-logs] [--jobs 2] [--only unet resnet32]

The census of issue 10: flat h_DTR (the reference for the threshold shift), then h_DTR, Coop
and dtr_fit under the caching allocator without and with expandable segments (the
``reserved`` semantics), at a 0.005 ratio step from 0.05 to 1.0 with refinement (every
pass/fail edge bisected to 0.001 of the baseline peak, suspicious samples probed), no
address-policy comparison. Runs :func:`dtrlab.analysis.allocator_census` one log at a time
on an empty result cache and without the shipped results (``DTRLAB_RECOMPUTE=1``), and
prints the wall time per log (the target is wall time on 2 cores; the sweep's worker processes
outlive each log, so their CPU time is not visible here), the number of simulations and the holes
per configuration, then the totals and the load average.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from dtrlab.sweep.execution import Execution

os.environ["DTRLAB_RECOMPUTE"] = "1"  # simulate everything: no shipped results (results/shipped/) either

from dtrlab.analysis.allocator_census import EXPANDABLE, Config, allocator_census  # noqa: E402
from dtrlab.runtime import FLAT  # noqa: E402
from bench_census import selected_logs  # noqa: E402  (beside this script)

#: Issue 10's configurations (the ``reserved`` semantics only).
ISSUE_10_CONFIGS = [Config("dtr", FLAT), *(Config(policy, "caching", options) for options in ({}, EXPANDABLE)
                                           for policy in ("dtr", "coop", "dtr_fit"))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--logs", default=str(Path(__file__).resolve().parent.parent.parent / "shared" / "dtr-logs"))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", nargs="+", metavar="NAME", help="logs whose name starts with one of these")
    args = parser.parse_args()

    traces = selected_logs(args.logs, args.only)
    if not traces:
        return 2
    print(f"{len(traces)} logs, {len(ISSUE_10_CONFIGS)} configurations, -j {args.jobs}, empty cache, "
          f"load average {os.getloadavg()[0]:.1f} at the start")
    total_wall, total_runs = 0.0, 0
    for name, trace in traces.items():
        with tempfile.TemporaryDirectory() as cache:
            started = time.perf_counter()
            census = allocator_census({name: trace}, ISSUE_10_CONFIGS,
                                      address_flips=(),
                                      execution=Execution(jobs=args.jobs, cache=cache, progress=False))
            wall = time.perf_counter() - started
        total_wall += wall
        total_runs += len(census.samples)
        holes = " ".join(f"{row.policy}@{row.memory}:{row.holes}" for row in census.table.itertuples())
        print(f"{name[:24]:24s} {wall:7.1f} s wall  runs {len(census.samples):5d}  holes {holes}", flush=True)
    print(f"total: {total_wall:.0f} s wall ({total_wall / 60:.1f} min), {total_runs} runs; "
          f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
