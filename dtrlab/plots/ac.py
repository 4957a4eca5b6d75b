"""The side-by-side figure (:mod:`dtrlab.solvers.side_by_side`, notebook 15): every rematerialization system's
overhead at each byte budget, beside the solvers' bracket on the optimum."""

from __future__ import annotations

import math

import numpy as np

from .knob import _axes

#: system: (label, colour, marker and line)
SYSTEM_STYLES = {"dtr": ("DTR", "#1f77b4", "o-"), "monotone": ("monotone(DTR)", "#17becf", "x--"),
                 "knob": ("largest fitting knob", "#9467bd", "s-"), "ac": ("cheapest checkpointing plan", "#d62728", "D-")}


def plot_side_by_side(table, ax=None, *, title: str = "", legend: bool = True):
    """Overhead ((compute + recompute) / compute, FLOPs) against the budget as a fraction of the plain step's peak:
    each system where it fits (no marker: it does not), the cheapest plan's name where it changes, and the band
    between the solvers' lower and upper bounds on the optimum (hatched up from the lower bound where no
    schedule was found; grey where no schedule can fit)."""
    ax = _axes(ax)
    ratios = table.ratio.to_numpy()
    finite = [v for s in SYSTEM_STYLES for v in table[f"{s}_overhead"][table[f"{s}_fits"]] if math.isfinite(v)]
    top = max([1.05, *finite]) * 1.05
    lower = table.opt_lower.to_numpy(dtype=float)
    upper = table.opt_upper.to_numpy(dtype=float)
    ax.fill_between(ratios, np.minimum(lower, top), np.minimum(upper, top), step="mid", color="#2ca02c", alpha=0.2,
                    label="the optimum's bracket (solvers)", hatch="//", edgecolor="#2ca02c", linewidth=0)
    half = np.diff(ratios).min() / 2 if len(ratios) > 1 else 0.01
    for ratio in ratios[~np.isfinite(lower)]:
        ax.axvspan(ratio - half, ratio + half, color="grey", alpha=0.3, linewidth=0)
    ax.axvspan(np.nan, np.nan, color="grey", alpha=0.3, label="no schedule fits (proven)")
    for system, (label, color, style) in SYSTEM_STYLES.items():
        fits = table[f"{system}_fits"].to_numpy(dtype=bool)
        ax.plot(ratios[fits], table[f"{system}_overhead"].to_numpy(dtype=float)[fits], style, color=color, ms=3.5,
                label=label)
    previous = None
    for row in table[table.ac_fits].itertuples():
        if row.ac_plan != previous:
            ax.annotate(row.ac_plan, (row.ratio, row.ac_overhead), fontsize="x-small", color="#d62728",
                        textcoords="offset points", xytext=(2, 3))
        previous = row.ac_plan
    ax.set_ylim(0.98, top)
    ax.set_xlabel("byte budget / plain step's peak")
    ax.set_ylabel("overhead (FLOPs)")
    ax.set_title(title)
    if legend:
        ax.legend(fontsize="xx-small", loc="upper right")
    return ax
