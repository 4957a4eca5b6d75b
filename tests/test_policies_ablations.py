"""simrd's 16 ablations: names, definitions, and decision identity with simrd itself.

tests/fixtures/simrd_ablations.jsonl was produced by running simrd beside dtrlab
(scripts/make_ablation_fixture.py): every non-random ablation on ResNet-32 and U-Net
at four budgets, with the sha256 of the evicted storages in order.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dtrlab.policies import ABLATIONS, get_policy
from dtrlab.runtime import simulate

FIXTURE = Path(__file__).parent / "fixtures" / "simrd_ablations.jsonl"
RECORDS = [json.loads(line) for line in FIXTURE.read_text().splitlines()]


def test_sixteen_ablations_with_simrd_aliases():
    assert len(ABLATIONS) == 16
    assert get_policy("AbESize").label == "ablation:estar-size"
    assert get_policy("ablation:e*-size-stale").label == "ablation:estar-size-stale"
    assert get_policy("AbEq").features == {"eq_class"}
    assert get_policy("AbLocalStale").features == frozenset()
    assert get_policy("AbRandom", seed=4).label == "ablation:random(seed=4)"


def test_fixture_covers_every_non_random_ablation_on_two_logs():
    assert len(RECORDS) == 2 * 15 * 4
    assert {r["heuristic"] for r in RECORDS} == {cls.__name__ for cls in ABLATIONS.values()} - {"AbRandom"}
    # The sample exercises all three outcomes, so it can tell policies apart.
    assert {r["status"] for r in RECORDS} == {"pass", "oom", "thrash"}


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: f"{r['log'][:6]}-{r['heuristic']}-{r['ratio']}")
def test_ablation_matches_simrd_decision_for_decision(record, load_shared_log):
    result = simulate(load_shared_log(record["log"]), record["heuristic"], ratio=record["ratio"])
    assert result.budget_bytes == record["budget_bytes"]
    assert list(result.evicted_storages[:10]) == record["first_evictions"]
    assert (result.status, result.clock, result.evictions, result.eviction_sha256) == (
        record["status"], record["clock"], record["evictions"], record["eviction_sha256"])


@pytest.mark.parametrize("ablation, builtin", [
    ("ablation:estar-size-stale", "dtr"), ("ablation:eqclass-size-stale", "dtr_eq_class"),
    ("ablation:local-size-stale", "dtr_local"), ("ablation:nocost-size", "largest_storage"),
])
def test_full_ablations_are_the_builtin_policies(ablation, builtin, resnet_trace):
    for ratio in (0.2, 0.4):
        a, b = simulate(resnet_trace, ablation, ratio=ratio), simulate(resnet_trace, builtin, ratio=ratio)
        assert (a.status, a.clock, a.eviction_sha256) == (b.status, b.clock, b.eviction_sha256)


def test_random_ablation_is_the_seeded_random_policy(resnet_trace):
    a = simulate(resnet_trace, "AbRandom", ratio=0.5, seed=7)
    b = simulate(resnet_trace, "random", ratio=0.5, seed=7)
    assert a.eviction_sha256 == b.eviction_sha256
