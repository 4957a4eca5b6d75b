"""The frontier believes no claim a real run contradicts, keeps every finished solve, and
resumes after SIGINT or SIGKILL without losing or repeating one (issues 22 and 26)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("ortools", reason="the exact solvers need the optional extra: pip install 'dtrlab[solvers]'")
pytest.importorskip("highspy", reason="the exact solvers need the optional extra: pip install 'dtrlab[solvers]'")

from dtrlab.cli import main  # noqa: E402
from dtrlab.solvers.frontier import steps as frontier_module  # noqa: E402
from dtrlab.solvers.frontier import (FrontierPlan, SolveJournal, SolverFaultWarning, StaleFrontier,  # noqa: E402
                                     compute_frontier, read_frontier, write_frontier)
from dtrlab.solvers.relax import RelaxResult  # noqa: E402
from test_solvers import HANG_GUARD_S, chain, chain_log  # noqa: E402

GRID = "0.7:1.0:0.01"  # the chain (peak 50): DTR's lowest passing budget is 40, the footprint bound
ROOT = Path(__file__).resolve().parent.parent


def _false_proofs(trace_or_problem, budget, *, overhead_limit, method, time_limit_s):
    """A relaxation that claims every budget infeasible (what issue 22's presolve did at one)."""
    return RelaxResult(trace="chain", method=method, budget_bytes=int(budget), overhead_limit=overhead_limit,
                       status="infeasible", bound=None, base_compute=10, build_seconds=0.0, solve_seconds=0.0,
                       time_limit_s=time_limit_s, n_vars=1, n_rows=1, n_nonzeros=1, message="claimed")


def test_a_proof_above_a_real_run_is_a_fault_not_a_proof(monkeypatch):
    """With a relaxation that 'proves' every budget infeasible, each claim at or above DTR's
    run at 40 bytes is reported as a solver fault, with a warning, and the bracket keeps
    only what no run contradicts: the footprint bound (39) and DTR's 40."""
    monkeypatch.setattr(frontier_module, "solve_relaxation", _false_proofs)
    plan = FrontierPlan(ratios=[0.9], time_limit_s=HANG_GUARD_S, resolution=1 / 50, policy_ratios=GRID)
    with pytest.warns(SolverFaultWarning, match="claimed infeasible"):
        frontier = compute_frontier(chain(), plan, cache=False)
    relax = frontier.rows[frontier.rows.kind == "relax"]
    assert len(relax) and (relax.budget_bytes >= 40).all() and (relax.fault != "").all()
    assert len(frontier.faults) == len(relax)
    assert frontier.max_infeasible_bytes == 39 and frontier.min_feasible_bytes == 40 and frontier.proven


def test_a_bound_above_a_real_run_and_a_claim_unlike_its_replay_are_faults(monkeypatch):
    """A relaxation bound above DTR's overhead at the same budget, and a stage-model solve
    that reports more recompute than its schedule replays with, are faults; a bound at or
    below every run is not."""
    real_relax, real_solve = frontier_module.solve_relaxation, frontier_module.solve_optimal

    def high_bound(*args, **kwargs):
        result = real_relax(*args, **kwargs)
        return result if result.bound is None else replace(result, bound=result.bound + 3)

    def inflated(*args, **kwargs):
        result = real_solve(*args, **kwargs)
        return result if result.objective is None else replace(result, objective=result.objective + 1)

    monkeypatch.setattr(frontier_module, "solve_relaxation", high_bound)
    monkeypatch.setattr(frontier_module, "solve_optimal", inflated)
    plan = FrontierPlan(ratios=[0.9], time_limit_s=HANG_GUARD_S, resolution=1 / 50, policy_ratios=GRID, bisect=False)
    with pytest.warns(SolverFaultWarning):
        frontier = compute_frontier(chain(), plan, cache=False)
    rows = frontier.rows.set_index("kind")
    assert "is above the compute" in rows.loc["relax", "fault"]
    assert "reported recompute 6 (optimal), its schedule replays with 5" in rows.loc["sample", "fault"]
    assert len(frontier.faults) == 2
    monkeypatch.undo()
    with warnings.catch_warnings():
        warnings.simplefilter("error", SolverFaultWarning)
        honest = compute_frontier(chain(), plan, cache=False)
    assert (honest.rows.fault == "").all() and not honest.faults


def test_a_damaged_frontier_file_is_never_served(tmp_path):
    """Every 71st byte of a written file flipped in turn: each read either refuses the file
    (StaleFrontier) or returns exactly what was written (a flip in bytes that no value depends on)."""
    trace = chain()
    with warnings.catch_warnings():
        warnings.simplefilter("error", SolverFaultWarning)
        frontier = compute_frontier(trace, FrontierPlan(ratios=[0.8, 0.9], time_limit_s=HANG_GUARD_S, policy_ratios=GRID),
                                    cache=False)
    path = write_frontier(frontier, tmp_path / "chain.parquet")
    clean = path.read_bytes()
    written = read_frontier(path, trace)
    assert written.metadata() == frontier.metadata() and not frontier.faults
    refused = 0
    for position in range(0, len(clean), 71):
        data = bytearray(clean)
        data[position] ^= 0x10
        path.write_bytes(bytes(data))
        try:
            again = read_frontier(path, trace)
        except StaleFrontier:
            refused += 1
            continue
        assert again.metadata() == written.metadata() and again.rows.equals(written.rows), position
    assert refused > len(clean) // 71 // 2


def test_a_damaged_journal_entry_is_ignored_and_solved_again(tmp_path, monkeypatch):
    trace = chain()
    plan = FrontierPlan(ratios=[0.8, 1.0], time_limit_s=HANG_GUARD_S, policy_ratios=GRID)
    journal = SolveJournal(tmp_path / "chain.solves", trace, plan)
    first = compute_frontier(trace, plan, cache=False, journal=journal)
    entries = journal.entries()
    assert len(entries) == len(first.rows[first.rows.kind != "policy"])
    damaged = entries[0]
    damaged.write_bytes(damaged.read_bytes().replace(b'"status"', b'"stat_s"'))
    solved = []
    for name in ("solve_optimal", "solve_relaxation"):
        original = getattr(frontier_module, name)
        monkeypatch.setattr(frontier_module, name,
                            lambda *a, _original=original, **k: solved.append(a[1]) or _original(*a, **k))
    again = SolveJournal(tmp_path / "chain.solves", trace, plan)
    with pytest.warns(UserWarning, match="damaged"):
        kept = again.rows()
    assert len(kept) == len(entries) - 1 and damaged.with_name(damaged.name + ".damaged").exists()
    resumed = compute_frontier(trace, plan, cache=False, reuse=kept, journal=again)
    assert len(solved) == 1 and resumed.metadata() == first.metadata()
    other = SolveJournal(tmp_path / "chain.solves", trace, FrontierPlan(time_limit_s=5))
    with pytest.raises(ValueError, match="other limits|not"):
        other.rows()


@pytest.mark.parametrize("argv, message", [
    (["--chain", "0"], "--chain"),
    (["--ratios", "inf"], "--ratios"),
    (["--ratios", "0.5:inf:0.1"], "--ratios"),
    (["--time-limit", "nan"], "--time-limit"),
    (["--overhead-limit", "inf"], "--overhead-limit"),
    (["--resolution", "2"], "--resolution"),
    (["--solver", "cpstat"], "did you mean 'cpsat'"),
])
def test_bad_frontier_input_is_one_line_and_rc_2(tmp_path, capsys, argv, message):
    log = tmp_path / "chain.log"
    chain_log().write(log)
    assert main(["frontier", str(log), *argv, "--out", str(tmp_path / "x.parquet")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dtrlab frontier: error:") and "\n" not in err and message in err


def test_plan_file_is_validated_with_a_suggestion(tmp_path, capsys):
    log = tmp_path / "chain.log"
    chain_log().write(log)
    plan = tmp_path / "plan.json"
    for fields, message in (({"chian": 2}, "did you mean 'chain'?"),
                            ({"interval_probes": -1}, "interval_probes must be"),
                            ([1, 2], "a JSON object of fields")):
        plan.write_text(json.dumps(fields))
        assert main(["frontier", str(log), "--plan", str(plan)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"dtrlab frontier: error: --plan {plan}:") and message in err and "\n" not in err
    # a flag overrides the file
    plan.write_text(json.dumps({"interval_probes": 2, "ratios": [0.8], "policies": []}))
    out = tmp_path / "out.parquet"
    assert main(["frontier", str(log), "--plan", str(plan), "--ratios", "1.0", "--time-limit", "5",
                 "--cache", str(tmp_path / "cache"), "--out", str(out)]) == 0
    written = read_frontier(out).plan
    assert written.interval_probes == 2 and written.ratios == (1.0,) and written.policies == ()
    assert FrontierPlan.from_dict(written.to_dict()) == written


def test_resume_from_a_finished_file_repeats_no_solve(tmp_path, capsys, monkeypatch):
    log, out = tmp_path / "chain.log", tmp_path / "chain.parquet"
    chain_log().write(log)
    command = ["frontier", str(log), "--ratios", "0.8,1.0", "--time-limit", "10", "--policy-ratios", GRID,
               "--cache", str(tmp_path / "cache"), "--out", str(out)]
    assert main(command) == 0
    first = read_frontier(out)

    def no_solve(*args, **kwargs):
        raise AssertionError("a solve that the file holds was repeated")
    monkeypatch.setattr(frontier_module, "solve_optimal", no_solve)
    monkeypatch.setattr(frontier_module, "solve_relaxation", no_solve)
    assert main(command + ["--resume"]) == 0, capsys.readouterr().err
    again = read_frontier(out)
    assert again.metadata() == first.metadata() and not again.faults


# ------------------------------------------------------------------ SIGINT and SIGKILL, then --resume
WRAPPER = textwrap.dedent("""
    import os, signal, sys, time
    from dtrlab.cli import main
    from dtrlab.solvers.frontier import steps as frontier

    # As tests/test_search.py's wrapper: a suite started in the background by a non-interactive shell passes
    # SIGINT on as ignored, and the SIGINT case then waited out its guard instead of testing Ctrl-C.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    done = 0

    def logged(original, kind_of):
        def solve(problem, budget, **kwargs):
            global done
            if done + 1 == int(os.environ.get("BLOCK_AT", "0")):
                open(os.environ["BLOCKED"], "w").close()
                time.sleep(3600)  # until the test's signal
            result = original(problem, budget, **kwargs)
            done += 1
            with open(os.environ["SOLVE_LOG"], "a") as log:
                log.write(f"{kind_of(kwargs)} {kwargs.get('solver') or kwargs.get('method')} {budget}\\n")
            return result
        return solve

    frontier.solve_optimal = logged(frontier.solve_optimal, lambda k: "bisect" if k["feasibility_only"] else "sample")
    frontier.solve_relaxation = logged(frontier.solve_relaxation, lambda k: "relax")
    sys.exit(main(sys.argv[1:]))
""")


def _frontier_command(tmp_path: Path, *extra: str) -> list[str]:
    log = tmp_path / "chain.log"
    if not log.exists():
        chain_log().write(log)
    script = tmp_path / "wrapper.py"
    script.write_text(WRAPPER)
    return [sys.executable, str(script), "frontier", str(log), "--ratios", "0.8,0.9,1.0", "--time-limit", "10",
            "--resolution", "0.02", "--policy-ratios", GRID, "--cache", str(tmp_path / "cache"), *extra]


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_an_interrupted_frontier_resumes_with_no_solve_lost_or_repeated(tmp_path, capsys, how):
    """Run ``dtrlab frontier`` until its third solve starts (two are finished and kept), send
    the signal there, then resume: the finished solves are not repeated, the rest are
    solved once, and the result equals an uninterrupted run's."""
    out, blocked = tmp_path / "chain.parquet", tmp_path / "blocked"
    environment = {**os.environ, "SOLVE_LOG": str(tmp_path / "first.log"), "BLOCK_AT": "3",
                   "BLOCKED": str(blocked), "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(_frontier_command(tmp_path, "--out", str(out)), env=environment,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(1200):  # a safety net only: the signal waits for the third solve to start
        if blocked.exists() or process.poll() is not None:
            break
        time.sleep(0.1)
    assert blocked.exists(), process.communicate()
    journal = tmp_path / "chain.solves"
    assert len(list(journal.glob("*.json"))) == 2
    process.send_signal(how)
    _, err = process.communicate(timeout=HANG_GUARD_S)
    assert process.returncode == (130 if how == signal.SIGINT else -signal.SIGKILL), err
    assert not out.exists() and len(list(journal.glob("*.json"))) == 2

    command = _frontier_command(tmp_path, "--out", str(out))
    assert main(command[2:]) == 2 and "--resume" in capsys.readouterr().err  # never silently discarded
    environment.update(SOLVE_LOG=str(tmp_path / "second.log"), BLOCK_AT="0")
    resumed = subprocess.run(_frontier_command(tmp_path, "--out", str(out), "--resume"), env=environment,
                             capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "2 kept from an interrupted run" in resumed.stdout
    first = (tmp_path / "first.log").read_text().splitlines()
    second = (tmp_path / "second.log").read_text().splitlines()
    assert len(first) == 2 and not set(first) & set(second) and len(set(second)) == len(second)
    frontier = read_frontier(out)
    solves = frontier.rows[frontier.rows.kind != "policy"]
    assert sorted(first + second) == sorted(f"{r.kind} {r.solver} {r.budget_bytes}" for r in solves.itertuples())
    assert not journal.exists()  # cleared once the file is written

    assert main(_frontier_command(tmp_path, "--out", str(tmp_path / "whole.parquet"))[2:]) == 0  # uninterrupted
    whole = read_frontier(tmp_path / "whole.parquet")
    assert whole.metadata() == frontier.metadata()
    assert whole.rows.drop(columns=["solve_seconds", "build_seconds"]).equals(
        frontier.rows.drop(columns=["solve_seconds", "build_seconds"]))


# ------------------------------------------------------------------ the shipped files
SHIPPED = sorted((ROOT / "results" / "frontier").glob("*.parquet"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem[:24] for p in SHIPPED])
def test_shipped_frontier_claims_no_proof_a_real_run_refutes(path):
    """Every shipped frontier file: its checksum holds; no relaxation proof lies at or above a
    budget where a real run (policy run, replayed schedule, DTR's run) passed, and no bound is
    above such a run's overhead; every reported optimum is its schedule's replayed recompute;
    the bracket in the file is the one its rows support; faults are only answers the solver
    itself gave up on ("unknown")."""
    import pyarrow.parquet as pq

    frontier = read_frontier(path)
    stored = json.loads(pq.read_table(path).schema.metadata[b"dtrlab.frontier"])
    assert "sha256" in stored, "shipped files carry their checksum"
    runs = frontier.real_runs()
    rows = frontier.rows
    for row in rows[rows.kind == "relax"].itertuples():
        below = [run for run in runs if run.budget <= row.budget_bytes]
        if row.status == "infeasible":
            assert not below, (row.budget_bytes, below[:1])
        if row.status == "bound":
            assert all(row.overhead_bound <= run.overhead * (1 + 1e-6) for run in below), row.budget_bytes
    optimal = rows[rows.status == "optimal"]
    assert (optimal.replay_passed == True).all()  # noqa: E712
    assert (optimal.remat_compute == optimal.replay_remat_compute).all()
    assert frontier.max_infeasible_bytes < min(run.budget for run in runs) == frontier.min_feasible_bytes
    derived = frontier.metadata()
    assert {k: stored[k] for k in derived} == derived
    assert set(rows[rows.fault != ""].status) <= {"unknown"}
