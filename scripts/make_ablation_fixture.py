"""Regenerate tests/fixtures/simrd_ablations.jsonl by running simrd itself beside dtrlab.

simrd (uwsampl/dtr-prototype, folder simrd/) is imported from the path given on the
command line and run with the reference protocol of ../shared/reference/README.md:
baseline from an unbounded RuntimeV1, budget int(peak * ratio), RuntimeV2EagerOptimized
with remat_limit = baseline compute, status pass/oom/thrash. Each record keeps what
tests/test_policies_ablations.py compares: status, clock and the evicted storages
(count and sha256 of their root tensor names, in eviction order).

    python scripts/make_ablation_fixture.py --simrd /tmp/simrd-src/simrd --logs ../shared/dtr-logs
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from pathlib import Path

LOGS = {
    "resnet32": "resnet32-56-9000000000.0-2020-10-1-13-3-30-default.log",
    "unet": "unet-6-8000000000.0-2020-10-1-10-57-18-default.log",
}
# Every non-random ablation (the random one cannot be decision-identical: simrd draws
# from the global `random` module).
ABLATIONS = [
    "AbESizeStale", "AbESize", "AbEStale", "AbE",
    "AbEqSizeStale", "AbEqSize", "AbEqStale", "AbEq",
    "AbLocalSizeStale", "AbLocalSize", "AbLocalStale", "AbLocal",
    "AbSizeStale", "AbSize", "AbStale",
]
RATIOS = [0.3, 0.5, 0.7, 0.9]


def run_simrd(simrd, log: Path, heuristic: str, ratio: float) -> dict:
    graph = simrd.parse.parse_file(open(log), start=True)
    callback = graph.get_closure()
    unbounded = simrd.runtime.RuntimeV1(math.inf, simrd.heuristic.Heuristic(), stats=False, trace=False)
    callback(unbounded)
    peak = unbounded.telemetry.summary["max_memory"]
    compute = unbounded.telemetry.summary["model_compute"]
    budget = int(peak * ratio)

    policy = simrd.heuristic.HEURISTICS[heuristic]()
    evicted = []
    choose = policy.choose

    def recording_choose(pool, rt, **kwargs):
        chosen = choose(pool, rt, **kwargs)
        evicted.extend(s.tensors[0].name for s in chosen)
        return chosen

    policy.choose = recording_choose
    rt = simrd.runtime.RuntimeV2EagerOptimized(budget, policy, stats=False, trace=False,
                                               remat_limit=compute * (2.0 - 1))
    try:
        callback(rt)
        status = "pass"
    except MemoryError:
        status = "oom"
    except simrd.runtime.RematExceededError:
        status = "thrash"
    return {"status": status, "budget_bytes": budget, "clock": rt.clock, "evictions": len(evicted),
            "eviction_sha256": hashlib.sha256("\n".join(evicted).encode()).hexdigest(),
            "first_evictions": evicted[:10]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--simrd", required=True, type=Path, help="simrd's folder (the one holding the simrd package)")
    parser.add_argument("--logs", required=True, type=Path, help="folder of the DTR logs (../shared/dtr-logs)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent
                        / "tests" / "fixtures" / "simrd_ablations.jsonl")
    args = parser.parse_args()
    if not (args.simrd / "simrd" / "heuristic" / "ablation.py").exists():
        parser.error(f"{args.simrd} does not hold simrd (expected simrd/heuristic/ablation.py under it)")
    sys.path.insert(0, str(args.simrd))
    sys.setrecursionlimit(100000)
    import simrd.heuristic.ablation  # noqa: F401  (registers the ablations)
    import simrd.parse
    import simrd.runtime
    simrd_module = sys.modules["simrd"]

    with open(args.out, "w") as out:
        for model, file_name in LOGS.items():
            for heuristic in ABLATIONS:
                for ratio in RATIOS:
                    record = {"log": file_name, "heuristic": heuristic, "ratio": ratio,
                              **run_simrd(simrd_module, args.logs / file_name, heuristic, ratio)}
                    out.write(json.dumps(record) + "\n")
                    out.flush()
                    print(model, heuristic, ratio, record["status"], record["evictions"], flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
