"""Census wall time: the 8-log DTR census at delta = peak/1000 (951 budgets from 0.05 to 1.0 each).

    python benchmarks/bench_census.py [--logs ../shared/dtr-logs] [--jobs 1 2] [--only unet resnet32]

For each ``--jobs`` value, runs ``run_census(..., ratios="0.05:1.0", delta=0.001)``
(grid sweep, fill, bisection of every edge) on an empty result cache and without the
shipped results (``DTRLAB_RECOMPUTE=1``), so every simulation is timed, and prints the
wall time per log and in total, the census (holes, widest hole, largest gap between
samples) and whether the census reports
every hole of the plain 0.001 sweep (its grid is that sweep's budgets: each plain
hole must sit inside exactly one refined hole). ``--plain DIR`` also checks against
sweep frames saved by ``dtrlab sweep LOG --ratios 0.05:1.0:0.001 --out DIR/NAME.parquet``
(NAME: the log's file name up to its first dash).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from dtrlab.sweep.execution import Execution

os.environ["DTRLAB_RECOMPUTE"] = "1"  # simulate everything: no shipped results (results/shipped/) either

import pandas as pd  # noqa: E402

from dtrlab.analysis.holes import MIB, find_holes, run_census  # noqa: E402
from dtrlab.trace import load_directory  # noqa: E402

DELTA = 0.001


def missed_holes(plain: pd.DataFrame, refined: pd.DataFrame) -> int:
    """Plain-sweep holes not inside exactly one refined hole."""
    return sum(((refined.fail_low_bytes <= hole.fail_low_bytes) & (refined.fail_high_bytes >= hole.fail_high_bytes)
                ).sum() != 1 for hole in plain.itertuples())


def selected_logs(logs: str, only: list[str] | None) -> dict:
    """The logs of directory ``logs`` whose name starts with one of ``only`` (all without it); none,
    after a one-line message on stderr, when there is no such directory or log."""
    traces = load_directory(logs) if Path(logs).is_dir() else {}
    if only:
        traces = {name: trace for name, trace in traces.items() if name.startswith(tuple(only))}
    if not traces:
        print(f"no logs in {logs} (matching {only})", file=sys.stderr)
    return traces


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--logs", default=str(Path(__file__).resolve().parent.parent.parent / "shared" / "dtr-logs"))
    parser.add_argument("--jobs", type=int, nargs="+", default=[2])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="logs whose name starts with one of these")
    parser.add_argument("--plain", metavar="DIR", help="saved plain 0.001 sweeps to compare with")
    args = parser.parse_args()

    traces = selected_logs(args.logs, args.only)
    if not traces:
        return 2
    for jobs in args.jobs:
        total, all_found = 0.0, True
        print(f"\n-j {jobs}: {len(traces)} logs, delta = {DELTA} x peak, empty cache")
        for name, trace in traces.items():
            with tempfile.TemporaryDirectory() as cache:
                started = time.perf_counter()
                census = run_census({name: trace}, "dtr", ratios="0.05:1.0", delta=DELTA,
                                    execution=Execution(jobs=jobs, cache=cache, progress=False))
                seconds = time.perf_counter() - started
            total += seconds
            refinement = census.refinements[name]
            refined = refinement.refined.holes
            missed = missed_holes(refinement.grid.holes, refined)
            if args.plain:
                saved = Path(args.plain) / f"{name.split('-')[0]}.parquet"
                if saved.is_file():
                    missed += missed_holes(find_holes(pd.read_parquet(saved)).holes, refined)
            all_found &= missed == 0
            widest = refinement.refined.widest
            print(f"{name[:24]:24s} {seconds:7.1f} s  runs {len(refinement.refined.samples):5d}  "
                  f"failures {refinement.grid.failures:4d}  non-monotone {refinement.grid.non_monotone_failures:3d}  "
                  f"plain holes {len(refinement.grid.holes):2d}  census holes {len(refined):2d}  "
                  f"widest {'' if widest is None else f'{widest.fail_low_ratio:.4f}-{widest.fail_high_ratio:.4f} '}"
                  f"{'' if widest is None else f'{widest.width_bytes / MIB:.2f} MiB'}  "
                  f"max gap {refinement.refined.max_gap_bytes / MIB:.2f} MiB  missed {missed}", flush=True)
        print(f"total -j {jobs}: {total:.0f} s ({total / 60:.1f} min); every plain-sweep hole reported: {all_found}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
