"""Feasibility figures: pass / oom / thrash against the budget ratio.

Input is a sweep frame (one row per simulated budget, with at least ``ratio`` and
``status``; ``overhead`` for the overhead curve).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from .style import HOLE_COLOR, STATUS_COLORS, STATUS_LABELS, THRESHOLD_COLOR, legend_below, use_style


def _cell_edges(ratios: np.ndarray) -> np.ndarray:
    """Edges halfway between neighbouring samples, so each sample owns one contiguous cell."""
    if len(ratios) == 1:
        return np.array([ratios[0] - 0.0025, ratios[0] + 0.0025])
    middle = (ratios[1:] + ratios[:-1]) / 2
    return np.concatenate([[ratios[0] - (middle[0] - ratios[0])], middle, [ratios[-1] + (ratios[-1] - middle[-1])]])


def plot_strip(frame: pd.DataFrame, ax, *, marker: float | None = None, legend: bool = True):
    """A band of cells coloured by status, one cell per sampled ratio; ``marker`` draws a line at a ratio."""
    frame = frame.sort_values("ratio")
    ratios = frame["ratio"].to_numpy(dtype=float)
    edges = _cell_edges(ratios)
    for status, color in STATUS_COLORS.items():
        mask = (frame["status"] == status).to_numpy()
        if mask.any():
            ax.broken_barh(list(zip(edges[:-1][mask], np.diff(edges)[mask])), (0, 1), facecolors=color,
                           edgecolor="none")
    if marker is not None:
        ax.axvline(marker, color="black", linewidth=1.5)
    ax.set_yticks([])
    ax.set_ylim(0, 1)
    ax.set_xlim(edges[0], edges[-1])
    ax.set_xlabel("budget ratio (budget / unbounded peak memory)")
    ax.grid(False)
    if legend:
        present = [s for s in STATUS_COLORS if (frame["status"] == s).any()]
        ax.legend(handles=[Patch(color=STATUS_COLORS[s], label=STATUS_LABELS[s]) for s in present],
                  loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return ax


def plot_feasibility_map(censuses, *, titles: dict[str, str] | None = None, columns: int = 4,
                         overhead_limit: float = 2.0):
    """One panel per trace: the overhead of passing budgets above a status strip, holes and threshold marked.

    ``censuses``: :class:`dtrlab.analysis.holes.HoleCensus` records (one per trace,
    from :func:`~dtrlab.analysis.holes.find_holes` on a sweep). Holes are purple
    bands with a triangle above them; the dashed line is the feasibility threshold
    (every sampled budget from it up passes). Returns the figure.
    """
    censuses = list(censuses)
    if not censuses:
        raise ValueError("plot_feasibility_map needs at least one HoleCensus (dtrlab.analysis.holes.find_holes)")
    use_style()
    columns = max(1, min(columns, len(censuses)))
    rows = -(-len(censuses) // columns)
    fig = plt.figure(figsize=(3.9 * columns, 2.9 * rows))
    outer = fig.add_gridspec(rows, columns, hspace=0.55, wspace=0.22)
    for index, census in enumerate(censuses):
        inner = outer[index // columns, index % columns].subgridspec(2, 1, height_ratios=(4, 1), hspace=0.06)
        top = fig.add_subplot(inner[0])
        strip = fig.add_subplot(inner[1], sharex=top)
        _feasibility_panel(census, top, strip, overhead_limit)
        holes = len(census.holes)
        threshold = "none" if census.threshold_ratio is None else f"{census.threshold_ratio:.3f}"
        top.set_title(f"{(titles or {}).get(census.trace, census.trace)}\n"
                      f"{holes} hole{'s' * (holes != 1)}, threshold {threshold}")
        if index % columns == 0:
            top.set_ylabel("overhead")
        if index // columns == rows - 1 or index + columns >= len(censuses):
            strip.set_xlabel("budget ratio")
    handles = [Patch(color=STATUS_COLORS[s], label=STATUS_LABELS[s]) for s in STATUS_COLORS]
    handles += [Patch(color=HOLE_COLOR, alpha=0.35, label="hole (fails between passing budgets)"),
                Line2D([], [], color=THRESHOLD_COLOR, linestyle="--", label="feasibility threshold")]
    legend_below(fig, handles)
    return fig


def _feasibility_panel(census, top, strip, overhead_limit: float) -> None:
    samples = census.samples
    passed = samples[samples["status"] == "pass"]
    top.plot(passed["ratio"], passed["overhead"], linestyle="none", marker="o", markersize=2.2,
             color=STATUS_COLORS["pass"])
    top.axhline(overhead_limit, color=STATUS_COLORS["thrash"], linewidth=0.8, linestyle=":")
    top.set_ylim(0.95, overhead_limit + 0.12)
    plot_strip(samples, strip, legend=False)
    strip.set_xlabel("")
    for hole in census.holes.itertuples():
        for ax in (top, strip):
            ax.axvspan(hole.pass_below_ratio, hole.pass_above_ratio, color=HOLE_COLOR, alpha=0.35, linewidth=0)
        top.plot([(hole.fail_low_ratio + hole.fail_high_ratio) / 2], [overhead_limit + 0.06], marker="v",
                 color=HOLE_COLOR, markersize=6, linestyle="none")
    if census.threshold_ratio is not None:
        for ax in (top, strip):
            ax.axvline(census.threshold_ratio, color=THRESHOLD_COLOR, linestyle="--", linewidth=1)
    top.tick_params(labelbottom=False)
