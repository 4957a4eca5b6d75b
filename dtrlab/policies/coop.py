"""Address-aware policies: Coop's sliding window and ``dtr_fit``.

Both read the memory model's layout (``sim.memory_model.layout()``) and the request
the runtime must place (``sim.request``, a :class:`~dtrlab.runtime.PlacementRequest`),
so they run only under an address-aware memory model (``memory="caching"``); under
a byte-counting model they refuse to start. docs/memory.md defines them.

**coop** follows Coop (Zhang et al., "Coop: Memory is not a Commodity", NeurIPS
2023, arXiv:2311.00591) as implemented in OneFlow (``DtrEpAllocator::
EvictAndFindPieceOnce``): slide a window over the address-ordered blocks of each
segment; a window is a contiguous run of free blocks and blocks of evictable
storages (a locked, pinned or withheld storage's block breaks it) whose bytes
cover the request; evict the window with the least summed cost. A block's cost is
its storage's recompute cost over its staleness, DTR's heuristic without the size
(OneFlow's ``RematableTensorStorage::cost`` with default flags; e* with
``cost="estar"``, the default, as its neighbour-cost option approximates): the
bytes of every window are the request's, so cost per window is what to compare,
and a free block costs nothing. Coop's cost density (compute over bytes) ranks
tensors for its allocation-side "cheap tensor partitioning", which this simulator
does not model (allocation is the memory model's). Our additions, where the
window cannot help: the window's segment must be of the request's pool
(caching: small for <= 1 MiB); when no segment holds a fitting window (the
request needs a new segment), the cheapest wholly evictable segment is evicted so
the allocator can release it; failing that, the single cheapest candidate.

**dtr_fit** (ours) is h_DTR with a block's size replaced by the free run its
eviction opens (its block plus the free blocks next to it), as MegEngine's DTE
and OneFlow's neighbour-size cost do; and when the bytes already fit but the
request cannot be placed, candidates whose run would hold the request come first.
"""

from __future__ import annotations

import math

from .ablations import COSTS, cost_function, cost_key
from .base import NotCompiled, Policy, register
from .core_spec import COST_CODES, P_COOP, P_DTR_FIT, runs_own

SMALL_POOL_LIMIT = 1 << 20  # the caching model's kSmallSize: larger rounded requests use the large pool


class AddressAware(Policy):
    """Base of policies that read block addresses: refuses byte-counting memory models."""

    address_aware = True

    def start(self, sim):
        model = sim.memory_model
        if model is None or not model.address_aware:
            name = "flat" if model is None else model.name
            raise ValueError(f"policy {self.name!r} evicts by block address and needs an address-aware memory "
                             f"model such as memory='caching'; the {name!r} model only counts bytes")

    def core_spec(self, build):
        raise NotCompiled("is an address-aware policy the compiled core does not implement")


def request_pool(model, size: int) -> str | None:
    """The pool a request goes to under the caching model (None: any segment)."""
    if model.name != "caching":
        return None
    return "small" if model.request_bytes(size) <= SMALL_POOL_LIMIT else "large"


@register(aliases=["Coop"])
class Coop(AddressAware):
    """Coop's sliding window: evict the contiguous run of free and evictable blocks that fits, at least cost."""

    name = "coop"
    # Place before evicting even while the bytes do not fit: the window is sized for the
    # block that failed.
    place_first = True

    @classmethod
    def parameters(cls):
        return {"cost": "estar"}

    def __init__(self, **params):
        super().__init__(**params)
        self.params["cost"] = cost_key(self.params["cost"])
        if self.params["cost"] == "nocost":
            raise ValueError("coop needs a recompute cost: estar, eqclass or local")
        feature = COSTS[self.params["cost"]][0]
        self.features = frozenset({feature} if feature else ())

    def start(self, sim):
        super().start(sim)
        self._numerator = cost_function(self.params["cost"])

    def cost_of(self, sim, s) -> float:
        """Recompute cost over staleness (inf at staleness 0, as h_DTR)."""
        stale = sim.clock - sim.last_access[s]
        return self._numerator(sim, s) / stale if stale > 0 else math.inf

    # The numerator is a closure set per run; process pools pickle the policy without it.
    def __getstate__(self):
        return {k: v for k, v in vars(self).items() if k != "_numerator"}

    def choose(self, sim, candidates):
        model, request = sim.memory_model, sim.request
        evictable = candidates if isinstance(candidates, dict) else set(candidates)
        _, size = request.block
        need = model.request_bytes(size)
        pool = request_pool(model, size)
        cost_of = self.cost_of
        segments = model.layout()
        costs = [[self._block_cost(sim, block, evictable) for block in seg.blocks] for seg in segments]
        best = None  # (cost, segment index, first block, last block)
        for index, seg in enumerate(segments):
            if pool is not None and seg.pool != pool:
                continue
            window = _cheapest_window(seg.blocks, costs[index], need)
            if window is not None and (best is None or window[0] < best[0]):
                best = (window[0], index, window[1], window[2])
        if best is None:  # no segment holds the request: free a whole segment for the allocator
            for index, seg in enumerate(segments):
                if None in costs[index] or all(block.block_id is None for block in seg.blocks):
                    continue
                cost = math.fsum(costs[index])
                if best is None or cost < best[0]:
                    best = (cost, index, 0, len(seg.blocks) - 1)
        if best is None:  # nothing contiguous can be freed: the single cheapest candidate
            return [min(candidates, key=lambda s: cost_of(sim, s))]
        _, index, first, last = best
        return [block.block_id for block in segments[index].blocks[first:last + 1] if block.block_id is not None]

    def _block_cost(self, sim, block, evictable):
        """0 for a free block, the storage's cost if evictable, None if it breaks a window."""
        if block.block_id is None:
            return 0
        return self.cost_of(sim, block.block_id) if block.block_id in evictable else None

    def label_params(self):
        return {k: v for k, v in self.params.items() if v != self.parameters()[k]}

    def core_spec(self, build):
        runs_own(self, Coop, ("choose", "start", "cost_of", "_block_cost"))
        try:
            cost = cost_key(self.params.get("cost"))  # what start() reads
        except (AttributeError, ValueError):
            cost = None
        if cost not in ("estar", "eqclass", "local"):
            raise NotCompiled(f"has cost {self.params.get('cost')!r}, not a recompute cost")
        build.require(COSTS[cost][0])
        return (P_COOP, None, COST_CODES[cost])


def _cheapest_window(blocks, costs, need: int):
    """(cost, first, last) of the least-cost run of unbroken blocks with >= ``need`` bytes and at
    least one evictable block; the lowest address wins a tie. None if no run fits."""
    best = None
    start = 0
    span = 0
    for end, block in enumerate(blocks):
        if costs[end] is None:  # a locked, pinned or withheld block: windows restart after it
            start, span = end + 1, 0
            continue
        span += block.size
        # Costs are >= 0, so the shortest fitting window ending here is the cheapest.
        while span - blocks[start].size >= need:
            span -= blocks[start].size
            start += 1
        if span >= need and any(blocks[i].block_id is not None for i in range(start, end + 1)):
            cost = math.fsum(costs[start:end + 1])
            if best is None or cost < best[0]:
                best = (cost, start, end)
    return best


@register(aliases=["DTRFit"])
class DTRFit(AddressAware):
    """h_DTR over the free run an eviction opens; while only placement fails, runs that hold the request first."""

    name = "dtr_fit"
    features = frozenset({"e_star"})

    def choose(self, sim, candidates):
        model, request = sim.memory_model, sim.request
        _, size = request.block
        need = model.request_bytes(size)
        pool = request_pool(model, size)
        runs = {}  # storage -> (bytes its eviction frees contiguously, whether they hold the request)
        for seg in model.layout():
            blocks = seg.blocks
            for i, block in enumerate(blocks):
                if block.block_id is None:
                    continue
                run = block.size
                if i > 0 and blocks[i - 1].block_id is None:
                    run += blocks[i - 1].size
                if i + 1 < len(blocks) and blocks[i + 1].block_id is None:
                    run += blocks[i + 1].size
                runs[block.block_id] = (run, run >= need and (pool is None or seg.pool == pool))
        # Tiers only while the bytes fit: then an eviction that opens no fitting run is wasted now.
        tiered = request.bytes_fit
        compute, region, region_rev = sim.compute_cost, sim.region_compute, sim.region_rev_compute
        clock, last_access = sim.clock, sim.last_access
        best_key, best = (2, math.inf), None
        for s in candidates:
            run, fits = runs.get(s, (0, False))  # a 0-byte storage holds no block
            denominator = run * (clock - last_access[s])
            score = (compute[s] + region[s] + region_rev[s]) / denominator if denominator > 0 else math.inf
            key = (0 if fits or not tiered else 1, score)
            if key <= best_key:  # simrd's rule: the last minimal candidate, stop at a 0 score
                best_key, best = key, s
            if key == (0, 0):
                break
        return [best]

    def core_spec(self, build):
        runs_own(self, DTRFit, ("choose", "start"))
        build.require("e_star")
        return (P_DTR_FIT, None)
