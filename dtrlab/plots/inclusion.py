"""The inclusion property over a run: where resident sets at two budgets stop nesting."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from .style import HOLE_COLOR, STATUS_COLORS, THRESHOLD_COLOR, use_style


def plot_inclusion(result, *, title: str | None = None):
    """Top: storages resident at the smaller budget but not the larger, after every schedule step.
    Bottom: both runs' cumulative rematerialization compute against the thrash limit. The first
    violation and the first failure are marked. ``result``: an
    :class:`dtrlab.analysis.inclusion.InclusionResult`. Returns the figure."""
    use_style()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 4.6), sharex=True, gridspec_kw={"height_ratios": (1, 1)})
    steps = np.arange(result.steps_compared)
    top.fill_between(steps, result.violation_counts, step="post", color=HOLE_COLOR, alpha=0.5, linewidth=0)
    top.set_ylabel("storages held only\nat the smaller budget")
    small = f"{result.budget_small:,} B ({result.status_small})"
    large = f"{result.budget_large:,} B ({result.status_large})"
    bottom.plot(steps, result.remat_small, color=STATUS_COLORS.get(result.status_small), label=f"smaller budget {small}")
    bottom.plot(steps, result.remat_large, color=STATUS_COLORS.get(result.status_large), linestyle="--",
                label=f"larger budget {large}")
    if np.isfinite(result.remat_limit):
        bottom.axhline(result.remat_limit, color=THRESHOLD_COLOR, linestyle=":", label="thrash limit")
    bottom.set_ylabel("cumulative\nremat compute")
    bottom.set_xlabel("schedule step")
    for ax in (top, bottom):
        if result.first_violation_step is not None:
            ax.axvline(result.first_violation_step, color=HOLE_COLOR, linewidth=1)
        if result.failure_step is not None:
            ax.axvline(result.failure_step, color="black", linewidth=1.2)
    marks = []
    if result.first_violation_step is not None:
        marks.append(f"first violation: step {result.first_violation_step}")
    if result.failure_step is not None:
        marks.append(f"first failure ({result.failing_run} run): step {result.failure_step}")
    top.set_title((title + "\n" if title else "") + "; ".join(marks or ["inclusion holds at every step"]))
    bottom.legend(loc="upper left", frameon=False, fontsize=8)
    fig.tight_layout()
    return fig


def plot_inclusion_census(table):
    """One row per hole: where nesting first breaks (purple dot) and where the run fails (black cross),
    as fractions of the schedule. ``table`` columns: ``trace``, ``budget_large``, ``steps``,
    ``first_violation_step``, ``failure_step``. Returns the figure."""
    use_style()
    fig, ax = plt.subplots(figsize=(8, 0.32 * len(table) + 1.4))
    for i, row in enumerate(table.itertuples()):
        violation = np.nan if row.first_violation_step is None else row.first_violation_step / row.steps
        failure = np.nan if row.failure_step is None else row.failure_step / row.steps
        ax.plot([violation, failure], [i, i], color="grey", linewidth=1)
        ax.plot(violation, i, marker="o", color=HOLE_COLOR, linestyle="none")
        ax.plot(failure, i, marker="X", color="black", linestyle="none", markersize=8)
    ax.set_yticks(range(len(table)), [f"{r.trace} @ {r.budget_large:,} B" for r in table.itertuples()], fontsize=8)
    ax.set_ylim(len(table) - 0.5, -0.5)
    ax.set_xlim(0, 1)
    ax.set_xlabel("position in the schedule (fraction of steps)")
    ax.plot([], [], marker="o", color=HOLE_COLOR, linestyle="none", label="first inclusion violation")
    ax.plot([], [], marker="X", color="black", linestyle="none", label="failure")
    ax.legend(loc="lower left", bbox_to_anchor=(0, 1.0), ncol=2, frameon=False)
    fig.tight_layout()
    return fig
