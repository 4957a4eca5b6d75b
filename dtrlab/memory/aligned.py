"""``aligned``: a byte counter that rounds every request up to a granularity (default 512 B,
the caching allocator's ``kMinBlockSize``), so many small tensors cost what they would on a GPU."""

from __future__ import annotations

from .base import check_int, register_memory_model
from .core_args import byte_counting_args
from .flat import ByteCountingModel

DEFAULT_GRANULARITY = 512


def _granularity(key, value):
    return check_int(key, value, minimum=1)


@register_memory_model
class AlignedModel(ByteCountingModel):
    name = "aligned"
    option_specs = {"granularity": (DEFAULT_GRANULARITY, _granularity)}

    def core_args(self) -> tuple | None:
        # A subclass may change a rule the C counter hard-codes.
        return byte_counting_args(self.capacity_bytes, self._granularity) if type(self) is AlignedModel else None
