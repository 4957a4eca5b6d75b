"""The explorer as it is used: notebook 07 in JupyterLab, driven by headless Chromium.

Starts JupyterLab as `make lab` does (scripts/lab.py's command, on a free port with a token) over a copy of
notebooks/07-explorer.ipynb whose parameters are set to quick mode (the cell
papermill would inject), opens it in the system's Chromium through Playwright
(no browser download), runs all cells, then moves the budget slider, the nudge,
toggles "withhold from eviction" and clicks "sweep window". After each action the
outcome line the browser renders must be exactly what dtrlab computes for the
setting the widgets show. No widget may show an error or a cut-off label.

Needs the `browser` extra (playwright) and Chromium (Debian: apt-get install chromium;
.ci/run installs it when it runs as root). On failure a screenshot is left in the
test's tmp dir.
"""

from __future__ import annotations

import html
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = next((p for p in (os.environ.get("DTRLAB_CHROMIUM"), shutil.which("chromium"), "/usr/bin/chromium")
                 if p and Path(p).exists()), None)
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# Hang guards, not verdicts: each wait ends as soon as its condition holds, however long it takes
# below this (a loaded 2-core machine can take tens of seconds for a kernel start).
TIMEOUT_MS = 600_000

pytestmark = pytest.mark.slow
sync_api = pytest.importorskip("playwright.sync_api", reason="the browser test needs playwright (pip install "
                               "'dtrlab[browser]')")
pytest.importorskip("jupyterlab", reason="the browser test needs JupyterLab")
if CHROMIUM is None:
    pytest.skip("no Chromium (apt-get install chromium, or set DTRLAB_CHROMIUM)", allow_module_level=True)

from conftest import load_script  # noqa: E402
from dtrlab import Intervention, baseline, simulate  # noqa: E402
from dtrlab.plots.style import short_trace_name  # noqa: E402
from dtrlab.trace import load_directory  # noqa: E402
from dtrlab.widgets.explorer import outcome_html  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _quick_notebook(directory: Path) -> Path:
    """Notebook 07 with a quick-mode parameter cell after its own, as papermill injects it."""
    notebook = json.loads((ROOT / "notebooks" / "07-explorer.ipynb").read_text())
    parameters = {"quick": True, "traces_dir": str(ROOT / "traces"), "figures_dir": str(directory / "figures"),
                  "cache_dir": str(directory / "cache"), "jobs": 1}
    index = next(i for i, cell in enumerate(notebook["cells"])
                 if "parameters" in cell.get("metadata", {}).get("tags", []))
    source = "\n".join(f"{key} = {value!r}" for key, value in parameters.items())
    notebook["cells"].insert(index + 1, {"cell_type": "code", "metadata": {"tags": ["injected-parameters"]},
                                         "source": source, "outputs": [], "execution_count": None})
    for cell in notebook["cells"]:
        cell.pop("id", None)  # nbformat 4.4 cells without ids: no duplicates after the insert
    notebook["nbformat_minor"] = min(notebook.get("nbformat_minor", 4), 4)
    path = directory / "07-explorer.ipynb"
    path.write_text(json.dumps(notebook))
    return path


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """(base url, token) of a JupyterLab serving a quick copy of notebook 07."""
    directory = tmp_path_factory.mktemp("lab")
    _quick_notebook(directory)
    settings = directory / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    # No news toast over the widgets, and no request for news on a closed network.
    (settings / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ, MPLBACKEND="agg", JUPYTERLAB_SETTINGS_DIR=str(directory / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(directory / "workspaces"), JUPYTER_RUNTIME_DIR=str(directory / "runtime"))
    # `make lab`'s command (scripts/lab.py), on a free port with a known token.
    command = load_script("lab").lab_command(directory, port=port, token=token, open_browser=False)
    command.append("--ServerApp.port_retries=0")
    log = open(directory / "jupyterlab.log", "w")
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + TIMEOUT_MS / 1000
        while True:
            if server.poll() is not None:
                pytest.fail(f"JupyterLab exited ({server.returncode}): {(directory / 'jupyterlab.log').read_text()}")
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not answer in {TIMEOUT_MS / 1000:.0f} s (hung?)")
                time.sleep(0.3)
        yield base, token, directory
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@pytest.fixture(scope="module")
def traces():
    loaded = load_directory(ROOT / "traces")
    return {short_trace_name(name): trace for name, trace in loaded.items()}


def _text(fragment: str) -> str:
    """What the browser renders of an HTML fragment (tags dropped, entities decoded)."""
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", "", fragment))).strip()


def _number(text: str) -> float:
    return float(text.replace("\u2212", "-").replace(",", ""))


class ExplorerPage:
    """The explorer's widgets in the page, located by their labels."""

    def __init__(self, page):
        self.page = page
        self.ratio = page.locator(".widget-slider", has=page.locator(".widget-label", has_text="budget ratio"))
        self.nudge = page.locator(".widget-slider", has=page.locator(".widget-label", has_text="nudge"))
        self.trace = page.locator(".widget-dropdown", has=page.locator(".widget-label", has_text="trace")).locator(
            "select")
        self.policy = page.locator(".widget-dropdown", has=page.locator(".widget-label", has_text="policy")).locator(
            "select")
        self.storage = page.locator(".widget-dropdown", has=page.locator(".widget-label", has_text="storage")).locator(
            "select")
        self.withhold = page.get_by_role("button", name="withhold from eviction")
        self.sweep = page.get_by_role("button", name="sweep window")
        self.outcome = page.locator(".widget-html-content", has_text="evictions")
        self.strip = page.locator(".widget-image").last

    def outcome_text(self) -> str:
        return re.sub(r"\s+", " ", self.outcome.inner_text()).strip()

    def wait_for_new_outcome(self, old: str) -> str:
        self.page.wait_for_function(
            "old => [...document.querySelectorAll('.widget-html-content')]"
            ".some(e => e.innerText.includes('evictions') && e.innerText.replace(/\\s+/g, ' ').trim() !== old)",
            arg=old, timeout=TIMEOUT_MS)
        return self.outcome_text()

    def wait_for_kernel(self) -> None:
        self.page.locator("#jp-main-statusbar").get_by_text("Idle").first.wait_for()

    def setting(self) -> dict:
        return {"trace": self.trace.locator("option:checked").inner_text().strip(),
                "policy": self.policy.input_value(),
                "ratio": _number(self.ratio.locator(".widget-readout").inner_text()),
                "nudge": int(_number(self.nudge.locator(".widget-readout").inner_text()))}

    def type_readout(self, slider, value: str) -> None:
        readout = slider.locator(".widget-readout")
        readout.click()
        self.page.keyboard.press("Control+A")
        self.page.keyboard.type(value)
        self.page.keyboard.press("Enter")


def _expected(traces, setting: dict, withhold: str | None = None) -> str:
    trace = traces[setting["trace"]]
    budget = int(baseline(trace).peak_memory * setting["ratio"]) + setting["nudge"]
    intervention = None
    if withhold is not None:
        intervention = Intervention(withhold=frozenset({trace.tensor_names.index(withhold)}))
    return _text(outcome_html(simulate(trace, setting["policy"], budget_bytes=budget, intervention=intervention),
                              intervention, trace))


def _assert_no_widget_errors(page) -> None:
    assert page.locator(".jupyter-widgets-error-widget").count() == 0
    assert page.get_by_text("Error displaying widget").count() == 0
    errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    tracebacks = [t for t in errors.all_inner_texts() if "Traceback" in t or "Error" in t]
    assert not tracebacks, tracebacks


def _assert_labels_fit(page) -> None:
    """Every label and button caption of the explorer is shown whole (not cut to 'budget ra...')."""
    cut = page.evaluate("""() => [...document.querySelectorAll(
            '.widget-label, .widget-toggle-button, .widget-button')]
        .filter(e => {
            if (e.offsetParent === null || !e.innerText.trim()) return false;
            // The text's own width against the room inside the element's padding.
            const range = document.createRange(), css = getComputedStyle(e);
            range.selectNodeContents(e);
            const room = e.getBoundingClientRect().width - ['paddingLeft', 'paddingRight', 'borderLeftWidth',
                'borderRightWidth'].reduce((sum, side) => sum + parseFloat(css[side]), 0);
            return range.getBoundingClientRect().width > room + 0.1;
        })
        .map(e => e.innerText)""")
    assert not cut, f"cut-off widget labels: {cut}"


def test_explorer_in_jupyterlab(lab, traces, tmp_path):
    base, token, directory = lab
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(TIMEOUT_MS)
        try:
            page.goto(f"{base}/lab/tree/07-explorer.ipynb?token={token}")
            page.wait_for_selector(".jp-Notebook .jp-Cell")
            ExplorerPage(page).wait_for_kernel()
            page.get_by_role("menuitem", name="Run", exact=True).click()
            page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
            explorer = ExplorerPage(page)
            explorer.outcome.wait_for()
            # The last cell (sweep and figure) has run once its output is printed.
            page.get_by_text(re.compile(r"\d+ evictions, \d+ remats, overhead")).wait_for()
            _assert_no_widget_errors(page)
            _assert_labels_fit(page)
            text = explorer.outcome_text()
            assert text == _expected(traces, explorer.setting())

            # The budget slider, moved by one step with the keyboard as a user would.
            before = explorer.setting()
            explorer.ratio.locator(".noUi-handle").focus()
            page.keyboard.press("ArrowRight")
            text = explorer.wait_for_new_outcome(text)
            explorer.wait_for_kernel()  # the timeline is redrawn after the outcome line
            page.screenshot(path=str(tmp_path / "explorer-after-slider.png"))
            setting = explorer.setting()
            assert setting["ratio"] == pytest.approx(before["ratio"] + 0.005)
            assert text == _expected(traces, setting)

            # The nudge, typed into its readout.
            explorer.type_readout(explorer.nudge, "0")
            text = explorer.wait_for_new_outcome(text)
            setting = explorer.setting()
            assert setting["nudge"] == 0
            assert text == _expected(traces, setting)

            # Withhold the preselected (most evicted) storage.
            storage = explorer.storage.locator("option:checked").inner_text().split()[0]
            explorer.withhold.click()
            text = explorer.wait_for_new_outcome(text)
            assert f"withholding {storage}" in text
            assert text == _expected(traces, setting, withhold=storage)

            # Sweep the window: a new strip is drawn, the outcome line stays.
            strip_before = explorer.strip.get_attribute("src")
            explorer.sweep.click()
            page.wait_for_function("old => { const imgs = document.querySelectorAll('.widget-image');"
                                   " return imgs[imgs.length - 1].src !== old; }", arg=strip_before)
            assert explorer.outcome_text() == text
            _assert_no_widget_errors(page)
            _assert_labels_fit(page)
        except BaseException:
            page.screenshot(path=str(tmp_path / "explorer-failure.png"), full_page=True)
            print(f"screenshot: {tmp_path / 'explorer-failure.png'}; JupyterLab log: {directory / 'jupyterlab.log'}")
            raise
        finally:
            browser.close()
