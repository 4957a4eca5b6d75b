"""Per policy: the Python simulator against the compiled core, on a few traces.

For each policy (h_DTR, score-family variants, an ablation, twophase, score_search
with d = 1, a searched policy, and coop and dtr_fit under the caching model) and each trace (three of traces/ and one DTR log), one
simulation at ratio 0.5 on both engines in this one process: ``engine="python"`` (one
run) and ``engine="compiled"`` (best of ``--repeats``). The two results must be equal
field by field before a time counts. Times are CPU seconds of this process
(``time.process_time``), wall-time ratios beside them.

    python benchmarks/bench_compiled_policies.py [--logs ../shared/dtr-logs] [--log resnet32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from dtrlab.runtime.semantics import Semantics

from dtrlab import load_log, simulate
from dtrlab.policies import get_policy
from dtrlab.policies.searched import SEARCHED
from bench_replay import timed  # the same best-of timing as the replay benchmark

ROOT = Path(__file__).resolve().parent.parent
TRACES = ("resnet32-b8", "transformer-b4", "treelstm-b4")
# (policy, parameters, memory model)
POLICIES = [("dtr", {}, "flat"), ("dtr_float64", {}, "flat"), ("dtr_stale_plus1", {}, "flat"),
            ("dtr_tiebreak_id", {}, "flat"), ("dtr_eq_class_float64", {}, "flat"), ("dtr_sqrt_size", {}, "flat"),
            ("ablation:local-size-stale", {}, "flat"), ("twophase", {}, "flat"), ("score_search", {"d": 1}, "flat")]
POLICIES += [(name, {}, "flat") for name in sorted(SEARCHED)[:1]]
POLICIES += [("dtr", {}, "caching"), ("coop", {}, "caching"), ("dtr_fit", {}, "caching")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--logs", default=str(ROOT.parent / "shared" / "dtr-logs"))
    parser.add_argument("--log", default="resnet32", help="the DTR log's name prefix (none found: traces only)")
    parser.add_argument("--ratio", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    traces = [load_log(ROOT / "traces" / f"{name}.jsonl.gz") for name in TRACES]
    logs = sorted(Path(args.logs).glob(f"{args.log}*.log"))
    if logs:
        traces.append(load_log(logs[0]))
    else:
        print(f"no DTR log {args.log}* in {args.logs}: traces/ only", file=sys.stderr)
    ratios: dict[str, list[float]] = {}
    print(f"ratio {args.ratio}; CPU seconds (best of {args.repeats} compiled, 1 python)")
    for trace in traces:
        simulate(trace, "dtr", ratio=args.ratio)  # warm the per-trace caches (baseline, flattened arrays)
        for name, params, memory in POLICIES:
            label = get_policy(name, **params).label + ("" if memory == "flat" else f" [{memory}]")

            def run(engine):
                return simulate(trace, get_policy(name, **params), ratio=args.ratio, engine=engine,
                                semantics=Semantics(memory=memory))

            fast_cpu, fast_wall, fast = timed(lambda: run("compiled"), args.repeats)
            slow_cpu, slow_wall, slow = timed(lambda: run("python"), 1)
            if fast != slow:
                print(f"RESULTS DIFFER: {trace.name} {label}", file=sys.stderr)
                return 1
            ratio = slow_cpu / fast_cpu
            ratios.setdefault(label, []).append(ratio)
            print(f"{trace.name[:28]:28s} {label[:34]:34s} {fast.status:6s} python {slow_cpu:8.3f} s  "
                  f"compiled {fast_cpu:8.4f} s  x{ratio:6.1f} CPU  x{slow_wall / fast_wall:6.1f} wall", flush=True)
    print("\ncompiled over python, geometric mean over the traces (equal results, same process):")
    for label, values in ratios.items():
        print(f"  {label:40s} x{statistics.geometric_mean(values):6.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
