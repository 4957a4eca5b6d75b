"""The device capacity of the ``allocated`` runtime semantics: how much memory the allocator may reserve.

Under ``enforce="allocated"`` the DTR budget limits allocated bytes and a separate device
capacity limits reserved memory (see docs/memory.md). It is given as

* bytes: an int (``85_899_345_920``) or a string with a unit (``"80GiB"``, ``"40GB"``, ``"512MiB"``);
* a multiple of the budget: ``"1.25x"`` (resolved per run, so one sweep covers every budget);
* a GPU preset: ``"A100-80GB"``, ``"H100-80GB"``, ... (:data:`GPU_PRESETS`, nominal memory);
* ``None`` or ``"unlimited"``: no device limit (the run reports the reserved memory it needed).

:func:`device_capacity` normalizes a spec into a :class:`DeviceCapacity`, whose ``label``
keys caches and tables (a preset and its byte count share a label). :func:`budget_bytes` reads a byte budget
in the same terms (here, free of torch: ``dtrlab knob CENSUS.json --budget`` parses it without importing it).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..suggest import did_you_mean

GiB = 1 << 30
#: Nominal memory of common GPUs (the marketing size in GiB; ``totalGlobalMem`` is a little less,
#: and the CUDA context takes a few hundred MiB of it, which no preset subtracts).
GPU_PRESETS = {
    "V100-16GB": 16 * GiB, "V100-32GB": 32 * GiB, "A100-40GB": 40 * GiB, "A100-80GB": 80 * GiB,
    "H100-80GB": 80 * GiB, "H200-141GB": 141 * GiB, "L4-24GB": 24 * GiB, "RTX3090-24GB": 24 * GiB,
    "RTX4090-24GB": 24 * GiB,
}
#: How a step's peak is counted, by short name (``--accounting``), and its column in the peak tables: bytes of live
#: storages, or the caching allocator's allocated or reserved bytes (what a device enforces).
PEAK_ACCOUNTINGS = {"flat": "flat_peak", "allocated": "allocated_peak", "reserved": "reserved_peak"}
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": GiB, "KB": 10**3, "MB": 10**6, "GB": 10**9}
#: The capacity an unlimited device stands for: more than any trace can reserve.
UNLIMITED_BYTES = 1 << 62

_MULTIPLE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*x\s*$")
_WITH_UNIT = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]+)\s*$")


@dataclass(frozen=True)
class DeviceCapacity:
    """A normalized device capacity: ``multiple`` of the budget, or fixed ``bytes``, or neither (unlimited)."""

    bytes: int | None = None
    multiple: float | None = None

    @property
    def label(self) -> str:
        """``"1.25x"``, ``"85899345920"`` or ``"unlimited"``: the spec's canonical text (cache keys, tables)."""
        if self.multiple is not None:
            return f"{self.multiple:g}x"
        return "unlimited" if self.bytes is None else str(self.bytes)

    def bytes_for(self, budget_bytes: int) -> int:
        """The capacity in bytes for a run at ``budget_bytes`` (at least the budget: the device holds it)."""
        if self.multiple is not None:
            return int(budget_bytes * self.multiple)
        return UNLIMITED_BYTES if self.bytes is None else self.bytes


def gpu_preset(device) -> str | None:
    """``device`` when it names a GPU preset (a step traced and lowered for that GPU:
    dtrlab.trace.torch_compile.cuda_joint), None for any other device (the CPU's lowering): ``dtrlab knob --device``'s,
    ``check``'s and ``dtrlab.fit_knob``'s rule."""
    return device if isinstance(device, str) and device in GPU_PRESETS else None


def human_bytes(count: int) -> str:
    """``count`` bytes as GiB from 1 GiB up, MiB from 0.1 MiB up, else KiB, two decimals (``"80.00 GiB"``,
    ``"0.50 MiB"``, ``"12.00 KiB"``): at least two significant digits, never ``"0.00 MiB"`` for a small count."""
    if count >= GiB:
        return f"{count / GiB:.2f} GiB"
    mib = count / UNITS["MiB"]
    return f"{mib:.2f} MiB" if mib >= 0.1 else f"{count / UNITS['KiB']:.2f} KiB"


def device_capacity(spec) -> DeviceCapacity:
    """``spec`` (bytes, ``"1.25x"``, ``"80GiB"``, a preset, ``None``/``"unlimited"``) as a :class:`DeviceCapacity`."""
    if isinstance(spec, DeviceCapacity):
        return spec
    if spec is None or spec == "unlimited":
        return DeviceCapacity()
    if isinstance(spec, bool) or isinstance(spec, float):
        raise ValueError(f"device capacity {spec!r}: give bytes as an integer, a multiple of the budget as a string "
                         "such as '1.25x', a size such as '80GiB', a GPU preset or 'unlimited'")
    if isinstance(spec, int):
        if spec <= 0:
            raise ValueError(f"device capacity must be positive bytes, got {spec}")
        return DeviceCapacity(bytes=spec)
    if not isinstance(spec, str):
        raise ValueError(f"device capacity must be an int or a string, got {spec!r}")
    if spec in GPU_PRESETS:
        return DeviceCapacity(bytes=GPU_PRESETS[spec])
    if spec.strip().isdigit():
        return device_capacity(int(spec))
    match = _MULTIPLE.match(spec)
    if match:
        multiple = float(match.group(1))
        if not (math.isfinite(multiple) and multiple >= 1):
            raise ValueError(f"device capacity {spec!r}: a multiple of the budget must be >= 1 (the device holds the "
                             "budget), e.g. '1.25x'")
        return DeviceCapacity(multiple=multiple)
    match = _WITH_UNIT.match(spec)
    if match and match.group(2) in UNITS:
        nbytes = int(float(match.group(1)) * UNITS[match.group(2)])
        return device_capacity(nbytes)
    hint = did_you_mean(spec, [*GPU_PRESETS, "unlimited"])
    raise ValueError(f"unknown device capacity {spec!r}{hint}; give bytes (85899345920 or '80GiB'; units "
                     f"{', '.join(UNITS)}), a multiple of the budget ('1.25x'), 'unlimited' or a GPU preset: "
                     f"{', '.join(GPU_PRESETS)}")


def budget_bytes(spec) -> tuple[int, bool]:
    """``spec`` (int bytes, a size such as ``"40GiB"``, or a GPU preset such as ``"A100-80GB"``) in bytes,
    and whether it named a preset. A one-line ValueError naming ``budget`` otherwise."""
    try:
        capacity = device_capacity(spec)
    except ValueError:  # its help offers what a device capacity takes besides bytes
        capacity = None
    if capacity is None or capacity.bytes is None:
        raise ValueError(f"budget {spec!r}{did_you_mean(spec, GPU_PRESETS)}: give positive bytes (42949672960 or "
                         f"'40GiB'; units {', '.join(UNITS)}) or a GPU preset ({', '.join(GPU_PRESETS)})")
    return capacity.bytes, isinstance(spec, str) and spec in GPU_PRESETS
