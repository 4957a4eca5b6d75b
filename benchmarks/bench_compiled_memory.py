"""The compiled core under memory models, as ratios measured side by side in one run.

Per log and ratio, under DTR:

(a) **caching, compiled over Python**: ``simulate(semantics=Semantics(memory="caching"), engine="python")`` (one run)
    against ``engine="compiled"`` (best of ``--repeats``). Target (issue 23): >= 20x, geometric
    mean over the 8 DTR logs.
(b) **caching over flat, both compiled**: the compiled caching run against the compiled flat run
    (best of ``--repeats`` each). Target: <= 3x. Where the outcomes differ (caching thrashes
    where flat passes, say) the two runs do different work; the statuses are printed, and the
    geometric mean is also given over the same-status runs alone.
(c) the same as (a) and (b) under ``enforce="allocated"`` with a device of 1.25x the budget.

The two engines' results must be equal (every field of the RunResult) before a time counts.
Times are CPU seconds of this process (``time.process_time``), which a shared machine disturbs
less than wall time.

    python benchmarks/bench_compiled_memory.py [--logs ../shared/dtr-logs] [--ratios 0.25,0.5,0.75]
                                               [--repeats 3] [--json rows.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from pathlib import Path

from bench_replay import timed  # best-of CPU and wall time, as the replay benchmark
from dtrlab import Semantics, load_log, simulate

ROOT = Path(__file__).resolve().parent.parent

SEMANTICS = {"reserved": {}, "allocated": {"enforce": "allocated", "device_capacity": "1.25x"}}


def geo(values) -> float:
    values = list(values)
    return statistics.geometric_mean(values) if values else math.nan


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--logs", type=Path, default=ROOT.parent / "shared" / "dtr-logs")
    parser.add_argument("--ratios", default="0.25,0.5,0.75")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    ratios = [float(r) for r in args.ratios.split(",")]
    logs = sorted(args.logs.glob("*.log"))
    if not logs:
        print(f"no *.log files in {args.logs}", file=sys.stderr)
        return 2
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    rows = []
    for path in logs:
        trace = load_log(path)
        for ratio in ratios:
            flat_time, _, flat = timed(lambda: simulate(trace, "dtr", ratio=ratio, engine="compiled"), args.repeats)
            for semantics, extra in SEMANTICS.items():
                options = Semantics(memory="caching", **extra)
                python_time, _, reference = timed(
                    lambda: simulate(trace, "dtr", ratio=ratio, engine="python", semantics=options), 1)
                compiled_time, _, result = timed(
                    lambda: simulate(trace, "dtr", ratio=ratio, engine="compiled", semantics=options), args.repeats)
                if result != reference:
                    raise SystemExit(f"{path.name} at {ratio} ({semantics}): the engines disagree")
                row = {"log": trace.name, "ratio": ratio, "semantics": semantics, "status": result.status,
                       "flat_status": flat.status, "python_s": python_time, "compiled_s": compiled_time,
                       "flat_s": flat_time, "over_python": python_time / compiled_time,
                       "over_flat": compiled_time / flat_time}
                rows.append(row)
                print(f"{trace.name[:28]:28} {ratio:5.2f} {semantics:9} {result.status:6} (flat {flat.status:6}) "
                      f"python {python_time:7.3f}s compiled {compiled_time:7.4f}s flat {flat_time:7.4f}s: "
                      f"{row['over_python']:6.1f}x over Python, {row['over_flat']:5.2f}x flat", flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    for semantics in SEMANTICS:
        chosen = [row for row in rows if row["semantics"] == semantics]
        same = [row for row in chosen if row["status"] == row["flat_status"]]
        print(f"{semantics}: compiled caching over Python caching, geometric mean "
              f"{geo(r['over_python'] for r in chosen):.1f}x; compiled caching over compiled flat "
              f"{geo(r['over_flat'] for r in chosen):.2f}x ({geo(r['over_flat'] for r in same):.2f}x over "
              f"{len(same)} same-status runs of {len(chosen)})")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
