"""Search outputs: the shipped policies file and the held-out comparison."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

from ..policies.searched import POLICIES_FORMAT, POLICIES_VERSION, SHIPPED_POLICIES, policies_digest
from ..runtime import REFERENCE, Semantics
from ..sweep.execution import QUIET, Execution
from .evaluate import SEARCH_RATIOS, evaluate

#: Shipped search results of a source checkout (the study, its tables, the policies file).
SHIPPED_SEARCH = SHIPPED_POLICIES.parent


def export_policies(study, path: str | os.PathLike = SHIPPED_POLICIES, top: int = 3) -> dict:
    """Write the ``top`` Pareto trials (best objective first) as ``searched_1..top`` to ``path``.

    The file is what :mod:`dtrlab.policies.searched` registers at import.
    """
    from .study import pareto_table

    pareto = pareto_table(study).head(top)
    policies = []
    for rank, row in enumerate(pareto.itertuples(index=False), start=1):
        trial = study.trials[row.trial]
        params = {**trial.params, "arithmetic": "float64"}
        policies.append({"name": f"searched_{rank}", "trial": trial.number, "params": params,
                         "tuning": {"holes": int(row.holes), "threshold": float(row.threshold),
                                    "overhead": float(row.overhead)}})
    document = {"format": POLICIES_FORMAT, "version": POLICIES_VERSION, "study": study.study_name,
                "tuning_traces": study.user_attrs.get("tuning_traces"), "ratios": study.user_attrs.get("ratios"),
                "policies": policies, "sha256": policies_digest(policies)}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    return document


def compare(policies, traces, *, ratios=SEARCH_RATIOS, semantics: Semantics = REFERENCE, execution: Execution = QUIET,
            refine: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Holes, mean threshold and mean overhead of each policy over ``traces``.

    ``policies`` is a list, or a dict display name -> policy (a searched policy shown
    as ``searched_1`` but swept as its ``score_search`` parameters, whose sweeps the
    search has cached). Returns ``(summary, per_trace)``: one row per policy, and the
    variant-census rows (one per trace and policy); ``semantics``, ``execution`` and ``refine`` as
    in :func:`~dtrlab.search.evaluate.evaluate`.
    """
    named = policies.items() if isinstance(policies, dict) else [(None, p) for p in policies]
    rows, tables = [], []
    for name, policy in named:
        result = evaluate(policy, traces, ratios=ratios, semantics=semantics, execution=execution, refine=refine)
        shown = name or result.policy
        rows.append({**result.as_dict(), "policy": shown, "traces": len(result.table)})
        tables.append(result.table.assign(policy=shown))
    return pd.DataFrame(rows), pd.concat(tables, ignore_index=True)
