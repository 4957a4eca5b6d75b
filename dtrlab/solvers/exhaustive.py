"""The exhaustive oracle: the least recompute of a tiny trace, by exhaustive search, with the simulator's semantics.

The tests check every solver and policy against it (tests/test_solvers_oracle.py), and
scripts/ahead_of_demand_gap.py measures the gap to ahead-of-demand schedules with it.

A *run* replays the trace's steps as :class:`~dtrlab.runtime.Simulator` does (the same
byte counter, references, releases, pins, views, multi-output operators), and between
steps it may

* evict any resident storage that is not pinned (before any compute or pin step), and
* recompute an operator with an undefined output whose arguments are all defined, as
  ``Simulator.materialize`` does (its budget check with all output bytes, its duplicate
  outputs dropped after the check, its thrash check), before a non-constant compute step
  or a pin step.

*On demand* (the default), an operator may be recomputed before a step only if it is an
ancestor of a tensor the step needs (its operator's arguments, or the pinned tensor): the
simulator's own recomputations are of this kind (``materialize`` recomputes undefined
ancestors), and so are the solvers' schedules, which recompute at an operator's need
stages. ``ahead_of_demand=True`` lets any operator computed before be recomputed at any
such point (Checkmate's schedules). The step itself must then fit without evicting: every
eviction the simulator makes inside a step can be made just before it instead, and every
recomputation inside a step (an undefined argument) just before it, in the same order.

The search is label-setting over (step, resident storages, defined tensors, bytes counted),
keeping the least recompute per label, so it is exact. :func:`replay_witness` replays the
optimal run it found in the real simulator (every storage withheld from the policy), which
checks that the search's semantics are the simulator's; :func:`every_simulator_run` runs the
real simulator under every sequence of eviction choices, which checks that no run escapes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..policies import Policy
from ..runtime import Intervention, Simulator, baseline, recompute_allowance
from ..runtime.simulator import OutOfMemory, Thrash
from ..trace.builder import LogBuilder
from ..trace.model import COMPUTE, GET, PIN, RELEASE, Trace
from .replay import ScriptedPolicy

#: The search gives up (raises) beyond this many labels at one step: traces for the oracle are tiny.
MAX_LABELS = 200_000


class SearchTooLarge(RuntimeError):
    """The trace is too large for the exhaustive search."""


@dataclass(frozen=True)
class Optimum:
    """The least recompute of any run (None: no run fits), and the actions of one optimal run:
    ``actions[k]`` are the ("evict", storage) and ("remat", tensor) actions before step ``k``."""

    recompute: int | None
    actions: dict[int, tuple[tuple[str, int], ...]]
    labels: int  # the most labels held at one step (the search's size)


class _Static:
    """What the simulator derives from the trace alone: storages, their tensors and sizes."""

    def __init__(self, trace: Trace):
        ops = trace.operators
        n = trace.n_tensors
        self.storage = list(range(n))
        for op in ops:
            for t, alias in zip(op.outputs, op.aliases):
                if alias != -1:
                    self.storage[t] = self.storage[op.args[alias]]
        self.size = [0] * n
        for op in ops:
            for t, size, alias in zip(op.outputs, op.sizes, op.aliases):
                if alias == -1:
                    self.size[t] = size
        self.tensors_of: dict[int, list[int]] = {}
        for t in range(n):
            self.tensors_of.setdefault(self.storage[t], []).append(t)
        self.undefine = {s: ~sum(1 << t for t in tensors) for s, tensors in self.tensors_of.items()}


def _ancestors(trace: Trace, tensors) -> frozenset[int]:
    """The non-constant operators whose outputs ``tensors`` transitively depend on."""
    ops, seen, stack = trace.operators, set(), list(tensors)
    while stack:
        op_index = trace.tensor_op[stack.pop()]
        if op_index in seen or ops[op_index].is_constant:
            continue
        seen.add(op_index)
        stack.extend(ops[op_index].args)
    return frozenset(seen)


def least_recompute(trace: Trace, budget_bytes: int, overhead_limit: float = 2.0, *,
                    ahead_of_demand: bool = False) -> Optimum:
    """The least recompute of any run of ``trace`` within ``budget_bytes`` (see the module docstring)."""
    ops, static = trace.operators, _Static(trace)
    storage, size, undefine = static.storage, static.size, static.undefine
    allowance = recompute_allowance(baseline(trace).model_compute, overhead_limit)
    ref = [0] * trace.n_tensors
    pinned = 0  # bit mask of pinned storages (the same in every run at a step)
    computed: set[int] = set()  # operators computed so far
    # label (material mask, defined mask, bytes counted) -> (recompute, actions as a linked list)
    labels: dict[tuple[int, int, int], tuple[int, tuple | None]] = {(0, 0, 0): (0, None)}
    widest = 1

    def evict(material: int, defined: int, memory: int, s: int):
        return material & ~(1 << s), defined & undefine[s], memory - size[s]

    def allocations(label, op_index: int, target: int):
        """``materialize(target)`` once every argument is defined, after each way of making room:
        ``(label after, storages evicted just before)`` per inclusion-minimal set of evictions
        that makes its outputs fit. (An eviction the allocation does not need can wait until
        the next allocation that does: nothing reads residency in between.)"""
        op = ops[op_index]
        material, defined, memory = label
        room = memory + op.total_size - budget_bytes  # bytes to free
        locked = {storage[a] for a in op.args} | {s for s in static.tensors_of if pinned >> s & 1}
        evictable = [s for s in static.tensors_of if material >> s & 1 and s not in locked and size[s]]
        choices: list[tuple[int, ...]] = []

        def extend(start: int, chosen: list[int], freed: int) -> None:
            if freed >= room:
                if not chosen or freed - min(size[s] for s in chosen) < room:
                    choices.append(tuple(chosen))
                return
            for j in range(start, len(evictable)):
                chosen.append(evictable[j])
                extend(j + 1, chosen, freed + size[evictable[j]])
                chosen.pop()

        extend(0, [], 0)
        for chosen in choices:
            now = label
            for s in chosen:
                now = evict(*now, s)
            yield compute(now, op_index, target), chosen

    def compute(label, op_index: int, target: int):
        """``materialize(target)``'s effect once every argument is defined and its outputs fit."""
        material, defined, memory = label
        op = ops[op_index]
        assert memory + op.total_size <= budget_bytes
        memory += op.total_size
        for u, out_size in zip(op.outputs, op.sizes):
            if u != target and defined >> u & 1:
                memory -= out_size  # a duplicate of a resident output, dropped after the check
            else:
                material |= 1 << storage[u]
                defined |= 1 << u
        return material, defined, memory

    def record(path, evicted, action):
        for s in evicted:
            path = (("evict", s), path)
        return (action, path) if action else path

    def gap(needed, recompute_allowed: bool) -> None:
        """Close ``labels`` under recomputations (each after its evictions) before a step needing ``needed``."""
        nonlocal labels, widest
        if not recompute_allowed:
            return
        candidates = sorted(computed if ahead_of_demand else _ancestors(trace, needed) & computed)
        work = list(labels)
        while work:
            label = work.pop()
            recompute, path = labels[label]
            defined = label[1]
            for op_index in candidates:
                op = ops[op_index]
                target = next((u for u in op.outputs if not defined >> u & 1), None)
                if target is None or any(not defined >> a & 1 for a in op.args):
                    continue
                if allowance is not None and recompute + op.cost > allowance:
                    continue
                for after, evicted in allocations(label, op_index, target):
                    known = labels.get(after)
                    if known is None or recompute + op.cost < known[0]:
                        labels[after] = (recompute + op.cost, record(path, evicted, ("remat", target)))
                        work.append(after)
            if len(labels) > MAX_LABELS:
                raise SearchTooLarge(f"more than {MAX_LABELS} labels before one step of {trace.name}")
        widest = max(widest, len(labels))

    for k, (kind, operand) in enumerate(trace.schedule):
        if kind == COMPUTE:
            op = ops[operand]
            constant = op.is_constant
            gap(op.args, recompute_allowed=not constant)
            nxt = {}
            for label, (recompute, path) in labels.items():
                if any(not label[1] >> a & 1 for a in op.args):
                    continue  # an argument is undefined: some other label recomputed it first
                for after, evicted in allocations(label, operand, op.outputs[0]):
                    if after not in nxt or recompute < nxt[after][0]:
                        nxt[after] = (recompute, (("step", k), record(path, evicted, None)))
            labels = nxt
            computed.add(operand)
            for u in op.outputs:
                ref[storage[u]] += 1
        elif kind == PIN:
            s = storage[operand]
            if not pinned >> s & 1:
                gap([operand], recompute_allowed=True)
                for label in list(labels):
                    labels[label] = (labels[label][0], (("step", k), labels[label][1]))
                labels = {label: value for label, value in labels.items() if label[1] >> operand & 1}
                pinned |= 1 << s
        elif kind == GET:
            ref[storage[operand]] += 1
        elif kind == RELEASE:
            s = storage[operand]
            ref[s] -= 1
            if ref[s] == 0 and not pinned >> s & 1:
                nxt = {}
                for label, value in labels.items():
                    after = evict(*label, s) if label[0] >> s & 1 else label
                    if after not in nxt or value[0] < nxt[after][0]:
                        nxt[after] = value
                labels = nxt
        if not labels:
            return Optimum(None, {}, widest)
    recompute, path = min(labels.values(), key=lambda value: value[0])
    actions: dict[int, tuple] = {}
    step, pending = None, []  # walking back: the actions seen since the marker of ``step``
    while path is not None:
        action, path = path
        if action[0] == "step":
            if step is not None:
                actions[step] = tuple(reversed(pending))
            step, pending = action[1], []
        else:
            pending.append(action)
    if step is not None:
        actions[step] = tuple(reversed(pending))
    return Optimum(recompute, {k: v for k, v in actions.items() if v}, widest)


def replay_witness(trace: Trace, budget_bytes: int, optimum: Optimum, overhead_limit: float = 2.0) -> tuple[str, int]:
    """Replay ``optimum``'s run in the real simulator, the policy never asked: ``(status, recompute)``."""
    remat_limit = baseline(trace).model_compute * (overhead_limit - 1)
    sim = Simulator(trace, ScriptedPolicy(), budget_bytes, remat_limit,
                    intervention=Intervention(withhold=frozenset(range(trace.n_tensors))))
    try:
        for k, (kind, operand) in enumerate(trace.schedule):
            sim.step = k
            for action, item in optimum.actions.get(k, ()):
                if action == "evict":
                    sim.evict(item)
                else:
                    sim.materialize(item, True)
            if kind == COMPUTE:
                sim.compute_op(operand)
            elif kind == RELEASE:
                sim.release(operand)
            elif kind == GET:
                sim.get(operand)
            else:
                sim.pin(operand)
    except OutOfMemory:
        return "oom", sim.remat_compute
    except Thrash:
        return "thrash", sim.remat_compute
    return "pass", sim.remat_compute


class _Branch(Exception):
    """The run reached an eviction choice beyond its prefix of decisions."""


class _Prefixed(Policy):
    """Evicts by a prefix of decisions; past it, records the candidates and stops the run."""

    name = "prefixed"

    def __init__(self, prefix: tuple[int, ...]):
        super().__init__()
        self.prefix, self.taken, self.candidates = prefix, 0, None

    def choose(self, sim, candidates):
        if self.taken < len(self.prefix):
            self.taken += 1
            return [self.prefix[self.taken - 1]]
        self.candidates = list(candidates)
        raise _Branch()


def every_simulator_run(trace: Trace, budget_bytes: int, overhead_limit: float = 2.0,
                        max_runs: int = 5_000) -> list[int]:
    """The recompute of every passing run of the real simulator under *every* sequence of
    eviction choices (each time it must evict, any candidate): a check of the search that
    shares no code with it. Raises :class:`SearchTooLarge` beyond ``max_runs`` runs."""
    remat_limit = baseline(trace).model_compute * (overhead_limit - 1)
    passed, pending, runs = [], [()], 0
    while pending:
        prefix = pending.pop()
        runs += 1
        if runs > max_runs:
            raise SearchTooLarge(f"more than {max_runs} simulator runs of {trace.name}")
        policy = _Prefixed(prefix)
        sim = Simulator(trace, policy, budget_bytes, remat_limit)
        try:
            status = sim.run()
        except _Branch:
            pending.extend(prefix + (s,) for s in policy.candidates)
            continue
        if status == "pass":
            passed.append(sim.remat_compute)
    return passed


def tiny_log(pick) -> LogBuilder:
    """A tiny training step for the oracle: ``pick(lo, hi)`` draws each choice (an int in [lo, hi]).

    A constant x; a forward of 2-4 layers, each with a second ("saved") output, a view of
    its input, or a skip input from an earlier layer, some times; maybe an in-place op on an
    activation and a copy of one; then the backward in reverse order, each layer reading the
    previous gradient and its own activations and releasing them, as a real step's log does.
    Sizes 1-6 bytes, costs 0-8 units.
    """
    log = LogBuilder()
    log.constant("x", pick(1, 4))
    layers: list[list[str]] = []  # per layer: the names its backward reads
    held: list[str] = []  # names whose reference the log still holds
    previous = "x"
    for i in range(pick(2, 4)):
        args = [previous]
        if layers and pick(0, 2) == 0:
            args.append(layers[pick(0, len(layers) - 1)][0])
        shape = pick(0, 4)
        if shape == 4 and len(args) == 1 and previous != "x":
            outputs = [(f"a{i}", 0, 0)]  # a view of its input
        elif shape == 3:
            outputs = [(f"a{i}", pick(1, 6)), (f"s{i}", pick(1, 6))]
        else:
            outputs = [(f"a{i}", pick(1, 6))]
        log.call(f"f{i}", args, outputs, time=pick(0, 8))
        layers.append([name for name, *_ in outputs])
        held.extend(name for name, *_ in outputs)
        previous = f"a{i}"
    if pick(0, 2) == 0:  # an in-place op on an activation (the log reads the new version from then on)
        target = layers[pick(0, len(layers) - 1)][0]
        log.mutate(f"m_{target}", [target], [0], time=pick(0, 4))
    if pick(0, 2) == 0:  # a copy: a second name for an activation, read by the backward instead
        layer = layers[pick(0, len(layers) - 1)]
        log.copy(f"c_{layer[0]}", layer[0])
        held.append(f"c_{layer[0]}")
        layer[0] = f"c_{layer[0]}"
    log.backward()
    gradient = None
    for i in reversed(range(len(layers))):
        args = ([gradient] if gradient else []) + layers[i]
        log.call(f"b{i}", args, [(f"g{i}", pick(1, 6))], time=pick(0, 8))
        done = [name for name in args if name in held]
        log.release(*done)
        held = [name for name in held if name not in done]
        gradient = f"g{i}"
    log.release(gradient, *held)
    return log
