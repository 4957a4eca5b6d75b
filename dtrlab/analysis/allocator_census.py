"""The hole census under each memory model: do flat's holes persist under a caching allocator?

:func:`allocator_census` sweeps every trace under every configuration (policy,
memory model, options), censuses its holes (refined by :func:`refine_holes` if
asked) and tabulates, per trace and configuration: failing samples, holes, the
feasibility threshold and its shift against flat h_DTR, the mean overhead of the
passing samples, and the caching metrics at the threshold.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ..runtime import FLAT, DEFAULT_OVERHEAD_LIMIT, baseline, memory_label
from ..sweep import sweep
from ..trace.model import Trace
from .holes import HoleCensus, find_holes, refine_holes

#: (policy, memory model, options): flat and aligned h_DTR, then h_DTR, Coop and
#: dtr_fit under the caching allocator without and with expandable segments.
DEFAULT_CONFIGS = (
    ("dtr", "flat", {}), ("dtr", "aligned", {}),
    ("dtr", "caching", {}), ("coop", "caching", {}), ("dtr_fit", "caching", {}),
    ("dtr", "caching", {"expandable_segments": True}), ("coop", "caching", {"expandable_segments": True}),
    ("dtr_fit", "caching", {"expandable_segments": True}),
)

#: Columns of :attr:`AllocatorCensus.table`.
TABLE_COLUMNS = ["trace", "policy", "memory", "samples", "failures", "holes", "threshold_ratio",
                 "threshold_shift", "mean_pass_overhead", "fragmentation_at_threshold",
                 "fragmentation_evictions_at_threshold", "evictions_at_threshold", "fragmentation_ooms"]


@dataclass(frozen=True)
class AllocatorCensus:
    """``table`` has :data:`TABLE_COLUMNS` (one row per trace and configuration); ``samples``
    every simulated row (with a ``config`` column, ``policy @ memory``); ``censuses`` the
    :class:`HoleCensus` per (trace, config)."""

    table: pd.DataFrame
    samples: pd.DataFrame
    censuses: dict[tuple[str, str], HoleCensus]


def config_label(policy: str, memory: str, options: dict | None = None) -> str:
    """``coop @ caching(expandable_segments=True)``."""
    return f"{policy} @ {memory_label(memory, options)}"


def allocator_census(traces: dict[str, Trace], configs=DEFAULT_CONFIGS, *, ratios="0.05:1.0:0.005",
                     refine: bool = True, resolution_ratio: float = 1e-3, jobs: int = 1, backend: str = "loky",
                     overhead_limit: float = DEFAULT_OVERHEAD_LIMIT, cache=True,
                     progress: bool = True) -> AllocatorCensus:
    """Sweep and census every trace under every ``(policy, memory, options)`` configuration.

    ``refine`` bisects every pass/fail edge to ``resolution_ratio`` of the trace's
    baseline peak (and probes suspicious samples), as :func:`refine_holes`. The
    threshold shift is the configuration's threshold ratio minus flat h_DTR's on the
    same trace (None when either has no threshold; flat h_DTR must be among the configs
    for it).
    """
    if not traces:
        raise ValueError("no traces; pass dtrlab.trace.load_directory('traces') or a dict name -> Trace")
    rows, frames, censuses = [], [], {}
    for name, trace in traces.items():
        resolution = max(1, int(baseline(trace).peak_memory * resolution_ratio))
        for policy, memory, options in configs:
            label = config_label(policy, memory, options)
            frame = sweep(trace, policy, ratios=ratios, memory=memory, memory_options=options, jobs=jobs,
                          backend=backend, overhead_limit=overhead_limit, cache=cache, progress=progress)
            census = (refine_holes(trace, frame, policy, resolution=resolution, jobs=jobs, backend=backend,
                                   cache=cache, progress=progress).refined if refine else find_holes(frame))
            censuses[name, label] = census
            frames.append(census.samples.assign(config=label))
            rows.append(_row(name, policy, memory_label(memory, options), census))
    table = pd.DataFrame(rows)
    flat = table[(table["policy"] == "dtr") & (table["memory"] == FLAT)].set_index("trace")["threshold_ratio"]
    table["threshold_shift"] = table["threshold_ratio"] - table["trace"].map(flat)
    samples = pd.concat(frames, ignore_index=True)
    return AllocatorCensus(table[TABLE_COLUMNS], samples, censuses)


def _row(trace: str, policy: str, memory: str, census: HoleCensus) -> dict:
    samples = census.samples
    passing = samples[samples["status"] == "pass"]
    at = samples[samples["budget_bytes"] == census.threshold_bytes]
    at = at.iloc[0] if len(at) else None

    def at_threshold(column):
        if at is None or column not in at or pd.isna(at[column]):
            return None
        return at[column]

    ooms = samples["oom_cause"] if "oom_cause" in samples else pd.Series(dtype=object)
    return {
        "trace": trace, "policy": policy, "memory": memory, "samples": len(samples), "failures": census.failures,
        "holes": len(census.holes), "threshold_ratio": census.threshold_ratio,
        "mean_pass_overhead": passing["overhead"].mean() if len(passing) else None,
        "fragmentation_at_threshold": at_threshold("fragmentation_at_peak"),
        "fragmentation_evictions_at_threshold": at_threshold("fragmentation_evictions"),
        "evictions_at_threshold": None if at is None else int(at["evictions"]),
        "fragmentation_ooms": int((ooms == "fragmentation").sum()),
    }
