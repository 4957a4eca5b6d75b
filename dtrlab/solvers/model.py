"""The stage formulation as a 0/1 linear program, shared by both solver back ends.

Variables (all binary), only at the *need stages* of :class:`~dtrlab.solvers.problem.Problem`:

* ``A[t, s]``: fresh storage ``s`` is resident while need stage ``t`` runs;
* ``K[t, s]``: ``s`` is kept through all stages from ``t`` up to its next need stage
  (or the release that frees it); otherwise it is evicted right after its last need.
  Keeping a storage through only part of such a stretch never helps: nothing can
  use it there, so these variables lose no schedule worth having;
* ``D[t, v]``: view tensor ``v`` is defined at need stage ``t``;
* ``R[t, op]``: operator ``op`` is recomputed in the gap before need stage ``t``;
* ``U[t, s]``: output ``s`` was still resident when its multi-output operator was
  recomputed at ``t`` (its bytes count twice there, as in the simulator's check).

A storage stays resident only if it was resident in the previous stage and no
release freed it, or its operator is recomputed; a single-output operator is
recomputed only when its output is gone, and any operator only with all its
arguments defined; the stage's operator needs its arguments defined; the resident bytes of
every stage, with the stage's outputs and the pinned constants, fit the budget;
recompute stays within the overhead limit. The objective is the recompute.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from .problem import Problem


@dataclass
class LinearModel:
    """``min cost . x`` subject to ``lower <= row . x <= upper`` with binary ``x`` (the stage
    model) or binary and continuous ``x`` (the relaxation of :mod:`.relax`)."""

    names: list[tuple[str, int, int]] = field(default_factory=list)  # (kind, stage, storage/tensor/op)
    lower: list[int] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    continuous: list[bool] = field(default_factory=list)  # the relaxation's auxiliary variables (:mod:`.relax`)
    cost: list[int] = field(default_factory=list)
    rows: list[tuple[dict[int, int], float, float]] = field(default_factory=list)
    index: dict[tuple[str, int, int], int] = field(default_factory=dict)
    cover: dict[int, dict[int, int]] = field(default_factory=dict)  # storage -> {stage: its residency variable}
    infeasible: str | None = None  # a reason found while building (a structural contradiction)

    def var(self, kind: str, stage: int, item: int, cost: int = 0, *, continuous: bool = False,
            upper: float = 1) -> int:
        key = (kind, stage, item)
        self.index[key] = len(self.names)
        self.names.append(key)
        self.lower.append(0)
        self.upper.append(upper)
        self.cost.append(cost)
        self.continuous.append(continuous)
        return self.index[key]

    def fix(self, var: int | None, value: int, why: str) -> None:
        if var is None:
            if value == 1:
                self.infeasible = self.infeasible or why
            return
        if not self.lower[var] <= value <= self.upper[var]:
            self.infeasible = self.infeasible or why
        self.lower[var] = self.upper[var] = value

    def row(self, terms: dict[int, int], lower: float, upper: float) -> None:
        self.rows.append((terms, lower, upper))

    @property
    def n_vars(self) -> int:
        return len(self.names)


def violations(model: LinearModel, values: list[float], tolerance: float = 1e-9) -> list[str]:
    """The rows and bounds of ``model`` that ``values`` break (empty: the point is feasible)."""
    broken = []
    for var, value in enumerate(values):
        if not model.lower[var] - tolerance <= value <= model.upper[var] + tolerance:
            broken.append(f"{model.names[var]} = {value} outside [{model.lower[var]}, {model.upper[var]}]")
    for terms, lo, hi in model.rows:
        lhs = sum(c * values[v] for v, c in terms.items())
        if not lo - tolerance <= lhs <= hi + tolerance:
            broken.append(f"row {[model.names[v] for v in list(terms)[:4]]}: {lhs} not in [{lo}, {hi}]")
    return broken


@dataclass(frozen=True)
class Stretch:
    """A need stage of a storage after its first, as :func:`storage_stretches` built it.

    ``resident``: the storage's ``A`` variable there; ``kept``: its ``K`` variable for the
    stages strictly between the previous need stage and this one (None: no such stage it
    can live through), ``kept_stages`` those stages; ``prev``: the variable saying it is
    still resident when the gap before ``stage`` starts (None: it cannot be, or a release
    freed it in the stretch)."""

    stage: int
    resident: int
    prev: int | None
    kept: int | None
    kept_stages: list[int]


def storage_stretches(m: LinearModel, problem: Problem, s: int, memory: list[dict[int, int]],
                      here: dict[int, int], covered: dict[int, int], kept_lower: float) -> Iterator[Stretch]:
    """The residency variables and rows of fresh storage ``s`` shared by the stage model and
    the relaxation: an ``A`` variable at each of its need stages (fixed to 1 at the first, where
    it is computed) and a ``K`` variable for each stretch of stages between two need stages it
    may live through, bounded by the ``A`` before it (``kept_lower``: that row's lower bound).
    Each variable's bytes go to ``memory`` of the stages it covers; ``here`` and ``covered``
    get stage -> variable. Yields each need stage after the first, for the caller's rows."""
    trace = problem.trace
    producer = trace.tensor_op[s]
    size = trace.operators[producer].sizes[trace.tensor_index[s]]
    stages = (problem.op_stage[producer],) + problem.need[producer]
    freed = problem.release_stage.get(s)
    for j, t in enumerate(stages):
        here[t] = covered[t] = m.var("A", t, s)
        memory[t][here[t]] = size
        if j == 0:
            m.fix(here[t], 1, "")
            continue
        before = stages[j - 1]
        between = range(before + 1, t)
        prev = here[before] if not between else None
        live = [u for u in between if not (freed is not None and before < freed <= u)]
        kept = None
        if live:
            kept = m.var("K", live[0], s)  # kept from stage before+1 through live[-1]
            m.row({kept: 1, here[before]: -1}, kept_lower, 0)
            for u in live:
                memory[u][kept] = size
                covered[u] = kept
            prev = kept
        if freed is not None and before < freed <= t:
            prev = None  # the release frees it before any recomputation of this gap
        yield Stretch(t, here[t], prev, kept, live)


def build_model(problem: Problem, budget_bytes: int, allowance: int | None) -> LinearModel:
    """The stage formulation of ``problem`` at one budget (variables per need stage, not per stage);
    ``allowance``: the largest recompute (:func:`~dtrlab.runtime.recompute_allowance`; None: no limit)."""
    m = LinearModel()
    ops = problem.trace.operators
    R = {(t, op_index): m.var("R", t, op_index, ops[op_index].cost)
         for op_index, stages in problem.need.items() for t in stages}
    # at[x][t]: the variable for "x is resident/defined at need stage t" of storage or view x.
    at: dict[int, dict[int, int]] = {}
    cover: dict[int, dict[int, int]] = {}  # storage -> {stage: variable} wherever it may be resident
    memory = [dict() for _ in range(problem.n_stages)]
    _storage_rows(m, problem, R, at, cover, memory)
    _view_rows(m, problem, R, at, cover)
    _argument_rows(m, problem, R, at)
    for t, terms in enumerate(memory):
        room = budget_bytes - problem.constant_bytes[t]
        if room < 0:
            m.infeasible = m.infeasible or f"the pinned constants ({problem.constant_bytes[t]} bytes) exceed the budget"
        if terms:
            m.row(terms, 0, max(room, 0))
    if R and allowance is not None:
        m.row({var: ops[op_index].cost for (t, op_index), var in R.items()}, 0, allowance)
    m.cover = cover
    return m


def _storage_rows(m: LinearModel, problem: Problem, R: dict[tuple[int, int], int], at: dict[int, dict[int, int]],
                  cover: dict[int, dict[int, int]], memory: list[dict[int, int]]) -> None:
    """Each fresh storage: resident only if kept from before or recomputed; recomputed only when gone."""
    trace, ops = problem.trace, problem.trace.operators
    fresh_outputs = {op_index: [t for t, alias in zip(ops[op_index].outputs, ops[op_index].aliases) if alias == -1]
                     for op_index in problem.op_stage}
    still_resident: dict[tuple[int, int], list[int]] = {}  # (stage, multi-output op) -> its outputs' "kept" variables
    for s in problem.storage_window:
        producer = trace.tensor_op[s]
        size = ops[producer].sizes[trace.tensor_index[s]]
        at[s], cover[s] = {}, {}
        for stretch in storage_stretches(m, problem, s, memory, at[s], cover[s], -1):
            t, prev = stretch.stage, stretch.prev
            remat = R[t, producer]
            terms = {stretch.resident: 1, remat: -1}
            if prev is not None:
                terms[prev] = -1
                if len(fresh_outputs[producer]) == 1:
                    m.row({remat: 1, prev: 1}, 0, 1)  # never recompute what is resident
                else:
                    # Recomputing a multi-output operator for a lost output briefly
                    # duplicates the outputs still resident (the simulator checks the
                    # budget with all output bytes): count them in this stage's memory.
                    duplicate = m.var("U", t, s)
                    m.row({duplicate: 1, remat: -1, prev: -1}, -1, 1)
                    memory[t][duplicate] = size
                    still_resident.setdefault((t, producer), []).append(prev)
            m.row(terms, -1, 0)
            m.row({remat: 1, stretch.resident: -1}, -1, 0)  # a recomputation fills every output
    for (t, producer), resident in still_resident.items():
        # ... but only for an output that is gone: recomputing an operator whose
        # outputs are all resident would leak bytes in simrd's accounting (it drops
        # the duplicates of the siblings, not of the output it was asked for).
        if len(resident) == len(fresh_outputs[producer]):
            m.row({R[t, producer]: 1, **{var: 1 for var in resident}}, 0, len(resident))


def _view_rows(m: LinearModel, problem: Problem, R: dict[tuple[int, int], int], at: dict[int, dict[int, int]],
               cover: dict[int, dict[int, int]]) -> None:
    """Each view: defined only while its storage stays resident and is not recomputed, or when redone."""
    trace = problem.trace
    for v in problem.view_window:
        view_op, s = trace.tensor_op[v], problem.storage[v]
        root_op = trace.tensor_op[s]
        stages = (problem.op_stage[view_op],) + problem.need[view_op]
        here = at[v] = {}
        for j, t in enumerate(stages):
            here[t] = m.var("D", t, v)
            m.row({here[t]: 1, at[s][t]: -1}, -1, 0)  # a view needs its storage
            if j == 0:
                m.fix(here[t], 1, "")
                continue
            before = stages[j - 1]
            redo = R[t, view_op]
            m.row({here[t]: 1, here[before]: -1, redo: -1}, -1, 0)
            # Still defined only if the storage stayed resident and was not recomputed since.
            holders = set()
            for u in range(before + 1, t + 1):
                holder = cover[s].get(u)
                if holder is None:
                    m.row({here[t]: 1, redo: -1}, -1, 0)
                    break
                if u < t:
                    holders.add(holder)
                root_redo = R.get((u, root_op))
                if root_redo is not None:
                    m.row({here[t]: 1, root_redo: 1, redo: -1}, -1, 1)
            for holder in holders:
                m.row({here[t]: 1, holder: -1, redo: -1}, -1, 0)


def _argument_rows(m: LinearModel, problem: Problem, R: dict[tuple[int, int], int],
                   at: dict[int, dict[int, int]]) -> None:
    """A recomputation needs its arguments defined; each stage's operator (and the end pins) too."""
    trace, ops = problem.trace, problem.trace.operators

    def defined(t: int, tensor: int):
        """The variable saying ``tensor`` is defined at need stage ``t``; True if always, None if never."""
        if problem.storage[tensor] in problem.pinned_storages:
            return True
        return at.get(tensor, {}).get(t)

    for (t, op_index), remat in R.items():
        for a in ops[op_index].args:
            dep = defined(t, a)
            if dep is None:
                m.fix(remat, 0, "")
            elif dep is not True:
                m.row({remat: 1, dep: -1}, -1, 0)
    for t, op_index in enumerate(problem.stage_op):
        needed = ops[op_index].args if op_index != -1 else sorted(problem.end_pinned)
        for a in needed:
            dep = defined(t, a)
            if dep is not True:
                m.fix(dep, 1, f"stage {t} needs {trace.tensor_names[a]}, which the model cannot keep")
