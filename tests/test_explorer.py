"""The budget explorer, driven without a browser: what it shows is what dtrlab computes."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("matplotlib")

from dtrlab import Intervention, simulate  # noqa: E402
from dtrlab.runtime import budget_for  # noqa: E402
from dtrlab.trace import load_directory  # noqa: E402
from dtrlab.widgets import BudgetExplorer  # noqa: E402

TRACES = Path(__file__).resolve().parent.parent / "traces"


@pytest.fixture(scope="module")
def traces():
    loaded = load_directory(TRACES)
    # The two shortest traces keep every update well under a second.
    return {name: loaded[name] for name in sorted(loaded, key=lambda n: len(loaded[n].schedule))[:2]}


@pytest.fixture
def explorer(traces, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "agg")
    return BudgetExplorer(traces, ratio=0.5)


def test_slider_shows_what_simulate_computes(explorer):
    for ratio in (0.3, 0.45, 0.8):
        explorer.ratio_slider.value = ratio
        trace = explorer.trace
        expected = simulate(trace, "dtr", budget_bytes=budget_for(trace, ratio))
        assert explorer.budget_bytes == budget_for(trace, ratio)
        assert explorer.result == expected
        assert f"evictions {expected.evictions:,}" in explorer.outcome.value
        assert f"budget {expected.budget_bytes:,} B" in explorer.outcome.value
        assert ">" + {"pass": "pass", "oom": "out of memory", "thrash": "thrash"}[expected.status] \
            in explorer.outcome.value


def test_timeline_is_the_recorded_run(explorer):
    explorer.ratio_slider.value = 0.35
    events = explorer.recorded.events
    assert explorer.recorded.result == explorer.result
    assert events["memory_after"].max() == explorer.result.peak_memory
    assert (events["kind"] == "evict").sum() == explorer.result.evictions
    shown = explorer.timeline_image.value
    assert shown[:8] == b"\x89PNG\r\n\x1a\n"
    explorer.ratio_slider.value = 0.9
    assert explorer.timeline_image.value != shown  # redrawn for the new budget


def test_nudge_moves_the_budget_by_bytes(explorer):
    explorer.ratio_slider.value = 0.4
    base = budget_for(explorer.trace, 0.4)
    explorer.nudge_slider.value = explorer.nudge_slider.min
    assert explorer.budget_bytes == base + explorer.nudge_slider.min < base
    assert explorer.result == simulate(explorer.trace, "dtr", budget_bytes=base + explorer.nudge_slider.min)
    # The nudge spans one slider step (0.005 of the peak) either way.
    assert explorer.nudge_slider.max == int(explorer.result.baseline_memory * 0.005)


def test_opens_at_an_exact_budget(traces):
    trace = next(iter(traces.values()))
    budget = budget_for(trace, 0.42) + 1234
    explorer = BudgetExplorer(traces, budget_bytes=budget, show_timeline=False)
    assert (explorer.ratio_slider.value, explorer.nudge_slider.value) == (pytest.approx(0.42), 1234)
    assert explorer.result == simulate(trace, "dtr", budget_bytes=budget)
    with pytest.raises(ValueError, match="outside the slider's range"):
        BudgetExplorer(traces, budget_bytes=10 * explorer.result.baseline_memory, show_timeline=False)


def test_policy_and_trace_dropdowns(explorer, traces):
    explorer.ratio_slider.value = 0.6
    explorer.policy_dropdown.value = "lru"
    assert explorer.result == simulate(explorer.trace, "lru", budget_bytes=budget_for(explorer.trace, 0.6))
    other = [name for name in traces if name != explorer.trace.name][0]
    explorer.nudge_slider.value = 7
    explorer.trace_dropdown.value = other
    assert explorer.nudge_slider.value == 0  # the nudge range belongs to the old trace
    assert explorer.result == simulate(traces[other], "lru", budget_bytes=budget_for(traces[other], 0.6))


def test_withholding_a_storage_is_the_intervention(explorer):
    explorer.ratio_slider.value = 0.5
    plain = explorer.result
    assert plain.evictions > 0
    most_evicted = explorer.withhold_dropdown.options[0]
    assert most_evicted[0].startswith(max(set(plain.evicted_storages), key=plain.evicted_storages.count))
    # The most evicted storage is preselected (as a user sees it in JupyterLab), so the toggle
    # alone withholds it; choosing a storage alone changes nothing.
    assert explorer.withhold_dropdown.value == most_evicted[1]
    explorer.withhold_dropdown.value = explorer.withhold_dropdown.options[-1][1]
    explorer.withhold_dropdown.value = most_evicted[1]
    assert explorer.result == plain
    explorer.withhold_toggle.value = True
    withheld = Intervention(withhold=frozenset({most_evicted[1]}))
    assert explorer.result == simulate(explorer.trace, "dtr", budget_bytes=plain.budget_bytes, intervention=withheld)
    assert explorer.trace.tensor_names[most_evicted[1]] not in explorer.result.evicted_storages
    assert "withholding" in explorer.outcome.value
    explorer.withhold_toggle.value = False
    assert explorer.result == plain


def test_sweep_window_is_the_local_feasibility_strip(explorer):
    explorer.ratio_slider.value = 0.5
    window = explorer.sweep_window()
    assert len(window) == explorer.window_points
    assert explorer.budget_bytes in set(window["budget_bytes"])  # centred on the current budget
    assert explorer.strip_image.value[:8] == b"\x89PNG\r\n\x1a\n"
    for row in window.iloc[[0, len(window) // 2, -1]].itertuples():
        assert row.status == simulate(explorer.trace, "dtr", budget_bytes=row.budget_bytes).status


def test_bad_arguments_say_what_works(traces):
    with pytest.raises(ValueError, match="not among the explorer's policies"):
        BudgetExplorer(traces, policy="belady")
    with pytest.raises(ValueError, match="no trace 'nope'"):
        BudgetExplorer(traces, trace="nope")
    with pytest.raises(ValueError, match="at least one trace"):
        BudgetExplorer({})
