"""The interactive budget explorer (ipywidgets).

Pick a trace and a policy, move the budget slider (and its fine nudge, in bytes)
and the run's outcome, eviction count and memory timeline update. A button sweeps
a small window of budgets around the current one and draws the local feasibility
strip; a toggle withholds one storage from eviction (the single-tensor
intervention of the causal analysis).

    from dtrlab.trace import load_directory
    from dtrlab.widgets import BudgetExplorer
    BudgetExplorer(load_directory("traces"))          # the last line of a cell displays it

Everything the widgets show is also an attribute (``result``, ``window``), so a
test or a notebook can drive the explorer without a browser.
"""

from __future__ import annotations

import html
import io

import ipywidgets as widgets
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import display

from ..analysis.events import RecordedRun, record
from ..plots.feasibility import plot_strip
from ..plots.style import STATUS_COLORS, STATUS_LABELS, short_trace_name, use_style
from ..plots.timelines import memory_timelines
from ..policies import available_policies, policy_class
from ..runtime import Intervention, RunResult, baseline, simulate
from ..sweep import QUIET, sweep
from ..trace import Trace

#: Ratio resolution of the slider; the nudge spans one slider step either way.
RATIO_STEP = 0.005


class BudgetExplorer:
    """Widgets around :func:`dtrlab.simulate` for one trace set.

    ``traces``: a Trace, a list of them, or a dict name -> Trace (as from
    :func:`dtrlab.trace.load_directory`). Start at ``ratio``, or at exactly
    ``budget_bytes`` (the slider goes to the nearest ratio, the nudge makes up the
    rest). ``window`` is the half-width (in ratio) of the local sweep and
    ``window_points`` its number of budgets.
    """

    def __init__(self, traces, policies: list[str] | None = None, *, trace: str | None = None,
                 policy: str = "dtr", ratio: float = 0.5, budget_bytes: int | None = None, window: float = 0.01,
                 window_points: int = 21, show_timeline: bool = True):
        self.traces = _as_dict(traces)
        # The explorer replays under the flat byte counter, which address-aware policies refuse.
        policies = policies or [name for name in available_policies()
                                if not getattr(policy_class(name), "address_aware", False)]
        if policy not in policies:
            raise ValueError(f"policy {policy!r} is not among the explorer's policies {policies}")
        if trace is not None and trace not in self.traces:
            raise ValueError(f"no trace {trace!r}; the explorer has {sorted(self.traces)}")
        if not window_points >= 2:
            raise ValueError(f"window_points must be at least 2 (e.g. 21), got {window_points}")
        self.window_half_width = window
        self.window_points = window_points
        self.show_timeline = show_timeline
        self.result: RunResult | None = None
        self.recorded: RecordedRun | None = None  # the current run's events, when the timeline is shown
        self.window: pd.DataFrame | None = None

        # One label width wide enough for every label: the default 80 px cut "budget ratio" to
        # "budget ra..." (found by tests/test_explorer_browser.py).
        label = {"description_width": "100px"}
        self.trace_dropdown = widgets.Dropdown(
            options=[(short_trace_name(name), name) for name in self.traces],
            value=trace or next(iter(self.traces)), description="trace", style=label)
        self.policy_dropdown = widgets.Dropdown(options=policies, value=policy, description="policy", style=label)
        self.ratio_slider = widgets.FloatSlider(
            value=ratio, min=RATIO_STEP, max=1.0, step=RATIO_STEP, readout_format=".3f",
            description="budget ratio", continuous_update=False, layout=widgets.Layout(width="520px"), style=label)
        self.nudge_slider = widgets.IntSlider(value=0, description="nudge (B)", continuous_update=False,
                                              layout=widgets.Layout(width="520px"), style=label)
        self.withhold_dropdown = widgets.Dropdown(options=[], description="storage", style=label)
        self.withhold_toggle = widgets.ToggleButton(value=False, description="withhold from eviction",
                                                    tooltip="never offer this storage as an eviction candidate",
                                                    layout=widgets.Layout(width="auto"))
        self.sweep_button = widgets.Button(description="sweep window", icon="search",
                                           tooltip=f"{window_points} budgets within ±{window} x peak of the budget")
        self.outcome = widgets.HTML()
        # Figures are shown as PNG images, which render the same under any matplotlib backend.
        self.timeline_image = widgets.Image(format="png", layout=widgets.Layout(max_width="900px"))
        self.strip_image = widgets.Image(format="png", layout=widgets.Layout(max_width="900px"))

        self._updating = False
        self._ids: dict[str, dict[str, int]] = {}
        self._set_nudge_range()
        if budget_bytes is not None:
            peak = baseline(self.trace).peak_memory
            self.ratio_slider.value = min(1.0, max(RATIO_STEP, round(budget_bytes / peak / RATIO_STEP) * RATIO_STEP))
            self.nudge_slider.value = budget_bytes - int(peak * self.ratio_slider.value)
            if self.budget_bytes != budget_bytes:
                raise ValueError(f"budget_bytes {budget_bytes:,} is outside the slider's range for {self.trace.name} "
                                 f"({int(peak * RATIO_STEP):,} to {peak:,} bytes)")
        self.trace_dropdown.observe(self._on_trace, names="value")
        for control in (self.policy_dropdown, self.ratio_slider, self.nudge_slider):
            control.observe(self._on_budget, names="value")
        self.withhold_dropdown.observe(self._on_withhold, names="value")
        self.withhold_toggle.observe(self._on_withhold, names="value")
        self.sweep_button.on_click(lambda _button: self.sweep_window())
        self.update()

    # ----------------------------------------------------------- state
    @property
    def trace(self) -> Trace:
        return self.traces[self.trace_dropdown.value]

    @property
    def budget_bytes(self) -> int:
        """simrd's budget for the slider's ratio, plus the nudge."""
        return int(baseline(self.trace).peak_memory * self.ratio_slider.value) + self.nudge_slider.value

    @property
    def intervention(self) -> Intervention | None:
        storage = self.withhold_dropdown.value
        if self.withhold_toggle.value and storage is not None:
            return Intervention(withhold=frozenset({storage}))
        return None

    # ------------------------------------------------------- callbacks
    def _on_trace(self, _change) -> None:
        self._updating = True
        try:  # storage ids belong to one trace: drop the old trace's choice
            self.withhold_toggle.value = False
            self.withhold_dropdown.options = []
        finally:
            self._updating = False
        self._set_nudge_range()
        self.update()

    def _on_budget(self, _change) -> None:
        self.update()

    def _on_withhold(self, change) -> None:
        # Choosing another storage only matters while withholding is on.
        if not self._updating and (self.withhold_toggle.value or change["owner"] is self.withhold_toggle):
            self.update()

    def _set_nudge_range(self) -> None:
        span = max(1, int(baseline(self.trace).peak_memory * RATIO_STEP))
        self._updating = True
        try:
            self.nudge_slider.value = 0
            self.nudge_slider.min, self.nudge_slider.max = -span, span
            self.nudge_slider.step = max(1, span // 200)
        finally:
            self._updating = False

    def _offer_storages(self, plain: RunResult) -> None:
        """Offer the storages the run without intervention evicts, most often evicted first."""
        counts = pd.Series(plain.evicted_storages, dtype=object).value_counts(sort=True)
        index = self._tensor_ids()
        options = [(f"{name} ({count} evictions)", index[name]) for name, count in counts.items()]
        keep = self.withhold_dropdown.value
        self.withhold_dropdown.options = options
        # ipywidgets 8 leaves the value at None when the options change: keep the choice if it
        # is still offered, else preselect the most evicted storage, so the toggle always acts.
        values = [value for _, value in options]
        if keep in values:
            self.withhold_dropdown.value = keep
        elif values:
            self.withhold_dropdown.value = values[0]

    def _tensor_ids(self) -> dict[str, int]:
        name = self.trace.name
        if name not in self._ids:
            self._ids[name] = {tensor: i for i, tensor in enumerate(self.trace.tensor_names)}
        return self._ids[name]

    # ---------------------------------------------------------- updates
    def update(self) -> RunResult:
        """Re-run the current setting and refresh the outcome, the storage list and the timeline."""
        if self._updating:
            return self.result
        self._updating = True
        try:
            intervention = self.intervention
            if self.show_timeline:  # one recorded run gives both the result and the timeline
                self.recorded = record(self.trace, self.policy_dropdown.value, budget_bytes=self.budget_bytes,
                                       intervention=intervention, candidate_scores=False)
                self.result = self.recorded.result
            else:
                self.result = simulate(self.trace, self.policy_dropdown.value, budget_bytes=self.budget_bytes,
                                       intervention=intervention)
            if intervention is None:
                self._offer_storages(self.result)
            self.outcome.value = outcome_html(self.result, intervention, self.trace)
            if self.show_timeline:
                _show(self.timeline_image, memory_timelines(
                    [self.recorded], titles=[f"{self.result.policy}, {self.result.budget_bytes:,} B"], panel_height=3.4))
        finally:
            self._updating = False
        return self.result

    def sweep_window(self) -> pd.DataFrame:
        """Simulate ``window_points`` budgets around the current one and draw the feasibility strip."""
        peak = baseline(self.trace).peak_memory
        centre = self.budget_bytes
        low = max(1, centre - int(self.window_half_width * peak))
        high = centre + int(self.window_half_width * peak)
        budgets = sorted({low + (high - low) * i // (self.window_points - 1) for i in range(self.window_points)})
        self.window = sweep(self.trace, self.policy_dropdown.value, budgets=budgets, intervention=self.intervention,
                            execution=QUIET.uncached)
        use_style()
        fig, ax = plt.subplots(figsize=(8, 1.0))
        plot_strip(self.window, ax=ax, marker=centre / peak)
        _show(self.strip_image, fig)
        return self.window

    def widget(self) -> widgets.Widget:
        return widgets.VBox([
            widgets.HBox([self.trace_dropdown, self.policy_dropdown]),
            self.ratio_slider, self.nudge_slider,
            widgets.HBox([self.withhold_dropdown, self.withhold_toggle]),
            self.outcome, self.timeline_image,
            self.sweep_button, self.strip_image,
        ])

    def _ipython_display_(self):
        display(self.widget())


def _show(image: widgets.Image, fig) -> None:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    image.value = buffer.getvalue()


def outcome_html(result: RunResult, intervention: Intervention | None, trace: Trace) -> str:
    """The outcome line the explorer shows."""
    color = STATUS_COLORS[result.status]
    parts = [
        f"<b style='color:{color}'>{html.escape(STATUS_LABELS[result.status])}</b>",
        f"budget {result.budget_bytes:,} B ({result.budget_bytes / result.baseline_memory:.4f} of peak)",
        f"evictions {result.evictions:,}", f"remats {result.remats:,}",
        f"overhead {result.overhead:.3f}", f"peak {result.peak_memory:,} B",
    ]
    if result.failure is not None:
        op = trace.operators[result.failure.operator]
        parts.append(f"failed at step {result.failure.step} ({html.escape(op.name)})")
    if intervention:
        names = ", ".join(trace.tensor_names[s] for s in sorted(intervention.withhold))
        parts.append(f"withholding {html.escape(names)}")
    return " &middot; ".join(parts)


def _as_dict(traces) -> dict[str, Trace]:
    if isinstance(traces, Trace):
        return {traces.name: traces}
    if isinstance(traces, dict):
        result = dict(traces)
    else:
        result = {t.name: t for t in traces}
    if not result:
        raise ValueError("the explorer needs at least one trace (e.g. dtrlab.trace.load_directory('traces'))")
    return result
