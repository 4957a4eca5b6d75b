"""Figures of the allocator census: feasibility strips per memory model, the threshold
shift against flat, and a memory layout over time (address x step)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from .feasibility import plot_strip
from .style import HOLE_COLOR, STATUS_COLORS, STATUS_LABELS, use_style

MIB = 1 << 20


def plot_model_strips(samples: pd.DataFrame, *, titles: dict[str, str] | None = None, configs=None,
                      holes: pd.DataFrame | None = None):
    """One panel per trace: a pass/oom/thrash strip per configuration (``config`` column), flat on top.

    ``samples`` is :attr:`~dtrlab.analysis.allocator_census.AllocatorCensus.samples`.
    ``holes`` (one row per hole with ``trace``, ``config``, ``fail_low_ratio`` and
    ``fail_high_ratio``, e.g. the censuses' hole tables) marks each hole with a triangle
    above its strip, visible however narrow the hole, and writes the strip's hole count
    at its right end.
    """
    use_style()
    traces = list(dict.fromkeys(samples["trace"]))
    configs = list(configs or dict.fromkeys(samples["config"]))
    height = 0.3 * len(configs) * len(traces) + 0.55 * len(traces)
    fig = plt.figure(figsize=(9, height + 0.9))
    # Fixed margins (in inches) for the legend on top and the axis label at the bottom.
    outer = fig.add_gridspec(len(traces), 1, left=0.3, right=0.9, top=1 - 0.5 / (height + 0.9),
                             bottom=0.55 / (height + 0.9), hspace=0.55)
    # Split once (a boolean mask per strip copies the whole frame each time): each strip's rows in their order.
    strips = dict(iter(samples.groupby(["trace", "config"], sort=False)))
    marks = dict(iter(holes.groupby(["trace", "config"], sort=False))) if holes is not None else {}
    for t, trace in enumerate(traces):
        inner = outer[t].subgridspec(len(configs), 1, hspace=0.45)
        for i, config in enumerate(configs):
            strip = fig.add_subplot(inner[i])
            if (trace, config) in strips:
                plot_strip(strips[trace, config], strip, legend=False)
            strip.set_xlim(0, 1.02)
            strip.set_yticks([])
            strip.set_xlabel("")
            strip.set_xticks(np.linspace(0, 1, 11))
            strip.tick_params(axis="x", labelbottom=i == len(configs) - 1, length=2 if i == len(configs) - 1 else 0)
            strip.text(-0.01, 0.5, config, transform=strip.transAxes, ha="right", va="center", fontsize=8)
            if holes is not None:
                _mark_holes(strip, marks.get((trace, config), holes.iloc[:0]))
            if i == 0:
                strip.set_title((titles or {}).get(trace, trace), loc="left", fontsize=10, pad=7)
    fig.supxlabel("budget ratio (budget / unbounded peak memory)", x=0.6, y=0.05 / (height + 0.9), fontsize=9,
                  va="bottom")
    handles = [Patch(color=c, label=STATUS_LABELS[s]) for s, c in STATUS_COLORS.items()]
    if holes is not None:
        handles.append(Line2D([], [], color=HOLE_COLOR, marker="v", linestyle="none",
                              label="hole (fails between passing budgets); count at the right"))
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.6, 1.0), ncols=len(handles), frameon=False,
               fontsize=8)
    return fig


def _mark_holes(strip, holes: pd.DataFrame) -> None:
    """A triangle just above the strip at every hole, and the strip's hole count to its right."""
    middle = ((holes["fail_low_ratio"] + holes["fail_high_ratio"]) / 2).to_numpy(dtype=float)
    strip.plot(middle, np.full(len(middle), 1.22), linestyle="none", marker="v", markersize=4.5,
               color=HOLE_COLOR, clip_on=False)
    if len(holes):
        strip.text(1.005, 0.5, f"{len(holes)} hole{'s' * (len(holes) != 1)}", transform=strip.transAxes,
                   ha="left", va="center", fontsize=8, color=HOLE_COLOR)


def plot_threshold_shift(table: pd.DataFrame, *, titles: dict[str, str] | None = None):
    """Per trace, each configuration's feasibility threshold minus flat h_DTR's (in budget ratio).

    ``table`` is :attr:`~dtrlab.analysis.allocator_census.AllocatorCensus.table`. A
    configuration without a threshold (no sampled budget from which all pass) is marked
    with an x at the top of the axis.
    """
    use_style()
    table = table.assign(config=table["policy"] + " @ " + table["memory"])
    configs = [c for c in dict.fromkeys(table["config"]) if not c.startswith("dtr @ flat")]
    traces = list(dict.fromkeys(table["trace"]))
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(traces) + 2), 3.6), constrained_layout=True)
    width = 0.8 / max(1, len(configs))
    cmap = plt.get_cmap("tab10")
    shifts = table["threshold_shift"].astype(float).abs()
    top = max(0.05, shifts.max()) if shifts.notna().any() else 0.05
    for j, config in enumerate(configs):
        rows = table[table["config"] == config].set_index("trace")
        x = np.arange(len(traces)) + (j - (len(configs) - 1) / 2) * width
        shift = np.array([rows["threshold_shift"].get(t, np.nan) for t in traces], dtype=float)
        ax.bar(x, np.nan_to_num(shift), width=width, color=cmap(j % 10), label=config)
        missing = np.isnan(shift)
        ax.scatter(x[missing], np.full(missing.sum(), top * 1.05), marker="x", color=cmap(j % 10), s=18)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(np.arange(len(traces)), [(titles or {}).get(t, t) for t in traces], rotation=20, ha="right")
    ax.set_ylabel("threshold shift vs flat h_DTR\n(budget ratio)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=8)
    return fig


def plot_layout(blocks: pd.DataFrame, ax=None, *, failure_step: int | None = None, title: str = "",
                rows: int = 600):
    """Address (MiB) against schedule step: allocated blocks coloured by storage, free blocks light grey,
    unreserved address space white.

    ``blocks`` is :attr:`~dtrlab.analysis.layouts.MemoryLayouts.blocks`. Addresses are
    the model's (segments placed one after another from 0); ``failure_step`` marks the
    failing step. The image has ``rows`` address rows (a block smaller than one row
    still shows as one).
    """
    use_style()
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4), constrained_layout=True)
    steps = np.sort(blocks["step"].unique())
    top = int((blocks["address"] + blocks["size"]).max()) if len(blocks) else 1
    scale = rows / top
    image = np.ones((rows, len(steps), 4))  # white: not reserved at that step
    palette = plt.get_cmap("tab20")(np.arange(20))
    column = np.searchsorted(steps, blocks["step"].to_numpy())
    low = np.floor(blocks["address"].to_numpy() * scale).astype(int)
    high = np.maximum(low + 1, np.ceil((blocks["address"] + blocks["size"]).to_numpy() * scale).astype(int))
    free = (blocks["state"] == "free").to_numpy()
    ids = blocks["block_id"].fillna(0).astype(int).to_numpy()
    for c, lo, hi, is_free, block_id in zip(column, low, high, free, ids):
        image[lo:hi, c] = (0.92, 0.92, 0.92, 1.0) if is_free else palette[block_id % 20]
    ax.imshow(image, origin="lower", aspect="auto", interpolation="nearest",
              extent=(steps[0] - 0.5, steps[-1] + 0.5, 0, top / MIB) if len(steps) else None)
    if failure_step is not None:
        ax.axvline(failure_step, color=STATUS_COLORS["oom"], linewidth=1.2, linestyle="--")
    ax.set_xlabel("schedule step")
    ax.set_ylabel("address (MiB)")
    ax.set_title(title, loc="left", fontsize=10)
    ax.grid(False)
    return ax.figure
