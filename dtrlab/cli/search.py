"""``dtrlab search TRACES... --trials N | --time SECONDS``: the policy search, resumable."""

from __future__ import annotations

from .common import (execution_argument, jobs_count, load_traces, output_file, positive_float, positive_int,
                     print_table, ratio_grid)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "search", help="search score policies for fewest holes, then lowest threshold, then lowest overhead "
                       "(Optuna, resumable SQLite storage)")
    parser.add_argument("logs", metavar="LOG", nargs="+", help="tuning traces: log files, directories or zips")
    parser.add_argument("--storage", default="search.db", type=output_file,
                        help="SQLite file of the study (default search.db); rerun with the same file to resume")
    parser.add_argument("--study", default="score_search", help="study name inside the storage")
    parser.add_argument("--trials", type=positive_int,
                        help="total finished (completed or pruned) trials to reach (a resumed search runs the rest)")
    parser.add_argument("--time", type=positive_float, metavar="SECONDS", help="stop starting new trials after SECONDS")
    parser.add_argument("--ratios", default="0.05:1.0:0.002",
                        help="START:STOP:STEP or comma-separated ratios (default 0.05:1.0:0.002)")
    parser.add_argument("--jobs", type=jobs_count, default=1, help="parallel processes per sweep (-1: all cores)")
    parser.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    parser.add_argument("--no-cache", action="store_true", help="do not reuse or store sweep results")
    parser.add_argument("--export", metavar="PATH", type=output_file,
                        help="write the best Pareto policies as a searched-policies JSON file to PATH")
    parser.add_argument("--top", type=positive_int, default=3, help="how many policies --export writes (default 3)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar (trials done, with an estimate of the time left under --trials)")
    parser.set_defaults(handler=search)


def search(args) -> int:
    from ..search import export_policies, open_study, run_search

    if args.trials is None and args.time is None:
        raise ValueError("give a budget: --trials N (total finished trials) and/or --time SECONDS")
    ratios = ratio_grid(args.ratios)
    result = run_search(load_traces(args.logs), args.storage, study_name=args.study, n_trials=args.trials,
                        timeout=args.time, ratios=ratios, seed=args.seed, execution=execution_argument(args))
    print(f"\n{result.ran} trials run in {result.seconds:.0f} s ({result.retried} interrupted trials retried); "
          f"{result.completed} completed in {args.storage}")
    print("\nPareto front (holes, mean threshold ratio, mean overhead of passing samples):")
    columns = ["trial", "holes", "threshold", "overhead", "policy"]
    print_table(result.pareto[columns].to_dict("records"))
    if args.export:
        document = export_policies(open_study(args.storage, args.study), args.export, top=args.top)
        print(f"\nwrote {len(document['policies'])} policies to {args.export}")
    return 0
