"""The parsed-trace cache: exact round trip, and stale or corrupted files rebuilt, never used."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from dtrlab.trace import cache as trace_cache
from dtrlab.trace import load_directory, load_log, simrd_log

from conftest import ROOT

SHIPPED = sorted((ROOT / "traces").glob("*.jsonl.gz"))


def entry(root, log, start=True):
    return trace_cache.cache_path(root, trace_cache.file_digest(log.read_bytes()), start)


def assert_identical(cached, parsed):
    assert cached == parsed  # every compared field: operators, names, tensor tables, schedule, name, source
    assert cached.content_hash == parsed.content_hash
    assert (cached.name, cached.source) == (parsed.name, parsed.source)
    for mine, theirs in zip(cached.operators, parsed.operators):
        assert mine == theirs and type(mine.cost) is int and type(mine.backward) is bool
        assert all(type(x) is int for x in mine.args + mine.outputs + mine.sizes + mine.aliases)
    assert all(type(step) is tuple and type(step[0]) is int for step in cached.schedule)


@pytest.mark.parametrize("log", SHIPPED, ids=lambda p: p.name)
def test_cached_trace_equals_the_parsed_trace(log, tmp_path, monkeypatch):
    parsed = load_log(log, cache=False)
    first = load_log(log, cache=tmp_path)  # parses and stores
    assert entry(tmp_path, log).is_file()
    monkeypatch.setattr(simrd_log, "parse_lines", lambda *a, **k: pytest.fail("parsed although cached"))
    cached = load_log(log, cache=tmp_path)
    assert_identical(first, parsed)
    assert_identical(cached, parsed)


def test_no_start_is_a_separate_entry(tmp_path):
    log = ROOT / "traces" / "resnet32-b8.jsonl.gz"
    with_start, without = load_log(log, cache=tmp_path), load_log(log, start=False, cache=tmp_path)
    assert entry(tmp_path, log, True) != entry(tmp_path, log, False)
    assert load_log(log, start=False, cache=tmp_path) == without == load_log(log, start=False, cache=False)
    assert load_log(log, cache=tmp_path) == with_start


def test_the_file_is_a_plain_npz_without_pickles(tmp_path):
    log = ROOT / "traces" / "unet-b2.jsonl.gz"
    load_log(log, cache=tmp_path)
    path = entry(tmp_path, log)
    assert path.parent.name == f"traces-v{trace_cache.PARSER_VERSION}"
    assert path.read_bytes()[:2] == b"PK"
    with np.load(path, allow_pickle=False) as archive:
        header = json.loads(archive["header"].tobytes())
        assert all(archive[key].dtype != object for key in archive.files)
    assert header["parser_version"] == trace_cache.PARSER_VERSION
    assert header["file_sha256"] == trace_cache.file_digest(log.read_bytes())


def test_the_default_directory_is_the_shared_cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("DTRLAB_CACHE", str(tmp_path))
    log = ROOT / "traces" / "unet-b2.jsonl.gz"
    load_log(log)
    assert entry(tmp_path, log).is_file()
    from dtrlab.sweep import default_cache_dir

    assert default_cache_dir() == trace_cache.default_cache_dir() == tmp_path


def rebuilt(log, tmp_path):
    """Load through the cache (which must notice the bad entry), then check the entry was rewritten whole."""
    parsed = load_log(log, cache=False)
    assert_identical(load_log(log, cache=tmp_path), parsed)
    assert trace_cache.load_cached(entry(tmp_path, log), trace_cache.file_digest(log.read_bytes()), True,
                                   parsed.name, parsed.source) == parsed


def test_an_entry_of_another_log_is_rebuilt(tmp_path):
    # An entry copied under the name of another log's hash: the header's hash does not match.
    unet, resnet = ROOT / "traces" / "unet-b2.jsonl.gz", ROOT / "traces" / "resnet32-b8.jsonl.gz"
    load_log(unet, cache=tmp_path)
    entry(tmp_path, resnet).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(entry(tmp_path, unet), entry(tmp_path, resnet))
    rebuilt(resnet, tmp_path)


def test_an_entry_of_another_parser_version_is_rebuilt(tmp_path, monkeypatch):
    log = ROOT / "traces" / "unet-b2.jsonl.gz"
    load_log(log, cache=tmp_path)
    old = entry(tmp_path, log)
    monkeypatch.setattr(trace_cache, "PARSER_VERSION", trace_cache.PARSER_VERSION + 1)
    new = entry(tmp_path, log)
    assert new != old
    new.parent.mkdir(parents=True)
    shutil.copy(old, new)  # a v1 file at the v2 path: its header says v1
    monkeypatch.setattr(simrd_log, "parse_lines", _counting(simrd_log.parse_lines, calls := []))
    rebuilt(log, tmp_path)
    assert len(calls) == 2  # parsed by load_log and once more by the reference parse in rebuilt()


def _counting(function, calls):
    def counted(*args, **kwargs):
        calls.append(1)
        return function(*args, **kwargs)
    return counted


def test_an_edited_log_is_parsed_again(tmp_path):
    shutil.copy(ROOT / "traces" / "unet-b2.jsonl.gz", tmp_path / "tiny.jsonl.gz")
    log = tmp_path / "tiny.jsonl.gz"
    before = load_log(log, cache=tmp_path / "c")
    other = ROOT / "traces" / "resnet32-b8.jsonl.gz"
    log.write_bytes(other.read_bytes())  # same path, new content: a new key
    after = load_log(log, cache=tmp_path / "c")
    assert after != before and after.operators == load_log(other, cache=False).operators


@pytest.mark.filterwarnings("ignore:ignoring damaged trace cache entry")
@pytest.mark.parametrize("keep", [0, 1, 100, 0.5, -1])
def test_a_truncated_entry_is_rebuilt(tmp_path, keep):
    log = ROOT / "traces" / "transformer-b4.jsonl.gz"
    load_log(log, cache=tmp_path)
    path = entry(tmp_path, log)
    data = path.read_bytes()
    cut = int(len(data) * keep) if isinstance(keep, float) else (keep if keep >= 0 else len(data) - 1)
    path.write_bytes(data[:cut])
    rebuilt(log, tmp_path)


@pytest.mark.filterwarnings("ignore:ignoring damaged trace cache entry")
def test_flipped_bytes_are_never_used(tmp_path):
    # A flip in an array's data fails the zip member's CRC-32; a flip in the zip structure fails
    # to open; either way the entry is rebuilt, so every load equals the parsed trace.
    log = ROOT / "traces" / "unet-b2.jsonl.gz"
    parsed = load_log(log, cache=False)
    load_log(log, cache=tmp_path)
    path = entry(tmp_path, log)
    good = path.read_bytes()
    schedule_at = good.find(np.asarray(parsed.schedule, dtype=np.int64).tobytes())  # savez stores uncompressed
    assert schedule_at > 0
    inside = schedule_at + 8 * len(parsed.schedule)  # the middle of the schedule's data
    for position in [inside, *range(0, len(good), max(1, len(good) // 30))]:
        corrupted = bytearray(good)
        corrupted[position] ^= 0x10
        path.write_bytes(bytes(corrupted))
        assert load_log(log, cache=tmp_path) == parsed, position
    # The flip inside the schedule's data is caught by the member's CRC, not read back as a schedule.
    corrupted = bytearray(good)
    corrupted[inside] ^= 0x10
    path.write_bytes(bytes(corrupted))
    assert trace_cache.load_cached(path, trace_cache.file_digest(log.read_bytes()), True, "x", "y") is None


def test_an_unwritable_cache_only_costs_a_parse(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    log = ROOT / "traces" / "unet-b2.jsonl.gz"
    with pytest.warns(UserWarning, match="could not write the trace cache"):
        trace = load_log(log, cache=blocked)
    assert trace == load_log(log, cache=False)


def test_directories_load_through_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DTRLAB_CACHE", str(tmp_path))
    parsed = load_directory(ROOT / "traces")  # parses and stores
    monkeypatch.setattr(simrd_log, "parse_lines", lambda *a, **k: pytest.fail("parsed although cached"))
    cached = load_directory(ROOT / "traces")
    assert cached == parsed and list(cached) == list(parsed)
    assert [t.meta for t in cached.values()] == [t.meta for t in parsed.values()]  # the manifest's titles
    assert len(list((tmp_path / f"traces-v{trace_cache.PARSER_VERSION}").glob("*.npz"))) == len(parsed)


def test_dtrlab_cache_lists_folders_and_cleans_inductor_lowerings(tmp_path, capsys):
    """``dtrlab cache list`` names each folder with its files and bytes (leftovers apart), and an Inductor
    lowering folder of another version as never read; ``clean --inductor`` removes every lowering, any version,
    and nothing else."""
    from dtrlab.cli import main
    from dtrlab.trace.torch_compile.lowering_cache import FOLDER

    (tmp_path / FOLDER).mkdir()
    (tmp_path / FOLDER / ("a" * 64 + ".npz")).write_bytes(b"x" * 1024)
    (tmp_path / FOLDER / ("b" * 64 + ".npz.damaged")).write_bytes(b"x")
    (tmp_path / "inductor-v0").mkdir()
    (tmp_path / "inductor-v0" / ("c" * 64 + ".npz")).write_bytes(b"x")
    (tmp_path / "traces-v3").mkdir()
    (tmp_path / "traces-v3" / "kept.npz").write_bytes(b"x" * 2048)
    assert main(["cache", "list", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{tmp_path}:"
    assert lines[1].startswith("  inductor-v0: 1 files, ") and lines[1].endswith("another version: never read "
                                                                                 "(clean --inductor removes it)")
    assert lines[2].startswith(f"  {FOLDER}: 1 files, ") and ", 1 leftovers  Inductor's lowered steps" in lines[2]
    assert "never read" not in lines[2] and lines[3].startswith("  traces-v3: 1 files, ") and len(lines) == 4
    assert main(["cache", "clean", str(tmp_path), "--inductor"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"removed 2 Inductor lowerings from {tmp_path}"
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["b" * 64 + ".npz.damaged", "kept.npz"]
    assert main(["cache", "list", str(tmp_path / "nope")]) == 2
