"""Progress bars only on a terminal (dtrlab.progress): a pipe or a file gets one line per stage, never a
bar's carriage-return fragments; and every bar dtrlab makes goes through that one rule."""

from __future__ import annotations

import ast
import io
from pathlib import Path

from dtrlab.cli import main
from dtrlab.progress import StageLine, progress_bar

ROOT = Path(__file__).resolve().parent.parent


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def run_stage(stream, **options) -> str:
    with progress_bar(total=3, desc="stage", unit="run", file=stream, mininterval=0, **options) as bar:
        for _ in range(3):
            bar.set_postfix_str("dtr @ flat")
            bar.update()
    return stream.getvalue()


def test_a_pipe_gets_one_line_per_stage():
    text = run_stage(io.StringIO())
    assert "\r" not in text
    assert text.splitlines() == [text.rstrip("\n")] and text.startswith("stage: 3/3 run in ")
    assert text.rstrip().endswith("(dtr @ flat)")


def test_a_terminal_gets_the_bar():
    text = run_stage(Terminal())
    assert "\r" in text and "3/3" in text


def test_disabled_writes_nothing():
    assert run_stage(io.StringIO(), disable=True) == ""


def test_iteration_counts_and_closes_once():
    stream = io.StringIO()
    bar = progress_bar(range(4), desc="census", unit="config", file=stream)
    assert isinstance(bar, StageLine) and list(bar) == [0, 1, 2, 3]
    bar.close()
    assert stream.getvalue().count("\n") == 1 and stream.getvalue().startswith("census: 4/4 config")


def test_check_in_a_pipe_writes_lines_not_bar_fragments(capsys, tmp_path):
    """``dtrlab check ... | tail``: stderr is not a terminal, so each stage (each census sweep, the check
    itself) is one line; before the shared rule this printed nested bar debris."""
    status = main(["check", str(ROOT / "traces" / "resnet32-b8.jsonl.gz"), "--device", "A100-80GB", "--budget",
                   "0.5", "--window", "0.01", "--delta", "0.005", "--policies", "dtr", "--no-monotone",
                   "--no-cache", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert status == 0
    assert "\r" not in err
    lines = err.splitlines()
    assert lines[-1].startswith("check resnet32-b8: 2/2 census in "), lines
    assert len(lines) >= 3 and all(": " in line and " in " in line for line in lines), lines


def test_every_bar_is_made_by_the_shared_rule():
    """No module but dtrlab/progress.py imports tqdm, and no call asks a library for its own bar
    unconditionally (papermill's ``progress_bar=True``): a bar made elsewhere would bypass the rule."""
    offenders = []
    for path in (ROOT / "dtrlab").rglob("*.py"):
        if path.name == "progress.py" and path.parent.name == "dtrlab":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] == "tqdm"]
            if isinstance(node, ast.keyword) and node.arg == "progress_bar" and \
                    isinstance(node.value, ast.Constant) and node.value.value is True:
                offenders.append(f"{path.relative_to(ROOT)}:{node.value.lineno}: progress_bar=True")
    assert offenders == []
