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
import json
from pathlib import Path

from dtrlab.analysis.simrd_bridge import load_simrd, run_simrd

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


def fixture_record(simrd, log: Path, heuristic: str, ratio: float) -> dict:
    outcome = run_simrd(simrd, log, heuristic, ratio=ratio)
    return {"status": outcome.status, "budget_bytes": outcome.budget_bytes, "clock": outcome.clock,
            "evictions": len(outcome.evicted_storages), "eviction_sha256": outcome.eviction_sha256,
            "first_evictions": list(outcome.evicted_storages[:10])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--simrd", required=True, type=Path, help="simrd's folder (the one holding the simrd package)")
    parser.add_argument("--logs", required=True, type=Path, help="folder of the DTR logs (../shared/dtr-logs)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent
                        / "tests" / "fixtures" / "simrd_ablations.jsonl")
    args = parser.parse_args()
    simrd_module = load_simrd(args.simrd)

    with open(args.out, "w") as out:
        for model, file_name in LOGS.items():
            for heuristic in ABLATIONS:
                for ratio in RATIOS:
                    record = {"log": file_name, "heuristic": heuristic, "ratio": ratio,
                              **fixture_record(simrd_module, args.logs / file_name, heuristic, ratio)}
                    out.write(json.dumps(record) + "\n")
                    out.flush()
                    print(model, heuristic, ratio, record["status"], record["evictions"], flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
