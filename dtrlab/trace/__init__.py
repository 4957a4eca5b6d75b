"""Traces: the data model, loaders for simrd's JSON-lines operator logs, and the
PyTorch recorder (``record``, which imports torch only when used)."""

from .builder import LogBuilder
from .model import COMPUTE, CONSTANT_OP, GET, PIN, RELEASE, Operator, Trace
from .simrd_log import TraceFormatError, load, load_directory, load_log, load_zip, parse_lines, trace_name

__all__ = [
    "COMPUTE", "CONSTANT_OP", "GET", "PIN", "RELEASE", "LogBuilder", "Operator", "Trace", "TraceFormatError",
    "load", "load_directory", "load_log", "load_zip", "parse_lines", "trace_name",
]


def __getattr__(name):
    # The recorder needs torch, an optional extra: import it on first use only.
    if name in ("record", "Recording"):
        from . import capture
        return getattr(capture, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
