"""``dtrlab variants LOG... --ratios 0.05:1.0:0.01``: the hole census of many policies over many traces."""

from __future__ import annotations

from .common import (add_memory_arguments, execution_argument, jobs_count, load_traces, output_file, overhead_limit,
                     print_table, ratio_grid, semantics_argument)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "variants", help="hole census per trace and policy: failures, non-monotone failures, holes, threshold")
    parser.add_argument("logs", metavar="LOG", nargs="+", help="log files, directories of logs or zips")
    parser.add_argument("--policies",
                        help="comma-separated policy names (default: h_DTR, its simrd siblings, TwoPhase and every "
                             "score variant; `dtrlab run --help` lists every name)")
    parser.add_argument("--ratios", default="0.05:1.0:0.01",
                        help="START:STOP:STEP (both ends included) or comma-separated ratios (default 0.05:1.0:0.01)")
    parser.add_argument("--overhead-limit", type=overhead_limit, default=2.0,
                        help="thrash once total compute exceeds this multiple of the baseline (default 2.0)")
    parser.add_argument("--jobs", type=jobs_count, default=1, help="parallel processes (-1: all cores)")
    parser.add_argument("--backend", default="loky", choices=["sequential", "fork", "loky", "dask"],
                        help="how to run the sweeps (default loky; dask needs --scheduler)")
    parser.add_argument("--scheduler", metavar="ADDRESS", help="Dask scheduler address, e.g. tcp://127.0.0.1:8786")
    parser.add_argument("--no-cache", action="store_true", help="simulate every budget again instead of reusing "
                                                                "the sweep cache")
    parser.add_argument("--save", metavar="PATH", type=output_file,
                        help="write the census table to PATH (.parquet or .csv)")
    parser.add_argument("--save-samples", metavar="PATH", type=output_file,
                        help="write every sweep row to PATH (.parquet or .csv)")
    add_memory_arguments(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(handler=variants)


def variants(args) -> int:
    from ..analysis.variant_census import DEFAULT_POLICIES, variant_census

    for path in (args.save, args.save_samples):
        if path and not path.endswith((".parquet", ".csv")):
            raise ValueError(f"--save and --save-samples write .parquet or .csv files, got {path}")
    policies = ([name.strip() for name in args.policies.split(",") if name.strip()] if args.policies is not None
                else list(DEFAULT_POLICIES))
    if not policies:
        raise ValueError(f"--policies {args.policies!r} names no policy; give names such as dtr,twophase")
    ratios = ratio_grid(args.ratios)
    execution = execution_argument(args)
    census = variant_census(load_traces(args.logs), policies, ratios=ratios, semantics=semantics_argument(args),
                            execution=execution)
    table = census.table
    print(f"{len(census.ratios)} ratios from {min(census.ratios):.6g} to {max(census.ratios):.6g}")
    for trace, rows in table.groupby("trace", sort=False):
        print(f"\n{trace}")
        rows = rows.drop(columns="trace").astype(object)
        print_table(rows.where(rows.notna(), None).to_dict("records"))
    for path, frame in ((args.save, table), (args.save_samples, census.samples)):
        if path:
            frame.to_parquet(path) if path.endswith(".parquet") else frame.to_csv(path, index=False)
            print(f"\nwrote {path}")
    return 0
