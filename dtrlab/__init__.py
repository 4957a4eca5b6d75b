"""dtrlab: study memory-budgeted training with Dynamic Tensor Rematerialization."""

from .version import __version__
from .policies import available_policies, get_policy, register, score_policy
from .runtime import Intervention, RunResult, Semantics, baseline, simulate
from .trace import Trace, load, load_log
from . import calibrated  # noqa: F401  (registers monotone; every import of a dtrlab module runs this file first)

__all__ = ["__version__", "available_policies", "get_policy", "register", "score_policy", "Intervention",
           "RunResult", "Semantics", "Execution", "baseline", "simulate", "sweep", "Trace", "load", "load_log",
           "fit_knob"]
# dtrlab.compile (torch.compile at the knob that fits a byte budget) is left out of __all__: a star import
# would shadow the builtin compile.


def __getattr__(name):
    # dtrlab.sweep (callable: dtrlab.sweep(trace, policy, ratios=...)) needs pandas;
    # import it on first use so that `import dtrlab` stays light for the simulator alone.
    if name == "sweep":
        import importlib

        return importlib.import_module(".sweep", __name__)
    if name in ("fit_knob", "compile"):  # torch.compile's knob for a byte budget: needs torch
        from .analysis import fit_knob, knob_compile

        return fit_knob.fit_knob if name == "fit_knob" else knob_compile.compile
    if name == "Execution":
        from .sweep.execution import Execution

        return Execution
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
