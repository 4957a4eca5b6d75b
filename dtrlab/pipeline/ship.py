"""``dtrlab ship TARGET``: regenerate a part of ``results/shipped/``, the results a fresh clone plots from.

    dtrlab ship results ...    # the notebooks' sweeps, tables and real runs (dtrlab.pipeline.ship_results)
    dtrlab ship anatomy ...    # the limit census of notebook 12 (dtrlab.pipeline.ship_anatomy)
    dtrlab ship search ...     # the policy search's study, comparisons and inclusion census
                               # (dtrlab.pipeline.ship_search)
    dtrlab ship knob ...       # the activation-memory knob censuses of notebook 13 (dtrlab.pipeline.ship_knob)
    dtrlab ship ac ...         # every rematerialization system at the same budget, notebook 15 (dtrlab.pipeline.ship_ac)
    dtrlab ship planner ...    # PyTorch's checkpointing planner checked on real CPU steps (dtrlab.pipeline.ship_planner)

Every target writes its files atomically and records their sha256 and size in
``results/shipped/MANIFEST.json`` (the other entries kept), which the readers check.
"""

from __future__ import annotations

from . import ship_ac, ship_anatomy, ship_knob, ship_planner, ship_results, ship_search

#: Each target's module: ``add_arguments(parser)`` adds its options, ``run(args, parser)`` ships.
TARGETS = {"results": ship_results, "anatomy": ship_anatomy, "search": ship_search, "knob": ship_knob,
           "ac": ship_ac, "planner": ship_planner}
