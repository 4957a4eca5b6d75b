"""The inclusion property: what a smaller budget holds, a larger one should hold too."""

from __future__ import annotations

import numpy as np
import pytest

from dtrlab.analysis.inclusion import inclusion
from dtrlab.trace import LogBuilder


def refetch():
    """x(1, const) -> a(1, cost 2) -> b(1, cost 1); c = fc(a, x) (3, cost 2); release a;
    d = fd(b) (1, cost 1); release b. Peak 6. Schedule steps: 0 x, 1 pin x, 2 a, 3 b,
    4 c, 5 release a, 6 d, 7 release b, 8-10 pin outputs x, c, d."""
    log = LogBuilder()
    log.constant("x", 1)
    log.call("fa", ["x"], [("a", 1)], time=2)
    log.call("fb", ["a", "x"], [("b", 1)], time=1)
    log.call("fc", ["a", "x"], [("c", 3)], time=2)
    log.release("a")
    log.call("fd", ["b"], [("d", 1)], time=1)
    log.release("b")
    return log.trace("refetch")


@pytest.mark.parametrize("policy", ["lru", "dtr"])
def test_rematerializing_a_released_parent_breaks_inclusion(policy):
    # Budget 6 holds everything: releasing a (step 5) frees it for good.
    # Budget 5: c (step 4) needs room and evicts b, the only unlocked candidate.
    # d (step 6) needs b, so b is rematerialized, and so is its released parent a
    # first; a stays resident (no release is left to free it). After steps 6-9 the
    # small run holds a, the large one does not. Pinning the outputs rematerializes
    # c (step 9, evicting d), then d (step 10): d needs b, and b's byte does not fit
    # with a locked as its parent and x, c pinned: oom.
    result = inclusion(refetch(), policy, 5, 6)
    assert (result.status_small, result.status_large) == ("oom", "pass")
    assert result.failure_small.step == 10 and result.failing_run == "small"
    assert result.steps_compared == 10
    assert list(result.violation_counts) == [0, 0, 0, 0, 0, 0, 1, 1, 1, 1]
    assert list(result.violating_steps) == [6, 7, 8, 9]
    assert result.first_violation_step == 6 and not result.holds and not result.anomaly
    assert result.episodes[["name", "first_step", "last_step", "steps"]].values.tolist() == [["a", 6, 9, 4]]
    assert result.held_remats.empty
    assert "first at step 6" in result.summary()


def test_inclusion_holds_when_nothing_is_evicted():
    result = inclusion(refetch(), "dtr", 6, 7)
    assert result.holds and result.first_violation_step is None and result.failing_run is None
    assert result.steps_compared == len(refetch().schedule) == 11
    assert result.episodes.empty
    assert "holds at every step" in result.summary()


def test_budgets_are_checked():
    with pytest.raises(ValueError, match="below budget_large"):
        inclusion(refetch(), "dtr", 6, 5)
    with pytest.raises(ValueError, match="ratio_small"):
        inclusion(refetch(), "dtr", budget_large=6)


def test_h_dtr_breaks_inclusion_around_the_resnet_hole(resnet_trace):
    # ResNet-32 under DTR: 0.165 passes, 0.17 thrashes (the hole).
    result = inclusion(resnet_trace, "dtr", ratio_small=0.165, ratio_large=0.17)
    assert (result.status_small, result.status_large) == ("pass", "thrash") and result.anomaly
    assert result.failing_run == "large" and result.failure_step == result.steps_compared == 2479
    assert result.first_violation_step == 1123
    assert len(result.violating_steps) == 1356
    assert len(result.episodes) == 26 and result.episodes["storage"].nunique() == 23
    assert len(result.held_remats) == 14 and result.held_remat_compute == 12_260_633
    assert int(result.remat_large[-1]) == 290_253_139
    # Episodes cover exactly the counted (step, storage) pairs.
    assert result.episodes["steps"].sum() == result.violation_counts.sum()


def test_lru_breaks_inclusion_on_resnet_too(resnet_trace):
    result = inclusion(resnet_trace, "lru", ratio_small=0.5, ratio_large=0.6)
    assert (result.status_small, result.status_large) == ("thrash", "pass")
    assert result.first_violation_step == 2438 and len(result.violating_steps) == 927
    assert np.all(result.violation_counts[:2438] == 0)
