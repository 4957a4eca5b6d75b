"""The project's own promises: pyproject and environment.yml agree, every install is under constraints.txt,
CI runs the README's test command."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _name(requirement: str) -> str:
    return re.split(r"[<>=!\[ ]", requirement.strip(), maxsplit=1)[0].lower()


def _spec(requirement: str) -> str:
    return re.sub(r"^[A-Za-z0-9_.-]+(\[[^\]]*\])?", "", requirement.strip()).replace(" ", "")


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_name(r): _spec(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]}
    # conda splits dask[distributed] into dask + distributed
    wanted["distributed"] = wanted["dask"]
    conda = {}
    text = (ROOT / "environment.yml").read_text()
    for line in text[text.index("dependencies:"):text.index("- pip:")].splitlines():  # pip's own list follows
        item = line.strip()
        if item.startswith("- ") and item != "- pip":
            requirement = item[2:].strip()
            if _name(requirement) not in ("python",):
                conda[_name(requirement)] = _spec(requirement)
    assert conda == wanted


def test_every_install_is_under_the_constraints():
    """The pins that draw the figures byte for byte hold for every pip install of `make` (and so of CI) and of
    environment.yml, and each lies within pyproject's range for that package."""
    from packaging.requirements import Requirement

    makefile = (ROOT / "Makefile").read_text()
    installs = [line for line in makefile.splitlines()
                if line.startswith("\t") and "pip install" in line and "--upgrade pip" not in line]
    assert installs and all("-c constraints.txt" in line for line in installs), installs
    assert re.search(r"^\$\(VENV\)/\.installed: .*\bconstraints\.txt\b", makefile, flags=re.M), \
        "an edited constraints.txt must reinstall"
    text = (ROOT / "environment.yml").read_text()
    assert "- -c constraints.txt" in text[text.index("- pip:"):]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    ranges = {}
    for requirement in project["dependencies"] + sum(project["optional-dependencies"].values(), []):
        parsed = Requirement(requirement)
        ranges[parsed.name.lower()] = parsed.specifier
    pins = [Requirement(line) for line in (ROOT / "constraints.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    assert {"matplotlib", "fonttools", "pillow"} <= {pin.name for pin in pins}
    for pin in pins:
        (pinned,) = pin.specifier
        assert pinned.operator == "==", pin
        if pin.name in ranges:  # the others are matplotlib's own dependencies, with no range of ours
            assert ranges[pin.name].contains(pinned.version), f"{pin} is outside pyproject's {ranges[pin.name]}"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    # every fenced block, paired in order (a pattern for shell blocks alone would pair a python block's closing fence)
    commands = [body for language, body in re.findall(r"^```(\w*)\n(.*?)^```$", readme, flags=re.S | re.M)
                if language in ("", "bash", "sh")]
    # make test: the quick suite; make test-all: everything, and what CI runs.
    for command in ("make test", "make test-all"):
        assert any(block.strip() == command for block in commands), f"README must show `{command}` on its own"
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test-all$", ci, flags=re.M)
    makefile = (ROOT / "Makefile").read_text()
    for target in ("test", "test-all", "figures"):
        assert re.search(rf"^{target}: setup$", makefile, flags=re.M)


def test_python_version_is_311_or_newer():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.11"
