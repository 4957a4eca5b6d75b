"""The rematerialization problem as the simulator sees a trace, in stages.

A *stage* is one schedule step that computes a non-constant operator, in schedule
order; if the trace pins outputs at its end, one more stage (the *final* stage)
stands for the moment just before the first of those pins. Between two stages
(in the *gap* before a stage) the trace's releases free storages, and a schedule
may evict storages and recompute operators, in operator order, before the stage's
operator runs.

What the model keeps from the runtime (see docs/solvers.md):

* storages, not tensors, hold memory; an alias output (a view) shares its
  argument's storage and costs no memory, but is its own tensor: evicting the
  storage undefines the view, and using the view again recomputes its operator;
* an operator recomputes all its outputs at once (a multi-output operator fills
  every output storage, even ones already released, which then count until evicted);
* constants are pinned from their creation on and never evicted;
* a release that drops a storage's last reference frees it at once;
* the pins at the end need every pinned tensor defined at the same time;
* a recomputation needs all its arguments defined, as does the stage's operator;
  the simulator's budget check (memory + all output bytes <= budget) applies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..runtime import baseline
from ..trace.model import COMPUTE, PIN, RELEASE, GET, Trace


#: What every optimum, bound and bracket of this package is about; the CLI prints it with results.
SCOPE_NOTE = ("optima, bounds and brackets hold for on-demand schedules (an operator is recomputed only when one "
              "being computed needs it, as in DTR); ahead-of-demand (Checkmate-style) schedules did better on 6 of "
              "500 tiny traces (docs/solvers.md, Scope)")


class UnsupportedTrace(ValueError):
    """A trace the stage model cannot express (it names the operator)."""


@dataclass(frozen=True)
class Problem:
    """Everything the solvers need, with tensor and storage ids of the trace.

    ``need[op]`` are the stages after its first computation at which an output of
    ``op`` may have to be defined (used by the stage's operator, pinned at the end,
    or needed to recompute a consumer at one of *its* need stages); recomputations
    of ``op`` are allowed only at those stages (on-demand recomputation).
    """

    trace: Trace
    storage: tuple[int, ...]  # tensor -> its storage (the root tensor id)
    n_stages: int  # including the final stage, if any
    stage_step: tuple[int, ...]  # schedule step before which each stage's actions run
    stage_op: tuple[int, ...]  # operator computed at each stage (-1 for the final stage)
    op_stage: dict[int, int]  # non-constant operator -> stage of its first computation
    need: dict[int, tuple[int, ...]]
    chain: int | None  # None: unbounded recompute chains (every stage an output may be needed at, transitively)
    storage_window: dict[int, tuple[int, int]]  # fresh storage -> (first stage, last stage) it may be resident
    view_window: dict[int, tuple[int, int]]  # view tensor of a non-pinned storage -> stages it may be defined
    release_stage: dict[int, int]  # storage -> first stage after the release that frees it
    end_pinned: frozenset[int]  # tensors pinned at the end (non-constant storages only)
    constant_bytes: tuple[int, ...]  # bytes of pinned constants resident at each stage
    pinned_storages: frozenset[int]  # storages of constants: always resident once created
    base_compute: int

    @property
    def final_stage(self) -> int | None:
        return self.n_stages - 1 if self.stage_op and self.stage_op[-1] == -1 else None

    def storage_of(self, tensor: int) -> int:
        return self.storage[tensor]

    def storage_producer(self, s: int) -> int:
        return self.trace.tensor_op[s]

    def is_view(self, tensor: int) -> bool:
        op = self.trace.operators[self.trace.tensor_op[tensor]]
        return op.aliases[self.trace.tensor_index[tensor]] != -1

    def lower_bound(self) -> int:
        """Bytes every schedule needs: the largest stage footprint (arguments + outputs) plus pinned bytes."""
        ops = self.trace.operators
        best = 0
        for t, op_index in enumerate(self.stage_op):
            if op_index == -1:
                needed = {self.storage_of(x) for x in self.end_pinned}
                out = 0
            else:
                op = ops[op_index]
                needed = {self.storage_of(a) for a in op.args}
                out = op.total_size
            footprint = sum(self.trace.operators[self.storage_producer(s)].sizes[self.trace.tensor_index[s]]
                            for s in needed if s not in self.pinned_storages)
            best = max(best, footprint + out + self.constant_bytes[t])
        return best


@dataclass(frozen=True)
class Schedule:
    """What to keep and what to recompute, per stage.

    ``resident[t]``: the non-constant storages resident while stage ``t`` runs (its own
    outputs included); ``remat[t]``: the operators recomputed, in this order, in the gap
    before stage ``t``. ``evictions`` is None when everything not in ``resident[t]`` is
    evicted at the start of the gap (the stage model); otherwise ``evictions[t][j]`` are
    the storages evicted just before the ``j``-th recomputation of that gap, and
    ``evictions[t][-1]`` those evicted just before the stage's operator (the interval
    model, which evicts between recomputations).
    """

    resident: tuple[tuple[int, ...], ...]
    remat: tuple[tuple[int, ...], ...]
    evictions: tuple[tuple[tuple[int, ...], ...], ...] | None = None

    @property
    def remat_count(self) -> int:
        return sum(len(ops) for ops in self.remat)


@dataclass(frozen=True)
class SolveResult:
    """One solve. Compute is in the trace's cost units; ``objective`` and ``best_bound``
    are total compute (the trace's own compute plus recompute)."""

    trace: str
    solver: str
    budget_bytes: int
    overhead_limit: float
    status: str  # "optimal", "feasible", "infeasible" or "unknown" (also: a solver fault, said in ``message``)
    objective: int | None
    best_bound: float | None
    base_compute: int
    solve_seconds: float
    time_limit_s: float
    n_vars: int = 0
    n_rows: int = 0
    message: str = ""
    schedule: Schedule | None = field(default=None, repr=False)

    @property
    def remat_compute(self) -> int | None:
        return None if self.objective is None else self.objective - self.base_compute

    @property
    def gap(self) -> float | None:
        """(objective - best bound) / objective; 0 when optimal, None without a solution."""
        if self.objective is None or self.best_bound is None:
            return None
        return max(0.0, (self.objective - self.best_bound) / self.objective) if self.objective else 0.0

    @property
    def overhead(self) -> float | None:
        """The simulator's overhead measure for this schedule: (1 + total compute) / trace compute."""
        if self.objective is None:
            return None
        return (1 + self.objective) / self.base_compute if self.base_compute else math.nan  # as RunResult

    @property
    def has_schedule(self) -> bool:
        return self.schedule is not None

    def to_dict(self) -> dict:
        return {
            "trace": self.trace, "solver": self.solver, "budget_bytes": self.budget_bytes,
            "overhead_limit": self.overhead_limit, "status": self.status, "objective": self.objective,
            "best_bound": self.best_bound, "gap": self.gap, "remat_compute": self.remat_compute,
            "overhead": self.overhead, "base_compute": self.base_compute, "solve_seconds": self.solve_seconds,
            "time_limit_s": self.time_limit_s, "n_vars": self.n_vars, "n_rows": self.n_rows,
            "message": self.message,
        }


def _storages(trace: Trace) -> list[int]:
    storage = list(range(trace.n_tensors))
    for op in trace.operators:
        for t, alias in zip(op.outputs, op.aliases):
            if alias != -1:
                storage[t] = storage[op.args[alias]]
    return storage


def build_problem(trace: Trace, chain: int | None = 3) -> Problem:
    """Read the stages, windows, releases and pins of ``trace`` (see the module docstring).

    ``chain`` bounds recompute chains: an operator may be recomputed at a stage only
    to feed the stage's operator through at most ``chain`` recomputed operators
    (views do not count). Larger values admit more schedules and cost model size.
    ``chain=None`` is the unbounded closure: every stage at which any chain of
    consumers may need the operator's outputs (what :mod:`.relax` needs; O(n^2)).
    """
    ops = trace.operators
    for index, op in enumerate(ops):
        kinds = {alias == -1 for alias in op.aliases}
        if len(kinds) > 1:
            raise UnsupportedTrace(f"operator {index} ({op.name}) has both fresh and alias outputs; "
                                   "the stage model needs each operator to be all-fresh or all-alias")
    storage = _storages(trace)
    stages = _read_stages(trace, storage)
    need = _need_stages(trace, storage, stages, chain)
    storage_window, view_window = {}, {}
    for op_index, first in stages.op_stage.items():
        op = ops[op_index]
        last = need[op_index][-1] if need[op_index] else first
        for t, alias in zip(op.outputs, op.aliases):
            if alias == -1:
                storage_window[t] = (first, last)
            elif storage[t] not in stages.pinned:
                view_window[t] = (first, last)
    # A view's operator consumes the storage's producer, so need[producer] covers the
    # view's needs and the storage window covers the view window.
    end_pinned = frozenset(t for t in stages.end_pins if storage[t] not in stages.pinned)
    return Problem(
        trace=trace, storage=tuple(storage), n_stages=len(stages.stage_op), stage_step=tuple(stages.stage_step),
        stage_op=tuple(stages.stage_op), op_stage=stages.op_stage, need=need, chain=chain,
        storage_window=storage_window, view_window=view_window,
        release_stage=_release_stages(stages.release_at_step, stages.stage_step), end_pinned=end_pinned,
        constant_bytes=tuple(stages.constant_bytes), pinned_storages=frozenset(stages.pinned),
        base_compute=baseline(trace).model_compute,
    )


@dataclass
class _Stages:
    """What one walk of the schedule finds (:func:`_read_stages`)."""

    stage_step: list[int] = field(default_factory=list)
    stage_op: list[int] = field(default_factory=list)
    op_stage: dict[int, int] = field(default_factory=dict)
    pinned: set[int] = field(default_factory=set)  # outputs of constants
    constant_bytes: list[int] = field(default_factory=list)
    release_at_step: dict[int, int] = field(default_factory=dict)  # storage -> schedule step whose release freed it
    end_pins: list[int] = field(default_factory=list)


def _read_stages(trace: Trace, storage: list[int]) -> _Stages:
    """A stage for each non-constant computation (and a final one for the end pins), the
    constant bytes resident at each, and the step of each release that frees a storage."""
    ops = trace.operators
    found = _Stages()
    constant_bytes_now = 0
    ref = [0] * trace.n_tensors
    last_compute = max((k for k, (kind, _) in enumerate(trace.schedule) if kind == COMPUTE), default=-1)
    final_step = None
    for k, (kind, operand) in enumerate(trace.schedule):
        if kind == COMPUTE:
            op = ops[operand]
            for t, alias in zip(op.outputs, op.aliases):
                ref[storage[t]] += 1
            if op.is_constant:
                found.pinned.update(op.outputs)
                constant_bytes_now += op.total_size
            else:
                found.op_stage[operand] = len(found.stage_op)
                found.stage_step.append(k)
                found.stage_op.append(operand)
                found.constant_bytes.append(constant_bytes_now)
        elif kind == GET:
            ref[storage[operand]] += 1
        elif kind == RELEASE:
            s = storage[operand]
            ref[s] -= 1
            if ref[s] == 0 and s not in found.pinned:
                found.release_at_step[s] = k
        elif kind == PIN:
            s = storage[operand]
            if s in found.pinned:
                continue
            if k < last_compute:
                raise UnsupportedTrace(f"the trace pins non-constant tensor {trace.tensor_names[operand]} "
                                       "before its last computation; the stage model pins only at the end")
            if final_step is None:
                final_step = k
            found.end_pins.append(operand)
    if final_step is not None:
        found.stage_step.append(final_step)
        found.stage_op.append(-1)
        found.constant_bytes.append(constant_bytes_now)
    return found


def _release_stages(release_at_step: dict[int, int], steps: list[int]) -> dict[int, int]:
    """The first stage whose gap comes after each freeing release."""
    release_stage = {}
    j = 0
    for s, k in sorted(release_at_step.items(), key=lambda item: item[1]):
        while j < len(steps) and steps[j] < k:
            j += 1
        release_stage[s] = j  # == n_stages when freed after the last stage
    return release_stage


def _need_stages(trace: Trace, storage: list[int], stages: _Stages, chain: int | None) -> dict[int, tuple[int, ...]]:
    """Stages at which each operator's outputs may be needed, consumers first."""
    ops, op_stage, pinned = trace.operators, stages.op_stage, stages.pinned
    consumers: dict[int, set[int]] = {}
    direct: dict[int, set[int]] = {}
    for t, op_index in enumerate(stages.stage_op):
        args = ops[op_index].args if op_index != -1 else stages.end_pins
        for a in args:
            producer = trace.tensor_op[a]
            if not ops[producer].is_constant and storage[a] not in pinned:
                direct.setdefault(producer, set()).add(t)
    for op_index in op_stage:
        for a in ops[op_index].args:
            producer = trace.tensor_op[a]
            if not ops[producer].is_constant and storage[a] not in pinned:
                consumers.setdefault(producer, set()).add(op_index)
    # Recompute chains at most ``chain`` operators long (views do not count): level k
    # holds the stages at which an operator may be recomputed to feed a chain of k.
    is_view = {op_index: ops[op_index].aliases[0] != -1 for op_index in op_stage}
    level = {op_index: direct.get(op_index, set()) for op_index in op_stage}
    if chain is None:  # the fixpoint in one pass: consumers are computed after their producers
        for op_index in sorted(op_stage, key=op_stage.get, reverse=True):
            needed = set(direct.get(op_index, ()))
            for consumer in consumers.get(op_index, ()):
                needed |= level[consumer]
            level[op_index] = needed
    for _ in range(0 if chain is None else max(chain, 1) - 1):
        nxt: dict[int, set[int]] = {}
        for op_index in sorted(op_stage, reverse=True):
            needed = set(direct.get(op_index, ()))
            for consumer in consumers.get(op_index, ()):
                needed.update(nxt[consumer] if is_view[consumer] else level[consumer])
            nxt[op_index] = needed
        level = nxt
    if chain is not None and chain >= 1:  # a view passes its needs to the storage's producer at every level
        for op_index in sorted(op_stage, reverse=True):
            for consumer in consumers.get(op_index, ()):
                if is_view[consumer]:
                    level[op_index] = level[op_index] | level[consumer]
    return {op_index: tuple(sorted(t for t in level[op_index] if t > op_stage[op_index])) for op_index in op_stage}
