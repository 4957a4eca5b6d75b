"""The DTR simulator: simrd's ``RuntimeV2EagerOptimized``, decision for decision.

State lives in flat Python lists indexed by tensor id; a storage is identified by
the id of its root tensor (the first tensor that used it), exactly as simrd's
``Storage.root_id``. The eviction pool is an insertion-ordered dict, which behaves
like simrd's ``storage_pool`` list (append on unlock, remove on lock or evict) but
with O(1) membership tests.

The semantics that decide which storage gets evicted, all kept from simrd:

* the pool order: a storage re-enters the pool at the end whenever its last lock is
  released, so candidates are scanned in that order;
* the choice: the *last* candidate with the minimal score, stopping at a score of 0;
* scores are exact ``int / int`` true divisions (Python rounds them exactly);
* evicted neighbourhoods (regions) and equivalence classes are maintained
  incrementally with simrd's absorb/rebuild and union-find rules, quirks included
  (cached compute values, merges with not-yet-computed outputs);
* rematerialization locks defined parents first, then materializes the undefined
  ones in argument order, recursively;
* a release that drops the last external reference frees the storage at once
  (eager eviction), which is not counted as a policy eviction;
* thrash is checked after every (re)materialization against ``remat_limit``, as the
  integer allowance :func:`remat_allowance` (the same comparison for integer recompute).

Memory is simrd's byte counter unless a :class:`~dtrlab.memory.MemoryModel` is
given (``memory_model=``); then every storage also holds one block of that model
while it is materialized. What the budget limits is the run's semantics
(``enforce=``): under ``"reserved"`` an allocation must both fit the (rounded)
bytes and be placed, evicting until it is (:meth:`Simulator._place`); under
``"allocated"`` (the DTR prototype) the outputs are allocated one by one, a failed
allocation is a device OOM, and after the operator the policy evicts while the
model's allocated bytes exceed the budget (:meth:`Simulator._allocate_outputs`,
:meth:`Simulator._evict_over_budget`). See docs/memory.md. Without a model no
model code runs: the byte counter is exactly simrd's.
"""

from __future__ import annotations

import math
import sys
from array import array
from dataclasses import dataclass

from ..trace.model import COMPUTE, GET, RELEASE, Trace
from .regions import PyRegionIndex

try:
    from ._regions import RegionIndex as CRegionIndex
except ImportError:  # not built (e.g. running from a source tree without `pip install`)
    CRegionIndex = None

#: Bump when a change can alter any simulation outcome; caches key on it.
SIMULATOR_VERSION = 1

#: The runtime semantics: what the budget limits under a memory model (docs/memory.md).
RESERVED = "reserved"  # reserved memory <= budget; evict until a block can be placed (OneFlow's DTR, Coop)
ALLOCATED = "allocated"  # allocated block bytes <= budget after each operator (the DTR prototype)
SEMANTICS = (RESERVED, ALLOCATED)


def remat_allowance(remat_limit: float) -> int | None:
    """The largest integer recompute the thrash check accepts under ``remat_limit``; None: no limit.

    Recompute is an integer, so ``remat_compute > remat_limit`` holds exactly when it
    exceeds ``floor(remat_limit)``. Infinity and NaN (an infinite overhead limit times a
    zero compute) are never exceeded: simrd's ``>`` against NaN is always false.
    """
    if remat_limit == math.inf or math.isnan(remat_limit):
        return None
    return math.floor(remat_limit)


def recompute_allowance(base_compute: int, overhead_limit: float) -> int | None:
    """The largest recompute a run may do under ``overhead_limit`` (None: unlimited): the
    simulator's thrash allowance ``floor(base_compute * (overhead_limit - 1))``, which every
    solver model uses too, so that no model accepts a run the simulator calls thrash."""
    return remat_allowance(base_compute * (overhead_limit - 1))


class OutOfMemory(Exception):
    """Nothing is left to evict and the allocation does not fit (simrd's MemoryError)."""


class Thrash(Exception):
    """Rematerialization compute exceeded the limit (simrd's RematExceededError)."""


class SimulationError(RuntimeError):
    """The trace asks for something the runtime cannot do (e.g. a get after the last release)."""


@dataclass(frozen=True)
class Intervention:
    """A change to the runtime's choices, for causal experiments.

    Storages are named by their root tensor ids; steps index the trace's schedule.

    * ``withhold``: storages never offered as eviction candidates; eager frees
      still apply to them.
    * ``pin``: ``(storage, step)`` pairs (or a ``{storage: step}`` dict): just before
      that step, or right after the storage is created if that is later, the storage
      is pinned as a PIN step pins it: rematerialized if evicted, then never a
      candidate and never freed. A storage whose last reference is already released
      stays freed.
    * ``force_evict``: ``(storage, step)`` pairs: just before that step the storage
      is evicted if it is resident and not pinned (not counted as a policy eviction).
    """

    withhold: frozenset[int] = frozenset()
    pin: tuple[tuple[int, int], ...] = ()
    force_evict: tuple[tuple[int, int], ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "withhold", frozenset(self.withhold))
        for name in ("pin", "force_evict"):
            pairs = getattr(self, name)
            pairs = pairs.items() if isinstance(pairs, dict) else pairs
            object.__setattr__(self, name, tuple(sorted((int(s), int(step)) for s, step in pairs)))

    def __bool__(self) -> bool:
        return bool(self.withhold or self.pin or self.force_evict)


@dataclass
class Failure:
    """Where a failing run stopped.

    ``cause`` tells an out-of-memory apart: ``"bytes"`` when the (rounded) bytes did
    not fit the budget, ``"fragmentation"`` when they did but the memory model could
    place no block (only address-aware models), ``"device"`` when the allocator ran
    out of device memory under ``enforce="allocated"``. ``largest_free_block`` is the
    model's largest free block at the failure (None without a memory model).
    """

    kind: str  # "oom" or "thrash"
    step: int  # index into the trace's schedule
    operator: int  # operator being computed or rematerialized
    tensor: int  # tensor being materialized
    requested_bytes: int
    memory_in_use: int
    candidates: int
    cause: str | None = None  # "bytes", "fragmentation" or "device" for an OOM, None for thrash
    largest_free_block: int | None = None


@dataclass(frozen=True)
class PlacementRequest:
    """What the runtime must place while it asks a policy to evict (``Simulator.request``).

    ``blocks`` are the ``(block_id, size)`` pairs of the operator's outputs (in output
    order; a still-resident output is recomputed into a temporary block); ``needed``
    is what they count against the budget (the model's rounded bytes). ``block`` is
    the pair that could not be placed, or the first one while the bytes do not fit
    yet (``bytes_fit`` False).
    """

    tensor: int
    blocks: tuple[tuple[int, int], ...]
    needed: int
    block: tuple[int, int]
    bytes_fit: bool


class Simulator:
    """One replay of a trace under a memory budget.

    Use :func:`dtrlab.runtime.simulate` unless you need the live state (the policy
    API reads it through :class:`dtrlab.policies.CandidateView`).
    """

    def __init__(self, trace: Trace, policy, budget_bytes: float, remat_limit: float = math.inf,
                 intervention: Intervention | None = None, recorder=None, regions: str = "auto",
                 memory_model=None, enforce: str = RESERVED):
        self.trace = trace
        self.policy = policy
        self.budget = budget_bytes
        # None: simrd's byte counter alone. Otherwise the model places blocks too; its
        # capacity is the budget (checked by dtrlab.runtime.simulate).
        self.memory_model = memory_model
        self.request: PlacementRequest | None = None  # set while a policy chooses under a model
        if enforce not in SEMANTICS:
            raise ValueError(f"enforce must be one of {', '.join(SEMANTICS)}, got {enforce!r}")
        if enforce == ALLOCATED and memory_model is None:
            raise ValueError("enforce='allocated' needs a memory model (its allocated bytes are what the budget limits)")
        self.enforce = enforce
        self.remat_limit = remat_limit
        allowance = remat_allowance(remat_limit)
        self._remat_allowance = math.inf if allowance is None else allowance
        self.intervention = intervention or Intervention()
        self.recorder = recorder

        features = frozenset(getattr(policy, "features", ()))
        self.track_eq_class = "eq_class" in features

        n = trace.n_tensors
        ops = trace.operators
        self.ops = ops
        self.tensor_op = trace.tensor_op
        self.tensor_index = trace.tensor_index
        self.parents = trace.tensor_parents
        self.siblings = trace.tensor_siblings
        self.children: list[list[int]] = [[] for _ in range(n)]
        self.defined = [False] * n
        self.storage = [-1] * n

        # Storage state, indexed by root tensor id. ``material`` and the compute arrays
        # are flat buffers so that the compiled region index can share them.
        self.size = [0] * n
        self.compute_cost = array("q", bytes(8 * n))
        self.material = bytearray(n)
        self.tensors: list[list[int]] = [[] for _ in range(n)]
        self.ref_int = [0] * n
        self.ref_ext = [0] * n
        self.pinned = [False] * n
        self.last_access = [-math.inf] * n
        self.pool: dict[int, None] = {}

        self.regions = None  # maintained only for policies that read e*
        if "e_star" in features:
            # e* compute of the forward region (through children) and the reverse one.
            self.region_compute = array("q", bytes(8 * n))
            self.region_rev_compute = array("q", bytes(8 * n))
            self.regions = _region_index(regions)(n, self.material, self.compute_cost,
                                                  self.region_compute, self.region_rev_compute)
        if self.track_eq_class:
            # Union-find over equivalence-class nodes; a storage points at its node
            # while evicted (or before its first computation), -1 otherwise.
            self.eq_node = [-1] * n
            self.eq_parent: list[int] = []
            self.eq_value: list[int] = []

        self.clock = 1
        self.memory = 0
        self.peak_memory = 0
        self.model_compute = 0
        self.remat_compute = 0
        self.remats = 0
        self.evicted: list[int] = []
        self.fragmentation_evictions = 0  # evictions made while the bytes already fit
        if memory_model is not None:
            self.charged = 0  # the model's counted (rounded) bytes of the live blocks
            self.peak_reserved = 0  # reserved bytes at their peak, and the most allocated
            self.allocated_at_peak = 0  # bytes seen while reserved was at that peak
            # Address-aware policies (coop) try to place before evicting even while the
            # bytes do not fit, so that they know which block to make room for.
            self._place_first = bool(getattr(policy, "address_aware", False))
        self.step = -1
        self.failure: Failure | None = None
        self.pending: list[int] = []  # tensors being materialized, outermost first (recorders read it)
        self._actions = self._timed_actions()
        self._replay = None
        policy.start(self)

    # ------------------------------------------------------------------ replay
    def run(self) -> str:
        """Replay the (rest of the) schedule; returns "pass", "oom" or "thrash".

        After some :meth:`steps` were taken, this finishes the same replay.
        """
        if self.failure is not None:
            return self.failure.kind
        try:
            for _ in self.steps():
                pass
            return "pass"
        except OutOfMemory:
            return "oom"
        except Thrash:
            return "thrash"

    def steps(self):
        """The replay as an iterator that yields each schedule step's index after it ran.

        Raises :class:`OutOfMemory` or :class:`Thrash` at a failure; lets analyses
        inspect (or run two simulators in lockstep) between steps. There is one
        replay per simulator: every call returns the same iterator.
        """
        if self._replay is None:
            self._replay = self._replay_steps()
        return self._replay

    def _replay_steps(self):
        # Rematerialization recurses along dependency chains, as in simrd. The limit is raised for each step
        # alone: a replay paused (or abandoned) between steps leaves the caller's limit as it was (Hypothesis
        # warns about a limit changed behind its back).
        depth = 20 * self.trace.n_tensors + 1000
        compute_op, get, release, pin = self.compute_op, self.get, self.release, self.pin
        actions = self._actions
        for self.step, (kind, operand) in enumerate(self.trace.schedule):
            old_limit = sys.getrecursionlimit()
            sys.setrecursionlimit(max(old_limit, depth))
            try:
                if actions and self.step in actions:
                    for action, s in actions[self.step]:
                        self._intervene(action, s)
                if kind == COMPUTE:
                    compute_op(operand)
                elif kind == RELEASE:
                    release(operand)
                elif kind == GET:
                    get(operand)
                else:
                    pin(operand)
            finally:
                sys.setrecursionlimit(old_limit)
            yield self.step

    def _timed_actions(self) -> dict[int, list[tuple[str, int]]]:
        """The intervention's pins and forced evictions, keyed by the step they precede."""
        intervention = self.intervention
        if not intervention.pin and not intervention.force_evict:
            return {}
        created = {}  # storage -> the first step at which it exists
        for step, (kind, operand) in enumerate(self.trace.schedule):
            if kind == COMPUTE:
                op = self.ops[operand]
                for t, alias in zip(op.outputs, op.aliases):
                    if alias == -1:
                        created[t] = step + 1
        actions: dict[int, list[tuple[str, int]]] = {}
        for action, pairs in (("pin", intervention.pin), ("force_evict", intervention.force_evict)):
            for s, step in pairs:
                if s not in created:
                    raise ValueError(f"intervention {action} names {s}, which is not a storage of {self.trace.name}; "
                                     "storages are root tensor ids, e.g. trace.tensor_names.index('x123') for a "
                                     "tensor that is not an alias")
                actions.setdefault(max(step, created[s]) if action == "pin" else step, []).append((action, s))
        return actions

    def _intervene(self, action: str, s: int) -> None:
        applied = False
        if action == "pin":
            if self.ref_ext[s] > 0 and not self.pinned[s]:
                self.pin(s)
                applied = True
        elif self.material[s] and self.ref_int[s] == 0:
            self.evict(s)
            applied = True
        if self.recorder is not None:
            self.recorder.on_intervene(self, action, s, applied)

    def compute_op(self, op_index: int) -> None:
        op = self.ops[op_index]
        storage, tensors, size, compute_cost = self.storage, self.tensors, self.size, self.compute_cost
        new_storages = []
        for index, t in enumerate(op.outputs):
            alias = op.aliases[index]
            if alias == -1:
                s = t
                size[s] = op.sizes[index]
                new_storages.append(s)
            else:
                s = storage[op.args[alias]]
            storage[t] = s
            # A storage's compute counts each operator once (two outputs of one
            # operator can alias the same storage; they are added consecutively).
            if not tensors[s] or self.tensor_op[tensors[s][-1]] != op_index:
                compute_cost[s] += op.cost
            tensors[s].append(t)
            self.ref_ext[s] += 1
        children = self.children
        for p in op.args:
            children[p].extend(op.outputs)
        if self.regions is not None:
            link = self.regions.link
            for t in op.outputs:
                for p in op.args:
                    link(storage[p], storage[t])
        if self.track_eq_class:
            for s in new_storages:
                self.eq_node[s] = self._eq_new(0)
        self.materialize(op.outputs[0], False)
        clock = self.clock
        for t in op.outputs:
            self.last_access[storage[t]] = clock

    def get(self, t: int) -> None:
        s = self.storage[t]
        if self.ref_ext[s] <= 0:
            raise SimulationError(f"get of {self.trace.tensor_names[t]} after its storage lost every reference")
        self.ref_ext[s] += 1

    def release(self, t: int) -> None:
        s = self.storage[t]
        if self.ref_ext[s] <= 0:
            raise SimulationError(f"release of {self.trace.tensor_names[t]} whose storage has no references")
        self.ref_ext[s] -= 1
        if self.ref_ext[s] == 0 and self.material[s] and not self.pinned[s]:
            self.evict(s)
            if self.recorder is not None:
                self.recorder.on_free(self, s)

    def pin(self, t: int) -> None:
        if not self.defined[t]:
            self.materialize(t, True)
        s = self.storage[t]
        if self.pinned[s]:
            return
        self.lock(s)
        self.pinned[s] = True

    # ------------------------------------------------------- materialization
    def materialize(self, t: int, rematerialize: bool) -> None:
        storage, defined, clock, last_access = self.storage, self.defined, self.clock, self.last_access
        parents = self.parents[t]
        for p in parents:
            last_access[storage[p]] = clock
        undefined = [p for p in parents if not defined[p]]
        for p in parents:
            if defined[p]:
                self.lock(storage[p])
        self.pending.append(t)
        for p in undefined:
            if not defined[p]:  # a sibling's rematerialization may have defined it
                self.materialize(p, True)
            self.lock(storage[p])
        op = self.ops[self.tensor_op[t]]
        if self.memory_model is None:
            total_size = op.total_size
            if self.memory + total_size > self.budget:
                self.free(total_size, t)
            self._compute(t, op, rematerialize)
        elif self.enforce == RESERVED:
            self._place(t, op)
            self._compute(t, op, rematerialize)
        else:
            blocks = self._allocate_outputs(t, op)
            self._compute(t, op, rematerialize)
            self._evict_over_budget(t, op, blocks)
        self.pending.pop()
        for p in parents:
            self.unlock(storage[p])
        if self.remat_compute > self._remat_allowance:
            self._fail("thrash", t, 0)
            raise Thrash()

    def _compute(self, t: int, op, rematerialize: bool) -> None:
        storage, defined, material = self.storage, self.defined, self.material
        siblings = self.siblings[t]
        duplicate = [u for u in siblings if defined[u]]
        remat_siblings = [u for u in siblings if not defined[u]]
        remat_storages = [storage[u] for u in siblings if not material[storage[u]]]
        if not material[storage[t]]:
            remat_storages.append(storage[t])

        self.clock += op.cost
        self.memory += op.total_size
        if self.memory > self.peak_memory:
            self.peak_memory = self.memory
        material[storage[t]] = True
        defined[t] = True
        if rematerialize:
            self.remat_compute += op.cost
            self.remats += 1
        else:
            self.model_compute += op.cost
        for u in remat_siblings:
            material[storage[u]] = True
            defined[u] = True
        sizes, tensor_index = op.sizes, self.tensor_index
        for u in duplicate:
            # The operator recomputed an output that was still resident; drop the copy.
            self.memory -= sizes[tensor_index[u]]
        pool = self.pool
        for s in remat_storages:
            pool[s] = None  # a no-op when already present: the position is kept
        if self.recorder is not None:
            if rematerialize:
                self.recorder.on_remat(self, t)
            else:
                self.recorder.on_compute(self, t)

        if self.regions is not None:
            self.regions.materialized(remat_storages)
        if self.track_eq_class:
            eq_node, eq_value = self.eq_node, self.eq_value
            for s in remat_storages:
                root = self._eq_root(eq_node[s])
                eq_value[root] -= self.compute_cost[s]
                eq_node[s] = -1

    # ----------------------------------------------------- locks and the pool
    def lock(self, s: int) -> None:
        if self.ref_int[s] == 0:
            del self.pool[s]
        self.ref_int[s] += 1

    def unlock(self, s: int) -> None:
        self.ref_int[s] -= 1
        if self.ref_int[s] == 0:
            self.pool[s] = None

    def candidates(self):
        """The storages offered to the policy, in simrd's scan order."""
        withhold = self.intervention.withhold
        if withhold:
            return [s for s in self.pool if s not in withhold]
        return self.pool

    def free(self, needed: int, t: int) -> None:
        while self.memory + needed > self.budget:
            candidates = self.candidates()
            if not candidates:
                self._fail("oom", t, needed, "bytes")
                raise OutOfMemory()
            chosen = self.policy.choose(self, candidates)
            if self.recorder is not None:
                self.recorder.on_choose(self, candidates, chosen)
            for s in chosen:
                self.evicted.append(s)
                self.evict(s)

    def evict(self, s: int) -> None:
        if self.memory_model is not None and self.size[s]:
            self.memory_model.free(s)
            self.charged -= self.memory_model.request_bytes(self.size[s])
        self.material[s] = False
        self.memory -= self.size[s]
        self.pool.pop(s, None)
        defined = self.defined
        for t in self.tensors[s]:
            defined[t] = False
        if self.regions is not None:
            self.regions.evicted(s)
        if self.track_eq_class:
            node = self._eq_new(self.compute_cost[s])
            self.eq_node[s] = node
            for n in self.evicted_neighbours(s):
                self._eq_merge(self.eq_node[n], node)

    # ------------------------------------------------- evicted neighbourhoods
    def evicted_neighbours(self, s: int) -> set[int]:
        """Evicted storages adjacent to ``s`` (through any of its tensors' parents or children)."""
        storage, material = self.storage, self.material
        neighbours = set()
        for t in self.tensors[s]:
            for u in self.parents[t]:
                us = storage[u]
                if not material[us] and us != s:
                    neighbours.add(us)
            for u in self.children[t]:
                us = storage[u]
                if not material[us] and us != s:
                    neighbours.add(us)
        return neighbours

    # ------------------------------------------------- equivalence classes
    def _eq_new(self, value: int) -> int:
        self.eq_parent.append(-1)
        self.eq_value.append(value)
        return len(self.eq_parent) - 1

    def _eq_root(self, node: int) -> int:
        parent = self.eq_parent
        root = node
        while parent[root] != -1:
            root = parent[root]
        while parent[node] != -1 and parent[node] != root:  # path compression
            parent[node], node = root, parent[node]
        return root

    def _eq_merge(self, lhs: int, rhs: int) -> None:
        left, right = self._eq_root(lhs), self._eq_root(rhs)
        if left != right:
            self.eq_parent[left] = right
            self.eq_value[right] += self.eq_value[left]

    def eq_class_compute(self, s: int) -> int:
        """Compute of ``s`` plus its evicted neighbours' distinct equivalence classes."""
        roots = {self._eq_root(self.eq_node[n]) for n in self.evicted_neighbours(s)}
        eq_value = self.eq_value
        return self.compute_cost[s] + sum(eq_value[r] for r in roots)

    # ------------------------------------------------------- memory model
    def _place(self, t: int, op) -> None:
        """Make room for ``op``'s outputs under the memory model and place their blocks.

        Evictions follow the policy, as in :meth:`free`, until the rounded bytes fit
        and every block is placed; those made while the bytes already fit are counted
        as fragmentation evictions. A still-resident output (an operator recomputing
        all its outputs) gets a temporary block, freed again once the operator ran,
        as the byte counter adds and drops its bytes.
        """
        model, material, n = self.memory_model, self.material, self.trace.n_tensors
        outputs = [(u, size) for u, size, alias in zip(op.outputs, op.sizes, op.aliases) if size and alias == -1]
        needed = sum(model.request_bytes(size) for _, size in outputs)
        while True:
            # A resident output may be evicted while room is made, so this is redone.
            blocks = [(n + u if material[u] else u, size) for u, size in outputs]  # temporaries above storage ids
            bytes_fit = self.charged + needed <= self.budget
            unplaced = self._try_place(blocks) if bytes_fit or self._place_first else 0
            if unplaced < 0:
                break
            candidates = self.candidates()
            if not candidates:
                self._fail("oom", t, needed, "fragmentation" if bytes_fit else "bytes")
                raise OutOfMemory()
            self.request = PlacementRequest(t, tuple(blocks), needed, blocks[unplaced], bytes_fit)
            try:
                chosen = self.policy.choose(self, candidates)
            finally:
                self.request = None
            if not chosen:
                raise RuntimeError(f"policy {self.policy!r} chose nothing to evict from {len(candidates)} candidates")
            if self.recorder is not None:
                self.recorder.on_choose(self, candidates, chosen)
            for s in chosen:
                self.evicted.append(s)
                self.evict(s)
            if bytes_fit:
                self.fragmentation_evictions += len(chosen)
        self.charged += needed
        self._note_reserved_peak()
        self._free_temporaries(blocks)

    def _note_reserved_peak(self) -> None:
        stats = self.memory_model.stats()
        if stats.reserved_bytes > self.peak_reserved:
            self.peak_reserved, self.allocated_at_peak = stats.reserved_bytes, stats.allocated_bytes
        elif stats.reserved_bytes == self.peak_reserved and stats.allocated_bytes > self.allocated_at_peak:
            self.allocated_at_peak = stats.allocated_bytes

    def _free_temporaries(self, blocks: list[tuple[int, int]]) -> None:
        """Drop the temporary blocks of still-resident outputs (ids above the storage ids)."""
        model, n = self.memory_model, self.trace.n_tensors
        for block_id, size in blocks:
            if block_id >= n:
                model.free(block_id)
                self.charged -= model.request_bytes(size)

    def _output_blocks(self, op) -> list[tuple[int, int]]:
        """``(block_id, size)`` of ``op``'s non-alias outputs in output order; a still-resident output
        (an operator recomputing all its outputs) gets a temporary id above the storage ids."""
        material, n = self.material, self.trace.n_tensors
        return [(n + u if material[u] else u, size)
                for u, size, alias in zip(op.outputs, op.sizes, op.aliases) if size and alias == -1]

    def _allocate_outputs(self, t: int, op) -> list[tuple[int, int]]:
        """``enforce="allocated"``: allocate ``op``'s outputs one at a time, in output order, as the
        operator's kernels ask PyTorch for them; nothing is evicted to make room. The model's
        ``allocate`` already releases the cache and retries (``malloc``), so a failure is a device
        OOM. The outputs placed before the failing one are freed, as unwinding the operator's
        exception frees their tensors (back to the cache, not to the device)."""
        model = self.memory_model
        blocks = self._output_blocks(op)
        for index, (block_id, size) in enumerate(blocks):
            if not model.allocate(block_id, size):
                for placed, _ in blocks[:index]:
                    model.free(placed)
                self._fail("oom", t, model.request_bytes(size), "device")
                raise OutOfMemory()
        self.charged += sum(model.request_bytes(size) for _, size in blocks)
        self._note_reserved_peak()
        return blocks

    def _evict_over_budget(self, t: int, op, blocks: list[tuple[int, int]]) -> None:
        """``enforce="allocated"``: after the operator ran, evict while the allocated bytes (block
        sizes, PyTorch's ``allocated_bytes``) exceed the budget, as the DTR prototype's
        ``CheckpointPool::auto_evict`` does after each operator (``make_raw``,
        ``Rematerializer::remat``). The operator's outputs are not candidates (the prototype adds
        them to its pool only afterwards) and its inputs are still locked. Temporary blocks of
        recomputed resident outputs are still held then, as the operator's result tensors are."""
        model = self.memory_model
        if model.stats().allocated_bytes > self.budget:
            storage = self.storage
            outputs = {storage[u] for u in op.outputs}
            while model.stats().allocated_bytes > self.budget:
                candidates = [s for s in self.candidates() if s not in outputs]
                if not candidates:
                    self._fail("oom", t, model.stats().allocated_bytes - self.budget, "bytes")
                    raise OutOfMemory()
                self.request = PlacementRequest(t, tuple(blocks), model.stats().allocated_bytes - self.budget,
                                                blocks[0] if blocks else (storage[t], 0), False)
                try:
                    chosen = self.policy.choose(self, candidates)
                finally:
                    self.request = None
                if not chosen:
                    raise RuntimeError(f"policy {self.policy!r} chose nothing to evict from {len(candidates)} "
                                       "candidates")
                if self.recorder is not None:
                    self.recorder.on_choose(self, candidates, chosen)
                for s in chosen:
                    self.evicted.append(s)
                    self.evict(s)
        self._free_temporaries(blocks)

    def _try_place(self, blocks: list[tuple[int, int]]) -> int:
        """Place all blocks (-1) or none: the index of the first one that did not fit."""
        model = self.memory_model
        for index, (block_id, size) in enumerate(blocks):
            if not model.allocate(block_id, size):
                for placed, _ in blocks[:index]:
                    model.free(placed)
                return index
        return -1

    # ------------------------------------------------------------ failure
    def _fail(self, kind: str, t: int, needed: int, cause: str | None = None) -> None:
        if self.failure is not None:
            return
        self.failure = Failure(
            kind=kind, step=self.step, operator=self.tensor_op[t], tensor=t, requested_bytes=needed,
            memory_in_use=self.memory, candidates=len(self.candidates()), cause=cause,
            largest_free_block=None if self.memory_model is None else self.memory_model.stats().largest_free_block,
        )
        if self.recorder is not None:
            self.recorder.on_failure(self, self.failure)


def _region_index(kind: str):
    """The region index class for ``regions="auto" | "c" | "python"``."""
    if kind == "python" or (kind == "auto" and CRegionIndex is None):
        return PyRegionIndex
    if kind in ("c", "auto"):
        if CRegionIndex is None:
            raise RuntimeError("the compiled region index is not built; reinstall dtrlab with `pip install -e .` "
                               "or pass regions='python'")
        return CRegionIndex
    raise ValueError(f"regions must be 'auto', 'c' or 'python', got {kind!r}")
