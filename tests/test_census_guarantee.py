"""The census with a stated guarantee (docs/sweeps.md, "The guarantee").

The sampling (fill every ``delta`` bytes, then bisect every edge) is checked against
synthetic pass/fail layouts whose holes are all known, then on real traces against a
plain sweep at the same resolution.
"""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dtrlab.analysis.holes import (bisect_transitions, delta_bytes, fill_budgets, find_holes, max_gap,
                                   refine_holes, run_census)
from dtrlab.cli import main
from dtrlab.runtime import baseline, simulate
from dtrlab.sweep import sweep

from conftest import ROOT, UNET_LOG
from dtrlab.sweep.execution import Execution


def test_delta_in_bytes_or_as_a_fraction_of_the_peak():
    assert delta_bytes(4096, 10**9) == 4096
    assert delta_bytes(0.001, 1_000_500) == 1002  # ceil(1000.5) + 1 byte for the rounding of ratio budgets
    assert delta_bytes(0.001, 2_000_000) == 2001
    for bad in (0, -3, 1.5, 0.0):
        with pytest.raises(ValueError, match="delta is bytes"):
            delta_bytes(bad, 10**9)


def test_fill_leaves_no_gap_wider_than_delta():
    assert fill_budgets([0, 10], 3) == [2, 5, 7]  # 4 pieces: 2, 3, 2, 3 bytes
    assert fill_budgets([0, 3, 6], 3) == []
    assert fill_budgets([10, 0, 25], 10) == [17]  # sorted first; gaps 10, 7, 8
    assert max_gap([0, 2, 5, 7, 10]) == 3 and max_gap([4]) == 0


def test_bisection_locates_each_transition_to_the_resolution():
    passed = {0: False, 100: True}
    sampled = bisect_transitions(passed, lambda budgets: {b: b >= 37 for b in budgets}, resolution=10)
    assert sampled == [50, 25, 37, 31]  # 31 fails, 37 passes: 6 bytes apart
    assert passed == {0: False, 25: False, 31: False, 37: True, 50: True, 100: True}


def frame_of(passed: dict[int, bool]) -> pd.DataFrame:
    budgets = sorted(passed)
    return pd.DataFrame({"trace": "t", "policy": "dtr", "overhead_limit": 2.0, "withhold": "",
                         "budget_bytes": budgets, "ratio": [b / 1000 for b in budgets],
                         "status": ["pass" if passed[b] else "oom" for b in budgets]})


def census_of_layout(layout: list[bool], delta: int, resolution: int):
    """The census sampling (grid of both ends, fill, bisection) of a known outcome per byte."""
    oracle = lambda budgets: {b: layout[b] for b in budgets}  # noqa: E731
    low, high = 0, len(layout) - 1
    passed = oracle([low, high])
    passed.update(oracle(fill_budgets(passed, delta)))
    bisect_transitions(passed, oracle, resolution)
    return find_holes(frame_of(passed), delta=delta)


def true_holes(layout: list[bool]) -> list[tuple[int, int]]:
    """Maximal runs of failing budgets with a passing budget on both sides."""
    holes, start = [], None
    for budget, ok in enumerate(layout):
        if not ok and start is None:
            start = budget
        if ok and start is not None:
            if start > 0:
                holes.append((start, budget - 1))
            start = None
    return holes


# A layout is a sequence of runs (passed, length): every hole and every pass island is known.
layouts = st.lists(st.tuples(st.booleans(), st.integers(1, 60)), min_size=1, max_size=12).map(
    lambda runs: [ok for ok, length in runs for _ in range(length)])


@settings(max_examples=150, deadline=None)
@given(layout=layouts, delta=st.integers(1, 40), resolution=st.integers(1, 8))
def test_every_hole_at_least_delta_wide_is_found(layout, delta, resolution):
    if len(layout) < 2:
        return
    census = census_of_layout(layout, delta, resolution)
    gap = census.max_gap_bytes
    assert gap <= delta
    samples = dict(zip(census.samples["budget_bytes"], census.samples["status"] == "pass"))
    reported = list(zip(census.holes["fail_low_bytes"], census.holes["fail_high_bytes"]))
    for a, b in true_holes(layout):
        if b - a + 1 < gap:
            continue  # narrower than the guarantee
        # (i) the hole holds a sample, which fails.
        inside = [s for s in samples if a <= s <= b]
        assert inside and not any(samples[s] for s in inside)
        # (ii) with a passing sample below and above it, a reported hole holds those samples.
        if any(ok for s, ok in samples.items() if s < a) and any(ok for s, ok in samples.items() if s > b):
            assert any(low <= inside[0] <= high for low, high in reported), (a, b, reported)
        # A passing lowest budget, or a pass run of at least `gap` budgets below the hole,
        # guarantees that passing sample (the same above).
        if layout[0] or any(ok and length >= gap for ok, length in _runs(layout[:a])):
            assert any(ok for s, ok in samples.items() if s < a)
        if layout[-1] or any(ok and length >= gap for ok, length in _runs(layout[b + 1:])):
            assert any(ok for s, ok in samples.items() if s > b)
    # (iii) every reported hole is real and its edges are located to the resolution.
    for hole in census.holes.itertuples():
        assert layout[hole.pass_below_bytes] and layout[hole.pass_above_bytes]
        assert not layout[hole.fail_low_bytes] and not layout[hole.fail_high_bytes]
        assert hole.fail_low_bytes - hole.pass_below_bytes <= resolution
        assert hole.pass_above_bytes - hole.fail_high_bytes <= resolution


def _runs(layout: list[bool]) -> list[tuple[bool, int]]:
    runs = []
    for ok in layout:
        if runs and runs[-1][0] == ok:
            runs[-1] = (ok, runs[-1][1] + 1)
        else:
            runs.append((ok, 1))
    return runs


def test_a_narrow_pass_island_below_a_wide_hole_can_hide_it():
    # The limit stated in docs/sweeps.md: 0..39 fail but for one passing byte at 20, 41..99 pass.
    layout = [False] * 20 + [True] + [False] * 19 + [True] * 60
    census = census_of_layout(layout, delta=10, resolution=1)
    assert (21, 39) in true_holes(layout)
    assert census.holes.empty  # no passing sample below 21..39: it reads as the infeasible region
    assert census.threshold_bytes == 40  # bisected to the byte


def test_find_holes_with_delta_rejects_a_coarse_frame():
    frame = frame_of({0: False, 10: True, 30: True}).assign(baseline_memory=10_000)
    assert find_holes(frame, delta=20).max_gap_bytes == 20
    assert find_holes(frame, delta=0.002).max_gap_bytes == 20  # within ceil(10000 * 0.002) + 1 = 21
    with pytest.raises(ValueError, match="20 bytes apart between budgets 10 and 30, coarser than delta = 19"):
        find_holes(frame, delta=19)


@pytest.fixture(scope="module")
def small_transformer():
    from dtrlab.trace import load_log

    return load_log(ROOT / "traces" / "transformer-b4.jsonl.gz", cache=False)


def test_fine_census_reports_every_hole_of_the_plain_sweep(small_transformer, tmp_path):
    # transformer-b4 between ratios 0.65 and 0.71: a plain 0.001 sweep shows three holes.
    plain = sweep(small_transformer, "dtr", ratios="0.65:0.71:0.001", execution=Execution(cache=False, progress=False))
    plain_holes = find_holes(plain).holes
    assert len(plain_holes) == 3
    census = run_census({small_transformer.name: small_transformer}, "dtr", ratios="0.65:0.71:0.005", delta=0.001,
                        execution=Execution(cache=tmp_path, progress=False))
    refinement = census.refinements[small_transformer.name]
    assert refinement.grid.samples["budget_bytes"].tolist() == plain["budget_bytes"].tolist()  # the same grid
    peak = baseline(small_transformer).peak_memory
    assert refinement.delta_bytes == -(-peak // 1000) + 1
    assert refinement.fill_budgets == ()  # the ratio grid is already that fine
    assert refinement.refined.max_gap_bytes <= refinement.delta_bytes
    assert refinement.probe_budgets == ()  # no probing with delta: every gap is sampled
    refined = refinement.refined.holes
    for hole in plain_holes.itertuples():
        inside = refined[(refined.fail_low_bytes <= hole.fail_low_bytes)
                         & (refined.fail_high_bytes >= hole.fail_high_bytes)]
        assert len(inside) == 1, hole
    assert len(refined) >= len(plain_holes)
    row = census.table.iloc[0]
    assert row.refined_max_gap_bytes == refinement.refined.max_gap_bytes
    for hole in refined.itertuples():  # edges to the default resolution, confirmed by the simulator
        assert hole.fail_low_bytes - hole.pass_below_bytes <= refinement.resolution
        assert simulate(small_transformer, "dtr", budget_bytes=hole.pass_below_bytes).passed
        assert not simulate(small_transformer, "dtr", budget_bytes=hole.fail_low_bytes).passed


def test_refine_with_delta_fills_a_coarse_frame(small_transformer, tmp_path):
    coarse = sweep(small_transformer, "dtr", ratios="0.65:0.70:0.01",
                   execution=Execution(cache=tmp_path, progress=False))
    delta = baseline(small_transformer).peak_memory // 400
    refinement = refine_holes(small_transformer, coarse, "dtr", delta=delta,
                              execution=Execution(cache=tmp_path, progress=False))
    assert refinement.delta_bytes == delta
    assert len(refinement.fill_budgets) > 0
    assert refinement.refined.max_gap_bytes <= delta
    assert set(refinement.fill_budgets) <= set(refinement.refined.samples["budget_bytes"])
    with pytest.raises(ValueError, match="delta is bytes"):
        refine_holes(small_transformer, coarse, "dtr", delta=2.5, execution=Execution(cache=tmp_path, progress=False))


def test_census_cli_with_delta(tmp_path, capsys):
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "transformer-b4.jsonl.gz").write_bytes((ROOT / "traces" / "transformer-b4.jsonl.gz").read_bytes())
    out = tmp_path / "census"
    assert main(["census", str(traces), "--ratios", "0.65:0.70:0.01", "--delta", "0.002", "--cache",
                 str(tmp_path / "c"), "--quiet", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "refined_max_gap_bytes" in printed
    frame = pd.read_parquet(out / "transformer-b4.parquet")
    assert max_gap(frame["budget_bytes"]) <= delta_bytes(0.002, int(frame["baseline_memory"].iloc[0]))
    assert main(["census", str(traces), "--delta", "1.5"]) == 2  # a usage error: one line, exit status 2


@pytest.mark.slow
def test_unet_fine_census_finds_the_three_holes_of_the_plain_sweep(load_shared_log, tmp_path):
    unet = load_shared_log(UNET_LOG)
    plain = find_holes(sweep(unet, "dtr", ratios="0.05:1.0:0.001",
                             execution=Execution(jobs=2, cache=tmp_path / "plain", progress=False))).holes
    assert len(plain) == 3
    census = run_census({unet.name: unet}, "dtr", ratios="0.05:1.0", delta=0.001,
                        execution=Execution(jobs=2, cache=tmp_path / "census", progress=False))
    refined = census.refinements[unet.name].refined.holes
    for hole in plain.itertuples():
        holding = (refined.fail_low_bytes <= hole.fail_low_bytes) & (refined.fail_high_bytes >= hole.fail_high_bytes)
        assert holding.sum() == 1
