"""Knob values partitioned per minute: trace once, then torch's partitioner per activation_memory_budget value.

A Llama-style decoder (``hf:llama``: Llama 3.2 1B's shape by default, 16 layers of width
2048) is traced once on fake tensors (:func:`dtrlab.trace.torch_compile.tracing.trace_joint`), then
partitioned at ``--knobs`` values evenly spread over [0, 1]. Printed per phase (CPU seconds
of this process, wall seconds beside):

* ``trace``: dynamo + AOT autograd once: what a fresh torch.compile per knob repeats (the
  baseline: a compile per knob costs at least trace + partition, Inductor's codegen not
  counted);
* ``partition``: torch's ``min_cut_rematerialization_partition`` on a copy of the joint
  graph, plus dtrlab's recording of the two graphs as a trace (one :func:`partition` call);
* ``peaks``: the flat and caching replays (:func:`dtrlab.memory.partitioned.step_peaks`).

    python benchmarks/bench_partition.py [--layers 16] [--seq 2048] [--batch 1] [--knobs 10]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

from dtrlab.memory.partitioned import step_peaks
from dtrlab.trace.torch_compile.partition import partition
from dtrlab.trace.torch_compile.tracing import trace_joint


def timed(function):
    cpu, wall = time.process_time(), time.perf_counter()
    result = function()
    return time.process_time() - cpu, time.perf_counter() - wall, result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--knobs", type=int, default=10)
    args = parser.parse_args(argv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trace_cpu, trace_wall, joint = timed(lambda: trace_joint("hf:llama", batch=args.batch, seq=args.seq,
                                                                 layers=args.layers))
    print(f"{joint.desc}; joint graph {joint.node_count} nodes")
    print(f"trace once: {trace_cpu:.1f} s CPU ({trace_wall:.1f} s wall)")
    knobs = [round(i / max(1, args.knobs - 1), 4) for i in range(args.knobs)]
    partition_cpu, peaks_cpu, partition_wall = [], [], []
    for knob in knobs:
        cpu, wall, step = timed(lambda: partition(joint, knob))
        partition_cpu.append(cpu)
        partition_wall.append(wall)
        cpu_peaks, _, peaks = timed(lambda: step_peaks(step))
        peaks_cpu.append(cpu_peaks)
        print(f"  knob {knob:.3f}: partition {cpu:.2f} s CPU ({wall:.2f} s wall), peaks {cpu_peaks:.2f} s; "
              f"saved {step.saved_count}, recomputed {step.recomputed_count}, flat peak {peaks['flat_peak']:,} B, "
              f"reserved {peaks['reserved_peak']:,} B, proxy {step.proxy_saved_bytes:,} B")
    per_knob = statistics.median(partition_cpu) + statistics.median(peaks_cpu)
    print(f"median per knob: partition {statistics.median(partition_cpu):.2f} s CPU, peaks "
          f"{statistics.median(peaks_cpu):.2f} s CPU")
    print(f"knob values per minute (partition + peaks, CPU): {60 / per_knob:.1f}")
    print(f"a fresh compile per knob (trace + partition + peaks): {60 / (trace_cpu + per_knob):.1f} per minute; "
          f"trace once is {(trace_cpu + per_knob) / per_knob:.1f}x faster")


if __name__ == "__main__":
    main()
