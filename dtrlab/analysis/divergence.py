"""Where two runs of one trace part ways: the first eviction decision that differs.

A decision is the set of storages one call of the policy evicted. Two runs agree on
decision ``i`` when they evicted the same storages there; the step at which it
happened may differ (a larger budget evicts later), so steps and clocks are shown
but not compared.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ..runtime import RunResult
from .events import RecordedRun


def identical_evictions(a: RunResult, b: RunResult) -> int:
    """How many leading policy evictions two runs share (no recording needed)."""
    n = 0
    for x, y in zip(a.evicted_storages, b.evicted_storages):
        if x != y:
            break
        n += 1
    return n


@dataclass(frozen=True)
class Divergence:
    """The first differing decision of runs ``a`` and ``b`` and its context.

    ``decision`` is its index (``None`` when the runs made identical decisions
    throughout); it also counts the identical decisions before it. ``a_decision``
    and ``b_decision`` are the decision rows (step, clock, chosen, score,
    runner-up, ...; ``None`` for a run that made no such decision, e.g. it had
    already failed). ``context`` lists every candidate offered in either run at
    that decision with its scan position, score and rank in each run (rank 0 is
    the best score; ties rank the later candidate first, as the policy chooses).
    """

    a_label: str
    b_label: str
    decision: int | None
    a_decisions: int
    b_decisions: int
    a_decision: dict | None
    b_decision: dict | None
    context: pd.DataFrame

    @property
    def identical_decisions(self) -> int:
        return min(self.a_decisions, self.b_decisions) if self.decision is None else self.decision

    def summary(self) -> str:
        if self.decision is None:
            return (f"{self.a_label} and {self.b_label} made the same {self.identical_decisions} decisions"
                    + ("" if self.a_decisions == self.b_decisions else
                       f"; then only one went on ({self.a_decisions} vs {self.b_decisions})"))
        lines = [f"first difference at decision {self.decision} (after {self.decision} identical ones):"]
        for label, row in ((self.a_label, self.a_decision), (self.b_label, self.b_decision)):
            if row is None:
                lines.append(f"  {label}: no decision (the run ended)")
            else:
                lines.append(f"  {label}: step {row['step']}, clock {row['clock']}, evicted {', '.join(row['chosen'])} "
                             f"(score {row['score']:.6g}; runner-up {row['runner_up']} {row['runner_up_score']:.6g})")
        return "\n".join(lines)


def _decisions(run: RecordedRun) -> pd.DataFrame:
    """One row per decision with the tuple of chosen storages."""
    evictions = run.evictions
    grouped = evictions.groupby("decision", sort=True)
    frame = grouped.first()[["step", "clock", "tensor", "needed_bytes", "candidates", "score", "runner_up",
                             "runner_up_score"]]
    frame.insert(4, "chosen", grouped["storage"].agg(tuple))
    return frame


def _ranked(run: RecordedRun, decision: int) -> pd.DataFrame:
    candidates = run.candidates
    frame = candidates[candidates["decision"] == decision][["storage", "position", "score", "chosen"]]
    order = frame.sort_values(["score", "position"], ascending=[True, False])
    return frame.assign(rank=pd.Series(range(len(order)), index=order.index)).set_index("storage")


def divergence(a: RecordedRun, b: RecordedRun) -> Divergence:
    """The first decision where two recorded runs of the same trace evicted differently."""
    if a.trace.content_hash != b.trace.content_hash:
        raise ValueError(f"divergence compares two runs of the same trace; got {a.trace.name} and {b.trace.name}")
    da, db = _decisions(a), _decisions(b)
    decision = None
    for i, (x, y) in enumerate(zip(da["chosen"], db["chosen"])):
        if x != y:
            decision = i
            break
    else:
        if len(da) != len(db):
            decision = min(len(da), len(db))
    if decision is None:
        return Divergence(a.label, b.label, None, len(da), len(db), None, None, pd.DataFrame())
    rows = [frame.loc[decision].to_dict() if decision < len(frame) else None for frame in (da, db)]
    sides = [_ranked(run, decision) for run in (a, b)]
    if any(row is not None and side.empty for row, side in zip(rows, sides)):
        raise ValueError("the context needs every candidate's score: record both runs with candidate_scores=True")
    context = pd.merge(sides[0], sides[1], how="outer", left_index=True, right_index=True, suffixes=("_a", "_b"))
    context = context.sort_values(["rank_a", "rank_b"], na_position="last").reset_index()
    for column in ("position_a", "rank_a", "position_b", "rank_b"):
        context[column] = context[column].astype("Int64")
    return Divergence(a.label, b.label, decision, len(da), len(db), rows[0], rows[1], context)
