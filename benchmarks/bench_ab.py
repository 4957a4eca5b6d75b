"""This tree's compiled core against another checkout's, on the same simulations: equal results, speed ratio.

For work on the compiled core (``_core.c``, ``_regions_core.h``, ...): build the baseline
commit in a second checkout (``git worktree add /tmp/base HEAD~1`` then, there,
``python setup.py build_ext --inplace``) and run

    python benchmarks/bench_ab.py --baseline /tmp/base [--logs ../shared/dtr-logs]
        [--runs inceptionv4:0.2 lstm:0.22 ...] [--grid 0.05:1.0:0.01 --names inceptionv4 ...]
        [--policy dtr] [--memory flat] [--overhead-limit 5] [--repeats 3] [--rounds 2]

Each side runs in its own process (``PYTHONPATH`` set to its checkout), rounds interleaved
so that a change in the machine's load hits both. A run's time is its best CPU time over
``--repeats`` (``time.process_time``). Every RunResult of one side must equal the other's,
field by field, or the script stops with status 1: a faster core that decides differently is
a bug. ``--grid`` runs every ratio of a grid on the named logs (exactness over whole sweeps;
times summed per log). Ratios are baseline / this tree: above 1 is faster.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RUNS = ["inceptionv4:0.2", "inceptionv4:0.25", "lstm:0.22", "treelstm:0.1", "unroll_gan:0.2",
                "transformer:0.1", "tv_densenet121:0.15", "resnet32:0.2"]

# One side's process: load each log once, time each (log, ratio), print one JSON line per run.
WORKER = r"""
import dataclasses, inspect, json, sys, time
from dtrlab import load, simulate
policy, memory, limit, repeats, runs = json.loads(sys.argv[1])
if "semantics" in inspect.signature(simulate).parameters:  # a checkout with the Semantics value (issue 39)
    from dtrlab import Semantics
    options = {"semantics": Semantics(memory=memory, overhead_limit=limit)}
else:
    options = {"memory": memory, "overhead_limit": limit}
traces = {}
for name, ratio in runs:
    if name not in traces:
        traces[name] = load(name)
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        result = simulate(traces[name], policy, ratio=ratio, engine="compiled", **options)
        best = min(best, time.process_time() - start)
    fields = {key: repr(value) for key, value in dataclasses.asdict(result).items()}
    print(json.dumps({"log": name, "ratio": ratio, "seconds": best, "status": result.status, "result": fields}))
"""


def side(tree: Path, job: list) -> list[dict]:
    environment = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run([sys.executable, "-c", WORKER, json.dumps(job)], env=environment, cwd=tree,
                          capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"bench_ab: the run in {tree} failed:\n{done.stderr.strip()}")
    return [json.loads(line) for line in done.stdout.splitlines()]


def log_path(logs: Path, prefix: str) -> str:
    matches = sorted(p for p in logs.glob(f"{prefix}*") if p.name != "manifest.json")
    if not matches:
        raise SystemExit(f"bench_ab: no log in {logs} starts with {prefix!r}")
    return str(matches[0].resolve())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout with its extensions built")
    parser.add_argument("--logs", type=Path, default=ROOT.parent / "shared" / "dtr-logs",
                        help="a folder of DTR logs or of traces (traces/models)")
    parser.add_argument("--runs", nargs="+", default=DEFAULT_RUNS, help="LOG_PREFIX:RATIO ...")
    parser.add_argument("--grid", help="START:STOP:STEP, run on every log of --names")
    parser.add_argument("--names", nargs="+", help="log prefixes for --grid (default: every log of --logs)")
    parser.add_argument("--policy", default="dtr")
    parser.add_argument("--memory", default="flat")
    parser.add_argument("--overhead-limit", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if not (args.baseline / "dtrlab").is_dir():
        print(f"bench_ab: --baseline {args.baseline} is not a dtrlab checkout", file=sys.stderr)
        return 2
    if args.grid:
        try:
            start, stop, step = (float(x) for x in args.grid.split(":"))
        except ValueError:
            start = stop = step = 0.0
        if step <= 0 or stop < start:
            print(f"bench_ab: --grid {args.grid!r}: expected START:STOP:STEP with STEP > 0 and STOP >= START, "
                  "e.g. 0.05:1.0:0.01", file=sys.stderr)
            return 2
        ratios = [round(start + i * step, 6) for i in range(int(round((stop - start) / step)) + 1)]
        if not args.names:
            args.names = sorted(p.name for p in args.logs.iterdir() if p.is_file() and p.name != "manifest.json") \
                if args.logs.is_dir() else []
        if not args.names:
            print(f"bench_ab: --grid {args.grid!r}: no log in {args.logs}", file=sys.stderr)
            return 2
        runs = [(log_path(args.logs, name), ratio) for name in args.names for ratio in ratios]
    else:
        runs = []
        for run in args.runs:
            prefix, _, ratio = run.rpartition(":")
            try:
                runs.append((log_path(args.logs, prefix), float(ratio)))
            except ValueError:
                print(f"bench_ab: --runs {run!r}: expected LOG_PREFIX:RATIO, e.g. inceptionv4:0.2", file=sys.stderr)
                return 2
    job = [args.policy, args.memory, args.overhead_limit, args.repeats, runs]
    print(f"load average at start: {os.getloadavg()[0]:.1f}; {args.policy} under {args.memory}, "
          f"limit {args.overhead_limit}, {len(runs)} runs, best of {args.repeats}, {args.rounds} rounds")
    best = {"this": {}, "baseline": {}}
    for _ in range(args.rounds):
        for label, tree in (("this", ROOT), ("baseline", args.baseline.resolve())):
            for row in side(tree, job):
                key = (row["log"], row["ratio"])
                previous = best[label].get(key)
                if previous and previous["result"] != row["result"]:
                    raise SystemExit(f"bench_ab: {label} is not deterministic at {key}")
                if not previous or row["seconds"] < previous["seconds"]:
                    best[label][key] = row
    per_log: dict[str, list[float]] = {}
    for key, mine in best["this"].items():
        theirs = best["baseline"][key]
        if mine["result"] != theirs["result"]:
            differing = [k for k in mine["result"] if mine["result"][k] != theirs["result"][k]]
            raise SystemExit(f"bench_ab: the results differ at {Path(key[0]).name} {key[1]}: {differing}")
        times = per_log.setdefault(Path(key[0]).name[:24], [0.0, 0.0])
        times[0] += mine["seconds"]
        times[1] += theirs["seconds"]
        if not args.grid:
            print(f"{Path(key[0]).name[:24]:24} {key[1]:6.3f} {mine['status']:6} this {mine['seconds']:7.3f}s "
                  f"baseline {theirs['seconds']:7.3f}s: {theirs['seconds'] / max(mine['seconds'], 1e-9):5.2f}x")
    if args.grid:
        for name, (mine, theirs) in per_log.items():
            print(f"{name:24} {len(ratios)} ratios: this {mine:7.2f}s baseline {theirs:7.2f}s: {theirs / mine:5.2f}x")
    ratios_by_log = [theirs / mine for mine, theirs in per_log.values() if mine > 0]
    total_mine = sum(t[0] for t in per_log.values())
    total_theirs = sum(t[1] for t in per_log.values())
    print(f"all {len(best['this'])} results equal; geometric mean over logs "
          f"{statistics.geometric_mean(ratios_by_log) if ratios_by_log else math.nan:.2f}x, "
          f"total {total_theirs:.2f}s -> {total_mine:.2f}s ({total_theirs / total_mine:.2f}x)")
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
