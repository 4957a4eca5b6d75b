"""The lockstep runtime: dtrlab's simulator decides, real tensors follow.

One training step runs for real under :class:`Executor`, a subclass of the capture's
recorder (:class:`dtrlab.trace.capture.Recorder`): the real step goes through the very
dispatch code that recorded its trace, so every log line it emits is compared with the
captured trace's line at the same position. A different operator, argument, size, cost or
release order stops the step with :class:`Divergence` naming the operator and the line.

While the lines agree, a :class:`LockstepSimulator` (the Python :class:`Simulator`) replays
the captured trace in step with the real program. Before each logged real operator runs, the
simulator takes the schedule up to that operator's compute: it rematerializes what the
operator reads and evicts by the policy to make room. The simulator's hooks carry each
decision out on real memory:

* **evict** a storage: when no resident storage of the trace reads its bytes from the same
  real storage any more, the real storage is shrunk to 0 bytes (``UntypedStorage.resize_(0)``);
  every view of it stays a valid tensor object without data;
* **rematerialize** an operator: its recorded call (the ATen overload, the non-tensor
  arguments, the trace tensors it read) runs again on the real parents, and its fresh outputs
  are copied back into their real storages, grown back to their size. Random operators replay
  the generator state they first ran with; arguments an operator writes are copied first, so
  that a recomputation never writes the program's storages.

Decisions are therefore the simulator's by construction (the same trace, policy, budget and
cost model); what this module adds is that they are carried out, and checks that they can be.

In-place operators (simrd's ``MUTATE``) give one real storage several trace storages (the
storage before and after each write), so the runtime numbers the versions of each real
storage (0 when it is made, +1 per in-place write) and records which version every
operator call read. A recomputation runs only on the versions its call first read (a
replaced version is recomputed into a private storage), and the program's own operators
only on the latest; where the needed version exists nowhere (an in-place write through one
alias, read through another, once the simulator has evicted the written version) that is an
:class:`UnsupportedOperator` error that names the operator, never a silently wrong value.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..runtime.simulator import Simulator
from ..trace.capture import Recorder
from ..trace.model import COMPUTE, Trace


class ExecutionError(RuntimeError):
    """The real step cannot be executed as the simulator decided it."""


class Divergence(ExecutionError):
    """The real step's operators differ from the captured trace's."""


class UnsupportedOperator(ExecutionError):
    """An operator the runtime cannot recompute or check; the message names it."""


@dataclass
class RealStorage:
    """Where a trace storage's bytes live: a storage of the program (shared by its versions), or a
    private one the runtime made for a version that an in-place write has since overwritten."""

    storage: torch.UntypedStorage | None
    nbytes: int
    shared: bool  # the program's storage (its tensors point at it); False: private to the runtime
    claimants: list[int] = field(default_factory=list)  # trace storages placed here (shared: every version)
    version: int | None = 0  # the version its bytes hold now; None: dropped (0 bytes)
    latest: int = 0  # the version the program wrote last

    @property
    def present(self) -> bool:
        return self.version is not None


@dataclass(frozen=True)
class TensorLayout:
    """How a trace tensor views its storage (enough to rebuild it for a recomputation)."""

    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


@dataclass(frozen=True)
class Recipe:
    """One recorded operator call, replayable on rebuilt arguments."""

    func: object  # the ATen OpOverload
    spec: object  # pytree spec of (args, kwargs)
    leaves: tuple  # non-tensor leaves; a tensor's slot holds its position among the tensor arguments
    tensor_slots: tuple[int, ...]  # leaf index of each tensor argument
    read_versions: tuple[int, ...]  # the version of each tensor argument's storage when the call first ran
    written: frozenset[int]  # positions (among the tensor arguments) the operator writes
    rng_state: torch.Tensor | None  # generator state before a random operator first ran


@dataclass(frozen=True)
class Recomputation:
    """One real rematerialization: the operator, its cost in the trace's unit, and its wall time."""

    operator: int
    name: str
    cost: int
    wall_ns: int


class LockstepSimulator(Simulator):
    """The reference simulator, whose evictions and rematerializations also happen for real."""

    def __init__(self, *args, executor: Executor, **kwargs):
        self.executor = executor
        super().__init__(*args, **kwargs)

    def evict(self, s: int) -> None:
        super().evict(s)
        self.executor.on_evict(s)

    def _compute(self, t: int, op, rematerialize: bool) -> None:
        if rematerialize:
            self.executor.rematerialize(self.tensor_op[t])
        super()._compute(t, op, rematerialize)


class Executor(Recorder):
    """The capture's recorder, executing the step while it checks it against the captured trace."""

    def __init__(self, cost: str, repeats: int, *, trace: Trace, expected_lines: list[dict], make_simulator):
        super().__init__(cost, repeats)
        self.trace = trace
        self.expected = expected_lines
        self.tensor_id = {name: t for t, name in enumerate(trace.tensor_names)}
        self.root = storage_roots(trace)
        self.compute_step = {operand: step for step, (kind, operand) in enumerate(trace.schedule) if kind == COMPUTE}
        # The written argument positions of each MUTATE operator (simrd's in-place writes).
        operator_lines = [line for line in expected_lines if line["INSTRUCTION"] in ("CONSTANT", "CALL", "MUTATE")]
        self.mutated = [tuple(line["MUTATE"]) if line["INSTRUCTION"] == "MUTATE" else None for line in operator_lines]
        self.copy_source: dict[str, str] = {}  # COPY dst -> src: the name a constant is used by
        self.program: dict[int, RealStorage] = {}  # real storage key -> the program's storage
        self.place: dict[int, RealStorage] = {}  # trace storage -> where its bytes live
        self.program_of: dict[int, RealStorage] = {}  # trace storage -> the program's storage it was made on
        self.version: dict[int, int] = {}  # trace storage -> the version of the program's storage it is
        self.layout: dict[int, TensorLayout] = {}
        self.recipes: dict[int, Recipe] = {}
        self.next_operator = 0  # index of the next operator line (constants included)
        self.recomputations: list[Recomputation] = []
        self.real_bytes = 0  # bytes of the real storages the runtime keeps resident (program's and private)
        # After each operator's computation (constants aside): (the simulator's memory, real_bytes). Sampled
        # there because the simulator runs behind the program between operators (the program holds its
        # parameters before the simulator's schedule reaches them).
        self.memory_timeline: list[tuple[int, int]] = []
        self._sampled = {self.compute_step[i] for i, op in enumerate(trace.operators) if not op.is_constant}
        self.sim: LockstepSimulator = make_simulator(self)
        self._steps = self.sim.steps()
        self._step = -1  # last schedule step the simulator took
        self._call: tuple | None = None  # the call being executed: (recipe, predicted operator or None)

    # -- the schedule --------------------------------------------------------------

    def advance_to(self, step: int) -> None:
        """Let the simulator take every schedule step up to ``step`` (inclusive)."""
        while self._step < step:
            self._step = next(self._steps)
            self._sample()

    def abandon(self) -> None:
        """Stop following the program (the step failed): tensors that die from now on are not logged."""
        self.closed = True
        for finalizer in list(self._tensor_finalizers.values()) + self._storage_finalizers:
            finalizer.detach()

    def finish(self) -> None:
        """The schedule's remaining steps (releases, then the outputs' pins) after the real step ended."""
        if len(self.lines) != len(self.expected):
            line = self.expected[len(self.lines)]
            raise Divergence(f"the real step ended at log line {len(self.lines) + 1} of {len(self.expected)}; "
                             f"the captured trace continues with {_describe(line)}")
        for self._step in self._steps:
            self._sample()

    def _sample(self) -> None:
        if self._step in self._sampled:
            self.memory_timeline.append((self.sim.memory, self.real_bytes))

    # -- log lines: checked one by one ----------------------------------------------

    def _emit(self, **line) -> None:
        position = len(self.lines)
        expected = self.expected[position] if position < len(self.expected) else None
        if line != expected:
            raise Divergence(f"the real step diverged from the captured trace at log line {position + 1}: it "
                             f"emitted {_describe(line)} where the trace has "
                             f"{_describe(expected) if expected else 'nothing more'}")
        super()._emit(**line)
        instruction = line["INSTRUCTION"]
        if instruction == "COPY":
            self.copy_source[line["DST"]] = line["SRC"]
        elif instruction in ("CONSTANT", "CALL", "MUTATE"):
            self.next_operator += 1

    def _bind(self, t: torch.Tensor, name: str) -> None:
        super()._bind(t, name)
        tensor = self.tensor_id[self.copy_source.get(name, name)]
        self.layout[tensor] = _layout_of(t)
        root = self.root[tensor]
        storage = t.untyped_storage()
        key = storage._cdata
        if root != tensor:  # a view: it lives on its root's real storage
            if self.program_of[root].storage._cdata != key:
                raise Divergence(f"{self.trace.tensor_names[tensor]} aliases {self.trace.tensor_names[root]} in "
                                 "the trace but not in the real step")
            return
        record = self.program.get(key)
        if record is None:
            record = self.program[key] = RealStorage(storage, storage.nbytes(), shared=True)
            self.real_bytes += record.nbytes
        elif not any(self.trace.tensor_op[c] == self.trace.tensor_op[tensor] for c in record.claimants):
            raise Divergence(f"{self.trace.tensor_names[tensor]} is a new storage in the trace but reuses the real "
                             f"storage of {self.trace.tensor_names[record.claimants[0]]}")
        record.claimants.append(tensor)
        self.place[tensor] = self.program_of[tensor] = record
        self.version[tensor] = record.latest

    # -- operators ------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        recipe, predicted = self._call
        self._call = None
        emitted = self.next_operator
        if predicted is not None and emitted <= predicted:
            raise Divergence(f"the real call of {func} produced no log line where the trace has operator "
                             f"{predicted} ({self.trace.operators[predicted].name})")
        first = predicted if predicted is not None else emitted
        for index in range(first, emitted):
            self.recipes[index] = recipe
            if index != predicted:  # the MUTATE line of an operator that also returned fresh tensors
                self.advance_to(self.compute_step[index])
            if self.mutated[index] is not None:
                self._register_mutation(index, args, kwargs)
        return out

    def _run(self, func, args, kwargs, written):
        """Make the simulator take this call (its evictions and rematerializations happen for real), then run it."""
        flat, spec = tree_flatten((args, kwargs))
        tensors = [(i, a) for i, a in enumerate(flat) if isinstance(a, torch.Tensor)]
        _check_supported(func, flat, tensors)
        index = self.next_operator
        op = self.trace.operators[index] if index < len(self.trace.operators) else None
        predicted = index if op is not None and op.name == func.overloadpacket.__name__ else None
        if predicted is not None:
            # The releases and constants logged before this operator, then its computation: rematerializations
            # and evictions. (Before a call the log does not record, the simulator stays where the log is: the
            # releases that precede the next logged operator may not have happened yet.)
            self.advance_to(self.compute_step[index])
        leaves = list(flat)
        for position, (i, _) in enumerate(tensors):
            leaves[i] = position
        rng_state = _rng_state(tensors[0][1].device if tensors else None) \
            if torch.Tag.nondeterministic_seeded in func.tags else None
        read_versions = tuple(self._program_storage(a).latest for _, a in tensors)
        recipe = Recipe(func, spec, tuple(leaves), tuple(i for i, _ in tensors), read_versions,
                        frozenset(p for p, (_, a) in enumerate(tensors) if id(a) in written), rng_state)
        self._call = (recipe, predicted)
        for _, a in tensors:
            record = self._program_storage(a)
            if record.version != record.latest:
                raise self._unreadable(func, record, logged=predicted is not None)
        if predicted is not None:
            for _, a in tensors:
                if id(a) in written:
                    self._keep_pinned_version(self._program_storage(a))
        return func(*args, **kwargs), 0

    def _keep_pinned_version(self, record: RealStorage) -> None:
        """Before the program writes a constant in place (an optimizer's update of a parameter), copy its
        bytes: the simulator keeps the constant resident for good, so recomputations may still read it."""
        for c in record.claimants:
            if self.place[c] is record and self.sim.pinned[c]:
                self.place[c] = RealStorage(_copy_storage(record.storage), record.nbytes, shared=False,
                                            claimants=[c])
                self.real_bytes += record.nbytes

    def _unreadable(self, func, record: RealStorage, logged: bool) -> ExecutionError:
        """Why the program reads a storage whose latest version is not resident."""
        names = self._trace_names(record.claimants)
        if not logged:
            return ExecutionError(f"{func} reads {names}, which is evicted; the trace does not log this read (e.g. "
                                  ".item() of a tensor computed earlier), so the simulator cannot rematerialize it")
        superseded = [c for c in record.claimants if self.sim.material[c] and self.place[c] is not record]
        if superseded:
            # simrd gives each version its own storage: the simulator keeps the old one resident (a tensor the
            # program still reads, written in place through another alias) while the written one is evicted.
            return UnsupportedOperator(
                f"{func} reads {names} after an in-place write through another alias; the trace keeps "
                f"{self._trace_names(superseded)} resident as a separate storage, so the written version was evicted")
        return ExecutionError(f"{func} reads {names}, which the simulator has resident but the runtime does "
                              "not (a runtime bug)")

    def _program_storage(self, a: torch.Tensor) -> RealStorage:
        key = a.untyped_storage()._cdata
        record = self.program.get(key)
        if record is None:  # a constant met for the first time is declared (and bound) before its call runs
            raise ExecutionError(f"a tensor of {a.untyped_storage().nbytes()} bytes is unknown to the runtime")
        return record

    def _register_mutation(self, index: int, args, kwargs) -> None:
        """A MUTATE line: its outputs are the written arguments' real storages, now holding the new values."""
        op = self.trace.operators[index]
        flat = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        bumped = []
        for output, position in zip(op.outputs, self.mutated[index]):
            written = flat[position]
            record = self.program_of[self.root[op.args[position]]]
            if written.untyped_storage().nbytes() != record.nbytes:
                raise UnsupportedOperator(f"{op.name} resized the storage it writes ({record.nbytes} to "
                                          f"{written.untyped_storage().nbytes()} bytes); the runtime cannot "
                                          "recompute a resized storage")
            if not any(record is r for r in bumped):  # one new version per storage and call
                bumped.append(record)
                for c in record.claimants:  # the versions overwritten: recomputed privately if needed again
                    if self.place[c] is record:
                        self.place[c] = RealStorage(None, record.nbytes, shared=False, claimants=[c], version=None)
                record.latest += 1
                record.version = record.latest
            self.layout[output] = _layout_of(written)
            record.claimants.append(output)
            self.place[output] = self.program_of[output] = record
            self.version[output] = record.latest

    def _trace_names(self, storages) -> str:
        return ", ".join(sorted(self.trace.tensor_names[s] for s in storages))

    # -- the simulator's decisions, for real ------------------------------------------

    def on_evict(self, s: int) -> None:
        record = self.place.get(s)
        if record is None or not record.present:
            return
        if record.shared:
            # While the simulator has a trace storage resident whose bytes are read here, keep them: another
            # output of the same call, or a version an in-place write has replaced and that has no private
            # copy (its tensors, still read by the program, see the new bytes; a constant written in place,
            # batch norm's running statistics, is pinned and keeps it for good).
            if any(self.sim.material[c] and (self.place[c] is record or not self.place[c].present)
                   for c in record.claimants):
                return
            record.storage.resize_(0)
        else:
            record.storage = None
        record.version = None
        self.real_bytes -= record.nbytes

    def rematerialize(self, index: int) -> None:
        """Run operator ``index`` again and restore its outputs whose bytes are not resident."""
        op = self.trace.operators[index]
        targets = [(j, t) for j, (t, alias) in enumerate(zip(op.outputs, op.aliases))
                   if alias == -1 and not self.place[t].present]
        if not targets:
            return
        start = time.perf_counter_ns()
        outputs = self._recompute(index)
        for j, t in targets:
            self._restore(t, outputs[j], op)
        self.recomputations.append(Recomputation(index, op.name, op.cost, time.perf_counter_ns() - start))

    def _recompute(self, index: int) -> list[torch.UntypedStorage | None]:
        """Run operator ``index`` on its recorded arguments; the storage of each output (None for a view)."""
        op = self.trace.operators[index]
        recipe = self.recipes[index]
        mutated = self.mutated[index]
        leaves = list(recipe.leaves)
        copies = {}  # position -> private copy of a written argument's storage
        for position, slot in enumerate(recipe.tensor_slots):
            t = op.args[position]
            written = position in recipe.written
            storage = self._value(t, recipe.read_versions[position], any_version=written and mutated is None,
                                  reader=(index, op))
            if written:
                # A recomputation never writes the program's storages: it writes a copy (which, for an
                # in-place operator, becomes the output's bytes).
                storage = copies[position] = _copy_storage(storage)
            leaves[slot] = self._tensor(t, storage)
        args, kwargs = tree_unflatten(leaves, recipe.spec)
        with _replayed_rng(recipe.rng_state, recipe.func, leaves):
            out = recipe.func(*args, **kwargs)
        if mutated is not None:
            return [copies[position] for position in mutated]
        written_ids = {id(leaves[recipe.tensor_slots[p]]) for p in copies}
        results = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor) and id(o) not in written_ids]
        storages = []
        for t, alias, result in zip(op.outputs, op.aliases, results):
            if alias != -1:
                storages.append(None)
                continue
            if _layout_of(result) != self.layout[t] or result.untyped_storage().nbytes() != self.place[t].nbytes:
                raise UnsupportedOperator(f"recomputing {op.name} gave {self.trace.tensor_names[t]} another layout "
                                          f"than its first run ({_layout_of(result)} against {self.layout[t]})")
            storages.append(result.untyped_storage())
        if len(results) != len(op.outputs):
            raise UnsupportedOperator(f"recomputing {op.name} returned {len(results)} tensors, not {len(op.outputs)}")
        return storages

    def _value(self, t: int, version: int, any_version: bool, reader) -> torch.UntypedStorage:
        """The storage holding tensor ``t``'s bytes at ``version`` of its program storage (the simulator has
        made ``t`` resident). ``any_version``: the current values will do (an argument that the recomputation
        writes a copy of)."""
        s = self.root[t]
        index, op = reader
        program = self.program_of[s]
        if program.present and (any_version or program.version == version):
            return program.storage
        if self.version[s] == version and self.place[s].present:  # a replaced version, kept privately
            return self.place[s].storage
        if self.version[s] != version:
            raise UnsupportedOperator(
                f"recomputing {op.name} (operator {index}) reads {self.trace.tensor_names[t]} as the program saw it "
                f"then, version {version} of its storage, written in place through another alias; the trace's "
                f"{self.trace.tensor_names[t]} is version {self.version[s]}, and that version is not resident")
        raise ExecutionError(f"recomputing {op.name} (operator {index}) reads {self.trace.tensor_names[t]}, "
                             "which the simulator has resident but the runtime does not (a runtime bug)")

    def _tensor(self, t: int, storage: torch.UntypedStorage) -> torch.Tensor:
        layout = self.layout[t]
        view = torch.empty((0,), dtype=layout.dtype, device=storage.device)
        return view.set_(storage, layout.offset, layout.size, layout.stride)

    def _restore(self, t: int, storage: torch.UntypedStorage, op) -> None:
        record = self.place[t]
        if record.present:  # two outputs of the operator on one storage: restored with the first
            return
        self.real_bytes += record.nbytes
        if record.shared:
            record.storage.resize_(record.nbytes)
            # As bytes (UntypedStorage.copy_ is element by element in Python, a thousand times slower).
            _bytes(record.storage).copy_(_bytes(storage))
            record.version = record.latest
        else:
            record.storage = storage
            record.version = 0


# -- helpers ------------------------------------------------------------------------

def storage_roots(trace: Trace) -> list[int]:
    """Each tensor's storage: its root tensor id, as the simulator names storages."""
    roots = list(range(trace.n_tensors))
    for t in range(trace.n_tensors):
        op = trace.operators[trace.tensor_op[t]]
        alias = op.aliases[trace.tensor_index[t]]
        if alias != -1:
            roots[t] = roots[op.args[alias]]
    return roots


def _bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty((0,), dtype=torch.uint8, device=storage.device).set_(storage)


def _copy_storage(storage: torch.UntypedStorage) -> torch.UntypedStorage:
    copy = torch.UntypedStorage(storage.nbytes(), device=storage.device)
    _bytes(copy).copy_(_bytes(storage))
    return copy


def _layout_of(t: torch.Tensor) -> TensorLayout:
    return TensorLayout(t.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset())


def _describe(line: dict) -> str:
    if line["INSTRUCTION"] in ("CALL", "MUTATE"):
        return f"{line['INSTRUCTION']} {line['NAME']}({', '.join(line['ARGS'])}) " \
               f"-> {line.get('RESULT', line.get('MUTATE'))} cost {line['TIME']}"
    return " ".join(f"{k}={v}" for k, v in sorted(line.items()))


def _check_supported(func, flat, tensors) -> None:
    for value in flat:
        if isinstance(value, torch.Generator):
            raise UnsupportedOperator(f"{func} draws from an explicit torch.Generator, whose state the runtime "
                                      "cannot replay for a recomputation; use the default generator")
    for _, a in tensors:
        if type(a) is not torch.Tensor and not isinstance(a, torch.nn.Parameter):
            raise UnsupportedOperator(f"{func} takes a {type(a).__name__}; the runtime executes plain tensors only")
        if a.layout != torch.strided:
            raise UnsupportedOperator(f"{func} takes a {a.layout} tensor; the runtime executes strided tensors only")


def _rng_state(device: torch.device | None) -> torch.Tensor:
    if device is not None and device.type == "cuda":
        return torch.cuda.get_rng_state(device)
    return torch.get_rng_state()


class _replayed_rng:
    """Run a random operator's recomputation from the generator state of its first run."""

    def __init__(self, state: torch.Tensor | None, func, leaves):
        self.state = state
        tensors = [a for a in leaves if isinstance(a, torch.Tensor)]
        self.device = tensors[0].device if tensors else torch.device("cpu")
        self.func = func

    def __enter__(self):
        if self.state is not None:
            self.saved = _rng_state(self.device)
            self._set(self.state)

    def __exit__(self, *exc):
        if self.state is not None:
            self._set(self.saved)

    def _set(self, state: torch.Tensor) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_rng_state(state, self.device)
        else:
            torch.set_rng_state(state)
