"""TwoPhase: phase 1 among candidates with no evicted neighbour, else phase 2 among all."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

from dtrlab.policies import TwoPhase, get_policy
from dtrlab.runtime import Simulator, budget_for, simulate


def fake_sim(neighbours):
    """Four candidates; h_DTR ranks 0 < 1 < 2 < 3 (1/1, 10/2, 100/3, 1000/4: no evicted
    regions, unit sizes) and LRU ranks 3 < 2 < 1 < 0. ``neighbours[s]`` are s's evicted
    neighbours."""
    n = 4
    return SimpleNamespace(
        size=[1] * n, compute_cost=[1, 10, 100, 1000], region_compute=[0] * n, region_rev_compute=[0] * n,
        last_access=[7, 6, 5, 4], clock=8, evicted_neighbours=lambda s: neighbours[s])


def test_phase_one_takes_the_best_candidate_with_no_evicted_neighbour():
    sim = fake_sim({0: {9}, 1: {9}, 2: set(), 3: set()})
    assert get_policy("dtr").choose(sim, [0, 1, 2, 3]) == [0]
    assert get_policy("twophase").choose(sim, [0, 1, 2, 3]) == [2]


def test_phase_two_only_when_every_candidate_has_an_evicted_neighbour():
    sim = fake_sim({0: {9}, 1: {9}, 2: {9}, 3: {8}})
    assert get_policy("twophase").choose(sim, [1, 2, 3, 0]) == [0]


def test_each_phase_takes_its_own_score():
    sim = fake_sim({0: set(), 1: set(), 2: set(), 3: {9}})
    assert get_policy("twophase", phase1="lru").choose(sim, [0, 1, 2, 3]) == [2]
    every = fake_sim({s: {9} for s in range(4)})
    assert get_policy("twophase", phase2="lru").choose(every, [0, 1, 2, 3]) == [3]


def test_features_are_the_union_of_the_phases():
    assert get_policy("twophase").features == {"e_star"}
    assert get_policy("twophase", phase1="dtr_eq_class", phase2="lru").features == {"eq_class"}
    cheap = get_policy("twophase", phase1="lru", phase2="dtr_local")
    assert cheap.features == frozenset()
    assert cheap.label == "twophase(phase1='lru', phase2='dtr_local')"


class CountingTwoPhase(TwoPhase):
    """TwoPhase that checks and counts its phases on a real run."""

    def start(self, sim):
        super().start(sim)
        self.phases = [0, 0]

    def choose(self, sim, candidates):
        chosen = super().choose(sim, candidates)
        isolated = [s for s in candidates if not sim.evicted_neighbours(s)]
        if isolated:
            assert chosen == get_policy("dtr").choose(sim, isolated)
            self.phases[0] += 1
        else:
            assert chosen == get_policy("dtr").choose(sim, candidates)
            self.phases[1] += 1
        return chosen


def test_both_phases_happen_on_resnet(resnet_trace):
    policy = CountingTwoPhase()
    sim = Simulator(resnet_trace, policy, budget_for(resnet_trace, 0.2))
    sim.run()
    assert policy.phases[0] > 0 and policy.phases[1] > 0
    assert sum(policy.phases) == len(sim.evicted)


def test_twophase_is_not_dtr_and_pickles(resnet_trace):
    two, dtr = simulate(resnet_trace, "twophase", ratio=0.2), simulate(resnet_trace, "dtr", ratio=0.2)
    assert two.eviction_sha256 != dtr.eviction_sha256
    again = simulate(resnet_trace, pickle.loads(pickle.dumps(get_policy("TwoPhase"))), ratio=0.2)
    assert again.eviction_sha256 == two.eviction_sha256
