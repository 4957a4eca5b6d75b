"""``dtrlab holes SWEEP.parquet``: the hole census of a saved sweep."""

from __future__ import annotations

from pathlib import Path

from .common import load_traces, print_table


def register(subparsers) -> None:
    parser = subparsers.add_parser("holes", help="census table and holes of a sweep parquet (from dtrlab sweep)")
    parser.add_argument("paths", nargs="+", metavar="PARQUET", help="sweep frame(s), or a directory of them")
    parser.add_argument("--list", action="store_true", help="also list every hole with its byte interval")
    parser.add_argument("--anatomy", action="store_true",
                        help="list every hole with its kind (oom / cliff / near-miss / limit), the overhead limit at "
                             "which it closes and the recompute it needs, from runs without a limit at its failing "
                             "samples (needs --traces; docs/sweeps.md, \"Hole anatomy\")")
    parser.add_argument("--traces", nargs="+", metavar="LOG", default=[],
                        help="with --anatomy: the swept traces (log files, directories or zips), to run the holes' "
                             "failing budgets without a limit")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(handler=run)


def run(args) -> int:
    import pandas as pd  # imported when the command runs, so other commands start fast

    from ..analysis.holes import census_table, configurations, find_holes

    files = []
    for path in map(Path, args.paths):
        if not path.exists():
            raise FileNotFoundError(f"no sweep parquet at {path} (write one with dtrlab sweep LOG --out FILE)")
        files += sorted(path.glob("*.parquet")) if path.is_dir() else [path]
    if not files:
        raise FileNotFoundError(f"no .parquet files in {', '.join(args.paths)} "
                                "(write one with dtrlab sweep LOG --out FILE)")
    frame = pd.concat([read_sweep(f) for f in files], ignore_index=True)
    traces = _traces_by_name(args.traces, set(frame["trace"])) if args.anatomy else {}
    table = census_table(frame)
    print_table(table.where(table.notna(), None).to_dict("records"))
    if args.list or args.anatomy:
        holes = [_holes(find_holes(group), traces, args.quiet).assign(trace=key[0], policy=key[1])
                 for key, group in configurations(frame)]
        listed = pd.concat(holes, ignore_index=True)
        columns = ["trace", "policy", "fail_low_ratio", "fail_high_ratio", "pass_below_bytes", "fail_low_bytes",
                   "fail_high_bytes", "pass_above_bytes", "width_bytes", "samples", "kinds",
                   *(["anatomy", "closes_at", "needed_remat"] if args.anatomy else [])]
        print()
        print_table(listed[columns].where(listed[columns].notna(), None).to_dict("records"))
    return 0


def _traces_by_name(paths: list[str], names: set[str]) -> dict:
    """The traces at ``paths`` by name; every one of ``names`` (the swept traces) must be among them."""
    from ..suggest import did_you_mean

    if not paths:
        raise ValueError("--anatomy runs the holes' failing budgets without a limit: name the swept traces with "
                         "--traces LOG...")
    traces = {trace.name: trace for trace in load_traces(paths)}
    for name in sorted(names - set(traces)):
        raise ValueError(f"--traces holds no trace named {name!r}{did_you_mean(name, list(traces))}")
    return traces


def _holes(census, traces: dict, quiet: bool):
    """``census.holes``, with :data:`~dtrlab.analysis.anatomy.ANATOMY_COLUMNS` when ``traces`` are given."""
    from ..analysis.anatomy import hole_anatomy, unlimited_runs
    from ..sweep.execution import Execution

    if not traces or census.holes.empty:
        return census.holes
    return hole_anatomy(census, unlimited_runs(traces[census.trace], census, execution=Execution(progress=not quiet)))


#: Columns every sweep frame has (older frames lack the memory columns, which are filled in).
SWEEP_COLUMNS = ("trace", "policy", "overhead_limit", "withhold", "ratio", "budget_bytes", "status")


def read_sweep(path: Path):
    """A sweep frame from a parquet file; another file (damaged, or a frontier's) is an error naming it."""
    import pandas as pd

    try:
        frame = pd.read_parquet(path)
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise ValueError(f"{path}: not a readable parquet file ({' '.join(str(exc).split())})") from None
    missing = [c for c in SWEEP_COLUMNS if c not in frame.columns]
    if missing:
        kind = " (a dtrlab frontier file?)" if "kind" in frame.columns and "overhead_bound" in frame.columns else ""
        raise ValueError(f"{path} is not a sweep frame{kind}: it lacks column(s) {', '.join(missing)}; "
                         "write one with dtrlab sweep LOG --out FILE")
    return frame
