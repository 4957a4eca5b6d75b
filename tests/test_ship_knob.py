"""``dtrlab ship knob``'s backends and plans, the shipped Inductor censuses, and their side-by-side plot."""

from __future__ import annotations

import pytest

from conftest import ROOT
from dtrlab.analysis.knob_census import DEFAULT_PLANS, KnobPlan, census_knob, parse_knobs, read_census
from dtrlab.pipeline import ship_knob

SHIPPED = ROOT / "results" / "shipped"
#: Inductor's default plan, every shipped Inductor census's (CPU or GPU lowering)
INDUCTOR_PLAN = KnobPlan(**parse_knobs(DEFAULT_PLANS["inductor"]["knobs"]),
                         resolution=DEFAULT_PLANS["inductor"]["resolution"], refine=DEFAULT_PLANS["inductor"]["refine"])


@pytest.fixture
def shipped_calls(monkeypatch):
    """``dtrlab ship knob`` with nothing traced or written: (set, name, plan, backend) of each census asked for, and
    the GPU it is lowered for where one is named."""
    calls = []

    def ship_one(set_name, name, command, title, plan, jobs, backend="aot_eager", gpu=None):
        calls.append((set_name, name, plan, backend) + ((gpu,) if gpu else ()))
        return []

    monkeypatch.setattr(ship_knob, "ship_one", ship_one)
    monkeypatch.setattr(ship_knob, "write_manifest", lambda *args: None)
    return calls


@pytest.mark.parametrize("backend, knobs, resolution, refine", [
    ("aot_eager", "0:1:0.01", 1e-4, "changes"), ("inductor", "0:1:0.1", 0.025, "against")])
def test_each_backend_has_its_default_plan(shipped_calls, backend, knobs, resolution, refine):
    from dtrlab.cli import main

    assert main(["ship", "knob", "--sets", "models", "--only", "gpt2-l2-b8-s1024", "--backend", backend]) == 0
    [(set_name, name, plan, used)] = shipped_calls
    assert (set_name, name, used) == ("models", "gpt2-l2-b8-s1024", backend)
    assert plan == KnobPlan(**parse_knobs(knobs), resolution=resolution, refine=refine)


def test_the_notebooks_set_is_notebook_14s_model_on_its_own_plan(shipped_calls):
    from dtrlab.cli import main

    assert main(["ship", "knob", "--sets", "notebooks", "--knobs", "0:1:0.5"]) == 0  # --knobs does not apply
    [(set_name, name, plan, backend)] = shipped_calls
    assert (set_name, name, backend) == ("notebooks", "14-fit-budget", "aot_eager")
    assert plan == KnobPlan(step=0.02, resolution=0.01, refine="against") == ship_knob.notebook_plan()


def test_a_given_option_overrides_the_backends_plan(shipped_calls):
    from dtrlab.cli import main

    assert main(["ship", "knob", "--sets", "traces", "--only", "unet-b2", "--backend", "inductor",
                 "--resolution", "0.05"]) == 0
    [(_, _, plan, backend)] = shipped_calls
    assert backend == "inductor" and plan == KnobPlan(step=0.1, resolution=0.05, refine="against")


@pytest.mark.parametrize("argv, message", [
    (["--backend", "inductor", "--interventions", "0.05", "--only", "llama-tiny-l2-b2-s64"], "aot_eager's only"),
    (["--backend", "inductor", "--knobs", "0:2:0.1"], "fractions in [0, 1]"),
    (["--backend", "tvm"], "invalid choice"),
    (["--device", "H100-80GB"], "--device: a GPU lowering is Inductor's"),
    (["--backend", "inductor", "--device", "H100-80G"], "unknown GPU 'H100-80G' (did you mean 'H100-80GB'?)"),
])
def test_ship_knob_refuses_in_one_line(shipped_calls, capsys, argv, message):
    from dtrlab.cli import main

    try:
        status = main(["ship", "knob", *argv])
    except SystemExit as exit_info:  # argparse's own errors
        status = exit_info.code
    error = capsys.readouterr().err
    assert status == 2 and error.count("\n") == 1 and message in error and "Traceback" not in error
    assert not shipped_calls


def test_an_inductor_census_ships_in_its_own_folder():
    assert ship_knob.census_directory("models", "aot_eager") == SHIPPED / "knob" / "models"
    assert ship_knob.census_directory("models", "inductor") == SHIPPED / "knob" / "models" / "inductor"
    assert ship_knob.census_directory("models", "inductor", "H100-80GB") == \
        SHIPPED / "knob" / "models" / "inductor-H100-80GB"


def test_a_gpu_lowering_is_asked_for_each_model_on_inductors_plan(shipped_calls):
    from dtrlab.cli import main

    assert main(["ship", "knob", "--sets", "traces", "--backend", "inductor", "--device", "H100-80GB"]) == 0
    plan = KnobPlan(step=0.1, resolution=0.025, refine="against")
    assert shipped_calls == [("traces", name, plan, "inductor", "H100-80GB") for name in ship_knob.ZOO]


SHIPPED_INDUCTOR = sorted((SHIPPED / "knob").glob("*/inductor/*.json"))


@pytest.mark.parametrize("path", SHIPPED_INDUCTOR, ids=[f"{p.parents[1].name}/{p.stem}" for p in SHIPPED_INDUCTOR])
def test_shipped_inductor_censuses_verify_and_sit_beside_their_aot_eager_census(path):
    """Each shipped Inductor census reads through the manifest, names its backend, is complete on Inductor's
    default plan (every grid knob evaluated), and the aot_eager census of the same step is shipped beside it."""
    census = read_census(path, SHIPPED)
    assert census.meta["backend"] == "inductor" and census.meta["refinement_complete"]
    assert census.plan == INDUCTOR_PLAN
    assert set(census.plan.grid()) <= set(census.samples.knob)
    beside = read_census(path.parents[1] / path.name, SHIPPED)
    assert beside.meta.get("backend", "aot_eager") == "aot_eager" and beside.name == census.name


SHIPPED_GPU = sorted((SHIPPED / "knob").glob("*/inductor-*/*.json"))


@pytest.mark.parametrize("path", SHIPPED_GPU,
                         ids=[f"{p.parents[1].name}/{p.parent.name}/{p.stem}" for p in SHIPPED_GPU])
def test_shipped_gpu_censuses_verify_name_their_gpu_and_sit_beside_the_cpu_lowerings(path):
    """Each shipped census lowered for a GPU (``knob/<set>/inductor-<GPU>/``) reads through the manifest, names
    that GPU as its lowering (the one line a reader gets says CUDA Inductor's), is complete on Inductor's default
    plan, and the CPU lowering's census of the same step is shipped beside it."""
    from dtrlab.analysis.knob_census import lowering_answer

    gpu = path.parent.name.removeprefix("inductor-")
    census = read_census(path, SHIPPED)
    assert census.meta["backend"] == "inductor" and census.meta["inductor_lowering"] == gpu
    assert census.meta["gpu_answer"] is None and f"CUDA Inductor's lowering for {gpu}" in lowering_answer(census.meta)
    assert census.meta["refinement_complete"] and set(census.plan.grid()) <= set(census.samples.knob)
    assert census.plan == INDUCTOR_PLAN
    beside = read_census(path.parents[1] / "inductor" / path.name, SHIPPED)
    assert beside.meta.get("inductor_lowering", "cpu") == "cpu" and beside.name == census.name


def test_the_backends_plot_draws_each_census_under_the_accounting():
    import matplotlib

    matplotlib.use("agg")
    from dtrlab.plots.knob import plot_knob_backends

    def census(peaks):
        def evaluate(knob):
            peak = peaks[0] if knob < 0.5 else peaks[1]
            return {"flat_peak": peak, "allocated_peak": 2 * peak, "reserved_peak": 3 * peak}
        return census_knob(evaluate, KnobPlan(step=0.25, resolution=0.25))

    ax = plot_knob_backends({"aot_eager": census([2**20, 3 * 2**20]), "inductor": census([2**21, 2**20])},
                            "allocated_peak", title="m")
    steps = [line for line in ax.get_lines() if line.get_label().endswith("knobs")]
    assert [line.get_label() for line in steps] == ["aot_eager, 5 knobs", "Inductor, 5 knobs"]
    assert list(steps[0].get_ydata()) == [2, 2, 6, 6, 6] and list(steps[1].get_ydata()) == [4, 4, 2, 2, 2]
    assert ax.get_ylabel() == "allocated peak (MiB)" and ax.get_title() == "m"
