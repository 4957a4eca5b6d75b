"""``dtrlab check``'s report: its figures and a self-contained HTML page (figures embedded as
base64 PNG; no network, no script, no external style), beside the JSON record. With a knob census
(``dtrlab check --knob``) the page gains a section on torch.compile's activation_memory_budget: the
choice under each accounting, the warnings, and the peak-against-knob figure."""

from __future__ import annotations

import base64
import html
import io
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # the report is written without a display
import matplotlib.pyplot as plt  # noqa: E402

from ..analysis.check import CheckReport, describe_position  # noqa: E402
from ..integrity import atomic_write_bytes  # noqa: E402
from .anatomy import ANATOMY_COLORS, ANATOMY_LABELS  # noqa: E402
from .knob import byte_unit, plot_knob_peaks  # noqa: E402
from .style import HOLE_COLOR, STATUS_COLORS, STATUS_LABELS  # noqa: E402

#: The second semantics' line and hole hatching (the first, flat, is solid).
_SEMANTICS_STYLE = ({"linestyle": "-", "hatch": None}, {"linestyle": "--", "hatch": "//"})
#: The chosen knob's mark (apart from the accountings' blue, orange and green and the statuses' colours).
_CHOSEN = "#e377c2"


def plot_check(report: CheckReport):
    """One panel per policy: overhead (y) of every passing budget of the window (x, ratio of the peak)
    under each semantics (flat solid, caching dashed), failures as marks below by status, holes shaded
    by anatomy, the budget as a black line and the nearest safe budgets as dotted ones."""
    policies = list(dict.fromkeys(c.policy for c in report.checks))
    fig, axes = plt.subplots(len(policies), 1, figsize=(10.0, 2.6 * len(policies) + 1.6), squeeze=False, sharex=True,
                             layout="constrained")
    entries = {}  # label -> handle, over every panel: one legend below them all
    for ax, policy in zip(axes[:, 0], policies):
        checks = [c for c in report.checks if c.policy == policy]
        for index, item in enumerate(checks):
            style = _SEMANTICS_STYLE[min(index, 1)]
            samples = item.samples.sort_values("budget_bytes")
            ratios = samples["budget_bytes"] / report.peak_bytes
            passed = samples["status"] == "pass"
            # NaN at failures breaks the line: no overhead is drawn across a hole
            ax.plot(ratios, samples["overhead"].where(passed).astype(float), color="#333333", linewidth=1.0,
                    linestyle=style["linestyle"], label=f"overhead @ {item.memory}")
            for status in ("oom", "thrash"):
                failed = samples["status"] == status
                ax.plot(ratios[failed], [0.98 - 0.04 * index] * int(failed.sum()), "|", color=STATUS_COLORS[status],
                        transform=ax.get_xaxis_transform(), markersize=6,
                        label=f"{STATUS_LABELS[status]} @ {item.memory}" if failed.any() else None)
            for hole in item.holes:
                kind = hole.get("anatomy") or "limit"
                ax.axvspan(hole["pass_below_bytes"] / report.peak_bytes, hole["pass_above_bytes"] / report.peak_bytes,
                           color=ANATOMY_COLORS.get(kind, "#999999"), alpha=0.25, hatch=style["hatch"], linewidth=0,
                           label=f"hole: {ANATOMY_LABELS.get(kind, kind)} @ {item.memory}")
            for safe in (item.safe_below, item.safe_above):
                if safe is not None:
                    ax.axvline(safe / report.peak_bytes, color=STATUS_COLORS["pass"], linestyle=":", linewidth=1.2)
        ax.axvline(report.ratio, color="black", linewidth=1.4, label="the budget")
        ax.set_ylabel(f"{policy}\noverhead")
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    axes[-1, 0].set_xlabel("budget (fraction of the unbounded peak); dotted green: nearest safe budgets")
    # Legible: the legend's and the title's text as large as the axis labels' (it was 6.5 pt beside 10 pt).
    size = axes[-1, 0].xaxis.label.get_size()
    fig.legend(entries.values(), entries.keys(), loc="outside lower center", ncol=2, fontsize=size, frameon=False)
    fig.suptitle(f"{report.trace}: budget {report.ratio:.4f} of the peak, device {report.device}", fontsize=size)
    return fig


def figure_png(fig) -> bytes:
    """``fig`` as PNG bytes (and closed)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


def plot_check_knob(report: CheckReport):
    """torch.compile's knob at the budget: the step's peak against the knob under each accounting of the
    census (:func:`~dtrlab.plots.knob.plot_knob_peaks`), the budget as a black line, the holes at the budget
    (knobs that do not fit between knobs that do, under the accounting the report answers for) shaded, and
    the chosen knob (the largest that fits) marked. Needs ``report.knob_census``."""
    census, choice = report.knob_census, report.knob
    fig, ax = plt.subplots(figsize=(10.0, 4.8), layout="constrained")
    plot_knob_peaks(census, ax, legend=False, regions=False,
                    title=f"{census.name}: torch.compile activation_memory_budget at the budget "
                          f"({choice['accounting']})")
    knobs, peaks = census.curve(choice["accounting"])
    every = census.samples[list(census.plan.accountings)].to_numpy().ravel()
    scale, unit = byte_unit(every)
    for index, (first, last) in enumerate(choice["holes"]):
        after = next((k for k in knobs if k > last), last)  # the step drawn from ``last`` reaches the next knob
        ax.axvspan(first, after, color=HOLE_COLOR, alpha=0.3, lw=0,
                   label="hole: does not fit between fitting knobs" if index == 0 else None)
        ax.plot([(first + after) / 2], [0.02], "^", color=HOLE_COLOR, ms=6, transform=ax.get_xaxis_transform())
    low, high = every.min() / scale, every.max() / scale
    budget = report.budget_bytes / scale
    if low / 2 <= budget <= high * 2:
        ax.axhline(budget, color="black", lw=1.4, label=f"the budget ({budget:.4g} {unit})")
        ax.set_ylim(min(low, budget) * 0.95, max(high, budget) * 1.05)
    else:
        ax.text(0.01, 0.97 if budget > high else 0.03, f"the budget, {budget:.4g} {unit}, is off this scale "
                f"({'above' if budget > high else 'below'} every peak)", transform=ax.transAxes, fontsize=8,
                va="top" if budget > high else "bottom")
    chosen = choice["largest_fitting_knob"]
    if chosen is not None:
        peak = dict(zip(knobs, peaks))[chosen] / scale
        ax.axvline(chosen, color=_CHOSEN, lw=1.2, linestyle="-.")
        ax.plot([chosen], [peak], "o", color=_CHOSEN, ms=7, zorder=4,
                label=f"chosen knob {chosen:g} (largest that fits)")
    fig.legend(fontsize=ax.xaxis.label.get_size(), loc="outside lower center", ncol=2, frameon=False)  # legible
    return fig


def report_html(report: CheckReport, png: bytes, knob_png: bytes | None = None) -> str:
    """The report as one HTML page with ``png`` (and, with a knob census, ``knob_png``) embedded."""
    e = html.escape
    rows = [[e(c.policy), e(c.memory), e(describe_position(c)), _cell(c.safe_below, report),
             _cell(c.safe_above, report), '' if c.threshold_ratio is None else f'{c.threshold_ratio:.4f}']
            for c in report.checks]
    holes = [[e(c.policy), e(c.memory), f"{h['fail_low_ratio']:.4f}-{h['fail_high_ratio']:.4f}",
              f"{h['width_bytes'] / 2**20:.1f}", e(str(h['kinds'])), e(str(h.get('anatomy') or '')),
              _overhead_limit(h.get('closes_at')), _whole(h.get('needed_remat'), ''), 'yes' if c.hole == h else '']
             for c in report.checks for h in c.holes]
    monotone = "" if report.monotone is None else _monotone_html(report.monotone)
    knob = "" if report.knob is None else _knob_html(report, knob_png)
    summary = "<br>".join(e(line) for line in report.summary())
    image = base64.b64encode(png).decode("ascii")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>dtrlab check: {e(report.trace)}</title>
<style>body{{font-family:sans-serif;max-width:1000px;margin:2em auto;line-height:1.4}}
table{{border-collapse:collapse;font-size:0.9em}}td,th{{border:1px solid #ccc;padding:2px 6px;text-align:left}}
.summary{{background:#f4f4f4;padding:0.8em;font-family:monospace}}img{{max-width:100%}}</style></head>
<body><h1>dtrlab check: {e(report.trace)}</h1>
<p class="summary">{summary}</p>
<p>Window: ratios {report.window[0]:.4f}-{report.window[1]:.4f} of the {report.peak_bytes:,}-byte unbounded peak,
censused every {report.delta_bytes:,} bytes with every pass/fail edge bisected: every hole at least that wide in the
window is found. A <i>safe</i> budget passes with no failing sample within one census step. Hole kinds:
<i>oom</i> fails at any overhead limit; <i>cliff</i> needs at least 1.5&times; its passing neighbours' recompute;
<i>near-miss</i> needs at most 10% more than the limit allows; <i>limit</i>: the limit cuts a gradual rise
(docs/sweeps.md, "Hole anatomy").</p>
<h2>At the budget</h2>
{_table(("policy", "memory", "outcome", "safe below", "safe above", "threshold in the window"), rows)}
<h2>Holes in the window</h2>
{_table(("policy", "memory", "failing ratios", "MiB", "kinds", "anatomy", "closes at limit", "needed recompute",
         "holds the budget"), holes, cell_class={5: "kind"})}
{monotone}
<h2>Figure</h2>
<img id="check-figure" alt="outcomes around the budget" src="data:image/png;base64,{image}">
{knob}
</body></html>
"""


def _table(headers, rows: list[list[str]], cell_class: dict[int, str] | None = None) -> str:
    """An HTML table of ``rows`` (cells already escaped) under ``headers``, or "none" when there are no rows."""
    if not rows:
        return '<p class="none">none</p>'
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td class='{(cell_class or {})[i]}'>{cell}</td>" if i in (cell_class or {})
                                    else f"<td>{cell}</td>" for i, cell in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _knob_html(report: CheckReport, png: bytes | None) -> str:
    """The knob section: the choice under each accounting, the warnings, and the figure."""
    e = html.escape
    choices = [[e(c["accounting"]) + (" (answers)" if c["answers"] else ""), _knob(c["largest_fitting_knob"]),
                _whole(c["peak"], ""), _whole(c["margin"], ""), _whole(c["recompute_flops"], ""),
                _knob(c["smallest_fitting_knob"]), "yes" if c["lowering_is_safe"] else "NO",
                ", ".join(f"{a:g}..{b:g}" for a, b in c["holes"]) or "none", _whole(c["min_peak"], ""),
                _knob(c["knob_at_min"])] for c in report.knob_choices]
    warnings = "".join(f"<li class='warning {e(w['kind'])}'><b>{e(w['kind'])}</b>: {e(w['message'])}</li>"
                       for w in report.knob_warnings)
    figure = "" if png is None else (f'<img id="knob-figure" alt="peak against the knob, with the budget" '
                                     f'src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">')
    plan = e(report.knob_census.plan.describe())
    return f"""<h2 id="knob">torch.compile activation_memory_budget</h2>
<p>From a census of the knob on the same step (knobs {plan}): the largest knob whose peak fits {report.budget_bytes:,} bytes under each accounting
(the report answers for allocated bytes under the caching allocator), its margin, its recompute, and whether a
smaller knob is safe (docs/compile.md).</p>
{_table(("accounting", "largest knob that fits", "its peak (bytes)", "margin (bytes)", "recompute FLOPs",
         "smallest knob that fits", "lowering safe", "holes below (knobs)", "smallest peak reachable",
         "at knob"), choices)}
<h3>Warnings</h3>
{f"<ul>{warnings}</ul>" if warnings else '<p class="none">none</p>'}
{figure}"""


def write_check_report(report: CheckReport, html_path: str | Path, json_path: str | Path,
                       png_path: str | Path | None = None) -> None:
    """Write the HTML report, the JSON record and (with ``png_path``) the figure alone, each atomically."""
    png = figure_png(plot_check(report))
    knob_png = None if report.knob_census is None else figure_png(plot_check_knob(report))
    atomic_write_bytes(html_path, report_html(report, png, knob_png).encode())
    if png_path is not None:
        atomic_write_bytes(png_path, png)
        if knob_png is not None:
            png_path = Path(png_path)
            atomic_write_bytes(png_path.with_name(f"{png_path.stem}-knob.png"), knob_png)
    atomic_write_bytes(json_path, (json.dumps(report.to_dict(), indent=1) + "\n").encode())


def _monotone_html(monotone: dict) -> str:
    overhead = "" if monotone["overhead"] is None else f", overhead {monotone['overhead']:.3f}"
    start = "" if monotone["threshold_ratio"] is None else \
        f"; it passes from {monotone['threshold_ratio']:.3f} of the peak up"
    return (f"<h2>monotone(dtr)</h2><p>Hole-free by construction (flat memory only): "
            f"<b>{html.escape(monotone['status'])}</b> at the budget{overhead}{start}.</p>")


def _cell(budget: int | None, report: CheckReport) -> str:
    return "none in the window" if budget is None else f"{budget:,} ({budget / report.peak_bytes:.4f})"


def _knob(value) -> str:
    return "none" if value is None else f"{value:g}"


# One format per column: a column with a gap (an oom hole's recompute) arrives as floats, its neighbours as ints.

def _whole(value, missing: str) -> str:
    """A count (bytes, FLOPs, recompute) as a whole number with thousands separators."""
    if value is None or math.isnan(value):
        return missing
    return f"{round(value):,}"


def _overhead_limit(value) -> str:
    """The overhead limit a hole closes at, two decimals as in the summary; "never" for an oom hole."""
    if value is None or not math.isfinite(value):
        return "never"
    return f"{value:.2f}"
