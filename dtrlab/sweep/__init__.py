"""Budget sweeps: many simulations of one trace, parallel (loky or Dask) and cached."""

from .engine import BACKENDS, RunSpec, iter_runs, run_many

__all__ = ["BACKENDS", "RunSpec", "iter_runs", "run_many"]
