"""Leftovers of killed writes (``.NAME.<hex>.tmp``) and of quarantines (``NAME.damaged``) are removed
once old: by the caches for the directory they read, and by ``dtrlab cache clean`` (issue 26, 39)."""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import pytest

import dtrlab.integrity as integrity
from dtrlab.cli import main
from dtrlab.integrity import STALE_AGE_S, atomic_write_bytes, is_unfinished_write, remove_stale
from dtrlab.policies import get_policy
from dtrlab.sweep import SweepCache
from dtrlab.trace import cache as trace_cache
from dtrlab.trace import load_log

from conftest import ROOT

LOG = ROOT / "traces" / "unet-b2.jsonl.gz"
UNFINISHED = ".part-0.parquet.0123456789abcdef0123456789abcdef.tmp"


def make(path: Path, age_s: float = 0.0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"left over")
    if age_s:
        then = time.time() - age_s
        os.utime(path, (then, then))
    return path


def old(path: Path) -> Path:
    return make(path, STALE_AGE_S + 60)


def test_the_names_of_unfinished_writes_are_those_atomic_writes_use(tmp_path, monkeypatch):
    seen = []
    real_replace = os.replace
    monkeypatch.setattr(integrity.os, "replace", lambda src, dst: seen.append(Path(src).name) or real_replace(src, dst))
    atomic_write_bytes(tmp_path / "part-0.parquet", b"data")
    assert len(seen) == 1 and is_unfinished_write(seen[0])
    for other in ("notes.tmp", ".notes.tmp", ".x.0123456789abcdef.tmp", "part-0.parquet",
                  ".x.0123456789abcdef0123456789abcdeg.tmp"):
        assert not is_unfinished_write(other), other


def test_only_old_leftovers_go_with_one_message(tmp_path):
    gone = [old(tmp_path / UNFINISHED), old(tmp_path / "part-1.parquet.damaged")]
    kept = [make(tmp_path / ".part-2.parquet.fedcba9876543210fedcba9876543210.tmp"),  # a live writer's, maybe
            make(tmp_path / "part-3.parquet.damaged"),  # set aside just now: its entry is being recomputed
            old(tmp_path / "notes.tmp"), old(tmp_path / "part-4.parquet"), old(tmp_path / "key.json"),
            old(tmp_path / "below" / "part-5.parquet.damaged")]  # not recursive
    (tmp_path / "link.damaged").symlink_to(kept[-2])
    with pytest.warns(UserWarning) as caught:
        stale = remove_stale(tmp_path)
    assert [str(w.message) for w in caught] == [
        f"removed 2 stale files from {tmp_path} (1 unfinished write, 1 damaged file set aside), each older than 1 h"]
    assert (stale.unfinished, stale.damaged) == (1, 1)
    assert not any(p.exists() for p in gone) and all(p.exists() for p in kept)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing stale left: no message
        assert remove_stale(tmp_path).removed == 0
        assert remove_stale(tmp_path / "missing").removed == 0
    assert remove_stale(tmp_path, recursive=True, announce=False).damaged == 1
    assert not kept[-1].exists() and kept[-2].exists()


def test_the_sweep_cache_cleans_the_directory_it_reads(tmp_path):
    cache = SweepCache(tmp_path, load_log(LOG, cache=False), get_policy("dtr"))
    leftovers = [old(cache.directory / UNFINISHED), old(cache.directory / "part-1.parquet.damaged")]
    with pytest.warns(UserWarning, match="removed 2 stale files"):
        assert cache.load().empty
    assert not any(p.exists() for p in leftovers)


def test_the_solve_journal_cleans_its_directory_on_resume(tmp_path):
    from dtrlab.solvers.frontier import FrontierPlan, SolveJournal
    from test_solvers import chain

    journal = SolveJournal(tmp_path / "chain.solves", chain(), FrontierPlan())
    leftovers = [old(journal.directory / "relax-lp-40-0.json.damaged"), old(journal.directory / UNFINISHED)]
    with pytest.warns(UserWarning, match="removed 2 stale files"):
        assert journal.rows() == []
    assert not any(p.exists() for p in leftovers)


def test_the_trace_cache_cleans_its_directory_when_it_stores(tmp_path):
    path = trace_cache.cache_path(tmp_path, "0" * 64, True)
    leftover = old(path.parent / f".{path.name}.0123456789abcdef0123456789abcdef.tmp")
    with pytest.warns(UserWarning, match="removed 1 stale file "):
        trace_cache.store(path, load_log(LOG, cache=False), "0" * 64, True)
    assert not leftover.exists() and path.exists()


def test_dtrlab_cache_clean(tmp_path, capsys, monkeypatch):
    leftovers = [old(tmp_path / "sim-v1" / "a" / UNFINISHED), old(tmp_path / "results" / "x.parquet.damaged")]
    fresh = make(tmp_path / "sim-v1" / "b" / "part-2.parquet.damaged")
    monkeypatch.setenv("DTRLAB_CACHE", str(tmp_path))
    assert main(["cache", "clean"]) == 0
    assert capsys.readouterr().out == (f"removed 2 stale files from {tmp_path} (1 unfinished write, 1 damaged file "
                                       "set aside), each older than 1 h\n")
    assert not any(p.exists() for p in leftovers) and fresh.exists()
    assert main(["cache", "clean", str(tmp_path), "--older-than", "0"]) == 0
    assert "removed 1 stale file " in capsys.readouterr().out and not fresh.exists()
    assert main(["cache", "clean", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"no stale files in {tmp_path}\n"
    assert main(["cache", "clean", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err == f"dtrlab cache: error: {tmp_path / 'nope'}: not a directory\n"
    assert main(["cache", "clean", "--older-than", "-1"]) == 2
    assert main(["cache", "clena"]) == 2
    assert "did you mean 'clean'?" in capsys.readouterr().err
