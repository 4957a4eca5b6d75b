"""The frontier bracket on hand-built graphs (both sides derived by hand), its file checks and the CLI."""

import json

import pyarrow.parquet as pq
import pytest

pytest.importorskip("ortools", reason="the exact solvers need the optional extra: pip install 'dtrlab[solvers]'")
pytest.importorskip("highspy", reason="the exact solvers need the optional extra: pip install 'dtrlab[solvers]'")

from dtrlab.cli import main  # noqa: E402
from dtrlab.runtime import baseline  # noqa: E402
from dtrlab.solvers.frontier import (FrontierPlan, PlanError, StaleFrontier, compute_frontier, read_frontier,  # noqa: E402
                                     write_frontier)
from test_solvers import HANG_GUARD_S, chain, chain_log, unet  # noqa: E402

GRID = "0.7:1.0:0.01"  # budgets int(peak * ratio): 40 of the chain (peak 50), 50 of the U-Net (peak 60)


@pytest.mark.parametrize("graph, minimal", [(chain, 40), (unet, 50)], ids=["chain", "unet"])
def test_frontier_brackets_the_hand_derived_minimal_budget(graph, minimal):
    """No run fits below the footprint bound, and DTR's run at it (on the grid) fits: proven."""
    trace = graph()
    peak = baseline(trace).peak_memory
    frontier = compute_frontier(trace, FrontierPlan(ratios=[1.0], time_limit_s=HANG_GUARD_S, resolution=1 / peak,
                                                   policy_ratios=GRID), cache=False)
    assert frontier.min_feasible_bytes == minimal and frontier.min_feasible_source == "dtr"
    assert frontier.max_infeasible_bytes == minimal - 1 and frontier.proven and frontier.gap_bytes == 1
    assert frontier.lower_bound_bytes == minimal and frontier.relax_status == "solved"
    assert frontier.rows.replay_passed.dropna().all()
    sample = frontier.rows[frontier.rows.kind == "sample"].iloc[0]
    assert sample.status == "optimal" and sample.remat_compute == 0 and sample.dtr_status == "pass"
    relax = frontier.rows[frontier.rows.kind == "relax"]
    assert (relax.budget_bytes < peak).all() and relax.status.isin(["bound", "infeasible"]).all()


@pytest.mark.parametrize("method, proven_up_to", [("mip", 49), ("lp", 41)])
def test_overhead_limit_moves_the_proof_above_the_footprint_bound(method, proven_up_to):
    """Chain (compute 10) at overhead limit 1.45 (recompute <= floor(10 x 0.45) = 4): below 50 bytes every run recomputes f1
    (5), so the minimal budget is 50, DTR's. The 0/1 relaxation proves 49 infeasible; the
    LP (which recomputes 5 (50 - B) / 10) only 41: a bracket [41, 50], honestly not closed."""
    trace = chain()
    frontier = compute_frontier(trace, FrontierPlan(ratios=[1.0], time_limit_s=HANG_GUARD_S, resolution=1 / 50, overhead_limit=1.45,
                                                   relax_method=method, policy_ratios=GRID), cache=False)
    assert frontier.min_feasible_bytes == 50 and frontier.stage_min_feasible_bytes == 50
    assert frontier.max_infeasible_bytes == proven_up_to
    assert frontier.proven == (method == "mip")


def test_mip_probes_carry_the_proof_above_the_lp():
    """The same chain at limit 1.45: after the LP's proof (41), four 0/1 probes (45, 47, 48, 49)
    carry it to 49, closing the bracket at DTR's 50."""
    frontier = compute_frontier(chain(), FrontierPlan(ratios=[1.0], time_limit_s=HANG_GUARD_S, resolution=1 / 50, overhead_limit=1.45,
                                                     mip_probes=4, policy_ratios=GRID), cache=False)
    mip = frontier.rows[(frontier.rows.kind == "relax") & (frontier.rows.solver == "mip")]
    assert list(mip.budget_bytes) == [45, 47, 48, 49] and (mip.status == "infeasible").all()
    assert frontier.max_infeasible_bytes == 49 and frontier.proven and frontier.mip_probes == 4


def test_interval_probes_find_what_the_stage_model_cannot(monkeypatch, tmp_path):
    """deep_chain (test_solvers_interval.py): the stage model needs 50 bytes, the interval
    model fits the footprint bound 40 (evicting a1 between two recomputations). Without
    policies (and without DTR's runs at the solved budgets, a real run too: DTR fits 40),
    the stage probes stop at 51; interval probes at 45, 42 and 40 close the bracket. A
    second run with ``reuse`` repeats no solve."""
    from dtrlab.solvers.frontier import steps as frontier_module
    from test_solvers_interval import deep_chain
    trace = deep_chain()
    plan = FrontierPlan(ratios=[1.0], time_limit_s=HANG_GUARD_S, resolution=1 / 60, interval_probes=4, policies=[],
                        dtr=False)
    frontier = compute_frontier(trace, plan, cache=False)
    assert frontier.stage_min_feasible_bytes == 51
    probes = frontier.rows[(frontier.rows.kind == "bisect") & (frontier.rows.solver == "interval")]
    assert list(probes.budget_bytes) == [40, 42, 45] and probes.replay_passed.all()
    assert frontier.min_feasible_bytes == 40 and frontier.min_feasible_source == "interval model"
    assert frontier.max_infeasible_bytes == 39 and frontier.proven
    path = write_frontier(frontier, tmp_path / "deep_chain.parquet")

    def no_solve(*args, **kwargs):
        raise AssertionError("a solve that the earlier file holds was repeated")
    monkeypatch.setattr(frontier_module, "solve_optimal", no_solve)
    monkeypatch.setattr(frontier_module, "solve_relaxation", no_solve)
    again = compute_frontier(trace, plan, cache=False, reuse=read_frontier(path, trace).rows)
    assert again.metadata() == frontier.metadata()


def test_frontier_file_is_checked_before_use(tmp_path):
    trace = chain()
    frontier = compute_frontier(trace, FrontierPlan(ratios=[0.8], time_limit_s=HANG_GUARD_S, bisect=False, policies=[]))
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


def test_bad_input_is_a_clear_error():
    with pytest.raises(PlanError, match="cpsat, milp"):
        FrontierPlan(probe_solver="gurobi")
    with pytest.raises(PlanError, match="lp, mip"):
        FrontierPlan(relax_method="simplex")


def test_cli_writes_parquet_and_prints_a_table(tmp_path, capsys):
    log = tmp_path / "chain.log"
    chain_log().write(log)
    out = tmp_path / "frontier.parquet"
    assert main(["frontier", str(log), "--ratios", "0.8,1.0", "--time-limit", "5", "--resolution", "0.02",
                 "--policy-ratios", GRID, "--cache", str(tmp_path / "cache"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "min_feasible_ratio" in printed and "overhead_bound" in printed
    frontier = read_frontier(out)
    assert frontier.min_feasible_bytes == 40 and frontier.max_infeasible_bytes == 39
    assert frontier.trace_hash == chain().content_hash
    assert main(["frontier", str(log), "--solver", "gurobi", "--out", str(out)]) == 2
    assert main(["frontier", str(log), "--relax", "simplex", "--out", str(out)]) == 2
    # --resume takes solves from the file only if it was computed with the same limits.
    assert main(["frontier", str(log), "--ratios", "0.8,1.0", "--time-limit", "9", "--resume",
                 "--out", str(out)]) == 2
    assert "computed with --overhead-limit 2.0 and --time-limit 5.0" in capsys.readouterr().err


def test_a_relaxation_too_large_is_skipped_and_said(monkeypatch):
    """Above MAX_NEED_PAIRS the relaxation is not built; the footprint bound still is the lower side."""
    from dtrlab.solvers import relax
    monkeypatch.setattr(relax, "MAX_NEED_PAIRS", 3)
    frontier = compute_frontier(chain(), FrontierPlan(ratios=[0.9], time_limit_s=HANG_GUARD_S, policy_ratios=GRID), cache=False)
    assert frontier.relax_status.startswith("not solved") and "pairs" in frontier.relax_status
    assert (frontier.rows.kind != "relax").all()
    assert frontier.max_infeasible_bytes == 39 and frontier.min_feasible_bytes == 40
