"""The ``dtrlab`` command line.

Each subcommand lives in its own module with ``register(subparsers)``, which adds
its parser and sets ``handler``; add a module name to ``COMMANDS`` to add one.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ..trace import TraceFormatError

COMMANDS = ["info", "run", "capture", "explain", "variants", "sweep", "holes", "census", "search", "frontier"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dtrlab", description="Simulate DTR on operator traces.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args) or 0
    except (TraceFormatError, FileNotFoundError, ValueError, TypeError) as exc:
        print(f"dtrlab {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"dtrlab {args.command}: interrupted", file=sys.stderr)
        return 130
