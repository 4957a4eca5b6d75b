"""Notebook 11's figure: real execution against the simulator around a hole (docs/execute.md)."""

from __future__ import annotations

import matplotlib.pyplot as plt

from .style import HOLE_COLOR, STATUS_COLORS, use_style

RUN_COLORS = ("#1f77b4", "#d62728", "#17becf")  # the runs below, inside and above the hole


def plot_real_execution(census, runs: dict, simulated: dict, trace, title: str = ""):
    """Four panels: the census around the hole with the real runs on it; accounted and real memory
    over the step; the evicted storages in order, real against simulated, at the hole; and each real
    recomputation's wall time against its cost in the trace.

    ``census`` is the sweep frame; ``runs`` and ``simulated`` map a label (``below``, ``hole``,
    ``above``) to an ``ExecuteResult`` and a ``RunResult`` of the same budget; ``trace`` is the
    captured trace (for storage ids).
    """
    use_style()
    fig, (strip, memory, order, walls) = plt.subplots(1, 4, figsize=(16, 3.4))
    peak = int(census.baseline_memory.iloc[0])

    for status, color in STATUS_COLORS.items():
        rows = census[census.status == status]
        strip.scatter(rows.budget_bytes / peak, [0] * len(rows), s=18, color=color, label=f"simulated {status}")
    for number, (label, run) in enumerate(runs.items()):
        strip.scatter([run.run.budget_bytes / peak], [1], s=90, facecolor="none", edgecolor=STATUS_COLORS[run.status],
                      linewidth=2)
        strip.annotate(label, (run.run.budget_bytes / peak, 1), textcoords="offset points",
                       xytext=(0, 9 + 11 * (number % 2)), ha=("right", "center", "left")[min(number, 2)],
                       fontsize=8)  # neighbours stagger
    strip.set_yticks([0, 1], ["census", "real"])
    strip.set_ylim(-0.6, 1.8)
    strip.set_xlabel("budget / unbounded peak")
    strip.set_title("the census and the real runs")
    strip.legend(loc="lower right", fontsize=7)

    for label, style in (("hole", "-"), ("above", "--")):
        if label not in runs:
            continue
        timeline = runs[label].memory_timeline
        memory.plot([s / 1e3 for s, _ in timeline], style, color="black", linewidth=1, label=f"{label}: accounted")
        memory.plot([r / 1e3 for _, r in timeline], style, color=HOLE_COLOR, linewidth=1, label=f"{label}: real")
    if "hole" in runs:
        memory.axhline(runs["hole"].run.budget_bytes / 1e3, color=STATUS_COLORS["oom"], linewidth=0.8)
    memory.set_xlabel("operator")
    memory.set_ylabel("kB resident")
    memory.set_title("memory over the step")
    memory.legend(fontsize=7)

    index = {name: t for t, name in enumerate(trace.tensor_names)}
    at = "hole" if "hole" in runs else next(iter(runs))
    real_order = [index[name] for name in runs[at].evicted_storages]
    simulated_order = [index[name] for name in simulated[at].evicted_storages]
    order.plot(simulated_order, color="black", linewidth=0.8, label="simulated")
    order.scatter(range(len(real_order)), real_order, s=4, color=HOLE_COLOR, label="real", zorder=3)
    order.set_xlabel("eviction")
    order.set_ylabel("storage (tensor id)")
    same = "identical" if real_order == simulated_order else "DIFFERENT"
    order.set_title(f"evictions at the {at} budget: {same}")
    order.legend(fontsize=7)

    for number, (label, run) in enumerate(runs.items()):
        costs = [r.cost for r in run.recomputations if r.cost > 0]
        times = [r.wall_ns / 1e3 for r in run.recomputations if r.cost > 0]
        walls.scatter(costs, times, s=6, alpha=0.5, label=f"{label} ({run.status})", color=RUN_COLORS[number % 3])
    walls.set_xscale("log")
    walls.set_yscale("log")
    walls.set_xlabel("cost in the trace")
    walls.set_ylabel("wall time (µs)")
    walls.set_title("each real recomputation")
    walls.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
