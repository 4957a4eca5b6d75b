"""Regenerate ``results/shipped/search/``: the study, its tables, the policies file and the comparisons.

    dtrlab ship search --study search.db --top 5 --refine --tuning traces \
        --heldout ../shared/dtr-logs --heldout traces/models --heldout-ratios 0.05:1.0:0.005 -j 2

(the shipped results' command; add ``--heldout-ratios 0.05:1.0:0.001`` for the finer census, hours of CPU).

Writes (CSV and JSON only: the shipped sweep layer reads the ``.parquet`` files
under ``results/shipped``):

* ``study.db``: the Optuna study (resume it with ``dtrlab search --storage``);
* ``trials.csv``, ``pareto.csv``: every completed trial, the Pareto front;
* ``policies.json``: the best Pareto trials as ``searched_1..N`` (registered at import);
* ``comparison.csv``, ``comparison_per_trace.csv``: holes, threshold and overhead of
  the compared policies on each trace set, with the set's role (tuning, held-out), its
  grid (``--heldout-ratios`` is repeatable: one comparison per grid), whether the
  censuses were refined (``--refine``) and the policy swept (``swept``: a searched
  policy's ``score_search`` label). Incremental: a comparison the files already hold for
  the same traces, grid, refinement and swept policy is kept, not recomputed;
* ``inclusion_pairs.csv``, ``inclusion_prediction.csv``: the inclusion census where
  holes can be (:func:`hole_zones`).

The CSV files are written atomically, and the sha256 and size of every file written
are recorded in the bundle's ``MANIFEST.json`` (``results/shipped/MANIFEST.json`` when
``--out`` lies in the shipped bundle, else ``OUT/MANIFEST.json``; other entries kept).
:func:`~dtrlab.search.read_shipped_csv` reads them back only if they match it (notebook 10 reads them so).
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pandas as pd

from ..integrity import IntegrityError, atomic_write_bytes, write_manifest
from ..search.report import SHIPPED_SEARCH, compare, export_policies
from ..search.shipped import manifest_root, read_shipped_csv
from ..search.space import make_policy
from ..search.study import open_study, pareto_table, trials_table
from ..sweep import QUIET, Execution, parse_ratios, sweep
from ..trace import load_directory

BASELINES = ["dtr", "msps", "monotone"]
HELDOUT_RATIOS = "0.05:1.0:0.01"
#: What a comparison row is of: a policy's census on a trace set at a grid.
COMPARISON_KEY = ["traces_role", "trace_set", "ratios", "refined", "policy", "swept"]
#: The inclusion census leaves out monotone: its runs at neighbouring budgets are identical
#: unless the cap changes, and it has no holes to predict.
INCLUSION_POLICIES = ["dtr", "msps"]


def hole_zones(traces: dict, policies: list[str], ratios: str, pad: float = 0.01) -> dict[str, list[float]]:
    """Per trace, the grid ``ratios`` between (first passing ratio - pad) and (threshold + pad)
    over ``policies`` (their sweeps at ``ratios``, usually cached)."""
    from ..analysis.holes import find_holes

    grid = parse_ratios(ratios)
    zones = {}
    for name, trace in traces.items():
        low, high = [], []
        for policy in policies:
            census = find_holes(sweep(trace, policy, ratios=ratios, execution=QUIET))
            passing = census.samples.loc[census.samples["status"] == "pass", "ratio"]
            low.append(passing.min())
            high.append(census.threshold_ratio)
        zones[name] = [r for r in grid if min(low) - pad <= r <= max(high) + pad]
    return zones


def write_csv(frame: pd.DataFrame, path: Path, written: list[Path]) -> None:
    atomic_write_bytes(path, frame.to_csv(index=False).encode())
    written.append(path)


def shipped_comparison(out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The comparison files already in ``out`` (checked against their manifest), or empty frames.

    A file that is missing, damaged or without a ``swept`` column (written before it) is not
    reused: its comparisons are recomputed.
    """
    none = pd.DataFrame(columns=COMPARISON_KEY), pd.DataFrame(columns=[*COMPARISON_KEY, "trace"])
    try:
        summary = read_shipped_csv(out / "comparison.csv")
        per_trace = read_shipped_csv(out / "comparison_per_trace.csv")
    except (IntegrityError, FileNotFoundError):
        return none
    return (summary, per_trace) if "swept" in summary and "swept" in per_trace else none


def kept_comparison(summary: pd.DataFrame, per_trace: pd.DataFrame, traces: dict,
                    key: dict) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """The rows of ``summary`` and ``per_trace`` for ``key`` (a value per :data:`COMPARISON_KEY`), if
    they are of exactly the traces ``traces``; else ``(None, None)``."""
    def of_key(frame):
        match = pd.Series(True, index=frame.index)
        for column, value in key.items():
            match &= frame[column].astype(type(value)) == value
        return frame[match]

    kept, kept_traces = of_key(summary), of_key(per_trace)
    if len(kept) != 1 or sorted(kept_traces["trace"]) != sorted(traces):
        return None, None
    return kept.reset_index(drop=True), kept_traces.reset_index(drop=True)


def add_arguments(parser) -> None:
    """The options of ``dtrlab ship search``."""
    parser.add_argument("--study", type=Path, help="the study's SQLite file (default: the shipped one)")
    parser.add_argument("--out", type=Path, default=SHIPPED_SEARCH)
    parser.add_argument("--tuning", type=Path, default=Path("traces"), help="directory of the tuning trace set")
    parser.add_argument("--tuning-ratios", default="0.05:1.0:0.002")
    parser.add_argument("--heldout", type=Path, action="append",
                        help="directory of a held-out trace set (repeatable; default ../shared/dtr-logs)")
    parser.add_argument("--heldout-ratios", action="append",
                        help="grid of the held-out comparison (repeatable: one comparison per grid; default "
                             f"{HELDOUT_RATIOS})")
    parser.add_argument("--exclude", action="append", default=[], metavar="PREFIX",
                        help="leave out held-out traces whose name starts with PREFIX (repeatable; e.g. a trace too slow "
                             "for the machine at hand: say so where the results are reported)")
    parser.add_argument("--refine", action="store_true",
                        help="refine every compared sweep (probes beside suspicious samples, edges bisected): holes "
                             "narrower than the step are found where a suspicious sample points at them")
    parser.add_argument("--inclusion-ratios", default="0.05:1.0:0.02")
    parser.add_argument("--top", type=int, default=3)
    parser.add_argument("--inclusion-baselines-only", action="store_true",
                        help="the inclusion census of the baseline policies only (before a search)")
    parser.add_argument("--skip", action="append", default=[], choices=["study", "comparison", "inclusion"])
    parser.add_argument("-j", "--jobs", type=int, default=1)


def run(args, parser) -> int:
    """``dtrlab ship search``: the study's tables, the comparisons and the inclusion census, as asked."""
    heldout_sets = args.heldout or [Path("../shared/dtr-logs")]
    heldout_grids = args.heldout_ratios or [HELDOUT_RATIOS]
    for option, directory in [("--tuning", args.tuning), *(("--heldout", d) for d in heldout_sets)]:
        if "comparison" not in args.skip and not directory.is_dir():
            parser.error(f"{option} {directory}: not a directory of traces")
    for option, grid in [("--tuning-ratios", args.tuning_ratios), ("--inclusion-ratios", args.inclusion_ratios),
                         *(("--heldout-ratios", g) for g in heldout_grids)]:
        try:  # a typo is an error now, not after an hour of sweeps
            parse_ratios(grid)
        except ValueError as exc:
            parser.error(f"{option} {grid}: {exc}")
    warnings.filterwarnings("ignore", category=UserWarning)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    if "study" not in args.skip:
        if args.study and args.study.resolve() != (out / "study.db").resolve():
            shutil.copyfile(args.study, out / "study.db")
        study = open_study(out / "study.db")
        write_csv(trials_table(study), out / "trials.csv", written)
        write_csv(pareto_table(study), out / "pareto.csv", written)
        export_policies(study, out / "policies.json", top=args.top)
        written += [out / "study.db", out / "policies.json"]
        print(f"wrote the study's tables and {args.top} policies to {out}")

    from ..policies import get_policy
    from ..policies.searched import load_searched

    searched = list(load_searched(out / "policies.json")) if (out / "policies.json").exists() else []
    # Searched policies are swept as their score_search parameters: the search cached those sweeps.
    policies = {name: name for name in BASELINES}
    policies.update({name: make_policy({k: v for k, v in get_policy(name).params.items() if k != "arithmetic"})
                     for name in searched})
    if "comparison" not in args.skip:
        tuned = set(open_study(out / "study.db").user_attrs.get("tuning_traces", []))
        kept_summary, kept_per_trace = shipped_comparison(out)
        summaries, per_trace = [], []
        for role, directory, ratios in [("tuning set", args.tuning, args.tuning_ratios),
                                        *(("held-out", d, r) for d in heldout_sets for r in heldout_grids)]:
            traces = load_directory(directory)
            if role == "held-out":
                traces = {n: t for n, t in traces.items() if not n.startswith(tuple(args.exclude))}
            groups = {role: traces}
            if role == "tuning set":  # the traces of the tuning set the search used, and the rest
                groups = {"tuned": {n: t for n, t in traces.items() if n in tuned},
                          "tuning set, not tuned": {n: t for n, t in traces.items() if n not in tuned}}
            for group, members in groups.items():
                if not members:
                    continue
                where = dict(traces_role=group, trace_set=directory.name, ratios=ratios, refined=args.refine)
                for name, policy in policies.items():
                    swept = get_policy(policy).label
                    summary, table = kept_comparison(kept_summary, kept_per_trace, members,
                                                     {**where, "policy": name, "swept": swept})
                    if summary is None:
                        summary, table = compare({name: policy}, members, ratios=ratios,
                                                 execution=Execution(jobs=args.jobs), refine=args.refine)
                        summary, table = summary.assign(**where, swept=swept), table.assign(**where, swept=swept)
                    summaries.append(summary)
                    per_trace.append(table)
                shown = pd.concat(summaries[-len(policies):], ignore_index=True)
                print(group, directory.name, ratios, "\n", shown.drop(columns="swept").to_string(index=False),
                      flush=True)
        write_csv(pd.concat(summaries, ignore_index=True), out / "comparison.csv", written)
        write_csv(pd.concat(per_trace, ignore_index=True), out / "comparison_per_trace.csv", written)

    if "inclusion" not in args.skip:
        from ..analysis.inclusion import InclusionCensus, inclusion_census

        # Where holes can be: per tuning-set trace, from the first passing budget to the
        # threshold of any compared policy (+-0.01), at the search's step; incremental:
        # policies already in the file are not recomputed.
        traces = load_directory(args.tuning)
        wanted = INCLUSION_POLICIES + ([] if args.inclusion_baselines_only else searched[:1])
        zones = hole_zones(traces, wanted, args.tuning_ratios)
        path = out / "inclusion_pairs.csv"
        done = read_shipped_csv(path) if path.exists() else pd.DataFrame(columns=["policy"])
        missing = [p for p in wanted if get_policy(p).label not in set(done["policy"])]
        if missing:
            new = inclusion_census(traces, missing, ratios=zones, execution=Execution(jobs=args.jobs)).pairs
            done = pd.concat([done, new], ignore_index=True) if len(done) else new
        done = done[done["policy"].isin([get_policy(p).label for p in wanted])]
        write_csv(done, path, written)
        prediction = InclusionCensus(ratios=(), pairs=done).prediction()
        write_csv(prediction, out / "inclusion_prediction.csv", written)
        print(prediction.to_string(index=False))
    if written:
        write_manifest(manifest_root(out), written)
    return 0

