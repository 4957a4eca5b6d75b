"""The compiled memory models (``_memory_core.h``) against the Python ones, on real call sequences.

For each log, one ``dtrlab.simulate(..., semantics=Semantics(memory="caching"))`` run (h_DTR, ``--ratio``, the
``reserved`` semantics) records every allocate/free call the simulator makes on its model (a
recording subclass of the Python ``CachingModel``). That sequence is then replayed, interleaved
and best of ``--repeats``, through:

* ``python``: a fresh Python ``CachingModel``, one method call per event;
* ``c``: the compiled caching model, the whole sequence in C (``MemoryCore.replay``);
* ``c+stats``: the same, with ``memory_stats`` after every placement (as the replay core does);
* ``c via wrapper``: the compiled model called from Python once per event (the wrapper's cost);
* ``c flat placed``: the compiled byte counter on the placed allocations and their frees (a byte
  counter at the budget places them all: its allocated bytes never exceed the caching model's).
  The caching model cannot replay that sub-sequence (the refused calls released its cache), so
  ``c / c flat placed`` compares what each model costs the same simulation.

Then the whole simulation: ``simulate(..., semantics=Semantics(memory="caching"))`` on the Python simulator (once) and on
the compiled core, and the compiled core's flat run (best of ``--repeats``).

Every replay must refuse as many allocations as the recorded run and end with the Python model's
statistics, and both caching simulations must match the recorded run (status, clock, evictions),
before a time counts. Times on a shared machine are noisy; read the ratios.

    python benchmarks/bench_memory_core.py [--logs ../shared/dtr-logs] [--names densenet,transformer]
                                           [--ratio 0.3] [--repeats 5]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from array import array
from dataclasses import astuple
from pathlib import Path
from dtrlab.runtime.semantics import Semantics

from dtrlab import load_log, simulate
from dtrlab.memory import CachingModel, FlatModel
from dtrlab.memory._compiled import MemoryCore
from dtrlab.runtime import budget_for

ROOT = Path(__file__).resolve().parent.parent


class RecordingCaching(CachingModel):
    """The Python caching model, recording each call: (block_id, size) for allocate, (block_id, -1) for
    free, and which allocations it placed."""

    def __init__(self, capacity_bytes: int, **options):
        super().__init__(capacity_bytes, **options)
        self.calls: list[tuple[int, int]] = []
        self.placed: list[bool] = []

    def allocate(self, block_id: int, size: int) -> bool:
        placed = super().allocate(block_id, size)
        self.calls.append((block_id, size))
        self.placed.append(placed)
        return placed

    def free(self, block_id: int) -> None:
        super().free(block_id)
        self.calls.append((block_id, -1))
        self.placed.append(True)


def python_replay(capacity, calls):
    model = CachingModel(capacity)
    refused = 0
    for block_id, size in calls:
        if size < 0:
            model.free(block_id)
        elif not model.allocate(block_id, size):
            refused += 1
    return refused, astuple(model.stats())


def c_replay(model, ids, sizes, stats_each=False):
    core = MemoryCore(*model.core_args())
    refused = core.replay(ids, sizes, stats_each)
    return refused, core.stats()


def wrapper_replay(capacity, calls):
    core = MemoryCore(*CachingModel(capacity).core_args())
    refused = 0
    allocate, free = core.allocate, core.free
    for block_id, size in calls:
        if size < 0:
            free(block_id)
        elif not allocate(block_id, size):
            refused += 1
    return refused, core.stats()


RATIOS = ("python / c", "python / c via wrapper", "c+stats / c", "c / c flat placed",
          "simulation python caching / compiled caching", "simulation compiled caching / compiled flat")


def arrays(calls):
    return array("i", [c[0] for c in calls]), array("q", [c[1] for c in calls])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", default=str(ROOT.parent / "shared" / "dtr-logs"))
    parser.add_argument("--names", default="densenet,transformer",
                        help="comma-separated substrings of log file names (default: densenet,transformer)")
    parser.add_argument("--ratio", type=float, default=0.3)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    logs = sorted(Path(args.logs).glob("*.log"))
    chosen = [next((log for log in logs if name in log.name), None) for name in args.names.split(",")]
    if not logs or None in chosen:
        print(f"bench_memory_core: no log matching each of {args.names!r} in {args.logs}", file=sys.stderr)
        return 2
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; ratio {args.ratio}, "
          f"best of {args.repeats}")
    ratios = {}
    for path in chosen:
        trace = load_log(path)
        budget = budget_for(trace, args.ratio)
        recorder = RecordingCaching(budget)
        start = time.perf_counter()
        result = simulate(trace, "dtr", budget_bytes=budget, engine="python", semantics=Semantics(memory=recorder))
        simulation = time.perf_counter() - start
        calls = recorder.calls
        ids, sizes = arrays(calls)
        refused = recorder.placed.count(False)
        expected = (refused, astuple(recorder.stats()))
        placed = [call for call, ok in zip(calls, recorder.placed) if ok]
        placed_ids, placed_sizes = arrays(placed)
        flat = FlatModel(budget)
        timings = {name: [] for name in ("python", "c", "c+stats", "c via wrapper", "c flat placed")}
        for _ in range(args.repeats):
            for name, function in (
                    ("python", lambda: python_replay(budget, calls)),
                    ("c", lambda: c_replay(CachingModel(budget), ids, sizes)),
                    ("c+stats", lambda: c_replay(CachingModel(budget), ids, sizes, True)),
                    ("c via wrapper", lambda: wrapper_replay(budget, calls)),
                    ("c flat placed", lambda: c_replay(flat, placed_ids, placed_sizes))):
                start = time.perf_counter()
                outcome = function()
                timings[name].append(time.perf_counter() - start)
                if name in ("python", "c", "c+stats", "c via wrapper") and (
                        outcome[0], tuple(outcome[1])) != expected:
                    print(f"{path.name}: {name} replay differs from the recorded run: {outcome} != {expected}",
                          file=sys.stderr)
                    return 1
                if name == "c flat placed" and outcome[0] != 0:
                    print(f"{path.name}: {name} refused {outcome[0]} placed allocations", file=sys.stderr)
                    return 1
        t = {name: min(values) for name, values in timings.items()}
        n_alloc = sum(size >= 0 for _, size in calls)
        print(f"\n{trace.name}: {result.status}, {result.evictions} evictions, simulation {simulation:.2f} s; "
              f"{len(calls)} calls ({n_alloc} allocate, {refused} refused), "
              f"{len(placed)} in the placed sub-sequence")
        for name, seconds in t.items():
            count = len(placed) if name.endswith("placed") else len(calls)
            print(f"  {name:14s} {seconds * 1e3:9.2f} ms  {seconds / count * 1e9:8.0f} ns/call")
        # The whole simulation: Python caching once, the compiled core's caching and flat best of --repeats.
        sims = {}
        caching = Semantics(memory="caching")
        for name, repeats, options in (("python caching", 1, {"semantics": caching, "engine": "python"}),
                                       ("compiled caching", args.repeats, {"semantics": caching, "engine": "compiled"}),
                                       ("compiled flat", args.repeats, {"engine": "compiled"})):
            sims[name] = math.inf
            for _ in range(repeats):
                start = time.perf_counter()
                run = simulate(trace, "dtr", budget_bytes=budget, **options)
                sims[name] = min(sims[name], time.perf_counter() - start)
            if name != "compiled flat" and (run.status, run.clock, run.evictions) != (
                    result.status, result.clock, result.evictions):
                print(f"{path.name}: {name} simulation differs from the recorded one", file=sys.stderr)
                return 1
        print("  simulation: " + "; ".join(f"{name} {seconds * 1e3:.1f} ms" for name, seconds in sims.items()))
        ratios[trace.name] = (t["python"] / t["c"], t["python"] / t["c via wrapper"], t["c+stats"] / t["c"],
                              t["c"] / t["c flat placed"], sims["python caching"] / sims["compiled caching"],
                              sims["compiled caching"] / sims["compiled flat"])
        print("  " + "; ".join(f"{label} {value:.2f}x" for label, value in zip(RATIOS, ratios[trace.name])))
    if len(ratios) > 1:
        geo = [math.exp(sum(math.log(r[i]) for r in ratios.values()) / len(ratios)) for i in range(len(RATIOS))]
        print("\ngeometric means: " + "; ".join(f"{label} {value:.2f}x" for label, value in zip(RATIOS, geo)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
