"""README.md runs as written: every `.venv/bin/dtrlab ...` command in it (code blocks and inline), and its Python
example, from the repository's root with .venv/bin on PATH, and `dtrlab check` prints the lines README shows."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from conftest import SHARED
from dtrlab.sweep.shipped import RECOMPUTE_ENV, SHIPPED_ENV

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
#: What a command in README starts with: the environment's own dtrlab, callable without activating it.
PROGRAM = ".venv/bin/dtrlab"


def code_blocks(text: str, language: str) -> list[str]:
    """The fenced blocks of ``language``, every fence paired in order."""
    return [body for tag, body in re.findall(r"^```(\w*)\n(.*?)^```$", text, flags=re.S | re.M) if tag == language]


def readme_commands(text: str) -> list[str]:
    """Every `.venv/bin/dtrlab` command: a line of a shell block (its comment dropped), or an inline code span."""
    commands = []
    for block in code_blocks(text, "bash"):
        commands += [" ".join(shlex.split(line, comments=True)) for line in block.splitlines()
                     if line.startswith(PROGRAM + " ")]
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    commands += [span for span in re.findall(r"`([^`\n]+)`", prose) if span.startswith(PROGRAM + " ")]
    return commands


def python_example(text: str) -> str:
    (example,) = code_blocks(text, "python")
    return example


def shown_check_lines(text: str) -> list[str]:
    """The lines README says `dtrlab check` prints: the block after "prints five lines:"."""
    return text.split("prints five lines:\n\n```\n", 1)[1].split("```", 1)[0].splitlines()


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A stand-in for the repository's root (every top-level entry linked, ``../shared`` beside it), so that what
    a command writes (``dtrlab-check/``) stays out of the checkout; caches go to a fresh ``$DTRLAB_CACHE``."""
    root = tmp_path / "checkout"
    root.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in (".git", "dtrlab-check"):
            (root / entry.name).symlink_to(entry)
    if SHARED.is_dir():
        (tmp_path / "shared").symlink_to(SHARED)
    return root


def run_as_written(command: list[str], cwd: Path, cache: Path) -> subprocess.CompletedProcess:
    """``command`` in a user's environment: conftest's DTRLAB_RECOMPUTE (tests simulate) is not a user's."""
    environment = {key: value for key, value in os.environ.items() if key not in (RECOMPUTE_ENV, SHIPPED_ENV)}
    environment.update(PATH=f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
                       DTRLAB_CACHE=str(cache), MPLBACKEND="agg")
    return subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True)


def _params() -> list:
    return [pytest.param(command, id=command[len(PROGRAM) + 1:],
                         marks=[pytest.mark.shared] if "../shared/" in command else [])  # the DTR artifact's logs
            for command in readme_commands(README)]


def test_readme_commands_are_found():
    """The extraction sees the commands README shows (a wrong pattern would run none and pass)."""
    commands = readme_commands(README)
    assert any(c.startswith(f"{PROGRAM} check traces/") for c in commands)
    assert any(c.startswith(f"{PROGRAM} explain traces/") for c in commands)
    assert all("#" not in c for c in commands)


@pytest.mark.skipif(not (ROOT / PROGRAM).exists(), reason="needs the environment `make setup` creates (.venv)")
@pytest.mark.parametrize("command", _params())
def test_readme_command_runs_as_written(command, checkout, tmp_path):
    if "../shared/" in command and not SHARED.is_dir():
        pytest.skip(f"{SHARED} is absent: the DTR logs live in ../shared")
    done = run_as_written(shlex.split(command), checkout, tmp_path / "cache")
    assert done.returncode == 0, f"{command}\n{done.stderr[-2000:]}"
    if command.startswith(f"{PROGRAM} check traces/"):
        assert done.stdout.splitlines()[:5] == shown_check_lines(README)


@pytest.mark.skipif(not (ROOT / PROGRAM).exists(), reason="needs the environment `make setup` creates (.venv)")
def test_readme_python_example_runs_as_written(checkout, tmp_path):
    if importlib.util.find_spec("torch") is None:  # not imported here: the example runs in its own process
        pytest.skip("dtrlab.compile needs torch (pip install 'dtrlab[torch]')")
    script = tmp_path / "example.py"
    script.write_text(python_example(README))
    done = run_as_written([str(ROOT / ".venv" / "bin" / "python"), str(script)], checkout, tmp_path / "cache")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "knob" in done.stdout and done.stdout.splitlines()[-1].startswith("loss ")

