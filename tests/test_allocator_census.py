"""The allocator census's columns under both runtime semantics, on hand-built traces.

The chain below (tests/test_memory_semantics.py's ``chain``) computes three 4 MiB outputs
from a 0-byte constant, each kept to the end and never used again: the baseline peak is
12 MiB, and the ratios 0.25, 0.5 and 1.0 are the budgets 3, 6 and 12 MiB. In the caching
model a 4 MiB request goes to the large pool, and the first one reserves a 20 MiB segment
(``get_allocation_size``: large requests below 10 MiB take ``kLargeBuffer``); the other
outputs split the segment's free remainder, so every run reserves exactly 20 MiB.
"""

from pathlib import Path

import pytest

from dtrlab.analysis.allocator_census import (DEFAULT_CONFIGS, FATE_COLUMNS, TABLE_COLUMNS, Config,
                                              allocator_census, config_label, flat_hole_fates)
from dtrlab import simulate
from test_anatomy import oom_trace
from test_memory_semantics import chain
from dtrlab.runtime.semantics import Semantics
from dtrlab.sweep.execution import Execution

MIB = 1 << 20
RATIOS = [0.25, 0.5, 1.0]

FLAT = Config("dtr", "flat")
RESERVED = Config("dtr", "caching")
UNLIMITED = Config("dtr", "caching", {}, "allocated", "unlimited")
DEVICE_125 = Config("dtr", "caching", {}, "allocated", "1.25x")


def census(trace, configs, ratios=RATIOS):
    result = allocator_census({trace.name: trace}, configs, ratios=ratios, refine=False,
                              execution=Execution(cache=False, progress=False, backend="sequential"))
    assert list(result.table.columns) == TABLE_COLUMNS
    return result, result.table.set_index("config")


def four_mib_chain():
    return chain(("a", 4 * MIB), ("b", 4 * MIB), ("c", 4 * MIB))


def test_columns_under_both_semantics():
    """Flat h_DTR fails at 3 MiB only (a 4 MiB output does not fit) and passes at 6 and 12 MiB:
    threshold 0.5, and flat reserves nothing (no reserved ratio, no addresses).

    caching, ``reserved`` (the budget is the device): 3 MiB fails on the bytes; at 6 and 12 MiB
    the bytes fit but the 20 MiB segment does not, and nothing can be evicted to make room:
    two fragmentation OOMs, no threshold.

    caching, ``allocated``, unlimited device: at 3 MiB a's 4 MiB block exceeds the budget after
    fa and a is no candidate (an OOM on the bytes); at 6 MiB the run evicts a after fb and b
    after fc (8 > 6 MiB each time) and passes; at 12 MiB it passes without evicting. Threshold
    0.5 (shift 0), reserving 20 MiB: 20/6 of the budget at the threshold, and 20/6 the largest
    over the passing budgets (20/12 at 12 MiB).

    caching, ``allocated``, device 1.25 x the budget (3.75, 7.5, 15 MiB): the first segment
    (20 MiB) does not fit on the device at any budget: three device OOMs, no threshold.

    No run releases a segment, so no outcome depends on the address policy: 0 of 3 flip where
    compared (not on the unlimited device, where the allocator never releases one)."""
    result, table = census(four_mib_chain(), [FLAT, RESERVED, UNLIMITED, DEVICE_125])
    columns = ["failures", "holes", "threshold_ratio", "threshold_shift", "fragmentation_ooms", "device_ooms",
               "reserved_over_budget_at_threshold", "max_reserved_over_budget", "address_flips",
               "address_compared"]
    rows = {label: [None if value != value else value for value in table.loc[label, columns]]  # NaN -> None
            for label in table.index}
    assert rows[FLAT.label] == [1, 0, 0.5, 0.0, 0, 0, None, None, None, None]
    assert rows[RESERVED.label] == [3, 0, None, None, 2, 0, None, None, 0, 3]
    assert rows[UNLIMITED.label] == [1, 0, 0.5, 0.0, 0, 0, 20 / 6, 20 / 6, None, None]
    assert rows[DEVICE_125.label] == [3, 0, None, None, 0, 3, None, None, 0, 3]
    assert table.loc[UNLIMITED.label, ["enforce", "device_capacity"]].tolist() == ["allocated", "unlimited"]
    assert table.loc[RESERVED.label, ["enforce", "device_capacity"]].tolist() == ["reserved", ""]
    # The columns are those of single runs.
    run = simulate(four_mib_chain(), "dtr", budget_bytes=6 * MIB,
                   semantics=Semantics(memory="caching", enforce="allocated"))
    assert (run.status, run.evicted_storages, run.peak_reserved_bytes) == ("pass", ("a", "b"), 20 * MIB)
    assert simulate(four_mib_chain(), "dtr", budget_bytes=12 * MIB,
                    semantics=Semantics(memory="caching", enforce="allocated", device_capacity="1.25x")
                    ).failure.cause == "device"
    # Every sample of the address-aware configurations was compared under both address policies.
    assert len(result.flips) == 6 and not result.flips["flipped"].any()
    assert set(result.flips["config"]) == {RESERVED.label, DEVICE_125.label}


def test_a_fixed_device_moves_the_threshold():
    """A device of exactly 20 MiB holds the segment at every budget: 3 MiB still fails on the
    bytes, 6 and 12 MiB pass as on the unlimited device, with 20 MiB reserved."""
    device = Config("dtr", "caching", {}, "allocated", "20MiB")
    _, table = census(four_mib_chain(), [FLAT, device])
    row = table.loc[device.label]
    assert (row.failures, row.device_ooms, row.threshold_ratio, row.threshold_shift) == (1, 0, 0.5, 0.0)
    assert row.device_capacity == str(20 * MIB) and row.max_reserved_over_budget == pytest.approx(20 / 6)


def test_holes_and_their_fates():
    """tests/test_anatomy.py's oom_trace (peak 112 bytes) has one flat h_DTR hole at budgets 98-99
    between passes at 97 and 100: sampled at 97, 98 and 100, one hole of one failing sample (not
    new: it is flat's own), and the threshold is 100's ratio. Under ``aligned`` every tensor takes
    512 bytes, more than any of these budgets: every sample fails, no hole, and flat's hole lies
    below a threshold that is not even sampled. The fate of flat's hole under each configuration
    is read from runs at its failing budgets (98 here), as direct runs give them."""
    ratios = [(b + 0.5) / 112 for b in (97, 98, 100)]
    aligned, allocated = Config("dtr", "aligned"), Config("dtr", "flat", {}, "allocated", "unlimited")
    result, table = census(oom_trace(), [FLAT, aligned, allocated], ratios)
    row = table.loc[FLAT.label]
    assert (row.samples, row.failures, row.holes, row.new_holes, row.threshold_ratio) == (3, 1, 1, 0, ratios[2])
    row = table.loc[aligned.label]
    assert (row.failures, row.holes, row.new_holes) == (3, 0, 0) and row.threshold_ratio != row.threshold_ratio
    assert result.flips.empty  # no address-aware configuration
    fates = flat_hole_fates(result, {"oom": oom_trace()}, [FLAT, aligned, allocated],
                            execution=Execution(cache=False, progress=False))
    assert list(fates.columns) == FATE_COLUMNS and len(fates) == 3
    fate = fates.set_index("config")
    assert fate.loc[FLAT.label, ["status_low", "fate"]].tolist() == ["oom", "hole"]
    assert fate.loc[aligned.label, ["status_low", "fate"]].tolist() == ["oom", "below threshold"]
    direct = {b: simulate(oom_trace(), "dtr", budget_bytes=b,
                          semantics=Semantics(memory="flat", enforce="allocated")).status
              for b in (97, 98)}
    assert fate.loc[allocated.label, "status_low"] == direct[98]
    assert fate.loc[allocated.label, "fate"] == ("passes" if direct[98] == "pass" else
                                                 "hole" if direct[97] == "pass" else "below threshold")


def test_labels_and_the_default_configurations():
    """``reserved`` labels are the old ones (the shipped figures' strips), ``allocated`` ones name
    the device; Coop and dtr_fit are ``reserved`` only, which the runtime enforces."""
    assert config_label("dtr", "caching") == "dtr @ caching"
    assert DEVICE_125.label == "dtr @ caching [allocated, device 1.25x]"
    assert Config("dtr", "caching", {"expandable_segments": True}, "allocated").label == \
        "dtr @ caching(expandable_segments=True) [allocated, device unlimited]"
    assert {c.policy for c in DEFAULT_CONFIGS if c.enforce == "allocated"} == {"dtr"}
    assert len({c.label for c in DEFAULT_CONFIGS}) == len(DEFAULT_CONFIGS)
    with pytest.raises(ValueError, match="evicts to place a block"):
        census(four_mib_chain(), [Config("coop", "caching", {}, "allocated", "1.25x")])


def test_shipping_merges_new_runs_into_a_verified_bundle(tmp_path, monkeypatch):
    """dtrlab ship results --allocator-census adds the cached runs of new configurations to a
    trace's bundle file and keeps its other rows; the shipped layer then serves both without
    simulating, and a bundle file that no longer matches the manifest is refused, not merged."""
    from dtrlab.integrity import IntegrityError, write_manifest
    from dtrlab.sweep import sweep
    from dtrlab.sweep.shipped import RECOMPUTE_ENV, SHIPPED_ENV, read_metadata
    from dtrlab.trace import LogBuilder

    from dtrlab.pipeline import ship_results as ship

    log = LogBuilder()
    log.constant("x", 0)
    for name in "abc":
        log.call("f" + name, ["x"], [(name, 4 * MIB)], time=1)
    log.release("a", "b", "c")
    (tmp_path / "set").mkdir()
    log.write(tmp_path / "set" / "chain.log")
    bundle = tmp_path / "shipped"
    monkeypatch.setenv(SHIPPED_ENV, str(bundle))
    first, second = tmp_path / "first", tmp_path / "second"
    old = sweep(tmp_path / "set" / "chain.log", "dtr", ratios=RATIOS, execution=Execution(cache=first, progress=False))
    ship.merge_pack(tmp_path / "set", first, bundle / "set")  # no file yet: a new one
    write_manifest(bundle)
    new = sweep(tmp_path / "set" / "chain.log", "dtr", ratios=RATIOS,
                execution=Execution(cache=second, progress=False), semantics=UNLIMITED.semantics())
    (path, rows, _), = ship.merge_pack(tmp_path / "set", second, bundle / "set")
    write_manifest(bundle, [path])
    assert rows == 6 and len(read_metadata(path)["configs"]) == 2
    monkeypatch.delenv(RECOMPUTE_ENV)  # read the shipped layer (tests/conftest.py ignores it)
    monkeypatch.setattr("dtrlab.sweep.engine.run_spec", None)  # any simulation would fail now
    for frame, semantics in ((old, Semantics()), (new, UNLIMITED.semantics())):
        shipped = sweep(tmp_path / "set" / "chain.log", "dtr", ratios=RATIOS,
                        execution=Execution(cache=tmp_path / "empty", progress=False), semantics=semantics)
        assert shipped["status"].tolist() == frame["status"].tolist()
    path.write_bytes(path.read_bytes() + b"\0")
    with pytest.raises(IntegrityError, match="does not match"), pytest.warns(UserWarning):
        ship.merge_pack(tmp_path / "set", second, bundle / "set")


MODELS = Path(__file__).resolve().parent.parent / "traces" / "models"


@pytest.mark.slow
@pytest.mark.parametrize("name, ratios, flat, allocated, allocated_expandable", [
    # persists exactly
    ("llama-1b-b4-s2048", [0.426, 0.427, 0.429], "pass thrash pass", "pass thrash pass", "pass thrash pass"),
    # narrows to 0.273; with expandable segments moves to 0.271
    ("vit_b_16-b64", [0.271, 0.272, 0.273, 0.274], "pass thrash thrash pass", "pass pass thrash pass",
     "thrash pass pass pass"),
    # closes
    ("resnet50-b64", [0.305, 0.306, 0.307, 0.308], "pass thrash thrash pass", "pass pass pass pass",
     "pass pass pass pass"),
])
def test_fates_of_the_models_flat_holes_under_allocated(name, ratios, flat, allocated, allocated_expandable):
    """docs/memory.md, "Today's models": flat h_DTR's three holes of the 0.001 census run at their budgets
    under `allocated` on an A100's 80 GB (which equals an unlimited device on these models)."""
    path = MODELS / f"{name}.jsonl.gz"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    import dtrlab
    from dtrlab.sweep import sweep

    trace = dtrlab.load(str(path))
    for config, expected in [(FLAT, flat), (Config("dtr", "caching", {}, "allocated", "A100-80GB"), allocated),
                             (Config("dtr", "caching", {"expandable_segments": True}, "allocated", "A100-80GB"),
                              allocated_expandable)]:
        frame = sweep(trace, "dtr", ratios=ratios,
                      execution=Execution(cache=False, progress=False, backend="sequential"),
                      semantics=config.semantics())
        assert " ".join(frame["status"]) == expected, config.label
