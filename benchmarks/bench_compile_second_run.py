"""What a second run of a training script pays for ``dtrlab.compile``'s pick, against the first run.

Runs one script twice, each in a fresh process sharing one empty dtrlab cache: build the model source on the
CPU (real weights), ``dtrlab.compile(model, budget=..., example_inputs=...)`` (timed: the pick), then one
training step (timed: torch's own compile at the first call, then the step). The first run searches (trace
and evaluations) and records the graphs torch compiles; the second reads the pick by the model's fingerprint
and checks the graphs when torch compiles. Prints both runs and the ratio of their pick times.

    python benchmarks/bench_compile_second_run.py --source hf:gpt2 --batch 1 --seq 256 --budget 2GiB
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile

RUN = """
import json, sys, time
import torch
import dtrlab
from dtrlab.trace.models import build

source, options, budget, backend, cache = json.loads(sys.argv[1])
started = time.perf_counter()
workload = build(source, device="cpu", **options)
built = time.perf_counter()
compiled = dtrlab.compile(workload.module, budget=budget, example_inputs=workload.inputs, loss_fn=workload.loss_fn,
                          backend=backend, cache=cache)
picked = time.perf_counter()
workload.loss_fn(compiled(*workload.inputs)).backward()
stepped = time.perf_counter()
graphs = compiled.knob_graphs
print(json.dumps({"build_s": built - started, "pick_s": picked - built, "first_step_s": stepped - picked,
                  "knob": compiled.knob_fit.knob, "from_cache": compiled.knob_fit.from_cache,
                  "evaluations": compiled.knob_fit.evaluations,
                  "graphs_checked": len(graphs.checked) if graphs else None,
                  "graphs_unexpected": len(graphs.unexpected) if graphs else None}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="hf:gpt2")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--layers", type=int)
    parser.add_argument("--budget", default="2GiB")
    parser.add_argument("--backend", default="inductor", choices=("inductor", "aot_eager"))
    args = parser.parse_args()
    options = {k: v for k, v in {"batch": args.batch, "seq": args.seq, "layers": args.layers}.items() if v is not None}
    with tempfile.TemporaryDirectory(prefix="dtrlab-second-run-") as cache:
        runs = []
        for label in ("first run", "second run"):
            spec = json.dumps([args.source, options, args.budget, args.backend, cache])
            done = subprocess.run([sys.executable, "-c", RUN, spec], capture_output=True, text=True)
            if done.returncode != 0:
                sys.exit(f"{label} failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ''}")
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"{label}: {runs[-1]}")
    print(f"pick: second run / first run = {runs[1]['pick_s'] / runs[0]['pick_s']:.4f}")


if __name__ == "__main__":
    main()
