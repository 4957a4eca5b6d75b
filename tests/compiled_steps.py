"""Real torch.compile training steps on the CPU and their measured peaks (shared by the knob tests).

Two independent instruments:

* :func:`measure_compiled_run`: torch.profiler's memory events (``profile_memory=True``) during
  one compiled step; the peak of their running sum is the peak of CPU allocator bytes above
  those live when the step starts;
* peak RSS: the same step in a fresh process started with a low
  ``MALLOC_MMAP_THRESHOLD_`` (tensors above it are mmapped, and returned to the system when
  freed) and glibc's ``malloc_trim(0)`` called just before the step (whole free heap pages
  are given back, so a tensor served from a free heap chunk faults its pages in anew);
  writing 5 to ``/proc/self/clear_refs`` resets the peak RSS (``VmHWM``) just before the
  step, and the peak RSS above the RSS at that moment is the step's.

:func:`both_instruments` measures one compiled step in such a fresh process with both, the RSS step first, then
the profiler's: one compile where there were two (a compile in the test process for the profiler, another in
the RSS process). Each instrument reads its own step and nothing the other wrote. The fresh process runs this
process's intra-op threads: the operators' internal temporaries the prediction measured depend on them
(ResNet-18 at 32x32, knob 0.0: the profiler read 229,376 B below the prediction at one thread, to the byte at
two, as in the test process); the encoder-decoder at knob 0.1 read the same profiler peak there as in the test
process (135,232 B above the prediction: dropout's mask, not measured).

Tiny models of the families the knob tests compare (sources for ``module:function``).
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import torch._functorch.config  # the knob's home: _fresh_main patches it in a process of its own
from torch import nn
from torch.nn import functional as F

from dtrlab.trace.models import build
from dtrlab.trace.torch_compile.tracing import LossStep
from dtrlab.trace.profiled import cpu_peak_bytes

ROOT = Path(__file__).resolve().parent.parent
#: glibc's mmap threshold in the RSS subprocess: every tensor of 4 KiB or more gets its own mapping.
MMAP_THRESHOLD = 4096


def tiny_seq2seq(batch: int = 4):
    """An encoder-decoder (torch.nn.Transformer: its attention runs SDPA), token embeddings, cross-entropy."""
    class Seq2Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(64, 32)
            self.transformer = nn.Transformer(32, 2, num_encoder_layers=1, num_decoder_layers=1,
                                              dim_feedforward=64, dropout=0.0, batch_first=True)
            self.head = nn.Linear(32, 64)

        def forward(self, source, target):
            return self.head(self.transformer(self.embed(source), self.embed(target)))

    source = torch.randint(0, 64, (batch, 24))
    target = torch.randint(0, 64, (batch, 16))
    labels = torch.randint(0, 64, (batch, 16))
    return Seq2Seq(), (source, target), lambda logits: F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def tiny_vit(batch: int = 4):
    """A two-block vision transformer (patch convolution, class token, SDPA attention), cross-entropy."""
    class ViT(nn.Module):
        def __init__(self):
            super().__init__()
            self.patch = nn.Conv2d(3, 32, 8, stride=8)
            self.cls = nn.Parameter(torch.zeros(1, 1, 32))
            self.pos = nn.Parameter(torch.zeros(1, 17, 32))
            layer = nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True, norm_first=True)
            self.blocks = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = nn.Linear(32, 10)

        def forward(self, images):
            tokens = self.patch(images).flatten(2).transpose(1, 2)
            tokens = torch.cat([self.cls.expand(tokens.shape[0], -1, -1), tokens], 1) + self.pos
            return self.head(self.blocks(tokens)[:, 0])

    images = torch.randn(batch, 3, 32, 32)
    labels = torch.randint(0, 10, (batch,))
    return ViT(), images, lambda logits: F.cross_entropy(logits, labels)


def compiled_step(source: str, backend: str, options: dict, fullgraph: bool = True):
    """``source``'s step compiled by torch.compile, run once (compiled), gradients dropped.

    Call it, and run the step, with the knob patched into ``torch._functorch.config``: dynamo
    guards on that configuration, and a call outside the patch compiles the step again."""
    workload = build(source, device="cpu", **options)
    step = LossStep(workload.module, workload.loss_fn)
    inputs = workload.inputs
    torch._dynamo.reset()  # else dynamo's cache would reuse another knob's graphs
    compiled = torch.compile(step, backend=backend, fullgraph=fullgraph, dynamic=False)
    compiled(*inputs).backward()  # compiles, at this knob
    step.zero_grad(set_to_none=True)
    gc.collect()
    return step, compiled, inputs


def measure_compiled_run(source: str, knob: float, backend: str = "aot_eager", fullgraph: bool = True, **options):
    """The compiled step's saved tensors ((shape, dtype), sorted) and its profiler peak (see the module docstring).
    ``fullgraph=False``: a step with graph breaks, compiled graph by graph as torch.compile does."""
    with torch._functorch.config.patch(activation_memory_budget=knob):
        return _measure(*compiled_step(source, backend, options, fullgraph)[1:])


def _measure(compiled, inputs):
    saved = []

    def pack(t):
        saved.append((tuple(t.shape), str(t.dtype).removeprefix("torch.")))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = compiled(*inputs)
    del loss
    gc.collect()
    peak = cpu_peak_bytes(lambda: compiled(*inputs).backward())
    torch._dynamo.reset()
    return sorted(saved), peak


def both_instruments(source: str, knob: float, backend: str = "aot_eager", fullgraph: bool = True,
                     threads: int | None = None, **options) -> tuple[int, int]:
    """(peak RSS, profiler peak) of the compiled step, each above its step's start, both measured in one fresh
    process on one compile (module docstring), the RSS step first; ``threads``: torch's intra-op threads there
    (default: this process's, which the prediction's measured operator temporaries were found under).
    ``fullgraph``: :func:`measure_compiled_run`'s."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    threads = torch.get_num_threads() if threads is None else threads
    arguments = json.dumps([source, knob, backend, fullgraph, options, threads])
    done = subprocess.run([sys.executable, "-c", f"from tests.compiled_steps import _fresh_main; _fresh_main({arguments!r})"],
                          env=env, capture_output=True, text=True, check=True, cwd=ROOT)
    rss, profiled = json.loads(done.stdout.strip().splitlines()[-1])
    return rss, profiled


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


def _fresh_main(arguments: str) -> None:
    source, knob, backend, fullgraph, options, threads = json.loads(arguments)
    import warnings

    warnings.simplefilter("ignore")
    torch.set_num_threads(threads)
    with torch._functorch.config.patch(activation_memory_budget=knob):
        _, compiled, inputs = compiled_step(source, backend, options, fullgraph)
        rss = _rss_measure(compiled, inputs)
        _drop_gradients(compiled)
        print(json.dumps([rss, _measure(compiled, inputs)[1]]))


def _drop_gradients(compiled) -> None:
    for parameter in compiled._orig_mod.parameters():
        parameter.grad = None
    gc.collect()


def _rss_measure(compiled, inputs) -> int:
    compiled(*inputs).backward()  # a second step: every lazy initialisation done
    gc.collect()
    _drop_gradients(compiled)
    # Free heap chunks would serve the step's tensors from pages already resident, which RSS does not
    # see: glibc's malloc_trim gives every whole free page back (MADV_DONTNEED), so they fault in anew.
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    start = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    compiled(*inputs).backward()
    return (_status_kib("VmHWM") - start) * 1024
