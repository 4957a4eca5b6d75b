"""Sweep throughput by backend: one 191-ratio DTR sweep (0.05:1.0:0.005) per log, no cache.

    python benchmarks/bench_sweep.py [--logs traces] [--jobs 2] [--dask]

Prints wall seconds per backend and checks every backend returns the same frame
(wall-seconds column aside). Worker start-up is included, as a user would see it.
"""

from __future__ import annotations

import argparse
import time

from dtrlab.sweep import sweep
from dtrlab.sweep.execution import Execution
from dtrlab.trace import load

RATIOS = "0.05:1.0:0.005"


def timed(trace, **options):
    start = time.perf_counter()
    frame = sweep(trace, "dtr", ratios=RATIOS, execution=Execution(cache=False, progress=False, **options))
    return time.perf_counter() - start, frame.drop(columns="wall_seconds")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", default="traces", help="log file or directory (default traces/)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--dask", action="store_true", help="also time a LocalCluster with --jobs workers")
    args = parser.parse_args()
    traces = load(args.logs)
    traces = traces if isinstance(traces, dict) else {traces.name: traces}
    client = None
    if args.dask:
        from distributed import Client, LocalCluster
        client = Client(LocalCluster(n_workers=args.jobs, threads_per_worker=1, processes=True,
                                     dashboard_address=None))
    print(f"{'trace':<40} {'sequential':>11} {'loky':>8} {'dask':>8}")
    for name, trace in traces.items():
        sequential, reference = timed(trace, backend="sequential")
        loky, frame = timed(trace, jobs=args.jobs)
        assert frame.equals(reference), f"loky differs from sequential on {name}"
        dask = float("nan")
        if client is not None:
            dask, frame = timed(trace, client=client)
            assert frame.equals(reference), f"dask differs from sequential on {name}"
        print(f"{name[:40]:<40} {sequential:>10.1f}s {loky:>7.1f}s {dask:>7.1f}s")
    if client is not None:
        client.close()


if __name__ == "__main__":
    main()
