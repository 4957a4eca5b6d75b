"""An Inductor census run again with its lowerings on disk, against the aot_eager census on the same plan, in one run.

In this process, on one plan (default the shipped Inductor censuses', ``dtrlab ship knob --backend inductor``:
0..1 every 0.1, changes against the knob bisected to 0.025), each census on a freshly traced joint graph (a new
run's: no memo of partitions, min-cuts or runtime estimates):

1. aot_eager's census;
2. Inductor's census with an empty lowering cache (every distinct partition lowered, and written);
3. Inductor's census again on a joint traced anew, the cache warm (every lowering read from disk); its samples
   must equal the cold census's.

Printed: each census's CPU seconds of this process (wall beside) without and with its trace, its evaluations and
the lowerings it made, and the ratios warm / aot_eager and cold / aot_eager. With ``--cli``, then ``dtrlab knob``
twice in fresh processes on the same source and plan with one new cache: the first lowers, the second reads.

    python benchmarks/bench_lowering_cache.py --source hf:gpt2 --layers 2 --batch 2 --seq 256 --cli
    python benchmarks/bench_lowering_cache.py --source hf:gpt2 --batch 8 --seq 1024      # the 12-layer GPT-2

Measured 6 December 2026, torch 2.14.1, this shared 2-core machine at load 7-11 (docs/compile.md, "Speed of the
Inductor accounting"), ``--source hf:gpt2 --layers 2 --batch 2 --seq 256``: aot_eager's census 8.4 s of CPU (23
evaluations); Inductor's cold 138.2 s (25 evaluations, 19 partitions lowered), 16.5x; warm 9.0 s, 1.07x (0.95x with
the traces), the same samples. ``dtrlab knob`` twice, measured apart (wall): 489 s, then 34.9 s. (In this run's
``--cli`` the second process lowered everything again, 682 s: presumably the key changed under it, another
helper's edit to the recording rules, part of the key, landing in the shared working tree between the two.)
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pandas as pd

from dtrlab.analysis.knob_census import KnobPlan, census_knob, parse_knobs
from dtrlab.memory.partitioned import knob_peaks
from dtrlab.pipeline.ship_knob import PLANS
from dtrlab.trace.torch_compile import inductor
from dtrlab.trace.torch_compile.tracing import trace_joint


def timed(function):
    cpu, wall = time.process_time(), time.perf_counter()
    result = function()
    return time.process_time() - cpu, time.perf_counter() - wall, result


def run_census(args, plan: KnobPlan, backend: str, cache) -> dict:
    """Trace ``args.source`` for ``backend`` and census it on ``plan`` (Inductor's lowerings kept in ``cache``)."""
    sizes = {"layers": args.layers} if args.layers else {}
    trace_cpu, trace_wall, joint = timed(lambda: trace_joint(args.source, batch=args.batch, seq=args.seq,
                                                             backend=backend, **sizes))
    lowered = []
    original = inductor.lower
    inductor.lower = lambda *a, **k: lowered.append(1) or original(*a, **k)
    try:
        options = {"cache": cache} if backend == "inductor" else {}
        cpu, wall, census = timed(lambda: census_knob(functools.partial(knob_peaks, joint, **options), plan))
    finally:
        inductor.lower = original
    return {"trace_cpu": trace_cpu, "trace_wall": trace_wall, "cpu": cpu, "wall": wall, "census": census,
            "lowerings": len(lowered) // 2}


def cli_run(args, plan_fields: dict, cache: Path) -> float:
    """Wall seconds of one ``dtrlab knob`` on the source and plan, in a fresh process, with ``cache``."""
    command = [sys.executable, "-m", "dtrlab", "knob", args.source, "--batch", str(args.batch), "--seq",
               str(args.seq), "--knobs", plan_fields["knobs"], "--resolution", str(plan_fields["resolution"]),
               "--refine", plan_fields["refine"], "--quiet"] + (["--layers", str(args.layers)] if args.layers else [])
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, env={**os.environ, "DTRLAB_CACHE": str(cache)})
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="hf:gpt2")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--cli", action="store_true", help="also time dtrlab knob twice in fresh processes")
    args = parser.parse_args()
    fields = PLANS["inductor"]
    plan = KnobPlan(**parse_knobs(fields["knobs"]), resolution=fields["resolution"], refine=fields["refine"])
    warnings.simplefilter("ignore")
    with tempfile.TemporaryDirectory() as scratch:
        runs = {"aot_eager": run_census(args, plan, "aot_eager", False),
                "inductor, cache cold": run_census(args, plan, "inductor", scratch),
                "inductor, cache warm": run_census(args, plan, "inductor", scratch)}
        base = runs["aot_eager"]
        print(f"{args.source} layers={args.layers or 'default'} batch={args.batch} seq={args.seq}; plan "
              f"{plan.describe()}; CPU seconds of this process (wall)")
        for name, run in runs.items():
            print(f"  {name}: census {run['cpu']:.1f} s ({run['wall']:.1f}), trace {run['trace_cpu']:.1f} s "
                  f"({run['trace_wall']:.1f}); {len(run['census'].samples)} evaluations, {run['lowerings']} "
                  f"partitions lowered; / aot_eager: {run['cpu'] / base['cpu']:.2f}x, with the traces "
                  f"{(run['cpu'] + run['trace_cpu']) / (base['cpu'] + base['trace_cpu']):.2f}x")
        pd.testing.assert_frame_equal(runs["inductor, cache warm"]["census"].samples,
                                      runs["inductor, cache cold"]["census"].samples)
        print("  the warm census's samples equal the cold one's")
        if args.cli:
            cache = Path(scratch) / "cli"
            first, second = cli_run(args, fields, cache), cli_run(args, fields, cache)
            print(f"dtrlab knob (fresh processes, one new cache): first {first:.1f} s, second {second:.1f} s wall")


if __name__ == "__main__":
    main()
