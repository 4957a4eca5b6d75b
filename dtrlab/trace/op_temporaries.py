"""What an operator allocates inside: each distinct call measured once on real tensors of its device, kept on disk.

A meta-device run sees an operator's outputs, not what its kernel allocates while it runs: an ATen
convolution on the CPU reorders its input, weight and gradients into oneDNN's blocked layouts in buffers
of the CPU allocator and frees them before it returns. The real peak of a step is its outputs' peak plus
such a buffer wherever one is live at the peak, so a CNN's peak moved against the prediction by knob
(issue 56). :class:`OpTemporaries` measures it: the first time a recording meets a call of an operator in
:data:`MEASURED_OPERATORS` with given (shapes, strides, storage offsets, dtypes, other arguments), the same
call runs once on real CPU tensors of those layouts (random values; the allocations do not depend on
them) under torch.profiler's allocator events (:func:`dtrlab.trace.profiled.cpu_memory_profile`, so the
answer is the allocator's, not RSS's), and two sizes are recorded:

* ``transient``: the peak it allocated above its inputs and its outputs (the temporaries live while it
  runs; placed beside its outputs, they give the call's real peak);
* ``held``: what it still holds after it returns beyond its outputs (a cache it filled).

The recorder (:class:`dtrlab.trace.capture.Recorder`, ``temporaries=``) then gives the call a transient
allocation of that size inside its execution (allocated just before its outputs, freed right after) and a
held one kept to the step's end, so every accounting of the trace (flat, caching allocated and reserved)
counts them, under Inductor's wrapper (its ``extern_kernels.convolution`` and the ATen fallback
``convolution_backward`` reach the dispatcher) and aot_eager's graphs alike.

Which operators: measured on this machine (torch 2.14.1, 2 threads; docs/compile.md has the table), CPU
convolutions (``convolution`` and ``convolution_backward``, dense and depthwise, contiguous and
channels-last) and batch norm's backward allocate inside; max pooling, adaptive average pooling and mm do
not (0 bytes). No call held anything after it returned. ``native_dropout`` allocates its mask's float
noise (not measured here: transformer steps would pay measurement runs; docs/compile.md says so).

On a GPU the same holds for cuDNN's workspaces, which go through CUDA's caching allocator. A step traced on CUDA
tensors on a machine with a GPU (``trace_joint(device="cuda")``) can be recorded with ``temporaries=True``: each call
is then run on that GPU and measured by the caching allocator's statistics (off by default: not yet measured on a
GPU; ``scripts/validate_allocator_cuda.py --sections op-temporaries`` is the check a lent GPU runs). A GPU preset's
step, lowered without its GPU, measures none; the GPU answer says so.

Answers are kept one JSON file per call and device under ``ROOT/op-temporaries-v{VERSION}/`` (the cache
root every dtrlab cache shares), named by the sha256 of the call's key and :func:`device_key` (torch's
version, the CPU's capability, the thread count oneDNN's scratch buffers depend on). A file is used only if
it reads back whole, names this format, version and key, and its sha256 over the rest matches; anything else
is moved aside (:func:`dtrlab.integrity.quarantine`) and the call measured again.
"""

from __future__ import annotations

import hashlib
import json
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map

from ..integrity import IntegrityError, atomic_write_json, quarantine, read_json, remove_stale
from .cache import default_cache_dir
from .profiled import cpu_memory_profile, cuda_memory_profile

VERSION = 1
FORMAT = "dtrlab-op-temporaries"
FOLDER = f"op-temporaries-v{VERSION}"

_aten = torch.ops.aten
#: The operators whose calls are measured (module docstring: the ones found to allocate inside on the CPU).
MEASURED_OPERATORS = frozenset({
    _aten.convolution.default,
    _aten.convolution_backward.default,
    _aten.native_batch_norm.default,
    _aten._native_batch_norm_legit_functional.default,
    _aten.native_batch_norm_backward.default,
})


@dataclass(frozen=True)
class Temporaries:
    """Bytes one call allocates beyond its outputs: at its peak (``transient``), and still held after it."""

    transient: int
    held: int


def temporaries_setting(temporaries: bool | None, target: str) -> str | None:
    """The measurements a step is recorded with: :func:`device_key` (on), or None (off). ``target``: the device the
    step runs on (``cpu``, ``cuda``, a GPU preset's name). ``temporaries`` None: on for the CPU, off for a GPU (not
    yet measured on one: ``True`` measures a step traced on CUDA tensors on this machine's GPU, cuDNN's workspaces
    included). A GPU preset's step, lowered without its GPU, cannot be measured: one line says so."""
    if temporaries is None:
        temporaries = target == "cpu"
    if not temporaries:
        return None
    if target == "cuda" and not torch.cuda.is_available():
        raise ValueError("temporaries: a step on CUDA has its operators' temporaries measured on this machine's GPU, "
                         "and it has none")
    if target not in ("cpu", "cuda"):
        raise ValueError(f"temporaries: operators' temporaries are measured on the device a step runs on (the CPU, "
                         f"or this machine's GPU for a step traced on CUDA), not for {target}, lowered without it")
    return device_key(target)


def device_key(device: str = "cpu") -> str:
    """What a measurement depends on besides the call: torch's version, and the CPU and the threads its kernels use,
    or the GPU and the cuDNN settings that choose a convolution's algorithm (and so its workspace)."""
    if device == "cuda":
        cudnn = torch.backends.cudnn
        major, minor = torch.cuda.get_device_capability(0)
        return (f"cuda/{torch.cuda.get_device_name(0)}/sm {major}{minor}/torch {torch.__version__}/cudnn "
                f"{cudnn.version()}/benchmark {cudnn.benchmark}/deterministic {cudnn.deterministic}/tf32 "
                f"{cudnn.allow_tf32}")
    return (f"cpu/{platform.machine()}/{torch.backends.cpu.get_cpu_capability()}/torch {torch.__version__}/"
            f"threads {torch.get_num_threads()}/mkldnn {torch.backends.mkldnn.is_available()}")


def call_key(func, args, kwargs) -> str:
    """A call's identity: the operator, every tensor's shape, strides, storage offset and dtype, every other
    argument's value (devices aside: the call is measured on the device its :func:`device_key` names)."""
    def described(value):
        if isinstance(value, torch.Tensor):
            return ("tensor", tuple(value.shape), tuple(value.stride()), value.storage_offset(), str(value.dtype))
        if isinstance(value, torch.device):
            return "device"
        return value

    return repr((str(func), tree_map(described, (tuple(args), dict(sorted((kwargs or {}).items()))))))


class OpTemporaries:
    """The temporaries of the calls a recording meets, measured once per call and machine.

    ``cache``: True for the default root (``$DTRLAB_CACHE`` or ``~/.cache/dtrlab``), a directory (its root), or
    False to keep nothing on disk. ``device``: :func:`device_key`'s answer the measurements belong to (its first
    part, ``cpu`` or ``cuda``, is where the calls run).
    ``measured`` and ``seconds``: the calls this object measured and what it cost.
    """

    def __init__(self, device: str, cache=True):
        self.device = device
        self.runs_on = device.split("/")[0]  # cpu or cuda
        self.directory = None if cache is False or cache is None else \
            (default_cache_dir() if cache is True else Path(cache)) / FOLDER
        self.measured = 0
        self.seconds = 0.0

    def __call__(self, func, args, kwargs) -> Temporaries | None:
        """The call's temporaries, or None for an operator not in :data:`MEASURED_OPERATORS`."""
        if func not in MEASURED_OPERATORS:
            return None
        key = call_key(func, args, kwargs)
        digest = hashlib.sha256(f"{self.device}\0{key}".encode()).hexdigest()
        known = _KNOWN.get(digest)
        if known is None:
            known = self._read(digest, key)
        if known is None:
            start = time.perf_counter()
            known = measure(func, args, kwargs, self.runs_on)
            self.seconds += time.perf_counter() - start
            self.measured += 1
            self._write(digest, key, known)
        _KNOWN[digest] = known
        return known

    def report(self) -> None:
        """One line on stderr of what measuring cost, if anything was measured."""
        if self.measured:
            where = f"kept in {self.directory}: once per machine" if self.directory is not None else \
                "not kept on disk"
            on = "the CPU" if self.runs_on == "cpu" else "this machine's GPU"
            print(f"dtrlab: measured the internal temporaries of {self.measured} operator call"
                  f"{'s' if self.measured > 1 else ''} on {on} in {self.seconds:.1f} s ({where})", file=sys.stderr)

    def _path(self, digest: str) -> Path | None:
        return None if self.directory is None else self.directory / f"{digest}.json"

    def _read(self, digest: str, key: str) -> Temporaries | None:
        path = self._path(digest)
        if path is None:
            return None
        try:
            document = read_json(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (IntegrityError, OSError) as exc:
            quarantine(path, f"operator temporaries cache entry: {exc}", stacklevel=4)
            return None
        try:
            body = {name: value for name, value in document.items() if name != "sha256"}
            if _body_digest(body) != document["sha256"]:
                raise IntegrityError("its sha256 does not match its content")
            if (body["format"], body["version"], body["device"], body["call"]) != (FORMAT, VERSION, self.device, key):
                raise IntegrityError("another format, version, device or call than its name says")
            transient, held = body["transient"], body["held"]
            if not all(type(value) is int and value >= 0 for value in (transient, held)):
                raise IntegrityError("sizes that are not non-negative integers")
            return Temporaries(transient, held)
        except Exception as exc:  # noqa: BLE001  (whatever a damaged entry raises, the call is measured again)
            quarantine(path, f"operator temporaries cache entry: {type(exc).__name__}: {exc}", stacklevel=4)
            return None

    def _write(self, digest: str, key: str, measured: Temporaries) -> None:
        path = self._path(digest)
        if path is None:
            return
        body = {"format": FORMAT, "version": VERSION, "device": self.device, "call": key,
                "transient": measured.transient, "held": measured.held}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            remove_stale(path.parent)
            atomic_write_json(path, {**body, "sha256": _body_digest(body)})
        except OSError as exc:
            print(f"dtrlab: could not write the operator temporaries cache {path} ({exc}); the call will be "
                  "measured again next time", file=sys.stderr)


#: Answers this process has read or measured, by the digest of device and call.
_KNOWN: dict[str, Temporaries] = {}


def _body_digest(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def measure(func, args, kwargs, device: str = "cpu") -> Temporaries:
    """Run the call once on real tensors of its arguments' layouts on ``device`` (``cpu`` or ``cuda``), outside
    every dispatch mode, under its allocator's accounting (the profiler's allocator events on the CPU, the caching
    allocator's statistics on a GPU, :mod:`dtrlab.trace.profiled`): its peak and end above its start, less its
    outputs' fresh storages (on a GPU as the caching allocator counts them, rounded up to 512 bytes)."""
    with _disable_current_modes():
        real_args, real_kwargs = tree_map(lambda value: _real_like(value, device), (tuple(args), dict(kwargs or {})))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((real_args, real_kwargs))[0]
                  if isinstance(t, torch.Tensor)}
        results = []
        profile = cuda_memory_profile if device == "cuda" else cpu_memory_profile
        peak, end = profile(lambda: results.append(func(*real_args, **real_kwargs)))
        outputs = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                   for t in tree_flatten(results)[0] if isinstance(t, torch.Tensor)}
        if device == "cuda":
            outputs = {pointer: -(-size // 512) * 512 for pointer, size in outputs.items()}
        fresh = sum(size for pointer, size in outputs.items() if pointer not in inputs)
    return Temporaries(transient=max(0, peak - fresh), held=max(0, end - fresh))


def _real_like(value, device: str = "cpu"):
    """A tensor on ``device`` of ``value``'s shape, strides, storage offset and dtype (random floats, zero integers:
    valid indices and masks); a device argument becomes ``device``."""
    if isinstance(value, torch.device):
        return torch.device(device)
    if not isinstance(value, torch.Tensor):
        return value
    extent = value.storage_offset() + 1 + sum((size - 1) * stride for size, stride in zip(value.shape, value.stride())
                                              if size > 0)
    base = torch.empty(extent if value.numel() else 0, dtype=value.dtype, device=device)
    if base.is_floating_point():
        base.normal_()
    else:
        base.zero_()
    return base.as_strided(value.shape, value.stride(), value.storage_offset() if value.numel() else 0)
