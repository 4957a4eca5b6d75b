"""Hole-census figures: counts per trace, hole widths, and the variant census heatmaps."""

from __future__ import annotations

import matplotlib.pyplot as plt
import matplotlib.ticker as mticker
import numpy as np
import pandas as pd

from .style import HOLE_COLOR, STATUS_COLORS, use_style

_COUNT_COLORS = {"failures": STATUS_COLORS["oom"], "non_monotone_failures": STATUS_COLORS["thrash"],
                 "holes": HOLE_COLOR}
_COUNT_LABELS = {"failures": "failing samples", "non_monotone_failures": "non-monotone failures",
                 "holes": "holes"}


def plot_hole_census(table: pd.DataFrame, holes: pd.DataFrame, *, titles: dict[str, str] | None = None):
    """Left: failing samples, non-monotone failures and holes per trace (``table``: one row per trace,
    as :func:`dtrlab.analysis.holes.census_table`). Right: every hole's width in bytes (``holes``: one
    row per hole with ``trace`` and ``width_bytes``), log scale. Returns the figure."""
    use_style()
    names = list(table["trace"])
    labels = [(titles or {}).get(name, name) for name in names]
    fig, (counts, widths) = plt.subplots(1, 2, figsize=(12, 0.45 * len(names) + 1.8),
                                         gridspec_kw={"width_ratios": (3, 2)})
    y = np.arange(len(names))
    height = 0.27
    for offset, column in zip((-height, 0, height), _COUNT_COLORS):
        values = table[column].to_numpy()
        bars = counts.barh(y + offset, values, height=height, color=_COUNT_COLORS[column],
                           label=_COUNT_LABELS[column])
        counts.bar_label(bars, fmt="%d", fontsize=7, padding=2)
    samples = table["samples"].iloc[0] if len(table) else 0
    counts.set_yticks(y, labels)
    counts.invert_yaxis()
    counts.set_xlabel(f"count (of {samples} sampled budgets per trace)")
    counts.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, frameon=False)
    for i, name in enumerate(names):
        width = holes.loc[holes["trace"] == name, "width_bytes"].to_numpy()
        widths.plot(width, np.full(len(width), i), linestyle="none", marker="v", color=HOLE_COLOR, alpha=0.8)
    widths.set_yticks(y, labels)
    widths.set_ylim(len(names) - 0.5, -0.5)
    if holes["width_bytes"].gt(0).any():
        _bytes_log_axis(widths.xaxis, holes.loc[holes["width_bytes"] > 0, "width_bytes"])
    else:
        widths.text(0.5, 0.5, "no holes at this sampling", ha="center", va="center", transform=widths.transAxes)
        widths.set_xticks([])  # no widths to scale
    widths.set_xlabel("hole width (between the passing budgets around it; 1 MB = 10^6 B)")
    widths.set_title("hole widths after edge refinement")
    fig.tight_layout()
    return fig


def _bytes_log_axis(axis, values) -> None:
    """A log axis labelled in decimal units (``500 kB``, ``2 MB``): labelled ticks at 1, 2 and 5 times a
    power of ten over at most two decades of ``values``, else at powers of ten only, and no minor labels,
    so that labels never collide."""
    axis.axes.set_xscale("log")
    low, high = float(values.min()), float(values.max())
    subs = (1.0, 2.0, 5.0) if high / low <= 100 else (1.0,)
    axis.set_major_locator(mticker.LogLocator(base=10, subs=subs))
    axis.set_major_formatter(mticker.FuncFormatter(lambda x, _: _decimal_bytes(x)))
    axis.set_minor_formatter(mticker.NullFormatter())
    # Over many decades only powers of ten are labelled: reach down to the one below the narrowest hole.
    floor = 10.0 ** np.floor(np.log10(low)) if len(subs) == 1 else low / 1.6
    axis.axes.set_xlim(min(low / 1.6, floor), high * 1.6)


def _decimal_bytes(value: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.3g} B"


def plot_variant_census(table: pd.DataFrame, *, titles: dict[str, str] | None = None,
                        values: tuple[str, ...] = ("failures", "holes")):
    """Heatmaps, one per column of ``values``: policies (rows) x traces (columns), counts written in.

    ``table``: :attr:`dtrlab.analysis.variant_census.VariantCensus.table`. Returns the figure.
    """
    use_style()
    traces = list(dict.fromkeys(table["trace"]))
    policies = list(dict.fromkeys(table["policy"]))
    fig, axes = plt.subplots(1, len(values), figsize=(1.0 * len(traces) * len(values) + 3, 0.36 * len(policies) + 2),
                             squeeze=False)
    for ax, value in zip(axes[0], values):
        grid = table.pivot(index="policy", columns="trace", values=value).loc[policies, traces]
        # vmax at least 1: a grid of zeros is drawn white (none), not in the colour map's middle
        image = ax.imshow(grid.to_numpy(dtype=float), aspect="auto", cmap="Purples" if value == "holes" else "Reds",
                          vmin=0, vmax=max(1.0, float(np.nanmax(grid.to_numpy(dtype=float)))))
        for (i, j), count in np.ndenumerate(grid.to_numpy()):
            dark = count > 0.6 * np.nanmax(grid.to_numpy(dtype=float))
            ax.text(j, i, f"{count:g}", ha="center", va="center", fontsize=8, color="white" if dark else "black")
        ax.set_xticks(range(len(traces)), [(titles or {}).get(t, t) for t in traces], rotation=35, ha="right")
        ax.set_yticks(range(len(policies)), policies)
        ax.set_title(_COUNT_LABELS.get(value, value) + " per policy and trace")
        ax.grid(False)
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.tight_layout()
    return fig
