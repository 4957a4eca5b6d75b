"""Tables and the figure of notebook 09: the optimum beside DTR and the policy zoo."""

from __future__ import annotations

import math

import pandas as pd

from ..analysis.holes import find_holes
from .frontier import Frontier


def _solved(frontier: Frontier) -> pd.DataFrame:
    """Rows whose schedule the simulator replayed (the only ones that count), with their overhead."""
    rows = frontier.rows
    return rows[(rows.replay_passed == True)].sort_values("budget_bytes")  # noqa: E712


def threshold_table(frontiers: dict[str, Frontier], sweeps: pd.DataFrame) -> pd.DataFrame:
    """Per trace: DTR's threshold, the best zoo threshold (and which policy), the optimal
    threshold (the minimal replayed budget and the largest proven-infeasible one) and the
    lower bound, all as fractions of the peak."""
    rows = []
    for name, frontier in frontiers.items():
        peak = frontier.peak_bytes
        thresholds = {}
        for policy, frame in sweeps[sweeps.trace == name].groupby("policy"):
            census = find_holes(frame)
            thresholds[policy] = census.threshold_ratio if census.threshold_ratio is not None else math.nan
        zoo = {p: r for p, r in thresholds.items() if p != "dtr" and not math.isnan(r)}
        best = min(zoo, key=zoo.get) if zoo else None
        rows.append({
            "trace": name,
            "dtr_threshold": thresholds.get("dtr", math.nan),
            "best_zoo_threshold": zoo[best] if best else math.nan,
            "best_zoo_policy": best,
            "optimal_threshold": frontier.min_feasible_ratio,
            "proven_infeasible_below": None if frontier.max_infeasible_bytes is None
            else frontier.max_infeasible_bytes / peak,
            "proven": frontier.proven,
            "lower_bound": frontier.lower_bound_bytes / peak,
            "solve_seconds": round(float(frontier.rows.solve_seconds.sum()), 1),
        })
    return pd.DataFrame(rows)


def hole_table(frontiers: dict[str, Frontier], sweeps: pd.DataFrame) -> pd.DataFrame:
    """Every hole of DTR's census with the solver's answer at its lowest failing budget and
    ``achievable_overhead``: the least overhead of any replayed schedule at that budget or
    below (a schedule that fits a budget fits every larger one), an upper bound on the optimum."""
    rows = []
    for name, frontier in frontiers.items():
        frame = sweeps[(sweeps.trace == name) & (sweeps.policy == "dtr")]
        if frame.empty:
            continue
        solved = frontier.rows.set_index("budget_bytes")
        for hole in find_holes(frame).holes.itertuples():
            at = solved.loc[[hole.fail_low_bytes]] if hole.fail_low_bytes in solved.index else None
            row = {"trace": name, "fail_low_ratio": hole.fail_low_ratio, "fail_high_ratio": hole.fail_high_ratio,
                   "budget_bytes": hole.fail_low_bytes, "dtr": hole.kinds,
                   "optimal_status": None, "optimal_overhead": math.nan, "gap": math.nan, "replayed": None,
                   "achievable_overhead": math.nan}
            below = _solved(frontier)
            below = below[below.budget_bytes <= hole.fail_low_bytes]
            if not below.empty:
                row["achievable_overhead"] = float(below.overhead.min())
            if at is not None:
                first = at.iloc[0]
                row.update(optimal_status=first.status, optimal_overhead=first.overhead, gap=first.gap,
                           replayed=first.replay_passed)
            rows.append(row)
    return pd.DataFrame(rows)


def plot_frontier(frontiers: dict[str, Frontier], sweeps: pd.DataFrame, titles: dict[str, str] | None = None):
    """Overhead against budget per trace: DTR and the zoo (lines; failures are gaps), the
    replayed optimum (black; bars reach down to the solver's bound), DTR's failing
    samples (red ticks), the lower bound (grey) and the stage model's threshold (black line).

    The stage model restricts recomputation (docs/solvers.md), so its optimum and threshold bound
    the true frontier from above, and its infeasibility holds within the model only."""
    import matplotlib.pyplot as plt

    if not frontiers:
        raise ValueError("no frontier to plot: compute one (dtrlab frontier LOG) or set compute_missing = True")
    titles = titles or {}
    n = len(frontiers)
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, (name, frontier) in zip(axes.flat, frontiers.items()):
        peak = frontier.peak_bytes
        for policy, frame in sweeps[sweeps.trace == name].groupby("policy"):
            frame = frame.sort_values("ratio")
            overhead = frame.overhead.where(frame.status == "pass")
            style = dict(lw=2, color="tab:red", zorder=3) if policy == "dtr" else dict(lw=0.8, alpha=0.6)
            ax.plot(frame.ratio, overhead, label=policy, **style)
            if policy == "dtr":
                failed = frame[frame.status != "pass"]
                ax.plot(failed.ratio, [1.0] * len(failed), "|", color="tab:red", ms=10, label="dtr fails")
        solved = _solved(frontier)
        if not solved.empty:
            ratio = solved.budget_bytes / peak
            low = solved.overhead * (1 + solved.best_bound.fillna(solved.objective)) / (1 + solved.objective)
            ax.errorbar(ratio, solved.overhead, yerr=[(solved.overhead - low).clip(lower=0), 0 * low],
                        fmt="*", color="black", ms=8, label="stage-model optimum (replayed)", zorder=4)
        ax.axvline(frontier.lower_bound_bytes / peak, color="grey", ls=":", label="lower bound")
        if frontier.min_feasible_bytes is not None:
            ax.axvline(frontier.min_feasible_bytes / peak, color="black", ls="-", lw=0.8, label="stage-model threshold")
        if frontier.max_infeasible_bytes is not None:
            ax.axvspan(0, frontier.max_infeasible_bytes / peak, color="grey", alpha=0.12, label="infeasible in the stage model")
        ax.set_xlim(max(0.0, frontier.lower_bound_bytes / peak - 0.1), 1.05)
        ax.set_ylim(0.95, frontier.overhead_limit + 0.05)
        ax.set_title(titles.get(name, name))
        ax.set_xlabel("budget / peak")
        ax.set_ylabel("overhead")
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    ncol = 3 * cols
    legend_rows = math.ceil(len(labels) / ncol)
    height = fig.get_figheight()
    fig.set_figheight(height + 0.3 * legend_rows)
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.3 * legend_rows / fig.get_figheight() + 0.01, 1, 1))
    return fig
