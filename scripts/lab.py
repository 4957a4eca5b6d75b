"""Start JupyterLab on 127.0.0.1 with the notebooks (``make lab``).

    .venv/bin/python scripts/lab.py                 # http://127.0.0.1:8888/lab, a browser opens
    .venv/bin/python scripts/lab.py --port 9000 --no-browser

JupyterLab prints the address with its token. The browser test
(tests/test_explorer_browser.py) starts its server with :func:`lab_command` too.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def lab_command(root_dir: str | Path = NOTEBOOKS, *, port: int = 8888, token: str | None = None,
                open_browser: bool = True) -> list[str]:
    """The command that serves ``root_dir`` with JupyterLab on 127.0.0.1 (this Python's environment).

    ``token``: None lets JupyterLab make one (it prints the address with it).
    """
    command = [sys.executable, "-m", "jupyter", "lab", "--ip=127.0.0.1", f"--port={port}",
               f"--ServerApp.root_dir={root_dir}"]
    if token is not None:
        command.append(f"--IdentityProvider.token={token}")
    if not open_browser:
        command.append("--no-browser")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-root")  # containers run as root; Jupyter refuses it otherwise
    return command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8888, help="port on 127.0.0.1 (default 8888; the next free "
                        "one if taken)")
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser")
    args = parser.parse_args(argv)
    # The Makefile exports MPLBACKEND=agg for headless figures; in JupyterLab figures draw inline.
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    try:
        return subprocess.run(lab_command(port=args.port, open_browser=not args.no_browser), env=env).returncode
    except KeyboardInterrupt:  # Ctrl-C: JupyterLab shuts down with it
        return 0


if __name__ == "__main__":
    sys.exit(main())
