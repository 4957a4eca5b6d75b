"""The policy interface, the candidate view and the registry.

A policy decides which storage to evict when an allocation does not fit. There are
two kinds:

* a **score policy** scores each candidate; the runtime evicts the *last* candidate
  with the minimal score and stops scanning at a score of exactly 0 (simrd's rule).
  Subclass :class:`ScorePolicy` and implement ``score(view)``, or decorate a plain
  function with :func:`score_policy`.
* a **chooser policy** receives the whole candidate list and returns the storages to
  evict (for multi-phase or batched policies). Subclass :class:`Policy` and
  implement ``choose(sim, candidates)``.

Both declare the runtime ``features`` they read, so the runtime maintains only
those: ``"e_star"`` (evicted neighbourhoods, simrd's regions) and ``"eq_class"``
(equivalence classes). Sizes, computes and last-access times are always available.

Policies are registered by name (:func:`register`) and built with parameters by
:func:`get_policy`; a policy defined in a notebook cell works everywhere a name does.

A policy runs on the compiled replay core when it describes itself to it:
:meth:`Policy.core_spec` returns the spec tuple the core decodes
(:mod:`dtrlab.policies.core_spec`, ``_policy_spec.h``), or raises :class:`NotCompiled`
with the reason; every other policy runs on the Python simulator.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import ClassVar

from ..suggest import did_you_mean

FEATURES = frozenset({"e_star", "eq_class"})


class CandidateView:
    """Read-only view of one eviction candidate, for score functions.

    Every attribute is computed on access from the live runtime, so a score that
    reads only ``size`` does not pay for neighbourhood sums.
    """

    __slots__ = ("_sim", "storage_id")

    def __init__(self, sim, storage_id: int):
        self._sim = sim
        self.storage_id = storage_id

    @property
    def name(self) -> str:
        """Log name of the storage's root tensor."""
        return self._sim.trace.tensor_names[self.storage_id]

    @property
    def size(self) -> int:
        return self._sim.size[self.storage_id]

    @property
    def compute(self) -> int:
        """Cost to recompute this storage alone (its operators, each counted once)."""
        return self._sim.compute_cost[self.storage_id]

    @property
    def e_star_compute(self) -> int:
        """Own compute plus the evicted neighbourhood e* in both directions (needs ``e_star``)."""
        sim, s = self._sim, self.storage_id
        return sim.compute_cost[s] + sim.region_compute[s] + sim.region_rev_compute[s]

    @property
    def e_star_reverse_compute(self) -> int:
        """Own compute plus the evicted ancestors only (MSPS's cost; needs ``e_star``)."""
        sim, s = self._sim, self.storage_id
        return sim.compute_cost[s] + sim.region_rev_compute[s]

    @property
    def eq_class_compute(self) -> int:
        """Own compute plus the evicted neighbours' equivalence classes (needs ``eq_class``)."""
        return self._sim.eq_class_compute(self.storage_id)

    @property
    def last_access(self) -> float:
        return self._sim.last_access[self.storage_id]

    @property
    def clock(self) -> int:
        return self._sim.clock

    @property
    def staleness(self) -> float:
        """``clock - last_access`` (simrd's staleness)."""
        return self._sim.clock - self._sim.last_access[self.storage_id]

    @property
    def evicted_neighbours(self) -> int:
        """Number of evicted storages adjacent to this one."""
        return len(self._sim.evicted_neighbours(self.storage_id))


class Policy:
    """Base of all policies. Subclasses set ``name`` and implement ``choose``."""

    name: ClassVar[str] = "policy"
    features: ClassVar[frozenset[str]] = frozenset()
    description: ClassVar[str] = ""
    #: The class path that sweep cache keys record; None: the class's own. A class that
    #: moved to another module keeps its old path here, so its cached and shipped rows stay valid.
    cache_class: ClassVar[str | None] = None

    def __init__(self, **params):
        unknown = set(params) - set(self.parameters())
        if unknown:
            raise TypeError(
                f"policy {self.name!r} has no parameter(s) {sorted(unknown)}; "
                f"it takes {sorted(self.parameters()) or 'none'}"
            )
        self.params = {**self.parameters(), **params}

    @classmethod
    def parameters(cls) -> dict:
        """Parameter names with their defaults."""
        return {}

    def start(self, sim) -> None:
        """Called once before each run; reset per-run state here."""

    def choose(self, sim, candidates) -> list[int]:
        """Return the storage ids (from ``candidates``) to evict now."""
        raise NotImplementedError

    def core_spec(self, build: SpecBuild) -> tuple:
        """This policy as the compiled core runs it: the spec tuple of ``_policy_spec.h``
        (:mod:`dtrlab.policies.core_spec`), built through ``build`` (:class:`SpecBuild`).

        Raise :class:`NotCompiled` with the reason where the core cannot run what this policy
        runs. The spec must describe the code the reference would run: an implementation
        checks that a subclass or the instance does not replace a method it describes
        (:func:`~dtrlab.policies.core_spec.runs_own`). The default refuses.
        """
        raise NotCompiled("is a chooser policy the compiled core does not implement")

    def label_params(self) -> dict:
        """The parameters shown in :attr:`label`; a policy with many defaults can show only the changed ones."""
        return self.params

    @property
    def label(self) -> str:
        """Name plus the :meth:`label_params`, e.g. ``random(seed=3)``."""
        params = self.label_params()
        if not params:
            return self.name
        return f"{self.name}(" + ", ".join(f"{k}={v!r}" for k, v in sorted(params.items())) + ")"

    def __repr__(self) -> str:
        return f"<policy {self.label}>"


class ScorePolicy(Policy):
    """A policy defined by a score: lower means evict first.

    Implement ``score(view)`` on a :class:`CandidateView`; built-in policies
    implement ``score_of(sim, storage_id)`` on the raw runtime state instead, which
    avoids building a view per candidate.

    ``choose`` follows simrd exactly: scan in pool order, keep the *last* candidate
    whose score is ``<=`` the best so far, stop at a score of exactly 0.
    """

    def score(self, view: CandidateView) -> float:
        return self.score_of(view._sim, view.storage_id)

    def score_of(self, sim, storage_id: int) -> float:
        return self.score(CandidateView(sim, storage_id))

    def choose(self, sim, candidates) -> list[int]:
        best_score = math.inf
        best = None
        score_of = self.score_of
        for s in candidates:
            value = score_of(sim, s)
            if value <= best_score:
                best_score = value
                best = s
            if value == 0:
                break
        return [best]

    def core_spec(self, build: SpecBuild) -> tuple:
        raise NotCompiled("has a score function the compiled core does not implement")


class NotCompiled(Exception):
    """Why the compiled core cannot run a policy; the message follows the policy's label
    (``policy 'x' <message>``)."""


@dataclass
class SpecBuild:
    """One build of a run's policy spec (:meth:`Policy.core_spec`), built afresh for every run.

    ``top`` is the run's policy: the runtime maintains the features it declares.
    ``generators`` holds the bound ``randrange`` of each random policy's generator, seeded for
    this run, by the instance's id: one instance serving both phases of a twophase is one generator.
    """

    top: Policy
    generators: dict[int, Callable] = field(default_factory=dict)

    def spec_of(self, policy) -> tuple:
        """The spec of ``policy``, the run's policy or a part of it."""
        if not isinstance(policy, Policy):
            raise NotCompiled("is not a dtrlab Policy")
        return policy.core_spec(self)

    def require(self, feature: str | None) -> None:
        """Refuse a score that reads ``feature`` unless the run's policy declares it: the reference
        maintains only the declared features (and fails without them)."""
        if feature is not None and feature not in frozenset(getattr(self.top, "features", ())):
            raise NotCompiled(f"reads {feature} without declaring it in its features")


_REGISTRY: dict[str, type[Policy]] = {}
_ALIASES: dict[str, str] = {}


def _key(name: str) -> str:
    return name.lower().replace("-", "_")


def register(cls: type[Policy] | None = None, *, aliases: Iterable[str] = ()):
    """Class decorator: make a policy available by ``cls.name`` (and aliases).

    Registering a name again replaces the earlier policy, so a notebook cell can be
    re-run while a policy is being developed.
    """

    def add(policy_cls: type[Policy]) -> type[Policy]:
        unknown = set(policy_cls.features) - FEATURES
        if unknown:
            raise ValueError(f"policy {policy_cls.name!r} asks for unknown features {sorted(unknown)}; "
                             f"available: {sorted(FEATURES)}")
        _REGISTRY[_key(policy_cls.name)] = policy_cls
        for alias in aliases:
            _ALIASES[_key(alias)] = _key(policy_cls.name)
        return policy_cls

    return add(cls) if cls is not None else add


def score_policy(name: str, features: Iterable[str] = (), description: str = "",
                 parameters: dict | None = None) -> Callable:
    """Decorator: turn ``fn(view, **params) -> score`` into a registered policy.

    >>> @score_policy("small_first")
    ... def small_first(view):
    ...     return view.size
    """
    defaults = dict(parameters or {})

    def make(fn: Callable) -> type[ScorePolicy]:
        def score(self, view):
            return fn(view, **self.params)

        cls = type(fn.__name__, (ScorePolicy,), {
            "name": name, "features": frozenset(features),
            "description": description or (fn.__doc__ or "").strip().split("\n")[0],
            "score": score, "parameters": classmethod(lambda cls: dict(defaults)),
            "__module__": fn.__module__, "__doc__": fn.__doc__,
        })
        return register(cls)

    return make


def available_policies() -> list[str]:
    """Registered policy names, sorted."""
    return sorted(_REGISTRY)


def policy_class(name: str) -> type[Policy]:
    key = _key(name)
    key = _ALIASES.get(key, key)
    try:
        return _REGISTRY[key]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}{did_you_mean(key, [*_REGISTRY, *_ALIASES])}; available: "
                         f"{', '.join(available_policies())}") from None


def get_policy(policy: str | Policy | type[Policy], **params) -> Policy:
    """A policy instance from a name, a class or an instance (returned as is)."""
    if isinstance(policy, Policy):
        if params:
            raise TypeError("parameters go with a policy name or class, not an instance")
        return policy
    if isinstance(policy, type) and issubclass(policy, Policy):
        return policy(**params)
    if isinstance(policy, str):
        return policy_class(policy)(**params)
    raise TypeError(f"expected a policy name, class or instance, got {policy!r}")
