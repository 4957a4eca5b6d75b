"""``dtrlab sweep LOG... --ratios 0.05:1.0:0.005 -j 2 --out sweep.parquet``: budget sweeps to parquet."""

from __future__ import annotations

from pathlib import Path

from .common import (add_policy_arguments, check_no_limit, execution_argument, jobs_count, load_traces, output_file, policy_params,
                     print_table, ratio_grid, semantics_argument)


def add_sweep_arguments(parser) -> None:
    """Budget and parallelism options shared by ``sweep`` and ``census``."""
    parser.add_argument("--ratios", default="0.05:1.0:0.005",
                        help="START:STOP:STEP (both ends included) or comma-separated ratios (default 0.05:1.0:0.005)")
    parser.add_argument("-j", "--jobs", type=jobs_count, default=1,
                        help="local worker processes (-1: all cores; default 1)")
    # dtrlab.sweep.BACKENDS (not imported here: it needs pandas; tests/test_cli_startup.py checks they agree)
    parser.add_argument("--backend", choices=("sequential", "fork", "loky", "dask"), default="loky",
                        help="where the runs go: sequential (here), fork (processes forked from this one; POSIX), "
                             "loky (joblib processes; default) or dask (needs --scheduler)")
    parser.add_argument("--scheduler", metavar="ADDRESS", help="run on this Dask scheduler, e.g. tcp://host:8786")
    cache = parser.add_mutually_exclusive_group()
    cache.add_argument("--cache", metavar="DIR", help="result cache directory (default $DTRLAB_CACHE or ~/.cache/dtrlab)")
    cache.add_argument("--no-cache", action="store_true", help="simulate everything, store nothing")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def sweep_options(args) -> dict:
    """``ratios``, ``policy`` (the instance, with its ``--param``), ``semantics`` and ``execution`` for
    :func:`dtrlab.sweep.sweep` (and the census) from the shared options."""
    from ..policies import get_policy

    execution = execution_argument(args)
    check_no_limit(args.overhead_limit, args.policy, policy_params(args.param))
    return dict(ratios=ratio_grid(args.ratios), policy=get_policy(args.policy, **policy_params(args.param)),
                semantics=semantics_argument(args), execution=execution)


def register(subparsers) -> None:
    parser = subparsers.add_parser("sweep", help="simulate many budgets of each trace; write a parquet frame")
    parser.add_argument("logs", nargs="+", metavar="LOG", help="log file, directory of logs, or logs.zip")
    add_policy_arguments(parser, unlimited=True)
    add_sweep_arguments(parser)
    parser.add_argument("--out", metavar="PARQUET", type=output_file,
                        help="write all rows here (one row per trace and budget)")
    parser.set_defaults(handler=run)


def run(args) -> int:
    import pandas as pd  # imported when the command runs, so other commands start fast

    from ..analysis.holes import census_table
    from ..sweep import sweep

    options = sweep_options(args)
    frame = pd.concat([sweep(trace, **options) for trace in load_traces(args.logs)],
                      ignore_index=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        frame.to_parquet(args.out, index=False)
        print(f"wrote {len(frame)} rows to {args.out}")
    print_table(census_table(frame).to_dict("records"))
    return 0
