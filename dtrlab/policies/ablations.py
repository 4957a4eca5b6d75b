"""simrd's 16 score ablations: {e*, eq-class, local, no cost} x {size, no size} x {staleness, no staleness}.

Each ablation keeps or drops one factor of h_DTR = cost / (size x staleness), with
simrd's exact arithmetic: ``cost / denominator`` as an exact ``int / int`` division,
``inf`` when the kept denominator is not positive, and the bare integer cost when
both size and staleness are dropped. "No cost" uses a numerator of 1, and dropping
all three factors is simrd's random policy. Registry names read
``ablation:<cost>-<size>-<stale>``; simrd's class names (``AbESize``, ...) are aliases.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .base import NotCompiled, ScorePolicy, register
from .builtin import RandomStorage
from .core_spec import Formula, runs_own

# cost name -> (runtime feature it needs, simrd's class-name stem, readable name)
COSTS = {
    "estar": ("e_star", "AbE", "e*"),
    "eqclass": ("eq_class", "AbEq", "eq-class"),
    "local": (None, "AbLocal", "local"),
    "nocost": (None, "Ab", "no cost"),
}


def cost_key(name: str) -> str:
    """The canonical cost name for ``e*``/``e_star``/``eq-class``/... (a clear error for anything else)."""
    key = name.lower().replace("*", "star").replace("_", "").replace("-", "").replace(" ", "")
    if key not in COSTS:
        raise ValueError(f"unknown cost {name!r}; use one of {', '.join(COSTS)} (or e*, e_star, eq_class)")
    return key


def cost_function(cost: str):
    """``numerator(sim, s)`` for a canonical cost name: the compute an eviction is charged."""
    if cost == "estar":
        return lambda sim, s: sim.compute_cost[s] + sim.region_compute[s] + sim.region_rev_compute[s]
    if cost == "eqclass":
        return lambda sim, s: sim.eq_class_compute(s)
    if cost == "local":
        return lambda sim, s: sim.compute_cost[s]
    return lambda sim, s: 1


def _score_function(cost: str, size: bool, stale: bool):
    numerator = cost_function(cost)
    if size and stale:
        def score_of(self, sim, s):
            denominator = sim.size[s] * (sim.clock - sim.last_access[s])
            return numerator(sim, s) / denominator if denominator > 0 else math.inf
    elif size:
        def score_of(self, sim, s):
            denominator = sim.size[s]
            return numerator(sim, s) / denominator if denominator > 0 else math.inf
    elif stale:
        def score_of(self, sim, s):
            denominator = sim.clock - sim.last_access[s]
            return numerator(sim, s) / denominator if denominator > 0 else math.inf
    else:
        def score_of(self, sim, s):
            return numerator(sim, s)
    return score_of


class Ablation(ScorePolicy):
    """Base of the score ablations; ``cost``, ``uses_size`` and ``uses_staleness`` say which factors are kept."""

    cost = "estar"
    uses_size = True
    uses_staleness = True

    def core_spec(self, build):
        runs_own(self, Ablation, ("score", "choose", "start"))  # and score_of, below
        formula = _FORMULAS.get(type(self).score_of)
        if formula is None:
            raise NotCompiled("defines its own score_of")
        build.require(COSTS[formula.cost][0])
        return formula.spec()


#: Each registered ablation's score function, and the formula it computes.
_FORMULAS: dict[Callable, Formula] = {}


def _register_ablation(cost: str, size: bool, stale: bool) -> type:
    feature, stem, readable = COSTS[cost]
    factors = f"{readable}, {'size' if size else 'no size'}, {'staleness' if stale else 'no staleness'}"
    if cost == "nocost" and not size and not stale:
        description = f"simrd's AbRandom: {factors} (random)"
        cls = type("AbRandom", (RandomStorage,), {"name": "ablation:random", "description": description,
                                                  "__doc__": description + ".", "__module__": __name__})
        return register(cls, aliases=["AbRandom"])
    name = "ablation:" + "-".join([cost] + (["size"] if size else []) + (["stale"] if stale else []))
    simrd_name = stem + ("Size" if size else "") + ("Stale" if stale else "")
    description = f"simrd's {simrd_name}: {factors}"
    score_of = _score_function(cost, size, stale)
    _FORMULAS[score_of] = Formula(cost, use_size=size, use_stale=stale)
    cls = type(simrd_name, (Ablation,), {
        "name": name, "features": frozenset({feature} if feature else ()), "description": description,
        "__doc__": description + ".", "__module__": __name__, "cost": cost, "uses_size": size,
        "uses_staleness": stale, "score_of": score_of,
    })
    aliases = [simrd_name] + ([name.replace("estar", "e*")] if cost == "estar" else [])
    return register(cls, aliases=aliases)


ABLATIONS: dict[str, type] = {}
for _cost in COSTS:
    for _size in (True, False):
        for _stale in (True, False):
            _cls = _register_ablation(_cost, _size, _stale)
            ABLATIONS[_cls.name] = _cls
            globals()[_cls.__name__] = _cls  # importable (and picklable) under simrd's class name
del _cost, _size, _stale, _cls
