"""The memory models alone: hand-derived allocator sequences and hypothesis invariants.

Every expected address, size and segment below is derived by hand from the rules of
PyTorch's caching allocator as docs/memory.md states them (constants: 512 B blocks,
1 MiB small requests, 2 MiB small segments, 20 MiB large segments for 1-10 MiB
requests, 2 MiB rounding above). New segments are placed by a bump pointer from 0.
"""

from __future__ import annotations


import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dtrlab.memory import (Block, MemoryModel, Segment, available_memory_models, get_memory_model)
from dtrlab.memory.replay import replay, unbounded_events

KiB, MiB = 1 << 10, 1 << 20


def caching(capacity_mib=1024, **options):
    return get_memory_model("caching", capacity_mib * MiB, **options)


def shape(model):
    """Layout as (segment address, size, pool, [(block address, size, block_id)]) tuples."""
    return [(s.address, s.size, s.pool, [(b.address, b.size, b.block_id) for b in s.blocks]) for s in model.layout()]


# ---------------------------------------------------------------- registry and options

def test_registry_lists_the_three_models():
    assert available_memory_models() == ["aligned", "caching", "flat"]


def test_unknown_model_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown memory model 'buddy'; valid models: aligned, caching, flat"):
        get_memory_model("buddy", MiB)


def test_unknown_option_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown memory option 'garbage_collection_threshold'; valid options for "
                                         "'caching': address_policy, expandable_segments, limit_check, max_split_size, "
                                         "roundup_power2_divisions"):
        caching(garbage_collection_threshold=0.5)


@pytest.mark.parametrize(("model", "option", "owner"), [
    ("flat", "max_split_size", "caching"), ("flat", "granularity", "aligned"),
    ("aligned", "expandable_segments", "caching"), ("caching", "granularity", "aligned"),
])
def test_an_option_of_another_model_is_refused(model, option, owner):
    with pytest.raises(ValueError, match=f"'{option}' does not apply to the '{model}' model .*belongs to '{owner}'"):
        get_memory_model(model, MiB, **{option: 1})


@pytest.mark.parametrize(("options", "message"), [
    ({"max_split_size": 20 * MiB}, "whole number of MiB above 20 MiB"),
    ({"max_split_size": 21 * MiB + 1}, "whole number of MiB"),
    ({"max_split_size": 21.0 * MiB}, "must be an integer"),
    ({"max_split_size": True}, "must be an integer"),
    ({"expandable_segments": "True"}, "must be True or False"),
    ({"roundup_power2_divisions": 3}, "0 \\(off\\) or a power of 2"),
    ({"roundup_power2_divisions": -2}, ">= 0"),
    ({"roundup_power2_divisions": {3: 2}}, "interval 3 must be a power of 2"),
    ({"roundup_power2_divisions": {4: 6}}, "must be 0 \\(no rounding\\) or a power of 2"),
    ({"roundup_power2_divisions": {}}, "must not be an empty dict"),
    ({"expandable_segments": True, "max_split_size": 32 * MiB}, "cannot be combined"),
])
def test_caching_option_values_are_validated(options, message):
    with pytest.raises(ValueError, match=message):
        caching(**options)


def test_bad_capacity_and_granularity_are_refused():
    with pytest.raises(ValueError, match="capacity_bytes must be >= 0"):
        get_memory_model("flat", -1)
    with pytest.raises(ValueError, match="granularity must be >= 1"):
        get_memory_model("aligned", MiB, granularity=0)


def test_an_instance_is_used_as_is_and_takes_no_options():
    model = caching(64)
    assert get_memory_model(model) is model
    assert get_memory_model(model, 64 * MiB) is model
    with pytest.raises(ValueError, match="set them when constructing"):
        get_memory_model(model, expandable_segments=True)
    with pytest.raises(ValueError, match="differs from the instance"):
        get_memory_model(model, 32 * MiB)


def test_effective_options():
    assert caching().options() == {"max_split_size": None, "expandable_segments": False,
                                   "roundup_power2_divisions": 0}
    assert get_memory_model("aligned", MiB).options() == {"granularity": 512}
    assert get_memory_model("flat", MiB).options() == {}
    assert caching(roundup_power2_divisions={2: 2, ">": 8}).options()["roundup_power2_divisions"] == {"2": 2, ">": 8}


def test_double_allocate_and_unknown_free_are_errors():
    for name in available_memory_models():
        model = get_memory_model(name, 64 * MiB)
        assert model.allocate(1, 100)
        with pytest.raises(ValueError, match="already allocated"):
            model.allocate(1, 100)
        with pytest.raises(KeyError):
            model.free(2)


# ---------------------------------------------------------------- byte-counting models

def test_flat_counts_bytes_exactly():
    model = get_memory_model("flat", 1000)
    assert not model.address_aware
    assert model.allocate(1, 600) and model.allocate(2, 400)
    assert not model.allocate(3, 1)  # 1000 + 1 > 1000
    model.free(1)
    assert model.allocate(3, 600)
    assert model.request_bytes(7) == 7
    assert shape(model) == [(0, 1000, "flat", [(0, 400, 2), (400, 600, 3)])]
    assert model.stats() == (model.stats().__class__)(1000, 1000, 1000, 1000, 0, 1)


def test_aligned_rounds_every_request_up():
    model = get_memory_model("aligned", 2048)
    assert [model.request_bytes(s) for s in (0, 1, 512, 513)] == [0, 512, 512, 1024]
    assert model.allocate(1, 10) and model.allocate(2, 1000)
    assert not model.allocate(3, 600)  # 512 + 1024 + 1024 > 2048 although 10 + 1000 + 600 fit
    assert model.allocate(3, 500)
    assert model.stats().allocated_bytes == 2048
    assert get_memory_model("aligned", 100, granularity=64).request_bytes(65) == 128


# ---------------------------------------------------------------- caching: hand-derived sequences

def test_small_pool_packing():
    model = caching()
    assert model.allocate(1, 1)  # rounds to 512: a new 2 MiB small segment at 0, split
    assert model.allocate(2, 1000)  # 1024 B right after it
    assert model.allocate(3, 512)
    assert shape(model) == [(0, 2 * MiB, "small", [(0, 512, 1), (512, 1024, 2), (1536, 512, 3),
                                                  (2048, 2 * MiB - 2048, None)])]
    assert model.allocate(4, MiB)  # exactly kSmallSize: still small, fits the 2 MiB - 2 KiB remainder
    assert model.allocate(5, MiB)  # the remainder (1 MiB - 2 KiB) is too small: a second small segment
    assert model.allocate(6, MiB + 1)  # large pool: its own 20 MiB segment after the two small ones
    assert shape(model) == [
        (0, 2 * MiB, "small", [(0, 512, 1), (512, 1024, 2), (1536, 512, 3), (2048, MiB, 4),
                               (MiB + 2048, MiB - 2048, None)]),
        (2 * MiB, 2 * MiB, "small", [(2 * MiB, MiB, 5), (3 * MiB, MiB, None)]),
        (4 * MiB, 20 * MiB, "large", [(4 * MiB, MiB + 512, 6), (5 * MiB + 512, 19 * MiB - 512, None)]),
    ]
    stats = model.stats()
    assert (stats.allocated_bytes, stats.reserved_bytes, stats.segments) == (
        512 + 1024 + 512 + 3 * MiB + 512, 24 * MiB, 3)
    assert stats.largest_free_block == 19 * MiB - 512


def test_large_pool_segment_sizes():
    model = caching()
    assert model.allocate(1, MiB + 1)  # 1-10 MiB: a 20 MiB segment, split (remainder > 1 MiB)
    assert model.allocate(2, 10 * MiB - 512)  # fits the 19 MiB - 512 remainder, split again
    assert model.allocate(3, 10 * MiB)  # >= kMinLargeAlloc: its own 10 MiB segment, nothing left over
    assert model.allocate(4, 11 * MiB + 1)  # rounds to a 12 MiB segment; 1 MiB - 512 left is not split off
    assert model.allocate(5, 9 * MiB + 1)  # 1-10 MiB again; the 9 MiB cached is too small: new 20 MiB
    assert shape(model) == [
        (0, 20 * MiB, "large", [(0, MiB + 512, 1), (MiB + 512, 10 * MiB - 512, 2), (11 * MiB, 9 * MiB, None)]),
        (20 * MiB, 10 * MiB, "large", [(20 * MiB, 10 * MiB, 3)]),
        (30 * MiB, 12 * MiB, "large", [(30 * MiB, 12 * MiB, 4)]),
        (42 * MiB, 20 * MiB, "large", [(42 * MiB, 9 * MiB + 512, 5), (51 * MiB + 512, 11 * MiB - 512, None)]),
    ]
    assert model.allocate(6, 9 * MiB)  # exactly the cached 9 MiB block: taken whole
    assert shape(model)[0][3][2] == (11 * MiB, 9 * MiB, 6)
    assert model.block_of(4) == Block(30 * MiB, 12 * MiB, 11 * MiB + 1, 4)
    stats = model.stats()
    assert (stats.allocated_bytes, stats.reserved_bytes, stats.segments) == (51 * MiB + 512, 62 * MiB, 4)


def test_best_fit_by_size_then_address():
    model = caching()
    for block_id, size in enumerate((4, 2, 6, 2), start=1):  # one 20 MiB segment: 4|2|6|2|6 free
        assert model.allocate(block_id, size * MiB)
    model.free(1)
    model.free(3)  # free: 4 MiB at 0, 6 MiB at 6 MiB, 6 MiB at 14 MiB
    assert model.allocate(5, 3 * MiB)  # smallest that fits: the 4 MiB block (not split: 1 MiB left)
    assert model.allocate(6, 5 * MiB)  # two 6 MiB blocks: the lower address wins (not split either)
    assert shape(model) == [(0, 20 * MiB, "large", [(0, 4 * MiB, 5), (4 * MiB, 2 * MiB, 2), (6 * MiB, 6 * MiB, 6),
                                                    (12 * MiB, 2 * MiB, 4), (14 * MiB, 6 * MiB, None)])]
    assert model.block_of(5).requested == 3 * MiB
    assert model.stats().allocated_bytes == 14 * MiB


def test_best_fit_finds_a_block_of_exactly_the_request_at_address_0():
    """get_free_block searches from (size, lowest address): a cached block of exactly the request's size at
    address 0 is found. 4 and 16 MiB fill a 20 MiB segment; 4 MiB after freeing the first takes it back."""
    model = caching()
    assert model.allocate(1, 4 * MiB) and model.allocate(2, 16 * MiB)
    model.free(1)
    assert model.allocate(3, 4 * MiB)
    assert shape(model) == [(0, 20 * MiB, "large", [(0, 4 * MiB, 3), (4 * MiB, 16 * MiB, 2)])]


def test_coalescing_on_free_but_never_across_segments():
    model = caching()
    for block_id in range(1, 5):  # four 512 KiB blocks fill the first small segment exactly
        assert model.allocate(block_id, 512 * KiB)
    assert model.allocate(5, 512 * KiB)  # second small segment, adjacent in address space
    model.free(1)
    model.free(3)
    assert shape(model)[0][3] == [(0, 512 * KiB, None), (512 * KiB, 512 * KiB, 2), (MiB, 512 * KiB, None),
                                  (1536 * KiB, 512 * KiB, 4)]
    model.free(2)  # merges with both free neighbours
    assert shape(model)[0][3] == [(0, 1536 * KiB, None), (1536 * KiB, 512 * KiB, 4)]
    model.free(4)
    model.free(5)
    # Both segments are wholly free and touch at 2 MiB, yet stay two blocks.
    assert shape(model) == [(0, 2 * MiB, "small", [(0, 2 * MiB, None)]),
                            (2 * MiB, 2 * MiB, "small", [(2 * MiB, 2 * MiB, None)])]
    stats = model.stats()
    assert (stats.allocated_bytes, stats.reserved_bytes, stats.largest_free_block) == (0, 4 * MiB, 2 * MiB)
    assert model.allocate(6, 3 * MiB)  # needs a new segment: no merge across the two free ones
    assert shape(model)[2] == (4 * MiB, 20 * MiB, "large", [(4 * MiB, 3 * MiB, 6), (7 * MiB, 17 * MiB, None)])


def test_release_cached_segments_and_retry_before_oom():
    model = caching(44)
    assert model.allocate(0, 100)  # small segment at 0 ...
    model.free(0)  # ... now cached and wholly free
    assert model.allocate(1, 12 * MiB)  # at 2 MiB
    assert model.allocate(2, 12 * MiB)  # at 14 MiB
    model.free(1)
    assert model.allocate(3, 14 * MiB)  # the cached 12 MiB is too small: new 14 MiB at 26 MiB (40 reserved)
    model.free(3)
    # 16 MiB: nothing cached fits and 40 + 16 > 44. Release every wholly free segment
    # (the small one, 12 MiB and 14 MiB), then the new segment fits at the bump pointer.
    assert model.allocate(4, 16 * MiB)
    assert shape(model) == [(14 * MiB, 12 * MiB, "large", [(14 * MiB, 12 * MiB, 2)]),
                            (40 * MiB, 16 * MiB, "large", [(40 * MiB, 16 * MiB, 4)])]
    stats = model.stats()
    assert (stats.reserved_bytes, stats.peak_reserved_bytes, stats.segments) == (28 * MiB, 40 * MiB, 2)
    assert not model.allocate(5, 20 * MiB)  # 28 + 20 > 44, nothing cached to release: OOM
    assert shape(model)[1][0] == 40 * MiB and model.stats().reserved_bytes == 28 * MiB


def test_fragmentation_oom_although_the_bytes_fit():
    model = caching(36)
    assert model.allocate(1, 2 * MiB)  # 20 MiB segment
    assert model.allocate(2, 16 * MiB)  # in its remainder, leaving 2 MiB free at the end
    model.free(1)  # free: 2 MiB at 0 and 2 MiB at 18 MiB; 16 MiB allocated
    # 16 + 18 <= 36 but no cached block fits, a new 18 MiB segment would reserve 38 > 36,
    # and the partly used segment cannot be released.
    assert not model.allocate(3, 18 * MiB)
    assert shape(model) == [(0, 20 * MiB, "large", [(0, 2 * MiB, None), (2 * MiB, 16 * MiB, 2),
                                                    (18 * MiB, 2 * MiB, None)])]


def test_max_split_size_keeps_oversize_blocks_whole():
    model = caching(max_split_size=24 * MiB)
    assert model.allocate(1, 30 * MiB)  # a 30 MiB segment
    model.free(1)
    assert model.allocate(2, 26 * MiB)  # oversize request: may use the 30 MiB block (< 26 + 20) but not split it
    assert shape(model) == [(0, 30 * MiB, "large", [(0, 30 * MiB, 2)])]
    model.free(2)
    assert model.allocate(3, 4 * MiB)  # a small request never takes an oversize block: new 20 MiB segment
    assert shape(model)[1] == (30 * MiB, 20 * MiB, "large", [(30 * MiB, 4 * MiB, 3), (34 * MiB, 16 * MiB, None)])
    model.free(3)
    assert model.allocate(4, 50 * MiB)  # new 50 MiB segment at 50 MiB
    model.free(4)
    assert model.allocate(5, 26 * MiB)  # lower bound is the 30 MiB block again (26 + 20 > 30): taken
    assert model.allocate(6, 28 * MiB)  # only the 50 MiB block is large enough, but 50 >= 28 + 20: new segment
    assert [(s[0], s[1], s[3][0][2]) for s in shape(model)] == [
        (0, 30 * MiB, 5), (30 * MiB, 20 * MiB, None), (50 * MiB, 50 * MiB, None), (100 * MiB, 28 * MiB, 6)]
    without = caching()
    assert without.allocate(1, 30 * MiB)
    without.free(1)
    assert without.allocate(2, 4 * MiB)  # without the option the 30 MiB block is split
    assert shape(without) == [(0, 30 * MiB, "large", [(0, 4 * MiB, 2), (4 * MiB, 26 * MiB, None)])]


def test_max_split_size_releases_oversize_segments_first():
    model = caching(80, max_split_size=24 * MiB)
    assert model.allocate(1, 30 * MiB)  # 30 MiB at 0
    assert model.allocate(2, 40 * MiB)  # 40 MiB at 30 MiB
    model.free(1)
    model.free(2)
    # 4 MiB: both cached blocks are oversize; 70 + 20 > 80. release_available_cached_blocks
    # frees the smallest oversize segment of at least 24 MiB (the 30 MiB one), which is enough.
    assert model.allocate(3, 4 * MiB)
    assert shape(model) == [(30 * MiB, 40 * MiB, "large", [(30 * MiB, 40 * MiB, None)]),
                            (70 * MiB, 20 * MiB, "large", [(70 * MiB, 4 * MiB, 3), (74 * MiB, 16 * MiB, None)])]
    # The same without max_split_size: the 30 MiB block is split, nothing is released.
    plain = caching(80)
    assert plain.allocate(1, 30 * MiB) and plain.allocate(2, 40 * MiB)
    plain.free(1)
    plain.free(2)
    assert plain.allocate(3, 4 * MiB)
    assert [s[0] for s in shape(plain)] == [0, 30 * MiB]


def test_max_split_size_releases_the_largest_oversize_segments_until_enough():
    model = caching(80, max_split_size=24 * MiB)
    assert model.allocate(1, 26 * MiB)  # 26 MiB at 0
    assert model.allocate(2, 28 * MiB)  # 28 MiB at 26 MiB
    assert model.allocate(3, 4 * MiB)  # 20 MiB at 54 MiB (74 reserved)
    model.free(1)
    model.free(2)
    # 30 MiB: no cached block fits, 74 + 30 > 80; no single oversize block >= 30 MiB, so
    # release from the largest down (28, then 26) until 30 MiB are released, then retry.
    assert model.allocate(4, 30 * MiB)
    assert [(s[0], s[1]) for s in shape(model)] == [(54 * MiB, 20 * MiB), (74 * MiB, 30 * MiB)]


def test_expandable_segments():
    model = caching(100, expandable_segments=True)
    # Virtual ranges of 1 1/8 x 100 MiB in pages: small 57 x 2 MiB = 114 MiB at 0, large 6 x 20 MiB at 114 MiB.
    assert model.allocate(1, 1000)  # maps one 2 MiB page of the small segment
    assert model.allocate(2, 3 * MiB)  # maps one 20 MiB page of the large segment
    assert model.allocate(3, 25 * MiB)  # grows the free 17 MiB tail by one page instead of a new segment
    assert shape(model) == [
        (0, 2 * MiB, "small", [(0, 1024, 1), (1024, 2 * MiB - 1024, None)]),
        (114 * MiB, 40 * MiB, "large", [(114 * MiB, 3 * MiB, 2), (117 * MiB, 25 * MiB, 3), (142 * MiB, 12 * MiB, None)]),
    ]
    model.free(2)
    model.free(3)
    assert model.allocate(4, 70 * MiB)  # maps two more pages after the merged 40 MiB free block
    assert shape(model)[1] == (114 * MiB, 80 * MiB, "large", [(114 * MiB, 70 * MiB, 4), (184 * MiB, 10 * MiB, None)])
    assert model.stats().reserved_bytes == 82 * MiB
    # 30 MiB needs one more page: 82 + 20 > 100. Releasing the cache unmaps no whole page (the
    # free blocks are partial pages), so this is an OOM.
    assert not model.allocate(5, 30 * MiB)
    model.free(1)
    # Now the release unmaps the small segment's only page (and drops that segment): 80 + 20 fits.
    assert model.allocate(5, 30 * MiB)
    assert shape(model) == [(114 * MiB, 100 * MiB, "large", [(114 * MiB, 70 * MiB, 4), (184 * MiB, 30 * MiB, 5)])]
    model.free(4)
    # A small request needs a new small segment (at 234 MiB, address ranges are never reused) and a
    # page; 100 + 2 > 100, so the release unmaps the free 70 MiB's three whole pages (60 MiB);
    # the 10 MiB partial page stays mapped and free.
    assert model.allocate(6, 1000)
    assert shape(model) == [(174 * MiB, 40 * MiB, "large", [(174 * MiB, 10 * MiB, None), (184 * MiB, 30 * MiB, 5)]),
                            (234 * MiB, 2 * MiB, "small", [(234 * MiB, 1024, 6), (234 * MiB + 1024, 2 * MiB - 1024, None)])]
    stats = model.stats()
    assert (stats.allocated_bytes, stats.reserved_bytes, stats.peak_reserved_bytes, stats.segments) == (
        30 * MiB + 1024, 42 * MiB, 100 * MiB, 2)


def test_expandable_best_fit_prefers_blocks_that_cannot_grow():
    model = caching(100, expandable_segments=True)
    for block_id, size in enumerate((5, 2, 9), start=1):  # one 20 MiB page at 0: 5|2|9|4 free, then unmapped
        assert model.allocate(block_id, size * MiB)
    model.free(1)  # free: 5 MiB at 0, and the 4 MiB tail that could grow by 100 MiB of address space
    # 3 MiB: best fit by size is the 4 MiB tail, but it counts as 104 MiB for the search, which
    # walks on to the 5 MiB block; with expandable segments its 2 MiB remainder is split off.
    assert model.allocate(4, 3 * MiB)
    assert shape(model) == [(0, 20 * MiB, "large", [(0, 3 * MiB, 4), (3 * MiB, 2 * MiB, None), (5 * MiB, 2 * MiB, 2),
                                                    (7 * MiB, 9 * MiB, 3), (16 * MiB, 4 * MiB, None)])]
    plain = caching(100)
    for block_id, size in enumerate((5, 2, 9), start=1):
        assert plain.allocate(block_id, size * MiB)
    plain.free(1)
    assert plain.allocate(4, 3 * MiB)  # without expandable segments the 4 MiB block is the best fit
    assert shape(plain)[0][3][-1] == (16 * MiB, 4 * MiB, 4)


def test_max_split_size_releases_the_largest_until_exactly_enough():
    """release_available_cached_blocks with no single oversize block large enough: it releases from the largest
    down while less than the target is released, and an exact target is enough (True: nothing else is released).
    With max_split_size 24 MiB: oversize segments D 30, C 28, B 26, A 24 MiB at 0, 30, 58, 84 and a free small
    segment at 108 MiB (110 of 112 reserved). 58 MiB: no cached block fits, 110 + 58 > 112, no oversize block
    holds 58; D (at address 0) and C make 58 exactly, so B, A and the small segment stay and the 58 MiB segment
    goes to the bump pointer, 110 MiB. Then 50 MiB: B and A (24 = max_split_size itself is oversize) make 50."""
    model = caching(112, max_split_size=24 * MiB)
    for block_id, size in enumerate((30, 28, 26, 24), start=1):
        assert model.allocate(block_id, size * MiB)
    assert model.allocate(5, 100)
    for block_id in range(1, 6):
        model.free(block_id)
    assert model.allocate(6, 58 * MiB)
    assert shape(model) == [(58 * MiB, 26 * MiB, "large", [(58 * MiB, 26 * MiB, None)]),
                            (84 * MiB, 24 * MiB, "large", [(84 * MiB, 24 * MiB, None)]),
                            (108 * MiB, 2 * MiB, "small", [(108 * MiB, 2 * MiB, None)]),
                            (110 * MiB, 58 * MiB, "large", [(110 * MiB, 58 * MiB, 6)])]
    assert model.stats().reserved_bytes == 110 * MiB
    assert model.allocate(7, 50 * MiB)  # 110 + 50 > 112; B + A = 50: the 50 MiB segment at 168 MiB
    assert shape(model) == [(108 * MiB, 2 * MiB, "small", [(108 * MiB, 2 * MiB, None)]),
                            (110 * MiB, 58 * MiB, "large", [(110 * MiB, 58 * MiB, 6)]),
                            (168 * MiB, 50 * MiB, "large", [(168 * MiB, 50 * MiB, 7)])]


def test_max_split_size_releases_the_smallest_block_of_the_target():
    """The single-block case of release_available_cached_blocks: the first cached block in (size, address)
    order of at least max(request, max_split_size) bytes, here the 24 MiB block at address 0 (exactly the
    target), not the 30 MiB one; that is enough, so the free small segment stays cached."""
    model = caching(60, max_split_size=24 * MiB)
    assert model.allocate(1, 24 * MiB) and model.allocate(2, 30 * MiB) and model.allocate(3, 100)
    for block_id in (1, 2, 3):
        model.free(block_id)
    # 4 MiB: the oversize blocks are not split for it; 56 + 20 > 60; releasing 24 MiB makes room.
    assert model.allocate(4, 4 * MiB)
    assert shape(model) == [(24 * MiB, 30 * MiB, "large", [(24 * MiB, 30 * MiB, None)]),
                            (54 * MiB, 2 * MiB, "small", [(54 * MiB, 2 * MiB, None)]),
                            (56 * MiB, 20 * MiB, "large", [(56 * MiB, 4 * MiB, 4), (60 * MiB, 16 * MiB, None)])]


def test_expandable_block_starts_at_a_free_block_before_unmapped_pages():
    """find_expandable_block walks the unmapped blocks in address order; a run may start at the free block just
    before one and must hold the request exactly or more. Capacity 100 MiB: the large range is 6 x 20 MiB pages.
    35, 5 and 60 MiB map pages 0-4 (100 MiB); freeing the 35 MiB leaves it free. 36 MiB fits no cached block, and
    no run (20 unmapped at 100 MiB) holds it: a second range at 120 MiB whose 2 pages do not fit; the release
    unmaps page 0 (0-20 MiB, 15 MiB free stay mapped) and the retry fails the same way: OOM. 35 MiB then starts
    at the unmapped page 0 (20 + 15 = 35 exactly), maps it (80 + 20 = 100) and takes the merged 35 MiB."""
    model = caching(100, expandable_segments=True)
    assert model.allocate(1, 35 * MiB) and model.allocate(2, 5 * MiB) and model.allocate(3, 60 * MiB)
    model.free(1)
    assert not model.allocate(4, 36 * MiB)
    assert shape(model) == [(20 * MiB, 80 * MiB, "large", [(20 * MiB, 15 * MiB, None), (35 * MiB, 5 * MiB, 2),
                                                           (40 * MiB, 60 * MiB, 3)])]
    assert (model.stats().reserved_bytes, model.stats().segments) == (80 * MiB, 1)
    assert model.allocate(5, 35 * MiB)  # the page mapped joins the run after it: still one segment
    assert shape(model) == [(0, 100 * MiB, "large", [(0, 35 * MiB, 5), (35 * MiB, 5 * MiB, 2), (40 * MiB, 60 * MiB, 3)])]
    assert (model.stats().reserved_bytes, model.stats().segments) == (100 * MiB, 1)


def test_expandable_ranges_are_nine_eighths_of_the_capacity_in_whole_pages():
    """An expandable segment reserves address space for capacity + capacity // 8 bytes, rounded up to whole pages
    (ceil). Capacity 37282703 B: + 4660337 = 41943040, exactly 2 large pages, so the small segment a later request
    creates starts at 40 MiB. Capacity 100 MiB: a 120 MiB request is exactly the large range (6 pages), so a range
    is still reserved for it although its pages never fit (OOM), and the next small segment starts after it."""
    model = get_memory_model("caching", 37282703, expandable_segments=True)
    assert model.allocate(1, 3 * MiB // 2) and model.allocate(2, 1000)
    assert [s[:3] for s in shape(model)] == [(0, 20 * MiB, "large"), (40 * MiB, 2 * MiB, "small")]
    whole = caching(100, expandable_segments=True)
    assert not whole.allocate(1, 120 * MiB)
    assert whole.allocate(2, 1000)
    assert shape(whole) == [(120 * MiB, 2 * MiB, "small", [(120 * MiB, 1024, 2), (120 * MiB + 1024, 2 * MiB - 1024, None)])]


def test_max_split_size_at_its_boundaries():
    """max_split_size 24 MiB: a 24 MiB request is oversize (should_split splits only requests below the limit,
    get_free_block keeps only those off oversize blocks), so it takes the cached 30 MiB block whole (30 < 24 + 20);
    a cached block of exactly 24 + 20 = 44 MiB is too large for it: a new 24 MiB segment."""
    model = caching(max_split_size=24 * MiB)
    assert model.allocate(1, 30 * MiB)
    model.free(1)
    assert model.allocate(2, 24 * MiB)
    assert model.allocate(3, 44 * MiB)  # at 30 MiB
    model.free(3)
    assert model.allocate(4, 24 * MiB)
    assert shape(model) == [(0, 30 * MiB, "large", [(0, 30 * MiB, 2)]),
                            (30 * MiB, 44 * MiB, "large", [(30 * MiB, 44 * MiB, None)]),
                            (74 * MiB, 24 * MiB, "large", [(74 * MiB, 24 * MiB, 4)])]


def test_expandable_best_fit_walks_on_only_past_blocks_that_can_grow():
    """One 20 MiB page holds 2|1.5|3.5|1.5|3.5|1.5|2.5|1.5 MiB (ids 1-8; 1.5 MiB keeps them all in the large pool)
    and a free 2.5 MiB tail that can grow by 100 MiB; 1, 3 and 5 are freed. 2.5 MiB: the search starts at the
    tail (2.5 MiB), which counts as 102.5, walks on to the 3.5 MiB block at 3.5 MiB, and stops there: the next,
    3.5 MiB at 8.5 MiB, counts as much, not less. Its 1 MiB remainder is split off. Then 7 (2.5 MiB at 13.5 MiB,
    before the tail in address order) is freed; 2.5 MiB takes it: the tail after it counts for more."""
    model = caching(100, expandable_segments=True)
    for block_id, kib in enumerate((2048, 1536, 3584, 1536, 3584, 1536, 2560, 1536), start=1):
        assert model.allocate(block_id, kib * KiB)
    for block_id in (1, 3, 5):
        model.free(block_id)
    assert model.allocate(9, 2560 * KiB)
    model.free(7)
    assert model.allocate(10, 2560 * KiB)
    assert shape(model) == [(0, 20 * MiB, "large", [(kib * KiB, size * KiB, owner) for kib, size, owner in (
        (0, 2048, None), (2048, 1536, 2), (3584, 2560, 9), (6144, 1024, None), (7168, 1536, 4), (8704, 3584, None),
        (12288, 1536, 6), (13824, 2560, 10), (16384, 1536, 8), (17920, 2560, None))])]


def test_expandable_pages_mapped_after_full_ones_and_unmapped_between():
    """Capacity 60 MiB: the large range is 4 pages (67.5 MiB rounded up) at 0, three 20 MiB blocks fill pages 0-2
    (each mapped after an allocated one). With the middle one freed, 1000 B needs a small page: the small range
    (34 x 2 MiB) at 80 MiB, 60 + 2 > 60, so the release unmaps page 1; two mapped runs of the large range and
    the small page show as three segments."""
    model = caching(60, expandable_segments=True)
    for block_id in (1, 2, 3):
        assert model.allocate(block_id, 20 * MiB)
    model.free(2)
    assert model.allocate(4, 1000)
    assert shape(model) == [(0, 20 * MiB, "large", [(0, 20 * MiB, 1)]), (40 * MiB, 20 * MiB, "large", [(40 * MiB, 20 * MiB, 3)]),
                            (80 * MiB, 2 * MiB, "small", [(80 * MiB, 1024, 4), (80 * MiB + 1024, 2 * MiB - 1024, None)])]
    stats = model.stats()
    assert (stats.reserved_bytes, stats.segments) == (42 * MiB, 3)


def test_reuse_merges_released_ranges_and_keeps_the_rest():
    """address_policy="reuse" (capacity 64 MiB): five 12 MiB segments at 0, 12, ..., 48 MiB; 1, 3 and 4 freed.
    16 MiB fits nothing cached and 60 + 16 > 64: the release drops 0-12, 24-36 and 36-48 (in (size, address)
    order), the last two merging into 24-48. 16 MiB takes 24-40, leaving 40-48 released; 14 MiB then fits no
    released range (0-12, 40-48) and goes to the bump pointer, 60 MiB."""
    model = caching(64, address_policy="reuse")
    for block_id in range(1, 6):
        assert model.allocate(block_id, 12 * MiB)
    for block_id in (1, 3, 4):
        model.free(block_id)
    assert model.allocate(6, 16 * MiB) and model.allocate(7, 14 * MiB)
    assert [(s[0], s[1], s[3][0][2]) for s in shape(model)] == [
        (12 * MiB, 12 * MiB, 2), (24 * MiB, 16 * MiB, 6), (48 * MiB, 12 * MiB, 5), (60 * MiB, 14 * MiB, 7)]


def test_expandable_addresses_past_2_to_the_53_stay_exact():
    """On the 'unlimited' 2^62-byte device the small range (created first) is 1.125 x 2^62 = 2^62 + 2^59 bytes, a
    whole number of 2 MiB pages, so the large range starts there. A block split 512 B past the start of its second
    page lies at 2^62 + 2^59 + 21 MiB + 512, which takes 54 significant bits (a float holds 53)."""
    model = get_memory_model("caching", 1 << 62, expandable_segments=True)
    start = (1 << 62) + (1 << 59)
    assert model.allocate(1, 1000) and model.allocate(2, 20 * MiB) and model.allocate(3, MiB + 512)
    assert shape(model)[1] == (start, 40 * MiB, "large", [(start, 20 * MiB, 2), (start + 20 * MiB, MiB + 512, 3),
                                                          (start + 21 * MiB + 512, 19 * MiB - 512, None)])


def test_roundup_power2_divisions():
    four = caching(roundup_power2_divisions=4)
    # Up to 4 x 512 B the 512 B rounding applies; above it the next quarter between powers of 2.
    assert [four.request_bytes(s) for s in (1200, 2048, 9000, MiB + 1, 10 * MiB + 1, 8 * MiB)] == [
        1536, 2048, 10240, MiB + 256 * KiB, 12 * MiB, 8 * MiB]
    assert caching().request_bytes(9000) == 9216
    assert four.allocate(1, 9000)
    assert shape(four)[0][3][0] == (0, 10240, 1)
    # Per interval: 2 MiB (and below) -> 2 divisions, 8 MiB -> 4, the 4 MiB interval stays 0.
    table = caching(roundup_power2_divisions={2: 2, 8: 4})
    assert [table.request_bytes(s) for s in (MiB + 1, 3 * MiB + 1, 5 * MiB + 1, 9 * MiB + 1)] == [
        MiB + 512 * KiB, 4 * MiB, 5 * MiB + 512, 10 * MiB]
    # '>' fills from the last listed interval on, that interval included (as PyTorch's parser does).
    rest = caching(roundup_power2_divisions={"2": 2, ">": 8})
    assert [rest.request_bytes(s) for s in (MiB + 1, 3 * MiB + 1)] == [MiB + 512 * KiB, 3 * MiB + 256 * KiB]


def test_zero_byte_requests_take_no_block():
    model = caching()
    assert model.request_bytes(0) == 0
    assert model.allocate(1, 0)
    assert model.layout() == [] and model.block_of(1) is None
    model.free(1)
    assert model.stats().allocated_bytes == 0


# ---------------------------------------------------------------- the unbounded event sequence

def test_unbounded_events_match_the_baseline_peak(small_resnet):
    from dtrlab.runtime.baseline import baseline

    events = unbounded_events(small_resnet)
    live = peak = 0
    for event in events:
        live += event.size if event.kind == "alloc" else -event.size
        peak = max(peak, live)
    assert peak == baseline(small_resnet).peak_memory
    model = caching(1024)
    assert replay(model, events) == len(events)
    stats = model.stats()
    assert peak <= stats.peak_allocated_bytes <= stats.peak_reserved_bytes
    assert replay(get_memory_model("flat", peak - 1), events) < len(events)


# ---------------------------------------------------------------- properties of every model

MODEL_SPECS = [
    ("flat", {}), ("aligned", {}), ("aligned", {"granularity": 4096}), ("caching", {}),
    ("caching", {"expandable_segments": True}), ("caching", {"max_split_size": 22 * MiB}),
    ("caching", {"roundup_power2_divisions": 4}),
]

sizes = st.one_of(st.integers(0, 4 * KiB), st.integers(1, 2 * MiB), st.integers(MiB, 40 * MiB))
operations = st.lists(st.one_of(st.tuples(st.just("alloc"), sizes), st.tuples(st.just("free"), st.integers(0, 50))),
                      max_size=60)


def run_checked(model: MemoryModel, ops) -> list:
    """Apply ``ops`` (frees pick a live block by index), checking the invariants after each; return
    the outcomes and layouts, for determinism."""
    live, history, next_id = [], [], 0
    for kind, value in ops:
        if kind == "alloc":
            before = model.stats().allocated_bytes
            ok = model.allocate(next_id, value)
            if not model.address_aware:
                assert ok == (before + model.request_bytes(value) <= model.capacity_bytes)
            if ok:
                live.append((next_id, value))
            history.append(ok)
            next_id += 1
        elif live:
            model.free(live.pop(value % len(live))[0])
        check_invariants(model, live)
        history.append(model.layout())
    return history


def check_invariants(model: MemoryModel, live: list[tuple[int, int]]) -> None:
    layout, stats = model.layout(), model.stats()
    end, allocated, reserved, owners = -1, 0, 0, {}
    for segment in layout:
        assert isinstance(segment, Segment)
        assert segment.address >= end  # segments never overlap
        position = segment.address
        free_bytes = used_bytes = 0
        for block in segment.blocks:
            assert block.address == position and block.size > 0  # blocks tile the segment, no overlap
            position += block.size
            if block.block_id is None:
                free_bytes += block.size
            else:
                used_bytes += block.size
                owners[block.block_id] = block.requested
                assert block.size >= model.request_bytes(block.requested)
        assert free_bytes + used_bytes == segment.size  # free + allocated = reserved, per segment
        end = position
        allocated += used_bytes
        reserved += segment.size
    assert owners == {block_id: size for block_id, size in live if size > 0}  # each live block placed once
    assert (allocated, reserved, len(layout)) == (stats.allocated_bytes, stats.reserved_bytes, stats.segments)
    assert stats.allocated_bytes <= stats.reserved_bytes <= model.capacity_bytes
    assert stats.peak_allocated_bytes <= stats.peak_reserved_bytes <= model.capacity_bytes
    free_sizes = [b.size for s in layout for b in s.blocks if b.block_id is None]
    assert stats.largest_free_block == max(free_sizes, default=0)


@pytest.mark.parametrize(("name", "options"), MODEL_SPECS, ids=[f"{n}-{o}" for n, o in MODEL_SPECS])
@settings(max_examples=100, deadline=None)
@given(capacity_mib=st.sampled_from([4, 24, 64, 160]), ops=operations)
def test_invariants_and_determinism(name, options, capacity_mib, ops):
    first = run_checked(get_memory_model(name, capacity_mib * MiB, **options), ops)
    second = run_checked(get_memory_model(name, capacity_mib * MiB, **options), ops)
    assert first == second


def test_roundup_power2_next_division_by_hand():
    """PyTorch's roundup_power2_next_division, derived by hand: a power of 2 stays (even where the step would be 0);
    1200 with 4 divisions of 1024..2048 goes to 1280, 1280 stays, 1025 with 1 division goes to 2048; 3 with 4
    divisions has a step of 0 (2 >> 2), so it goes to the next power of 2, 4."""
    from dtrlab.memory.caching import _roundup_power2_next_division as next_division
    cases = {(1, 4): 1, (2, 4): 2, (1024, 4): 1024, (1200, 4): 1280, (1280, 4): 1280, (1025, 1): 2048, (3, 4): 4,
             (3 * 2**20 + 1, 4): 3 * 2**20 + 2**19}
    assert {case: next_division(*case) for case in cases} == cases


def test_roundup_power2_divisions_option_by_hand():
    """Intervals are powers of 2 MiB (1 included, 0 and names not); divisions are 0 or powers of 2 (1 included)."""
    from dtrlab.memory import CachingModel
    from dtrlab.memory.caching import _divisions_table
    assert _divisions_table(CachingModel(2**30, roundup_power2_divisions={"1": 4, "2": 2})._options[
        "roundup_power2_divisions"])[:3] == [4, 2, 0]
    assert CachingModel(2**30, roundup_power2_divisions=1).request_bytes(1200) == 1536  # 512-byte blocks: 3 of them
    # '>' first fills every interval; a later interval, the first listed, still sets all below it too. Intervals
    # index 2^i MiB as i, and from 32 GiB (index 15, the last) on all share the last: 64 GiB is index 15, not 16.
    assert _divisions_table({">": 4}) == [4] * 16
    assert _divisions_table({">": 2, "4": 8}) == [8, 8, 8] + [2] * 13
    assert _divisions_table({"1": 0, "32768": 4}) == _divisions_table({"1": 0, "65536": 4}) == [0] * 15 + [4]
    last = CachingModel(2**40, roundup_power2_divisions={"1": 0, "32768": 4})
    assert [last.request_bytes(size) for size in (2**35 - 1, 2**35 + 1, 2**36 + 1)] == [
        2**35, 2**35 + 2**33, 2**36 + 2**34]  # 4 steps of 8 GiB, then of 16 GiB; below 32 GiB 512 B rounding
    for bad, message in (({"0": 4}, r"interval '0' must be a power of 2 \(MiB\) or '>'"),
                         ({"abc": 4}, r"interval 'abc' must be a power of 2 \(MiB\) or '>'"),
                         ({"2": -1}, r"\['2'\] must be >= 0, got -1")):
        with pytest.raises(ValueError, match=r"^roundup_power2_divisions(: |)" + message + "$"):
            CachingModel(2**30, roundup_power2_divisions=bad)


def test_caching_option_errors_word_for_word():
    """PyTorch's kLargeBuffer is 20 MiB: a split limit must be a whole number of MiB above it, 21 MiB = 22020096
    bytes or more. A divisions table may switch rounding off for one interval with 0."""
    from dtrlab.memory import CachingModel
    for options, message in (
            ({"max_split_size": 5}, "max_split_size must be None (no limit) or a whole number of MiB above 20 MiB "
                                    "(22020096 bytes or more, as max_split_size_mb in PyTorch), got 5"),
            ({"max_split_size": "x"}, "max_split_size must be an integer, got 'x'"),
            ({"roundup_power2_divisions": -2}, "roundup_power2_divisions must be >= 0, got -2"),
            ({"roundup_power2_divisions": 3}, "roundup_power2_divisions must be 0 (off) or a power of 2, got 3"),
            ({"max_split_size": 32 * 2**20, "expandable_segments": True},
             "max_split_size cannot be combined with expandable_segments=True "
             "(PyTorch's release_available_cached_blocks cannot release expandable blocks)")):
        with pytest.raises(ValueError) as refused:
            CachingModel(2**30, **options)
        assert str(refused.value) == message
    assert CachingModel(2**30, max_split_size=21 * 2**20).core_args()[4] == 21 * 2**20
    assert CachingModel(2**30, roundup_power2_divisions={"2": 0}).core_args()[5][:2] == (0, 0)
