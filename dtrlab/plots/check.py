"""``dtrlab check``'s report: its figure and a self-contained HTML page (figures embedded as
base64 PNG; no network, no script, no external style), beside the JSON record."""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # the report is written without a display
import matplotlib.pyplot as plt  # noqa: E402

from ..analysis.check import CheckReport, describe_position  # noqa: E402
from ..integrity import atomic_write_bytes  # noqa: E402
from .anatomy import ANATOMY_COLORS, ANATOMY_LABELS  # noqa: E402
from .style import STATUS_COLORS, STATUS_LABELS  # noqa: E402

#: The second semantics' line and hole hatching (the first, flat, is solid).
_SEMANTICS_STYLE = ({"linestyle": "-", "hatch": None}, {"linestyle": "--", "hatch": "//"})


def plot_check(report: CheckReport):
    """One panel per policy: overhead (y) of every passing budget of the window (x, ratio of the peak)
    under each semantics (flat solid, caching dashed), failures as marks below by status, holes shaded
    by anatomy, the budget as a black line and the nearest safe budgets as dotted ones."""
    policies = list(dict.fromkeys(c.policy for c in report.checks))
    fig, axes = plt.subplots(len(policies), 1, figsize=(10.0, 2.6 * len(policies)), squeeze=False, sharex=True)
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
        handles, labels = ax.get_legend_handles_labels()
        unique = dict(zip(labels, handles))
        ax.legend(unique.values(), unique.keys(), fontsize=6.5, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes[-1, 0].set_xlabel("budget (fraction of the unbounded peak); dotted green: nearest safe budgets")
    fig.suptitle(f"{report.trace}: budget {report.ratio:.4f} of the peak, device {report.device}", fontsize=9)
    fig.tight_layout()
    return fig


def figure_png(fig) -> bytes:
    """``fig`` as PNG bytes (and closed)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


def report_html(report: CheckReport, png: bytes) -> str:
    """The report as one HTML page with ``png`` embedded."""
    e = html.escape
    rows = "".join(
        f"<tr><td>{e(c.policy)}</td><td>{e(c.memory)}</td><td>{e(describe_position(c))}</td>"
        f"<td>{_cell(c.safe_below, report)}</td><td>{_cell(c.safe_above, report)}</td>"
        f"<td>{'' if c.threshold_ratio is None else f'{c.threshold_ratio:.4f}'}</td></tr>" for c in report.checks)
    holes = "".join(
        f"<tr><td>{e(c.policy)}</td><td>{e(c.memory)}</td><td>{h['fail_low_ratio']:.4f}-{h['fail_high_ratio']:.4f}"
        f"</td><td>{h['width_bytes'] / 2**20:.1f}</td><td>{e(str(h['kinds']))}</td>"
        f"<td class='kind'>{e(str(h.get('anatomy') or ''))}</td><td>{_number(h.get('closes_at'), 'never')}</td>"
        f"<td>{_number(h.get('needed_remat'), '')}</td><td>{'yes' if c.hole == h else ''}</td></tr>"
        for c in report.checks for h in c.holes)
    monotone = "" if report.monotone is None else _monotone_html(report.monotone)
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
<table><tr><th>policy</th><th>memory</th><th>outcome</th><th>safe below</th><th>safe above</th>
<th>threshold in the window</th></tr>{rows}</table>
<h2>Holes in the window</h2>
<table><tr><th>policy</th><th>memory</th><th>failing ratios</th><th>MiB</th><th>kinds</th><th>anatomy</th>
<th>closes at limit</th><th>needed recompute</th><th>holds the budget</th></tr>{holes}</table>
{monotone}
<h2>Figure</h2>
<img id="check-figure" alt="outcomes around the budget" src="data:image/png;base64,{image}">
</body></html>
"""


def write_check_report(report: CheckReport, html_path: str | Path, json_path: str | Path,
                       png_path: str | Path | None = None) -> None:
    """Write the HTML report, the JSON record and (with ``png_path``) the figure alone, each atomically."""
    png = figure_png(plot_check(report))
    atomic_write_bytes(html_path, report_html(report, png).encode())
    if png_path is not None:
        atomic_write_bytes(png_path, png)
    atomic_write_bytes(json_path, (json.dumps(report.to_dict(), indent=1) + "\n").encode())


def _monotone_html(monotone: dict) -> str:
    overhead = "" if monotone["overhead"] is None else f", overhead {monotone['overhead']:.3f}"
    start = "" if monotone["threshold_ratio"] is None else \
        f"; it passes from {monotone['threshold_ratio']:.3f} of the peak up"
    return (f"<h2>monotone(dtr)</h2><p>Hole-free by construction (flat memory only): "
            f"<b>{html.escape(monotone['status'])}</b> at the budget{overhead}{start}.</p>")


def _cell(budget: int | None, report: CheckReport) -> str:
    return "none in the window" if budget is None else f"{budget:,} ({budget / report.peak_bytes:.4f})"


def _number(value, missing: str) -> str:
    if value is None:
        return missing
    return f"{value:.3f}" if isinstance(value, float) else f"{value:,}"
