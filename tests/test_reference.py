"""Fidelity: every outcome simrd recorded in ../shared/reference is reproduced exactly."""

import pytest

from conftest import RESNET_LOG, UNET_LOG, read_jsonl
from dtrlab import simulate
from dtrlab.policies import get_policy
from dtrlab.runtime import baseline, compiled

FIELDS = ("status", "budget", "clock", "remat_compute", "peak_memory", "evictions", "eviction_sha256")


def _check(records, load_shared_log, regions="auto", engine="auto"):
    mismatches = []
    for record in records:
        trace = load_shared_log(record["log"])
        base = baseline(trace)
        assert (base.peak_memory, base.model_compute) == (record["baseline_memory"], record["baseline_compute"])
        result = simulate(trace, record["heuristic"], ratio=record["ratio"], regions=regions, engine=engine)
        got = {"status": result.status, "budget": result.budget_bytes, "clock": result.clock,
               "remat_compute": result.remat_compute, "peak_memory": result.peak_memory,
               "evictions": result.evictions, "eviction_sha256": result.eviction_sha256}
        expected = {field: record[field] for field in FIELDS}
        if got != expected or list(result.evicted_storages[:10]) != record["first_evictions"]:
            mismatches.append((record["log"], record["heuristic"], record["ratio"], got, expected))
    assert not mismatches, mismatches[:3]


@pytest.fixture(scope="module")
def outcomes(reference_dir):
    return read_jsonl(reference_dir / "simrd-outcomes.jsonl")


@pytest.mark.shared
@pytest.mark.parametrize("log_prefix", ["inceptionv4", "lstm", "resnet32", "transformer", "treelstm",
                                        "tv_densenet121", "unet", "unroll_gan"])
def test_simrd_outcomes(outcomes, load_shared_log, log_prefix):
    records = [r for r in outcomes if r["log"].startswith(log_prefix)]
    assert records, f"no reference records for {log_prefix}"
    if compiled.available():  # simulate()'s default then takes the compiled core for every record
        trace = load_shared_log(records[0]["log"])
        assert {compiled.unsupported_reason(trace, get_policy(r["heuristic"])) for r in records} == {None}
    _check(records, load_shared_log)


@pytest.mark.shared
def test_resnet32_dtr_sweep(reference_dir, load_shared_log):
    records = read_jsonl(reference_dir / "resnet32-dtr-sweep.jsonl")
    assert len(records) == 191
    assert [r["ratio"] for r in records] == [0.05 + 0.95 * i / 190 for i in range(191)]
    _check(records, load_shared_log)


@pytest.mark.shared
@pytest.mark.slow
def test_pure_python_region_index_matches_simrd_too(outcomes, load_shared_log):
    """The readable region index is a second, independent path to the same decisions."""
    records = [r for r in outcomes if r["log"] in (RESNET_LOG, UNET_LOG)]
    _check(records, load_shared_log, regions="python")


@pytest.mark.shared
@pytest.mark.slow
def test_python_simulator_matches_simrd_on_every_record(outcomes, load_shared_log):
    """The readable reference simulator (with the compiled region index) reaches the same outcomes."""
    _check(outcomes, load_shared_log, engine="python")
