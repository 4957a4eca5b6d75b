"""``dtrlab check --knob``'s knob section: the choice under each accounting, the warnings the census can
tell (a smaller knob that does not fit, the 1.0 cliff, a budget below every peak), the hook for warnings
only a capture can tell, the figure, and "none" for an empty table. On a planted census (exact answers)."""

from __future__ import annotations

import json
from dataclasses import replace

import pandas as pd
import pytest

from dtrlab.analysis.check import CheckPlan, KnobWarning, census_knob_warnings, check, knob_choices
from dtrlab.analysis.knob_census import CPU_INDUCTOR_ANSWER, CUDA_INDUCTOR_ANSWER, KnobPlan, analyse
from dtrlab.plots.check import plot_check_knob, report_html, write_check_report
from dtrlab.sweep.execution import Execution

QUIET = Execution(cache=False, progress=False)
UNIT = 100_000
KNOBS = (0.0, 0.2, 0.4, 0.6, 0.8, 0.99, 1.0)


def planted(allocated: list[int], name: str = "planted"):
    """A census of ``allocated`` peaks (in UNITs) at KNOBS; flat one byte less, reserved rounded up to 2 MiB."""
    peaks = [a * UNIT for a in allocated]
    samples = pd.DataFrame({"knob": KNOBS, "flat_peak": [p - 1 for p in peaks], "allocated_peak": peaks,
                            "reserved_peak": [-(-p // 2**21) * 2**21 for p in peaks],
                            "recompute_flops": [1000 * (10 - i) for i in range(len(KNOBS))]})
    return analyse(samples, KnobPlan(knobs=KNOBS), name)


#: 0.2, 0.6 and 0.8 fit 100 units; 0.4 between them does not (a hole), nor does 0.0; 0.99 and 1.0 differ.
CENSUS = planted([150, 90, 120, 95, 100, 105, 110])


def warnings_at(census, units: int) -> dict[str, str]:
    choice = census.knob_for_budget(units * UNIT, "allocated_peak")
    return {w.kind: w.message for w in census_knob_warnings(census, choice)}


def test_a_hole_below_the_choice_is_named():
    warnings = warnings_at(CENSUS, 100)
    assert set(warnings) == {"lowering-unsafe"}
    assert "largest knob that fits 0.8" in warnings["lowering-unsafe"] and "0.4..0.4" in warnings["lowering-unsafe"]


def test_the_cliff_on_either_side_of_one():
    at_one = warnings_at(CENSUS, 110)
    assert "1.0 is torch's default" in at_one["cliff"] and "-4.5%" in at_one["cliff"]
    below = warnings_at(CENSUS, 107)
    assert "0.99 sits just below the 1.0 cliff" in below["cliff"] and f"{110 * UNIT:,}" in below["cliff"]
    assert "cliff" not in warnings_at(planted([150, 90, 120, 95, 100, 110, 110]), 110)  # equal peaks: no cliff
    assert "cliff" not in warnings_at(CENSUS, 100)  # a choice away from 1.0


def test_a_budget_below_every_peak():
    warnings = warnings_at(CENSUS, 80)
    assert list(warnings) == ["below-reachable"]
    assert f"{90 * UNIT:,} bytes, at knob 0.2" in warnings["below-reachable"]


def test_the_table_of_choices():
    rows = {r["accounting"]: r for r in knob_choices(CENSUS, 100 * UNIT)}
    allocated = rows["allocated_peak"]
    assert allocated["answers"] and not rows["flat_peak"]["answers"]
    assert allocated["largest_fitting_knob"] == 0.8 and allocated["peak"] == 100 * UNIT and allocated["margin"] == 0
    assert allocated["recompute_flops"] == 6000 and allocated["holes"] == [[0.4, 0.4]]
    assert allocated["min_peak"] == 90 * UNIT and allocated["knob_at_min"] == 0.2
    assert rows["flat_peak"]["margin"] == 1


def test_the_choice_under_each_accounting_from_its_own_curve():
    """One byte below 105 units, written out by hand from CENSUS: flat peaks (a byte below allocated) reach 0.99,
    allocated ones only 0.8; reserved peaks round up to 2 MiB blocks (90 to 100 units take five, 105 six)."""
    budget = 105 * UNIT - 1
    common = {"smallest_fitting_knob": 0.2, "lowering_is_safe": False, "holes": [[0.4, 0.4]]}
    assert knob_choices(CENSUS, budget) == [
        {"accounting": "flat_peak", "answers": False, "largest_fitting_knob": 0.99, "peak": budget, "margin": 0,
         "recompute_flops": 5000, **common, "min_peak": 90 * UNIT - 1, "knob_at_min": 0.2},
        {"accounting": "allocated_peak", "answers": True, "largest_fitting_knob": 0.8, "peak": 100 * UNIT,
         "margin": 5 * UNIT - 1, "recompute_flops": 6000, **common, "min_peak": 90 * UNIT, "knob_at_min": 0.2},
        {"accounting": "reserved_peak", "answers": False, "largest_fitting_knob": 0.8, "peak": 5 * 2**21,
         "margin": budget - 5 * 2**21, "recompute_flops": 6000, **common, "min_peak": 5 * 2**21,
         "knob_at_min": 0.8}]


def test_the_census_warnings_word_for_word():
    assert warnings_at(CENSUS, 80) == {"below-reachable": (
        "no knob value fits 8,000,000 bytes (allocated_peak): the smallest peak the knob reaches is 9,000,000 bytes, "
        "at knob 0.2; see DTR's and monotone(dtr)'s outcome at this budget above")}
    assert warnings_at(CENSUS, 110)["cliff"] == (
        "the chosen knob 1.0 is torch's default, where the partitioner keeps its default min-cut; at 0.99 it may cut "
        "differently and the peak changes by -4.5% (-500,000 bytes): the step from 1.0 to 0.99 is a change of regime")
    assert warnings_at(CENSUS, 107)["cliff"] == (
        "the chosen knob 0.99 sits just below the 1.0 cliff: 1.0 (torch's default) peaks at 11,000,000 bytes and does "
        "not fit; 0.99 fits because below 1.0 the partitioner cuts differently (-4.5%)")


@pytest.mark.parametrize("knobs", [(1.0,), (0.2, 0.5)], ids=["only-1.0", "no-1.0"])
def test_no_cliff_without_both_sides_of_one(knobs):
    """The cliff needs 1.0 and a knob below it: a census of 1.0 alone, or of knobs below 1.0 only, has none."""
    samples = pd.DataFrame({"knob": knobs, **{a: [UNIT * (i + 1) for i in range(len(knobs))] for a in
                                               ("flat_peak", "allocated_peak", "reserved_peak")}})
    assert warnings_at(analyse(samples, KnobPlan(knobs=knobs)), len(knobs)) == {}


@pytest.fixture(scope="module")
def report(small_resnet):
    extra = (KnobWarning("random-ops", "native_dropout is recomputed"),)
    return check(small_resnet, 100 * UNIT, "A100-80GB", knob=CENSUS, knob_warnings=extra,
                 plan=CheckPlan(window=0.01, delta=0.005, policies=("dtr",), monotone=False), execution=QUIET)


def test_the_report_carries_the_knob_section(report, tmp_path):
    write_check_report(report, tmp_path / "r.html", tmp_path / "r.json", tmp_path / "r.png")
    record = json.loads((tmp_path / "r.json").read_text())
    assert [w["kind"] for w in record["knob_warnings"]] == ["lowering-unsafe", "random-ops"]  # the hook's after
    assert len(record["knob_choices"]) == 3 and "knob_census" not in record
    page = (tmp_path / "r.html").read_text()
    assert 'id="knob-figure"' in page and "native_dropout is recomputed" in page and "0.4..0.4" in page
    assert (tmp_path / "r-knob.png").stat().st_size > 5000


def test_knob_warnings_need_a_census(small_resnet):
    with pytest.raises(ValueError, match=r"^check: knob_warnings need a knob census \(knob=\.\.\.\)$"):
        check(small_resnet, 100 * UNIT, "A100-80GB", knob_warnings=(KnobWarning("random-ops", "x"),),
              plan=CheckPlan(window=0.01, delta=0.005, policies=("dtr",), monotone=False), execution=QUIET)


def test_the_figure_marks_the_budget_the_hole_and_the_choice(report):
    fig = plot_check_knob(report)
    ax = fig.axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert "chosen knob 0.8 (largest that fits)" in labels and "hole: does not fit between fitting knobs" in labels
    budget = [line for line in ax.lines if line.get_label().startswith("the budget")]
    assert len(budget) == 1 and budget[0].get_ydata()[0] == pytest.approx(100 * UNIT / 2**20)
    (span,) = [p for p in ax.patches if p.get_label().startswith("hole")]
    assert span.get_x() == pytest.approx(0.4) and span.get_width() == pytest.approx(0.2)  # 0.4 up to 0.6


def test_empty_tables_say_none(report):
    no_holes = replace(report, checks=[replace(c, holes=[]) for c in report.checks], knob_warnings=[])
    page = report_html(no_holes, b"", b"")
    holes = page.split("<h2>Holes in the window</h2>", 1)[1].split("<h2>", 1)[0]
    warnings = page.split("<h3>Warnings</h3>", 1)[1].split("<img", 1)[0]
    assert "<th>" not in holes and '<p class="none">none</p>' in holes
    assert '<p class="none">none</p>' in warnings


def test_an_inductor_census_answers_for_the_gpu_with_the_cpu_lowering(small_resnet, tmp_path):
    """No CUDA Inductor accounting without a GPU: an Inductor census (lowered for the CPU) answers, and the report
    says which lowering it is and its uncertainty measured on CPU, in its summary, its JSON and its HTML."""
    inductor = replace(CENSUS, meta={"backend": "inductor"})
    assert warnings_at(inductor, 100)["cpu-lowering"] == CPU_INDUCTOR_ANSWER
    assert list(warnings_at(inductor, 80)) == ["below-reachable", "cpu-lowering"]  # also when nothing fits
    assert "cpu-lowering" not in warnings_at(replace(CENSUS, meta={"backend": "aot_eager"}), 100)
    assert "cpu-lowering" not in warnings_at(replace(CENSUS, meta={"backend": "inductor",
                                                                   "inductor_lowering": "cuda"}), 100)
    report = check(small_resnet, 100 * UNIT, "A100-80GB", knob=inductor,
                   plan=CheckPlan(window=0.01, delta=0.005, policies=("dtr",), monotone=False), execution=QUIET)
    summary = report.summary()
    assert summary[summary.index(next(s for s in summary if s.startswith("torch.compile"))) + 1] == CPU_INDUCTOR_ANSWER
    write_check_report(report, tmp_path / "r.html", tmp_path / "r.json", tmp_path / "r.png")
    assert "cpu-lowering" in [w["kind"] for w in json.loads((tmp_path / "r.json").read_text())["knob_warnings"]]
    page = (tmp_path / "r.html").read_text()
    assert "cpu-lowering" in page and "ResNet-18 and MobileNetV3" in page


def test_a_census_lowered_for_a_gpu_says_so_under_the_knob_line(small_resnet):
    """`dtrlab check --device H100-80GB --knob`: a census lowered by CUDA Inductor names that lowering (its
    ``cuda-lowering`` line under the knob's, as `dtrlab knob` prints it), and no CPU line; aot_eager names none."""
    gpu = replace(CENSUS, meta={"backend": "inductor", "inductor_lowering": "H100-80GB"})
    line = CUDA_INDUCTOR_ANSWER.format(gpu="H100-80GB")
    assert warnings_at(gpu, 100) == {"lowering-unsafe": warnings_at(CENSUS, 100)["lowering-unsafe"],
                                     "cuda-lowering": line}
    assert list(warnings_at(gpu, 80)) == ["below-reachable", "cuda-lowering"]
    report = check(small_resnet, 100 * UNIT, "H100-80GB", knob=gpu,
                   plan=CheckPlan(window=0.01, delta=0.005, policies=("dtr",), monotone=False), execution=QUIET)
    summary = report.summary()
    assert summary[summary.index(next(s for s in summary if s.startswith("torch.compile"))) + 1] == line
    assert CPU_INDUCTOR_ANSWER not in summary


def test_check_knob_on_a_model_source_lowers_for_its_gpu_preset():
    """`dtrlab check MODEL --device H100-80GB --knob`'s census source: lowered for the H100 (check has no
    --autocast: until 6 December 2026 reading it was an internal error); bytes as --device, the CPU's."""
    pytest.importorskip("torch")
    from dtrlab.cli import parse
    from dtrlab.cli.knob import model_evaluation
    from dtrlab.trace.sizes import SIZE_KEYS

    for device, options in (("H100-80GB", {"gpu": "H100-80GB"}), ("80GiB", {})):
        args = parse(["check", "tests.test_partition:tiny_mlp", "--device", device, "--budget", "0.5", "--knob"])
        evaluate, name = model_evaluation(args)
        assert dict(evaluate.options) == {"batch": None, "seq": None, "image": 224, "dtype": None, "autocast": None,
                                          **dict.fromkeys(SIZE_KEYS), **options}
        assert name == "tests.test_partition-tiny_mlp" + ("-H100-80GB" if options else "")
