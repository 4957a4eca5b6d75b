"""Every solver, both relaxations and every registered policy against the exhaustive search of
dtrlab/solvers/exhaustive.py (the least recompute of a tiny trace, with the simulator's semantics), and
the regressions of issue 22.

The truth ``T`` at (trace, budget, overhead limit) is the search's optimum over on-demand runs
(None: no run fits). A claim is a violation when it is better than the truth: a schedule or a
policy run recomputing less than ``T`` (or anything where ``T`` is None), a relaxation bound
above ``T``, a relaxation or footprint "infeasible" where ``T`` exists. The stage and interval
models are restrictions, so their "optimal" and "infeasible" hold within the model: HiGHS and
CP-SAT solve the same stage model and must agree. Every solve here runs without a time limit
and with one worker (``EXACT``): the verdicts do not depend on the machine's speed.
"""

import math
import os

import pytest
from dtrlab.runtime.semantics import Semantics

pytest.importorskip("ortools", reason="the exact solvers need the optional extra: pip install 'dtrlab[solvers]'")
pytest.importorskip("highspy", reason="the exact solvers need the optional extra: pip install 'dtrlab[solvers]'")

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from dtrlab.policies import available_policies, get_policy  # noqa: E402
from dtrlab.runtime import baseline, recompute_allowance, simulate  # noqa: E402
from dtrlab.solvers import SOLVERS, build_problem, checked, replay, solve_optimal  # noqa: E402
from dtrlab.solvers import relax, solve  # noqa: E402
from dtrlab.solvers.relax import RELAX_METHODS, checked_relaxation, solve_relaxation  # noqa: E402
from dtrlab.trace.builder import LogBuilder  # noqa: E402
from dtrlab.solvers.exhaustive import (  # noqa: E402
    SearchTooLarge, every_simulator_run, least_recompute, replay_witness, tiny_log)
from test_solvers import EXACT, HAND_DERIVED, chain  # noqa: E402

# The same traces on every run, so that CI's verdict is reproducible (each defect these tests found
# stays as a regression test below); DTRLAB_ORACLE_RANDOM=1 draws new traces to look for more.
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                derandomize=not os.environ.get("DTRLAB_ORACLE_RANDOM"))
# The registered policies for the simulator's flat memory (coop's need an address-aware model);
# "monotone" calibrates by simulation (seconds a run on larger traces), so it has a test of its own.
FLAT_POLICIES = [p for p in available_policies() if not getattr(get_policy(p), "address_aware", False)]
QUICK_POLICIES = [p for p in FLAT_POLICIES if p != "monotone"]


@st.composite
def tiny_cases(draw):
    """(trace, budget, overhead limit): a tiny_log, a budget from one byte below the footprint
    bound up to the peak, and a limit 1 + c / compute (the thrash allowance is then c, or c - 1
    where floating point puts compute x (limit - 1) just below c)."""
    trace = tiny_log(lambda lo, hi: draw(st.integers(lo, hi))).trace("tiny")
    lower, peak = build_problem(trace, chain=None).lower_bound(), baseline(trace).peak_memory
    budget = draw(st.integers(max(0, lower - 1), max(lower, peak)))
    compute = baseline(trace).model_compute
    limit = 1 + draw(st.integers(0, compute)) / compute if compute else 2.0
    return trace, budget, limit


def oracle_disagreements(trace, budget: int, policies=QUICK_POLICIES) -> list[str]:
    """The search against the simulator: its optimal run replays in the simulator with its
    recompute; every registered policy's passing run recomputes at least as much; at the
    peak nothing is recomputed; below the footprint bound nothing fits."""
    found = []
    truth = least_recompute(trace, budget).recompute
    if truth is not None:
        witness = replay_witness(trace, budget, least_recompute(trace, budget))
        if witness != ("pass", truth):
            found.append(f"the optimal run ({truth}) replays as {witness}")
    for policy in policies:
        run = simulate(trace, policy, budget_bytes=budget)
        if run.passed and (truth is None or run.remat_compute < truth):
            found.append(f"{policy} passes with recompute {run.remat_compute}, the search says {truth}")
    if budget >= baseline(trace).peak_memory and truth != 0:
        found.append(f"at the peak the search says {truth}")
    if budget < build_problem(trace).lower_bound() and truth is not None:
        found.append(f"below the footprint bound the search finds {truth}")
    return found


def claim_violations(trace, budget: int, limit: float, policies=None, solvers=True) -> list[str]:
    """Every claim made about (trace, budget, limit) that the truth refutes (see the module docstring)."""
    truth = least_recompute(trace, budget, limit).recompute
    base = baseline(trace).model_compute
    where = f"budget {budget}, limit {limit!r}, truth {truth}"
    found = []
    for policy in policies or QUICK_POLICIES:
        run = simulate(trace, policy, budget_bytes=budget, semantics=Semantics(overhead_limit=limit))
        if run.passed and (truth is None or run.remat_compute < truth):
            found.append(f"{policy} passes with {run.remat_compute} ({where})")
    if not solvers:
        return found
    results = {}
    for solver in SOLVERS:
        result = results[solver] = solve_optimal(trace, budget, overhead_limit=limit, solver=solver, **EXACT)
        if result.status == "unknown":
            found.append(f"{solver} ended unknown without a time limit: {result.message} ({where})")
        if result.schedule is not None:
            if truth is None or result.remat_compute < truth:
                found.append(f"{solver} claims {result.status} recompute {result.remat_compute} ({where})")
            if not replay(trace, result).passed:
                found.append(f"{solver}'s schedule fails its replay ({where})")
    milp, cpsat = results["milp"], results["cpsat"]
    if milp.status == cpsat.status == "optimal" and milp.objective != cpsat.objective:
        found.append(f"stage model optimum: milp {milp.remat_compute}, cpsat {cpsat.remat_compute} ({where})")
    if {milp.status, cpsat.status} & {"infeasible"} and {milp.status, cpsat.status} & {"optimal", "feasible"}:
        found.append(f"stage model: milp {milp.status}, cpsat {cpsat.status} ({where})")
    for method in RELAX_METHODS:  # HiGHS's own claims, without the check against DTR's run
        bound = solve_relaxation(trace, budget, overhead_limit=limit, method=method, check_policies=(), **EXACT)
        if bound.status == "infeasible" and truth is not None:
            found.append(f"{method} relaxation claims infeasible: {bound.message} ({where})")
        if bound.status == "bound" and truth is not None and bound.bound > base + truth + 1e-6 * max(1, base):
            found.append(f"{method} relaxation bound {bound.bound} above {base + truth} ({where})")
        if bound.status == "unknown" and "not a proof" not in bound.message:  # HiGHS failing is no claim
            found.append(f"{method} relaxation ended unknown without a time limit ({where})")
    if budget < build_problem(trace).lower_bound() and truth is not None:
        found.append(f"the footprint bound {build_problem(trace).lower_bound()} is above a run ({where})")
    return found


# ---------------------------------------------------------------- the search itself

@pytest.mark.parametrize("graph", list(HAND_DERIVED), ids=lambda g: g.__name__)
def test_the_search_finds_the_hand_derived_optima(graph):
    minimal, free_from, recompute = HAND_DERIVED[graph]
    trace = graph()
    for budget, expected in [(minimal - 1, None), (minimal, recompute), (free_from - 1, recompute), (free_from, 0)]:
        assert least_recompute(trace, budget).recompute == expected, budget


@settings(max_examples=8, **SETTINGS)
@given(case=tiny_cases())
def test_the_search_is_the_simulator(case):
    """Quick: the search's optimal run replays in the simulator, and no policy run beats it."""
    trace, budget, _ = case
    assert not oracle_disagreements(trace, budget)


@pytest.mark.slow
@settings(max_examples=1000, **SETTINGS)
@given(case=tiny_cases())
def test_the_search_is_the_simulator_on_many_traces(case):
    trace, budget, _ = case
    assert not oracle_disagreements(trace, budget)


@pytest.mark.slow
@settings(max_examples=100, **SETTINGS)
@given(case=tiny_cases())
def test_the_calibrated_policy_never_beats_the_search(case):
    """"monotone" (it calibrates by simulation: seconds a run on larger traces) on 100 tiny traces."""
    assert not claim_violations(*case, policies=["monotone"], solvers=False)


def check_every_simulator_run(trace, budget: int, max_runs: int) -> None:
    """No run of the simulator, under any sequence of eviction choices, beats the search."""
    from hypothesis import assume
    try:
        runs = every_simulator_run(trace, budget, max_runs=max_runs)
    except SearchTooLarge:
        assume(False)
    truth = least_recompute(trace, budget).recompute
    assert not runs or (truth is not None and truth <= min(runs)), (truth, min(runs))


@settings(max_examples=3, **SETTINGS)
@given(case=tiny_cases())
def test_no_simulator_run_beats_the_search(case):
    check_every_simulator_run(*case[:2], max_runs=300)


@pytest.mark.slow
@settings(max_examples=100, **SETTINGS)
@given(case=tiny_cases())
def test_no_simulator_run_beats_the_search_on_many_traces(case):
    check_every_simulator_run(*case[:2], max_runs=3000)


# ---------------------------------------------------------------- every claim against the truth

@settings(max_examples=5, **SETTINGS)
@given(case=tiny_cases())
def test_no_claim_beats_the_truth(case):
    """Quick: a few tiny traces, every solver, both relaxations, DTR and two-phase."""
    assert not claim_violations(*case, policies=["dtr", "twophase"])


@pytest.mark.slow
@settings(max_examples=500, **SETTINGS)
@given(case=tiny_cases())
def test_no_claim_beats_the_truth_on_many_traces(case):
    """Slow: 500 tiny traces, every solver, both relaxations and every registered policy
    for flat memory but "monotone" (tested on its own)."""
    assert not claim_violations(*case)


def bracket_violations(trace, limit: float) -> list[str]:
    """compute_frontier's bracket against the true minimal budget (the least budget the search
    fits): no proof at or above it, no real run below it, and no solver fault."""
    from dtrlab.solvers.frontier import FrontierPlan, compute_frontier
    lower, peak = build_problem(trace, chain=None).lower_bound(), baseline(trace).peak_memory
    minimal = next(b for b in range(lower, peak + 1) if least_recompute(trace, b, limit).recompute is not None)
    plan = FrontierPlan(ratios=(0.6, 0.8, 1.0), policies=("dtr", "twophase"), policy_ratios="0.3:1.0:0.05",
                        relax_method="mip", mip_probes=2, resolution=0.05, interval_samples=True, interval_probes=2,
                        time_limit_s=60.0, overhead_limit=limit)  # a time limit only widens a bracket
    frontier = compute_frontier(trace, plan, cache=False)
    found = [f"fault: {fault}" for fault in frontier.faults]
    if frontier.max_infeasible_bytes >= minimal:
        found.append(f"proof {frontier.max_infeasible_bytes} at or above the minimal budget {minimal}")
    if frontier.min_feasible_bytes is not None and frontier.min_feasible_bytes < minimal:
        found.append(f"a real run at {frontier.min_feasible_bytes} below the minimal budget {minimal}")
    return found


@settings(max_examples=2, **SETTINGS)
@given(case=tiny_cases())
def test_the_frontier_brackets_the_true_minimal_budget(case):
    trace, _, limit = case
    assert not bracket_violations(trace, limit)


@pytest.mark.slow
@settings(max_examples=100, **SETTINGS)
@given(case=tiny_cases())
def test_the_frontier_brackets_the_true_minimal_budget_on_many_traces(case):
    trace, _, limit = case
    assert not bracket_violations(trace, limit)


def test_the_frontier_brackets_a_trace_with_no_compute():
    """Every operator free: a run's overhead is undefined (0 / 0), so the frontier must take a
    policy run's recompute from the run itself, not from its overhead (it raised on NaN)."""
    log = LogBuilder()
    log.constant("x", 2)
    log.call("f0", ["x"], [("a0", 3)], time=0)
    log.call("f1", ["a0"], [("a1", 2)], time=0)
    log.backward()
    log.call("b1", ["a1"], [("g1", 2)], time=0)
    log.release("a1")
    log.call("b0", ["g1", "a0"], [("g0", 3)], time=0)
    log.release("a0", "g1")
    assert not bracket_violations(log.trace("no_compute"), 2.0)


# ---------------------------------------------------------------- the regressions of issue 22

def relaxation_reproducer():
    """HiGHS's presolve proved the 0/1 relaxation infeasible at 16 bytes, limit 1.3, where DTR
    passes with recompute 2 (the optimum) and its run satisfies every row."""
    log = LogBuilder()
    log.constant("x", 2)
    log.call("f0", ["x"], [("a0", 1)], time=2)
    log.call("f1", ["a0"], [("a1", 1), ("s1", 2)], time=8)
    log.call("f2", ["a1"], [("a2", 5)], time=3)
    log.call("f3", ["a2"], [("a3", 4)], time=4)
    log.backward()
    log.call("b3", ["a3"], [("g3", 2)], time=1)
    log.release("a3")
    log.call("b2", ["g3", "a2"], [("g2", 3)], time=5)
    log.release("g3", "a2")
    log.call("b1", ["g2", "a1", "s1"], [("g1", 5)], time=3)
    log.release("a1", "s1", "g2")
    log.call("b0", ["g1", "a0"], [("g0", 4)], time=3)
    log.release("a0", "g1")
    return log.trace("relaxation_reproducer")


def allowance_reproducer():
    """Compute 12, limit 4/3: 12 x (4/3 - 1) = 3.999999999999999, so the simulator allows 3.
    At 13 bytes every run recomputes 4: milp, handed the float, said optimal with 4 (its replay
    thrashes); the others, DTR and the truth say infeasible."""
    log = LogBuilder()
    log.constant("x", 3)
    log.call("f0", ["x"], [("a0", 3)], time=4)
    log.call("f1", ["a0"], [("a1", 4), ("s1", 3)], time=3)
    log.backward()
    log.call("b1", ["a1", "s1"], [("g1", 1)], time=3)
    log.release("a1", "s1")
    log.call("b0", ["g1", "a0"], [("g0", 6)], time=2)
    log.release("a0", "g1")
    return log.trace("allowance_reproducer")


def test_the_0_1_relaxation_agrees_with_dtrs_run():
    trace = relaxation_reproducer()
    assert least_recompute(trace, 16, 1.3).recompute == 2
    dtr = simulate(trace, "dtr", budget_bytes=16, semantics=Semantics(overhead_limit=1.3))
    assert dtr.passed and dtr.remat_compute == 2
    for checks in ((), ("dtr",)):
        result = solve_relaxation(trace, 16, overhead_limit=1.3, method="mip", check_policies=checks, **EXACT)
        assert result.status == "bound" and result.bound == pytest.approx(trace.model_compute + 2), result
    assert not claim_violations(trace, 16, 1.3, policies=["dtr"])


def presolve_reproducer():
    """Found by the slow oracle test after the first fix: at 12 bytes (peak 13), limit 11/6,
    DTR runs with recompute 0 (it rematerializes two free operators), yet HiGHS 1.16 with
    presolve proved the 0/1 relaxation infeasible; without presolve it is optimal at 0."""
    log = LogBuilder()
    log.constant("x", 1)
    log.call("f0", ["x"], [("a0", 5)], time=5)
    log.call("f1", ["a0", "a0"], [("a1", 1)], time=1)
    log.call("f2", ["a1"], [("a2", 1)], time=0)
    log.call("f3", ["a2"], [("a3", 0, 0)], time=0)
    log.mutate("m_a0", ["a0"], [0], time=0)
    log.backward()
    log.call("b3", ["a3"], [("g3", 1)], time=0)
    log.release("a3")
    log.call("b2", ["g3", "a2"], [("g2", 1)], time=0)
    log.release("a2")
    log.call("b1", ["g2", "a1"], [("g1", 1)], time=0)
    log.release("a1")
    log.call("b0", ["g1", "a0"], [("g0", 1)], time=0)
    log.release("a0")
    log.release("g0")
    return log.trace("presolve_reproducer")


def test_an_infeasibility_found_with_presolve_is_confirmed_without_it():
    trace, limit = presolve_reproducer(), 1 + 5 / 6
    assert least_recompute(trace, 12, limit).recompute == 0
    assert simulate(trace, "dtr", budget_bytes=12, semantics=Semantics(overhead_limit=limit)).remat_compute == 0
    for method in RELAX_METHODS:
        result = solve_relaxation(trace, 12, overhead_limit=limit, method=method, check_policies=(), **EXACT)
        assert result.status == "bound" and result.bound == pytest.approx(trace.model_compute), (method, result)
    assert not claim_violations(trace, 12, limit, policies=["dtr"])


def test_a_relaxation_claim_a_run_refutes_is_a_solver_fault(monkeypatch):
    """Whatever HiGHS says, a claim that DTR's run (mapped in, every row holding) refutes is
    reported "unknown" with the fault, and checked_relaxation does the same with any run."""
    trace = relaxation_reproducer()
    monkeypatch.setattr(relax, "_solve", lambda *args: ("infeasible", None))
    result = solve_relaxation(trace, 16, overhead_limit=1.3, method="mip", **EXACT)
    assert result.status == "unknown" and "solver fault" in result.message and "dtr passes" in result.message
    monkeypatch.setattr(relax, "_solve", lambda *args: ("bound", 5.0))  # recompute >= 5: above DTR's 2
    result = solve_relaxation(trace, 16, overhead_limit=1.3, method="lp", **EXACT)
    assert result.status == "unknown" and "above the compute" in result.message
    claimed = solve_relaxation(trace, 16, overhead_limit=1.3, method="lp", check_policies=(), **EXACT)
    assert claimed.status == "bound" and claimed.bound == trace.model_compute + 5
    assert checked_relaxation(claimed, [("a schedule", 15, 4)]).status == "unknown"
    assert checked_relaxation(claimed, [("a schedule", 15, 5)]) == claimed  # no better than the bound
    assert checked_relaxation(claimed, [("a larger budget", 17, 0)]) == claimed  # not at this budget


def test_every_model_uses_the_simulators_integer_allowance():
    trace = allowance_reproducer()
    assert trace.model_compute == 12 and recompute_allowance(12, 4 / 3) == 3
    assert least_recompute(trace, 13, 4 / 3).recompute is None
    assert least_recompute(trace, 13, 1 + 4 / 12 + 1e-9).recompute == 4
    assert simulate(trace, "dtr", budget_bytes=13, semantics=Semantics(overhead_limit=4 / 3)).status == "thrash"
    for solver in SOLVERS:
        result = solve_optimal(trace, 13, overhead_limit=4 / 3, solver=solver, **EXACT)
        assert result.status == "infeasible" and result.schedule is None, (solver, result)
    result = solve_relaxation(trace, 13, overhead_limit=4 / 3, method="mip", check_policies=(), **EXACT)
    assert result.status == "infeasible", result
    assert not claim_violations(trace, 13, 4 / 3, policies=["dtr"])


def test_the_allowance_is_the_simulators_thrash_check():
    """An integer recompute r passes the simulator's check (r > compute x (limit - 1) fails)
    exactly when r <= recompute_allowance; infinity and NaN are no limit."""
    for compute in range(0, 40):
        for c in range(0, compute + 1):
            limit = 1 + c / compute if compute else 1.0
            allowance = recompute_allowance(compute, limit)
            assert not allowance > compute * (limit - 1) and allowance + 1 > compute * (limit - 1)
    assert recompute_allowance(12, math.inf) is None and recompute_allowance(0, math.inf) is None  # 0 x inf is NaN


def test_a_reported_optimum_is_its_schedules_recompute(monkeypatch):
    """HiGHS once reported "optimal" with objective 0 and bound 0 for a point that recomputes 5
    (issue 22): the objective reported is now the point's own, checked against the replay, and
    a solver whose objective or bound disagrees with its point is a fault, never "optimal"."""
    trace = chain()
    original = solve._solve_highs

    def wrong_objective(model, start, time_limit_s, workers):
        status, values, objective, best = original(model, start, time_limit_s, workers)
        return status, values, 0.0, 0.0

    monkeypatch.setattr(solve, "_solve_highs", wrong_objective)
    result = solve_optimal(trace, 40, solver="milp", **EXACT)
    assert result.status == "unknown" and result.schedule is None
    assert "solver fault" in result.message and "recomputes 5" in result.message
    monkeypatch.undo()
    good = solve_optimal(trace, 40, solver="milp", **EXACT)
    assert good.status == "optimal" and good.remat_compute == 5 and checked(build_problem(trace), good) == good
    from dataclasses import replace as changed
    lying = changed(good, objective=good.objective - 5, best_bound=good.objective - 5)
    assert checked(build_problem(trace), lying).status == "unknown"
    above = changed(good, status="feasible", best_bound=good.objective + 1)
    assert "above the objective" in checked(build_problem(trace), above).message


def optimum_reproducer():
    """Found by test_no_claim_beats_the_truth_on_many_traces: at 23 bytes, limit 1 + 5/6,
    HiGHS 1.16 given DTR's run as a start (recompute 4) returned it as "optimal" with
    objective 0 and bound 0, with presolve; the stage model's optimum and the truth are 2."""
    log = LogBuilder()
    log.constant("x", 4)
    log.call("f0", ["x"], [("a0", 4)], time=4)
    log.call("f1", ["a0"], [("a1", 3)], time=0)
    log.call("f2", ["a1"], [("a2", 5)], time=2)
    log.call("f3", ["a2", "a2"], [("a3", 1), ("s3", 5)], time=0)
    log.mutate("m_a2", ["a2"], [0], time=0)
    log.backward()
    log.call("b3", ["a3", "s3"], [("g3", 1)], time=0)
    log.release("a3", "s3")
    log.call("b2", ["g3", "a2"], [("g2", 1)], time=0)
    log.release("a2")
    log.call("b1", ["g2", "a1"], [("g1", 1)], time=0)
    log.release("a1")
    log.call("b0", ["g1", "a0"], [("g0", 1)], time=0)
    log.release("a0", "g0")
    return log.trace("optimum_reproducer")


def test_a_false_optimum_from_highs_is_solved_again():
    """The reported optimum is the truth, and equals its replay: HiGHS's inconsistent answer
    from the start is never returned (solve_optimal solves again without the start)."""
    trace, limit = optimum_reproducer(), 1 + 5 / 6
    assert least_recompute(trace, 23, limit).recompute == 2
    result = solve_optimal(trace, 23, overhead_limit=limit, solver="milp", **EXACT)
    assert result.status == "optimal" and result.remat_compute == 2 and result.best_bound == result.objective
    assert replay(trace, result).remat_compute == 2
    assert not claim_violations(trace, 23, limit, policies=["dtr"])


def test_milp_answers_with_any_number_of_workers():
    """HiGHS's thread scheduler is started once per process; a solve with other workers than
    the first one's answered "unknown" (issue 22). Every worker count now gets the proof."""
    trace = chain()
    for workers in (1, 2, 3, 1, 2):
        result = solve_optimal(trace, 45, solver="milp", workers=workers, time_limit_s=math.inf)
        assert result.status == "optimal" and result.remat_compute == 5, workers
        bound = solve_relaxation(trace, 45, method="mip", workers=workers, time_limit_s=math.inf)
        assert bound.status == "bound" and bound.bound == pytest.approx(15), workers
