"""``dtrlab check``: the hole holding a budget, its kind and the nearest safe budgets, checked against
the shipped anatomy tables (results/shipped/anatomy, written by dtrlab ship anatomy from censuses
made independently of the check), and its HTML report in a real browser.

Each check is small: a narrow window on a coarse step, DTR alone (deterministic; no time limits)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from chains import chain_trace
from conftest import RESNET_LOG
from dtrlab import baseline, simulate
from dtrlab.analysis.check import (CheckPlan, CheckReport, PolicyCheck, check, check_semantics, describe_position,
                                   memory_name, parse_budget, parse_device)
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


@pytest.mark.parametrize("device", ["A100", "a100-80gb"])  # lower case: difflib alone picked H100-80GB
def test_an_unknown_device_lists_the_presets_once(tmp_path, capsys, device):
    status = main(["check", str(ROOT / "traces" / "resnet32-b8.jsonl.gz"), "--device", device, "--budget", "0.5",
                   "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert status == 2 and "(did you mean 'A100-80GB'?)" in err and err.count("H200-141GB") == 1, err


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


# --- the check's own logic on hand-built inputs (quick: each kills mutants for a fraction of a second) ----------

CHAIN_PLAN = CheckPlan(window=0.2, delta=0.02, policies=("dtr",), monotone=False)
#: The chain's caching answer: 10-byte tensors become 512-byte blocks, so under `allocated` on a 1 MiB device
#: nothing passes at tens of bytes.
ON_1MIB = REFERENCE.with_(memory="caching", enforce=ALLOCATED, device_capacity=1 << 20)


def test_check_on_the_chain_where_the_budget_is_safe():
    """At 0.9 of the chain's 50-byte peak (45 bytes): the window 0.7-1.1 is sampled every 0.02 of the peak (a byte
    or two: simrd's int(peak x ratio)) and the edge at 40 bisected, so the census holds 35..55; the margin is
    ceil(0.02 x 50) + 1 = 2 bytes. DTR and MSPS fail below 40 and pass from it (runs of the simulator), so 45 is safe
    for both; under the caching allocator everything fails."""
    trace = chain_trace()
    flat = {b: simulate(trace, "dtr", budget_bytes=b) for b in range(35, 56)}
    assert [b for b, r in flat.items() if not r.passed] == list(range(35, 40))
    assert all(simulate(trace, "msps", budget_bytes=b).passed == flat[b].passed for b in flat)
    assert not any(simulate(trace, "dtr", budget_bytes=b, semantics=ON_1MIB).passed for b in flat)
    report = check(trace, "0.9", "1MiB", plan=CheckPlan(window=0.2, delta=0.02, policies=("dtr", "msps"),
                                                         monotone=False), execution=QUIET)
    assert (report.trace, report.peak_bytes, report.budget_bytes, report.ratio, report.window, report.delta_bytes) == \
        ("chain", 50, 45, 0.9, (0.7, 1.1), 2)
    assert (report.device, report.device_bytes, report.monotone, report.knob, report.ac) == \
        ("1MiB", 1 << 20, None, None, None)
    caching_label = "caching/allocated(1MiB)"
    assert [(c.policy, c.memory) for c in report.checks] == \
        [("dtr", "flat"), ("dtr", caching_label), ("msps", "flat"), ("msps", caching_label)]
    for item in report.checks[0], report.checks[2]:
        assert (item.status, item.overhead, item.position, item.hole, item.holes, item.threshold_ratio) == \
            ("pass", flat[45].overhead, "safe", None, [], 0.8)
        assert (item.safe_below, item.safe_above, item.safe_below_overhead, item.safe_above_overhead) == \
            (45, 45, flat[45].overhead, flat[45].overhead)
        assert {35, 39, 40, 43, 44, 45, 46, 47, 55} <= set(item.samples["budget_bytes"]) <= set(range(35, 56))
    for item in report.checks[1], report.checks[3]:
        assert (item.status, item.overhead, item.position, item.hole, item.threshold_ratio) == \
            (simulate(trace, item.policy, budget_bytes=45, semantics=ON_1MIB).status, None, "fails-in-window", None,
             None)
        assert (item.safe_below, item.safe_above, item.safe_below_overhead, item.safe_above_overhead) == (None,) * 4
    assert report.summary() == [
        "chain: budget 0.0 MiB = 0.9000 of the 0.0 MiB peak, device 1MiB (1.0 MiB)",
        "dtr @ flat: passes (overhead 1.700)",
        f"dtr @ {caching_label}: oom, and nothing passes above it in the window",
        "nearest safe budgets (dtr, flat / caching): below 0.0 MiB (0.9000) / none in the window, above 0.0 MiB "
        "(0.9000) / none in the window",
        "other policies safe here: msps @ flat (overhead 1.700)"]
    record = json.loads(json.dumps(report.to_dict(), allow_nan=False))  # strict JSON
    assert record["window"] == [0.7, 1.1] and record["delta_bytes"] == 2 and "knob_census" not in record
    assert record["checks"][0] == {
        "policy": "dtr", "memory": "flat", "status": "pass", "overhead": flat[45].overhead, "position": "safe",
        "hole": None, "holes": [], "threshold_ratio": 0.8, "safe_below": 45, "safe_above": 45,
        "safe_below_overhead": flat[45].overhead, "safe_above_overhead": flat[45].overhead}


def test_check_on_the_chain_next_to_a_failure_with_monotone():
    """At 40 bytes (0.8; window 0.6-1.0, budgets from 30 to 50): DTR passes, but the failure at 39 lies within the
    2-byte margin of 40 and 41, so 42 is the nearest safe budget. monotone(dtr) passes at 40 and, calibrated every
    0.01 of the peak, first at 0.8 (DTR's 40 bytes)."""
    trace = chain_trace()
    report = check(trace, 40, "1MiB", plan=CheckPlan(window=0.2, delta=0.02, policies=("dtr",)), execution=QUIET)
    dtr = simulate(trace, "dtr", budget_bytes=40)
    flat, caching = report.checks
    assert report.window == (0.6, 1.0) and {30, 39, 40, 41, 42, 50} <= set(flat.samples["budget_bytes"]) <= \
        set(range(30, 51))
    assert (flat.status, flat.overhead, flat.position, flat.safe_below, flat.safe_above) == \
        ("pass", dtr.overhead, "pass-near-failure", None, 42)
    assert (flat.safe_below_overhead, flat.safe_above_overhead) == \
        (None, simulate(trace, "dtr", budget_bytes=42).overhead)
    monotone = simulate(trace, "monotone", budget_bytes=40)
    assert report.monotone == {"policy": "monotone", "memory": "flat", "status": "pass",
                               "overhead": monotone.overhead, "threshold_ratio": 0.8}
    assert report.summary()[1:] == [
        f"dtr @ flat: passes (overhead {dtr.overhead:.3f}), but within one census step of a failure",
        "dtr @ caching/allocated(1MiB): oom, and nothing passes above it in the window",
        "nearest safe budgets (dtr, flat / caching): below none in the window / none in the window, above 0.0 MiB "
        "(0.8400) / none in the window",
        f"monotone(dtr) pass at overhead {monotone.overhead:.3f}, passes from 0.800 of the peak; other policies "
        "safe here: none checked"]


def test_check_on_the_chain_under_an_overhead_limit():
    """The flat semantics' overhead limit (1.5) applies to the census, the caching check and monotone(dtr): DTR's
    recompute below the peak (overhead 1.7 from 40 to 49 bytes) thrashes, so at 45 it lies below the feasibility
    threshold of 50 bytes (1.0 of the peak), and 52 is the nearest safe budget (49 fails)."""
    trace = chain_trace()
    limited = REFERENCE.with_(overhead_limit=1.5)
    runs = {b: simulate(trace, "dtr", budget_bytes=b, semantics=limited) for b in range(35, 56)}
    assert [b for b, r in runs.items() if r.passed] == list(range(50, 56))
    report = check(trace, 45, "1MiB", plan=CheckPlan(window=0.2, delta=0.02, policies=("dtr",)), semantics=limited,
                   execution=QUIET)
    flat, caching = report.checks
    assert (flat.status, flat.overhead, flat.position, flat.threshold_ratio, flat.safe_below, flat.safe_above) == \
        (runs[45].status, None, "below-threshold", 1.0, None, 52)
    assert flat.safe_above_overhead == runs[52].overhead and flat.status == "thrash"
    assert caching.status == simulate(trace, "dtr", budget_bytes=45,
                                      semantics=ON_1MIB.with_(overhead_limit=1.5)).status
    monotone = simulate(trace, "monotone", budget_bytes=45, semantics=limited)
    assert not monotone.passed
    assert report.monotone == {"policy": "monotone", "memory": "flat", "status": monotone.status,
                               "overhead": None, "threshold_ratio": 1.0}
    assert report.summary()[1] == f"dtr @ flat: {flat.status}, below the feasibility threshold (1.0000 of the peak)"
    assert report.summary()[4] == (f"monotone(dtr) {monotone.status}, passes from 1.000 of the peak; other policies "
                                   "safe here: none checked")


def test_check_window_starts_at_one_census_step():
    """At 0.1 of the peak a window of 0.2 would start below zero; it starts at delta (0.02) instead. Nothing passes
    there. The checkpointing plans are listed least recompute first (then the smaller peak, then the name), each
    with whether its flat peak fits the 5-byte budget."""
    plans = pd.DataFrame({"plan": ["b", "a", "c", "d"], "recompute_flops": [10, 10, 0, 5],
                          "flat_peak": [5, 5, 9, 6], "overhead": [1.5, 1.5, 1.0, 1.25]})
    report = check(chain_trace(), 5, "1MiB", plan=CHAIN_PLAN, execution=QUIET, ac=plans)
    assert report.window == (0.02, 0.3)
    assert [(c.position, c.threshold_ratio) for c in report.checks] == [("fails-in-window", None)] * 2
    assert [(p["plan"], p["fits"]) for p in report.ac] == [("c", False), ("d", False), ("a", True), ("b", True)]
    assert report.summary()[-1] == \
        "activation checkpointing (flat peak): fits with a (overhead 1.500), b (overhead 1.500)"
    assert check(chain_trace(), 6, "1MiB", plan=CHAIN_PLAN, execution=QUIET, ac=plans).summary()[-1] == \
        "activation checkpointing (flat peak): fits with d (overhead 1.250), a (overhead 1.500), b (overhead 1.500)"


def policy_check(policy="dtr", memory="flat", position="safe", status="pass", overhead=1.25, **fields) -> PolicyCheck:
    """A hand-built PolicyCheck (no census behind it): only what the summary reads."""
    defaults = dict(hole=None, holes=[], threshold_ratio=None, safe_below=None, safe_above=None,
                    safe_below_overhead=None, safe_above_overhead=None, samples=pd.DataFrame())
    return PolicyCheck(policy=policy, memory=memory, status=status, overhead=overhead, position=position,
                       **{**defaults, **fields})


def hand_built_report(checks, **fields) -> CheckReport:
    """A report at 1 GiB of a 2 GiB peak on a 1 GiB device, the census step 1.5 MiB."""
    defaults = dict(trace="t", peak_bytes=2 << 30, device="1GiB", device_bytes=1 << 30, budget_bytes=1 << 30,
                    ratio=0.5, window=(0.45, 0.55), delta_bytes=3 << 19, monotone=None)
    return CheckReport(checks=checks, **{**defaults, **fields})


def test_summary_of_a_hand_built_safe_report():
    """Every line of the summary, written out by hand: a budget equal to the device (no warning), safe under both
    semantics, two other policies safe (one of them only under flat memory), monotone(dtr) with no threshold, the
    knob with its cpu-lowering warning (and not its other warnings) and checkpointing plans none of which fits (the
    smallest peak named)."""
    caching = "caching/allocated(1GiB)"
    knob = {"budget": 1 << 30, "accounting": "allocated_peak", "largest_fitting_knob": 0.5,
            "smallest_fitting_knob": 0.1, "lowering_is_safe": True, "holes": ()}
    report = hand_built_report(
        [policy_check(), policy_check(memory=caching), policy_check("msps", overhead=1.0625),
         policy_check("msps", caching, "pass-near-failure"), policy_check("dtr_eq_class", overhead=1.5)],
        monotone={"status": "pass", "overhead": 1.5, "threshold_ratio": None}, knob=knob,
        knob_warnings=[{"kind": "cpu-lowering", "message": "lowered for the CPU"},
                       {"kind": "cliff", "message": "a cliff"}],
        ac=[{"plan": "x", "fits": False, "flat_peak": 3 << 30, "overhead": 1.1},
            {"plan": "y", "fits": False, "flat_peak": (2 << 30) - (1 << 20), "overhead": 1.2}])
    assert report.summary() == [
        "t: budget 1.00 GiB = 0.5000 of the 2.00 GiB peak, device 1GiB (1.00 GiB)",
        "dtr @ flat: passes (overhead 1.250)",
        "dtr @ caching/allocated(1GiB): passes (overhead 1.250)",
        "1,073,741,824 bytes is safe for dtr (no failure within one census step, 1.5 MiB)",
        "monotone(dtr) pass at overhead 1.500; other policies safe here: msps @ flat (overhead 1.062), dtr_eq_class @ "
        "flat (overhead 1.500)",
        "torch.compile activation_memory_budget (allocated_peak): largest knob that fits 0.5; every smaller knob "
        "fits too",
        "lowered for the CPU",
        "activation checkpointing (flat peak): no plan fits; the smallest peak is y's, 2.00 GiB"]


def test_summary_of_a_hand_built_report_in_a_hole():
    """The nearest safe budgets when the first policy's budget is in a hole under flat memory and no caching check
    exists; the device smaller than the budget is said; other policies checked, none safe; monotone(dtr) failing
    with a threshold."""
    hole = {"anatomy": "cliff", "closes_at": 2.304, "fail_low_ratio": 0.49, "fail_high_ratio": 0.5125,
            "width_bytes": 3 << 20}
    report = hand_built_report(
        [policy_check(position="hole", status="thrash", overhead=None, hole=hole, safe_below=(1 << 30) - (1 << 21),
                      safe_above=3 << 29),
         policy_check("msps", position="below-threshold", status="oom", overhead=None, threshold_ratio=0.75)],
        device="V100-16GB", device_bytes=(1 << 30) - 1,
        monotone={"status": "thrash", "overhead": None, "threshold_ratio": 0.625})
    assert report.summary() == [
        "t: budget 1.00 GiB = 0.5000 of the 2.00 GiB peak, device V100-16GB (1024.0 MiB, smaller than the budget)",
        "dtr @ flat: thrash, inside a cliff hole, ratios 0.4900-0.5125 (3.0 MiB wide; closes at overhead limit 2.30)",
        "nearest safe budgets (dtr, flat / caching): below 1022.0 MiB (0.4990) / none in the window, above 1.50 GiB "
        "(0.7500) / none in the window",
        "monotone(dtr) thrash, passes from 0.625 of the peak; other policies safe here: none"]
    # A caching check that is safe while flat memory is not still gives the nearest safe budgets, both columns.
    both = hand_built_report([report.checks[0], policy_check(memory="caching/allocated(1GiB)", safe_below=1 << 30,
                                                             safe_above=1 << 30)])
    assert both.summary()[3] == ("nearest safe budgets (dtr, flat / caching): below 1022.0 MiB (0.4990) / 1.00 GiB "
                                 "(0.5000), above 1.50 GiB (0.7500) / 1.00 GiB (0.5000)")
    assert both.summary()[4] == "other policies safe here: none checked"
    # Without a caching check, flat memory alone says whether the budget is safe.
    assert hand_built_report([policy_check()]).summary()[2] == \
        "1,073,741,824 bytes is safe for dtr (no failure within one census step, 1.5 MiB)"


def test_the_report_tables_keep_one_number_format_per_column():
    """A hole table whose recompute column has a gap (an oom hole: pandas hands its neighbours over as floats) and
    a knob table whose FLOPs come as an int and a float: each column in one format, as the summary writes them."""
    from types import SimpleNamespace

    from dtrlab.plots.check import report_html

    hole = {"fail_low_ratio": 0.49, "fail_high_ratio": 0.5, "width_bytes": 1 << 20, "kinds": "thrash"}
    holes = [{**hole, "anatomy": "cliff", "closes_at": 2.304, "needed_remat": 378_973_564},
             {**hole, "anatomy": "limit", "closes_at": 2, "needed_remat": 565_485_669.0},
             {**hole, "anatomy": "oom", "closes_at": math.inf, "needed_remat": math.nan}]
    choice = {"accounting": "flat_peak", "answers": False, "largest_fitting_knob": 0.5, "peak": 1000,
              "margin": 24.0, "recompute_flops": 1234, "smallest_fitting_knob": 0.1, "lowering_is_safe": True,
              "holes": (), "min_peak": 900.0, "knob_at_min": 0.1}
    knob = {"budget": 1 << 30, "accounting": "allocated_peak", "largest_fitting_knob": 0.5,
            "smallest_fitting_knob": 0.1, "lowering_is_safe": True, "holes": ()}
    report = hand_built_report([policy_check(holes=holes)], knob=knob, knob_warnings=[],
                               knob_choices=[choice, {**choice, "answers": True, "recompute_flops": 5678.0}],
                               knob_census=SimpleNamespace(plan=SimpleNamespace(describe=lambda: "0:1:0.1")))
    page = report_html(report, b"")

    def table(heading: str) -> list[list[str]]:
        section = page.split(heading, 1)[1].split("</table>", 1)[0]
        return [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", section)[1:]]

    assert [(row[6], row[7]) for row in table("Holes in the window")] == \
        [("2.30", "378,973,564"), ("2.00", "565,485,669"), ("never", "")]
    assert [row[2:5] + row[8:9] for row in table('id="knob"')] == \
        [["1,000", "24", "1,234", "900"], ["1,000", "24", "5,678", "900"]]


def test_text_tables_keep_one_number_format_per_column(capsys):
    """dtrlab census/holes --anatomy's tables: a whole-number column with a gap prints whole (565485669.0 came
    out as 5.65486e+08 beside 378973564), a fractional column keeps 6 digits, booleans stay words."""
    from dtrlab.cli.common import print_table

    print_table([{"needed_remat": 378_973_564, "closes_at": 2.304, "hidden": True},
                 {"needed_remat": 565_485_669.0, "closes_at": 2.0, "hidden": False},
                 {"needed_remat": None, "closes_at": math.inf, "hidden": None}])
    assert [line.split() for line in capsys.readouterr().out.splitlines()] == [
        ["needed_remat", "closes_at", "hidden"], ["378973564", "2.304", "True"], ["565485669", "2", "False"],
        ["inf"]]


def legible_legend(fig) -> list[str]:
    """The entries of ``fig``'s one legend, after checking that its text is as large as the axis labels (it was 6.5
    and 7 pt beside 10 pt) and that it lies inside the figure, over no panel."""
    import matplotlib.pyplot as plt

    fig.canvas.draw()
    legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    assert len(legends) == 1
    (legend,) = legends
    label_size = max(text.get_size() for ax in fig.axes for text in (ax.xaxis.label, ax.yaxis.label))
    assert all(text.get_size() >= label_size for text in legend.get_texts())
    extent = legend.get_window_extent()
    assert fig.bbox.contains(extent.x0, extent.y0) and fig.bbox.contains(extent.x1, extent.y1)
    assert not any(extent.overlaps(ax.get_window_extent()) for ax in fig.axes)
    plt.close(fig)
    return sorted(text.get_text() for text in legend.get_texts())


def test_the_check_figure_legend_is_legible():
    """One legend for every panel, legible, with every entry of every panel once."""
    from dtrlab.plots.check import plot_check

    budgets = [int((2 << 30) * ratio) for ratio in (0.45, 0.48, 0.5, 0.52, 0.55)]
    samples = pd.DataFrame({"budget_bytes": budgets, "status": ["oom", "thrash", "pass", "pass", "pass"],
                            "overhead": [None, None, 1.4, 1.3, 1.2]})
    hole = {"anatomy": "cliff", "pass_below_bytes": budgets[0], "pass_above_bytes": budgets[2]}
    caching = "caching/allocated(1GiB)"
    report = hand_built_report([policy_check(samples=samples, holes=[hole]), policy_check(memory=caching,
                                samples=samples), policy_check("msps", samples=samples)])
    assert legible_legend(plot_check(report)) == sorted(
        [f"{kind} @ {memory}" for memory in ("flat", caching) for kind in
         ("overhead", "out of memory", "thrash (overhead > limit)")] + ["hole: cliff @ flat", "the budget"])


def test_the_check_knob_figure_legend_is_legible():
    """The knob section's figure on the shipped Transformer census at the browser test's budget: legible too."""
    from dataclasses import asdict

    from dtrlab.analysis.knob_census import read_census
    from dtrlab.plots.check import plot_check_knob

    census = read_census(ROOT / "results" / "shipped" / "knob" / "traces" / "transformer-b4.json")
    budget = 11_516_928
    report = hand_built_report([], budget_bytes=budget, knob=asdict(census.knob_for_budget(budget, "allocated_peak")),
                               knob_census=census)
    entries = legible_legend(plot_check_knob(report))
    assert "chosen knob 0.43 (largest that fits)" in entries and "hole: does not fit between fitting knobs" in entries


def test_describe_position_of_each_hole_kind():
    hole = {"fail_low_ratio": 0.16891, "fail_high_ratio": 0.17334, "width_bytes": 5 << 19}
    oom = policy_check(position="hole", status="oom", overhead=None, hole={**hole, "anatomy": "oom", "closes_at": None})
    assert describe_position(oom) == "oom, inside an oom hole, ratios 0.1689-0.1733 (2.5 MiB wide; fails at any " \
        "overhead limit)"
    # closes_at is the overhead limit from which the hole's budgets pass: an oom hole has none
    cliff = policy_check(position="hole", status="thrash", overhead=None,
                         hole={**hole, "anatomy": "cliff", "closes_at": 2.0})
    assert describe_position(cliff).endswith("(2.5 MiB wide; closes at overhead limit 2.00)")
    assert describe_position(policy_check(position="pass-near-failure", overhead=1.0)) == \
        "passes (overhead 1.000), but within one census step of a failure"


@pytest.mark.parametrize("spec, expected", [
    (45, 45), (1, 1), ("45", 45), ("0.9", 45), (".9", 45), ("90%", 45), (" 90 % ", 45), ("1.5", 75), ("150%", 75),
    ("45B", 45), ("2KiB", 2048)])
def test_parse_budget_on_the_chain(spec, expected):
    """Bytes, ratios of the chain's 50-byte peak (int(50 x ratio)) and sizes."""
    assert parse_budget(spec, chain_trace()) == expected


@pytest.mark.parametrize("spec, message", [
    (0, "budget must be positive bytes, got 0"), ("0", "budget must be positive bytes, got 0"),
    (-3, "budget must be positive bytes, got -3"),
    (True, "budget 'True': give bytes (4294967296), a size (40GiB, 512MB) or a ratio of the unbounded peak "
           "(0.17 or 17%)"),
    ("unlimited", "budget 'unlimited': give bytes"), ("1.25x", "budget '1.25x': give bytes"),
    ("lots", "budget 'lots': give bytes")])
def test_parse_budget_refusals_word_for_word(spec, message):
    with pytest.raises(ValueError) as error:
        parse_budget(spec, chain_trace())
    assert str(error.value).startswith(message)


def test_parse_device_forms_and_refusals():
    assert parse_device("1MiB") == ("1MiB", 1 << 20)
    assert parse_device(4096) == ("4096", 4096)
    for spec in ("unlimited", "1.25x"):
        with pytest.raises(ValueError) as error:
            parse_device(spec)
        assert str(error.value) == (f"device {spec!r}: give the device's memory (a preset such as A100-80GB, bytes or "
                                    "a size such as 80GiB), not a multiple of the budget or unlimited")
    with pytest.raises(ValueError) as error:
        parse_device("A100-81GB")
    message = str(error.value)
    assert message.startswith("device 'A100-81GB': unknown device capacity 'A100-81GB'")
    assert message.endswith("or a GPU preset: V100-16GB, V100-32GB, A100-40GB, A100-80GB, H100-80GB, H200-141GB, "
                            "L4-24GB, RTX3090-24GB, RTX4090-24GB") and message.count("V100-16GB") == 1  # the presets once


@pytest.mark.parametrize("window, delta", [(1.0, 0.5), (0.3, 0.3), (0.05, 0.002)])
def test_check_plan_accepts_its_edges(window, delta):
    assert (CheckPlan(window=window, delta=delta).window, CheckPlan(window=window, delta=delta).delta) == \
        (window, delta)


@pytest.mark.parametrize("fields", [dict(window=0), dict(window=1.01), dict(window=-0.1), dict(delta=0),
                                    dict(window=1.0, delta=1.0), dict(window=0.3, delta=0.31), dict(delta=-0.002)])
def test_check_plan_refuses_in_words(fields):
    plan = {"window": 0.05, "delta": 0.002, **fields}
    with pytest.raises(ValueError) as error:
        CheckPlan(**fields)
    assert str(error.value) == ("check: the window must be in (0, 1] and delta in (0, window] (fractions of the peak), "
                                f"got window={plan['window']}, delta={plan['delta']}")
    with pytest.raises(ValueError) as error:
        CheckPlan(policies=())
    assert str(error.value) == "check: give at least one policy to census"


def test_check_refuses_monotone_among_the_censused_policies():
    """monotone refuses the caching allocator, which check censuses every policy under: refused before any census
    (it stopped after the flat one), in words."""
    with pytest.raises(ValueError) as error:
        check(chain_trace(), 45, "1MiB", plan=CheckPlan(policies=("dtr", "monotone")))
    assert str(error.value) == ("check: monotone runs under flat memory only, and check censuses each policy under "
                                "the caching allocator too; monotone(dtr) is checked already (--no-monotone drops it)")


def test_the_two_semantics_and_their_names():
    """flat, then the caching allocator under `allocated` on the device, each with the flat one's overhead limit."""
    limited = REFERENCE.with_(overhead_limit=1.5)
    assert check_semantics(7, limited) == [limited, REFERENCE.with_(memory="caching", enforce=ALLOCATED,
                                                                     device_capacity=7, overhead_limit=1.5)]
    assert check_semantics(7) == [REFERENCE, ON_1MIB.with_(device_capacity=7)]
    assert memory_name(REFERENCE, "X") == "flat"
    assert memory_name(ON_1MIB, "X") == "caching/allocated(X)"
    assert memory_name(ON_1MIB.with_(enforce="reserved"), "X") == "caching"


def test_safe_budgets_keep_one_census_step_from_every_failure():
    """Passing samples with no failure within the margin (2 bytes), both ends of it included: 11 and 15 lie exactly
    2 bytes from the failure at 13 (a thrash is a failure too), so only 10, 16 and 20 are safe; 3 bytes leave 20."""
    from dtrlab.analysis.check import _safe_budgets

    samples = pd.DataFrame({"budget_bytes": [10, 11, 13, 15, 16, 20],
                            "status": ["pass", "pass", "thrash", "pass", "pass", "pass"]})
    assert _safe_budgets(samples, 2) == [10, 16, 20]
    assert _safe_budgets(samples, 3) == [20]


def test_the_census_is_the_grid_the_budget_and_the_bisection():
    """Every 0.1 of the chain's peak from 0.7 to 1.1 (35, 40, ..., 55 bytes; the margin ceil(0.1 x 50) + 1 = 6) under
    the overhead limit 1.65, where DTR's recompute of 6 at 40 and 45 bytes is a near miss (at least 90% of the
    allowance 6.5), which a census without a census step would probe around; the check's census does not. The edge
    between 35 (fails) and 40 is bisected to the plan's resolution: at 3 bytes 37 alone (35-40 is 5 apart, 37-40
    3), so 45 is 8 bytes from the nearest failure and safe; at the default (1 byte for a 50-byte peak) 38 and 39 as
    well, 6 bytes from 45, so it only passes near a failure and 50 is the nearest safe budget."""
    trace, limited = chain_trace(), REFERENCE.with_(overhead_limit=1.65)
    assert simulate(trace, "dtr", budget_bytes=40, semantics=limited).remat_compute == 6
    coarse = check(trace, 45, "1MiB", plan=CheckPlan(window=0.2, delta=0.1, policies=("dtr",), monotone=False,
                                                      resolution=3), semantics=limited, execution=QUIET).checks[0]
    assert sorted(coarse.samples["budget_bytes"]) == [35, 37, 40, 45, 50, 55]
    assert (coarse.position, coarse.safe_below, coarse.safe_above) == ("safe", 45, 45)
    fine = check(trace, 45, "1MiB", plan=CheckPlan(window=0.2, delta=0.1, policies=("dtr",), monotone=False),
                 semantics=limited, execution=QUIET).checks[0]
    assert sorted(fine.samples["budget_bytes"]) == [35, 37, 38, 39, 40, 45, 50, 55]
    assert (fine.position, fine.safe_below, fine.safe_above) == ("pass-near-failure", None, 50)


def test_check_finds_a_one_sample_cliff_and_writes_no_cache(small_resnet, tmp_path, monkeypatch):
    """traces/resnet32-b8's shipped one-sample cliff starts at 9,460,849 bytes (results/shipped/anatomy): the budget
    there is inside it, at its lower failing edge, and so is the census's upper failing edge. An execution without a
    cache leaves the default cache alone, in the census, the runs at the budget, the refinement and the anatomy's runs
    without a limit."""
    monkeypatch.setenv("DTRLAB_CACHE", str(tmp_path / "default"))
    budget = 9_460_849
    shipped = shipped_hole("traces-holes.csv", "resnet32-b8", budget)
    report = check(small_resnet, budget, "A100-80GB", plan=CheckPlan(window=0.01, delta=0.005, policies=("dtr",),
                                                                      monotone=False), execution=QUIET)
    flat = report.checks[0]
    assert (flat.position, flat.hole["anatomy"], flat.hole["fail_low_bytes"]) == ("hole", shipped["anatomy"], budget)
    # the window: the budget's ratio (the shipped 0.4288888569) +-0.01, to six decimals
    assert report.window == (0.418889, 0.438889) and round(shipped["fail_low_ratio"], 10) == 0.4288888569
    assert flat.holes == [flat.hole] and shipped["fail_low_bytes"] == budget
    assert not (tmp_path / "default").exists()
    # The hole's upper failing edge (a grid sample, 3 bytes up), checked as the budget, lies inside the same hole.
    top = flat.hole["fail_high_bytes"]
    assert top > budget and simulate(small_resnet, "dtr", budget_bytes=top).status == "thrash"
    at_top = check(small_resnet, top, "A100-80GB", plan=CheckPlan(window=0.01, delta=0.005, policies=("dtr",),
                                                                   monotone=False), execution=QUIET).checks[0]
    assert (at_top.position, at_top.hole["fail_high_bytes"]) == ("hole", top)


def test_the_device_reaches_the_caching_check_and_the_progress_line_names_each_stage(capsys):
    """At 5000 bytes (100 times the chain's peak) flat memory is safe; under the caching allocator the run passes on
    an 80 GB device but not on a 1 MiB one, smaller than one 2 MiB segment of small blocks (runs of the simulator),
    so the device given reaches the caching check. Shown progress ends with one line per check (stderr is no
    terminal here: docs of dtrlab/progress.py), counting the censuses and monotone(dtr), naming the last stage."""
    trace = chain_trace()
    assert [simulate(trace, "dtr", budget_bytes=5000, semantics=ON_1MIB.with_(device_capacity=d)).status
            for d in (1 << 20, 80 << 30)] == ["oom", "pass"]
    shown = Execution(cache=False, progress=True)
    report = check(trace, 5000, "1MiB", plan=CHAIN_PLAN, execution=shown)
    assert report.window == (99.8, 100.2)
    assert [(c.status, c.position) for c in report.checks] == [("pass", "safe"), ("oom", "fails-in-window")]
    last = capsys.readouterr().err.splitlines()[-1]
    assert re.fullmatch(r"check chain: 2/2 census in \d+\.\d s \(dtr @ caching/allocated\(1MiB\)\)", last), last
    check(trace, 45, "1MiB", plan=CheckPlan(window=0.2, delta=0.02, policies=("dtr",)), execution=shown)
    last = capsys.readouterr().err.splitlines()[-1]
    assert re.fullmatch(r"check chain: 3/3 census in \d+\.\d s \(monotone\(dtr\)\)", last), last
    check(trace, 45, "1MiB", plan=CHAIN_PLAN, execution=QUIET)
    assert capsys.readouterr().err == ""
