"""Shared fixtures. Tests that need ../shared (the DTR logs and simrd's reference
outcomes) use the ``shared_dir``-based fixtures and skip with a reason when it is absent."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from dtrlab.trace import load_log

ROOT = Path(__file__).resolve().parent.parent


def load_script(name: str):
    """``scripts/NAME.py`` as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SHARED = Path(os.environ.get("DTRLAB_SHARED", ROOT.parent / "shared"))
LOGS = SHARED / "dtr-logs"
REFERENCE = SHARED / "reference"
RESNET_LOG = "resnet32-56-9000000000.0-2020-10-1-13-3-30-default.log"
UNET_LOG = "unet-6-8000000000.0-2020-10-1-10-57-18-default.log"


@pytest.fixture(autouse=True)
def _without_shipped_results(monkeypatch):
    """Tests simulate: the shipped results (results/shipped/) would serve some of their sweeps.

    tests/test_shipped.py turns the layer back on where it is what is tested.
    """
    monkeypatch.setenv("DTRLAB_RECOMPUTE", "1")


def _require(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} is absent: the DTR logs and reference outcomes live in ../shared (set DTRLAB_SHARED)")
    return path


@pytest.fixture(scope="session")
def small_resnet():
    """ResNet-32 at batch 8 from our own corpus in traces/ (always present, no ../shared needed)."""
    return load_log(ROOT / "traces" / "resnet32-b8.jsonl.gz")


@pytest.fixture(scope="session")
def logs_dir() -> Path:
    return _require(LOGS)


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    return _require(REFERENCE)


@pytest.fixture(scope="session")
def load_shared_log(logs_dir):
    """``load_shared_log(file_name)`` -> Trace, loaded once per session."""
    cache = {}

    def load(file_name: str):
        if file_name not in cache:
            cache[file_name] = load_log(_require(logs_dir / file_name))
        return cache[file_name]

    return load


@pytest.fixture(scope="session")
def resnet_trace(load_shared_log):
    return load_shared_log(RESNET_LOG)


@pytest.fixture(scope="session")
def unet_trace(load_shared_log):
    return load_shared_log(UNET_LOG)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in _require(path).read_text().splitlines() if line.strip()]
