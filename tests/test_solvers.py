"""Exact solvers on hand-built graphs whose optimum is derived by hand, and their replay in the simulator.

Every graph has a constant ``x`` of 10 bytes that stays pinned; budgets below count it.
Solves of these tiny models run without a time limit and with one worker (``EXACT``), so
every verdict is the solver's proof, whatever the machine's speed or load.
"""

import math
from pathlib import Path

import pytest

pytest.importorskip("ortools", reason="the exact solvers need the optional extra: pip install 'dtrlab[solvers]'")
pytest.importorskip("highspy", reason="the exact solvers need the optional extra: pip install 'dtrlab[solvers]'")

from dtrlab.solvers import SOLVERS, build_problem, replay, solve_optimal  # noqa: E402
from dtrlab.solvers.problem import Schedule  # noqa: E402
from dtrlab.trace import load_log  # noqa: E402
from dtrlab.trace.builder import LogBuilder  # noqa: E402
from chains import chain_log  # noqa: E402


#: No wall-clock limit, one worker: a tiny model's solve ends with a proof, deterministically.
EXACT = dict(time_limit_s=math.inf, workers=1)
#: a wall-clock limit for APIs that need a finite one: no solve of a tiny trace comes near it, so it
#: only stops a hang and never decides a verdict
HANG_GUARD_S = 600


def chain():
    return chain_log().trace("chain")


def diamond():
    """a feeds b and c, which meet in d; e needs d and a again.

    d's step needs b, c, d and x (40) while a is still live (50 with it). Below 50, a
    must be gone at d and recomputed (cost 4) for e; recomputing b or c instead would
    need a resident at d anyway. Nothing fits below 40.
    """
    log = LogBuilder()
    log.constant("x", 10)
    log.call("f", ["x"], [("a", 10)], time=4)
    log.call("g", ["a"], [("b", 10)], time=1)
    log.call("h", ["a"], [("c", 10)], time=2)
    log.call("k", ["b", "c"], [("d", 10)], time=1)
    log.release("b", "c")
    log.call("m", ["d", "a"], [("e", 10)], time=1)
    log.release("d", "a")
    return log.trace("diamond")


def unet():
    """An encoder output e1 (10 bytes, cost 8) skips, through a view (cost 1), to the decoder.

    mid needs e2, m and x (50) while e1 is live (60 with it). Below 60, e1 must be
    gone at mid and come back for dec1: recompute enc1 (8) and, since the view died
    with its storage, the view again (1): 9 for budgets 50..59. Nothing fits below 50.
    """
    log = LogBuilder()
    log.constant("x", 10)
    log.call("enc1", ["x"], [("e1", 10)], time=8)
    log.call("view", ["e1"], [("v", 0, 0)], time=1)
    log.call("enc2", ["e1"], [("e2", 20)], time=1)
    log.call("mid", ["e2"], [("m", 20)], time=1)
    log.release("e2")
    log.call("dec2", ["m"], [("d2", 10)], time=1)
    log.release("m")
    log.call("dec1", ["d2", "v"], [("d1", 10)], time=1)
    log.release("d2", "v", "e1")
    log.call("out", ["d1"], [("y", 10)], time=1)
    log.release("d1")
    return log.trace("unet")


def multi_output():
    """bn makes y (20 bytes) and stats (2 bytes) at once (cost 5); the backward needs both.

    h's step holds y, stats, z, w and x: 72 bytes. h itself needs z, w and x (50), so
    below 72, y must be gone at h and bn recomputed for gb (5), which refills stats too.
    gb needs w, y, stats, g and x: 62 bytes, the lower bound.
    """
    log = LogBuilder()
    log.constant("x", 10)
    log.call("bn", ["x"], [("y", 20), ("stats", 2)], time=5)
    log.call("f", ["y"], [("z", 20)], time=1)
    log.call("h", ["z"], [("w", 20)], time=1)
    log.release("z")
    log.backward()
    log.call("gb", ["w", "y", "stats"], [("g", 10)], time=1)
    log.release("w", "y", "stats")
    return log.trace("multi_output")


def random_budgets(log: LogBuilder, fractions) -> tuple:
    """``(trace, budgets)`` of a random log for the solvers' property tests: budgets at
    ``fractions`` of the way from the footprint bound to the peak (where runs pass and
    recompute). A trace the solvers cannot model (an operator with both fresh and alias
    outputs) is discarded by hypothesis."""
    from hypothesis import assume
    from dtrlab.runtime import baseline
    from dtrlab.solvers import UnsupportedTrace
    trace = log.trace("random")
    try:
        problem = build_problem(trace, chain=None)
    except UnsupportedTrace:
        assume(False)
    lower, peak = problem.lower_bound(), baseline(trace).peak_memory
    return trace, sorted({int(lower + (peak - lower) * f) for f in fractions})


# graph -> (lower bound = minimal budget, the budget from which nothing is recomputed, recompute between)
HAND_DERIVED = {chain: (40, 50, 5), diamond: (40, 50, 4), unet: (50, 60, 9), multi_output: (62, 72, 5)}


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("graph", list(HAND_DERIVED), ids=lambda g: g.__name__)
def test_hand_built_optimum(graph, solver):
    trace = graph()
    minimal, free_from, recompute = HAND_DERIVED[graph]
    problem = build_problem(trace)
    assert problem.lower_bound() == minimal
    for budget, expected in [(minimal - 1, None), (minimal, recompute), (free_from - 1, recompute),
                             (free_from, 0), (free_from + 20, 0)]:
        result = solve_optimal(problem, budget, solver=solver, **EXACT)
        if expected is None:
            assert result.status == "infeasible" and result.schedule is None
            assert "lower bound" in result.message
            continue
        assert result.status == "optimal", (budget, result)
        assert result.remat_compute == expected, budget
        assert result.objective == trace.model_compute + expected
        assert result.gap == 0.0
        check = replay(problem, result)
        assert check.passed, check.summary()
        assert check.remat_compute == expected and check.peak_memory <= budget


def test_overhead_limit_makes_a_budget_infeasible():
    """The chain at 40 bytes needs recompute 5 of its 10 units of compute: fine at 1.5, not at 1.4."""
    trace = chain()
    assert trace.model_compute == 10
    assert solve_optimal(trace, 40, overhead_limit=1.5, **EXACT).remat_compute == 5
    for solver in SOLVERS:
        result = solve_optimal(trace, 40, overhead_limit=1.4, solver=solver, **EXACT)
        assert result.status == "infeasible" and result.schedule is None


def test_replay_catches_a_schedule_that_does_not_fit():
    """A schedule is checked by the simulator, not by the solver's accounting: the same
    schedule that fits 40 bytes fails at 39."""
    trace = chain()
    result = solve_optimal(trace, 40, **EXACT)
    assert replay(trace, result).passed
    tight = replay(trace, result.schedule, 39)
    assert not tight.passed and tight.status == "oom"


def test_replay_reports_a_wrong_compute_claim():
    """Dropping the schedule's recompute makes the simulator recompute a1 on demand: reported."""
    from dataclasses import replace
    trace = chain()
    result = solve_optimal(trace, 40, **EXACT)
    stripped = replace(result.schedule, remat=tuple(() for _ in result.schedule.remat))
    check = replay(trace, stripped, 40)
    assert not check.passed
    assert check.remat_compute == 5 and check.claimed_remat_compute == 0


def test_bad_input_is_a_clear_error():
    trace = chain()
    with pytest.raises(ValueError, match="cpsat, milp"):
        solve_optimal(trace, 40, solver="gurobi")
    with pytest.raises(ValueError, match="overhead_limit"):
        solve_optimal(trace, 40, overhead_limit=0.5)
    result = solve_optimal(trace, 5)
    assert result.status == "infeasible" and "below the lower bound 40" in result.message


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("graph", list(HAND_DERIVED), ids=lambda g: g.__name__)
def test_optimum_never_costs_more_than_dtr(graph, solver):
    """Wherever DTR passes, the optimal compute is at most DTR's (clock = 1 + compute)."""
    from dtrlab.runtime import simulate
    trace = graph()
    minimal, free_from, _ = HAND_DERIVED[graph]
    for budget in range(minimal, free_from + 11):
        dtr = simulate(trace, "dtr", budget_bytes=budget)
        if dtr.passed:
            assert solve_optimal(trace, budget, solver=solver, **EXACT).objective + 1 <= dtr.clock, budget


def test_shipped_unet_schedules_replay_and_beat_dtr(small_unet):
    """The shipped U-Net at three budgets: every schedule replays in the simulator, and where
    DTR passes a proven optimum is no more compute than DTR's. The solves have a time limit,
    so only what they return is checked, except at 1.5 x peak: there keeping everything is a
    point of the model with no recompute, returned even if the time runs out, so a schedule
    with recompute 0 comes back whatever the machine's speed. (At the peak itself the stage
    model needs recompute 17: it holds each storage until its last need stage.)"""
    from dtrlab.runtime import baseline, simulate
    problem = build_problem(small_unet)
    for ratio in (0.9, 1.0, 1.5):
        budget = int(baseline(small_unet).peak_memory * ratio)
        result = solve_optimal(problem, budget, solver="milp", time_limit_s=3, workers=1)
        assert "fault" not in result.message, result.message
        if ratio == 1.5:
            assert result.schedule is not None and result.remat_compute == 0, result.status
        if result.schedule is None:
            assert result.status == "unknown", (ratio, result)  # DTR passes: never "infeasible"
            continue
        check = replay(problem, result)
        assert check.passed, check.summary()
        dtr = simulate(small_unet, "dtr", budget_bytes=budget)
        if dtr.passed and result.status == "optimal":
            assert result.objective + 1 <= dtr.clock


@pytest.fixture(scope="module")
def small_unet():
    return load_log(Path(__file__).resolve().parent.parent / "traces" / "unet-b2.jsonl.gz")


@pytest.mark.slow
def test_every_returned_schedule_replays_on_the_shipped_traces():
    """Every shipped trace at three budgets from the peak up: each schedule a solver returns passes
    in the simulator (feasibility solves of at most 3 s each, so the test is bounded: about a
    minute in all). Keeping everything is a point of the model there and the solver's start, so
    a schedule comes back even when the time runs out."""
    from dtrlab.runtime import baseline
    from dtrlab.trace import load_directory
    for name, trace in load_directory(Path(__file__).resolve().parent.parent / "traces").items():
        problem = build_problem(trace, chain=2)
        replayed = 0
        for ratio in (1.0, 1.5, 2.0):
            result = solve_optimal(problem, int(baseline(trace).peak_memory * ratio), solver="cpsat",
                                   time_limit_s=3, feasibility_only=True)
            if result.schedule is not None:
                check = replay(problem, result)
                assert check.passed, (name, ratio, check.summary())
                replayed += 1
        assert replayed >= 2, name


def test_replay_thrash_limit_budget_errors_and_summary():
    """The chain at 40 bytes recomputes a1 (5 of its 10 units of compute, chain_log's derivation): the replay
    passes under the overhead limit 1.5 and thrashes under 1.4 (a recompute allowance of 4); a budget given with a
    SolveResult overrides its own; bad input is one line; the summary says what happened."""
    from dataclasses import replace

    from dtrlab.solvers.replay import ScriptedPolicy

    trace = chain()
    result = solve_optimal(trace, 40, **EXACT)
    fits = replay(trace, result.schedule, 40, overhead_limit=1.5)
    assert fits.passed and fits.summary() == f"pass: recompute 5, peak {fits.peak_memory} <= 40" and fits.peak_memory <= 40
    assert fits.clock == 1 + 10 + 5  # the clock starts at 1; the model's compute, then a1 again
    over = replay(trace, result.schedule, 40, overhead_limit=1.4)
    assert over.status == "thrash" and not over.passed and over.summary().startswith("FAIL: simulator: thrash (")
    tight = replay(trace, result, 39)
    assert (tight.status, tight.budget_bytes, tight.failure.kind) == ("oom", 39, "oom")
    assert tight.summary() == f"FAIL: simulator: oom ({tight.failure}); recompute 0 != claimed 5"
    # Without its recompute the schedule's stage 5 (b1) misses a1, which the simulator then recomputes on demand.
    stripped = replay(trace, replace(result.schedule, remat=tuple(() for _ in result.schedule.remat)), 40)
    assert stripped.disagreements == ("stage 5: resident set differs from the schedule (extra [], missing ['a1'])",)
    assert stripped.summary() == f"FAIL: {stripped.disagreements[0]}; recompute 5 != claimed 0"
    with pytest.raises(ValueError, match=r"^give budget_bytes= with a bare Schedule$"):
        replay(trace, result.schedule)
    with pytest.raises(ValueError, match=r"^the solve ended 'infeasible' without a schedule to replay$"):
        replay(trace, solve_optimal(trace, 5))
    with pytest.raises(RuntimeError,
                       match=r"^the scripted replay withholds every storage; the policy is never asked to choose$"):
        ScriptedPolicy().choose(None, [])


def test_replay_refuses_hand_built_bad_schedules():
    """Schedules that break the replay's rules, built by hand on chain_log's traces (storage ids: x is 0, a_i is i,
    then g3, g2, g1): each is refused with the one disagreement its construction plants, and the recompute it caused."""
    from dataclasses import replace

    trace = chain()
    at_50, at_40 = (solve_optimal(trace, budget, **EXACT).schedule for budget in (50, 40))
    # The interval model evicting the pinned constant x in stage 1's gap: refused, x stays. At 40 bytes the schedule
    # that needs 50 then runs out of memory when b3 makes g3 beside x, a1, a2 and a3 (the simulator's own words first).
    pinned = replace(at_50, evictions=tuple(((0,),) if t == 1 else ((),) for t in range(7)))
    refused = replay(trace, pinned, 50)
    assert refused.status == "pass" and not refused.passed
    assert refused.disagreements == ("stage 1: cannot evict x (locked or pinned)",)
    oom = replay(trace, pinned, 40)
    assert (oom.status, oom.failure.step, oom.failure.memory_in_use) == ("oom", 5, 40)
    assert oom.summary() == f"FAIL: simulator: oom ({oom.failure}); stage 1: cannot evict x (locked or pinned)"
    # Recomputing f1 at stage 5 while a1 is resident (the schedule at 50 keeps it): refused although the claim is right.
    resident = replay(trace, replace(at_50, remat=tuple((1,) if t == 5 else () for t in range(7))), 50)
    assert (resident.remat_compute, resident.claimed_remat_compute) == (5, 5) and not resident.passed
    assert resident.disagreements == ("stage 5: recomputing f1 (operator 1) whose outputs are all resident",)
    # The schedule at 40 (a1 gone from stage 2 to 4) made interval-model, with f1 recomputed (5) and dropped again at
    # stage 3, then f2 recomputed at stage 4 after evicting a2, and a1 evicted again before b2: f2 then costs f1's 5
    # and its own 1, and f1 at stage 5 another 5, after an attempt to evict the pinned x.
    storages = list(build_problem(trace).storage_window)

    def gone(t):
        return tuple(s for s in storages if s not in at_40.resident[t])
    evictions = {3: ((), (1, *gone(3))), 4: ((2,), (1, *gone(4))), 5: ((0,), gone(5))}
    evictions = tuple(evictions.get(t, ((),) * len(at_40.remat[t]) + (gone(t),)) for t in range(7))
    remat = tuple({3: (1,), 4: (2,)}.get(t, at_40.remat[t]) for t in range(7))
    assert at_40.remat[5] == (1,)
    costly = replay(trace, Schedule(at_40.resident, remat, evictions), 50, overhead_limit=3)
    assert costly.disagreements == ("stage 4: recomputing f2 (operator 2) cost 6, not 1: an argument was not resident",
                                    "stage 5: cannot evict x (locked or pinned)")
    assert costly.summary() == f"FAIL: {'; '.join(costly.disagreements)}; recompute 16 != claimed 11"


def test_replay_names_at_most_three_storages_and_five_disagreements():
    """Five layers, nothing evicted: a schedule claiming nothing resident differs at every stage but the first, and
    one claiming every storage misses, at stage 0, all but a1 (only the first three named, in storage order)."""
    trace = chain_log((1,) * 5).trace("chain5")
    problem = build_problem(trace)
    n = len(problem.stage_op)
    assert n == 11  # f1..f5, b5..b1, the final stage
    empty = replay(trace, Schedule(((),) * n, ((),) * n, (((),),) * n), 10 ** 6)
    assert len(empty.disagreements) == n - 1
    assert empty.disagreements[3] == ("stage 4: resident set differs from the schedule "
                                      "(extra ['a1', 'a2', 'a3'], missing [])")
    assert empty.summary() == "FAIL: " + "; ".join(empty.disagreements[:5])
    everything = replay(trace, Schedule((tuple(problem.storage_window),) * n, ((),) * n), 10 ** 6)
    assert everything.disagreements[0] == ("stage 0: resident set differs from the schedule "
                                           "(extra [], missing ['a2', 'a3', 'a4'])")


def test_replay_runs_the_gap_before_the_first_step():
    """A trace that starts with an operator, then a constant: its first stage's gap is before step 0 (and none is
    before step 1), and a wrong claim there is reported."""
    from dataclasses import replace
    log = LogBuilder()
    log.call("f1", [], [("a1", 10)], time=2)
    log.constant("x", 10)
    log.call("f2", ["a1", "x"], [("a2", 10)], time=1)
    log.release("a1")
    log.call("f3", ["a2"], [("a3", 10)], time=1)
    log.release("a2")
    trace = log.trace("operator_first")
    assert build_problem(trace).stage_step == (0, 3, 5, 8)
    schedule = solve_optimal(trace, 30, **EXACT).schedule
    assert replay(trace, schedule, 30).passed
    wrong = replay(trace, replace(schedule, resident=((2, 3), *schedule.resident[1:])), 30)
    assert wrong.disagreements == ("stage 0: resident set differs from the schedule (extra [], missing ['a2', 'a3'])",)
