"""The variant census: the hole census for many policies over many traces.

It tests two claims: that simple changes to h_DTR leave the feasibility holes in
place, and that TwoPhase fails at more sampled budgets than DTR. Every policy is
swept over the same ratios with :func:`dtrlab.sweep.sweep` (parallel and cached) and
measured with :func:`dtrlab.analysis.holes.find_holes`.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ..policies import VARIANTS, Policy, get_policy
from ..runtime import REFERENCE, Semantics
from ..sweep import SERIAL, Execution, sweep
from ..trace.model import Trace
from .holes import HoleCensus, find_holes, refine_holes

#: h_DTR, its simrd siblings, TwoPhase and every registered score variant.
DEFAULT_POLICIES = ("dtr", "dtr_eq_class", "dtr_local", "twophase", *VARIANTS)

#: Columns of :attr:`VariantCensus.table`, one row per trace and policy.
TABLE_COLUMNS = ["trace", "policy", "samples", "failures", "non_monotone_failures", "holes", "threshold_ratio",
                 "mean_pass_overhead", "failures_vs_dtr", "holes_vs_dtr"]


@dataclass(frozen=True)
class VariantCensus:
    """Hole censuses of every (trace, policy) pair over one set of ratios.

    ``table`` has :data:`TABLE_COLUMNS`: failing samples, non-monotone failures,
    holes, the feasibility threshold and the mean overhead of the passing samples,
    plus the differences in failures and holes from ``dtr`` on the same trace (NaN
    when dtr is not in the census). ``samples`` holds every sweep row; ``censuses``
    maps ``(trace, policy label)`` to its :class:`~dtrlab.analysis.holes.HoleCensus`
    (with the holes' positions).
    """

    ratios: tuple[float, ...]
    table: pd.DataFrame
    samples: pd.DataFrame
    censuses: dict[tuple[str, str], HoleCensus]

    def pivot(self, value: str = "failures") -> pd.DataFrame:
        """One ``value`` per trace (rows) and policy (columns), for the notebook and figure."""
        if value not in self.table:
            raise ValueError(f"no column {value!r}; use one of {', '.join(TABLE_COLUMNS[2:])}")
        return self.table.pivot(index="trace", columns="policy", values=value)


def variant_census(traces: Trace | list[Trace] | dict[str, Trace], policies=DEFAULT_POLICIES, *,
                   ratios="0.05:1.0:0.01", semantics: Semantics = REFERENCE, execution: Execution = SERIAL,
                   refine: bool = False) -> VariantCensus:
    """Sweep every policy over every trace at ``ratios`` and tabulate their holes.

    ``policies`` are registered names, classes or instances (a policy defined in a
    notebook cell works); ``ratios``, ``semantics`` (one memory model, runtime semantics and
    overhead limit for every run) and ``execution`` are as in :func:`dtrlab.sweep.sweep`.
    ``refine`` refines each sweep as :func:`refine_holes` does with its defaults (probes
    beside suspicious samples, every pass/fail edge bisected to ``default_resolution``):
    holes narrower than the grid's step are then found where a suspicious sample points at
    them, and thresholds are exact to that resolution; ``samples`` and the table's counts
    hold every sampled budget, but ``mean_pass_overhead`` stays the grid's (probes cluster
    where a policy fails, and would weigh its most expensive budgets more).
    """
    if isinstance(traces, Trace):
        traces = [traces]
    elif isinstance(traces, dict):
        traces = list(traces.values())
    if not traces or not all(isinstance(t, Trace) for t in traces):
        raise TypeError("traces must be a Trace, a list of Traces or a dict name -> Trace "
                        "(e.g. dtrlab.trace.load_directory('traces'))")
    if isinstance(policies, (str, Policy, type)):
        policies = [policies]
    policies = [get_policy(p) for p in policies]
    labels = [p.label for p in policies]
    if len(set(labels)) != len(labels):
        raise ValueError(f"policies must have distinct labels, got {labels}")

    frames, censuses, grid_overheads = [], {}, {}
    for trace in traces:
        for policy in policies:
            frame = sweep(trace, policy, ratios=ratios, semantics=semantics, execution=execution)
            grid_overheads[trace.name, policy.label] = _mean_pass_overhead(frame)
            census = refine_holes(trace, frame, policy, execution=execution.with_(progress=False)).refined \
                if refine else find_holes(frame)
            frames.append(census.samples)
            censuses[trace.name, policy.label] = census
    samples = pd.concat(frames, ignore_index=True)
    table = pd.DataFrame([_row(census, grid_overheads[key]) for key, census in censuses.items()])
    dtr = table[table["policy"] == "dtr"].set_index("trace")
    for column in ("failures", "holes"):
        table[f"{column}_vs_dtr"] = table[column] - table["trace"].map(dtr[column]) if len(dtr) else float("nan")
    ratio_list = tuple(sorted(samples["ratio"].unique()))
    return VariantCensus(ratios=ratio_list, table=table[TABLE_COLUMNS], samples=samples, censuses=censuses)


def _mean_pass_overhead(frame: pd.DataFrame) -> float:
    passing = frame[frame["status"] == "pass"]
    return float(passing["overhead"].mean()) if len(passing) else float("nan")


def _row(census: HoleCensus, mean_pass_overhead: float) -> dict:
    return {"trace": census.trace, "policy": census.policy, "samples": len(census.samples),
            "failures": census.failures, "non_monotone_failures": census.non_monotone_failures,
            "holes": len(census.holes), "threshold_ratio": census.threshold_ratio,
            "mean_pass_overhead": mean_pass_overhead}
