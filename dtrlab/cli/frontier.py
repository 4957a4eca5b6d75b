"""``dtrlab frontier LOG``: the bracket of the minimal budget, and bounds on compute per budget.

The options a user needs come first; the solver settings are fields of a
:class:`~dtrlab.solvers.frontier.FrontierPlan`, given as ``--plan FILE`` (a JSON object of
fields) or as the advanced flags of their own help group (a flag overrides the file).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .common import (finite_float, load_single_trace, nonnegative_int, overhead_limit, positive_float, positive_int,
                     print_table)

#: The advanced flags: (flag, plan field, argparse keywords). Their defaults are the plan's.
ADVANCED = [
    ("--policy-ratios", "policy_ratios", dict(metavar="RATIOS", help="the policies' sweep grid, also where --holes "
                                              "looks (default 0.05:1.0:0.005)")),
    ("--relax", "relax_method", dict(metavar="METHOD", help="the relaxation (lower side): lp (default) or mip")),
    ("--relax-time-limit", "relax_time_limit_s", dict(type=positive_float, metavar="S",
                                                      help="seconds per relaxation solve (default 4x --time-limit)")),
    ("--mip-probes", "mip_probes", dict(type=nonnegative_int, metavar="N", help="after the LP, probes of the 0/1 "
                                        "relaxation above its proof (stronger, slower; default 0)")),
    ("--solver", "solver", dict(help="stage model at the sampled budgets: milp (HiGHS, default) or cpsat (OR-Tools)")),
    ("--probe-solver", "probe_solver", dict(help="stage model, the probes below the best real run (default cpsat)")),
    ("--stage-probes", "stage_probes", dict(type=nonnegative_int, metavar="N",
                                            help="stage-model probes below the best real run (default 3)")),
    ("--chain", "chain", dict(type=positive_int, metavar="N",
                              help="longest recompute chain the stage model admits (default 3)")),
    ("--interval-samples", "interval_samples", dict(action="store_const", const=True,
                                                    help="also optimize the interval model at the sampled budgets")),
    ("--interval-probes", "interval_probes",
     dict(type=nonnegative_int, metavar="N",
          help="interval-model (CP-SAT) probes below the best real run, after the stage model's (default 0)")),
    ("--interval-time-limit", "interval_time_limit_s",
     dict(type=positive_float, metavar="S", help="seconds per interval-model solve (default --time-limit)")),
    ("--resolution", "resolution",
     dict(type=finite_float, metavar="FRACTION",
          help="bisect the relaxation's proof to this fraction of the peak (default 0.01)")),
    ("--no-bisect", "bisect", dict(action="store_const", const=False, help="only the sampled budgets")),
]
#: The plan fields of the main options.
MAIN = {"ratios": "--ratios", "policies": "--policies", "holes": "--holes", "time_limit_s": "--time-limit",
        "overhead_limit": "--overhead-limit"}


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "frontier", help="exact solvers: the minimal budget bracketed by a relaxation and real runs (dtrlab[solvers])",
        description="Bracket the smallest budget an on-demand rematerialization schedule fits: real runs from above "
                    "(policies, replayed solver schedules), proofs of a relaxation from below. Each finished solve "
                    "is kept as it finishes, so an interrupted run continues with --resume.")
    parser.add_argument("log", metavar="LOG", help="log file")
    parser.add_argument("--ratios", default=None, help="budgets to solve, as fractions of the peak: a list 0.5,0.7 or "
                                                       "START:STOP:STEP (default 0.6,0.8,1.0)")
    parser.add_argument("--policies", default=None, help="policies whose lowest passing budget on the grid is a real "
                                                         "run (comma list; '' for none; default dtr)")
    parser.add_argument("--holes", action="store_const", const=True, default=None,
                        help="also solve at DTR's holes on the policies' grid")
    parser.add_argument("--time-limit", type=positive_float, default=None, metavar="S",
                        help="seconds per stage-model solve (default 30)")
    parser.add_argument("--overhead-limit", type=overhead_limit, default=None,
                        help="thrash once total compute exceeds this multiple of the baseline (default 2.0)")
    parser.add_argument("--plan", metavar="FILE", default=None,
                        help="a JSON object of plan fields (docs/solvers.md), e.g. {\"interval_probes\": 4}; "
                             "the flags given override it")
    parser.add_argument("--resume", action="store_true",
                        help="take the solves of an interrupted run and of the output file (same trace, kind, "
                             "solver and budget) instead of repeating them; they must have the same "
                             "--overhead-limit and --time-limit (checked); their other limits are taken as they were")
    parser.add_argument("--cache", metavar="DIR", default=None,
                        help="sweep cache directory (default $DTRLAB_CACHE or ~/.cache/dtrlab)")
    parser.add_argument("--out", default="", metavar="PARQUET",
                        help="where to write (default frontier-<trace>.parquet); a directory gets <trace>.parquet; "
                             "finished solves are kept in <out without .parquet>.solves/ until it is written")
    advanced = parser.add_argument_group("advanced (solver settings; also fields of --plan FILE)")
    for flag, name, keywords in ADVANCED:
        advanced.add_argument(flag, dest=name, default=None, **keywords)
    parser.add_argument("--quiet", action="store_true", help="no progress bar and no line per solve")
    parser.set_defaults(handler=run)


def build_plan(args):
    """The plan: its defaults, then ``--plan FILE``, then the flags given."""
    from ..solvers.frontier import FrontierPlan, PlanError

    fields, source = {}, None
    if args.plan:
        source = args.plan
        try:
            fields = json.loads(Path(args.plan).read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"--plan {args.plan}: not JSON (line {error.lineno}: {error.msg})") from None
        except (OSError, UnicodeDecodeError) as error:
            raise ValueError(f"--plan {args.plan}: {getattr(error, 'strerror', None) or error}") from None
        try:
            FrontierPlan.from_dict(fields)
        except PlanError as error:
            raise ValueError(f"--plan {args.plan}: {error}") from None
    flags = {}
    if args.ratios is not None:
        flags["ratios"] = _ratios(args.ratios)
    if args.policies is not None:
        flags["policies"] = [p for p in args.policies.split(",") if p]
    for name, value in (("holes", args.holes), ("time_limit_s", args.time_limit),
                        ("overhead_limit", args.overhead_limit)):
        if value is not None:
            flags[name] = value
    for flag, name, _ in ADVANCED:
        if getattr(args, name) is not None:
            flags[name] = getattr(args, name)
    try:
        return FrontierPlan.from_dict({**fields, **flags})
    except PlanError as error:
        flag = MAIN.get(error.field) or next((f for f, n, _ in ADVANCED if n == error.field), None)
        if error.field in flags and flag:
            raise ValueError(f"{flag}: {error.problem}") from None
        raise ValueError(f"--plan {source}: {error}" if source else str(error)) from None


def _ratios(text: str):
    from ..sweep.budget_sweep import parse_ratios

    try:
        ratios = parse_ratios(text if ":" in text else text.split(","))
    except (ValueError, OverflowError) as error:
        raise ValueError(f"--ratios: {error}") from None
    return ratios


def run(args) -> int:
    from ..solvers.frontier import SolveJournal, SolverFaultWarning, compute_frontier, frontier_path, write_frontier
    from ..solvers.problem import SCOPE_NOTE

    from ..policies import get_policy

    plan = build_plan(args)
    for name in plan.policies:
        get_policy(name)  # an unknown name fails now, not after the first solves
    try:
        import highspy  # noqa: F401
        from ortools.sat.python import cp_model  # noqa: F401
    except ImportError:
        raise ValueError("dtrlab frontier needs the solver extra: pip install 'dtrlab[solvers]'") from None
    trace = load_single_trace(args.log)
    out = Path(args.out) if args.out else Path(f"frontier-{trace.name}.parquet")
    if out.is_dir():
        out = frontier_path(out, trace.name)
    journal = SolveJournal(out.with_suffix(".solves") if out.suffix == ".parquet" else Path(f"{out}.solves"),
                           trace, plan)
    reuse = _resumed_solves(out, trace, plan, journal) if args.resume else []
    if not args.resume and journal.entries():
        raise ValueError(f"{journal.directory} holds {len(journal.entries())} solves of an interrupted run: "
                         "--resume continues it (or delete that directory to start over)")
    print(f"scope: {SCOPE_NOTE}", flush=True)

    from ..progress import progress_bar

    # The number of solves is adaptive (bisection, probes), so the bar counts them and their rate, with no total.
    bar = progress_bar(desc=f"frontier {trace.name}", unit="solve", disable=args.quiet)

    def progress(row):
        bar.update()
        if args.quiet:
            return
        detail = ""
        if row["kind"] == "policy":
            detail = f", {row['solver']} passes (overhead {row['overhead']:.3f})"
        elif row["kind"] == "relax":
            bound = row["overhead_bound"]
            detail = f", {row['n_vars']} vars" + (f", overhead >= {bound:.4f}" if bound is not None else "")
        elif row["remat_compute"] is not None:
            detail = f", recompute {row['remat_compute']:g}"
        if row["replay_passed"] is not None and row["kind"] != "policy":
            detail += f", replay {'pass' if row['replay_passed'] else 'FAIL ' + row['disagreement']}"
        bar.write(f"  {row['kind']:7} {row['solver'] or '':8} ratio {row['ratio']:.4f}: {row['status']}{detail} "
                  f"({row['solve_seconds'] or 0:.1f}s)")

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SolverFaultWarning)  # printed below, one line each
        try:
            frontier = compute_frontier(trace, plan, cache=args.cache or True, reuse=reuse, progress=progress,
                                        journal=journal)
        except KeyboardInterrupt:
            print(f"{len(journal.entries())} finished solves are kept in {journal.directory}; the same command "
                  "with --resume continues", file=sys.stderr)
            raise
        finally:
            bar.close()
    write_frontier(frontier, out)
    journal.clear()
    rows = frontier.rows[frontier.rows.kind.isin(["sample", "relax"])]
    print_table([{"kind": r.kind, "ratio": round(r.budget_bytes / frontier.peak_bytes, 4), "status": r.status,
                  "overhead": r.overhead, "overhead_bound": r.overhead_bound, "replay": r.replay_passed,
                  "dtr": r.dtr_status, "dtr_overhead": r.dtr_overhead, "seconds": round(r.solve_seconds, 1)}
                 for r in rows.itertuples()])
    for fault in frontier.faults:
        print(f"warning: solver fault, not used as a proof: {fault}")
    print(f"\n{frontier.summary()}\nscope: {SCOPE_NOTE}\nwrote {out}")
    return 0


def _resumed_solves(out: Path, trace, plan, journal) -> list[dict]:
    """The solves ``--resume`` takes: those of the output file, unless it is stale (a warning), and
    the journal's; a file or journal made with other limits is an error."""
    from ..solvers.frontier import StaleFrontier, read_frontier

    reuse = []
    if out.exists():
        try:
            earlier = read_frontier(out, trace)
        except StaleFrontier as stale:
            print(f"warning: not resuming from {out}: {stale}")
        else:
            if (earlier.overhead_limit, earlier.time_limit_s) != (plan.overhead_limit, plan.time_limit_s):
                raise ValueError(f"--resume: {out} was computed with --overhead-limit {earlier.overhead_limit} "
                                 f"and --time-limit {earlier.time_limit_s}; give the same, or write elsewhere")
            reuse = [r for r in earlier.rows.to_dict("records") if r["kind"] != "policy"]
    kept = journal.rows()  # ValueError if made with other limits
    reuse += kept
    print(f"resuming: {len(reuse)} solves ({len(kept)} kept from an interrupted run in {journal.directory})")
    return reuse
