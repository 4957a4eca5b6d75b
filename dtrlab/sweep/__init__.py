"""Budget sweeps: many simulations of one trace, parallel (loky or Dask) and cached.

The package is callable: ``dtrlab.sweep(trace, "dtr", ratios="0.05:1.0:0.005")`` is
``dtrlab.sweep.sweep(...)``.
"""

import sys
import types

from .budget_sweep import COLUMNS, parse_ratios, sweep
from .cache import SweepCache, default_cache_dir
from .execution import QUIET, SERIAL, Execution
from .engine import BACKENDS, RunSpec, iter_runs, run_many

__all__ = ["BACKENDS", "COLUMNS", "Execution", "QUIET", "RunSpec", "SERIAL", "SweepCache", "default_cache_dir",
           "iter_runs", "parse_ratios",
           "run_many", "sweep"]


class _CallableModule(types.ModuleType):
    """Lets ``dtrlab.sweep(...)`` call :func:`sweep` while this stays a package."""

    def __call__(self, *args, **kwargs):
        return sweep(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
