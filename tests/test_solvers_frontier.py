"""The frontier on a hand-built graph (minimal budget derived by hand), its file checks and the CLI."""

import json

import pyarrow.parquet as pq
import pytest

pytest.importorskip("ortools", reason="the exact solvers need the optional extra: pip install 'dtrlab[solvers]'")
pytest.importorskip("highspy", reason="the exact solvers need the optional extra: pip install 'dtrlab[solvers]'")

from dtrlab.cli import main  # noqa: E402
from dtrlab.runtime import baseline  # noqa: E402
from dtrlab.solvers.frontier import StaleFrontier, compute_frontier, read_frontier, write_frontier  # noqa: E402
from test_solvers import chain, chain_log, unet  # noqa: E402


@pytest.mark.parametrize("graph, minimal", [(chain, 40), (unet, 50)], ids=["chain", "unet"])
def test_frontier_finds_the_hand_derived_minimal_budget(graph, minimal):
    trace = graph()
    peak = baseline(trace).peak_memory
    frontier = compute_frontier(trace, ratios=[1.0], time_limit_s=10, resolution=1 / peak)
    assert frontier.min_feasible_bytes == minimal
    assert frontier.max_infeasible_bytes == minimal - 1 and frontier.proven
    assert frontier.lower_bound_bytes == minimal
    assert frontier.rows.replay_passed.dropna().all()
    sample = frontier.rows[frontier.rows.kind == "sample"].iloc[0]
    assert sample.status == "optimal" and sample.remat_compute == 0 and sample.dtr_status == "pass"


def test_frontier_file_is_checked_before_use(tmp_path):
    trace = chain()
    frontier = compute_frontier(trace, ratios=[0.8], time_limit_s=10, bisect=False)
    path = write_frontier(frontier, tmp_path / "chain.parquet")
    again = read_frontier(path, trace)
    assert again.metadata() == frontier.metadata() and len(again.rows) == len(frontier.rows)
    with pytest.raises(StaleFrontier, match="other content"):
        read_frontier(path, unet())
    table = pq.read_table(path)
    meta = json.loads(table.schema.metadata[b"dtrlab.frontier"])
    meta["version"] = -1
    pq.write_table(table.replace_schema_metadata({b"dtrlab.frontier": json.dumps(meta).encode()}), path)
    with pytest.raises(StaleFrontier, match="version"):
        read_frontier(path, trace)


def test_cli_writes_parquet_and_prints_a_table(tmp_path, capsys):
    log = tmp_path / "chain.log"
    chain_log().write(log)
    out = tmp_path / "frontier.parquet"
    assert main(["frontier", str(log), "--ratios", "0.8,1.0", "--time-limit", "5", "--resolution", "0.02",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "min_feasible_ratio" in printed and "0.8" in printed
    frontier = read_frontier(out)
    assert frontier.min_feasible_bytes == 40 and frontier.trace_hash == chain().content_hash
    assert main(["frontier", str(log), "--solver", "gurobi", "--out", str(out)]) == 2
