"""The committed figures are reproducible byte for byte: constraints.txt pins what draws them, and one figure
redrawn from the shipped results equals its committed PNG and PDF (notebook 01's feasibility map: 3 s of CPU)."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from dtrlab.analysis.holes import find_holes  # noqa: E402
from dtrlab.plots import plot_feasibility_map, save_figure, trace_titles  # noqa: E402
from dtrlab.sweep import sweep  # noqa: E402
from dtrlab.sweep.execution import Execution  # noqa: E402
from dtrlab.sweep.shipped import RECOMPUTE_ENV, SHIPPED_ENV  # noqa: E402
from dtrlab.trace import load_directory  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def pins() -> dict[str, str]:
    """constraints.txt's ``name==version`` lines."""
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    return dict(re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)", line).groups() for line in lines
                if line.strip() and not line.startswith("#"))


def test_installed_drawing_stack_is_the_pinned_one():
    """A different version draws different bytes (fonttools 4.69.1 subsets DejaVuSans differently)."""
    installed = {name: version(name) for name in pins()}
    assert installed == pins(), "reinstall with `make setup` (pip install -c constraints.txt)"


def test_feasibility_map_redrawn_from_shipped_results_is_byte_identical(tmp_path, monkeypatch):
    """Notebook 01 on traces/ with its default parameters, as `make figures` runs it (a fresh rc state, an
    empty cache: the rows come from results/shipped/, which conftest turns off for other tests)."""
    monkeypatch.delenv(RECOMPUTE_ENV, raising=False)
    monkeypatch.delenv(SHIPPED_ENV, raising=False)
    traces = load_directory(ROOT / "traces")
    titles = trace_titles(traces)
    execution = Execution(jobs=1, cache=tmp_path / "cache", progress=False)
    frame = pd.concat([sweep(trace, "dtr", ratios="0.05:1.0:0.005", execution=execution)
                       for trace in traces.values()], ignore_index=True)
    censuses = [find_holes(frame[frame["trace"] == name]) for name in traces]
    with matplotlib.rc_context():
        matplotlib.rc_file_defaults()  # a notebook kernel's start: no rcParams another test set
        fig = plot_feasibility_map(censuses, titles=titles)
        written = save_figure(fig, tmp_path, "01-feasibility-map")
        plt.close(fig)
    for path in written:
        committed = ROOT / "figures" / "traces" / path.name
        assert path.read_bytes() == committed.read_bytes(), f"{path.name} differs from {committed}"


def test_a_save_killed_while_drawing_leaves_the_previous_figure_whole(tmp_path, monkeypatch):
    """save_figure draws into memory and renames: a failure mid-PDF keeps the old PDF and leaves no partial file."""
    fig = plt.figure()
    first = save_figure(fig, tmp_path, "figure")
    before = {path: path.read_bytes() for path in first}
    real_savefig = fig.savefig

    def savefig_dying_in_the_pdf(target, **options):
        if options.get("format") == "pdf":
            target.write(b"%PDF-1.4 truncated")
            raise KeyboardInterrupt
        return real_savefig(target, **options)

    monkeypatch.setattr(fig, "savefig", savefig_dying_in_the_pdf)
    try:
        save_figure(fig, tmp_path, "figure")
    except KeyboardInterrupt:
        pass
    plt.close(fig)
    assert {path: path.read_bytes() for path in first} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["figure.pdf", "figure.png"]
