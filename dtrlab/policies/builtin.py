"""simrd's policies, with its exact score definitions.

Each score is an exact ``int / int`` division (Python rounds it exactly), with
``inf`` when the denominator is not positive, as in simrd. Staleness is
``clock - last_access``.
"""

from __future__ import annotations

import math
import random

from .base import NotCompiled, Policy, ScorePolicy, SpecBuild, register
from .core_spec import (P_DTR, P_DTR_EQ_CLASS, P_DTR_LOCAL, P_LARGEST_STORAGE, P_LRU, P_MSPS, P_RANDOM,
                        POLICY_METHODS, runs_own)


@register(aliases=["DTR", "h_dtr"])
class DTR(ScorePolicy):
    """h_DTR: (own + evicted-neighbourhood e* compute) / (size x staleness)."""

    name = "dtr"
    features = frozenset({"e_star"})

    def score_of(self, sim, s):
        denominator = sim.size[s] * (sim.clock - sim.last_access[s])
        if denominator > 0:
            return (sim.compute_cost[s] + sim.region_compute[s] + sim.region_rev_compute[s]) / denominator
        return math.inf

    def core_spec(self, build):
        return _simrd_spec(self, DTR, build)


@register(aliases=["DTREqClass"])
class DTREqClass(ScorePolicy):
    """h_DTR^eq: (own + neighbouring equivalence-class compute) / (size x staleness)."""

    name = "dtr_eq_class"
    features = frozenset({"eq_class"})

    def score_of(self, sim, s):
        denominator = sim.size[s] * (sim.clock - sim.last_access[s])
        if denominator > 0:
            return sim.eq_class_compute(s) / denominator
        return math.inf

    def core_spec(self, build):
        return _simrd_spec(self, DTREqClass, build)


@register(aliases=["DTRLocal"])
class DTRLocal(ScorePolicy):
    """h_DTR^local: own compute / (size x staleness)."""

    name = "dtr_local"

    def score_of(self, sim, s):
        denominator = sim.size[s] * (sim.clock - sim.last_access[s])
        return sim.compute_cost[s] / denominator if denominator > 0 else math.inf

    def core_spec(self, build):
        return _simrd_spec(self, DTRLocal, build)


@register(aliases=["MSPS"])
class MSPS(ScorePolicy):
    """h_MSPS: (own + evicted-ancestor compute) / size."""

    name = "msps"
    features = frozenset({"e_star"})

    def score_of(self, sim, s):
        size = sim.size[s]
        return (sim.compute_cost[s] + sim.region_rev_compute[s]) / size if size > 0 else math.inf

    def core_spec(self, build):
        return _simrd_spec(self, MSPS, build)


@register(aliases=["LRU"])
class LRU(ScorePolicy):
    """h_LRU: the last access time (least recently used first)."""

    name = "lru"

    def score_of(self, sim, s):
        return sim.last_access[s]

    def core_spec(self, build):
        return _simrd_spec(self, LRU, build)


@register(aliases=["LargestStorage", "largest"])
class LargestStorage(ScorePolicy):
    """h_size: 1 / size (largest storage first)."""

    name = "largest_storage"

    def score_of(self, sim, s):
        size = sim.size[s]
        return 1 / size if size > 0 else math.inf

    def core_spec(self, build):
        return _simrd_spec(self, LargestStorage, build)


@register(aliases=["RandomStorage", "rand"])
class RandomStorage(Policy):
    """Uniformly random candidate, from a seeded generator (``seed`` parameter)."""

    name = "random"

    @classmethod
    def parameters(cls):
        return {"seed": 0}

    def __init__(self, **params):
        super().__init__(**params)
        seed = self.params["seed"]
        if not isinstance(seed, int) or isinstance(seed, bool):
            # An unseeded generator would make runs irreproducible while sweeps cache them as results.
            raise ValueError(f"policy {self.name!r}: seed must be an integer, got {seed!r} (e.g. seed=0)")

    def start(self, sim):
        # Re-seeded per run, so that one instance replays identically every time.
        self._random = random.Random(self.params["seed"])

    def choose(self, sim, candidates):
        ordered = list(candidates)
        return [ordered[self._random.randrange(0, len(ordered))]]

    def core_spec(self, build):
        runs_own(self, RandomStorage, ("choose", "start"))
        seed = self.params.get("seed")
        if type(seed) is not int:
            raise NotCompiled(f"has seed {seed!r}, not an int")
        # The policy's own generator, seeded as start() seeds it: the same draws in the same order.
        if id(self) not in build.generators:
            build.generators[id(self)] = random.Random(seed).randrange
        return (P_RANDOM, build.generators[id(self)])


#: simrd's built-in policy classes and their codes in the compiled core (_policy_spec.h).
POLICY_CODES = {DTR: P_DTR, DTREqClass: P_DTR_EQ_CLASS, DTRLocal: P_DTR_LOCAL, MSPS: P_MSPS, LRU: P_LRU,
                LargestStorage: P_LARGEST_STORAGE, RandomStorage: P_RANDOM}


def _simrd_spec(policy: ScorePolicy, owner: type[ScorePolicy], build: SpecBuild) -> tuple:
    """A built-in score: the core computes ``owner.score_of`` by its code."""
    runs_own(policy, owner, POLICY_METHODS)
    for feature in owner.features:
        build.require(feature)
    return (POLICY_CODES[owner], None)
