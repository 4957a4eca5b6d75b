"""A stand-in ``torch`` whose CUDA caching allocator is dtrlab's ``caching`` model.

Only for exercising scripts/validate_allocator_cuda.py on machines without a GPU
(tests/test_validate_allocator_script.py puts this directory first on PYTHONPATH of the
script's process): every section must then report 0 mismatches, which checks the script's
plumbing, not the model. ``STAND_IN_LIMIT_CHECK`` sets the limit check a per-process
fraction gets (PyTorch's is ``allocation_size``), so a test can make the two sides differ.
"""

import itertools
import os
import types

from dtrlab.memory import CachingModel

__version__ = "0.0-stand-in"
version = types.SimpleNamespace(cuda="stand-in")
uint8 = "uint8"
TOTAL = 80 << 30
BASE = 1 << 40  # device addresses of the stand-in start here


def _conf() -> dict:
    options = {}
    for item in filter(None, os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").split(",")):
        key, _, value = item.partition(":")
        if key == "expandable_segments":
            options["expandable_segments"] = value == "True"
        elif key == "max_split_size_mb":
            options["max_split_size"] = int(value) << 20
        elif key == "roundup_power2_divisions":
            options["roundup_power2_divisions"] = int(value)
    return options


class _Allocator:
    def __init__(self):
        self.model = CachingModel(TOTAL, **_conf())
        self.ids = itertools.count()

    def limit(self, fraction):
        assert not self.model.stats().reserved_bytes, "set the fraction before allocating"
        check = os.environ.get("STAND_IN_LIMIT_CHECK", "allocation_size")
        self.model = CachingModel(int(fraction * TOTAL), limit_check=check, **_conf())


_allocator = _Allocator()


class _Tensor:
    def __init__(self, size):
        self.block = next(_allocator.ids)
        self.model = _allocator.model
        if not self.model.allocate(self.block, size):
            self.model = None
            raise cuda.OutOfMemoryError(f"stand-in: cannot allocate {size} bytes")
        self.size = size

    def data_ptr(self):
        block = self.model.block_of(self.block)
        return 0 if block is None else BASE + block.address

    def __del__(self):
        if self.model is not None:
            self.model.free(self.block)


def empty(size, dtype=None, device=None):
    return _Tensor(size)


def _stats():
    return _allocator.model.stats()


def _snapshot():
    return [{"address": BASE + seg.address, "total_size": seg.size, "segment_type": seg.pool,
             "blocks": [{"size": b.size, "state": "active_allocated" if b.block_id is not None else "inactive"}
                        for b in seg.blocks]} for seg in _allocator.model.layout()]


class _OutOfMemoryError(RuntimeError):
    pass


cuda = types.SimpleNamespace(
    is_available=lambda: True,
    OutOfMemoryError=_OutOfMemoryError,
    get_device_properties=lambda device: types.SimpleNamespace(total_memory=TOTAL),
    mem_get_info=lambda device=0: (TOTAL - _stats().reserved_bytes, TOTAL),
    set_per_process_memory_fraction=lambda fraction, device=0: _allocator.limit(fraction),
    empty_cache=lambda: _allocator.model._release_cached_blocks(),
    memory_allocated=lambda: _stats().allocated_bytes,
    memory_reserved=lambda: _stats().reserved_bytes,
    max_memory_allocated=lambda: _stats().peak_allocated_bytes,
    max_memory_reserved=lambda: _stats().peak_reserved_bytes,
    memory_snapshot=_snapshot,
)
