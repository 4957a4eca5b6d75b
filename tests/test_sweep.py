"""Budget sweeps: the reference sweep, backends, the cache and resuming after an interruption."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from unittest import mock

import pandas as pd
import pyarrow as pa
import pytest

import dtrlab.sweep
from dtrlab.policies import ScorePolicy, get_policy
from dtrlab.runtime import Intervention, budget_for, simulate
from dtrlab.sweep import RunSpec, SweepCache, parse_ratios, run_many, sweep
from dtrlab.sweep import budget_sweep, cache as cache_module, engine

from conftest import REFERENCE, RESNET_LOG, ROOT, read_jsonl
from dtrlab.runtime.semantics import Semantics
from dtrlab.sweep.execution import Execution

TRACES = ROOT / "traces"


@pytest.fixture
def count_runs(monkeypatch):
    """Counts the simulations run in this process (sequential backend)."""
    calls = []
    real = engine.simulate

    def counting(trace, policy, **kwargs):
        calls.append(kwargs["budget_bytes"])
        return real(trace, policy, **kwargs)

    monkeypatch.setattr(engine, "simulate", counting)
    return calls


def without_wall(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.drop(columns="wall_seconds")


def test_ratio_ranges_match_the_reference_formula():
    ratios = parse_ratios("0.05:1.0:0.005")
    assert ratios == [0.05 + 0.95 * i / 190 for i in range(191)]
    assert parse_ratios([0.25, "0.5"]) == [0.25, 0.5]
    for bad in ("0.05:1.0", "1.0:0.05:0.01", "a:b:c"):
        with pytest.raises(ValueError, match="START:STOP:STEP|STOP > START"):
            parse_ratios(bad)
    with pytest.raises(ValueError, match="positive"):
        parse_ratios([0.5, 0])


@pytest.mark.slow
def test_resnet32_sweep_reproduces_the_reference(resnet_trace, tmp_path):
    reference = read_jsonl(REFERENCE / "resnet32-dtr-sweep.jsonl")
    frame = dtrlab.sweep(resnet_trace, "dtr", ratios="0.05:1.0:0.005",
                         execution=Execution(jobs=2, cache=tmp_path, progress=False))
    assert len(frame) == len(reference) == 191
    got = frame[["ratio", "status", "budget_bytes", "clock", "evictions"]].to_dict("records")
    want = [{"ratio": r["ratio"], "status": r["status"], "budget_bytes": r["budget"], "clock": r["clock"],
             "evictions": r["evictions"]} for r in reference]
    assert got == want
    assert (frame["eviction_sha256"] == [r["eviction_sha256"] for r in reference]).all()
    assert set(frame["trace"]) == {RESNET_LOG.removesuffix(".log")}
    assert set(frame["policy"]) == {"dtr"} and set(frame["dtrlab_version"]) == {dtrlab.__version__}


def test_frame_columns_and_budgets_in_bytes(small_resnet, tmp_path):
    peak = dtrlab.baseline(small_resnet).peak_memory
    frame = sweep(small_resnet, "random", budgets=[peak // 2, peak], seed=3,
                  execution=Execution(cache=tmp_path, progress=False))
    assert list(frame.columns) == budget_sweep.COLUMNS
    assert frame["budget_bytes"].tolist() == [peak // 2, peak]
    assert frame["ratio"].tolist() == [(peak // 2) / peak, 1.0]
    assert frame["policy"].tolist() == ["random(seed=3)"] * 2
    assert json.loads(frame["policy_params"][0]) == {"seed": 3}
    one = simulate(small_resnet, "random", budget_bytes=peak // 2, seed=3)
    row = frame.iloc[0]
    assert (row.status, row.clock, row.evictions, row.remats, row.peak_memory) == (
        one.status, one.clock, one.evictions, one.remats, one.peak_memory)
    assert row.overhead == one.overhead


def test_bad_arguments_say_what_works(small_resnet):
    with pytest.raises(ValueError, match="exactly one of ratios"):
        sweep(small_resnet, ratios=[0.5], budgets=[10], execution=Execution(cache=False))
    with pytest.raises(ValueError, match="unknown backend 'forks' \\(did you mean 'fork'"):
        sweep(small_resnet, ratios=[0.5, 0.6], execution=Execution(backend="forks", cache=False, progress=False))
    with pytest.raises(ValueError, match="unknown backend 'threads'"):
        sweep(small_resnet, ratios=[0.5], execution=Execution(backend="threads", cache=False, progress=False))
    with pytest.raises(ValueError, match="unknown policy"):
        sweep(small_resnet, "nope", ratios=[0.5], execution=Execution(cache=False))
    with pytest.raises(ValueError, match="holds 7 traces"):
        sweep(TRACES, ratios=[0.5], execution=Execution(cache=False))


def test_run_many_keeps_spec_order_across_backends(small_resnet):
    policy = get_policy("dtr")
    ratios = [0.9, 0.3, 0.6, 0.45]
    specs = [RunSpec(budget_for(small_resnet, r), policy, ratio=r) for r in ratios]
    sequential = run_many(small_resnet, specs, execution=Execution(backend="sequential", progress=False))
    assert [r.ratio for r in sequential] == ratios
    assert sequential == [simulate(small_resnet, "dtr", ratio=r) for r in ratios]
    assert run_many(small_resnet, specs, execution=Execution(jobs=2, backend="loky", progress=False)) == sequential
    assert run_many(small_resnet, specs, execution=Execution(jobs=2, backend="fork", progress=False)) == sequential


class SmallestFirst(ScorePolicy):
    """A user-defined policy: travels to worker processes as an instance."""

    name = "smallest_first_test"

    def score(self, view):
        return view.size


def test_user_policy_instances_run_in_worker_processes(small_resnet):
    specs = [RunSpec(budget_for(small_resnet, r), SmallestFirst(), ratio=r) for r in (0.5, 0.8)]
    expected = [simulate(small_resnet, SmallestFirst(), ratio=r) for r in (0.5, 0.8)]
    assert run_many(small_resnet, specs, execution=Execution(jobs=2, progress=False)) == expected


def test_parallel_sweeps_and_joblib_parallel_share_one_pool(small_resnet):
    # A worker sweep used to leave joblib's reusable executor without its temporary-folder manager,
    # so a later joblib.Parallel call (e.g. analysis.inclusion_census) failed with AttributeError.
    from joblib import Parallel, delayed

    first = sweep(small_resnet, "dtr", ratios=[0.5, 0.7], execution=Execution(jobs=2, cache=False, progress=False))
    assert Parallel(n_jobs=2)(delayed(abs)(-i) for i in range(3)) == [0, 1, 2]
    again = sweep(small_resnet, "dtr", ratios=[0.5, 0.7], execution=Execution(jobs=2, cache=False, progress=False))
    assert first["clock"].tolist() == again["clock"].tolist()


def test_rerun_is_served_from_the_cache(small_resnet, tmp_path, count_runs):
    first = sweep(small_resnet, "dtr", ratios="0.3:0.9:0.1", execution=Execution(cache=tmp_path, progress=False))
    assert len(count_runs) == 7
    again = sweep(small_resnet, "dtr", ratios="0.3:0.9:0.1", execution=Execution(cache=tmp_path, progress=False))
    assert len(count_runs) == 7
    pd.testing.assert_frame_equal(first, again)
    # A budget already cached under another ratio list is not simulated again either.
    sweep(small_resnet, "dtr", ratios=[0.5, 0.55], execution=Execution(cache=tmp_path, progress=False))
    assert count_runs[7:] == [budget_for(small_resnet, 0.55)]
    # A different overhead limit or policy parameter is a different cache entry.
    sweep(small_resnet, "dtr", ratios=[0.5], semantics=Semantics(overhead_limit=3.0),
          execution=Execution(cache=tmp_path, progress=False))
    sweep(small_resnet, "random", ratios=[0.5], seed=1, execution=Execution(cache=tmp_path, progress=False))
    sweep(small_resnet, "random", ratios=[0.5], seed=2, execution=Execution(cache=tmp_path, progress=False))
    assert len(count_runs) == 11


def test_cache_of_another_simulator_version_is_not_reused(small_resnet, tmp_path, count_runs, monkeypatch):
    sweep(small_resnet, "dtr", ratios=[0.5, 0.7], execution=Execution(cache=tmp_path, progress=False))
    store = SweepCache(tmp_path, small_resnet, get_policy("dtr"))
    # Rows that claim an older version inside the current directory are ignored, with a warning.
    (part,) = store.directory.glob("*.parquet")
    store._write(pa.Table.from_pandas(pd.read_parquet(part).assign(simulator_version=-1)), "part")
    part.unlink()
    with pytest.warns(UserWarning, match="another simulator version"):
        sweep(small_resnet, "dtr", ratios=[0.5, 0.7], execution=Execution(cache=tmp_path, progress=False))
    assert len(count_runs) == 4
    # A version bump moves the whole cache.
    monkeypatch.setattr(cache_module, "SIMULATOR_VERSION", 10**6)
    monkeypatch.setattr(budget_sweep, "SIMULATOR_VERSION", 10**6)
    assert SweepCache(tmp_path, small_resnet, get_policy("dtr")).directory != store.directory
    sweep(small_resnet, "dtr", ratios=[0.5, 0.7], execution=Execution(cache=tmp_path, progress=False))
    assert len(count_runs) == 6


def test_every_part_of_an_intervention_is_in_the_cache_key(small_resnet, tmp_path):
    storage = small_resnet.operators[-1].outputs[0]
    interventions = [None, Intervention(withhold={storage}), Intervention(pin={storage: 10}),
                     Intervention(force_evict={storage: 10}), Intervention(force_evict={storage: 11})]
    directories = {SweepCache(tmp_path, small_resnet, get_policy("dtr"), intervention=i).directory
                   for i in interventions}
    assert len(directories) == len(interventions)
    # Without timed actions the key is what it always was (existing caches stay valid).
    assert SweepCache(tmp_path, small_resnet, get_policy("dtr"), intervention=Intervention()).directory == \
        SweepCache(tmp_path, small_resnet, get_policy("dtr")).directory


def test_editing_a_user_policy_changes_its_cache_key(small_resnet, tmp_path):
    class Edited(SmallestFirst):
        def score(self, view):
            return -view.size

    assert cache_module.policy_fingerprint(SmallestFirst()) != cache_module.policy_fingerprint(Edited())
    keys = {SweepCache(tmp_path, small_resnet, p).directory for p in (SmallestFirst(), Edited())}
    assert len(keys) == 2


def test_interrupted_sweep_resumes_without_recomputing(small_resnet, tmp_path, monkeypatch):
    ratios = "0.3:0.9:0.05"
    uninterrupted = sweep(small_resnet, "dtr", ratios=ratios, execution=Execution(cache=False, progress=False))
    calls = []
    real = engine.simulate

    def interrupt_after_five(trace, policy, **kwargs):
        if len(calls) == 5:
            raise KeyboardInterrupt
        calls.append(kwargs["budget_bytes"])
        return real(trace, policy, **kwargs)

    monkeypatch.setattr(engine, "simulate", interrupt_after_five)
    with pytest.raises(KeyboardInterrupt):
        sweep(small_resnet, "dtr", ratios=ratios, execution=Execution(cache=tmp_path, progress=False))
    finished = list(calls)
    assert len(finished) == 5
    assert sorted(SweepCache(tmp_path, small_resnet, get_policy("dtr")).load()["budget_bytes"]) == sorted(finished)

    calls.clear()
    monkeypatch.setattr(engine, "simulate", lambda trace, policy, **kw: calls.append(kw["budget_bytes"])
                        or real(trace, policy, **kw))
    resumed = sweep(small_resnet, "dtr", ratios=ratios, execution=Execution(cache=tmp_path, progress=False))
    assert not set(calls) & set(finished)
    assert len(calls) == len(uninterrupted) - 5
    pd.testing.assert_frame_equal(without_wall(resumed), without_wall(uninterrupted))


KILLED_SWEEP = """
import sys
from dtrlab.sweep import Execution, sweep
from dtrlab.trace import load_log
trace = load_log(sys.argv[1])
sweep(trace, "dtr", ratios="0.3:1.0:0.01", execution=Execution(cache=sys.argv[2], progress=False))
"""


def test_a_compaction_by_another_process_between_listing_and_reading_loses_no_row(small_resnet, tmp_path,
                                                                                   monkeypatch):
    budgets = [budget_for(small_resnet, r) for r in (0.4, 0.6, 0.8)]
    rows = sweep(small_resnet, "dtr", budgets=budgets,
                 execution=Execution(cache=False, progress=False)).to_dict("records")
    mine = SweepCache(tmp_path, small_resnet, get_policy("dtr"))
    other = SweepCache(tmp_path, small_resnet, get_policy("dtr"))  # the other process's view
    for row in rows:
        mine.append([row])
    listed = mine._parts()
    assert len(listed) == 3
    calls = []

    def stale_then_fresh():  # the other process compacts right after the first listing; two listings are stale
        calls.append(1)
        if len(calls) == 1:
            other.compact()
        return listed if len(calls) <= 2 else sorted(mine.directory.glob("*.parquet"))

    monkeypatch.setattr(mine, "_parts", stale_then_fresh)
    mine.compact()
    assert sorted(mine.load()["budget_bytes"]) == sorted(budgets)
    assert len(list(mine.directory.glob("*.parquet"))) == 1  # other's merged file, nothing left to merge


def test_sigkilled_sweep_loses_no_finished_result(small_resnet, tmp_path, count_runs):
    store = SweepCache(tmp_path, small_resnet, get_policy("dtr"))
    process = subprocess.Popen([sys.executable, "-c", KILLED_SWEEP, str(TRACES / "resnet32-b8.jsonl.gz"), str(tmp_path)],
                               env={**os.environ, "PYTHONPATH": str(ROOT)})
    # No wall-clock limit: the sweep ends by itself (71 budgets), which fails the test if it was not killed first.
    while len(list(store.directory.glob("part-*.parquet"))) < 10:
        assert process.poll() is None, "the sweep ended before it could be killed"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    stored = set(store.load()["budget_bytes"])
    assert len(stored) >= 10

    resumed = sweep(small_resnet, "dtr", ratios="0.3:1.0:0.01", execution=Execution(cache=tmp_path, progress=False))
    assert len(resumed) == 71
    assert not set(count_runs) & stored
    assert len(count_runs) == 71 - len(stored)
    assert len(list(store.directory.glob("*.parquet"))) == 1  # compacted after the resumed sweep
    check = resumed.sample(5, random_state=0)
    for row in check.itertuples():
        assert simulate(small_resnet, "dtr", budget_bytes=row.budget_bytes).clock == row.clock


@pytest.mark.slow
def test_dask_local_cluster_matches_the_local_backend(small_resnet, tmp_path):
    distributed = pytest.importorskip("distributed")
    ratios = "0.3:1.0:0.05"
    local = sweep(small_resnet, "dtr", ratios=ratios, execution=Execution(jobs=2, cache=False, progress=False))
    # A Nanny writes its pre-spawn variables (OMP_NUM_THREADS, PYTHONHASHSEED, ...) into this process's own
    # os.environ before it spawns a worker (distributed/nanny.py, WorkerProcess.start); patch.dict puts them back.
    with mock.patch.dict(os.environ), distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        on_dask = sweep(small_resnet, "dtr", ratios=ratios,
                        execution=Execution(client=client, cache=False, progress=False))
        by_address = sweep(small_resnet, "dtr", ratios=[0.5],
                           execution=Execution(client=cluster.scheduler_address, cache=False, progress=False))
    pd.testing.assert_frame_equal(without_wall(on_dask), without_wall(local))
    assert by_address["clock"].tolist() == local.loc[local["ratio"] == 0.5, "clock"].tolist()


def test_cli_sweep_writes_parquet_and_holes_reads_it(tmp_path, capsys):
    from dtrlab.cli import main

    out = tmp_path / "sweep.parquet"
    log = TRACES / "resnet32-b8.jsonl.gz"
    assert main(["sweep", str(log), "--ratios", "0.3:0.5:0.1", "--cache", str(tmp_path / "c"), "--quiet",
                 "--out", str(out)]) == 0
    frame = pd.read_parquet(out)
    assert frame["ratio"].tolist() == [0.3, 0.4, 0.5]
    capsys.readouterr()
    assert main(["holes", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "resnet32-b8" in printed and "non_monotone_failures" in printed
    assert main(["sweep", str(log), "--ratios", "x"]) == 2


def test_an_interrupted_sweep_keeps_its_parts_and_does_no_clean_up(small_resnet, tmp_path, monkeypatch):
    """Ctrl-C mid-sweep: the finished runs stay in the cache as parts, and nothing runs after the
    interrupt that a second Ctrl-C (``timeout -s INT`` sends two) could cut short."""
    real_iter_runs = budget_sweep.iter_runs

    def interrupted(*args, **kwargs):
        for number, item in enumerate(real_iter_runs(*args, **kwargs)):
            if number == 3:
                raise KeyboardInterrupt
            yield item

    def no_compaction(self):
        raise AssertionError("an interrupted sweep compacted its cache")

    monkeypatch.setattr(budget_sweep, "iter_runs", interrupted)
    monkeypatch.setattr(SweepCache, "compact", no_compaction)
    with pytest.raises(KeyboardInterrupt):
        sweep(small_resnet, "dtr", ratios="0.3:1.0:0.1", execution=Execution(cache=tmp_path, progress=False))
    store = SweepCache(tmp_path, small_resnet, get_policy("dtr"))
    assert len(store.load()) == 3 and len(list(store.directory.glob("part-*.parquet"))) == 3
    monkeypatch.undo()
    assert len(sweep(small_resnet, "dtr", ratios="0.3:1.0:0.1",
                     execution=Execution(cache=tmp_path, progress=False))) == 8
    assert len(list(store.directory.glob("*.parquet"))) == 1


#: A sweep frame's dtypes: pandas' string dtype for text, int64 for counts, nullable Int64 for the caching
#: metrics (null under flat), float64 for ratios and overheads.
FRAME_DTYPES = {**{c: "str" for c in ("trace", "trace_hash", "policy", "policy_name", "policy_params", "status",
                                       "withhold", "eviction_sha256", "dtrlab_version", "memory", "memory_options",
                                       "oom_cause", "enforce", "device_capacity")},
                **{c: "int64" for c in ("budget_bytes", "clock", "evictions", "remats", "peak_memory", "remat_compute",
                                        "model_compute", "baseline_memory", "baseline_compute", "simulator_version")},
                **{c: "Int64" for c in ("fragmentation_evictions", "peak_reserved_bytes", "peak_allocated_bytes",
                                        "largest_free_block", "segments")},
                **{c: "float64" for c in ("ratio", "overhead", "overhead_limit", "wall_seconds",
                                          "fragmentation_at_peak")}}


@pytest.mark.parametrize("semantics", [Semantics(), Semantics("caching")], ids=["flat", "caching"])
def test_a_frame_has_the_same_dtypes_and_values_fresh_and_from_the_cache(small_resnet, tmp_path, semantics):
    # The frame is built column by column with these dtypes; a fresh run's row dicts and a cached row's must give
    # the same frame (an out-of-memory run leaves the caching metrics and the overhead null).
    run = dict(ratios=[0.05, 0.5, 1.0], semantics=semantics, execution=Execution(cache=tmp_path, progress=False))
    fresh, cached = sweep(small_resnet, "dtr", **run), sweep(small_resnet, "dtr", **run)
    assert fresh["status"].tolist()[0] != "pass" and fresh["status"].tolist()[-1] == "pass"
    # oom_cause: text under a caching model, nothing but None (object) under flat
    expected = {c: FRAME_DTYPES[c] for c in budget_sweep.COLUMNS}
    expected["oom_cause"] = "object" if semantics.memory == "flat" else "str"
    assert {c: str(d) for c, d in fresh.dtypes.items()} == expected
    pd.testing.assert_frame_equal(fresh, cached, check_exact=True)
    memory = fresh[["peak_reserved_bytes", "segments", "fragmentation_at_peak"]]
    assert memory.isna().all().all() if semantics.memory == "flat" else memory.iloc[-1].notna().all()
