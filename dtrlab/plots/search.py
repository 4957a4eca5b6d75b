"""Figures of notebook 10: overhead curves, holes per policy, inclusion breaks against holes."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .style import STATUS_COLORS, legend_below, panel_grid, policy_styles, title_above


def plot_overhead_curves(samples: pd.DataFrame, titles: dict[str, str] | None = None, columns: int = 4):
    """One panel per trace: overhead of every policy's passing samples against the budget ratio.

    Above each panel, outside its data area, a strip with one row per policy marks that
    policy's failing samples, so a hole shows as a gap in a line with a mark above it.
    ``samples`` are sweep rows (``trace``, ``policy``, ``ratio``, ``status``, ``overhead``).
    """
    traces = list(dict.fromkeys(samples["trace"]))
    styles = policy_styles(samples["policy"])
    fig, axes = panel_grid(len(traces), columns=columns, panel_size=(3.8, 3.4))
    for ax, trace in zip(axes, traces):
        rows = samples[samples["trace"] == trace]
        strip = ax.inset_axes([0, 1.04, 1, 0.045 * len(styles)], sharex=ax)
        for k, (label, style) in enumerate(styles.items()):
            run = rows[rows["policy"] == label].sort_values("ratio")
            passed = run["status"] == "pass"
            # NaN between passing samples breaks the line at failures.
            ax.plot(run["ratio"], run["overhead"].where(passed), color=style.color, linestyle=style.linestyle,
                    linewidth=1.2, label=style.label)
            # A passing sample between failures (or at an end) draws no line: a dot shows it.
            alone = passed & ~passed.shift(1, fill_value=False) & ~passed.shift(-1, fill_value=False)
            ax.plot(run.loc[alone, "ratio"], run.loc[alone, "overhead"], ".", color=style.color, markersize=5)
            failed = run.loc[~passed, "ratio"]
            strip.plot(failed, np.full(len(failed), len(styles) - 1 - k), "|", color=style.color, markersize=4,
                       markeredgewidth=1.0)
        strip.set_ylim(-0.7, len(styles) - 0.3)
        strip.set_yticks([])
        strip.tick_params(axis="x", labelbottom=False, length=0)
        strip.grid(False)
        for side in ("left", "bottom"):
            strip.spines[side].set_visible(False)
        strip.set_title((titles or {}).get(trace, trace))
        ax.set_xlim(0, 1.02)
        ax.set_xlabel("budget / baseline peak")
        ax.set_ylabel("overhead")
    fig.tight_layout()
    title_above(fig, "Overhead of the passing budgets; above each panel, one row per policy: its failing budgets")
    legend_below(fig, axes[0].get_legend_handles_labels()[0])
    return fig


def plot_holes_per_policy(tables: dict[str, pd.DataFrame]):
    """Bars of total holes per policy, one panel per trace set (e.g. tuning and held-out).

    Each table has one row per policy with ``policy``, ``holes``, ``threshold`` and ``overhead``.
    """
    fig, axes = panel_grid(len(tables), columns=min(len(tables), 3), panel_size=(5.0, 3.2))
    for ax, (title, table) in zip(axes, tables.items()):
        styles = policy_styles(table["policy"])
        colors = [styles[p].color for p in table["policy"]]
        bars = ax.bar(range(len(table)), table["holes"], color=colors)
        for bar, threshold, overhead in zip(bars, table["threshold"], table["overhead"]):
            ax.annotate(f"t={threshold:.3f}\no={overhead:.3f}", (bar.get_x() + bar.get_width() / 2,
                                                                  bar.get_height()),
                        ha="center", va="bottom", fontsize=6)
        ax.set_xticks(range(len(table)), [styles[p].label[:24] for p in table["policy"]], rotation=40, ha="right",
                      fontsize=7)
        ax.set_ylabel("holes (total over traces)")
        ax.set_title(title)
        ax.margins(y=0.25)
    fig.suptitle("Holes per policy; t = mean threshold ratio, o = mean overhead of passing budgets", y=1.0)
    fig.tight_layout()
    return fig


def plot_breaks_against_holes(prediction: pd.DataFrame, pairs: pd.DataFrame):
    """Left: per policy, the share of passing neighbour pairs that break inclusion, that are
    hole onsets, and the precision of "break => onset". Right: violating steps of onset
    pairs against the other passing pairs."""
    fig, (left, right) = panel_grid(2, columns=2, panel_size=(5.0, 3.2))
    table = prediction[prediction["policy"] != "all"].reset_index(drop=True)
    x = np.arange(len(table))
    width = 0.27
    left.bar(x - width, table["breaks"] / table["pairs"], width, label="pairs that break", color="#1f77b4")
    left.bar(x, table["onset_rate"], width, label="hole onsets", color=STATUS_COLORS["oom"])
    left.bar(x + width, table["precision"].fillna(0), width, label="precision of break => onset", color="#6a3d9a")
    left.set_xticks(x, [p[:24] for p in table["policy"]], rotation=40, ha="right", fontsize=7)
    left.set_ylabel("share of passing neighbour pairs")
    left.legend(fontsize=7)
    eligible = pairs[pairs["status_small"] == "pass"]
    onset = eligible[eligible["hole_onset"].astype(bool)]
    other = eligible[~eligible["hole_onset"].astype(bool)]
    right.hist([other["violating_steps"], onset["violating_steps"]], bins=20, label=["no onset", "hole onset"],
               color=["#7f7f7f", STATUS_COLORS["oom"]], density=True)
    right.set_xlabel("steps with an inclusion violation")
    right.set_ylabel("density")
    right.legend(fontsize=7)
    fig.suptitle("Inclusion breaks between neighbouring budgets against hole onsets", y=1.0)
    fig.tight_layout()
    return fig
