"""The outcome at any overhead limit derived from one run without a limit equals a direct run
(random traces, every registered policy that does not read the limit, both engines), and the
anatomy of holes on hand-built traces with one hole of each kind."""

from __future__ import annotations

import inspect
import math
import re
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dtrlab.calibrated  # noqa: F401  (registers monotone)
from dtrlab import simulate
from dtrlab.analysis.anatomy import (ANATOMY_COLUMNS, CLIFF_MARGIN, LIMIT_READERS, NEAR_MISS_MARGIN, RUN_COLUMNS,
                                     UNLIMITED_COLUMNS, census_anatomy, check_limit_blind, failing_budgets,
                                     hole_anatomy, needed_limit, outcome_at, outcomes_at, unlimited_runs)
from dtrlab.analysis.holes import HOLE_COLUMNS, HoleCensus, census_table, find_holes, run_census
from dtrlab.analysis.limit_census import KINDS, _memory_label, limit_census, read_anatomy_table
from dtrlab.integrity import IntegrityError, read_json, write_manifest
from dtrlab.policies import available_policies, get_policy, policy_class
from dtrlab.runtime import Intervention, baseline, recompute_allowance
from dtrlab.runtime.compiled import POLICY_CODES
from dtrlab.sweep import sweep
from dtrlab.sweep import budget_sweep
from dtrlab.sweep.cache import SweepCache
from dtrlab.sweep.shipped import read_metadata
from dtrlab.trace import LogBuilder, load_log

from conftest import ROOT
from test_properties import random_logs
from dtrlab.runtime.semantics import Semantics
from dtrlab.sweep.execution import Execution

LIMIT_WORDS = ("remat_limit", "overhead_limit", "remat_allowance", "recompute_allowance")
BLIND = [name for name in available_policies() if name not in LIMIT_READERS]


def test_limit_readers_are_the_policies_whose_code_mentions_the_limit():
    """Every registered policy whose modules (its class and its dtrlab base classes) name the limit is
    refused, and no other is: a new policy that reads the limit fails this test until it is listed."""
    readers = set()
    for name in available_policies():
        modules = {sys.modules[c.__module__] for c in policy_class(name).__mro__ if c.__module__.startswith("dtrlab")}
        if any(word in inspect.getsource(module) for module in modules for word in LIMIT_WORDS):
            readers.add(name)
    assert readers == set(LIMIT_READERS)


def test_needed_limit_is_the_smallest_float_admitting_the_recompute():
    for base in (1, 3, 6, 7, 29, 59, 10**9 + 7, 3 * 10**12 + 1):  # 6: 1 + 5/6 rounds above the smallest
        for remat in (1, 2, 3, 16, 17, base - 1, base, base + 1, 3 * base + 2):
            if remat <= 0:
                continue
            limit = needed_limit(base, remat)
            assert recompute_allowance(base, limit) >= remat
            assert recompute_allowance(base, math.nextafter(limit, -math.inf)) < remat
    assert needed_limit(59, 0) == 1.0 and needed_limit(0, 5) == math.inf
    assert needed_limit(0, 0) == 1.0  # no compute and no recompute: the allowance floor(0 x 0) = 0 admits it


def _options(name):
    # Address-aware policies place blocks: they need an address-aware model (Python engine).
    return {"memory": "caching"} if getattr(get_policy(name), "address_aware", False) else {}


def _engines(name):
    return ["python", "compiled"] if type(get_policy(name)) in POLICY_CODES and not _options(name) else ["python"]


def check_derived_equals_direct(trace, name, budget):
    options = _options(name)
    for engine in _engines(name):
        run = lambda limit: simulate(trace, get_policy(name), budget_bytes=budget,
                                     engine=engine, semantics=Semantics(overhead_limit=limit, **options))
        unlimited = run(math.inf)
        assert unlimited.status in ("pass", "oom")
        base, remat = unlimited.baseline_compute, unlimited.remat_compute
        limits = {1.0, 1.25, 2.0, 3.0, math.inf}
        for allowance in (remat - 1, remat, remat + 1):  # the boundaries: allowance exactly r, r - 1, r + 1
            if allowance >= 0 and base:
                limit = needed_limit(base, allowance)
                assert recompute_allowance(base, limit) == allowance
                limits |= {limit, max(1.0, math.nextafter(limit, -math.inf))}
        for limit in sorted(limits):
            direct = run(limit)
            assert outcome_at(unlimited, limit) == direct.status, (name, engine, budget, limit)
            if direct.passed:
                assert (direct.clock, direct.remat_compute, direct.evicted_storages) == \
                       (unlimited.clock, unlimited.remat_compute, unlimited.evicted_storages)
            if direct.status != "thrash":  # a run that passed or ran out of memory speaks for any larger limit
                assert outcome_at(direct, math.inf) == unlimited.status
            else:
                assert outcome_at(direct, limit) == "thrash"


@st.composite
def cases(draw):
    return draw(random_logs()).trace("random"), draw(st.sampled_from(BLIND)), draw(st.floats(0.05, 1.2))


def _run_case(case):
    trace, name, fraction = case
    check_derived_equals_direct(trace, name, int(baseline(trace).peak_memory * fraction))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_derived_outcome_equals_direct_run(case):
    _run_case(case)


@pytest.mark.slow
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_derived_outcome_equals_direct_run_many(case):
    _run_case(case)


@pytest.mark.slow
@pytest.mark.parametrize("name", BLIND)
def test_derived_outcome_every_policy(name):
    """Every policy that does not read the limit, on its own random traces."""
    @settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(log=random_logs(), fraction=st.floats(0.05, 1.2))
    def check(log, fraction):
        trace = log.trace("random")
        check_derived_equals_direct(trace, name, int(baseline(trace).peak_memory * fraction))
    check()


# --------------------------------------------------------------- hand-built holes
# Found by a seeded search over small random logs (dtr, every budget from 1 byte to the peak, limit
# 2.0) and frozen here; each docstring derives the hole's kind from the numbers the test checks
# with direct runs.

def cliff_trace():
    """Baseline compute 29 (5+6+2+10+2+1+3), peak 60, so the allowance at 2.0 is 29. The only hole is
    budget 59 (58 and 60 pass): without a limit it recomputes 37 > 29 (thrash at 2.0), more than
    (1 + 0.1) x 29 = 31.9 (not a near miss) and at least 1.5 x 18, its neighbours' recompute (18 at 58,
    0 at 60): a cliff, closing at 1 + 37/29 = 2.2759."""
    log = LogBuilder()
    log.constant("t1", 16)
    log.constant("t2", 14)
    log.release("t2")
    log.call("op1", ["t1"], [("t3", 8)], time=5)
    log.release("t3")
    log.call("op3", ["t1"], [("t4", 8)], time=6)
    log.call("op4", ["t1", "t4"], [("t5", 6)], time=2)
    log.release("t4")
    log.call("op6", ["t5", "t1"], [("t6", 10)], time=10)
    log.call("op7", ["t6", "t1"], [("t7", 16)], time=2)
    log.call("op8", ["t5", "t1"], [("t8", 5)], time=1)
    log.call("op9", ["t6", "t8"], [("t9", 7)], time=3)
    log.release("t7")
    return log.trace("cliff")


def oom_trace():
    """Baseline compute 59, peak 112. The hole is budgets 98-99 (97 and 100 pass): both run out of
    memory without a limit (after recomputing 16), so they fail at every limit: oom, never closes.
    The OOM boundary: at allowance 16 the run at 98 still runs out of memory, at 15 it thrashes."""
    log = LogBuilder()
    log.constant("t1", 4)
    log.call("op0", ["t1"], [("t2", 16)], time=6)
    log.call("op1", ["t1"], [("t3", 3)], time=5)
    log.call("op2", ["t2", "t1"], [("t4", 12)], time=5)
    log.call("op3", ["t3", "t2"], [("t5", 10)], time=8)
    log.release("t4")
    log.call("op5", ["t3", "t1"], [("t6", 15)], time=10)
    log.call("op6", ["t6"], [("t7", 10)], time=1)
    log.call("op7", ["t7", "t5"], [("t8", 14)], time=4)
    log.call("op8", ["t5", "t7"], [("t9", 16)], time=10)
    log.call("op9", ["t8", "t2"], [("t10", 8)], time=4)
    log.call("op10", ["t10", "t8"], [("t11", 16)], time=2)
    log.release("t8")
    log.call("op12", ["t3", "t7"], [("t12", 2)], time=4)
    log.release("t7")
    return log.trace("oom")


def near_miss_trace():
    """Baseline compute 31 (4+9+7+2+1+7+1), allowance 31 at 2.0. The hole is budgets 52-54 (51 and 55
    pass); without a limit they recompute at most 32 <= 1.1 x 31 = 34.1: a near miss, closing at
    1 + 32/31 = 2.0323."""
    log = LogBuilder()
    log.constant("t1", 13)
    log.constant("t2", 7)
    log.call("op0", ["t2"], [("t3", 3)], time=4)
    log.call("op1", ["t3", "t1"], [("t4", 10)], time=9)
    log.call("op2", ["t3", "t1"], [("t5", 6)], time=7)
    log.call("op3", ["t1", "t4"], [("t6", 16)], time=2)
    log.call("op4", ["t2", "t3"], [("t7", 11)], time=1)
    log.call("op5", ["t6", "t3"], [("t8", 8)], time=7)
    log.release("t6")
    log.release("t8")
    log.call("op8", ["t2"], [("t9", 1)], time=1)
    return log.trace("near-miss")


def limit_trace():
    """Baseline compute 46 (2+10+9+8+2+1+9+4+1), allowance 46 at 2.0. Hole 34 (33 and 35 pass) needs 52:
    more than 1.1 x 46 = 50.6 (no near miss) but less than 1.5 x 40 = 60, its neighbours' most recompute
    (40): neither, a ``limit`` hole, closing at 1 + 52/46 = 2.1304. Hole 37-40 (36 and 41 pass) needs 48
    <= 50.6: a near miss."""
    log = LogBuilder()
    log.constant("t1", 1)
    log.call("op0", ["t1"], [("t2", 9)], time=2)
    log.call("op1", ["t1"], [("t3", 7)], time=10)
    log.call("op2", ["t1", "t2"], [("t4", 14)], time=9)
    log.release("t2")
    log.call("op4", ["t1", "t3"], [("t5", 10)], time=8)
    log.release("t3")
    log.call("op6", ["t4", "t5"], [("t6", 5)], time=2)
    log.call("op7", ["t6", "t4"], [("t7", 7)], time=1)
    log.call("op8", ["t5", "t1"], [("t8", 9)], time=9)
    log.call("op9", ["t6"], [("t9", 3)], time=4)
    log.release("t7")
    log.call("op11", ["t8"], [("t10", 7)], time=1)
    log.release("t4")
    log.release("t10")
    return log.trace("limit")


def every_budget(trace, limit=2.0, **options):
    return sweep(trace, "dtr", budgets=range(1, baseline(trace).peak_memory + 1),
                 semantics=Semantics(overhead_limit=limit, **options),
                 execution=Execution(cache=False, progress=False, backend="sequential"))


HANDBUILT = {  # trace -> (base compute, [(fail_low, fail_high, anatomy, needed remat, neighbour remat)])
    cliff_trace: (29, [(59, 59, "cliff", 37, 18)]),
    oom_trace: (59, [(98, 99, "oom", None, 17)]),
    near_miss_trace: (31, [(52, 54, "near-miss", 32, 23)]),
    limit_trace: (46, [(34, 34, "limit", 52, 40), (37, 40, "near-miss", 48, 26)]),
}


@pytest.mark.parametrize("build", HANDBUILT, ids=lambda b: b.__name__)
def test_handbuilt_hole_is_classified_as_built(build):
    trace = build()
    base, expected = HANDBUILT[build]
    assert baseline(trace).model_compute == base
    census = find_holes(every_budget(trace))
    unlimited = unlimited_runs(trace, census, execution=Execution(progress=False, backend="sequential", cache=False))
    assert sorted(unlimited["budget_bytes"]) == failing_budgets(census)
    table = hole_anatomy(census, unlimited)
    assert list(table.columns) == HOLE_COLUMNS + ANATOMY_COLUMNS
    got = [(r.fail_low_bytes, r.fail_high_bytes, r.anatomy, None if pd.isna(r.needed_remat) else int(r.needed_remat),
            r.neighbour_remat) for r in table.itertuples()]
    assert got == expected
    allowance = recompute_allowance(base, 2.0)
    for hole in table.itertuples():
        budgets = list(range(hole.fail_low_bytes, hole.fail_high_bytes + 1))
        if hole.anatomy == "oom":  # fails at any limit: out of memory even with a huge one
            assert hole.closes_at == math.inf
            assert set(every_budget_at(trace, budgets, 1e9)["status"]) == {"oom"}
            continue
        # The margins, from the numbers alone, as the docstrings derive them.
        near = hole.needed_remat <= (1 + NEAR_MISS_MARGIN) * allowance
        cliff = hole.needed_remat >= (1 + CLIFF_MARGIN) * hole.neighbour_remat
        assert hole.anatomy == ("near-miss" if near else "cliff" if cliff else "limit")
        # closes_at: every failing sample passes there (direct runs), and not all at the next smaller float.
        assert hole.closes_at == needed_limit(base, hole.needed_remat)
        assert set(every_budget_at(trace, budgets, hole.closes_at)["status"]) == {"pass"}
        assert "thrash" in set(every_budget_at(trace, budgets, math.nextafter(hole.closes_at, 0))["status"])


def every_budget_at(trace, budgets, limit, policy="dtr", **semantics):
    return sweep(trace, policy, budgets=budgets, semantics=Semantics(overhead_limit=limit, **semantics),
                 execution=Execution(cache=False, progress=False, backend="sequential"))


@pytest.mark.parametrize("engine", ["python", "compiled"])
def test_oom_boundary_allowance_r_is_oom_and_r_minus_1_thrash(engine):
    """The unlimited run at 98 bytes OOMs after recomputing 16; the simulator checks thrash after every
    (re)materialization, but the OOM comes while freeing room before the next computation, so a
    direct run with allowance exactly 16 runs out of memory at the same step and one with 15 thrashes."""
    trace = oom_trace()
    unlimited = simulate(trace, "dtr", budget_bytes=98, engine=engine, semantics=Semantics(overhead_limit=math.inf))
    assert (unlimited.status, unlimited.remat_compute) == ("oom", 16)
    at_r, below = needed_limit(59, 16), needed_limit(59, 15)
    assert (recompute_allowance(59, at_r), recompute_allowance(59, below)) == (16, 15)
    for limit, status in ((at_r, "oom"), (math.nextafter(at_r, 0), "thrash"), (below, "thrash")):
        assert simulate(trace, "dtr", budget_bytes=98, engine=engine,
                        semantics=Semantics(overhead_limit=limit)).status == status
        assert outcome_at(unlimited, limit) == status


def test_outcomes_at_equals_direct_sweeps():
    """A whole frame at several limits from one sweep at a limit no run reaches (sweep keys its cache on
    a finite limit): statuses, the census, and every run column it keeps equal direct sweeps."""
    trace = limit_trace()
    wide = every_budget(trace, limit=1e9)
    assert "thrash" not in set(wide["status"])
    limits = [1.0, 1.5, 2.0, needed_limit(46, 48), math.nextafter(needed_limit(46, 48), 0), 3.0]
    derived = outcomes_at(wide, limits)
    for limit in limits:
        ours = derived[derived["overhead_limit"] == limit].reset_index(drop=True)
        direct = every_budget(trace, limit=limit)
        assert ours["status"].tolist() == direct["status"].tolist()
        for column in RUN_COLUMNS:
            if column in ours and column != "wall_seconds":
                kept = ours[column].notna()
                assert ours.loc[kept, column].tolist() == direct.loc[kept, column].tolist(), column
        assert ours.loc[ours["status"] == "pass", "clock"].notna().all()  # a pass is the same run
        cols = ["samples", "failures", "non_monotone_failures", "holes", "threshold_ratio"]
        assert census_table(ours)[cols].equals(census_table(direct)[cols])


def test_refusals():
    trace = oom_trace()
    with pytest.raises(ValueError, match="^" + re.escape(
            "policy 'monotone' reads the overhead limit to decide, so a run at one limit says nothing about another; "
            "simulate it at each limit (sweep(..., overhead_limit=L))") + "$"):
        check_limit_blind("monotone")
    monotone = {"status": "pass", "remat_compute": 0, "baseline_compute": 59, "overhead_limit": math.inf,
                "policy": "monotone", "policy_name": "monotone"}
    with pytest.raises(ValueError, match="reads the overhead limit"):
        outcome_at(monotone, 2.0)
    thrash = simulate(trace, "dtr", budget_bytes=98, semantics=Semantics(overhead_limit=1.2))
    assert thrash.status == "thrash"
    assert outcome_at(thrash, 1.1) == "thrash"
    with pytest.raises(ValueError, match="cannot tell"):
        outcome_at(thrash, 2.0)
    allocated_oom = {"status": "oom", "remat_compute": 3, "baseline_compute": 59, "overhead_limit": math.inf,
                     "policy": "dtr", "enforce": "allocated"}
    with pytest.raises(ValueError, match="allocated"):
        outcome_at(allocated_oom, 2.0)
    census = find_holes(every_budget(trace))
    with pytest.raises(ValueError, match="without a limit"):
        hole_anatomy(census, every_budget_at(trace, failing_budgets(census), 2.0))
    with pytest.raises(ValueError, match="no run without a limit"):
        hole_anatomy(census, unlimited_runs(trace, census,
                                            execution=Execution(progress=False, backend="sequential",
                                                                cache=False)).iloc[:1])


MODELS = Path(__file__).resolve().parent.parent / "traces" / "models"


@pytest.mark.parametrize("name, ratios, anatomy, closes_at", [
    ("llama-1b-b4-s2048", [0.426, 0.427, 0.429], "oom", math.inf),
    ("vit_b_16-b64", [0.271, 0.272, 0.273, 0.274], "cliff", 2.554),
    ("resnet50-b64", [0.305, 0.306, 0.307, 0.308], "near-miss", 2.0105),
])
def test_issue_holes_on_todays_models(name, ratios, anatomy, closes_at):
    """Issue 24's three holes at the 2.0 limit: Llama 0.427 fails at any limit, ViT-B/16 0.272-0.273 is
    a cliff (needs 2.55 against 1.39 beside it), ResNet-50 0.306-0.307 a near miss (needs 2.0105)."""
    path = MODELS / f"{name}.jsonl.gz"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    import dtrlab
    trace = dtrlab.load(str(path))
    census = find_holes(sweep(trace, "dtr", ratios=ratios,
                              execution=Execution(cache=False, progress=False, backend="sequential")))
    table = hole_anatomy(census, unlimited_runs(trace, census,
                                                execution=Execution(progress=False, backend="sequential", cache=False)))
    assert len(table) == 1
    hole = table.iloc[0]
    assert hole.anatomy == anatomy
    assert hole.closes_at == pytest.approx(closes_at, rel=1e-4)
    for budget in failing_budgets(census):  # the derivation agrees with direct runs around the closing limit
        unlimited = simulate(trace, "dtr", budget_bytes=budget, semantics=Semantics(overhead_limit=math.inf))
        for limit in (2.0, 2.5, 3.0):
            assert outcome_at(unlimited, limit) == simulate(trace, "dtr", budget_bytes=budget,
                                                            semantics=Semantics(overhead_limit=limit)).status


# --------------------------------------------------------------- sweeps without a limit
def test_sweep_without_a_limit_is_cached_under_its_own_key(tmp_path, monkeypatch):
    """sweep(overhead_limit=math.inf): no run thrashes, rows say inf, the rows come back from the cache
    under a key of their own, and the keys of finite limits are as before (the shipped bundle's)."""
    trace = near_miss_trace()
    budgets = list(range(40, 61))
    unlimited = sweep(trace, "dtr", budgets=budgets, semantics=Semantics(overhead_limit=math.inf),
                      execution=Execution(cache=tmp_path, progress=False))
    assert set(unlimited["status"]) <= {"pass", "oom"} and "pass" in set(unlimited["status"])
    assert (unlimited["overhead_limit"] == math.inf).all()
    at_2 = sweep(trace, "dtr", budgets=budgets, semantics=Semantics(overhead_limit=2.0),
                 execution=Execution(cache=tmp_path, progress=False))
    assert "thrash" in set(at_2["status"])  # the hole at 52-54: another configuration, not the same rows
    keys = {d.name: read_json(d / "key.json") for d in tmp_path.glob("sim-v*/*/*")}
    assert sorted(k["overhead_limit"] for k in keys.values()) == [2.0, math.inf]
    def no_runs(trace, specs, **options):
        assert not specs, "every row is cached: nothing is simulated"
        return iter(())
    monkeypatch.setattr(budget_sweep, "iter_runs", no_runs)
    again = sweep(trace, "dtr", budgets=budgets, semantics=Semantics(overhead_limit=math.inf),
                  execution=Execution(cache=tmp_path, progress=False))
    assert again["status"].tolist() == unlimited["status"].tolist()
    assert again["remat_compute"].tolist() == unlimited["remat_compute"].tolist()
    for bad in (math.nan, 0.5):
        with pytest.raises(ValueError, match="overhead_limit must be a number >= 1"):
            sweep(trace, "dtr", budgets=budgets, semantics=Semantics(overhead_limit=bad),
                  execution=Execution(cache=False, progress=False))


def test_finite_limits_keep_their_shipped_cache_keys():
    """Accepting inf changed no finite key: the shipped bundle's rows at 2.0 are still found."""
    bundle = Path(__file__).resolve().parent.parent / "results" / "shipped" / "traces" / "resnet32-b8.parquet"
    if not bundle.exists():
        pytest.skip(f"{bundle} is absent")
    import dtrlab
    trace = dtrlab.load("traces/resnet32-b8.jsonl.gz")
    key = SweepCache("unused", trace, get_policy("dtr")).config_key
    assert key in read_metadata(bundle)["configs"]


# --------------------------------------------------------------- the limit census
CENSUS_LIMITS = (1.25, 1.5, 2.0, 3.0, math.inf)
COMPILED = sorted(name for name in available_policies() if type(get_policy(name)) in POLICY_CODES)


def check_limit_census(trace, policy, tmp_path, ratios="0.1:1.0:0.05", **semantics):
    """limit_census's outcome at each limit, derived from one sweep without a limit (and refined on the
    derived outcomes), equals direct sweeps at that limit at every budget it sampled; so do its holes,
    threshold and failures, and its anatomy counts are its hole table's. ``semantics``: ``memory``,
    ``enforce`` and ``device_capacity`` of every run."""
    memory = semantics.pop("memory", "flat")
    result = limit_census({trace.name: trace}, [policy], [memory], limits=CENSUS_LIMITS, ratios=ratios,
                          semantics=Semantics(**semantics), execution=Execution(cache=tmp_path, progress=False))
    semantics["memory"] = memory
    assert sorted(result.table["limit"]) == sorted(CENSUS_LIMITS)
    for row in result.table.itertuples():
        ours = result.samples[result.samples["limit"] == row.limit]
        direct = sweep(trace, policy, budgets=ours["budget_bytes"].tolist(),
                       semantics=Semantics(overhead_limit=row.limit, **semantics),
                       execution=Execution(cache=False, progress=False, backend="sequential"))
        assert ours["status"].tolist() == direct["status"].tolist(), (policy, row.limit)
        census = find_holes(direct)
        assert (row.samples, row.failures, row.holes) == (len(direct), census.failures, len(census.holes))
        assert (pd.isna(row.threshold_ratio) and census.threshold_ratio is None) or \
            row.threshold_ratio == pytest.approx(census.threshold_ratio, rel=1e-12)  # a grid ratio, or bytes/peak
        holes = result.holes[result.holes["limit"] == row.limit]
        assert holes["fail_low_bytes"].tolist() == census.holes["fail_low_bytes"].tolist()
        if policy not in LIMIT_READERS:
            assert [getattr(row, c) for c in KINDS.values()] == [int((holes["anatomy"] == k).sum()) for k in KINDS]
            for hole in holes.itertuples():  # closes_at: every failing sample passes there (direct runs)
                failing = [b for b in ours["budget_bytes"] if hole.fail_low_bytes <= b <= hole.fail_high_bytes]
                if hole.anatomy != "oom":
                    assert set(every_budget_at(trace, failing, hole.closes_at, policy, **semantics)["status"]) == \
                        {"pass"}
                else:  # fails at any limit: some failing sample does not pass even at a limit of a million
                    assert "pass" not in set(every_budget_at(trace, failing, 1e6, policy, **semantics)["status"])
    return result


@pytest.mark.parametrize("build", HANDBUILT, ids=lambda b: b.__name__)
def test_limit_census_on_handbuilt_holes(build, tmp_path):
    """Each hand-built hole, censused every byte: at 2.0 the census finds and classifies it as built."""
    trace = build()
    peak = baseline(trace).peak_memory
    result = check_limit_census(trace, "dtr", tmp_path, ratios=f"{1 / peak}:1.0:{1 / peak}")
    at_2 = result.holes[result.holes["limit"] == 2.0]
    assert [(h.fail_low_bytes, h.fail_high_bytes, h.anatomy) for h in at_2.itertuples()] == \
        [(low, high, anatomy) for low, high, anatomy, _, _ in HANDBUILT[build][1]]
    at_inf = result.table[result.table["limit"] == math.inf].iloc[0]
    assert at_inf.holes == at_inf.oom_holes  # without a limit, only failures at any cost are left


@pytest.mark.parametrize("policy", ["dtr"] + [pytest.param(name, marks=pytest.mark.slow) for name in
                                              COMPILED + ["twophase", "monotone"] if name != "dtr"])
def test_limit_census_equals_direct_sweeps(policy, tmp_path_factory):
    """Every compiled policy (and twophase; monotone, which reads the limit, is swept at each limit) on
    random traces: the census at every limit equals direct sweeps at that limit."""
    @settings(max_examples=4, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(log=random_logs())
    def check(log):
        check_limit_census(log.trace("random"), policy, tmp_path_factory.mktemp("cache"))
    check()


@pytest.mark.parametrize("name, kinds", [("unet-b2", {"oom", "near-miss"}),
                                         ("resnet32-b8", {"cliff", "near-miss", "limit"})])
def test_limit_census_under_allocated_semantics_is_swept_at_each_limit(name, kinds, tmp_path):
    """Under the DTR prototype's allocated semantics no outcome is derived (an OOM run's last recompute may
    be unchecked): every limit is swept directly, labelled MODEL/allocated, and the anatomy's claims hold
    in direct runs (closes_at passes; an oom hole fails even at a limit of a million). Random traces have
    no hole under these semantics; two shipped traces under the caching model have every kind."""
    trace = load_log(ROOT / "traces" / f"{name}.jsonl.gz")
    result = check_limit_census(trace, "dtr", tmp_path, ratios="0.05:1.0:0.01", memory="caching", enforce="allocated")
    assert set(result.table["memory"]) == {"caching/allocated"}
    assert (result.table["sweep_limit"] == result.table["limit"]).all()
    assert set(result.holes["anatomy"]) == kinds
    with pytest.raises(ValueError, match="enforce must be"):
        limit_census({name: trace}, ["dtr"], semantics=Semantics(enforce="allocate"))
    # another device than the sweep's default (unlimited) is a configuration of its own
    assert [_memory_label("caching", "allocated", device) for device in (None, "unlimited", "1.25x")] == \
        ["caching/allocated", "caching/allocated", "caching/allocated(1.25x)"]


def test_read_anatomy_table_refuses_an_unlisted_or_edited_file(tmp_path):
    (tmp_path / "anatomy").mkdir()
    path = tmp_path / "anatomy" / "set-table.csv"
    path.write_text("trace,limit,holes\na,2.0,1\n")
    with pytest.raises(IntegrityError, match="refusing"):
        read_anatomy_table("set-table.csv", tmp_path / "anatomy")  # no manifest
    write_manifest(tmp_path / "anatomy", [path])
    assert read_anatomy_table("set-table.csv", tmp_path / "anatomy")["holes"].tolist() == [1]
    path.write_text("trace,limit,holes\na,2.0,0\n")
    with pytest.raises(IntegrityError, match="refusing"):
        read_anatomy_table("set-table.csv", tmp_path / "anatomy")


def test_ship_anatomy_stops_on_ctrl_c_in_one_line_and_ships_what_it_finished(tmp_path, monkeypatch, capsys):
    from dtrlab.cli import main
    from dtrlab.pipeline import ship_anatomy

    finished = []

    def census(*args, **kwargs):  # the first configuration finishes, Ctrl-C arrives in the second
        if finished:
            raise KeyboardInterrupt
        finished.append(1)
        return limit_census(*args, **kwargs)

    monkeypatch.setattr(ship_anatomy, "limit_census", census)
    monkeypatch.setenv("DTRLAB_CACHE", str(tmp_path / "cache"))  # restored afterwards: --cache sets it
    out = tmp_path / "anatomy"
    status = main(["ship", "anatomy", str(ROOT / "traces"), "--only", "unet", "--policies", "dtr", "lru",
                   "--limits", "2", "--ratios", "0.4:1.0:0.2", "--output", str(out),
                   "--cache", str(tmp_path / "cache")])
    error = capsys.readouterr().err
    assert status == 130 and error.count("\n") == 1 and "interrupted" in error and "Traceback" not in error
    table = pd.read_csv(out / "traces-table.csv")
    assert table["policy"].tolist() == ["dtr"]  # the finished configuration is shipped, the interrupted one not


# --------------------------------------------------------------- unit tests on tests/chains.py's chain
# The chain (tests/chains.py: baseline compute 10, forward 5+1+1 and backward 1+1+1; peak 50). Below 50
# bytes b3 cannot hold x, a1, a2, a3 and g3: DTR drops a2 (cost 1 against a1's 5), so b2 recomputes f2,
# then a1 goes for g2 and b1 recomputes f1: recompute 6; LRU drops a1 (used before a2), so only b1
# recomputes f1: 5. Below 40 (b2's x, g3, a2 and g2) nothing fits: f3 drops a1 and b3 a2, then b2's
# recompute of a2 recomputes f1 (5) and f2 cannot fit (a1 is its input, g3 has lost its parent a3): oom
# after recomputing 5.
QUICK = Execution(cache=False, progress=False, backend="sequential")


def chain_census(holes, budgets=(30, 35, 45, 49, 50), policy="dtr", limit=1.5, intervention=None):
    """The chain's direct runs at ``budgets`` as a census whose holes are ``holes`` ((fail_low, fail_high)
    pairs placed by hand: the chain has no hole, and unlimited_runs reads only the samples' configuration
    and the holes' failing budgets)."""
    from chains import chain_log

    samples = sweep(chain_log().trace("chain"), policy, budgets=list(budgets),
                    semantics=Semantics(overhead_limit=limit), intervention=intervention, execution=QUICK)
    return replace(find_holes(samples), holes=pd.DataFrame(list(holes), columns=["fail_low_bytes", "fail_high_bytes"]))


def test_unlimited_runs_are_the_failing_samples_run_without_a_limit(tmp_path, monkeypatch):
    """At 1.5 (allowance 5) DTR's 6 thrashes at 45 and 49; without a limit both pass with recompute 6, and
    30 and 35 run out of memory. The runs go to the execution's cache (under the key of no limit), not the
    default one, and come back with the columns of UNLIMITED_COLUMNS only, numbered from 0."""
    from chains import chain_log

    census = chain_census([(30, 35), (45, 49)])
    assert census.samples["status"].tolist() == ["oom", "oom", "thrash", "thrash", "pass"]
    monkeypatch.setenv("DTRLAB_CACHE", str(tmp_path / "default"))
    runs = unlimited_runs(chain_log().trace("chain"), census,
                          execution=Execution(cache=tmp_path / "mine", progress=False, backend="sequential"))
    assert list(runs.columns) == UNLIMITED_COLUMNS and runs.index.equals(pd.RangeIndex(4))
    assert runs["budget_bytes"].tolist() == [30, 35, 45, 49]
    assert runs["status"].tolist() == ["oom", "oom", "pass", "pass"]
    assert runs["remat_compute"].tolist() == [5, 5, 6, 6]
    assert (runs["baseline_compute"] == 10).all() and (runs["overhead_limit"] == math.inf).all()
    passed = runs[runs["status"] == "pass"]  # the clock of the run at 50 (nothing recomputed) plus 6, over 10
    clock = int(census.samples.set_index("budget_bytes").loc[50, "clock"]) + 6
    assert passed["clock"].tolist() == [clock, clock] and passed["overhead"].tolist() == [clock / 10] * 2
    keys = [read_json(d / "key.json") for d in (tmp_path / "mine").glob("sim-v*/*/*")]
    assert [k["overhead_limit"] for k in keys] == [math.inf]
    assert not (tmp_path / "default").exists()


def test_unlimited_runs_rebuild_the_census_policy_and_withheld_storages():
    """LRU's census recomputes 5 at 45, not DTR's 6; withholding a1 leaves b2 x, a1, g3, a2 and g2 (50 bytes)
    at 45: oom; random(seed=3) is rebuilt with its seed (with the defaults its label would not match); a frame
    without policy parameters (None) rebuilds the defaults."""
    from chains import chain_log

    trace = chain_log().trace("chain")
    lru = unlimited_runs(trace, chain_census([(45, 45)], policy="lru"), execution=QUICK)
    assert (lru["status"].tolist(), lru["remat_compute"].tolist()) == (["pass"], [5])
    withheld = chain_census([(45, 45)], intervention=Intervention(frozenset({trace.tensor_names.index("a1")})))
    assert unlimited_runs(trace, withheld, execution=QUICK)["status"].tolist() == ["oom"]
    seeded = chain_census([(45, 45)], policy=get_policy("random", seed=3))
    assert seeded.policy == "random(seed=3)"
    direct = simulate(trace, get_policy("random", seed=3), budget_bytes=45,
                      semantics=Semantics(overhead_limit=math.inf))
    runs = unlimited_runs(trace, seeded, execution=QUICK)
    assert (runs["status"].tolist(), runs["remat_compute"].tolist()) == ([direct.status], [direct.remat_compute])
    census = chain_census([(45, 45)])
    bare = replace(census, samples=census.samples.assign(policy_params=None))
    assert unlimited_runs(trace, bare, execution=QUICK)["remat_compute"].tolist() == [6]


def test_unlimited_runs_refusals_and_a_census_without_holes():
    from chains import chain_log

    trace = chain_log().trace("chain")
    census = chain_census([(45, 45)])
    with pytest.raises(ValueError, match="^" + re.escape("the census's policy 'lru' is not rebuilt by its "
                                                         "policy_params ('dtr')") + "$"):
        unlimited_runs(trace, replace(census, policy="lru"), execution=QUICK)
    with pytest.raises(ValueError, match="policy 'monotone' reads the overhead limit"):
        unlimited_runs(trace, replace(census, samples=census.samples.assign(policy_name="monotone")),
                       execution=QUICK)
    one_sample = chain_census([], budgets=[45])
    runs = unlimited_runs(trace, one_sample, execution=QUICK)
    assert runs.empty and list(runs.columns) == UNLIMITED_COLUMNS


def test_hole_anatomy_refusals_word_for_word_and_a_census_without_holes():
    """A census of a policy that reads the limit is refused by the samples' policy_name or, without that column
    (frames saved before it), by the census's label; runs at a limit, or missing at failing budgets (the
    first five named), are refused in full; a census without holes needs no runs."""
    census = chain_census([(45, 45)])
    monotone = replace(census, policy="monotone(calibration=(0.5, 0.75))",
                       samples=census.samples.assign(policy_name="monotone"))
    no_runs = pd.DataFrame(columns=UNLIMITED_COLUMNS)
    for refused in (monotone, replace(monotone, samples=monotone.samples.drop(columns="policy_name"))):
        with pytest.raises(ValueError, match="^policy 'monotone' reads the overhead limit"):
            hole_anatomy(refused, no_runs)
    at_50 = pd.DataFrame([[50, "pass", 0, 11, 1.1, 10, math.inf]], columns=UNLIMITED_COLUMNS)
    with pytest.raises(ValueError, match="^" + re.escape("hole_anatomy needs runs without a limit "
                                                         "(overhead_limit=math.inf); see unlimited_runs") + "$"):
        hole_anatomy(census, at_50.assign(overhead_limit=2.0))
    wide = chain_census([(41, 47)], budgets=range(40, 51))
    with pytest.raises(ValueError, match="^" + re.escape("no run without a limit at the failing budgets "
                                                         "[41, 42, 43, 44, 45] (of 7); simulate them with "
                                                         "unlimited_runs(trace, census)") + "$"):
        hole_anatomy(wide, at_50)
    one_sample = chain_census([], budgets=[45])
    for unlimited in (no_runs, at_50):
        table = hole_anatomy(one_sample, unlimited)
        assert table.empty and list(table.columns) == ["fail_low_bytes", "fail_high_bytes", *ANATOMY_COLUMNS]


def test_hole_anatomy_margins_at_their_boundaries():
    """A hand-made census (baseline compute 10, limit 2.0: allowance 10) with four one-sample holes whose passing
    neighbours recompute 10 (4 below the first): needing 11 = 1.1 x 10 is a near miss, 15 = 1.5 x 10 a cliff, 14
    between them a ``limit`` hole (both margins multiply exactly in floats), and one out of memory an ``oom`` hole
    that needs and closes at an infinite limit. A budget run twice counts once, the first run."""
    budgets = list(range(10, 19))
    samples = pd.DataFrame({"budget_bytes": budgets, "status": ["pass", "thrash"] * 4 + ["pass"],
                            "remat_compute": [4] + [10] * 8, "baseline_compute": 10, "overhead_limit": 2.0,
                            "policy_name": "dtr"})
    holes = pd.DataFrame([(low - 1, low, low, low + 1) for low in (11, 13, 15, 17)],
                         columns=["pass_below_bytes", "fail_low_bytes", "fail_high_bytes", "pass_above_bytes"])
    census = HoleCensus(trace="hand", policy="dtr", samples=samples, holes=holes, failures=4, non_monotone_failures=4,
                        threshold_bytes=None, threshold_ratio=None)
    unlimited = pd.DataFrame({"budget_bytes": [11, 13, 15, 17, 13], "status": ["pass"] * 3 + ["oom", "pass"],
                              "remat_compute": [11, 15, 14, 3, 99], "overhead_limit": math.inf})
    table = hole_anatomy(census, unlimited)
    assert table["anatomy"].tolist() == ["near-miss", "cliff", "limit", "oom"]
    assert table["needed_remat"].tolist()[:3] == [11, 15, 14] and pd.isna(table["needed_remat"].iloc[3])
    assert table["neighbour_remat"].tolist() == [10] * 4
    assert table["neighbour_limit"].tolist() == [2.0] * 4  # 1 + 10/10: floor(10 x 1.0) = 10
    needed = [needed_limit(10, 11), needed_limit(10, 15), needed_limit(10, 14), math.inf]
    assert table["needed_limit"].tolist() == needed and table["closes_at"].tolist() == needed


def test_outcomes_at_by_hand_on_the_chain():
    """A frame at 1.5 (allowance 5) of two configurations: LRU passes at 45 (recompute 5) and 50 (none), DTR
    runs out of memory at 35 (after recomputing 5) and thrashes at 45. At 1.25 (allowance 2) LRU's 45 and
    DTR's oom thrash and DTR's thrash stops earlier: their run columns are blanked (None), the pass at 50
    keeps them; at 1.55 (allowance 5 again) every row is the same run. ``needed_limit``: 1 + 5/10 = 1.5 for
    LRU's 45, 1.0 without recompute, infinite for a run that did not pass."""
    from chains import chain_log

    trace = chain_log().trace("chain")
    at_15 = Semantics(overhead_limit=1.5)
    frame = pd.concat([sweep(trace, "lru", budgets=[45, 50], semantics=at_15, execution=QUICK),
                       sweep(trace, "dtr", budgets=[35, 45], semantics=at_15, execution=QUICK)], ignore_index=True)
    assert list(zip(frame["status"], frame["remat_compute"])) == [("pass", 5), ("pass", 0), ("oom", 5), ("thrash", 6)]
    derived = outcomes_at(frame, [1.25, 1.5, 1.55])
    assert derived.index.equals(pd.RangeIndex(12))
    assert derived["overhead_limit"].tolist() == [1.25] * 4 + [1.5] * 4 + [1.55] * 4
    assert derived["status"].tolist() == ["thrash", "pass", "thrash", "thrash"] + frame["status"].tolist() * 2
    assert derived["needed_limit"].tolist() == [1.5, 1.0, math.inf, math.inf] * 3
    kept = np.array([False, True, False, False] + [True] * 8)
    for column in RUN_COLUMNS:  # blanked to None (JSON's null; NaN is no JSON), else the frame's values
        assert derived.loc[~kept, column].tolist() == [None, None, None], column
        original = pd.concat([frame[column]] * 3, ignore_index=True).astype(object)
        assert derived.loc[kept, column].equals(original[kept]), column
    empty = outcomes_at(frame.iloc[:0], [1.5])
    assert empty.empty and "needed_limit" in empty


def test_census_anatomy_on_a_tiny_census(tmp_path, monkeypatch):
    """A census every byte from 0.9 of the peak: the cliff trace's hole at 59 (cliff_trace's docstring) gets its
    anatomy from runs in the execution's cache; the chain has none; a census of no hole gets the columns; an
    unrefined census with holes is refused."""
    from chains import chain_log

    traces = {"cliff": cliff_trace(), "chain": chain_log().trace("chain")}
    census = run_census(traces, ratios="0.9:1.0", delta=1, execution=QUICK)
    monkeypatch.setenv("DTRLAB_CACHE", str(tmp_path / "default"))
    holes = census_anatomy(census, traces,
                           execution=Execution(cache=tmp_path / "mine", progress=False, backend="sequential"))
    assert list(holes.columns) == list(census.holes.columns) + ANATOMY_COLUMNS
    assert [(h.trace, h.fail_low_bytes, h.fail_high_bytes, h.anatomy, h.needed_remat, h.neighbour_remat)
            for h in holes.itertuples()] == [("cliff", 59, 59, "cliff", 37, 18)]
    assert holes["closes_at"].tolist() == [needed_limit(29, 37)]
    assert [read_json(d / "key.json")["overhead_limit"] for d in (tmp_path / "mine").glob("sim-v*/*/*")] == [math.inf]
    assert not (tmp_path / "default").exists()
    chain = {"chain": traces["chain"]}
    for refine in (True, False):
        none = census_anatomy(run_census(chain, ratios="0.9:1.0", delta=1, refine=refine, execution=QUICK), chain)
        assert none.empty and list(none.columns)[-len(ANATOMY_COLUMNS):] == ANATOMY_COLUMNS
    with pytest.raises(ValueError, match="^" + re.escape("the anatomy needs a refined census (run_census(..., "
                                                         "refine=True))") + "$"):
        census_anatomy(run_census(traces, ratios="0.9:1.0", delta=1, refine=False, execution=QUICK), traces)


def test_outcome_at_refusals_word_for_word():
    """A run result has no ``policy_name``: its label names the policy, parameters and all (a monotone run is
    refused); each refusal's message in full."""
    run = simulate(oom_trace(), "dtr", budget_bytes=98, semantics=Semantics(overhead_limit=1.2))
    assert run.status == "thrash"
    with pytest.raises(ValueError, match="^policy 'monotone' reads the overhead limit"):
        outcome_at(replace(run, policy="monotone(calibration=(0.5, 0.75))"), 1.1)
    with pytest.raises(ValueError, match="^" + re.escape(
            "a run that thrashed at overhead limit 1.2 cannot tell the outcome at 2.0 (a larger allowance); simulate "
            "with overhead_limit=math.inf") + "$"):
        outcome_at(run, 2.0)
    allocated_oom = {"status": "oom", "remat_compute": 3, "baseline_compute": 59, "overhead_limit": math.inf,
                     "policy": "dtr", "enforce": "allocated"}
    with pytest.raises(ValueError, match="^" + re.escape(
            "under enforce='allocated' an OOM can follow an operator's recompute before its thrash check, so the "
            "recompute an OOM run records may never have been checked; simulate at each limit") + "$"):
        outcome_at(allocated_oom, 2.0)
