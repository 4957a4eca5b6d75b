"""The search space: :class:`~dtrlab.policies.searched.ScoreSearch` parameters drawn from an Optuna trial.

Exponents are sampled on a 0.25 grid so that found policies have readable
parameters and near-identical trials coincide (and share the sweep cache). Every
trial uses float64 arithmetic (fractional exponents need it); the staleness offset is
0 or 1 because staleness is measured in compute units, whose scale differs between
traces by orders of magnitude, so a larger fixed offset would mean different things
on different traces.
"""

from __future__ import annotations

from ..policies import ScoreSearch

#: name -> ("categorical", choices) or ("float", low, high, step)
SPACE = {
    "cost": ("categorical", ["estar", "eqclass", "local"]),
    "a": ("float", 0.0, 2.0, 0.25),
    "b": ("float", 0.0, 2.0, 0.25),
    "c": ("float", 0.0, 2.0, 0.25),
    "stale_offset": ("categorical", [0, 1]),
    "tie_break": ("categorical", ["order", "storage_id"]),
    "d": ("float", 0.0, 2.0, 0.5),
}

#: h_DTR in float64 (= dtr_float64): the first trial of every study, the reference point.
DTR_POINT = {"cost": "estar", "a": 1.0, "b": 1.0, "c": 1.0, "stale_offset": 0, "tie_break": "order", "d": 0.0}


def suggest(trial) -> dict:
    """Draw one parameter set from ``trial`` (an ``optuna.Trial``)."""
    params = {}
    for name, (kind, *spec) in SPACE.items():
        if kind == "categorical":
            params[name] = trial.suggest_categorical(name, spec[0])
        else:
            low, high, step = spec
            params[name] = trial.suggest_float(name, low, high, step=step)
    return params


def make_policy(params: dict) -> ScoreSearch:
    """The policy of one parameter set (float64 arithmetic)."""
    return ScoreSearch(**params, arithmetic="float64")
