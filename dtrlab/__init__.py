"""dtrlab: study memory-budgeted training with Dynamic Tensor Rematerialization."""

__version__ = "0.1.0"

from .policies import available_policies, get_policy, register, score_policy  # noqa: E402
from .runtime import Intervention, RunResult, baseline, simulate  # noqa: E402
from .trace import Trace, load, load_log  # noqa: E402

__all__ = ["__version__", "available_policies", "get_policy", "register", "score_policy", "Intervention",
           "RunResult", "baseline", "simulate", "Trace", "load", "load_log"]
