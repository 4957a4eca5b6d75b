"""``dtrlab info LOG...``: what a trace holds and its unbounded baseline."""

from __future__ import annotations

import json

from ..runtime import baseline
from .common import load_traces, print_table


def register(subparsers) -> None:
    parser = subparsers.add_parser("info", help="operators, tensors, baseline peak and compute of traces")
    parser.add_argument("logs", nargs="+", metavar="LOG", help="log file, directory of logs, or logs.zip")
    parser.add_argument("--json", action="store_true", help="one JSON object per trace")
    parser.set_defaults(handler=run)


def run(args) -> int:
    rows = []
    for trace in load_traces(args.logs):
        base = baseline(trace)
        summary = trace.summary()
        rows.append({
            "trace": trace.name, "operators": summary["operators"], "constants": summary["constants"],
            "tensors": summary["tensors"], "schedule_steps": summary["schedule_steps"],
            "baseline_peak_bytes": base.peak_memory, "baseline_compute": base.model_compute,
        })
    if args.json:
        for row in rows:
            print(json.dumps(row))
    else:
        print_table(rows)
    return 0
