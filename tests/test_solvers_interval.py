"""The interval formulation (dtrlab.solvers.interval): a hand-derived graph where evicting
inside a gap matters, DTR's own runs as points of the model, and replay of its schedules.

The hand-built graphs of test_solvers.py run through every solver there (interval included).
"""

import math
from pathlib import Path

import pytest

pytest.importorskip("ortools", reason="the interval model needs the optional extra: pip install 'dtrlab[solvers]'")

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from dtrlab.runtime import baseline, simulate  # noqa: E402
from dtrlab.solvers import build_problem, replay, solve_optimal  # noqa: E402
from dtrlab.solvers import interval  # noqa: E402
from dtrlab.solvers.hint import interval_hint, policy_run  # noqa: E402
from dtrlab.solvers.interval import build_interval_model, solve_interval  # noqa: E402
from dtrlab.trace import load_log  # noqa: E402
from test_properties import random_logs  # noqa: E402
from test_solvers import EXACT, chain_log, random_budgets  # noqa: E402

TRACES = Path(__file__).resolve().parent.parent / "traces"


def deep_chain():
    """Four forward layers a1..a4 (10 bytes each; cost 1, 2, 4, 8) and their backward
    (test_solvers.chain_log's shape).

    b3, b2 and b1 each need 40 bytes with x (the lower bound), so at 40 nothing else is
    resident at b3: a2 (for b2) and a1 (for b1) must come back after it. Before b2, a1 is
    recomputed (30 bytes), then a2 (40), then a1 is evicted: b2 has no room for it. Before
    b1, a1 is recomputed again. Keeping a3 through b4 (40) saves recomputing it: 1 + 2 + 1
    = 4 for budgets 40..49, and a1 is computed three times. The stage model holds a1 through
    b2 (50 bytes): infeasible below 50. From 50, a2 can stay (b3 at 50) and only a1 comes
    back for b1: 1 for budgets 50..59; from 60 (a1 and a2 held at b3) nothing.
    """
    return chain_log((1, 2, 4, 8)).trace("deep_chain")


@pytest.mark.parametrize("budget, recompute", [(40, 4), (45, 4), (49, 4), (50, 1), (59, 1), (60, 0)])
def test_interval_model_reaches_the_hand_derived_optimum(budget, recompute):
    trace = deep_chain()
    assert build_problem(trace).lower_bound() == 40
    result = solve_optimal(trace, budget, solver="interval", copies=3, **EXACT)
    assert result.status == "optimal" and result.remat_compute == recompute, result
    check = replay(trace, result)
    assert check.passed, check.summary()
    assert check.peak_memory <= budget
    if budget < 50:
        # Evictions between recomputations are what the stage model cannot express.
        assert any(len(evicted) for gap in result.schedule.evictions for evicted in gap[:-1])
        for solver in ("milp", "cpsat"):
            assert solve_optimal(trace, budget, solver=solver, **EXACT).status == "infeasible"
    else:
        assert solve_optimal(trace, budget, solver="milp", **EXACT).remat_compute == recompute


def test_the_copies_bound_is_the_models_own():
    """At 40, a1 must be computed three times: with two copies the model has no schedule,
    and says which bounds its "infeasible" is relative to."""
    result = solve_optimal(deep_chain(), 40, solver="interval", copies=2, hint=False, **EXACT)
    assert result.status == "infeasible"
    assert "at most 2 computations per operator" in result.message
    # DTR passes at 40 (recompute 4, computing a1 three times); from its run the model
    # raises the bound for a1, so the model holds DTR's run and finds the optimum again.
    assert simulate(deep_chain(), "dtr", budget_bytes=40).remat_compute == 4
    result = solve_optimal(deep_chain(), 40, solver="interval", copies=2, **EXACT)
    assert result.status == "optimal" and result.remat_compute == 4


def _dtr_run_is_a_point(trace, budget: int) -> bool:
    """DTR's passing run, fixed into the interval model (every start, end and presence), is
    feasible there with DTR's recompute: the model admits what the simulator really did."""
    problem = build_problem(trace, chain=None)
    limit = problem.base_compute  # overhead limit 2.0
    run = policy_run(problem, budget, limit, "dtr")
    if run is None:
        return False
    model = build_interval_model(problem, budget, limit, min_copies=run.copies, min_slots=run.recomputations)
    hints = interval_hint(model, run)
    assert hints is not None
    for var, value in hints:
        model.cp.Add(var == value)
    status, schedule, recompute, _ = solve_interval(model, math.inf, 1, True, hints)  # every variable fixed
    assert status == "feasible", (trace.name, budget)
    assert recompute == simulate(trace, "dtr", budget_bytes=budget).remat_compute
    assert replay(problem, schedule, budget).passed
    return True


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(log=random_logs(), fractions=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=3))
def test_dtr_runs_are_points_of_the_interval_model_on_random_traces(log, fractions):
    trace, budgets = random_budgets(log, fractions)
    for budget in budgets:
        _dtr_run_is_a_point(trace, budget)


def test_dtr_runs_are_points_of_the_interval_model_on_the_shipped_unet():
    trace = load_log(TRACES / "unet-b2.jsonl.gz")
    peak = baseline(trace).peak_memory
    assert sum(_dtr_run_is_a_point(trace, int(peak * r)) for r in (0.72, 0.8, 0.9)) == 3


@pytest.mark.slow
@pytest.mark.parametrize("name", ["transformer-b4", "resnet32-b8"])
def test_dtr_runs_are_points_of_the_interval_model_on_shipped_traces(name):
    trace = load_log(TRACES / f"{name}.jsonl.gz")
    peak = baseline(trace).peak_memory
    assert sum(_dtr_run_is_a_point(trace, int(peak * r)) for r in (0.75, 0.9)) >= 1


def test_schedules_where_dtr_passes_cost_no_more_than_dtr():
    """The shipped U-Net at 0.8: the interval model starts from DTR's run, so its schedule
    costs at most DTR's compute (when the time runs out, DTR's run itself is returned, so
    this holds at any machine speed: a 3 s limit, one worker)."""
    trace = load_log(TRACES / "unet-b2.jsonl.gz")
    budget = int(baseline(trace).peak_memory * 0.8)
    result = solve_optimal(trace, budget, solver="interval", time_limit_s=3, workers=1)
    assert result.schedule is not None and replay(trace, result).passed
    assert result.objective + 1 <= simulate(trace, "dtr", budget_bytes=budget).clock


@pytest.mark.slow
def test_a_schedule_below_dtrs_threshold_replays():
    """Below DTR's threshold (0.695) on the shipped U-Net a schedule, if the time-limited
    search finds one, replays (found in about 20 s at 0.62 on a 2-core machine)."""
    trace = load_log(TRACES / "unet-b2.jsonl.gz")
    below = int(baseline(trace).peak_memory * 0.65)
    assert not simulate(trace, "dtr", budget_bytes=below).passed
    found = solve_optimal(trace, below, solver="interval", time_limit_s=25, feasibility_only=True)
    assert found.status in ("feasible", "unknown")  # a time limit, not a proof either way
    if found.schedule is not None:
        assert replay(trace, found).passed


def test_bad_input_is_a_clear_error(monkeypatch):
    trace = deep_chain()
    with pytest.raises(ValueError, match="copies must be >= 1"):
        solve_optimal(trace, 40, solver="interval", copies=0)
    monkeypatch.setattr(interval, "MAX_INTERVAL_PAIRS", 3)
    result = solve_optimal(trace, 45, solver="interval")
    assert result.status == "unknown" and "the interval model is not built" in result.message


@pytest.mark.slow
def test_every_interval_schedule_replays_on_the_shipped_traces():
    """Every shipped trace the interval model is built for, at three budgets: each schedule it
    returns passes in the simulator (feasibility solves of at most 5 s each); the others are
    answered "unknown" with the reason."""
    from dtrlab.trace import load_directory
    built = 0
    for name, trace in load_directory(TRACES).items():
        peak = baseline(trace).peak_memory
        replayed = 0
        for ratio in (0.8, 0.9, 1.0):
            result = solve_optimal(trace, int(peak * ratio), solver="interval", time_limit_s=5, feasibility_only=True)
            if "not built" in result.message:
                assert result.status == "unknown" and result.schedule is None
                break
            if result.schedule is not None:
                check = replay(trace, result)
                assert check.passed, (name, ratio, check.summary())
                replayed += 1
        else:
            built += 1
            assert replayed >= 2, name
    assert built >= 4  # U-Net, ResNet-32, Transformer, DenseNet-45


def test_the_hint_is_the_passing_run_with_least_recompute():
    """best_run picks, among the given policies, the passing run with the least recompute;
    a failing policy is skipped."""
    from dtrlab.solvers.hint import best_run
    trace = deep_chain()
    problem = build_problem(trace, chain=None)
    runs = {p: simulate(trace, p, budget_bytes=45) for p in ("dtr", "lru", "msps")}
    chosen = best_run(problem, 45, problem.base_compute, tuple(runs))
    assert chosen.remat_compute == min(r.remat_compute for r in runs.values() if r.passed)
    assert runs[chosen.policy].remat_compute == chosen.remat_compute
    assert best_run(problem, 39, problem.base_compute, tuple(runs)) is None  # below the footprint bound
