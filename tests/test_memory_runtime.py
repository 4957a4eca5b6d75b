"""The runtime under memory models: flat unchanged, invariants of every model on random
traces (hypothesis), hand-derived fragmentation cases, address-aware policies, sweeps
(column and cache key), layouts over time and the CLI's --memory options.

Hand-built traces use 512 KiB tensors in one 2 MiB small-pool segment of the caching
model (budget 2 MiB: a second segment never fits). Clock and staleness follow
tests/test_handbuilt.py: the clock starts at 1, a parent's last access is the clock
when a child's computation starts, an output's the clock after it.
"""

import dataclasses
import hashlib
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dtrlab import simulate
from dtrlab.analysis.layouts import record_layouts
from dtrlab.cli import main
from dtrlab.memory import FlatModel, get_memory_model
from dtrlab.policies import Policy, get_policy
from dtrlab.runtime import OutOfMemory, Simulator, Thrash, baseline
from dtrlab.sweep import sweep
from dtrlab.sweep.cache import SweepCache, policy_fingerprint
from dtrlab.trace import LogBuilder
from test_properties import random_logs, random_traces
from dtrlab.runtime.semantics import Semantics
from dtrlab.sweep.execution import Execution

KIB = 1024
SEGMENT = 2048 * KIB  # a small-pool segment of the caching model


def outcome(result):
    failure = result.failure
    return (result.status, result.clock, result.remat_compute, result.peak_memory, result.evicted_storages,
            None if failure is None else (failure.kind, failure.step, failure.tensor, failure.requested_bytes))


# ---------------------------------------------------------------- flat is unchanged

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(trace=random_traces, fraction=st.floats(0.05, 1.2), policy=st.sampled_from(["dtr", "lru", "msps", "random"]))
def test_flat_model_through_the_block_path_decides_as_the_byte_counter(trace, fraction, policy):
    """A FlatModel instance takes the model path (blocks, placement loop) and must not change a decision."""
    budget = int(baseline(trace).peak_memory * fraction)
    counter = simulate(trace, policy, budget_bytes=budget)
    placed = simulate(trace, policy, budget_bytes=budget, semantics=Semantics(memory=FlatModel(budget)))
    assert outcome(placed) == outcome(counter)
    assert placed.fragmentation_evictions == 0
    assert simulate(trace, policy, budget_bytes=budget, semantics=Semantics(memory="flat")) == counter


def test_flat_runs_have_no_memory_metrics(small_resnet):
    result = simulate(small_resnet, "dtr", ratio=0.5)
    assert result.memory == "flat" and result.peak_reserved_bytes is None
    assert "memory" not in result.to_dict() and "fragmentation_evictions" not in result.to_dict()


# ------------------------------------------------------- invariants of every model

def scaled(trace, factor):
    """The trace with every size multiplied (random logs have 0-64 bytes; the caching model needs MiBs)."""
    ops = tuple(dataclasses.replace(op, sizes=tuple(s * factor for s in op.sizes)) for op in trace.operators)
    return dataclasses.replace(trace, operators=ops)


# (model, options, scale of the random sizes): 0-64 bytes become up to 2 MiB (both caching
# pools), or up to 32 MiB where max_split_size (> 20 MiB) must matter.
MODELS = [("flat", {}, 32 * KIB), ("aligned", {}, 32 * KIB), ("aligned", {"granularity": 4096}, 32 * KIB),
          ("caching", {}, 32 * KIB), ("caching", {"expandable_segments": True}, 32 * KIB),
          ("caching", {"expandable_segments": True}, 512 * KIB), ("caching", {}, 512 * KIB),
          ("caching", {"max_split_size": 22 * 1024 * KIB}, 512 * KIB),
          ("caching", {"roundup_power2_divisions": 4}, 32 * KIB)]


def new_model(memory, budget, options):
    """A fresh model (flat as a FlatModel instance, so that it takes the block path)."""
    return FlatModel(budget) if memory == "flat" else get_memory_model(memory, budget, **options)


def checked_model_replay(trace, policy, budget, memory, options):
    """Step through a replay under a model, checking the model and the accounting after every step."""
    model = new_model(memory, budget, options)
    sim = Simulator(trace, get_policy(policy), budget, baseline(trace).model_compute, memory_model=model)
    n = trace.n_tensors
    status = "pass"
    try:
        for _ in sim.steps():
            stats = model.stats()
            assert stats.allocated_bytes <= stats.reserved_bytes <= budget
            layout = model.layout()
            owners = []
            for previous, segment in zip([None] + layout, layout):
                if previous is not None:  # segments in address order, never overlapping
                    assert previous.address + previous.size <= segment.address
                address = segment.address
                for block in segment.blocks:  # blocks tile their segment: free + allocated = reserved
                    assert block.address == address and block.size > 0
                    address += block.size
                    if block.block_id is not None:
                        owners.append(block.block_id)
                        assert block.size >= model.request_bytes(block.requested)
                assert address == segment.address + segment.size
            if model.address_aware:
                assert sum(segment.size for segment in layout) == stats.reserved_bytes
            resident = [s for s in range(n) if sim.material[s] and sim.storage[s] == s and sim.size[s]]
            assert sorted(owners) == resident  # one block per resident storage, no temporaries left
            assert sim.charged == sum(model.request_bytes(sim.size[s]) for s in resident) <= budget
    except OutOfMemory:
        status = "oom"
    except Thrash:
        status = "thrash"
    return status, sim


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(log=random_logs(), fraction=st.floats(0.1, 1.6), model=st.sampled_from(MODELS),
       policy=st.sampled_from(["dtr", "lru", "coop", "dtr_fit"]))
def test_every_model_keeps_its_invariants_and_replays_deterministically(log, fraction, model, policy):
    memory, options, scale = model
    trace = scaled(log.trace("random"), scale)
    if policy in ("coop", "dtr_fit") and memory != "caching":
        policy = "dtr"
    budget = int(baseline(trace).peak_memory * fraction)
    status, sim = checked_model_replay(trace, policy, budget, memory, options)
    first = simulate(trace, policy, budget_bytes=budget, semantics=Semantics(memory=new_model(memory, budget, options)))
    assert first.status == status
    assert first == simulate(trace, policy, budget_bytes=budget,
                             semantics=Semantics(memory=new_model(memory, budget, options)))
    assert first.peak_allocated_bytes <= first.peak_reserved_bytes <= budget
    assert 0 <= first.fragmentation_at_peak < 1
    assert first.fragmentation_evictions <= first.evictions
    if status == "oom":
        assert first.failure.cause in ("bytes", "fragmentation")
        if first.failure.cause == "fragmentation" and memory != "caching":
            pytest.fail("a byte-counting model failed for fragmentation")


# ------------------------------------------------ hand-derived fragmentation cases

def two_holes():
    """Segment [a][b][c][d] (512 KiB each, addresses 0, 512K, 1M, 1.5M); b is released.

    Then h (0 bytes, time 100) ages d; g1 touches a, g2 touches c; e (1 MiB) is computed.
    Clock: a, b, c, d end at 11, 21, 31, 41; h at 141; g1 starts at 141 (a's last
    access), ends 151; g2 starts at 151 (c's), ends 161. At e (clock 161) the
    staleness is a 20, c 10, d 120, so h_DTR = 10 / (512K x staleness) orders d < a < c.
    """
    log = LogBuilder()
    log.constant("x", 0)
    for name in "abcd":
        log.call("f" + name, ["x"], [(name, 512 * KIB)], time=10)
    log.release("b")
    log.call("fh", ["x"], [("h", 0)], time=100)
    log.call("g1", ["a"], [("g1", 0)], time=10)
    log.call("g2", ["c"], [("g2", 0)], time=10)
    log.call("fe", ["x"], [("e", 1024 * KIB)], time=10)
    log.release("a", "c", "d", "e", "g1", "g2", "h")
    return log.trace("two_holes")


def test_flat_evicts_by_bytes_only():
    # a + c + d + e = 2.5 MiB > 2 MiB: evict the lowest score, d; then 2 MiB fits.
    result = simulate(two_holes(), "dtr", budget_bytes=SEGMENT)
    assert (result.status, result.evicted_storages) == ("pass", ("d",))


def test_caching_dtr_makes_a_fragmentation_eviction():
    # Bytes: evict d as under flat. Now 2 MiB are counted, but the free blocks are
    # [512K, 1M) and [1.5M, 2M): no 1 MiB block, and a second segment exceeds the
    # budget. Evict by score again: a (staleness 20 < c's 10 in h): [0, 1M) is free.
    result = simulate(two_holes(), "dtr", budget_bytes=SEGMENT, semantics=Semantics(memory="caching"))
    assert (result.status, result.evicted_storages, result.fragmentation_evictions) == ("pass", ("d", "a"), 1)
    assert (result.peak_reserved_bytes, result.segments) == (SEGMENT, 1)


def test_coop_evicts_one_window():
    # Placement fails first. Windows of >= 1 MiB: {a, free} costs h(a) = 10/20, {free, c}
    # 10/10, {c, d} 10/10 + 10/120: Coop evicts a alone, and e takes [0, 1M). The bytes
    # did not fit when it chose (1.5 + 1 MiB), so this is no fragmentation eviction.
    result = simulate(two_holes(), "coop", budget_bytes=SEGMENT, semantics=Semantics(memory="caching"))
    assert (result.status, result.evicted_storages, result.fragmentation_evictions) == ("pass", ("a",), 0)


def test_dtr_fit_tiers_by_fitting_runs():
    # Bytes phase (no tiers): h over the free run each eviction opens: a 10/(1M x 20),
    # c 10/(1M x 10), d 10/(512K x 120): d. Placement phase: runs a = 1M, c = 1.5M both
    # hold 1 MiB; a 10/(1M x 20) < c 10/(1.5M x 10): a.
    result = simulate(two_holes(), "dtr_fit", budget_bytes=SEGMENT, semantics=Semantics(memory="caching"))
    assert (result.status, result.evicted_storages, result.fragmentation_evictions) == ("pass", ("d", "a"), 1)


def locked_holes():
    """[a][b][c][d], b and d released, then e (1 MiB) = f(a, c): a and c are locked."""
    log = LogBuilder()
    log.constant("x", 0)
    for name in "abcd":
        log.call("f" + name, ["x"], [(name, 512 * KIB)], time=10)
    log.release("b", "d")
    log.call("fe", ["a", "c"], [("e", 1024 * KIB)], time=10)
    log.release("a", "c", "e")
    return log.trace("locked_holes")


def test_bytes_fit_but_no_block_does_is_a_fragmentation_oom():
    assert simulate(locked_holes(), "dtr", budget_bytes=SEGMENT).passed  # 1 + 1 MiB fit the byte counter
    result = simulate(locked_holes(), "dtr", budget_bytes=SEGMENT, semantics=Semantics(memory="caching"))
    failure = result.failure
    assert (result.status, failure.cause, failure.candidates, failure.requested_bytes) == (
        "oom", "fragmentation", 0, 1024 * KIB)
    assert failure.largest_free_block == 512 * KIB
    # Below the bytes the same OOM is a byte shortfall.
    short = simulate(locked_holes(), "dtr", budget_bytes=SEGMENT - 512, semantics=Semantics(memory="aligned"))
    assert (short.status, short.failure.cause) == ("oom", "bytes")


def test_locked_blocks_break_coop_windows():
    # a and c are locked: every window holds only free blocks, none fits, and no segment
    # is wholly evictable: no candidate is offered at all, so the run fails as under DTR.
    result = simulate(locked_holes(), "coop", budget_bytes=SEGMENT, semantics=Semantics(memory="caching"))
    assert (result.status, result.failure.cause, result.evicted_storages) == ("oom", "fragmentation", ())


class RecordRequests(Policy):
    """h_DTR's choice, recording what the runtime asked to place."""

    name = "record_requests"
    features = frozenset({"e_star"})

    def start(self, sim):
        self.requests = []
        self.dtr = get_policy("dtr")

    def choose(self, sim, candidates):
        self.requests.append(sim.request)
        return self.dtr.choose(sim, candidates)


def test_the_simulator_tells_the_policy_what_to_place():
    policy = RecordRequests()
    simulate(two_holes(), policy, budget_bytes=SEGMENT, semantics=Semantics(memory="caching"))
    e = two_holes().tensor_names.index("e")
    byte_phase, placement = policy.requests
    assert (byte_phase.tensor, byte_phase.blocks, byte_phase.needed, byte_phase.bytes_fit) == (
        e, ((e, 1024 * KIB),), 1024 * KIB, False)
    assert (placement.block, placement.bytes_fit) == ((e, 1024 * KIB), True)


def test_address_aware_policies_refuse_byte_counting_models(small_resnet):
    for policy in ("coop", "dtr_fit"):
        for memory in ("flat", "aligned"):
            with pytest.raises(ValueError, match="needs an address-aware memory model"):
                simulate(small_resnet, policy, ratio=0.5, semantics=Semantics(memory=memory))


def test_bad_memory_arguments_list_the_valid_ones(small_resnet):
    with pytest.raises(ValueError, match=r"unknown memory model 'cachin' \(did you mean 'caching'\?\); valid models: aligned, caching, flat"):
        simulate(small_resnet, ratio=0.5, semantics=Semantics(memory="cachin"))
    with pytest.raises(ValueError, match="valid options for 'caching': address_policy, expandable_segments, limit_check, max_split_size"):
        simulate(small_resnet, ratio=0.5, semantics=Semantics(memory="caching", memory_options={"expandable": True}))
    with pytest.raises(ValueError, match="does not apply to the 'aligned' model"):
        simulate(small_resnet, ratio=0.5,
                 semantics=Semantics(memory="aligned", memory_options={"expandable_segments": True}))
    used = get_memory_model("caching", 10**9)
    used.allocate(1, 4096)
    with pytest.raises(ValueError, match="already holds blocks"):
        simulate(small_resnet, budget_bytes=10**9, semantics=Semantics(memory=used))


def test_caching_runs_report_their_metrics(small_resnet):
    result = simulate(small_resnet, "dtr", ratio=0.6, semantics=Semantics(memory="caching"))
    record = result.to_dict()
    assert record["memory"] == "caching" and record["memory_options"]["expandable_segments"] is False
    assert 0 < result.peak_allocated_bytes <= result.peak_reserved_bytes <= result.budget_bytes
    assert result.peak_reserved_bytes % SEGMENT == 0  # this trace uses the small pool only
    assert 0 < result.fragmentation_evictions <= result.evictions
    assert result.segments == result.peak_reserved_bytes // SEGMENT


# ----------------------------------------------------------------- layouts over time

def test_layouts_over_time_show_the_fragmentation_failure():
    layouts = record_layouts(locked_holes(), "dtr", budget_bytes=SEGMENT, semantics=Semantics(memory="caching"))
    assert layouts.status == "oom" and layouts.failure.cause == "fragmentation"
    at_failure = layouts.blocks[layouts.blocks["step"] == layouts.failure.step]
    assert at_failure[["address", "size", "storage", "state"]].values.tolist() == [
        [0, 512 * KIB, "a", "allocated"], [512 * KIB, 512 * KIB, "", "free"],
        [1024 * KIB, 512 * KIB, "c", "allocated"], [1536 * KIB, 512 * KIB, "", "free"]]
    with pytest.raises(ValueError, match="keeps no blocks"):
        record_layouts(locked_holes(), "dtr", budget_bytes=SEGMENT, semantics=Semantics(memory="flat"))


# ------------------------------------------------------------------------- sweeps

def test_sweep_frames_carry_the_memory_model_and_flat_keys_stay(tmp_path, small_resnet):
    flat = sweep(small_resnet, "dtr", ratios=[0.5], execution=Execution(cache=tmp_path, progress=False))
    assert (flat["memory"].tolist(), flat["memory_options"].tolist()) == (["flat"], [""])
    assert flat["fragmentation_evictions"].isna().all()
    caching = sweep(small_resnet, "dtr", ratios=[0.5], semantics=Semantics(memory="caching"),
                    execution=Execution(cache=tmp_path, progress=False))
    row = caching.iloc[0]
    assert row["memory"] == "caching" and json.loads(row["memory_options"])["max_split_size"] is None
    direct = simulate(small_resnet, "dtr", ratio=0.5, semantics=Semantics(memory="caching"))
    assert (row["evictions"], row["fragmentation_evictions"], row["peak_reserved_bytes"]) == (
        direct.evictions, direct.fragmentation_evictions, direct.peak_reserved_bytes)

    policy = get_policy("dtr")
    # The flat key is exactly the key from before memory models existed.
    config = {"policy": policy_fingerprint(policy), "overhead_limit": 2.0, "withhold": []}
    old_key = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:24]
    assert SweepCache(tmp_path, small_resnet, policy).directory.name == old_key
    keys = {SweepCache(tmp_path, small_resnet, policy,
                       Semantics(memory=memory, memory_options=options), None).directory.name
            for memory, options in [("caching", get_memory_model("caching", 0).options()),
                                    ("caching", {**get_memory_model("caching", 0).options(),
                                                 "expandable_segments": True}),
                                    ("aligned", {"granularity": 512})]}
    assert len(keys) == 3 and old_key not in keys
    # Default options written out or left implicit share one cache entry.
    again = sweep(small_resnet, "dtr", ratios=[0.5],
                  semantics=Semantics(memory="caching", memory_options={"expandable_segments": False}),
                  execution=Execution(cache=tmp_path, progress=False))
    assert again["wall_seconds"].tolist() == caching["wall_seconds"].tolist()


# ---------------------------------------------------------------------------- CLI

def test_cli_memory_options(tmp_path, capsys):
    path = tmp_path / "two_holes.log"
    log = LogBuilder()
    log.constant("x", 0)
    log.call("f", ["x"], [("a", 512 * KIB)], time=10)
    log.write(path)
    assert main(["run", str(path), "--budget", str(SEGMENT), "--memory", "caching", "--memory-option",
                 "expandable_segments=true", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["memory"] == "caching" and record["memory_options"]["expandable_segments"] is True
    for command in (["run", str(path), "--budget", "100"], ["sweep", str(path), "--ratios", "0.5", "--no-cache"],
                    ["census", str(tmp_path), "--no-refine", "--no-cache"], ["explain", str(path), "--budget", "1"],
                    ["variants", str(path), "--ratios", "0.5"]):
        assert main([*command, "--memory", "paged"]) == 2
        err = capsys.readouterr().err
        assert "unknown memory model 'paged'" in err and "valid models: aligned, caching, flat" in err
    assert main(["run", str(path), "--budget", "100", "--memory", "caching", "--memory-option", "granularity=8"]) == 2
    assert "does not apply to the 'caching' model (it belongs to 'aligned')" in capsys.readouterr().err
    assert main(["run", str(path), "--budget", "100", "--memory-option", "oops"]) == 2
    assert "--memory-option takes KEY=VALUE" in capsys.readouterr().err
    assert main(["run", str(path), "--budget", "100", "--policy", "coop"]) == 2
    assert "needs an address-aware memory model" in capsys.readouterr().err
