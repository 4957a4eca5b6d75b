"""The policy-search space and the policies the search found.

``score_search`` extends :class:`~dtrlab.policies.variants.ScoreFamily` by one
feature, the number ``n`` of evicted storages adjacent to a candidate:

    h = cost^a / (size^b x (staleness + stale_offset)^c) x (1 + n)^d

With ``d > 0`` a candidate whose eviction would grow an evicted neighbourhood (and so
every later rematerialization chain through it) is kept longer; ``d = 0`` is the
score family itself and does not compute ``n``.

The searched policies (``searched_1``, ...) are registered from the shipped results
``results/shipped/search/policies.json`` (written by :func:`dtrlab.search.export_policies`):
the file is checked (format, version and a sha256 of its policy list) and every
parameter set is validated by building the policy, so a registered name always
means the parameters the search reported.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from .base import register
from .variants import ScoreFamily

#: The shipped search results of a source checkout.
SHIPPED_POLICIES = Path(__file__).resolve().parents[2] / "results" / "shipped" / "search" / "policies.json"
POLICIES_FORMAT = "dtrlab-searched-policies"
POLICIES_VERSION = 1


@register
class ScoreSearch(ScoreFamily):
    """score_family x (1 + evicted neighbours)^d: the policy-search space."""

    name = "score_search"

    @classmethod
    def parameters(cls):
        return {**ScoreFamily.parameters(), "d": 0}

    def __init__(self, **params):
        super().__init__(**params)
        d = self.params["d"]
        if not (isinstance(d, (int, float)) and d >= 0):
            raise ValueError(f"d (the evicted-neighbour exponent) must be a number >= 0, got {d!r}")
        if d:
            family_score = self.score_of

            def score_of(sim, s):
                return family_score(sim, s) * (1 + len(sim.evicted_neighbours(s))) ** d

            self.score_of = self._core_score = score_of
            self._core_formula = dataclasses.replace(self._core_formula, d=d)


def policies_digest(policies: list[dict]) -> str:
    """sha256 of the canonical JSON of a policy list (the check stored beside it)."""
    return hashlib.sha256(json.dumps(policies, sort_keys=True).encode()).hexdigest()


def load_searched(path: str | Path = SHIPPED_POLICIES) -> dict[str, type[ScoreSearch]]:
    """Register every policy of a search-results file; returns name -> class.

    Raises ``ValueError`` when the file is not a valid results file.
    """
    document = json.loads(Path(path).read_text())
    if document.get("format") != POLICIES_FORMAT or document.get("version") != POLICIES_VERSION:
        raise ValueError(f"{path} is not a version-{POLICIES_VERSION} {POLICIES_FORMAT} file")
    policies = document["policies"]
    if document.get("sha256") != policies_digest(policies):
        raise ValueError(f"{path}: the policy list does not match its sha256 (edited by hand?)")
    registered = {}
    for entry in policies:
        if not entry["name"].isidentifier():
            raise ValueError(f"{path}: policy name {entry['name']!r} is not an identifier")
        params = {**ScoreSearch.parameters(), **entry["params"]}
        ScoreSearch(**params)  # validates the parameters
        doc = (f"Found by the policy search (study {document.get('study')!r}, trial {entry.get('trial')}): "
               f"score_search with {entry['params']}.")
        registered[entry["name"]] = register(_searched_class(entry["name"], params, doc))
    return registered


def _searched_class(name: str, params: dict, doc: str) -> type[ScoreSearch]:
    """A ScoreSearch subclass whose defaults are one searched parameter set."""
    return type(f"Searched_{name}", (ScoreSearch,), {
        "name": name, "description": doc, "__doc__": doc, "__module__": __name__,
        "parameters": classmethod(lambda cls, params=params: dict(params)), "__reduce__": _reduce_searched,
    })


def _reduce_searched(policy: ScoreSearch):
    # Pickled by value: a worker process may not have loaded the same results file.
    return _rebuild_searched, (policy.name, type(policy).parameters(), policy.description, policy.params)


def _rebuild_searched(name: str, class_params: dict, doc: str, params: dict) -> ScoreSearch:
    return _searched_class(name, class_params, doc)(**params)


SEARCHED = load_searched() if SHIPPED_POLICIES.exists() else {}
