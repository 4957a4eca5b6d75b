"""dtrlab: study memory-budgeted training with Dynamic Tensor Rematerialization."""

__version__ = "0.1.0"

from .policies import available_policies, get_policy, register, score_policy  # noqa: E402
from .runtime import Intervention, RunResult, baseline, simulate  # noqa: E402
from .trace import Trace, load, load_log  # noqa: E402

__all__ = ["__version__", "available_policies", "get_policy", "register", "score_policy", "Intervention",
           "RunResult", "baseline", "simulate", "sweep", "Trace", "load", "load_log"]


def __getattr__(name):
    # dtrlab.sweep (callable: dtrlab.sweep(trace, policy, ratios=...)) needs pandas;
    # import it on first use so that `import dtrlab` stays light for the simulator alone.
    if name == "sweep":
        import importlib

        return importlib.import_module(".sweep", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
