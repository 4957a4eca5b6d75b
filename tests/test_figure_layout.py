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
