"""`make lab` serves the notebooks with JupyterLab on 127.0.0.1 (scripts/lab.py, which the browser test uses too)."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import load_script

ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("jupyterlab", reason="make lab needs JupyterLab (a dependency of dtrlab)")


def test_make_lab_runs_the_lab_script():
    dry_run = subprocess.run(["make", "-n", "lab", "PORT=9123"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert "scripts/lab.py --port 9123" in dry_run.stdout


@pytest.mark.slow  # a JupyterLab server start: about 8 s of CPU
def test_the_lab_command_serves_the_notebooks_on_localhost(tmp_path):
    lab = load_script("lab")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(8)
    command = lab.lab_command(port=port, token=token, open_browser=False) + ["--ServerApp.port_retries=0"]
    assert "--ip=127.0.0.1" in command and f"--ServerApp.root_dir={ROOT / 'notebooks'}" in command
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"))
    with open(tmp_path / "lab.log", "w") as log:
        server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300  # a hang guard only: the answer is what decides
        while True:
            assert server.poll() is None, f"JupyterLab exited: {(tmp_path / 'lab.log').read_text()}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents?token={token}", timeout=5) as reply:
                    listing = json.load(reply)
                break
            except OSError:
                assert time.monotonic() < deadline, (tmp_path / "lab.log").read_text()
                time.sleep(0.5)
        names = {item["name"] for item in listing["content"]}
        assert "01-feasibility-map.ipynb" in names and "README.md" in names
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
