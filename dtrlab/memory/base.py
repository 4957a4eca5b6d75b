"""The memory-model interface, its records and the registry.

A memory model decides whether a block of a given size can be placed on the device
now, and where. The simulator gives every storage one block (``block_id`` = storage
id) while it is materialized. Two kinds exist:

* **byte-counting** models (``address_aware = False``: ``flat``, ``aligned``) only
  compare bytes with the capacity; a request fails only when the bytes do not fit.
* **address-aware** models (``address_aware = True``: ``caching``) place blocks at
  addresses inside segments, so a request can fail although the bytes would fit
  (fragmentation).

Models are registered by name (:func:`register_memory_model`) and built with
options by :func:`get_memory_model`. Options are validated up front: an unknown
option, or one that belongs to another model, is refused with the valid ones listed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from ..suggest import did_you_mean


@dataclass(frozen=True)
class Block:
    """One block of a segment: ``block_id`` is the owner's id, ``None`` for a free block.

    ``size`` is what the block occupies (after rounding and unsplit remainders);
    ``requested`` is what the owner asked for (0 for a free block).
    """

    address: int
    size: int
    requested: int
    block_id: int | None


@dataclass(frozen=True)
class Segment:
    """One reserved region (a ``cudaMalloc`` in the caching model) and its blocks in address order."""

    address: int
    size: int
    pool: str  # "small", "large" (caching) or "flat" (byte-counting models)
    blocks: tuple[Block, ...]


@dataclass(frozen=True)
class MemoryStats:
    """Byte counts of a model at one moment (peaks since construction).

    ``largest_free_block`` is the largest free block inside reserved segments; the
    byte-counting models reserve exactly what is allocated, so theirs is 0.
    """

    allocated_bytes: int
    reserved_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    largest_free_block: int
    segments: int


# An option validator turns the given value into the effective one or raises ValueError.
OptionValidator = Callable[[str, Any], Any]


class MemoryModel:
    """Base class of every memory model.

    Subclasses set ``name``, ``address_aware`` and ``option_specs`` (option name ->
    (default, validator)) and implement the methods below.
    """

    name: ClassVar[str] = ""
    address_aware: ClassVar[bool] = False
    option_specs: ClassVar[dict[str, tuple[Any, OptionValidator]]] = {}
    #: Options added after results were shipped: :meth:`options` lists them only when they
    #: differ from their default, so the records and cache keys of older configurations stay as they were.
    later_options: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, capacity_bytes: int, **options):
        self.capacity_bytes = check_int("capacity_bytes", capacity_bytes, minimum=0)
        self._options = self._resolve_options(options)

    def _resolve_options(self, given: dict) -> dict:
        effective = {}
        for key in given:
            if key not in self.option_specs:
                raise ValueError(_option_error(self.name, key, sorted(self.option_specs)))
        for key, (default, validate) in self.option_specs.items():
            effective[key] = validate(key, given[key]) if key in given else default
        return effective

    def options(self) -> dict:
        """The effective options (defaults filled in, except :attr:`later_options` at their default),
        for records and cache keys."""
        return {k: v for k, v in self._options.items()
                if k not in self.later_options or v != self.option_specs[k][0]}

    def request_bytes(self, size: int) -> int:
        """What a request of ``size`` bytes counts against the capacity."""
        raise NotImplementedError

    def allocate(self, block_id: int, size: int) -> bool:
        """Place a block for ``block_id``; False when it cannot be placed now."""
        raise NotImplementedError

    def free(self, block_id: int) -> None:
        """Release the block of ``block_id`` (a ``KeyError`` if it holds none)."""
        raise NotImplementedError

    def layout(self) -> list[Segment]:
        """Address-ordered segments, each with its blocks in address order."""
        raise NotImplementedError

    def stats(self) -> MemoryStats:
        raise NotImplementedError

    def core_args(self) -> tuple | None:
        """The compiled twin's arguments for this instance (:mod:`dtrlab.memory.core_args`), or None
        where the C code does not model it: then a run takes the Python simulator."""
        return None

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self._options.items())
        return f"{type(self).__name__}(capacity_bytes={self.capacity_bytes}{', ' if opts else ''}{opts})"


def check_int(key: str, value: Any, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an int (bools and floats refused), within [minimum, maximum]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{key} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{key} must be <= {maximum}, got {value}")
    return value


def check_bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be True or False, got {value!r}")
    return value


MEMORY_MODELS: dict[str, type[MemoryModel]] = {}


def register_memory_model(cls: type[MemoryModel]) -> type[MemoryModel]:
    """Class decorator: make ``cls`` available by ``cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} needs a non-empty name to be registered")
    if cls.name in MEMORY_MODELS and MEMORY_MODELS[cls.name] is not cls:
        raise ValueError(f"a memory model named {cls.name!r} is already registered")
    MEMORY_MODELS[cls.name] = cls
    return cls


def available_memory_models() -> list[str]:
    return sorted(MEMORY_MODELS)


def get_memory_model(spec: str | MemoryModel, capacity_bytes: int | None = None, **options) -> MemoryModel:
    """A model by registry name (built with ``capacity_bytes`` and ``options``), or an instance as is.

    An instance already carries its capacity and options, so passing options with
    it is refused rather than silently ignored.
    """
    if isinstance(spec, MemoryModel):
        if options:
            raise ValueError(f"memory options {sorted(options)} given with a ready {spec.name!r} model instance; "
                             "set them when constructing the instance")
        if capacity_bytes is not None and capacity_bytes != spec.capacity_bytes:
            raise ValueError(f"capacity_bytes={capacity_bytes} differs from the instance's "
                             f"capacity_bytes={spec.capacity_bytes}")
        return spec
    if not isinstance(spec, str) or spec not in MEMORY_MODELS:
        raise ValueError(f"unknown memory model {spec!r}{did_you_mean(spec, MEMORY_MODELS)}; valid models: "
                         f"{', '.join(available_memory_models())}")
    if capacity_bytes is None:
        raise ValueError(f"memory model {spec!r} needs capacity_bytes")
    return MEMORY_MODELS[spec](capacity_bytes, **options)


def _option_error(model: str, key: str, valid: list[str]) -> str:
    owners = [name for name, cls in sorted(MEMORY_MODELS.items()) if key in cls.option_specs]
    listing = ", ".join(valid) if valid else "none"
    if owners:
        return (f"memory option {key!r} does not apply to the {model!r} model (it belongs to "
                f"{', '.join(repr(o) for o in owners)}); valid options for {model!r}: {listing}")
    return f"unknown memory option {key!r}; valid options for {model!r}: {listing}"
