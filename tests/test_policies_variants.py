"""The h_DTR score family and its named variants."""

from __future__ import annotations

import math
import pickle
from types import SimpleNamespace

import pytest

from dtrlab.policies import VARIANTS, ScoreFamily, get_policy
from dtrlab.runtime import simulate


def fake_sim(sizes, computes, last_access, clock):
    """Just the runtime state a local-cost score reads."""
    return SimpleNamespace(size=sizes, compute_cost=computes, last_access=last_access, clock=clock)


def test_exact_and_float64_arithmetic_differ_only_by_rounding():
    # size x staleness = 2**53 + 1 is exact as an integer but rounds to 2**53 in float64.
    sim = fake_sim([2**53 + 1], [1], [9], clock=10)
    exact = get_policy("score_family", cost="local")
    floating = get_policy("score_family", cost="local", arithmetic="float64")
    assert exact.score_of(sim, 0) == 1 / (2**53 + 1)
    assert floating.score_of(sim, 0) == 1.0 / 2.0**53
    assert exact.score_of(sim, 0) != floating.score_of(sim, 0)


def test_exponents_and_staleness_offset():
    sim = fake_sim([4], [6], [7], clock=10)  # staleness 3
    assert get_policy("score_family", cost="local").score_of(sim, 0) == 6 / 12
    assert get_policy("score_family", cost="local", a=2, b=0, c=2).score_of(sim, 0) == 36 / 9
    assert get_policy("score_family", cost="local", stale_offset=1).score_of(sim, 0) == 6 / 16
    assert get_policy("dtr_sqrt_size", cost="local").score_of(sim, 0) == 6.0 / (2.0 * 3.0)
    # A staleness of 0 scores inf (never evict what was just used), as in simrd...
    fresh = fake_sim([4], [6], [10], clock=10)
    assert get_policy("score_family", cost="local").score_of(fresh, 0) == math.inf
    # ...unless smoothed by +1.
    assert get_policy("dtr_stale_plus1", cost="local").score_of(fresh, 0) == 6 / 4


def test_tie_break_by_storage_id_ignores_the_pool_order():
    sim = fake_sim([1] * 10, [1] * 10, [0] * 10, clock=5)  # every score is 1/5
    pool = [5, 2, 9]
    assert get_policy("score_family", cost="local").choose(sim, pool) == [9]  # simrd: the last minimal one
    assert get_policy("dtr_tiebreak_id", cost="local").choose(sim, pool) == [2]


def test_family_defaults_are_h_dtr(resnet_trace):
    for ratio in (0.165, 0.17, 0.3):
        family, dtr = simulate(resnet_trace, "score_family", ratio=ratio), simulate(resnet_trace, "dtr", ratio=ratio)
        assert (family.status, family.clock, family.eviction_sha256) == (dtr.status, dtr.clock, dtr.eviction_sha256)


def test_a_variant_changes_decisions(resnet_trace):
    # Squaring the size makes ResNet-32 thrash at 0.15, where h_DTR passes.
    assert simulate(resnet_trace, "dtr", ratio=0.15).status == "pass"
    assert simulate(resnet_trace, "dtr_size_squared", ratio=0.15).status == "thrash"


def test_variants_are_registered_documented_and_labelled():
    assert set(VARIANTS) >= {"dtr_float64", "dtr_stale_plus1", "dtr_tiebreak_id"}
    for name, cls in VARIANTS.items():
        assert len(cls.__doc__.strip().splitlines()) == 1
        policy = get_policy(name)
        assert policy.label == name
        assert issubclass(cls, ScoreFamily)
    assert get_policy("dtr_float64", cost="local").label == "dtr_float64(cost='local')"
    assert get_policy("h_family", cost="e*").label == "score_family"


@pytest.mark.parametrize("cost, features", [("e*", {"e_star"}), ("eq-class", {"eq_class"}), ("local", set())])
def test_the_runtime_maintains_only_the_cost_feature(cost, features):
    assert get_policy("score_family", cost=cost).features == features


@pytest.mark.parametrize("params, message", [
    ({"b": 0.5}, "arithmetic='float64'"),
    ({"cost": "flops"}, "estar, eqclass"),
    ({"cost": "nocost"}, "ablation:nocost"),
    ({"tie_break": "random"}, "storage_id"),
    ({"arithmetic": "decimal"}, "float64"),
    ({"alpha": 1}, "it takes"),
])
def test_bad_parameters_say_what_would_work(params, message):
    with pytest.raises((ValueError, TypeError), match=message):
        get_policy("score_family", **params)


def test_variants_pickle_with_their_parameters(resnet_trace):
    policy = get_policy("dtr_sqrt_size", c=2)
    copy = pickle.loads(pickle.dumps(policy))
    assert copy.label == "dtr_sqrt_size(c=2)"
    a, b = simulate(resnet_trace, policy, ratio=0.3), simulate(resnet_trace, copy, ratio=0.3)
    assert a.eviction_sha256 == b.eviction_sha256
