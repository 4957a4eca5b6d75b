"""Arguments and printing shared by several subcommands."""

from __future__ import annotations

import argparse
import json

from ..memory import available_memory_models
from ..policies import available_policies
from ..trace import Trace, load


def load_traces(paths: list[str]) -> list[Trace]:
    """Each path may be a log, a directory of logs (with manifest.json) or a zip."""
    traces = []
    for path in paths:
        loaded = load(path)
        traces.extend(loaded.values() if isinstance(loaded, dict) else [loaded])
    return traces


def add_single_run_arguments(parser: argparse.ArgumentParser) -> None:
    """LOG and one budget (--ratio or --budget), for commands about a single run."""
    parser.add_argument("log", metavar="LOG", help="log file (or a directory/zip holding exactly one log)")
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument("--ratio", type=float,
                        help="budget as a fraction of the unbounded peak (simrd's int(peak*ratio))")
    budget.add_argument("--budget", type=int, metavar="BYTES", help="budget in bytes")
    add_policy_arguments(parser)


def load_single_trace(path: str) -> Trace:
    traces = load_traces([path])
    if len(traces) != 1:
        raise ValueError(f"{path} holds {len(traces)} traces; name one log file")
    return traces[0]


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", default="dtr",
                        help=f"eviction policy (default dtr; available: {', '.join(available_policies())})")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="policy parameter, e.g. --param seed=3 (repeatable; values are parsed as JSON)")
    parser.add_argument("--overhead-limit", type=float, default=2.0,
                        help="thrash once total compute exceeds this multiple of the baseline (default 2.0)")
    add_memory_arguments(parser)


def add_memory_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--memory", default="flat",
                        help="memory model (default flat, simrd's byte counter; available: "
                             f"{', '.join(available_memory_models())}; see docs/memory.md)")
    parser.add_argument("--memory-option", action="append", default=[], metavar="KEY=VALUE",
                        help="memory model option, e.g. --memory-option expandable_segments=true (repeatable; "
                             "values are parsed as JSON)")


def memory_arguments(args) -> dict:
    """``memory=`` and ``memory_options=`` for simulate/sweep, checked now: an unknown model or
    option is an error that lists the valid ones."""
    from ..runtime import memory_spec

    options = key_values(args.memory_option, "--memory-option")
    memory_spec(args.memory, options)
    return {"memory": args.memory, "memory_options": options}


def policy_params(pairs: list[str]) -> dict:
    return key_values(pairs, "--param")


def key_values(pairs: list[str], flag: str) -> dict:
    """``KEY=VALUE`` arguments as a dict; values are parsed as JSON when they are JSON."""
    params = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"{flag} takes KEY=VALUE, got {pair!r}")
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    return params


def print_table(rows: list[dict]) -> None:
    """A plain aligned table (no pandas needed for small outputs)."""
    if not rows:
        return
    columns = list(rows[0])
    cells = [[_format(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))


def _format(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "" if value is None else str(value)
