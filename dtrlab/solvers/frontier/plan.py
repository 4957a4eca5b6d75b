"""What one frontier computes: :class:`FrontierPlan`, a dataclass whose defaults are ``dtrlab frontier``'s."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ...runtime import DEFAULT_OVERHEAD_LIMIT
from ...suggest import did_you_mean
from ..relax import RELAX_METHODS
from ..solve import DEFAULT_TIME_LIMIT_S

STAGE_SOLVERS = ("cpsat", "milp")


@dataclass(frozen=True)
class FrontierPlan:
    """What one frontier computes. The defaults are ``dtrlab frontier``'s.

    Where to solve: ``ratios`` (fractions of the baseline peak) and ``budgets`` (bytes) are
    the sampled budgets; ``holes`` adds DTR's holes on ``policy_ratios`` (their lowest
    failing budgets).

    What to try (upper side): ``policies`` swept over ``policy_ratios`` (each one's lowest
    passing budget is a real run); the stage model optimized at the samples (``solver``,
    recompute chains up to ``chain``), then at most ``stage_probes`` feasibility probes
    bisecting below the best real run (``probe_solver``, then the other on "unknown"); the
    interval model at the samples with ``interval_samples`` and in at most
    ``interval_probes`` probes below the best real run (its "infeasible" is no proof).
    ``dtr`` also runs DTR at every solved budget (a real run too, when it passes).

    What to prove (lower side): the relaxation (``relax_method`` "lp" or "mip") at the
    samples, and its largest infeasible budget, found to ``resolution`` x peak by
    galloping up from the footprint bound and bisecting; then at most ``mip_probes`` probes
    of the 0/1 relaxation between that proof and the upper side. ``bisect=False`` solves
    the samples only.

    Limits: ``overhead_limit`` (the simulator's thrash limit, for every model and run),
    ``time_limit_s`` per stage-model solve, ``relax_time_limit_s`` per relaxation solve
    (None: 4x ``time_limit_s``), ``interval_time_limit_s`` per interval solve (None:
    ``time_limit_s``). A wall-clock limit decides only how far a solve gets, never what
    a finished solve proves.
    """

    ratios: tuple[float, ...] = (0.6, 0.8, 1.0)
    budgets: tuple[int, ...] = ()
    holes: bool = False
    policies: tuple[str, ...] = ("dtr",)
    policy_ratios: str | tuple[float, ...] = "0.05:1.0:0.005"
    solver: str = "milp"
    probe_solver: str = "cpsat"
    stage_probes: int = 3
    chain: int = 3
    interval_samples: bool = False
    interval_probes: int = 0
    dtr: bool = True
    relax_method: str = "lp"
    mip_probes: int = 0
    resolution: float = 0.01
    bisect: bool = True
    overhead_limit: float = DEFAULT_OVERHEAD_LIMIT
    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    relax_time_limit_s: float | None = None
    interval_time_limit_s: float | None = None

    def __post_init__(self):
        for name in ("ratios", "budgets", "policies"):
            value = getattr(self, name)
            if isinstance(value, (str, bytes)) and name != "policies":
                raise PlanError(name, f"must be a list, got {value!r}")
            object.__setattr__(self, name, tuple([value] if isinstance(value, str) else value))
        if not isinstance(self.policy_ratios, str):
            object.__setattr__(self, "policy_ratios", tuple(self.policy_ratios))
        for name in ("holes", "interval_samples", "dtr", "bisect"):
            if not isinstance(getattr(self, name), bool):
                raise PlanError(name, f"must be true or false, got {getattr(self, name)!r}")
        for name in ("stage_probes", "interval_probes", "mip_probes"):
            _require(name, getattr(self, name), int, lambda v: v >= 0, "a whole number >= 0")
        _require("chain", self.chain, int, lambda v: v >= 1,
                 "a whole number >= 1 (the longest recompute chain of the stage model)")
        for ratio in self.ratios:
            _require("ratios", ratio, float, lambda v: v > 0, "positive finite fractions of the peak")
        for budget in self.budgets:
            _require("budgets", budget, int, lambda v: v > 0, "positive whole numbers of bytes")
        self.policy_grid()  # checks policy_ratios
        _require("resolution", self.resolution, float, lambda v: 0 < v < 1,
                 "a fraction of the peak in (0, 1), e.g. 0.01")
        _require("overhead_limit", self.overhead_limit, float, lambda v: v >= 1,
                 "a finite number >= 1 (2.0 allows as much recompute as compute)")
        for name in ("time_limit_s", "relax_time_limit_s", "interval_time_limit_s"):
            if name == "time_limit_s" or getattr(self, name) is not None:
                _require(name, getattr(self, name), float, lambda v: v > 0, "a positive finite number of seconds")
        if self.relax_method not in RELAX_METHODS:
            raise PlanError("relax_method", f"must be one of {', '.join(RELAX_METHODS)}, got {self.relax_method!r}"
                            + did_you_mean(self.relax_method, RELAX_METHODS))
        for name in ("solver", "probe_solver"):
            if getattr(self, name) not in STAGE_SOLVERS:
                raise PlanError(name, f"must be a stage-model solver, one of {', '.join(STAGE_SOLVERS)}, got "
                                f"{getattr(self, name)!r} (the interval model runs with interval_samples and "
                                "interval_probes)"
                                f"{did_you_mean(getattr(self, name), STAGE_SOLVERS)}")

    def policy_grid(self) -> list[float]:
        """``policy_ratios`` as a list of ratios (it may be a range "START:STOP:STEP")."""
        from ...sweep.budget_sweep import parse_ratios

        try:
            grid = parse_ratios(self.policy_ratios)
        except (ValueError, OverflowError) as error:
            raise PlanError("policy_ratios", f"must be a list of ratios or START:STOP:STEP: {error}") from None
        if not all(math.isfinite(r) for r in grid):
            raise PlanError("policy_ratios", f"must be finite, got {self.policy_ratios!r}")
        return grid

    @property
    def relax_limit_s(self) -> float:
        return self.relax_time_limit_s or 4 * self.time_limit_s

    @property
    def interval_limit_s(self) -> float:
        return self.interval_time_limit_s or self.time_limit_s

    def to_dict(self) -> dict:
        """The plan as JSON-ready fields (what :meth:`from_dict` and ``--plan FILE`` read)."""
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
                for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, fields: dict, base: FrontierPlan | None = None) -> FrontierPlan:
        """``base`` (default: the defaults) with ``fields`` replaced; an unknown field is a
        :class:`PlanError` with a suggestion."""
        if not isinstance(fields, dict):
            raise PlanError(None, f"a plan is a JSON object of fields, got {type(fields).__name__}")
        known = [f.name for f in dataclasses.fields(cls)]
        for name in fields:
            if name not in known:
                raise PlanError(name, "is not a plan field" + (did_you_mean(name, known)
                                                               or f" (the fields: {', '.join(known)})"))
        return dataclasses.replace(base or cls(), **fields)


class PlanError(ValueError):
    """A plan field with a bad value; ``field`` names it (None: the plan as a whole)."""

    def __init__(self, field_name: str | None, problem: str):
        self.field, self.problem = field_name, problem
        super().__init__(problem if field_name is None else f"{field_name} {problem}")


def _require(name: str, value, kind: type, ok, what: str) -> None:
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not numeric or (kind is int and not float(value).is_integer()) or not math.isfinite(value) or not ok(value):
        raise PlanError(name, f"must be {what}, got {value!r}")
