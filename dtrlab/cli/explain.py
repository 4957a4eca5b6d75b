"""``dtrlab explain LOG --policy dtr --ratio 0.17``: why a run fails, one withheld storage at a time."""

from __future__ import annotations

from .common import (add_single_run_arguments, execution_argument, jobs_count, load_single_trace, output_file,
                     policy_params, print_table, semantics_argument)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "explain", help="print a failing run's failure record and which single withheld storage rescues it")
    add_single_run_arguments(parser)
    parser.add_argument("--jobs", type=jobs_count, default=1, help="parallel processes for the re-runs (-1: all cores)")
    parser.add_argument("--backend", default="loky", choices=["sequential", "fork", "loky", "dask"],
                        help="how to run the re-runs (default loky; dask needs --scheduler)")
    parser.add_argument("--scheduler", metavar="ADDRESS", help="Dask scheduler address, e.g. tcp://127.0.0.1:8786")
    parser.add_argument("--all", action="store_true",
                        help="list every withheld storage, not only those that change the outcome")
    parser.add_argument("--save", metavar="PATH", type=output_file,
                        help="write the whole table to PATH (.parquet or .csv)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(handler=explain)


def explain(args) -> int:
    from ..analysis.events import record
    from ..analysis.interventions import single_tensor_search

    trace = load_single_trace(args.log)
    if args.save and not args.save.endswith((".parquet", ".csv")):
        raise ValueError(f"--save writes .parquet or .csv files, got {args.save}")
    params = policy_params(args.param)
    semantics = semantics_argument(args)
    execution = execution_argument(args).uncached  # explain's search is not cached
    run = record(trace, args.policy, ratio=args.ratio, budget_bytes=args.budget, semantics=semantics,
                 candidate_scores=False, **params)
    result = run.result
    overhead = f"overhead {result.overhead:.4f}, " if result.passed else ""  # a failed run has none
    print(f"{trace.name} under {result.policy} at {result.budget_bytes:,} bytes: {result.status} "
          f"({overhead}{result.evictions} evictions, {result.remats} remats)")
    if result.passed:
        print("the run passes; nothing to explain")
        return 0
    print("\nfailure:")
    failure = run.failure.iloc[0].to_dict()
    width = max(map(len, failure))
    for key, value in failure.items():
        print(f"  {key.ljust(width)}  {value}")
    search = single_tensor_search(trace, args.policy, budget_bytes=result.budget_bytes, semantics=semantics,
                                  execution=execution, **params)
    table = search.table
    rescues = search.rescues
    print(f"\nwithholding each of the {len(table)} evicted storages: {len(rescues)} rescue the run, "
          f"{int((table['effect'] == 'kind changed').sum())} change the failure kind, "
          f"{int((table['effect'] == 'failure moved').sum())} move the failure point")
    shown = table if args.all else search.changes
    columns = ["storage", "size", "times_evicted", "first_evicted", "effect", "status", "overhead",
               "identical_decisions", "failure_step", "failure_step_delta"]
    if shown.empty:
        print("no single withheld storage changes the outcome")
    else:
        print()
        shown = shown[columns].astype(object)
        print_table(shown.where(shown.notna(), None).to_dict("records"))
    if args.save:
        if args.save.endswith(".parquet"):
            table.to_parquet(args.save)
        else:
            table.to_csv(args.save, index=False)
        print(f"\nwrote {args.save}")
    return 0
