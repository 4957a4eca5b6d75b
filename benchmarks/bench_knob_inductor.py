"""Knob evaluations per minute, Inductor accounting against aot_eager, in one run on the same knobs.

The source is traced once per backend (:func:`dtrlab.trace.torch_compile.tracing.trace_joint`), then each of
``--knobs`` values evenly spread over [0, 1] is partitioned by torch and accounted under each:
aot_eager (the partitioned graphs run node by node) and inductor (Inductor's lowering of each
distinct partition, dtrlab.trace.torch_compile.inductor; a partition met at an earlier knob is not lowered
again, so the rate depends on how many distinct partitions the knobs give). Printed per backend:
the trace's and each knob's CPU seconds of this process (wall beside), knob evaluations per CPU
minute, and for inductor the check that each distinct partition is lowered once: Inductor's
lowering calls (two per partition: forward and backward) against the distinct partitions by
content (``joint.lowerings``) and by decision (the saved and recomputed nodes). Last, the ratios
inductor / aot_eager of the knobs' time and of the whole census (trace + knobs).

``--census`` instead runs the whole census (:func:`dtrlab.analysis.knob_census.census_knob`, serial) under
each backend on one plan, by default the shipped Inductor censuses' (``dtrlab ship knob --backend
inductor``: 0..1 every 0.1, changes against the knob bisected to 0.025): each backend's evaluations
(its own refinements follow its own curve), distinct partitions, CPU seconds, and the ratio of the two.

    python benchmarks/bench_knob_inductor.py --source hf:gpt2 [--layers 12] [--seq 1024] [--knobs 11]
    python benchmarks/bench_knob_inductor.py --source hf:llama --layers 16 --seq 2048
    python benchmarks/bench_knob_inductor.py --source hf:gpt2 --batch 8 --seq 1024 --census

Measured 2026-12-03, torch 2.14.1, CPU seconds of this one process on a shared 2-core machine at
load 4-11 (docs/compile.md, "Speed of the Inductor accounting"); GPT-2 small at batch 8, sequence 1024:

* ``--layers 2`` (11 knobs): aot_eager 107.9, inductor 7.7 knob evaluations per CPU minute: 14.0x per
  knob, 7.9x for the whole census with its traces; 10 distinct partitions, 20 lowerings (each once).
* ``--layers 12 --knobs 3``: aot_eager 16.8, inductor 1.5 a minute (32-44 s per lowered partition):
  11.0x per knob, 6.0x with the traces; 3 distinct partitions, 6 lowerings.
* ``--source hf:llama --layers 16 --batch 4 --seq 2048 --knobs 3``: aot_eager 13.0, inductor 1.6 a
  minute (31-42 s per lowered partition): 7.9x per knob, 5.1x with the traces; 6 lowerings for 3.
* ``--batch 8 --seq 1024 --census`` (12 layers; 4 December, load 1-2): aot_eager's census 25.0 s of CPU (15
  evaluations), Inductor's 230.0 s (13 evaluations, 11 partitions lowered once each): 9.2x, 7.6x with the traces.
"""

from __future__ import annotations

import argparse
import functools
import time
import warnings

from dtrlab.analysis.knob_census import KnobPlan, census_knob, parse_knobs
from dtrlab.memory.partitioned import knob_peaks, step_record
from dtrlab.pipeline.ship_knob import PLANS
from dtrlab.trace.torch_compile import inductor
from dtrlab.trace.torch_compile.partition import partition
from dtrlab.trace.torch_compile.tracing import trace_joint


def timed(function):
    cpu, wall = time.process_time(), time.perf_counter()
    result = function()
    return time.process_time() - cpu, time.perf_counter() - wall, result


def counting_lowerings(counter: list):
    """dtrlab.trace.torch_compile.inductor's ``lower``, counting its calls (one per graph Inductor lowers)."""
    original = inductor.lower

    def counted(*args, **kwargs):
        counter.append(kwargs.get("backward"))
        return original(*args, **kwargs)

    return original, counted


def census(args, backend: str, knobs: list[float]) -> tuple[float, float]:
    """Trace and account every knob under ``backend``: (trace CPU seconds, knobs' CPU seconds)."""
    sizes = {"layers": args.layers} if args.layers else {}
    trace_cpu, trace_wall, joint = timed(lambda: trace_joint(args.source, batch=args.batch, seq=args.seq,
                                                             backend=backend, **sizes))
    print(f"{backend}: {joint.desc}; joint graph {joint.node_count} nodes; trace {trace_cpu:.1f} s CPU "
          f"({trace_wall:.1f} s wall)", flush=True)
    account = inductor.partition_lowered if backend == "inductor" else partition
    total_cpu, decisions = 0.0, set()
    for knob in knobs:
        cpu, wall, step = timed(lambda: account(joint, knob))
        row = step_record(step)
        total_cpu += cpu
        decisions.add((frozenset(s.name for s in step.saved), frozenset(step.recomputed)))
        print(f"  knob {knob:.3f}: {cpu:.2f} s CPU ({wall:.2f} s wall), flat peak {row['flat_peak']:,} B, "
              f"saved {row['saved_count']}", flush=True)
    print(f"{backend}: {60 * len(knobs) / total_cpu:.1f} knob evaluations per CPU minute; "
          f"{len(decisions)} distinct partitions (saved and recomputed nodes) over {len(knobs)} knobs", flush=True)
    if backend == "inductor":
        print(f"inductor: {len(joint.lowerings)} distinct partitions by graph content, lowered once each: "
              f"{len(args.lowered)} lowerings (forward + backward) = 2 x {len(joint.lowerings)}: "
              f"{len(args.lowered) == 2 * len(joint.lowerings)}", flush=True)
    return trace_cpu, total_cpu


def whole_census(args, backend: str) -> tuple[float, float]:
    """Trace and census ``args.plan`` under ``backend``: (trace CPU seconds, census CPU seconds)."""
    sizes = {"layers": args.layers} if args.layers else {}
    trace_cpu, _, joint = timed(lambda: trace_joint(args.source, batch=args.batch, seq=args.seq,
                                                    backend=backend, **sizes))
    census_cpu, wall, census = timed(lambda: census_knob(functools.partial(knob_peaks, joint), args.plan))
    distinct = census.samples[["saved_count", "recomputed_count", "proxy_saved_bytes",
                               "proxy_recompute_runtime"]].drop_duplicates()
    print(f"{backend}: {joint.desc}; trace {trace_cpu:.1f} s CPU; census {census_cpu:.1f} s CPU ({wall:.1f} s wall): "
          f"{len(census.samples)} evaluations, {len(distinct)} distinct partitions (saved count, recomputed count "
          f"and the partitioner's two proxies)" + (f", {len(joint.lowerings)} lowered" if backend == "inductor"
                                                   else ""), flush=True)
    return trace_cpu, census_cpu


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="hf:gpt2")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--seq", type=int, default=None)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--knobs", type=int, default=11)
    parser.add_argument("--census", action="store_true", help="whole censuses on one plan (module docstring)")
    parser.add_argument("--plan", default="inductor", choices=tuple(PLANS), help="--census's plan: the shipped "
                        "censuses' of that backend (default inductor's)")
    args = parser.parse_args(argv)
    plan = PLANS[args.plan]
    args.plan = KnobPlan(**parse_knobs(plan["knobs"]), resolution=plan["resolution"], refine=plan["refine"])
    knobs = [round(i / max(1, args.knobs - 1), 4) for i in range(args.knobs)]
    args.lowered = []
    original, inductor.lower = counting_lowerings(args.lowered)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run = whole_census if args.census else functools.partial(census, knobs=knobs)
            times = {backend: run(args, backend) for backend in ("aot_eager", "inductor")}
    finally:
        inductor.lower = original
    (aot_trace, aot_knobs), (ind_trace, ind_knobs) = times["aot_eager"], times["inductor"]
    print(f"inductor / aot_eager: {'census' if args.census else 'knobs'} {ind_knobs / aot_knobs:.2f}x, with the traces "
          f"{(ind_trace + ind_knobs) / (aot_trace + aot_knobs):.2f}x", flush=True)


if __name__ == "__main__":
    main()
