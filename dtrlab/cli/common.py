"""Arguments, argument types and printing shared by several subcommands."""

from __future__ import annotations

import argparse
import json
import math
import numbers
import os
import re
from pathlib import Path
from urllib.parse import urlsplit

from ..memory import available_memory_models
from ..memory.device import device_capacity
from ..policies import available_policies, get_policy
from ..suggest import did_you_mean
from ..trace import Trace, load


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors and a suggestion for a mistyped choice."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # A word that starts with a minus and a digit (-1GiB, -0.5:1:0.1) is a value, refused by its option's own
        # check: argparse's pattern takes plain numbers alone, and read the rest as an unknown option, leaving the
        # option before it with "expected one argument". No option of ours looks like a number.
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_args(self, args=None, namespace=None):
        namespace, unknown = self.parse_known_args(args, namespace)
        if unknown:
            self.unrecognized(unknown)
        return namespace

    def unrecognized(self, unknown: list[str]):
        """Refuse words no option takes, suggesting the option closest to the first."""
        options = [o for o in self._option_string_actions if o.startswith("--")]
        self.error(f"unrecognized arguments: {' '.join(unknown)}{did_you_mean(unknown[0].split('=')[0], options)}")

    def _check_value(self, action, value):
        if action.choices is not None and value not in action.choices:
            listed = ", ".join(map(str, action.choices))
            raise argparse.ArgumentError(
                action, f"invalid choice: {value!r}{did_you_mean(value, action.choices)} (choose from {listed})")


# Argument types: argparse reports their errors as "argument --OPTION: message".

def finite_float(text: str) -> float:
    """A finite number (inf and nan are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (ratios, seconds)."""
    value = finite_float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


_LEADING_NUMBER = re.compile(r"^\s*([+-]?(?:\d+\.?\d*|\.\d+))")


def positive_size(text: str) -> str:
    """A budget, size or device whose number is > 0 (``-1GiB``, ``0``, ``-0.5`` and ``0%`` are refused now; the
    rest of the spec, which may need the trace, is read where it is used)."""
    number = _LEADING_NUMBER.match(text)
    if number and not float(number.group(1)) > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return text


def overhead_limit(text: str) -> float:
    """A finite multiple of the baseline compute, at least 1."""
    value = finite_float(text)
    if not value >= 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (2.0 allows as much recompute as compute), got {text!r}")
    return value


#: The words ``--overhead-limit`` takes for no limit (where a command allows it).
NO_LIMIT = ("none", "inf", "infinity")


def overhead_limit_or_none(text: str) -> float:
    """:func:`overhead_limit`, or ``none``/``inf`` for no limit (``math.inf``: a run ends by passing or
    running out of memory; see :func:`check_no_limit`)."""
    if text.strip().lower() in NO_LIMIT:
        return math.inf
    return overhead_limit(text)


def check_no_limit(limit: float, policy: str, params: dict | None = None) -> None:
    """Refuse ``--overhead-limit none`` for a policy that reads the limit to decide (its outcome at no
    limit is not what the census axis derives; dtrlab.analysis.anatomy.check_limit_blind)."""
    if not math.isinf(limit):
        return
    from ..analysis.anatomy import check_limit_blind  # pandas: only when there is no limit

    try:
        check_limit_blind(get_policy(policy, **(params or {})).name)
    except ValueError as exc:
        raise ValueError(f"--overhead-limit none: {exc}") from None


def positive_int(text: str) -> int:
    """A whole number >= 1 (counts, sizes, bytes)."""
    return _int_at_least(text, 1)


def device_capacity_spec(text: str) -> str:
    """``--device-capacity``: a spec :func:`~dtrlab.memory.device.device_capacity` reads, checked now."""
    try:
        device_capacity(positive_size(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def byte_count(text: str) -> int:
    """A whole number of bytes >= 1 (``-1GiB`` is refused as not positive, ``1GiB`` as not a whole number)."""
    return positive_int(positive_size(text))


def nonnegative_int(text: str) -> int:
    """A whole number >= 0."""
    return _int_at_least(text, 0)


def jobs_count(text: str) -> int:
    """Worker processes: a positive count, or -1 for every core."""
    value = _int_at_least(text, -1)
    if value == 0:
        raise argparse.ArgumentTypeError("must be a count >= 1, or -1 for every core; got '0'")
    return value


def _int_at_least(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be {'positive' if minimum == 1 else f'>= {minimum}'}, got {text!r}")
    return value


def output_file(text: str) -> str:
    """A file to write, checked before any work is done: not a directory, and in a directory
    that exists and is writable, or can be made."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; give a file name such as {path / 'out.parquet'}")
    existing = next(p for p in path.absolute().parents if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text}: {existing} is not a writable directory")
    return text


def model_source(text: str) -> str:
    """A model source whose name is checked now, before torch is imported (seconds): a misspelt zoo, hf: or
    diffusers: name is refused with the closest one (dtrlab.trace.sources)."""
    from ..trace.sources import check_source

    try:
        check_source(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def check_scheduler(address: str | None, backend: str | None = None, timeout_s: float = 5.0) -> None:
    """Fail fast, with the address, when a Dask scheduler does not answer (Dask itself waits 30 s),
    or when ``--backend dask`` comes without one."""
    if not address:
        if backend == "dask":
            raise ValueError("--backend dask needs --scheduler ADDRESS, e.g. tcp://127.0.0.1:8786")
        return
    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if not host or not port:
        raise ValueError(f"--scheduler {address}: expected an address such as tcp://127.0.0.1:8786")
    import socket  # here: a run that names no scheduler need not import it

    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        raise ValueError(f"--scheduler {address}: no Dask scheduler answers there ({exc.strerror or exc}); "
                         "start one with `dask scheduler`, or drop --scheduler to run locally") from None


def ratio_grid(text: str, option: str = "--ratios"):
    """A ratios option checked now (finite, positive, at most MAX_BUDGETS): a range
    ``START:STOP:STEP`` stays a string (sweeps and searches record it so), a list
    ``0.25,0.5`` becomes floats."""
    from ..sweep.budget_sweep import parse_ratios  # pandas: only commands that sweep get here

    try:
        values = parse_ratios(text)
    except ValueError as exc:
        raise ValueError(f"{option}: {exc}") from None
    return text if ":" in text else values


def load_traces(paths: list[str]) -> list[Trace]:
    """Each path may be a log, a directory of logs (with manifest.json) or a zip."""
    traces = []
    for path in paths:
        loaded = load(path)
        traces.extend(loaded.values() if isinstance(loaded, dict) else [loaded])
    return traces


def add_single_run_arguments(parser: argparse.ArgumentParser, unlimited: bool = False) -> None:
    """LOG and one budget (--ratio or --budget), for commands about a single run."""
    parser.add_argument("log", metavar="LOG", help="log file (or a directory/zip holding exactly one log)")
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument("--ratio", type=positive_float,
                        help="budget as a fraction of the unbounded peak (simrd's int(peak*ratio))")
    budget.add_argument("--budget", type=byte_count, metavar="BYTES", help="budget in bytes")
    add_policy_arguments(parser, unlimited)


def load_single_trace(path: str) -> Trace:
    traces = load_traces([path])
    if len(traces) != 1:
        raise ValueError(f"{path} holds {len(traces)} traces; name one log file")
    return traces[0]


def add_policy_arguments(parser: argparse.ArgumentParser, unlimited: bool = False) -> None:
    """--policy, --param, --overhead-limit (with ``unlimited``, ``none`` too) and the memory options."""
    parser.add_argument("--policy", default="dtr",
                        help=f"eviction policy (default dtr; available: {', '.join(available_policies())})")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="policy parameter, e.g. --param seed=3 (repeatable; values are parsed as JSON)")
    parser.add_argument("--overhead-limit", type=overhead_limit_or_none if unlimited else overhead_limit, default=2.0,
                        help="thrash once total compute exceeds this multiple of the baseline (default 2.0)" +
                        ("; none (or inf): no limit, for policies that do not read it" if unlimited else ""))
    add_memory_arguments(parser)


def add_memory_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--memory", default="flat",
                        help="memory model (default flat, simrd's byte counter; available: "
                             f"{', '.join(available_memory_models())}; see docs/memory.md)")
    parser.add_argument("--memory-option", action="append", default=[], metavar="KEY=VALUE",
                        help="memory model option, e.g. --memory-option expandable_segments=true (repeatable; "
                             "values are parsed as JSON)")
    parser.add_argument("--enforce", default="reserved", choices=("reserved", "allocated"),
                        help="what the budget limits under a memory model: reserved (default; evict until a block "
                             "is placed) or allocated (the DTR prototype; see docs/memory.md)")
    parser.add_argument("--device-capacity", type=device_capacity_spec, metavar="SPEC",
                        help="with --enforce allocated: the device memory (bytes, 80GiB, 1.25x the budget, a GPU "
                             "preset such as A100-80GB; default unlimited)")


def semantics_argument(args):
    """The :class:`~dtrlab.runtime.semantics.Semantics` of ``--memory``, ``--memory-option``, ``--enforce``,
    ``--device-capacity`` and ``--overhead-limit`` (those the command has), checked now: an unknown
    model or option is an error that lists the valid ones."""
    from ..runtime import DEFAULT_OVERHEAD_LIMIT, Semantics

    if getattr(args, "device_capacity", None) is not None and getattr(args, "enforce", "reserved") == "reserved":
        raise ValueError("--device-capacity applies to --enforce allocated only")
    semantics = Semantics(memory=getattr(args, "memory", "flat"),
                          memory_options=key_values(getattr(args, "memory_option", []), "--memory-option"),
                          enforce=getattr(args, "enforce", "reserved"),
                          device_capacity=getattr(args, "device_capacity", None),
                          overhead_limit=getattr(args, "overhead_limit", DEFAULT_OVERHEAD_LIMIT))
    return semantics.normalized()


def execution_argument(args):
    """The :class:`~dtrlab.sweep.execution.Execution` of ``--jobs``, ``--backend``, ``--scheduler``,
    ``--cache``/``--no-cache`` and ``--quiet`` (those the command has); a ``--scheduler`` that does
    not answer fails now (:func:`check_scheduler`)."""
    from ..sweep.execution import Execution

    backend, scheduler = getattr(args, "backend", "loky"), getattr(args, "scheduler", None)
    check_scheduler(scheduler, backend)
    return Execution(jobs=getattr(args, "jobs", 1), backend="dask" if scheduler else backend, client=scheduler,
                     cache=False if getattr(args, "no_cache", False) else (getattr(args, "cache", None) or True),
                     progress=not getattr(args, "quiet", False))


def policy_params(pairs: list[str]) -> dict:
    return key_values(pairs, "--param")


def key_values(pairs: list[str], flag: str) -> dict:
    """``KEY=VALUE`` arguments as a dict; values are parsed as JSON when they are JSON."""
    params = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"{flag} takes KEY=VALUE, got {pair!r}")
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
    return params


def print_table(rows: list[dict]) -> None:
    """A plain aligned table (no pandas needed for small outputs), one number format per column: whole numbers
    where every number in it is whole (a column with a gap arrives as floats: 565485669.0), else 6 digits."""
    if not rows:
        return
    columns = list(rows[0])
    whole = {c for c in columns if all(_is_whole(row.get(c)) for row in rows if _is_number(row.get(c)))}
    cells = [[_format(row.get(c), c in whole) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_whole(value) -> bool:
    return isinstance(value, numbers.Integral) or float(value).is_integer()


def _format(value, whole: bool) -> str:
    if _is_number(value):
        return str(int(value)) if whole else f"{value:.6g}"
    return "" if value is None else str(value)
