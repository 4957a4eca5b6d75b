"""Whole-process speed: ``dtrlab run LOG --ratio 0.5`` against simrd's replay as a process.

Each side is a fresh Python process, timed from the outside as a user would see it
(interpreter start, imports, log parsing or the parsed-trace cache, the baseline,
the budgeted replay). simrd's process imports simrd, parses the log, runs the
unbounded baseline and the budgeted ``RuntimeV2EagerOptimized`` replay with the
reference protocol (dtrlab.analysis.simrd_bridge, loaded as a file so that its
process does not import dtrlab). Outcomes (status, clock, eviction hash) are checked
to be identical before a time counts. Runs alternate between the two sides, so
both see the same machine load; each time is the best of ``--repeats``. ``--clock cpu``
compares the processes' CPU time (user + system) instead of wall time, for a machine
that other jobs keep busy.

    python benchmarks/bench_cli.py --simrd /tmp/dtr-prototype/simrd [--logs ../shared/dtr-logs] [--repeats 3] [--clock cpu]

dtrlab is timed twice: ``cold`` (an empty trace cache) and ``warm`` (after a first run). A plain
log that the compiled reader takes is never cached, so the two differ only for logs it leaves to
the Python parser (parsed cold, loaded from the cache warm).

Both sides first get their bytecode compiled (``compileall`` on the dtrlab package and
on simrd's folder), as an installed package has it. Without that, an environment with
``PYTHONDONTWRITEBYTECODE=1`` (this machine sets it) recompiles every module from
source in every process: measured here, that cost dtrlab 30-40 ms a process (its
warm run 0.10 s instead of 0.07 s) and made the comparison one of compilers.
"""

from __future__ import annotations

import argparse
import compileall
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOGS = ("transformer", "inceptionv4", "treelstm", "tv_densenet121")
RATIO = 0.5

SIMRD_PROCESS = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("simrd_bridge", sys.argv[1])
bridge = sys.modules["simrd_bridge"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bridge)
simrd = bridge.load_simrd(sys.argv[2])
outcome = bridge.run_simrd(simrd, sys.argv[3], "DTR", ratio=float(sys.argv[4]))
print(json.dumps({"status": outcome.status, "clock": outcome.clock, "sha": outcome.eviction_sha256}))
"""


def timed(command: list[str], env: dict, clock: str) -> tuple[float, dict]:
    """Run ``command``; its wall time, or its CPU time (user + system) with ``clock="cpu"``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
    seconds = time.perf_counter() - start
    if clock == "cpu":
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        seconds = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    if done.returncode not in (0, 1) or not done.stdout.strip():  # dtrlab run exits 1 when the run fails
        raise SystemExit(f"{' '.join(command[:4])}... failed:\n{done.stderr[-3000:]}")
    return seconds, json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--logs", default=str(ROOT.parent / "shared" / "dtr-logs"))
    parser.add_argument("--simrd", required=True, help="the folder holding simrd's `simrd` package")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ratio", type=float, default=RATIO)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall time (a quiet machine), or the processes' CPU time (user + system), which "
                             "other jobs on the machine disturb far less")
    args = parser.parse_args()

    python = sys.executable
    for tree in (ROOT / "dtrlab", Path(args.simrd)):  # both sides as installed: bytecode compiled
        if not compileall.compile_dir(str(tree), quiet=1):
            print(f"could not compile the bytecode under {tree}", file=sys.stderr)
            return 2
    bridge = str(ROOT / "dtrlab" / "analysis" / "simrd_bridge.py")
    rows = []
    with tempfile.TemporaryDirectory() as cold_root, tempfile.TemporaryDirectory() as warm_root:
        for name in LOGS:
            matches = sorted(Path(args.logs).glob(f"{name}-*.log"))
            if not matches:
                print(f"no {name}-*.log in {args.logs}", file=sys.stderr)
                return 2
            log = str(matches[0])
            mine = [python, "-m", "dtrlab.cli", "run", log, "--ratio", str(args.ratio), "--json"]
            theirs = [python, "-c", SIMRD_PROCESS, bridge, args.simrd, log, str(args.ratio)]
            warm_env = {**os.environ, "DTRLAB_CACHE": warm_root}
            timed(mine, warm_env, args.clock)  # fills the warm trace cache
            best = {"cold": math.inf, "warm": math.inf, "simrd": math.inf}
            for repeat in range(args.repeats):
                cold_env = {**os.environ, "DTRLAB_CACHE": os.path.join(cold_root, f"{name}-{repeat}")}
                seconds, cold = timed(mine, cold_env, args.clock)
                best["cold"] = min(best["cold"], seconds)
                seconds, warm = timed(mine, warm_env, args.clock)
                best["warm"] = min(best["warm"], seconds)
                seconds, reference = timed(theirs, dict(os.environ), args.clock)
                best["simrd"] = min(best["simrd"], seconds)
                for record in (cold, warm):
                    outcome = {"status": record["status"], "clock": record["clock"], "sha": record["eviction_sha256"]}
                    if outcome != reference:
                        print(f"OUTCOMES DIFFER on {name}: {outcome} vs simrd {reference}", file=sys.stderr)
                        return 1
            rows.append({"log": name, "status": warm["status"], **best})
            print(f"{name:16s} {warm['status']:6s} dtrlab cold {best['cold']:6.2f} s  warm {best['warm']:6.2f} s  "
                  f"simrd {best['simrd']:7.2f} s  x{best['simrd'] / best['cold']:5.1f} cold  "
                  f"x{best['simrd'] / best['warm']:5.1f} warm", flush=True)

    def geomean(values):
        return math.exp(sum(math.log(v) for v in values) / len(values))

    print(f"\nwhole-process speed-up against simrd at ratio {args.ratio} ({args.clock} time, best of "
          f"{args.repeats}, same run, identical outcomes), geometric mean over {len(rows)} logs:")
    for side in ("cold", "warm"):
        print(f"  dtrlab {side}: x{geomean([r['simrd'] / r[side] for r in rows]):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
