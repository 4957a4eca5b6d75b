"""One look for every figure: status and policy colours, panel layout, saving.

Styling lives here, not on policies: a policy is identified by its registry name
(``dtr``, ``random``, ...); labelled variants such as ``random(seed=3)`` share
their base policy's style.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path

import matplotlib as mpl
import matplotlib.pyplot as plt

from ..integrity import atomic_write_bytes

#: Outcome colours: pass green, out of memory red, thrash orange.
STATUS_COLORS = {"pass": "#2ca02c", "oom": "#d62728", "thrash": "#ff7f0e"}
STATUS_LABELS = {"pass": "pass", "oom": "out of memory", "thrash": "thrash (overhead > limit)"}
HOLE_COLOR = "#6a3d9a"
THRESHOLD_COLOR = "#1f1f1f"


@dataclass(frozen=True)
class LineStyle:
    label: str
    color: str
    marker: str
    linestyle: str = "-"


#: The DTR paper's seven simulated policies, in its legend order.
POLICY_STYLES = {
    "dtr": LineStyle("DTR (h_DTR)", "#1f77b4", "o"),
    "dtr_eq_class": LineStyle("DTR eq. class (h_DTR^eq)", "#17becf", "s", "--"),
    "dtr_local": LineStyle("DTR local (h_DTR^local)", "#9467bd", "^", "-."),
    "msps": LineStyle("MSPS", "#2ca02c", "D"),
    "lru": LineStyle("LRU", "#d62728", "v", ":"),
    "largest_storage": LineStyle("Largest storage", "#8c564b", "P", "--"),
    "random": LineStyle("Random", "#7f7f7f", "X", ":"),
}
# Spare styles for policies without one (variants): 12 colours x 4 dash patterns.
_FALLBACK_COLORS = ["#e377c2", "#bcbd22", "#ff7f0e", "#393b79", "#8c6d31", "#843c39", "#7b4173", "#637939",
                    "#aec7e8", "#98df8a", "#c5b0d5", "#f7b6d2"]
_FALLBACK_MARKERS = ["*", "h", "p", "<", ">", "8", "d", "H"]
_FALLBACK_LINESTYLES = ["-", "--", "-.", ":"]


def policy_base(label: str) -> str:
    """``random(seed=3)`` -> ``random``: the registry name inside a run's policy label."""
    return label.split("(", 1)[0]


def policy_style(label: str, index: int = 0) -> LineStyle:
    """Style of a policy label; unknown policies (variants) take the ``index``-th spare style."""
    known = POLICY_STYLES.get(policy_base(label))
    if known is not None:
        return known
    return LineStyle(label, _FALLBACK_COLORS[index % len(_FALLBACK_COLORS)],
                     _FALLBACK_MARKERS[index % len(_FALLBACK_MARKERS)],
                     _FALLBACK_LINESTYLES[index // len(_FALLBACK_COLORS) % len(_FALLBACK_LINESTYLES)])


def policy_styles(labels) -> dict[str, LineStyle]:
    """Distinct styles for the policies of one figure: known ones keep theirs, the rest get spare ones in order."""
    styles, spare = {}, 0
    for label in dict.fromkeys(labels):
        styles[label] = policy_style(label, spare)
        spare += policy_base(label) not in POLICY_STYLES
    return styles


def use_style() -> None:
    """Readable defaults for print and screen (applied by every plotting function)."""
    mpl.rcParams.update({
        "figure.dpi": 110, "savefig.dpi": 150, "savefig.bbox": "tight",
        "font.size": 10, "axes.titlesize": 10, "axes.labelsize": 10, "legend.fontsize": 9,
        "xtick.labelsize": 9, "ytick.labelsize": 9, "axes.grid": True, "grid.alpha": 0.3,
        "axes.spines.top": False, "axes.spines.right": False, "pdf.fonttype": 42,
    })


def panel_grid(n: int, columns: int = 4, panel_size: tuple[float, float] = (3.6, 2.6), **kwargs):
    """A figure with ``n`` panels in rows of ``columns``; unused axes are hidden. Returns (fig, axes list)."""
    use_style()
    columns = max(1, min(columns, n))
    rows = max(1, math.ceil(n / columns))
    fig, axes = plt.subplots(rows, columns, figsize=(panel_size[0] * columns, panel_size[1] * rows),
                             squeeze=False, **kwargs)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def axes_extent(fig) -> tuple[float, float]:
    """The bottom and top, in figure coordinates, of every visible axes with its labels, titles and insets."""
    fig.canvas.draw()  # the labels' extents
    renderer = fig.canvas.get_renderer()
    to_figure = fig.transFigure.inverted()
    boxes = [ax.get_tightbbox(renderer).transformed(to_figure) for ax in fig.axes if ax.get_visible()]
    return min(b.y0 for b in boxes), max(b.y1 for b in boxes)


def title_above(fig, text: str, *, gap: float = 0.08):
    """A figure title just above every visible axes and its titles (``suptitle`` at a fixed height left a
    gap over panels with strips above them, or overlapped them), wrapped at "; " when wider than the figure."""
    _, top = axes_extent(fig)
    title = fig.suptitle(text, y=top + gap / fig.get_figheight(), va="bottom")
    fig.canvas.draw()
    if title.get_window_extent().width > fig.bbox.width:
        title.set_text(text.replace("; ", ";\n", 1))
    return title


def legend_below(fig, handles, *, min_width: float = 7.5, gap: float = 0.02):
    """A figure legend under every visible axes and its labels, so it never covers an x-axis label
    (a fixed offset did on a one-panel figure), in as many columns as fit ``min_width`` inches or the
    figure's width, whichever is wider (``savefig.bbox = "tight"`` keeps a legend wider than the figure)."""
    bottom, _ = axes_extent(fig)
    longest = max(len(h.get_label()) for h in handles)
    size = mpl.rcParams["legend.fontsize"]
    entry = 0.065 * longest * (size if isinstance(size, (int, float)) else 9) / 9 + 0.7  # inches: a label and its key
    columns = max(1, min(len(handles), int(max(min_width, fig.get_figwidth()) // entry)))
    return fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, bottom - gap / fig.get_figheight()),
                      ncol=columns, frameon=False)


def short_trace_name(name: str) -> str:
    """``resnet32-56-9000000000.0-2020-...-default`` -> ``resnet32-56``: model and batch of a DTR log name."""
    parts = name.split("-")
    if len(parts) > 2 and parts[2].replace(".", "", 1).isdigit():
        return "-".join(parts[:2])
    return name


def save_figure(fig, directory: str | Path, name: str) -> list[Path]:
    """Write ``name``.png and ``name``.pdf into ``directory`` (created); returns both paths.

    Each file is drawn into memory and then written atomically, so a run killed while saving leaves the
    previous figure whole, never a truncated PDF."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    png, pdf = directory / f"{name}.png", directory / f"{name}.pdf"
    # No creation date in the PDF, so that regenerating an unchanged figure changes no byte; the rest of the bytes
    # depend on the versions constraints.txt pins (fontTools writes the PDF's font subset).
    for path, options in ((png, {"format": "png"}), (pdf, {"format": "pdf", "metadata": {"CreationDate": None}})):
        buffer = io.BytesIO()
        fig.savefig(buffer, **options)
        atomic_write_bytes(path, buffer.getvalue())
    return [png, pdf]


def trace_set_name(traces_dir: str | Path) -> str:
    """The name of a set of traces: its directory's (``traces``, ``dtr-logs``, ``models``)."""
    return Path(traces_dir).resolve().name


def figure_directory(traces_dir: str | Path, root: str | Path = "figures") -> Path:
    """Where the figures of the traces in ``traces_dir`` go: ``root/<trace set>/``, so that each set of
    traces keeps its own figures (``dtrlab figures`` and every notebook use it)."""
    return Path(root) / trace_set_name(traces_dir)


def trace_titles(traces: dict) -> dict[str, str]:
    """Panel titles: each trace's manifest title (e.g. ``ResNet-32 (56)``), else its short name."""
    return {name: trace.meta.get("title") or short_trace_name(name) for name, trace in traces.items()}
