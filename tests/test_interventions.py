"""Interventions (withhold, pin from a step, force-evict at a step) and the single-tensor search."""

from __future__ import annotations

import pytest
from dtrlab.sweep.execution import Execution

pd = pytest.importorskip("pandas")

from dtrlab import Intervention, simulate  # noqa: E402
from dtrlab.analysis import identical_evictions, record, single_tensor_search  # noqa: E402
from dtrlab.cli import main  # noqa: E402
from dtrlab.trace.model import COMPUTE  # noqa: E402

from conftest import LOGS, RESNET_LOG  # noqa: E402


@pytest.fixture(scope="module")
def search(resnet_trace):
    return single_tensor_search(resnet_trace, "dtr", ratio=0.17, execution=Execution(progress=False, cache=False))


def never_chosen(run) -> list[int]:
    """Storages offered to the policy at some decision but never evicted by it."""
    candidates = run.candidates
    evicted = set(run.evictions["storage"])
    return sorted(set(candidates["storage_id"][~candidates["storage"].isin(evicted)]))


def without_candidate_count(result):
    # The failure record counts the candidates left, which a withheld resident storage reduces by one.
    record = result.to_dict(evicted=True)
    record.get("failure", {}).pop("candidates", None)
    return record


@pytest.mark.parametrize("policy", ["dtr", "lru", "msps", "largest_storage"])
@pytest.mark.parametrize("ratio", [0.3, 0.45, 0.6])
def test_withholding_a_never_chosen_storage_leaves_a_score_policy_run_identical(small_resnet, policy, ratio):
    # A score policy evicts the last candidate with the minimal score, and scores do not depend on
    # the other candidates; removing a candidate it did not choose keeps every choice, so by induction
    # the whole run is the same.
    base = record(small_resnet, policy, ratio=ratio)
    storages = never_chosen(base)
    assert storages, "the test needs a candidate the policy never chose"
    for s in storages[:: max(1, len(storages) // 8)]:
        run = simulate(small_resnet, policy, ratio=ratio, intervention=Intervention(withhold=frozenset({s})))
        assert without_candidate_count(run) == without_candidate_count(base.result)


def test_withholding_a_never_chosen_storage_on_the_resnet32_hole(resnet_trace):
    base = record(resnet_trace, "dtr", ratio=0.17)
    for s in never_chosen(base)[:10]:
        run = simulate(resnet_trace, "dtr", ratio=0.17, intervention=Intervention(withhold=frozenset({s})))
        assert without_candidate_count(run) == without_candidate_count(base.result)


def test_withholding_a_never_chosen_storage_can_change_a_random_policy_run(small_resnet):
    # The identity needs a score policy: random draws an index into the candidate list,
    # so a shorter list changes later draws.
    base = record(small_resnet, "random", ratio=0.6, seed=1)
    changed = [s for s in never_chosen(base)[:20]
               if simulate(small_resnet, "random", ratio=0.6, seed=1,
                           intervention=Intervention(withhold=frozenset({s}))).evicted_storages
               != base.result.evicted_storages]
    assert changed


def test_withholding_the_chosen_storage_diverges_at_its_first_eviction(small_resnet):
    base = simulate(small_resnet, "dtr", ratio=0.45)
    name = base.evicted_storages[5]
    s = small_resnet.tensor_names.index(name)
    run = simulate(small_resnet, "dtr", ratio=0.45, intervention=Intervention(withhold=frozenset({s})))
    assert identical_evictions(base, run) == base.evicted_storages.index(name)
    assert name not in run.evicted_storages


def test_intervention_record_normalizes_its_fields():
    intervention = Intervention(withhold={3, 1}, pin={7: 40, 5: 2}, force_evict=[(9, 11)])
    assert intervention.withhold == frozenset({1, 3})
    assert intervention.pin == ((5, 2), (7, 40))
    assert intervention.force_evict == ((9, 11),)
    assert intervention and not Intervention()
    assert hash(intervention) == hash(Intervention(withhold=[1, 3], pin=[(7, 40), (5, 2)], force_evict={9: 11}))


def test_intervention_on_a_tensor_that_is_not_a_storage_is_rejected(small_resnet):
    ops, tensor_op, tensor_index = small_resnet.operators, small_resnet.tensor_op, small_resnet.tensor_index
    not_a_storage = next(t for t in range(small_resnet.n_tensors) if ops[tensor_op[t]].aliases[tensor_index[t]] != -1)
    with pytest.raises(ValueError, match="not a storage"):
        simulate(small_resnet, "dtr", ratio=0.45, intervention=Intervention(pin={not_a_storage: 0}))


def test_pin_from_a_step_keeps_the_storage_resident(small_resnet):
    base = record(small_resnet, "dtr", ratio=0.45)
    name = base.evictions["storage"].iloc[3]
    step = int(base.evictions["step"].iloc[3]) + 1  # pin just after its first eviction
    s = small_resnet.tensor_names.index(name)
    run = record(small_resnet, "dtr", ratio=0.45, intervention=Intervention(pin={s: step}))
    (action,) = run.interventions.itertuples()
    assert (action.step, action.action, action.storage, action.applied) == (step, "pin", name, True)
    # Identical until the pin, which rematerializes the evicted storage; never evicted or freed after.
    assert list(run.evictions["storage"][:3]) == list(base.evictions["storage"][:3])
    after = run.events[run.events["step"] >= step]
    assert after["kind"].iloc[:2].tolist() == ["remat", "pin"] and (after["storage"].iloc[:2] == name).all()
    assert not ((after["kind"].isin(["evict", "free"])) & (after["storage"] == name)).any()


def test_pin_before_creation_applies_once_the_storage_exists(small_resnet):
    base = simulate(small_resnet, "dtr", ratio=0.45)
    s = small_resnet.tensor_names.index(base.evicted_storages[0])
    run = record(small_resnet, "dtr", ratio=0.45, intervention=Intervention(pin={s: 0}))
    created = next(step for step, (kind, op) in enumerate(small_resnet.schedule)
                   if kind == COMPUTE and s in small_resnet.operators[op].outputs)
    assert run.interventions["step"].tolist() == [created + 1]
    assert run.interventions["applied"].tolist() == [True]
    assert base.evicted_storages[0] not in run.result.evicted_storages


def test_force_evict_at_a_step(small_resnet):
    base = record(small_resnet, "dtr", ratio=0.45)
    computes = base.events[base.events["kind"] == "compute"]
    # A storage computed at some step; force it out two steps later if it is still resident.
    row = computes.iloc[len(computes) // 3]
    s = small_resnet.tensor_names.index(row["storage"])
    run = record(small_resnet, "dtr", ratio=0.45, intervention=Intervention(force_evict={s: int(row["step"]) + 1}))
    (action,) = run.interventions.itertuples()
    assert action.action == "force_evict" and action.storage == row["storage"] and action.applied
    forced = run.events[run.events["kind"] == "force_evict"].iloc[0]
    before = run.events.iloc[forced.name - 1]
    assert forced["memory_after"] == before["memory_after"] + forced["bytes"] < before["memory_after"]
    # Forced evictions are not policy evictions.
    assert run.result.evictions == len(run.evictions)


def test_force_evict_of_a_storage_that_is_not_resident_changes_nothing(small_resnet):
    base = simulate(small_resnet, "dtr", ratio=0.45)
    s = small_resnet.tensor_names.index(base.evicted_storages[0])
    run = record(small_resnet, "dtr", ratio=0.45, intervention=Intervention(force_evict={s: 0}))
    assert run.interventions["applied"].tolist() == [False]  # not created yet at step 0
    assert run.result.to_dict(evicted=True) == base.to_dict(evicted=True)


def test_search_finds_the_rescues_of_the_resnet32_hole(search):
    assert search.base.status == "thrash"
    table = search.table
    assert len(table) == len(set(search.base.evicted_storages)) == 182
    rescues = search.rescues
    assert len(rescues) == 46
    assert {"x7977", "x8029", "x8101", "x8976"} <= set(rescues["storage"])
    assert (rescues["status"] == "pass").all() and (rescues["overhead"] < 2).all()
    # A score policy makes the same decisions until it would have chosen the withheld storage.
    assert (table["identical_decisions"] == table["first_evicted"]).all()
    moved = table[table["effect"] == "failure moved"]
    assert (moved["failure_step_delta"] != 0).all() and len(moved) == 86
    assert (table[table["effect"] == "no change"]["failure_step_delta"] == 0).all()


def test_a_rescue_replayed_on_its_own_passes_deterministically(resnet_trace, search):
    row = search.rescues.set_index("storage").loc["x8029"]
    intervention = search.intervention("x8029")
    first = simulate(resnet_trace, "dtr", ratio=0.17, intervention=intervention)
    second = simulate(resnet_trace, "dtr", ratio=0.17, intervention=intervention)
    assert first.passed and first.to_dict(evicted=True) == second.to_dict(evicted=True)
    assert (first.clock, first.evictions, first.overhead) == (row["clock"], row["evictions"], row["overhead"])


@pytest.mark.slow
def test_search_runs_through_the_sweep_engine_backends(resnet_trace, search):
    parallel = single_tensor_search(resnet_trace, "dtr", ratio=0.17,
                                    execution=Execution(jobs=2, progress=False, cache=False))
    pd.testing.assert_frame_equal(parallel.table, search.table)


def test_search_rejects_a_passing_run_and_unknown_storages(small_resnet, search):
    with pytest.raises(ValueError, match="passes"):
        single_tensor_search(small_resnet, "dtr", ratio=0.6, execution=Execution(progress=False, cache=False))
    with pytest.raises(ValueError, match="not a storage the base run evicted"):
        search.intervention("x0")


def test_rescue_timelines_plot(resnet_trace, search):
    import matplotlib

    matplotlib.use("agg")
    from dtrlab.plots import memory_timelines

    runs = [record(resnet_trace, "dtr", ratio=0.17, candidate_scores=False),
            record(resnet_trace, "dtr", ratio=0.17, intervention=search.intervention("x8029"), candidate_scores=False)]
    fig = memory_timelines(runs, highlight="x8029")
    assert len(fig.axes) == 2
    title = fig.axes[1].get_title(loc="left")
    assert "withhold x8029" in title and "pass" in title
    with pytest.raises(ValueError, match="x must be"):
        memory_timelines(runs, x="time")


@pytest.mark.slow
def test_explain_command_prints_the_failure_and_rescue_table(logs_dir, capsys):
    assert main(["explain", str(LOGS / RESNET_LOG), "--policy", "dtr", "--ratio", "0.17"]) == 0
    out = capsys.readouterr().out
    assert "thrash" in out and "bytes_locked" in out
    assert "46 rescue the run" in out and "x8029" in out
