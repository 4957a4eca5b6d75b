"""Shared fixtures. Tests that need ../shared (the DTR logs and simrd's reference
outcomes) use the ``shared_dir``-based fixtures and skip with a reason when it is absent."""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import shutil
import sys
import tempfile
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


# dtrlab.trace.models sets HF_HUB_OFFLINE=1 for the whole process before transformers is imported (it builds configs,
# never downloads); set here first, every test sees the same environment whichever runs first.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Every dtrlab cache a test does not name goes to one empty folder of this test run, never to the user's
# ($DTRLAB_CACHE or ~/.cache/dtrlab): an answer an earlier run (or a developer) left there never stands in for what
# a test computes, and a test run leaves nothing behind.
os.environ["DTRLAB_CACHE"] = tempfile.mkdtemp(prefix="dtrlab-tests-cache-")
atexit.register(shutil.rmtree, os.environ["DTRLAB_CACHE"], ignore_errors=True)
#: Variables a library sets once per process to its own default when they are unset: torch's inductor cache directory
#: (torch/_inductor/runtime/cache_dir_utils.py:19, first computed by whichever test compiles first) and joblib's
#: KMP_INIT_AT_FORK (joblib/__init__.py:163, on its first import), and the address Inductor's CPU kernels read when
#: their first library loads (torch/_inductor/codecache.py:4145). Their first setting is not counted
#: as a test's.
LIBRARY_WRITES = ("TORCHINDUCTOR_CACHE_DIR", "KMP_INIT_AT_FORK", "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR")
#: The torch configuration modules a test must leave as it found them (compared when torch is already imported).
TORCH_CONFIGS = ("torch._functorch.config", "torch._inductor.config")


def process_state() -> dict:
    """What one test may not change for the next: the environment, the working directory, and torch's
    functorch/inductor configuration (each module's values, and that ``torch._functorch.config`` is still the module
    itself), its default dtype and grad mode. Cheap: well under a millisecond."""
    environment = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}  # pytest's own, per phase
    state = {"os.environ": environment, "working directory": os.getcwd()}
    torch = sys.modules.get("torch")
    for name in TORCH_CONFIGS:
        module = sys.modules.get(name)
        if module is not None:
            package, _, attribute = name.rpartition(".")
            state[name] = (getattr(sys.modules[package], attribute, None) is module, module.get_config_copy())
    if torch is not None:
        state["torch defaults"] = (torch.get_default_dtype(), torch.is_grad_enabled())
    return state


@pytest.fixture(autouse=True)
def _leaves_no_trace():
    """Fails a test that leaves os.environ, the working directory or torch's configuration changed (use
    monkeypatch, or restore what you change); what was imported during the test is compared from the next one on."""
    before = process_state()
    yield
    after = process_state()
    for name in LIBRARY_WRITES:
        if name not in before["os.environ"]:
            after["os.environ"].pop(name, None)
    changed = [key for key in before if key in after and before[key] != after[key]]
    if changed:
        pytest.fail(f"the test left {', '.join(changed)} changed: " + "; ".join(
            _difference(before[key], after[key]) for key in changed), pytrace=False)


def _difference(before, after) -> str:
    if isinstance(before, tuple) and isinstance(before[1], dict):
        if before[0] != after[0]:
            return "the module was replaced"
        before, after = before[1], after[1]
    if isinstance(before, dict):
        keys = sorted(k for k in before.keys() | after.keys() if before.get(k, "<unset>") != after.get(k, "<unset>"))
        return ", ".join(f"{k}: {before.get(k, '<unset>')!r} -> {after.get(k, '<unset>')!r}" for k in keys[:5])
    return f"{before!r} -> {after!r}"


@pytest.fixture(autouse=True)
def _without_shipped_results(_leaves_no_trace, monkeypatch):
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


def _mutmut_durations() -> dict | None:
    """Under scripts/mutate.py (``DTRLAB_MUTATE``): each test's duration in mutmut's stats run
    (``mutmut-stats.json`` in its working directory); None otherwise."""
    stats = Path("mutmut-stats.json")
    if os.environ.get("DTRLAB_MUTATE") and stats.exists():
        return json.loads(stats.read_text())["duration_by_test"]
    return None


#: Each test file's seconds, measured (scripts/tests_alone.py reads tests/file_seconds.json for both):
#: ``--heaviest-files-first`` and scripts/tests_alone.py hand the longest files out first.
FILE_SECONDS = load_script("tests_alone").file_seconds()


def pytest_addoption(parser):
    parser.addoption("--heaviest-files-first", action="store_true",
                     help="run the test files in the order of their measured slow-test seconds, longest first "
                          "(tests/file_seconds.json): with xdist's --dist loadfile, no long file starts last")
    parser.addoption("--cnn-knobs", default="1.0,0.7,0.5,0.3,0.1,0.0", metavar="KNOBS",
                     help="the knobs tests/test_op_temporaries.py's CNN families are compiled at for real (default: "
                          "the six of tests/test_inductor.py; a real step per knob costs a compile)")


def pytest_collection_modifyitems(config, items):
    """Under scripts/mutate.py, the quickest tests first: mutmut runs a mutant's tests with ``-x``, so a mutant
    that a quick test kills stops there instead of waiting for the slow ones first. With
    ``--heaviest-files-first`` (make test-all's slow run), the files longest first, each file's tests in their
    order: the two workers finish together instead of one waiting on a long file handed out last."""
    durations = _mutmut_durations()
    if durations is not None:
        items.sort(key=lambda item: durations.get(item.nodeid, float("inf")))
    elif config.getoption("heaviest_files_first"):
        seconds = FILE_SECONDS["slow"]
        items.sort(key=lambda item: -seconds.get(item.path.name, 0))  # stable: a file's tests keep their order


class MutantTooSlow(Exception):
    """A test ran far longer under a mutant than in mutmut's stats run (a loop that never ends)."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """Under scripts/mutate.py, fails a test that runs 20 times its stats-run duration plus 10 s: mutmut's own
    limit is 6 times the CPU time of *all* the mutant's tests, minutes for a loop a quick test entered."""
    durations = _mutmut_durations()
    if durations is None or item.nodeid not in durations:
        yield
        return
    import signal

    def too_slow(signum, frame):
        raise MutantTooSlow(f"{item.nodeid} ran past 20 x its {durations[item.nodeid]:.2f} s + 10 s")

    previous = signal.signal(signal.SIGALRM, too_slow)
    signal.setitimer(signal.ITIMER_REAL, 20 * durations[item.nodeid] + 10)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
