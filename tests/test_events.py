"""Event recording: the recorder sees every decision, remat, free and the failure, and changes nothing."""

from __future__ import annotations

import pytest

pd = pytest.importorskip("pandas")

from dtrlab import simulate  # noqa: E402
from dtrlab.analysis import Recorder, record  # noqa: E402

from conftest import REFERENCE, read_jsonl  # noqa: E402


@pytest.fixture(scope="module")
def hole(resnet_trace):
    """ResNet-32 under DTR at ratio 0.17: thrashes (0.165 and 0.175 pass)."""
    return record(resnet_trace, "dtr", ratio=0.17)


def test_recording_changes_nothing(small_resnet):
    for ratio in (0.3, 0.45, 0.6):
        plain = simulate(small_resnet, "dtr", ratio=ratio)
        recorded = simulate(small_resnet, "dtr", ratio=ratio, recorder=Recorder())
        assert recorded.to_dict(evicted=True) == plain.to_dict(evicted=True)


def test_tables_account_for_every_event(small_resnet):
    run = record(small_resnet, "dtr", ratio=0.45)
    result = run.result
    assert list(run.evictions["storage"]) == list(result.evicted_storages)
    assert len(run.remats) == result.remats
    assert run.remats["cost"].sum() == result.remat_compute
    kinds = run.events["kind"].value_counts()
    assert kinds["evict"] == result.evictions and kinds["remat"] == result.remats
    assert kinds["free"] == len(run.frees)
    # The peak can be transient (an operator recomputing a resident output holds both copies for a moment).
    assert run.events["memory_after"].max() <= result.peak_memory <= result.budget_bytes
    events = run.events
    freed = events["kind"].isin(["evict", "free"])
    assert (events["memory_after"].diff()[freed] == events["bytes"][freed]).all()


def test_decisions_choose_the_minimal_score_and_rank_the_runner_up(small_resnet):
    run = record(small_resnet, "dtr", ratio=0.45)
    candidates = run.candidates
    best = candidates.groupby("decision")["score"].min()
    evictions = run.evictions.set_index("decision")
    assert (evictions["score"] == best.loc[evictions.index]).all()
    assert (evictions["runner_up_score"] >= evictions["score"]).all()
    assert (candidates.groupby("decision").size() == evictions["candidates"]).all()
    assert (candidates.groupby("decision")["chosen"].sum() == 1).all()


def test_remat_chains_share_one_trigger_and_nest(small_resnet):
    remats = record(small_resnet, "dtr", ratio=0.45).remats
    assert remats["chain"].is_monotonic_increasing
    assert (remats.groupby("chain")["trigger"].nunique() == 1).all()
    assert (remats.groupby("chain")["step"].nunique() == 1).all()
    assert (remats["depth"] >= 0).all()
    # A remat at depth 0 is its own trigger (a pin or an intervention rematerializing it).
    top = remats[remats["depth"] == 0]
    assert (top["tensor"] == top["trigger"]).all()


def test_failure_record_of_the_resnet32_hole(hole, reference_dir):
    reference = next(r for r in read_jsonl(REFERENCE / "resnet32-dtr-sweep.jsonl")
                     if r["heuristic"] == "DTR" and abs(r["ratio"] - 0.17) < 1e-9)
    failure = hole.failure.iloc[0]
    assert hole.result.status == failure["kind"] == reference["status"] == "thrash"
    assert failure["clock"] == reference["clock"]
    assert failure["budget_bytes"] == reference["budget"]
    assert failure["step"] == hole.result.failure.step
    assert failure["candidates"] == hole.result.failure.candidates
    # Resident memory is locked, pinned or offered to the policy: nothing else.
    assert (failure["bytes_locked"] + failure["bytes_pinned"] + failure["bytes_evictable"]
            + failure["bytes_withheld"]) == failure["memory_in_use"]
    assert failure["bytes_withheld"] == 0
    assert failure["remat_compute"] > failure["remat_limit"]
    assert hole.events["kind"].iloc[-1] == "failure"


def test_failure_record_of_an_out_of_memory_run(resnet_trace):
    run = record(resnet_trace, "dtr", ratio=0.05, candidate_scores=False)
    assert run.result.status == "oom"
    failure = run.failure.iloc[0]
    assert failure["candidates"] == 0 and failure["bytes_evictable"] == 0
    assert failure["memory_in_use"] + failure["requested_bytes"] > failure["budget_bytes"]
    assert failure["bytes_locked"] + failure["bytes_pinned"] == failure["memory_in_use"]
    assert run.candidates.empty


def test_passing_run_has_no_failure(small_resnet):
    run = record(small_resnet, "dtr", ratio=0.6)
    assert run.result.passed and run.failure.empty
    assert "failure" not in set(run.events["kind"])
