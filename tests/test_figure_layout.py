"""Figure layout that a user's own traces exercise: a shared legend below the panels never covers an
x-axis label, with one panel (a user's single capture) or many."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from dtrlab.analysis.holes import find_holes  # noqa: E402
from dtrlab.plots import plot_feasibility_map  # noqa: E402
from dtrlab.sweep import sweep  # noqa: E402
from dtrlab.sweep.execution import Execution  # noqa: E402


def overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


@pytest.mark.parametrize("panels", [1, 5])
def test_feasibility_map_legend_is_below_every_label(small_resnet, panels):
    census = find_holes(sweep(small_resnet, "dtr", ratios="0.3:0.9:0.1", execution=Execution(cache=False,
                                                                                             progress=False)))
    fig = plot_feasibility_map([census] * panels)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (legend,) = fig.legends
    box = legend.get_window_extent(renderer)
    labelled = [ax for ax in fig.axes if ax.get_xlabel()]
    assert labelled and all(not overlaps(box, ax.get_tightbbox(renderer)) for ax in fig.axes)
    assert all(box.y1 <= ax.xaxis.label.get_window_extent(renderer).y0 for ax in labelled)
    plt.close(fig)


def test_variant_heatmap_of_zeros_is_white():
    """A grid of zero holes (a user's one trace, no holes) is the colour map's bottom, not its middle."""
    import pandas as pd

    from dtrlab.plots.census import plot_variant_census

    table = pd.DataFrame({"trace": ["t", "t"], "policy": ["dtr", "msps"], "failures": [1, 0], "holes": [0, 0]})
    fig = plot_variant_census(table)
    holes = [ax for ax in fig.axes if ax.get_title().startswith("holes")][0]
    (image,) = holes.get_images()
    assert image.norm.vmin == 0 and image.norm.vmax == 1
    plt.close(fig)


@pytest.mark.parametrize("panels", [1, 7])
def test_overhead_curves_title_and_legend_hug_the_panels(panels):
    """Notebook 10's overhead curves: the title sits just above the panels' strips (no band of empty space,
    no overlap) and the legend below every label, with one trace or many."""
    import numpy as np
    import pandas as pd

    from dtrlab.plots.search import plot_overhead_curves

    rows = [{"trace": f"t{t}", "policy": p, "ratio": r, "status": "pass" if r > 0.4 else "thrash",
             "overhead": 2 - r} for t in range(panels) for p in ("dtr", "msps") for r in np.linspace(0.05, 1, 20)]
    fig = plot_overhead_curves(pd.DataFrame(rows))
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [ax.get_tightbbox(renderer) for ax in fig.axes if ax.get_visible()]
    top = max(box.y1 for box in boxes)
    title = fig.get_suptitle() and fig._suptitle.get_window_extent(renderer)
    assert top <= title.y0 <= top + 0.2 * fig.dpi  # within a fifth of an inch above the strips' titles
    (legend,) = fig.legends
    assert legend.get_window_extent(renderer).y1 <= min(box.y0 for box in boxes)
    plt.close(fig)


@pytest.mark.parametrize("panels", [1, 6])
@pytest.mark.parametrize("plot", ["plot_pareto", "plot_overhead"])
def test_pareto_and_overhead_legends_are_below_every_label(small_resnet, plot, panels):
    """Notebooks 06 and 04: eight policies' legend under the panels, not over a one-panel figure's x label
    (the fixed offset it had did that)."""
    import dtrlab.plots.pareto as pareto

    frame = sweep(small_resnet, "dtr", ratios="0.3:0.9:0.1", execution=Execution(cache=False, progress=False))
    frames = [frame.assign(trace=f"t{t}", policy=policy) for t in range(panels)
              for policy in ("dtr", "msps", "lru", "largest_storage", "dtr_local", "dtr_eq_class")]
    import pandas as pd

    fig = getattr(pareto, plot)(pd.concat(frames, ignore_index=True))
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (legend,) = fig.legends
    box = legend.get_window_extent(renderer)
    assert all(box.y1 <= ax.get_tightbbox(renderer).y0 for ax in fig.axes if ax.get_visible())
    plt.close(fig)


def test_model_strips_draw_each_configurations_own_samples_and_holes():
    # Two traces x two configurations, their rows interleaved: each strip must draw its own samples (one cell
    # each, coloured by status, in ratio order) and mark its own holes, however the frame is ordered.
    import numpy as np
    import pandas as pd

    from dtrlab.plots.memory import plot_model_strips
    from dtrlab.plots.style import STATUS_COLORS

    statuses = {("a", "flat"): ["oom", "pass", "pass"], ("a", "caching"): ["oom", "oom", "pass", "thrash"],
                ("b", "flat"): ["pass", "oom"], ("b", "caching"): ["oom", "pass", "oom", "pass", "pass"]}
    rows = [{"trace": t, "config": c, "ratio": 0.9 - 0.2 * i, "status": s}
            for (t, c), seq in statuses.items() for i, s in enumerate(seq)]
    samples = pd.DataFrame([rows[i] for i in np.random.default_rng(0).permutation(len(rows))])
    holes = pd.DataFrame([{"trace": "b", "config": "caching", "fail_low_ratio": 0.45, "fail_high_ratio": 0.55},
                          {"trace": "a", "config": "flat", "fail_low_ratio": 0.1, "fail_high_ratio": 0.2},
                          {"trace": "a", "config": "flat", "fail_low_ratio": 0.3, "fail_high_ratio": 0.3}])
    fig = plot_model_strips(samples, configs=["flat", "caching"], holes=holes)
    traces = list(dict.fromkeys(samples["trace"]))  # panels in order of appearance, strips in the configs' order
    keys = [(trace, config) for trace in traces for config in ["flat", "caching"]]
    assert len(fig.axes) == len(keys)
    colors = {matplotlib.colors.to_hex(c): s for s, c in STATUS_COLORS.items()}
    for ax, key in zip(fig.axes, keys):
        drawn = {}
        for bars in ax.collections:
            drawn[colors[matplotlib.colors.to_hex(bars.get_facecolor()[0])]] = len(bars.get_paths())
        assert drawn == {s: statuses[key].count(s) for s in set(statuses[key])}, key
        marks = sorted(x for line in ax.get_lines() for x in line.get_xdata())
        wanted = holes[(holes["trace"] == key[0]) & (holes["config"] == key[1])]
        assert marks == pytest.approx(sorted((wanted["fail_low_ratio"] + wanted["fail_high_ratio"]) / 2)), key
    plt.close(fig)
