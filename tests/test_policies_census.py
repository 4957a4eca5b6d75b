"""The variant census: hole census per trace and policy, from the API and the CLI."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from dtrlab.analysis.variant_census import TABLE_COLUMNS, variant_census
from dtrlab.cli import main
from dtrlab.runtime import simulate
from dtrlab.sweep.execution import Execution

RATIOS = "0.16:0.19:0.005"  # 0.16, 0.165, ..., 0.19
UNET_B2 = str(Path(__file__).resolve().parent.parent / "traces" / "unet-b2.jsonl.gz")


def test_census_counts_the_resnet_hole(resnet_trace):
    census = variant_census(resnet_trace, ["dtr", "dtr_float64", "twophase"], ratios=RATIOS,
                            execution=Execution(cache=False, progress=False))
    assert list(census.table.columns) == TABLE_COLUMNS
    table = census.table.set_index("policy")
    # h_DTR: 0.16-0.165 pass, 0.17 thrashes, 0.175 on pass (the reference sweep).
    assert table.loc["dtr", ["samples", "failures", "non_monotone_failures", "holes"]].tolist() == [7, 1, 1, 1]
    assert table.loc["dtr", "threshold_ratio"] == pytest.approx(0.175)
    hole = census.censuses[resnet_trace.name, "dtr"].holes.iloc[0]
    assert hole["fail_low_ratio"] == pytest.approx(0.17) and hole["kinds"] == "thrash"
    assert table.loc["dtr_float64", "failures_vs_dtr"] == 0 and table.loc["dtr", "holes_vs_dtr"] == 0
    passing = [simulate(resnet_trace, "twophase", ratio=r) for r in census.ratios]
    passing = [r.overhead for r in passing if r.passed]
    assert table.loc["twophase", "mean_pass_overhead"] == pytest.approx(sum(passing) / len(passing))
    assert census.pivot("holes").loc[resnet_trace.name, "dtr"] == 1


def test_refined_census_is_refine_holes_of_each_sweep(resnet_trace):
    """``refine=True``: each policy's census is refine_holes' refined census of its sweep: the
    hole's edges bisected inside the grid's step, every sampled budget in ``samples``."""
    from dtrlab.analysis.holes import refine_holes
    from dtrlab.sweep import sweep

    census = variant_census(resnet_trace, ["dtr"], ratios=RATIOS, refine=True,
                            execution=Execution(cache=False, progress=False))
    frame = sweep(resnet_trace, "dtr", ratios=RATIOS, execution=Execution(cache=False, progress=False))
    direct = refine_holes(resnet_trace, frame, "dtr", execution=Execution(cache=False, progress=False)).refined
    row = census.table.set_index("policy").loc["dtr"]
    assert row["samples"] == len(direct.samples) == len(census.samples) > len(frame)
    assert (row["holes"], row["threshold_ratio"]) == (len(direct.holes), direct.threshold_ratio)
    hole = census.censuses[resnet_trace.name, "dtr"].holes.iloc[0]  # the grid's: 0.17 fails, 0.165 and 0.175 pass
    assert 0.165 < hole["pass_below_ratio"] < hole["fail_low_ratio"] <= 0.17 <= hole["fail_high_ratio"]
    assert hole["fail_high_ratio"] < hole["pass_above_ratio"] == row["threshold_ratio"] < 0.175
    passing = frame[frame["status"] == "pass"]  # the overhead stays the grid's
    assert row["mean_pass_overhead"] == pytest.approx(passing["overhead"].mean())


def test_census_rejects_bad_input(resnet_trace):
    with pytest.raises(TypeError, match="load_directory"):
        variant_census("resnet.log", ["dtr"])
    with pytest.raises(ValueError, match="distinct labels"):
        variant_census(resnet_trace, ["dtr", "DTR"], ratios=[0.5], execution=Execution(cache=False, progress=False))


def test_cli_prints_and_saves_the_table(tmp_path, capsys):
    out = tmp_path / "census.csv"
    code = main(["variants", UNET_B2, "--policies", "dtr,twophase", "--ratios", "0.3,0.6,0.9",
                 "--no-cache", "--save", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "3 ratios from 0.3 to 0.9" in printed and "twophase" in printed
    saved = pd.read_csv(out)
    assert list(saved["policy"]) == ["dtr", "twophase"] and list(saved["samples"]) == [3, 3]
    assert main(["variants", UNET_B2, "--save", "x.txt"]) == 2
