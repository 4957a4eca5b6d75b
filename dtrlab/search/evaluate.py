"""The search objective: holes, threshold and overhead of a policy over a set of traces.

A policy is swept over every trace at ``ratios`` with :func:`dtrlab.sweep.sweep`
(parallel and cached) and measured with the variant census
(:func:`dtrlab.analysis.variant_census.variant_census`). Three numbers rank it, in
this order (all lower is better):

* ``holes``: the total number of feasibility holes over the traces;
* ``threshold``: the mean feasibility threshold ratio (a trace that never passes counts 2);
* ``overhead``: the mean over traces of the mean overhead of the passing samples.

:func:`objective_value` folds them into one number for a single-objective sampler,
lexicographically up to the grid's resolution (see its docstring).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from ..analysis.variant_census import variant_census
from ..runtime import REFERENCE, Semantics
from ..sweep.execution import QUIET, Execution

#: The search's ratio grid: 476 ratios, a step of 0.002.
SEARCH_RATIOS = "0.05:1.0:0.002"
#: Threshold counted for a trace on which a policy never ends passing.
NO_THRESHOLD = 2.0


@dataclass(frozen=True)
class Evaluation:
    """One policy over a set of traces: ``table`` has one variant-census row per trace."""

    policy: str
    holes: int
    threshold: float
    overhead: float
    table: pd.DataFrame

    def as_dict(self) -> dict:
        return {"policy": self.policy, "holes": self.holes, "threshold": self.threshold, "overhead": self.overhead}


def evaluate(policy, traces, *, ratios=SEARCH_RATIOS, semantics: Semantics = REFERENCE, execution: Execution = QUIET,
             refine: bool = False) -> Evaluation:
    """Sweep ``policy`` over ``traces`` under ``semantics`` and rank it by holes, threshold and overhead
    (``refine``: of the refined census, see :func:`~dtrlab.analysis.variant_census.variant_census`)."""
    census = variant_census(traces, [policy], ratios=ratios, semantics=semantics, execution=execution, refine=refine)
    return summarize(census.table)


def summarize(table: pd.DataFrame) -> Evaluation:
    """The :class:`Evaluation` of variant-census rows of one policy."""
    thresholds = table["threshold_ratio"].astype(float).fillna(NO_THRESHOLD)
    return Evaluation(policy=str(table["policy"].iloc[0]), holes=int(table["holes"].sum()),
                      threshold=float(thresholds.mean()), overhead=float(table["mean_pass_overhead"].mean()),
                      table=table)


def objective_value(holes: int, threshold: float, overhead: float) -> float:
    """``holes + threshold + 1e-5 x overhead``: lexicographic at the search's resolution.

    A hole changes the value by 1, more than any threshold (a ratio <= 2). One grid step
    of one trace's threshold changes the mean by at least 0.002 x 0.95 / n_traces
    (above 2e-4 for fewer than 9 traces), more than any mean overhead (below the
    overhead limit, 2 by default) times 1e-5.
    """
    if math.isnan(overhead):
        overhead = 2.0
    return holes + threshold + 1e-5 * overhead
