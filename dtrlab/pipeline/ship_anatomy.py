"""Run the limit census (dtrlab.analysis.limit_census) and ship its tables in results/shipped/anatomy/.

    dtrlab ship anatomy ../shared/dtr-logs --policies dtr lru --limits 1.25 1.5 2 3 5
    dtrlab ship anatomy traces/models --policies twophase --ratios 0.05:1.0:0.001
    dtrlab ship anatomy traces --memories caching --enforce allocated   # the DTR prototype's semantics
    dtrlab ship anatomy ../shared/dtr-logs --census   # the anatomy of notebook 02's census at 2.0

Per trace set (the directory's name: ``dtr-logs``, ``traces``, ``models``) it writes
``SET-table.csv`` (one row per trace, policy, memory model and limit), ``SET-holes.csv`` (every
hole at every limit with its anatomy) and ``SET-samples.csv.gz`` (every budget's outcome at every
limit), then records them in ``results/shipped/MANIFEST.json``, where ``read_anatomy_table`` checks
them. Rows of the (trace, policy, memory, ratios) configurations already shipped are replaced, the
others kept, so a set is shipped policy by policy. Runs go through the sweep cache (``--cache``, default
``$DTRLAB_CACHE`` or ``~/.cache/dtrlab``): an interrupted run resumes. ``SET-timing.csv`` records each
configuration's wall and CPU seconds on this machine (0 when its runs were cached).

``--census`` classifies the holes of notebook 02's census instead (the README's numbers: the range
0.05-1.0 sampled every 0.001 of the peak, edges bisected to 1e-4 of it, at the limit 2.0; its runs are
shipped): ``SET-census-holes.csv``, each hole with its anatomy and the limit at which it closes, from
runs without a limit at its failing samples (:func:`~dtrlab.analysis.anatomy.unlimited_runs`).
"""

from __future__ import annotations

import gzip
import math
import os
import sys
import time
from pathlib import Path

import pandas as pd
from dtrlab.runtime.semantics import Semantics
from dtrlab.sweep.execution import Execution

from .. import calibrated  # noqa: F401  (registers monotone)
from ..analysis.anatomy import hole_anatomy, unlimited_runs
from ..analysis.holes import census_grid, refine_holes
from ..analysis.limit_census import SHIPPED_ANATOMY, limit_census
from ..integrity import atomic_write_bytes, write_manifest
from ..memory.device import device_capacity
from ..policies import get_policy
from ..runtime import ALLOCATED, RESERVED, SEMANTICS, baseline
from ..sweep import sweep
from ..sweep.shipped import DEFAULT_SHIPPED_DIR
from ..trace import load_directory

KEY = ["trace", "policy", "memory", "ratios"]


def merge_write(path: Path, new: pd.DataFrame) -> None:
    """Replace ``path``'s rows of ``new``'s configurations by ``new`` (atomically)."""
    if path.exists():
        old = pd.read_csv(path)
        configs = set(map(tuple, new[KEY].astype(str).to_numpy()))
        keep = [tuple(row) not in configs for row in old[KEY].astype(str).to_numpy()]
        new = pd.concat([old[keep], new], ignore_index=True)
    data = new.to_csv(index=False, float_format="%.10g").encode()
    atomic_write_bytes(path, gzip.compress(data, mtime=0) if path.suffix == ".gz" else data)


def shipped_samples(result) -> pd.DataFrame:
    """The samples worth shipping: a limit-blind policy's at its sweep's limit only (every budget run for any
    limit, whose ``needed_limit`` and ``sweep_status`` give the outcome at every limit), a policy swept at each
    limit (monotone) at every limit."""
    samples = result.samples.merge(result.table[["trace", "policy", "memory", "limit", "sweep_limit"]])
    derived = samples["sweep_limit"] == samples.groupby(["trace", "policy", "memory"])["limit"].transform("max")
    direct = samples["sweep_limit"] == samples["limit"]
    keep = (derived & (samples["limit"] == samples["sweep_limit"])) | (direct & ~derived)
    return samples[keep].drop(columns=["sweep_limit", "remat_compute", "baseline_compute"])


def census_anatomy(traces: dict, args, name: str, manifest_dir: Path) -> int:
    """``--census``: notebook 02's census of each trace (its default parameters), its holes classified."""
    path = args.output / f"{name}-census-holes.csv"
    for trace_name, trace in traces.items():
        for policy in args.policies:
            wall, cpu = time.perf_counter(), time.process_time()
            execution = Execution(jobs=args.jobs, progress=False)
            frame = sweep(trace, policy, **census_grid(trace, "0.05:1.0:0.005", 0.001), execution=execution)
            census = refine_holes(trace, frame, policy, delta=0.001,
                                  resolution=max(1, int(baseline(trace).peak_memory * 1e-4)),
                                  execution=execution).refined
            holes = hole_anatomy(census, unlimited_runs(trace, census, execution=execution))
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            merge_write(path, holes.assign(trace=trace_name, policy=census.policy, memory="flat",
                                           ratios="0.05:1.0 delta 0.001", wall_seconds=round(wall, 1),
                                           cpu_seconds=round(cpu, 1)) if len(holes) else
                        pd.DataFrame([{"trace": trace_name, "policy": census.policy, "memory": "flat",
                                       "ratios": "0.05:1.0 delta 0.001", "wall_seconds": round(wall, 1),
                                       "cpu_seconds": round(cpu, 1)}]))
            write_manifest(manifest_dir, [path])
            print(f"dtrlab ship anatomy: {name} {trace_name} {policy} census: {len(holes)} holes "
                  f"{holes['anatomy'].value_counts().to_dict() if len(holes) else {}}; {wall:.0f} s wall, "
                  f"{cpu:.0f} s CPU", flush=True)
    return 0


def add_arguments(parser) -> None:
    """The options of ``dtrlab ship anatomy``."""
    parser.add_argument("traces", type=Path, help="directory of traces (a trace set)")
    parser.add_argument("--policies", nargs="+", default=["dtr"])
    parser.add_argument("--memories", nargs="+", default=["flat"])
    parser.add_argument("--limits", nargs="+", type=float, default=[1.25, 1.5, 2, 3, 5, math.inf])
    parser.add_argument("--ratios", default="0.05:1.0:0.005")
    parser.add_argument("--enforce", choices=SEMANTICS, default=RESERVED,
                        help="runtime semantics (allocated: the DTR prototype's; every limit swept directly, "
                             "rows labelled MODEL/allocated)")
    parser.add_argument("--device-capacity", help="the device under --enforce allocated (default: unlimited, as "
                                                  "in dtrlab.sweep; rows then labelled MODEL/allocated(DEVICE))")
    parser.add_argument("--only", nargs="+", metavar="PREFIX", help="only the traces whose name starts so")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--cache", type=Path, help="sweep cache directory")
    parser.add_argument("--output", type=Path, default=SHIPPED_ANATOMY)
    parser.add_argument("--census", action="store_true",
                        help="classify the holes of notebook 02's census (delta 0.001, limit 2.0) instead")


def ship(args, parser) -> int:
    """``dtrlab ship anatomy``: configuration by configuration, each shipped as it finishes."""
    if not args.traces.is_dir():
        parser.error(f"{args.traces} is not a directory of traces")
    try:  # a typo is an error now, not after an hour of runs
        names = [get_policy(policy).name for policy in args.policies]
    except (KeyError, ValueError) as exc:
        parser.error(str(exc).strip("'\""))
    if "monotone" in names and set(args.memories) - {"flat"}:  # its start() refuses, in a worker, much later
        parser.error("monotone runs under flat memory only (its replay argument needs byte counting); "
                     "give it its own --memories flat run")
    if "monotone" in names and args.enforce != RESERVED:
        parser.error("monotone runs under the reserved semantics only; give it its own run without --enforce")
    if args.device_capacity is not None and args.enforce != ALLOCATED:
        parser.error("--device-capacity is the device of --enforce allocated")
    try:
        device_capacity(args.device_capacity)
    except ValueError as exc:
        parser.error(f"--device-capacity: {exc}")
    if args.cache:
        os.environ["DTRLAB_CACHE"] = str(args.cache)
    name = args.traces.resolve().name
    traces = {n: t for n, t in load_directory(args.traces).items() if not args.only or n.startswith(tuple(args.only))}
    args.output.mkdir(parents=True, exist_ok=True)
    bundle = DEFAULT_SHIPPED_DIR.resolve()
    manifest_dir = bundle if args.output.resolve().is_relative_to(bundle) else args.output
    if args.census:
        return census_anatomy(traces, args, name, manifest_dir)
    paths = {suffix: args.output / f"{name}-{suffix}" for suffix in ("table.csv", "holes.csv", "samples.csv.gz",
                                                                      "timing.csv")}
    for trace_name, trace in traces.items():
        for policy in args.policies:
            for memory in args.memories:
                wall, cpu = time.perf_counter(), time.process_time()
                result = limit_census({trace_name: trace}, [policy], [memory], args.limits, ratios=args.ratios,
                                      semantics=Semantics(enforce=args.enforce, device_capacity=args.device_capacity),
                                      execution=Execution(jobs=args.jobs, progress=False))
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                config = {"ratios": args.ratios}
                label = result.table["memory"].iloc[0]  # MODEL, or MODEL/allocated
                timing = pd.DataFrame([{
                    "trace": trace_name, "policy": result.table["policy"].iloc[0], "memory": label, **config,
                    "limits": " ".join(map(str, args.limits)), "wall_seconds": round(wall, 1),
                    "cpu_seconds": round(cpu, 1), "jobs": args.jobs}])
                # Shipped configuration by configuration, so that an interrupted run keeps what it finished.
                for suffix, frame in (("table.csv", result.table), ("holes.csv", result.holes),
                                      ("samples.csv.gz", shipped_samples(result)), ("timing.csv", timing)):
                    merge_write(paths[suffix], frame.assign(**config))
                write_manifest(manifest_dir, list(paths.values()))
                print(f"dtrlab ship anatomy: {name} {trace_name} {policy} {label}: {wall:.0f} s wall, {cpu:.0f} s CPU; "
                      f"holes by limit {dict(zip(result.table['limit'], result.table['holes']))}", flush=True)
    print(f"dtrlab ship anatomy: wrote {', '.join(str(p) for p in paths.values())}")
    return 0


def run(args, parser) -> int:
    """:func:`ship`, with Ctrl-C (or ``timeout -s INT``) one line and status 130: the configurations finished
    are shipped, and the runs of the one under way are in the sweep cache, so the same command resumes."""
    try:
        return ship(args, parser)
    except KeyboardInterrupt:
        print("dtrlab ship anatomy: interrupted; the configurations finished are shipped, the runs of the one "
              "under way are cached (run the same command again to resume)", file=sys.stderr)
        return 130
