"""Eviction policies: the interface, the registry and the built-in policies.

Policies that simulate to decide (``monotone``) live above the runtime, in
:mod:`dtrlab.calibrated`, and register their names here when imported.
"""

from .base import (FEATURES, CandidateView, NotCompiled, Policy, ScorePolicy, SpecBuild, available_policies,
                   get_policy, policy_class, register, score_policy)
from . import builtin  # noqa: F401  (registers the built-in policies)
from .builtin import DTR, LRU, MSPS, DTREqClass, DTRLocal, LargestStorage, RandomStorage
from .ablations import ABLATIONS, Ablation  # registers simrd's 16 ablations
from .variants import VARIANTS, ScoreFamily  # registers the h_DTR score variants
from .twophase import TwoPhase
from .coop import Coop, DTRFit  # address-aware: they need an address-aware memory model
from .searched import SEARCHED, ScoreSearch  # the search space and the searched policies

__all__ = [
    "FEATURES", "CandidateView", "NotCompiled", "Policy", "ScorePolicy", "SpecBuild", "available_policies",
    "get_policy", "policy_class", "register", "score_policy", "DTR", "DTREqClass", "DTRLocal", "MSPS", "LRU", "LargestStorage", "RandomStorage",
    "ABLATIONS", "Ablation", "VARIANTS", "ScoreFamily", "TwoPhase", "Coop", "DTRFit", "SEARCHED",
    "ScoreSearch",
]
