"""TwoPhase: evict where no evicted neighbourhood grows, if possible.

* Phase 1 considers only the candidates with no evicted neighbour, i.e. whose
  eviction does not grow any evicted neighbourhood, and picks by the ``phase1``
  policy (default h_DTR).
* Only if that set is empty, phase 2 picks by the ``phase2`` policy (default
  h_DTR) among all candidates.

Each phase's policy is a registered name, class or instance; the runtime
maintains the union of the features both phases declare.
"""

from __future__ import annotations

from .base import NotCompiled, Policy, SpecBuild, get_policy, register
from .coop import AddressAware
from .core_spec import P_TWOPHASE, runs_own


@register(aliases=["TwoPhase", "two_phase"])
class TwoPhase(Policy):
    """Phase 1: best ``phase1`` score among candidates with no evicted neighbour; else ``phase2`` among all."""

    name = "twophase"

    @classmethod
    def parameters(cls):
        return {"phase1": "dtr", "phase2": "dtr"}

    def __init__(self, **params):
        super().__init__(**params)
        self.phase1 = get_policy(self.params["phase1"])
        self.phase2 = get_policy(self.params["phase2"])
        self.features = frozenset(self.phase1.features) | frozenset(self.phase2.features)

    def start(self, sim):
        self.phase1.start(sim)
        self.phase2.start(sim)

    def choose(self, sim, candidates):
        evicted_neighbours = sim.evicted_neighbours
        isolated = [s for s in candidates if not evicted_neighbours(s)]
        if isolated:
            return self.phase1.choose(sim, isolated)
        return self.phase2.choose(sim, candidates)

    def core_spec(self, build):
        runs_own(self, TwoPhase, ("choose", "start"))
        if self is not build.top:  # the core's twophase takes two single policies
            raise NotCompiled("nests a twophase inside a twophase")
        return (P_TWOPHASE, _phase_spec(self.phase1, build), _phase_spec(self.phase2, build))

    def label_params(self):
        # A phase given as an instance shows as its label.
        shown = {key: value if isinstance(value, str) else get_policy(value).label
                 for key, value in self.params.items()}
        return {key: value for key, value in shown.items() if value != self.parameters()[key]}


def _phase_spec(phase, build: SpecBuild) -> tuple:
    if isinstance(phase, AddressAware):
        raise NotCompiled("has an address-aware phase (the runtime places first only for the policy itself)")
    return build.spec_of(phase)
