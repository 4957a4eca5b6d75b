"""``dtrlab check``: the hole holding a budget, its kind and the nearest safe budgets, checked against
the shipped anatomy tables (results/shipped/anatomy, written by dtrlab ship anatomy from censuses
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
from dtrlab import baseline, simulate
from dtrlab.analysis.check import CheckPlan, check, describe_position, parse_budget, parse_device
from dtrlab.analysis.limit_census import read_anatomy_table
from dtrlab.cli import main
from dtrlab.runtime import ALLOCATED, budget_for
from dtrlab.runtime.semantics import REFERENCE
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
    # The caching answer against runs of the simulator itself (docs/memory.md: the DTR prototype's `allocated`
    # semantics on the device): DTR passes at the budget there, while flat memory thrashes, and fails a quarter
    # census step on either side, so the budget passes but is not safe.
    device = REFERENCE.with_(memory="caching", enforce=ALLOCATED, device_capacity=80 << 30)
    direct = simulate(trace, "dtr", budget_bytes=budget, semantics=device)
    assert simulate(trace, "dtr", budget_bytes=budget).status == flat["status"] == "thrash"
    assert (caching["status"], caching["overhead"]) == ("pass", pytest.approx(direct.overhead, rel=1e-12))
    quarter = record["delta_bytes"] // 4
    assert [simulate(trace, "dtr", budget_bytes=budget + k, semantics=device).status for k in (-quarter, quarter)] == \
        ["thrash", "thrash"]
    assert caching["position"] == "pass-near-failure" and caching["hole"] is None
    assert out[2] == f"dtr @ caching/allocated(A100-80GB): passes (overhead {direct.overhead:.3f}), but within one " \
        "census step of a failure"


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


def first_passing_budget(trace, low: int, high: int, resolution: int) -> int:
    """The oracle for a feasibility edge: bisect DTR's own runs between a failing ``low`` and a passing ``high``."""
    assert not simulate(trace, "dtr", budget_bytes=low).passed and simulate(trace, "dtr", budget_bytes=high).passed
    while high - low > resolution:
        middle = (low + high) // 2
        low, high = (low, middle) if simulate(trace, "dtr", budget_bytes=middle).passed else (middle, high)
    return high


def test_check_below_the_threshold(small_resnet):
    """traces/resnet32-b8 under DTR (flat memory) fails at every 0.001 of the peak from 0.38 to 0.404 and passes from
    0.405 on (runs of the simulator, below): 0.395 lies below the feasibility threshold the census finds there."""
    ratios = [round(0.38 + i / 1000, 3) for i in range(31)]
    passing = [r for r in ratios if simulate(small_resnet, "dtr", budget_bytes=budget_for(small_resnet, r)).passed]
    assert passing == [r for r in ratios if r >= 0.405]
    report = check(small_resnet, "0.395", "A100-80GB", plan=CheckPlan(window=0.015, delta=0.005, policies=("dtr",),
                                                                        monotone=False), execution=QUIET)
    flat = report.checks[0]
    peak = report.peak_bytes
    resolution = peak // 10_000  # the census's default resolution
    edge = first_passing_budget(small_resnet, budget_for(small_resnet, 0.404), budget_for(small_resnet, 0.405),
                                resolution)
    assert (flat.status, flat.position, flat.hole, flat.safe_below) == ("thrash", "below-threshold", None, None)
    assert abs(flat.threshold_ratio * peak - edge) <= resolution
    assert describe_position(flat) == f"thrash, below the feasibility threshold ({flat.threshold_ratio:.4f} of the peak)"
    assert flat.safe_above >= edge and report.checks[1].position == "below-threshold"


def test_check_fails_in_the_whole_window(small_resnet):
    """At 0.3 of the peak DTR fails at every 0.001 of the peak in the window 0.29-0.31 (runs of the simulator): no
    threshold, no hole, no safe budget, and the phrase says so."""
    ratios = [round(0.29 + i / 1000, 3) for i in range(21)]
    assert not any(simulate(small_resnet, "dtr", budget_bytes=budget_for(small_resnet, r)).passed for r in ratios)
    report = check(small_resnet, "0.3", "A100-80GB", plan=CheckPlan(window=0.01, delta=0.005, policies=("dtr",),
                                                                      monotone=False), execution=QUIET)
    for item in report.checks:
        assert (item.position, item.threshold_ratio, item.hole, item.safe_below, item.safe_above) == \
            ("fails-in-window", None, None, None, None)
        assert describe_position(item) == f"{item.status}, and nothing passes above it in the window"
    assert report.checks[0].status == simulate(small_resnet, "dtr", budget_bytes=report.budget_bytes).status


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
    (["--budget", "0.5", "--knob"], "--knob without a census file needs a model source"),
])
def test_check_bad_input_is_one_line(tmp_path, capsys, arguments, message):
    device = [] if "--device" in arguments else ["--device", "A100-80GB"]
    status = main(["check", str(ROOT / "traces" / "resnet32-b8.jsonl.gz"), *device, *arguments, "--quiet",
                   "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert status == 2 and len(err.strip().splitlines()) == 1 and message in err, err
    assert not list(tmp_path.iterdir())


def test_check_adds_the_knob_from_a_shipped_census(tmp_path, capsys):
    """With --knob CENSUS, the sixth line is the census's own answer at the budget (allocated bytes)."""
    from dtrlab.analysis.knob_census import read_census

    shipped = ROOT / "results" / "shipped" / "knob" / "traces"
    census = read_census(shipped / "transformer-b4.json")
    trace = shipped / "transformer-b4.jsonl.gz"
    out, report = run_check(capsys, str(trace), "--device", "A100-80GB", "--budget", "0.6", "--window", "0.02",
                            "--delta", "0.01", "--no-monotone", "--knob", str(shipped / "transformer-b4.json"),
                            "--out", str(tmp_path))
    # The answer read off the census's samples by hand: the largest evaluated knob whose allocated peak fits, and
    # whether every evaluated knob below it fits too.
    samples = census.samples.sort_values("knob")
    fits = samples["allocated_peak"] <= report["budget_bytes"]
    largest = float(samples.loc[fits, "knob"].max())
    safe = bool(fits[samples["knob"] <= largest].all())
    assert (report["knob"]["largest_fitting_knob"], report["knob"]["lowering_is_safe"]) == (largest, safe)
    assert report["knob"]["accounting"] == "allocated_peak" and not safe  # the shipped census has holes below it
    # the knob's line (an Inductor census adds its cpu-lowering line after it: tests/test_check_knob.py)
    (line,) = [line for line in out if line.startswith("torch.compile activation_memory_budget")]
    assert line.startswith(f"torch.compile activation_memory_budget (allocated_peak): largest knob that fits "
                           f"{largest:g}; lowering it is NOT safe")
    choice = census.knob_for_budget(report["budget_bytes"], "allocated_peak")
    assert line == f"torch.compile activation_memory_budget (allocated_peak): {choice.describe()}"
    assert "activation_memory_budget" in (tmp_path / "transformer-b4.html").read_text()


def test_parse_device():
    assert parse_device("A100-80GB") == ("A100-80GB", 80 << 30)
    assert parse_device("24GiB") == ("24GiB", 24 << 30)


CHROMIUM = next((p for p in (os.environ.get("DTRLAB_CHROMIUM"), shutil.which("chromium"), "/usr/bin/chromium")
                 if p and Path(p).exists()), None)


def open_offline(html_path: Path, figures: tuple[str, ...]) -> tuple[dict, str, list[str]]:
    """``html_path`` in headless Chromium: each figure's (loaded, width, height), the page's text, and every
    URL it requested."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install 'dtrlab[browser]')")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox",
                                                                            "--disable-gpu"])
        page = browser.new_page()
        requests = []
        page.on("request", lambda request: requests.append(request.url))
        page.goto(html_path.as_uri())
        page.wait_for_load_state("load")
        sizes = {name: page.evaluate(f"() => {{ const i = document.getElementById('{name}'); "
                                     "return [i.complete, i.naturalWidth, i.naturalHeight]; }")
                 for name in figures}
        text = page.inner_text("body")
        browser.close()
    return sizes, text, requests


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (apt-get install chromium, or set DTRLAB_CHROMIUM)")
def test_check_report_opens_in_a_browser(small_resnet, tmp_path):
    """The HTML report in headless Chromium, offline: its figure decodes and its tables name the hole."""
    from dtrlab.plots.check import write_check_report

    report = check(small_resnet, 9_460_849, "A100-80GB",
                   plan=CheckPlan(window=0.01, delta=0.005, policies=("dtr",), monotone=False), execution=QUIET)
    html_path = tmp_path / "report.html"
    write_check_report(report, html_path, tmp_path / "report.json")
    sizes, text, requests = open_offline(html_path, ("check-figure",))
    size = sizes["check-figure"]
    assert size[0] and size[1] > 400 and size[2] > 100, size
    assert "inside a cliff hole" in text and "holds the budget" in text
    assert all(url.startswith(("file:", "data:")) for url in requests), requests  # nothing from the network


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (apt-get install chromium, or set DTRLAB_CHROMIUM)")
def test_check_knob_report_opens_in_a_browser(tmp_path):
    """With a knob census (the shipped Transformer's), the report's knob section in headless Chromium,
    offline: the peak-against-knob figure decodes, the table of choices and the census's warning show."""
    from dtrlab.analysis.knob_census import read_census
    from dtrlab.plots.check import write_check_report

    shipped = ROOT / "results" / "shipped" / "knob" / "traces"
    report = check(load_log(shipped / "transformer-b4.jsonl.gz"), 11_516_928, "A100-80GB",
                   plan=CheckPlan(window=0.01, delta=0.005, policies=("dtr",), monotone=False), execution=QUIET,
                   knob=read_census(shipped / "transformer-b4.json"))
    html_path = tmp_path / "report.html"
    write_check_report(report, html_path, tmp_path / "report.json")
    sizes, text, requests = open_offline(html_path, ("check-figure", "knob-figure"))
    assert all(s[0] and s[1] > 400 and s[2] > 100 for s in sizes.values()), sizes
    assert "torch.compile activation_memory_budget" in text and "allocated_peak (answers)" in text
    assert "lowering-unsafe: largest knob that fits 0.43" in text and "0.34..0.40875" in text
    assert all(url.startswith(("file:", "data:")) for url in requests), requests  # nothing from the network


# --- dtrlab census --anatomy and --overhead-limit none ---------------------------------------------------------

def census_holes(capsys, tmp_path, source, *options) -> pd.DataFrame:
    status = main(["census", str(source), "--anatomy", "--no-cache", "--quiet", "--out", str(tmp_path), *options])
    out = capsys.readouterr().out
    assert status == 0 and "anatomy" in out and "closes_at" in out and "needed_remat" in out, out
    return pd.read_parquet(tmp_path / "holes.parquet")


@pytest.mark.parametrize("log", [RESNET_LOG, "unet-6-8000000000.0-2020-10-1-10-57-18-default.log"])
def test_census_anatomy_matches_the_shipped_census(load_shared_log, logs_dir, tmp_path, capsys, log):
    """The README's census (0.05-1.0 every 0.001 of the peak, edges to 1e-4 of it, limit 2.0) with --anatomy: the
    same holes and classes as results/shipped/anatomy/dtr-logs-census-holes.csv (ResNet-32: a cliff; U-Net: 3 oom)."""
    trace = load_shared_log(log)
    resolution = max(1, int(baseline(trace).peak_memory * 1e-4))
    holes = census_holes(capsys, tmp_path, logs_dir / log, "--ratios", "0.05:1.0:0.005", "--delta", "0.001",
                         "--resolution", str(resolution))
    shipped = read_anatomy_table("dtr-logs-census-holes.csv")
    shipped = shipped[(shipped["trace"] == trace.name) & shipped["anatomy"].notna()]
    edges = ["pass_below_bytes", "fail_low_bytes", "fail_high_bytes", "pass_above_bytes"]
    assert len(holes) == len(shipped) > 0
    assert holes[edges].astype("int64").values.tolist() == shipped[edges].astype("int64").values.tolist()
    assert holes["anatomy"].tolist() == shipped["anatomy"].tolist()
    finite = holes["closes_at"].notna() & (holes["anatomy"] != "oom")
    assert holes.loc[finite, "closes_at"].round(6).tolist() == shipped.loc[finite.values, "closes_at"].round(6).tolist()


def test_census_anatomy_matches_the_shipped_traces_table(tmp_path, capsys):
    """traces/unroll_gan-b64 (notebook 12's grid, 0.005 with probes, at 2.0): every hole the census finds is a hole of
    results/shipped/anatomy/traces-holes.csv with the same class (cliff, near-miss and limit all occur); the shipped
    census, refined at five limits from shared runs, has more samples, so it may hold holes this one does not."""
    holes = census_holes(capsys, tmp_path, ROOT / "traces" / "unroll_gan-b64.jsonl.gz", "--ratios", "0.05:1.0:0.005")
    shipped = read_anatomy_table("traces-holes.csv")
    shipped = shipped[(shipped["trace"] == "unroll_gan-b64") & (shipped["policy"] == "dtr") &
                      (shipped["memory"] == "flat") & (shipped["limit"] == 2.0)]
    resolution = baseline(load_log(ROOT / "traces" / "unroll_gan-b64.jsonl.gz")).peak_memory // 10_000
    assert set(holes["anatomy"]) == {"cliff", "near-miss", "limit"}
    for hole in holes.itertuples():
        same = shipped[(shipped["fail_low_bytes"] - hole.fail_low_bytes).abs().le(resolution) &
                       (shipped["fail_high_bytes"] - hole.fail_high_bytes).abs().le(resolution)]
        assert len(same) == 1, hole
        assert same["anatomy"].iloc[0] == hole.anatomy
        assert math.isclose(same["closes_at"].iloc[0], hole.closes_at, rel_tol=0.01)


def test_no_limit(capsys, small_resnet, tmp_path):
    """--overhead-limit none: a run without a limit, for a limit-blind policy; refused, one line, for monotone."""
    log = str(ROOT / "traces" / "resnet32-b8.jsonl.gz")
    assert main(["run", log, "--ratio", "0.3", "--overhead-limit", "none", "--json"]) in (0, 1)
    record = json.loads(capsys.readouterr().out)
    assert record["status"] in ("pass", "oom") and record["overhead_limit"] is None or \
        math.isinf(float(record["overhead_limit"]))
    for argv in (["run", log, "--ratio", "0.3"], ["sweep", log, "--ratios", "0.3,0.5", "--no-cache"],
                 ["census", log, "--ratios", "0.3:0.4:0.05", "--no-cache", "--out", str(tmp_path)]):
        assert main([*argv, "--policy", "monotone", "--overhead-limit", "inf"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--overhead-limit none" in err and "reads the overhead limit" in err, err
    assert main(["census", log, "--ratios", "0.3:0.4:0.05", "--no-cache", "--anatomy", "--no-refine",
                 "--out", str(tmp_path)]) == 2
    assert "drop --no-refine" in capsys.readouterr().err


def test_holes_anatomy(tmp_path, capsys):
    """`dtrlab holes SWEEP --anatomy --traces LOG` gives every hole of a saved sweep its kind; without the swept
    trace it is refused in one line."""
    log = ROOT / "traces" / "unroll_gan-b64.jsonl.gz"
    sweep = tmp_path / "sweep.parquet"
    assert main(["sweep", str(log), "--ratios", "0.75:0.80:0.0025", "--no-cache", "--quiet", "--out", str(sweep)]) == 0
    capsys.readouterr()
    assert main(["holes", str(sweep), "--anatomy"]) == 2 and "--traces" in capsys.readouterr().err
    assert main(["holes", str(sweep), "--anatomy", "--traces", str(ROOT / "traces" / "lstm-b16.jsonl.gz")]) == 2
    assert "no trace named 'unroll_gan-b64'" in capsys.readouterr().err
    assert main(["holes", str(sweep), "--anatomy", "--traces", str(log), "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("trace") and "anatomy" in line))
    rows = [line.split() for line in lines[header + 1:] if line.strip()]
    assert rows and all(row[11] in ("oom", "cliff", "near-miss", "limit") for row in rows), lines


@pytest.mark.slow
def test_readme_example_is_true(logs_dir, tmp_path, capsys):
    """README.md's `dtrlab check` example prints the five lines README shows (its default census)."""
    readme = (ROOT / "README.md").read_text()
    command = readme.split("dtrlab check ../shared/dtr-logs/", 1)[1].split("```", 1)[0]
    log = command.split()[0]
    options = command.replace("\\", " ").split()[1:]
    assert main(["check", str(logs_dir / log), *options, "--quiet", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out.splitlines()[:5]
    shown = readme.split("prints five lines:\n\n```\n", 1)[1].split("```", 1)[0].splitlines()
    assert printed == shown
