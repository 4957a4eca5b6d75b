"""``caching``: a model of PyTorch's CUDA caching allocator (torch 2.x, one device, one stream).

The rules follow ``c10/cuda/CUDACachingAllocator.cpp``; each is named after the
function or constant it models (docs/memory.md lists them and what is left out):

* ``round_size``: requests round up to 512 B (``kMinBlockSize``), or to a
  power-of-2 division (``roundup_power2_divisions``).
* ``get_pool``: rounded requests <= 1 MiB (``kSmallSize``) use the small pool,
  larger ones the large pool; pools never share blocks.
* ``get_allocation_size``: a new small segment is 2 MiB (``kSmallBuffer``); a
  large request below 10 MiB (``kMinLargeAlloc``) gets a 20 MiB segment
  (``kLargeBuffer``), a larger one its size rounded up to 2 MiB (``kRoundLarge``).
* ``get_free_block``: best fit, the cached free block of the pool that is first
  in (size, address) order among those large enough (``BlockComparatorSize``),
  with the ``max_split_size`` limits on oversize blocks.
* ``should_split``/``alloc_found_block``: the request takes the low end of the
  block; the remainder stays cached if it is >= 512 B (small pool, expandable
  segments) or > 1 MiB (large pool, and only for requests below ``max_split_size``).
* ``free_block``/``try_merge_blocks``: a freed block merges with free neighbours
  of its own segment; segments never merge and are not returned on free.
* ``malloc``: when no cached block fits, reserve a new segment (``alloc_block``);
  if that would exceed the capacity, release oversize cached segments
  (``release_available_cached_blocks``) and retry, then release every wholly
  free cached segment (``release_cached_blocks``) and retry; only then OOM.
* ``expandable_segments``: one virtual segment per pool, mapped in 2 MiB (small)
  or 20 MiB (large) pages as it grows (``find_expandable_block``,
  ``try_allocate_expandable_block``, ``map_block``); releasing the cache unmaps
  the free whole pages (``unmap_block``).

The capacity plays the device memory: reserved bytes (segments, mapped pages)
never exceed it (``limit_check="mapped"``, the default). With
``limit_check="allocation_size"`` it plays ``set_per_process_memory_fraction``
instead, checked as ``alloc_block`` checks it: reserved + ``get_allocation_size``
of the request against the limit *before* a segment is reserved or pages are
mapped; the pages then mapped may pass the limit by less than one page.

Addresses are deterministic: with ``address_policy="bump"`` (the default) new
segments are placed by a bump pointer from 0 and an address range is never
reused; with ``"reuse"`` a new segment takes the lowest released range that holds
it (real ``cudaMalloc`` addresses are the driver's and may be either).
"""

from __future__ import annotations

from bisect import bisect_left, insort

from .base import MemoryModel, MemoryStats, Segment, Block, check_bool, check_int, register_memory_model
from .core_args import MAX_BYTES, MAX_DIVISIONS, MEM_CACHING, NO_SPLIT

MiB = 1 << 20
K_MIN_BLOCK_SIZE = 512  # kMinBlockSize: every size rounds up to a multiple of this
K_SMALL_SIZE = MiB  # kSmallSize: largest request of the small pool
K_SMALL_BUFFER = 2 * MiB  # kSmallBuffer: small-pool segment (and expandable page) size
K_LARGE_BUFFER = 20 * MiB  # kLargeBuffer: large-pool segment for 1-10 MiB requests (and expandable page)
K_MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc: from here on a request gets its own rounded segment
K_ROUND_LARGE = 2 * MiB  # kRoundLarge: rounding of those segments
ROUNDUP_INTERVALS = 16  # kRoundUpPowerOfTwoIntervals: 1 MiB, 2 MiB, ..., >= 32 GiB
NO_SPLIT_LIMIT = (1 << 64) - 1  # max_split_size's default: SIZE_MAX, i.e. no limit
LIMIT_CHECKS = ("mapped", "allocation_size")
ADDRESS_POLICIES = ("bump", "reuse")


class _Blk:
    """A block of a segment: allocated (``owner`` set), free and mapped, or unmapped (expandable only)."""

    __slots__ = ("addr", "size", "requested", "owner", "prev", "next", "seg", "mapped")

    def __init__(self, addr, size, seg, mapped=True):
        self.addr, self.size, self.seg, self.mapped = addr, size, seg, mapped
        self.requested = 0
        self.owner = None
        self.prev = self.next = None


class _Seg:
    """A ``cudaMalloc`` segment, or an expandable segment's virtual address range (``page`` > 0)."""

    __slots__ = ("addr", "size", "pool", "head", "page")

    def __init__(self, addr, size, pool, page=0):
        self.addr, self.size, self.pool, self.page = addr, size, pool, page
        self.head = None  # lowest-address block; merges and splits keep it the same object


class _Pool:
    """One block pool: its cached free blocks ordered by (size, address), and its unmapped ranges."""

    __slots__ = ("name", "small", "free", "unmapped")

    def __init__(self, name, small):
        self.name, self.small = name, small
        self.free: list[tuple[int, int]] = []  # (size, address) of free mapped blocks
        self.unmapped: list[int] = []  # addresses of unmapped blocks (expandable segments only)


def _max_split_size(key, value):
    if value is None:
        return None
    value = check_int(key, value)
    # CUDAAllocatorConfig::parseMaxSplitSize: given in whole MiB, and more than kLargeBuffer.
    if value <= K_LARGE_BUFFER or value % MiB:
        raise ValueError(f"{key} must be None (no limit) or a whole number of MiB above {K_LARGE_BUFFER // MiB} MiB "
                         f"({K_LARGE_BUFFER + MiB} bytes or more, as max_split_size_mb in PyTorch), got {value}")
    return value


def _choice(choices):
    def validate(key, value):
        if value not in choices:
            raise ValueError(f"{key} must be one of {', '.join(map(repr, choices))}, got {value!r}")
        return value
    return validate


def _is_power_of_2(n):
    return n > 0 and n & (n - 1) == 0


def _roundup_power2_divisions(key, value):
    """An int (0 = off, else a power of 2 for every size) or an ordered dict {interval MiB | ">": divisions}."""
    if isinstance(value, dict):
        normalized = {}
        for interval, divisions in value.items():
            if interval != ">":
                try:
                    mib = int(interval)
                except (TypeError, ValueError):
                    mib = 0
                if isinstance(interval, bool) or not _is_power_of_2(mib):
                    raise ValueError(f"{key}: interval {interval!r} must be a power of 2 (MiB) or '>'")
                interval = str(mib)
            divisions = check_int(f"{key}[{interval!r}]", divisions, minimum=0)
            if divisions and not _is_power_of_2(divisions):
                raise ValueError(f"{key}[{interval!r}] must be 0 (no rounding) or a power of 2, got {divisions}")
            normalized[interval] = divisions
        if not normalized:
            raise ValueError(f"{key} must not be an empty dict")
        return normalized
    value = check_int(key, value, minimum=0)
    if value and not _is_power_of_2(value):
        raise ValueError(f"{key} must be 0 (off) or a power of 2, got {value}")
    return value


def _divisions_table(option) -> list[int]:
    """Divisions per size interval [2^i MiB, 2^(i+1) MiB), as CUDAAllocatorConfig::parseRoundUpPower2Divisions
    builds it: the first listed interval also sets all smaller ones, and '>' fills from the
    last listed interval (inclusive) to the end."""
    if isinstance(option, int):
        return [option] * ROUNDUP_INTERVALS
    table = [0] * ROUNDUP_INTERVALS
    first, last_index = True, 0
    for interval, divisions in option.items():
        if interval == ">":
            table[last_index:] = [divisions] * (ROUNDUP_INTERVALS - last_index)
            continue
        index = min(int(interval).bit_length() - 1, ROUNDUP_INTERVALS - 1)
        if first:
            table[:index] = [divisions] * index
            first = False
        table[index] = divisions
        last_index = index
    return table


@register_memory_model
class CachingModel(MemoryModel):
    name = "caching"
    address_aware = True
    option_specs = {
        "max_split_size": (None, _max_split_size),
        "expandable_segments": (False, check_bool),
        "roundup_power2_divisions": (0, _roundup_power2_divisions),
        "limit_check": ("mapped", _choice(LIMIT_CHECKS)),
        "address_policy": ("bump", _choice(ADDRESS_POLICIES)),
    }
    later_options = frozenset({"limit_check", "address_policy"})

    def __init__(self, capacity_bytes: int, **options):
        super().__init__(capacity_bytes, **options)
        opts = self._options
        if opts["expandable_segments"] and opts["max_split_size"] is not None:
            # PyTorch's release_available_cached_blocks would hand an expandable block to
            # release_block, which asserts it never gets one: the combination is not supported.
            raise ValueError("max_split_size cannot be combined with expandable_segments=True "
                             "(PyTorch's release_available_cached_blocks cannot release expandable blocks)")
        self._max_split = NO_SPLIT_LIMIT if opts["max_split_size"] is None else opts["max_split_size"]
        self._expandable = opts["expandable_segments"]
        self._divisions = _divisions_table(opts["roundup_power2_divisions"])
        self._rounds_power2 = any(d > 1 for d in self._divisions)
        self._small, self._large = _Pool("small", True), _Pool("large", False)
        self._free_at: dict[int, _Blk] = {}  # address -> free mapped block
        self._unmapped_at: dict[int, _Blk] = {}  # address -> unmapped block
        self._owned: dict[int, _Blk | None] = {}  # block_id -> its block (None for a 0-byte request)
        self._segments: dict[int, _Seg] = {}  # address -> segment
        self._next_address = 0
        self._check_before_mapping = opts["limit_check"] == "allocation_size"
        self._reuse_addresses = opts["address_policy"] == "reuse"
        self._released: list[list[int]] = []  # [address, size] of released ranges below the bump pointer
        self._allocated = self._reserved = 0
        self._peak_allocated = self._peak_reserved = 0
        self._mapped_runs = 0  # contiguous mapped ranges of expandable segments (snapshot segments)

    # ---- sizes -------------------------------------------------------------------------

    def request_bytes(self, size: int) -> int:
        """``round_size``; a 0-byte request takes no block (PyTorch returns a null pointer)."""
        if size < K_MIN_BLOCK_SIZE:
            return K_MIN_BLOCK_SIZE if size else 0
        if self._rounds_power2:
            divisions = self._divisions[min(max(size.bit_length() - 21, 0), ROUNDUP_INTERVALS - 1)]
            if divisions > 1 and size > K_MIN_BLOCK_SIZE * divisions:
                return _roundup_power2_next_division(size, divisions)
        return -(-size // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE

    @staticmethod
    def _allocation_size(size: int) -> int:
        """``get_allocation_size``: the segment a request reserves when no cached block fits."""
        if size <= K_SMALL_SIZE:
            return K_SMALL_BUFFER
        if size < K_MIN_LARGE_ALLOC:
            return K_LARGE_BUFFER
        return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE

    # ---- malloc / free -----------------------------------------------------------------

    def allocate(self, block_id: int, size: int) -> bool:
        if block_id in self._owned:
            raise ValueError(f"block {block_id} is already allocated")
        if size == 0:
            self._owned[block_id] = None
            return True
        rounded = self.request_bytes(size)
        pool = self._small if rounded <= K_SMALL_SIZE else self._large
        block = self._get_free_block(pool, rounded)
        if block is None:
            block = (self._alloc_block(pool, rounded)
                     or (self._release_available_cached_blocks(pool, rounded) and self._alloc_block(pool, rounded))
                     or (self._release_cached_blocks() and self._alloc_block(pool, rounded)))
            if not block:
                return False
        self._alloc_found_block(block, pool, rounded, size, block_id)
        return True

    def free(self, block_id: int) -> None:
        block = self._owned.pop(block_id)
        if block is None:
            return
        self._allocated -= block.size
        block.owner = None
        block.requested = 0
        self._add_free(self._merge_neighbours(block))

    def _get_free_block(self, pool: _Pool, size: int) -> _Blk | None:
        free = pool.free
        i = bisect_left(free, (size, -1))
        if i == len(free):
            return None
        if self._expandable:
            # A block followed by unmapped space counts as the size it could grow to, so the
            # search walks on while the next block in size order could grow to less.
            while i + 1 < len(free) and self._expandable_size(free[i + 1]) < self._expandable_size(free[i]):
                i += 1
        found_size = free[i][0]
        if size < self._max_split <= found_size:
            return None  # do not split an oversize block for a smaller request
        if size >= self._max_split and found_size >= size + K_LARGE_BUFFER:
            return None  # an oversize request may round up into a cached block, but by less than 20 MiB
        address = free.pop(i)[1]
        return self._free_at.pop(address)

    def _expandable_size(self, entry):
        block = self._free_at[entry[1]]
        nxt = block.next
        return block.size + (nxt.size if nxt is not None and not nxt.mapped else 0)

    def _alloc_found_block(self, block: _Blk, pool: _Pool, size: int, requested: int, block_id: int) -> None:
        remaining = block.size - size
        if pool.small or self._expandable:
            split = remaining >= K_MIN_BLOCK_SIZE
        else:
            split = size < self._max_split and remaining > K_SMALL_SIZE
        if split:
            rest = _Blk(block.addr + size, remaining, block.seg)
            self._link_after(block, rest)
            block.size = size
            self._add_free(rest)
        block.owner = block_id
        block.requested = requested
        self._owned[block_id] = block
        self._allocated += block.size
        if self._allocated > self._peak_allocated:
            self._peak_allocated = self._allocated

    def _alloc_block(self, pool: _Pool, size: int) -> _Blk | None:
        """A new segment for ``size`` (not yet in the pool), or None when it does not fit the capacity."""
        alloc_size = self._allocation_size(size)
        if self._check_before_mapping and self._reserved + alloc_size > self.capacity_bytes:
            return None  # alloc_block's per-process limit check, before anything is reserved or mapped
        if self._expandable:
            return self._try_allocate_expandable_block(pool, size)
        if self._reserved + alloc_size > self.capacity_bytes:
            return None
        seg = self._new_segment(alloc_size, pool)
        seg.head = _Blk(seg.addr, alloc_size, seg)
        self._grow_reserved(alloc_size)
        return seg.head

    def _release_available_cached_blocks(self, pool: _Pool, size: int) -> bool:
        """Release cached oversize segments of ``pool`` (only with a ``max_split_size``): the smallest
        one of at least max(size, max_split_size) bytes, else the largest ones until that many bytes
        are released. True if enough was released (the blocks released are gone either way)."""
        if self._max_split == NO_SPLIT_LIMIT:
            return False
        target = max(size, self._max_split)
        free = pool.free
        i = bisect_left(free, (target, -1))
        if i < len(free):
            self._release_segment(self._free_at[free[i][1]])
            return True
        released = 0
        while free and released < target and free[-1][0] >= self._max_split:
            released += free[-1][0]
            self._release_segment(self._free_at[free[-1][1]])
        return released >= target

    def _release_cached_blocks(self) -> bool:
        """Release every wholly free segment (large pool first, then small); with expandable
        segments, unmap the whole free pages and drop a segment left with no mapped page."""
        for pool in (self._large, self._small):
            cached = [self._free_at[address] for _, address in pool.free]
            for block in cached:
                if self._expandable:
                    unmapped = self._unmap_block(block)
                    if unmapped is not None and unmapped.prev is None and unmapped.next is None:
                        self._remove_unmapped(unmapped)
                        self._drop_segment(unmapped.seg)
                elif block.prev is None and block.next is None:
                    self._release_segment(block)
        return True

    def _release_segment(self, block: _Blk) -> None:
        # Only a whole cudaMalloc segment can be returned; an oversize cached block always is one
        # (oversize blocks are never split and nothing is split off them).
        assert block.prev is None and block.next is None and block.seg.page == 0, "not a whole segment"
        self._remove_free(block)
        self._drop_segment(block.seg)
        self._reserved -= block.size

    # ---- expandable segments -----------------------------------------------------------

    def _try_allocate_expandable_block(self, pool: _Pool, size: int) -> _Blk | None:
        candidate = self._find_expandable_block(pool, size)
        if candidate is None:
            return None
        if not candidate.mapped:
            candidate = self._map_block(candidate, min(candidate.size, size))
            if candidate is None:
                return None
        while candidate.size < size:
            # The candidate is free and mapped, followed by unmapped space: map more of it.
            nxt = candidate.next
            candidate = self._map_block(nxt, min(size - candidate.size, nxt.size))
            if candidate is None:
                return None
        self._remove_free(candidate)
        return candidate

    def _find_expandable_block(self, pool: _Pool, size: int) -> _Blk | None:
        """The lowest-address run of free and unmapped blocks with ``size`` bytes, starting at an
        unmapped block or the free block just before it; else a new expandable segment."""
        for address in pool.unmapped:
            start = self._unmapped_at[address]
            if start.prev is not None and start.prev.owner is None:
                start = start.prev
            room, block = 0, start
            while room < size and block is not None and block.owner is None:
                room += block.size
                block = block.next
            if room >= size:
                return start
        page = K_SMALL_BUFFER if pool.small else K_LARGE_BUFFER
        # PyTorch reserves address space for 1 1/8 of the device memory.
        pages = -(-(self.capacity_bytes + self.capacity_bytes // 8) // page)
        if pages * page < size:
            # No fresh segment could hold it either. PyTorch would still reserve one (address space
            # only) on every such attempt; skipping that changes no layout or statistic.
            return None
        seg = self._new_segment(pages * page, pool, page)
        seg.head = _Blk(seg.addr, seg.size, seg, mapped=False)
        self._add_unmapped(seg.head)
        return seg.head

    def _map_block(self, block: _Blk, size: int) -> _Blk | None:
        """Map the pages covering the first ``size`` bytes of the unmapped ``block`` (all or none);
        return the resulting free block, merged with free neighbours."""
        seg = block.seg
        first = (block.addr - seg.addr) // seg.page
        end = -(-(block.addr + size - seg.addr) // seg.page)
        nbytes = (end - first) * seg.page
        if nbytes == 0 or (not self._check_before_mapping and self._reserved + nbytes > self.capacity_bytes):
            return None
        self._remove_unmapped(block)
        if nbytes < block.size:
            rest = _Blk(block.addr + nbytes, block.size - nbytes, seg, mapped=False)
            self._link_after(block, rest)
            self._add_unmapped(rest)
            block.size = nbytes
        block.mapped = True
        self._mapped_runs += 1 - _is_mapped(block.prev) - _is_mapped(block.next)
        self._grow_reserved(nbytes)
        block = self._merge_neighbours(block)
        self._add_free(block)
        return block

    def _unmap_block(self, block: _Blk) -> _Blk | None:
        """Unmap the whole pages inside the free ``block``; partial pages at either end stay free
        and mapped. Return the unmapped block (merged with unmapped neighbours), or None."""
        seg = block.seg
        offset = block.addr - seg.addr
        first = -(-offset // seg.page)
        end = (offset + block.size) // seg.page
        if first >= end:
            return None
        self._remove_free(block)
        start, nbytes = seg.addr + first * seg.page, (end - first) * seg.page
        after = block.addr + block.size - (start + nbytes)
        if start > block.addr:  # keep the low partial page as the (still free) block
            block.size = start - block.addr
            self._add_free(block)
            unmapped = _Blk(start, nbytes, seg, mapped=False)
            self._link_after(block, unmapped)
        else:
            unmapped = block
            unmapped.size = nbytes
            unmapped.mapped = False
        if after:
            tail = _Blk(start + nbytes, after, seg)
            self._link_after(unmapped, tail)
            self._add_free(tail)
        self._reserved -= nbytes
        self._mapped_runs += _is_mapped(unmapped.prev) + _is_mapped(unmapped.next) - 1
        unmapped = self._merge_neighbours(unmapped)
        self._add_unmapped(unmapped)
        return unmapped

    # ---- block bookkeeping -------------------------------------------------------------

    def _new_segment(self, size: int, pool: _Pool, page: int = 0) -> _Seg:
        address = self._reused_address(size) if self._released else None
        if address is None:
            address = self._next_address
            self._next_address += size
        seg = _Seg(address, size, pool, page)
        self._segments[seg.addr] = seg
        return seg

    def _reused_address(self, size: int) -> int | None:
        """``address_policy="reuse"``: the low end of the lowest released range that holds ``size``."""
        for index, (address, room) in enumerate(self._released):
            if room >= size:
                if room == size:
                    del self._released[index]
                else:
                    self._released[index] = [address + size, room - size]
                return address
        return None

    def _drop_segment(self, seg: _Seg) -> None:
        """Forget a released segment; under ``address_policy="reuse"`` its range becomes reusable (merged
        with released neighbours; a range that reaches the bump pointer lowers it)."""
        del self._segments[seg.addr]
        if not self._reuse_addresses:
            return
        released = self._released
        index = bisect_left(released, [seg.addr, 0])
        start, end = seg.addr, seg.addr + seg.size
        if index < len(released) and released[index][0] == end:
            end += released.pop(index)[1]
        if index > 0 and sum(released[index - 1]) == start:
            index -= 1
            start = released.pop(index)[0]
        if end == self._next_address:
            self._next_address = start
        else:
            released.insert(index, [start, end - start])

    def _grow_reserved(self, nbytes: int) -> None:
        self._reserved += nbytes
        if self._reserved > self._peak_reserved:
            self._peak_reserved = self._reserved

    @staticmethod
    def _link_after(block: _Blk, new: _Blk) -> None:
        new.prev, new.next = block, block.next
        if block.next is not None:
            block.next.prev = new
        block.next = new

    def _merge_neighbours(self, block: _Blk) -> _Blk:
        """``try_merge_blocks`` with both neighbours: absorb each that is unallocated and in the same
        mapped state. The lower block survives, so a segment's head object never changes."""
        prev = block.prev
        if prev is not None and prev.owner is None and prev.mapped == block.mapped:
            self._remove_cached(prev)
            prev.size += block.size
            prev.next = block.next
            if block.next is not None:
                block.next.prev = prev
            block = prev
        nxt = block.next
        if nxt is not None and nxt.owner is None and nxt.mapped == block.mapped:
            self._remove_cached(nxt)
            block.size += nxt.size
            block.next = nxt.next
            if nxt.next is not None:
                nxt.next.prev = block
        return block

    def _add_free(self, block: _Blk) -> None:
        insort(block.seg.pool.free, (block.size, block.addr))
        self._free_at[block.addr] = block

    def _remove_free(self, block: _Blk) -> None:
        free = block.seg.pool.free
        del free[bisect_left(free, (block.size, block.addr))]
        del self._free_at[block.addr]

    def _add_unmapped(self, block: _Blk) -> None:
        insort(block.seg.pool.unmapped, block.addr)
        self._unmapped_at[block.addr] = block

    def _remove_unmapped(self, block: _Blk) -> None:
        unmapped = block.seg.pool.unmapped
        del unmapped[bisect_left(unmapped, block.addr)]
        del self._unmapped_at[block.addr]

    def _remove_cached(self, block: _Blk) -> None:
        if block.mapped:
            self._remove_free(block)
        else:
            self._remove_unmapped(block)

    # ---- inspection --------------------------------------------------------------------

    def layout(self) -> list[Segment]:
        """Segments in address order; an expandable segment shows one segment per mapped run
        of pages, as ``torch.cuda.memory_snapshot()`` does."""
        out = []
        for address in sorted(self._segments):
            seg = self._segments[address]
            run: list[Block] = []
            block = seg.head
            while block is not None:
                if block.mapped:
                    run.append(Block(block.addr, block.size, block.requested, block.owner))
                if run and (not block.mapped or block.next is None):
                    start = run[0].address
                    out.append(Segment(start, run[-1].address + run[-1].size - start, seg.pool.name, tuple(run)))
                    run = []
                block = block.next
        return out

    def stats(self) -> MemoryStats:
        largest = max((pool.free[-1][0] for pool in (self._small, self._large) if pool.free), default=0)
        segments = self._mapped_runs if self._expandable else len(self._segments)
        return MemoryStats(allocated_bytes=self._allocated, reserved_bytes=self._reserved,
                           peak_allocated_bytes=self._peak_allocated, peak_reserved_bytes=self._peak_reserved,
                           largest_free_block=largest, segments=segments)

    def core_args(self) -> tuple | None:
        # A subclass may change a rule the C model hard-codes.
        if type(self) is not CachingModel or self.capacity_bytes > MAX_BYTES or max(self._divisions) > MAX_DIVISIONS:
            return None
        opts = self._options
        max_split = opts["max_split_size"]
        if max_split is not None and max_split > MAX_BYTES:
            return None
        return (MEM_CACHING, self.capacity_bytes, 1, opts["expandable_segments"],
                NO_SPLIT if max_split is None else max_split, tuple(self._divisions),
                self._check_before_mapping, self._reuse_addresses)

    def block_of(self, block_id: int) -> Block | None:
        """The block ``block_id`` holds (None for a 0-byte request); a ``KeyError`` if it holds none."""
        block = self._owned[block_id]
        return None if block is None else Block(block.addr, block.size, block.requested, block.owner)


def _is_mapped(block: _Blk | None) -> bool:
    return block is not None and block.mapped


def _roundup_power2_next_division(size: int, divisions: int) -> int:
    """``roundup_power2_next_division``: round up to the next of ``divisions`` equal steps between
    the powers of 2 around ``size`` (1200 with 4 divisions: steps 1024, 1280, 1536, 1792 -> 1280)."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    rounded = size & ~(step - 1)
    return size if rounded == size else rounded + step
