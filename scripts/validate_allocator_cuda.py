#!/usr/bin/env python
"""Check the memory models and the runtime semantics against PyTorch's real CUDA caching allocator.

Usage (on a machine with a CUDA GPU and torch; nothing else may use the GPU's allocator)::

    python scripts/validate_allocator_cuda.py                       # every section, traces/resnet32-b8
    python scripts/validate_allocator_cuda.py TRACE --sections layout --expandable-segments --checkpoints 50
    python scripts/validate_allocator_cuda.py TRACE --sections layout --fraction 0.05   # release-and-retry / OOM
    python scripts/validate_allocator_cuda.py --out results.json

Sections (``--sections``, comma-separated; each runs in a fresh Python process, since
PYTORCH_CUDA_ALLOC_CONF is read once, when torch's allocator starts):

* ``layout``: the trace's unbounded allocation/free sequence
  (:func:`dtrlab.memory.replay.unbounded_events`: outputs allocated when computed, storages
  freed when their last external reference goes) with real tensors
  (``torch.empty(size, dtype=torch.uint8, device="cuda")``) and with the ``caching`` model.
  At each checkpoint ``torch.cuda.memory_snapshot()`` is compared with the model's
  ``layout()``. Real addresses differ from the model's, so segments are matched through the
  live blocks they hold: for every live block its segment's pool and size, its offset and
  size, and the segment's full block list (sizes, allocated or free); segments without a
  live block as a multiset of (pool, size); allocated/reserved bytes; whether both sides
  OOM at the same event. Without layout options it runs twice: plain and with expandable
  segments. ``--fraction`` caps the allocator with ``set_per_process_memory_fraction`` (the
  model's capacity is the same number of bytes, else the device's total memory).
* ``expandable-limit``: the two hand-derived cases of tests/test_memory_semantics.py for
  expandable segments under a per-process limit: PyTorch's ``alloc_block`` checks
  reserved + ``get_allocation_size`` before mapping. For each case: the real outcome and
  reserved bytes, and which model limit check (``allocation_size``, ``mapped``) predicted it.
* ``semantics``: runs of the trace under both runtime semantics (``reserved`` at the budget;
  ``allocated`` with a device of ``--device-capacity``, default 1.25x the budget, with and
  without expandable segments) at ``--ratios``. The sequence of allocate/free calls the
  simulator made on its model is replayed with real tensors under
  ``set_per_process_memory_fraction`` = the model's capacity; every call must succeed or
  fail as in the model, with the same allocated and reserved bytes after it.
  (``reserved`` with expandable segments is left out: its model caps mapped pages, which a
  per-process fraction does not; see docs/memory.md.)

* ``execute`` (only when named: ``--sections execute``): real execution (dtrlab.execute,
  docs/execute.md): ``--execute-model``'s training step (a model source of ``dtrlab capture``,
  default ``resnet32``) run on the GPU at each of ``--execute-ratios`` with the allocator capped
  at the budget and the simulator deciding; each run's record must equal ``dtrlab.simulate`` on
  the step's GPU trace and a passing run's loss and gradients must match an unbudgeted eager step
  within 1e-4; the real allocator's peaks are reported beside the ``caching`` model's prediction
  for the budget (:func:`dtrlab.execute.gpu_check.check_execution`).

* ``knob`` (only when named: ``--sections knob``): torch.compile's ``activation_memory_budget``
  (dtrlab.trace.torch_compile.partition, dtrlab.memory.partitioned): ``--knob-model``'s training step
  (default ``transformer``) compiled with each of ``--knob-backends`` (default ``inductor`` then
  ``aot_eager``: torch's min-cut partitioner, then Inductor's kernels or eager ones) at each of
  ``--knob-values`` after ``torch._dynamo.reset()``, run once on the GPU; ``torch.cuda.max_memory_allocated`` and ``max_memory_reserved`` above the bytes allocated
  before the step, against the prediction from the step traced on fake CUDA tensors and
  partitioned by torch at the same knob, for ``inductor`` lowered by Inductor for CUDA
  (dtrlab.trace.torch_compile.inductor; on the GPU machine, where Inductor can target the device) (the
  ``caching`` model's allocated peak less the
  constants the real step allocated beforehand). A run whose allocated peak differs from the
  prediction by more than the step's largest tensor is a mismatch; reserved bytes and the
  saved-tensor counts (real: autograd's saved-tensor hooks) are reported beside.

* ``compile`` (only when named: ``--sections compile``): ``dtrlab.compile`` (docs/compile.md, "Budget in
  bytes") on the GPU: for each of ``--compile-models`` (a JSON object, source -> build options; default the
  zoo ``transformer`` and a two-layer ``hf:llama``), a probe pick at a budget every knob fits, then three
  budgets spread between the smallest and the largest predicted peak
  (:func:`dtrlab.analysis.fit_knob.spread_budgets`); at each, the step (the model and its loss,
  ``LossStep``) compiled by ``dtrlab.compile(..., backend=--compile-backend, accounting="allocated")``
  on the GPU's own tensors, run once to compile and once measured: the bytes the allocator held for the
  parameters and inputs plus ``torch.cuda.max_memory_allocated`` above the bytes allocated when the step
  starts, against the budget. Recorded per budget: the pick, its predicted peak, the measured peak,
  whether it is within the budget (a run over it is a mismatch), ``max_memory_reserved``, and the grid
  knob above the pick with its predicted peak (over the budget: the pick is the largest at the grid's
  resolution).

* ``cuda-lowering`` (only when named: ``--sections cuda-lowering``): CUDA Inductor's lowering on fake tensors without
  a GPU (dtrlab.trace.torch_compile.cuda_joint, dtrlab.trace.torch_compile.gpu_target) against the real thing. For
  each of ``--lowering-models`` (a JSON object, source -> build options; default four families:
  :data:`LOWERING_MODELS`) at each of ``--knob-values``: the step traced on fake CUDA tensors on this GPU and lowered
  by Inductor (``trace_joint(device="cuda")``, the real route), and traced through the fake target named after this
  GPU (``trace_joint(gpu=...)``, :func:`dtrlab.trace.torch_compile.gpu_target.matching_target`; a GPU no target
  matches is refused in one line). Each distinct lowered wrapper of one route is compared line by line with the
  other's (``difflib``; allowed: nothing; each differing line is reported, the first 20 kept); the fake route's
  predicted allocated and reserved peaks are set against the step compiled at the knob and run once:
  ``torch.cuda.max_memory_allocated`` above the bytes allocated before it (within the step's largest tensor: else a
  mismatch) and ``max_memory_reserved`` (reported beside).
* ``op-temporaries`` (only when named: ``--sections op-temporaries``): what convolutions allocate inside on the GPU
  (cuDNN's workspaces; dtrlab.trace.op_temporaries). For each of ``--temporaries-models`` (default three CNN
  families, two with depthwise convolutions: :data:`TEMPORARIES_MODELS`) under ``--compile-backend`` at each of
  ``--knob-values``: the step traced on this GPU (``trace_joint(device="cuda")``) and partitioned twice, without
  and with each distinct call's temporaries measured on this GPU (``temporaries=True``: run once on real tensors,
  the caching allocator's peak above its inputs and outputs). Both predictions are set against the step compiled at
  the knob and run once (``max_memory_allocated`` above the bytes before it); the one with the temporaries must be
  within the step's largest tensor (else a mismatch); the one without is reported beside, with the temporaries
  the step's trace carries per operator (count, largest, held).

Results are printed and written as JSON to ``--out``, else to ``$OUT/validate_allocator_cuda.json``
when ``$OUT`` is set.

Exit status: 0 when everything matches, 1 on a mismatch, 2 on bad input, 3 when torch or a
CUDA device is missing (one line says which; the JSON file says so too).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from dtrlab.runtime.semantics import Semantics

from dtrlab.memory import get_memory_model
from dtrlab.memory.replay import unbounded_events
from dtrlab.trace import load

MiB = 1 << 20
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = ROOT / "traces" / "resnet32-b8.jsonl.gz"
SECTIONS = ("layout", "expandable-limit", "semantics", "execute", "knob", "compile", "cuda-lowering", "op-temporaries")
DEFAULT_SECTIONS = SECTIONS[:3]  # the others run a model's step on the GPU: asked for by name
#: The compile section's default models: source -> build options (dtrlab.trace.models.build).
COMPILE_MODELS = {"transformer": {}, "hf:llama": {"layers": 2, "hidden": 256, "heads": 4, "kv_heads": 2,
                                                   "intermediate": 512, "vocab": 1024, "batch": 8, "seq": 256}}
#: The cuda-lowering section's default models, one per family: an encoder (attention, dropout), a GPT-2 and a
#: Llama decoder (CUDA's fused attention, the Philox RNG), a CNN (convolutions).
LOWERING_MODELS = {"transformer": {}, "hf:gpt2": {"layers": 2, "batch": 4, "seq": 256},
                   "hf:llama": COMPILE_MODELS["hf:llama"], "torchvision:resnet18": {"batch": 8, "image": 64}}
#: The op-temporaries section's default models: CNN families, a ResNet and two with depthwise convolutions.
TEMPORARIES_MODELS = {"torchvision:resnet18": {"batch": 8, "image": 64},
                      "torchvision:shufflenet_v2_x0_5": {"batch": 8, "image": 64},
                      "torchvision:mobilenet_v3_small": {"batch": 8, "image": 64}}
NO_CUDA = 3  # exit status without torch or a CUDA device


class OneLineParser(argparse.ArgumentParser):
    """Bad input: one line naming the problem, exit status 2 (no usage block)."""

    def error(self, message):
        self.exit(2, f"validate_allocator_cuda: error: {message}\n")


def compile_models(text: str) -> dict:
    """``--compile-models``, ``--lowering-models``: a JSON object, each model source to a dict of its build options."""
    try:
        models = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc.msg} at character {exc.pos}): {text!r}") from None
    if not isinstance(models, dict) or not models or not all(isinstance(o, dict) for o in models.values()):
        raise argparse.ArgumentTypeError(f'a JSON object of sources and their build options, such as '
                                         f'{{"transformer": {{}}}}, got {text!r}')
    return models


def parse_args(argv=None):
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path, nargs="?", default=DEFAULT_TRACE,
                        help="a dtrlab trace or simrd log (default traces/resnet32-b8.jsonl.gz)")
    parser.add_argument("--sections", default=",".join(DEFAULT_SECTIONS),
                        help=f"comma-separated sections (default {', '.join(DEFAULT_SECTIONS)}; also execute, knob, "
                             "compile, cuda-lowering, op-temporaries)")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON results file (default $OUT/validate_allocator_cuda.json when $OUT is set)")
    parser.add_argument("--checkpoints", type=int, default=20, help="layout: snapshots evenly spaced over the events")
    parser.add_argument("--fraction", type=float, default=None,
                        help="layout: cap the allocator at this fraction of device memory (and the model's capacity)")
    parser.add_argument("--expandable-segments", action="store_true")
    parser.add_argument("--max-split-size-mb", type=int, default=None)
    parser.add_argument("--roundup-power2-divisions", type=int, default=None)
    parser.add_argument("--max-mismatches", type=int, default=200, help="stop printing after this many")
    parser.add_argument("--ratios", default="0.3,0.5,0.7", help="semantics: budget ratios (comma-separated)")
    parser.add_argument("--device-capacity", default="1.25x", help="semantics: the device under enforce='allocated'")
    parser.add_argument("--execute-model", default="resnet32", help="execute: the model source (default resnet32)")
    parser.add_argument("--execute-ratios", default="0.5,0.8,1.0", help="execute: budget ratios (comma-separated)")
    parser.add_argument("--knob-model", default="transformer", help="knob: the model source (default transformer)")
    parser.add_argument("--knob-values", default="1.0,0.5,0.2,0.1,0.05,0.0",
                        help="knob: activation_memory_budget values (comma-separated)")
    parser.add_argument("--knob-backends", default="inductor,aot_eager",
                        help="knob: the torch.compile backends compared, each with its accounting "
                             "(comma-separated; default inductor,aot_eager)")
    parser.add_argument("--compile-models", type=compile_models, default=COMPILE_MODELS,
                        help="compile: a JSON object of model sources and their build options (default "
                             + json.dumps(COMPILE_MODELS) + ")")
    parser.add_argument("--lowering-models", type=compile_models, default=LOWERING_MODELS,
                        help="cuda-lowering: a JSON object of model sources and their build options (default "
                             + json.dumps(LOWERING_MODELS) + ")")
    parser.add_argument("--temporaries-models", type=compile_models, default=TEMPORARIES_MODELS,
                        help="op-temporaries: a JSON object of model sources and their build options (default "
                             + json.dumps(TEMPORARIES_MODELS) + ")")
    parser.add_argument("--compile-backend", choices=("inductor", "aot_eager"), default="inductor",
                        help="compile, op-temporaries: the torch.compile backend, and the accounting of the pick "
                             "(default inductor)")
    parser.add_argument("--worker", choices=SECTIONS, help=argparse.SUPPRESS)  # a section in its own process
    parser.add_argument("--worker-spec", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.sections = [name.strip() for name in args.sections.split(",") if name.strip()]
    unknown = [name for name in args.sections if name not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; valid: {', '.join(SECTIONS)}")
    if args.fraction is not None and args.expandable_segments:
        # With a fraction set, PyTorch checks the per-process limit against get_allocation_size
        # before mapping pages, not against the pages it maps; the layout section's model caps the
        # mapped pages (the expandable-limit section checks the pre-mapping rule).
        parser.error("--fraction with --expandable-segments is not comparable in the layout section "
                     "(see docs/memory.md); drop one of them")
    if not args.trace.exists():
        parser.error(f"{args.trace}: no such trace")
    return args


def allocator_conf(args) -> tuple[str, dict]:
    """The PYTORCH_CUDA_ALLOC_CONF string and the model options for the same settings."""
    conf, options = [], {}
    if args.expandable_segments:
        conf.append("expandable_segments:True")
        options["expandable_segments"] = True
    if args.max_split_size_mb is not None:
        conf.append(f"max_split_size_mb:{args.max_split_size_mb}")
        options["max_split_size"] = args.max_split_size_mb * MiB
    if args.roundup_power2_divisions is not None:
        conf.append(f"roundup_power2_divisions:{args.roundup_power2_divisions}")
        options["roundup_power2_divisions"] = args.roundup_power2_divisions
    return ",".join(conf), options


def cuda_problem() -> str | None:
    """Why this machine cannot run the checks (no torch, no CUDA device), or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed; install it with CUDA support on a GPU machine (pip install torch)"
    if not torch.cuda.is_available():
        return (f"no CUDA device available (torch {torch.__version__}, built with CUDA {torch.version.cuda}); "
                "run this on a GPU machine")
    return None


def require_cuda():
    """torch with a usable CUDA device, or exit 3 with the reason."""
    problem = cuda_problem()
    if problem:
        print(f"validate_allocator_cuda: {problem}", file=sys.stderr)
        sys.exit(NO_CUDA)
    import torch
    return torch


def real_layout(torch, tensors: dict) -> tuple[list[dict], dict[int, tuple[int, int]]]:
    """The snapshot's segments (address order) as dicts with offset-annotated blocks, and for
    every live block id: (segment index, offset of its block)."""
    segments = []
    for seg in sorted(torch.cuda.memory_snapshot(), key=lambda s: s["address"]):
        offset, blocks = 0, []
        for block in seg["blocks"]:
            blocks.append((offset, block["size"], block["state"] == "active_allocated"))
            offset += block["size"]
        segments.append({"address": seg["address"], "size": seg["total_size"], "pool": seg["segment_type"],
                         "blocks": blocks})
    where = {}
    for block_id, tensor in tensors.items():
        if tensor is None:
            continue
        ptr = tensor.data_ptr()
        for index, seg in enumerate(segments):
            if seg["address"] <= ptr < seg["address"] + seg["size"]:
                where[block_id] = (index, ptr - seg["address"])
                break
    return segments, where


def model_layout(model) -> tuple[list[dict], dict[int, tuple[int, int]]]:
    segments, where = [], {}
    for index, seg in enumerate(model.layout()):
        blocks = []
        for block in seg.blocks:
            blocks.append((block.address - seg.address, block.size, block.block_id is not None))
            if block.block_id is not None:
                where[block.block_id] = (index, block.address - seg.address)
        segments.append({"address": seg.address, "size": seg.size, "pool": seg.pool, "blocks": blocks})
    return segments, where


def compare(step: int, torch, tensors: dict, model, report) -> None:
    real, real_where = real_layout(torch, tensors)
    mine, mine_where = model_layout(model)
    stats = model.stats()
    real_allocated = torch.cuda.memory_allocated()
    real_reserved = torch.cuda.memory_reserved()
    if real_allocated != stats.allocated_bytes:
        report(step, f"allocated bytes: cuda {real_allocated}, model {stats.allocated_bytes}")
    if real_reserved != stats.reserved_bytes:
        report(step, f"reserved bytes: cuda {real_reserved}, model {stats.reserved_bytes}")
    if len(real) != len(mine):
        report(step, f"segment count: cuda {len(real)}, model {len(mine)}")
    seen_pairs = set()
    for block_id in sorted(mine_where.keys() | real_where.keys()):
        if block_id not in real_where or block_id not in mine_where:
            report(step, f"block {block_id}: live in {'model' if block_id in mine_where else 'cuda'} only")
            continue
        (ri, roff), (mi, moff) = real_where[block_id], mine_where[block_id]
        rseg, mseg = real[ri], mine[mi]
        if roff != moff:
            report(step, f"block {block_id}: offset in its segment cuda {roff}, model {moff}")
        if (ri, mi) in seen_pairs:
            continue
        seen_pairs.add((ri, mi))
        if (rseg["pool"], rseg["size"]) != (mseg["pool"], mseg["size"]):
            report(step, f"segment of block {block_id}: cuda {rseg['pool']} {rseg['size']} B, "
                         f"model {mseg['pool']} {mseg['size']} B")
        if rseg["blocks"] != mseg["blocks"]:
            first = next(i for i, pair in enumerate(zip(rseg["blocks"] + [None], mseg["blocks"] + [None]))
                         if pair[0] != pair[1])
            at = lambda blocks: blocks[first] if first < len(blocks) else "none"  # noqa: E731
            report(step, f"blocks of the segment of block {block_id} ({len(rseg['blocks'])} in cuda, "
                         f"{len(mseg['blocks'])} in the model) first differ at block {first} "
                         f"(offset, size, allocated): cuda {at(rseg['blocks'])}, model {at(mseg['blocks'])}")
    live_real = {i for i, _ in real_where.values()}
    live_mine = {i for i, _ in mine_where.values()}
    cached_real = Counter((s["pool"], s["size"]) for i, s in enumerate(real) if i not in live_real)
    cached_mine = Counter((s["pool"], s["size"]) for i, s in enumerate(mine) if i not in live_mine)
    if cached_real != cached_mine:
        report(step, f"wholly free segments (pool, size): cuda {sorted(cached_real.elements())}, "
                     f"model {sorted(cached_mine.elements())}")


# ---------------------------------------------------------------- section: layout

def layout_section(args, torch) -> dict:
    """The unbounded replay with real tensors and the model, compared at checkpoints (see the module doc)."""
    conf, options = allocator_conf(args)
    trace = load(args.trace)
    events = unbounded_events(trace)
    total = torch.cuda.get_device_properties(0).total_memory
    if args.fraction is not None:
        torch.cuda.set_per_process_memory_fraction(args.fraction, 0)
        # The allocator caps at fraction * the total cudaMemGetInfo reports.
        capacity = int(args.fraction * torch.cuda.mem_get_info(0)[1])
    else:
        capacity = total
    model = get_memory_model("caching", capacity, **options)
    n = len(events)
    checkpoints = {min(n - 1, round(i * (n - 1) / max(args.checkpoints - 1, 1))) for i in range(args.checkpoints)}
    mismatches = []

    def report(step, message):
        mismatches.append((step, message))
        if len(mismatches) <= args.max_mismatches:
            print(f"[layout, event {step}] {message}")

    tensors: dict[int, object] = {}
    compared = 0
    print(f"layout: {trace.name}: {n} events, capacity {capacity} B, PYTORCH_CUDA_ALLOC_CONF={conf!r}, "
          f"torch {torch.__version__}")
    for step, event in enumerate(events):
        if event.kind == "alloc":
            try:
                tensor = torch.empty(event.size, dtype=torch.uint8, device="cuda") if event.size else None
                real_ok = True
            except torch.cuda.OutOfMemoryError:
                tensor, real_ok = None, False
            model_ok = model.allocate(event.block_id, event.size)
            if real_ok != model_ok:
                report(step, f"alloc of {event.size} B for block {event.block_id}: "
                             f"cuda {'ok' if real_ok else 'OOM'}, model {'ok' if model_ok else 'OOM'}")
            if not (real_ok and model_ok):
                print(f"[layout, event {step}] stopping at the first OOM (cuda {real_ok}, model {model_ok})")
                compare(step, torch, tensors, model, report)
                compared += 1
                break
            tensors[event.block_id] = tensor
            tensor = None  # the dict holds the only reference: a free must release the block
        else:
            del tensors[event.block_id]
            model.free(event.block_id)
        if step in checkpoints:
            compare(step, torch, tensors, model, report)
            compared += 1
    stats = model.stats()
    if stats.peak_allocated_bytes != torch.cuda.max_memory_allocated():
        report(n, f"peak allocated bytes: cuda {torch.cuda.max_memory_allocated()}, model {stats.peak_allocated_bytes}")
    if stats.peak_reserved_bytes != torch.cuda.max_memory_reserved():
        report(n, f"peak reserved bytes: cuda {torch.cuda.max_memory_reserved()}, model {stats.peak_reserved_bytes}")
    return {"trace": trace.name, "conf": conf, "capacity": capacity, "events": n, "checkpoints": compared,
            "mismatches": len(mismatches), "first_mismatches": [f"event {s}: {m}" for s, m in mismatches[:20]]}


# ---------------------------------------------------------------- section: expandable-limit

#: (limit in MiB, allocations in MiB): tests/test_memory_semantics.py's expandable cases. The
#: limits carry half a MiB of margin so that the fraction's float rounding cannot decide.
EXPANDABLE_CASES = (
    ("pre-mapping check fails where the pages would fit", 42.5, (1.5, 25)),
    ("pre-mapping check lets the pages pass the limit", 35.5, (30,)),
)


def set_limit(torch, capacity: int) -> int:
    """``set_per_process_memory_fraction`` so that the allocator's limit, ``(size_t)(fraction *
    total)``, is ``capacity`` bytes (or the nearest below it the double arithmetic allows)."""
    total = torch.cuda.mem_get_info(0)[1]
    if capacity >= total:
        raise ValueError(f"a limit of {capacity} B needs a device with more than its {total} B")
    fraction = capacity / total  # within a few units in the last place of the exact fraction
    for _ in range(1000):
        limit = int(fraction * total)
        if limit == capacity:
            break
        fraction = math.nextafter(fraction, 1.0 if limit < capacity else 0.0)
    torch.cuda.set_per_process_memory_fraction(fraction, 0)
    return int(fraction * total)


def expandable_limit_section(spec: dict, torch) -> dict:
    """One case (``spec["case"]`` indexes :data:`EXPANDABLE_CASES`) with expandable segments on."""
    name, limit_mib, sizes_mib = EXPANDABLE_CASES[spec["case"]]
    limit = set_limit(torch, int(limit_mib * MiB))
    models = {check: get_memory_model("caching", limit, expandable_segments=True, limit_check=check)
              for check in ("allocation_size", "mapped")}
    tensors, steps = [], []
    for size in (int(s * MiB) for s in sizes_mib):
        try:
            tensors.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
            real_ok = True
        except torch.cuda.OutOfMemoryError:
            real_ok = False
        step = {"size": size, "cuda_ok": real_ok, "cuda_reserved": torch.cuda.memory_reserved()}
        for check, model in models.items():
            step[f"{check}_ok"] = model.allocate(len(steps), size)
            step[f"{check}_reserved"] = model.stats().reserved_bytes
        steps.append(step)
    predicted = {check: all(s["cuda_ok"] == s[f"{check}_ok"] and s["cuda_reserved"] == s[f"{check}_reserved"]
                            for s in steps) for check in models}
    print(f"expandable-limit: {name} (limit {limit} B): " + "; ".join(
        f"{s['size']} B cuda {'ok' if s['cuda_ok'] else 'OOM'} reserved {s['cuda_reserved']}" for s in steps)
        + f"; predicted by allocation_size: {predicted['allocation_size']}, mapped: {predicted['mapped']}")
    return {"case": name, "limit": limit, "steps": steps, "predicted_by": predicted,
            "mismatches": 0 if predicted["allocation_size"] else 1}


# ---------------------------------------------------------------- section: semantics

def semantics_runs(args) -> list[dict]:
    """The runs of the semantics section, each with the allocate/free calls its model received."""
    from dtrlab import simulate
    from dtrlab.memory import CachingModel
    from dtrlab.memory.device import device_capacity
    from dtrlab.runtime import budget_for

    class Recording(CachingModel):
        """The caching model, keeping every allocate and free call (block id, size, placed)."""

        def __init__(self, capacity_bytes, **options):
            super().__init__(capacity_bytes, **options)
            self.calls = []

        def allocate(self, block_id, size):
            placed = super().allocate(block_id, size)
            self.calls.append(("alloc", block_id, size, placed))
            return placed

        def free(self, block_id):
            super().free(block_id)
            self.calls.append(("free", block_id, 0, True))

    trace = load(args.trace)
    runs = []
    for ratio in (float(r) for r in args.ratios.split(",")):
        budget = budget_for(trace, ratio)
        device = device_capacity(args.device_capacity)
        configs = [("reserved", {}, budget, {}),
                   ("allocated", {"limit_check": "allocation_size"}, device.bytes_for(budget),
                    {"device_capacity": args.device_capacity}),
                   ("allocated", {"limit_check": "allocation_size", "expandable_segments": True},
                    device.bytes_for(budget), {"device_capacity": args.device_capacity})]
        for enforce, options, capacity, extra in configs:
            model = Recording(capacity, **options)
            result = simulate(trace, "dtr", budget_bytes=budget,
                              semantics=Semantics(memory=model, enforce=enforce, **extra))
            runs.append({"trace": trace.name, "ratio": ratio, "enforce": enforce, "options": options,
                         "capacity": capacity, "status": result.status, "calls": model.calls,
                         "conf": "expandable_segments:True" if options.get("expandable_segments") else ""})
    return runs


def semantics_replay(spec: dict, torch) -> dict:
    """Replay one run's model calls with real tensors under a per-process limit of the model's
    capacity; every call must succeed or fail as in the model, with the same allocated and
    reserved bytes after it (the model is replayed alongside to read its bytes)."""
    from dtrlab.memory import CachingModel

    limit = set_limit(torch, spec["capacity"])
    model = CachingModel(spec["capacity"], **spec["options"])
    tensors, mismatches = {}, []
    for index, (kind, block_id, size, placed) in enumerate(spec["calls"]):
        if kind == "alloc":
            try:
                tensor = torch.empty(size, dtype=torch.uint8, device="cuda") if size else None
                real_ok = True
            except torch.cuda.OutOfMemoryError:
                real_ok = False
            assert model.allocate(block_id, size) == placed, "the model replays differently"
            if real_ok:
                tensors[block_id] = tensor
            tensor = None  # the dict holds the only reference: a free must release the block
            if real_ok != placed:
                mismatches.append(f"call {index}: alloc {size} B: cuda {'ok' if real_ok else 'OOM'}, "
                                  f"model {'ok' if placed else 'OOM'}")
                break  # the two allocators hold different blocks from here on
        else:
            tensors.pop(block_id, None)
            model.free(block_id)
        stats = model.stats()
        real = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
        if real != (stats.allocated_bytes, stats.reserved_bytes):
            mismatches.append(f"call {index} ({kind} {block_id}): allocated/reserved cuda {real}, "
                              f"model {(stats.allocated_bytes, stats.reserved_bytes)}")
            if len(mismatches) >= 20:
                break
    label = f"{spec['trace']} at {spec['ratio']} under {spec['enforce']} {spec['options']}"
    print(f"semantics: {label}: {len(spec['calls'])} calls, limit {limit} B, {len(mismatches)} mismatches"
          + (f"; first: {mismatches[0]}" if mismatches else ""))
    return {"run": label, "status": spec["status"], "limit": limit, "calls": len(spec["calls"]),
            "mismatches": len(mismatches), "first_mismatches": mismatches}


# ---------------------------------------------------------------- driver

def worker(args) -> int:
    """Run one section in this (fresh) process; print its result as the last line of JSON."""
    torch = require_cuda()
    torch.cuda.empty_cache()
    if torch.cuda.memory_reserved() or torch.cuda.memory_allocated():
        print("validate_allocator_cuda: the caching allocator is already in use; run in a fresh process",
              file=sys.stderr)
        return 2
    spec = json.loads(args.worker_spec)
    if args.worker == "layout":
        result = layout_section(args, torch)
    elif args.worker == "expandable-limit":
        result = expandable_limit_section(spec, torch)
    elif args.worker == "execute":
        result = execute_section(spec)
    elif args.worker == "knob":
        result = knob_section(spec, torch)
    elif args.worker == "compile":
        result = compile_section(spec, torch)
    elif args.worker == "cuda-lowering":
        result = cuda_lowering_section(spec, torch)
    elif args.worker == "op-temporaries":
        result = op_temporaries_section(spec, torch)
    else:
        result = semantics_replay(spec, torch)
    print(json.dumps(result))
    return 0


def execute_section(spec: dict) -> dict:
    """Real execution on the GPU: each run's record against the simulator's (see the module docstring)."""
    from dtrlab.execute.gpu_check import check_execution, device_description

    runs = check_execution(spec["model"], spec["ratios"])
    for run in runs:
        print(f"  {spec['model']} at {run['ratio']}: {run['status']}, identical {run['identical']}, peak reserved "
              f"{run.get('peak_reserved_bytes')} B (caching model {run['caching_model_peak_reserved']} B)")
    mismatches = sum(run["identical"] is False or run.get("within_tolerance") is False for run in runs)
    return {"device": device_description(), "runs": runs, "mismatches": mismatches}


def knob_section(spec: dict, torch) -> dict:
    """torch.compile's activation_memory_budget on the GPU against dtrlab's prediction (see the module docstring)."""
    from dtrlab.memory.partitioned import step_peaks
    from dtrlab.trace.torch_compile.inductor import partition_lowered
    from dtrlab.trace.torch_compile.partition import partition
    from dtrlab.trace.torch_compile.tracing import trace_joint

    backend = spec.get("backend", "aot_eager")
    joint = trace_joint(spec["model"], device="cuda", backend=backend)
    runs = []
    for knob in spec["knobs"]:
        step = partition_lowered(joint, knob) if backend == "inductor" else partition(joint, knob)
        predicted = step_peaks(step)
        run = {"knob": knob, "backend": backend, **measured_against(torch, step, predicted, spec["model"], {}, knob,
                                                                     backend)}
        print(f"  knob {knob}: allocated above start {run['real_allocated_above_start']:,} B real, "
              f"{run['predicted_allocated_above_start']:,} B predicted; saved {run['real_saved']} real, "
              f"{step.saved_count} predicted")
        runs.append(run)
    return {"model": spec["model"], "backend": backend, "runs": runs, "mismatches": sum(not run["within_tolerance"] for run in runs)}


def measured_against(torch, step, predicted: dict, model: str, options: dict, knob: float, backend: str) -> dict:
    """The real step of ``model`` compiled at ``knob`` with ``backend`` and run once on the GPU, against the
    partitioned ``step``'s ``predicted`` peaks: allocated bytes above those allocated before the step (the prediction
    less the step's constants, plus the loss's gradient), reserved bytes, saved tensors (autograd's saved-tensor
    hooks)."""
    from dtrlab.trace.capture import is_measured_temporary
    from dtrlab.trace.models import build
    from dtrlab.trace.torch_compile.tracing import LossStep
    import torch._functorch.config  # noqa: F401 - the knob's home, patched below

    constants = sum(-(-op.total_size // 512) * 512 for op in step.trace.operators if op.is_constant)
    tangent = 512  # the loss's gradient, allocated by autograd during the real step
    workload = build(model, device="cuda", **options)
    module = LossStep(workload.module, workload.loss_fn)
    torch._dynamo.reset()
    with torch._functorch.config.patch(activation_memory_budget=knob):
        compiled = torch.compile(module, backend=backend, fullgraph=True, dynamic=False)
        compiled(*workload.inputs).backward()  # compiles at this knob
        module.zero_grad(set_to_none=True)
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(1) or t, lambda t: t):
            compiled(*workload.inputs)
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        start_reserved = torch.cuda.memory_reserved()
        torch.cuda.reset_peak_memory_stats()
        compiled(*workload.inputs).backward()
        torch.cuda.synchronize()
    real = torch.cuda.max_memory_allocated() - start
    expected = predicted["allocated_peak"] - constants + tangent
    # the tolerance is the step's largest tensor, not a measured workspace (tests/test_inductor.py's _prediction)
    largest = max(op.total_size for op in step.trace.operators if not is_measured_temporary(op.name))
    measured = {"real_allocated_above_start": real, "predicted_allocated_above_start": expected,
                "real_max_reserved": torch.cuda.max_memory_reserved(), "reserved_at_start": start_reserved,
                "predicted_reserved_peak": predicted["reserved_peak"], "real_saved": len(saved),
                "predicted_saved": step.saved_count, "tolerance": largest,
                "within_tolerance": abs(real - expected) <= largest}
    del compiled, module, workload
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    return measured


def cuda_lowering_section(spec: dict, torch) -> dict:
    """CUDA Inductor's lowering through the fake target against the real one, and its peaks against the real
    step's (see the module docstring)."""
    from dtrlab.memory.partitioned import step_peaks
    from dtrlab.trace.torch_compile.gpu_target import matching_target
    from dtrlab.trace.torch_compile.inductor import partition_lowered
    from dtrlab.trace.torch_compile.tracing import trace_joint

    gpu = matching_target(torch.cuda.get_device_properties(0))
    if gpu is None:
        return {"model": spec["model"], "error": f"no dtrlab GPU target matches {torch.cuda.get_device_name(0)}",
                "mismatches": 1}
    real = trace_joint(spec["model"], device="cuda", backend="inductor", **spec["options"])
    fake = trace_joint(spec["model"], gpu=gpu, backend="inductor", **spec["options"])
    runs = []
    for knob in spec["knobs"]:
        partition_lowered(real, knob, cache=False)
        step = partition_lowered(fake, knob, cache=False)
        run = {"knob": knob, **measured_against(torch, step, step_peaks(step), spec["model"], spec["options"], knob,
                                                "inductor")}
        print(f"  {spec['model']} for {gpu} at knob {knob}: allocated above start "
              f"{run['real_allocated_above_start']:,} B real, {run['predicted_allocated_above_start']:,} B predicted; "
              f"reserved {run['real_max_reserved']:,} B real, {run['predicted_reserved_peak']:,} B predicted")
        runs.append(run)
    wrappers = compared_wrappers(real, fake)
    mismatches = sum(not run["within_tolerance"] for run in runs) + sum(w["differing_lines"] > 0 for w in wrappers)
    return {"model": spec["model"], "options": spec["options"], "gpu": gpu, "device": torch.cuda.get_device_name(0),
            "runs": runs, "wrappers": wrappers, "mismatches": mismatches}


def op_temporaries_section(spec: dict, torch) -> dict:
    """Convolutions' temporaries on the GPU: the step's prediction without and with each distinct call measured on
    this GPU, against the real step (see the module docstring)."""
    from dtrlab.memory.partitioned import step_peaks
    from dtrlab.trace.op_temporaries import device_key
    from dtrlab.trace.torch_compile.inductor import partition_lowered
    from dtrlab.trace.torch_compile.partition import partition
    from dtrlab.trace.torch_compile.tracing import trace_joint

    backend = spec["backend"]
    joint = trace_joint(spec["model"], device="cuda", backend=backend, **spec["options"])
    runs = []
    for knob in spec["knobs"]:
        steps = [partition_lowered(joint, knob, cache=False, temporaries=counted) if backend == "inductor"
                 else partition(joint, knob, temporaries=counted) for counted in (False, True)]
        without, counted = (step_peaks(step) for step in steps)
        run = {"knob": knob, **measured_against(torch, steps[1], counted, spec["model"], spec["options"], knob,
                                                backend)}
        run["predicted_without_temporaries"] = (run["predicted_allocated_above_start"]
                                                - (counted["allocated_peak"] - without["allocated_peak"]))
        run["temporaries"] = temporaries_by_operator(steps[1].trace)
        print(f"  {spec['model']} ({backend}) at knob {knob}: allocated above start "
              f"{run['real_allocated_above_start']:,} B real, {run['predicted_allocated_above_start']:,} B predicted "
              f"with the temporaries, {run['predicted_without_temporaries']:,} B without")
        runs.append(run)
    return {"model": spec["model"], "options": spec["options"], "backend": backend, "device": device_key("cuda"),
            "runs": runs, "mismatches": sum(not run["within_tolerance"] for run in runs)}


def temporaries_by_operator(trace) -> dict:
    """The measured temporaries a step's trace carries (dtrlab.trace.capture's ``<op>_temporary`` and ``<op>_held``
    allocations), per name: how many calls, the largest, and the bytes in all."""
    from dtrlab.trace.capture import is_measured_temporary

    kinds: dict[str, dict] = {}
    for op in trace.operators:
        if is_measured_temporary(op.name):
            entry = kinds.setdefault(op.name, {"calls": 0, "largest": 0, "bytes": 0})
            entry["calls"] += 1
            entry["largest"] = max(entry["largest"], op.total_size)
            entry["bytes"] += op.total_size
    return kinds


def compared_wrappers(real, fake) -> list[dict]:
    """Each distinct wrapper the real route lowered beside the fake route's, in lowering order, line by line."""
    import difflib

    def sources(joint) -> list[str]:
        return [lowered[0] for part in joint.parts or (joint,) for pair in part.lowerings.values() for lowered in pair]

    real_sources, fake_sources = sources(real), sources(fake)
    compared = []
    for index in range(max(len(real_sources), len(fake_sources))):
        if index >= len(real_sources) or index >= len(fake_sources):
            compared.append({"wrapper": index, "differing_lines": -1, "first_differences": ["only one route has it"]})
            continue
        differences = [line for line in difflib.unified_diff(real_sources[index].splitlines(),
                                                              fake_sources[index].splitlines(), lineterm="", n=0)
                       if line[:1] in "+-" and not line.startswith(("+++", "---"))]
        compared.append({"wrapper": index, "lines": len(real_sources[index].splitlines()),
                         "differing_lines": len(differences), "first_differences": differences[:20]})
    return compared


def compile_section(spec: dict, torch) -> dict:
    """dtrlab.compile's pick on a real GPU step at three budgets (see the module docstring)."""
    import dtrlab
    from dtrlab.analysis.fit_knob import fit_knob, spread_budgets
    from dtrlab.trace.models import build
    from dtrlab.trace.torch_compile.tracing import LossStep

    backend, runs = spec["backend"], []
    workload = build(spec["model"], device="cuda", **spec["options"])
    step, inputs = LossStep(workload.module, workload.loss_fn), tuple(workload.inputs)
    probe = fit_knob(step, inputs, budget=1 << 50, accounting="allocated", backend=backend, cache=False)
    for budget in spread_budgets(probe):
        step.zero_grad(set_to_none=True)
        torch._dynamo.reset()
        compiled = dtrlab.compile(step, budget=budget, example_inputs=inputs, accounting="allocated",
                                  backend=backend, cache=False)
        fit = compiled.knob_fit
        compiled(*inputs).backward()  # compiles at the pick
        step.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        compiled(*inputs).backward()
        torch.cuda.synchronize()
        constants = {t.untyped_storage().data_ptr(): -(-t.untyped_storage().nbytes() // 512) * 512
                     for t in [*step.parameters(), *step.buffers(), *inputs] if isinstance(t, torch.Tensor)}
        measured = sum(constants.values()) + torch.cuda.max_memory_allocated() - start
        above = round(fit.knob + 0.01, 2) if fit.knob < 1.0 else None
        run = {"budget": budget, "knob": fit.knob, "predicted": fit.peak, "measured": measured,
               "within": measured <= budget, "over_by": max(0, measured - budget),
               "max_memory_allocated": torch.cuda.max_memory_allocated(), "allocated_at_start": start,
               "max_memory_reserved": torch.cuda.max_memory_reserved(), "next_grid_knob": above,
               "next_grid_knob_predicted": dict(fit.evaluated).get(above), "evaluations": fit.evaluations,
               "pick_seconds": fit.seconds, "warnings": fit.warnings()}
        print(f"  {spec['model']} at {budget:,} B: knob {fit.knob:g}, predicted {fit.peak:,} B, measured "
              f"{measured:,} B ({'within' if run['within'] else 'OVER'}); grid knob above: {above} predicted "
              f"{run['next_grid_knob_predicted']}")
        runs.append(run)
        del compiled
        torch._dynamo.reset()
    return {"model": spec["model"], "options": spec["options"], "backend": backend, "accounting": "allocated_peak",
            "runs": runs, "mismatches": sum(not run["within"] for run in runs)}


def run_worker(args, section: str, conf: str, spec: dict | None = None, extra: list[str] = ()) -> dict:
    """One section in a fresh Python process with PYTORCH_CUDA_ALLOC_CONF=conf."""
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=conf)
    command = [sys.executable, str(Path(__file__).resolve()), str(args.trace), "--worker", section, *extra]
    with tempfile.TemporaryDirectory() as tmp:
        if spec is not None:  # a run's calls are too long for a command line
            spec_file = Path(tmp) / "spec.json"
            spec_file.write_text(json.dumps(spec))
            command += ["--worker-spec", f"@{spec_file}"]
        done = subprocess.run(command, env=env, capture_output=True, text=True)
    sys.stdout.write("".join(line + "\n" for line in done.stdout.splitlines()[:-1]))
    if done.returncode != 0 or not done.stdout.strip():
        return {"section": section, "conf": conf, "error": (done.stderr or done.stdout).strip()[-2000:],
                "mismatches": 1}
    return {"section": section, "conf": conf, **json.loads(done.stdout.splitlines()[-1])}


def layout_variants(args) -> list[tuple[str, list[str]]]:
    """(PYTORCH_CUDA_ALLOC_CONF, worker options) of the layout section: the given options, or
    plain and expandable segments when none is given."""
    conf, _ = allocator_conf(args)
    passed = [flag for flag, on in (("--expandable-segments", args.expandable_segments),) if on]
    for flag, value in (("--max-split-size-mb", args.max_split_size_mb),
                        ("--roundup-power2-divisions", args.roundup_power2_divisions), ("--fraction", args.fraction)):
        if value is not None:
            passed += [flag, str(value)]
    passed += ["--checkpoints", str(args.checkpoints), "--max-mismatches", str(args.max_mismatches)]
    if conf or args.fraction is not None:
        return [(conf, passed)]
    return [("", passed), ("expandable_segments:True", [*passed, "--expandable-segments"])]


def write_results(args, results: dict) -> None:
    out = args.out or (Path(os.environ["OUT"]) / "validate_allocator_cuda.json" if os.environ.get("OUT") else None)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(results, indent=1, default=str))
        tmp.replace(out)
        print(f"results written to {out}")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker_spec.startswith("@"):
        args.worker_spec = Path(args.worker_spec[1:]).read_text()
    if args.worker:
        return worker(args)
    problem = cuda_problem()
    if problem:
        print(f"validate_allocator_cuda: {problem}", file=sys.stderr)
        write_results(args, {"status": "no-cuda", "reason": problem})
        return NO_CUDA
    results = {"trace": str(args.trace), "sections": {}}
    if "layout" in args.sections:
        results["sections"]["layout"] = [run_worker(args, "layout", conf, None, extra)
                                         for conf, extra in layout_variants(args)]
    if "expandable-limit" in args.sections:
        results["sections"]["expandable-limit"] = [
            run_worker(args, "expandable-limit", "expandable_segments:True", {"case": case})
            for case in range(len(EXPANDABLE_CASES))]
    if "semantics" in args.sections:
        results["sections"]["semantics"] = [run_worker(args, "semantics", run["conf"], run)
                                            for run in semantics_runs(args)]
    if "execute" in args.sections:
        spec = {"model": args.execute_model, "ratios": [float(r) for r in args.execute_ratios.split(",")]}
        results["sections"]["execute"] = [run_worker(args, "execute", "", spec)]
    if "knob" in args.sections:
        knobs = [float(v) for v in args.knob_values.split(",")]
        results["sections"]["knob"] = [run_worker(args, "knob", "", {"model": args.knob_model, "knobs": knobs,
                                                                      "backend": backend})
                                       for backend in args.knob_backends.split(",")]
    if "compile" in args.sections:
        results["sections"]["compile"] = [run_worker(args, "compile", "", {"model": model, "options": options,
                                                                            "backend": args.compile_backend})
                                          for model, options in args.compile_models.items()]
    if "cuda-lowering" in args.sections:
        knobs = [float(v) for v in args.knob_values.split(",")]
        results["sections"]["cuda-lowering"] = [run_worker(args, "cuda-lowering", "", {"model": model,
                                                                                       "options": options,
                                                                                       "knobs": knobs})
                                                for model, options in args.lowering_models.items()]
    if "op-temporaries" in args.sections:
        knobs = [float(v) for v in args.knob_values.split(",")]
        results["sections"]["op-temporaries"] = [
            run_worker(args, "op-temporaries", "", {"model": model, "options": options, "knobs": knobs,
                                                    "backend": args.compile_backend})
            for model, options in args.temporaries_models.items()]
    mismatches = sum(part.get("mismatches", 0) for parts in results["sections"].values() for part in parts)
    results["mismatches"] = mismatches
    results["status"] = "match" if mismatches == 0 else "mismatch"
    print(f"summary: {mismatches} mismatches over sections {', '.join(results['sections'])}")
    write_results(args, results)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
