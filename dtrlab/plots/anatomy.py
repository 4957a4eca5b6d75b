"""Hole-anatomy figures (notebook 12): holes against the overhead limit, and the overhead each budget needs."""

from __future__ import annotations

import math
from dataclasses import replace

import matplotlib.ticker as mticker
import numpy as np
import pandas as pd

from ..analysis.limit_census import grid_steps
from .style import STATUS_COLORS, THRESHOLD_COLOR, panel_grid, policy_styles

#: One colour per hole kind of :func:`dtrlab.analysis.anatomy.hole_anatomy`.
ANATOMY_COLORS = {"oom": STATUS_COLORS["oom"], "cliff": "#6a3d9a", "near-miss": "#1f77b4", "limit": "#ff7f0e"}
ANATOMY_LABELS = {"oom": "oom (fails at any limit)", "cliff": "cliff", "near-miss": "near miss of the limit",
                  "limit": "cut by the limit"}


def plot_holes_by_limit(table: pd.DataFrame, *, titles: dict[str, str] | None = None, columns: int = 4):
    """One panel per trace: the number of holes (y) at each overhead limit (x, log scale), one line per
    policy and memory model (``dtr`` under flat memory, ``dtr @ caching`` under another), and per census
    grid where a policy and model were censused on several (the finer ones labelled with their step).
    ``table``: :attr:`dtrlab.analysis.limit_census.LimitCensus.table` (or its shipped CSV, whose
    ``ratios`` column names each row's grid)."""
    base = policy_styles(list(dict.fromkeys(table["policy"])))
    steps = grid_steps(table)
    coarsest = steps.groupby([table["policy"], table["memory"]]).transform(
        lambda group: max(group, key=lambda step: float(step or 0)))
    finer = [f" @ step {step}" if step != top else "" for step, top in zip(steps, coarsest)]
    # Under another memory model a policy keeps its colour and marker, hollow (a policy drawn dashed under
    # flat memory stays told apart), on a dashed line (dotted under the allocated semantics, MODEL/allocated;
    # dash-dotted on a finite device, MODEL/allocated(DEVICE)), its label naming the model; a finer grid's
    # line is dash-dot-dotted, its label naming the step.
    line = {"/allocated(": "-.", "/allocated": ":"}
    styles = {}
    for p, m, f in dict.fromkeys(zip(table["policy"], table["memory"], finer)):
        style = base[p] if m == "flat" else replace(
            base[p], label=f"{base[p].label} @ {m}", linestyle=next((v for k, v in line.items() if k in m), "--"))
        styles[f"{p} @ {m}{f}"] = replace(style, label=f"{style.label}{f}", linestyle=(0, (3, 1, 1, 1, 1, 1))) \
            if f else style
    table = table.assign(policy=[f"{p} @ {m}{f}" for p, m, f in zip(table["policy"], table["memory"], finer)])
    traces = list(dict.fromkeys(table["trace"]))
    fig, axes = panel_grid(len(traces), columns=columns, sharex=True)
    finite = sorted(x for x in table["limit"].unique() if math.isfinite(x))
    for ax, trace in zip(axes, traces):
        rows = table[table["trace"] == trace]
        for policy, style in styles.items():
            line = rows[rows["policy"] == policy].sort_values("limit")
            line = line[np.isfinite(line["limit"])]
            fill = style.color if " @ flat" in policy else "white"
            ax.plot(line["limit"], line["holes"], marker=style.marker, color=style.color, linestyle=style.linestyle,
                    label=style.label, markersize=4, markerfacecolor=fill)
        ax.axvline(2.0, color=THRESHOLD_COLOR, linewidth=0.7, linestyle=":")
        ax.set_xscale("log")
        ax.set_xticks(finite, [f"{x:g}" for x in finite])
        ax.minorticks_off()
        ax.set_title((titles or {}).get(trace, trace))
        ax.set_ylim(-0.3, max(1, rows["holes"].max()) + 0.5)
        ax.yaxis.set_major_locator(mticker.MaxNLocator(integer=True))
    for ax in axes[-columns:]:
        ax.set_xlabel("overhead limit (2 = simrd's)")
    for ax in axes[::columns]:
        ax.set_ylabel("holes")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), frameon=False,
               bbox_to_anchor=(0.5, 1.0))
    fig.tight_layout()
    return fig


def plot_needed_overhead(samples: pd.DataFrame, holes: pd.DataFrame, *, limit: float = 2.0,
                         titles: dict[str, str] | None = None, columns: int = 4, ceiling: float | None = None):
    """One panel per trace: the overhead limit each sampled budget needs to pass (its ``needed_limit``: the
    overhead of its run without a limit), against the budget as a fraction of the peak, for one policy.
    Budgets that run out of memory at any limit are marked at the bottom; budgets that still thrash at the
    sweep's own limit at the top (``ceiling``: at least that much). The holes at ``limit`` (a dashed line)
    are shaded by kind. ``samples``/``holes``: one policy's rows of
    :class:`~dtrlab.analysis.limit_census.LimitCensus` (or the shipped CSVs)."""
    traces = list(dict.fromkeys(samples["trace"]))
    fig, axes = panel_grid(len(traces), columns=columns)
    top = ceiling or float(samples.loc[np.isfinite(samples["needed_limit"]), "needed_limit"].max() * 1.2)
    for ax, trace in zip(axes, traces):
        rows = samples[samples["trace"] == trace].drop_duplicates("budget_bytes").sort_values("budget_bytes")
        passed = rows[np.isfinite(rows["needed_limit"])]
        ax.plot(passed["ratio"], passed["needed_limit"], color=STATUS_COLORS["pass"], linewidth=0.9, marker=".",
                markersize=2, label="overhead needed to pass")
        oom = rows[rows["sweep_status"] == "oom"]
        ax.plot(oom["ratio"], np.full(len(oom), 1.0), linestyle="none", marker="|", color=STATUS_COLORS["oom"],
                label="out of memory at any limit")
        thrash = rows[rows["sweep_status"] == "thrash"]
        ax.plot(thrash["ratio"], np.full(len(thrash), top), linestyle="none", marker="|",
                color=STATUS_COLORS["thrash"], label="needs more than the sweep's limit")
        ax.axhline(limit, color=THRESHOLD_COLOR, linewidth=0.8, linestyle="--", label=f"limit {limit:g}")
        for hole in holes[holes["trace"] == trace].itertuples():
            ax.axvspan(hole.pass_below_ratio, hole.pass_above_ratio, color=ANATOMY_COLORS[hole.anatomy], alpha=0.35,
                       linewidth=0, label=ANATOMY_LABELS[hole.anatomy])
        ax.set_yscale("log")
        ax.set_ylim(0.95, top * 1.15)
        ax.yaxis.set_major_locator(mticker.FixedLocator([1, 1.5, 2, 3, 5, 10, 20, 50, 100]))
        ax.yaxis.set_major_formatter(mticker.FuncFormatter(lambda y, _: f"{y:g}"))
        ax.yaxis.set_minor_formatter(mticker.NullFormatter())
        ax.set_title((titles or {}).get(trace, trace))
    for ax in axes[-columns:]:
        ax.set_xlabel("budget / peak")
    for ax in axes[::columns]:
        ax.set_ylabel("overhead needed")
    labels = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            labels.setdefault(label, handle)
    fig.legend(labels.values(), labels.keys(), loc="lower center", ncol=4, frameon=False, bbox_to_anchor=(0.5, 1.0))
    fig.tight_layout()
    return fig
