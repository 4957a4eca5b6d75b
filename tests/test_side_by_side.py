"""Every system at the same byte budget (dtrlab.analysis.checkpointing, dtrlab.solvers.side_by_side) on a tiny
model: the plan table, the cheapest fitting plan, the solvers' bracket and the side-by-side table's claims."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
from dtrlab.analysis.checkpointing import cheapest_fitting, plan_table  # noqa: E402
from dtrlab.analysis.knob_census import KnobPlan, census_knob  # noqa: E402
from dtrlab.runtime import budget_for  # noqa: E402
from dtrlab.solvers.frontier.plan import FrontierPlan  # noqa: E402
from dtrlab.solvers.frontier.steps import compute_frontier  # noqa: E402
from dtrlab.solvers.side_by_side import SYSTEMS, bracket, side_by_side  # noqa: E402
from dtrlab.trace import parse_lines  # noqa: E402
from dtrlab.trace.checkpointing import capture_plans  # noqa: E402

SOURCE = "dtrlab.pipeline.ac_models:mlp_blocks"
RATIOS = (0.5, 0.7, 0.85, 1.0)


@pytest.fixture(scope="module")
def compared():
    recordings = capture_plans(SOURCE, batch=32)
    plans = plan_table(recordings)
    trace = parse_lines(recordings["none"].to_jsonl().splitlines(), name="tiny")
    frontier = compute_frontier(trace, FrontierPlan(ratios=RATIOS, bisect=False, stage_probes=0, time_limit_s=5.0),
                                cache=False)
    full = plans.set_index("plan").loc["full"]
    none = plans.set_index("plan").loc["none"]

    def knob(k: float) -> dict:  # a planted knob curve between the plain step's and full checkpointing's peaks
        peak = int(full.flat_peak + k * (none.flat_peak - full.flat_peak))
        return {"flat_peak": peak, "allocated_peak": peak, "reserved_peak": peak,
                "recompute_flops": int((1 - k) * full.recompute_flops)}

    census = census_knob(knob, KnobPlan(step=0.25, resolution=0.25), name="planted")
    budgets = [budget_for(trace, ratio) for ratio in RATIOS]
    return plans, frontier, side_by_side(trace, plans, census, frontier, budgets)


def test_plan_table(compared):
    plans = compared[0].set_index("plan")
    assert (plans.flat_peak == plans.recorded_peak).all()
    assert plans.at["none", "recompute_flops"] == 0 and plans.at["none", "overhead"] == 1
    assert plans.at["full", "flat_peak"] < plans.at["every:2", "flat_peak"] < plans.at["none", "flat_peak"]
    assert plans.at["full", "overhead"] > plans.at["every:2", "overhead"] > 1
    assert list(plans.checkpointed_blocks) == [0, 3, 1, 1, 3]  # none, full, every:2, every:3, op
    with pytest.raises(ValueError, match="need the plain step 'none'"):
        plan_table({})


def test_cheapest_fitting(compared):
    plans = compared[0]
    by_name = plans.set_index("plan")
    assert cheapest_fitting(plans, int(by_name.flat_peak.max()))["plan"] == "none"
    assert cheapest_fitting(plans, int(by_name.flat_peak.min()) - 1) is None
    squeezed = cheapest_fitting(plans, int(by_name.at["every:2", "flat_peak"]))
    assert squeezed["flat_peak"] <= by_name.at["every:2", "flat_peak"]
    assert squeezed["recompute_flops"] == min(r for p, r in zip(plans.flat_peak, plans.recompute_flops)
                                              if p <= by_name.at["every:2", "flat_peak"])


def test_bracket_holds_every_fitting_system(compared):
    """No fitting system beats the proven lower bound, the upper bound is a real run, and where the
    relaxation proves that nothing fits, nothing does."""
    _, frontier, table = compared
    assert len(table) == len(RATIOS)
    for row in table.to_dict("records"):
        assert row["opt_lower"] <= row["opt_upper"]
        if not math.isfinite(row["opt_lower"]):
            assert not any(row[f"{name}_fits"] for name in SYSTEMS), row
        for name in SYSTEMS:
            if row[f"{name}_fits"]:
                assert row[f"{name}_overhead"] >= row["opt_lower"] - 1e-9, (name, row)
    at_peak = table.iloc[-1]
    assert at_peak.ratio == pytest.approx(1.0, abs=1e-6) and at_peak.ac_plan == "none"
    assert at_peak.opt_upper == pytest.approx(1.0) and at_peak.best is not None
    lower, upper = bracket(frontier, frontier.peak_bytes)
    assert lower == 1.0 and upper == pytest.approx(1.0)
    assert bracket(frontier, frontier.max_infeasible_bytes)[0] == math.inf


def test_best_is_the_cheapest_fitting_system(compared):
    table = compared[2]
    for row in table.to_dict("records"):
        fitting = {name: row[f"{name}_overhead"] for name in SYSTEMS if row[f"{name}_fits"]}
        best = row["best"] if isinstance(row["best"], str) else None  # pandas reads a missing one as NaN
        assert best == (min(fitting, key=fitting.get) if fitting else None)
