"""``dtrlab frontier LOG``: the bracket of the minimal budget, and bounds on compute per budget."""

from __future__ import annotations

from pathlib import Path

from .common import load_single_trace, print_table


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "frontier", help="exact solvers: the minimal budget bracketed by a relaxation and real runs (dtrlab[solvers])")
    parser.add_argument("log", metavar="LOG", help="log file")
    parser.add_argument("--ratios", default="0.6,0.8,1.0",
                        help="budgets to solve, as fractions of the peak: a list 0.5,0.7 or START:STOP:STEP")
    parser.add_argument("--time-limit", type=float, default=30.0, metavar="S",
                        help="seconds per stage-model solve (default 30)")
    parser.add_argument("--relax", default="lp", help="the relaxation (lower side): lp (default) or mip")
    parser.add_argument("--relax-time-limit", type=float, default=None, metavar="S",
                        help="seconds per relaxation solve (default 4x --time-limit)")
    parser.add_argument("--mip-probes", type=int, default=0,
                        help="after the LP, probes of the 0/1 relaxation above its proof (stronger, slower; default 0)")
    parser.add_argument("--solver", default="milp", help="stage model, sampled budgets: milp (HiGHS) or cpsat (OR-Tools)")
    parser.add_argument("--probe-solver", default="cpsat", help="stage model, the probes below the best real run")
    parser.add_argument("--stage-probes", type=int, default=3, help="stage-model probes below the best real run")
    parser.add_argument("--interval-probes", type=int, default=0,
                        help="interval-model (CP-SAT) probes below the best real run, after the stage model's")
    parser.add_argument("--interval-time-limit", type=float, default=None, metavar="S",
                        help="seconds per interval-model solve (default --time-limit)")
    parser.add_argument("--interval-samples", action="store_true",
                        help="also optimize the interval model at the sampled budgets")
    parser.add_argument("--resume", action="store_true",
                        help="take solves already in the output file (same trace, kind, solver and budget) from "
                             "it instead of repeating them; the file must have the same --overhead-limit and "
                             "--time-limit (checked); its other limits are taken as they were")
    parser.add_argument("--overhead-limit", type=float, default=2.0)
    parser.add_argument("--chain", type=int, default=3, help="longest recompute chain the stage model admits (default 3)")
    parser.add_argument("--resolution", type=float, default=0.01,
                        help="bisect the relaxation's proof to this fraction of the peak (default 0.01)")
    parser.add_argument("--no-bisect", action="store_true", help="only the sampled budgets")
    parser.add_argument("--policies", default="dtr",
                        help="policies whose lowest passing budget on --policy-ratios is a real run (comma list; "
                             "'' for none)")
    parser.add_argument("--policy-ratios", metavar="RATIOS", default="0.05:1.0:0.005",
                        help="the policies' sweep grid (also where --holes looks)")
    parser.add_argument("--holes", action="store_true", help="also solve at DTR's holes on --policy-ratios")
    parser.add_argument("--cache", metavar="DIR", default=None,
                        help="sweep cache directory (default $DTRLAB_CACHE or ~/.cache/dtrlab)")
    parser.add_argument("--out", default="", metavar="PARQUET",
                        help="where to write (default frontier-<trace>.parquet); a directory gets <trace>.parquet")
    parser.set_defaults(handler=run)


def run(args) -> int:
    from ..solvers.frontier import compute_frontier, frontier_path, hole_budgets, read_frontier, write_frontier
    from ..sweep.budget_sweep import parse_ratios

    try:
        import highspy  # noqa: F401
        from ortools.sat.python import cp_model  # noqa: F401
    except ImportError:
        raise ValueError("dtrlab frontier needs the solver extra: pip install 'dtrlab[solvers]'") from None
    trace = load_single_trace(args.log)
    ratios = parse_ratios(args.ratios if ":" in args.ratios else args.ratios.split(","))
    grid = parse_ratios(args.policy_ratios if ":" in args.policy_ratios else args.policy_ratios.split(","))
    cache = args.cache or True
    budgets = hole_budgets(trace, grid, overhead_limit=args.overhead_limit, cache=cache) if args.holes else ()
    policies = [p for p in args.policies.split(",") if p]

    def progress(row):
        detail = ""
        if row["kind"] == "policy":
            detail = f", {row['solver']} passes (overhead {row['overhead']:.3f})"
        elif row["kind"] == "relax":
            bound = row["overhead_bound"]
            detail = f", {row['n_vars']} vars" + (f", overhead >= {bound:.4f}" if bound is not None else "")
        elif row["remat_compute"] is not None:
            detail = f", recompute {row['remat_compute']}"
        if row["replay_passed"] is not None and row["kind"] != "policy":
            detail += f", replay {'pass' if row['replay_passed'] else 'FAIL ' + row['disagreement']}"
        print(f"  {row['kind']:7} ratio {row['ratio']:.4f}: {row['status']}{detail} ({row['solve_seconds'] or 0:.1f}s)",
              flush=True)

    out = Path(args.out) if args.out else Path(f"frontier-{trace.name}.parquet")
    if out.is_dir():
        out = frontier_path(out, trace.name)
    reuse = None
    if args.resume and out.exists():
        earlier = read_frontier(out, trace)
        if (earlier.overhead_limit, earlier.time_limit_s) != (args.overhead_limit, args.time_limit):
            raise ValueError(f"--resume: {out} was computed with --overhead-limit {earlier.overhead_limit} and "
                             f"--time-limit {earlier.time_limit_s}; give the same, or write elsewhere")
        reuse = earlier.rows
        print(f"resuming: {len(reuse)} solves of {out}")
    frontier = compute_frontier(trace, ratios=ratios, budgets=budgets, overhead_limit=args.overhead_limit,
                                time_limit_s=args.time_limit, solver=args.solver, probe_solver=args.probe_solver,
                                chain=args.chain, resolution=args.resolution, bisect=not args.no_bisect,
                                relax_method=args.relax, relax_time_limit_s=args.relax_time_limit,
                                policies=policies, policy_ratios=grid, cache=cache, stage_probes=args.stage_probes,
                                mip_probes=args.mip_probes, interval_probes=args.interval_probes,
                                interval_samples=args.interval_samples,
                                interval_time_limit_s=args.interval_time_limit, reuse=reuse, progress=progress)
    write_frontier(frontier, out)
    rows = frontier.rows[frontier.rows.kind.isin(["sample", "relax"])]
    print_table([{"kind": r.kind, "ratio": round(r.budget_bytes / frontier.peak_bytes, 4), "status": r.status,
                  "overhead": r.overhead, "overhead_bound": r.overhead_bound, "replay": r.replay_passed,
                  "dtr": r.dtr_status, "dtr_overhead": r.dtr_overhead, "seconds": round(r.solve_seconds, 1)}
                 for r in rows.itertuples()])
    print(f"\n{frontier.summary()}\nwrote {out}")
    return 0
