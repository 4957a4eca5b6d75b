"""``dtrlab frontier LOG``: optimal recompute at sampled budgets and the minimal feasible budget."""

from __future__ import annotations

from pathlib import Path

from .common import load_single_trace, print_table


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "frontier", help="exact solver: optimal recompute per budget and the minimal feasible budget (dtrlab[solvers])")
    parser.add_argument("log", metavar="LOG", help="log file")
    parser.add_argument("--ratios", default="0.6,0.8,1.0",
                        help="budgets to optimize, as fractions of the peak: a list 0.5,0.7 or START:STOP:STEP")
    parser.add_argument("--time-limit", type=float, default=30.0, metavar="S", help="seconds per solve (default 30)")
    parser.add_argument("--solver", default="milp", help="for the sampled budgets: milp (HiGHS) or cpsat (OR-Tools)")
    parser.add_argument("--probe-solver", default="cpsat", help="for the bisection's feasibility probes")
    parser.add_argument("--overhead-limit", type=float, default=2.0)
    parser.add_argument("--chain", type=int, default=3, help="longest recompute chain the model admits (default 3)")
    parser.add_argument("--resolution", type=float, default=0.01,
                        help="bisect the minimal budget to this fraction of the peak (default 0.01)")
    parser.add_argument("--no-bisect", action="store_true", help="only the sampled budgets")
    parser.add_argument("--holes", metavar="RATIOS", default="",
                        help="also optimize at DTR's holes found by sweeping these ratios (e.g. 0.3:1.0:0.01)")
    parser.add_argument("--out", default="", metavar="PARQUET",
                        help="where to write (default frontier-<trace>.parquet); a directory gets <trace>.parquet")
    parser.set_defaults(handler=run)


def run(args) -> int:
    from ..solvers.frontier import compute_frontier, frontier_path, hole_budgets, write_frontier
    from ..sweep.budget_sweep import parse_ratios

    try:
        import highspy  # noqa: F401
        from ortools.sat.python import cp_model  # noqa: F401
    except ImportError:
        raise ValueError("dtrlab frontier needs the solver extra: pip install 'dtrlab[solvers]'") from None
    trace = load_single_trace(args.log)
    ratios = parse_ratios(args.ratios if ":" in args.ratios else args.ratios.split(","))
    budgets = hole_budgets(trace, parse_ratios(args.holes), overhead_limit=args.overhead_limit) if args.holes else ()

    def progress(row):
        print(f"  {row['kind']:7} ratio {row['ratio']:.4f}: {row['status']}"
              + (f", recompute {row['remat_compute']}" if row['remat_compute'] is not None else "")
              + (f", replay {'pass' if row['replay_passed'] else 'FAIL ' + row['disagreement']}"
                 if row['replay_passed'] is not None else "") + f" ({row['solve_seconds']:.1f}s)", flush=True)

    frontier = compute_frontier(trace, ratios=ratios, budgets=budgets, overhead_limit=args.overhead_limit,
                                time_limit_s=args.time_limit, solver=args.solver, probe_solver=args.probe_solver, chain=args.chain,
                                resolution=args.resolution, bisect=not args.no_bisect, progress=progress)
    out = Path(args.out) if args.out else Path(f"frontier-{trace.name}.parquet")
    if out.is_dir():
        out = frontier_path(out, trace.name)
    write_frontier(frontier, out)
    samples = frontier.rows[frontier.rows.kind == "sample"]
    print_table([{"ratio": r.ratio, "budget_bytes": r.budget_bytes, "status": r.status, "overhead": r.overhead,
                  "gap": r.gap, "replay": r.replay_passed, "dtr": r.dtr_status, "dtr_overhead": r.dtr_overhead,
                  "seconds": round(r.solve_seconds, 1)} for r in samples.itertuples()])
    print(f"\n{frontier.summary()}\nwrote {out}")
    return 0
