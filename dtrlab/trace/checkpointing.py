"""Activation-checkpointing plans recorded as traces: the step as autograd runs it under each plan.

A plan says which of a model's blocks run under ``torch.utils.checkpoint.checkpoint``
(``use_reentrant=False``) and, for selective plans, which operators inside a block are
saved rather than recomputed. The forms are torchtitan's (pytorch/torchtitan,
``torchtitan/distributed/activation_checkpoint.py``: ``apply_ac`` and the helpers it
calls) and PyTorch's own selective API:

* ``none``: no checkpointing (the plain step);
* ``full``: every block checkpointed (torchtitan ``mode="full"``);
* ``every:N``: torchtitan's layer-selective mode, ``selective_ac_option="N"``: it counts the
  blocks from 1 and checkpoints those whose count is a multiple of N (blocks N, 2N, ...;
  ``every:1`` is ``full``);
* ``op``: torchtitan's operator-selective mode (``selective_ac_option="op"``) with its default
  save list as torchtitan shipped it before the list moved into each model's
  ``parallelize.py`` (``_save_list``): the outputs of ``aten.mm``, the CUDA attention kernels,
  ``aten.max`` and ``reduce_scatter_tensor`` are saved, every second ``aten.mm`` of a block is
  recomputed, everything else is recomputed. On the CPU ``scaled_dot_product_attention``
  runs ``_scaled_dot_product_flash_attention_for_cpu``, the CPU twin of the flash kernel the
  list names, so it is saved too (:data:`OP_SAVE_LIST`). The list names operators, so a
  linear layer with a bias (``aten.addmm``, e.g. GPT-2's Conv1D) is not saved;
* a user's ``policy_fn`` (``Plan.policy(fn)``): every block runs under
  ``create_selective_checkpoint_contexts(fn)``; ``fn(ctx, op, *args, **kwargs)`` returns a
  ``CheckpointPolicy`` (or a bool: True saves).

Blocks are found generically (:func:`find_blocks`): among the children of every
``nn.ModuleList`` / ``nn.Sequential`` of the model, the classes with at least two instances
in one container are candidates; a candidate whose instances lie inside another candidate's
(the two linears of a transformer block's MLP) is dropped; the candidate with the most
instances is the block class (ties: the one met first), and its instances in module order are
the blocks. That gives a decoder's ``layers``, GPT-2's ``h``, a ViT's encoder layers and a
ResNet's residual blocks (across its four stages).

Recording: the plan is applied by replacing each chosen block's ``forward`` with a call of
``torch.utils.checkpoint.checkpoint`` on the original (restored afterwards), and the step is
recorded by :func:`dtrlab.trace.capture.record` as usual. Non-reentrant checkpointing runs
the recomputation inside ``loss.backward()`` through the dispatcher, so the recorder sees
every recomputed operator in the backward pass and the selective modes' cached outputs are
not rerun. ``preserve_rng_state=False``, as torchtitan's wrappers pass by default: the RNG
state copies are no part of the model's memory (recomputed dropout masks then differ from the
forward's; memory and FLOPs do not). Recompute FLOPs (:func:`recompute_flops`): the plan's
total cost minus the plain step's, both in capture's FLOP model.
"""

from __future__ import annotations

import contextlib
import functools
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from .capture import Recording, default_loss, record
from .models import ModelSourceError, build, meta_patches
from .profiled import cpu_peak_bytes
from .zoo import Workload

#: Plan kinds: no checkpointing, every block, every N-th block, torchtitan's operator list, a user's policy.
KINDS = ("none", "full", "every", "op", "policy")

#: torchtitan's default operator save list (see the module docstring), plus the CPU flash attention kernel.
OP_SAVE_LIST = frozenset({
    torch.ops.aten.mm.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    torch.ops.aten.max.default,
})


@dataclass(frozen=True)
class Plan:
    """One checkpointing plan; ``name`` is how tables and the CLI spell it."""

    kind: str
    every: int = 1
    policy_fn: Callable | None = None
    label: str = "policy"

    @property
    def name(self) -> str:
        if self.kind == "every":
            return f"every:{self.every}"
        return self.label if self.kind == "policy" else self.kind

    @staticmethod
    def policy(policy_fn: Callable, label: str = "policy") -> Plan:
        """A user's selective policy, applied inside every block."""
        return Plan("policy", policy_fn=policy_fn, label=label)

    def checkpointed(self, count: int) -> list[int]:
        """Indices of the checkpointed blocks among ``count``."""
        if self.kind == "none":
            return []
        if self.kind == "every":
            return [i for i in range(count) if (i + 1) % self.every == 0]
        return list(range(count))


def parse_plan(text: str) -> Plan:
    """``none``, ``full``, ``every:N`` (N >= 1) or ``op``; a one-line ValueError otherwise."""
    from ..suggest import did_you_mean

    kind, _, value = str(text).partition(":")
    if kind == "every":
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"checkpointing plan {text!r}: every:N needs a whole number N >= 1")
        return Plan("every", every=int(value))
    if kind in ("none", "full", "op") and not value:
        return Plan(kind)
    raise ValueError(f"unknown checkpointing plan {text!r}{did_you_mean(kind, ['none', 'full', 'every:N', 'op'])}; "
                     "plans: none, full, every:N, op")


def standard_plans(block_count: int) -> list[Plan]:
    """The plain step, ``full``, ``every:N`` for N = 2..block_count, and ``op``."""
    return [Plan("none"), Plan("full"), *(Plan("every", every=n) for n in range(2, block_count + 1)), Plan("op")]


def find_blocks(module: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks (see the module docstring); a ValueError when it has none."""
    order = {id(m): i for i, m in enumerate(module.modules())}
    candidates: dict[type, dict[int, nn.Module]] = {}
    for container in module.modules():
        if isinstance(container, (nn.ModuleList, nn.Sequential)):
            children = list(container.children())
            for child in children:
                if sum(type(other) is type(child) for other in children) >= 2:
                    candidates.setdefault(type(child), {})[id(child)] = child
    nested = {id(sub) for blocks in candidates.values() for block in blocks.values()
              for sub in block.modules() if sub is not block}
    top = [blocks for blocks in candidates.values() if not nested.intersection(blocks)]
    if not top:
        raise ValueError(f"{type(module).__name__}: no repeated blocks (no nn.ModuleList or nn.Sequential holds two "
                         "modules of one class)")
    chosen = max(top, key=lambda blocks: (len(blocks), -min(order[key] for key in blocks)))
    return sorted(chosen.values(), key=lambda block: order[id(block)])


def _op_policy() -> Callable:
    """torchtitan's operator policy for one block's checkpoint: save the list, but every second mm."""
    mm_count: dict[bool, int] = defaultdict(int)  # per pass: the forward and the recompute count apart

    def policy(ctx, func, *args, **kwargs):
        if func == torch.ops.aten.mm.default:
            mm_count[ctx.is_recompute] += 1
        save = func in OP_SAVE_LIST and not (func == torch.ops.aten.mm.default and mm_count[ctx.is_recompute] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _context_fn(plan: Plan) -> Callable | None:
    if plan.kind == "op":
        return lambda: create_selective_checkpoint_contexts(_op_policy())
    if plan.kind == "policy":
        return lambda: create_selective_checkpoint_contexts(plan.policy_fn)
    return None


@contextlib.contextmanager
def applied(module: nn.Module, plan: Plan) -> Iterator[list[nn.Module]]:
    """Run ``module``'s chosen blocks under checkpointing for the duration; yields the checkpointed blocks."""
    if plan.kind not in KINDS:
        raise ValueError(f"unknown checkpointing plan kind {plan.kind!r}; kinds: {', '.join(KINDS)}")
    blocks = find_blocks(module) if plan.kind != "none" else []
    chosen = [blocks[i] for i in plan.checkpointed(len(blocks))]
    context_fn = _context_fn(plan)
    options = {"use_reentrant": False, "preserve_rng_state": False}
    if context_fn is not None:
        options["context_fn"] = context_fn
    for block in chosen:
        block.forward = functools.partial(checkpoint, block.forward, **options)
    try:
        yield chosen
    finally:
        for block in chosen:
            del block.forward  # the class's forward again


def record_plan(workload: Workload, plan: Plan, *, device: str = "meta", cost: str = "flops") -> Recording:
    """Record ``workload``'s training step under ``plan`` (tensors on ``device``, as :func:`build` made them)."""
    with torch.device(device), meta_patches(), applied(workload.module, plan) as chosen:
        recording = record(workload.module, workload.inputs, loss_fn=workload.loss_fn, cost=cost)
    recording.meta.update(plan=plan.name, checkpointed_blocks=len(chosen))
    return recording


def capture_plans(source: str, plans: list[Plan] | None = None, *, real: bool = False, cost: str = "flops",
                  **build_options) -> dict[str, Recording]:
    """Build ``source`` once and record its step under each plan (default :func:`standard_plans`); plan name ->
    recording. Errors name the model, the plan and the cause."""
    device = "cpu" if real else "meta"
    workload = build(source, device=device, **build_options)
    if plans is None:
        plans = standard_plans(len(find_blocks(workload.module)))
    recordings = {}
    for plan in plans:
        try:
            recordings[plan.name] = record_plan(workload, plan, device=device, cost=cost)
        except Exception as exc:
            raise ModelSourceError(f"{source}: the step under checkpointing plan {plan.name} raised: "
                                   f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
                                   ) from exc
        recordings[plan.name].meta.update(source=source, batch=workload.batch, input_shape=workload.input_shape,
                                          desc=workload.desc)
    return recordings


def real_peak(workload: Workload, plan: Plan) -> int:
    """The real CPU peak of ``workload``'s step under ``plan`` (real CPU tensors), above the bytes live before the
    step (:func:`dtrlab.trace.profiled.cpu_peak_bytes`): what a recording's peak minus those bytes predicts."""
    module, loss_fn = workload.module, workload.loss_fn or default_loss

    def step():
        loss_fn(module(*workload.inputs)).backward()

    module.zero_grad(set_to_none=True)
    with applied(module, plan):
        peak = cpu_peak_bytes(step)
    module.zero_grad(set_to_none=True)
    return peak


def total_flops(recording: Recording) -> int:
    """The step's compute: the sum of its CALL and MUTATE costs (FLOPs when recorded with ``cost="flops"``)."""
    return sum(int(line["TIME"]) for line in recording.lines if line["INSTRUCTION"] in ("CALL", "MUTATE"))


def recompute_flops(recording: Recording, plain: Recording) -> int:
    """FLOPs a plan adds to the plain step: what checkpointing recomputes."""
    return total_flops(recording) - total_flops(plain)
