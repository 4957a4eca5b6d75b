"""The runtime semantics (``enforce``) and PyTorch's rules behind ``allocated`` (issue 20).

Hand-derived cases, one per rule, with the derivation in each docstring: block sizes
counted as allocated, the expandable segments' limit check before mapping
(``limit_check="allocation_size"``) and their address range from the device
capacity, an operator's outputs allocated one by one, address reuse, the
``allocated`` semantics' after-operator eviction and its device OOM. Then hypothesis
invariants on random traces for both semantics, the device capacity's parser, the
sweep column and cache key, the CLI options and the address-policy sensitivity helper.

Clock and staleness follow tests/test_handbuilt.py: the clock starts at 1, an output's
last access is the clock after its operator ran.
"""

import dataclasses
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dtrlab import simulate
from dtrlab.analysis.address_sensitivity import FLIP_COLUMNS, address_policy_flips
from dtrlab.cli import main
from dtrlab.memory import CachingModel, FlatModel
from dtrlab.memory.device import GPU_PRESETS, UNLIMITED_BYTES, device_capacity
from dtrlab.policies import get_policy
from dtrlab.runtime import OutOfMemory, Simulator, Thrash, baseline
from dtrlab.runtime.run import memory_model
from dtrlab.sweep import sweep
from dtrlab.sweep.cache import SweepCache
from dtrlab.trace import LogBuilder
from test_properties import random_logs
from dtrlab.runtime.semantics import Semantics
from dtrlab.sweep.execution import Execution

KIB = 1024
MIB = 1 << 20
GIB = 1 << 30


def chain(*outputs, release=True):
    """``x`` (a 0-byte constant), then one operator per ``(name, size)`` computing it from x (time 1
    each), every output kept until the end."""
    log = LogBuilder()
    log.constant("x", 0)
    for name, size in outputs:
        log.call("f" + name, ["x"], [(name, size)], time=1)
    if release:
        log.release(*(name for name, _ in outputs))
    return log.trace("chain")


# ---------------------------------------------------------------- block sizes count as allocated

def test_a_large_request_counts_its_whole_block():
    """19.5 MiB rounds to itself (a multiple of 512 B) and goes to the large pool; no cached block,
    so a segment of get_allocation_size = 19.5 MiB rounded up to 2 MiB = 20 MiB is reserved. The
    remainder, 0.5 MiB, is not above 1 MiB, so should_split keeps the block whole: it is 20 MiB,
    and allocated_bytes counts 20 MiB while the request counts 19.5 MiB."""
    model = CachingModel(GIB)
    assert model.allocate(1, 19 * MIB + MIB // 2)
    assert model.request_bytes(19 * MIB + MIB // 2) == 19 * MIB + MIB // 2
    assert model.block_of(1).size == 20 * MIB
    assert model.stats().allocated_bytes == 20 * MIB


def test_allocated_semantics_evicts_by_block_sizes():
    """a = 19.5 MiB takes a 20 MiB block (above); b = 1 MiB goes to the small pool (a new 2 MiB
    segment, block 1 MiB). Budget 20.75 MiB: after fa, 20 MiB <= budget; after fb the blocks hold
    21 MiB > 20.75 MiB, so the run evicts a (b is the operator's output, not a candidate).
    Counting requests (19.5 + 1 = 20.5 MiB <= 20.75 MiB) would evict nothing."""
    trace = chain(("a", 19 * MIB + MIB // 2), ("b", MIB))
    result = simulate(trace, "dtr", budget_bytes=20 * MIB + 3 * MIB // 4,
                      semantics=Semantics(memory="caching", enforce="allocated"))
    assert (result.status, result.evicted_storages) == ("pass", ("a",))
    assert (result.peak_allocated_bytes, result.peak_reserved_bytes) == (21 * MIB, 22 * MIB)
    assert (result.enforce, result.device_capacity) == ("allocated", "unlimited")


# ---------------------------------------------------------------- expandable segments

def expandable(capacity, check):
    return CachingModel(capacity, expandable_segments=True, limit_check=check)


def test_pre_mapping_check_fails_where_the_pages_would_fit():
    """Capacity 42 MiB. x = 1.5 MiB (large pool): get_allocation_size = 20 MiB (below 10 MiB);
    20 <= 42, one 20 MiB page is mapped, x takes [0, 1.5 MiB), [1.5, 20) stays free.
    y = 25 MiB: no cached block holds it; get_allocation_size = 26 MiB (25 rounded up to 2 MiB).
    PyTorch's alloc_block checks 20 + 26 = 46 > 42 before mapping: OOM (releasing the cache
    unmaps nothing, no free block covers a whole page). Checking the pages instead: the free
    18.5 MiB grow by one more page, 20 + 20 = 40 <= 42, so y fits at 1.5 MiB."""
    for check, fits, reserved in (("allocation_size", False, 20 * MIB), ("mapped", True, 40 * MIB)):
        model = expandable(42 * MIB, check)
        assert model.allocate(1, 3 * MIB // 2)
        assert model.allocate(2, 25 * MIB) is fits
        assert model.stats().reserved_bytes == reserved
        if fits:
            assert model.block_of(2).address == 3 * MIB // 2


def test_pre_mapping_check_lets_the_pages_pass_the_limit():
    """Capacity 35 MiB (a per-process limit). z = 30 MiB: get_allocation_size = 30 MiB, 0 + 30 <= 35,
    so PyTorch maps the pages covering 30 MiB: two 20 MiB pages, 40 MiB reserved, past the limit
    by less than a page. Checking the pages instead, 40 > 35 is an OOM."""
    model = expandable(35 * MIB, "allocation_size")
    assert model.allocate(1, 30 * MIB)
    assert model.stats().reserved_bytes == 40 * MIB
    assert not expandable(35 * MIB, "mapped").allocate(1, 30 * MIB)


def test_without_expandable_segments_both_checks_agree():
    """A cudaMalloc segment is exactly get_allocation_size, so both checks compare the same bytes:
    25 MiB reserves 26 MiB, which fits 26 MiB and not 25.5 MiB under either check."""
    for check in ("allocation_size", "mapped"):
        assert CachingModel(26 * MIB, limit_check=check).allocate(1, 25 * MIB)
        assert not CachingModel(25 * MIB + MIB // 2, limit_check=check).allocate(1, 25 * MIB)


def test_expandable_address_range_comes_from_the_device_capacity():
    """Under enforce='allocated' the model's capacity is the device's (A100-80GB: 80 GiB), so each
    pool's expandable segment spans 1.125 x 80 GiB = 90 GiB (46080 small pages of 2 MiB): the
    large pool's segment, reserved after the small pool's, starts at 90 GiB."""
    model = memory_model(Semantics(memory="caching", memory_options={"expandable_segments": True}, enforce="allocated"),
                         8 * MIB, device_capacity("A100-80GB"))
    assert model.capacity_bytes == 80 * GIB
    assert model.allocate(1, 512 * KIB) and model.allocate(2, 2 * MIB)
    assert [segment.address for segment in model.layout()] == [0, 90 * GIB]


# ---------------------------------------------------------------- outputs one by one

def two_outputs():
    log = LogBuilder()
    log.constant("x", 0)
    log.call("f", ["x"], [("a", 512 * KIB), ("b", 3 * MIB)], time=1)
    log.release("a", "b")
    return log.trace("two_outputs")


def test_outputs_are_allocated_one_by_one_and_unwound_on_failure():
    """Device 4 MiB. a = 512 KiB reserves a 2 MiB small segment and is placed; b = 3 MiB needs a
    20 MiB large segment: 2 + 20 > 4, releasing the cache frees nothing (a's segment holds a), so
    b's allocation fails: a device OOM for b's 3 MiB. a's block is freed (the operator's exception
    frees its tensor) but its segment stays cached: allocated 0, reserved 2 MiB."""
    model = CachingModel(4 * MIB, limit_check="allocation_size")
    result = simulate(two_outputs(), "dtr", budget_bytes=4 * MIB,
                      semantics=Semantics(memory=model, enforce="allocated", device_capacity=4 * MIB))
    assert (result.status, result.failure.cause, result.failure.requested_bytes) == ("oom", "device", 3 * MIB)
    assert (model.stats().allocated_bytes, model.stats().reserved_bytes) == (0, 2 * MIB)
    assert result.evictions == 0


def test_reserved_places_the_outputs_all_or_none():
    """Under 'reserved' the budget (4 MiB) is the capacity: the rounded bytes (3.5 MiB) fit, a is
    placed, b is not, a is taken back; nothing can be evicted: a fragmentation OOM."""
    result = simulate(two_outputs(), "dtr", budget_bytes=4 * MIB, semantics=Semantics(memory="caching"))
    assert (result.status, result.failure.cause) == ("oom", "fragmentation")


# ---------------------------------------------------------------- address policies

def test_reuse_takes_the_merged_released_range():
    """Capacity 24 MiB: a, b = 10 MiB take segments [0, 10) and [10, 20) MiB; both freed (cached).
    c = 22 MiB: no cached block holds it and 20 + 22 > 24, so the cache is released (both
    segments) and a 22 MiB segment reserved. bump: at 20 MiB. reuse: the released ranges merge
    into [0, 20), which reaches the bump pointer, so the pointer drops to 0: c at 0."""
    for policy, address in (("bump", 20 * MIB), ("reuse", 0)):
        model = CachingModel(24 * MIB, address_policy=policy)
        assert model.allocate(1, 10 * MIB) and model.allocate(2, 10 * MIB)
        model.free(1)
        model.free(2)
        assert model.allocate(3, 22 * MIB)
        assert model.block_of(3).address == address


def test_reuse_takes_the_lowest_range_and_keeps_the_rest():
    """Capacity 32 MiB: a, b, c = 10 MiB at [0, 10), [10, 20), [20, 30); a and b freed.
    d = 18 MiB: 30 + 18 > 32, so a's and b's segments are released (c's holds c) and 10 + 18 <= 32.
    reuse: [0, 20) holds 18 MiB: d at 0, [18, 20) stays released. e = 512 KiB needs a 2 MiB small
    segment (28 + 2 <= 32): reuse puts it at 18 MiB exactly. bump: d at 30, e at 48 MiB."""
    for policy, addresses in (("bump", (30 * MIB, 48 * MIB)), ("reuse", (0, 18 * MIB))):
        model = CachingModel(32 * MIB, address_policy=policy)
        for block in (1, 2, 3):
            assert model.allocate(block, 10 * MIB)
        model.free(1)
        model.free(2)
        assert model.allocate(4, 18 * MIB) and model.allocate(5, 512 * KIB)
        assert (model.block_of(4).address, model.block_of(5).address) == addresses
        segments = model.layout()
        assert all(s.address + s.size <= t.address for s, t in zip(segments, segments[1:]))


def test_new_options_at_their_default_leave_the_options_unchanged():
    """limit_check and address_policy came after shipped results: at their defaults they are not
    listed, so configurations keep their records and cache keys."""
    assert CachingModel(MIB).options() == {"max_split_size": None, "expandable_segments": False,
                                           "roundup_power2_divisions": 0}
    assert CachingModel(MIB, address_policy="reuse").options()["address_policy"] == "reuse"
    with pytest.raises(ValueError, match="address_policy must be one of 'bump', 'reuse'"):
        CachingModel(MIB, address_policy="first_fit")


# ---------------------------------------------------------------- the allocated semantics

THREE = (("a", 4 * KIB), ("b", 4 * KIB), ("c", 4 * KIB))


def test_allocated_evicts_after_the_operator():
    """Budget 10 KiB, flat model, unlimited device. After fa and fb 8 KiB are allocated; fc's
    output is allocated first (12 KiB, over the budget for the length of the operator), then
    the run evicts: candidates a and b (c is the operator's output). At clock 4 (three operators
    of time 1), a's staleness is 4 - 2 = 2 and b's 4 - 3 = 1, so h_DTR = 1 / (4 KiB x staleness)
    is lowest for a: a goes, 8 KiB remain. Peaks are 12 KiB."""
    result = simulate(chain(*THREE), "dtr", budget_bytes=10 * KIB,
                      semantics=Semantics(memory="flat", enforce="allocated"))
    assert (result.status, result.evicted_storages) == ("pass", ("a",))
    assert (result.peak_memory, result.peak_allocated_bytes, result.peak_reserved_bytes) == (12 * KIB,) * 3


def test_allocated_fails_on_the_device_not_on_the_budget():
    """Same trace, device = budget = 10 KiB: fc's output needs 12 KiB on the device, which it
    does not have, and nothing is evicted to make room: a device OOM at fc (schedule step 4, after
    x's computation and pin, fa and fb) for 4 KiB, no eviction.
    A device of 1.25 x the budget (12.8 KiB) holds the 12 KiB: the run passes as above."""
    failed = simulate(chain(*THREE), "dtr", budget_bytes=10 * KIB,
                      semantics=Semantics(memory="flat", enforce="allocated", device_capacity=10 * KIB))
    assert (failed.status, failed.evictions, failed.failure.cause) == ("oom", 0, "device")
    assert (failed.failure.step, failed.failure.requested_bytes) == (4, 4 * KIB)
    passed = simulate(chain(*THREE), "dtr", budget_bytes=10 * KIB,
                      semantics=Semantics(memory="flat", enforce="allocated", device_capacity="1.25x"))
    assert (passed.status, passed.evicted_storages, passed.device_capacity) == ("pass", ("a",), "1.25x")


def test_allocated_fails_on_the_budget_when_nothing_can_be_evicted():
    """Budget 3 KiB: fa's 4 KiB output exceeds it after the operator and the output is no
    candidate: an OOM with cause 'bytes' for the 1 KiB over the budget."""
    result = simulate(chain(*THREE), "dtr", budget_bytes=3 * KIB,
                      semantics=Semantics(memory="flat", enforce="allocated"))
    assert (result.status, result.failure.cause, result.failure.requested_bytes) == ("oom", "bytes", KIB)


def test_semantics_arguments_are_checked():
    trace = chain(*THREE)
    with pytest.raises(ValueError, match=r"unknown enforce 'allocate' \(did you mean 'allocated'\?\)"):
        simulate(trace, budget_bytes=10 * KIB, semantics=Semantics(enforce="allocate"))
    with pytest.raises(ValueError, match="device_capacity applies to enforce='allocated' only"):
        simulate(trace, budget_bytes=10 * KIB, semantics=Semantics(memory="caching", device_capacity="2x"))
    with pytest.raises(ValueError, match="policy 'coop' evicts to place a block"):
        simulate(trace, "coop", budget_bytes=10 * KIB, semantics=Semantics(memory="caching", enforce="allocated"))


def test_device_capacity_specs():
    assert device_capacity(None).bytes_for(5) == UNLIMITED_BYTES
    assert device_capacity("unlimited").label == "unlimited"
    assert device_capacity("1.25x").bytes_for(1000) == 1250 and device_capacity("1.25x").label == "1.25x"
    assert device_capacity("80GiB") == device_capacity("A100-80GB") == device_capacity(80 * GIB)
    assert device_capacity("H100-80GB").label == str(80 * GIB) == device_capacity(str(80 * GIB)).label
    assert device_capacity("40GB").bytes == 40 * 10**9 and "A100-40GB" in GPU_PRESETS
    with pytest.raises(ValueError, match=r"unknown device capacity 'A100-80G' \(did you mean 'A100-80GB'\?\)"):
        device_capacity("A100-80G")
    with pytest.raises(ValueError, match="must be >= 1"):
        device_capacity("0.5x")
    with pytest.raises(ValueError, match="give bytes as an integer"):
        device_capacity(1.5)


# ---------------------------------------------------------------- invariants on random traces

class Checked:
    """Mixin: after every allocate and free, reserved stays within the capacity (a pre-mapping check
    lets expandable pages pass it by less than one page) and no two blocks or segments overlap."""

    def allocate(self, block_id, size):
        placed = super().allocate(block_id, size)
        self.check()
        return placed

    def free(self, block_id):
        super().free(block_id)
        self.check()

    def check(self):
        stats = self.stats()
        slack = 0
        options = self._options
        if options.get("expandable_segments") and options.get("limit_check") == "allocation_size":
            slack = 20 * MIB - 1  # the large pool's page, the larger one
        assert stats.allocated_bytes <= stats.reserved_bytes <= self.capacity_bytes + slack
        end = 0
        for segment in self.layout():
            assert segment.address >= end
            address = segment.address
            for block in segment.blocks:
                assert block.address == address and block.size > 0
                address += block.size
            assert address == segment.address + segment.size
            end = address


class CheckedCaching(Checked, CachingModel):
    pass


class CheckedFlat(Checked, FlatModel):
    pass


def scaled(trace, factor):
    ops = tuple(dataclasses.replace(op, sizes=tuple(s * factor for s in op.sizes)) for op in trace.operators)
    return dataclasses.replace(trace, operators=ops)


MODELS = [("flat", {}, 32 * KIB), ("caching", {}, 32 * KIB), ("caching", {}, 512 * KIB),
          ("caching", {"expandable_segments": True}, 32 * KIB), ("caching", {"expandable_segments": True}, 512 * KIB),
          ("caching", {"address_policy": "reuse"}, 512 * KIB),
          ("caching", {"expandable_segments": True, "limit_check": "mapped"}, 512 * KIB)]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def checked_model(memory, capacity, options, enforce):
    if memory == "flat":
        return CheckedFlat(capacity)
    if enforce == "allocated":
        options = {"limit_check": "allocation_size", **options}
    return CheckedCaching(capacity, **options)


@SETTINGS
@given(log=random_logs(), fraction=st.floats(0.1, 1.6), model=st.sampled_from(MODELS),
       device=st.sampled_from([None, "1x", "1.25x", "2x"]), policy=st.sampled_from(["dtr", "lru", "msps"]))
def test_allocated_semantics_invariants(log, fraction, model, device, policy):
    """After every schedule step allocated <= budget (the after-operator eviction ran last);
    reserved <= the device capacity after every model call; blocks never overlap; the run is
    deterministic and simulate() decides as the stepped replay."""
    memory, options, scale = model
    trace = scaled(log.trace("random"), scale)
    budget = int(baseline(trace).peak_memory * fraction)
    capacity = device_capacity(device).bytes_for(budget)
    sim = Simulator(trace, get_policy(policy), budget, baseline(trace).model_compute,
                    memory_model=checked_model(memory, capacity, options, "allocated"), enforce="allocated")
    status = "pass"
    try:
        for _ in sim.steps():
            assert sim.memory_model.stats().allocated_bytes <= budget
    except OutOfMemory:
        status = "oom"
        assert sim.failure.cause in ("bytes", "device")
    except Thrash:
        status = "thrash"
    result = simulate(trace, policy, budget_bytes=budget,
                      semantics=Semantics(memory=checked_model(memory, capacity, options, "allocated"),
                                          enforce="allocated", device_capacity=device if device != "1x" else capacity))
    assert result.status == status and result.evicted_storages == tuple(trace.tensor_names[s] for s in sim.evicted)


@SETTINGS
@given(log=random_logs(), fraction=st.floats(0.1, 1.6), model=st.sampled_from(MODELS),
       policy=st.sampled_from(["dtr", "lru", "coop", "dtr_fit"]))
def test_reserved_semantics_invariants(log, fraction, model, policy):
    """Under 'reserved' the budget is the capacity: reserved <= budget after every model call, no
    overlapping blocks, and naming the default semantics changes nothing."""
    memory, options, scale = model
    if memory == "flat" or options.get("limit_check"):
        return  # covered by tests/test_memory_runtime.py; the pre-mapping check is allocated's
    trace = scaled(log.trace("random"), scale)
    budget = int(baseline(trace).peak_memory * fraction)
    checked = simulate(trace, policy, budget_bytes=budget,
                       semantics=Semantics(memory=checked_model(memory, budget, options, "reserved")))
    plain = simulate(trace, policy, budget_bytes=budget,
                     semantics=Semantics(memory=memory, memory_options=options, enforce="reserved"))
    assert checked == plain and plain.enforce == "reserved" and "enforce" not in plain.to_dict()


# ---------------------------------------------------------------- sweeps, cache keys, CLI

def test_sweep_column_and_cache_key(tmp_path, small_resnet):
    reserved = SweepCache(tmp_path, small_resnet, get_policy("dtr"),
                          Semantics(memory="caching", memory_options={}), None)
    named = SweepCache(tmp_path, small_resnet, get_policy("dtr"),
                       Semantics(memory="caching", memory_options={}, enforce="reserved"), None)
    allocated = SweepCache(tmp_path, small_resnet, get_policy("dtr"),
                           Semantics(memory="caching", memory_options={}, enforce="allocated",
                                     device_capacity="1.25x"), None)
    assert reserved.config_key == named.config_key and "enforce" not in reserved.key
    assert allocated.config_key != reserved.config_key and allocated.key["device_capacity"] == "1.25x"
    frame = sweep(small_resnet, "dtr", ratios=[0.6, 0.9],
                  semantics=Semantics(memory="caching", enforce="allocated", device_capacity="1.25x"),
                  execution=Execution(cache=tmp_path, progress=False))
    assert frame["enforce"].tolist() == ["allocated"] * 2 and frame["device_capacity"].tolist() == ["1.25x"] * 2
    for ratio, status in zip(frame["ratio"], frame["status"]):
        run = simulate(small_resnet, "dtr", ratio=ratio,
                       semantics=Semantics(memory="caching", enforce="allocated", device_capacity="1.25x"))
        assert run.status == status
    flat = sweep(small_resnet, "dtr", ratios=[0.6], execution=Execution(cache=False, progress=False))
    assert (flat["enforce"].tolist(), flat["device_capacity"].tolist()) == (["reserved"], [""])


def three_outputs_log(directory) -> str:
    """A log file: three 4 KiB outputs of a free constant, released together at the end."""
    path = directory / "chain.log"
    log = LogBuilder()
    log.constant("x", 0)
    for name in "abc":
        log.call("f" + name, ["x"], [(name, 4 * KIB)], time=1)
    log.release("a", "b", "c")
    log.write(path)
    return path


def test_cli_enforce(tmp_path, capsys):
    path = three_outputs_log(tmp_path)
    assert main(["run", str(path), "--budget", str(10 * KIB), "--enforce", "allocated", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert (record["status"], record["enforce"], record["device_capacity"]) == ("pass", "allocated", "unlimited")
    assert main(["run", str(path), "--budget", str(10 * KIB), "--enforce", "allocated", "--device-capacity",
                 str(10 * KIB), "--json"]) == 1  # a failed run
    record = json.loads(capsys.readouterr().out)
    assert (record["status"], record["failure"]["cause"], record["peak_allocated_bytes"]) == ("oom", "device", 8 * KIB)
    assert main(["run", str(path), "--budget", "100", "--device-capacity", "2x"]) == 2
    assert "--device-capacity applies to --enforce allocated only" in capsys.readouterr().err
    assert main(["run", str(path), "--budget", "100", "--enforce", "allocated", "--device-capacity", "H100"]) == 2
    assert "unknown device capacity 'H100'" in capsys.readouterr().err


def test_every_simulating_command_takes_the_semantics(tmp_path, capsys):
    """variants and explain pass enforce and device_capacity to their runs (variants raised
    TypeError, explain's search took them for policy parameters and crashed when the base run
    evicted nothing). Three 4 KiB outputs under a 10 KiB device: the third fails, cause device."""
    path = three_outputs_log(tmp_path)
    semantics = ["--enforce", "allocated", "--device-capacity", str(10 * KIB)]
    assert main(["explain", str(path), "--budget", str(10 * KIB), *semantics]) == 0
    out = capsys.readouterr().out
    assert "oom" in out and "device" in out and "withholding each of the 0 evicted storages" in out
    assert main(["variants", str(path), "--policies", "dtr", "--ratios", "0.5,1.0", "--no-cache", *semantics]) == 0


def test_address_policy_flips_compares_both_policies(small_resnet):
    """The helper's statuses are those of single runs under each address policy."""
    table = address_policy_flips(small_resnet, ratios=[0.4, 0.7], execution=Execution(cache=False, progress=False))
    assert list(table.columns) == FLIP_COLUMNS and len(table) == 2
    for row in table.itertuples():
        for policy in ("bump", "reuse"):
            run = simulate(small_resnet, "dtr", ratio=row.ratio,
                           semantics=Semantics(memory="caching", memory_options={"address_policy": policy}))
            assert run.status == getattr(row, f"status_{policy}")
        assert row.flipped == (row.status_bump != row.status_reuse)


def test_refine_holes_keeps_the_frame_semantics(small_resnet):
    """A frame swept under 'allocated' is refined under 'allocated' with its device; naming a
    semantics is refused (the frame's own is the one)."""
    from dtrlab.analysis.holes import refine_holes

    frame = sweep(small_resnet, "dtr", ratios=[0.4, 0.6, 0.8],
                  semantics=Semantics(memory="caching", enforce="allocated", device_capacity="1.5x"),
                  execution=Execution(cache=False, progress=False))
    refinement = refine_holes(small_resnet, frame, "dtr", probes=1, execution=Execution(cache=False, progress=False))
    samples = refinement.refined.samples
    assert set(samples["enforce"]) == {"allocated"} and set(samples["device_capacity"]) == {"1.5x"}
    with pytest.raises(TypeError, match="under the frame's own semantics"):
        refine_holes(small_resnet, frame, "dtr", enforce="allocated", device_capacity="2x",
                     execution=Execution(cache=False, progress=False))


# --- dtrlab.runtime.semantics on its own: each method's answer, derived by hand (make mutate) --------------------

def test_semantics_with_and_options():
    from dtrlab.runtime.semantics import REFERENCE, Semantics

    changed = REFERENCE.with_(memory="caching", overhead_limit=3.0)
    assert (changed.memory, changed.overhead_limit, changed.enforce) == ("caching", 3.0, "reserved")
    assert Semantics(memory_options={"b": 1, "a": 2}).memory_options == (("a", 2), ("b", 1))  # sorted pairs
    assert Semantics(memory_options={"b": 1, "a": 2}).options == {"a": 2, "b": 1}
    assert not REFERENCE.unlimited and Semantics(overhead_limit=float("inf")).unlimited
    for bad in (0.5, float("nan"), "2"):
        with pytest.raises(ValueError, match="overhead_limit must be a number >= 1"):
            Semantics(overhead_limit=bad)
    assert Semantics(overhead_limit=1).overhead_limit == 1  # 1 is allowed: no recompute at all


def test_semantics_normalized_fills_defaults_and_labels_the_device():
    from dtrlab.runtime.semantics import REFERENCE, Semantics

    caching_defaults = (("expandable_segments", False), ("max_split_size", None), ("roundup_power2_divisions", 0))
    assert REFERENCE.normalized() == REFERENCE
    reserved = Semantics(memory="caching").normalized()
    assert (reserved.memory_options, reserved.device_capacity) == (caching_defaults, None)
    allocated = Semantics(memory="caching", enforce="allocated", device_capacity=80 << 30).normalized()
    assert allocated.memory_options == tuple(sorted((*caching_defaults, ("limit_check", "allocation_size"))))
    assert allocated.device_capacity == str(80 << 30) and allocated.normalized() == allocated
    assert Semantics(memory=CachingModel(0)).normalized() == reserved  # an instance stands for its name and options
    assert Semantics(enforce="allocated", device_capacity="1.25x").normalized().device_capacity == "1.25x"
    with pytest.raises(ValueError, match="unknown enforce 'alocated'.*did you mean 'allocated'"):
        Semantics(enforce="alocated").normalized()
    with pytest.raises(ValueError, match="device_capacity applies to enforce='allocated' only"):
        Semantics(device_capacity=1 << 30).normalized()
    with pytest.raises(ValueError, match="policy 'coop' evicts to place a block"):
        Semantics(enforce="allocated").normalized(get_policy("coop"))


def test_semantics_require_default_names_what_is_set():
    from dtrlab.runtime.semantics import REFERENCE, Semantics

    REFERENCE.require_default(("memory", "enforce", "overhead_limit"), "x")  # nothing set: no error
    with pytest.raises(ValueError, match=r"^semantics sets memory, overhead_limit, which the sweep sets; leave them "
                                         r"at their defaults$"):
        Semantics(memory="caching", overhead_limit=3.0).require_default(("memory", "enforce", "overhead_limit"),
                                                                        "the sweep sets")


@pytest.mark.parametrize("row, expected", [
    ({"overhead_limit": 2}, ("flat", (), "reserved", None, 2.0)),  # a frame from before the memory columns
    ({"memory": "caching", "memory_options": '{"max_split_size": 4}', "enforce": "allocated",
      "device_capacity": "1.25x", "overhead_limit": "3.5"}, ("caching", (("max_split_size", 4),), "allocated", "1.25x",
                                                             3.5)),
    ({"memory": None, "memory_options": "", "enforce": None, "device_capacity": "80GiB", "overhead_limit": 2.0},
     ("flat", (), "reserved", None, 2.0)),  # no capacity under reserved
    ({"enforce": "allocated", "device_capacity": "", "overhead_limit": 2.0}, ("flat", (), "allocated", None, 2.0)),
])
def test_semantics_from_a_sweep_row(row, expected):
    from dtrlab.runtime.semantics import Semantics

    semantics = Semantics.from_row(row)
    assert (semantics.memory, semantics.memory_options, semantics.enforce, semantics.device_capacity,
            semantics.overhead_limit) == expected
    assert isinstance(semantics.overhead_limit, float)


def test_refuse_loose_names_the_keywords_and_where_they_go():
    from dtrlab.runtime.semantics import refuse_loose
    from dtrlab.sweep.execution import Execution

    refuse_loose({"budget": 1, "policy": "dtr"})  # none of Semantics' fields: no error
    with pytest.raises(TypeError, match=r"^enforce, memory: pass them as semantics=Semantics\(enforce='allocated', "
                                        r"memory='caching'\), not as loose keywords$"):
        refuse_loose({"memory": "caching", "enforce": "allocated", "budget": 1})
    with pytest.raises(TypeError, match=r"^jobs: pass them as execution=Execution\(jobs=2\)"):
        refuse_loose({"jobs": 2}, Execution, "execution")


def test_memory_spec_and_semantics_options():
    from dtrlab.runtime.semantics import memory_spec, semantics_options

    assert memory_spec() == ("flat", {})
    assert memory_spec("caching", {}, "allocated")[1]["limit_check"] == "allocation_size"
    assert "limit_check" not in memory_spec("caching")[1]
    assert memory_spec("caching", {"limit_check": "mapped"}, "allocated") == memory_spec("caching")  # given wins
    assert semantics_options("flat", None, "allocated") == {}  # flat memory has no limit check
    assert semantics_options("caching", None, "reserved") == {}
    with pytest.raises(ValueError, match="max_splitsize"):
        memory_spec("caching", {"max_splitsize": 1})


def test_semantics_errors_word_for_word():
    """The one-line errors a user reads, whole (make mutate: a mangled message is a wrong answer too)."""
    from dtrlab.runtime.semantics import Semantics, check_semantics, memory_spec

    assert Semantics(memory_options=(("b", 1), ("a", 2))).memory_options == (("a", 2), ("b", 1))  # pairs, not a dict
    with pytest.raises(ValueError, match=r"^unknown enforce 'x'; valid: reserved, allocated \(see docs/memory.md\)$"):
        check_semantics("x")
    with pytest.raises(ValueError, match=r"^device_capacity applies to enforce='allocated' only \(under 'reserved' the "
                                         r"budget is the device\)$"):
        check_semantics("reserved", 1 << 30)
    with pytest.raises(ValueError, match=r"^policy 'coop' evicts to place a block, which enforce='allocated' never asks "
                                         r"for \(it evicts by allocated bytes after each operator\); use "
                                         r"enforce='reserved'$"):
        check_semantics("allocated", None, get_policy("coop"))
    with pytest.raises(ValueError, match=r"memory options \['max_split_size'\] given with a ready 'caching' model"):
        memory_spec(CachingModel(0), {"max_split_size": 4})
    with pytest.raises(ValueError, match=r"unknown memory model 'cachng' \(did you mean 'caching'\?\)"):
        memory_spec("cachng", None, "allocated")


def test_human_bytes_picks_the_unit_that_shows_the_count():
    from dtrlab.memory.device import human_bytes

    assert [human_bytes(n) for n in (512, 12 << 10, 102 << 10, 103 << 10, 512 << 10, 3 << 20, 80 << 30)] == [
        "0.50 KiB", "12.00 KiB", "102.00 KiB", "0.10 MiB", "0.50 MiB", "3.00 MiB", "80.00 GiB"]
