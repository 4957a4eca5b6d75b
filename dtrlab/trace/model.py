"""The trace data model: operators, tensors and the replay schedule.

A :class:`Trace` is what the simulator replays. It is deliberately flat (tuples of
ints) so that the runtime can index it without attribute chains:

* every tensor has an integer id, assigned in the order the operators that create
  it are computed (this is also the order simrd assigns runtime tensor ids);
* every operator has an integer cost, one output size in bytes per output, and for
  each output either -1 or the index of the input argument that it aliases (an
  alias output has size 0 and shares the argument's storage);
* the schedule is a list of ``(kind, operand)`` steps where ``kind`` is one of
  :data:`COMPUTE` (operand: operator index), :data:`GET`, :data:`PIN` or
  :data:`RELEASE` (operand: tensor id).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cached_property

COMPUTE = 0
GET = 1
PIN = 2
RELEASE = 3
STEP_NAMES = ("compute", "get", "pin", "release")

#: Operator name that marks constants (parameters, inputs, buffers). The runtime
#: never evicts a storage created by a constant operator.
CONSTANT_OP = "constant"


@dataclass(frozen=True)
class Operator:
    """One operator call: ``outputs = name(*args)``."""

    name: str
    cost: int
    args: tuple[int, ...]
    outputs: tuple[int, ...]
    sizes: tuple[int, ...]
    aliases: tuple[int, ...]
    backward: bool = False

    @property
    def is_constant(self) -> bool:
        return self.name == CONSTANT_OP

    @property
    def total_size(self) -> int:
        return sum(self.sizes)


@dataclass(frozen=True)
class Trace:
    """A replayable operator trace.

    ``tensor_names[i]`` is the log name of tensor ``i``; ``tensor_op[i]`` and
    ``tensor_index[i]`` say which operator output it is.
    """

    name: str
    operators: tuple[Operator, ...]
    tensor_names: tuple[str, ...]
    tensor_op: tuple[int, ...]
    tensor_index: tuple[int, ...]
    schedule: tuple[tuple[int, int], ...]
    source: str = ""
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def n_tensors(self) -> int:
        return len(self.tensor_names)

    @cached_property
    def content_hash(self) -> str:
        """sha256 over everything that influences a simulation (not the name)."""
        digest = hashlib.sha256()
        for op in self.operators:
            digest.update(repr((op.name, op.cost, op.args, op.outputs, op.sizes, op.aliases)).encode())
        digest.update(repr(self.tensor_names).encode())
        digest.update(repr(self.schedule).encode())
        return digest.hexdigest()

    @cached_property
    def tensor_parents(self) -> tuple[tuple[int, ...], ...]:
        """The arguments of the operator that computes each tensor (computed once per trace)."""
        return tuple(self.operators[op].args for op in self.tensor_op)

    @cached_property
    def tensor_siblings(self) -> tuple[tuple[int, ...], ...]:
        """The other outputs of the operator that computes each tensor."""
        return tuple(tuple(u for u in self.operators[op].outputs if u != t) for t, op in enumerate(self.tensor_op))

    @cached_property
    def model_compute(self) -> int:
        """Sum of the costs of all operators: the compute of one unbounded replay."""
        return sum(op.cost for op in self.operators)

    def summary(self) -> dict:
        """Counts that describe the trace (for ``dtrlab info``)."""
        steps = [0, 0, 0, 0]
        for kind, _ in self.schedule:
            steps[kind] += 1
        return {
            "name": self.name,
            "operators": len(self.operators),
            "constants": sum(op.is_constant for op in self.operators),
            "tensors": self.n_tensors,
            "schedule_steps": len(self.schedule),
            **{f"{STEP_NAMES[k]}_steps": steps[k] for k in range(4)},
            "model_compute": self.model_compute,
        }
