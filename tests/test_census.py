"""The census runner and CLI: ResNet-32's thrash hole at 0.17, files written, our own corpus."""

from __future__ import annotations

import pandas as pd
import pytest

from dtrlab.analysis.holes import MIB, run_census
from dtrlab.cli import main
from dtrlab.runtime import simulate

from conftest import ROOT
from dtrlab.sweep.execution import Execution


@pytest.mark.slow
def test_resnet32_census_reports_the_thrash_hole_at_0_17(resnet_trace, tmp_path):
    census = run_census({resnet_trace.name: resnet_trace}, "dtr", ratios="0.05:1.0:0.005", out=tmp_path / "out",
                        execution=Execution(jobs=2, cache=tmp_path / "cache", progress=False))
    row = census.table.iloc[0]
    assert (row.samples, row.failures, row.non_monotone_failures, row.holes) == (191, 21, 1, 1)
    assert (row.widest_hole_ratio, row.widest_hole_kinds, row.threshold_ratio) == ("0.17-0.17", "thrash", 0.175)
    (hole,) = census.holes.itertuples()
    assert hole.kinds == "thrash" and not hole.hidden
    # Refined to ~1 MiB: the hole spans ratios ~0.1689..0.1733 (about 43 MiB).
    assert hole.fail_low_bytes - hole.pass_below_bytes <= MIB
    assert hole.pass_above_bytes - hole.fail_high_bytes <= MIB
    assert 0.1688 < hole.fail_low_ratio < 0.1690 and 0.1732 < hole.fail_high_ratio < 0.1734
    assert simulate(resnet_trace, "dtr", budget_bytes=hole.pass_below_bytes).passed
    assert simulate(resnet_trace, "dtr", budget_bytes=hole.fail_low_bytes).status == "thrash"
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == sorted([f"{resnet_trace.name}.parquet", "holes.parquet", "summary.csv"])
    assert pd.read_csv(tmp_path / "out" / "summary.csv")["holes"].tolist() == [1]


def test_census_cli_on_a_directory_of_traces(tmp_path, capsys):
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "resnet32-b8.jsonl.gz").write_bytes((ROOT / "traces" / "resnet32-b8.jsonl.gz").read_bytes())
    out = tmp_path / "census"
    assert main(["census", str(traces), "--ratios", "0.42:0.43:0.005", "--cache", str(tmp_path / "c"), "--quiet",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "resnet32-b8" in printed and "hidden_holes" in printed
    frame = pd.read_parquet(out / "resnet32-b8.parquet")
    assert len(frame) > 3  # the grid plus probes and bisection points
    holes = pd.read_parquet(out / "holes.parquet")
    assert holes["hidden"].any()
    assert main(["holes", str(out / "resnet32-b8.parquet")]) == 0
    assert main(["census", str(tmp_path / "missing"), "--quiet"]) == 2
