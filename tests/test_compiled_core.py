"""The compiled replay core (dtrlab/runtime/_core.c) decides exactly as the Python reference simulator.

Random traces (the generator of test_properties) are replayed by both, and the clock,
memory, eviction count and recompute are compared after every schedule step, then
the evicted sequence, the counters and the failure record.
"""

import dataclasses
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_properties import random_traces

from dtrlab import simulate
from dtrlab.memory import get_memory_model
from dtrlab.policies import get_policy, score_policy
from dtrlab.runtime import Intervention, OutOfMemory, Simulator, Thrash, baseline, compiled
from dtrlab.runtime.baseline import _replay as reference_baseline
from dtrlab.trace import LogBuilder, load_directory
from dtrlab.trace.model import GET, Operator, Trace
from dtrlab.runtime.semantics import Semantics

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not compiled.available(), reason="the compiled core is not built")

COMPILED_POLICIES = sorted(cls.name for cls in compiled.POLICY_CODES)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class RegionReads:
    """A recorder of the regions every choice could read: (storage, forward, reverse region
    compute) of each resident storage, as the core's ``region_reads`` records them. The Python
    simulator rebuilds regions at once; the core owes rebuilds until a choice, so this is where
    a late rebuild that differs would show, even when no decision changes."""

    def __init__(self):
        self.reads = []

    def on_choose(self, sim, candidates, chosen):
        if sim.regions is not None:
            self.reads.append(tuple((s, sim.region_compute[s], sim.region_rev_compute[s])
                                    for s, resident in enumerate(sim.material) if resident))

    def __getattr__(self, name):  # the other hooks record nothing
        if name.startswith("on_"):
            return lambda *args: None
        raise AttributeError(name)


def assert_same_region_reads(core, sim):
    if core.region_reads is None:
        assert not sim.recorder.reads
    else:
        assert core.region_reads == sim.recorder.reads


def reference_replay(trace, policy_name, budget_bytes, remat_limit, intervention=None):
    """The Python simulator's replay with (clock, memory, evictions, recompute) after every step."""
    sim = Simulator(trace, get_policy(policy_name), budget_bytes, remat_limit, intervention=intervention,
                    recorder=RegionReads())
    steps, status = [], "pass"
    try:
        for _ in sim.steps():
            steps.append((sim.clock, sim.memory, len(sim.evicted), sim.remat_compute))
    except OutOfMemory:
        status = "oom"
    except Thrash:
        status = "thrash"
    return status, sim, steps


def assert_same_replay(trace, policy_name, budget_bytes, remat_limit, intervention=None):
    status, sim, steps = reference_replay(trace, policy_name, budget_bytes, remat_limit, intervention)
    core = compiled.run(trace, get_policy(policy_name), budget_bytes, remat_limit, intervention, record_steps=True)
    assert core.steps == steps
    assert core.evicted == sim.evicted
    assert (core.status, core.clock, core.model_compute, core.remat_compute, core.peak_memory, core.remats) == (
        status, sim.clock, sim.model_compute, sim.remat_compute, sim.peak_memory, sim.remats)
    assert core.failure == sim.failure
    assert_same_region_reads(core, sim)
    return core


@SETTINGS
@given(trace=random_traces, fraction=st.floats(0.0, 1.2), policy=st.sampled_from(COMPILED_POLICIES),
       overhead=st.sampled_from([0.0, 0.5, 1.0, math.inf]))
def test_compiled_core_matches_the_reference_at_every_step(trace, fraction, policy, overhead):
    base = baseline(trace)
    assert_same_replay(trace, policy, int(base.peak_memory * fraction), base.model_compute * overhead)


def scaled(trace, size_factor: int, cost_factor: int):
    """The trace with every size and cost multiplied, so that scores need more than 53 bits."""
    operators = tuple(dataclasses.replace(op, sizes=tuple(size * size_factor for size in op.sizes),
                                          cost=op.cost * cost_factor) for op in trace.operators)
    return dataclasses.replace(trace, operators=operators)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=random_traces, fraction=st.floats(0.05, 1.1), policy=st.sampled_from(COMPILED_POLICIES))
def test_scores_above_53_bits_are_divided_exactly(trace, fraction, policy):
    # Clocks above 2^53 (LRU compares them as integers) and size x staleness products
    # above 2^64: the core must round every int/int score exactly as Python does.
    big = scaled(trace, 2**40 + 7, 2**45 + 3)
    base = baseline(big)
    core = assert_same_replay(big, policy, int(base.peak_memory * fraction), base.model_compute * 1.0)
    assert core.clock < 2**62


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=random_traces, fraction=st.floats(0.05, 1.1), policy=st.sampled_from(COMPILED_POLICIES),
       data=st.data())
def test_withheld_storages_are_never_chosen_on_either_path(trace, fraction, policy, data):
    storages = [t for t in range(trace.n_tensors) if trace.operators[trace.tensor_op[t]].aliases[trace.tensor_index[t]] == -1]
    withheld = data.draw(st.sets(st.sampled_from(storages)))
    base = baseline(trace)
    core = assert_same_replay(trace, policy, int(base.peak_memory * fraction), base.model_compute * 1.0,
                              Intervention(withhold=withheld))
    assert not withheld.intersection(core.evicted)


def test_simulate_dispatches_and_results_are_identical_field_by_field(small_resnet):
    for policy in COMPILED_POLICIES:
        for ratio in (0.3, 0.6):
            fast = simulate(small_resnet, policy, ratio=ratio, engine="compiled")
            slow = simulate(small_resnet, policy, ratio=ratio, engine="python")
            assert fast == slow
            assert fast.evicted_storages == slow.evicted_storages and fast.evictions > 0


def test_random_policy_draws_the_same_candidates_for_every_seed(small_resnet):
    for seed in range(4):
        fast = simulate(small_resnet, "random", ratio=0.5, seed=seed, engine="compiled")
        assert fast == simulate(small_resnet, "random", ratio=0.5, seed=seed, engine="python")
        assert fast.evictions > 0


def test_a_failure_record_is_identical():
    log = LogBuilder()
    log.constant("x", 10)
    log.call("f", ["x"], [("y", 30)], time=3)
    trace = log.trace()
    fast, slow = (simulate(trace, "dtr", budget_bytes=35, engine=engine) for engine in ("compiled", "python"))
    assert fast.status == "oom" and fast.failure == slow.failure
    # schedule: compute x, pin x, compute f; x is pinned, so nothing can make room for y
    assert (fast.failure.step, fast.failure.tensor, fast.failure.requested_bytes, fast.failure.memory_in_use,
            fast.failure.candidates, fast.failure.cause) == (2, 1, 30, 10, 0, "bytes")


def test_runs_the_core_cannot_take_go_to_the_reference_or_are_refused(small_resnet):
    @score_policy("test_compiled_core_user_policy")
    def smallest_first(view):
        return view.size

    reasons = {
        "user policy": compiled.unsupported_reason(small_resnet, smallest_first()),
        "recorder": compiled.unsupported_reason(small_resnet, get_policy("dtr"), recorder=object()),
        "pin": compiled.unsupported_reason(small_resnet, get_policy("dtr"), Intervention(pin=[(0, 0)])),
    }
    assert all(reasons.values()), reasons
    assert compiled.unsupported_reason(small_resnet, get_policy("dtr"), Intervention(withhold={0})) is None
    overridden = get_policy("dtr")
    overridden.score_of = lambda sim, s: 0.0
    assert compiled.unsupported_reason(small_resnet, overridden) is not None
    with pytest.raises(ValueError, match="cannot take this run"):
        simulate(small_resnet, smallest_first(), ratio=0.5, engine="compiled")
    with pytest.raises(ValueError, match="cannot take this run: a memory model instance"):
        simulate(small_resnet, "dtr", budget_bytes=10**6, engine="compiled",
                 semantics=Semantics(memory=get_memory_model("aligned", 10**6)))
    with pytest.raises(ValueError, match="auto, compiled, python"):
        simulate(small_resnet, "dtr", ratio=0.5, engine="fast")
    # auto sends the user policy to the Python simulator, with the same result as forcing it there
    assert simulate(small_resnet, smallest_first(), ratio=0.5) == simulate(
        small_resnet, smallest_first(), ratio=0.5, engine="python")


def test_a_subclass_of_a_builtin_policy_is_not_mistaken_for_it(small_resnet):
    class Halved(type(get_policy("dtr"))):
        name = "test_compiled_core_halved"

        def score_of(self, sim, s):
            return super().score_of(sim, s) / 2

    assert compiled.unsupported_reason(small_resnet, Halved()) is not None


def test_a_trace_with_an_index_out_of_range_is_left_to_the_reference(small_resnet):
    broken = dataclasses.replace(small_resnet, schedule=small_resnet.schedule + ((0, len(small_resnet.operators)),))
    assert compiled.unsupported_reason(broken, get_policy("dtr")) is not None
    assert compiled.unsupported_reason(small_resnet, get_policy("dtr")) is None


@SETTINGS
@given(trace=random_traces)
def test_the_compiled_baseline_is_the_reference_baseline(trace):
    assert compiled.baseline(trace) == dataclasses.astuple(reference_baseline(trace))


def test_the_compiled_baseline_matches_on_every_shipped_trace():
    for trace in load_directory(ROOT / "traces").values():
        assert compiled.baseline(trace) == dataclasses.astuple(reference_baseline(trace)), trace.name


def test_a_get_of_a_never_computed_tensor_leaves_the_baseline_to_the_reference(small_resnet):
    trace = dataclasses.replace(small_resnet, schedule=((GET, 0),) + small_resnet.schedule)
    assert compiled.baseline(trace) is None
    assert baseline(trace) == reference_baseline(trace)


def test_an_infinite_overhead_limit_on_a_trace_without_compute_is_no_limit():
    # inf x 0 compute is a NaN limit; the reference never exceeds it (found by hypothesis).
    trace = Trace(name="zero-compute", operators=(
        Operator(name="constant", cost=0, args=(), outputs=(0,), sizes=(1,), aliases=(-1,), backward=False),
        Operator(name="op0", cost=0, args=(0,), outputs=(1,), sizes=(0,), aliases=(-1,), backward=False)),
        tensor_names=("t1", "t2"), tensor_op=(0, 1), tensor_index=(0, 0),
        schedule=((0, 0), (2, 0), (0, 1), (2, 0), (2, 1)), source="<test>")
    assert_same_replay(trace, "dtr", 0, math.nan)
    results = [simulate(trace, "dtr", budget_bytes=1, engine=engine, semantics=Semantics(overhead_limit=math.inf))
               for engine in ("compiled", "python")]
    assert results[0].status == results[1].status == "pass"
