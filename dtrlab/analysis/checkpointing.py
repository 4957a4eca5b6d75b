"""Activation-checkpointing plans as a table: each plan's peaks and recompute, and the cheapest plan that fits.

:func:`plan_table` turns the recordings of :func:`dtrlab.trace.checkpointing.capture_plans`
(one per plan, FLOP costs) into one row per plan: its peaks under the flat and caching
accountings (:func:`dtrlab.memory.peaks.trace_peaks` of the recorded trace), the recorder's
own peak (equal to ``flat_peak``; checked), how many blocks the plan checkpoints, its
recompute FLOPs (the plan's total cost minus the plain step's) and its overhead
``(compute + recompute) / compute`` with the plain step's compute, the unit DTR's and the
knob's overheads use. :func:`cheapest_fitting` picks, for a byte budget, the fitting plan
with the least recompute (ties: the lower peak).
"""

from __future__ import annotations

import pandas as pd

from ..memory.peaks import trace_peaks
from ..trace import parse_lines

#: The columns of :func:`plan_table`.
PLAN_COLUMNS = ["plan", "flat_peak", "allocated_peak", "reserved_peak", "recorded_peak", "checkpointed_blocks",
                "ops", "compute_flops", "recompute_flops", "overhead"]


def plan_table(recordings: dict) -> pd.DataFrame:
    """One row per plan (:data:`PLAN_COLUMNS`) from ``{plan name: Recording}``, which must hold ``"none"``."""
    from ..trace.checkpointing import recompute_flops, total_flops

    if "none" not in recordings:
        raise ValueError(f"the plans need the plain step 'none' to count recompute against; got {sorted(recordings)}")
    plain = recordings["none"]
    compute = total_flops(plain)
    rows = []
    for name, recording in recordings.items():
        peaks = trace_peaks(parse_lines(recording.to_jsonl().splitlines(), name=name))
        if peaks["flat_peak"] != recording.peak_live_bytes:
            raise AssertionError(f"plan {name}: the trace's flat peak {peaks['flat_peak']} is not the recorder's "
                                 f"{recording.peak_live_bytes}")
        recompute = recompute_flops(recording, plain)
        rows.append({"plan": name, **peaks, "recorded_peak": recording.peak_live_bytes,
                     "checkpointed_blocks": recording.meta.get("checkpointed_blocks", 0), "ops": recording.op_count,
                     "compute_flops": compute, "recompute_flops": recompute,
                     "overhead": 1 + recompute / compute if compute else float("nan")})
    return pd.DataFrame(rows, columns=PLAN_COLUMNS)


def cheapest_fitting(plans: pd.DataFrame, budget: int, accounting: str = "flat_peak") -> dict | None:
    """The row of the fitting plan (``accounting`` peak <= ``budget``) with the least recompute, or None."""
    fitting = plans[plans[accounting] <= budget]
    if fitting.empty:
        return None
    return fitting.sort_values(["recompute_flops", accounting, "plan"]).iloc[0].to_dict()
