"""The compiled core under memory models decides exactly as the Python reference simulator.

Random traces (scaled so that both caching pools, segment sizes and max_split_size
matter) are replayed by both engines under every memory model and both budget
semantics; the clock, byte counter, eviction count, recompute and the model's
allocated and reserved bytes are compared after every schedule step, then the
evicted sequence, the failure record and every memory metric.
"""

import dataclasses
import math

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_compiled_core import RegionReads, assert_same_region_reads
from test_memory_runtime import MODELS, scaled
from test_properties import random_logs

from dtrlab import Semantics, simulate
from dtrlab.memory import CachingModel, MemoryModel, get_memory_model, register_memory_model
from dtrlab.memory.base import MEMORY_MODELS
from dtrlab.policies import get_policy
from dtrlab.runtime import OutOfMemory, Simulator, Thrash, baseline, compiled
from dtrlab.runtime.run import check_semantics, memory_model
from dtrlab.runtime.simulator import ALLOCATED, RESERVED

pytestmark = pytest.mark.skipif(not compiled.available(), reason="the compiled core is not built")

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
POLICIES = ["dtr", "dtr_eq_class", "msps", "lru", "random", "largest"]
DEVICES = [None, "1.0x", "1.25x"]


def run_model(memory, budget, options, enforce, device):
    """A fresh model as simulate() builds it for this run."""
    if memory == "flat" and not options and enforce == RESERVED:
        return get_memory_model("flat", budget)  # the block path, not the byte counter alone
    return memory_model(Semantics(memory=memory, memory_options=options, enforce=enforce), budget,
                        check_semantics(enforce, device))


def reference_replay(trace, policy, budget, remat_limit, model, enforce):
    sim = Simulator(trace, get_policy(policy), budget, remat_limit, memory_model=model, enforce=enforce,
                    recorder=RegionReads())
    steps, status = [], "pass"
    try:
        for _ in sim.steps():
            stats = model.stats()
            steps.append((sim.clock, sim.memory, len(sim.evicted), sim.remat_compute, stats.allocated_bytes,
                          stats.reserved_bytes))
    except OutOfMemory:
        status = "oom"
    except Thrash:
        status = "thrash"
    return status, sim, steps


def assert_same_memory_replay(trace, policy, budget, remat_limit, memory, options=None, enforce=RESERVED,
                              device=None):
    """Both engines under one memory model and semantics, compared after every step; returns the core's run."""
    options = options or {}
    model = run_model(memory, budget, options, enforce, device)
    status, sim, steps = reference_replay(trace, policy, budget, remat_limit, model, enforce)
    fresh = run_model(memory, budget, options, enforce, device)
    assert compiled.unsupported_reason(trace, get_policy(policy), model=fresh) is None
    core = compiled.run(trace, get_policy(policy), budget, remat_limit, record_steps=True, model=fresh,
                        enforce=enforce)
    assert core.steps == steps
    assert core.evicted == sim.evicted
    assert (core.status, core.clock, core.model_compute, core.remat_compute, core.peak_memory, core.remats) == (
        status, sim.clock, sim.model_compute, sim.remat_compute, sim.peak_memory, sim.remats)
    assert core.failure == sim.failure
    assert (core.fragmentation_evictions, core.peak_reserved, core.allocated_at_peak) == (
        sim.fragmentation_evictions, sim.peak_reserved, sim.allocated_at_peak)
    assert_same_region_reads(core, sim)
    assert core.memory_stats == model.stats()
    assert fresh.stats().allocated_bytes == 0  # the instance only described the model
    return core


@SETTINGS
@given(log=random_logs(), fraction=st.floats(0.05, 1.6), model=st.sampled_from(MODELS),
       policy=st.sampled_from(POLICIES), enforce=st.sampled_from([RESERVED, ALLOCATED]),
       device=st.sampled_from(DEVICES), overhead=st.sampled_from([0.5, 1.0, math.inf]),
       address_policy=st.sampled_from(["bump", "reuse"]), limit_check=st.sampled_from(["mapped", "allocation_size"]))
def test_every_memory_model_and_semantics_decide_as_the_reference_at_every_step(
        log, fraction, model, policy, enforce, device, overhead, address_policy, limit_check):
    memory, options, scale = model
    if memory == "caching":
        options = {**options, "address_policy": address_policy, "limit_check": limit_check}
    trace = scaled(log.trace("random"), scale)
    base = baseline(trace)
    budget = int(base.peak_memory * fraction)
    core = assert_same_memory_replay(trace, policy, budget, base.model_compute * overhead, memory, options, enforce,
                                     device if enforce == ALLOCATED else None)
    event(f"{core.status} {core.failure.cause if core.failure else ''}"
          f"{' with fragmentation evictions' if core.fragmentation_evictions else ''}")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(log=random_logs(), fraction=st.floats(0.05, 1.2), policy=st.sampled_from(["dtr", "msps", "dtr_eq_class"]),
       enforce=st.sampled_from([RESERVED, ALLOCATED]))
def test_clocks_above_2_to_the_53_under_the_caching_model(log, fraction, policy, enforce):
    """Costs near 2^45 push clocks, scores' numerators and staleness past a double's exact integers."""
    trace = scaled(log.trace("random"), 512 * 1024)
    ops = tuple(dataclasses.replace(op, cost=op.cost * (2**45 + 3)) for op in trace.operators)
    trace = dataclasses.replace(trace, operators=ops)
    base = baseline(trace)
    core = assert_same_memory_replay(trace, policy, int(base.peak_memory * fraction), base.model_compute * 1.0,
                                     "caching", {}, enforce, "1.25x" if enforce == ALLOCATED else None)
    assert core.clock < 2**63


def test_memory_runs_take_the_compiled_core_and_report_identical_results(small_resnet):
    for options in ({"memory": "caching"}, {"memory": "aligned", "memory_options": {"granularity": 4096}},
                    {"memory": "caching", "memory_options": {"expandable_segments": True}},
                    {"memory": "caching", "enforce": "allocated", "device_capacity": "1.25x"}):
        for ratio in (0.3, 0.6, 1.0):
            assert simulate(small_resnet, "dtr", ratio=ratio, engine="compiled",
                            semantics=Semantics(**options)) == simulate(
                small_resnet, "dtr", ratio=ratio, engine="python", semantics=Semantics(**options))


def test_a_model_the_core_does_not_know_runs_on_the_reference(small_resnet):
    @register_memory_model
    class TinyCaching(CachingModel):  # a subclass may change any rule, so it is not the compiled caching model
        name = "tiny_caching_for_engine_test"

    try:
        budget = int(baseline(small_resnet).peak_memory * 0.5)
        reason = compiled.unsupported_reason(small_resnet, get_policy("dtr"), model=TinyCaching(budget))
        assert reason is not None and "TinyCaching" in reason
        with pytest.raises(ValueError, match="engine='compiled' cannot take this run: the 'tiny_caching"):
            simulate(small_resnet, "dtr", budget_bytes=budget, engine="compiled",
                     semantics=Semantics(memory="tiny_caching_for_engine_test"))
        assert simulate(small_resnet, "dtr", budget_bytes=budget,
                        semantics=Semantics(memory="tiny_caching_for_engine_test")).status
    finally:
        MEMORY_MODELS.pop("tiny_caching_for_engine_test")
    assert isinstance(get_memory_model("caching", 1), MemoryModel)


def test_an_address_aware_policy_under_a_byte_counter_gets_the_reference_error(small_resnet):
    with pytest.raises(ValueError, match="needs an address-aware memory model"):
        simulate(small_resnet, "coop", ratio=0.5)
