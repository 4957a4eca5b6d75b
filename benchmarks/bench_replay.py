"""Replay speed per simulation: dtrlab's compiled core against simrd and against dtrlab's Python path.

One simulation per log at ratios 0.25, 0.5 and 0.75 under DTR, each measured side by
side in this one process: ``simulate(..., engine="compiled")`` (best of ``--repeats``),
``simulate(..., engine="python")`` (the readable reference simulator, one run) and,
with ``--simrd``, simrd's own replay (one run; the budgeted replay alone, not its log
parsing or baseline). Every outcome (status, clock, eviction hash) must be identical
on all paths before its time counts.

Times are CPU seconds of this process (``time.process_time``), which a shared machine
disturbs less than wall time; wall-time ratios are printed beside them.

    python benchmarks/bench_replay.py [--logs ../shared/dtr-logs] [--simrd PATH/simrd] [--repeats 3]

``--simrd`` names the folder holding simrd's ``simrd`` package (uwsampl/dtr-prototype;
it is not part of dtrlab).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from dtrlab import load_log, simulate
from dtrlab.analysis.simrd_bridge import load_simrd, run_simrd

RATIOS = (0.25, 0.5, 0.75)


def timed(function, repeats: int):
    """(best CPU seconds, best wall seconds, result) over ``repeats`` calls."""
    cpu = wall = math.inf
    result = None
    for _ in range(repeats):
        start_wall, start_cpu = time.perf_counter(), time.process_time()
        result = function()
        cpu = min(cpu, time.process_time() - start_cpu)
        wall = min(wall, time.perf_counter() - start_wall)
    return cpu, wall, result


def outcome(result) -> dict:
    return {"status": result.status, "clock": result.clock, "sha": result.eviction_sha256}


def geometric_means(rows: list[dict], key: str) -> dict[str, float]:
    per_log: dict[str, list[float]] = {}
    for row in rows:
        per_log.setdefault(row["log"], []).append(row[key])
    means = {log: statistics.geometric_mean(values) for log, values in per_log.items()}
    means["all logs"] = statistics.geometric_mean([row[key] for row in rows])
    return means


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--logs", default=str(Path(__file__).resolve().parent.parent.parent / "shared" / "dtr-logs"))
    parser.add_argument("--only", nargs="*", default=(), help="log name prefixes to keep (default: all)")
    parser.add_argument("--simrd", help="path of the folder holding simrd's `simrd` package")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the per-run rows to this file")
    args = parser.parse_args()

    logs = sorted(p for p in Path(args.logs).glob("*.log") if not args.only or p.name.startswith(tuple(args.only)))
    if not logs:
        print(f"no .log files in {args.logs}; pass --logs DIR", file=sys.stderr)
        return 2
    simrd = load_simrd(args.simrd) if args.simrd else None
    rows = []
    for log_path in logs:
        trace = load_log(log_path)
        simulate(trace, "dtr", ratio=0.5)  # warm the per-trace caches (baseline, flattened arrays)
        for ratio in RATIOS:
            fast_cpu, fast_wall, fast = timed(lambda: simulate(trace, "dtr", ratio=ratio, engine="compiled"),
                                              args.repeats)
            slow_cpu, slow_wall, slow = timed(lambda: simulate(trace, "dtr", ratio=ratio, engine="python"), 1)
            row = {"log": trace.name, "ratio": ratio, "status": fast.status, "compiled_cpu_s": fast_cpu,
                   "compiled_wall_s": fast_wall, "python_cpu_s": slow_cpu, "python_wall_s": slow_wall,
                   "vs_python": slow_cpu / fast_cpu}
            outcomes = {"compiled": outcome(fast), "python": outcome(slow)}
            if simrd:
                other = run_simrd(simrd, log_path, "DTR", budget_bytes=fast.budget_bytes)
                outcomes["simrd"] = {"status": other.status, "clock": other.clock, "sha": other.eviction_sha256}
                row.update(simrd_cpu_s=other.cpu_seconds, simrd_wall_s=other.seconds,
                           vs_simrd=other.cpu_seconds / fast_cpu, vs_simrd_wall=other.seconds / fast_wall)
            if any(value != outcomes["compiled"] for value in outcomes.values()):
                print(f"OUTCOMES DIFFER on {trace.name} at {ratio}: {outcomes}", file=sys.stderr)
                return 1
            rows.append(row)
            line = (f"{trace.name[:24]:24s} {ratio:4.2f} {fast.status:6s} compiled {fast_cpu * 1e3:8.1f} ms  "
                    f"python {slow_cpu * 1e3:8.1f} ms (x{row['vs_python']:5.1f})")
            if simrd:
                line += f"  simrd {other.cpu_seconds:7.2f} s (x{row['vs_simrd']:6.1f} CPU, x{row['vs_simrd_wall']:6.1f} wall)"
            print(line, flush=True)

    print("\nspeed-up of the compiled core, geometric mean over the ratios (identical outcomes, same process):")
    columns = [("vs_python", "over Python path")]
    if simrd:
        columns = [("vs_simrd", "over simrd CPU"), ("vs_simrd_wall", "over simrd wall")] + columns
    means = {key: geometric_means(rows, key) for key, _ in columns}
    print(f"  {'log':36s}" + "".join(f"{title:>18s}" for _, title in columns))
    for log in means[columns[0][0]]:
        print(f"  {log[:36]:36s}" + "".join(f"{'x' + format(means[key][log], '.1f'):>18s}" for key, _ in columns))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
