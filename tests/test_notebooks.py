"""Every notebook runs under papermill in quick mode and writes its figures; the plot helpers' summaries."""

from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path

import pytest

pd = pytest.importorskip("pandas")

ROOT = Path(__file__).resolve().parent.parent

from dtrlab.pipeline import figures as make_figures  # noqa: E402  (matplotlib: after pandas' importorskip)

NOTEBOOKS = make_figures.notebook_paths()


def test_every_issue_notebook_is_there():
    assert [p.name[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04", "05", "06", "07", "08", "09", "10", "11", "12",
                                            "13", "14", "15"]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_in_quick_mode_and_writes_figures(notebook, tmp_path, monkeypatch):
    pytest.importorskip("papermill")
    monkeypatch.setenv("MPLBACKEND", "agg")
    figures = tmp_path / "figures"
    parameters = make_figures.notebook_parameters(ROOT / "traces", figures, tmp_path / "cache", quick=True, jobs=1,
                                                  reference=None)
    executed = make_figures.run_notebook(notebook, tmp_path / "executed", parameters)
    assert executed.stat().st_size > 0
    prefix = notebook.name[:2]
    pngs = sorted(figures.glob(f"{prefix}-*.png"))
    assert pngs, f"{notebook.name} wrote no figure named {prefix}-*.png into {figures}"
    for png in pngs:
        pdf = png.with_suffix(".pdf")
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
        assert pdf.read_bytes()[:5] == b"%PDF-" and pdf.stat().st_size > 1000


@pytest.mark.slow
@pytest.mark.parametrize("prefix", ["03", "04", "08", "10"])
def test_models_notebooks_read_only_shipped_results(prefix, tmp_path, monkeypatch):
    """Notebooks 03, 04, 08 and 10 on traces/models (figures/models/) simulate nothing: every run they ask for is
    shipped."""
    pytest.importorskip("papermill")
    monkeypatch.setenv("MPLBACKEND", "agg")
    monkeypatch.delenv("DTRLAB_RECOMPUTE", raising=False)
    parameters = make_figures.notebook_parameters(ROOT / "traces" / "models", tmp_path / "figures", tmp_path / "cache",
                                                  quick=False, jobs=1, reference=None)
    make_figures.run_notebook(make_figures.notebook_paths([prefix])[0], tmp_path / "executed", parameters)
    assert sorted((tmp_path / "figures").glob(f"{prefix}-*.png"))
    assert not list((tmp_path / "cache").rglob("*.parquet")), "runs were simulated: ship them (dtrlab ship results)"


def test_only_selects_notebooks_by_prefix():
    assert [p.name[:2] for p in make_figures.notebook_paths(["06", "01"])] == ["01", "06"]
    with pytest.raises(ValueError, match="no notebook matches"):
        make_figures.notebook_paths(["99"])


def test_figure_directory_is_named_after_the_trace_set(tmp_path):
    from dtrlab.plots import figure_directory, trace_set_name

    logs = tmp_path / "dtr-logs"
    logs.mkdir()
    assert trace_set_name(logs) == "dtr-logs"
    assert trace_set_name(ROOT / "traces") == "traces"
    assert figure_directory(ROOT / "traces" / "models", "../figures") == Path("../figures/models")


def _cells(notebook: Path) -> tuple[str, str, list[str]]:
    """(first cell's text, the parameters cell's source, the other code cells' sources)."""
    cells = json.loads(notebook.read_text())["cells"]
    parameters = next(c for c in cells if "parameters" in c.get("metadata", {}).get("tags", []))
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code" and c is not parameters]
    return "".join(cells[0]["source"]), "".join(parameters["source"]), code


def _parameter_names(source: str) -> set[str]:
    return {target.id for node in ast.parse(source).body if isinstance(node, ast.Assign)
            for target in node.targets if isinstance(target, ast.Name)}


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_first_cell_names_only_real_parameters(notebook):
    intro, parameters, _ = _cells(notebook)
    assert "Worth changing:" in intro, f"{notebook.name}: the first cell says which parameters are worth changing"
    named = re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", intro.split("Worth changing:", 1)[1])
    assert named and set(named) <= _parameter_names(parameters), \
        f"{notebook.name} names {sorted(set(named) - _parameter_names(parameters))}, not parameters"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_figures_follow_the_traces_they_ran_on(notebook):
    # figures_dir is empty by default and derived from traces_dir, as dtrlab figures derives it, so
    # traces_dir = "../../shared/dtr-logs" cannot overwrite figures/traces/.
    _, parameters, code = _cells(notebook)
    assert 'figures_dir = ""' in parameters
    assert any("figure_directory(traces_dir" in source for source in code)


# ------------------------------------------------------------------ plot helpers
def _rows(policy, statuses, overheads, trace="t"):
    return [{"trace": trace, "policy": policy, "ratio": r, "status": s, "overhead": o}
            for r, s, o in zip([0.2, 0.4, 0.6, 0.8], statuses, overheads)]


def test_pareto_curves_lowest_passing_ratio_and_seed_bands():
    from dtrlab.plots import pareto_curves

    frame = pd.DataFrame(
        _rows("dtr", ["oom", "pass", "pass", "pass"], [1.9, 1.5, 1.2, 1.0])
        # a hole at 0.6: the curve starts above it
        + _rows("lru", ["thrash", "pass", "thrash", "pass"], [2.0, 1.8, 2.0, 1.1])
        + _rows("random(seed=0)", ["thrash", "pass", "pass", "pass"], [2.0, 1.6, 1.3, 1.0])
        + _rows("random(seed=1)", ["thrash", "thrash", "pass", "pass"], [2.0, 2.0, 1.5, 1.0])
        + _rows("msps", ["pass"] * 4, [1.4, 1.2, 1.1, 1.0]))
    summary = pareto_curves(frame)
    frontier = summary.frontier.set_index("policy")
    assert frontier.loc["dtr", "min_passing_ratio"] == 0.4 and frontier.loc["dtr", "failure_below"] == "oom"
    assert frontier.loc["lru", "min_passing_ratio"] == 0.8 and frontier.loc["lru", "failure_below"] == "thrash"
    assert frontier.loc["random", "min_passing_ratio"] == 0.6  # every seed must pass
    assert frontier.loc["msps", "min_passing_ratio"] == 0.2 and math.isnan(frontier.loc["msps", "failure_below"])
    random = summary.curves[(summary.curves["policy"] == "random") & (summary.curves["ratio"] == 0.6)].iloc[0]
    assert (random["trials"], random["overhead_min"], random["overhead_max"]) == (2, 1.3, 1.5)
    assert random["overhead_mean"] == pytest.approx(1.4)


def test_pareto_curves_names_missing_columns():
    from dtrlab.plots import pareto_curves

    with pytest.raises(ValueError, match=r"\['overhead'\]"):
        pareto_curves(pd.DataFrame({"trace": [], "policy": [], "ratio": [], "status": []}))


def test_trace_names_and_policy_styles():
    from dtrlab.plots import policy_style, short_trace_name

    assert short_trace_name("resnet32-56-9000000000.0-2020-10-1-13-3-30-default") == "resnet32-56"
    assert short_trace_name("resnet32-b8") == "resnet32-b8"
    assert policy_style("random(seed=3)") == policy_style("random")
    assert policy_style("two_phase", 0).color != policy_style("two_phase", 1).color


def test_holes_by_limit_names_each_policy_and_memory_model_once():
    """One legend entry per (policy, memory model): random under flat and under caching are two lines."""
    import matplotlib.pyplot as plt

    from dtrlab.plots.anatomy import plot_holes_by_limit

    rows = [{"trace": "t", "policy": policy, "memory": memory, "limit": limit, "holes": 1}
            for policy in ("dtr", "random(seed=0)") for memory in ("flat", "caching") for limit in (1.5, 2.0)]
    fig = plot_holes_by_limit(pd.DataFrame(rows))
    labels = [text.get_text() for text in fig.legends[0].get_texts()]
    assert labels == ["DTR (h_DTR)", "DTR (h_DTR) @ caching", "Random", "Random @ caching"]
    plt.close(fig)


def test_holes_by_limit_draws_a_finer_grid_as_its_own_line():
    """A policy censused on two grids (twophase at 0.005 and 0.001) is two lines, the finer one named by its step;
    DTR on one grid under two memory models (their grids differ, their steps do not) keeps plain labels."""
    import matplotlib.pyplot as plt

    from dtrlab.plots.anatomy import plot_holes_by_limit

    grids = [("twophase", "flat", "0.05:1.0:0.005", 3), ("twophase", "flat", "0.05:1.0:0.001", 5),
             ("dtr", "flat", "0.05:1.0:0.005", 1), ("dtr", "caching", "0.05:2.0:0.005", 2)]
    rows = [{"trace": "t", "policy": policy, "memory": memory, "ratios": ratios, "limit": limit, "holes": holes}
            for policy, memory, ratios, holes in grids for limit in (1.5, 2.0)]
    fig = plot_holes_by_limit(pd.DataFrame(rows))
    labels = [text.get_text() for text in fig.legends[0].get_texts()]
    assert labels == ["twophase", "twophase @ step 0.001", "DTR (h_DTR)", "DTR (h_DTR) @ caching"]
    drawn = {line.get_label(): line.get_ydata().tolist() for line in fig.axes[0].get_lines()
             if not line.get_label().startswith("_")}
    assert drawn["twophase @ step 0.001"] == [5, 5] and drawn["twophase"] == [3, 3]
    plt.close(fig)


def test_strip_cells_meet_halfway_between_samples():
    from dtrlab.plots.feasibility import _cell_edges

    assert _cell_edges(pd.Series([0.1, 0.2, 0.4]).to_numpy()).tolist() == pytest.approx([0.05, 0.15, 0.3, 0.5])


@pytest.mark.slow
@pytest.mark.parametrize("traces", ["traces", "traces/models", "../shared/dtr-logs"])
def test_anatomy_notebook_reads_only_shipped_tables(traces, tmp_path, monkeypatch):
    """Notebook 12 on a trace set whose limit census is shipped (results/shipped/anatomy/) simulates nothing."""
    pytest.importorskip("papermill")
    directory = (ROOT / traces).resolve()
    if not (ROOT / "results" / "shipped" / "anatomy" / f"{directory.name}-table.csv").exists() or not directory.is_dir():
        pytest.skip(f"no shipped limit census of {directory} (dtrlab ship anatomy), or the traces are absent")
    monkeypatch.setenv("MPLBACKEND", "agg")
    parameters = make_figures.notebook_parameters(directory, tmp_path / "figures", tmp_path / "cache", quick=False,
                                                  jobs=1, reference=None)
    make_figures.run_notebook(make_figures.notebook_paths(["12"])[0], tmp_path / "executed", parameters)
    # every shipped set has flat and caching rows: one holes-by-limit figure each
    assert sorted(path.name for path in (tmp_path / "figures").glob("12-*.png")) == [
        "12-holes-by-limit-caching.png", "12-holes-by-limit.png", "12-needed-overhead.png"]
    assert not list((tmp_path / "cache").rglob("*.parquet")), "runs were simulated: ship them (dtrlab ship anatomy)"


def test_notebook_13_reads_a_census_dtrlab_knob_wrote(tmp_path, monkeypatch):
    """Notebook 13 with ``results_dir`` at a folder ``dtrlab knob --out`` wrote (no MANIFEST.json above it):
    it reads the census checked against its own JSON's sha256s and plots it (it stopped with
    FileNotFoundError .../MANIFEST.json before), with a DTR trace beside one census and none beside the
    other; a census whose samples do not match its JSON is refused."""
    pytest.importorskip("papermill")
    import shutil

    from papermill.exceptions import PapermillExecutionError

    from dtrlab.analysis.knob_census import KnobPlan, census_knob, write_census

    monkeypatch.setenv("MPLBACKEND", "agg")
    out = tmp_path / "mine"
    for name, peaks in (("tiny", [300, 100, 200, 250]), ("other", [400, 200, 300, 500])):
        curve = dict(zip((0.0, 0.3, 0.6, 1.0), peaks))
        evaluate = lambda knob, curve=curve: {  # noqa: E731  (a step curve: the peak of the last knob at or below)
            **dict.fromkeys(("flat_peak", "allocated_peak", "reserved_peak"),
                            2**20 * curve[max(k for k in curve if k <= knob)]), "recompute_flops": 1e6 * (1 - knob)}
        write_census(census_knob(evaluate, KnobPlan(step=0.1, resolution=0.05), name=name), out)
    shutil.copy(ROOT / "traces" / "resnet32-b8.jsonl.gz", out / "tiny.jsonl.gz")
    parameters = {**make_figures.notebook_parameters(ROOT / "traces", tmp_path / "figures", tmp_path / "cache",
                                                     quick=True, jobs=1, reference=None), "results_dir": str(out)}
    notebook = make_figures.notebook_paths(["13"])[0]
    executed = make_figures.run_notebook(notebook, tmp_path / "executed", parameters)
    names = sorted(p.name for p in (tmp_path / "figures").glob("13-*.png"))
    assert names == ["13-dtr-beside-knob.png", "13-knob-holes.png", "13-knob-map.png", "13-knob-peaks.png"]
    text = executed.read_text()
    assert "no DTR trace beside other" in text and "other" in text and "tiny" in text
    samples = out / "other-samples.parquet"
    samples.write_bytes(samples.read_bytes() + b"\0")  # damaged: no longer the sha256 its JSON carries
    with pytest.raises(PapermillExecutionError, match="does not match its sha256"):
        make_figures.run_notebook(notebook, tmp_path / "executed", parameters)


def test_notebook_13_draws_inductor_beside_aot_eager_and_a_gpus_lowering_beside_the_cpus(tmp_path, monkeypatch):
    """Notebook 13 with a census under each backend of the same step (``DIR/NAME.json`` and
    ``DIR/inductor/NAME.json``, as ``dtrlab ship knob --backend inductor`` lays them out): the side-by-side
    figure, and the table's ratios of the two peaks on the knobs both evaluated; a census with no Inductor
    twin is left out of it."""
    pytest.importorskip("papermill")
    from dtrlab.analysis.knob_census import KnobPlan, census_knob, write_census

    monkeypatch.setenv("MPLBACKEND", "agg")
    out = tmp_path / "mine"

    def census(peaks, plan, name, backend):
        def evaluate(knob):
            peak = 2**20 * peaks[0 if knob < 0.5 else 1]
            return {**dict.fromkeys(("flat_peak", "allocated_peak", "reserved_peak"), peak), "backend": backend,
                    "recompute_flops": 1e6 * (1 - knob)}
        return census_knob(evaluate, plan, name=name)

    write_census(census([300, 200], KnobPlan(step=0.05, resolution=0.05), "both", "aot_eager"), out)
    write_census(census([150, 200], KnobPlan(step=0.1, resolution=0.1), "both", "inductor"), out / "inductor")
    write_census(census([100, 50], KnobPlan(step=0.1, resolution=0.1), "alone", "aot_eager"), out)
    write_census(census([120, 180], KnobPlan(step=0.1, resolution=0.1), "both", "inductor"), out / "inductor-H100-80GB")
    parameters = {**make_figures.notebook_parameters(ROOT / "traces", tmp_path / "figures", tmp_path / "cache",
                                                     quick=True, jobs=1, reference=None), "results_dir": str(out)}
    executed = make_figures.run_notebook(make_figures.notebook_paths(["13"])[0], tmp_path / "executed", parameters)
    assert (tmp_path / "figures" / "13-knob-backends.png").stat().st_size > 5000
    cells = json.loads(executed.read_text())["cells"]
    [cell] = [cell for cell in cells if "pairs = {name" in "".join(cell["source"])]
    [table] = ["".join(output["data"]["text/plain"]) for output in cell["outputs"] if "data" in output]
    assert "alone" not in table  # it has no Inductor census
    row = next(line.split() for line in table.splitlines() if line.startswith("both"))
    assert row[1:5] == ["11", "0.5", "1.0", "1.0"]  # knobs both evaluated; Inductor / aot_eager: min, max, at 1.0
    # A GPU's lowering beside the CPU's (DIR/inductor-H100-80GB/): its figure, and the GPU over the CPU on the knobs
    # both evaluated (min, max) and each side's best knob.
    assert (tmp_path / "figures" / "13-knob-H100-80GB.png").stat().st_size > 5000
    [cell] = [cell for cell in cells if "gpu_lowerings = {" in "".join(cell["source"])]
    [table] = ["".join(output["data"]["text/plain"]) for output in cell["outputs"] if "data" in output]
    cells_of_both = [value for line in table.splitlines() if line.startswith("both") for value in line.split()[1:]]
    assert cells_of_both[:7] == ["11", "0.8", "0.9", "0.4", "0.4", "150.0", "120.0"], table  # pandas wraps the columns


# ------------------------------------------------------------------ dtrlab figures: limits and quiet kernels
def _notebook(directory: Path, name: str, *sources: str) -> Path:
    """A notebook of ``sources`` after a parameters cell taking what dtrlab figures passes every notebook."""
    nbformat = pytest.importorskip("nbformat")
    parameters = nbformat.v4.new_code_cell("\n".join(f"{name} = {value!r}" for name, value in (
        ("quick", False), ("traces_dir", ""), ("figures_dir", ""), ("cache_dir", ""), ("jobs", 1), ("reference", ""))))
    parameters.metadata["tags"] = ["parameters"]
    notebook = nbformat.v4.new_notebook(cells=[parameters, *map(nbformat.v4.new_code_cell, sources)])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    directory.mkdir(exist_ok=True)
    nbformat.write(notebook, directory / name)
    return directory / name


def _figures(tmp_path, monkeypatch, *options: str) -> int:
    """``dtrlab figures`` in this process on the notebooks of ``tmp_path/notebooks``, everything it writes in
    tmp_path (the environment variables it sets are restored after the test)."""
    from dtrlab.cli import main

    monkeypatch.setenv("DTRLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("MPLBACKEND", "agg")
    monkeypatch.delenv("DTRLAB_DEBUG", raising=False)
    return main(["figures", "--notebooks", str(tmp_path / "notebooks"), "--output", str(tmp_path / "executed"),
                 "--figures", str(tmp_path / "figures"), "--cache", str(tmp_path / "cache"), *options])


# Limits of 10 s and 12 s, not 3 s and 4 s: on a busy machine the cells before the hang (the parameters) and the
# hanging cell's first lines must run well inside them, or the limit fires at another cell than the one tested.
@pytest.mark.parametrize("limit, line", [
    (["--cell-timeout", "10"], "ran past the 10 s limit of a cell (--cell-timeout)"),
    (["--notebook-timeout", "12"], "ran past the 12 s limit of the notebook (--notebook-timeout)")])
def test_a_hung_cell_stops_its_notebook_with_one_line(limit, line, tmp_path, monkeypatch, capfd):
    """A cell that never ends (the hang of issue 57, made on purpose) stops at the limit: one line naming the
    notebook and the cell as written (its index, its first line), exit status 1, the kernel gone, no traceback."""
    pytest.importorskip("papermill")
    pid_file = tmp_path / "kernel.pid"
    _notebook(tmp_path / "notebooks", "01-hangs.ipynb",
              f"# sleeps\nimport os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(1000)")
    assert _figures(tmp_path, monkeypatch, *limit) == 1
    err = capfd.readouterr().err
    assert f"dtrlab figures: 01-hangs.ipynb: cell 1 ('# sleeps') {line}; its kernel was shut down\n" in err
    assert "Traceback" not in err and "Timeout waiting" not in err
    status = Path(f"/proc/{pid_file.read_text()}/status")
    assert not status.exists() or "zombie" in status.read_text(), "the kernel still runs"


def test_a_quiet_run_prints_no_kernel_noise(tmp_path, monkeypatch, capfd):
    """No line of ipykernel's TCP warning, torch's "No CUDA runtime is found" (a CUDA build of torch where no GPU
    is) or the profiler's USDT and gpuGetDeviceCount lines, in the terminal or in the executed notebook."""
    pytest.importorskip("papermill")
    pytest.importorskip("torch")
    _notebook(tmp_path / "notebooks", "01-noisy.ipynb",
              "import torch\nimport torch.utils.cpp_extension\n"
              "with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):\n"
              "    torch.ones(4).sum()")
    assert _figures(tmp_path, monkeypatch) == 0
    printed = capfd.readouterr()
    seen = printed.out + printed.err + (tmp_path / "executed" / "01-noisy.ipynb").read_text()
    assert "without encryption" not in seen
    if not Path("/proc/driver/nvidia/version").exists():  # with a driver, torch's GPU lines are not noise
        for noise in ("No CUDA runtime is found", "profiler_start", "gpuGetDeviceCount"):
            assert noise not in seen, noise


@pytest.mark.parametrize("option, value", [("--cell-timeout", "-1"), ("--notebook-timeout", "inf"),
                                           ("--cell-timeout", "nan")])
def test_a_limit_that_is_no_number_of_seconds_is_refused(option, value, tmp_path, capsys):
    from dtrlab.cli import main

    assert main(["figures", "--notebooks", str(tmp_path), option, value]) == 2
    assert capsys.readouterr().err == (f"dtrlab figures: error: {option} {value}: give seconds, or 0 for no limit "
                                       "(see dtrlab figures --help)\n")
