"""Divergence: the first eviction decision where two runs of one trace differ, with its context."""

from __future__ import annotations

import pytest

pd = pytest.importorskip("pandas")

from dtrlab import Intervention  # noqa: E402
from dtrlab.analysis import divergence, identical_evictions, record  # noqa: E402



@pytest.fixture(scope="module")
def hole_neighbourhood(resnet_trace):
    return {ratio: record(resnet_trace, "dtr", ratio=ratio) for ratio in (0.165, 0.17, 0.175)}


def test_failing_budget_against_the_passing_budget_below(hole_neighbourhood):
    below, hole = hole_neighbourhood[0.165], hole_neighbourhood[0.17]
    found = divergence(below, hole)
    assert found.decision == found.identical_decisions == 59
    assert found.decision == identical_evictions(below.result, hole.result)
    assert found.a_decision["chosen"] == ("x8337",) and found.b_decision["chosen"] == ("x8334",)
    # Each run's runner-up is the other's choice: the two scores swapped order.
    assert found.a_decision["runner_up"] == "x8334" and found.b_decision["runner_up"] == "x8337"
    context = found.context.set_index("storage")
    assert context.loc["x8337", "rank_a"] == 0 and context.loc["x8334", "rank_b"] == 0
    assert context.loc["x8337", "chosen_a"] and context.loc["x8334", "chosen_b"]
    assert context.loc["x8334", "score_a"] > context.loc["x8337", "score_a"]
    assert context.loc["x8334", "score_b"] < context.loc["x8337", "score_b"]
    assert "decision 59" in found.summary()


def test_failing_budget_against_the_passing_budget_above(hole_neighbourhood):
    found = divergence(hole_neighbourhood[0.17], hole_neighbourhood[0.175])
    assert found.decision == 32
    assert found.a_decision["chosen"] == ("x8101",) and found.b_decision["chosen"] == ("x8195",)


def test_a_run_does_not_diverge_from_itself(hole_neighbourhood):
    run = hole_neighbourhood[0.17]
    found = divergence(run, run)
    assert found.decision is None and found.identical_decisions == run.result.evictions
    assert found.context.empty


def test_withholding_diverges_where_the_withheld_storage_was_first_chosen(resnet_trace, hole_neighbourhood):
    hole = hole_neighbourhood[0.17]
    name = hole.result.evicted_storages[3]
    withheld = record(resnet_trace, "dtr", ratio=0.17,
                      intervention=Intervention(withhold=frozenset({resnet_trace.tensor_names.index(name)})))
    found = divergence(hole, withheld)
    assert found.decision == 3 and found.a_decision["chosen"] == (name,)
    # The intervened run picks the base run's runner-up at that decision.
    assert found.b_decision["chosen"] == (found.a_decision["runner_up"],)
    assert name not in set(found.context.dropna(subset=["rank_b"])["storage"])


def test_a_run_that_stops_early_diverges_where_it_stopped(small_resnet):
    failing, passing = record(small_resnet, "dtr", ratio=0.4), record(small_resnet, "dtr", ratio=0.5)
    found = divergence(failing, passing)
    assert found.decision is not None and found.decision <= min(found.a_decisions, found.b_decisions)


def test_divergence_needs_one_trace_and_candidate_scores(resnet_trace, unet_trace, hole_neighbourhood):
    with pytest.raises(ValueError, match="same trace"):
        divergence(hole_neighbourhood[0.17], record(unet_trace, "dtr", ratio=0.5))
    without = record(resnet_trace, "dtr", ratio=0.165, candidate_scores=False)
    with pytest.raises(ValueError, match="candidate_scores=True"):
        divergence(without, hole_neighbourhood[0.17])
