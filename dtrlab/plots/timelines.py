"""Memory-in-use timelines of recorded runs, one panel per run on a shared axis.

Typical uses: the budgets B-delta, B and B+delta around a feasibility hole, or a
failing run with and without its rescuing intervention (``highlight`` the rescuing
storage to see where it was evicted and rematerialized).
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D

from ..analysis.events import RecordedRun
from .style import STATUS_COLORS, STATUS_LABELS, THRESHOLD_COLOR, short_trace_name, use_style

EVICT_COLOR = "#1f77b4"
REMAT_COLOR = "#9467bd"
HIGHLIGHT_COLOR = "#e7298a"
GB = 1e9


def memory_timelines(runs: Sequence[RecordedRun], *, highlight: str | None = None, x: str = "clock",
                     titles: Sequence[str] | None = None, panel_height: float = 2.3):
    """One panel per run: memory in use after every event, the budget, policy
    evictions (blue ticks) and rematerializations (purple ticks) along the bottom, the
    failure point (a cross in the status colour) and, with ``highlight`` (a storage
    name such as ``"x8010"``), that storage's evictions and rematerializations as
    vertical lines.

    ``x="clock"`` plots compute time in units of the unbudgeted run's compute (so
    the thrash limit of the default overhead limit is at 2); ``x="step"`` plots the
    schedule step. Returns the matplotlib Figure.
    """
    if not runs:
        raise ValueError("memory_timelines needs at least one RecordedRun (from dtrlab.analysis.record)")
    if x not in ("clock", "step"):
        raise ValueError(f"x must be 'clock' or 'step', got {x!r}")
    if titles is not None and len(titles) != len(runs):
        raise ValueError(f"give one title per run: {len(runs)} runs, {len(titles)} titles")
    use_style()
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, panel_height * len(runs)), sharex=True, squeeze=False)
    for i, (ax, run) in enumerate(zip(axes[:, 0], runs)):
        _panel(ax, run, highlight, x)
        result = run.result
        title = titles[i] if titles is not None else run.label
        ax.set_title(f"{title}: {result.status} (overhead {result.overhead:.3f})", loc="left",
                     color=STATUS_COLORS.get(result.status, THRESHOLD_COLOR))
        ax.set_ylabel("memory (GB)")
    axes[-1, 0].set_xlabel("compute time / unbudgeted compute" if x == "clock" else "schedule step")
    handles = [
        Line2D([], [], color=THRESHOLD_COLOR, linestyle="--", label="budget"),
        Line2D([], [], color=EVICT_COLOR, marker="|", linestyle="", label="eviction"),
        Line2D([], [], color=REMAT_COLOR, marker="|", linestyle="", label="rematerialization"),
        *[Line2D([], [], color=STATUS_COLORS[kind], marker="X", linestyle="", markersize=9,
                 label=STATUS_LABELS[kind]) for kind in ("oom", "thrash")],
    ]
    if highlight is not None:
        handles.append(Line2D([], [], color=HIGHLIGHT_COLOR, label=f"{highlight} evicted (solid) / remat (dotted)"))
    height = fig.get_figheight()
    fig.suptitle(short_trace_name(runs[0].trace.name), y=1 - 0.05 / height)
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), frameon=False,
               bbox_to_anchor=(0.5, 1 - 0.3 / height))
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.65 / height))
    return fig


def _panel(ax, run: RecordedRun, highlight: str | None, x: str) -> None:
    events = run.events
    scale = run.result.baseline_compute if x == "clock" else 1
    position = events[x] / scale
    memory = events["memory_after"] / GB
    ax.plot(position, memory, drawstyle="steps-post", color="#444444", linewidth=0.9)
    budget = run.result.budget_bytes / GB
    ax.axhline(budget, color=THRESHOLD_COLOR, linestyle="--", linewidth=0.9)
    ax.set_ylim(0, max(budget, memory.max() if len(memory) else budget) * 1.05)
    # Rugs along the bottom, where the memory curve rarely is.
    for kind, color, low, high in (("evict", EVICT_COLOR, 0.0, 0.05), ("remat", REMAT_COLOR, 0.06, 0.11)):
        marks = position[events["kind"] == kind]
        ax.vlines(marks, low, high, transform=ax.get_xaxis_transform(), color=color, linewidth=0.6)
    if highlight is not None:
        for kind, style in (("evict", "-"), ("remat", ":")):
            marks = position[(events["kind"] == kind) & (events["storage"] == highlight)]
            ax.vlines(marks, 0, 1, transform=ax.get_xaxis_transform(), color=HIGHLIGHT_COLOR, linestyle=style,
                      linewidth=1.2)
    failed = events["kind"] == "failure"
    if failed.any():
        row = events[failed].iloc[0]
        at = row[x] / scale
        ax.plot([at], [row["memory_after"] / GB], marker="X", markersize=11, linestyle="",
                color=STATUS_COLORS[run.result.status], markeredgecolor="black", zorder=5)
        ax.annotate(f"{run.result.status} at step {row['step']}", (at, row["memory_after"] / GB),
                    xytext=(-8, -14), textcoords="offset points", ha="right", fontsize=8)
