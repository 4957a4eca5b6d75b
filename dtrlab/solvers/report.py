"""Tables and the figure of notebook 09: the frontier bracket beside DTR and the policy zoo."""

from __future__ import annotations

import math

import pandas as pd

from ..analysis.holes import find_holes
from .frontier import MODEL_OF, Frontier, RealRun


def _solved(frontier: Frontier) -> pd.DataFrame:
    """Solver rows whose schedule the simulator replayed (the only ones that count), with
    ``model`` ("stage model" or "interval model") and ``overhead`` as replayed (where a solver
    reported other recompute than its schedule's, the row is a fault and the replay counts)."""
    rows = frontier.rows
    solved = rows[rows.kind.isin(["sample", "bisect"]) & (rows.replay_passed == True)]  # noqa: E712
    base = solved.objective - solved.remat_compute
    return solved.assign(model=solved.solver.map(MODEL_OF), overhead=(1 + base + solved.replay_remat_compute) / base
                         ).sort_values("budget_bytes")


def _bounds(frontier: Frontier) -> pd.DataFrame:
    """The relaxation's solved rows that no real run contradicts: lower bounds on the overhead
    of every on-demand run at their budget."""
    rows = frontier.rows
    return rows[(rows.kind == "relax") & (rows.status == "bound") & (rows.fault.fillna("") == "")
                ].sort_values("budget_bytes")


def smallest_real_run(frontier: Frontier) -> RealRun | None:
    """The real run at the upper side of the bracket (the least overhead at that budget)."""
    return min(frontier.real_runs(), key=lambda run: (run.budget, run.overhead), default=None)


def threshold_table(frontiers: dict[str, Frontier], sweeps: pd.DataFrame) -> pd.DataFrame:
    """Per trace, as fractions of the peak: DTR's threshold, the best zoo threshold (and which
    policy), the frontier bracket (``proven_infeasible_up_to``: no run fits there, by the
    relaxation or the footprint bound; ``min_feasible``: the smallest budget with a real run,
    and its source), the stage model's own threshold, the smallest budget with a replayed
    interval-model schedule (None where it was not run) and the footprint bound."""
    rows = []
    for name, frontier in frontiers.items():
        peak = frontier.peak_bytes
        thresholds = {}
        for policy, frame in sweeps[sweeps.trace == name].groupby("policy"):
            census = find_holes(frame)
            thresholds[policy] = census.threshold_ratio if census.threshold_ratio is not None else math.nan
        zoo = {p: r for p, r in thresholds.items() if p != "dtr" and not math.isnan(r)}
        solved = _solved(frontier)
        interval = solved[solved.model == "interval model"]
        best = min(zoo, key=zoo.get) if zoo else None
        rows.append({
            "trace": name,
            "dtr_threshold": thresholds.get("dtr", math.nan),
            "best_zoo_threshold": zoo[best] if best else math.nan,
            "best_zoo_policy": best,
            "proven_infeasible_up_to": frontier.max_infeasible_ratio,
            "min_feasible": frontier.min_feasible_ratio,
            "min_feasible_source": frontier.min_feasible_source,
            "gap": None if frontier.gap_bytes is None else frontier.gap_bytes / peak,
            "stage_model_threshold": None if frontier.stage_min_feasible_bytes is None
            else frontier.stage_min_feasible_bytes / peak,
            "interval_model_min": None if interval.empty else float(interval.budget_bytes.min()) / peak,
            "footprint_bound": frontier.lower_bound_bytes / peak,
            "relaxation": frontier.relax_status,
            "solve_seconds": round(float(frontier.rows.solve_seconds.sum()), 1),
        })
    return pd.DataFrame(rows)


def hole_table(frontiers: dict[str, Frontier], sweeps: pd.DataFrame) -> pd.DataFrame:
    """Every hole of DTR's census at its lowest failing budget, with the bracket of the best
    overhead any run could have there: ``overhead_bound`` (the relaxation: no run does
    better; NaN where not solved there) and ``achievable_overhead`` (the least overhead of
    a real run at that budget or below, ``achieved_by``: a replayed solver schedule or
    a policy's passing run in ``sweeps``; replaying a run's decisions fits every larger budget)."""
    rows = []
    for name, frontier in frontiers.items():
        frame = sweeps[(sweeps.trace == name) & (sweeps.policy == "dtr")]
        if frame.empty:
            continue
        solved, bounds = _solved(frontier), _bounds(frontier)
        passed = sweeps[(sweeps.trace == name) & (sweeps.status == "pass")]
        real = pd.concat([solved.assign(source=solved.model)[["budget_bytes", "overhead", "source"]],
                          passed.assign(source=passed.policy)[["budget_bytes", "overhead", "source"]]])
        for hole in find_holes(frame).holes.itertuples():
            budget = hole.fail_low_bytes
            row = {"trace": name, "fail_low_ratio": hole.fail_low_ratio, "fail_high_ratio": hole.fail_high_ratio,
                   "budget_bytes": budget, "dtr": hole.kinds, "overhead_bound": math.nan,
                   "achievable_overhead": math.nan, "achieved_by": None,
                   "proven_infeasible": budget <= frontier.max_infeasible_bytes}
            below = real[real.budget_bytes <= budget]
            if not below.empty:
                best = below.loc[below.overhead.idxmin()]
                row.update(achievable_overhead=float(best.overhead), achieved_by=best.source)
            at = bounds[bounds.budget_bytes == budget]
            if not at.empty:
                row["overhead_bound"] = float(at.overhead_bound.iloc[0])
            rows.append(row)
    return pd.DataFrame(rows)


def plot_frontier(frontiers: dict[str, Frontier], sweeps: pd.DataFrame, titles: dict[str, str] | None = None):
    """Overhead against budget per trace: DTR and the zoo (lines; failures are gaps; an
    isolated passing budget is a dot), DTR's failing budgets (red ticks below the curves),
    replayed stage-model schedules (black stars) and interval-model schedules (green
    diamonds), the relaxation's lower bound on the overhead of every on-demand run (blue
    triangles), the budgets where no on-demand run fits (grey band, proven) and the smallest
    budget with a real run (black line, its run circled)."""
    import matplotlib.pyplot as plt

    if not frontiers:
        raise ValueError("no frontier to plot: compute one (dtrlab frontier LOG) or set compute_missing = True")
    titles = titles or {}
    n = len(frontiers)
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    # Policies get colours the solver markers do not use (stars black, diamonds green, triangles blue).
    palette = iter(["tab:cyan", "tab:olive", "tab:brown", "tab:pink", "tab:purple", "tab:gray", "tab:orange"] * 9)
    colors = {"dtr": "tab:red"}
    for ax, (name, frontier) in zip(axes.flat, frontiers.items()):
        peak, limit = frontier.peak_bytes, frontier.overhead_limit
        for policy, frame in sweeps[sweeps.trace == name].groupby("policy"):
            frame = frame.sort_values("ratio")
            passed = frame.status == "pass"
            overhead = frame.overhead.where(passed)
            color = colors[policy] if policy in colors else colors.setdefault(policy, next(palette))
            style = dict(lw=2, zorder=3) if policy == "dtr" else dict(lw=0.9, alpha=0.8)
            ax.plot(frame.ratio, overhead, label=policy, color=color, **style)
            # a pass between two failures draws no line: show it as a dot
            alone = passed & ~passed.shift(1, fill_value=False) & ~passed.shift(-1, fill_value=False)
            ax.plot(frame.ratio[alone], frame.overhead[alone], ".", color=color, ms=6, zorder=3)
            if policy == "dtr":
                failed = frame[~passed]
                ax.plot(failed.ratio, [0.97] * len(failed), "|", color="tab:red", ms=8, label="dtr fails")
        solved = _solved(frontier)
        for model, marker, color in (("stage model", "*", "black"), ("interval model", "D", "tab:green")):
            mine = solved[solved.model == model]
            if not mine.empty:
                ax.plot(mine.budget_bytes / peak, mine.overhead, marker, color=color, ms=8 if marker == "*" else 5,
                        label=f"{model} schedule (replayed)", zorder=4)
        bounds = _bounds(frontier)
        if not bounds.empty:
            ax.plot(bounds.budget_bytes / peak, bounds.overhead_bound.clip(upper=limit), "^",
                    color="tab:blue", ms=6, label="relaxation: lower bound on overhead", zorder=4)
        ax.axvspan(0, frontier.max_infeasible_ratio, color="grey", alpha=0.2, label="no on-demand run fits (proven)")
        smallest = smallest_real_run(frontier)
        if smallest is not None:
            ax.axvline(smallest.budget / peak, color="black", ls="-", lw=0.8, label="smallest real run (circled)")
            ax.plot(smallest.budget / peak, smallest.overhead, "o", mfc="none", mec="black", ms=11, mew=1.2, zorder=5)
        ax.set_xlim(max(0.0, frontier.lower_bound_bytes / peak - 0.1), 1.05)
        ax.set_ylim(0.94, limit + 0.05)
        ax.set_title(titles.get(name, name))
        ax.set_xlabel("budget / peak")
        ax.set_ylabel("overhead")
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    legend = {}
    for ax in list(axes.flat)[:n]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    ncol = max(1, min(len(legend), int(fig.get_figwidth() / 3.4)))  # a long label takes ~3.4 inches at 10 pt
    legend_rows = math.ceil(len(legend) / ncol)
    fig.set_figheight(fig.get_figheight() + 0.25 * legend_rows + 0.1)
    fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=ncol, fontsize=10, frameon=False)
    fig.tight_layout(rect=(0, (0.25 * legend_rows + 0.1) / fig.get_figheight(), 1, 1))
    return fig
