"""Event recording: what a run decided, step by step, as pandas DataFrames.

Pass a :class:`Recorder` to :func:`dtrlab.runtime.simulate` (or call :func:`record`).
The simulator calls its hooks only when one is given, so runs without a recorder
pay nothing. A recorder captures:

* every policy eviction, with the candidates' scores, the chosen storage and the
  runner-up (the storage the policy would have chosen had the chosen one been
  withheld);
* every rematerialization, with the chain it belongs to (one chain is everything
  rematerialized for one outermost materialization);
* every eager free, every ordinary computation and every intervention action;
* the memory in use after each of those events;
* on failure, the allocation that could not be satisfied and where the memory was.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass

import pandas as pd

from ..policies import ScorePolicy
from ..runtime import REFERENCE, Intervention, RunResult, Semantics, simulate
from ..trace.model import Trace

EVENT_KINDS = ("compute", "remat", "evict", "free", "pin", "force_evict", "failure")


class Recorder:
    """Simulator hooks that log every event; read the results as DataFrames.

    ``candidate_scores=True`` also keeps every candidate's score at every decision
    (the ``candidates`` table, which :func:`dtrlab.analysis.divergence.divergence`
    shows as context); turn it off for very long runs to save memory. Scores are
    available for score policies only; other policies get NaN scores and no
    runner-up.
    """

    def __init__(self, candidate_scores: bool = True):
        self.candidate_scores = candidate_scores
        self._names: tuple[str, ...] = ()
        self._events: list[tuple] = []
        self._evictions: list[tuple] = []
        self._remats: list[tuple] = []
        self._interventions: list[tuple] = []
        # Per decision: candidate ids and their scores, in the policy's scan order.
        self._candidate_ids: list[array] = []
        self._candidate_scores: list[array] = []
        self._chain = -1
        self._chain_key = None
        self._failure: dict | None = None

    # ------------------------------------------------------------------ hooks
    def on_choose(self, sim, candidates, chosen) -> None:
        names = self._names = sim.trace.tensor_names
        policy = sim.policy
        candidates = list(candidates)
        scores = {}
        runner_up = None
        if isinstance(policy, ScorePolicy):
            scores = {s: policy.score_of(sim, s) for s in candidates}
            chosen_set = set(chosen)
            rest = [s for s in candidates if s not in chosen_set]
            if rest:
                runner_up = policy.choose(sim, rest)[0]
        decision = len(self._candidate_ids)
        keep = candidates if self.candidate_scores else ()
        self._candidate_ids.append(array("q", keep))
        self._candidate_scores.append(array("d", (scores.get(s, math.nan) for s in keep)))
        tensor = names[sim.pending[-1]]
        needed = sim.ops[sim.tensor_op[sim.pending[-1]]].total_size
        memory = sim.memory
        for s in chosen:
            memory -= sim.size[s]
            self._evictions.append((
                decision, sim.step, sim.clock, tensor, needed, len(candidates), s, names[s], sim.size[s],
                scores.get(s, math.nan), None if runner_up is None else names[runner_up],
                scores.get(runner_up, math.nan), memory,
            ))
            self._events.append(("evict", sim.step, sim.clock, names[s], names[s], -sim.size[s], memory))

    def on_remat(self, sim, t) -> None:
        names = sim.trace.tensor_names
        pending = sim.pending
        key = (sim.step, pending[0])
        if key != self._chain_key:
            self._chain_key = key
            self._chain += 1
        op = sim.ops[sim.tensor_op[t]]
        storage = names[sim.storage[t]]
        self._remats.append((sim.step, sim.clock, names[t], storage, op.name, op.cost, self._chain,
                             len(pending) - 1, names[pending[0]], sim.memory))
        self._events.append(("remat", sim.step, sim.clock, storage, names[t], op.total_size, sim.memory))

    def on_compute(self, sim, t) -> None:
        names = sim.trace.tensor_names
        self._events.append(("compute", sim.step, sim.clock, names[sim.storage[t]], names[t],
                             sim.ops[sim.tensor_op[t]].total_size, sim.memory))

    def on_free(self, sim, s) -> None:
        name = sim.trace.tensor_names[s]
        self._events.append(("free", sim.step, sim.clock, name, name, -sim.size[s], sim.memory))

    def on_intervene(self, sim, action, s, applied) -> None:
        name = sim.trace.tensor_names[s]
        self._interventions.append((sim.step, sim.clock, action, name, applied, sim.memory))
        if applied:
            self._events.append((action, sim.step, sim.clock, name, name,
                                 -sim.size[s] if action == "force_evict" else 0, sim.memory))

    def on_failure(self, sim, failure) -> None:
        size, material, ref_int, pinned = sim.size, sim.material, sim.ref_int, sim.pinned
        locked = pinned_bytes = 0
        for s in range(sim.trace.n_tensors):
            if material[s] and ref_int[s] > 0:
                if pinned[s]:
                    pinned_bytes += size[s]
                else:
                    locked += size[s]
        evictable = sum(size[s] for s in sim.candidates())
        tensor = sim.trace.tensor_names[failure.tensor]
        self._failure = {
            "kind": failure.kind, "cause": failure.cause, "step": failure.step, "clock": sim.clock,
            "operator": failure.operator, "operator_name": sim.ops[failure.operator].name,
            "tensor": tensor, "requested_bytes": failure.requested_bytes,
            "memory_in_use": failure.memory_in_use, "budget_bytes": sim.budget,
            "bytes_locked": locked, "bytes_pinned": pinned_bytes, "bytes_evictable": evictable,
            # Resident and unlocked but kept out of the candidates by a withhold intervention.
            "bytes_withheld": sum(size[s] for s in sim.pool) - evictable,
            "candidates": failure.candidates, "remat_compute": sim.remat_compute, "remat_limit": sim.remat_limit,
        }
        self._events.append(("failure", failure.step, sim.clock, None, tensor, failure.requested_bytes,
                             sim.memory))

    # ------------------------------------------------------------- the tables
    @property
    def events(self) -> pd.DataFrame:
        """Every event in order with the memory in use after it; ``bytes`` is + allocated, - freed."""
        frame = pd.DataFrame(self._events, columns=["kind", "step", "clock", "storage", "tensor", "bytes",
                                                    "memory_after"])
        frame["kind"] = pd.Categorical(frame["kind"], categories=EVENT_KINDS)
        return frame

    @property
    def evictions(self) -> pd.DataFrame:
        """One row per policy eviction (a decision evicting k storages has k rows).

        ``tensor``/``needed_bytes``: the materialization that needed the room.
        """
        return pd.DataFrame(self._evictions, columns=[
            "decision", "step", "clock", "tensor", "needed_bytes", "candidates", "storage_id", "storage", "size",
            "score", "runner_up", "runner_up_score", "memory_after"])

    @property
    def remats(self) -> pd.DataFrame:
        """One row per rematerialization.

        ``chain`` numbers the outermost materializations that needed remats,
        ``trigger`` is that outermost tensor and ``depth`` the nesting below it.
        """
        return pd.DataFrame(self._remats, columns=["step", "clock", "tensor", "storage", "operator", "cost",
                                                   "chain", "depth", "trigger", "memory_after"])

    @property
    def frees(self) -> pd.DataFrame:
        """Eager frees: storages released for the last time while resident."""
        frame = self.events
        frame = frame[frame["kind"] == "free"].reset_index(drop=True)
        return frame.drop(columns=["kind", "tensor"]).assign(bytes=-frame["bytes"])

    @property
    def interventions(self) -> pd.DataFrame:
        """Timed intervention actions (pins, forced evictions) and whether each applied."""
        return pd.DataFrame(self._interventions, columns=["step", "clock", "action", "storage", "applied",
                                                          "memory_after"])

    @property
    def candidates(self) -> pd.DataFrame:
        """Every candidate at every decision, in scan order, with its score and whether it was chosen."""
        chosen = {(row[0], row[6]) for row in self._evictions}
        names = self._names
        rows = [(d, position, s, names[s], score, (d, s) in chosen)
                for d, (ids, scores) in enumerate(zip(self._candidate_ids, self._candidate_scores))
                for position, (s, score) in enumerate(zip(ids, scores))]
        return pd.DataFrame(rows, columns=["decision", "position", "storage_id", "storage", "score", "chosen"])

    @property
    def failure(self) -> pd.DataFrame:
        """The failure record as a one-row frame (empty when the run passed)."""
        return pd.DataFrame([self._failure] if self._failure else [])


@dataclass(frozen=True)
class RecordedRun:
    """A run's result with all its recorded events as DataFrames."""

    trace: Trace
    result: RunResult
    intervention: Intervention | None
    events: pd.DataFrame
    evictions: pd.DataFrame
    remats: pd.DataFrame
    frees: pd.DataFrame
    interventions: pd.DataFrame
    candidates: pd.DataFrame
    failure: pd.DataFrame

    @property
    def label(self) -> str:
        """A short description: ratio (or budget), policy and intervention."""
        result = self.result
        text = f"{result.policy}, " + (f"ratio {result.ratio:g}" if result.ratio is not None
                                       else f"{result.budget_bytes:,} B")
        if self.intervention:
            text += f", {describe_intervention(self.intervention, self.trace)}"
        return text


def describe_intervention(intervention: Intervention, trace: Trace) -> str:
    """``withhold x8010; pin x12 from 40``, with tensor names."""
    names = trace.tensor_names
    parts = []
    if intervention.withhold:
        parts.append("withhold " + ", ".join(sorted(names[s] for s in intervention.withhold)))
    parts += [f"pin {names[s]} from step {step}" for s, step in intervention.pin]
    parts += [f"force-evict {names[s]} at step {step}" for s, step in intervention.force_evict]
    return "; ".join(parts)


def record(trace: Trace, policy="dtr", *, ratio: float | None = None, budget_bytes: int | None = None,
           semantics: Semantics = REFERENCE, intervention: Intervention | None = None, candidate_scores: bool = True,
           **policy_params) -> RecordedRun:
    """:func:`~dtrlab.runtime.simulate` with a :class:`Recorder`; same arguments."""
    recorder = Recorder(candidate_scores=candidate_scores)
    result = simulate(trace, policy, ratio=ratio, budget_bytes=budget_bytes, semantics=semantics,
                      intervention=intervention, recorder=recorder, **policy_params)
    return RecordedRun(trace, result, intervention, recorder.events, recorder.evictions, recorder.remats,
                       recorder.frees, recorder.interventions, recorder.candidates, recorder.failure)
