"""``dtrlab census [DIR] --delta 0.001 -j 2 --out results/census``: holes of every trace."""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from ..trace import load
from .common import add_policy_arguments, byte_count, check_no_limit, nonnegative_int, policy_params, print_table
from .sweep import add_sweep_arguments, sweep_options

SHARED_LOGS = Path("../shared/dtr-logs")
#: The anatomy columns the table shows (the hole kind, where it closes, the recompute its failing samples need).
ANATOMY_SHOWN = ["anatomy", "closes_at", "needed_remat"]


def register(subparsers) -> None:
    parser = subparsers.add_parser("census", help="sweep, census and refine the holes of every trace in a directory")
    parser.add_argument("directory", nargs="?", metavar="DIR",
                        help=f"directory of logs (default {SHARED_LOGS} if it exists, else traces/)")
    add_policy_arguments(parser, unlimited=True)
    add_sweep_arguments(parser)
    parser.add_argument("--out", default="results/census", help="output directory (default results/census)")
    parser.add_argument("--resolution", type=byte_count, metavar="BYTES",
                        help="bisect hole edges down to this many bytes (default: 1 MiB, or "
                             "1/10000 of the trace's baseline peak when finer)")
    parser.add_argument("--delta", type=delta_argument, metavar="DELTA",
                        help="sample the range START:STOP of --ratios every DELTA (a fraction of each trace's peak "
                             "such as 0.001, or bytes when >= 1), then bisect every pass/fail edge: every hole at "
                             "least DELTA wide in the range is found (docs/sweeps.md); without it, the grid is "
                             "--ratios and suspicious samples are probed")
    parser.add_argument("--probes", type=nonnegative_int, metavar="N",
                        help="budgets probed in each gap next to a suspicious passing sample "
                             "(default 8; 0 with --delta)")
    parser.add_argument("--no-refine", action="store_true", help="grid census only: no probing or bisection")
    parser.add_argument("--anatomy", action="store_true",
                        help="classify every hole (oom / cliff / near-miss / limit), with the overhead limit at which "
                             "it closes and the recompute it needs, from runs without a limit at its failing samples "
                             "(docs/sweeps.md, \"Hole anatomy\"); written to OUT/holes.parquet too")
    parser.set_defaults(handler=run)


def delta_argument(text: str) -> int | float:
    """A fraction of the peak (0 < DELTA < 1) or a whole number of bytes."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"DELTA is a fraction such as 0.001 or bytes such as 4194304, got {text!r}")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"DELTA must be a finite number, got {text!r}")
    if 0 < value < 1:
        return value
    if value >= 1 and value == int(value):
        return int(value)
    raise argparse.ArgumentTypeError(f"DELTA is a fraction in (0, 1) or a whole number of bytes >= 1, got {text!r}")


def run(args) -> int:
    from ..analysis.anatomy import census_anatomy
    from ..analysis.holes import run_census  # pandas: imported when the command runs

    if args.anatomy and args.no_refine:
        raise ValueError("--anatomy classifies the refined census's holes; drop --no-refine")
    if args.delta is not None and args.ratios.count(":") == 1:
        # With --delta only START:STOP is read (census_grid); a three-point grid validates them.
        start, stop = args.ratios.split(":")
        try:
            args.ratios += f":{(float(stop) - float(start)) / 2!r}"
        except ValueError:
            pass  # ratio_grid names the bad value
    options = sweep_options(args)
    if args.anatomy:
        check_no_limit(math.inf, args.policy, policy_params(args.param))  # the anatomy runs without a limit
    directory = args.directory or (SHARED_LOGS if SHARED_LOGS.is_dir() else Path("traces"))
    traces = load(directory)
    if not isinstance(traces, dict):
        traces = {traces.name: traces}
    started = time.perf_counter()
    census = run_census(traces, delta=args.delta, out=args.out, refine=not args.no_refine,
                        resolution=args.resolution, probes=args.probes, **options)
    holes = census.holes
    if args.anatomy:
        holes = census_anatomy(census, traces, execution=options["execution"])
        write_parquet(Path(args.out) / "holes.parquet", holes)
    seconds = time.perf_counter() - started
    table = census.table
    print_table(table.where(table.notna(), None).to_dict("records"))
    if len(holes):
        print()
        columns = ["trace", "fail_low_ratio", "fail_high_ratio", "pass_below_bytes", "pass_above_bytes",
                   "width_bytes", "samples", "kinds", "hidden", *(ANATOMY_SHOWN if args.anatomy else [])]
        print_table(holes[columns].where(holes[columns].notna(), None).to_dict("records"))
    print(f"\n{len(traces)} traces in {seconds:.1f} s; wrote {', '.join(census.files[-2:])} and one parquet per trace "
          f"in {args.out}")
    return 0


def write_parquet(path: Path, frame) -> None:
    """``frame`` as parquet at ``path``, atomically."""
    import io

    from ..integrity import atomic_write_bytes

    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    atomic_write_bytes(path, buffer.getvalue())
