"""Every system at the same byte budget (dtrlab.analysis.checkpointing, dtrlab.solvers.side_by_side) on a tiny
model: the plan table, the cheapest fitting plan, the solvers' bracket and the side-by-side table's claims."""

from __future__ import annotations

import math
from pathlib import Path

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


SHIPPED = Path(__file__).resolve().parents[1] / "results" / "shipped"


def test_shipped_tables_are_whole_and_recompute():
    """The shipped comparison (dtrlab ship ac) reads through the manifest, covers five models at 13 budgets, and
    the MLP's table is what side_by_side computes again from its shipped trace, plans, census and frontier."""
    import pandas as pd

    from dtrlab.analysis.knob_census import read_census
    from dtrlab.pipeline.ship_ac import read_shipped
    from dtrlab.solvers.frontier.store import read_frontier
    from dtrlab.trace import load_log

    directory = SHIPPED / "ac" / "models"
    side, plans = read_shipped(directory, SHIPPED)
    assert side.groupby("model").ratio.count().to_dict() == {m: 13 for m in
                                                          ("decoder-l2", "gpt2-l2", "mlp3", "resnet14", "vit-l2")}
    trace = load_log(directory / "mlp3.jsonl.gz", cache=False)
    shipped = side[side.model == "mlp3"].drop(columns=["model", "title"]).reset_index(drop=True)
    again = side_by_side(trace, plans[plans.model == "mlp3"], read_census(directory / "mlp3-knob.json", SHIPPED),
                         read_frontier(directory / "mlp3-frontier.parquet", trace), list(shipped.budget_bytes))
    pd.testing.assert_frame_equal(again[shipped.columns], shipped, check_dtype=False)


def test_a_damaged_shipped_table_is_refused(tmp_path):
    import shutil

    from dtrlab.integrity import IntegrityError
    from dtrlab.pipeline.ship_ac import read_shipped

    copy = tmp_path / "shipped"
    shutil.copytree(SHIPPED / "ac", copy / "ac")
    shutil.copy(SHIPPED / "MANIFEST.json", copy / "MANIFEST.json")
    damaged = copy / "ac" / "models" / "mlp3-plans.parquet"
    damaged.write_bytes(damaged.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(IntegrityError):
        read_shipped(copy / "ac" / "models", copy)
