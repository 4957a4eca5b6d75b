"""The DTR paper's simulated Pareto figure: compute overhead against budget ratio per policy.

As in the paper, a policy's curve covers the ratios at which every trial passes
(several trials only for the random policy, one per seed); a vertical line marks
its smallest such ratio, dotted when the failure just below it is an out-of-memory
and dashed when it is a thrash.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D

from .style import legend_below, panel_grid, policy_base, policy_styles


@dataclass(frozen=True)
class ParetoCurves:
    """Per trace and policy: the summary rows and the lowest all-pass ratio."""

    curves: pd.DataFrame  # trace, policy, ratio, trials, passed, overhead_mean/min/max
    frontier: pd.DataFrame  # trace, policy, min_passing_ratio, failure_below


def pareto_curves(frame: pd.DataFrame) -> ParetoCurves:
    """Summarise sweep rows (trace, policy, ratio, status, overhead) per base policy and ratio.

    ``policy`` labels such as ``random(seed=3)`` are trials of ``random``. A ratio
    counts as passed when every trial passed there; ``min_passing_ratio`` is the
    smallest ratio from which every larger sampled ratio passes too, and
    ``failure_below`` the status of the failing trial at the sampled ratio just
    below it (NaN when nothing fails).
    """
    missing = {"trace", "policy", "ratio", "status", "overhead"} - set(frame.columns)
    if missing:
        raise ValueError(f"pareto_curves needs sweep rows with columns {sorted(missing)} "
                         "(e.g. from dtrlab.sweep.sweep)")
    rows = frame.assign(policy=frame["policy"].map(policy_base), passed=frame["status"] == "pass")
    passing_overhead = rows["overhead"].where(rows["passed"])
    rows = rows.assign(passing_overhead=passing_overhead)
    curves = (rows.groupby(["trace", "policy", "ratio"], sort=True)
              .agg(trials=("passed", "size"), passed=("passed", "all"),
                   overhead_mean=("passing_overhead", "mean"), overhead_min=("passing_overhead", "min"),
                   overhead_max=("passing_overhead", "max"))
              .reset_index())
    frontier = []
    for (trace, policy), group in curves.groupby(["trace", "policy"], sort=False):
        passed = group["passed"].to_numpy()
        ratios = group["ratio"].to_numpy()
        failing = np.flatnonzero(~passed)
        if len(failing) == 0:
            frontier.append((trace, policy, ratios[0], np.nan))
            continue
        last_fail = failing[-1]
        lowest = ratios[last_fail + 1] if last_fail + 1 < len(ratios) else np.nan
        statuses = rows.loc[(rows["trace"] == trace) & (rows["policy"] == policy) & (rows["ratio"] == ratios[last_fail])
                            & ~rows["passed"], "status"]
        frontier.append((trace, policy, lowest, statuses.iloc[0]))
    frontier = pd.DataFrame(frontier, columns=["trace", "policy", "min_passing_ratio", "failure_below"])
    return ParetoCurves(curves=curves, frontier=frontier)


def plot_pareto(frame: pd.DataFrame, *, titles: dict[str, str] | None = None, columns: int = 4,
                overhead_limit: float = 2.0):
    """One panel per trace, one step curve per policy (random: min-max band over seeds). Returns the figure."""
    summary = pareto_curves(frame)
    traces = list(dict.fromkeys(frame["trace"]))
    policies = list(dict.fromkeys(frame["policy"].map(policy_base)))
    styles = policy_styles(policies)
    fig, axes = panel_grid(len(traces), columns=columns, sharex=True, sharey=True)
    for ax, trace in zip(axes, traces):
        for policy in policies:
            style = styles[policy]
            curve = summary.curves[(summary.curves["trace"] == trace) & (summary.curves["policy"] == policy)]
            edge = summary.frontier[(summary.frontier["trace"] == trace) & (summary.frontier["policy"] == policy)]
            lowest = edge["min_passing_ratio"].iloc[0]
            ok = curve[curve["ratio"] >= lowest] if np.isfinite(lowest) else curve.iloc[:0]
            if len(ok):
                ax.step(ok["ratio"], ok["overhead_mean"], where="post", color=style.color,
                        linestyle=style.linestyle, linewidth=1.8, alpha=0.85)
                if (ok["trials"] > 1).any():
                    ax.fill_between(ok["ratio"], ok["overhead_min"], ok["overhead_max"], step="post",
                                    color=style.color, alpha=0.25, linewidth=0)
                ax.plot(ok["ratio"].iloc[[0, -1]], ok["overhead_mean"].iloc[[0, -1]], linestyle="none",
                        marker=style.marker, color=style.color, markersize=6)
            failure = edge["failure_below"].iloc[0]
            if isinstance(failure, str) and np.isfinite(lowest):
                ax.axvline(lowest, color=style.color, alpha=0.45, linewidth=2,
                           linestyle=":" if failure == "oom" else "--")
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
        ax.set_title((titles or {}).get(trace, trace))
        ax.set_ylim(0.95, overhead_limit + 0.05)
        ax.set_xlim(0.0, 1.05)
    for ax in axes:
        if ax.get_subplotspec().is_last_row():
            ax.set_xlabel("budget ratio")
        if ax.get_subplotspec().is_first_col():
            ax.set_ylabel("compute overhead")
    handles = [Line2D([], [], color=s.color, linestyle=s.linestyle, marker=s.marker, label=s.label)
               for s in styles.values()]
    handles += [Line2D([], [], color="grey", linestyle=":", label="lowest passing ratio (OOM below)"),
                Line2D([], [], color="grey", linestyle="--", label="lowest passing ratio (thrash below)")]
    fig.tight_layout()
    legend_below(fig, handles)
    return fig


def plot_overhead(frame: pd.DataFrame, *, titles: dict[str, str] | None = None, columns: int = 4,
                  overhead_limit: float = 2.0):
    """One panel per trace: overhead of every passing sample per policy; failing samples leave gaps."""
    traces = list(dict.fromkeys(frame["trace"]))
    styles = policy_styles(frame["policy"])
    fig, axes = panel_grid(len(traces), columns=columns, sharex=True, sharey=True)
    for ax, trace in zip(axes, traces):
        for policy, style in styles.items():
            rows = frame[(frame["trace"] == trace) & (frame["policy"] == policy)].sort_values("ratio")
            ax.plot(rows["ratio"], rows["overhead"].where(rows["status"] == "pass"), color=style.color,
                    linestyle=style.linestyle, linewidth=1.2, alpha=0.85)
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
        ax.set_title((titles or {}).get(trace, trace))
        ax.set_ylim(0.95, overhead_limit + 0.05)
    for ax in axes:
        if ax.get_subplotspec().is_last_row():
            ax.set_xlabel("budget ratio")
        if ax.get_subplotspec().is_first_col():
            ax.set_ylabel("compute overhead")
    handles = [Line2D([], [], color=s.color, linestyle=s.linestyle, label=s.label) for s in styles.values()]
    fig.tight_layout()
    legend_below(fig, handles)
    return fig
