"""Damaged caches and shipped files are never served (issue 26's acceptance fuzz test), and never fatal.

Hypothesis flips single bits of, or truncates, (a) a sweep cache file, (b) a shipped
parquet file and (c) a parsed-trace ``.npz``; every run then returns the result of
a clean cache, having simulated (or parsed) again exactly what the damaged file
held. Plus the primitives of :mod:`dtrlab.integrity`, a full disk and an
unwritable cache directory, and the unseeded ``random`` policy.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import tempfile
import warnings
from pathlib import Path
from unittest import mock

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dtrlab.integrity as integrity
from dtrlab.policies import get_policy
from dtrlab.runtime import budget_for
from dtrlab.sweep import SweepCache, engine, sweep
from dtrlab.sweep.cache import rows_from_cache
from dtrlab.sweep.shipped import DEFAULT_SHIPPED_DIR, RECOMPUTE_ENV, SHIPPED_ENV
from dtrlab.trace import cache as trace_cache
from dtrlab.trace import load_log, simrd_log

from conftest import ROOT
from dtrlab.sweep.execution import Execution

LOG = ROOT / "traces" / "unet-b2.jsonl.gz"  # the smallest shipped trace: a run takes milliseconds
RATIOS = (0.75, 0.85, 0.95)
QUICK = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def damage(draw, size: int):
    """('flip', byte, bit) or ('cut', length): one single-bit flip or one truncation of a file of ``size`` bytes."""
    if draw(st.booleans()):
        return "flip", draw(st.integers(0, size - 1)), draw(st.integers(0, 7))
    return "cut", draw(st.integers(0, size - 1))


def damaged(data: bytes, how: tuple) -> bytes:
    if how[0] == "flip":
        out = bytearray(data)
        out[how[1]] ^= 1 << how[2]
        return bytes(out)
    return data[:how[1]]


class Simulated:
    """Counts the budgets simulated in this process while active."""

    def __init__(self):
        self.budgets = []
        self._real = engine.simulate

    def __enter__(self):
        def counting(trace, policy, **kwargs):
            self.budgets.append(kwargs["budget_bytes"])
            return self._real(trace, policy, **kwargs)
        self._patch = mock.patch.object(engine, "simulate", counting)
        self._patch.__enter__()
        return self

    def __exit__(self, *exc):
        self._patch.__exit__(*exc)


def same_results(a: pd.DataFrame, b: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(a.drop(columns="wall_seconds"), b.drop(columns="wall_seconds"))


# The inputs are built once per process by functions, not fixtures: hypothesis would print a
# fixture's (large) value with every falsifying example.
@functools.cache
def load_unet():
    return load_log(LOG, cache=False)


@functools.cache
def clean_cache():
    """The clean sweep of the budgets, and its cache as one file per row (parts) and merged."""
    unet_ = load_unet()
    with mock.patch.dict(os.environ, {RECOMPUTE_ENV: "1"}):
        frame = sweep(unet_, "dtr", ratios=list(RATIOS), execution=Execution(cache=False, progress=False))
    with tempfile.TemporaryDirectory() as root:
        store = SweepCache(root, unet_, get_policy("dtr"))
        rows = [{c: r[c] for c in store_columns()} for r in frame.to_dict("records")]
        for row in rows:
            store.append([row])
        parts = {p.name: p.read_bytes() for p in store.directory.glob("*.parquet")}
        store.compact()
        (merged,) = store.directory.glob("*.parquet")
        files = {"parts": parts, "merged": {merged.name: merged.read_bytes()},
                 "key.json": (store.directory / "key.json").read_bytes()}
    return frame, files


def store_columns():
    from dtrlab.sweep.budget_sweep import _RESULT_COLUMNS
    return _RESULT_COLUMNS


# ------------------------------------------------------------------ (a) the sweep cache
def check_sweep_cache(unet, clean, layout: str, target: int, how: tuple) -> None:
    frame, files = clean
    with tempfile.TemporaryDirectory() as root, mock.patch.dict(os.environ, {RECOMPUTE_ENV: "1"}):
        directory = SweepCache(root, unet, get_policy("dtr")).directory
        directory.mkdir(parents=True)
        (directory / "key.json").write_bytes(files["key.json"])
        names = sorted(files[layout])
        for name in names:
            (directory / name).write_bytes(files[layout][name])
        victim = directory / names[target % len(names)]
        lost = set(pd.read_parquet(victim)["budget_bytes"])
        victim.write_bytes(damaged(victim.read_bytes(), how))
        with Simulated() as simulated, pytest.warns(UserWarning, match="ignoring damaged cache file"):
            again = sweep(unet, "dtr", ratios=list(RATIOS), execution=Execution(cache=root, progress=False))
        same_results(again, frame)
        assert sorted(simulated.budgets) == sorted(lost)  # exactly the damaged file's rows, recomputed
        assert (directory / f"{victim.name}.damaged").exists()  # quarantined, not deleted silently
        with Simulated() as simulated:  # and the repaired cache serves everything
            same_results(sweep(unet, "dtr", ratios=list(RATIOS),
                               execution=Execution(cache=root, progress=False)), frame)
        assert simulated.budgets == []


def sweep_cache_damage():
    return st.tuples(st.sampled_from(["parts", "merged"]), st.integers(0, 2))


@QUICK
@given(where=sweep_cache_damage(), data=st.data())
def test_damaged_sweep_cache_file_is_never_served(where, data):
    unet = load_unet()
    clean = clean_cache()
    layout, target = where
    size = len(sorted(clean[1][layout].items())[target % len(clean[1][layout])][1])
    check_sweep_cache(unet, clean, layout, target, data.draw(damage(size)))


@pytest.mark.slow
@SLOW
@given(where=sweep_cache_damage(), data=st.data())
def test_damaged_sweep_cache_file_is_never_served_many(where, data):
    unet = load_unet()
    clean = clean_cache()
    layout, target = where
    size = len(sorted(clean[1][layout].items())[target % len(clean[1][layout])][1])
    check_sweep_cache(unet, clean, layout, target, data.draw(damage(size)))


def test_a_part_without_checksum_is_recomputed(tmp_path):
    """A part of the format before checksums (``part-<uuid>.parquet``) cannot be verified: recomputed."""
    unet = load_unet()
    clean = clean_cache()
    frame, files = clean
    directory = SweepCache(tmp_path, unet, get_policy("dtr")).directory
    directory.mkdir(parents=True)
    (name, data), = files["merged"].items()
    (directory / "part-0123456789abcdef0123456789abcdef.parquet").write_bytes(data)
    with Simulated() as simulated, pytest.warns(UserWarning, match="no sha256 in its name"):
        same_results(sweep(unet, "dtr", ratios=list(RATIOS),
                           execution=Execution(cache=tmp_path, progress=False)), frame)
    assert len(simulated.budgets) == len(RATIOS)


# ------------------------------------------------------------------ (b) shipped parquet files
SHIPPED_FILE = "traces/unet-b2.parquet"


@functools.cache
def shipped_file():
    """The committed shipped file of the trace and its committed manifest entry."""
    entry = integrity.read_manifest(DEFAULT_SHIPPED_DIR)[SHIPPED_FILE]
    return (DEFAULT_SHIPPED_DIR / SHIPPED_FILE).read_bytes(), entry


def check_shipped(unet, clean, shipped, how) -> None:
    frame, _ = clean
    data, entry = shipped
    with tempfile.TemporaryDirectory() as root:
        bundle = Path(root) / "bundle"
        (bundle / "traces").mkdir(parents=True)
        integrity.atomic_write_json(bundle / integrity.MANIFEST_NAME,
                                    {"format": integrity.MANIFEST_FORMAT, "files": {SHIPPED_FILE: entry}})
        (bundle / SHIPPED_FILE).write_bytes(data if how is None else damaged(data, how))
        environment = {SHIPPED_ENV: str(bundle), RECOMPUTE_ENV: ""}
        with mock.patch.dict(os.environ, environment), Simulated() as simulated, warnings.catch_warnings(record=True) \
                as caught:
            warnings.simplefilter("always")
            again = sweep(unet, "dtr", ratios=list(RATIOS),
                          execution=Execution(cache=Path(root) / "cache", progress=False))
        same_results(again, frame)
        if how is None:  # the clean shipped file serves every budget
            assert simulated.budgets == [] and not caught
        else:  # the damaged one serves none of them, with a one-line warning
            assert sorted(simulated.budgets) == sorted(budget_for(unet, r) for r in RATIOS)
            assert [str(w.message) for w in caught if "ignoring a shipped file" in str(w.message)]
            assert all("\n" not in str(w.message) for w in caught)


def test_the_clean_shipped_file_is_served():
    unet = load_unet()
    clean = clean_cache()
    shipped = shipped_file()
    check_shipped(unet, clean, shipped, None)


@QUICK
@given(data=st.data())
def test_damaged_shipped_file_is_never_served(data):
    unet = load_unet()
    clean = clean_cache()
    shipped = shipped_file()
    check_shipped(unet, clean, shipped, data.draw(damage(len(shipped[0]))))


@pytest.mark.slow
@SLOW
@given(data=st.data())
def test_damaged_shipped_file_is_never_served_many(data):
    unet = load_unet()
    clean = clean_cache()
    shipped = shipped_file()
    check_shipped(unet, clean, shipped, data.draw(damage(len(shipped[0]))))


# ------------------------------------------------------------------ (c) the parsed-trace cache
@functools.cache
def clean_npz():
    with tempfile.TemporaryDirectory() as root:
        load_log(LOG, cache=root)
        return trace_cache.cache_path(root, trace_cache.file_digest(LOG.read_bytes()), True).read_bytes()


def check_trace_cache(unet, npz, how) -> None:
    with tempfile.TemporaryDirectory() as root:
        path = trace_cache.cache_path(root, trace_cache.file_digest(LOG.read_bytes()), True)
        path.parent.mkdir(parents=True)
        path.write_bytes(damaged(npz, how))
        parses = []
        real = simrd_log.parse_lines
        with mock.patch.object(simrd_log, "parse_lines", lambda *a, **k: parses.append(1) or real(*a, **k)), \
                pytest.warns(UserWarning, match="damaged trace cache entry"):
            loaded = load_log(LOG, cache=root)
        assert loaded == unet and loaded.content_hash == unet.content_hash
        assert parses == [1]  # parsed again, never read from the damaged file
        digest = trace_cache.file_digest(LOG.read_bytes())
        assert trace_cache.load_cached(path, digest, True, unet.name, unet.source) == unet  # rewritten whole


@QUICK
@given(data=st.data())
def test_damaged_trace_cache_entry_is_never_served(data):
    unet = load_unet()
    npz = clean_npz()
    check_trace_cache(unet, npz, data.draw(damage(len(npz))))


@pytest.mark.slow
@SLOW
@given(data=st.data())
def test_damaged_trace_cache_entry_is_never_served_many(data):
    unet = load_unet()
    npz = clean_npz()
    check_trace_cache(unet, npz, data.draw(damage(len(npz))))


def test_flipped_compression_method_is_a_rebuilt_miss():
    """Issue 26 item 8: the compression method of a zip entry set to an unknown one raised
    NotImplementedError from every later load."""
    unet = load_unet()
    npz = clean_npz()
    local_header = npz.index(b"PK\x03\x04")
    bad = bytearray(npz)
    bad[local_header + 8] = 99  # the first member's compression method
    central = npz.index(b"PK\x01\x02")
    bad[central + 10] = 99
    check_trace_cache(unet, bytes(bad), ("cut", len(bad)))


# ------------------------------------------------------------------ a full disk, an unwritable directory
def test_atomic_write_leaves_nothing_behind_on_a_full_disk(tmp_path, monkeypatch):
    target = tmp_path / "key.json"
    target.write_text('{"old": 1}')

    def half_then_full(fd, data):
        os.write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(integrity, "_write_all", half_then_full)
    with pytest.raises(OSError, match="No space left"):
        integrity.atomic_write_json(target, {"new": 2})
    assert target.read_text() == '{"old": 1}'  # the old file, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["key.json"]  # no temporary left
    with pytest.raises(OSError):
        integrity.atomic_write_bytes(tmp_path / "new.bin", b"x" * 10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["key.json"]  # no 0-byte file either


def full_disk(monkeypatch):
    def raise_enospc(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(integrity, "_write_all", raise_enospc)


def test_a_full_disk_runs_the_sweep_uncached_with_one_warning(tmp_path, monkeypatch):
    unet = load_unet()
    clean = clean_cache()
    full_disk(monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        frame = sweep(unet, "dtr", ratios=list(RATIOS), execution=Execution(cache=tmp_path, progress=False))
    same_results(frame, clean[0])
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "running uncached" in messages[0] and "No space left" in messages[0]
    # Nothing half-written: no key.json, no part, no temporary file.
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_an_unwritable_cache_directory_runs_the_sweep_uncached(tmp_path, monkeypatch):
    unet = load_unet()
    clean = clean_cache()
    # Tests run as root, where chmod does not stop writes: the refusal is monkeypatched.
    real = os.open

    def refuse(path, flags, *args, **kwargs):
        if flags & os.O_CREAT:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(integrity.os, "open", refuse)
    with pytest.warns(UserWarning, match="cannot write the sweep cache .* Permission denied.*running uncached"):
        frame = sweep(unet, "dtr", ratios=list(RATIOS), execution=Execution(cache=tmp_path, progress=False))
    same_results(frame, clean[0])
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    with pytest.warns(UserWarning, match="cannot write the sweep cache"):
        same_results(sweep(unet, "dtr", ratios=list(RATIOS),
                           execution=Execution(cache=blocked, progress=False)), clean[0])


def test_a_full_disk_while_compacting_keeps_the_parts(tmp_path, monkeypatch):
    unet = load_unet()
    clean = clean_cache()
    frame, files = clean
    directory = SweepCache(tmp_path, unet, get_policy("dtr")).directory
    directory.mkdir(parents=True)
    for name, data in files["parts"].items():
        (directory / name).write_bytes(data)
    store = SweepCache(tmp_path, unet, get_policy("dtr"))
    with monkeypatch.context() as patch, pytest.warns(UserWarning, match="running uncached"):
        full_disk(patch)
        store.compact()
    assert sorted(p.name for p in directory.iterdir()) == sorted(files["parts"])
    with Simulated() as simulated:
        same_results(sweep(unet, "dtr", ratios=list(RATIOS),
                           execution=Execution(cache=tmp_path, progress=False)), frame)
    assert simulated.budgets == []


@pytest.mark.parametrize("key", ["", "{\"trace_hash\": ", "{}", "other"])
def test_ship_results_skips_a_damaged_key_json(tmp_path, key):
    """A 0-byte, cut, foreign or other configuration's key.json is skipped by the packer, with a warning
    (it broke the packer of dtrlab ship results with JSONDecodeError)."""
    unet = load_unet()
    clean = clean_cache()
    frame, files = clean
    directory = SweepCache(tmp_path, unet, get_policy("dtr")).directory
    directory.mkdir(parents=True)
    (name, data), = files["merged"].items()
    (directory / name).write_bytes(data)
    (directory / "key.json").write_bytes(files["key.json"])
    rows, configs = rows_from_cache(tmp_path, unet.content_hash)
    assert sorted(rows["budget_bytes"]) == sorted(frame["budget_bytes"]) and list(configs) == [directory.name]
    if key == "other":
        other = json.loads(files["key.json"])
        other["overhead_limit"] = 3.0
        key = json.dumps(other)
    (directory / "key.json").write_text(key)
    with pytest.warns(UserWarning, match="skipping the cached rows"):
        rows, configs = rows_from_cache(tmp_path, unet.content_hash)
    assert len(rows) == 0 and configs == {}
    # The next sweep repairs the key (its rows were never at risk: they are verified separately).
    with mock.patch.dict(os.environ, {RECOMPUTE_ENV: "1"}):
        sweep(unet, "dtr", ratios=list(RATIOS) + [0.65], execution=Execution(cache=tmp_path, progress=False))
    rows, configs = rows_from_cache(tmp_path, unet.content_hash)
    assert len(rows) == len(RATIOS) + 1


# ------------------------------------------------------------------ the primitives
def test_hashed_files_round_trip_and_refuse_any_change(tmp_path):
    path = integrity.write_hashed(tmp_path, "part", ".bin", b"some bytes")
    assert path.name == f"part-{integrity.sha256_bytes(b'some bytes')}.bin"
    assert integrity.read_hashed(path) == b"some bytes" and integrity.sha256_file(path) == path.name[5:-4]
    path.write_bytes(b"some bytez")
    with pytest.raises(integrity.IntegrityError, match="do not match the sha256"):
        integrity.read_hashed(path)
    with pytest.raises(FileNotFoundError):
        integrity.read_hashed(tmp_path / f"part-{'0' * 64}.bin")


def test_manifest_records_and_verifies_files(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.parquet").write_bytes(b"x" * 10)
    (tmp_path / "y.csv").write_bytes(b"y")
    manifest = integrity.write_manifest(tmp_path)
    assert sorted(manifest["files"]) == ["a/x.parquet", "y.csv"]
    integrity.verify_in_manifest(tmp_path / "a" / "x.parquet", tmp_path)
    (tmp_path / "y.csv").write_bytes(b"z")
    with pytest.raises(integrity.IntegrityError, match="does not match its sha256"):
        integrity.verify_in_manifest(tmp_path / "y.csv", tmp_path)
    (tmp_path / "new.csv").write_bytes(b"n")
    with pytest.raises(integrity.IntegrityError, match="not listed"):
        integrity.verify_in_manifest(tmp_path / "new.csv", tmp_path)
    # Recording some files keeps the other entries (an edited file stays caught) and drops removed ones.
    (tmp_path / "a" / "x.parquet").unlink()
    integrity.write_manifest(tmp_path, [tmp_path / "new.csv"])
    assert sorted(integrity.read_manifest(tmp_path)) == ["new.csv", "y.csv"]
    with pytest.raises(integrity.IntegrityError):
        integrity.verify_in_manifest(tmp_path / "y.csv", tmp_path)
    (tmp_path / integrity.MANIFEST_NAME).write_text("[]")
    with pytest.raises(integrity.IntegrityError, match="not a dtrlab manifest"):
        integrity.read_manifest(tmp_path)


# ------------------------------------------------------------------ issue 26 item 6: random without a seed
@pytest.mark.parametrize("seed", [None, 1.5, "3", True])
def test_random_policy_refuses_a_seed_that_is_not_an_integer(seed):
    with pytest.raises(ValueError, match="seed must be an integer"):
        get_policy("random", seed=seed)
    with pytest.raises(ValueError, match="seed must be an integer"):
        get_policy("AbRandom", seed=seed)
    assert get_policy("random", seed=7).params == {"seed": 7}


def test_cli_refuses_an_unseeded_random_policy(capsys):
    from dtrlab.cli import main

    assert main(["run", str(LOG), "--policy", "random", "--param", "seed=null", "--ratio", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "seed must be an integer" in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------ cached analysis tables
def test_a_damaged_cached_table_is_a_miss_and_an_unwritable_one_only_warns(tmp_path, monkeypatch):
    from dtrlab.sweep.tables import TableCache

    unet = load_unet()
    table = pd.DataFrame({"storage": ["x1", "x2"], "clock": [3, 4]})
    store = TableCache(tmp_path, unet, "test_table", {"n": 1})
    assert store.load() is None
    store.store(table)
    pd.testing.assert_frame_equal(TableCache(tmp_path, unet, "test_table", {"n": 1}).load(), table)
    assert TableCache(tmp_path, unet, "test_table", {"n": 2}).load() is None
    (path,) = store.directory.glob("*.parquet")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 4
    path.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="ignoring damaged cache file"):
        assert store.load() is None
    full_disk(monkeypatch)
    with pytest.warns(UserWarning, match="cannot write the table cache"):
        store.store(table)
    assert store.load() is None
