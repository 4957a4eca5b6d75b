"""Real execution's overhead: ``dtrlab.execute.run_step`` against the plain eager training step, on CPU.

For each model, in one process and one torch thread (tiny operators on a shared machine
only wait for each other with more), it times, best of ``--repeats`` (CPU time of this
process, ``time.process_time``, so that other jobs on the machine do not count):

* ``eager``: forward and backward of the freshly built model, nothing else;
* ``recorder``: the same step under dtrlab capture's recorder on real tensors (the log
  lines, no simulator): what checking every line costs;
* ``execute 1.0``: ``run_step`` at ratio 1.0 (the lockstep simulator, the line checks, the
  recorded calls; evictions only where the simulator makes them at the full peak);
* ``execute R``: ``run_step`` at ``R``, a passing budget that evicts and recomputes.

It prints each as a ratio to ``eager`` and as microseconds of overhead per operator (the
trace's operator count), and for the budgeted run the real recomputations' CPU time
against the step's, beside the cost model's recompute over compute. Building the model
and capturing the trace are not timed (run_step gets a captured step).

    python benchmarks/bench_execute.py [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from dtrlab.execute import capture_step, run_step
from dtrlab.trace.capture import record
from dtrlab.trace.models import build, meta_patches

MODELS = {  # name: (source, build options, a passing ratio that evicts and recomputes)
    "resnet32 b1 (zoo)": ("resnet32", dict(batch=1), 0.90),
    "resnet32 b8 (zoo)": ("resnet32", dict(batch=8), 0.50),
    "llama 2x64 s64 b4 (hf)": ("hf:llama", dict(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128,
                                                vocab=100, seq=64, batch=4), 0.60),
    "llama 4x256 s256 b2 (hf)": ("hf:llama", dict(layers=4, hidden=256, heads=8, kv_heads=4, intermediate=512,
                                                  vocab=1000, seq=256, batch=2), 0.70),
}


def best(repeats: int, fn) -> float:
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return min(times)


def eager(source: str, options: dict):
    workload = build(source, device="cpu", **options)

    def step():
        workload.module.zero_grad(set_to_none=True)
        with meta_patches():
            output = workload.module(*workload.inputs)
            loss = workload.loss_fn(output) if workload.loss_fn else output.sum()
            loss.backward()
    return step


def recorder_only(source: str, options: dict):
    workload = build(source, device="cpu", **options)

    def step():
        with torch.device("cpu"), meta_patches():
            record(workload.module, workload.inputs, loss_fn=workload.loss_fn, cost="flops")
    return step


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for label, (source, options, ratio) in MODELS.items():
        captured = capture_step(source, **options)
        operators = sum(1 for op in captured.trace.operators if not op.is_constant)
        base = best(args.repeats, eager(source, options))
        timings = {"recorder": best(args.repeats, recorder_only(source, options))}
        results = {}
        for run_ratio in (1.0, ratio):
            def execute(r=run_ratio):
                results[r] = run_step(captured, ratio=r)
            timings[f"execute {run_ratio}"] = best(args.repeats, execute)
        budgeted = results[ratio]
        assert budgeted.passed and budgeted.run.evictions, f"{label}: ratio {ratio} should pass with evictions"
        real = budgeted.recomputations
        row = {"model": label, "operators": operators, "eager_s": base,
               **{f"{k}_ratio": v / base for k, v in timings.items()},
               **{f"{k}_us_per_op": (v - base) / operators * 1e6 for k, v in timings.items()},
               "evictions": budgeted.run.evictions, "real_recomputations": len(real),
               # wall time (perf_counter) of the recomputations over the run's wall time, beside the cost model
               "recompute_wall_share": sum(r.wall_ns for r in real) / 1e9 / budgeted.wall_seconds,
               "cost_model_recompute_over_compute": budgeted.run.remat_compute / budgeted.run.model_compute}
        rows.append(row)
        print(f"{label}: {operators} operators, eager step {base * 1e3:.1f} ms CPU")
        for name, seconds in timings.items():
            print(f"  {name:<14} {seconds * 1e3:8.1f} ms  {seconds / base:6.1f}x eager  "
                  f"{(seconds - base) / operators * 1e6:8.1f} us/operator")
        print(f"  at {ratio}: {budgeted.run.evictions} evictions, {len(real)} real recomputations taking "
              f"{row['recompute_wall_share']:.1%} of the step's wall time; the cost model's recompute is "
              f"{row['cost_model_recompute_over_compute']:.1%} of the compute")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
