"""The hand-built chain of tests/test_solvers.py, whose costs and budgets are derived by hand; shared by
the tests of modules that do not need the solvers (the census of tests/test_holes.py)."""

from dtrlab.trace.builder import LogBuilder


def chain_log(costs=(5, 1, 1)) -> LogBuilder:
    """Forward layers a1..an (10 bytes each, costs ``costs``) after a pinned constant x, then
    their backward: b_n(a_n), then b_i(g_{i+1}, a_i), each releasing its arguments.

    With the default three layers (a1 is expensive, the others cost 1): without eviction
    the backward's first two steps hold a1, a2, a3/g3, g2 and x: 50 bytes. b2 needs g3, a2,
    g2 and x (40) and b1 needs g2, a1, g1 and x (40), so below 50 a1 must be gone at b2 and
    recomputed for b1: recompute 5 for budgets 40..49, none from 50. Below 40 (b2's own
    footprint) nothing fits.
    """
    log = LogBuilder()
    log.constant("x", 10)
    previous = "x"
    for i, cost in enumerate(costs, start=1):
        log.call(f"f{i}", [previous], [(f"a{i}", 10)], time=cost)
        previous = f"a{i}"
    log.backward()
    n = len(costs)
    log.call(f"b{n}", [f"a{n}"], [(f"g{n}", 10)], time=1)
    log.release(f"a{n}")
    for i in range(n - 1, 0, -1):
        log.call(f"b{i}", [f"g{i + 1}", f"a{i}"], [(f"g{i}", 10)], time=1)
        log.release(f"g{i + 1}", f"a{i}")
    return log


def chain_trace():
    """The default chain as a trace named "chain": a 50-byte peak; DTR fails below 40 bytes (b2's own footprint)
    and passes from it."""
    return chain_log().trace("chain")
