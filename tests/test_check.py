"""``dtrlab check``: the hole holding a budget, its kind and the nearest safe budgets, checked against
the shipped anatomy tables (results/shipped/anatomy, written by scripts/ship_anatomy.py from censuses
made independently of the check), and its HTML report in a real browser.

Each check is small: a narrow window on a coarse step, DTR alone (deterministic; no time limits)."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from conftest import RESNET_LOG
from dtrlab import baseline
from dtrlab.analysis.check import CheckPlan, check, parse_budget, parse_device
from dtrlab.analysis.limit_census import read_anatomy_table
from dtrlab.cli import main
from dtrlab.sweep.execution import Execution
from dtrlab.trace import load_log

ROOT = Path(__file__).resolve().parent.parent
QUIET = Execution(cache=False, progress=False)


def shipped_hole(table: str, trace: str, budget: int) -> pd.Series:
    """The shipped DTR hole under flat memory at the limit 2.0 whose failing samples hold ``budget``."""
    holes = read_anatomy_table(table)
    holes = holes[(holes["trace"] == trace) & (holes["policy"] == "dtr") & (holes["memory"] == "flat")]
    if "limit" in holes:
        holes = holes[holes["limit"] == 2.0]
    inside = holes[(holes["fail_low_bytes"] <= budget) & (holes["fail_high_bytes"] >= budget)]
    assert len(inside) == 1, f"the shipped table has {len(inside)} holes holding {budget}"
    return inside.iloc[0]


def run_check(capsys, *arguments) -> tuple[list[str], dict]:
    status = main(["check", *arguments, "--policies", "dtr", "--no-cache", "--quiet"])
    out = capsys.readouterr().out.splitlines()
    assert status == 0, out
    report = Path(out[-1].split("JSON: ")[1].rstrip(")"))
    return out, json.loads(report.read_text())


def test_check_names_the_hole_of_a_shipped_trace(tmp_path, capsys):
    """traces/densenet45-b4 at 0.415 of the peak lies in a cliff of the shipped anatomy (no ../shared needed)."""
    trace = load_log(ROOT / "traces" / "densenet45-b4.jsonl.gz")
    budget = parse_budget("0.415", trace)
    shipped = shipped_hole("traces-holes.csv", "densenet45-b4", budget)
    out, record = run_check(capsys, str(ROOT / "traces" / "densenet45-b4.jsonl.gz"), "--device", "A100-80GB",
                            "--budget", "0.415", "--window", "0.03", "--delta", "0.005", "--no-monotone",
                            "--out", str(tmp_path))
    assert len(out) == 6  # five lines of summary, then where the report is
    assert f"inside a {shipped['anatomy']} hole" in out[1] and shipped["anatomy"] == "cliff"
    flat = record["checks"][0]
    assert (flat["policy"], flat["memory"], flat["position"]) == ("dtr", "flat", "hole")
    hole = flat["hole"]
    assert hole["anatomy"] == shipped["anatomy"]
    # The same upper edge, bisected to the default resolution (1/10000 of the peak) in both censuses.
    resolution = baseline(trace).peak_memory // 10_000
    assert abs(hole["pass_above_bytes"] - shipped["pass_above_bytes"]) <= resolution
    assert math.isclose(hole["closes_at"], shipped["closes_at"], rel_tol=0.01)
    # Safe above: past the hole's edge, at least one census step from any failure; nothing safe below in the window.
    assert flat["safe_above"] >= shipped["pass_above_bytes"] + record["delta_bytes"]
    assert flat["safe_above"] <= budget + 0.03 * baseline(trace).peak_memory
    assert f"above {flat['safe_above'] / 2**20:.1f} MiB" in out[3]
    caching = record["checks"][1]
    assert caching["memory"] == "caching/allocated(A100-80GB)" and out[2].startswith("dtr @ caching/allocated")
    assert (Path(tmp_path) / "densenet45-b4.html").read_text().count("data:image/png;base64,") == 1


def test_check_captures_a_zoo_model(tmp_path, capsys):
    """`dtrlab check resnet32`: the zoo model is captured (the same log as traces/resnet32-b8) and the shipped
    one-sample cliff at 9,460,849 bytes is found and named, with monotone(dtr)'s cost there."""
    pytest.importorskip("torch", reason="capturing a model needs torch (pip install 'dtrlab[torch,models]')")
    budget = 9_460_849
    shipped = shipped_hole("traces-holes.csv", "resnet32-b8", budget)
    out, record = run_check(capsys, "resnet32", "--batch", "8", "--device", "V100-16GB", "--budget", str(budget),
                            "--window", "0.01", "--delta", "0.005", "--out", str(tmp_path))
    captured = tmp_path / "resnet32-b8.jsonl.gz"
    assert load_log(captured).content_hash == load_log(ROOT / "traces" / "resnet32-b8.jsonl.gz").content_hash
    flat = record["checks"][0]
    assert flat["position"] == "hole" and flat["hole"]["anatomy"] == shipped["anatomy"] == "cliff"
    resolution = baseline(load_log(captured)).peak_memory // 10_000  # both censuses bisect to it
    for edge in ("pass_below_bytes", "pass_above_bytes"):
        assert abs(flat["hole"][edge] - shipped[edge]) <= resolution
    assert flat["safe_below"] < shipped["pass_below_bytes"] < shipped["pass_above_bytes"] < flat["safe_above"]
    monotone = record["monotone"]
    assert monotone["status"] == "pass" and monotone["overhead"] >= 1 and monotone["threshold_ratio"] <= record["ratio"]
    assert "monotone(dtr) pass at overhead" in out[4]


def test_check_on_the_resnet32_log(load_shared_log, logs_dir, tmp_path, capsys):
    """The DTR artifact's ResNet-32 log at 0.17 of the peak: inside the README's hole at 0.1689-0.1733, a cliff
    closing at 2.30 (results/shipped/anatomy/dtr-logs-census-holes.csv)."""
    trace = load_shared_log(RESNET_LOG)
    budget = parse_budget("0.17", trace)
    shipped = shipped_hole("dtr-logs-census-holes.csv", trace.name, budget)
    out, record = run_check(capsys, str(logs_dir / RESNET_LOG), "--device", "A100-80GB", "--budget", "0.17",
                            "--window", "0.01", "--no-monotone", "--out", str(tmp_path))
    flat = record["checks"][0]
    assert flat["hole"]["anatomy"] == shipped["anatomy"] == "cliff"
    resolution = 1 << 20  # the check's default; the shipped census bisected to 1/10000 of the peak
    for edge in ("pass_below_bytes", "pass_above_bytes"):
        assert abs(flat["hole"][edge] - shipped[edge]) <= resolution
    assert math.isclose(flat["hole"]["closes_at"], shipped["closes_at"], rel_tol=0.02)
    assert "inside a cliff hole, ratios 0.1689-0.1733" in out[1] and "closes at overhead limit 2.30" in out[1]
    assert flat["safe_below"] < shipped["pass_below_bytes"] and flat["safe_above"] > shipped["pass_above_bytes"]


def test_check_api_passes_and_safe(small_resnet):
    """Far above every hole the budget is safe, under both semantics."""
    report = check(small_resnet, "0.6", "A100-80GB", plan=CheckPlan(window=0.01, delta=0.005, policies=("dtr",),
                                                                      monotone=False), execution=QUIET)
    assert [c.position for c in report.checks] == ["safe", "safe"]
    assert all(c.safe_below == c.safe_above == report.budget_bytes for c in report.checks)
    assert "is safe for dtr" in report.summary()[3] and len(report.summary()) == 5


@pytest.mark.parametrize("spec, expected", [("40GiB", 40 << 30), ("512MB", 512 * 10**6), ("4096", 4096)])
def test_parse_budget(small_resnet, spec, expected):
    assert parse_budget(spec, small_resnet) == expected
    assert parse_budget("50%", small_resnet) == parse_budget("0.5", small_resnet) == \
        int(baseline(small_resnet).peak_memory * 0.5)


@pytest.mark.parametrize("arguments, message", [
    (["--budget", "lots"], "budget 'lots'"),
    (["--budget", "1.25x"], "budget '1.25x'"),
    (["--budget", "0.5", "--device", "A100-81GB"], "A100-80GB"),
    (["--budget", "0.5", "--device", "1.25x"], "not a multiple"),
    (["--budget", "0.5", "--policies", "dtrr"], "dtr"),
])
def test_check_bad_input_is_one_line(tmp_path, capsys, arguments, message):
    device = [] if "--device" in arguments else ["--device", "A100-80GB"]
    status = main(["check", str(ROOT / "traces" / "resnet32-b8.jsonl.gz"), *device, *arguments, "--quiet",
                   "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert status == 2 and len(err.strip().splitlines()) == 1 and message in err, err
    assert not list(tmp_path.iterdir())


def test_parse_device():
    assert parse_device("A100-80GB") == ("A100-80GB", 80 << 30)
    assert parse_device("24GiB") == ("24GiB", 24 << 30)


CHROMIUM = next((p for p in (os.environ.get("DTRLAB_CHROMIUM"), shutil.which("chromium"), "/usr/bin/chromium")
                 if p and Path(p).exists()), None)


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (apt-get install chromium, or set DTRLAB_CHROMIUM)")
def test_check_report_opens_in_a_browser(small_resnet, tmp_path):
    """The HTML report in headless Chromium, offline: its figure decodes and its tables name the hole."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install 'dtrlab[browser]')")
    from dtrlab.plots.check import write_check_report

    report = check(small_resnet, 9_460_849, "A100-80GB",
                   plan=CheckPlan(window=0.01, delta=0.005, policies=("dtr",), monotone=False), execution=QUIET)
    html_path = tmp_path / "report.html"
    write_check_report(report, html_path, tmp_path / "report.json")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox",
                                                                            "--disable-gpu"])
        page = browser.new_page()
        requests = []
        page.on("request", lambda request: requests.append(request.url))
        page.goto(html_path.as_uri())
        page.wait_for_load_state("load")
        size = page.evaluate("() => { const i = document.getElementById('check-figure'); "
                             "return [i.complete, i.naturalWidth, i.naturalHeight]; }")
        text = page.inner_text("body")
        browser.close()
    assert size[0] and size[1] > 400 and size[2] > 100, size
    assert "inside a cliff hole" in text and "holds the budget" in text
    assert all(url.startswith(("file:", "data:")) for url in requests), requests  # nothing from the network
