"""The inclusion census: breaks between neighbouring budgets and whether they predict holes."""

from __future__ import annotations

import pytest

from dtrlab.analysis.inclusion import PAIR_COLUMNS, inclusion, inclusion_census
from dtrlab.sweep import sweep
from dtrlab.sweep.execution import Execution

RATIOS = [0.38, 0.40, 0.42, 0.44]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DTRLAB_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def census(small_resnet):
    return inclusion_census(small_resnet, ["msps", "monotone"], ratios=RATIOS,
                            execution=Execution(jobs=2, progress=False))


def test_pairs_agree_with_inclusion_and_the_sweep(census, small_resnet):
    pairs = census.pairs
    assert list(pairs.columns) == PAIR_COLUMNS and len(pairs) == 2 * 3
    msps = pairs[pairs["policy"] == "msps"]
    statuses = sweep(small_resnet, "msps", ratios=RATIOS,
                     execution=Execution(cache=False, progress=False))["status"].tolist()
    assert msps["status_small"].tolist() == statuses[:-1] and msps["status_large"].tolist() == statuses[1:]
    assert (msps["hole_onset"] == ((msps["status_small"] == "pass") & (msps["status_large"] != "pass"))).all()
    row = msps.iloc[1]
    direct = inclusion(small_resnet, "msps", ratio_small=row.ratio_small, ratio_large=row.ratio_large)
    assert row.breaks == (not direct.holds) and row.violating_steps == len(direct.violating_steps)


def test_monotone_pairs_with_one_cap_never_break(census):
    # Both budgets below the first passing calibration budget, or both capped at the same one: identical runs.
    monotone = census.pairs[census.pairs["policy"] == "monotone"]
    same = monotone[monotone["status_small"] == monotone["status_large"]]
    assert len(same) and not same.loc[same["status_small"] != "pass", "breaks"].any()


def test_prediction_counts_by_hand(census):
    table = census.prediction().set_index("policy")
    eligible = census.pairs[census.pairs["status_small"] == "pass"]
    for policy, rows in [*eligible.groupby("policy"), ("all", eligible)]:
        hits = (rows["breaks"] & rows["hole_onset"]).sum()
        assert table.loc[policy, "breaks_before_onset"] == hits
        assert table.loc[policy, "pairs"] == len(rows)
        if rows["breaks"].any():
            assert table.loc[policy, "precision"] == pytest.approx(hits / rows["breaks"].sum())
    # msps passes at 0.40 and thrashes at 0.42 on this trace: one onset, preceded by a break.
    assert table.loc["msps", "hole_onsets"] == 1 and table.loc["msps", "recall"] == 1.0


def test_needs_two_ratios(small_resnet):
    with pytest.raises(ValueError, match="at least two ratios"):
        inclusion_census(small_resnet, "dtr", ratios=[0.5], execution=Execution(progress=False))


def test_ratios_per_trace(census, small_resnet):
    zone = inclusion_census(small_resnet, "msps", ratios={small_resnet.name: [0.42, 0.40]},
                            execution=Execution(progress=False))
    assert len(zone.pairs) == 1 and zone.ratios == (0.40, 0.42)
    expected = census.pairs[(census.pairs["policy"] == "msps") & (census.pairs["ratio_small"] == 0.40)]
    assert zone.pairs.to_dict("records") == expected.to_dict("records")
