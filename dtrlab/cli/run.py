"""``dtrlab run LOG --policy dtr --ratio 0.5``: one simulation, its result record."""

from __future__ import annotations

import json

from ..runtime import simulate
from .common import add_single_run_arguments, check_no_limit, load_single_trace, policy_params, semantics_argument


def register(subparsers) -> None:
    parser = subparsers.add_parser("run", help="simulate one budget and print the result record")
    add_single_run_arguments(parser, unlimited=True)
    parser.add_argument("--json", action="store_true", help="print the record as JSON")
    parser.add_argument("--evictions", action="store_true", help="also list the evicted storages in order")
    parser.set_defaults(handler=run)


def run(args) -> int:
    check_no_limit(args.overhead_limit, args.policy, policy_params(args.param))
    trace = load_single_trace(args.log)
    result = simulate(trace, args.policy, ratio=args.ratio, budget_bytes=args.budget,
                      semantics=semantics_argument(args), **policy_params(args.param))
    record = result.to_dict(evicted=args.evictions)
    if not result.passed:
        record["overhead"] = None  # clock over baseline compute at the failure: no overhead of a run
    if args.json:
        print(json.dumps(record))
    else:
        width = max(map(len, record))
        for key, value in record.items():
            print(f"{key.ljust(width)}  {value}")
    return 0 if result.passed else 1
