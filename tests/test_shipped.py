"""The shipped results (results/shipped/) are checked, not trusted.

Every file matches MANIFEST.json (sha256 and size), and a file that does not is
ignored at run time. A sample of the rows (every trace, at least 10 budgets each,
every configuration) is recomputed and compared field by field; slow tests
recompute every row. A row whose simulator version, trace hash or config key does
not match is never used.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

import dtrlab.analysis.interventions as interventions
import dtrlab.integrity as integrity
import dtrlab.sweep.budget_sweep as budget_sweep
from dtrlab.analysis import single_tensor_search
from dtrlab.policies import get_policy
from dtrlab.runtime import SIMULATOR_VERSION, Intervention, budget_for, memory_spec
from dtrlab.sweep import SweepCache, parse_ratios, sweep
from dtrlab.sweep.cache import policy_fingerprint
from dtrlab.sweep.cache import rows_from_cache
from dtrlab.sweep.shipped import (DEFAULT_SHIPPED_DIR, METADATA_KEY, RECOMPUTE_ENV, SHIPPED_ENV,
                                  bundle_table, read_metadata, shipped_dir, write_bundle_file)
from dtrlab.trace import load_directory
from dtrlab.runtime.semantics import Semantics
from dtrlab.sweep.execution import Execution

ROOT = Path(__file__).resolve().parent.parent
TRACES_BUNDLE = sorted((DEFAULT_SHIPPED_DIR / "traces").glob("*.parquet"))
LOGS_BUNDLE = sorted((DEFAULT_SHIPPED_DIR / "dtr-logs").glob("*.parquet"))
MODELS_BUNDLE = sorted((DEFAULT_SHIPPED_DIR / "models").glob("*.parquet"))
#: Fields that differ between two runs of the same simulation.
UNCOMPARED = {"wall_seconds"}
SAMPLE_BUDGETS = 10
#: Budgets per non-flat configuration of the DTR logs' bundle that the slow test recomputes.
NON_FLAT_SAMPLE = 10
#: The census grids of notebook 01 (also 03, 05 and 07) and 02 (delta = 0.001), by default.
CENSUS_GRID, FINE_CENSUS_GRID = "0.05:1.0:0.005", "0.05:1.0:0.001"


@pytest.fixture(autouse=True)
def _shipped_layer_in_use(monkeypatch):
    monkeypatch.delenv(RECOMPUTE_ENV, raising=False)
    monkeypatch.delenv(SHIPPED_ENV, raising=False)


@pytest.fixture(scope="module")
def shipped_traces():
    return load_directory(ROOT / "traces")


@pytest.fixture(scope="module")
def log_traces(logs_dir):
    return load_directory(logs_dir)


def _bundle_rows(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path)


def _policy(key: dict):
    """The policy instance a cache key describes: its registered name (the label's) and parameters,
    of the class the key names (a moved class keeps its old name, ``Policy.cache_class``)."""
    policy = get_policy(key["policy"]["label"].split("(", 1)[0], **json.loads(key["policy"]["params"]))
    assert policy_fingerprint(policy)["class"] == key["policy"]["class"]
    return policy


def _intervention(key: dict) -> Intervention | None:
    if not (key["withhold"] or key.get("pin") or key.get("force_evict")):
        return None
    return Intervention(withhold=frozenset(key["withhold"]), pin=tuple(map(tuple, key.get("pin", []))),
                        force_evict=tuple(map(tuple, key.get("force_evict", []))))


def recompute_and_compare(path: Path, trace, rows: pd.DataFrame, tmp_path: Path, jobs: int = 1) -> int:
    """Simulate every row of ``rows`` again and assert each stored field equals the new one; returns the count."""
    configs = read_metadata(path)["configs"]
    compared = 0
    for config_key, group in rows.groupby("config_key"):
        key = configs[config_key]
        policy, intervention = _policy(key), _intervention(key)
        semantics = Semantics(memory=key.get("memory", "flat"), memory_options=key.get("memory_options"),
                              overhead_limit=key["overhead_limit"],
                              **{k: key[k] for k in ("enforce", "device_capacity") if k in key})  # under `allocated`
        # The rebuilt configuration is the stored one: the cache key hashes the same.
        assert SweepCache(tmp_path, trace, policy, semantics, intervention).config_key == config_key
        fresh = sweep(trace, policy, budgets=group["budget_bytes"].tolist(), intervention=intervention,
                      semantics=semantics, execution=Execution(cache=False, progress=False, jobs=jobs))
        fields = [c for c in key["row_columns"] if c not in UNCOMPARED]
        stored = _missing_as_none(group[fields].reset_index(drop=True))
        pd.testing.assert_frame_equal(_missing_as_none(fresh[fields].reset_index(drop=True)), stored,
                                      check_dtype=False, obj=f"{path.name} {key['policy']['label']}")
        compared += len(group)
    return compared


def _missing_as_none(frame: pd.DataFrame) -> pd.DataFrame:
    # A column with no value (e.g. oom_cause where every run passed) reads back from parquet as
    # NaN in a string column, and comes fresh from a sweep as None: both mean "no value".
    return frame.astype(object).where(frame.notna(), None)


def sample(rows: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """One row of every configuration, then more until the sample holds SAMPLE_BUDGETS distinct budgets."""
    rng = random.Random(seed)
    chosen = {rng.choice(list(group.index)) for _, group in rows.groupby("config_key")}
    rest = [i for i in rows.index if i not in chosen]
    rng.shuffle(rest)
    while rows.loc[sorted(chosen), "budget_bytes"].nunique() < min(SAMPLE_BUDGETS, rows["budget_bytes"].nunique()):
        chosen.add(rest.pop())
    return rows.loc[sorted(chosen)]


def _trace_of(path: Path, traces: dict):
    metadata = read_metadata(path)
    trace = traces[metadata["trace"]]
    assert trace.content_hash == metadata["trace_hash"], (
        f"{path} was shipped for another version of {metadata['trace']}; run dtrlab ship results")
    return trace


# ------------------------------------------------------------------ every shipped file is the one of the manifest
def test_every_shipped_file_matches_the_manifest():
    """Fails when a shipped file was edited, added or removed without dtrlab ship results (or
    dtrlab ship search) recording it: the shipped layer would ignore it at run time."""
    listed = integrity.read_manifest(DEFAULT_SHIPPED_DIR)
    present = {p.relative_to(DEFAULT_SHIPPED_DIR).as_posix() for p in DEFAULT_SHIPPED_DIR.rglob("*")
               if p.is_file() and p.name != integrity.MANIFEST_NAME and not p.name.startswith(".")}
    assert sorted(present - set(listed)) == [], "shipped files missing from results/shipped/MANIFEST.json"
    assert sorted(set(listed) - present) == [], "files of results/shipped/MANIFEST.json missing"
    for name, entry in listed.items():
        data = (DEFAULT_SHIPPED_DIR / name).read_bytes()
        assert (len(data), integrity.sha256_bytes(data)) == (entry["size"], entry["sha256"]), \
            f"results/shipped/{name} does not match MANIFEST.json"


# ------------------------------------------------------------------ the bundle is current and covers the notebooks
def test_bundle_is_in_the_repository_for_every_shipped_trace(shipped_traces):
    assert [p.stem for p in TRACES_BUNDLE] == sorted(shipped_traces), "run dtrlab ship results"
    total = sum(p.stat().st_size for p in DEFAULT_SHIPPED_DIR.rglob("*.parquet"))
    # 6.9 MB on 1 December 2026, after notebook 10's sweeps of the five searched policies joined
    # traces/ (0.002) and traces/models (0.005, eight policies); 8.3 MB on 2 December, after the
    # allocator census of traces/models (notebook 08, 14 configurations, 1.2 MB); 10.1 MB on 6 December, after the
    # nine Inductor censuses lowered for an H100 (knob/*/inductor-H100-80GB/, 0.28 MB).
    assert total < 11e6, f"the bundle is {total / 1e6:.1f} MB; keep it a few MB"


@pytest.mark.parametrize("path", TRACES_BUNDLE + LOGS_BUNDLE + MODELS_BUNDLE, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_bundle_rows_are_of_this_simulator_and_trace(path):
    metadata = read_metadata(path)
    rows = _bundle_rows(path)
    assert metadata["simulator_version"] == SIMULATOR_VERSION, (
        f"{path} holds simulator v{metadata['simulator_version']} results, the simulator is v{SIMULATOR_VERSION}: "
        "regenerate the bundle with dtrlab ship results")
    assert (rows["simulator_version"] == SIMULATOR_VERSION).all()
    assert (rows["trace_hash"] == metadata["trace_hash"]).all()
    assert set(rows["config_key"]) == set(metadata["configs"])
    assert not rows.duplicated(["config_key", "budget_bytes"]).any()


def test_bundle_covers_the_notebooks_grids(shipped_traces, tmp_path):
    """Notebook 01's and 02's DTR grids, 04's policies and 06's ratios are all shipped (the notebooks' defaults)."""
    from dtrlab.analysis.variant_census import DEFAULT_POLICIES

    wanted = [("dtr", {}, CENSUS_GRID), ("dtr", {}, FINE_CENSUS_GRID)]
    wanted += [(p, {}, "0.05:1.0:0.01") for p in DEFAULT_POLICIES]
    wanted += [(p, {}, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0])
               for p in ["dtr", "dtr_eq_class", "dtr_local", "msps", "lru", "largest_storage"]]
    wanted += [("random", {"seed": s}, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]) for s in range(10)]
    for path in TRACES_BUNDLE:
        trace = _trace_of(path, shipped_traces)
        rows = _bundle_rows(path)
        for policy, params, ratios in wanted:
            config_key = SweepCache(tmp_path, trace, get_policy(policy, **params)).config_key
            shipped = set(rows.loc[rows["config_key"] == config_key, "budget_bytes"])
            missing = {budget_for(trace, r) for r in parse_ratios(ratios)} - shipped
            assert not missing, f"{path.stem} {policy}{params}: {len(missing)} budgets not shipped"


def test_dtr_log_census_is_shipped(log_traces, tmp_path):
    """The censuses behind figures/dtr-logs: DTR on notebook 01's and 02's grids, and every
    configuration of notebook 08's allocator census on its grid."""
    from dtrlab.analysis.allocator_census import DEFAULT_CONFIGS

    assert sorted(p.stem for p in LOGS_BUNDLE) == sorted(log_traces), "run dtrlab ship results"
    wanted = [("dtr", {}, CENSUS_GRID), ("dtr", {}, FINE_CENSUS_GRID)]
    wanted += [(c.policy, {**dict(zip(("memory", "memory_options"), memory_spec(c.memory, c.options, c.enforce))),
                           **({"enforce": c.enforce, "device_capacity": c.device_label} if c.device_label else {})},
                CENSUS_GRID) for c in DEFAULT_CONFIGS if c.memory != "flat"]
    for path in LOGS_BUNDLE:
        trace = _trace_of(path, log_traces)
        rows = _bundle_rows(path)
        for policy, memory, grid in wanted:
            config_key = SweepCache(tmp_path, trace, get_policy(policy), Semantics(**memory)).config_key
            shipped = set(rows.loc[rows["config_key"] == config_key, "budget_bytes"])
            assert {budget_for(trace, r) for r in parse_ratios(grid)} <= shipped, \
                f"{path.stem}: {policy} {memory} {grid}"


def test_models_allocator_census_is_shipped(tmp_path):
    """Every configuration of notebook 08's census of today's models (its defaults on traces/models) on
    its grid, so that the notebook opens there in seconds."""
    from dtrlab.analysis.allocator_census import MODELS_GPU, MODELS_POLICIES, census_configs

    models = load_directory(ROOT / "traces" / "models")
    assert sorted(p.stem for p in MODELS_BUNDLE) == sorted(models), \
        "run dtrlab ship results --allocator-census models"
    configs = census_configs(MODELS_POLICIES, gpu=MODELS_GPU)
    wanted = [(c.policy, dict(zip(("memory", "memory_options"), memory_spec(c.memory, c.options, c.enforce)))
               | ({"enforce": c.enforce, "device_capacity": c.device_label} if c.device_label else {}))
              for c in configs]
    for path in MODELS_BUNDLE:
        trace = _trace_of(path, models)
        rows = _bundle_rows(path)
        for policy, memory in wanted:
            config_key = SweepCache(tmp_path, trace, get_policy(policy), Semantics(**memory)).config_key
            shipped = set(rows.loc[rows["config_key"] == config_key, "budget_bytes"])
            assert {budget_for(trace, r) for r in parse_ratios(CENSUS_GRID)} <= shipped, \
                f"{path.stem}: {policy} {memory} {CENSUS_GRID}"


# ------------------------------------------------------------------ recomputed field by field
@pytest.mark.parametrize("path", TRACES_BUNDLE, ids=lambda p: p.stem)
def test_sample_of_shipped_rows_recomputes_field_by_field(path, shipped_traces, tmp_path):
    rows = sample(_bundle_rows(path))
    assert rows["budget_bytes"].nunique() >= SAMPLE_BUDGETS
    assert set(rows["config_key"]) == set(read_metadata(path)["configs"])  # every policy involved
    assert recompute_and_compare(path, _trace_of(path, shipped_traces), rows, tmp_path) == len(rows)


@pytest.mark.parametrize("path", LOGS_BUNDLE, ids=lambda p: p.stem.split("-")[0])
def test_sample_of_dtr_log_census_recomputes_field_by_field(path, log_traces, tmp_path):
    rows = sample(_bundle_rows(path))
    assert rows["budget_bytes"].nunique() >= SAMPLE_BUDGETS
    assert recompute_and_compare(path, _trace_of(path, log_traces), rows, tmp_path) == len(rows)


#: Processes for the two full recomputes: one. make test-all runs the slow files on every core already, and a pool per
#: configuration (hundreds of them) costs CPU: unroll_gan-b64's rows took 61 s of CPU on two processes against 52 s on
#: one (6 December, the other core busy; 48 s and 52 s of wall time).
RECOMPUTE_JOBS = 1


@pytest.mark.slow
def test_every_shipped_trace_row_recomputes(shipped_traces, tmp_path):
    for path in TRACES_BUNDLE:
        rows = _bundle_rows(path)
        assert recompute_and_compare(path, _trace_of(path, shipped_traces), rows, tmp_path,
                                     jobs=RECOMPUTE_JOBS) == len(rows)


@pytest.mark.slow
def test_every_shipped_dtr_log_census_row_recomputes(log_traces, tmp_path):
    """Every row of the flat census (notebooks 01 and 02), and NON_FLAT_SAMPLE budgets of each
    configuration of notebook 08's allocator census: all of them take most of an hour on 2 cores
    even compiled (dtrlab ship results recomputes them)."""
    for path in LOGS_BUNDLE:
        rows, configs = _bundle_rows(path), read_metadata(path)["configs"]
        non_flat = rows["config_key"].map(lambda key: configs[key].get("memory", "flat") != "flat")
        checked = pd.concat([rows[~non_flat]] + [group.sample(min(NON_FLAT_SAMPLE, len(group)), random_state=1)
                                                 for _, group in rows[non_flat].groupby("config_key")])
        assert recompute_and_compare(path, _trace_of(path, log_traces), checked, tmp_path,
                                     jobs=RECOMPUTE_JOBS) == len(checked)


# ------------------------------------------------------------------ a stale row is never used
@pytest.fixture()
def small_bundle(small_resnet, tmp_path, monkeypatch):
    """A bundle of four DTR budgets of the small ResNet in tmp_path, in use; returns (budgets, fresh frame)."""
    budgets = [budget_for(small_resnet, r) for r in (0.3, 0.5, 0.7, 0.9)]
    monkeypatch.setenv(RECOMPUTE_ENV, "1")
    fresh = sweep(small_resnet, "dtr", budgets=budgets,
                  execution=Execution(cache=tmp_path / "computed", progress=False))
    monkeypatch.delenv(RECOMPUTE_ENV)
    monkeypatch.setenv(SHIPPED_ENV, str(tmp_path / "bundle"))

    def ship(edit=None, manifest=True) -> None:
        """Pack the computed rows (``edit``ed first) into the bundle; record them in its manifest unless not."""
        rows, configs = rows_from_cache(tmp_path / "computed", small_resnet.content_hash)
        if edit:
            edit(rows)
        table = bundle_table(rows, trace=small_resnet.name, trace_hash=small_resnet.content_hash, configs=configs)
        path = tmp_path / "bundle" / "traces" / f"{small_resnet.name}.parquet"
        write_bundle_file(table, path)
        if manifest:
            integrity.write_manifest(tmp_path / "bundle", [path])

    return budgets, fresh, ship


@pytest.fixture()
def simulated(monkeypatch):
    """The budgets every sweep of the test actually simulates."""
    budgets = []
    real = budget_sweep.iter_runs

    def spy(trace, specs, **options):
        budgets.extend(spec.budget_bytes for spec in specs)
        return real(trace, specs, **options)

    monkeypatch.setattr(budget_sweep, "iter_runs", spy)
    return budgets


def _same_results(a: pd.DataFrame, b: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(a.drop(columns="wall_seconds"), b.drop(columns="wall_seconds"))


def test_valid_shipped_rows_are_used_without_simulating(small_resnet, small_bundle, simulated, tmp_path):
    budgets, fresh, ship = small_bundle
    ship()
    frame = sweep(small_resnet, "dtr", budgets=budgets, execution=Execution(cache=tmp_path / "empty", progress=False))
    assert simulated == []
    pd.testing.assert_frame_equal(frame, fresh)  # wall seconds too: these are the shipped rows
    assert not (tmp_path / "empty").exists()  # the shipped layer is read-only: nothing copied up


@pytest.mark.parametrize("column, stale", [("simulator_version", SIMULATOR_VERSION + 1), ("trace_hash", "0" * 64),
                                           ("config_key", "f" * 24)])
def test_stale_shipped_row_is_ignored_and_recomputed(column, stale, small_resnet, small_bundle, simulated, tmp_path):
    budgets, fresh, ship = small_bundle

    def edit(rows):
        rows.loc[rows["budget_bytes"] == budgets[1], column] = stale

    ship(edit)
    frame = sweep(small_resnet, "dtr", budgets=budgets, execution=Execution(cache=tmp_path / "empty", progress=False))
    assert simulated == [budgets[1]]
    _same_results(frame, fresh)


def test_shipped_file_edited_after_its_manifest_is_ignored_and_recomputed(small_resnet, small_bundle, simulated,
                                                                          tmp_path):
    """A row edited with its keys kept (status and clock changed) is never served: the file no longer
    matches the manifest, so every budget of it is simulated, with one warning."""
    budgets, fresh, ship = small_bundle
    ship()

    def edit(rows):
        rows.loc[rows["budget_bytes"] == budgets[2], ["status", "clock"]] = ["oom", 111111111]

    ship(edit, manifest=False)
    with pytest.warns(UserWarning, match="ignoring a shipped file: .*(does not match its sha256|bytes where)"):
        frame = sweep(small_resnet, "dtr", budgets=budgets,
                      execution=Execution(cache=tmp_path / "empty", progress=False))
    assert sorted(simulated) == sorted(budgets)
    _same_results(frame, fresh)


@pytest.mark.parametrize("damage", ["no manifest", "damaged manifest", "unlisted file"])
def test_bundle_without_a_valid_manifest_entry_is_not_used(damage, small_resnet, small_bundle, simulated, tmp_path):
    budgets, fresh, ship = small_bundle
    ship()
    manifest = tmp_path / "bundle" / integrity.MANIFEST_NAME
    if damage == "no manifest":
        manifest.unlink()
    elif damage == "damaged manifest":
        manifest.write_bytes(manifest.read_bytes()[:-20])
    else:
        integrity.atomic_write_json(manifest, {"format": integrity.MANIFEST_FORMAT, "files": {}})
    with pytest.warns(UserWarning, match="MANIFEST.json"):
        frame = sweep(small_resnet, "dtr", budgets=budgets,
                      execution=Execution(cache=tmp_path / "empty", progress=False))
    assert sorted(simulated) == sorted(budgets)
    _same_results(frame, fresh)


def test_a_file_is_hashed_once_per_process_while_unchanged(small_resnet, small_bundle, tmp_path, monkeypatch):
    budgets, fresh, ship = small_bundle
    ship()
    hashed = []
    real = integrity.sha256_file
    monkeypatch.setattr(integrity, "sha256_file", lambda path: hashed.append(path) or real(path))
    integrity._cached_sha256.cache_clear()
    for _ in range(3):
        sweep(small_resnet, "dtr", budgets=budgets, execution=Execution(cache=tmp_path / "empty", progress=False))
        SweepCache(tmp_path / "empty", small_resnet, get_policy("dtr"),
                   Semantics(overhead_limit=3.0)).load()  # another key: same file
    assert len(hashed) == 1


def test_only_the_asked_traces_files_are_read_and_their_rows_served(small_resnet, small_bundle, simulated, tmp_path,
                                                                      monkeypatch):
    # A census of one trace set reads the rows of its own traces' files alone (the others' schemas only); what
    # it serves is still exactly the shipped rows. Another trace's file (the same rows under another hash) beside it.
    import dtrlab.sweep.shipped as shipped

    budgets, fresh, ship = small_bundle
    ship()
    rows, configs = rows_from_cache(tmp_path / "computed", small_resnet.content_hash)
    other = bundle_table(rows.assign(trace_hash="0" * 64), trace="other", trace_hash="0" * 64, configs=configs)
    write_bundle_file(other, tmp_path / "bundle" / "dtr-logs" / "other.parquet")
    integrity.write_manifest(tmp_path / "bundle", [tmp_path / "bundle" / "dtr-logs" / "other.parquet"])
    read = []
    real = shipped._read_valid
    monkeypatch.setattr(shipped, "_read_valid", lambda path: read.append(path.name) or real(path))
    frame = sweep(small_resnet, "dtr", budgets=budgets, execution=Execution(cache=tmp_path / "empty", progress=False))
    assert simulated == [] and read == [f"{small_resnet.name}.parquet"]
    pd.testing.assert_frame_equal(frame, fresh)
    key = SweepCache(tmp_path, small_resnet, get_policy("dtr")).config_key
    assert len(shipped.shipped_rows("0" * 64, key)) == len(budgets)
    assert read == [f"{small_resnet.name}.parquet", "other.parquet"]


def test_edited_result_with_current_version_and_hash_is_trusted_so_the_sample_test_catches_it(
        small_resnet, small_bundle, tmp_path):
    """A wrong value under a valid key is what the field-by-field recomputation exists for."""
    budgets, fresh, ship = small_bundle

    def edit(rows):
        rows.loc[rows["budget_bytes"] == budgets[2], "evictions"] += 1

    ship(edit)
    path = tmp_path / "bundle" / "traces" / f"{small_resnet.name}.parquet"
    with pytest.raises(AssertionError, match="evictions"):
        recompute_and_compare(path, small_resnet, _bundle_rows(path), tmp_path)


def test_recompute_variable_ignores_the_shipped_layer(small_resnet, small_bundle, simulated, monkeypatch, tmp_path):
    budgets, fresh, ship = small_bundle
    ship()
    assert shipped_dir() == tmp_path / "bundle"
    monkeypatch.setenv(RECOMPUTE_ENV, "1")
    assert shipped_dir() is None
    frame = sweep(small_resnet, "dtr", budgets=budgets, execution=Execution(cache=tmp_path / "empty", progress=False))
    assert sorted(simulated) == sorted(budgets)
    _same_results(frame, fresh)


# ------------------------------------------------------------------ shipped analysis tables (the intervention search)
TABLES_BUNDLE = sorted((DEFAULT_SHIPPED_DIR / "traces" / "tables").glob("*.parquet"))


def _search_inputs(path: Path, traces: dict):
    metadata = json.loads(pq.read_schema(path).metadata[METADATA_KEY])
    assert metadata["kind"] == "single_tensor_search" and metadata["simulator_version"] == SIMULATOR_VERSION
    trace = traces[metadata["trace"]]
    assert trace.content_hash == metadata["trace_hash"], f"{path} is stale; run dtrlab ship results"
    config = metadata["config"]
    return trace, _policy(config), config["budget_bytes"], config["overhead_limit"]


def test_notebook_03_search_is_shipped():
    assert len(TABLES_BUNDLE) >= 1, "notebook 03's intervention search is not shipped; run dtrlab ship results"


@pytest.mark.parametrize("path", TABLES_BUNDLE, ids=lambda p: p.stem)
def test_sample_of_shipped_search_recomputes_field_by_field(path, shipped_traces):
    trace, policy, budget, limit = _search_inputs(path, shipped_traces)
    shipped = pd.read_parquet(path)
    storages = random.Random(0).sample(list(shipped["storage"]), min(SAMPLE_BUDGETS, len(shipped)))
    fresh = single_tensor_search(trace, policy, budget_bytes=budget, storages=storages,
                                 semantics=Semantics(overhead_limit=limit),
                                 execution=Execution(progress=False, cache=False)).table
    expected = shipped[shipped["storage"].isin(storages)].reset_index(drop=True)
    pd.testing.assert_frame_equal(fresh, expected)


@pytest.mark.slow
@pytest.mark.parametrize("path", TABLES_BUNDLE, ids=lambda p: p.stem)
def test_every_shipped_search_row_recomputes(path, shipped_traces):
    trace, policy, budget, limit = _search_inputs(path, shipped_traces)
    fresh = single_tensor_search(trace, policy, budget_bytes=budget,
                                 semantics=Semantics(overhead_limit=limit),
                                 execution=Execution(jobs=os.cpu_count() or 1, progress=False, cache=False)).table
    pd.testing.assert_frame_equal(fresh, pd.read_parquet(path))


def test_search_table_is_cached_reused_and_never_trusted_when_stale(resnet_trace, tmp_path, monkeypatch):
    monkeypatch.setenv(SHIPPED_ENV, str(tmp_path / "bundle"))
    first = single_tensor_search(resnet_trace, "dtr", ratio=0.17,
                                 execution=Execution(cache=tmp_path / "cache", progress=False))
    (stored,) = (tmp_path / "cache").rglob("tables/*.parquet")
    calls, real = [], interventions.run_many
    monkeypatch.setattr(interventions, "run_many", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = single_tensor_search(resnet_trace, "dtr", ratio=0.17,
                                 execution=Execution(cache=tmp_path / "cache", progress=False))
    assert calls == [] and again.base == first.base
    pd.testing.assert_frame_equal(again.table, first.table)

    # Shipped (moved into the bundle) it is found there; with another simulator version it is not.
    (tmp_path / "bundle" / "traces" / "tables").mkdir(parents=True)
    shipped = tmp_path / "bundle" / "traces" / "tables" / stored.name
    stored.rename(shipped)
    with pytest.warns(UserWarning, match="ignoring the shipped file .*MANIFEST.json"):  # no manifest: not used
        single_tensor_search(resnet_trace, "dtr", ratio=0.17,
                             execution=Execution(cache=tmp_path / "cache2", progress=False))
    assert calls == [1]
    integrity.write_manifest(tmp_path / "bundle")
    again = single_tensor_search(resnet_trace, "dtr", ratio=0.17,
                                 execution=Execution(cache=tmp_path / "cache", progress=False))
    assert calls == [1]
    pd.testing.assert_frame_equal(again.table, first.table)
    table = pq.read_table(shipped)
    metadata = json.loads(table.schema.metadata[METADATA_KEY])
    metadata["simulator_version"] += 1
    pq.write_table(table.replace_schema_metadata({**table.schema.metadata,
                                                  METADATA_KEY: json.dumps(metadata).encode()}), shipped)
    integrity.write_manifest(tmp_path / "bundle")  # listed, so the version check is what rejects it
    recomputed = single_tensor_search(resnet_trace, "dtr", ratio=0.17,
                                      execution=Execution(cache=tmp_path / "cache", progress=False))
    assert calls == [1, 1]
    pd.testing.assert_frame_equal(recomputed.table, first.table)


# ------------------------------------------------------------------ notebook 11's real runs (results/shipped/execute/)
EXECUTE_BUNDLE = sorted((DEFAULT_SHIPPED_DIR / "execute").glob("*.json"))


@pytest.fixture(scope="module")
def notebook_11_runs():
    """Notebook 11's captured step and the budgets it executes, from its default parameters."""
    pytest.importorskip("torch")
    from dtrlab.analysis.holes import find_holes
    from dtrlab.execute import capture_step

    cells = json.loads((ROOT / "notebooks" / "11-real-execution.ipynb").read_text())["cells"]
    parameters = {}
    exec("".join(next(c for c in cells if "parameters" in c["metadata"].get("tags", []))["source"]), parameters)
    step = capture_step(parameters["model"], batch=parameters["batch"])
    census = sweep(step.trace, parameters["policy"], ratios=parameters["census_ratios"],
                   execution=Execution(cache=False, progress=False))
    hole = find_holes(census).holes.iloc[0]
    budgets = {"below": int(hole.pass_below_bytes), "hole": int(hole.fail_low_bytes),
               "above": int(hole.pass_above_bytes)}
    return step, budgets, parameters["policy"]


def test_every_shipped_real_run_is_a_listed_record():
    from dtrlab.execute.record import RECORD_FORMAT, from_record, record_path

    assert EXECUTE_BUNDLE, "notebook 11's real runs are not shipped; run dtrlab ship results --execute-only"
    for path in EXECUTE_BUNDLE:
        integrity.verify_in_manifest(path, DEFAULT_SHIPPED_DIR)
        record = integrity.read_json(path)
        assert record["format"] == RECORD_FORMAT
        assert record_path(path.parent, record["key"]) == path  # stored under its key's hash
        result = from_record(record)
        assert result.run.budget_bytes == record["key"]["budget_bytes"] and result.run.policy == record["key"]["policy"]
        assert record["made_on"]["machine"]  # whose wall times these are


def test_notebook_11_runs_are_shipped_and_match_a_fresh_real_run(notebook_11_runs):
    """Each of the notebook's three runs has a verified record of this torch, dtrlab and simulator; the
    hole's record holds the decisions of a real run made now (whole RunResult, memory timeline, every
    recomputation's operator and cost; only wall times differ)."""
    from dtrlab.execute import run_step
    from dtrlab.execute.record import load_shipped, record_key

    step, budgets, policy = notebook_11_runs
    shipped = {label: load_shipped(DEFAULT_SHIPPED_DIR, record_key(step, budget, policy=policy))
               for label, budget in budgets.items()}
    missing = [label for label, found in shipped.items() if found is None]
    assert not missing, f"no valid shipped record of {missing}: run dtrlab ship results --execute-only"
    record, _ = shipped["hole"]
    fresh = run_step(step, budget_bytes=budgets["hole"], policy=policy)
    assert record.run == fresh.run and record.status == "thrash"
    assert record.memory_timeline == fresh.memory_timeline
    assert [(r.operator, r.name, r.cost) for r in record.recomputations] == \
           [(r.operator, r.name, r.cost) for r in fresh.recomputations]


@pytest.mark.parametrize("damage", ["edited", "another key"])
def test_notebook_11_loader_refuses_a_damaged_record_and_runs_for_real(damage, notebook_11_runs, tmp_path,
                                                                       monkeypatch):
    import dtrlab.execute.record as record_module

    step, budgets, policy = notebook_11_runs
    key = record_module.record_key(step, budgets["hole"], policy=policy)
    bundle = tmp_path / "bundle"
    path = record_module.record_path(bundle / record_module.SHIPPED_SUBDIR, key)
    path.parent.mkdir(parents=True)
    shipped = integrity.read_json(record_module.record_path(DEFAULT_SHIPPED_DIR / record_module.SHIPPED_SUBDIR, key))
    integrity.atomic_write_json(path, shipped)
    integrity.write_manifest(bundle)
    ran, real_run_step = [], record_module.run_step
    monkeypatch.setattr(record_module, "run_step", lambda *a, **k: ran.append(1) or real_run_step(*a, **k))

    evictions = shipped["run"]["evictions"]
    kept = record_module.run_or_load(step, budgets["hole"], bundle=bundle, policy=policy)
    assert ran == [] and kept.run.evictions == evictions  # intact: used, not run
    if damage == "edited":  # decisions changed, the manifest not: the file no longer matches it
        shipped["run"]["evictions"] += 1
        integrity.atomic_write_json(path, shipped)
        match = "does not match|bytes where"
    else:  # listed in the manifest, but the record of another budget
        shipped["key"]["budget_bytes"] += 1
        integrity.atomic_write_json(path, shipped)
        integrity.write_manifest(bundle)
        match = "not the record of this run"
    with pytest.warns(UserWarning, match=f"ignoring the shipped real run .*({match})"):
        result = record_module.run_or_load(step, budgets["hole"], bundle=bundle, policy=policy)
    assert ran == [1] and result.run.evictions == evictions  # executed: the real decisions, not the edited ones


# ------------------------------------------------------------------ the shipped search CSVs (notebook 10)
SEARCH_CSVS = ["comparison.csv", "pareto.csv", "inclusion_pairs.csv", "inclusion_prediction.csv"]


def test_shipped_search_csvs_read_through_the_manifest():
    from dtrlab.search import read_shipped_csv

    for name in SEARCH_CSVS:
        assert len(read_shipped_csv(DEFAULT_SHIPPED_DIR / "search" / name)) > 0


@pytest.mark.parametrize("damage", ["edited", "unlisted", "no manifest"])
def test_edited_shipped_search_csv_is_refused_at_load(damage, tmp_path):
    from dtrlab.search import read_shipped_csv

    path = tmp_path / "comparison.csv"
    original = (DEFAULT_SHIPPED_DIR / "search" / "comparison.csv").read_bytes()
    path.write_bytes(original)
    integrity.write_manifest(tmp_path)
    pd.testing.assert_frame_equal(read_shipped_csv(path), pd.read_csv(DEFAULT_SHIPPED_DIR / "search" / "comparison.csv"))
    if damage == "edited":  # one digit changed, same size
        text = original.decode()
        at = next(i for i, ch in enumerate(text) if ch.isdigit() and i > text.index("\n"))
        path.write_text(text[:at] + str((int(text[at]) + 1) % 10) + text[at + 1:])
        match = "does not match its sha256"
    elif damage == "unlisted":
        integrity.atomic_write_json(tmp_path / integrity.MANIFEST_NAME,
                                    {"format": integrity.MANIFEST_FORMAT, "files": {}})
        match = "not listed"
    else:
        (tmp_path / integrity.MANIFEST_NAME).unlink()
        match = "MANIFEST.json"
    with pytest.raises(integrity.IntegrityError, match=f"refusing the shipped search result .*{match}"):
        read_shipped_csv(path)


@pytest.mark.slow
def test_notebook_14_census_is_served_for_its_default_model_and_recomputes():
    """The shipped census of notebook 14's default model (dtrlab ship knob --sets notebooks) is the one the notebook
    reads for that model, and a census computed here on the same plan equals it row for row."""
    import functools
    import warnings

    from dtrlab.analysis.knob_census import census_knob, shipped_census_for
    from dtrlab.memory.partitioned import knob_peaks
    from dtrlab.pipeline.ship_knob import NOTEBOOKS, build_options, capture_options, census_directory, notebook_plan
    from dtrlab.trace.torch_compile.tracing import trace_joint

    command, _ = NOTEBOOKS["14-fit-budget"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        joint = trace_joint(capture_options(command).model, **build_options(command))
        served, how = shipped_census_for(census_directory("notebooks", "aot_eager") / "14-fit-budget.json", joint,
                                         notebook_plan(), DEFAULT_SHIPPED_DIR)
        assert served is not None, how
        # In this process, not forked workers: earlier tests ran real steps here, and a child forked after torch's
        # OpenMP threads have run hangs in its first parallel region (seen: the partitioner's dp_knapsack).
        fresh = census_knob(functools.partial(knob_peaks, joint), notebook_plan(), name=served.name)
    pd.testing.assert_frame_equal(fresh.samples, served.samples)
