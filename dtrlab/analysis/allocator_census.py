"""The hole census under each memory model and runtime semantics: do flat's holes persist
under a caching allocator, and what does a device need beyond the DTR budget?

:func:`allocator_census` sweeps every trace under every :class:`Config` (policy, memory
model, options, runtime semantics ``enforce`` and, under ``"allocated"``, the device
capacity), censuses its holes (refined by :func:`refine_holes` if asked) and tabulates,
per trace and configuration: failing samples, holes, the feasibility threshold and its
shift against flat h_DTR, the mean overhead of the passing samples, the caching metrics
at the threshold, the peak reserved memory over the budget (at the threshold and the
largest of any passing sample), the device OOMs, and how many sampled outcomes flip
when the allocator reuses released address ranges (:func:`address_policy_flips`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from ..memory import MEMORY_MODELS
from ..runtime import ALLOCATED, DEFAULT_OVERHEAD_LIMIT, FLAT, REFERENCE, RESERVED, Semantics, baseline, memory_label
from ..memory.device import device_capacity as parse_device_capacity
from ..sweep import QUIET, SERIAL, Execution, sweep
from ..trace.model import Trace
from .address_sensitivity import address_policy_flips
from .holes import HoleCensus, find_holes, refine_holes


@dataclass(frozen=True)
class Config:
    """One census configuration: ``policy`` under ``memory`` (with ``options``) and the runtime
    semantics ``enforce``; ``device_capacity`` (``"1.25x"``, ``"H100-80GB"``, ``"unlimited"``, ...)
    only under ``"allocated"`` (docs/memory.md)."""

    policy: str
    memory: str = FLAT
    options: dict = field(default_factory=dict)
    enforce: str = RESERVED
    device_capacity: str | None = None

    @property
    def device_label(self) -> str:
        """The device capacity's canonical label (``"1.25x"``, bytes, ``"unlimited"``); empty under ``reserved``."""
        return parse_device_capacity(self.device_capacity).label if self.enforce == ALLOCATED else ""

    @property
    def label(self) -> str:
        """``dtr @ caching`` under ``reserved``, ``dtr @ caching [allocated, device 1.25x]`` under ``allocated``."""
        semantics = f" [allocated, device {self.device_capacity or 'unlimited'}]" if self.enforce == ALLOCATED else ""
        return f"{self.policy} @ {memory_label(self.memory, self.options)}{semantics}"

    @property
    def address_sensitive(self) -> bool:
        """Whether outcomes can depend on where new segments go (the caching model's ``address_policy``):
        an address-aware model that may release segments. It releases them only when a new one does
        not fit on the device (``malloc``'s release-and-retry), which an unlimited device never asks."""
        return MEMORY_MODELS[self.memory].address_aware and self.device_label != "unlimited"

    def semantics(self, overhead_limit: float = DEFAULT_OVERHEAD_LIMIT) -> Semantics:
        """This configuration's :class:`~dtrlab.runtime.semantics.Semantics` at ``overhead_limit``."""
        device = self.device_capacity if self.enforce == ALLOCATED else None
        return Semantics(self.memory, self.options, self.enforce, device, overhead_limit)


EXPANDABLE = {"expandable_segments": True}
#: Devices of the ``allocated`` semantics: as large as the budget, a quarter larger, and
#: unlimited (the run reports the reserved memory it needed).
DEVICES = ("1x", "1.25x", "unlimited")


def census_configs(policies=("dtr", "coop", "dtr_fit"), *, expandable_segments: bool = True, devices=DEVICES,
                   gpu: str = "") -> list[Config]:
    """The census's configurations. Under the ``reserved`` semantics (the budget caps reserved
    memory; placement failures are answered by evicting): flat and aligned h_DTR, then each
    of ``policies`` under the caching allocator, without and (``expandable_segments``) with
    expandable segments. Then the ``allocated`` semantics (the DTR prototype's: the budget
    caps allocated bytes after each operator, a device capacity caps reserved memory) for
    h_DTR under the same caching models on each of ``devices`` and, if given, the ``gpu``
    preset (e.g. ``"A100-80GB"``). Coop and dtr_fit evict to place a block, which
    ``allocated`` never asks for: they are ``reserved`` only."""
    models = [{}, EXPANDABLE] if expandable_segments else [{}]
    reserved = [Config(p, "caching", options) for options in models for p in policies]
    allocated = [Config("dtr", "caching", options, ALLOCATED, device)
                 for options in models for device in [*devices, *([gpu] if gpu else [])]]
    return [Config("dtr", FLAT), Config("dtr", "aligned"), *reserved, *allocated]


#: :func:`census_configs` with its defaults.
DEFAULT_CONFIGS = tuple(census_configs())
#: Notebook 08's census of today's models (traces/models, issue 20): h_DTR and Coop (dtr_fit, ours, is
#: left out), with the memory of the GPU their costs are modelled on as one more device.
MODELS_POLICIES, MODELS_GPU = ("dtr", "coop"), "A100-80GB"

#: Columns of :attr:`AllocatorCensus.table`.
TABLE_COLUMNS = ["trace", "config", "policy", "memory", "enforce", "device_capacity", "samples", "failures", "holes",
                 "new_holes", "threshold_ratio", "threshold_shift", "mean_pass_overhead", "fragmentation_at_threshold",
                 "fragmentation_evictions_at_threshold", "evictions_at_threshold", "fragmentation_ooms",
                 "device_ooms", "reserved_over_budget_at_threshold", "max_reserved_over_budget",
                 "address_flips", "address_compared"]


@dataclass(frozen=True)
class AllocatorCensus:
    """``table`` has :data:`TABLE_COLUMNS` (one row per trace and configuration); ``samples``
    every simulated row (with a ``config`` column, :attr:`Config.label`); ``censuses`` the
    :class:`HoleCensus` per (trace, config label); ``flips`` the address-policy comparison
    of every sample of the address-aware configurations (:func:`address_policy_flips`'s
    columns plus ``trace`` and ``config``)."""

    table: pd.DataFrame
    samples: pd.DataFrame
    censuses: dict[tuple[str, str], HoleCensus]
    flips: pd.DataFrame


def config_label(policy: str, memory: str, options: dict | None = None, enforce: str = RESERVED,
                 device_capacity: str | None = None) -> str:
    """``coop @ caching(expandable_segments=True)``; see :attr:`Config.label`."""
    return Config(policy, memory, options or {}, enforce, device_capacity).label


def allocator_census(traces: dict[str, Trace], configs=DEFAULT_CONFIGS, *, ratios="0.05:1.0:0.005",
                     refine: bool = True, resolution_ratio: float = 1e-3, address_flips=("dtr",),
                     semantics: Semantics = REFERENCE, execution: Execution = SERIAL) -> AllocatorCensus:
    """Sweep and census every trace under every :class:`Config` at ``semantics``' overhead limit (the
    configurations set the rest); runs go where ``execution`` says.

    ``refine`` bisects every pass/fail edge to ``resolution_ratio`` of the trace's
    baseline peak (and probes suspicious samples), as :func:`refine_holes`, under the
    configuration's own semantics. The threshold shift is the configuration's threshold
    ratio minus flat h_DTR's on the same trace (None when either has no threshold; flat
    h_DTR must be among the configs for it). Every sample of an address-aware configuration
    named in ``address_flips`` (by policy or by :attr:`Config.label`) that may release
    segments (:attr:`Config.address_sensitive`; not on an unlimited device) is simulated
    again with ``address_policy="reuse"`` (the
    census runs with the default, ``"bump"``) and the outcomes that differ are counted (Coop
    and dtr_fit are left out by default: on the Python simulator they cost minutes per sweep).
    """
    if not traces:
        raise ValueError("no traces; pass dtrlab.trace.load_directory('traces') or a dict name -> Trace")
    semantics.require_default(("memory", "memory_options", "enforce", "device_capacity"), "configs= set")
    configs = [c if isinstance(c, Config) else Config(*c) for c in configs]
    rows, frames, censuses, flips = [], [], {}, []
    for name, trace in traces.items():
        resolution = max(1, int(baseline(trace).peak_memory * resolution_ratio))
        for config in configs:
            frame = sweep(trace, config.policy, ratios=ratios, semantics=config.semantics(semantics.overhead_limit),
                          execution=execution)
            census = (refine_holes(trace, frame, config.policy, resolution=resolution, execution=execution).refined
                      if refine else find_holes(frame))
            censuses[name, config.label] = census
            frames.append(census.samples.assign(config=config.label))
            flipped = None
            if (config.policy in address_flips or config.label in address_flips) and config.address_sensitive:
                flipped = address_policy_flips(trace, config.policy, budgets=census.samples["budget_bytes"].tolist(),
                                               semantics=config.semantics(semantics.overhead_limit),
                                               execution=execution)
                flips.append(flipped.assign(trace=name, config=config.label))
            rows.append(census_row(name, config, census, flipped))
    table = pd.DataFrame(rows)
    flat = table[table["config"] == Config("dtr", FLAT).label].set_index("trace")["threshold_ratio"]
    table["threshold_shift"] = table["threshold_ratio"] - table["trace"].map(flat)
    table["new_holes"] = [new_holes(censuses[trace, label].holes, censuses.get((trace, Config("dtr", FLAT).label)))
                          for trace, label in zip(table["trace"], table["config"])]
    samples = pd.concat(frames, ignore_index=True)
    flips = pd.concat(flips, ignore_index=True) if flips else pd.DataFrame()
    return AllocatorCensus(table[TABLE_COLUMNS], samples, censuses, flips)


def new_holes(holes: pd.DataFrame, flat: HoleCensus | None) -> int | None:
    """How many of ``holes`` overlap none of flat h_DTR's holes (each taken from the passing sample
    below it to the one above): holes that flat does not have nearby (None without flat's census)."""
    if flat is None:
        return None
    extents = list(zip(flat.holes["pass_below_bytes"], flat.holes["pass_above_bytes"]))
    return sum(not any(low < above and high > below for below, above in extents)
               for low, high in zip(holes["fail_low_bytes"], holes["fail_high_bytes"]))


def census_row(trace: str, config: Config, census: HoleCensus, flips: pd.DataFrame | None = None) -> dict:
    """One row of :attr:`AllocatorCensus.table` (without ``threshold_shift``, which needs flat's row).

    ``reserved_over_budget_at_threshold`` is the threshold sample's peak reserved bytes over
    its budget, ``max_reserved_over_budget`` the largest of that ratio over the passing
    samples (None under flat, which reports no reserved memory; byte-counting models reserve
    exactly what they allocate, so theirs is at most 1); ``address_flips``
    counts the samples whose status differs in ``flips`` (None without ``flips``)."""
    samples = census.samples
    passing = samples[samples["status"] == "pass"]
    at = samples[samples["budget_bytes"] == census.threshold_bytes]
    at = at.iloc[0] if len(at) else None

    def at_threshold(column):
        if at is None or column not in at or pd.isna(at[column]):
            return None
        return at[column]

    over_passing = (passing["peak_reserved_bytes"].astype(float) / passing["budget_bytes"]).dropna() \
        if "peak_reserved_bytes" in passing else pd.Series(dtype=float)
    reserved_at = at_threshold("peak_reserved_bytes")
    ooms = samples["oom_cause"] if "oom_cause" in samples else pd.Series(dtype=object)
    return {
        "trace": trace, "config": config.label, "policy": config.policy,
        "memory": memory_label(config.memory, config.options), "enforce": config.enforce,
        "device_capacity": config.device_label, "samples": len(samples), "failures": census.failures,
        "holes": len(census.holes), "threshold_ratio": census.threshold_ratio,
        "mean_pass_overhead": passing["overhead"].mean() if len(passing) else None,
        "fragmentation_at_threshold": at_threshold("fragmentation_at_peak"),
        "fragmentation_evictions_at_threshold": at_threshold("fragmentation_evictions"),
        "evictions_at_threshold": None if at is None else int(at["evictions"]),
        "fragmentation_ooms": int((ooms == "fragmentation").sum()),
        "device_ooms": int((ooms == "device").sum()),
        "reserved_over_budget_at_threshold": None if reserved_at is None else reserved_at / at["budget_bytes"],
        "max_reserved_over_budget": float(over_passing.max()) if len(over_passing) else None,
        "address_flips": None if flips is None else int(flips["flipped"].sum()),
        "address_compared": None if flips is None else len(flips),
    }


#: Columns of :func:`flat_hole_fates`.
FATE_COLUMNS = ["trace", "config", "fail_low_ratio", "fail_high_ratio", "status_low", "status_high", "fate"]


def flat_hole_fates(census: AllocatorCensus, traces: dict[str, Trace], configs, *,
                    execution: Execution = QUIET) -> pd.DataFrame:
    """What becomes of each of flat h_DTR's refined holes under each of ``configs``: one row per
    (hole, configuration) with the configuration's status at the hole's lowest and highest
    failing budget (:data:`FATE_COLUMNS`) and its ``fate``:

    * ``"passes"``: the configuration passes at both budgets (the hole closes there);
    * ``"hole"``: it fails at one of them while a budget below that one passes (one of its
      samples, or the other budget): a failure above a pass, so the hole persists (possibly
      wider, narrower or merged with others);
    * ``"below threshold"``: it fails there and passes at no sample below (the hole is
      swallowed by a failing region that reaches down from there).

    Both budgets are simulated under the configuration (cached like every sweep, with ``execution``)."""
    rows = []
    flat = Config("dtr", FLAT).label
    for (name, label), hole_census in census.censuses.items():
        if label != flat:
            continue
        for config in configs:
            samples = census.censuses[name, config.label].samples
            for hole in hole_census.holes.itertuples():
                budgets = [hole.fail_low_bytes, hole.fail_high_bytes]
                limit = float(samples["overhead_limit"].iloc[0])
                frame = sweep(traces[name], config.policy, budgets=sorted(set(budgets)),
                              semantics=config.semantics(limit), execution=execution).set_index("budget_bytes")
                low, high = (frame.loc[b, "status"] for b in budgets)
                statuses = dict(zip(budgets, (low, high)))
                failing = [b for b, status in statuses.items() if status != "pass"]
                passing = set(samples.loc[samples["status"] == "pass", "budget_bytes"]) | \
                    {b for b, status in statuses.items() if status == "pass"}
                fate = ("passes" if not failing else
                        "hole" if any(b < min(failing) for b in passing) else "below threshold")
                rows.append({"trace": name, "config": config.label, "fail_low_ratio": hole.fail_low_ratio,
                             "fail_high_ratio": hole.fail_high_ratio, "status_low": low, "status_high": high,
                             "fate": fate})
    return pd.DataFrame(rows, columns=FATE_COLUMNS)
