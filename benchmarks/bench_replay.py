"""Replay speed: dtrlab against simrd, side by side, on the same inputs.

One simulation per log at ratios 0.25, 0.5 and 0.75 under DTR. Each outcome is
checked to be identical (status, clock, eviction hash) before its time counts.

    python benchmarks/bench_replay.py [--logs ../shared/dtr-logs] [--simrd PATH/simrd] [--repeats 3]

``--simrd`` names a checkout of simrd (the folder holding the ``simrd`` package, from
uwsampl/dtr-prototype; it is not part of dtrlab). Without it, the baseline is
dtrlab's own pure-Python region index, measured in the same run. Times are the best
of ``--repeats`` runs for dtrlab and one run for simrd (minutes per log).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dtrlab import load_log, simulate  # noqa: E402
from dtrlab.analysis.simrd_bridge import load_simrd, run_simrd  # noqa: E402

RATIOS = (0.25, 0.5, 0.75)


def best_time(function, repeats: int):
    best, result = math.inf, None
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--logs", default=str(Path(__file__).resolve().parent.parent.parent / "shared" / "dtr-logs"))
    parser.add_argument("--simrd", help="path of the folder holding simrd's `simrd` package")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the per-run rows to this file")
    args = parser.parse_args()

    logs = sorted(Path(args.logs).glob("*.log"))
    if not logs:
        print(f"no .log files in {args.logs}; pass --logs DIR", file=sys.stderr)
        return 2
    simrd = load_simrd(args.simrd) if args.simrd else None
    baseline_name = "simrd" if simrd else "dtrlab pure-Python regions"
    rows = []
    for log_path in logs:
        trace = load_log(log_path)
        for ratio in RATIOS:
            fast_seconds, fast = best_time(lambda: simulate(trace, "dtr", ratio=ratio, regions="c"), args.repeats)
            if simrd:
                outcome = run_simrd(simrd, log_path, "DTR", budget_bytes=fast.budget_bytes)
                base_seconds = outcome.seconds
                reference = {"status": outcome.status, "clock": outcome.clock, "sha": outcome.eviction_sha256}
            else:
                base_seconds, slow = best_time(lambda: simulate(trace, "dtr", ratio=ratio, regions="python"), 1)
                reference = {"status": slow.status, "clock": slow.clock, "sha": slow.eviction_sha256}
            mine = {"status": fast.status, "clock": fast.clock, "sha": fast.eviction_sha256}
            if mine != reference:
                print(f"OUTCOMES DIFFER on {trace.name} at {ratio}: {mine} vs {reference}", file=sys.stderr)
                return 1
            rows.append({"log": trace.name, "ratio": ratio, "status": fast.status, "dtrlab_s": fast_seconds,
                         "baseline_s": base_seconds, "speedup": base_seconds / fast_seconds})
            print(f"{trace.name[:28]:28s} {ratio:5.2f} {fast.status:6s} dtrlab {fast_seconds:8.3f} s  "
                  f"{baseline_name} {base_seconds:8.3f} s  x{base_seconds / fast_seconds:6.1f}", flush=True)

    print(f"\nspeed-up against {baseline_name} (same run, identical outcomes), geometric mean over ratios:")
    per_log = {}
    for row in rows:
        per_log.setdefault(row["log"], []).append(row["speedup"])
    for log, speedups in per_log.items():
        print(f"  {log[:40]:40s} x{statistics.geometric_mean(speedups):6.1f}")
    print(f"  {'all logs (geometric mean)':40s} x{statistics.geometric_mean([r['speedup'] for r in rows]):6.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
