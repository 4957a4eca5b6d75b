"""The interval formulation for OR-Tools CP-SAT (Moccasin-style): evictions at any event.

Moccasin (Bartan et al., ICML 2023) writes rematerialization as a constraint program:
every computation of a value opens a *retention interval*, memory is a cumulative
constraint over the intervals, and each operator may be computed a bounded number of
times. Here that idea is laid on the simulator's stages (:mod:`.problem`):

* **Time is a sequence of events.** The gap before a stage has ``slots`` recompute
  slots (the final stage's gap, where the end pins may need many recomputations, one
  more per pinned storage), then the stage's operator runs. A recomputation that
  allocates occupies a slot of its own; a view's (0 bytes) may share one.
* **Copies.** An operator is computed first at its stage, and at most ``copies - 1``
  more times, each in a slot of a gap before one of its need stages (the unbounded
  closure, ``build_problem(chain=None)``: recomputation is on demand, chains of any
  length). Copies are ordered in time.
* **Retention.** Each copy gives each fresh output an interval ``[start, end]``: the
  storage is allocated at ``start`` and evicted before the first event after ``end``.
  Its bytes count in a cumulative constraint whose capacity is the budget, with the
  pinned constants as fixed intervals. At an event the resident intervals plus all
  the event's outputs fit the budget: the simulator's own check.
* **Dependencies.** An event needs each argument defined: some copy of it started
  earlier and still retained. A view (0 bytes, its own tensor) is defined from its
  computation to at most the end of the storage copy it was computed on: evicting the
  storage undefines the view, and recomputing the storage does not bring it back.
* **The runtime's rules.** A single-output operator is recomputed only when its output
  is gone. A multi-output operator may be recomputed while some outputs are resident
  (as DTR does); those duplicates are dropped at once (the simulator drops them after
  its budget check), and at least one output must be gone. A release that frees a
  storage ends every copy that spans it; copies after it are allowed (a released
  storage can be recomputed). The end pins need every pinned tensor retained at the
  final stage.

Against the stage model (:mod:`.model`) this drops the chain bound and lets values die
between two recomputations of a gap; it adds two bounds of its own: ``copies``
computations per operator and ``slots`` recomputations per gap. So it too is a
*restriction*: its schedules are real (the replay checks them event by event), its
"infeasible" holds within those bounds only.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from .problem import Problem, Schedule

DEFAULT_COPIES = 2
DEFAULT_SLOTS = 6
#: Traces with more (operator, need stage) pairs are not built: each pair brings a gap's
#: slots into a copy's domain, and the unbounded closure is O(n^2) (sizes in docs/solvers.md).
MAX_INTERVAL_PAIRS = 200_000


class IntervalModelTooLarge(ValueError):
    """The interval model of this trace would exceed :data:`MAX_INTERVAL_PAIRS`."""


@dataclass
class _Copy:
    op: int
    k: int  # 0: the first computation, at the operator's stage
    start: object  # int (copy 0) or an IntVar
    present: object  # True (copy 0) or a BoolVar
    earliest: int  # the first time it may start
    ends: dict[int, object] = field(default_factory=dict)  # output tensor -> IntVar (last time retained)
    latest_end: dict[int, int] = field(default_factory=dict)  # output tensor -> the upper bound of its end


@dataclass
class IntervalModel:
    """The CP-SAT model and what is needed to read a schedule from its solution."""

    cp: object
    problem: Problem
    slots: int
    stage_times: list[int]  # the time of each stage's operator; the gap's slots come just before
    copies: dict[int, list[_Copy]]
    cost_terms: list[tuple[object, int]]  # (presence literal, operator cost) of every recomputation
    infeasible: str | None = None

    def stage_time(self, t: int) -> int:
        return self.stage_times[t]

    def gap_of(self, time: int) -> int:
        """The stage whose gap (or operator) is at ``time``."""
        return bisect.bisect_left(self.stage_times, time)


def check_interval_size(problem: Problem) -> None:
    """Raise :class:`IntervalModelTooLarge` above :data:`MAX_INTERVAL_PAIRS`."""
    pairs = sum(len(stages) for stages in problem.need.values())
    if pairs > MAX_INTERVAL_PAIRS:
        raise IntervalModelTooLarge(f"{problem.trace.name} has {pairs:,} (operator, need stage) pairs "
                                    f"(limit {MAX_INTERVAL_PAIRS:,}): the interval model is not built")


def build_interval_model(problem: Problem, budget_bytes: int, allowance: int | None, *, copies: int = DEFAULT_COPIES,
                         slots: int = DEFAULT_SLOTS, min_copies: dict[int, int] | None = None,
                         min_slots: dict[int, int] | None = None) -> IntervalModel:
    """The interval formulation of ``problem`` (built with ``chain=None``) at one budget;
    ``allowance``: the largest recompute (:func:`~dtrlab.runtime.recompute_allowance`; None: no limit).

    ``min_copies`` (operator -> computations) and ``min_slots`` (stage -> recomputations
    in its gap) raise the two bounds where a known run needs more: given DTR's run
    or another policy's (:func:`.hint.policy_run`), the model holds that run, so its
    optimum is never worse.
    """
    from ortools.sat.python import cp_model

    if problem.chain is not None:
        raise ValueError("the interval formulation needs the unbounded need closure: build_problem(trace, chain=None)")
    check_interval_size(problem)
    if copies < 1 or slots < 0:
        raise ValueError(f"copies must be >= 1 and slots >= 0, got copies={copies}, slots={slots}")
    model = IntervalModel(cp=cp_model.CpModel(), problem=problem, slots=slots,
                          stage_times=_stage_times(problem, slots, min_slots), copies={}, cost_terms=[])
    memory = _Memory(horizon=model.stage_times[-1] + 1 if model.stage_times else 0)
    for op_index in problem.op_stage:
        _add_copies(model, op_index, max(copies, (min_copies or {}).get(op_index, 0)), memory)
    for chain in model.copies.values():
        _add_overlap_rules(model, chain)
        _add_views_within_storage(model, chain)
    _add_dependencies(model)
    _add_memory(model, memory, budget_bytes)
    if model.cost_terms and allowance is not None:
        model.cp.Add(sum(cost * present for present, cost in model.cost_terms) <= allowance)
    return model


@dataclass
class _Memory:
    """What the cumulative and slot constraints gather while the copies are built."""

    horizon: int  # one past the last event
    intervals: list = field(default_factory=list)  # retention intervals (and the pinned constants')
    demands: list[int] = field(default_factory=list)  # their bytes
    slot_events: list = field(default_factory=list)  # allocating recomputations: one to a slot


def _stage_times(problem: Problem, slots: int, min_slots: dict[int, int] | None) -> list[int]:
    """The time of each stage's operator, after its gap's recompute slots."""
    stage_times, time = [], -1
    for t in range(problem.n_stages):
        room = max(slots + (len(problem.end_pinned) if t == problem.final_stage else 0), (min_slots or {}).get(t, 0))
        time += 1 + room
        stage_times.append(time)
    return stage_times


def _gap_slots(model: IntervalModel, t: int) -> range:
    return range(model.stage_times[t - 1] + 1 if t else 0, model.stage_times[t])


def _add_copies(model: IntervalModel, op_index: int, copies: int, memory: _Memory) -> None:
    """Operator ``op_index``'s chain of copies, ordered in time, and their retention intervals."""
    from ortools.sat.python import cp_model

    cp, problem = model.cp, model.problem
    op = problem.trace.operators[op_index]
    first = model.stage_time(problem.op_stage[op_index])
    fresh = [x for x, alias in zip(op.outputs, op.aliases) if alias == -1]
    if not fresh and all(problem.storage[x] in problem.pinned_storages for x in op.outputs):
        model.copies[op_index] = [_Copy(op_index, 0, first, True, first)]
        return  # a view of a constant is always defined
    chain = [_Copy(op_index, 0, first, True, first)]
    slot_times = [time for t in problem.need[op_index] for time in _gap_slots(model, t)]
    allocates = any(alias == -1 for alias in op.aliases)
    for k in range(1, copies if slot_times else 1):
        start = cp.NewIntVarFromDomain(cp_model.Domain.FromValues(slot_times), f"x{op_index}.{k}")
        present = cp.NewBoolVar(f"p{op_index}.{k}")
        chain.append(_Copy(op_index, k, start, present, min(slot_times)))
        if allocates:
            memory.slot_events.append(cp.NewOptionalFixedSizeIntervalVar(start, 1, present, ""))
        model.cost_terms.append((present, op.cost))
        prev = chain[k - 1]
        if k > 1:
            cp.AddImplication(present, prev.present)
        cp.Add(start >= prev.start + 1).OnlyEnforceIf(present)
    for c in chain:
        _add_retention(model, c, memory)
    model.copies[op_index] = chain


def _add_retention(model: IntervalModel, c: _Copy, memory: _Memory) -> None:
    """Copy ``c``'s end for each output it defines and, for a fresh storage, its interval in memory."""
    cp, problem = model.cp, model.problem
    op = problem.trace.operators[c.op]
    need = problem.need[c.op]
    lo = c.earliest
    for x in op.outputs:
        if problem.storage[x] in problem.pinned_storages:
            continue
        hi = model.stage_time(need[-1] if need else problem.op_stage[c.op])
        freed = problem.release_stage.get(x) if x in problem.storage_window else None
        if freed is not None and c.k == 0:
            hi = min(hi, model.stage_time(freed - 1))
        end = cp.NewIntVar(lo, max(lo, hi), f"e{c.op}.{c.k}.{x}")
        c.ends[x], c.latest_end[x] = end, max(lo, hi)
        if c.k:
            cp.Add(end >= c.start).OnlyEnforceIf(c.present)
        if freed is not None and c.k:
            # A release frees the storage: no copy spans it (ends before, or starts after).
            before = cp.NewBoolVar("")
            cp.Add(end <= model.stage_time(freed - 1)).OnlyEnforceIf(before)
            cp.Add(c.start >= model.stage_time(freed - 1) + 1).OnlyEnforceIf(before.Not())
        size = op.sizes[problem.trace.tensor_index[x]]
        if x in problem.storage_window and size:
            length = cp.NewIntVar(1, memory.horizon, "")
            if c.k == 0:
                memory.intervals.append(cp.NewIntervalVar(c.start, length, end + 1, ""))
            else:
                memory.intervals.append(cp.NewOptionalIntervalVar(c.start, length, end + 1, c.present, ""))
            memory.demands.append(size)


def _add_overlap_rules(model: IntervalModel, chain: list[_Copy]) -> None:
    """Two copies of one output overlap only as a dropped duplicate of a multi-output operator
    (the later one ends at its start); an operator whose outputs are all resident is not
    recomputed, nor a single-output one or a view whose output is resident."""
    cp = model.cp
    outputs = list(chain[0].ends)
    duplicates_allowed = len(outputs) > 1 and all(x in model.problem.storage_window for x in outputs)
    for later in chain[1:]:
        gone_outputs = []
        for x in outputs:
            gone = cp.NewBoolVar("")
            gone_outputs.append(gone)
            for earlier in chain[:later.k]:
                both = [later.present] if earlier.k == 0 else [later.present, earlier.present]
                overlap = cp.NewBoolVar("")
                cp.Add(earlier.ends[x] <= later.start - 1).OnlyEnforceIf([overlap.Not(), *both])
                cp.Add(later.ends[x] == later.start).OnlyEnforceIf([overlap, later.present])
                cp.AddImplication(gone, overlap.Not())
                if not duplicates_allowed:
                    cp.Add(overlap == 0)
        if gone_outputs:
            cp.AddBoolOr(gone_outputs).OnlyEnforceIf(later.present)


def _add_views_within_storage(model: IntervalModel, chain: list[_Copy]) -> None:
    """A view lives within one copy of its storage, from its computation on."""
    cp, problem = model.cp, model.problem
    for c in chain:
        for x, end in c.ends.items():
            if x in problem.storage_window:
                continue
            s = problem.storage[x]
            choices = []
            for b in model.copies[problem.trace.tensor_op[s]]:
                within = cp.NewBoolVar("")
                choices.append(within)
                if b.k:
                    cp.AddImplication(within, b.present)
                cp.Add(b.start <= c.start - 1).OnlyEnforceIf(within)
                cp.Add(end <= b.ends[s]).OnlyEnforceIf(within)
            _require(cp, choices, c.present)


def _add_dependencies(model: IntervalModel) -> None:
    """Every copy needs its arguments defined when it starts; the final stage, its end pins."""
    cp, problem = model.cp, model.problem
    trace = problem.trace

    def need_defined(tensor: int, when, present) -> None:
        """Some copy of ``tensor`` started before ``when`` and is retained at ``when``."""
        if problem.storage[tensor] in problem.pinned_storages:
            return
        choices = []
        for c in model.copies[trace.tensor_op[tensor]]:
            if isinstance(when, int) and (c.earliest >= when or c.latest_end[tensor] < when):
                continue
            used = cp.NewBoolVar("")
            choices.append(used)
            if c.k:
                cp.AddImplication(used, c.present)
            cp.Add(c.start <= when - 1).OnlyEnforceIf(used)
            cp.Add(c.ends[tensor] >= when).OnlyEnforceIf(used)
        if not choices and present is True:
            model.infeasible = model.infeasible or f"{trace.tensor_names[tensor]} cannot be defined when it is needed"
        _require(cp, choices, present)

    for op_index, chain in model.copies.items():
        for c in chain:
            for a in set(trace.operators[op_index].args):
                need_defined(a, c.start, c.present)
    if problem.final_stage is not None:
        for x in sorted(problem.end_pinned):
            need_defined(x, model.stage_time(problem.final_stage), True)


def _add_memory(model: IntervalModel, memory: _Memory, budget_bytes: int) -> None:
    """The retention intervals and the pinned constants fit the budget; one allocation a slot."""
    # Pinned constants: fixed intervals from the gap of the first stage they precede.
    previous = 0
    for t, pinned_bytes in enumerate(model.problem.constant_bytes):
        if pinned_bytes > previous:
            begin = _gap_slots(model, t).start
            memory.intervals.append(model.cp.NewIntervalVar(begin, memory.horizon - begin, memory.horizon, ""))
            memory.demands.append(pinned_bytes - previous)
            previous = pinned_bytes
    if budget_bytes < previous:
        model.infeasible = f"the pinned constants ({previous} bytes) exceed the budget"
    model.cp.AddCumulative(memory.intervals, memory.demands, int(budget_bytes))
    if memory.slot_events:
        model.cp.AddNoOverlap(memory.slot_events)


def _require(cp, choices: list, present) -> None:
    if present is True:
        cp.AddBoolOr(choices) if choices else cp.AddBoolOr([False])
    elif choices:
        cp.AddBoolOr(choices).OnlyEnforceIf(present)
    else:
        cp.Add(present == 0)


class _Fixed:
    """Variable values from hints, read like a solved :class:`CpSolver`."""

    def __init__(self, hints: list[tuple[object, int]]):
        self.values = {var.Index(): value for var, value in hints}

    def Value(self, var) -> int:
        return self.values[var.Index()]

    def BooleanValue(self, var) -> bool:
        return bool(self.values[var.Index()])


def solve_interval(model: IntervalModel, time_limit_s: float, workers: int, feasibility_only: bool,
                   hints: list[tuple[object, int]] | None = None, complete_hint: bool = False):
    """``(status, schedule, recompute, bound)`` of the model with CP-SAT, starting from
    ``hints`` ((variable, value) pairs, e.g. DTR's run) or else from keeping everything.
    With ``complete_hint`` (the hints are a known point of the model: every start, end
    and presence of a run that passed), that point is returned as "feasible" when the
    time runs out before the search reports a solution."""
    from ortools.sat.python import cp_model

    cp = model.cp
    if model.cost_terms and not feasibility_only:
        cp.Minimize(sum(cost * present for present, cost in model.cost_terms))
    if hints is None:
        hints = [(c.present, 0) for chain in model.copies.values() for c in chain if c.k]
        hints += [(end, c.latest_end[x]) for chain in model.copies.values() for c in chain if not c.k
                  for x, end in c.ends.items()]
    for var, value in hints:
        cp.AddHint(var, value)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit_s)
    solver.parameters.num_workers = max(1, int(workers))
    code = solver.Solve(cp)
    if code == cp_model.INFEASIBLE:
        return "infeasible", None, None, None
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        if not complete_hint:
            return "unknown", None, None, None
        # Out of time before the search reported even its start: the hinted run (DTR's)
        # is a point of the model, so it is the incumbent (the replay checks it as any other).
        values = _Fixed(hints)
        recompute = sum(cost for present, cost in model.cost_terms if values.BooleanValue(present))
        return "feasible", read_schedule(model, values), recompute, None
    recompute = sum(cost for present, cost in model.cost_terms if solver.BooleanValue(present))
    if feasibility_only:
        return "feasible", read_schedule(model, solver), recompute, None
    status = "optimal" if code == cp_model.OPTIMAL else "feasible"
    bound = recompute if status == "optimal" else solver.BestObjectiveBound()
    return status, read_schedule(model, solver), recompute, bound


def read_schedule(model: IntervalModel, solver) -> Schedule:
    """The solution as a :class:`Schedule` with evictions between recomputations."""
    problem = model.problem
    n = problem.n_stages
    remats: list[list[tuple[int, int]]] = [[] for _ in range(n)]  # gap -> (time, operator)
    retained: dict[int, list[tuple[int, int]]] = {}  # storage -> its copies' (start, end)
    for op_index, chain in model.copies.items():
        for c in chain:
            if c.k and not solver.BooleanValue(c.present):
                continue
            start = c.start if c.k == 0 else solver.Value(c.start)
            if c.k:
                views_first = not model.problem.trace.operators[op_index].total_size
                remats[model.gap_of(start)].append((start, not views_first, op_index))
            for x, end in c.ends.items():
                if x in problem.storage_window:
                    retained.setdefault(x, []).append((start, solver.Value(end)))
    for gap in remats:
        gap.sort()  # by time; views (which allocate nothing) first at a shared time
    events = sorted({time for gap in remats for time, _, _ in gap} | set(model.stage_times))
    where = {}  # event time -> (gap, position of its first event in the gap; the stage's operator is last)
    for t, gap in enumerate(remats):
        for j, (time, _, _) in reversed(list(enumerate(gap))):
            where[time] = (t, j)
        where[model.stage_time(t)] = (t, len(gap))
    evict = [[set() for _ in range(len(gap) + 1)] for gap in remats]
    resident = [set() for _ in range(n)]
    for s, spans in retained.items():
        for start, end in spans:
            for t in range(model.gap_of(start), n):  # the stages inside the span
                if model.stage_time(t) > end:
                    break
                resident[t].add(s)
            nxt = bisect.bisect_right(events, end)
            if nxt == len(events):
                continue
            z = events[nxt]
            if not any(a < z <= b for a, b in spans):  # another copy still holds it (a dropped duplicate's original)
                t, j = where[z]
                evict[t][j].add(s)
    return Schedule(resident=tuple(tuple(sorted(r)) for r in resident),
                    remat=tuple(tuple(op for _, _, op in gap) for gap in remats),
                    evictions=tuple(tuple(tuple(sorted(e)) for e in gap) for gap in evict))
