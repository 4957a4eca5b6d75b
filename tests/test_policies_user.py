"""A policy defined inline, as in a notebook cell, works everywhere a built-in does:
simulate, sweep (in worker processes), the variant census, the intervention search
and the inclusion check, without editing the package; so do TwoPhase and the variants."""

from __future__ import annotations

import math

import pytest

from dtrlab.analysis.inclusion import inclusion
from dtrlab.analysis.interventions import single_tensor_search
from dtrlab.analysis.variant_census import variant_census
from dtrlab.policies import Policy, get_policy, score_policy
from dtrlab.runtime import simulate
from dtrlab.sweep import sweep
from dtrlab.trace import load_directory
from dtrlab.sweep.execution import Execution

RATIOS = [0.3, 0.45, 0.6, 0.8, 1.0]


@score_policy("inline_stale_size", parameters={"offset": 1})
def inline_stale_size(view, offset):
    """Oldest and largest first: 1 / (size x (staleness + offset))."""
    return 1 / (view.size * (view.staleness + offset)) if view.size else math.inf


class InlineLargestIsolated(Policy):
    """A chooser: the largest candidate with no evicted neighbour, else the largest."""

    name = "inline_largest_isolated"

    def choose(self, sim, candidates):
        isolated = [s for s in candidates if not sim.evicted_neighbours(s)] or list(candidates)
        return [max(isolated, key=lambda s: (sim.size[s], s))]


@pytest.fixture(scope="module")
def unet():
    return load_directory("traces")["unet-b2"]


@pytest.mark.parametrize("policy", [get_policy("inline_stale_size"), InlineLargestIsolated()], ids=str)
def test_inline_policy_sweeps_in_worker_processes(policy, unet):
    frame = sweep(unet, policy, ratios=RATIOS, execution=Execution(jobs=2, backend="loky", cache=False, progress=False))
    assert list(frame["policy"].unique()) == [policy.label]
    expected = [simulate(unet, policy, ratio=r) for r in RATIOS]
    assert list(frame["status"]) == [r.status for r in expected]
    assert list(frame["eviction_sha256"]) == [r.eviction_sha256 for r in expected]
    assert frame["status"].iloc[-1] == "pass" and (frame["evictions"] > 0).any()


def test_inline_policy_parameters_and_features():
    policy = get_policy("inline_stale_size", offset=3)
    assert policy.label == "inline_stale_size(offset=3)"
    assert policy.features == frozenset()
    assert policy.description == "Oldest and largest first: 1 / (size x (staleness + offset))."


def test_inline_policy_in_census_intervention_search_and_inclusion(unet):
    census = variant_census(unet, ["dtr", "twophase", "dtr_float64", "inline_stale_size", InlineLargestIsolated],
                            ratios=RATIOS, execution=Execution(cache=False, progress=False))
    assert list(census.table["policy"]) == ["dtr", "twophase", "dtr_float64", "inline_stale_size(offset=1)",
                                            "inline_largest_isolated"]
    row = census.table.set_index("policy").loc["inline_largest_isolated"]
    statuses = [simulate(unet, InlineLargestIsolated(), ratio=r).status for r in RATIOS]
    assert row["failures"] == statuses.count("oom") + statuses.count("thrash")

    # The smallest budget fails early, after few evictions, so the search stays short.
    assert statuses[0] != "pass"
    for policy in (InlineLargestIsolated(), "twophase", "dtr_float64"):
        search = single_tensor_search(unet, policy, ratio=RATIOS[0], execution=Execution(progress=False, cache=False))
        assert search.base.policy == get_policy(policy).label and len(search.table) > 0

    check = inclusion(unet, "inline_stale_size", ratio_small=0.45, ratio_large=0.6)
    assert check.policy == "inline_stale_size(offset=1)" and check.steps_compared > 0
