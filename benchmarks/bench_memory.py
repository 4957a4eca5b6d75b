"""Cost of the memory-model layer, as ratios measured side by side in one run.

(a) **Flat path.** The simulator before the memory-model layer (loaded from git, by
    default the parent of the first commit that gave the simulator a memory model)
    against today's, both with the default flat byte counter, on the same traces,
    policy and ratios, interleaved and best of ``--repeats``. Outcomes must be
    identical (status, clock, eviction hash) before a time counts. Target: today's
    flat path at most 5% slower.
(b) **Caching model.** The same Python simulator with ``memory="caching"`` against
    flat on the same budgets (the compiled replay core serves flat runs only, so the
    Python flat run is the comparison that isolates the model's cost). Target: at most
    3x the flat run time. A run whose outcome differs (e.g. caching thrashes where flat
    passes) does different work; the status of both is printed.

    python benchmarks/bench_memory.py [--logs ../shared/dtr-logs] [--ratios 0.25,0.5,0.75] [--repeats 3]
                                      [--before REV] [--json rows.json]

Timings on a shared machine are noisy; the two sides of every ratio run back to
back, so the ratio is what to read, not the seconds.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dtrlab import load_log
from dtrlab.memory import available_memory_models, get_memory_model
from dtrlab.policies import get_policy
from dtrlab.runtime import baseline, budget_for
from dtrlab.runtime.simulator import Simulator

ROOT = Path(__file__).resolve().parent.parent


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def simulator_before(rev: str | None):
    """The Simulator class of ``dtrlab/runtime/simulator.py`` at ``rev``, as a module of dtrlab.runtime."""
    if rev is None:
        first = git("log", "--reverse", "--format=%H", "-S", "memory_model", "--", "dtrlab/runtime/simulator.py")
        if not first:
            raise SystemExit("no commit gives the simulator a memory model yet; pass --before REV")
        rev = first.splitlines()[0] + "^"
    source = git("show", f"{rev}:dtrlab/runtime/simulator.py")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as file:
        file.write(source)
    spec = importlib.util.spec_from_file_location("dtrlab.runtime._simulator_before", file.name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)  # relative imports resolve in dtrlab.runtime
    return git("rev-parse", "--short", rev), module.Simulator


def replay(simulator_class, trace, budget: int, remat_limit: float, **memory):
    sim = simulator_class(trace, get_policy("dtr"), budget, remat_limit, **memory)
    status = sim.run()
    return status, sim.clock, tuple(sim.evicted)


def best_time(function, repeats: int):
    best, result = math.inf, None
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--logs", default=str(ROOT.parent / "shared" / "dtr-logs"))
    parser.add_argument("--ratios", default="0.25,0.5,0.75")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", help="git revision of the simulator to compare with (default: see above)")
    parser.add_argument("--json", help="also write the per-run rows to this file")
    args = parser.parse_args()

    logs = sorted(Path(args.logs).glob("*.log"))
    if not logs:
        print(f"no .log files in {args.logs}; pass --logs DIR", file=sys.stderr)
        return 2
    ratios = [float(r) for r in args.ratios.split(",")]
    rev, Before = simulator_before(args.before)
    caching = "caching" in available_memory_models()
    rows = []
    for log_path in logs:
        trace = load_log(log_path)
        remat_limit = baseline(trace).model_compute  # overhead limit 2.0, as simulate's default
        for ratio in ratios:
            budget = budget_for(trace, ratio)
            before_s, before = best_time(lambda: replay(Before, trace, budget, remat_limit), args.repeats)
            after_s, after = best_time(lambda: replay(Simulator, trace, budget, remat_limit), args.repeats)
            if before != after:
                print(f"OUTCOMES DIFFER on {trace.name} at {ratio}", file=sys.stderr)
                return 1
            row = {"log": trace.name, "ratio": ratio, "status": after[0], "before_s": before_s, "flat_s": after_s,
                   "flat_ratio": after_s / before_s}
            line = f"{trace.name[:28]:28s} {ratio:5.2f} {after[0]:6s} flat/before {after_s / before_s:6.3f}"
            if caching:
                caching_s, run = best_time(lambda: replay(Simulator, trace, budget, remat_limit,
                                                          memory_model=get_memory_model("caching", budget)),
                                           args.repeats)
                row.update(caching_s=caching_s, caching_ratio=caching_s / after_s, caching_status=run[0])
                line += f"  caching/flat {caching_s / after_s:6.2f} ({run[0]})"
            rows.append(row)
            print(line, flush=True)

    print(f"\nflat path against the simulator at {rev} (identical outcomes): geometric mean "
          f"{statistics.geometric_mean([r['flat_ratio'] for r in rows]):.3f}, "
          f"max {max(r['flat_ratio'] for r in rows):.3f} (target <= 1.05)")
    if caching:
        print(f"caching model against flat (Python simulator, all runs): geometric mean "
              f"{statistics.geometric_mean([r['caching_ratio'] for r in rows]):.2f}, "
              f"max {max(r['caching_ratio'] for r in rows):.2f} (target <= 3)")
        same = [r["caching_ratio"] for r in rows if r["caching_status"] == r["status"]]
        if same:
            print(f"  over the {len(same)} runs with the same status under both: geometric mean "
                  f"{statistics.geometric_mean(same):.2f}, max {max(same):.2f}")
    else:
        print("no caching model registered yet: (b) not measured")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
