"""Figures of the activation-memory knob census (:mod:`dtrlab.analysis.knob_census`, docs/compile.md).

The census takes the peak as constant from one evaluated knob to the next, so every curve is drawn as a
step from each sample to the next (``where="post"``).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from .style import HOLE_COLOR, STATUS_COLORS

GIB = 2**30


def byte_unit(values) -> tuple[int, str]:
    """(bytes per unit, its name): GiB when the largest value reaches one, else MiB."""
    return (GIB, "GiB") if max(values, default=0) >= GIB else (2**20, "MiB")
ACCOUNTING_STYLES = {"flat_peak": ("flat bytes", "#1f77b4", "-"),
                     "allocated_peak": ("caching allocator, allocated", "#ff7f0e", "--"),
                     "reserved_peak": ("caching allocator, reserved", "#2ca02c", ":")}


def _axes(ax):
    return plt.subplots(figsize=(6, 3.6))[1] if ax is None else ax


def plot_knob_peaks(census, ax=None, *, title: str | None = None, legend: bool = True, regions: bool = True):
    """The step's peak (GiB, or MiB below one GiB) against the knob under each accounting; with ``regions``, the
    non-monotone regions of the first accounting (knobs some larger knob beats) shaded."""
    ax = _axes(ax)
    scale, unit = byte_unit(census.samples[list(census.plan.accountings)].to_numpy().ravel())
    for accounting in census.plan.accountings:
        knobs, peaks = census.curve(accounting)
        label, color, linestyle = ACCOUNTING_STYLES.get(accounting, (accounting, None, "-"))
        ax.step(knobs, np.array(peaks) / scale, where="post", color=color, linestyle=linestyle, label=label)
    shaded = census.plan.accountings[0]
    for index, region in enumerate(census.regions[census.regions.accounting == shaded].itertuples() if regions else ()):
        ax.axvspan(region.knob_from, region.beaten_by_knob, color=HOLE_COLOR, alpha=0.15, lw=0,
                   label=f"non-monotone ({ACCOUNTING_STYLES.get(shaded, (shaded,))[0]})" if index == 0 else None)
    ax.set_xlabel("activation_memory_budget (knob)")
    ax.set_ylabel(f"peak memory ({unit})")
    ax.set_title(title if title is not None else census.name)
    if legend:
        ax.legend(fontsize="small")
    return ax


#: Each knob accounting's backend (dtrlab.memory.partitioned.knob_peaks): its label and colour.
BACKEND_STYLES = {"aot_eager": ("aot_eager", "#1f77b4"), "inductor": ("Inductor", "#d62728")}


def plot_knob_backends(censuses: dict, accounting: str = "allocated_peak", ax=None, *, title: str = ""):
    """One model's peak against the knob under each backend's accounting (``censuses``: backend -> census of
    the same step), under ``accounting``; a dot at every knob a census evaluated (their plans may differ)."""
    ax = _axes(ax)
    curves = {backend: census.curve(accounting) for backend, census in censuses.items()}
    scale, unit = byte_unit([peak for _, peaks in curves.values() for peak in peaks])
    for backend, (knobs, peaks) in curves.items():
        label, color = BACKEND_STYLES.get(backend, (backend, None))
        line = ax.step(knobs, np.array(peaks) / scale, where="post", color=color,
                       label=f"{label}, {len(knobs)} knobs")[0]
        ax.plot(knobs, np.array(peaks) / scale, ".", color=line.get_color(), markersize=2)
    ax.set_xlabel("activation_memory_budget (knob)")
    ax.set_ylabel(f"{accounting.replace('_peak', '')} peak ({unit})")
    ax.set_title(title)
    ax.legend(fontsize="x-small")
    return ax


def plot_knob_holes(census, accounting: str = "allocated_peak", ax=None, *, title: str | None = None):
    """Holes in byte terms: the knob on x, the byte budget on y. Above the peak curve the knob fits; a
    hole (purple) is a budget and a run of knobs that do not fit although a smaller and a larger knob do."""
    ax = _axes(ax)
    knobs, peaks = census.curve(accounting)
    scale, unit = byte_unit(peaks)
    peaks_gib = np.array(peaks) / scale
    top = peaks_gib.max() * 1.08
    ax.step(knobs, peaks_gib, where="post", color="black", lw=1.2, label="peak (fits above)")
    ax.fill_between(knobs, peaks_gib, top, step="post", color=STATUS_COLORS["pass"], alpha=0.15, lw=0,
                    label="fits")
    holes = census.holes[census.holes.accounting == accounting]
    for index, hole in enumerate(holes.itertuples()):
        budget_to = (hole.budget_to + 1) / scale if hole.budget_to == hole.budget_to and hole.budget_to is not None \
            else top
        ax.fill_between([hole.knob_from, hole.fits_above], hole.budget_from / scale, budget_to, color=HOLE_COLOR,
                        alpha=0.6, lw=0, label="hole" if index == 0 else None)
    ax.set_ylim(peaks_gib.min() * 0.85, top)
    ax.set_xlabel("activation_memory_budget (knob)")
    ax.set_ylabel(f"byte budget ({unit})")
    ax.set_title(title if title is not None else f"{census.name}: holes ({accounting})")
    ax.legend(fontsize="small", loc="lower right")
    return ax


def plot_knob_map(census, accounting: str = "allocated_peak", ax=None, *, title: str | None = None):
    """The bytes-to-knob map: at each byte budget the largest knob that fits (black) and the smallest
    (grey); red where lowering the knob from the largest fitting value is not safe (a smaller knob fails)."""
    ax = _axes(ax)
    table = census.knob_map[census.knob_map.accounting == accounting]
    scale, unit = byte_unit(table.budget_from)
    budgets = table.budget_from.to_numpy() / scale
    edge = budgets[-1] * 1.05 if len(budgets) else 1
    xs = np.append(budgets, edge)
    ax.step(xs, np.append(table.largest_fitting_knob, table.largest_fitting_knob.iloc[-1]), where="post",
            color="black", label="largest knob that fits")
    ax.step(xs, np.append(table.smallest_fitting_knob, table.smallest_fitting_knob.iloc[-1]), where="post",
            color="grey", linestyle="--", label="smallest knob that fits")
    unsafe = table[~table.lowering_is_safe.astype(bool)]
    ax.scatter(unsafe.budget_from / scale, unsafe.largest_fitting_knob, color=STATUS_COLORS["oom"], zorder=3, s=14,
               label="a smaller knob does not fit")
    ax.set_xlabel(f"byte budget ({unit})")
    ax.set_ylabel("activation_memory_budget")
    ax.set_title(title if title is not None else f"{census.name}: knob for a budget ({accounting})")
    ax.legend(fontsize="small")
    return ax


def plot_dtr_beside_knob(table, ax=None, *, title: str = ""):
    """At each byte budget: whether some knob fits, whether DTR and monotone(DTR) pass (strips below), and
    the overhead ((compute + recompute) / compute) of the largest fitting knob, of DTR and of monotone(DTR)."""
    ax = _axes(ax)
    scale, unit = byte_unit(table.budget_bytes)
    budgets = table.budget_bytes.to_numpy() / scale
    lanes = [("knob fits", np.where(table.knob_fits, "pass", "oom")), ("DTR", table.dtr_status.to_numpy())]
    if table.monotone_status.notna().any():
        lanes.append(("monotone(DTR)", table.monotone_status.to_numpy()))
    fits = table.knob_fits.to_numpy(dtype=bool)
    overheads = [table.knob_overhead[fits], *(table[c][table[s] == "pass"] for c, s in (
        ("dtr_overhead", "dtr_status"), ("monotone_overhead", "monotone_status")))]
    top = max([1.05, *(float(np.nanmax(o)) for o in overheads if len(o))])
    lane_height = (top - 1) * 0.12
    for lane, (label, statuses) in enumerate(lanes):
        height = 1 - lane_height * (lane + 1)
        ax.scatter(budgets, np.full(len(budgets), height), c=[STATUS_COLORS.get(s, "grey") for s in statuses],
                   marker="s", s=10)
        ax.text(budgets.min(), height + lane_height * 0.3, label, fontsize="x-small")
    ax.step(budgets[fits], table.knob_overhead[fits], where="post", color="#9467bd", label="largest fitting knob")
    for column, status, color, style in (("dtr_overhead", "dtr_status", "#1f77b4", "o-"),
                                         ("monotone_overhead", "monotone_status", "#17becf", "--")):
        passed = (table[status] == "pass").to_numpy()
        ax.plot(budgets[passed], table[column][passed], style, color=color, ms=2.5,
                label="DTR" if column == "dtr_overhead" else "monotone(DTR)")
    ax.set_ylim(1 - lane_height * (len(lanes) + 0.7), top + lane_height * 0.4)
    ax.set_xlabel(f"byte budget ({unit})")
    ax.set_ylabel("overhead (FLOPs)")
    ax.set_title(title)
    ax.legend(fontsize="x-small", loc="center right")
    return ax


def knob_panels(items: dict, draw, *, titles: dict[str, str] | None = None, columns: int = 3, **options):
    """One panel per census or table in ``items``, drawn by ``draw`` (one of this module's plot functions)
    with ``options``; returns the figure."""
    from .style import panel_grid

    fig, axes = panel_grid(len(items), columns=columns, panel_size=(4.4, 3.0))
    for ax, (name, item) in zip(axes, items.items()):
        draw(item, ax=ax, title=(titles or {}).get(name, name), **options)
    fig.tight_layout()
    return fig


def plot_knob_interventions(rows, ax=None, *, top: int = 12, title: str = ""):
    """Single-node interventions at one knob (:func:`dtrlab.memory.partitioned.interventions`): the
    change of the flat peak (MiB) when one node the partitioner recomputed is forced saved, or one it
    saved is forced recomputed; the ``top`` largest changes either way. A bar below zero is a decision
    of the partitioner that raises the peak the user sees."""
    import pandas as pd

    ax = _axes(ax)
    table = pd.DataFrame(rows)
    table = table.reindex(table.peak_delta.abs().sort_values(ascending=False).index).head(top)[::-1]
    colors = [STATUS_COLORS["pass"] if d < 0 else STATUS_COLORS["oom"] for d in table.peak_delta]
    ax.barh([f"{n} ({f})" for n, f in zip(table.node, table.forced)], table.peak_delta / 2**20, color=colors)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel("flat peak change (MiB)")
    ax.set_title(title)
    return ax
