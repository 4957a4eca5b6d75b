"""The reference simulator raises the recursion limit for each replay step alone (issue 57: Hypothesis warned
that the limit had changed behind its back when a replay was left paused)."""

from __future__ import annotations

import sys
from pathlib import Path

from dtrlab.policies import get_policy
from dtrlab.runtime import Simulator
from dtrlab.trace import load_directory

ROOT = Path(__file__).resolve().parent.parent


def test_a_paused_replay_leaves_the_recursion_limit_as_it_was():
    traces = load_directory(ROOT / "traces")
    trace = traces[min(traces, key=lambda name: len(traces[name].schedule))]
    before = sys.getrecursionlimit()
    replay = Simulator(trace, get_policy("dtr"), budget_bytes=float("inf")).steps()
    next(replay)
    next(replay)  # paused between steps, as an analysis stepping two simulators in lockstep leaves it
    assert sys.getrecursionlimit() == before
    replay.close()
    assert sys.getrecursionlimit() == before
