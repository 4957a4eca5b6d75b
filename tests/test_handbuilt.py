"""Small graphs whose outcome is derived by hand (the derivations are in the comments).

Conventions: the clock starts at 1; constants cost 0 and are pinned; a storage
re-enters the eviction pool at the end when its last lock is released; DTR evicts
the last candidate with the minimal h = e*-compute / (size x staleness).
"""

import pytest

from dtrlab import simulate
from dtrlab.runtime import baseline
from dtrlab.trace import LogBuilder


def chain_log() -> LogBuilder:
    """x(const, 10) -> a(10, cost 1) -> b(10, cost 2) -> c(10, cost 3); nothing released."""
    log = LogBuilder()
    log.constant("x", 10)
    log.call("f", ["x"], [("a", 10)], time=1)
    log.call("g", ["a"], [("b", 10)], time=2)
    log.call("h", ["b"], [("c", 10)], time=3)
    return log


def chain():
    return chain_log().trace("chain")


def test_chain_baseline():
    assert baseline(chain()) == baseline(chain())
    assert baseline(chain()).peak_memory == 40
    assert baseline(chain()).model_compute == 6


def test_chain_fits_without_evictions():
    result = simulate(chain(), "dtr", budget_bytes=40)
    assert (result.status, result.clock, result.evictions, result.peak_memory) == ("pass", 7, 0, 40)


@pytest.mark.parametrize("budget_bytes", [30, 35])
def test_chain_under_budget_runs_out_while_pinning_outputs(budget_bytes):
    # Computing c needs 10 more bytes; b is locked (c's parent), so a is the only
    # candidate. At the end a, b, c are outputs, pinned in name order:
    # * a is rematerialized (clock 7 -> 8); the pool is [c, b]: h(c) = 3/(10*0) = inf,
    #   h(b) = (2 + evicted parent a's 1)/(10*(7-4)) = 0.1, so b is evicted;
    # * b is rematerialized (clock 10) after evicting c, the only unpinned storage;
    # * c cannot be rematerialized: x, a, b are pinned and the pool is empty.
    result = simulate(chain(), "dtr", budget_bytes=budget_bytes)
    assert result.status == "oom"
    assert result.clock == 10
    assert result.remat_compute == 3
    assert result.evicted_storages == ("a", "b", "c")
    assert result.failure.kind == "oom" and result.failure.requested_bytes == 10


def diamond():
    """x -> a; a -> b, a -> c; release a; d = k(b, c); release b, c."""
    log = LogBuilder()
    log.constant("x", 10)
    log.call("f", ["x"], [("a", 10)], time=1)
    log.call("g", ["a"], [("b", 10)], time=2)
    log.call("h", ["a"], [("c", 10)], time=3)
    log.release("a")
    log.call("k", ["b", "c"], [("d", 10)], time=4)
    log.release("b", "c")
    return log.trace("diamond")


def test_diamond_eager_free_then_recursive_remat():
    # c needs room: b is the only candidate (a is locked). Releasing a frees it
    # eagerly (not a policy eviction). d needs b: b's parent a is rematerialized
    # first (clock 7 -> 8, memory back to 30), then b itself cannot fit: a is locked
    # as b's parent and c as d's parent, so nothing is left to evict.
    assert baseline(diamond()).peak_memory == 40
    result = simulate(diamond(), "dtr", budget_bytes=30)
    assert (result.status, result.clock, result.remat_compute, result.evicted_storages) == ("oom", 8, 1, ("b",))
    passing = simulate(diamond(), "dtr", budget_bytes=40)
    assert (passing.status, passing.clock, passing.evictions) == ("pass", 11, 0)


def test_tuple_outputs_and_alias_lock_their_storages():
    # split produces p (10) and q (20); v is a view of p (size 0, same storage).
    # y = f(v, q) locks both storages, so at a budget of 40 (x 10 + 30 resident)
    # nothing can be evicted for y's 10 bytes.
    log = LogBuilder()
    log.constant("x", 10)
    log.call("split", ["x"], [("p", 10), ("q", 20)], time=5)
    log.call("view", ["p"], [("v", 0, 0)], time=1)
    log.release("p")  # v still references p's storage: nothing is freed
    log.call("f", ["v", "q"], [("y", 10)], time=2)
    trace = log.trace("tuple")
    assert baseline(trace).peak_memory == 50
    result = simulate(trace, "dtr", budget_bytes=40)
    assert (result.status, result.clock, result.evictions) == ("oom", 7, 0)
    assert simulate(trace, "dtr", budget_bytes=50).status == "pass"


def test_mutation_needs_room_for_the_new_version():
    # MUTATE writes a fresh storage a$ the size of a's storage, then releases a.
    log = LogBuilder()
    log.constant("x", 10)
    log.call("f", ["x"], [("a", 10)], time=1)
    log.mutate("relu_", ["a"], [0], time=2)
    trace = log.trace("mutate")
    assert [trace.tensor_names[t] for t in trace.operators[-1].outputs] == ["a$"]
    assert baseline(trace).peak_memory == 30
    assert simulate(trace, "dtr", budget_bytes=20).status == "oom"  # a is locked as the parent
    result = simulate(trace, "dtr", budget_bytes=30)
    assert (result.status, result.clock, result.evictions) == ("pass", 4, 0)


def two_candidates(cost_a: int, cost_b: int):
    """a, b, c all computed from x; c's allocation must evict a or b (pool order [a, b])."""
    log = LogBuilder()
    log.constant("x", 10)
    log.call("f", ["x"], [("a", 10)], time=cost_a)
    log.call("g", ["x"], [("b", 10)], time=cost_b)
    log.call("h", ["x"], [("c", 10)], time=1)
    return log.trace("candidates")


def test_lru_takes_the_least_recently_used():
    # last_access(a) = 1 + 2 = 3, last_access(b) = 3 + 2 = 5.
    assert simulate(two_candidates(2, 2), "lru", budget_bytes=30).evicted_storages[0] == "a"


def test_ties_go_to_the_last_candidate():
    # LargestStorage scores both 1/10: the later candidate in pool order wins the tie.
    assert simulate(two_candidates(2, 2), "largest_storage", budget_bytes=30).evicted_storages[0] == "b"


def test_zero_score_stops_the_scan():
    # MSPS scores a storage by compute/size: with both costs 0, a and b score 0. A
    # plain "last minimum" rule would take b; simrd stops at the first 0, so a.
    assert simulate(two_candidates(0, 0), "msps", budget_bytes=30).evicted_storages[0] == "a"
    # With only b at 0 the scan reaches it and stops there.
    assert simulate(two_candidates(2, 0), "msps", budget_bytes=30).evicted_storages[0] == "b"
