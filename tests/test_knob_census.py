"""The knob census on planted curves: holes, regions, the bytes-to-knob map, refinement and its limits."""

from __future__ import annotations

import bisect
import contextlib
import dataclasses

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dtrlab.analysis.knob_census import (ACCOUNTINGS, KnobPlan, KnobSource, analyse, census_knob, dtr_beside_knob,
                                          gpu_answer, parse_knobs, read_census, write_census)
from chains import chain_trace
from conftest import ROOT
from dtrlab.integrity import IntegrityError, verify_in_manifest
from dtrlab.sweep.execution import Execution


def planted(breaks: list[float], values: list[int], calls: list[float] | None = None, **curves: list[int]):
    """A step curve: ``values[i]`` on [breaks[i-1], breaks[i]) under every accounting, except those given
    in ``curves`` (e.g. ``reserved_peak=[...]``, on the same breaks)."""
    peaks = {accounting: curves.get(accounting, values) for accounting in ACCOUNTINGS}
    assert all(len(v) == len(breaks) + 1 for v in peaks.values())

    def evaluate(knob: float) -> dict:
        if calls is not None:
            calls.append(knob)
        piece = bisect.bisect_right(breaks, knob)
        return {**{accounting: v[piece] for accounting, v in peaks.items()}, "recompute_flops": 1 - knob}
    return evaluate


# A bump: 100 below 0.2, 300 on [0.2, 0.405), 200 on [0.405, 0.6), 400 from 0.6.
BUMP = planted([0.2, 0.405, 0.6], [100, 300, 200, 400])


def test_planted_bump_holes_regions_and_map():
    census = census_knob(BUMP, KnobPlan(), name="bump")
    resolution = census.plan.resolution
    assert census.check_resolution() == [] and census.meta["refinement_complete"]
    for accounting in ACCOUNTINGS:
        changes = census.changes[census.changes.accounting == accounting]
        assert changes[["peak_below", "peak_above", "against"]].values.tolist() == \
            [[100, 300, False], [300, 200, True], [200, 400, False]]
        for truth, (_, change) in zip([0.2, 0.405, 0.6], changes.iterrows()):
            assert change.knob_below < truth <= change.knob_above and change.knob_above - change.knob_below <= \
                resolution
        holes = census.holes[census.holes.accounting == accounting]
        assert len(holes) == 1  # at budgets 200..299 only
        hole = holes.iloc[0]
        assert (hole.budget_from, hole.budget_to, hole.knob_from) == (200, 299, 0.2)
        assert 0.405 - resolution <= hole.knob_to < 0.405 <= hole.fits_above <= 0.405 + resolution
        assert 0.2 - resolution <= hole.fits_below < 0.2
        regions = census.regions[census.regions.accounting == accounting]
        assert len(regions) == 1 and regions.iloc[0].knob_from == 0.2 and regions.iloc[0].rise == 1.5
        assert regions.iloc[0].beaten_by_peak == 200 and 0.405 <= regions.iloc[0].beaten_by_knob <= 0.405 + resolution
        knob_map = census.knob_map[census.knob_map.accounting == accounting].set_index("budget_from")
        assert knob_map.loc[[100, 200, 300], "lowering_is_safe"].tolist() == [True, False, True]
        assert knob_map.loc[400, "largest_fitting_knob"] == 1.0 and knob_map.loc[100, "smallest_fitting_knob"] == 0.0
        assert 0.6 - resolution <= knob_map.loc[200, "largest_fitting_knob"] < 0.6
        summary = census.summary.set_index("accounting").loc[accounting]
        assert summary.min_peak == 100 and summary.smallest_knob_at_min == 0.0
        assert summary.worst_rise == 1.5 and summary.worst_rise_knob_low == 0.2
        assert (summary.regions, summary.hole_levels, summary.against_changes) == (1, 1, 1)


MIB = 1 << 20
#: Three accountings, three curves on the same breaks: flat has the bump, allocated rises with the knob, and
#: reserved (whole MiB) is flat below 0.405 and falls back at 0.6.
DISTINCT = planted([0.2, 0.405, 0.6], [100, 300, 200, 400], allocated_peak=[100, 200, 300, 400],
                   reserved_peak=[2 * MIB, 2 * MIB, 4 * MIB, 3 * MIB])


@pytest.mark.parametrize("again", [False, True], ids=["censused", "read-back"])
def test_each_accounting_is_analysed_from_its_own_curve(tmp_path, again):
    """Hand-derived from the three planted curves: each accounting's changes, holes, regions and map are its own."""
    census = census_knob(DISTINCT, KnobPlan(), name="distinct")
    if again:
        write_census(census, tmp_path)
        census = read_census(tmp_path / "distinct.json")

    def rows(table, accounting, columns):
        return table[table.accounting == accounting][columns].values.tolist()

    changes = ["peak_below", "peak_above", "against"]
    assert rows(census.changes, "flat_peak", changes) == [[100, 300, False], [300, 200, True], [200, 400, False]]
    assert rows(census.changes, "allocated_peak", changes) == [[100, 200, False], [200, 300, False],
                                                               [300, 400, False]]
    assert rows(census.changes, "reserved_peak", changes) == [[2 * MIB, 4 * MIB, False], [4 * MIB, 3 * MIB, True]]
    assert rows(census.holes, "flat_peak", ["budget_from", "budget_to", "knob_from"]) == [[200, 299, 0.2]]
    assert rows(census.holes, "allocated_peak", ["budget_from"]) == []
    assert rows(census.holes, "reserved_peak", ["budget_from", "budget_to"]) == [[3 * MIB, 4 * MIB - 1]]
    assert 0.405 <= rows(census.holes, "reserved_peak", ["knob_from"])[0][0] <= 0.405 + census.plan.resolution
    assert rows(census.regions, "allocated_peak", ["rise"]) == []
    assert rows(census.regions, "reserved_peak", ["beaten_by_peak"]) == [[3 * MIB]]
    summary = census.summary.set_index("accounting")
    assert summary.min_peak.tolist() == [100, 100, 2 * MIB] and summary.hole_levels.tolist() == [1, 0, 1]
    flat, allocated = census.knob_for_budget(250, "flat_peak"), census.knob_for_budget(250, "allocated_peak")
    assert not flat.lowering_is_safe and allocated.lowering_is_safe and allocated.holes == ()
    assert 0.405 - census.plan.resolution <= allocated.largest_fitting_knob < 0.405
    assert census.knob_for_budget(3 * MIB, "reserved_peak").largest_fitting_knob == 1.0


def test_knob_for_budget_between_levels():
    census = census_knob(BUMP, KnobPlan())
    choice = census.knob_for_budget(250, "flat_peak")
    assert not choice.lowering_is_safe and len(choice.holes) == 1 and choice.holes[0][0] == 0.2
    assert 0.6 - census.plan.resolution <= choice.largest_fitting_knob < 0.6
    below_everything = census.knob_for_budget(99, "flat_peak")
    assert below_everything.largest_fitting_knob is None and below_everything.holes == ()


def test_refinement_finds_a_spike_between_grid_points():
    # 0.50 and 0.51 differ (100 vs 50); a 2e-4-wide spike of 900 sits between them.
    census = census_knob(planted([0.503, 0.5032], [100, 900, 50]), KnobPlan())
    spiked = census.samples[census.samples.flat_peak == 900]
    assert len(spiked) >= 1 and (spiked.source == "refine").all()
    assert all(0.503 <= k < 0.5032 for k in spiked.knob)
    assert census.summary.set_index("accounting").loc["flat_peak", "worst_rise"] == 18.0


def test_limit_a_spike_inside_a_cell_with_equal_ends_is_not_seen():
    # The documented limit: 0.50 and 0.51 both give 100, so nothing is bisected there.
    census = census_knob(planted([0.503, 0.5032], [100, 900, 100]), KnobPlan())
    assert census.changes.empty and census.regions.empty and census.holes.empty
    assert len(census.samples) == 101


def test_monotone_curve_has_no_holes_or_regions():
    census = census_knob(planted([0.1, 0.33, 0.5], [10, 20, 30, 40]), KnobPlan())
    assert census.holes.empty and census.regions.empty
    assert census.knob_map.lowering_is_safe.all() and not census.changes.against.any()


@st.composite
def step_curves(draw, step=0.01):
    """Random step curves whose pieces are all wider than the grid step."""
    count = draw(st.integers(0, 8))
    gaps = draw(st.lists(st.floats(step * 1.01, 0.2), min_size=count, max_size=count))
    breaks, position = [], 0.0
    for gap in gaps:
        position += gap
        if position >= 1:
            break
        breaks.append(round(position, 6))
    values = [draw(st.integers(1, 10**9))]
    for _ in breaks:
        values.append(draw(st.integers(1, 10**9).filter(lambda v, last=values[-1]: v != last)))
    return breaks, values


@settings(max_examples=40, deadline=None)
@given(step_curves())
def test_guarantee_every_change_is_bracketed_when_pieces_exceed_the_step(curve):
    breaks, values = curve
    calls: list[float] = []
    plan = KnobPlan(accountings=("flat_peak",))
    census = census_knob(planted(breaks, values, calls), plan)
    assert census.check_resolution() == []
    assert len(calls) == len(set(calls)) == len(census.samples)  # each knob evaluated once
    changes = census.changes
    assert len(changes) == len(breaks)
    for truth, (_, change) in zip(breaks, changes.iterrows()):
        assert change.knob_below < truth <= change.knob_above <= change.knob_below + plan.resolution
    # Soundness: every sample is the planted value (nothing is interpolated), and every hole's knobs fail
    # at its budget while the knobs bracketing it fit.
    for knob, peak in zip(census.samples.knob, census.samples.flat_peak):
        assert peak == values[bisect.bisect_right(breaks, knob)]
    for hole in census.holes.itertuples():
        curve_at = planted(breaks, values)
        assert curve_at(hole.knob_from)["flat_peak"] > hole.budget_from
        assert curve_at(hole.fits_below)["flat_peak"] <= hole.budget_from
        assert curve_at(hole.fits_above)["flat_peak"] <= hole.budget_from
    monotone = all(a <= b for a, b in zip(values, values[1:]))
    if monotone:
        assert census.holes.empty and census.regions.empty


def test_resolution_stated_and_honoured():
    coarse = census_knob(BUMP, KnobPlan(resolution=0.003, accountings=("flat_peak",)))
    fine = census_knob(BUMP, KnobPlan(resolution=1e-5, accountings=("flat_peak",)))
    for census in (coarse, fine):
        gaps = [c.knob_above - c.knob_below for c in census.changes.itertuples()]
        assert max(gaps) <= census.plan.resolution
    assert len(fine.samples) > len(coarse.samples)
    assert "1e-05" in fine.plan.describe()


def test_evaluation_limit_is_reported():
    census = census_knob(BUMP, KnobPlan(max_evaluations=105, accountings=("flat_peak",)))
    assert len(census.samples) == 105 and census.check_resolution() and not census.meta["refinement_complete"]


def test_analyse_recomputes_from_samples():
    census = census_knob(BUMP, KnobPlan())
    again = analyse(census.samples.sample(frac=1, random_state=0), census.plan, "bump")
    for table in ("changes", "regions", "holes", "knob_map", "summary"):
        assert getattr(again, table).equals(getattr(census, table))


@pytest.mark.parametrize("text, message", [
    ("0:1.5:0.01", "[0, 1]"), ("-0.1:1:0.01", "[0, 1]"), ("0:1", "START:STOP:STEP"), ("a:b:c", "START:STOP:STEP"),
    ("0.5:0.1:0.01", "low to high"), ("0:1:0", "step must be > 0"), ("0.1,2", "[0, 1]"), ("0:1:nan", "step"),
])
def test_bad_knob_ranges(text, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_knobs(text)


def test_knob_lists_and_ranges():
    assert KnobPlan(**parse_knobs("0.15,0.05")).grid() == [0.05, 0.15]
    grid = KnobPlan(**parse_knobs("0:1:0.01")).grid()
    assert len(grid) == 101 and grid[5] == 0.05 and grid[-1] == 1.0


def test_bad_evaluation_is_named():
    with pytest.raises(ValueError, match="knob 0.0 gave flat_peak=None"):
        census_knob(lambda knob: {"allocated_peak": 1, "reserved_peak": 1}, KnobPlan())


def test_write_and_read_back(tmp_path):
    census = census_knob(BUMP, KnobPlan(), name="bump")
    paths = write_census(census, tmp_path)
    assert [p.name for p in paths][-1] == "bump.json" and all(p.exists() for p in paths)
    again = read_census(tmp_path / "bump.json")
    for table in ("samples", "changes", "regions", "holes", "knob_map", "summary"):
        assert getattr(again, table).equals(getattr(census, table)), table
    assert again.plan == census.plan
    samples = tmp_path / "bump-samples.parquet"
    samples.write_bytes(samples.read_bytes()[:-10])
    with pytest.raises(IntegrityError, match="does not match its sha256"):
        read_census(tmp_path / "bump.json")


def test_dtr_beside_the_knob_on_the_same_budgets():
    from dtrlab.runtime import baseline, simulate
    from dtrlab.sweep.execution import SERIAL
    from dtrlab.trace import load

    trace = load(ROOT / "traces" / "unet-b2.jsonl.gz")
    peak = baseline(trace).peak_memory
    fractions = [0.3, 0.9, 0.5, 1.0]

    def evaluate(knob):
        value = int(peak * fractions[bisect.bisect_right([0.2, 0.405, 0.6], knob)])
        return {"flat_peak": value, "allocated_peak": value, "reserved_peak": value, "recompute_flops": 1000 - knob}
    census = census_knob(evaluate, KnobPlan(step=0.05, resolution=0.01), name="unet")
    budgets = [int(peak * 0.25), int(peak * 0.5), int(peak * 0.7), peak]
    table = dtr_beside_knob(census, trace, budgets=budgets, execution=SERIAL.with_(cache=False, progress=False))
    assert table.budget_bytes.tolist() == budgets
    assert table.knob_fits.tolist() == [False, True, True, True]
    assert table.knob_lowering_is_safe.tolist() == [False, False, False, True]
    for row in table.itertuples():
        assert row.dtr_status == simulate(trace, "dtr", budget_bytes=row.budget_bytes).status
        if row.knob_fits:
            assert row.knob_recompute_flops == 1000 - row.largest_fitting_knob
    assert (table.monotone_status == "pass").is_monotonic_increasing


# ------------------------------------------------------------------ the command line

def refused(capsys, argv, *names) -> str:
    """``dtrlab ARGV`` must exit 2 with one line naming each of ``names`` (as tests/test_cli_errors.py)."""
    from dtrlab.cli import main

    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"dtrlab {argv[0]}: error: "), err
    for name in names:
        assert str(name) in err, (name, err)
    return err


@pytest.fixture
def written(tmp_path):
    census = census_knob(BUMP, KnobPlan(), name="bump")
    write_census(census, tmp_path / "census")
    return tmp_path / "census" / "bump.json"


@pytest.mark.parametrize("knobs, says", [("0:1.5:0.01", "[0, 1]"), ("-0.2,0.5", "[0, 1]"), ("0:1", "START:STOP:STEP"),
                                         ("0:1:zero", "START:STOP:STEP"), ("1:0:0.1", "low to high")])
def test_cli_refuses_bad_knobs_and_writes_nothing(capsys, tmp_path, written, knobs, says):
    out = tmp_path / "out"
    refused(capsys, ["knob", written, f"--knobs={knobs}", "--out", out], "--knobs", says)
    assert not out.exists()


def test_cli_refuses_bad_budgets_and_outputs(capsys, tmp_path, written):
    refused(capsys, ["knob", written, "--budget", "40GIB"], "--budget", "40GIB")
    refused(capsys, ["knob", written, "--budget", "1.25x"], "--budget", "bytes")
    refused(capsys, ["knob", written, "--out", written], "--out", "is a file")
    refused(capsys, ["knob", written, "--accounting", "alocated"], "did you mean 'allocated'")
    refused(capsys, ["knob", written, "--resolution", "0"], "--resolution")


def test_cli_refuses_a_torch_without_the_knob(capsys, tmp_path, monkeypatch):
    """An older torch, without the knob: the real config module with the knob hidden (its ``__delattr__`` hides an
    entry, torch/utils/_config_module.py:482-488, and setting it again shows it), so that no module imported
    meanwhile keeps a stand-in config, and monkeypatch puts the knob back."""
    import torch._functorch.config

    monkeypatch.delattr(torch._functorch.config, "activation_memory_budget")
    out = tmp_path / "out"
    refused(capsys, ["knob", "transformer", "--out", out], "activation_memory_budget", torch.__version__)
    assert not out.exists()


def test_cli_refuses_a_damaged_census(capsys, written):
    samples = written.parent / "bump-samples.parquet"
    samples.write_bytes(samples.read_bytes()[:100])
    refused(capsys, ["knob", written], "bump-samples.parquet", "sha256")


def test_cli_reads_a_census_back_and_answers_budgets(capsys, tmp_path, written):
    from dtrlab.cli import main

    assert main(["knob", str(written), "--budget", "250", "--budget", "350", "--accounting", "flat",
                 "--out", str(tmp_path / "again")]) == 0
    out = capsys.readouterr().out
    assert "budget 250 bytes" in out and "lowering it is NOT safe: knobs 0.2..0.40" in out
    assert "budget 350 bytes" in out and "every smaller knob fits too" in out
    assert "non-monotone regions (flat_peak)" in out and "holes (flat_peak)" in out
    again = read_census(tmp_path / "again" / "bump.json")
    assert again.holes.equals(read_census(written).holes)


def test_read_checks_the_manifest(tmp_path):
    from dtrlab.integrity import write_manifest

    census = census_knob(BUMP, KnobPlan(step=0.1), name="bump")
    write_census(census, tmp_path / "knob")
    write_manifest(tmp_path)
    assert read_census(tmp_path / "knob" / "bump.json", tmp_path).holes.equals(census.holes)
    (tmp_path / "knob" / "bump.json").write_text((tmp_path / "knob" / "bump.json").read_text() + " ")
    with pytest.raises(IntegrityError, match="bump.json has"):
        read_census(tmp_path / "knob" / "bump.json", tmp_path)


UNTRACEABLE = """
import torch


class Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.linear(x)
        if y.sum().item() > 0:  # data-dependent control flow: no single graph
            return y * 2
        return y


def step(batch=2):
    return Branchy(), torch.randn(batch, 4), None
"""


@pytest.mark.slow  # torch.compile's tracing: tens of seconds
def test_cli_refuses_a_model_the_partitioner_cannot_trace(capsys, tmp_path, monkeypatch):
    (tmp_path / "branchy_model.py").write_text(UNTRACEABLE)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "out"
    refused(capsys, ["knob", "branchy_model:step", "--out", out], "branchy_model:step", "cannot trace")
    assert not out.exists()


@pytest.mark.parametrize("backend", ["fork", "loky"])
def test_worker_processes_give_the_same_census(backend):
    import os

    def where(knob):
        return {**BUMP(knob), "pid": os.getpid()}
    serial = census_knob(BUMP, KnobPlan(), name="bump")
    parallel = census_knob(where, KnobPlan(), name="bump", execution=Execution(jobs=2, backend=backend, progress=False))
    assert parallel.samples.drop(columns="pid").equals(serial.samples) and parallel.holes.equals(serial.holes)
    assert os.getpid() not in set(parallel.samples.pid)  # every knob was evaluated in a worker
    assert parallel.meta["execution"] == backend and serial.meta["execution"] == "sequential"
    assert serial.meta["processes"] == 1 and parallel.meta["processes"] == parallel.samples.pid.nunique() <= 2


@pytest.mark.parametrize("backend", ["fork", "loky"])
def test_a_failing_evaluation_in_a_worker_is_raised_here(backend):
    def evaluate(knob):
        if knob > 0.5:
            raise ValueError(f"no partition at {knob}")
        return BUMP(knob)
    with pytest.raises(ValueError, match=r"no partition at (0\.5[1-9]|0\.[6-9]|1\.0)"):  # any, as they finish
        census_knob(evaluate, KnobPlan(), execution=Execution(jobs=2, backend=backend, progress=False))


def test_an_inductor_census_names_its_cpu_lowering_in_its_meta_and_output(capsys, tmp_path):
    """A GPU user gets the CPU Inductor lowering as the best answer available: the census's JSON meta names it
    (``inductor_lowering``, ``gpu_answer``) and `dtrlab knob` prints it in one line; an aot_eager census does not."""
    from dtrlab.analysis.knob_census import CPU_INDUCTOR_ANSWER
    from dtrlab.cli import main

    def inductor(knob):
        return {**BUMP(knob), "backend": "inductor"}
    census = census_knob(inductor, KnobPlan(step=0.1, resolution=0.05), name="bump")
    assert census.meta["inductor_lowering"] == "cpu" and census.meta["gpu_answer"] == CPU_INDUCTOR_ANSWER
    assert "oneDNN temporaries measured and counted" in CPU_INDUCTOR_ANSWER
    assert "attention, convolutions and fusions differently" in CPU_INDUCTOR_ANSWER
    write_census(census, tmp_path)
    assert read_census(tmp_path / "bump.json").meta["gpu_answer"] == CPU_INDUCTOR_ANSWER
    assert main(["knob", str(tmp_path / "bump.json"), "--budget", "A100-80GB"]) == 0
    out = capsys.readouterr().out
    assert out.count(CPU_INDUCTOR_ANSWER) == 1 and "\n" not in CPU_INDUCTOR_ANSWER
    aot = census_knob(lambda knob: {**BUMP(knob), "backend": "aot_eager"}, KnobPlan(step=0.1, resolution=0.05))
    assert "gpu_answer" not in aot.meta and "inductor_lowering" not in aot.meta
    assert gpu_answer({"backend": "inductor", "inductor_lowering": "cuda"}) is None  # a CUDA lowering needs none


def test_bad_execution_backends_are_named():
    with pytest.raises(ValueError, match="unknown backend 'lokky' \\(did you mean 'loky'\\?\\)"):
        census_knob(BUMP, KnobPlan(), execution=Execution(jobs=2, backend="lokky", progress=False))
    with pytest.raises(ValueError, match="needs Execution\\(client=\\)"):
        census_knob(BUMP, KnobPlan(), execution=Execution(jobs=2, backend="dask", progress=False))


def test_an_evaluation_that_cannot_travel_to_loky_is_refused_in_one_line():
    import threading

    lock = threading.Lock()  # what pickle refuses, as it refuses a traced joint's weak references

    def holding(knob):
        with lock:
            return BUMP(knob)
    for execution, where in [(Execution(jobs=2, backend="loky", progress=False), "loky"),
                             (Execution(client="tcp://127.0.0.1:1", progress=False), "dask")]:  # no scheduler there
        with pytest.raises(ValueError, match=rf"^census_knob on {where} ships evaluate to each worker, and this one "
                                             r"cannot be pickled \(TypeError: cannot pickle '_thread.lock' object\); "
                                             r"give a KnobSource \(the model source's spec, traced once per worker\) "
                                             r"or use backend='fork'$"):  # refused before one is sought
            census_knob(holding, KnobPlan(), execution=execution)
    assert census_knob(holding, KnobPlan(), execution=Execution(jobs=2, backend="fork", progress=False)).meta[
        "processes"] >= 1


def test_cli_names_the_executor(capsys, written):
    refused(capsys, ["knob", written, "--executor", "lokky"], "--executor", "did you mean 'loky'")
    refused(capsys, ["knob", "tests.test_partition:tiny_mlp", "--executor", "dask"], "--executor dask needs --scheduler")
    refused(capsys, ["knob", "tests.test_partition:tiny_mlp", "--scheduler", "tcp://127.0.0.1:1"], "--scheduler",
            "no Dask scheduler answers")


SHIPPED = ROOT / "results" / "shipped"
SHIPPED_CENSUSES = sorted(path for corpus in ("traces", "models") for path in (SHIPPED / "knob" / corpus).glob("*.json"))


@pytest.mark.parametrize("path", SHIPPED_CENSUSES, ids=[f"{p.parent.name}/{p.stem}" for p in SHIPPED_CENSUSES])
def test_shipped_censuses_verify_and_are_complete(path):
    census = read_census(path, SHIPPED)
    assert census.meta["refinement_complete"] and census.check_resolution() == []
    assert census.plan.step == 0.01 and census.plan.low == 0.0 and census.plan.high == 1.0
    assert (census.samples.knob.diff().dropna() > 0).all() and set(census.samples.source) <= {"grid", "refine"}
    verify_in_manifest(path.with_suffix("").with_suffix(".jsonl.gz"), SHIPPED)


def test_refining_only_against_the_knob():
    plan = KnobPlan(refine="against")
    census = census_knob(BUMP, plan)
    assert census.check_resolution() == [] and "against the knob" in plan.describe()
    changes = census.changes[census.changes.accounting == "flat_peak"]
    widths = (changes.knob_above - changes.knob_below).round(9).tolist()
    assert changes.against.tolist() == [False, True, False]
    assert widths[0] == 0.01 and widths[1] <= plan.resolution and widths[2] == 0.01  # only 0.405 bisected
    assert len(census.samples) == 101 + 7
    with pytest.raises(ValueError, match="refine is one of"):
        KnobPlan(refine="all")


def test_interventions_plot_shows_the_largest_changes():
    import matplotlib

    matplotlib.use("agg")
    from dtrlab.plots.knob import plot_knob_interventions

    rows = [{"node": f"n{i}", "forced": "save" if i % 2 else "recompute", "peak_delta": (-1) ** i * i * 2**20}
            for i in range(20)]
    ax = plot_knob_interventions(rows, top=5)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["n15 (save)", "n16 (recompute)", "n17 (save)", "n18 (recompute)", "n19 (save)"]
    assert [round(p.get_width()) for p in ax.patches] == [-15, 16, -17, 18, -19]


@pytest.mark.slow  # torch.compile's tracing of a tiny decoder: about 15 s
def test_cli_censuses_a_model_end_to_end(capsys, tmp_path):
    from dtrlab.cli import main

    argv = ["knob", "hf:llama", "--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
            "--intermediate", "128", "--vocab", "256", "--batch", "2", "--seq", "64", "--knobs", "0,0.05,0.15,1",
            "--resolution", "0.5", "--budget", "1.5MiB", "--accounting", "flat", "--out", str(tmp_path), "--quiet"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    census = read_census(tmp_path / "hf-llama-layers2-hidden64-heads4-kvheads2-intermediate128-vocab256-b2-s64.json")
    assert census.samples.knob.tolist()[:3] == [0.0, 0.05, 0.15] and census.samples.knob.iloc[-1] == 1.0
    assert {"flat_peak", "allocated_peak", "reserved_peak", "recompute_flops", "saved_count"} <= set(census.samples)
    assert f"budget {int(1.5 * 2**20):,} bytes (1.50 MiB), flat_peak" in out
    assert census.meta["refinement_complete"]


@pytest.mark.parametrize("options, plan", [
    ([], KnobPlan(step=0.1, resolution=0.025, refine="against")),  # Inductor: each distinct partition a lowering
    (["--backend", "aot_eager"], KnobPlan()),
    (["--knobs", "0:1:0.5", "--resolution", "0.1", "--refine", "changes"],
     KnobPlan(step=0.5, resolution=0.1, refine="changes"))])
def test_cli_default_plan_is_its_backends(monkeypatch, tmp_path, capsys, options, plan):
    """`dtrlab knob` without --knobs, --resolution or --refine takes its backend's plan (DEFAULT_PLANS), the one
    `dtrlab ship knob` takes; given options win."""
    import dtrlab.analysis.knob_census as knob_census
    from dtrlab.cli import main

    planned = []

    def census(evaluate, plan, **kwargs):  # the plan noted; the model never traced
        planned.append(plan)
        return census_knob(lambda knob: {**BUMP(knob), "backend": "aot_eager"}, plan, name="bump")
    monkeypatch.setattr(knob_census, "census_knob", census)
    assert main(["knob", "tests.test_partition:tiny_mlp", *options, "--quiet"]) == 0
    assert planned == [plan]


TINY = KnobSource("tests.test_partition:tiny_mlp", (("batch", 256),), backend="aot_eager")  # its peak moves


@pytest.mark.slow  # torch.compile traces the tiny MLP once in this process and once in each of 4 workers: ~1 min
def test_every_execution_backend_gives_the_same_census_each_worker_tracing_once():
    """Serial, forked, loky and Dask (a LocalCluster of 2 worker processes, 2 threads each: the lock serialises a
    worker's evaluations) give identical samples; each process that evaluated knobs traced the joint once, and
    loky's and Dask's workers traced it themselves (this process had not)."""
    import os
    from unittest import mock

    distributed = pytest.importorskip("distributed")
    plan = KnobPlan(low=0.0, high=1.0, step=0.125, resolution=0.03)

    def traced_once_each(census, backend: str, processes: int = 2):
        # How many of the workers get knobs is the scheduler's choice (a busy machine can leave one idle): at most
        # ``processes``, and each that got any traced once.
        assert census.meta["execution"] == backend and census.meta["backend"] == "aot_eager"
        assert census.meta["traces_per_process"] == [1] * census.meta["processes"], (backend, census.meta)
        assert 1 <= census.meta["processes"] <= processes, (backend, census.meta)
        return census

    censuses = {"loky": traced_once_each(census_knob(TINY, plan, execution=Execution(jobs=2, backend="loky",
                                                                                     progress=False)), "loky")}
    # A Nanny writes OMP_NUM_THREADS and more into this process's os.environ (tests/test_sweep.py's Dask test)
    with mock.patch.dict(os.environ), distributed.LocalCluster(n_workers=2, threads_per_worker=2, processes=True,
                                                               dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        censuses["dask"] = traced_once_each(census_knob(TINY, plan, execution=Execution(client=client,
                                                                                        progress=False)), "dask")
    assert TINY.traces_here() == 0  # the workers traced; this process did not
    censuses["sequential"] = traced_once_each(census_knob(TINY, plan), "sequential", processes=1)
    with torch_on_one_thread():
        censuses["fork"] = traced_once_each(census_knob(TINY, plan, execution=Execution(jobs=2, backend="fork",
                                                                                        progress=False)), "fork")
    assert TINY.traces_here() == 1  # here, once, before the fork: forked workers inherit the joint
    serial = censuses["sequential"].samples
    assert len(serial) > len(plan.grid()) and serial.flat_peak.nunique() > 1  # refined: several rounds
    for backend, census in censuses.items():
        # each knob's peaks and partition side by side first: the shapes alone would not say which evaluation
        # differed, nor whether its partition or the partition's recording did (docs/compile.md, "Executors")
        side_by_side = census.samples.merge(serial, on="knob", how="outer", suffixes=(f" {backend}", " serial"))
        columns = ["knob", *(f"{field} {who}" for field in ("flat_peak", "allocated_peak", "saved_count",
                                                            "recomputed_count", "proxy_saved_bytes", "solver",
                                                            "runtime_estimator")
                             for who in (backend, "serial"))]
        assert len(census.samples) == len(serial), side_by_side[columns].to_string()
        pd.testing.assert_frame_equal(census.samples, serial, obj=backend)


class _InOrder:
    """Workers that evaluate here, in item order (engine.Workers.imap's interface)."""

    def __init__(self, function):
        self.function, self.items = function, []

    def imap(self, items):
        self.items.append(list(items))
        return ((i, self.function(item)) for i, item in enumerate(items))


def test_lowering_phases_send_each_new_partition_to_one_worker_first():
    """Per batch: the workers find every knob's lowering key; the first knob of each key not sent before goes out
    first, the rest after (read from the disk cache then); keys sent in earlier batches go with the rest."""
    from dtrlab.analysis.knob_census import _lowering_phases

    keys = {0.0: "b", 0.8: "a", 0.9: "a", 1.0: "a", 0.5: "c", 0.45: "b"}
    workers = _InOrder(lambda task: keys[task[1]] if task[0] == "key" else pytest.fail("evaluated"))
    lowered: set[str] = set()
    assert _lowering_phases(workers, [0.0, 0.8, 0.9, 1.0], lowered) == [[0.0, 0.8], [0.9, 1.0]]
    assert workers.items == [[("key", 0.0), ("key", 0.8), ("key", 0.9), ("key", 1.0)]] and lowered == {"a", "b"}
    assert _lowering_phases(workers, [0.45, 0.5], lowered) == [[0.5], [0.45]] and lowered == {"a", "b", "c"}
    assert _lowering_phases(workers, [0.45], lowered) == [[0.45]]


@contextlib.contextmanager
def torch_on_one_thread():
    """torch on one intra-op thread while workers are forked that run it (the partitioner's knapsack on real
    tensors): a child forked after this process ran a parallel kernel can hang in its first parallel region on the
    copied OpenMP pool (docs/compile.md "Executors"), and on one thread torch enters none. By then a test process
    has run other tests' kernels (one forked census test stopped for 13 minutes in a file-alone run on 7 December,
    not located)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def test_forked_workers_lower_each_partition_once_and_give_the_serial_census(tmp_path, monkeypatch):
    """Under Inductor with the disk cache, two forked workers share the census's lowerings: each distinct partition
    (by disk key) is lowered by one worker only, the others read it, and the samples are the serial census's (its
    own cache, the joint's memo forgotten in between so that the workers lower afresh). The serial census needs no
    phases (its memo shares its lowerings)."""
    import warnings

    pytest.importorskip("torch")
    from dtrlab.analysis import knob_census
    from dtrlab.trace.torch_compile.lowering_cache import cache_entries

    phased = []
    split = knob_census._lowering_phases
    monkeypatch.setattr(knob_census, "_lowering_phases", lambda *args: phased.append(1) or split(*args))
    source = KnobSource("tests.test_partition:tiny_mlp", backend="inductor")
    plan = KnobPlan(knobs=(1.0, 0.9, 0.8, 0.0), resolution=1.0)  # four knobs, two partitions, no refinement
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        serial = census_knob(dataclasses.replace(source, cache=str(tmp_path / "serial")), plan)
        assert not phased
        joint = source.joint()
        distinct = len(cache_entries(tmp_path / "serial"))
        assert serial.meta["lowered_per_process"] == [distinct] and 1 < distinct < len(plan.grid())
        for part in joint.parts or (joint,):
            part.lowerings.clear()
            part.lowered_records.clear()
        with torch_on_one_thread():
            forked = census_knob(dataclasses.replace(source, cache=str(tmp_path / "forked")), plan,
                                 execution=Execution(jobs=2, backend="fork", progress=False))
    assert forked.meta["execution"] == "fork" and phased == [1]
    assert sum(forked.meta["lowered_per_process"]) == distinct == len(cache_entries(tmp_path / "forked"))
    pd.testing.assert_frame_equal(forked.samples, serial.samples)


@pytest.mark.slow  # two loky workers trace the tiny MLP: ~30 s
def test_cli_runs_the_census_on_loky_workers(capsys, tmp_path):
    from dtrlab.cli import main

    argv = ["knob", "tests.test_partition:tiny_mlp", "--batch", "256", "--backend", "aot_eager", "--knobs",
            "0,0.25,0.5,0.75,1", "--resolution", "0.5", "-j", "2", "--executor", "loky", "--out", str(tmp_path),
            "--quiet"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    (path,) = tmp_path.glob("*.json")
    census = read_census(path)
    assert census.meta["execution"] == "loky" and census.meta["traces_per_process"] == [1] * census.meta["processes"]
    assert census.samples.knob.tolist() == [0.0, 0.25, 0.5, 0.75, 1.0] and census.samples.flat_peak.nunique() == 2
    assert "aot_eager accounting" in out and "CPU Inductor" not in out  # the GPU line is the Inductor census's


# ------------------------------------------------------------------ unit tests on hand-made curves and frames
# Written for the survivors of mutation testing (docs/reproduce.md): each expected value is derived by hand from
# the planted curve or the hand-made samples, or comes from a run of the simulator (dtr_beside_knob's DTR columns).

#: On KnobPlan(step=0.1, resolution=0.06) a planted curve is sampled at 0, 0.1, .., 1 and each differing pair of
#: grid neighbours once at its midpoint (0.05 from both ends, in floating point a little more or less: no further
#: bisection).
COARSE = KnobPlan(step=0.1, resolution=0.06)
#: 40 below 0.3, 60 on [0.3, 0.5), 45 on [0.5, 0.8), 55 from 0.8: on COARSE the samples are the 11 grid knobs and
#: the midpoints 0.25 (40), 0.45 (60) and 0.75 (45).
HUMP = planted([0.3, 0.5, 0.8], [40, 60, 45, 55])


def hand_samples(knobs, peaks):
    """A census's samples made by hand: the same peaks under every accounting."""
    return pd.DataFrame({"knob": knobs, **{accounting: peaks for accounting in ACCOUNTINGS}})


def test_analyse_every_table_of_a_hand_made_curve():
    """Peaks 50, 80, 40, 60, 40 at knobs 0..0.4, derived by hand. The lowest peak at a larger knob (its first knob):
    40 at 0.2 for knobs 0 and 0.1, 40 at 0.4 for 0.2 and 0.3. Knobs 0, 0.1 (beaten by 40 at 0.2: rise 80/40) and
    0.3 (beaten by 40 at 0.4: 1.5) form two regions. Fitting sets per level: 40 fits 0.2 and 0.4 (hole 0.3);
    50 adds 0 (holes 0.1 and 0.3); 60 adds 0.3 (hole 0.1); 80 fits all."""
    samples = hand_samples([0.3, 0.0, 0.4, 0.2, 0.1], [60, 50, 40, 40, 80])  # shuffled: analyse sorts by knob
    census = analyse(samples, KnobPlan(accountings=("flat_peak",)), "hand")
    assert census.name == "hand" and census.samples.knob.tolist() == [0.0, 0.1, 0.2, 0.3, 0.4]
    assert census.samples.index.tolist() == [0, 1, 2, 3, 4] and census.samples.flat_peak.tolist() == [50, 80, 40, 60, 40]
    expected = {
        "changes": pd.DataFrame([["flat_peak", 0.0, 0.1, 50, 80, False], ["flat_peak", 0.1, 0.2, 80, 40, True],
                                 ["flat_peak", 0.2, 0.3, 40, 60, False], ["flat_peak", 0.3, 0.4, 60, 40, True]],
                                columns=["accounting", "knob_below", "knob_above", "peak_below", "peak_above",
                                         "against"]),
        "regions": pd.DataFrame([["flat_peak", 0.0, 0.1, 80, 0.2, 40, 2.0], ["flat_peak", 0.3, 0.3, 60, 0.4, 40, 1.5]],
                                columns=["accounting", "knob_from", "knob_to", "peak_max", "beaten_by_knob",
                                         "beaten_by_peak", "rise"]),
        "holes": pd.DataFrame([["flat_peak", 40, 49, 0.3, 0.3, 0.2, 0.4], ["flat_peak", 50, 59, 0.1, 0.1, 0.0, 0.2],
                               ["flat_peak", 50, 59, 0.3, 0.3, 0.2, 0.4], ["flat_peak", 60, 79, 0.1, 0.1, 0.0, 0.2]],
                              columns=["accounting", "budget_from", "budget_to", "knob_from", "knob_to", "fits_below",
                                       "fits_above"]),
        "knob_map": pd.DataFrame([["flat_peak", 40, 49, 0.4, 0.2, 1, False], ["flat_peak", 50, 59, 0.4, 0.0, 2, False],
                                  ["flat_peak", 60, 79, 0.4, 0.0, 1, False], ["flat_peak", 80, None, 0.4, 0.0, 0, True]],
                                 columns=["accounting", "budget_from", "budget_to", "largest_fitting_knob",
                                          "smallest_fitting_knob", "holes", "lowering_is_safe"]),
        "summary": pd.DataFrame([{"accounting": "flat_peak", "min_peak": 40, "largest_knob_at_min": 0.4,
                                  "smallest_knob_at_min": 0.2, "peak_at_lowest_knob": 50, "peak_at_highest_knob": 40,
                                  "changes": 4, "against_changes": 2, "regions": 2, "hole_levels": 3,
                                  "worst_rise": 2.0, "worst_rise_knob_low": 0.1, "worst_rise_knob_high": 0.2}]),
    }
    for table, frame in expected.items():
        pd.testing.assert_frame_equal(getattr(census, table), frame, obj=table)


def test_analyse_a_monotone_curve_and_a_zero_peak():
    """A rising curve: no change against the knob, no region, no hole, the worst rise 1 at no knob. Peaks 0, 5, 0:
    the knob 0.5 is beaten by a zero peak (its rise infinite, its first zero at a larger knob 1.0), and no ratio over
    a zero peak counts toward the worst rise."""
    rising = analyse(hand_samples([0.0, 0.5, 1.0], [10, 20, 20]), KnobPlan(accountings=("reserved_peak",)))
    assert rising.changes.against.tolist() == [False] and rising.regions.empty and rising.holes.empty
    assert rising.name == "" and list(rising.regions.columns) == ["accounting", "knob_from", "knob_to", "peak_max",
                                                                   "beaten_by_knob", "beaten_by_peak", "rise"]
    assert list(rising.holes.columns) == ["accounting", "budget_from", "budget_to", "knob_from", "knob_to",
                                          "fits_below", "fits_above"]
    flat = analyse(hand_samples([0.0, 1.0], [10, 10]), KnobPlan(accountings=("flat_peak",)))
    assert flat.changes.empty and list(flat.changes.columns) == ["accounting", "knob_below", "knob_above",
                                                                 "peak_below", "peak_above", "against"]
    none = analyse(hand_samples([0.0, 1.0], [10, 10]), KnobPlan(accountings=()))
    assert none.knob_map.empty and list(none.knob_map.columns) == ["accounting", "budget_from", "budget_to",
                                                                   "largest_fitting_knob", "smallest_fitting_knob",
                                                                   "holes", "lowering_is_safe"]
    summary = rising.summary.iloc[0].to_dict()
    assert summary["accounting"] == "reserved_peak" and summary["worst_rise"] == 1.0
    assert summary["worst_rise_knob_low"] is None and summary["worst_rise_knob_high"] is None
    assert (summary["largest_knob_at_min"], summary["smallest_knob_at_min"], summary["changes"]) == (0.0, 0.0, 1)
    assert rising.knob_map.budget_to.fillna(-1).tolist() == [19, -1] and rising.knob_map.lowering_is_safe.tolist() == [True, True]
    zero = analyse(hand_samples([0.0, 0.5, 1.0], [0, 5, 0]), KnobPlan(accountings=("flat_peak",)))
    assert zero.regions[["knob_from", "knob_to", "peak_max", "beaten_by_knob", "beaten_by_peak"]].values.tolist() == \
        [[0.5, 0.5, 5, 1.0, 0]] and zero.regions.rise.tolist() == [float("inf")]
    assert zero.summary.worst_rise.tolist() == [1.0] and zero.summary.largest_knob_at_min.tolist() == [1.0]
    assert zero.holes[["budget_from", "budget_to", "knob_from", "fits_below", "fits_above"]].values.tolist() == \
        [[0, 4, 0.5, 0.0, 1.0]]


def test_regions_run_to_the_last_beaten_knob():
    """Peaks 30, 30, 20, 30, 10, 40: knobs 0..0.3 are all beaten (by 10 at 0.4), in one region; 0.4 and the last
    knob are not."""
    census = analyse(hand_samples([0.0, 0.1, 0.2, 0.3, 0.4, 0.5], [30, 30, 20, 30, 10, 40]),
                     KnobPlan(accountings=("flat_peak",)))
    assert census.regions.drop(columns="accounting").values.tolist() == [[0.0, 0.3, 30, 0.4, 10, 3.0]]
    assert census.summary.worst_rise.tolist() == [3.0] and census.summary.worst_rise_knob_low.tolist() == [0.0]
    assert census.summary.worst_rise_knob_high.tolist() == [0.4]
    one_byte = analyse(hand_samples([0.0, 0.5], [5, 1]), KnobPlan(accountings=("flat_peak",)))
    assert one_byte.summary[["worst_rise", "worst_rise_knob_low", "worst_rise_knob_high"]].values.tolist() == \
        [[5.0, 0.0, 0.5]]
    tail = analyse(hand_samples([0.0, 0.1, 0.2], [10, 30, 20]), KnobPlan(accountings=("flat_peak",)))
    assert tail.regions.drop(columns="accounting").values.tolist() == [[0.1, 0.1, 30, 0.2, 20, 1.5]]


@pytest.mark.parametrize("budget, says", [
    (30, "no knob value fits"),
    (40, "largest knob that fits 0.25; every smaller knob fits too"),
    (50, "largest knob that fits 0.75; lowering it is NOT safe: knobs 0.3..0.45 do not fit"),
    (55, "largest knob that fits 1; lowering it is NOT safe: knobs 0.3..0.45 do not fit"),
    (60, "largest knob that fits 1; every smaller knob fits too"),
])
def test_knob_choices_on_the_hump_word_for_word(budget, says):
    census = census_knob(HUMP, COARSE)
    choice = census.knob_for_budget(budget, "flat_peak")
    assert choice.describe() == says
    assert (choice.budget, choice.accounting) == (budget, "flat_peak")


def test_knob_choice_describes_holes_and_a_missing_low_end():
    from dtrlab.analysis.knob_census import KnobChoice

    two = KnobChoice(50, "flat_peak", 0.9, 0.0, False, ((0.1, 0.2), (0.5, 0.5)))
    assert two.describe() == "largest knob that fits 0.9; lowering it is NOT safe: knobs 0.1..0.2, 0.5..0.5 do not fit"
    low = KnobChoice(50, "flat_peak", 0.9, 0.4, False, ())
    assert low.describe() == "largest knob that fits 0.9; lowering it is NOT safe: knobs below 0.4 do not fit"
    # Knobs 0.0 and 0.1 fail at 45 (peak 60), 0.2 and 0.3 fit: the choice names the fitting ends, and no hole.
    census = analyse(hand_samples([0.0, 0.1, 0.2, 0.3], [60, 60, 45, 40]), KnobPlan(accountings=("flat_peak",)))
    choice = census.knob_for_budget(45.9, "flat_peak")
    assert (choice.budget, choice.largest_fitting_knob, choice.smallest_fitting_knob, choice.holes) == (45, 0.3, 0.2, ())
    assert not choice.lowering_is_safe and census.knob_for_budget(45).accounting == "allocated_peak"


def test_plans_describe_themselves_word_for_word():
    assert KnobPlan().describe() == "0:1:0.01, every change refined to 0.0001"
    assert KnobPlan(low=0.25, high=0.75, step=0.05, resolution=0.001).describe() == \
        "0.25:0.75:0.05, every change refined to 0.001"
    listed = KnobPlan(low=0.05, high=0.15, knobs=(0.15, 0.05, 0.15), refine="against", resolution=0.5)
    assert listed.describe() == "0.05,0.15, every change against the knob refined to 0.5"
    assert listed.grid() == [0.05, 0.15]


def test_plan_grids_and_refusals():
    assert KnobPlan(low=0.2, high=0.5, step=0.1).grid() == [0.2, 0.3, 0.4, 0.5]
    assert KnobPlan(low=0.2, high=0.45, step=0.1).grid() == [0.2, 0.3, 0.4, 0.45]  # high is always evaluated
    assert KnobPlan(low=0.5, high=0.5).grid() == [0.5] and KnobPlan(low=0, high=1, step=1).grid() == [0.0, 1.0]
    assert KnobPlan(knobs=(1 / 3,)).grid() == [0.333333333333]
    with pytest.raises(ValueError, match=r"^knob values are fractions in \[0, 1\] \(activation_memory_budget\), "
                                         r"got \[0.0, 1.0, 0.5, inf\]$"):
        KnobPlan(knobs=(0.5, float("inf")))
    with pytest.raises(ValueError, match=r"got \[0.0, 1.0, '0.5'\]$"):
        KnobPlan(knobs=("0.5",))
    with pytest.raises(ValueError, match=r"^the knob range runs from low to high, got 0.6:0.5$"):
        KnobPlan(low=0.6, high=0.5)
    for step in (0.0, -0.1, float("inf")):
        with pytest.raises(ValueError, match=rf"^the knob step must be > 0, got {step}$"):
            KnobPlan(step=step)
    for resolution in (0.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=rf"^the resolution must be > 0, got {resolution}$"):
            KnobPlan(resolution=resolution)
    with pytest.raises(ValueError, match=r"^refine is one of changes, against, got 'all'$"):
        KnobPlan(refine="all")
    assert KnobPlan(low=0, high=1, knobs=(0, 1)).grid() == [0.0, 1.0]  # both ends are fractions


def test_parse_knobs_fields_and_refusal_word_for_word():
    assert parse_knobs(" 0.1:0.9:0.2 ") == {"low": 0.1, "high": 0.9, "step": 0.2}
    assert parse_knobs("0.15,0.05") == {"low": 0.05, "high": 0.15, "knobs": (0.15, 0.05)}
    for text in ("0:1:0.1:0.2", "0,x"):
        with pytest.raises(ValueError, match=r"^expected START:STOP:STEP such as 0:1:0.01, or a list such as "
                                             rf"0.05,0.15; got '{text}'$"):
            parse_knobs(text)


def test_a_census_counts_its_progress_in_one_line(capsys):
    """The hump on COARSE: 11 grid knobs, then 3 midpoints, counted on one stage line (stderr is no terminal)."""
    census_knob(HUMP, COARSE, name="hump", execution=Execution(progress=True))
    err = capsys.readouterr().err
    assert err.startswith("knob hump: 14/14 knob in ") and err.endswith(" s\n") and err.count("\n") == 1
    census_knob(HUMP, COARSE, execution=Execution(progress=True))
    assert capsys.readouterr().err.startswith("knob: 14/14 knob in ")
    census_knob(HUMP, COARSE)  # quiet by default
    census_knob(HUMP, COARSE, execution=Execution(progress=False))
    assert capsys.readouterr().err == ""


def test_the_evaluation_limit_bounds_the_grid_and_each_round():
    calls: list[float] = []
    census = census_knob(planted([0.3, 0.5, 0.8], [40, 60, 45, 55], calls), KnobPlan(step=0.1, resolution=0.06,
                                                                                      max_evaluations=5))
    assert calls == [0.0, 0.1, 0.2, 0.3, 0.4] and census.samples.source.tolist() == ["grid"] * 5
    calls.clear()
    census = census_knob(planted([0.3, 0.5, 0.8], [40, 60, 45, 55], calls), KnobPlan(step=0.1, resolution=0.06,
                                                                                      max_evaluations=13))
    assert calls[11:] == [0.25, 0.45] and census.samples.source.tolist().count("refine") == 2
    assert not census.meta["refinement_complete"]


def test_a_census_records_where_it_ran():
    import time

    started = time.perf_counter()
    census = census_knob(HUMP, COARSE, name="hump")
    took = time.perf_counter() - started
    assert census.meta == {"refinement_complete": True, "jobs": 1, "execution": "sequential", "processes": 1}
    assert census.name == "hump" and census.plan == COARSE and 0 < census.seconds <= took
    assert census.samples.knob.tolist() == [0.0, 0.1, 0.2, 0.25, 0.3, 0.4, 0.45, 0.5, 0.6, 0.7, 0.75, 0.8, 0.9, 1.0]
    assert census.samples.source.tolist() == ["grid"] * 3 + ["refine"] + ["grid"] * 2 + ["refine"] + \
        ["grid"] * 3 + ["refine"] + ["grid"] * 3
    assert census.samples.flat_peak.tolist() == [40] * 4 + [60] * 3 + [45] * 4 + [55] * 3
    mixed = census_knob(lambda knob: {**HUMP(knob), "backend": "aot_eager" if knob < 0.5 else "eager"}, COARSE)
    assert mixed.meta["backend"] == "aot_eager,eager" and "gpu_answer" not in mixed.meta


@dataclasses.dataclass(frozen=True)
class PlantedSource(KnobSource):
    """A KnobSource whose knobs are the hump's, without tracing a model (the census treats it as any source: it
    asks for its joint before the first knob and how often this process traced it)."""

    def joint(self):
        return None

    def traces_here(self) -> int:
        return 1

    def __call__(self, knob: float) -> dict:
        return {**HUMP(knob), "backend": self.backend}


def test_a_knob_source_census_names_its_traces_and_its_lowering_device():
    cpu = census_knob(PlantedSource("planted"), COARSE)
    assert cpu.meta["traces_per_process"] == [1] and cpu.meta["backend"] == "inductor"
    assert cpu.meta["inductor_lowering"] == "cpu" and cpu.meta["gpu_answer"] == gpu_answer({"backend": "inductor"})
    cuda = census_knob(PlantedSource("planted", (("device", "cuda"), ("batch", 2))), COARSE)
    assert cuda.meta["inductor_lowering"] == "cuda" and cuda.meta["gpu_answer"] is None
    aot = census_knob(PlantedSource("planted", backend="aot_eager"), COARSE)
    assert aot.meta["traces_per_process"] == [1] and "inductor_lowering" not in aot.meta


def test_gpu_answer_for_each_backend_and_device():
    from dtrlab.analysis.knob_census import CPU_INDUCTOR_ANSWER

    assert gpu_answer({}) is None and gpu_answer({"backend": "aot_eager"}) is None
    assert gpu_answer({"backend": "inductor"}) == CPU_INDUCTOR_ANSWER
    assert gpu_answer({"backend": "aot_eager,inductor", "inductor_lowering": "cpu"}) == CPU_INDUCTOR_ANSWER
    assert CPU_INDUCTOR_ANSWER.startswith("Inductor accounting: CPU Inductor's lowering (give --device with a GPU")


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf"), "12"])
def test_an_evaluation_that_is_no_byte_count_is_refused_word_for_word(value):
    def evaluate(knob):
        return {**HUMP(knob), "reserved_peak": value if knob > 0.35 else 10}
    with pytest.raises(ValueError, match=rf"^the evaluation at knob 0.4 gave reserved_peak={value!r}; "
                                         r"expected bytes >= 0$"):
        census_knob(evaluate, COARSE)
    assert census_knob(planted([0.5], [0, 1]), COARSE).summary.min_peak.tolist() == [0, 0, 0]


def test_resolution_is_an_inclusive_width():
    """Knobs 0.5 and 0.75 (exact in binary) with different peaks and a resolution of 0.25: already resolved, so not
    bisected, and check_resolution finds nothing wide; at 0.2 the pair is wide, for each accounting it differs in."""
    calls: list[float] = []
    plan = KnobPlan(low=0.5, high=0.75, knobs=(0.5, 0.75), resolution=0.25)
    census = census_knob(planted([0.6], [20, 10], calls), plan)
    assert calls == [0.5, 0.75] and census.check_resolution() == []
    against = dataclasses.replace(plan, refine="against")
    assert census_knob(planted([0.6], [20, 10]), against).check_resolution() == []
    samples = hand_samples([0.5, 0.75], [20, 10]).assign(reserved_peak=[10, 10])
    wide = analyse(samples, dataclasses.replace(plan, resolution=0.2))
    assert wide.check_resolution() == [("flat_peak", 0.5, 0.75), ("allocated_peak", 0.5, 0.75)]
    peaks = census.curve("flat_peak")
    assert peaks == ([0.5, 0.75], [20, 10]) and {type(p) for p in peaks[1]} == {int}


def test_bisection_stops_where_rounding_leaves_no_midpoint():
    """Knobs 2e-12 apart, with a resolution below that: one midpoint (0.100000000001), then none survives the
    rounding to 12 decimals, so the census stops short of the resolution instead of evaluating a knob twice."""
    calls: list[float] = []
    census = census_knob(planted([0.1000000000005], [1, 2], calls),
                         KnobPlan(low=0.1, high=0.100000000002, knobs=(0.1, 0.100000000002), resolution=1e-13))
    assert calls == [0.1, 0.100000000002, 0.100000000001] and not census.meta["refinement_complete"]
    # Here both midpoints round up to the upper knob (0.100000000002 and 0.100000000003).
    calls.clear()
    census_knob(planted([0.1000000000015, 0.1000000000025], [1, 2, 3], calls),
                KnobPlan(low=0.1, high=0.2, knobs=(0.100000000001, 0.100000000003), resolution=1e-13))
    assert calls == [0.100000000001, 0.100000000003, 0.100000000002]


def test_written_census_document(tmp_path):
    """The JSON beside the tables: the plan, the summary (missing values as null), the meta, and each table's
    sha256; a census without a name is written as census-*."""
    import hashlib
    import json

    import pyarrow.parquet

    census = census_knob(planted([0.5], [10, 20]), COARSE)
    census.meta["note"] = "planted"
    paths = write_census(census, tmp_path / "deep" / "er")
    names = ["census-samples.parquet", "census-changes.parquet", "census-regions.parquet", "census-holes.parquet",
             "census-knob_map.parquet", "census.json"]
    assert paths == [tmp_path / "deep" / "er" / name for name in names]
    document = json.loads(paths[-1].read_text())
    assert document["format"] == "dtrlab-knob-census-1" and document["name"] == ""
    assert document["plan"] == {"low": 0.0, "high": 1.0, "step": 0.1, "resolution": 0.06, "knobs": None,
                                "accountings": list(ACCOUNTINGS), "max_evaluations": 5000, "refine": "changes"}
    assert document["seconds"] == census.seconds and document["meta"]["note"] == "planted"
    assert document["files"] == {name: hashlib.sha256(path.read_bytes()).hexdigest()
                                 for name, path in zip(names[:-1], paths)}
    flat = document["summary"][0]
    assert flat["accounting"] == "flat_peak" and flat["min_peak"] == 10 and flat["worst_rise_knob_low"] is None
    assert pd.read_parquet(paths[0]).knob.tolist() == census.samples.knob.tolist()
    assert pyarrow.parquet.read_schema(paths[0]).names == list(census.samples.columns)  # no index column
    again = read_census(paths[-1])
    assert again.name == "" and again.meta["note"] == "planted" and again.seconds == census.seconds


def test_read_census_restores_a_listed_plan_and_refuses_what_is_no_census(tmp_path):
    import json

    plan = KnobPlan(low=0.1, high=0.9, knobs=(0.9, 0.1, 0.5), accountings=("flat_peak",), refine="against")
    census = census_knob(HUMP, plan, name="listed")
    write_census(census, tmp_path)
    again = read_census(tmp_path / "listed.json")
    assert again.plan == plan and again.plan.knobs == (0.9, 0.1, 0.5) and again.name == "listed"
    assert again.samples.equals(census.samples)
    document = json.loads((tmp_path / "listed.json").read_text())
    for bad in ({**document, "format": "dtrlab-knob-census-0"}, [document]):
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        with pytest.raises(IntegrityError, match=r"bad.json is not a dtrlab knob census \(dtrlab-knob-census-1\)$"):
            read_census(tmp_path / "bad.json")


def test_dtr_beside_the_knob_on_the_chain(capsys, tmp_path, monkeypatch):
    """The hump's census against tests/chains.py's chain (baseline compute 10, peak 50; DTR passes from 40 bytes,
    recomputing 6 below 50). The knob columns by hand: at 40 only knobs below 0.3 fit (the largest 0.25, recompute
    0.75, overhead 1 + 0.75 / 10), at 45 and 50 also 0.5..0.75 (0.75: recompute 0.25), at 60 every knob. The DTR
    and monotone columns are the simulator's own runs."""
    from dtrlab.runtime import simulate
    from dtrlab.sweep.execution import SERIAL

    trace = chain_trace()
    census = census_knob(HUMP, COARSE)
    monkeypatch.setenv("DTRLAB_CACHE", str(tmp_path / "default"))
    table = dtr_beside_knob(census, trace, budgets=[60, 45.5, 30, 40, 50, 45],
                            execution=SERIAL.with_(cache=False, progress=False))
    assert capsys.readouterr().err == "" and not (tmp_path / "default").exists()  # the execution given, quiet
    assert list(table.columns) == ["budget_bytes", "knob_fits", "largest_fitting_knob", "knob_lowering_is_safe",
                                   "knob_recompute_flops", "knob_overhead", "dtr_status", "dtr_remat_compute",
                                   "dtr_overhead", "monotone_status", "monotone_overhead"]
    assert table.budget_bytes.tolist() == [30, 40, 45, 50, 60]
    assert table.knob_fits.tolist() == [False, True, True, True, True]
    assert table.largest_fitting_knob.tolist()[1:] == [0.25, 0.75, 0.75, 1.0]
    assert pd.isna(table.largest_fitting_knob.iloc[0])
    assert table.knob_lowering_is_safe.tolist() == [False, True, False, False, True]
    assert table.knob_recompute_flops.round(9).tolist()[1:] == [0.75, 0.25, 0.25, 0.0]
    assert table.knob_overhead.round(9).tolist()[1:] == [1.075, 1.025, 1.025, 1.0]
    assert pd.isna(table.knob_recompute_flops.iloc[0]) and pd.isna(table.knob_overhead.iloc[0])
    assert table.dtr_remat_compute.tolist()[1:] == [6, 6, 0, 0]
    for row in table.itertuples():
        dtr = simulate(trace, "dtr", budget_bytes=row.budget_bytes)
        monotone = simulate(trace, "monotone", budget_bytes=row.budget_bytes)
        assert (row.dtr_status, row.dtr_remat_compute, row.dtr_overhead) == (dtr.status, dtr.remat_compute, dtr.overhead)
        assert (row.monotone_status, row.monotone_overhead) == (monotone.status, monotone.overhead)
    assert table.dtr_status.tolist()[0] != "pass"


def test_dtr_beside_the_knob_reads_ratios_and_each_accountings_semantics():
    """Ratios of the chain's 50-byte peak (simrd's int(peak x ratio)): the default 0.05..1 every 0.01 gives every
    byte from 2 to 50. Under the caching allocator each of the chain's 10-byte tensors takes a 512-byte block and
    the step one 2 MiB segment: a budget of 2560 bytes (five blocks) holds the allocated peak, not the reserved one.
    Statuses come from the simulator under each accounting's semantics; monotone(dtr) is run on flat memory only."""
    from dtrlab.runtime import simulate
    from dtrlab.runtime.semantics import Semantics
    from dtrlab.sweep.execution import SERIAL

    trace = chain_trace()
    census = census_knob(HUMP, COARSE)
    quiet = SERIAL.with_(cache=False, progress=False)
    assert dtr_beside_knob(census, trace, execution=quiet).budget_bytes.tolist() == list(range(2, 51))
    assert dtr_beside_knob(census, trace, ratios="0.8,1", execution=quiet).budget_bytes.tolist() == [40, 50]
    budgets = [2000, 2560, 2 * MIB]
    statuses = {}
    for accounting, semantics in [("allocated_peak", Semantics(memory="caching", enforce="allocated")),
                                  ("reserved_peak", Semantics(memory="caching"))]:
        table = dtr_beside_knob(census, trace, accounting, budgets=budgets, execution=quiet)
        statuses[accounting] = table.dtr_status.tolist()
        assert statuses[accounting] == [simulate(trace, "dtr", budget_bytes=b, semantics=semantics).status
                                        for b in budgets]
        assert table.monotone_status.tolist() == [None] * 3 and table.monotone_overhead.isna().all()
        assert table.knob_fits.all()  # the hump's peaks are tens of bytes under every accounting
    assert statuses["allocated_peak"][1] == "pass" and statuses["reserved_peak"][1] != "pass"
    flat = dtr_beside_knob(census, trace, "flat_peak", budgets=[45], semantics=Semantics(memory="caching"),
                           execution=quiet)
    assert flat.dtr_status.tolist() != ["pass"] and flat.monotone_status.tolist() == [None]


@pytest.fixture
def recorded_tracing(monkeypatch) -> list:
    """KnobSource with torch's tracing and partitioning replaced by recorders (this process's memo and counts put
    aside): the list of (source, options) traced; a knob's row names how it was evaluated and with what."""
    import dtrlab.analysis.knob_census as knob_census
    import dtrlab.analysis.knob_solvers as knob_solvers
    import dtrlab.memory.partitioned as partitioned
    import dtrlab.trace.torch_compile.inductor as inductor
    import dtrlab.trace.torch_compile.tracing as tracing

    traced = []
    monkeypatch.setattr(knob_census, "_JOINT_MEMO", {})
    monkeypatch.setattr(knob_census, "_JOINT_TRACES", {})
    monkeypatch.setattr(tracing, "trace_joint",
                        lambda source, **options: traced.append((source, options)) or f"joint of {source}")
    peaks = {accounting: 1 for accounting in ACCOUNTINGS}
    monkeypatch.setattr(partitioned, "knob_peaks",
                        lambda joint, knob, **options: {"how": "plain", "joint": joint, "knob": knob, **options, **peaks})
    monkeypatch.setattr(knob_solvers, "watched_peaks",
                        lambda joint, knob, **options: {"how": "watched", "joint": joint, "knob": knob, **options,
                                                        **peaks})
    # Inductor's lowering keys (each knob its own partition) and counts, of these stand-in joints
    monkeypatch.setattr(inductor, "lowering_key", lambda joint, knob, **options: f"{joint} at {knob}")
    monkeypatch.setattr(knob_census.KnobSource, "lowered_here", lambda self: 0)
    return traced


def test_a_knob_source_traces_its_joint_once_per_process_and_source(recorded_tracing):
    """The first knob traces the joint with the source's options and backend, later knobs reuse it, each knob goes
    to knob_peaks (or watched_peaks when watched) with the source's solver, and another source's joint replaces
    it, so the first source is traced again."""
    import dtrlab.analysis.knob_census as knob_census

    traced = recorded_tracing
    first = KnobSource("model:a", (("batch", 2),), backend="aot_eager", solver="greedy")
    assert first.traces_here() == 0 and first.joint_key == ("model:a", (("batch", 2),), "aot_eager")
    peaks = {accounting: 1 for accounting in ACCOUNTINGS}
    assert first(0.5) == {"how": "plain", "joint": "joint of model:a", "knob": 0.5, "solver": "greedy", **peaks}
    assert first(0.25)["knob"] == 0.25 and first.joint() == "joint of model:a"
    assert traced == [("model:a", {"backend": "aot_eager", "batch": 2})] and first.traces_here() == 1
    watched = KnobSource("model:b", watched=True, solver="dp", runtime_estimator="flops")
    assert watched(0.1) == {"how": "watched", "joint": "joint of model:b", "knob": 0.1, "solver": "dp",
                            "runtime_estimator": "flops", "cache": True, **peaks}
    assert traced[1:] == [("model:b", {"backend": "inductor"})] and watched.traces_here() == 1
    assert first(0.5)["joint"] == "joint of model:a" and first.traces_here() == 2 and len(traced) == 3
    assert knob_census._JOINT_MEMO == {"key": first.joint_key, "joint": "joint of model:a"}


def test_a_knob_source_is_traced_here_before_forked_workers(recorded_tracing):
    """Forked workers inherit the joint traced here (and the recorders): this process traced once, the workers
    none."""
    census = census_knob(KnobSource("model:a"), KnobPlan(knobs=(0.0, 0.5, 1.0)),
                         execution=Execution(jobs=2, backend="fork", progress=False))
    assert recorded_tracing == [("model:a", {"backend": "inductor"})]
    assert census.meta["execution"] == "fork" and census.meta["traces_per_process"] == [1] * census.meta["processes"]
    assert census.samples.joint.tolist() == ["joint of model:a"] * 3


# ------------------------------------------------------------------ a shipped census served only for its own graph
def test_a_shipped_census_is_served_only_for_its_own_graph_torch_configuration_and_plan(tmp_path, monkeypatch):
    import functools

    import torch
    import torch._functorch.config as functorch_config

    from dtrlab.analysis.knob_census import shipped_census_for
    from dtrlab.integrity import write_manifest
    from dtrlab.memory.partitioned import knob_peaks
    from dtrlab.trace.torch_compile.joint import joint_hash
    from dtrlab.trace.torch_compile.tracing import trace_joint

    joint = trace_joint("tests.test_partition:tiny_mlp")
    plan = KnobPlan(step=0.5, resolution=0.25, refine="against")
    census = census_knob(functools.partial(knob_peaks, joint), plan, name="tiny")
    census.meta.update(graph_hash=joint_hash(joint), torch_version=torch.__version__)
    write_census(census, tmp_path / "knob")
    write_manifest(tmp_path)
    path = tmp_path / "knob" / "tiny.json"
    served, how = shipped_census_for(path, joint, plan, tmp_path)
    assert served.samples.equals(census.samples) and served.holes.equals(census.holes)
    assert how == f"read from {path} (the same joint graph, torch {torch.__version__} and plan)"
    other_plan = KnobPlan(step=0.25, resolution=0.25, refine="against")
    assert shipped_census_for(path, joint, other_plan, tmp_path) == (None, "computed (tiny.json is of another plan)")
    other_graph = trace_joint("tests.test_partition:tiny_mlp", batch=8)
    assert shipped_census_for(path, other_graph, plan, tmp_path) == (None,
                                                                     "computed (tiny.json is of another joint graph)")
    with functorch_config.patch(activation_memory_budget_solver="greedy"):
        assert shipped_census_for(path, joint, plan, tmp_path)[1] == "computed (tiny.json is of another partitioner " \
                                                                      "configuration)"
    with monkeypatch.context() as patched:
        patched.setattr(torch, "__version__", "2.0.0")
        assert shipped_census_for(path, joint, plan, tmp_path)[1] == \
            f"computed (tiny.json is of torch {census.meta['torch_version']})"
    assert shipped_census_for(tmp_path / "none.json", joint, plan, tmp_path) == (
        None, f"computed (no shipped census at {tmp_path / 'none.json'})")
    samples = tmp_path / "knob" / "tiny-samples.parquet"
    samples.write_bytes(samples.read_bytes() + b"damaged")
    served, how = shipped_census_for(path, joint, plan, tmp_path)
    assert served is None and how.startswith("computed (the shipped census is not used: ") and "tiny-samples" in how


def test_notebook_14_defaults_are_the_shipped_census_model_and_plan():
    """dtrlab ship knob --sets notebooks censuses notebook 14's default model on its plan: the two stay one."""
    import json

    from dtrlab.pipeline.ship_knob import NOTEBOOK_PLAN, NOTEBOOKS, capture_options

    cells = json.loads((ROOT / "notebooks" / "14-fit-budget.ipynb").read_text())["cells"]
    parameters = {}
    exec("".join(next(c["source"] for c in cells if "parameters" in c.get("metadata", {}).get("tags", []))),
         parameters)
    command, _ = NOTEBOOKS["14-fit-budget"]
    options = capture_options(command)
    assert parameters["source"] == options.model and parameters["knobs"] == NOTEBOOK_PLAN["knobs"]
    assert {key: getattr(options, key) for key in parameters["build_options"]} == parameters["build_options"]
    assert f'resolution={NOTEBOOK_PLAN["resolution"]}, refine="{NOTEBOOK_PLAN["refine"]}"' in "".join(
        "".join(c["source"]) for c in cells)


def test_the_shipped_notebook_census_verifies():
    from dtrlab.pipeline.ship_knob import census_directory

    census = read_census(census_directory("notebooks", "aot_eager") / "14-fit-budget.json", SHIPPED)
    assert census.meta["refinement_complete"] and census.check_resolution() == []
    assert census.meta["backend"] == "aot_eager" and len(census.meta["graph_hash"]) == 64
