"""Memory models below the runtime: how a block of bytes is placed on the device.

``flat`` counts bytes (simrd), ``aligned`` rounds each request to a granularity,
``caching`` models PyTorch's CUDA caching allocator (segments, pools, splitting,
coalescing). See docs/memory.md.
"""

from .base import (MEMORY_MODELS, Block, MemoryModel, MemoryStats, Segment, available_memory_models,
                   get_memory_model, register_memory_model)
from .flat import FlatModel
from .aligned import AlignedModel
from .caching import CachingModel

__all__ = ["MEMORY_MODELS", "Block", "MemoryModel", "MemoryStats", "Segment", "available_memory_models",
           "get_memory_model", "register_memory_model", "FlatModel", "AlignedModel", "CachingModel"]
