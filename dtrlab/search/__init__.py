"""Policy search: Optuna over the ``score_search`` space, on the sweep engine.

:func:`run_search` tunes on one set of traces (resumable SQLite storage);
:func:`compare` reports policies on another; :func:`export_policies` writes the
file from which the best policies are registered (``searched_1``, ...);
:func:`read_shipped_csv` reads the shipped results (``dtrlab ship search`` writes them). See
docs/policies.md ("Policy search").
"""

from .evaluate import SEARCH_RATIOS, Evaluation, evaluate, objective_value
from .report import SHIPPED_SEARCH, compare, export_policies
from .shipped import read_shipped_csv
from .space import DTR_POINT, SPACE, make_policy, suggest
from .study import PARETO_COLUMNS, SearchResult, open_study, pareto_table, run_search, trials_table

__all__ = ["SEARCH_RATIOS", "Evaluation", "evaluate", "objective_value", "SHIPPED_SEARCH", "compare",
           "export_policies", "read_shipped_csv", "DTR_POINT", "SPACE", "make_policy", "suggest", "PARETO_COLUMNS",
           "SearchResult", "open_study", "pareto_table", "run_search", "trials_table"]
