"""``dtrlab holes SWEEP.parquet``: the hole census of a saved sweep."""

from __future__ import annotations

from pathlib import Path

from .common import print_table


def register(subparsers) -> None:
    parser = subparsers.add_parser("holes", help="census table and holes of a sweep parquet (from dtrlab sweep)")
    parser.add_argument("paths", nargs="+", metavar="PARQUET", help="sweep frame(s), or a directory of them")
    parser.add_argument("--list", action="store_true", help="also list every hole with its byte interval")
    parser.set_defaults(handler=run)


def run(args) -> int:
    import pandas as pd  # imported when the command runs, so other commands start fast

    from ..analysis.holes import CONFIGURATION, census_table, find_holes

    files = []
    for path in map(Path, args.paths):
        if not path.exists():
            raise FileNotFoundError(f"no sweep parquet at {path} (write one with dtrlab sweep LOG --out FILE)")
        files += sorted(path.glob("*.parquet")) if path.is_dir() else [path]
    if not files:
        raise FileNotFoundError(f"no .parquet files in {', '.join(args.paths)} "
                                "(write one with dtrlab sweep LOG --out FILE)")
    frame = pd.concat([read_sweep(f) for f in files], ignore_index=True)
    table = census_table(frame)
    print_table(table.where(table.notna(), None).to_dict("records"))
    if args.list:
        holes = [find_holes(group).holes.assign(trace=key[0], policy=key[1])
                 for key, group in frame.groupby(CONFIGURATION, sort=False)]
        listed = pd.concat(holes, ignore_index=True)
        columns = ["trace", "policy", "fail_low_ratio", "fail_high_ratio", "pass_below_bytes", "fail_low_bytes",
                   "fail_high_bytes", "pass_above_bytes", "width_bytes", "samples", "kinds"]
        print()
        print_table(listed[columns].to_dict("records"))
    return 0


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
