"""Hole detection on known frames, suspicious samples, and refinement on real traces."""

from __future__ import annotations

import pandas as pd
import pytest

from chains import chain_log
from dtrlab.analysis.holes import (HOLE_COLUMNS, census_table, default_resolution, find_holes, refine_holes,
                                   suspicious_samples)
from dtrlab.runtime import baseline, simulate
from dtrlab.sweep.execution import Execution


def frame_of(statuses, trace="t", overheads=None, remat=None):
    n = len(statuses)
    return pd.DataFrame({
        "trace": trace, "policy": "dtr", "overhead_limit": 2.0, "withhold": "",
        "budget_bytes": [10 * (i + 1) for i in range(n)], "ratio": [(i + 1) / 10 for i in range(n)],
        "status": statuses, "overhead": overheads or [1.5] * n, "remat_compute": remat or [0] * n,
        "baseline_compute": 100,
    })


def test_holes_non_monotone_failures_and_threshold():
    census = find_holes(frame_of(["oom", "oom", "pass", "thrash", "thrash", "pass", "oom", "pass", "pass"]))
    assert census.failures == 5
    assert census.non_monotone_failures == 3
    assert (census.threshold_bytes, census.threshold_ratio) == (80, 0.8)
    assert list(census.holes.columns) == HOLE_COLUMNS
    assert census.holes[["pass_below_bytes", "fail_low_bytes", "fail_high_bytes", "pass_above_bytes",
                         "width_bytes", "min_width_bytes", "samples", "kinds"]].to_dict("records") == [
        {"pass_below_bytes": 30, "fail_low_bytes": 40, "fail_high_bytes": 50, "pass_above_bytes": 60,
         "width_bytes": 30, "min_width_bytes": 10, "samples": 2, "kinds": "thrash"},
        {"pass_below_bytes": 60, "fail_low_bytes": 70, "fail_high_bytes": 70, "pass_above_bytes": 80,
         "width_bytes": 20, "min_width_bytes": 0, "samples": 1, "kinds": "oom"},
    ]
    assert census.widest.fail_low_bytes == 40
    summary = census.summary()
    assert (summary["holes"], summary["widest_hole_ratio"], summary["widest_hole_kinds"]) == (2, "0.4-0.5", "thrash")


def test_mixed_kinds_unsorted_input_and_edges():
    frame = frame_of(["pass", "oom", "thrash", "pass", "oom"]).iloc[::-1]
    census = find_holes(frame)
    assert census.holes["kinds"].tolist() == ["oom+thrash"]
    assert census.samples["budget_bytes"].is_monotonic_increasing
    assert census.threshold_bytes is None  # the largest sample fails
    assert census.non_monotone_failures == 3
    assert len(find_holes(frame_of(["oom", "oom", "pass"])).holes) == 0  # leading failures are no hole
    assert find_holes(frame_of(["pass", "pass"])).threshold_bytes == 10


def test_one_configuration_at_a_time():
    both = pd.concat([frame_of(["pass", "oom", "pass"], "a"), frame_of(["oom", "pass", "pass"], "b")])
    with pytest.raises(ValueError, match="mixes 2"):
        find_holes(both)
    table = census_table(both)
    assert table[["trace", "holes", "non_monotone_failures"]].to_dict("records") == [
        {"trace": "a", "holes": 1, "non_monotone_failures": 1}, {"trace": "b", "holes": 0, "non_monotone_failures": 0}]
    with pytest.raises(ValueError, match="column 'status' is missing"):
        find_holes(both.drop(columns="status"))


def test_suspicious_samples_flag_overhead_spikes_and_near_misses():
    frame = frame_of(["pass"] * 5, overheads=[1.9, 1.5, 1.6, 1.52, 1.4], remat=[95, 50, 60, 52, 40])
    flagged = suspicious_samples(find_holes(frame).samples)
    assert flagged["budget_bytes"].tolist() == [10, 30]
    assert flagged["reason"].tolist() == ["near miss", "overhead spike"]


def test_probing_finds_a_hole_narrower_than_the_sampling_step(small_resnet, tmp_path):
    from dtrlab.sweep import sweep

    # On this grid every sample passes, but 0.425 costs more recompute than 0.42.
    grid = sweep(small_resnet, "dtr", ratios=[0.42, 0.425, 0.43], execution=Execution(cache=tmp_path, progress=False))
    assert (grid["status"] == "pass").all()
    refinement = refine_holes(small_resnet, grid, "dtr", execution=Execution(cache=tmp_path, progress=False))
    assert refinement.suspicious["budget_bytes"].tolist() == [grid["budget_bytes"][1]]
    assert len(refinement.grid.holes) == 0
    resolution = default_resolution(small_resnet)
    assert resolution == baseline(small_resnet).peak_memory // 10_000
    hidden = refinement.hidden_holes
    assert len(hidden) >= 1
    for hole in hidden.itertuples():
        # Each edge is located to the resolution, and the simulator agrees with every bound.
        assert hole.fail_low_bytes - hole.pass_below_bytes <= resolution
        assert hole.pass_above_bytes - hole.fail_high_bytes <= resolution
        assert simulate(small_resnet, "dtr", budget_bytes=hole.pass_below_bytes).passed
        assert simulate(small_resnet, "dtr", budget_bytes=hole.pass_above_bytes).passed
        for budget in (hole.fail_low_bytes, hole.fail_high_bytes):
            assert simulate(small_resnet, "dtr", budget_bytes=budget).status in hole.kinds.split("+")
    # The probe at 0.425 + 0.005 * 7/9 (budget 9460849) lands in a thrash hole.
    assert ((hidden.fail_low_bytes <= 9460849) & (hidden.fail_high_bytes >= 9460849)).any()


def test_refine_rejects_a_frame_of_another_policy(small_resnet, tmp_path):
    from dtrlab.sweep import sweep

    grid = sweep(small_resnet, "lru", ratios=[0.5, 0.6], execution=Execution(cache=tmp_path, progress=False))
    with pytest.raises(ValueError, match="swept with policy 'lru'"):
        refine_holes(small_resnet, grid, "dtr", probes=1, spike=-1, execution=Execution(cache=tmp_path, progress=False))
    with pytest.raises(ValueError, match="resolution must be >= 1"):
        refine_holes(small_resnet, grid, "lru", resolution=0, execution=Execution(cache=tmp_path, progress=False))


def test_summary_row_in_full():
    """Every field of a census row, for the frame of test_holes_non_monotone_failures_and_threshold (holes 40-50 and
    70, passes from 80 on) and for one without holes."""
    from dtrlab.analysis.holes import MIB
    census = find_holes(frame_of(["oom", "oom", "pass", "thrash", "thrash", "pass", "oom", "pass", "pass"]))
    assert census.summary() == {
        "trace": "t", "policy": "dtr", "memory": "flat", "samples": 9, "failures": 5, "non_monotone_failures": 3,
        "holes": 2, "widest_hole_ratio": "0.4-0.5", "widest_hole_mib": 30 / MIB, "widest_hole_kinds": "thrash",
        "threshold_ratio": 0.8, "max_gap_bytes": 10}
    plain = find_holes(frame_of(["oom", "pass"])).summary()
    assert {k: plain[k] for k in ("holes", "widest_hole_ratio", "widest_hole_mib", "widest_hole_kinds",
                                  "threshold_ratio")} == {"holes": 0, "widest_hole_ratio": None,
                                                          "widest_hole_mib": None, "widest_hole_kinds": None,
                                                          "threshold_ratio": 0.2}


def chain_trace():
    """chains.chain_log's three layers: peak 50 bytes (x, a1, a2, a3 and g3), and nothing fits below 40 (b2's
    own footprint), so every budget int(50 * ratio) under 40 fails."""
    return chain_log().trace("chain")


def test_census_grid_keywords():
    """The grid of a census with delta, on the chain (peak 50): a fraction keeps START:STOP of the ratios at the
    new step; bytes sample int(50 * START)..int(50 * STOP) in ceil(gap / delta) even pieces."""
    from dtrlab.analysis.holes import census_grid
    trace = chain_trace()
    assert census_grid(trace, "0.2:0.6:0.01", None) == {"ratios": "0.2:0.6:0.01"}
    assert census_grid(trace, [0.5], None) == {"ratios": [0.5]}
    assert census_grid(trace, "0.2:0.6:0.01", 0.05) == {"ratios": "0.2:0.6:0.05"}
    assert census_grid(trace, [0.6, 0.2, 0.4], 0.05) == {"ratios": "0.2:0.6:0.05"}
    # 10..50 bytes, 40 apart, at 15 bytes: 3 pieces, 10 + 40 // 3 and 10 + 80 // 3.
    assert census_grid(trace, "0.2:1.0:0.1", 15) == {"budgets": [10, 23, 36, 50]}
    assert census_grid(trace, "0.2:1.0", 1.0) == {"budgets": list(range(10, 51))}  # 1.0 is one byte, not a ratio
    with pytest.raises(ValueError, match=r"^delta is bytes \(an integer >= 1\)"):
        census_grid(trace, "0.2:1.0", 0.0)
    for bad in ("0.2", "a:b"):
        with pytest.raises(ValueError, match=r"^ratios must look like START:STOP:STEP, e.g. 0.05:1.0:0.005; "
                                             f"got '{bad}'$"):
            census_grid(trace, bad, 0.05)


def test_run_census_on_the_chain(tmp_path):
    """The chain's census at ratios 0.5..1.0: budgets 25, 30 and 35 fail (below 40), and 40, 45 and 50 pass under
    DTR; refinement bisects 35..40 to one byte (midpoints 37, 38, 39). Files go into a new nested directory, and a
    second census writes into it again."""
    from dtrlab.analysis.holes import run_census
    execution = Execution(cache=tmp_path / "cache", progress=False)
    out = tmp_path / "a" / "b"
    census = run_census({"chain": chain_trace()}, "dtr", ratios="0.5:1.0:0.1", out=out, execution=execution)
    assert census.table.to_dict("records") == [{
        "trace": "chain", "policy": "dtr", "memory": "flat", "samples": 6, "failures": 3, "non_monotone_failures": 0,
        "holes": 0, "widest_hole_ratio": None, "widest_hole_mib": None, "widest_hole_kinds": None,
        "threshold_ratio": 0.8, "max_gap_bytes": 5, "refined_holes": 0, "hidden_holes": 0, "refined_widest_mib": None,
        "refined_threshold_ratio": 0.8, "refined_max_gap_bytes": 5, "refinement_runs": 3}]
    assert census.files == tuple(str(out / name) for name in ("chain.parquet", "holes.parquet", "summary.csv"))
    samples = pd.read_parquet(out / "chain.parquet")
    assert samples["budget_bytes"].tolist() == [25, 30, 35, 37, 38, 39, 40, 45, 50]
    assert samples["status"].tolist() == ["oom"] * 6 + ["pass"] * 3
    assert census.refinements["chain"].bisection_budgets == (37, 38, 39)
    assert len(pd.read_parquet(out / "holes.parquet")) == 0 and list(census.holes["trace"]) == []
    assert pd.read_csv(out / "summary.csv")["refinement_runs"].tolist() == [3]
    grid_only = run_census({"chain": chain_trace()}, "dtr", ratios="0.5:1.0:0.1", out=out, refine=False,
                           execution=execution)
    assert "refined_holes" not in grid_only.table and grid_only.refinements == {}
    assert len(pd.read_parquet(out / "chain.parquet")) == 6
    with pytest.raises(ValueError, match=r"^no traces to census; pass a directory of logs such as "
                                         r"\.\./shared/dtr-logs or traces/$"):
        run_census({})
