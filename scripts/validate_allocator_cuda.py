#!/usr/bin/env python
"""Compare the ``caching`` memory model with PyTorch's real CUDA caching allocator.

Usage (on a machine with a CUDA GPU and torch)::

    python scripts/validate_allocator_cuda.py traces/resnet32-b8.jsonl.gz
    python scripts/validate_allocator_cuda.py TRACE --expandable-segments --checkpoints 50
    python scripts/validate_allocator_cuda.py TRACE --fraction 0.05   # exercise release-and-retry / OOM

It replays the trace's unbounded allocation/free sequence
(:func:`dtrlab.memory.replay.unbounded_events`: outputs allocated when computed,
storages freed when their last external reference goes) twice: with real tensors
(``torch.empty(size, dtype=torch.uint8, device="cuda")``, dropped on free) and with
the model. At each checkpoint it compares ``torch.cuda.memory_snapshot()`` with the
model's ``layout()``. Real addresses differ from the model's, so segments are
matched through the live blocks they hold: for every live block it compares the
segment's pool and size, the block's offset from the segment start and its size,
and the full block list (sizes, allocated or free) of that segment. Segments without
a live block (cached, wholly free) are compared as a multiset of (pool, size). It
also checks allocated/reserved bytes and that both sides fail (OOM) at the same event.

Run it in a fresh process: nothing else may use the CUDA caching allocator. The
options set PYTORCH_CUDA_ALLOC_CONF before torch starts; ``--fraction`` caps the
allocator with ``torch.cuda.set_per_process_memory_fraction``, and the model's
capacity is the same number of bytes (without it the capacity is the device's
total memory, which an unbounded replay of a small trace never reaches).

Exit status: 0 when everything matches, 1 on a mismatch, 2 when torch or CUDA is missing.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dtrlab.memory import get_memory_model  # noqa: E402
from dtrlab.memory.replay import unbounded_events  # noqa: E402
from dtrlab.trace import load  # noqa: E402

MiB = 1 << 20


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path, help="a dtrlab trace or simrd log (e.g. traces/resnet32-b8.jsonl.gz)")
    parser.add_argument("--checkpoints", type=int, default=20, help="snapshots evenly spaced over the events")
    parser.add_argument("--fraction", type=float, default=None,
                        help="cap the allocator at this fraction of device memory (and the model's capacity)")
    parser.add_argument("--expandable-segments", action="store_true")
    parser.add_argument("--max-split-size-mb", type=int, default=None)
    parser.add_argument("--roundup-power2-divisions", type=int, default=None)
    parser.add_argument("--max-mismatches", type=int, default=200, help="stop printing after this many")
    return parser.parse_args(argv)


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


def require_cuda():
    """torch with a usable CUDA device, or exit 2 with the reason."""
    try:
        import torch
    except ImportError:
        print("validate_allocator_cuda: torch is not installed; install it with CUDA support "
              "on a GPU machine (pip install torch)", file=sys.stderr)
        sys.exit(2)
    if not torch.cuda.is_available():
        print(f"validate_allocator_cuda: no CUDA device available (torch {torch.__version__}, "
              f"built with CUDA {torch.version.cuda}); run this on a GPU machine", file=sys.stderr)
        sys.exit(2)
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


def main(argv=None) -> int:
    args = parse_args(argv)
    conf, options = allocator_conf(args)
    if args.fraction is not None and args.expandable_segments:
        # With a fraction set, PyTorch checks the per-process limit against get_allocation_size
        # before mapping pages, not against the pages it maps; the model caps the mapped pages.
        print("validate_allocator_cuda: --fraction with --expandable-segments is not comparable "
              "(see docs/memory.md); drop one of them", file=sys.stderr)
        return 2
    if conf:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf  # before torch initialises the allocator
    torch = require_cuda()
    trace = load(args.trace)
    events = unbounded_events(trace)
    total = torch.cuda.get_device_properties(0).total_memory
    if args.fraction is not None:
        torch.cuda.set_per_process_memory_fraction(args.fraction, 0)
        # The allocator caps at fraction * the total cudaMemGetInfo reports.
        capacity = int(args.fraction * torch.cuda.mem_get_info(0)[1])
    else:
        capacity = total
    torch.cuda.empty_cache()
    if torch.cuda.memory_reserved() or torch.cuda.memory_allocated():
        print("validate_allocator_cuda: the caching allocator is already in use; run in a fresh process",
              file=sys.stderr)
        return 2
    model = get_memory_model("caching", capacity, **options)
    n = len(events)
    checkpoints = {min(n - 1, round(i * (n - 1) / max(args.checkpoints - 1, 1))) for i in range(args.checkpoints)}
    mismatches = []

    def report(step, message):
        mismatches.append((step, message))
        if len(mismatches) <= args.max_mismatches:
            print(f"[event {step}] {message}")

    tensors: dict[int, object] = {}
    compared = 0
    print(f"{trace.name}: {n} events, capacity {capacity} B, PYTORCH_CUDA_ALLOC_CONF={conf!r}, "
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
                print(f"[event {step}] stopping at the first OOM (cuda {real_ok}, model {model_ok})")
                compare(step, torch, tensors, model, report)
                compared += 1
                break
            tensors[event.block_id] = tensor
        else:
            del tensors[event.block_id]
            model.free(event.block_id)
        if step in checkpoints:
            compare(step, torch, tensors, model, report)
            compared += 1
    stats = model.stats()
    print(f"summary: {compared} checkpoints compared, {len(mismatches)} mismatches; model peak allocated "
          f"{stats.peak_allocated_bytes} B (cuda {torch.cuda.max_memory_allocated()}), peak reserved "
          f"{stats.peak_reserved_bytes} B (cuda {torch.cuda.max_memory_reserved()})")
    if stats.peak_allocated_bytes != torch.cuda.max_memory_allocated():
        report(n, "peak allocated bytes differ")
    if stats.peak_reserved_bytes != torch.cuda.max_memory_reserved():
        report(n, "peak reserved bytes differ")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
