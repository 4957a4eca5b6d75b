"""The relaxation (dtrlab.solvers.relax): hand-derived bounds on hand-built graphs, and its
soundness claim checked directly: every passing run of DTR and of the zoo maps into it
(each row holds for the run's image), so its bound is at most the run's compute."""

import math
from pathlib import Path

import pytest
from dtrlab.runtime.semantics import Semantics

pytest.importorskip("highspy", reason="the relaxation needs the optional extra: pip install 'dtrlab[solvers]'")

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from dtrlab.runtime import baseline, simulate  # noqa: E402
from dtrlab.solvers import build_problem  # noqa: E402
from dtrlab.solvers import relax  # noqa: E402
from dtrlab.solvers.relax import (RelaxationTooLarge, build_relaxation, run_point, solve_relaxation,  # noqa: E402
                                  violations)
from dtrlab.trace import load_log  # noqa: E402
from test_properties import random_logs  # noqa: E402
from test_solvers import EXACT, HAND_DERIVED, chain, diamond, multi_output, random_budgets, unet  # noqa: E402

TRACES = Path(__file__).resolve().parent.parent / "traces"
POLICIES = ["dtr", "dtr_eq_class", "dtr_local", "lru", "msps", "twophase"]
# The relaxation does not count view recomputation: the U-Net's view (cost 1) drops out.
VIEW_COST = {chain: 0, diamond: 0, unet: 1, multi_output: 0}


@pytest.mark.parametrize("graph", list(HAND_DERIVED), ids=lambda g: g.__name__)
def test_mip_relaxation_reaches_the_hand_derived_optimum(graph):
    """On these graphs the 0/1 relaxation is exact (less the views' cost): the only way to
    fit below ``free_from`` is the recomputation derived by hand in test_solvers."""
    trace = graph()
    minimal, free_from, recompute = HAND_DERIVED[graph]
    problem = build_problem(trace, chain=None)
    below = solve_relaxation(problem, minimal - 1, method="mip", **EXACT)
    assert below.status == "infeasible" and "lower bound" in below.message
    for budget, expected in [(minimal, recompute - VIEW_COST[graph]), (free_from - 1, recompute - VIEW_COST[graph]),
                             (free_from, 0), (free_from + 20, 0)]:
        result = solve_relaxation(problem, budget, method="mip", **EXACT)
        assert result.status == "bound", budget
        assert result.bound == pytest.approx(trace.model_compute + expected), budget
        lp = solve_relaxation(problem, budget, method="lp", **EXACT)
        assert lp.status == "bound" and lp.bound <= result.bound + 1e-6


def test_lp_bound_on_the_chain_is_the_hand_derived_fraction():
    """Chain (compute 10): at b2 the budget leaves B - 40 bytes for a1 (10 bytes), so the LP
    keeps a fraction (B - 40) / 10 of it and recomputes the rest of f1 (cost 5) for b1:
    bound 10 + 5 (50 - B) / 10 for 40 <= B <= 50, and 10 from 50 on."""
    problem = build_problem(chain(), chain=None)
    for budget in range(40, 56):
        expected = 10 + 5 * max(0, 50 - budget) / 10
        assert solve_relaxation(problem, budget, **EXACT).bound == pytest.approx(expected), budget


def test_overhead_limit_proves_budgets_infeasible():
    """With overhead limit 1.4 the chain may recompute floor(10 x 0.3999...) = 3 units: the
    simulator's thrash check compares with 10 x (1.4 - 1), which is just below 4 in floating
    point (recompute_allowance). Below 50 bytes every run recomputes f1 (5): the 0/1
    relaxation proves all of 40..49 infeasible; the LP, which recomputes 5 (50 - B) / 10,
    only up to 43 (from 44 on its fraction is at most 3)."""
    from dtrlab.runtime import recompute_allowance
    assert recompute_allowance(10, 1.4) == 3 and recompute_allowance(10, 1.45) == 4
    problem = build_problem(chain(), chain=None)
    for budget in range(40, 52):
        mip = solve_relaxation(problem, budget, overhead_limit=1.4, method="mip", **EXACT)
        lp = solve_relaxation(problem, budget, overhead_limit=1.4, method="lp", **EXACT)
        assert mip.status == ("infeasible" if budget < 50 else "bound"), budget
        assert lp.status == ("infeasible" if budget < 44 else "bound"), budget
        assert simulate(chain(), "dtr", budget_bytes=budget,
                        semantics=Semantics(overhead_limit=1.4)).passed == (budget >= 50)


def _check_runs_map_in(trace, budgets, policies=POLICIES, solve=True, time_limit_s=math.inf):
    """Every passing run's image satisfies every row of the relaxation; its bound <= the run's compute.
    With a finite ``time_limit_s`` only what the solve proves is checked: a bound, if it finds one,
    is at most the runs' compute, and it never claims infeasibility (the runs pass)."""
    problem = build_problem(trace, chain=None)
    passed = 0
    for budget in budgets:
        if budget < problem.lower_bound():
            continue
        model = build_relaxation(problem, budget, problem.base_compute)  # overhead limit 2.0
        runs = []
        for policy in policies:
            status, recompute, values = run_point(problem, model, policy, budget)
            if status != "pass":
                continue
            passed += 1
            broken = violations(model, values, tolerance=1e-7)
            assert not broken, (trace.name, policy, budget, broken[:3])
            claimed = sum(cost * value for cost, value in zip(model.cost, values))
            assert claimed <= recompute, (policy, budget)
            runs.append(recompute)
        if solve and runs:
            result = solve_relaxation(problem, budget, time_limit_s=time_limit_s, workers=1, check_policies=())
            assert result.status == "bound" or (result.status == "unknown" and math.isfinite(time_limit_s)), budget
            if result.status == "bound":
                assert result.bound <= problem.base_compute + min(runs) + 1e-6 * problem.base_compute, budget
    return passed


@pytest.mark.parametrize("graph", list(HAND_DERIVED), ids=lambda g: g.__name__)
def test_every_passing_run_maps_into_the_relaxation_on_hand_built_graphs(graph):
    minimal, free_from, _ = HAND_DERIVED[graph]
    assert _check_runs_map_in(graph(), range(minimal, free_from + 12)) > 0


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(log=random_logs(), fractions=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=3))
def test_every_passing_run_maps_into_the_relaxation_on_random_traces(log, fractions):
    _check_runs_map_in(*random_budgets(log, fractions))


def test_dtr_and_the_zoo_map_into_the_relaxation_on_the_shipped_unet():
    """The shipped U-Net: DTR's and two-phase's passing runs satisfy every row (no solve)."""
    trace = load_log(TRACES / "unet-b2.jsonl.gz")
    peak = baseline(trace).peak_memory
    assert _check_runs_map_in(trace, [int(peak * r) for r in (0.75, 0.9)], policies=["dtr", "twophase"],
                              solve=False) >= 2


@pytest.mark.slow
def test_the_lp_bound_on_the_shipped_unet_is_below_dtr():
    """The shipped U-Net's LP (93,000 variables, about 10 s of CPU): its bound, when the solve
    finds one within the time limit, is at most DTR's compute, and it never claims infeasible."""
    trace = load_log(TRACES / "unet-b2.jsonl.gz")
    peak = baseline(trace).peak_memory
    assert _check_runs_map_in(trace, [int(peak * 0.75)], policies=["dtr"], time_limit_s=120) == 1


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet32-b8", "transformer-b4"])
def test_dtr_maps_into_the_relaxation_on_shipped_traces(name):
    """Row check only (no solve): DTR's runs near its threshold satisfy every row."""
    trace = load_log(TRACES / f"{name}.jsonl.gz")
    peak = baseline(trace).peak_memory
    assert _check_runs_map_in(trace, [int(peak * r) for r in (0.72, 0.85, 1.0)], policies=["dtr"], solve=False) >= 2


def test_bad_input_is_a_clear_error(monkeypatch):
    trace = chain()
    with pytest.raises(ValueError, match="lp, mip"):
        solve_relaxation(trace, 45, method="simplex")
    with pytest.raises(ValueError, match="overhead_limit"):
        solve_relaxation(trace, 45, overhead_limit=0.5)
    with pytest.raises(ValueError, match="chain=None"):
        solve_relaxation(build_problem(trace, chain=3), 45)
    result = solve_relaxation(trace, 5)
    assert result.status == "infeasible" and "below the lower bound 40" in result.message
    monkeypatch.setattr(relax, "MAX_NEED_PAIRS", 3)
    with pytest.raises(RelaxationTooLarge, match="need stage"):
        solve_relaxation(trace, 45)
