"""``dtrlab run LOG --policy dtr --ratio 0.5``: one simulation, its result record."""

from __future__ import annotations

import json

from ..runtime import simulate
from .common import add_policy_arguments, load_traces, policy_params


def register(subparsers) -> None:
    parser = subparsers.add_parser("run", help="simulate one budget and print the result record")
    parser.add_argument("log", metavar="LOG", help="log file (or a directory/zip holding exactly one log)")
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument("--ratio", type=float, help="budget as a fraction of the unbounded peak (simrd's int(peak*ratio))")
    budget.add_argument("--budget", type=int, metavar="BYTES", help="budget in bytes")
    add_policy_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the record as JSON")
    parser.add_argument("--evictions", action="store_true", help="also list the evicted storages in order")
    parser.set_defaults(handler=run)


def run(args) -> int:
    traces = load_traces([args.log])
    if len(traces) != 1:
        raise ValueError(f"{args.log} holds {len(traces)} traces; name one log file")
    result = simulate(traces[0], args.policy, ratio=args.ratio, budget_bytes=args.budget,
                      overhead_limit=args.overhead_limit, **policy_params(args.param))
    record = result.to_dict(evicted=args.evictions)
    if args.json:
        print(json.dumps(record))
    else:
        width = max(map(len, record))
        for key, value in record.items():
            print(f"{key.ljust(width)}  {value}")
    return 0 if result.passed else 1
