"""Evicted neighbourhoods (simrd's "regions"), maintained incrementally.

For every resident storage ``s`` the index keeps two regions: the forward one
(through children) and the reverse one (through parents). A region's *interior* is
the set of evicted storages reachable from ``s`` through evicted storages only; its
*frontier* is the resident storages where that walk stops; its *compute* is the sum
of the interior's compute costs. h_DTR's e* cost is ``compute(s) + forward compute +
reverse compute``.

simrd maintains regions with two rules, which this index keeps exactly, including
their quirks (an interior's compute is summed when a storage joins it and is not
updated if that storage's compute changes later; a region can include outputs whose
operator is still being materialized):

* **rebuild** (a storage becomes resident): walk its regions afresh, then rebuild the
  regions of every frontier storage, because their interiors may have been split;
* **absorb** (a storage is evicted): each frontier storage's region swallows the
  evicted storage and its region, then the evicted storage's regions are cleared.

The walk is over a storage-level adjacency: ``link(p, c)`` records that a tensor of
storage ``c`` was computed from a tensor of storage ``p``.

Two implementations share this interface: :class:`PyRegionIndex` below, the readable
reference, and the compiled ``dtrlab.runtime._regions.RegionIndex`` (bitsets, no
per-walk allocation), which is what makes the e* policies fast. Tests check that the
two agree.
"""

from __future__ import annotations


class RegionError(RuntimeError):
    """The incremental invariants broke; simrd fails an assertion at the same point.

    This happens only on graphs with a storage-level cycle (an operator output that
    aliases one argument while reading another), which the DTR logs do not contain.
    """


class PyRegionIndex:
    """Pure-Python region index. ``material``, ``compute`` and the two compute
    arrays are shared with the simulator (the index writes only the latter two)."""

    def __init__(self, n: int, material, compute, region_compute, region_rev_compute):
        self.material = material
        self.compute = compute
        self.region_compute = region_compute
        self.region_rev_compute = region_rev_compute
        self.children: list[set[int]] = [set() for _ in range(n)]
        self.parents: list[set[int]] = [set() for _ in range(n)]
        self.interior: list[set[int]] = [set() for _ in range(n)]
        self.frontier: list[set[int]] = [set() for _ in range(n)]
        self.rev_interior: list[set[int]] = [set() for _ in range(n)]
        self.rev_frontier: list[set[int]] = [set() for _ in range(n)]

    def link(self, parent: int, child: int) -> None:
        if parent != child:  # a self-edge never changes a walk
            self.children[parent].add(child)
            self.parents[child].add(parent)

    def _walk(self, base: int, forward: bool) -> None:
        edges = self.children if forward else self.parents
        material, compute = self.material, self.compute
        interior, frontier = set(), set()
        gained = 0
        stack = [base]
        while stack:
            for us in edges[stack.pop()]:
                if material[us]:
                    if us != base:
                        frontier.add(us)
                elif us not in interior:
                    gained += compute[us]
                    interior.add(us)
                    stack.append(us)
        if forward:
            self.interior[base], self.frontier[base], self.region_compute[base] = interior, frontier, gained
        else:
            self.rev_interior[base], self.rev_frontier[base], self.region_rev_compute[base] = interior, frontier, gained

    def materialized(self, storages) -> None:
        """``storages`` just became resident: rebuild them and their frontiers' regions."""
        affected, affected_rev = set(), set()
        for s in storages:
            self._walk(s, True)
            self._walk(s, False)
            affected.update(self.rev_frontier[s])
            affected_rev.update(self.frontier[s])
        for s in affected:
            self._walk(s, True)
        for s in affected_rev:
            self._walk(s, False)

    def _absorb(self, interior: set, frontier: set, s: int, s_interior: set, s_frontier: set) -> int:
        if s not in frontier:
            raise RegionError(f"storage {s} is not on the frontier of a region it should join "
                              "(simrd fails the same assertion here)")
        frontier.remove(s)
        frontier.update(s_frontier)
        added = s_interior - interior
        added.add(s)
        interior.update(added)
        compute = self.compute
        return sum(compute[u] for u in added)

    def evicted(self, s: int) -> None:
        """``s`` was just evicted: its frontier storages absorb it, then its regions are cleared."""
        for p in self.rev_frontier[s]:
            self.region_compute[p] += self._absorb(self.interior[p], self.frontier[p], s,
                                                   self.interior[s], self.frontier[s])
        for c in self.frontier[s]:
            self.region_rev_compute[c] += self._absorb(self.rev_interior[c], self.rev_frontier[c], s,
                                                       self.rev_interior[s], self.rev_frontier[s])
        for region in (self.interior, self.frontier, self.rev_interior, self.rev_frontier):
            region[s] = set()
        self.region_compute[s] = 0
        self.region_rev_compute[s] = 0

    def region(self, s: int, forward: bool = True) -> tuple[list[int], list[int]]:
        """(sorted interior, sorted frontier) of one region, for inspection and tests."""
        if forward:
            return sorted(self.interior[s]), sorted(self.frontier[s])
        return sorted(self.rev_interior[s]), sorted(self.rev_frontier[s])
