"""The policy search: space, objective, resumable study (SIGKILL and Ctrl-C), exported policies."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pandas as pd
import pytest
from dtrlab.sweep.execution import Execution

optuna = pytest.importorskip("optuna", reason="the policy search needs optuna")

from dtrlab.analysis.holes import find_holes  # noqa: E402
from dtrlab.policies import get_policy  # noqa: E402
from dtrlab.policies.searched import ScoreSearch, load_searched  # noqa: E402
from dtrlab.runtime import simulate  # noqa: E402
from dtrlab.search import (DTR_POINT, SPACE, evaluate, export_policies, make_policy, objective_value,  # noqa: E402
                           open_study, run_search)
from dtrlab.sweep import sweep  # noqa: E402

from conftest import ROOT  # noqa: E402

TRACE = ROOT / "traces" / "resnet32-b8.jsonl.gz"
RATIOS = [0.3, 0.45, 0.5, 0.55, 0.6, 0.7, 0.9]


def test_the_dtr_point_is_dtr_in_float64_and_d_adds_the_neighbour_factor(small_resnet):
    reference = simulate(small_resnet, "dtr_float64", ratio=0.5)
    assert simulate(small_resnet, make_policy(DTR_POINT), ratio=0.5).eviction_sha256 == reference.eviction_sha256
    plain = make_policy({**DTR_POINT, "cost": "local"})
    neighbours = make_policy({**DTR_POINT, "cost": "local", "d": 1.0})
    assert neighbours.label == "score_search(arithmetic='float64', cost='local', d=1.0)"
    runs = [simulate(small_resnet, p, ratio=0.5) for p in (plain, neighbours, neighbours)]
    assert runs[0].eviction_sha256 != runs[1].eviction_sha256  # the factor changes decisions
    assert runs[1].to_dict(evicted=True) == runs[2].to_dict(evicted=True)  # and is deterministic
    with pytest.raises(ValueError, match="d \\(the evicted-neighbour exponent\\)"):
        ScoreSearch(d=-1)


def test_score_search_factor_by_hand():
    class Sim:  # one candidate: cost 6, size 2, staleness 3, two evicted neighbours
        size, last_access, clock = {0: 2}, {0: 7}, 10
        compute_cost = {0: 6}

        def evicted_neighbours(self, s):
            return {4, 5}

    policy = ScoreSearch(cost="local", d=2, arithmetic="float64")
    assert policy.score_of(Sim(), 0) == pytest.approx(6 / (2 * 3) * 3 ** 2)


def test_objective_is_lexicographic():
    assert objective_value(1, 0.05, 1.0) > objective_value(0, 1.0, 2.0)  # one hole outweighs any threshold
    step = 0.002 * 0.95 / 8  # one grid step of one of 8 traces
    assert objective_value(0, 0.5 + step, 1.0) > objective_value(0, 0.5, 2.0)
    assert objective_value(0, 0.5, 1.1) > objective_value(0, 0.5, 1.0)


def test_evaluate_matches_the_hole_census(small_resnet, tmp_path):
    result = evaluate("dtr", [small_resnet], ratios=RATIOS, execution=Execution(cache=tmp_path, progress=False))
    census = find_holes(sweep(small_resnet, "dtr", ratios=RATIOS, execution=Execution(cache=tmp_path, progress=False)))
    assert result.holes == len(census.holes) and result.threshold == census.threshold_ratio
    passing = census.samples[census.samples["status"] == "pass"]
    assert result.overhead == pytest.approx(passing["overhead"].mean())


def test_search_reaches_its_trial_budget_and_resumes(small_resnet, tmp_path):
    storage = tmp_path / "study.db"
    first = run_search([small_resnet], storage, n_trials=3, ratios=RATIOS,
                       execution=Execution(cache=tmp_path, progress=False))
    assert first.completed == 3 and first.ran == 3
    assert first.trials.loc[first.trials["trial"] == 0, "policy"].item() == make_policy(DTR_POINT).label
    again = run_search([small_resnet], storage, n_trials=5, ratios=RATIOS,
                       execution=Execution(cache=tmp_path, progress=False))
    assert again.completed == 5 and again.ran == 2 and again.retried == 0
    kept = again.trials.set_index("trial").loc[first.trials["trial"], "value"]
    assert kept.tolist() == first.trials["value"].tolist()
    assert not again.pareto.empty and set(again.pareto["trial"]) <= set(again.trials["trial"])
    with pytest.raises(ValueError, match="give a budget"):
        run_search([small_resnet], storage, n_trials=None, timeout=None)


SEARCH = """
import signal
import sys
from dtrlab.cli import main
# A process started in the background by a non-interactive shell inherits SIGINT as ignored,
# and Python then installs no handler; a terminal's Ctrl-C reaches Python's default one.
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.exit(main(["search", sys.argv[1], "--storage", sys.argv[2], "--trials", "5", "--ratios",
               "0.3,0.4,0.45,0.5,0.55,0.6,0.65,0.7,0.8,0.9", "--seed", "1"]))
"""


def _polled_states(storage) -> list[tuple[str, int]]:
    """(state, parameters drawn) of each trial in number order, read without optuna in read-only mode."""
    with sqlite3.connect(f"file:{storage}?mode=ro", uri=True, timeout=1) as connection:
        return list(connection.execute(
            "SELECT state, (SELECT COUNT(*) FROM trial_params p WHERE p.trial_id = t.trial_id) "
            "FROM trials t ORDER BY number"))


def _states(storage):
    study = optuna.load_study(study_name="score_search", storage=f"sqlite:///{storage}")
    return study.get_trials(deepcopy=False)


@pytest.mark.parametrize("sig", [signal.SIGKILL, pytest.param(signal.SIGINT, marks=pytest.mark.slow)],
                         ids=["SIGKILL", "SIGINT"])
def test_interrupted_search_resumes_with_no_trial_lost_or_repeated(small_resnet, tmp_path, sig):
    storage = tmp_path / "study.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DTRLAB_CACHE": str(tmp_path / "cache")}
    process = subprocess.Popen([sys.executable, "-c", SEARCH, str(TRACE), str(storage)], env=env,
                               stdout=subprocess.DEVNULL, stderr=(tmp_path / "stderr").open("w"))
    # No wall-clock limit: the search ends by itself (5 trials), which fails the test if it was not killed first.
    while True:  # kill it while a trial runs, after two have completed
        assert process.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
        try:
            states = _polled_states(storage) if storage.exists() else []
        except sqlite3.Error:  # the database is being created
            states = []
        # A running trial with all its parameters drawn: it is evaluating.
        if sum(s in ("COMPLETE", "PRUNED") for s, _ in states) >= 2 and states[-1] == ("RUNNING", len(SPACE)):
            break
        time.sleep(0.02)
    process.send_signal(sig)
    assert process.wait() == (130 if sig == signal.SIGINT else -signal.SIGKILL)  # it ends by itself if SIGINT is lost
    before = {t.number: (t.state, t.value, t.params) for t in _states(storage)}
    interrupted = [n for n, (state, _, _) in before.items() if not state.is_finished()
                   or state == optuna.trial.TrialState.FAIL]
    assert len(interrupted) == 1

    env_cache = tmp_path / "cache"
    result = run_search([small_resnet], storage, n_trials=5, seed=1,
                        ratios=[0.3, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.8, 0.9],
                        execution=Execution(progress=False, cache=env_cache))
    after = _states(storage)
    finished = [t for t in after if t.state.is_finished() and t.state != optuna.trial.TrialState.FAIL]
    assert result.retried == 1 and len(finished) == 5
    for t in after:  # nothing that finished before the kill changed
        if t.number in before and before[t.number][0].is_finished() and before[t.number][0] != \
                optuna.trial.TrialState.FAIL:
            assert (t.state, t.value, t.params) == before[t.number]
    (killed,) = interrupted
    assert after[killed].state == optuna.trial.TrialState.FAIL
    retries = [t for t in after if t.user_attrs.get("retry_of") == killed]
    assert len(retries) == 1 and retries[0].state == optuna.trial.TrialState.COMPLETE
    if before[killed][2]:
        assert retries[0].params == before[killed][2]


def test_a_storage_answers_one_question(tmp_path):
    from dtrlab.trace import LogBuilder
    from test_handbuilt import chain, chain_log

    storage = tmp_path / "study.db"
    options = dict(execution=Execution(cache=False, progress=False))
    run_search([chain()], storage, n_trials=1, ratios=[0.5, 1.0], **options)
    with pytest.raises(ValueError, match=r"study\.db \(study 'score_search'\) was searched at ratios \[0\.5, 1\.0\], "
                                         r"not \[0\.5, 0\.75\]"):
        run_search([chain()], storage, n_trials=2, ratios=[0.5, 0.75], **options)
    with pytest.raises(ValueError, match="was searched on traces chain, not other"):
        run_search([chain_log().trace("other")], storage, n_trials=2, ratios=[0.5, 1.0], **options)
    edited = LogBuilder()  # the same name, another log
    edited.constant("x", 10)
    edited.call("f", ["x"], [("a", 20)], time=5)
    with pytest.raises(ValueError, match="was searched on other contents of chain"):
        run_search([edited.trace("chain")], storage, n_trials=2, ratios=[0.5, 1.0], **options)
    # The same question asked in other words, or in another study of the file, is fine.
    assert run_search([chain()], storage, n_trials=2, ratios="0.5,1.0", **options).completed == 2
    other_study = run_search([edited.trace("chain")], storage, study_name="edited", n_trials=1, ratios=[0.5], **options)
    assert other_study.ran == 1


def test_search_writes_only_into_its_own_storages(tmp_path):
    from test_handbuilt import chain

    foreign = tmp_path / "foreign.db"  # an Optuna storage of another project
    optuna.create_study(study_name="theirs", storage=f"sqlite:///{foreign}")
    before = foreign.read_bytes()
    with pytest.raises(ValueError, match=r"foreign\.db holds Optuna studies dtrlab did not make \(theirs\)"):
        run_search([chain()], foreign, n_trials=1, ratios=[0.5], execution=Execution(cache=False, progress=False))
    assert foreign.read_bytes() == before


CONCURRENT = """
import sys
from dtrlab.cli import main
sys.exit(main(["search", *sys.argv[1:], "--trials", "1000", "--ratios", "0.3:0.9:0.01"]))
"""


def test_a_second_search_on_a_storage_in_use_is_refused(tmp_path):
    from dtrlab.search.study import storage_lock

    storage = tmp_path / "study.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DTRLAB_CACHE": str(tmp_path / "cache")}
    first = subprocess.Popen([sys.executable, "-c", CONCURRENT, str(TRACE), "--storage", str(storage)], env=env,
                             stdout=subprocess.DEVNULL, stderr=(tmp_path / "stderr").open("w"))
    try:
        while True:  # until the first search evaluates a trial (it would run for many minutes)
            assert first.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
            try:
                states = _polled_states(storage) if storage.exists() else []
            except sqlite3.Error:  # the database is being created
                states = []
            if states and states[-1] == ("RUNNING", len(SPACE)):
                break
            time.sleep(0.02)
        second = subprocess.run([sys.executable, "-m", "dtrlab", "search", str(TRACE), "--storage", str(storage),
                                 "--trials", "1000", "--ratios", "0.3:0.9:0.01"], env=env, capture_output=True,
                                text=True, cwd=ROOT)
        assert second.returncode == 2 and second.stderr.count("\n") == 1, second.stderr
        assert f"{storage} is in use by PID {first.pid} (another dtrlab search)" in second.stderr
        assert first.poll() is None  # the first search runs on
    finally:
        first.kill()
        first.wait()
    with storage_lock(storage):  # a killed search leaves no lock behind
        pass


@pytest.fixture
def restore_shipped_policies():
    yield
    from dtrlab.policies.searched import SHIPPED_POLICIES
    if SHIPPED_POLICIES.exists():
        load_searched()


def test_exported_policies_register_by_name_and_are_checked(small_resnet, tmp_path, restore_shipped_policies):
    storage = tmp_path / "study.db"
    run_search([small_resnet], storage, n_trials=3, ratios=RATIOS, execution=Execution(cache=tmp_path, progress=False))
    path = tmp_path / "policies.json"
    document = export_policies(open_study(storage), path, top=2)
    registered = load_searched(path)
    assert list(registered) == [p["name"] for p in document["policies"]]
    first = document["policies"][0]
    policy = get_policy(first["name"])
    expected = make_policy({k: v for k, v in first["params"].items() if k != "arithmetic"})
    assert simulate(small_resnet, policy, ratio=0.5).eviction_sha256 == \
        simulate(small_resnet, expected, ratio=0.5).eviction_sha256
    frame = sweep(small_resnet, policy, ratios=[0.5, 0.7, 0.9],
                  execution=Execution(jobs=2, cache=False, progress=False))
    assert frame["eviction_sha256"].iloc[0] == simulate(small_resnet, policy, ratio=0.5).eviction_sha256
    tampered = json.loads(path.read_text())
    tampered["policies"][0]["params"]["a"] = 0.0
    path.write_text(json.dumps(tampered))
    with pytest.raises(ValueError, match="sha256"):
        load_searched(path)


def test_cli_search_prints_the_pareto_table(tmp_path, capsys, monkeypatch):
    from dtrlab.cli import main

    monkeypatch.setenv("DTRLAB_CACHE", str(tmp_path / "cache"))
    code = main(["search", str(TRACE), "--storage", str(tmp_path / "s.db"), "--trials", "2", "--ratios", "0.5,0.9",
                 "--export", str(tmp_path / "p.json"), "--top", "1"])
    out = capsys.readouterr().out
    assert code == 0 and "Pareto front" in out and "2 trials run" in out and "wrote 1 policies" in out
    assert main(["search", str(TRACE), "--storage", str(tmp_path / "s.db")]) == 2


def ship_fixture(tmp_path, monkeypatch):
    """A tuning set, two held-out sets and a 2-trial study under ``tmp_path``; returns ship's arguments."""
    from dtrlab.trace import load_directory

    for directory, names in (("tuning", ["resnet32-b8"]), ("first", ["unet-b2"]), ("second", ["lstm-b16", "unet-b2"])):
        (tmp_path / directory).mkdir()
        for name in names:
            (tmp_path / directory / f"{name}.jsonl.gz").symlink_to(ROOT / "traces" / f"{name}.jsonl.gz")
    monkeypatch.setenv("DTRLAB_CACHE", str(tmp_path / "cache"))
    run_search(list(load_directory(tmp_path / "tuning").values()), tmp_path / "study.db", n_trials=2,
               ratios=[0.5, 0.9], execution=Execution(progress=False, cache=tmp_path / "cache"))
    return ["--study", str(tmp_path / "study.db"), "--out", str(tmp_path / "out"), "--tuning", str(tmp_path / "tuning"),
            "--tuning-ratios", "0.5,0.9", "--heldout", str(tmp_path / "first"), "--heldout", str(tmp_path / "second"),
            "--top", "1", "--skip", "inclusion"]


def test_ship_compares_on_every_held_out_set(tmp_path, monkeypatch, restore_shipped_policies):
    """``dtrlab ship search`` with two ``--heldout`` sets: comparison rows for each, by set."""
    from dtrlab.cli import main
    from dtrlab.search import read_shipped_csv

    out = tmp_path / "out"
    assert main(["ship", "search", *ship_fixture(tmp_path, monkeypatch), "--heldout-ratios", "0.6,0.9"]) == 0
    comparison = read_shipped_csv(out / "comparison.csv")
    held = comparison[comparison["traces_role"] == "held-out"]
    assert held.groupby("trace_set")["traces"].first().to_dict() == {"first": 1, "second": 2}
    assert set(held["policy"]) == {"dtr", "msps", "monotone", "searched_1"}
    assert held.set_index("policy")["swept"].to_dict()["searched_1"].startswith("score_search(")
    per_trace = read_shipped_csv(out / "comparison_per_trace.csv")
    assert len(per_trace[per_trace["trace_set"] == "second"]) == 2 * 4


def test_ship_keeps_the_comparisons_it_holds_and_computes_the_rest(tmp_path, monkeypatch, restore_shipped_policies):
    """A second ``ship`` with one more held-out grid computes only that grid's comparisons; the rows it
    held come back unchanged; a file damaged since is not trusted (all recomputed)."""
    import dtrlab.pipeline.ship_search as ship_module
    from dtrlab.cli import main
    from dtrlab.search import read_shipped_csv

    arguments = ["ship", "search", *ship_fixture(tmp_path, monkeypatch)]
    out = tmp_path / "out"
    assert main([*arguments, "--heldout-ratios", "0.6,0.9"]) == 0
    before = read_shipped_csv(out / "comparison.csv")
    computed = []
    real_compare = ship_module.compare

    def counting_compare(policies, traces, *, ratios, **options):
        computed.append(ratios)
        return real_compare(policies, traces, ratios=ratios, **options)

    monkeypatch.setattr(ship_module, "compare", counting_compare)
    assert main([*arguments, "--heldout-ratios", "0.6,0.9", "--heldout-ratios", "0.7,0.9"]) == 0
    assert computed == ["0.7,0.9"] * 8  # 4 policies on each held-out set
    after = read_shipped_csv(out / "comparison.csv")
    pd.testing.assert_frame_equal(after[after["ratios"] != "0.7,0.9"].reset_index(drop=True), before)
    assert len(after[after["ratios"] == "0.7,0.9"]) == 8
    per_trace = read_shipped_csv(out / "comparison_per_trace.csv")
    assert len(per_trace[per_trace["ratios"] == "0.7,0.9"]) == 4 * (1 + 2)

    (out / "comparison.csv").write_text((out / "comparison.csv").read_text().replace("held-out", "held_out", 1))
    computed.clear()
    assert main([*arguments, "--heldout-ratios", "0.6,0.9"]) == 0
    assert len(computed) == 4 * 3  # the tuned set and both held-out sets, recomputed
    pd.testing.assert_frame_equal(read_shipped_csv(out / "comparison.csv"), before)


def test_ship_names_a_malformed_grid(tmp_path, capsys):
    from dtrlab.cli import main

    assert main(["ship", "search", "--out", str(tmp_path), "--skip", "study", "--skip", "inclusion", "--tuning",
                 str(ROOT / "traces"), "--heldout", str(ROOT / "traces"), "--heldout-ratios", "0.05:1.0:0.005",
                 "--heldout-ratios", "xyz"]) == 2
    err = capsys.readouterr().err
    assert "--heldout-ratios xyz: ratios must be numbers" in err and "Traceback" not in err


def test_ship_names_a_missing_trace_directory(tmp_path, capsys):
    from dtrlab.cli import main

    assert main(["ship", "search", "--out", str(tmp_path), "--skip", "study", "--skip", "inclusion", "--heldout",
                 str(tmp_path / "nope")]) == 2
    assert f"--heldout {tmp_path / 'nope'}: not a directory of traces" in capsys.readouterr().err
