"""The ``dtrlab`` command line.

Each subcommand lives in its own module with ``register(subparsers)``, which adds
its parser and sets ``handler``; add a module name to ``COMMANDS`` to add one.

One error path for every subcommand (:func:`main`): bad input (a file, an option, a
log line) ends in one line ``dtrlab CMD: error: ...`` and exit status 2; a closed
output pipe ends quietly; anything else is a bug: one line that says where the
traceback was written (``--debug`` prints it instead), exit status 70.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import tempfile
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path

from ..trace import TraceFormatError
from .common import Parser

COMMANDS = ["info", "check", "run", "capture", "explain", "variants", "sweep", "holes", "census", "search", "frontier",
            "execute", "knob", "figures", "ship", "cache"]

#: Failures that come from the input (files, options, logs, storages) rather than from
#: a bug: a ValueError (TraceFormatError, IntegrityError, ...), a TypeError from a
#: policy's parameters, an OSError (a missing, unreadable or unwritable file) or a
#: missing optional package.
ANTICIPATED = (TraceFormatError, ValueError, TypeError, OSError, ImportError)
#: Exit status of a bug (sysexits' EX_SOFTWARE), of a closed output pipe (128 + SIGPIPE)
#: and of Ctrl-C (128 + SIGINT).
INTERNAL_ERROR, CLOSED_PIPE, INTERRUPTED = 70, 141, 130


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; with ``command``, that subcommand's alone (a run need not import and
    build the others, a tenth of a short run's time)."""
    parser = Parser(prog="dtrlab", description="Simulate DTR on operator traces.")
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an unexpected error (also accepted after the command)")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS if command is None else [command]:
        importlib.import_module(f"{__name__}.{name}").register(subparsers)
    parser.commands = subparsers.choices  # name -> its parser
    for choice in subparsers._choices_actions:  # a command's line in the list also heads its own --help
        parser.commands[choice.dest].description = parser.commands[choice.dest].description or choice.help
    for subparser in subparsers.choices.values():  # SUPPRESS: absent, it leaves the top-level value alone
        subparser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                               help="show the full traceback of an unexpected error")
    return parser


def parse(argv: list[str]) -> argparse.Namespace:
    """The parsed command line; a command that reads its own arguments (``passthrough``) gets
    every word after its name in ``arguments``, in order."""
    # The first word that is not an option names the command (the top level has only flags); help,
    # a misspelt or a missing command need every command's parser.
    command = next((word for word in argv if not word.startswith("-")), None)
    parser = build_parser(command if command in COMMANDS else None)
    args, unknown = parser.parse_known_args(argv)
    if getattr(args, "passthrough", False):
        args.arguments = argv[argv.index(args.command) + 1:]
    elif unknown:
        parser.commands[args.command].unrecognized(unknown)
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse(argv)
    except SystemExit as exit:  # --help, or a usage error argparse has printed
        return _exit_status(exit)
    ctrl_c: list[int] = []
    try:
        with _noting_ctrl_c(ctrl_c):
            status = args.handler(args) or 0
            sys.stdout.flush()  # a closed pipe shows here, inside the handling below
        return status
    except SystemExit as exit:  # a command that parses its own arguments
        return _exit_status(exit)
    except BrokenPipeError:
        _silence_stdout()
        return CLOSED_PIPE
    except KeyboardInterrupt:
        print(f"dtrlab {args.command}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except Exception as exc:
        if ctrl_c:  # a library that caught the Ctrl-C and failed while cleaning up: still the interruption
            print(f"dtrlab {args.command}: interrupted ({type(exc).__name__} while stopping)", file=sys.stderr)
            return INTERRUPTED
        if isinstance(exc, ANTICIPATED):
            print(f"dtrlab {args.command}: error: {_describe(exc)}", file=sys.stderr)
            return 2
        # A bug: one line here and the traceback in a file, or the traceback with --debug.
        if args.debug:
            traceback.print_exc()
        else:
            where = _write_traceback(argv)
            print(f"dtrlab {args.command}: internal error: {type(exc).__name__}: {_describe(exc)} (a bug; the "
                  f"traceback is in {where}; --debug prints it)", file=sys.stderr)
        return INTERNAL_ERROR


@contextlib.contextmanager
def _noting_ctrl_c(seen: list[int]) -> Iterator[None]:
    """Note every Ctrl-C in ``seen`` while raising KeyboardInterrupt as Python does (when Python's
    own handler is in place: an ignored SIGINT stays ignored)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return

    def note(signum, frame):
        seen.append(signum)
        signal.default_int_handler(signum, frame)

    signal.signal(signal.SIGINT, note)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _exit_status(exit: SystemExit) -> int:
    return exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 2)


def _describe(exc: BaseException) -> str:
    """The exception's message on one line; an OS error as ``PATH: reason``."""
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        message = f"{exc.filename}: {exc.strerror}"
    else:
        message = str(exc) or type(exc).__name__
    return " ".join(message.split())


def _silence_stdout() -> None:
    """After the reader of our output went away: send what is left to /dev/null, so that the
    interpreter's final flush does not complain."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no file descriptor (an in-process caller's stream)
        pass


def _write_traceback(argv: list[str]) -> str:
    """Write the current exception's traceback under the cache directory (else a temporary
    file) and return the path."""
    import datetime
    from importlib.metadata import version

    from ..trace.cache import default_cache_dir

    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    text = f"dtrlab {version('dtrlab')}: dtrlab {' '.join(argv)}\n\n{traceback.format_exc()}"
    try:
        directory = default_cache_dir() / "errors"
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{stamp}-{os.getpid()}.txt"
        path.write_text(text)
    except OSError:
        descriptor, name = tempfile.mkstemp(prefix=f"dtrlab-error-{stamp}-", suffix=".txt")
        with os.fdopen(descriptor, "w") as handle:
            handle.write(text)
        path = Path(name)
    return str(path)
