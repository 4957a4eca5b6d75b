"""Hole detection on known frames, suspicious samples, and refinement on real traces."""

from __future__ import annotations

import pandas as pd
import pytest

from chains import chain_trace
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


def test_hole_ratios_samples_and_errors_word_for_word():
    """The ratio columns of each hole and the samples frame as given (sorted, renumbered, memory columns added);
    each refusal in its own words."""
    frame = frame_of(["pass", "oom", "thrash", "pass", "pass"]).iloc[::-1]
    census = find_holes(frame)
    hole = census.holes.iloc[0]
    assert (hole.pass_below_ratio, hole.fail_low_ratio, hole.fail_high_ratio, hole.pass_above_ratio) == (
        0.1, 0.2, 0.3, 0.4)
    assert hole.width_ratio == pytest.approx(0.3) and census.max_gap_bytes == 10
    assert list(census.samples.columns) == [*frame.columns, "memory", "memory_options", "enforce", "device_capacity"]
    assert census.samples.index.tolist() == [0, 1, 2, 3, 4]
    assert (census.trace, census.policy, census.threshold_bytes, census.threshold_ratio) == ("t", "dtr", 40, 0.4)
    with pytest.raises(ValueError, match=r"^find_holes needs a sweep frame \(dtrlab.sweep\(...\)\); column 'ratio' "
                                         r"is missing$"):
        find_holes(frame.drop(columns="ratio"))
    both = pd.concat([frame_of(["pass"], "a"), frame_of(["pass"], "b")])
    with pytest.raises(ValueError, match=r"^the frame mixes 2 trace/policy configurations; pass one at a time, "
                                         r"e.g. frame\[\(frame.trace == T\) & \(frame.policy == P\)\], or use "
                                         r"census_table\(frame\)$"):
        find_holes(both)
    with pytest.raises(ValueError, match=r"^a fractional delta needs the frame's baseline_memory column \(a "
                                         r"dtrlab.sweep frame\); give delta in bytes instead$"):
        find_holes(frame, delta=0.5)
    with pytest.raises(ValueError, match=r"^the samples are 10 bytes apart between budgets 10 and 20, coarser than "
                                         r"delta = 9 bytes; sample more finely \(refine_holes\(trace, frame, "
                                         r"delta=...\) fills every gap\)$"):
        find_holes(frame, delta=9)
    assert find_holes(frame, delta=10).max_gap_bytes == 10  # a gap of exactly delta is fine


def test_census_table_keeps_the_frames_order_and_memory_labels():
    """Configurations in the order they first appear, each labelled with its memory model and changed options."""
    from dtrlab.analysis.holes import frame_memory_label, with_memory_columns
    caching = frame_of(["pass"], "z").assign(memory="caching", memory_options='{"expandable_segments": true}',
                                             enforce="reserved", device_capacity="")
    flat = with_memory_columns(frame_of(["oom", "pass"], "a"))
    table = census_table(pd.concat([caching, flat]))
    assert table[["trace", "memory", "samples"]].to_dict("records") == [
        {"trace": "z", "memory": "caching(expandable_segments=True)", "samples": 1},
        {"trace": "a", "memory": "flat", "samples": 2}]
    assert frame_memory_label(caching.assign(memory_options="")) == "caching"
    filled = with_memory_columns(frame_of(["pass"]).assign(enforce="allocated"))
    assert filled.iloc[0][["memory", "memory_options", "enforce", "device_capacity"]].tolist() == [
        "flat", "", "allocated", ""]


def test_census_table_keeps_every_row_of_a_frame_with_missing_values():
    """Sweep files saved before the memory columns, read with newer ones (``dtrlab holes OLD NEW``), and a
    configuration without an overhead limit: pandas' groupby dropped their rows; each is its own configuration,
    the old one flat."""
    caching = frame_of(["pass"], "z").assign(memory="caching", memory_options="", enforce="reserved",
                                             device_capacity="")
    old = frame_of(["oom", "pass", "oom", "pass"], "a")
    unlimited = frame_of(["oom", "pass"], "u").assign(overhead_limit=float("nan"))
    table = census_table(pd.concat([caching, old, unlimited], ignore_index=True))
    assert table[["trace", "memory", "samples", "non_monotone_failures"]].to_dict("records") == [
        {"trace": "z", "memory": "caching", "samples": 1, "non_monotone_failures": 0},
        {"trace": "a", "memory": "flat", "samples": 4, "non_monotone_failures": 1},
        {"trace": "u", "memory": "flat", "samples": 2, "non_monotone_failures": 0}]


def test_suspicious_samples_boundaries_and_both_reasons():
    """With spike 0.5 and near_miss 0.5 (allowance 100 x (2 - 1) = 100): an overhead exactly 1.5 x the previous
    passing one, or a recompute of exactly 50, is no spike but is a near miss; failing samples are skipped."""
    frame = frame_of(["pass", "oom", "pass", "pass", "pass"], overheads=[1.0, 9.0, 1.5, 1.6, 2.5],
                     remat=[0, 0, 49, 50, 80])
    flagged = suspicious_samples(find_holes(frame).samples, spike=0.5, near_miss=0.5)
    assert flagged.to_dict("list") == {"ratio": [0.4, 0.5], "budget_bytes": [40, 50], "overhead": [1.6, 2.5],
                                       "remat_compute": [50, 80], "reason": ["near miss", "overhead spike + near miss"]}
    assert flagged.index.tolist() == [3, 4]


def test_fill_probe_and_bisection_edges():
    """fill_budgets' limit (exactly MAX_BUDGETS budgets is allowed), gap_probes beside the first, a middle and the
    last sample (existing budgets dropped), and a bisection that stops at a gap of exactly the resolution."""
    from dtrlab.analysis.holes import bisect_transitions, fill_budgets, gap_probes
    from dtrlab.sweep.budget_sweep import MAX_BUDGETS
    low = 10**6  # gaps counted from their lower end, not from 0
    assert len(fill_budgets([low, low + MAX_BUDGETS + 1], 1)) == MAX_BUDGETS
    with pytest.raises(ValueError, match=rf"^delta = 1 bytes makes {MAX_BUDGETS + 1:,} budgets, more than the "
                                         rf"{MAX_BUDGETS:,} allowed; take a larger delta \(a fraction such as 0.001 "
                                         r"of the peak, or more bytes\)$"):
        fill_budgets([low, low + MAX_BUDGETS + 2], 1)
    with pytest.raises(ValueError, match=r"^delta must be >= 1 byte, got 0$"):
        fill_budgets([0, 10], 0)
    assert fill_budgets([0, 1], 1) == []
    budgets = [0, 90, 180]
    assert gap_probes(budgets, [1], 2) == {30, 60, 120, 150}
    assert gap_probes(budgets, [0], 2) == {30, 60}
    assert gap_probes(budgets, [2], 2) == {120, 150}
    assert gap_probes([0, 1, 4], [0], 2) == set()  # 0 + 1 * j // 3 is 0, a budget already run
    passed = {0: False, 8: True}
    assert bisect_transitions(passed, lambda budgets: {b: b >= 3 for b in budgets}, resolution=4) == [4]
    assert passed == {0: False, 4: True, 8: True}


def test_hidden_holes_are_those_without_a_grid_sample():
    """Refined holes at 20, 40-50 and 70-80; the grid sampled 50 (the second's upper edge) and 70 (the third's lower
    edge), so only the first is hidden."""
    from dtrlab.analysis.holes import Refinement
    refined = find_holes(frame_of(["pass", "oom", "pass", "oom", "oom", "pass", "oom", "oom", "pass", "pass"]))
    grid = find_holes(refined.samples[refined.samples["budget_bytes"].isin([10, 50, 70, 100])])
    refinement = Refinement(grid=grid, refined=refined, suspicious=pd.DataFrame(), probe_budgets=(),
                            bisection_budgets=(), resolution=1)
    hidden = refinement.hidden_holes
    assert hidden[["fail_low_bytes", "fail_high_bytes"]].to_dict("records") == [
        {"fail_low_bytes": 20, "fail_high_bytes": 20}]
    assert hidden.index.tolist() == [0]


def test_refine_holes_on_the_chain(tmp_path):
    """The chain's grid 25..50 every 5 bytes (oom below 40, pass from 40). Probing every passing sample but the first
    (spike -1; the first has no smaller passing sample) two budgets a gap: 41, 43, 46, 48, then the bisection of
    35..40: 37, 38, 39. With delta 2 bytes: each 5-byte gap gets
    low + 5 // 3 and low + 10 // 3, no probes by default, and the bisection 39 again. A fraction 0.05 of the peak
    is ceil(2.5) + 1 = 4 bytes. Resolution defaults to one byte (50 // 10000 is below it)."""
    from dtrlab.analysis.holes import default_resolution
    from dtrlab.sweep import sweep
    execution = Execution(cache=tmp_path, progress=False)
    trace = chain_trace()
    grid = sweep(trace, "dtr", ratios="0.5:1.0:0.1", execution=execution)
    probed = refine_holes(trace, grid, "dtr", probes=2, spike=-1, execution=execution)
    assert probed.suspicious["budget_bytes"].tolist() == [45, 50]
    assert probed.probe_budgets == (41, 43, 46, 48) and probed.bisection_budgets == (37, 38, 39)
    assert (probed.resolution, probed.fill_budgets, probed.delta_bytes) == (1, (), None)
    assert (probed.refined.threshold_bytes, len(probed.refined.samples)) == (40, 13)
    filled = refine_holes(trace, grid, "dtr", delta=2, execution=execution)
    assert filled.fill_budgets == (26, 28, 31, 33, 36, 38, 41, 43, 46, 48)
    assert (filled.probe_budgets, filled.bisection_budgets, filled.delta_bytes) == ((), (39,), 2)
    assert filled.refined.max_gap_bytes == 2
    assert refine_holes(trace, grid, "dtr", delta=0.05, execution=execution).delta_bytes == 4
    assert default_resolution(trace) == 1
    with pytest.raises(TypeError, match=r"^memory: refine_holes runs under the frame's own semantics \(its rows' "
                                        r"memory, enforce, device capacity and overhead limit\); sweep again to "
                                        r"refine under another$"):
        refine_holes(trace, grid, "dtr", memory="caching")
    with pytest.raises(ValueError, match=r"^resolution must be >= 1 byte \(default: min\(1 MiB, baseline peak / "
                                         r"10000\)\) and probes >= 0; got resolution=1, probes=-1$"):
        refine_holes(trace, grid, "dtr", probes=-1)
    with pytest.raises(ValueError, match=r"^the frame was swept with policy 'dtr', not 'lru'; pass the same policy "
                                         r"\(and parameters\) to refine_holes$"):
        refine_holes(trace, grid, "lru")


def test_default_resolution_is_at_most_a_mebibyte():
    """A 20 GB constant: a ten-thousandth of its peak is 2 MB, above the 1 MiB cap; a peak of 10^7 bytes gives 1000."""
    from dtrlab.analysis.holes import MIB, default_resolution
    from dtrlab.trace.builder import LogBuilder
    log = LogBuilder()
    log.constant("x", 20 * 10**9)
    log.call("f", ["x"], [("y", 10)], time=1)
    assert default_resolution(log.trace("huge")) == MIB
    small = LogBuilder()
    small.constant("x", 10**7 - 10)
    small.call("f", ["x"], [("y", 10)], time=1)
    assert default_resolution(small.trace("small")) == 1000  # a peak of 10^7 bytes


def test_run_census_defaults_policy_semantics_and_delta_in_bytes(tmp_path):
    """The chain's census with the default policy (dtr) and grid (0.05:1.0:0.005: every budget int(50 * r), 2..50
    bytes, of which 2..39 fail); under an overhead limit of 1.5 (a recompute allowance of 5) its 40 and 45 bytes,
    which need DTR's recompute of 6, thrash too; LRU is swept and refined as LRU; a delta of 5 bytes samples 25, 30, .., 50;
    every run goes to the cache the execution names."""
    from dtrlab.analysis.holes import run_census
    from dtrlab.runtime import REFERENCE
    execution = Execution(cache=tmp_path / "cache", progress=False)
    traces = {"chain": chain_trace()}
    default = run_census(traces, refine=False, execution=execution).table.iloc[0]
    assert (default.policy, default.samples, default.failures, default.threshold_ratio) == ("dtr", 49, 38, 0.8)
    assert any((tmp_path / "cache").iterdir())
    tight = run_census(traces, "dtr", ratios="0.5:1.0", delta=5, refine=False, execution=execution,
                       semantics=REFERENCE.with_(overhead_limit=1.5))
    assert tight.holes.empty
    row = tight.table.iloc[0]
    assert (row.samples, row.failures, row.threshold_ratio, row.max_gap_bytes) == (6, 5, 1.0, 5)
    lru = run_census(traces, "lru", ratios="0.5:1.0:0.1", execution=execution)
    assert (lru.table.iloc[0].policy, lru.refinements["chain"].grid.policy) == ("lru", "lru")


def test_run_census_passes_its_options_to_the_refinement(small_resnet, tmp_path, monkeypatch):
    """ResNet-32: a thrash hole holds 9460849 bytes (test_probing_finds_a_hole_narrower_than_the_sampling_step), between
    passing samples at 0.425 and 0.43. On that three-sample grid the hole is found, not hidden, as wide as the
    grid's gap around it, with no bisection at a resolution of peak / 50. On the grid 0.42, 0.425, 0.43, where 0.425
    is an overhead spike, one probe a gap samples the two midpoints. Nothing reaches the default cache."""
    from dtrlab.analysis.holes import MIB, run_census
    monkeypatch.setenv("DTRLAB_CACHE", str(tmp_path / "default"))
    execution = Execution(cache=tmp_path / "cache", progress=False)
    peak = baseline(small_resnet).peak_memory
    low, high = (int(peak * r) for r in (0.425, 0.43))
    ratios = [0.425, (9460849 + 0.5) / peak, 0.43]
    grid_only = run_census({"r": small_resnet}, "dtr", ratios=ratios, refine=False, execution=execution)
    assert grid_only.holes[["fail_low_bytes", "hidden"]].to_dict("records") == [
        {"fail_low_bytes": 9460849, "hidden": False}]
    census = run_census({"r": small_resnet}, "dtr", ratios=ratios, resolution=peak // 50, probes=0,
                        execution=execution)
    row = census.table.iloc[0]
    assert (row.refined_holes, row.hidden_holes, row.refinement_runs) == (1, 0, 0)
    assert row.refined_widest_mib == row.widest_hole_mib == (high - low) / MIB
    assert census.holes[["trace", "policy", "hidden"]].to_dict("records") == [
        {"trace": "r", "policy": "dtr", "hidden": False}]
    probed_census = run_census({"r": small_resnet}, "dtr", ratios=[0.42, 0.425, 0.43], resolution=peak // 50,
                               probes=1, execution=execution)
    probed = probed_census.refinements["r"]
    assert probed_census.table.iloc[0].refinement_runs == 2 + len(probed.bisection_budgets)
    budgets = [int(peak * r) for r in (0.42, 0.425, 0.43)]
    assert probed.probe_budgets == ((budgets[0] + budgets[1]) // 2, (budgets[1] + budgets[2]) // 2)
    assert probed.resolution == peak // 50
    assert not (tmp_path / "default").exists()


def test_refine_holes_keeps_the_frames_configuration(tmp_path):
    """New runs go under the frame's own policy (with its parameters), withheld storages and overhead limit: the
    refined samples stay one configuration. At an overhead limit of 1.65 (an allowance of 6.5) the recompute of 6 at
    40 and 45 bytes is a near miss (>= 0.9 x 6.5), so each gap beside them gets probes 36..49, and no bisection is
    left; a one-sample frame has nothing to refine. Loose keywords are refused in words."""
    from dtrlab.runtime import REFERENCE, Intervention
    from dtrlab.sweep import sweep
    execution = Execution(cache=tmp_path, progress=False)
    trace = chain_trace()
    for policy, params, intervention in (("random", {"seed": 3}, None), ("lru", {}, None),
                                         ("dtr", {}, Intervention(frozenset({3})))):
        grid = sweep(trace, policy, ratios="0.5:1.0:0.1", execution=execution, intervention=intervention, **params)
        refined = refine_holes(trace, grid, policy, execution=execution, **params)
        assert refined.bisection_budgets == (37, 38, 39)
        assert refined.refined.samples[["policy", "withhold"]].drop_duplicates().to_dict("records") == \
            grid[["policy", "withhold"]].drop_duplicates().to_dict("records")
    near = sweep(trace, "dtr", ratios="0.5:1.0:0.1", execution=execution,
                 semantics=REFERENCE.with_(overhead_limit=1.65))
    refined = refine_holes(trace, near, execution=execution)
    assert refined.suspicious[["budget_bytes", "reason"]].to_dict("list") == {"budget_bytes": [40, 45],
                                                                              "reason": ["near miss"] * 2}
    assert refined.probe_budgets == (*range(36, 40), *range(41, 45), *range(46, 50))
    assert refined.bisection_budgets == () and (refined.refined.samples["overhead_limit"] == 1.65).all()
    strict = refine_holes(trace, near, near_miss=0.95, execution=execution)  # 6 < 0.95 x 6.5: no near miss
    assert (len(strict.suspicious), strict.probe_budgets, strict.bisection_budgets) == (0, (), (37, 38, 39))
    single = refine_holes(trace, sweep(trace, "dtr", ratios=[1.0], execution=execution), execution=execution)
    assert len(single.refined.samples) == 1 and single.bisection_budgets == ()
    with pytest.raises(TypeError, match=r"^enforce, memory: refine_holes runs under the frame's own semantics"):
        refine_holes(trace, near, enforce="allocated", memory="caching")
    with pytest.raises(TypeError, match=r"^jobs: pass them as execution=Execution\(jobs=2\), not as loose keywords$"):
        refine_holes(trace, near, jobs=2)


def test_near_misses_scale_with_the_overhead_limit():
    """At an overhead limit of 3 the allowance is 100 x (3 - 1) = 200: a recompute of 150 is no near miss, 190 is."""
    frame = frame_of(["pass", "pass"], remat=[150, 190]).assign(overhead_limit=3.0)
    assert suspicious_samples(find_holes(frame).samples)["remat_compute"].tolist() == [190]


def test_census_files_carry_no_index(small_resnet, tmp_path):
    """Two traces, each with the grid hole of test_run_census_passes_its_options_to_the_refinement: the hole table
    is numbered 0, 1, and no file stores a pandas index as a column."""
    import pyarrow.parquet as pq
    from dtrlab.analysis.holes import run_census
    peak = baseline(small_resnet).peak_memory
    census = run_census({"r": small_resnet, "s": small_resnet}, "dtr", ratios=[0.425, (9460849 + 0.5) / peak, 0.43],
                        refine=False, out=tmp_path / "out", execution=Execution(cache=tmp_path, progress=False))
    assert census.holes.index.tolist() == [0, 1] and census.holes["trace"].tolist() == ["r", "s"]
    for name in ("r.parquet", "holes.parquet"):
        assert not any(column.startswith("__index") for column in pq.read_schema(tmp_path / "out" / name).names)
    assert list(pd.read_csv(tmp_path / "out" / "summary.csv").columns) == list(census.table.columns)


def test_small_frames_and_whole_byte_deltas():
    """Two samples have one gap; a float delta of 1.0 is one byte (no baseline needed), so a 10-byte gap is too
    coarse for it; one sample with its baseline takes a fractional delta; a frame saved before the memory columns
    reads as flat under the reserved semantics."""
    from dtrlab.analysis.holes import max_gap, with_memory_columns
    assert max_gap([0, 5]) == 5
    with pytest.raises(ValueError, match=r"^the samples are 10 bytes apart between budgets 10 and 20, coarser than "
                                         r"delta = 1 bytes;"):
        find_holes(frame_of(["pass", "pass"]), delta=1.0)
    assert find_holes(frame_of(["pass"]).assign(baseline_memory=1000), delta=0.5).max_gap_bytes == 0
    assert with_memory_columns(frame_of(["pass"])).iloc[0][["memory", "memory_options", "enforce",
                                                            "device_capacity"]].tolist() == ["flat", "", "reserved", ""]
