"""The compiled memory models (dtrlab/memory/_memory_core.h) against the Python ones.

1. The hand-derived allocator tests of tests/test_memory_models.py (and the model-only ones of
   tests/test_memory_semantics.py) run again with every model they build replaced by the compiled
   model of the same capacity and options (through ``core_args()``): the same exact
   expectations, nothing copied.
2. Hypothesis: random allocate/free sequences under every option combination, with small
   capacities so that OOMs and the release-and-retry paths trigger, checking after every call that
   the result, ``stats()`` and ``layout()`` equal the Python model's.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import test_memory_models as hand
import test_memory_semantics as semantics
from dtrlab.memory import (AlignedModel, Block, CachingModel, FlatModel, MemoryModel, MemoryStats, Segment,
                           get_memory_model)
from dtrlab.memory.caching import _divisions_table
from dtrlab.memory.core_args import MAX_BYTES, MAX_DIVISIONS

_memory = pytest.importorskip("dtrlab.memory._compiled", reason="the compiled memory models are not built")

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


class Compiled:
    """The compiled model with the Python model's interface (what the hand-derived tests call)."""

    def __init__(self, model: MemoryModel):
        self.core = _memory.MemoryCore(*model.core_args())
        self.name, self.address_aware, self.capacity_bytes = model.name, model.address_aware, model.capacity_bytes

    def request_bytes(self, size):
        return self.core.request_bytes(size)

    def allocate(self, block_id, size):
        return self.core.allocate(block_id, size)

    def free(self, block_id):
        self.core.free(block_id)

    def stats(self):
        return MemoryStats(*self.core.stats())

    def layout(self):
        return [Segment(address, size, pool, tuple(Block(*block) for block in blocks))
                for address, size, pool, blocks in self.core.layout()]

    def block_of(self, block_id):
        block = self.core.block_of(block_id)
        return None if block is None else Block(*block)


def compiled_model(*args, **options):
    return Compiled(get_memory_model(*args, **options))


# ---------------------------------------------------------------- 1. the hand-derived tests, compiled

#: Tests of test_memory_models.py that place blocks (run again here); the others check the
#: registry and option validation, which stay in Python.
HAND_TESTS = [
    "test_double_allocate_and_unknown_free_are_errors", "test_flat_counts_bytes_exactly",
    "test_aligned_rounds_every_request_up", "test_small_pool_packing", "test_large_pool_segment_sizes",
    "test_best_fit_by_size_then_address", "test_best_fit_finds_a_block_of_exactly_the_request_at_address_0",
    "test_coalescing_on_free_but_never_across_segments",
    "test_release_cached_segments_and_retry_before_oom", "test_fragmentation_oom_although_the_bytes_fit",
    "test_max_split_size_keeps_oversize_blocks_whole", "test_max_split_size_releases_oversize_segments_first",
    "test_max_split_size_releases_the_largest_oversize_segments_until_enough", "test_expandable_segments",
    "test_expandable_best_fit_prefers_blocks_that_cannot_grow", "test_roundup_power2_divisions",
    "test_max_split_size_releases_the_largest_until_exactly_enough",
    "test_max_split_size_releases_the_smallest_block_of_the_target",
    "test_expandable_block_starts_at_a_free_block_before_unmapped_pages",
    "test_expandable_ranges_are_nine_eighths_of_the_capacity_in_whole_pages",
    "test_max_split_size_at_its_boundaries", "test_expandable_best_fit_walks_on_only_past_blocks_that_can_grow",
    "test_expandable_pages_mapped_after_full_ones_and_unmapped_between",
    "test_reuse_merges_released_ranges_and_keeps_the_rest",
    "test_expandable_addresses_past_2_to_the_53_stay_exact",
    "test_zero_byte_requests_take_no_block", "test_unbounded_events_match_the_baseline_peak",
]
PYTHON_ONLY = [
    "test_registry_lists_the_three_models", "test_unknown_model_lists_the_valid_ones",
    "test_unknown_option_lists_the_valid_ones", "test_an_option_of_another_model_is_refused",
    "test_caching_option_values_are_validated", "test_bad_capacity_and_granularity_are_refused",
    "test_an_instance_is_used_as_is_and_takes_no_options", "test_effective_options",
    "test_roundup_power2_next_division_by_hand", "test_roundup_power2_divisions_option_by_hand",
    "test_caching_option_errors_word_for_word",
]
#: test_memory_models.py's hypothesis invariants, run on compiled models (slow: 100 examples each).
INVARIANT_TEST = "test_invariants_and_determinism"

#: Tests of test_memory_semantics.py that build a CachingModel and only call it.
SEMANTICS_TESTS = [
    "test_a_large_request_counts_its_whole_block", "test_pre_mapping_check_fails_where_the_pages_would_fit",
    "test_pre_mapping_check_lets_the_pages_pass_the_limit", "test_without_expandable_segments_both_checks_agree",
    "test_reuse_takes_the_merged_released_range", "test_reuse_takes_the_lowest_range_and_keeps_the_rest",
]


def test_every_hand_derived_test_is_accounted_for():
    """A new test in test_memory_models.py must be listed: run compiled, or Python-only on purpose."""
    names = {name for name in vars(hand) if name.startswith("test_")}
    assert names == set(HAND_TESTS) | set(PYTHON_ONLY) | {INVARIANT_TEST}


@pytest.mark.parametrize("name", HAND_TESTS)
def test_hand_derived_through_the_compiled_models(name, monkeypatch, request):
    monkeypatch.setattr(hand, "get_memory_model", compiled_model)  # caching() builds through it too
    test = getattr(hand, name)
    if "small_resnet" in test.__code__.co_varnames[:test.__code__.co_argcount]:
        test(request.getfixturevalue("small_resnet"))
    else:
        test()


@pytest.mark.parametrize("name", SEMANTICS_TESTS)
def test_hand_derived_semantics_through_the_compiled_models(name, monkeypatch):
    monkeypatch.setattr(semantics, "CachingModel", lambda capacity, **options: Compiled(CachingModel(capacity, **options)))
    getattr(semantics, name)()


@pytest.mark.slow
@pytest.mark.parametrize(("name", "options"), hand.MODEL_SPECS, ids=[f"{n}-{o}" for n, o in hand.MODEL_SPECS])
def test_invariants_through_the_compiled_models(name, options, monkeypatch):
    monkeypatch.setattr(hand, "get_memory_model", compiled_model)
    getattr(hand, INVARIANT_TEST)(name=name, options=options)


# ---------------------------------------------------------------- the constructor's arguments

def test_core_args():
    assert FlatModel(100).core_args() == (0, 100, 1, False, -1, (0,) * 16, False, False)
    assert AlignedModel(100, granularity=64).core_args()[:3] == (0, 100, 64)
    table = {"2": 2, ">": 8}
    args = CachingModel(GiB, roundup_power2_divisions=table, max_split_size=32 * MiB,
                        limit_check="allocation_size", address_policy="reuse").core_args()
    assert args == (1, GiB, 1, False, 32 * MiB, tuple(_divisions_table(table)), True, True)
    assert CachingModel(GiB, expandable_segments=True).core_args()[3] is True


def test_models_the_c_code_does_not_know_get_none():
    class Subclass(CachingModel):  # may override any rule
        pass

    assert Subclass(GiB).core_args() is None
    assert FlatModel(MAX_BYTES + 1).core_args() is None
    assert AlignedModel(GiB, granularity=MAX_BYTES + 1).core_args() is None
    assert CachingModel(GiB, roundup_power2_divisions=1 << 31).core_args() is None
    assert CachingModel(GiB, max_split_size=1 << 63).core_args() is None
    # The limits themselves still go to the C model.
    assert CachingModel(GiB, roundup_power2_divisions=MAX_DIVISIONS).core_args()[5] == (MAX_DIVISIONS,) * 16
    assert CachingModel(GiB, max_split_size=MAX_BYTES).core_args()[4] == MAX_BYTES


def test_a_caching_choice_is_refused_in_words():
    """limit_check and address_policy take one of their names. (A mutant of this check is built when the class is,
    at import, so make mutate cannot plant it; planted by hand, it fails this test.)"""
    assert CachingModel(GiB, limit_check="allocation_size", address_policy="reuse").core_args()[6:] == (True, True)
    with pytest.raises(ValueError, match=r"^limit_check must be one of 'mapped', 'allocation_size', got 'nope'$"):
        CachingModel(GiB, limit_check="nope")
    with pytest.raises(ValueError, match=r"^address_policy must be one of 'bump', 'reuse', got 3$"):
        CachingModel(GiB, address_policy=3)


def test_bad_arguments_are_refused():
    args = CachingModel(GiB).core_args()
    with pytest.raises(ValueError, match=r"capacity must be in \[0, 2\^62\]"):
        _memory.MemoryCore(args[0], MAX_BYTES + 1, *args[2:])
    with pytest.raises(ValueError, match="divisions must be 0 or powers of 2"):
        _memory.MemoryCore(*args[:5], (3,) * 16, *args[6:])
    with pytest.raises(ValueError, match="16 ints"):
        _memory.MemoryCore(*args[:5], (0,) * 15, *args[6:])
    with pytest.raises(ValueError, match="cannot be combined"):
        _memory.MemoryCore(1, GiB, 1, True, 32 * MiB, (0,) * 16, False, False)
    core = _memory.MemoryCore(*args)
    with pytest.raises(ValueError, match=r"sizes must be in \[0, 2\^62\]"):
        core.allocate(1, MAX_BYTES + 1)
    with pytest.raises(ValueError, match="block ids"):
        core.allocate(-1, 10)
    with pytest.raises(KeyError):
        core.block_of(7)


def test_a_2_to_the_62_device_with_expandable_segments():
    """The 'unlimited' device (2^62 bytes): the large pool's expandable range starts at
    1.125 x 2^62 (rounded up to 2 MiB pages) and ends past 2^63; its blocks still have int64 addresses."""
    python = CachingModel(MAX_BYTES, expandable_segments=True)
    compiled = Compiled(CachingModel(MAX_BYTES, expandable_segments=True))
    for block_id, size in enumerate((1000, 30 * MiB, 5 * GiB, 700)):
        assert python.allocate(block_id, size) and compiled.allocate(block_id, size)
        assert compiled.layout() == python.layout() and compiled.stats() == python.stats()
    assert compiled.layout()[1].address == (1 << 62) + (1 << 59)  # 1.125 x 2^62, a whole number of 2 MiB pages


def test_pool_of():
    core = Compiled(CachingModel(GiB)).core
    assert [core.pool_of(s) for s in (0, 1, MiB, MiB + 1)] == [0, 0, 0, 1]
    assert Compiled(FlatModel(GiB)).core.pool_of(5) == 2


# ---------------------------------------------------------------- 2. random sequences against Python

BOUNDARIES = (512, MiB, 2 * MiB, 10 * MiB, 20 * MiB)
sizes = st.one_of(
    st.integers(0, 4 * KiB),
    st.integers(0, 100 * MiB),
    st.builds(lambda b, k, d: max(0, b * k + d), st.sampled_from(BOUNDARIES), st.integers(1, 3),
              st.sampled_from((-512, -1, 0, 1, 511, 512))),
)
intervals = st.sampled_from(["1", "2", "4", "8", "16", "32", "64", "1024", ">"]) | st.sampled_from([1, 2, 4, 8])
divisions = st.sampled_from((0, 1, 2, 4, 8, 16))
caching_options = st.fixed_dictionaries({
    "expandable_segments": st.booleans(),
    "max_split_size": st.sampled_from((None, None, 21 * MiB, 24 * MiB, 40 * MiB)),
    "roundup_power2_divisions": divisions | st.dictionaries(intervals.map(str), divisions, min_size=1, max_size=4),
    "limit_check": st.sampled_from(("mapped", "allocation_size")),
    "address_policy": st.sampled_from(("bump", "reuse")),
}).map(lambda o: {**o, "max_split_size": None} if o["expandable_segments"] else o)
specs = st.sampled_from(("caching",) * 6 + ("flat", "aligned")).flatmap(lambda name: st.tuples(st.just(name), {
    "flat": st.just({}), "caching": caching_options,
    "aligned": st.fixed_dictionaries({"granularity": st.sampled_from((1, 3, 512, 4096, MiB))})}[name]))
capacities = st.sampled_from((0, 2, 4, 21, 24, 36, 42, 44, 64, 80, 100, 160)).map(lambda mib: mib * MiB) | \
    st.integers(0, 200 * MiB)


@st.composite
def scenarios(draw, max_ops):
    """(spec, capacity, ops): ("alloc", size, reuse) allocates a new block id, or (reuse) a freed one;
    ("free", index) frees a live block by index. Sizes are boundary-biased or a share of the capacity,
    so that segments fill, empty and are released."""
    spec, capacity = draw(specs), draw(capacities)
    size = (sizes | st.integers(1, 48).map(lambda k: k * MiB) | st.integers(1, 64).map(lambda k: k * 512 * KiB)
            | st.integers(0, max(capacity * 6 // 10, 1)) | st.integers(0, max(capacity // 8, 1)))
    ops = draw(st.lists(st.one_of(st.tuples(st.just("alloc"), size, st.booleans()),
                                  st.tuples(st.just("free"), st.integers(0, 1 << 16))),
                        min_size=max_ops // 2, max_size=max_ops))
    return spec, capacity, ops


def python_layout(model):
    return [(s.address, s.size, s.pool, tuple((b.address, b.size, b.requested, b.block_id) for b in s.blocks))
            for s in model.layout()]


def check_same(spec, capacity, ops):
    name, options = spec
    python = get_memory_model(name, capacity, **options)
    core = _memory.MemoryCore(*python.core_args())
    live, freed, next_id = [], [], 0
    for op in ops:
        if op[0] == "alloc":
            _, size, reuse = op
            if reuse and freed:
                block_id = freed.pop()
            else:
                block_id, next_id = next_id, next_id + 1
            assert core.request_bytes(size) == python.request_bytes(size)
            placed = python.allocate(block_id, size)
            assert core.allocate(block_id, size) == placed
            (live if placed else freed).append(block_id)
        elif live:
            block_id = live.pop(op[1] % len(live))
            python.free(block_id)
            core.free(block_id)
            freed.append(block_id)
        assert MemoryStats(*core.stats()) == python.stats()
        assert core.layout() == python_layout(python)
    placed = {block.block_id: block for segment in python.layout() for block in segment.blocks}
    for block_id in live:  # a 0-byte request holds no block: None
        block = core.block_of(block_id)
        assert (None if block is None else Block(*block)) == placed.get(block_id)


def alloc(size):
    return ("alloc", size, False)


def free(index):
    return ("free", index)


PLAIN = {"expandable_segments": False, "max_split_size": None, "roundup_power2_divisions": 0,
         "limit_check": "mapped", "address_policy": "bump"}


# Paths that random sequences of this length reach rarely, so the quick run always takes them:
@example(scenario=(("caching", {**PLAIN, "expandable_segments": True}), 64 * MiB,
                   # 60 MiB fails; the release unmaps [20, 40) MiB of the free block [1.5, 40): its low
                   # partial page stays free and mapped.
                   [alloc(3 * MiB // 2), alloc(30 * MiB), free(1), alloc(60 * MiB), alloc(40 * MiB)]))
@example(scenario=(("caching", {**PLAIN, "address_policy": "reuse"}), 30 * MiB,
                   # 14 MiB releases [2, 14) then [0, 2) (large pool first): the ranges merge, 14 MiB reuses [0, 14)
                   [alloc(512 * KiB), alloc(12 * MiB), alloc(12 * MiB), free(0), free(0), alloc(14 * MiB),
                    alloc(MiB)]))
@example(scenario=(("caching", {**PLAIN, "address_policy": "reuse"}), 32 * MiB,
                   # 18 MiB reuses the low end of the released [0, 20) MiB; 512 KiB's segment takes the rest
                   [alloc(10 * MiB), alloc(10 * MiB), alloc(10 * MiB), free(0), free(0), alloc(18 * MiB),
                    alloc(512 * KiB)]))
@example(scenario=(("caching", {**PLAIN, "address_policy": "reuse"}), 30 * MiB,
                   # the released [0, 2) MiB cannot hold 20 MiB: the bump pointer places it
                   [alloc(512 * KiB), alloc(12 * MiB), free(0), alloc(20 * MiB)]))
@example(scenario=(("caching", {**PLAIN, "expandable_segments": True}), 100 * MiB,
                   # test_expandable_segments' sequence: the last release keeps a 10 MiB partial page mapped
                   [alloc(1000), alloc(3 * MiB), alloc(25 * MiB), free(1), free(1), alloc(70 * MiB),
                    alloc(30 * MiB), free(0), alloc(30 * MiB), free(0), alloc(1000)]))
@example(scenario=(("caching", {**PLAIN, "max_split_size": 24 * MiB}), 80 * MiB,
                   # release_available_cached_blocks: the smallest oversize segment of at least 24 MiB
                   [alloc(30 * MiB), alloc(40 * MiB), free(0), free(0), alloc(4 * MiB)]))
@example(scenario=(("caching", {**PLAIN, "max_split_size": 24 * MiB}), 80 * MiB,
                   # ... and the largest oversize segments down until 30 MiB are released
                   [alloc(26 * MiB), alloc(28 * MiB), alloc(4 * MiB), free(0), free(0), alloc(30 * MiB)]))
@example(scenario=(("caching", {**PLAIN, "expandable_segments": True}), 100 * MiB,
                   # best fit walks past the 4 MiB tail, which could grow into unmapped space
                   [alloc(5 * MiB), alloc(2 * MiB), alloc(9 * MiB), free(0), alloc(3 * MiB)]))
@settings(max_examples=200, deadline=None)
@given(scenario=scenarios(max_ops=40))
def test_random_sequences_match_the_python_models(scenario):
    check_same(*scenario)


@pytest.mark.slow
@settings(max_examples=1500, deadline=None)
@given(scenario=scenarios(max_ops=200))
def test_random_sequences_match_the_python_models_at_length(scenario):
    check_same(*scenario)
