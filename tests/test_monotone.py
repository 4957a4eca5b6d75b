"""monotone(policy): feasibility monotone in the budget, overhead non-increasing, decisions replayed."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from dtrlab.analysis.holes import find_holes
from dtrlab.policies import get_policy
from dtrlab.calibrated.monotone import CalibrationPoint, choose_cap, monotone_envelope
from dtrlab.runtime import baseline, budget_for, simulate
from dtrlab.sweep import parse_ratios, sweep
from dtrlab.trace import load_directory

from conftest import ROOT
from dtrlab.sweep.execution import Execution

CALIBRATION = "0.05:1.0:0.01"


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    # Calibrations go through the default sweep cache; keep the tests' runs out of the user's.
    monkeypatch.setenv("DTRLAB_CACHE", str(tmp_path / "cache"))
    # ... and calibrate each test afresh: a calibration memoized by an earlier test (or, under make mutate, by the
    # unmutated run) would hide a bug in calibrate() from every later test.
    from dtrlab.calibrated import monotone

    monkeypatch.setattr(monotone, "_CALIBRATIONS", {})


def test_choose_cap_takes_the_cheapest_passing_budget_that_fits():
    points = [CalibrationPoint(0.1, 100, "oom", 5), CalibrationPoint(0.2, 200, "pass", 30),
              CalibrationPoint(0.3, 300, "thrash", 99), CalibrationPoint(0.4, 400, "pass", 20),
              CalibrationPoint(0.5, 500, "pass", 20), CalibrationPoint(0.6, 600, "pass", 25)]
    assert choose_cap(points, 199) is None
    assert choose_cap(points, 200).budget_bytes == 200
    assert choose_cap(points, 399).budget_bytes == 200  # 300 failed
    assert choose_cap(points, 450).budget_bytes == 400
    assert choose_cap(points, 10**9).budget_bytes == 500  # equal clocks: the larger budget


def test_monotone_replays_the_cap_run_inside_the_budget(small_resnet):
    envelope = monotone_envelope(small_resnet, "dtr", CALIBRATION)
    first_pass = envelope.loc[envelope["base_status"] == "pass", "budget_bytes"].min()
    for ratio in (0.455, 0.5, 0.583, 0.9):
        budget = budget_for(small_resnet, ratio)
        wrapped = simulate(small_resnet, "monotone", budget_bytes=budget)
        row = envelope[envelope["budget_bytes"] <= budget].iloc[-1]
        cap = budget_for(small_resnet, row["cap_ratio"])
        at_cap = simulate(small_resnet, "dtr", budget_bytes=cap)
        assert budget >= first_pass and wrapped.passed
        assert wrapped.budget_bytes == budget and wrapped.peak_memory <= cap <= budget
        # Decision for decision the base policy's run at the cap, inside budget B.
        assert wrapped.eviction_sha256 == at_cap.eviction_sha256 and wrapped.clock == at_cap.clock
        assert wrapped.overhead == pytest.approx(row["monotone_overhead"])


def test_below_the_first_passing_calibration_budget_it_refuses(small_resnet):
    envelope = monotone_envelope(small_resnet, "dtr", CALIBRATION)
    first_pass = int(envelope.loc[envelope["base_status"] == "pass", "budget_bytes"].min())
    refused = simulate(small_resnet, "monotone", budget_bytes=first_pass - 1)
    assert refused.status == "oom" and refused.peak_memory == 0 and refused.evictions == 0
    assert simulate(small_resnet, "monotone", budget_bytes=first_pass).passed


def test_zero_holes_and_non_increasing_overhead_at_0001_with_two_workers(small_resnet):
    # The 0.001 grid crosses the DTR hole of this trace at 0.376-0.404 and its threshold (0.406 at 0.002).
    frame = sweep(small_resnet, "monotone", ratios="0.35:0.45:0.001", execution=Execution(jobs=2, progress=False))
    census = find_holes(frame)
    dtr = find_holes(sweep(small_resnet, "dtr", ratios="0.35:0.45:0.001", execution=Execution(jobs=2, progress=False)))
    assert len(dtr.holes) > 0, "the range should contain holes of the base policy"
    assert census.holes.empty and census.non_monotone_failures == 0
    passing = frame[frame["status"] == "pass"].sort_values("budget_bytes")
    assert (np.diff(passing["overhead"].to_numpy()) <= 0).all()
    assert (frame["peak_memory"] <= frame["budget_bytes"]).all()
    # Workers give the same decisions as this process.
    for row in frame.sample(4, random_state=1).itertuples():
        assert simulate(small_resnet, "monotone", budget_bytes=row.budget_bytes).eviction_sha256 == \
            row.eviction_sha256


def test_decision_identical_twice_and_labels(small_resnet):
    policy = get_policy("monotone", base="msps", calibration=[0.3, 0.5, 0.7, 0.9])
    assert policy.label == "monotone(base='msps', calibration=[0.3, 0.5, 0.7, 0.9])"
    first = simulate(small_resnet, policy, ratio=0.8)
    second = simulate(small_resnet, get_policy("monotone", base="msps", calibration=[0.9, 0.7, 0.5, 0.3]), ratio=0.8)
    assert first.to_dict(evicted=True) | {"policy": ""} == second.to_dict(evicted=True) | {"policy": ""}
    assert get_policy("monotone").label == "monotone"


def test_bad_parameters_are_clear():
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        get_policy("monotone", base="nope")
    with pytest.raises(ValueError, match=r"a range 0\.05:1\.0:0\.005"):
        get_policy("monotone", calibration="0.1-0.9")
    with pytest.raises(ValueError, match="wrap a plain policy"):
        get_policy("monotone", base="monotone")


def test_the_move_to_the_calibrated_layer_kept_the_shipped_rows_keys(small_resnet):
    # The shipped rows of notebook 10 were keyed when the class lived in dtrlab.policies.
    from dtrlab.sweep import SweepCache
    from dtrlab.sweep.shipped import read_metadata

    key = SweepCache(ROOT / "unused", small_resnet, get_policy("monotone")).config_key
    configs = read_metadata(ROOT / "results" / "shipped" / "traces" / "resnet32-b8.parquet")["configs"]
    assert configs[key]["policy"]["class"] == "dtrlab.policies.monotone.Monotone"


def test_a_process_that_imports_only_the_policies_layer_knows_monotone():
    # A sweep worker (loky, Dask) rebuilds a policy by name after importing some dtrlab module;
    # every such import runs dtrlab/__init__.py first, which imports the calibrated layer.
    code = ("from dtrlab.policies.base import get_policy; "
            "print(type(get_policy('monotone', base='msps')).__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "dtrlab.calibrated.monotone"


TRACES = ROOT / "traces"


@pytest.mark.slow
def test_zero_holes_at_0001_on_every_shipped_trace():
    for name, trace in load_directory(TRACES).items():
        frame = sweep(trace, "monotone", ratios="0.05:1.0:0.001", execution=Execution(jobs=2, progress=False))
        census = find_holes(frame)
        assert census.holes.empty and census.non_monotone_failures == 0, name
        passing = frame[frame["status"] == "pass"].sort_values("budget_bytes")
        assert (np.diff(passing["overhead"].to_numpy()) <= 0).all(), name


@pytest.mark.slow
@pytest.mark.shared
def test_zero_holes_at_0001_on_every_dtr_log(logs_dir):
    """Every DTR log: the wrapper's feasibility and overhead at all 951 ratios of the 0.001 grid
    (from its calibration), and a simulation at 12 of them per log that must agree."""
    rng = np.random.default_rng(0)
    grid = parse_ratios("0.05:1.0:0.001")
    for name, trace in load_directory(logs_dir).items():
        envelope = monotone_envelope(trace, "dtr", CALIBRATION)
        budgets = [budget_for(trace, r) for r in grid]
        position = np.searchsorted(envelope["budget_bytes"].to_numpy(), budgets, side="right") - 1
        cap_overhead = np.where(position >= 0, envelope["monotone_overhead"].to_numpy()[np.maximum(position, 0)],
                                np.nan)
        passed = ~np.isnan(cap_overhead)
        assert passed.any() and not (np.diff(passed.astype(int)) < 0).any(), name  # one step from fail to pass
        assert (np.diff(cap_overhead[passed]) <= 0).all(), name
        compute = baseline(trace).model_compute
        for k in sorted(rng.choice(len(grid), 12, replace=False)):
            result = simulate(trace, "monotone", budget_bytes=budgets[k])
            assert result.passed == passed[k], (name, grid[k])
            if result.passed:
                assert result.clock / compute == pytest.approx(cap_overhead[k]) and result.peak_memory <= budgets[k]


@pytest.mark.parametrize("limit", [2.0, 3.0])
def test_monotone_envelope_from_the_base_policys_own_runs(small_resnet, limit):
    """The envelope row by row from DTR's runs at each calibration budget (the oracle): its status and overhead,
    and the cap: the passing budget at or below with the fewest clock ticks, the larger budget on a tie."""
    from dtrlab.runtime.semantics import REFERENCE, Semantics

    ratios = [0.37, 0.38, 0.40, 0.42, 0.44, 0.46, 0.48, 0.50]
    semantics = REFERENCE.with_(overhead_limit=limit)
    envelope = monotone_envelope(small_resnet, calibration=ratios, semantics=semantics)
    compute = baseline(small_resnet).model_compute
    budgets = [budget_for(small_resnet, r) for r in ratios]
    runs = [simulate(small_resnet, "dtr", budget_bytes=b, semantics=semantics) for b in budgets]
    assert envelope["ratio"].tolist() == ratios and envelope["budget_bytes"].tolist() == budgets
    assert envelope["base_status"].tolist() == [r.status for r in runs]
    assert any(r.passed for r in runs) and not all(r.passed for r in runs)
    for i, row in envelope.iterrows():
        if runs[i].passed:
            assert row.base_overhead == pytest.approx(runs[i].clock / compute, rel=1e-12)
        else:
            assert np.isnan(row.base_overhead)
        fitting = [(runs[j].clock, -budgets[j], j) for j in range(i + 1) if runs[j].passed]
        if fitting:
            cap = min(fitting)[2]
            assert (row.cap_ratio, row.monotone_overhead) == (ratios[cap], pytest.approx(runs[cap].clock / compute))
        else:
            assert np.isnan(row.cap_ratio) and np.isnan(row.monotone_overhead)
    with pytest.raises(ValueError, match="semantics sets memory, which calibration runs under flat memory"):
        monotone_envelope(small_resnet, calibration=ratios, semantics=Semantics(memory="caching"))


# The hand-built chain (tests/chains.py): peak 50 bytes, model compute 10, the clock starts at 1. Its calibration at
# budgets 30, 40, 45 and 50 (ratios 0.6, 0.8, 0.9, 1.0): 30 fails (nothing fits below 40), 50 needs no recompute
# (clock 11), and DTR at 40 and 45 recomputes 6 (clock 17), within an allowance of 20 but not of 5.3.
CHAIN_RATIOS = [0.6, 0.8, 0.9, 1.0]


def chain_points(statuses, clocks):
    return tuple(CalibrationPoint(r, int(50 * r), s, c) for r, s, c in zip(CHAIN_RATIOS, statuses, clocks))


def test_calibration_memo_tells_configurations_apart():
    """Calibrations of two traces with the same budgets, two policies, two recompute limits and two calibrations in
    one process: each its own (a memo keyed on less would hand one the other's points)."""
    from chains import chain_log
    from dtrlab.calibrated.monotone import calibrate
    chain, cheaper = chain_log().trace("chain"), chain_log((4, 1, 1)).trace("chain")
    dtr = get_policy("dtr")
    assert calibrate(chain, dtr, CHAIN_RATIOS, 20.0) == chain_points(["oom", "pass", "pass", "pass"], [14, 17, 17, 11])
    assert calibrate(cheaper, dtr, CHAIN_RATIOS, 20.0)[-1].clock == 10  # its model compute is 9
    assert calibrate(chain, dtr, CHAIN_RATIOS, 5.3) == chain_points(["oom", "thrash", "thrash", "pass"],
                                                                   [14, 16, 16, 11])
    assert calibrate(chain, get_policy("lru"), CHAIN_RATIOS, 20.0)[1].clock == 16  # LRU recomputes 5 at 40
    assert [p.budget_bytes for p in calibrate(chain, dtr, [0.8, 1.0], 20.0)] == [40, 50]


def test_calibration_without_an_exact_overhead_limit_matches_one_with_it():
    """A recompute limit of 20.3 is no overhead limit's allowance (1 + 20.3 / 10 gives back another float), so
    calibration runs the Python Simulator with it: the same points as at the exact limit 20 (overhead 3), which
    simulate() runs, since the chain's runs recompute 0 or 6."""
    from chains import chain_log
    from dtrlab.calibrated.monotone import _overhead_limit, calibrate
    from dtrlab.trace.builder import LogBuilder
    chain = chain_log().trace("chain")
    assert _overhead_limit(chain, 20.3) is None and _overhead_limit(chain, 20.0) == 3.0
    free = LogBuilder()
    free.call("f", [], [("y", 10)], time=0)
    assert _overhead_limit(free.trace("free"), 0.0) is None  # no compute: no overhead limit at all
    assert calibrate(chain, get_policy("dtr"), CHAIN_RATIOS, 20.3) == calibrate(chain, get_policy("dtr"),
                                                                                CHAIN_RATIOS, 20.0)
    assert calibrate(chain, get_policy("dtr"), CHAIN_RATIOS, 5.3) == chain_points(
        ["oom", "thrash", "thrash", "pass"], [14, 16, 16, 11])


def test_calibration_reads_the_sweep_cache(monkeypatch):
    """Budgets a sweep already ran (at the overhead limit whose allowance is the recompute limit) are read from the
    default cache, not simulated; the others, or all when the cache cannot be read, are simulated."""
    from chains import chain_log
    from dtrlab.calibrated import monotone
    from dtrlab.runtime import REFERENCE
    from dtrlab.sweep import SweepCache
    chain = chain_log().trace("chain")
    frame = sweep(chain, "dtr", budgets=[30, 40, 50], semantics=REFERENCE.with_(overhead_limit=3.0),
                  execution=Execution(progress=False))
    simulated = []
    real = monotone.simulate

    def counted(*args, **kwargs):
        simulated.append(kwargs["budget_bytes"])
        return real(*args, **kwargs)
    monkeypatch.setattr(monotone, "simulate", counted)
    points = monotone.calibrate(chain, get_policy("dtr"), CHAIN_RATIOS, 20.0)
    assert simulated == [45]
    cached = {b: (s, c) for b, s, c in zip(frame["budget_bytes"], frame["status"], frame["clock"])}
    assert {p.budget_bytes: (p.status, p.clock) for p in points if p.budget_bytes != 45} == cached
    assert points == chain_points(["oom", "pass", "pass", "pass"], [14, 17, 17, 11])

    def busy(self):
        raise OSError("compacting")
    monkeypatch.setattr(SweepCache, "load", busy)
    monkeypatch.setattr(monotone, "_CALIBRATIONS", {})
    simulated.clear()
    assert monotone.calibrate(chain, get_policy("dtr"), CHAIN_RATIOS, 20.0) == points
    assert simulated == [30, 40, 45, 50]


def test_monotone_envelope_of_the_chain():
    """The envelope row by row, derived by hand from the chain's calibration (overhead limit 2, an allowance of 10):
    at 45 the tie between 40 and 45 (both clock 17) goes to the larger budget; at 50 the cap is 50 (clock 11)."""
    from chains import chain_log
    from dtrlab.runtime import Semantics
    chain = chain_log().trace("chain")
    envelope = monotone_envelope(chain, "dtr", CHAIN_RATIOS)
    nan = float("nan")
    expected = {"ratio": CHAIN_RATIOS, "budget_bytes": [30, 40, 45, 50], "base_status": ["oom", "pass", "pass", "pass"],
                "base_overhead": [nan, 1.7, 1.7, 1.1], "cap_ratio": [nan, 0.8, 0.9, 1.0],
                "monotone_overhead": [nan, 1.7, 1.7, 1.1]}
    assert list(envelope.columns) == list(expected)
    assert envelope.pop("base_status").tolist() == expected.pop("base_status")
    for column, values in expected.items():
        assert envelope[column].tolist() == pytest.approx(values, nan_ok=True), column
    default = monotone_envelope(chain)  # dtr over the default calibration 0.05:1.0:0.01
    assert len(default) == 96 and default.set_index("ratio").loc[0.8, "base_overhead"] == pytest.approx(1.7)
    with pytest.raises(ValueError, match=r"^semantics sets memory, which calibration runs under flat memory, so the "
                                         r"envelope"):
        monotone_envelope(chain, calibration=CHAIN_RATIOS, semantics=Semantics(memory="caching"))


def test_monotone_parameters_start_and_refusal():
    """A tuple of ratios becomes a list of floats (and its label says so); a base given as an instance is labelled by
    its own label; the wrapper has its base's features and no cap until it starts; under an address-aware memory
    model it refuses in words; below the first passing budget it refuses before allocating even a 1-byte constant."""
    from dtrlab.runtime import Semantics
    from dtrlab.trace.builder import LogBuilder
    policy = get_policy("monotone", base=get_policy("lru"), calibration=(0.5, 1))
    assert policy.params["calibration"] == [0.5, 1.0] and all(type(r) is float for r in policy.params["calibration"])
    assert policy.label == "monotone(base='lru', calibration=[0.5, 1.0])"
    assert get_policy("monotone", base="dtr", calibration=CALIBRATION).label == "monotone"
    assert get_policy("monotone", base="msps").features == get_policy("msps").features != frozenset()
    assert policy.cap is None
    with pytest.raises(ValueError, match=r"^monotone\(base=monotone\(...\)\) is the same as its inner monotone; wrap a "
                                         r"plain policy$"):
        get_policy("monotone", base="monotone")
    log = LogBuilder()
    log.constant("x", 1)
    log.call("f", ["x"], [("y", 10)], time=1)
    trace = log.trace("tiny")
    with pytest.raises(ValueError, match=r"^monotone needs the flat byte-counting memory model \(the default\); its "
                                         r"replay argument does not hold under an address-aware model$"):
        simulate(trace, "monotone", budget_bytes=11, semantics=Semantics(memory="caching"))
    wrapped = get_policy("monotone", calibration=[1.0])
    refused = simulate(trace, wrapped, budget_bytes=10)
    assert (refused.status, refused.peak_memory, wrapped.cap) == ("oom", 0, None)
    capped = get_policy("monotone", calibration=[1.0])
    assert simulate(trace, capped, budget_bytes=20).passed and capped.cap.budget_bytes == 11


def test_calibration_tells_apart_classes_that_share_a_label():
    """Two stand-ins labelled ``dtr`` that evict as LRU does (clock 16 at 40 bytes, DTR's is 17): one in DTR's own
    module under another class name, one under DTR's class name in another module. After DTR's calibration in the
    same process, each gets its own points; and the base starts on the simulator capped at the calibration budget."""
    from chains import chain_log
    from dtrlab.calibrated.monotone import calibrate
    chain = chain_log().trace("chain")
    dtr, lru = type(get_policy("dtr")), type(get_policy("lru"))
    assert calibrate(chain, get_policy("dtr"), CHAIN_RATIOS, 20.0)[1].clock == 17
    for module, qualname in ((dtr.__module__, "Other"), ("elsewhere", dtr.__qualname__)):
        twin = type(qualname, (lru,), {"name": "dtr", "__module__": module, "__qualname__": qualname})()
        assert twin.label == "dtr"
        assert calibrate(chain, twin, CHAIN_RATIOS, 20.0)[1].clock == 16, (module, qualname)

    class Watched(lru):
        name = "watched"
        budgets: list = []

        def start(self, sim):
            Watched.budgets.append(sim.budget)
    assert simulate(chain, get_policy("monotone", base=Watched(), calibration=CHAIN_RATIOS), budget_bytes=47).passed
    assert Watched.budgets[-1] == 45  # 40 and 45 tie at clock 17 under DTR; as LRU both take 16: the larger, 45
