"""Byte-counting memory: ``flat`` (simrd's counter) and the shared code of ``aligned``.

A byte-counting model has no addresses. A request fits when the allocated bytes
plus the (rounded) request stay within the capacity, as if the device compacted
perfectly. Its :meth:`layout` is therefore one segment of exactly the allocated
bytes, the blocks packed in allocation order: a picture of the bookkeeping, not of
real addresses.
"""

from __future__ import annotations

from .base import MemoryModel, MemoryStats, Segment, Block, register_memory_model
from .core_args import byte_counting_args


class ByteCountingModel(MemoryModel):
    """Counts (rounded) bytes against the capacity; subclasses choose the rounding."""

    address_aware = False

    def __init__(self, capacity_bytes: int, **options):
        super().__init__(capacity_bytes, **options)
        self._granularity = self._options.get("granularity", 1)
        self._blocks: dict[int, tuple[int, int]] = {}  # block_id -> (counted size, requested size)
        self._allocated = 0
        self._peak = 0

    def request_bytes(self, size: int) -> int:
        g = self._granularity
        return size if g == 1 else -(-size // g) * g

    def allocate(self, block_id: int, size: int) -> bool:
        if block_id in self._blocks:
            raise ValueError(f"block {block_id} is already allocated")
        counted = self.request_bytes(size)
        if self._allocated + counted > self.capacity_bytes:
            return False
        self._blocks[block_id] = (counted, size)
        self._allocated += counted
        if self._allocated > self._peak:
            self._peak = self._allocated
        return True

    def free(self, block_id: int) -> None:
        counted, _ = self._blocks.pop(block_id)
        self._allocated -= counted

    def layout(self) -> list[Segment]:
        blocks, address = [], 0
        for block_id, (counted, requested) in self._blocks.items():
            if counted:  # a 0-byte block occupies no address
                blocks.append(Block(address, counted, requested, block_id))
                address += counted
        return [Segment(0, address, "flat", tuple(blocks))] if blocks else []

    def stats(self) -> MemoryStats:
        return MemoryStats(allocated_bytes=self._allocated, reserved_bytes=self._allocated,
                           peak_allocated_bytes=self._peak, peak_reserved_bytes=self._peak,
                           largest_free_block=0, segments=1 if self._allocated else 0)


@register_memory_model
class FlatModel(ByteCountingModel):
    """simrd's byte counter: a request of ``size`` bytes counts ``size`` bytes; no options."""

    name = "flat"
    option_specs = {}

    def core_args(self) -> tuple | None:
        # A subclass may change a rule the C counter hard-codes.
        return byte_counting_args(self.capacity_bytes, 1) if type(self) is FlatModel else None
