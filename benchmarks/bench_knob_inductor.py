"""Knob evaluations per minute, Inductor accounting against aot_eager, in one run on the same knobs.

The source is traced once per backend (:func:`dtrlab.trace.partition.trace_joint`), then
:func:`dtrlab.memory.partitioned.knob_peaks` runs at ``--knobs`` values evenly spread over
[0, 1] under each: aot_eager (the partitioned graphs run node by node) and inductor
(Inductor's lowering of each distinct partition, dtrlab.trace.inductor; a partition met
at an earlier knob is not lowered again, so the rate depends on how many distinct
partitions the knobs give: printed). CPU seconds of this process, wall beside.

    python benchmarks/bench_knob_inductor.py --source hf:gpt2 [--layers 12] [--seq 1024] [--knobs 11]
    python benchmarks/bench_knob_inductor.py --source hf:llama --layers 16 --seq 2048
"""

from __future__ import annotations

import argparse
import time
import warnings

from dtrlab.memory.partitioned import knob_peaks
from dtrlab.trace.partition import trace_joint


def timed(function):
    cpu, wall = time.process_time(), time.perf_counter()
    result = function()
    return time.process_time() - cpu, time.perf_counter() - wall, result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="hf:gpt2")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--seq", type=int, default=None)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--knobs", type=int, default=11)
    args = parser.parse_args(argv)
    knobs = [round(i / max(1, args.knobs - 1), 4) for i in range(args.knobs)]
    sizes = {"layers": args.layers} if args.layers else {}
    per_minute = {}
    for backend in ("aot_eager", "inductor"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trace_cpu, trace_wall, joint = timed(lambda: trace_joint(args.source, batch=args.batch, seq=args.seq,
                                                                     backend=backend, **sizes))
            print(f"{backend}: {joint.desc}; joint graph {joint.node_count} nodes; trace {trace_cpu:.1f} s CPU "
                  f"({trace_wall:.1f} s wall)")
            total_cpu = 0.0
            for knob in knobs:
                cpu, wall, row = timed(lambda: knob_peaks(joint, knob))
                total_cpu += cpu
                print(f"  knob {knob:.3f}: {cpu:.2f} s CPU ({wall:.2f} s wall), flat peak {row['flat_peak']:,} B, "
                      f"saved {row['saved_count']}")
        per_minute[backend] = 60 * len(knobs) / total_cpu
        distinct = f", {len(joint.lowerings)} distinct partitions lowered" if backend == "inductor" else ""
        print(f"{backend}: {per_minute[backend]:.1f} knob evaluations per CPU minute{distinct}")
    print(f"inductor / aot_eager time per knob: {per_minute['aot_eager'] / per_minute['inductor']:.2f}x")


if __name__ == "__main__":
    main()
